//! The agent's own metrics in otelcol's names, and the Prometheus endpoint that serves them.

use crate::component::ComponentId;
use crate::pdata::Signal;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;
type CounterFamily = Family<Labels, Counter>;
type GaugeFamily = Family<Labels, Gauge>;

/// Counters per signal, indexed by [`Signal`] order.
#[derive(Clone, Default)]
struct PerSignal {
    traces: CounterFamily,
    metrics: CounterFamily,
    logs: CounterFamily,
}

impl PerSignal {
    fn register(reg: &mut Registry, prefix: &str, help: &str) -> Self {
        let p = PerSignal::default();
        for (s, fam) in [(Signal::Traces, &p.traces), (Signal::Metrics, &p.metrics), (Signal::Logs, &p.logs)] {
            reg.register(format!("{prefix}_{}", s.item_noun()), format!("{help} ({})", s.item_noun()), fam.clone());
        }
        p
    }

    fn get(&self, s: Signal, labels: &Labels) -> Counter {
        let fam = match s {
            Signal::Traces => &self.traces,
            Signal::Metrics => &self.metrics,
            Signal::Logs => &self.logs,
        };
        fam.get_or_create(labels).clone()
    }
}

/// The agent's self-telemetry registry.
pub struct Telemetry {
    registry: parking_lot::Mutex<Registry>,
    /// Counter families components declare for themselves, by name.
    declared: parking_lot::Mutex<std::collections::HashMap<String, CounterFamily>>,
    receiver_accepted: PerSignal,
    receiver_refused: PerSignal,
    exporter_sent: PerSignal,
    exporter_send_failed: PerSignal,
    exporter_enqueue_failed: PerSignal,
    exporter_shutdown_dropped: PerSignal,
    processor_refused: PerSignal,
    processor_dropped: PerSignal,
    queue_size: GaugeFamily,
    queue_capacity: GaugeFamily,
    // Persistent sending queue (exporterhelper + file_storage).
    queue_resumed: PerSignal,
    queue_redelivered: PerSignal,
    queue_write_failed: PerSignal,
    queue_damaged: CounterFamily,
    arrow_conversions: CounterFamily,
    late_points: CounterFamily,
    derived_points: CounterFamily,
    series: GaugeFamily,
    series_evicted: CounterFamily,
    checkpoints: CounterFamily,
    // Robustness counters (state files set aside, recording rows outside the event-time window).
    state_unusable: CounterFamily,
    recording_out_of_window: CounterFamily,
    replay_items: CounterFamily,
    scrape_failures: CounterFamily,
    nvml_available: GaugeFamily,
    runtime_available: GaugeFamily,
    gpu_enrich_items: CounterFamily,
    // Listeners (core::server) and receiver authentication.
    listener: ListenerFamilies,
    process_rss: Gauge,
    process_cpu: Counter<f64, AtomicU64>,
    process_uptime: Counter<f64, AtomicU64>,
    started: std::time::Instant,
}

/// Counters of one receiver on one transport.
#[derive(Clone)]
pub struct ReceiverMetrics {
    accepted: [Counter; 3],
    refused: [Counter; 3],
}

impl ReceiverMetrics {
    /// Counts items accepted into the pipeline.
    pub fn accepted(&self, s: Signal, n: usize) {
        self.accepted[s as usize].inc_by(n as u64);
    }
    /// Counts items refused (backpressure or bad data).
    pub fn refused(&self, s: Signal, n: usize) {
        self.refused[s as usize].inc_by(n as u64);
    }
}

/// Counters and gauges of one exporter for one signal.
#[derive(Clone)]
pub struct ExporterMetrics {
    /// Items delivered.
    pub sent: Counter,
    /// Items dropped after a permanent error or exhausted retries.
    pub send_failed: Counter,
    /// Items refused because the queue was full.
    pub enqueue_failed: Counter,
    /// Items still queued when shutdown ended.
    pub shutdown_dropped: Counter,
    /// Requests now in the queue.
    pub queue_size: Gauge,
    /// Queue capacity in requests.
    pub queue_capacity: Gauge,
    /// Items found in the persistent queue at start (delivered after a restart).
    pub queue_resumed: Counter,
    /// Items that were being sent when the agent stopped and are sent again (possible duplicates).
    pub queue_redelivered: Counter,
    /// Items refused because the persistent queue could not be written (full disk, I/O error).
    pub queue_write_failed: Counter,
    /// Torn records truncated from the persistent queue's tail (a crash mid-write).
    pub queue_torn: Counter,
    /// Corrupt or unreadable persistent-queue files and records moved aside.
    pub queue_quarantined: Counter,
}

