//! Connector `alerts` through its factory and the Consumer contract: the exact life cycle on
//! hand-made level series, the records' fields and evidence, grouping, per-detector
//! thresholds, the cap, and checkpoint / restore through a real state store.

use async_trait::async_trait;
use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, NodeRef, PathSeg};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::state::Store;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::alerts::AlertsFactory;
use inferwatch_processors::detect::{BREACH_ETA, Output, Point, kv_f64, kv_i64, kv_str};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use parking_lot::Mutex;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

/// Captures what the connector emits; refuses the first `refuse` payloads.
#[derive(Default)]
struct Capture {
    got: Mutex<Vec<Payload>>,
    refuse: AtomicUsize,
}

#[async_trait]
impl Consumer for Capture {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        if self.refuse.load(Ordering::SeqCst) > 0 {
            self.refuse.fetch_sub(1, Ordering::SeqCst);
            return Err(ConsumeError::refused(RefuseReason::QueueFull, None, "full"));
        }
        self.got.lock().push(data);
        Ok(())
    }
}

impl Capture {
    /// Every record emitted so far (with its resource), then cleared.
    fn take(&self) -> Vec<(Resource, LogRecord)> {
        let mut out = Vec::new();
        for p in self.got.lock().drain(..) {
            let Payload::Logs(req) = p else { panic!("not logs: {:?}", p.signal()) };
            for rl in req.resource_logs {
                let res = rl.resource.unwrap_or_default();
                for sl in rl.scope_logs {
                    assert_eq!(sl.scope.unwrap().name, "inferwatch.alerts");
                    for r in sl.log_records {
                        out.push((res.clone(), r));
                    }
                }
            }
        }
        out
    }
}

struct Rig {
    node: NodeRef,
    out: Arc<Capture>,
    telemetry: Arc<Telemetry>,
}

fn rig_with(cfg: serde_json::Value, host: Arc<Host>) -> Rig {
    let out = Arc::new(Capture::default());
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext { id: ComponentId::parse("alerts").unwrap(), telemetry: telemetry.clone(), host };
    let node = AlertsFactory.create(ctx, &cfg, Signal::Metrics, Signal::Logs, out.clone()).unwrap();
    Rig { node, out, telemetry }
}

fn rig(cfg: serde_json::Value) -> Rig {
    rig_with(cfg, Host::new())
}

fn resource(instance: &str) -> Resource {
    Resource {
        attributes: vec![
            kv_str("service.name", "vllm"),
            kv_str("service.version", "v2"),
            kv_str("service.instance.id", instance),
        ],
        ..Default::default()
    }
}

/// One detector output point pair (score, level) the way detectors emit them.
#[derive(Clone)]
struct Lv {
    detector: &'static str,
    metric: &'static str,
    model: &'static str,
    instance: &'static str,
    t_s: u64,
    level: f64,
    score: f64,
    extra: Vec<KeyValue>,
}

fn lv(t_s: u64, level: f64) -> Lv {
    Lv {
        detector: "zscore_skew",
        metric: "llm.ttft.p95",
        model: "llama-3-8b",
        instance: "gpu-0",
        t_s,
        level,
        score: level * 10.0,
        extra: vec![kv_i64("window", 50), kv_f64("mean", 0.25), kv_f64("std", 0.01)],
    }
}

fn request(points: &[Lv]) -> ExportMetricsServiceRequest {
    let mut o = Output::new();
    for p in points {
        o.score(
            &resource(p.instance),
            &InstrumentationScope::default(),
            &[kv_str("gen_ai.request.model", p.model), kv_str("gpu", "0")],
            T0 + p.t_s * S,
            p.detector,
            p.metric,
            p.score,
            p.level,
            &p.extra,
        );
    }
    o.into_request()
}

async fn feed(r: &Rig, points: &[Lv]) {
    r.node.consume(Payload::Metrics(request(points))).await.unwrap();
}

/// Feeds each point in its own payload; returns (t_s, state, severity, transition) of each record.
async fn run(r: &Rig, points: &[Lv]) -> Vec<(u64, String, String, String)> {
    for p in points {
        feed(r, std::slice::from_ref(p)).await;
    }
    r.out.take().iter().map(|(_, rec)| summary(rec)).collect()
}

fn attr(r: &LogRecord, k: &str) -> Option<any_value::Value> {
    r.attributes.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.clone()).and_then(|v| v.value)
}

