//! The agent's own metrics in otelcol's names: a registry of counter and gauge families, served
//! on the self-metrics endpoint in the Prometheus text format 0.0.4 or OpenMetrics 1.0.0 as the
//! scrape's `Accept` asks ([`exposition`]), with the `service.telemetry.resource` attributes as
//! `target_info`, and readable family by family ([`Telemetry::on_family`]) for the OTLP push of
//! `service.telemetry.metrics.readers[].periodic`.

use crate::pdata::Signal;
use crate::vocab::ComponentId;
use exposition::Format;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::server::ListenerMetrics;

type Labels = Vec<(String, String)>;

/// The series of one family: a handle per label set (handles are shared atomics).
struct Family<M> {
    series: Arc<parking_lot::RwLock<BTreeMap<Labels, M>>>,
}

impl<M> Clone for Family<M> {
    fn clone(&self) -> Self {
        Family { series: self.series.clone() }
    }
}

impl<M> Default for Family<M> {
    fn default() -> Self {
        Family { series: Default::default() }
    }
}

impl<M: Clone + Default> Family<M> {
    /// The handle of `labels`, created at zero on first use.
    fn get_or_create(&self, labels: &Labels) -> M {
        if let Some(m) = self.series.read().get(labels) {
            return m.clone();
        }
        self.series.write().entry(labels.clone()).or_default().clone()
    }
}

type CounterFamily = Family<Counter>;
type GaugeFamily = Family<Gauge>;

/// What kind of instrument a family is (as OTLP and the exposition formats name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic cumulative sum.
    Counter,
    /// A value that goes up and down.
    Gauge,
}

/// The number type of a family's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberKind {
    /// Integer samples (item counts, sizes).
    Int,
    /// Floating-point samples (seconds).
    Float,
}

/// One sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer counter reading.
    U64(u64),
    /// An integer gauge reading.
    I64(i64),
    /// A floating-point reading.
    F64(f64),
}

impl Number {
    /// The value as a float (integers above 2^53 round).
    pub fn as_f64(self) -> f64 {
        match self {
            Number::U64(v) => v as f64,
            Number::I64(v) => v as f64,
            Number::F64(v) => v,
        }
    }

    fn render(self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Number::U64(v) => write!(out, "{v}"),
            Number::I64(v) => write!(out, "{v}"),
            Number::F64(v) => {
                out.push_str(&exposition::float(v));
                Ok(())
            }
        };
    }
}

/// Reads a computed value (the process readings) at collection time.
type Compute = Box<dyn Fn() -> Option<f64> + Send + Sync>;

enum Store {
    Counters(CounterFamily),
    Gauges(GaugeFamily),
    Computed(MetricKind, Compute),
}

impl From<CounterFamily> for Store {
    fn from(f: CounterFamily) -> Self {
        Store::Counters(f)
    }
}

impl From<GaugeFamily> for Store {
    fn from(f: GaugeFamily) -> Self {
        Store::Gauges(f)
    }
}

/// One registered family: name (OpenMetrics base name, without `_total`), help, unit and series.
pub struct MetricFamily {
    name: String,
    help: String,
    unit: Option<Unit>,
    store: Store,
}

/// A unit a family's name ends with (OpenMetrics `UNIT`) and its UCUM form (OTLP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (`By`).
    Bytes,
    /// Seconds (`s`).
    Seconds,
}

impl Unit {
    /// The Prometheus / OpenMetrics unit name.
    pub fn prometheus(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
        }
    }

    /// The UCUM unit OTLP carries.
    pub fn ucum(self) -> &'static str {
        match self {
            Unit::Bytes => "By",
            Unit::Seconds => "s",
        }
    }
}

impl MetricFamily {
    /// The family's name (a counter's without `_total`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its help text.
    pub fn help(&self) -> &str {
        &self.help
    }

    /// Its unit, when it has one.
    pub fn unit(&self) -> Option<Unit> {
        self.unit
    }

