//! The live part of `inferwatch demo`: the simulator with a fault that starts after a while, the
//! agent on the demo pipeline receiving the simulator's spans, and the bench client driving load;
//! the golden signals (from the spans the agent receives) print live, with the alerts of the
//! detectors running on them as they fire and resolve.

use super::DemoArgs;
use async_trait::async_trait;
use clap::Parser;
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
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Window of llm_signals in the demo pipeline (a production pipeline uses 1 minute).
pub const WINDOW: &str = "5s";

/// How long the live part runs on after the last alert resolved (the healthy lines after it).
const AFTER_RESOLVE: Duration = Duration::from_secs(3);
/// Longest the live part waits for the alerts to resolve after the fault ended.
const RESOLVE_CAP: Duration = Duration::from_secs(30);

/// The demo's agent configuration: `receiver` (its YAML, named `otlp` or `eval_feed`) feeds the
/// spans (through `batch` when `batch`) to `span_exporters` and llm_signals; the detectors' alerts
/// go to `alerts_exporter`.
///
/// llm_signals works on 5-second windows so that the demo alerts within seconds. kv_pressure fires
/// on its first window over a threshold (`for: 0s`): its verdict is a fixed rule per window, and a
/// queue that blocks in stalls shows in every other 5-second window only (blocked requests finish
/// in bursts after each stall), so `for: 5s` (two windows in a row) could miss a fault lasting
/// several windows; `resolve_after: 10s` keeps the alert firing through one quiet window.
pub fn config(receiver: &str, batch: bool, span_exporters: &[&str], alerts_exporter: &str) -> String {
    let mut spans: Vec<&str> = span_exporters.to_vec();
    spans.push("llm_signals");
    format!(
        r#"
receivers:
  {receiver}
processors:
  batch: {{ timeout: 200ms }}
  kv_pressure: {{ stale_after: 30s }}
  zscore_skew: {{ metrics: [llm.ttft.p95, llm.e2e.p95], window: 12 }}
connectors:
  llm_signals: {{ window: {WINDOW}, allowed_lateness: 1s }}
  alerts: {{ for: 5s, resolve_after: 10s, repeat_interval: 0s, per_detector: {{ zscore_skew: {{ warning: 0.9, critical: 1.0 }}, kv_pressure: {{ for: 0s }} }} }}
exporters:
  {alerts_exporter}: {{}}
{extra_exporters}
service:
  telemetry: {{ metrics: {{ level: none }} }}
  pipelines:
    traces: {{ receivers: [{receiver_name}], processors: [{batch}], exporters: [{spans}] }}
    metrics/detect: {{ receivers: [llm_signals], processors: [kv_pressure, zscore_skew], exporters: [alerts] }}
    logs/alerts: {{ receivers: [alerts], exporters: [{alerts_exporter}] }}
"#,
        receiver_name = receiver.split(':').next().unwrap_or_default().trim(),
        extra_exporters = span_exporters.iter().map(|e| format!("  {e}: {{}}\n")).collect::<String>(),
        spans = spans.join(", "),
        batch = if batch { "batch" } else { "" },
    )
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
    total: AtomicU64,
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
            self.total.fetch_add(1, Ordering::Relaxed);
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

/// One alert transition the demo printed: wall seconds since the start and what it was.
#[derive(Debug, Clone)]
struct Seen {
    t: f64,
    severity: String,
    detector: String,
    metric: String,
}

/// The alerts seen so far: the ones firing now (by identity) and every fire and resolve.
#[derive(Default)]
struct AlertLog {
    open: BTreeMap<String, Seen>,
    fired: Vec<Seen>,
    resolved: Vec<Seen>,
}

/// An exporter that prints the alerts connector's records as they come (demo registry only).
struct AlertsViewFactory {
    started: Instant,
    log: Arc<Mutex<AlertLog>>,
}

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
        Ok(Arc::new(AlertsView { started: self.started, log: self.log.clone() }))
    }
}