/// `labels` plus `kind`.
fn with_kind(labels: &Labels, kind: &str) -> Labels {
    let mut l = labels.clone();
    l.push(("kind".into(), kind.into()));
    l
}

/// Counters of one processor for one signal.
#[derive(Clone)]
pub struct ProcessorMetrics {
    /// Items refused to the caller (memory limit, full buffer).
    pub refused: Counter,
    /// Items dropped after being accepted (counted, never silent).
    pub dropped: Counter,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    /// Creates the registry with every otelcol-named family.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let receiver_accepted =
            PerSignal::register(&mut r, "otelcol_receiver_accepted", "Items successfully pushed into the pipeline");
        let receiver_refused =
            PerSignal::register(&mut r, "otelcol_receiver_refused", "Items that could not be pushed into the pipeline");
        let exporter_sent =
            PerSignal::register(&mut r, "otelcol_exporter_sent", "Items successfully sent to destination");
        let exporter_send_failed =
            PerSignal::register(&mut r, "otelcol_exporter_send_failed", "Items the exporter failed to send");
        let exporter_enqueue_failed = PerSignal::register(
            &mut r,
            "otelcol_exporter_enqueue_failed",
            "Items that failed to be added to the sending queue",
        );
        let exporter_shutdown_dropped = PerSignal::register(
            &mut r,
            "inferwatch_exporter_shutdown_dropped",
            "Items still queued when the shutdown timeout ran out",
        );
        let processor_refused =
            PerSignal::register(&mut r, "otelcol_processor_refused", "Items refused by a processor");
        let processor_dropped =
            PerSignal::register(&mut r, "otelcol_processor_dropped", "Items dropped by a processor after acceptance");
        let queue_size = GaugeFamily::default();
        r.register("otelcol_exporter_queue_size", "Current size of the retry queue (in batches)", queue_size.clone());
        let queue_capacity = GaugeFamily::default();
        r.register(
            "otelcol_exporter_queue_capacity",
            "Fixed capacity of the retry queue (in batches)",
            queue_capacity.clone(),
        );
        let queue_resumed = PerSignal::register(
            &mut r,
            "inferwatch_exporter_queue_resumed",
            "Items found in the persistent sending queue at start",
        );
        let queue_redelivered = PerSignal::register(
            &mut r,
            "inferwatch_exporter_queue_redelivered",
            "Items being sent when the agent stopped, sent again after the restart (possible duplicates)",
        );
        let queue_write_failed = PerSignal::register(
            &mut r,
            "inferwatch_exporter_queue_write_failed",
            "Items refused because the persistent sending queue could not be written",
        );
        let queue_damaged = CounterFamily::default();
        r.register(
            "inferwatch_exporter_queue_damaged",
            "Persistent-queue damage found and repaired (kind: torn_tail truncated, quarantined moved aside)",
            queue_damaged.clone(),
        );
        let arrow_conversions = CounterFamily::default();
        r.register(
            "inferwatch_arrow_conversions",
            "OTLP batches converted to Arrow RecordBatches, by converting component and signal",
            arrow_conversions.clone(),
        );
        let late_points = CounterFamily::default();
        r.register(
            "inferwatch_arrow_late_items",
            "Items older than the pipeline's watermark minus allowed_lateness, excluded from windows",
            late_points.clone(),
        );
        let derived_points = CounterFamily::default();
        r.register(
            "inferwatch_arrow_derived_points",
            "Data points emitted by Arrow processors",
            derived_points.clone(),
        );
        let series = GaugeFamily::default();
        r.register("inferwatch_processor_series", "Series whose state a processor holds", series.clone());
        let series_evicted = CounterFamily::default();
        r.register(
            "inferwatch_processor_series_evicted",
            "Series evicted from a processor's state (reason: idle or max_series)",
            series_evicted.clone(),
        );
        let checkpoints = CounterFamily::default();
        r.register("inferwatch_checkpoints", "State checkpoints taken, by result", checkpoints.clone());
        let state_unusable = CounterFamily::default();
        r.register(
            "inferwatch_state_unusable",
            "State that could not be restored (scope: file or entry; reason: empty, corrupt, unreadable, incompatible)",
            state_unusable.clone(),
        );
        let recording_out_of_window = CounterFamily::default();
        r.register(
            "inferwatch_exporter_out_of_window_items",
            "Rows a recording exporter wrote outside the event-time window (reason: late or early)",
            recording_out_of_window.clone(),
        );
        let replay_items = CounterFamily::default();
        r.register("inferwatch_replay_items", "Items read from recordings by replay receivers", replay_items.clone());
        let scrape_failures = CounterFamily::default();
        r.register(
            "inferwatch_scrape_failures",
            "Failed scrapes of the prometheus receiver, by job, target and reason",
            scrape_failures.clone(),
        );
        let nvml_available = GaugeFamily::default();
        r.register(
            "inferwatch_nvml_available",
            "1 when an nvml receiver samples GPUs through NVML, 0 when it idles without it",
            nvml_available.clone(),
        );
        let runtime_available = GaugeFamily::default();
        r.register(
            "inferwatch_lstm_ae_runtime_available",
            "1 when a learned detector has ONNX Runtime loaded, 0 when it is disabled without it",
            runtime_available.clone(),
        );
        let listener = ListenerFamilies::register(&mut r);
        let gpu_enrich_items = CounterFamily::default();
        r.register(
            "inferwatch_gpu_enrich_items",
            "Items gpu_enrich saw, by processor, signal and result (matched, unmatched)",
            gpu_enrich_items.clone(),
        );
        let process_rss = Gauge::default();
        r.register(
            "otelcol_process_memory_rss",
            "Total physical memory (resident set size) in bytes",
            process_rss.clone(),
        );
        let process_cpu = Counter::<f64, AtomicU64>::default();
        r.register("otelcol_process_cpu_seconds", "Total CPU user and system time in seconds", process_cpu.clone());
        let process_uptime = Counter::<f64, AtomicU64>::default();
        r.register("otelcol_process_uptime", "Uptime of the process in seconds", process_uptime.clone());
        Telemetry {
            registry: parking_lot::Mutex::new(r),
            declared: Default::default(),
            receiver_accepted,
            receiver_refused,
            exporter_sent,
            exporter_send_failed,
            exporter_enqueue_failed,
            exporter_shutdown_dropped,
            processor_refused,
            processor_dropped,
            queue_size,
            queue_capacity,
            queue_resumed,
            queue_redelivered,
            queue_write_failed,
            queue_damaged,
            arrow_conversions,
            late_points,
            derived_points,
            series,
            series_evicted,
            checkpoints,
            state_unusable,
            recording_out_of_window,
            replay_items,
            scrape_failures,
            nvml_available,
            runtime_available,
            gpu_enrich_items,
            listener,
            process_rss,
            process_cpu,
            process_uptime,
            started: std::time::Instant::now(),
        }
    }

    /// Handles for one receiver on one transport (`grpc`, `http`).
    pub fn receiver(&self, id: &ComponentId, transport: &str) -> ReceiverMetrics {
        let l: Labels = vec![("receiver".into(), id.to_string()), ("transport".into(), transport.into())];
        ReceiverMetrics {
            accepted: Signal::ALL.map(|s| self.receiver_accepted.get(s, &l)),
            refused: Signal::ALL.map(|s| self.receiver_refused.get(s, &l)),
        }
    }

    /// Handles for one exporter and signal.
    pub fn exporter(&self, id: &ComponentId, signal: Signal) -> ExporterMetrics {
        let l: Labels = vec![("exporter".into(), id.to_string())];
        let lq: Labels = vec![("exporter".into(), id.to_string()), ("data_type".into(), signal.as_str().into())];
        // One family twice: each handle is taken (and its read guard released) on its own.
        let queue_torn = self.queue_damaged.get_or_create(&with_kind(&lq, "torn_tail")).clone();
        let queue_quarantined = self.queue_damaged.get_or_create(&with_kind(&lq, "quarantined")).clone();
        ExporterMetrics {
            sent: self.exporter_sent.get(signal, &l),
            send_failed: self.exporter_send_failed.get(signal, &l),
            enqueue_failed: self.exporter_enqueue_failed.get(signal, &l),
            shutdown_dropped: self.exporter_shutdown_dropped.get(signal, &l),
            queue_size: self.queue_size.get_or_create(&lq).clone(),
            queue_capacity: self.queue_capacity.get_or_create(&lq).clone(),
            queue_resumed: self.queue_resumed.get(signal, &l),
            queue_redelivered: self.queue_redelivered.get(signal, &l),
            queue_write_failed: self.queue_write_failed.get(signal, &l),
            queue_torn,
            queue_quarantined,
        }
    }

    /// Handles for one processor and signal.
    pub fn processor(&self, id: &ComponentId, signal: Signal) -> ProcessorMetrics {
        let l: Labels = vec![("processor".into(), id.to_string())];
        ProcessorMetrics {
            refused: self.processor_refused.get(signal, &l),
            dropped: self.processor_dropped.get(signal, &l),
        }
    }

    /// Counter of OTLP → Arrow conversions made by `component` (e.g. `stage metrics/window_stats`).
    pub fn arrow_conversions(&self, component: &str, signal: Signal) -> Counter {
        let l: Labels = vec![("component".into(), component.into()), ("data_type".into(), signal.as_str().into())];
        self.arrow_conversions.get_or_create(&l).clone()
    }

    /// Counter of late items excluded by the Arrow stage of `pipeline`.
    pub fn late_items(&self, pipeline: &str) -> Counter {
        let l: Labels = vec![("pipeline".into(), pipeline.into())];
        self.late_points.get_or_create(&l).clone()
    }

    /// Counter of data points derived by `processor`.
    pub fn derived_points(&self, processor: &ComponentId) -> Counter {
        let l: Labels = vec![("processor".into(), processor.to_string())];
        self.derived_points.get_or_create(&l).clone()
    }

    /// Gauge of series held by `processor` in one pipeline.
    pub fn series(&self, processor: &ComponentId, pipeline: &str) -> Gauge {
        let l: Labels = vec![("processor".into(), processor.to_string()), ("pipeline".into(), pipeline.into())];
        self.series.get_or_create(&l).clone()
    }

    /// Counter of series evicted by `processor` for `reason` (`idle`, `max_series`).
    pub fn series_evicted(&self, processor: &ComponentId, reason: &str) -> Counter {
        let l: Labels = vec![("processor".into(), processor.to_string()), ("reason".into(), reason.into())];
        self.series_evicted.get_or_create(&l).clone()
    }

    /// Counter of checkpoints with `result` (`ok`, `failed`).
    pub fn checkpoints(&self, result: &str) -> Counter {
        let l: Labels = vec![("result".into(), result.into())];
        self.checkpoints.get_or_create(&l).clone()
    }

    /// Counter of state set aside at start: `scope` `file` or `entry`, `reason` as [`crate::state::Unusable`].
    pub fn state_unusable(&self, scope: &str, reason: &str) -> Counter {
        let l: Labels = vec![("scope".into(), scope.into()), ("reason".into(), reason.into())];
        self.state_unusable.get_or_create(&l).clone()
    }

    /// Counter of rows a recording exporter wrote outside its event-time window (`late`, `early`).
    pub fn recording_out_of_window(&self, exporter: &ComponentId, signal: Signal, reason: &str) -> Counter {
        let l: Labels = vec![
            ("exporter".into(), exporter.to_string()),
            ("data_type".into(), signal.as_str().into()),
            ("reason".into(), reason.into()),
        ];
        self.recording_out_of_window.get_or_create(&l).clone()
    }

    /// Counter of items read by a replay receiver.
    pub fn replay_items(&self, receiver: &ComponentId, signal: Signal) -> Counter {
        let l: Labels = vec![("receiver".into(), receiver.to_string()), ("data_type".into(), signal.as_str().into())];
        self.replay_items.get_or_create(&l).clone()
    }

    /// Counter of failed scrapes of `target` in `job` for `reason` (`unreachable`, `timeout`, `http_status`, `parse`, `too_large`).
    pub fn scrape_failures(&self, job: &str, target: &str, reason: &str) -> Counter {
        let l: Labels =
            vec![("job".into(), job.into()), ("target".into(), target.into()), ("reason".into(), reason.into())];
        self.scrape_failures.get_or_create(&l).clone()
    }

    /// Gauge of one nvml receiver: 1 while NVML works, 0 while it idles without it.
    pub fn nvml_available(&self, receiver: &ComponentId) -> Gauge {
        let l: Labels = vec![("receiver".into(), receiver.to_string())];
        self.nvml_available.get_or_create(&l).clone()
    }

    /// Gauge of one learned-detector processor: 1 with ONNX Runtime loaded, 0 when disabled without it.
    pub fn lstm_ae_runtime_available(&self, processor: &ComponentId) -> Gauge {
        let l: Labels = vec![("processor".into(), processor.to_string())];
        self.runtime_available.get_or_create(&l).clone()
    }

    /// Counter of items `processor` saw on `signal` with `result` (`matched`, `unmatched`).
    pub fn gpu_enrich_items(&self, processor: &ComponentId, signal: Signal, result: &str) -> Counter {
        let l: Labels = vec![
            ("processor".into(), processor.to_string()),
            ("data_type".into(), signal.as_str().into()),
            ("result".into(), result.into()),
        ];
        self.gpu_enrich_items.get_or_create(&l).clone()
    }

    /// Handles of the listener named `listener` (`otlp/grpc`, `health_check`, ...).
    pub fn listener(&self, listener: &str) -> ListenerMetrics {
        self.listener.get(listener)
    }

    /// Requests refused by `receiver`'s authenticator on `transport` (`grpc`, `http`).
    pub fn auth_failures(&self, receiver: &ComponentId, transport: &str) -> Counter {
        let l = vec![("receiver".into(), receiver.to_string()), ("transport".into(), transport.into())];
        self.listener.auth_failures.get_or_create(&l).clone()
    }

    /// A counter of the family `name` (OpenMetrics name, without `_total`) that a component
    /// declares for itself, with `labels`; the family is registered on first use and shared by
    /// every later caller of the same name (whose `help` is then not used).
    pub fn component_counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        let fam = {
            let mut declared = self.declared.lock();
            match declared.get(name) {
                Some(f) => f.clone(),
                None => {
                    let f = CounterFamily::default();
                    self.registry.lock().register(name, help, f.clone());
                    declared.insert(name.to_string(), f.clone());
                    f
                }
            }
        };
        let l: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        fam.get_or_create(&l).clone()
    }

    /// Renders every metric in the OpenMetrics text format.
    pub fn render(&self) -> String {
        if let Some(p) = crate::telemetry::process::sample() {
            self.process_rss.set(p.rss_bytes as i64);
            let cpu = self.process_cpu.get();
            if p.cpu_seconds > cpu {
                self.process_cpu.inc_by(p.cpu_seconds - cpu);
            }
        }
        let up = self.started.elapsed().as_secs_f64();
        let prev = self.process_uptime.get();
        if up > prev {
            self.process_uptime.inc_by(up - prev);
        }
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry.lock());
        out
    }

    /// Serves `/metrics` on `addr` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        addr: &str,
        tls: Option<&crate::tls::server::TlsServerSettings>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> std::io::Result<std::net::SocketAddr> {
        use axum::http::header::CONTENT_TYPE;
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let t = self.clone();
        let app =
            axum::Router::new().route(
                "/metrics",
                get(move || {
                    let t = t.clone();
                    async move {
                        ([(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], t.render())
                    }
                }),
            );
        // The hardened serve loop (connection cap, header and idle timeouts) of every listener.
        let limits = crate::server::Limits::new(crate::server::Role::Auxiliary);
        let listener =
            crate::server::Listener::from_tcp("telemetry", listener, tls, limits, self.listener("telemetry"))
                .map_err(std::io::Error::other)?;
        tokio::spawn(crate::server::serve(listener, app, shutdown));
        Ok(local)
    }
}

