//! `inferwatch demo`: the simulator with a fault that starts after a while, the agent on a
//! demo pipeline receiving the simulator's spans, and the bench client driving load; the
//! golden signals (from the spans the agent receives) print live until Ctrl-C or --duration, with
//! the alerts of the detectors running on them as they fire and resolve.

use async_trait::async_trait;
use clap::{Args, Parser};
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, parse_config,
};
use inferwatch_core::config;
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::graph::Service;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Options of `inferwatch demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Fault to inject: queue_blocking, context_collapse, batch_saturation, kv_pressure, cold_start, slow_drift.
    #[arg(long, default_value = "queue_blocking")]
    pub fault: String,
    /// Seconds before the fault starts.
    #[arg(long, default_value_t = 20)]
    pub fault_after: u64,
    /// Seconds the fault lasts (0: until the end), so the alert is seen to resolve.
    #[arg(long, default_value_t = 15)]
    pub fault_for: u64,
    /// Fault strength (see the simulator's fault table).
    #[arg(long)]
    pub strength: Option<f64>,
    /// Requests per second of the bench client.
    #[arg(long, default_value_t = 3.0)]
    pub rate: f64,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seconds between two lines of the live view.
    #[arg(long, default_value_t = 2)]
    pub every: u64,
    /// Sliding window of the live percentiles, in seconds.
    #[arg(long, default_value_t = 10)]
    pub window: u64,
}

/// One finished request as its `llm_request` span tells it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    ttft: f64,
    tpot: Option<f64>,
    e2e: f64,
    queue: f64,
}

/// What the demo exporter collects from the spans.
#[derive(Default)]
struct View {
    samples: Mutex<VecDeque<Sample>>,
    total: std::sync::atomic::AtomicU64,
}

fn attr_f64(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<f64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| match v.value {
        Some(Value::DoubleValue(d)) => Some(d),
        Some(Value::IntValue(i)) => Some(i as f64),
        _ => None,
    })
}

impl View {
    fn add(&self, data: &Payload) {
        let Ok(decoded) = data.decoded() else { return };
        let Payload::Traces(req) = decoded.as_ref() else { return };
        let now = Instant::now();
        let mut s = self.samples.lock();
        for span in req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
            if span.name != "llm_request" {
                continue;
            }
            let a = &span.attributes;
            let (Some(ttft), Some(e2e)) =
                (attr_f64(a, "gen_ai.latency.time_to_first_token"), attr_f64(a, "gen_ai.latency.e2e"))
            else {
                continue;
            };
            let queue = attr_f64(a, "gen_ai.latency.time_in_queue").unwrap_or(0.0);
            let out = attr_f64(a, "gen_ai.usage.completion_tokens").unwrap_or(0.0);
            let decode = attr_f64(a, "gen_ai.latency.time_in_model_decode");
            let tpot = decode.filter(|_| out > 1.0).map(|d| d / (out - 1.0));
            s.push_back(Sample { at: now, ttft, tpot, e2e, queue });
            self.total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Percentiles over the window: (count, ttft p50/p95, tpot p50, e2e p95, queue p95).
    fn line(&self, window: Duration) -> String {
        let mut s = self.samples.lock();
        let cutoff = Instant::now().checked_sub(window);
        while let (Some(c), Some(f)) = (cutoff, s.front()) {
            if f.at >= c {
                break;
            }
            s.pop_front();
        }
        let pct = |mut v: Vec<f64>, p: f64| -> String {
            if v.is_empty() {
                return "    -".into();
            }
            v.sort_by(|a, b| a.total_cmp(b));
            let i = ((v.len() as f64 - 1.0) * p).round() as usize;
            let x = v[i.min(v.len() - 1)];
            if x >= 1.0 { format!("{x:>4.2}s") } else { format!("{:>3.0}ms", x * 1000.0) }
        };
        let ttft: Vec<f64> = s.iter().map(|x| x.ttft).collect();
        let tpot: Vec<f64> = s.iter().filter_map(|x| x.tpot).collect();
        let e2e: Vec<f64> = s.iter().map(|x| x.e2e).collect();
        let queue: Vec<f64> = s.iter().map(|x| x.queue).collect();
        format!(
            "req {:>3}  TTFT p50 {} p95 {}  TPOT p50 {}  e2e p95 {}  queue p95 {}",
            s.len(),
            pct(ttft.clone(), 0.5),
            pct(ttft, 0.95),
            pct(tpot, 0.5),
            pct(e2e, 0.95),
            pct(queue, 0.95)
        )
    }
}

/// An exporter that feeds the live view (registered only in the demo's registry).
struct ViewFactory(Arc<View>);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewConfig {}

impl ExporterFactory for ViewFactory {
    fn type_name(&self) -> &'static str {
        "demo_view"
    }
    fn signals(&self) -> &'static [Signal] {
        &[Signal::Traces]
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<ViewConfig>(cfg).map(|_| ())
    }
    fn create(&self, _ctx: CreateContext, _cfg: &serde_json::Value, _s: Signal) -> Result<NodeRef, ComponentError> {
        Ok(Arc::new(ViewNode(self.0.clone())))
    }
}

struct ViewNode(Arc<View>);

#[async_trait]
impl Consumer for ViewNode {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.add(&data);
        Ok(())
    }
}

#[async_trait]
impl Node for ViewNode {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}

/// An exporter that prints the alerts connector's records as they come (demo registry only).
struct AlertsViewFactory(Instant);

impl ExporterFactory for AlertsViewFactory {
    fn type_name(&self) -> &'static str {
        "demo_alerts"
    }
    fn signals(&self) -> &'static [Signal] {
        &[Signal::Logs]
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<ViewConfig>(cfg).map(|_| ())
    }
    fn create(&self, _ctx: CreateContext, _cfg: &serde_json::Value, _s: Signal) -> Result<NodeRef, ComponentError> {
        Ok(Arc::new(AlertsView(self.0)))
    }
}

struct AlertsView(Instant);

#[async_trait]
impl Consumer for AlertsView {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let Ok(decoded) = data.decoded() else { return Ok(()) };
        let Payload::Logs(req) = decoded.as_ref() else { return Ok(()) };
        let t = self.0.elapsed().as_secs();
        for lr in req.resource_logs.iter().flat_map(|r| &r.scope_logs).flat_map(|s| &s.log_records) {
            // The same string form as eval's capture of alert records.
            let a = inferwatch_eval::harness::attrs(&lr.attributes);
            let attr_str = |k: &str| a.get(k).cloned().unwrap_or_default();
            let transition = attr_str("alert.transition");
            if transition == "repeat" {
                continue;
            }
            let state = attr_str("alert.state").to_uppercase();
            println!(
                "t={t:>4}s  ALERT {state:<8} {:<8} {} on {} of {} ({transition}; level {}, threshold {})",
                attr_str("alert.severity"),
                attr_str("detector"),
                attr_str("metric"),
                attr_str("gen_ai.request.model"),
                attr_str("evidence.level"),
                attr_str("evidence.threshold"),
            );
        }
        Ok(())
    }
}

#[async_trait]
impl Node for AlertsView {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `inferwatch demo`.
pub fn run(args: DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inferwatch demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(demo(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferwatch demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let view = Arc::new(View::default());
    // 1. The agent: OTLP in, batch, the live view and a debug summary.
    let grpc = free_port()?;
    // The detectors work on 5-second windows of the spans so that the demo alerts within seconds
    // (a production pipeline uses 1-minute windows and `for: 2m`; docs/eval.md).
    let yaml = format!(
        r#"
receivers:
  otlp: {{ protocols: {{ grpc: {{ endpoint: "127.0.0.1:{grpc}" }} }} }}
processors:
  batch: {{ timeout: 200ms }}
  kv_pressure: {{ stale_after: 30s }}
  zscore_skew: {{ metrics: [llm.ttft.p95, llm.e2e.p95], window: 12 }}
connectors:
  llm_signals: {{ window: 5s, allowed_lateness: 1s }}
  alerts: {{ for: 5s, resolve_after: 10s, repeat_interval: 0s, per_detector: {{ zscore_skew: {{ warning: 0.9, critical: 1.0 }} }} }}
exporters:
  demo_view: {{}}
  demo_alerts: {{}}
service:
  telemetry: {{ metrics: {{ level: none }} }}
  pipelines:
    traces: {{ receivers: [otlp], processors: [batch], exporters: [demo_view, llm_signals] }}
    metrics/detect: {{ receivers: [llm_signals], processors: [kv_pressure, zscore_skew], exporters: [alerts] }}
    logs/alerts: {{ receivers: [alerts], exporters: [demo_alerts] }}
"#
    );
    let cfg = config::load_str("demo.yaml", &yaml, &|_| None).map_err(|e| {
        anyhow::anyhow!("demo pipeline: {}", e.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
    })?;
    let started = Instant::now();
    let mut registry = inferwatch::components::registry();
    registry.add_exporter(Arc::new(ViewFactory(view.clone())));
    registry.add_exporter(Arc::new(AlertsViewFactory(started)));
    let errors = config::validate(&cfg, &registry);
    anyhow::ensure!(errors.is_empty(), "demo pipeline: {errors:?}");
    let mut agent = Service::build(&cfg, &registry, Arc::new(Telemetry::new())).context("building the agent")?;
    agent.start().await.context("starting the agent")?;

    // 2. The simulator, sending its spans to the agent.
    #[derive(Parser)]
    struct SimCli {
        #[command(flatten)]
        a: inferwatch_sim::server::SimArgs,
    }
    let sim_args = SimCli::try_parse_from([
        "sim",
        "--port",
        "0",
        "--served-model-name",
        "demo-llama",
        "--seed",
        "7",
        "--otlp-traces-endpoint",
        &format!("grpc://127.0.0.1:{grpc}"),
        "--otlp-batch-delay-ms",
        "200",
    ])
    .context("simulator options")?
    .a;
    let sim = inferwatch_sim::server::SimServer::start(sim_args).await.context("starting the simulator")?;
    let base = sim.base_url();

    // 3. The fault, scheduled through the simulator's admin API.
    let mut fault = serde_json::json!({ "kind": args.fault, "onset": format!("{}s", args.fault_after) });
    // Every fault kind but cold_start (a one-off restart) takes an end time.
    if args.fault_for > 0 && args.fault != "cold_start" {
        fault["until"] = serde_json::json!(format!("{}s", args.fault_after + args.fault_for));
    }
    if let Some(s) = args.strength {
        fault["strength"] = serde_json::json!(s);
    }
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{base}/admin/faults"))
        .json(&serde_json::json!({ "faults": [fault] }))
        .send()
        .await
        .context("scheduling the fault")?;
    anyhow::ensure!(
        resp.status().is_success(),
        "the simulator refused the fault: {}",
        resp.text().await.unwrap_or_default()
    );

    // 4. The bench client, driving load.
    #[derive(Parser)]
    struct BenchCli {
        #[command(flatten)]
        a: inferwatch_probe::BenchArgs,
    }
    let rate = args.rate.to_string();
    let bench_args = BenchCli::try_parse_from([
        "bench",
        "--endpoint",
        &base,
        "--model",
        "demo-llama",
        "--rate",
        &rate,
        "--duration",
        "24h",
        "--max-tokens",
        "64",
        "--prompt-tokens",
        "512",
    ])
    .context("bench options")?
    .a;
    let stop = CancellationToken::new();
    let bench = tokio::spawn(inferwatch_probe::run_until(bench_args, stop.clone()));

    println!("inferwatch demo: simulator {base}, agent OTLP grpc 127.0.0.1:{grpc}");
    println!(
        "fault {} from t={}s{}; golden signals from the llm_request spans the agent receives ({} s window), \
         and the alerts of kv_pressure / zscore_skew as they fire and resolve:",
        args.fault,
        args.fault_after,
        if args.fault_for > 0 { format!(" to t={}s", args.fault_after + args.fault_for) } else { String::new() },
        args.window
    );
    let mut tick = tokio::time::interval(Duration::from_secs(args.every.max(1)));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let t = started.elapsed().as_secs();
        let faulty = t >= args.fault_after && (args.fault_for == 0 || t < args.fault_after + args.fault_for);
        let phase = if faulty { format!("FAULT {}", args.fault) } else { "healthy".to_string() };
        println!("t={t:>4}s  {phase:<24} {}", view.line(Duration::from_secs(args.window)));
        if args.duration.is_some_and(|d| t >= d) {
            break;
        }
    }
    stop.cancel();
    let _ = bench.await;
    sim.shutdown().await;
    agent.shutdown(Duration::from_secs(5)).await;
    println!("spans received by the agent: {}", view.total.load(std::sync::atomic::Ordering::Relaxed));
    Ok(())
}