    /// Counter or gauge.
    pub fn kind(&self) -> MetricKind {
        match &self.store {
            Store::Counters(_) => MetricKind::Counter,
            Store::Gauges(_) => MetricKind::Gauge,
            Store::Computed(k, _) => *k,
        }
    }

    /// Integer or floating-point samples.
    pub fn number_kind(&self) -> NumberKind {
        match &self.store {
            Store::Counters(_) | Store::Gauges(_) => NumberKind::Int,
            Store::Computed(..) => NumberKind::Float,
        }
    }

    /// The current samples, by label set in label order.
    pub fn samples(&self) -> Vec<(Labels, Number)> {
        match &self.store {
            Store::Counters(f) => f.series.read().iter().map(|(l, c)| (l.clone(), Number::U64(c.get()))).collect(),
            Store::Gauges(f) => f.series.read().iter().map(|(l, g)| (l.clone(), Number::I64(g.get()))).collect(),
            Store::Computed(_, read) => read().map(|v| vec![(Vec::new(), Number::F64(v))]).unwrap_or_default(),
        }
    }
}

/// Called with every family, those registered so far and each one registered later.
type Watcher = Box<dyn Fn(&Arc<MetricFamily>) + Send + Sync>;

/// The families in registration order, and who wants to hear of new ones.
#[derive(Default)]
struct Registry {
    families: Vec<Arc<MetricFamily>>,
    watchers: Vec<Watcher>,
}

impl Registry {
    fn register(&mut self, name: impl Into<String>, help: impl Into<String>, store: impl Into<Store>) {
        self.add(MetricFamily { name: name.into(), help: help.into(), unit: None, store: store.into() });
    }

    fn add(&mut self, f: MetricFamily) {
        let f = Arc::new(f);
        for w in &self.watchers {
            w(&f);
        }
        self.families.push(f);
    }
}

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
        fam.get_or_create(labels)
    }
}

/// A family a component declared through [`Telemetry::component_counter`] or
/// [`Telemetry::component_gauge`].
#[derive(Clone)]
enum Declared {
    Counters(CounterFamily),
    Gauges(GaugeFamily),
}

impl Declared {
    fn kind(&self) -> MetricKind {
        match self {
            Declared::Counters(_) => MetricKind::Counter,
            Declared::Gauges(_) => MetricKind::Gauge,
        }
    }
}