/// The listener families (core::server): connections open, refused, evicted, timed out,
/// handshake failures and accept errors per listener, and authentication failures per receiver.
#[derive(Clone, Default)]
struct ListenerFamilies {
    connections: GaugeFamily,
    refused: CounterFamily,
    evicted: CounterFamily,
    timed_out: CounterFamily,
    tls_failures: CounterFamily,
    accept_errors: CounterFamily,
    auth_failures: CounterFamily,
}

impl ListenerFamilies {
    fn register(r: &mut Registry) -> Self {
        let f = ListenerFamilies::default();
        r.register("inferwatch_listener_connections", "Connections open on a listener", f.connections.clone());
        r.register(
            "inferwatch_listener_connections_refused",
            "Connections closed at accept because every connection had a request in flight at max_connections",
            f.refused.clone(),
        );
        r.register(
            "inferwatch_listener_connections_evicted",
            "Idle connections closed to make room for a new one at max_connections",
            f.evicted.clone(),
        );
        r.register(
            "inferwatch_listener_connections_timed_out",
            "Connections closed by read_header_timeout or idle_timeout",
            f.timed_out.clone(),
        );
        r.register(
            "inferwatch_listener_tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            f.tls_failures.clone(),
        );
        r.register(
            "inferwatch_listener_accept_errors",
            "Errors accepting connections (EMFILE, ENFILE, ...)",
            f.accept_errors.clone(),
        );
        r.register(
            "inferwatch_receiver_auth_failures",
            "Requests refused by a receiver's authenticator (401 / UNAUTHENTICATED)",
            f.auth_failures.clone(),
        );
        f
    }