fn s_attr(r: &LogRecord, k: &str) -> String {
    match attr(r, k) {
        Some(any_value::Value::StringValue(s)) => s,
        other => panic!("{k}: {other:?}"),
    }
}

fn f_attr(r: &LogRecord, k: &str) -> f64 {
    match attr(r, k) {
        Some(any_value::Value::DoubleValue(d)) => d,
        other => panic!("{k}: {other:?}"),
    }
}

fn i_attr(r: &LogRecord, k: &str) -> i64 {
    match attr(r, k) {
        Some(any_value::Value::IntValue(i)) => i,
        other => panic!("{k}: {other:?}"),
    }
}

fn summary(r: &LogRecord) -> (u64, String, String, String) {
    ((r.time_unix_nano - T0) / S, s_attr(r, "alert.state"), s_attr(r, "alert.severity"), s_attr(r, "alert.transition"))
}

fn ev(t: u64, state: &str, sev: &str, tr: &str) -> (u64, String, String, String) {
    (t, state.into(), sev.into(), tr.into())
}

#[tokio::test]
async fn pending_fires_after_for_then_resolves_after_resolve_after() {
    let r = rig(json!({"for": "30s", "resolve_after": "20s", "repeat_interval": "0s"}));
    let series: Vec<Lv> = [(0, 0.5), (10, 0.65), (20, 0.7), (39, 0.75), (40, 0.7), (50, 0.3), (69, 0.1), (70, 0.2)]
        .iter()
        .map(|&(t, l)| lv(t, l))
        .collect();
    let got = run(&r, &series).await;
    assert_eq!(got, vec![ev(40, "firing", "warning", "fire"), ev(70, "resolved", "warning", "resolve")]);
}

#[tokio::test]
async fn firing_record_fields_and_evidence() {
    let r = rig(json!({}));
    let mut p = lv(5, 0.85);
    p.score = 7.25;
    feed(&r, &[lv(0, 0.1), p]).await;
    let recs = r.out.take();
    assert_eq!(recs.len(), 1);
    let (res, rec) = &recs[0];
    // The record goes out under the input's resource, at the triggering point's event time.
    assert_eq!(*res, resource("gpu-0"));
    assert_eq!(rec.time_unix_nano, T0 + 5 * S);
    assert_eq!(rec.observed_time_unix_nano, T0 + 5 * S);
    assert_eq!(rec.event_name, "llm.degradation.alert");
    assert_eq!(rec.severity_number, 17);
    assert_eq!(rec.severity_text, "ERROR");
    let keys: Vec<&str> = rec.attributes.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            "event.name",
            "alert.state",
            "alert.severity",
            "alert.id",
            "alert.starts_at",
            "alert.transition",
            "detector",
            "metric",
            "gen_ai.request.model",
            "service.version",
            "service.instance.id",
            "evidence.level",
            "evidence.score",
            "evidence.threshold",
            "evidence.gpu",
            "evidence.window",
            "evidence.mean",
            "evidence.std",
        ]
    );
    assert_eq!(s_attr(rec, "event.name"), "llm.degradation.alert");
    assert_eq!(s_attr(rec, "detector"), "zscore_skew");
    assert_eq!(s_attr(rec, "metric"), "llm.ttft.p95");
    assert_eq!(s_attr(rec, "gen_ai.request.model"), "llama-3-8b");
    // Group attributes come from the resource when the point lacks them.
    assert_eq!(s_attr(rec, "service.version"), "v2");
    assert_eq!(s_attr(rec, "service.instance.id"), "gpu-0");
    assert_eq!(i_attr(rec, "alert.starts_at"), (T0 + 5 * S) as i64);
    assert_eq!(f_attr(rec, "evidence.level"), 0.85);
    assert_eq!(f_attr(rec, "evidence.score"), 7.25);
    assert_eq!(f_attr(rec, "evidence.threshold"), 0.8);
    assert_eq!(i_attr(rec, "evidence.window"), 50);
    assert_eq!(f_attr(rec, "evidence.std"), 0.01);
    let id = s_attr(rec, "alert.id");
    assert_eq!(id.len(), 16);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    let Some(any_value::Value::StringValue(body)) = rec.body.clone().and_then(|b| b.value) else { panic!("body") };
    assert_eq!(
        body,
        "FIRING critical: zscore_skew on llm.ttft.p95 (gen_ai.request.model=llama-3-8b, service.version=v2, \
         service.instance.id=gpu-0): level 0.850 >= 0.8"
    );

    // The resolved record: INFO, same id and starts_at, the warning threshold as evidence.
    feed(&r, &[lv(9, 0.2)]).await;
    let recs = r.out.take();
    let (_, rec) = &recs[0];
    assert_eq!(rec.severity_number, 9);
    assert_eq!(s_attr(rec, "alert.state"), "resolved");
    assert_eq!(s_attr(rec, "alert.severity"), "critical");
    assert_eq!(s_attr(rec, "alert.id"), id);
    assert_eq!(i_attr(rec, "alert.starts_at"), (T0 + 5 * S) as i64);
    assert_eq!(f_attr(rec, "evidence.threshold"), 0.6);
    assert_eq!(rec.time_unix_nano, T0 + 9 * S);
}