struct AlertsView {
    started: Instant,
    log: Arc<Mutex<AlertLog>>,
}

#[async_trait]
impl Consumer for AlertsView {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let Ok(decoded) = data.decoded() else { return Ok(()) };
        let Payload::Logs(req) = decoded.as_ref() else { return Ok(()) };
        let t = self.started.elapsed().as_secs_f64();
        for lr in req.resource_logs.iter().flat_map(|r| &r.scope_logs).flat_map(|s| &s.log_records) {
            // The same string form as eval's capture of alert records.
            let a = inferwatch_eval::harness::attrs(&lr.attributes);
            let attr_str = |k: &str| a.get(k).cloned().unwrap_or_default();
            let transition = attr_str("alert.transition");
            if transition == "repeat" {
                continue;
            }
            let state = attr_str("alert.state").to_uppercase();
            let seen = Seen {
                t,
                severity: attr_str("alert.severity"),
                detector: attr_str("detector"),
                metric: attr_str("metric"),
            };
            let id = match a.get("alert.id") {
                Some(id) => id.clone(),
                None => format!("{}/{}/{}", seen.detector, seen.metric, attr_str("gen_ai.request.model")),
            };
            let summary = a.get("alert.summary").map(|s| format!("\n           {s}")).unwrap_or_default();
            println!(
                "t={:>4}s  ALERT {state:<8} {:<8} {} on {} of {} ({transition}; level {}, threshold {}){summary}",
                t as u64,
                seen.severity,
                seen.detector,
                seen.metric,
                attr_str("gen_ai.request.model"),
                attr_str("evidence.level"),
                attr_str("evidence.threshold"),
            );
            let mut log = self.log.lock();
            if state == "RESOLVED" {
                log.open.remove(&id);
                log.resolved.push(seen);
            } else if transition == "fire" {
                log.open.insert(id, seen.clone());
                log.fired.push(seen);
            }
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

/// When the fault ends (seconds since the start), if it does.
fn fault_end(args: &DemoArgs) -> Option<u64> {
    (args.fault_for > 0).then_some(args.fault_after + args.fault_for)
}

/// Runs the live part until Ctrl-C, `--duration`, or (by default, for a fault that ends) shortly
/// after its alerts resolved; `between` is polled at every line and may print (the drift replay's
/// result). Returns whether Ctrl-C stopped it.
pub async fn run(args: &DemoArgs, mut between: impl FnMut()) -> anyhow::Result<bool> {
    use anyhow::Context;
    let view = Arc::new(View::default());
    let log: Arc<Mutex<AlertLog>> = Arc::default();
    // 1. The agent: OTLP in, batch, the live view and the detectors.
    let grpc = free_port()?;
    let receiver = format!(r#"otlp: {{ protocols: {{ grpc: {{ endpoint: "127.0.0.1:{grpc}" }} }} }}"#);
    let yaml = config(&receiver, true, &["demo_view"], "demo_alerts");
    let cfg = config::load_str("demo.yaml", &yaml, &|_| None).map_err(|e| {
        anyhow::anyhow!("demo pipeline: {}", e.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
    })?;
    let started = Instant::now();
    let mut registry = inferwatch::components::registry();
    registry.add_exporter(Arc::new(ViewFactory(view.clone())));
    registry.add_exporter(Arc::new(AlertsViewFactory { started, log: log.clone() }));
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

    // 3. The fault, scheduled through the simulator's admin API (its times count from the call,
    // the demo's from `started`).
    let onset = (args.fault_after as f64 - started.elapsed().as_secs_f64()).max(0.0);
    let mut fault = serde_json::json!({ "kind": args.fault, "onset": onset });
    // Every fault kind but cold_start (a one-off restart) takes an end time.
    if args.fault_for > 0 && args.fault != "cold_start" {
        fault["until"] = serde_json::json!(onset + args.fault_for as f64);
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

    println!("LIVE: simulator {base}, agent OTLP grpc 127.0.0.1:{grpc}");
    println!(
        "fault {} from t={}s{}; golden signals from the llm_request spans the agent receives ({} s window), \
         and the alerts of kv_pressure / zscore_skew (on {WINDOW} windows) as they fire and resolve:",
        args.fault,
        args.fault_after,
        fault_end(args).map(|e| format!(" to t={e}s")).unwrap_or_default(),
        args.window
    );
    let mut tick = tokio::time::interval(Duration::from_secs(args.every.max(1)));
    tick.tick().await;
    let mut quiet_since: Option<Instant> = None;
    let interrupted = loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break true,
        }
        between();
        let t = started.elapsed().as_secs();
        let faulty = t >= args.fault_after && fault_end(args).is_none_or(|e| t < e);
        let phase = if faulty { format!("FAULT {}", args.fault) } else { "healthy".to_string() };
        println!("t={t:>4}s  {phase:<24} {}", view.line(Duration::from_secs(args.window)));
        match (args.duration, fault_end(args)) {
            (Some(d), _) if t >= d => break false,
            (None, Some(end)) if t >= end => {
                let l = log.lock();
                let settled = !l.fired.is_empty() && l.open.is_empty();
                drop(l);
                if settled {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= AFTER_RESOLVE {
                        break false;
                    }
                }
                if t >= end + RESOLVE_CAP.as_secs() {
                    break false;
                }
            }
            _ => {}
        }
    };
    stop.cancel();
    let _ = bench.await;
    sim.shutdown().await;
    agent.shutdown(Duration::from_secs(5)).await;
    println!("spans received by the agent: {}", view.total.load(Ordering::Relaxed));
    println!("{}", summary(args, &log.lock()));
    Ok(interrupted)
}

/// The live part's result line: when the first alert fired after the fault started, and when it resolved.
fn summary(args: &DemoArgs, log: &AlertLog) -> String {
    let start = args.fault_after as f64;
    let Some(first) = log.fired.iter().find(|s| s.t >= start) else {
        return format!("LIVE RESULT: no alert fired after the {} fault started (t={}s)", args.fault, args.fault_after);
    };
    let resolved = log
        .resolved
        .iter()
        .find(|r| r.t >= first.t && r.detector == first.detector && r.metric == first.metric)
        .map(|r| format!("resolved at t={:.1}s", r.t))
        .unwrap_or_else(|| "not resolved yet".into());
    let early = log.fired.iter().filter(|s| s.t < start).count();
    format!(
        "LIVE RESULT: {} fault from t={}s: {} {} on {} fired at t={:.1}s ({:.1} s after the fault started), {resolved}{}",
        args.fault,
        args.fault_after,
        first.severity,
        first.detector,
        first.metric,
        first.t,
        first.t - start,
        if early > 0 { format!("; {early} alert(s) before the fault") } else { String::new() },
    )
}

#[cfg(test)]
mod tests {
    //! The demo pipeline on the data's own time (eval's harness): a queue that blocks in stalls
    //! shows in every other window, as the simulator's queue_blocking fault does at the demo's load.

    use super::config;
    use inferwatch_core::pdata::Payload;
    use inferwatch_eval::Harness;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    const S: u64 = 1_000_000_000;
    /// An epoch-aligned start (a multiple of the 5-second window), so windows are [T0 + 5k, T0 + 5k + 5).
    const T0: u64 = 1_767_225_600 * S;

    fn kv(key: &str, v: f64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }),
            key_strindex: 0,
        }
    }