    fn get(&self, listener: &str) -> ListenerMetrics {
        let l = vec![("listener".to_string(), listener.to_string())];
        ListenerMetrics {
            connections: self.connections.get_or_create(&l).clone(),
            refused: self.refused.get_or_create(&l).clone(),
            evicted: self.evicted.get_or_create(&l).clone(),
            timed_out: self.timed_out.get_or_create(&l).clone(),
            tls_handshake_failures: self.tls_failures.get_or_create(&l).clone(),
            accept_errors: self.accept_errors.get_or_create(&l).clone(),
        }
    }
}

/// Counters and gauges of one listener.
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub connections: Gauge,
    /// Connections closed at once at the cap (all busy).
    pub refused: Counter,
    /// Idle connections closed to make room.
    pub evicted: Counter,
    /// Connections closed by a timeout.
    pub timed_out: Counter,
    /// Failed or timed-out TLS handshakes.
    pub tls_handshake_failures: Counter,
    /// Accept errors.
    pub accept_errors: Counter,
}

pub mod process {
    //! Reads this process's RSS and CPU time from /proc.

    /// One reading of the process's resource use.
    #[derive(Debug, Clone, Copy)]
    pub struct ProcessSample {
        /// Resident set size in bytes.
        pub rss_bytes: u64,
        /// User plus system CPU seconds.
        pub cpu_seconds: f64,
    }