/// Owned label pairs.
fn owned(labels: &[(&str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A counter family a component declares beside itself (a `const`): its name (OpenMetrics
/// name, without `_total`), help text and label names. Core registers it on first use.
#[derive(Debug, Clone, Copy)]
pub struct Counters<const N: usize> {
    /// The family's name, without `_total`.
    pub name: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// Its label names, in the order the values are given.
    pub labels: [&'static str; N],
}

impl<const N: usize> Counters<N> {
    /// The declaration of family `name` with `help` and `labels`.
    pub const fn new(name: &'static str, help: &'static str, labels: [&'static str; N]) -> Self {
        Counters { name, help, labels }
    }

    /// The counter of the series with label `values` (in [`Counters::labels`] order) in `telemetry`.
    pub fn get(&self, telemetry: &Telemetry, values: [&str; N]) -> Counter {
        let l: Vec<(&str, &str)> = self.labels.iter().copied().zip(values).collect();
        telemetry.component_counter(self.name, self.help, &l)
    }
}

/// A gauge family a component declares beside itself (a `const`): name, help text, label names.
#[derive(Debug, Clone, Copy)]
pub struct Gauges<const N: usize> {
    /// The family's name.
    pub name: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// Its label names, in the order the values are given.
    pub labels: [&'static str; N],
}

impl<const N: usize> Gauges<N> {
    /// The declaration of family `name` with `help` and `labels`.
    pub const fn new(name: &'static str, help: &'static str, labels: [&'static str; N]) -> Self {
        Gauges { name, help, labels }
    }

    /// The gauge of the series with label `values` (in [`Gauges::labels`] order) in `telemetry`.
    pub fn get(&self, telemetry: &Telemetry, values: [&str; N]) -> Gauge {
        let l: Vec<(&str, &str)> = self.labels.iter().copied().zip(values).collect();
        telemetry.component_gauge(self.name, self.help, &l)
    }
}

/// The agent's self-telemetry registry.
pub struct Telemetry {
    registry: parking_lot::Mutex<Registry>,
    /// `service.telemetry.resource`, rendered as `target_info` on the pull endpoint.
    resource: parking_lot::RwLock<Labels>,
    /// Families components declare for themselves, by name.
    declared: parking_lot::Mutex<std::collections::HashMap<String, Declared>>,
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
    // Listeners (core::server) and receiver authentication.
    listener: ListenerFamilies,
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
        let listener = ListenerFamilies::register(&mut r);
        let started = std::time::Instant::now();
        let computed = [
            (
                "otelcol_process_memory_rss",
                "Total physical memory (resident set size) in bytes",
                MetricKind::Gauge,
                Unit::Bytes,
                Box::new(|| process::rss_bytes().map(|b| b as f64)) as Compute,
            ),
            (
                "otelcol_process_cpu_seconds",
                "Total CPU user and system time in seconds",
                MetricKind::Counter,
                Unit::Seconds,
                Box::new(|| process::sample().map(|p| p.cpu_seconds)),
            ),
            (
                "otelcol_process_uptime",
                "Uptime of the process in seconds",
                MetricKind::Counter,
                Unit::Seconds,
                Box::new(move || Some(started.elapsed().as_secs_f64())),
            ),
        ];
        for (name, help, kind, unit, read) in computed {
            r.add(MetricFamily {
                name: name.into(),
                help: help.into(),
                unit: Some(unit),
                store: Store::Computed(kind, read),
            });
        }
        Telemetry {
            registry: parking_lot::Mutex::new(r),
            resource: Default::default(),
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
            listener,
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
            queue_size: self.queue_size.get_or_create(&lq),
            queue_capacity: self.queue_capacity.get_or_create(&lq),
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
        self.arrow_conversions.get_or_create(&l)
    }

    /// Counter of late items excluded by the Arrow stage of `pipeline`.
    pub fn late_items(&self, pipeline: &str) -> Counter {
        let l: Labels = vec![("pipeline".into(), pipeline.into())];
        self.late_points.get_or_create(&l)
    }

    /// Counter of data points derived by `processor`.
    pub fn derived_points(&self, processor: &ComponentId) -> Counter {
        let l: Labels = vec![("processor".into(), processor.to_string())];
        self.derived_points.get_or_create(&l)
    }

    /// Gauge of series held by `processor` in one pipeline.
    pub fn series(&self, processor: &ComponentId, pipeline: &str) -> Gauge {
        let l: Labels = vec![("processor".into(), processor.to_string()), ("pipeline".into(), pipeline.into())];
        self.series.get_or_create(&l)
    }

    /// Counter of series evicted by `processor` for `reason` (`idle`, `max_series`).
    pub fn series_evicted(&self, processor: &ComponentId, reason: &str) -> Counter {
        let l: Labels = vec![("processor".into(), processor.to_string()), ("reason".into(), reason.into())];
        self.series_evicted.get_or_create(&l)
    }

    /// Counter of checkpoints with `result` (`ok`, `failed`).
    pub fn checkpoints(&self, result: &str) -> Counter {
        let l: Labels = vec![("result".into(), result.into())];
        self.checkpoints.get_or_create(&l)
    }

    /// Counter of state set aside at start: `scope` `file` or `entry`, `reason` as [`crate::state::Unusable`].
    pub fn state_unusable(&self, scope: &str, reason: &str) -> Counter {
        let l: Labels = vec![("scope".into(), scope.into()), ("reason".into(), reason.into())];
        self.state_unusable.get_or_create(&l)
    }

    /// Counter of rows a recording exporter wrote outside its event-time window (`late`, `early`).
    pub fn recording_out_of_window(&self, exporter: &ComponentId, signal: Signal, reason: &str) -> Counter {
        let l: Labels = vec![
            ("exporter".into(), exporter.to_string()),
            ("data_type".into(), signal.as_str().into()),
            ("reason".into(), reason.into()),
        ];
        self.recording_out_of_window.get_or_create(&l)
    }

    /// Handles of the listener named `listener` (`otlp/grpc`, `health_check`, ...).
    pub fn listener(&self, listener: &str) -> ListenerMetrics {
        self.listener.get(listener)
    }

    /// Requests refused by `receiver`'s authenticator on `transport` (`grpc`, `http`).
    pub fn auth_failures(&self, receiver: &ComponentId, transport: &str) -> Counter {
        let l = vec![("receiver".into(), receiver.to_string()), ("transport".into(), transport.into())];
        self.listener.auth_failures.get_or_create(&l)
    }

    /// A counter of the family `name` (OpenMetrics name, without `_total`) that a component
    /// declares for itself, with `labels`; the family is registered on first use and shared by
    /// every later caller of the same name (whose `help` is then not used).
    pub fn component_counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        let l = owned(labels);
        match self.declare(name, help, MetricKind::Counter) {
            Some(Declared::Counters(f)) => f.get_or_create(&l),
            _ => Counter::default(),
        }
    }

    /// A gauge of the family `name` that a component declares for itself, with `labels`; as
    /// [`Telemetry::component_counter`], registered on first use and shared by later callers.
    pub fn component_gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        let l = owned(labels);
        match self.declare(name, help, MetricKind::Gauge) {
            Some(Declared::Gauges(f)) => f.get_or_create(&l),
            _ => Gauge::default(),
        }
    }

    /// The declared family `name` of `kind`, registered now when it is new; `None` (and a
    /// warning) when `name` was declared before as the other kind.
    fn declare(&self, name: &str, help: &str, kind: MetricKind) -> Option<Declared> {
        let mut declared = self.declared.lock();
        if let Some(f) = declared.get(name) {
            if f.kind() == kind {
                return Some(f.clone());
            }
            tracing::warn!(
                family = name,
                "self-metric family declared as both a counter and a gauge; the second is not exported"
            );
            return None;
        }
        let f = match kind {
            MetricKind::Counter => {
                let f = CounterFamily::default();
                self.registry.lock().register(name, help, f.clone());
                Declared::Counters(f)
            }
            MetricKind::Gauge => {
                let f = GaugeFamily::default();
                self.registry.lock().register(name, help, f.clone());
                Declared::Gauges(f)
            }
        };
        declared.insert(name.to_string(), f.clone());
        Some(f)
    }

    /// Sets the `service.telemetry.resource` attributes (in order), served as `target_info`.
    pub fn set_resource(&self, attributes: Vec<(String, String)>) {
        *self.resource.write() = attributes;
    }

    /// The resource attributes set by [`Telemetry::set_resource`].
    pub fn resource(&self) -> Vec<(String, String)> {
        self.resource.read().clone()
    }

    /// Calls `f` with every family registered so far and then with each one registered later
    /// (e.g. to create an observable instrument per family). `f` runs under the registry's lock:
    /// it must not register families itself.
    pub fn on_family(&self, f: impl Fn(&Arc<MetricFamily>) + Send + Sync + 'static) {
        let mut r = self.registry.lock();
        for fam in &r.families {
            f(fam);
        }
        r.watchers.push(Box::new(f));
    }

    /// Every family, in registration order.
    pub fn families(&self) -> Vec<Arc<MetricFamily>> {
        self.registry.lock().families.clone()
    }

    /// Renders every metric in the OpenMetrics 1.0.0 text format.
    pub fn render(&self) -> String {
        self.render_as(Format::OpenMetrics)
    }

    /// Renders every metric in `format`, `target_info` first when a resource is set.
    pub fn render_as(&self, format: Format) -> String {
        let mut out = String::new();
        exposition::target_info(&mut out, &self.resource.read(), format);
        for fam in self.families() {
            exposition::family(&mut out, &fam, format);
        }
        if format == Format::OpenMetrics {
            out.push_str("# EOF\n");
        }
        out
    }

    /// Serves `/metrics` on `addr` until `shutdown` resolves, in the format the scrape's
    /// `Accept` header asks for ([`exposition::negotiate`]).
    pub async fn serve(
        self: Arc<Self>,
        addr: &str,
        tls: Option<&crate::tls::server::TlsServerSettings>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> std::io::Result<std::net::SocketAddr> {
        use axum::http::HeaderMap;
        use axum::http::header::{ACCEPT, CONTENT_TYPE, VARY};
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let t = self.clone();
        let app = axum::Router::new().route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let t = t.clone();
                async move {
                    let format = exposition::negotiate(headers.get(ACCEPT).and_then(|v| v.to_str().ok()));
                    ([(CONTENT_TYPE, format.content_type()), (VARY, "Accept")], t.render_as(format))
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
            connections: self.connections.get_or_create(&l),
            refused: self.refused.get_or_create(&l),
            evicted: self.evicted.get_or_create(&l),
            timed_out: self.timed_out.get_or_create(&l),
            tls_handshake_failures: self.tls_failures.get_or_create(&l),
            accept_errors: self.accept_errors.get_or_create(&l),
        }
    }
}

pub mod exposition {
    //! The Prometheus text format 0.0.4 and OpenMetrics 1.0.0, and choosing between them from a
    //! request's `Accept` header as Prometheus' client libraries do.

    use super::{MetricFamily, MetricKind};

    /// `Content-Type` of the text format 0.0.4.
    pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
    /// `Content-Type` of OpenMetrics 1.0.0.
    pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// An exposition format.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Format {
        /// Prometheus text format 0.0.4 (the default).
        Text,
        /// OpenMetrics 1.0.0 text.
        OpenMetrics,
    }

    impl Format {
        /// The response `Content-Type`.
        pub fn content_type(self) -> &'static str {
            match self {
                Format::Text => TEXT_CONTENT_TYPE,
                Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            }
        }
    }

    /// The format for an `Accept` header, as client_golang's `NegotiateIncludingOpenMetrics`:
    /// the media ranges in order of q-value (ties keep their order), the first that is
    /// `application/openmetrics-text` (version 1.0.0, 0.0.1 or none) or `text/plain` (version
    /// 0.0.4 or none) wins; ranges with `q=0` are not acceptable; otherwise text 0.0.4.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else { return Format::Text };
        let mut ranges: Vec<(f64, Option<Format>)> = Vec::new();
        for part in accept.split(',') {
            let mut it = part.split(';').map(str::trim);
            let media = it.next().unwrap_or_default().to_ascii_lowercase();
            let (mut q, mut version) = (1.0, None);
            for p in it {
                let Some((k, v)) = p.split_once('=') else { continue };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    // An unparsable q-value makes the range unacceptable rather than preferred.
                    "q" => q = v.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0),
                    "version" => version = Some(v.to_string()),
                    _ => {}
                }
            }
            let format = match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None | Some("1.0.0" | "0.0.1")) => Some(Format::OpenMetrics),
                ("text/plain", None | Some("0.0.4")) => Some(Format::Text),
                _ => None,
            };
            if q > 0.0 {
                ranges.push((q, format));
            }
        }
        // A stable sort: equal q-values keep the client's order.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges.into_iter().find_map(|(_, f)| f).unwrap_or(Format::Text)
    }

    /// A float as both formats write it: shortest round-trip digits, `NaN`, `+Inf`, `-Inf`.
    pub fn float(v: f64) -> String {
        if v.is_nan() {
            "NaN".into()
        } else if v == f64::INFINITY {
            "+Inf".into()
        } else if v == f64::NEG_INFINITY {
            "-Inf".into()
        } else {
            format!("{v}")
        }
    }

    /// Escapes a label value (`\\`, `"`, newline) into `out`, as both formats need.
    pub fn escape_label_value(s: &str, out: &mut String) {
        for c in s.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
    }

    /// HELP text: `\` and newline escaped in both formats, `"` in OpenMetrics too.
    pub fn escape_help(s: &str, format: Format, out: &mut String) {
        for c in s.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '"' if format == Format::OpenMetrics => out.push_str("\\\""),
                c => out.push(c),
            }
        }
    }

    /// A label name from an attribute key: characters outside `[a-zA-Z0-9_]` become `_`, and a
    /// leading digit gets a `key_` prefix (as the OpenTelemetry Prometheus exporter does).
    pub fn label_name(key: &str) -> String {
        let mut s: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        if s.starts_with(|c: char| c.is_ascii_digit()) {
            s.insert_str(0, "key_");
        }
        s
    }

    fn labels(out: &mut String, labels: &[(String, String)]) {
        if labels.is_empty() {
            return;
        }
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape_label_value(v, out);
            out.push('"');
        }
        out.push('}');
    }

    fn metadata(out: &mut String, name: &str, help: &str, kind: &str, unit: Option<&str>, format: Format) {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        escape_help(help, format, out);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind);
        out.push('\n');
        if let Some(u) = unit {
            out.push_str("# UNIT ");
            out.push_str(name);
            out.push(' ');
            out.push_str(u);
            out.push('\n');
        }
    }

    /// Writes one family: in OpenMetrics a counter's family is named without `_total` and its
    /// samples with it; in text 0.0.4 the family and samples both carry `_total`. `UNIT` is
    /// written in OpenMetrics only, where the name ends with the unit.
    pub fn family(out: &mut String, fam: &MetricFamily, format: Format) {
        let om = format == Format::OpenMetrics;
        let (kind, sample_name) = match fam.kind() {
            MetricKind::Counter => ("counter", format!("{}_total", fam.name())),
            MetricKind::Gauge => ("gauge", fam.name().to_string()),
        };
        let family_name = if om { fam.name() } else { sample_name.as_str() };
        let unit = fam
            .unit()
            .map(|u| u.prometheus())
            .filter(|u| om && fam.name().strip_suffix(u).is_some_and(|n| n.ends_with('_')));
        metadata(out, family_name, fam.help(), kind, unit, format);
        for (l, v) in fam.samples() {
            out.push_str(&sample_name);
            labels(out, &l);
            out.push(' ');
            v.render(out);
            out.push('\n');
        }
    }

    /// Writes `target_info` with the resource attributes as labels (keys that collide once
    /// sanitised are joined with `;`, in attribute order); nothing for an empty resource.
    pub fn target_info(out: &mut String, resource: &[(String, String)], format: Format) {
        if resource.is_empty() {
            return;
        }
        let mut l: Vec<(String, String)> = Vec::new();
        for (k, v) in resource {
            let name = label_name(k);
            match l.iter_mut().find(|(n, _)| *n == name) {
                Some((_, joined)) => {
                    joined.push(';');
                    joined.push_str(v);
                }
                None => l.push((name, v.clone())),
            }
        }
        let help = "Target metadata";
        match format {
            Format::OpenMetrics => metadata(out, "target", help, "info", None, format),
            Format::Text => metadata(out, "target_info", help, "gauge", None, format),
        }
        out.push_str("target_info");
        labels(out, &l);
        out.push_str(" 1\n");
    }
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

    #[test]
    fn accept_negotiation_follows_q_values() {
        use exposition::{Format::*, negotiate};
        let cases: &[(Option<&str>, exposition::Format)] = &[
            (None, Text),
            (Some(""), Text),
            (Some("*/*"), Text),
            (Some("text/plain"), Text),
            (Some("application/openmetrics-text"), OpenMetrics),
            (Some("application/openmetrics-text; version=1.0.0; charset=utf-8"), OpenMetrics),
            (Some("application/openmetrics-text;version=0.0.1"), OpenMetrics),
            // An OpenMetrics version this endpoint does not write is passed over.
            (Some("application/openmetrics-text;version=2.0.0"), Text),
            // Prometheus 2.x's scrape header.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            // Prometheus 3's, with a text/plain version it does not write ranked in between.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                ),
                OpenMetrics,
            ),
            // q-values, not order, decide; equal q keeps the client's order.
            (Some("application/openmetrics-text;q=0.3, text/plain;version=0.0.4;q=0.9"), Text),
            (Some("text/plain;q=0.2, application/openmetrics-text;q=0.8"), OpenMetrics),
            (Some("application/openmetrics-text, text/plain"), OpenMetrics),
            (Some("text/plain, application/openmetrics-text"), Text),
            // q=0 means not acceptable; a malformed q is not a preference.
            (Some("application/openmetrics-text;q=0, text/plain;q=0.1"), Text),
            (Some("application/openmetrics-text;q=0"), Text),
            (Some("application/openmetrics-text;q=high, text/plain;q=0.1"), Text),
            (Some("Application/OpenMetrics-Text; Q=0.9"), OpenMetrics),
            (Some("application/json, application/openmetrics-text;q=0.1"), OpenMetrics),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(*accept), *want, "{accept:?}");
        }
        assert_eq!(OpenMetrics.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
        assert_eq!(Text.content_type(), "text/plain; version=0.0.4; charset=utf-8");
    }

    #[test]
    fn openmetrics_and_text_render_counters_units_and_target_info() {
        let t = Telemetry::new();
        t.receiver(&ComponentId::parse("otlp").unwrap(), "grpc").accepted(Signal::Traces, 3);
        t.component_counter(
            "inferwatch_test_events",
            "Help with \\ and \"quotes\"\nand a newline",
            &[("v", "a\"b\\c\nd")],
        )
        .inc_by(2);
        t.set_resource(vec![
            ("service.name".into(), "inferwatch".into()),
            ("k8s.pod.name".into(), "p-1".into()),
            ("k8s_pod.name".into(), "dup".into()),
            ("1st".into(), "x".into()),
        ]);
        let om = t.render_as(Format::OpenMetrics);
        let lines: Vec<&str> = om.lines().collect();
        assert_eq!(lines.last(), Some(&"# EOF"), "{om}");
        assert_eq!(om.matches("# EOF").count(), 1);
        // target_info first, as an info family named `target`.
        assert_eq!(
            &lines[..3],
            [
                "# HELP target Target metadata",
                "# TYPE target info",
                "target_info{service_name=\"inferwatch\",k8s_pod_name=\"p-1;dup\",key_1st=\"x\"} 1",
            ]
        );
        // Counter families are named without _total, their samples with it.
        assert!(om.contains("# TYPE otelcol_receiver_accepted_spans counter\n"), "{om}");
        assert!(om.contains("otelcol_receiver_accepted_spans_total{receiver=\"otlp\",transport=\"grpc\"} 3\n"));
        assert!(!om.contains("# TYPE otelcol_receiver_accepted_spans_total"));
        // UNIT only where the name ends with it.
        assert!(om.contains("# UNIT otelcol_process_cpu_seconds seconds\n"), "{om}");
        assert!(!om.contains("# UNIT otelcol_process_memory_rss"), "{om}");
        assert!(!om.contains("# UNIT otelcol_process_uptime"), "{om}");
        // Escaping: HELP escapes quotes in OpenMetrics only; label values in both.
        assert!(
            om.contains("# HELP inferwatch_test_events Help with \\\\ and \\\"quotes\\\"\\nand a newline\n"),
            "{om}"
        );
        assert!(om.contains("inferwatch_test_events_total{v=\"a\\\"b\\\\c\\nd\"} 2\n"), "{om}");
        // Every metadata line precedes its family's samples, and each family appears once.
        let mut seen = std::collections::HashSet::new();
        for l in &lines {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                assert!(seen.insert(rest.split(' ').next().unwrap().to_string()), "{l} twice");
            }
        }

        let text = t.render_as(Format::Text);
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(
            text.starts_with("# HELP target_info Target metadata\n# TYPE target_info gauge\ntarget_info{"),
            "{text}"
        );
        assert!(text.contains("# TYPE otelcol_receiver_accepted_spans_total counter\n"), "{text}");
        assert!(text.contains("otelcol_receiver_accepted_spans_total{receiver=\"otlp\",transport=\"grpc\"} 3\n"));
        assert!(
            text.contains("# HELP inferwatch_test_events_total Help with \\\\ and \"quotes\"\\nand a newline\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE otelcol_process_memory_rss gauge\n"));
        // No resource, no target_info.
        assert!(!Telemetry::new().render_as(Format::Text).contains("target_info"));
    }

    #[test]
    fn declared_families_register_on_first_use_with_their_labels() {
        const HITS: Counters<2> =
            Counters::new("inferwatch_test_hits", "Hits by a test component", ["component", "result"]);
        const UP: Gauges<1> = Gauges::new("inferwatch_test_up", "1 while a test component is up", ["component"]);
        let t = Telemetry::new();
        assert!(!t.render().contains("inferwatch_test_hits"), "no family before a component declares it");
        HITS.get(&t, ["a/1", "ok"]).inc_by(2);
        HITS.get(&t, ["a/1", "ok"]).inc();
        UP.get(&t, ["a/1"]).set(1);
        let text = t.render_as(Format::Text);
        assert!(text.contains("# HELP inferwatch_test_hits_total Hits by a test component\n"), "{text}");
        assert!(text.contains("inferwatch_test_hits_total{component=\"a/1\",result=\"ok\"} 3\n"), "{text}");
        assert!(text.contains("# TYPE inferwatch_test_up gauge\ninferwatch_test_up{component=\"a/1\"} 1\n"), "{text}");
        // A name declared as a counter is not also a gauge: the gauge handle is not exported.
        t.component_gauge("inferwatch_test_hits", "", &[("component", "b")]).set(9);
        let text = t.render_as(Format::Text);
        assert_eq!(text.matches("# TYPE inferwatch_test_hits_total").count(), 1, "{text}");
        assert!(!text.contains("component=\"b\""), "{text}");
    }

    #[test]
    fn families_are_announced_to_watchers_once() {
        let t = Telemetry::new();
        let before = t.families().len();
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s = seen.clone();
        t.on_family(move |f| s.lock().push((f.name().to_string(), f.kind(), f.number_kind())));
        assert_eq!(seen.lock().len(), before);
        let c = t.component_counter("inferwatch_late_family", "declared after the watcher", &[("k", "v")]);
        c.inc_by(5);
        let _again = t.component_counter("inferwatch_late_family", "", &[("k", "w")]);
        let seen = seen.lock();
        assert_eq!(seen.len(), before + 1, "a family is announced once");
        assert_eq!(seen.last().unwrap(), &("inferwatch_late_family".to_string(), MetricKind::Counter, NumberKind::Int));
        assert!(seen.contains(&("otelcol_process_uptime".to_string(), MetricKind::Counter, NumberKind::Float)));
        assert!(seen.contains(&("otelcol_exporter_queue_size".to_string(), MetricKind::Gauge, NumberKind::Int)));
        let fam = t.families().into_iter().find(|f| f.name() == "inferwatch_late_family").unwrap();
        let samples = fam.samples();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0], (vec![("k".to_string(), "v".to_string())], Number::U64(5)));
    }
}