    /// A vLLM request span ending at `end` (ns) that waited `queue` s.
    fn span(end: u64, queue: f64) -> Span {
        Span {
            name: "llm_request".into(),
            start_time_unix_nano: end - 2 * S,
            end_time_unix_nano: end,
            attributes: vec![
                kv("gen_ai.latency.time_in_queue", queue),
                kv("gen_ai.latency.time_to_first_token", 0.15 + queue),
                kv("gen_ai.latency.e2e", 2.0 + queue),
                kv("gen_ai.usage.completion_tokens", 64.0),
                kv("gen_ai.usage.prompt_tokens", 512.0),
            ],
            ..Default::default()
        }
    }

    fn payload(spans: Vec<Span>) -> Payload {
        let resource = Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue { value: Some(any_value::Value::StringValue("vllm-server".into())) }),
                key_strindex: 0,
            }],
            ..Default::default()
        };
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource),
                scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
                schema_url: String::new(),
            }],
        })
    }

    /// Runs `windows` (per 5-second window from T0: its requests' queue times, ending 0.4 s apart
    /// from 0.2 s into the window) through the demo pipeline; returns the (transition, seconds
    /// since T0) of its kv_pressure alert records on llm.queue.p99.
    async fn alerts(windows: &[Vec<f64>]) -> Vec<(String, f64)> {
        // No batch processor: eval's harness ends the input before a batch would flush.
        let yaml = config("eval_feed: {}", false, &[], "eval_capture");
        let harness = Harness::start(&yaml, inferwatch::components::registry()).await.expect("demo pipeline starts");
        for (w, queues) in windows.iter().enumerate() {
            // One export per window, as the simulator's 200 ms batches arrive in order.
            let start = T0 + w as u64 * 5 * S;
            let spans = queues.iter().enumerate().map(|(i, q)| span(start + S / 5 + i as u64 * 2 * S / 5, *q));
            harness.send(payload(spans.collect())).await.expect("accepted");
        }
        let captured = harness.finish().await.expect("drained");
        captured
            .records()
            .iter()
            .filter(|r| {
                r.attrs.get("detector").map(String::as_str) == Some("kv_pressure")
                    && r.attrs.get("metric").map(String::as_str) == Some("llm.queue.p99")
            })
            .map(|r| {
                let transition = r.attrs.get("alert.transition").cloned().unwrap_or_default();
                (transition, (r.time_ns - T0) as f64 / 1e9)
            })
            .collect()
    }

    fn healthy() -> Vec<f64> {
        vec![0.02, 0.05, 0.01, 0.08, 0.03, 0.04, 0.02, 0.06, 0.01, 0.03, 0.05, 0.02]
    }

    fn blocked() -> Vec<f64> {
        vec![0.02, 1.9, 1.6, 1.5, 1.2, 1.1, 0.9, 0.05, 0.03, 0.02, 0.04, 0.01]
    }

    #[tokio::test]
    async fn a_stalling_queue_seen_in_every_other_window_fires_at_its_first_window_and_resolves_after() {
        // Healthy for 10 s, the fault for 20 s (its windows alternate: blocked, quiet, blocked,
        // quiet — the bursts of blocked requests land in every other window), healthy for 30 s.
        let mut windows = vec![healthy(), healthy()];
        windows.extend([blocked(), healthy(), blocked(), healthy()]);
        windows.extend(std::iter::repeat_with(healthy).take(6));
        let got = alerts(&windows).await;
        let fire: Vec<f64> = got.iter().filter(|(k, _)| k == "fire").map(|(_, t)| *t).collect();
        let resolve: Vec<f64> = got.iter().filter(|(k, _)| k == "resolve").map(|(_, t)| *t).collect();
        // Fired once, at the end of the first blocked window (t = 15 s); with `for: 5s` the quiet
        // window after each blocked one restarted pending and nothing fired.
        assert_eq!(fire, vec![15.0], "{got:?}");
        // Resolved once, after the fault: the last blocked window ends at 25 s, then 10 s quiet.
        assert_eq!(resolve.len(), 1, "{got:?}");
        assert!(resolve[0] >= 35.0 && resolve[0] <= 45.0, "{got:?}");
    }

    #[tokio::test]
    async fn a_healthy_queue_raises_no_alert() {
        let windows: Vec<Vec<f64>> = std::iter::repeat_with(healthy).take(12).collect();
        let got = alerts(&windows).await;
        assert!(got.is_empty(), "{got:?}");
    }
}