    use std::sync::OnceLock;

    static RELEASER: OnceLock<fn()> = OnceLock::new();

    /// Registers how to hand free memory back to the system (the binary's allocator knows how).
    pub fn set_memory_releaser(f: fn()) {
        let _ = RELEASER.set(f);
    }

    /// Asks the allocator to return free memory to the system: the registered releaser, or
    /// glibc's `malloc_trim` when none is registered.
    pub fn release_free_memory() {
        if let Some(f) = RELEASER.get() {
            f();
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            unsafe extern "C" {
                fn malloc_trim(pad: usize) -> i32;
            }
            // SAFETY: malloc_trim has no preconditions; it only releases free heap pages.
            unsafe {
                malloc_trim(0);
            }
        }
    }

    /// Raises the soft limit on open files (RLIMIT_NOFILE) to the hard limit (to the kernel's
    /// `fs.nr_open` when the hard limit is unlimited). Returns the soft limit before and after.
    #[cfg(unix)]
    pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let lim = getrlimit(Resource::Nofile);
        let old = lim.current.unwrap_or(u64::MAX);
        let hard = lim.maximum.unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(1_048_576)
        });
        if old >= hard {
            return Ok((old, old));
        }
        setrlimit(Resource::Nofile, Rlimit { current: Some(hard), maximum: lim.maximum })?;
        Ok((old, hard))
    }

    /// Resident set size in bytes from /proc/self/statm, if readable.
    pub fn rss_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    /// Samples RSS and CPU time; `None` where /proc is unavailable.
    pub fn sample() -> Option<ProcessSample> {
        let rss = rss_bytes()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which is in parentheses and may contain spaces).
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = f.get(11)?.parse().ok()?;
        let stime: f64 = f.get(12)?.parse().ok()?;
        Some(ProcessSample { rss_bytes: rss, cpu_seconds: (utime + stime) / 100.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_otelcol_names() {
        let t = Telemetry::new();
        let id = ComponentId::parse("otlp").unwrap();
        t.receiver(&id, "grpc").accepted(Signal::Traces, 7);
        let e = t.exporter(&ComponentId::parse("otlp/b").unwrap(), Signal::Logs);
        e.queue_capacity.set(1000);
        let text = t.render();
        assert!(
            text.contains("otelcol_receiver_accepted_spans_total{receiver=\"otlp\",transport=\"grpc\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("otelcol_exporter_queue_capacity{exporter=\"otlp/b\",data_type=\"logs\"} 1000"),
            "{text}"
        );
        assert!(text.contains("otelcol_process_memory_rss "), "{text}");
    }
}