#[tokio::test]
async fn escalation_dedup_and_repeat_on_event_time() {
    let r = rig(json!({"repeat_interval": "1m"}));
    let series: Vec<Lv> = [(0, 0.65), (10, 0.7), (30, 0.75), (59, 0.7), (60, 0.7), (61, 0.7), (90, 0.9), (100, 0.95)]
        .iter()
        .map(|&(t, l)| lv(t, l))
        .collect();
    let got = run(&r, &series).await;
    assert_eq!(
        got,
        vec![
            ev(0, "firing", "warning", "fire"),
            ev(60, "firing", "warning", "repeat"),
            ev(90, "firing", "critical", "escalate"),
        ]
    );
    // Severity never lowers while firing; repeats count from the escalation.
    let got = run(&r, &[lv(120, 0.7), lv(149, 0.7), lv(150, 0.7), lv(151, 0.1)]).await;
    assert_eq!(got, vec![ev(150, "firing", "critical", "repeat"), ev(151, "resolved", "critical", "resolve")]);
    // Warn / error severity numbers follow the severity.
    let recs = {
        let r2 = rig(json!({}));
        feed(&r2, &[lv(0, 0.7)]).await;
        feed(&r2, &[lv(1, 0.9)]).await;
        r2.out.take()
    };
    let nums: Vec<i32> = recs.iter().map(|(_, r)| r.severity_number).collect();
    assert_eq!(nums, vec![13, 17]);
}

#[tokio::test]
async fn points_in_one_payload_are_taken_in_event_time_order() {
    let r = rig(json!({"for": "10s"}));
    // Out of order inside one request: sorted before the life cycle runs.
    feed(&r, &[lv(10, 0.7), lv(0, 0.7), lv(20, 0.1), lv(15, 0.7)]).await;
    let got: Vec<_> = r.out.take().iter().map(|(_, rec)| summary(rec)).collect();
    assert_eq!(got, vec![ev(10, "firing", "warning", "fire"), ev(20, "resolved", "warning", "resolve")]);
    // A point older than the alert's latest is ignored (35 would resolve what fired at 40).
    feed(&r, &[lv(30, 0.7)]).await;
    feed(&r, &[lv(40, 0.7), lv(41, 0.7)]).await;
    feed(&r, &[lv(35, 0.1)]).await;
    let got: Vec<_> = r.out.take().iter().map(|(_, rec)| summary(rec)).collect();
    assert_eq!(got, vec![ev(40, "firing", "warning", "fire")]);
}

#[tokio::test]
async fn per_detector_thresholds() {
    let r = rig(json!({"per_detector": {"kv_pressure": {"warning": 0.3, "critical": 0.5}}}));
    let mut kv = lv(0, 0.4);
    kv.detector = "kv_pressure";
    kv.metric = "llm.kv.usage";
    let z = lv(0, 0.4);
    feed(&r, &[kv.clone(), z]).await;
    let recs = r.out.take();
    assert_eq!(recs.len(), 1, "only kv_pressure fires at 0.4");
    assert_eq!(s_attr(&recs[0].1, "detector"), "kv_pressure");
    assert_eq!(s_attr(&recs[0].1, "alert.severity"), "warning");
    assert_eq!(f_attr(&recs[0].1, "evidence.threshold"), 0.3);
    kv.t_s = 1;
    kv.level = 0.55;
    feed(&r, &[kv.clone()]).await;
    let recs = r.out.take();
    assert_eq!(s_attr(&recs[0].1, "alert.transition"), "escalate");
    assert_eq!(f_attr(&recs[0].1, "evidence.threshold"), 0.5);
    // Only warning given: critical defaults to the connector's.
    let r = rig(json!({"per_detector": {"delta_ab": {"warning": 0.5}}}));
    let mut d = lv(0, 0.79);
    d.detector = "delta_ab";
    feed(&r, &[d]).await;
    let recs = r.out.take();
    assert_eq!(s_attr(&recs[0].1, "alert.severity"), "warning");
}

#[tokio::test]
async fn grouping_by_model_version_instance_and_detector() {
    let r = rig(json!({}));
    let a = lv(0, 0.9);
    let mut b = lv(0, 0.9);
    b.model = "mistral-7b";
    let mut c = lv(0, 0.9);
    c.instance = "gpu-1";
    let mut d = lv(0, 0.9);
    d.metric = "llm.tpot.p95";
    feed(&r, &[a.clone(), b, c, d]).await;
    let recs = r.out.take();
    let ids: std::collections::BTreeSet<String> = recs.iter().map(|(_, r)| s_attr(r, "alert.id")).collect();
    assert_eq!(ids.len(), 4, "four distinct alerts");
    // The same group with other non-group attributes is the same alert: deduplicated.
    let mut a2 = a.clone();
    a2.t_s = 1;
    a2.extra = vec![kv_str("window_kind", "other")];
    feed(&r, &[a2]).await;
    assert!(r.out.take().is_empty());

    // group_by narrowed to the model only: instances share one alert.
    let r = rig(json!({"group_by": ["gen_ai.request.model"]}));
    let mut c = lv(0, 0.9);
    c.instance = "gpu-1";
    feed(&r, &[lv(0, 0.9), c]).await;
    let recs = r.out.take();
    assert_eq!(recs.len(), 1);
    let keys: Vec<&str> = recs[0].1.attributes.iter().map(|kv| kv.key.as_str()).collect();
    assert!(!keys.contains(&"service.instance.id"), "{keys:?}");
}

#[tokio::test]
async fn breach_eta_and_score_are_joined_by_identity_and_time() {
    let r = rig(json!({}));
    let mut req = request(&[lv(0, 0.95)]);
    let mut o = Output::new();
    o.push(Point {
        resource: resource("gpu-0"),
        scope: InstrumentationScope::default(),
        name: BREACH_ETA,
        unit: "s",
        time_ns: T0,
        value: 86_400.0,
        attributes: vec![
            kv_str("detector", "zscore_skew"),
            kv_str("metric", "llm.ttft.p95"),
            kv_str("gen_ai.request.model", "llama-3-8b"),
        ],
    });
    req.resource_metrics.extend(o.into_request().resource_metrics);
    // Encoded (undecoded protobuf) input is read too.
    let enc = Encoded::from_decoded(&Payload::Metrics(req));
    r.node.consume(Payload::Encoded(enc)).await.unwrap();
    let recs = r.out.take();
    assert_eq!(recs.len(), 1);
    assert_eq!(f_attr(&recs[0].1, "evidence.breach_eta"), 86_400.0);
    assert_eq!(f_attr(&recs[0].1, "evidence.score"), 9.5);
}

#[tokio::test]
async fn unidentified_points_and_other_metrics_are_ignored() {
    let r = rig(json!({}));
    let mut o = Output::new();
    o.push(Point {
        resource: resource("gpu-0"),
        scope: InstrumentationScope::default(),
        name: "llm.anomaly.level",
        unit: "1",
        time_ns: T0,
        value: 1.0,
        attributes: vec![kv_str("metric", "m")],
    });
    o.push(Point {
        resource: resource("gpu-0"),
        scope: InstrumentationScope::default(),
        name: "llm.ttft.p95",
        unit: "s",
        time_ns: T0,
        value: 1.0,
        attributes: vec![kv_str("detector", "d"), kv_str("metric", "m")],
    });
    r.node.consume(Payload::Metrics(o.into_request())).await.unwrap();
    assert!(r.out.take().is_empty());
    let text = r.telemetry.render();
    assert!(
        text.lines().any(|l| l.starts_with("otelcol_processor_dropped_metric_points")
            && l.contains("processor=\"alerts\"")
            && l.ends_with(" 1")),
        "{text}"
    );
    // Logs and traces payloads are not the connector's input: accepted and ignored.
    r.node.consume(Payload::empty(Signal::Logs)).await.unwrap();
    assert!(r.out.take().is_empty());
}

#[tokio::test]
async fn cap_evicts_and_reports_firing_alerts_resolved() {
    let r = rig(json!({"max_alerts": 2}));
    let mut a = lv(0, 0.9);
    a.model = "a";
    let mut b = lv(1, 0.9);
    b.model = "b";
    let mut c = lv(2, 0.9);
    c.model = "c";
    feed(&r, &[a, b]).await;
    assert_eq!(r.out.take().len(), 2);
    feed(&r, &[c]).await;
    let recs = r.out.take();
    let got: Vec<(String, String, String)> = recs
        .iter()
        .map(|(_, r)| (s_attr(r, "alert.transition"), s_attr(r, "alert.state"), s_attr(r, "gen_ai.request.model")))
        .collect();
    assert_eq!(
        got,
        vec![("evict".into(), "resolved".into(), "a".into()), ("fire".into(), "firing".into(), "c".into()),]
    );
    assert_eq!(recs[0].1.time_unix_nano, T0 + 2 * S);
    let text = r.telemetry.render();
    assert!(text.contains("reason=\"max_alerts\""), "{text}");
}

#[tokio::test]
async fn refusals_downstream_are_retried() {
    let r = rig(json!({}));
    r.out.refuse.store(2, Ordering::SeqCst);
    feed(&r, &[lv(0, 0.9)]).await;
    assert_eq!(r.out.take().len(), 1);
}

#[tokio::test]
async fn state_survives_checkpoint_and_restore() {
    let dir = std::env::temp_dir().join(format!("iw-alerts-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = json!({"for": "10s", "repeat_interval": "1m"});
    {
        let host = Host::new();
        let r = rig_with(cfg.clone(), host.clone());
        host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap();
        // One alert firing (since 10 s), one pending (since 20 s).
        let mut p = lv(20, 0.7);
        p.model = "pending";
        let got = run(&r, &[lv(0, 0.7), lv(10, 0.7), p]).await;
        assert_eq!(got, vec![ev(10, "firing", "warning", "fire")]);
        assert_eq!(host.state.checkpoint().await.unwrap(), 1);
    }
    let host = Host::new();
    let r = rig_with(cfg, host.clone());
    assert_eq!(host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap(), 1);
    let mut p = lv(30, 0.7);
    p.model = "pending";
    // Restored: no second fire for the first alert, its repeat counts from 10 s, the pending one
    // fires 10 s after its start, and resolution keeps the original starts_at.
    let got = run(&r, &[lv(25, 0.7), p, lv(70, 0.75), lv(71, 0.1)]).await;
    assert_eq!(
        got,
        vec![
            ev(30, "firing", "warning", "fire"),
            ev(70, "firing", "warning", "repeat"),
            ev(71, "resolved", "warning", "resolve"),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_settings_point_at_the_field() {
    use inferwatch_processors::alerts::AlertsConfig;
    let key = |p: &[PathSeg]| -> Vec<String> {
        p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
    };
    let cases = [
        (json!({"warning": 0.0}), vec!["warning"]),
        (json!({"warning": 0.9, "critical": 0.8}), vec!["critical"]),
        (json!({"critical": 1.5}), vec!["critical"]),
        (json!({"for": "soon"}), vec!["for"]),
        (json!({"max_alerts": 0}), vec!["max_alerts"]),
        (json!({"group_by": [""]}), vec!["group_by"]),
        (json!({"per_detector": {"z": {"critical": 0.5}}}), vec!["per_detector", "z", "critical"]),
        (json!({"per_detector": {"z": {"bogus": 1}}}), vec!["per_detector", "z", "bogus"]),
        (json!({"unknown": 1}), vec!["unknown"]),
    ];
    for (v, path) in cases {
        let e = AlertsConfig::from_value(&v).expect_err(&v.to_string());
        assert_eq!(key(&e.path), path, "{v}: {}", e.message);
    }
    let c = AlertsConfig::from_value(&serde_json::Value::Null).unwrap();
    assert_eq!(c.thresholds.warning, 0.6);
    assert_eq!(c.thresholds.critical, 0.8);
    assert_eq!(c.params.repeat_ns, 300 * S);
    assert_eq!(c.params.max_alerts, 10_000);
    assert_eq!(c.group_by, vec!["gen_ai.request.model", "service.version", "service.instance.id", "detector"]);
}

#[test]
fn factory_connects_metrics_to_logs_only() {
    assert_eq!(AlertsFactory.signal_pairs(), &[(Signal::Metrics, Signal::Logs)]);
    let ctx = CreateContext::new(ComponentId::parse("alerts").unwrap(), Arc::new(Telemetry::new()));
    let e = AlertsFactory.create(ctx, &json!({}), Signal::Logs, Signal::Logs, Arc::new(Capture::default()));
    assert!(e.is_err());
}
