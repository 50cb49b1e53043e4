//! Connector `alerts` through its factory and the Consumer contract: the exact life cycle on
//! hand-made level series, the records' fields and evidence, grouping, per-detector
//! thresholds, the cap, and checkpoint / restore through a real state store.

use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, NodeRef, PathSeg};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::state::Store;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::alerts::AlertsFactory;
use inferwatch_processors::detect::{BREACH_ETA, Output, Point, kv_f64, kv_i64, kv_str};
use inferwatch_testkit::harness::Sink;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::json;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

/// Every record the sink got so far (with its resource), then cleared.
fn records(out: &Sink) -> Vec<(Resource, LogRecord)> {
    let mut out_records = Vec::new();
    for p in out.take() {
        let Payload::Logs(req) = p else { panic!("not logs: {:?}", p.signal()) };
        for rl in req.resource_logs {
            let res = rl.resource.unwrap_or_default();
            for sl in rl.scope_logs {
                assert_eq!(sl.scope.unwrap().name, "inferwatch.alerts");
                for r in sl.log_records {
                    out_records.push((res.clone(), r));
                }
            }
        }
    }
    out_records
}

struct Rig {
    node: NodeRef,
    out: Arc<Sink>,
    telemetry: Arc<Telemetry>,
}

fn rig_with(cfg: serde_json::Value, host: Arc<Host>) -> Rig {
    let out = Sink::new();
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext { id: ComponentId::parse("alerts").unwrap(), telemetry: telemetry.clone(), host };
    let node = AlertsFactory.create(ctx, &cfg, Signal::Metrics, Signal::Logs, out.clone()).unwrap();
    Rig { node, out, telemetry }
}

fn rig(cfg: serde_json::Value) -> Rig {
    rig_with(cfg, Host::new())
}

/// A rig with `for: 0s` and `resolve_after: 0s` unless `cfg` sets them (the life-cycle tests
/// that predate the 2m defaults).
fn rig0(mut cfg: serde_json::Value) -> Rig {
    let m = cfg.as_object_mut().expect("an object");
    m.entry("for").or_insert(json!("0s"));
    m.entry("resolve_after").or_insert(json!("0s"));
    rig(cfg)
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
        extra: vec![
            kv_i64("window", 50),
            kv_f64("zscore.mean", 0.25),
            kv_f64("zscore.std", 0.01),
            kv_f64("value", 0.31),
        ],
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
    o.into_request().unwrap()
}

async fn feed(r: &Rig, points: &[Lv]) {
    r.node.consume(Payload::Metrics(request(points))).await.unwrap();
}

/// Feeds each point in its own payload; returns (t_s, state, severity, transition) of each record.
async fn run(r: &Rig, points: &[Lv]) -> Vec<(u64, String, String, String)> {
    for p in points {
        feed(r, std::slice::from_ref(p)).await;
    }
    records(&r.out).iter().map(|(_, rec)| summary(rec)).collect()
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
    let r = rig0(json!({"links": {"dashboard": "http://grafana/d/iw?var-model={{model}}&i={{instance}}",
        "runbook": "https://runbooks/{{alertname}}#{{severity}}"}}));
    let mut p = lv(5, 0.85);
    p.score = 7.25;
    feed(&r, &[lv(0, 0.1), p]).await;
    let recs = records(&r.out);
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
            "alertname",
            "detector",
            "metric",
            "gen_ai.request.model",
            "service.version",
            "service.instance.id",
            "alert.summary",
            "alert.value",
            "alert.baseline",
            "alert.dashboard_url",
            "alert.runbook_url",
            "evidence.level",
            "evidence.score",
            "evidence.threshold",
            "evidence.gpu",
            "evidence.window",
            "evidence.zscore.mean",
            "evidence.zscore.std",
            "evidence.value",
        ]
    );
    assert_eq!(s_attr(rec, "alertname"), "LLMLatencyAnomaly");
    assert_eq!(f_attr(rec, "alert.value"), 0.31);
    assert_eq!(f_attr(rec, "alert.baseline"), 0.25);
    assert_eq!(s_attr(rec, "alert.dashboard_url"), "http://grafana/d/iw?var-model=llama-3-8b&i=gpu-0");
    assert_eq!(s_attr(rec, "alert.runbook_url"), "https://runbooks/LLMLatencyAnomaly#critical");
    assert_eq!(
        s_attr(rec, "alert.summary"),
        "TTFT p95 of llama-3-8b on gpu-0 is 310 ms against a baseline of 250 ms (critical)"
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
    assert_eq!(f_attr(rec, "evidence.zscore.std"), 0.01);
    let id = s_attr(rec, "alert.id");
    assert_eq!(id.len(), 16);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    let Some(any_value::Value::StringValue(body)) = rec.body.clone().and_then(|b| b.value) else { panic!("body") };
    assert_eq!(
        body,
        "FIRING critical LLMLatencyAnomaly: TTFT p95 of llama-3-8b on gpu-0 is 310 ms against a baseline of 250 ms \
         (critical)"
    );

    // The resolved record: INFO, same id and starts_at, the warning threshold as evidence.
    feed(&r, &[lv(9, 0.2)]).await;
    let recs = records(&r.out);
    let (_, rec) = &recs[0];
    assert_eq!(rec.severity_number, 9);
    assert_eq!(s_attr(rec, "alert.state"), "resolved");
    assert_eq!(s_attr(rec, "alert.severity"), "critical");
    assert_eq!(s_attr(rec, "alert.id"), id);
    assert_eq!(i_attr(rec, "alert.starts_at"), (T0 + 5 * S) as i64);
    assert_eq!(f_attr(rec, "evidence.threshold"), 0.6);
    assert_eq!(rec.time_unix_nano, T0 + 9 * S);
    assert_eq!(
        s_attr(rec, "alert.summary"),
        "TTFT p95 of llama-3-8b on gpu-0 is back to normal at 310 ms (zscore_skew level 0.2 < 0.6)"
    );
}

#[tokio::test]
async fn escalation_dedup_and_repeat_on_event_time() {
    let r = rig0(json!({"repeat_interval": "1m"}));
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
        let r2 = rig0(json!({}));
        feed(&r2, &[lv(0, 0.7)]).await;
        feed(&r2, &[lv(1, 0.9)]).await;
        records(&r2.out)
    };
    let nums: Vec<i32> = recs.iter().map(|(_, r)| r.severity_number).collect();
    assert_eq!(nums, vec![13, 17]);
}

#[tokio::test]
async fn points_in_one_payload_are_taken_in_event_time_order() {
    let r = rig0(json!({"for": "10s"}));
    // Out of order inside one request: sorted before the life cycle runs.
    feed(&r, &[lv(10, 0.7), lv(0, 0.7), lv(20, 0.1), lv(15, 0.7)]).await;
    let got: Vec<_> = records(&r.out).iter().map(|(_, rec)| summary(rec)).collect();
    assert_eq!(got, vec![ev(10, "firing", "warning", "fire"), ev(20, "resolved", "warning", "resolve")]);
    // A point older than the alert's latest is ignored (35 would resolve what fired at 40).
    feed(&r, &[lv(30, 0.7)]).await;
    feed(&r, &[lv(40, 0.7), lv(41, 0.7)]).await;
    feed(&r, &[lv(35, 0.1)]).await;
    let got: Vec<_> = records(&r.out).iter().map(|(_, rec)| summary(rec)).collect();
    assert_eq!(got, vec![ev(40, "firing", "warning", "fire")]);
}

#[tokio::test]
async fn per_detector_thresholds() {
    let r = rig0(json!({"per_detector": {"kv_pressure": {"warning": 0.3, "critical": 0.5}}}));
    let mut kv = lv(0, 0.4);
    kv.detector = "kv_pressure";
    kv.metric = "llm.kv.usage";
    let z = lv(0, 0.4);
    feed(&r, &[kv.clone(), z]).await;
    let recs = records(&r.out);
    assert_eq!(recs.len(), 1, "only kv_pressure fires at 0.4");
    assert_eq!(s_attr(&recs[0].1, "detector"), "kv_pressure");
    assert_eq!(s_attr(&recs[0].1, "alert.severity"), "warning");
    assert_eq!(f_attr(&recs[0].1, "evidence.threshold"), 0.3);
    kv.t_s = 1;
    kv.level = 0.55;
    feed(&r, &[kv.clone()]).await;
    let recs = records(&r.out);
    assert_eq!(s_attr(&recs[0].1, "alert.transition"), "escalate");
    assert_eq!(f_attr(&recs[0].1, "evidence.threshold"), 0.5);
    // Only warning given: critical defaults to the connector's.
    let r = rig0(json!({"per_detector": {"delta_ab": {"warning": 0.5}}}));
    let mut d = lv(0, 0.79);
    d.detector = "delta_ab";
    feed(&r, &[d]).await;
    let recs = records(&r.out);
    assert_eq!(s_attr(&recs[0].1, "alert.severity"), "warning");
}

#[tokio::test]
async fn grouping_by_model_version_instance_and_detector() {
    let r = rig0(json!({}));
    let a = lv(0, 0.9);
    let mut b = lv(0, 0.9);
    b.model = "mistral-7b";
    let mut c = lv(0, 0.9);
    c.instance = "gpu-1";
    let mut d = lv(0, 0.9);
    d.metric = "llm.tpot.p95";
    feed(&r, &[a.clone(), b, c, d]).await;
    let recs = records(&r.out);
    let ids: std::collections::BTreeSet<String> = recs.iter().map(|(_, r)| s_attr(r, "alert.id")).collect();
    assert_eq!(ids.len(), 4, "four distinct alerts");
    // The same group with other non-group attributes is the same alert: deduplicated.
    let mut a2 = a.clone();
    a2.t_s = 1;
    a2.extra = vec![kv_str("window_kind", "other")];
    feed(&r, &[a2]).await;
    assert!(records(&r.out).is_empty());

    // group_by narrowed to the model only: instances share one alert.
    let r = rig0(json!({"group_by": ["gen_ai.request.model"]}));
    let mut c = lv(0, 0.9);
    c.instance = "gpu-1";
    feed(&r, &[lv(0, 0.9), c]).await;
    let recs = records(&r.out);
    assert_eq!(recs.len(), 1);
    let keys: Vec<&str> = recs[0].1.attributes.iter().map(|kv| kv.key.as_str()).collect();
    assert!(!keys.contains(&"service.instance.id"), "{keys:?}");
}

#[tokio::test]
async fn breach_eta_and_score_are_joined_by_identity_and_time() {
    let r = rig0(json!({}));
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
    req.resource_metrics.extend(o.into_request().unwrap().resource_metrics);
    // Encoded (undecoded protobuf) input is read too.
    let enc = Encoded::from_decoded(&Payload::Metrics(req));
    r.node.consume(Payload::Encoded(enc)).await.unwrap();
    let recs = records(&r.out);
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
    r.node.consume(Payload::Metrics(o.into_request().unwrap())).await.unwrap();
    assert!(records(&r.out).is_empty());
    let text = r.telemetry.render();
    assert!(
        text.lines().any(|l| l.starts_with("otelcol_processor_dropped_metric_points")
            && l.contains("processor=\"alerts\"")
            && l.ends_with(" 1")),
        "{text}"
    );
    // Logs and traces payloads are not the connector's input: accepted and ignored.
    r.node.consume(Payload::empty(Signal::Logs)).await.unwrap();
    assert!(records(&r.out).is_empty());
}

#[tokio::test]
async fn cap_evicts_and_reports_firing_alerts_resolved() {
    let r = rig0(json!({"max_alerts": 2}));
    let mut a = lv(0, 0.9);
    a.model = "a";
    let mut b = lv(1, 0.9);
    b.model = "b";
    let mut c = lv(2, 0.9);
    c.model = "c";
    feed(&r, &[a, b]).await;
    assert_eq!(records(&r.out).len(), 2);
    feed(&r, &[c]).await;
    let recs = records(&r.out);
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
    let r = rig0(json!({}));
    r.out.refuse_next(2);
    feed(&r, &[lv(0, 0.9)]).await;
    assert_eq!(records(&r.out).len(), 1);
}

#[tokio::test]
async fn state_survives_checkpoint_and_restore() {
    let dir = std::env::temp_dir().join(format!("iw-alerts-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = json!({"for": "10s", "resolve_after": "0s", "repeat_interval": "1m"});
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
        (json!({"resolve_below": 0.7}), vec!["resolve_below"]),
        (json!({"resolve_below": -0.1}), vec!["resolve_below"]),
        (
            json!({"per_detector": {"z": {"warning": 0.5, "resolve_below": 0.55}}}),
            vec!["per_detector", "z", "resolve_below"],
        ),
        (json!({"per_detector": {"z": {"alertname": "bad name"}}}), vec!["per_detector", "z", "alertname"]),
        (
            json!({"per_detector": {"trend_forecast": {"resolve_after": "x"}}}),
            vec!["per_detector", "trend_forecast", "resolve_after"],
        ),
        (json!({"links": {"dashboard": "http://g/{{model"}}), vec!["links", "dashboard"]),
        (json!({"links": {"dash-board": "http://g/"}}), vec!["links", "dash-board"]),
        (json!({"context": [""]}), vec!["context"]),
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
    assert_eq!(c.group_by, vec!["gen_ai.request.model", "service.version", "service.instance.id", "detector", "slo"]);
    assert_eq!(c.context, vec!["k8s.pod.name", "k8s.namespace.name", "k8s.node.name"]);
    // Safe defaults: for 2m, resolve_after 2m, stale_after 5m, resolve_below = warning.
    assert_eq!(c.params.for_ns, 120 * S);
    assert_eq!(c.params.resolve_after_ns, 120 * S);
    assert_eq!(c.params.stale_ns, 300 * S);
    assert_eq!(c.thresholds.resolve_below, 0.6);
    // Built-in per-detector defaults.
    let tf = c.thresholds_of("trend_forecast");
    assert_eq!((tf.for_ns, tf.stale_ns), (Some(0), Some(3 * 3600 * S)));
    assert_eq!(c.thresholds_of("delta_ab").for_ns, Some(0));
    assert_eq!(c.thresholds_of("slo_burn").for_ns, Some(0));
    assert_eq!(c.thresholds_of("zscore_skew").for_ns, None);
    // A per_detector block overrides the built-ins key by key only.
    let c = AlertsConfig::from_value(&json!({"for": "5m", "resolve_below": 0.5,
        "per_detector": {"trend_forecast": {"warning": 0.4}, "kv_pressure": {"warning": 0.8, "critical": 0.9}}}))
    .unwrap();
    let tf = c.thresholds_of("trend_forecast");
    assert_eq!((tf.warning, tf.for_ns, tf.stale_ns), (0.4, Some(0), Some(3 * 3600 * S)));
    // The connector's resolve_below, at most the detector's warning.
    assert_eq!(tf.resolve_below, 0.4);
    assert_eq!(c.thresholds_of("kv_pressure").resolve_below, 0.5);
    let c =
        AlertsConfig::from_value(&json!({"per_detector": {"kv_pressure": {"warning": 0.8, "critical": 0.9}}})).unwrap();
    assert_eq!(c.thresholds_of("kv_pressure").resolve_below, 0.8, "defaults to the detector's own warning");
}

#[test]
fn factory_connects_metrics_to_logs_only() {
    assert_eq!(AlertsFactory.signal_pairs(), &[(Signal::Metrics, Signal::Logs)]);
    let ctx = CreateContext::new(ComponentId::parse("alerts").unwrap(), Arc::new(Telemetry::new()));
    let e = AlertsFactory.create(ctx, &json!({}), Signal::Logs, Signal::Logs, Sink::new());
    assert!(e.is_err());
}

fn at(detector: &'static str, metric: &'static str, t_s: u64, level: f64, extra: Vec<KeyValue>) -> Lv {
    Lv { detector, metric, t_s, level, extra, ..lv(0, 0.0) }
}

fn transitions(got: &[(u64, String, String, String)], tr: &str) -> usize {
    got.iter().filter(|g| g.3 == tr).count()
}

#[tokio::test]
async fn defaults_wait_two_minutes_before_firing_and_after_quiet() {
    let r = rig(json!({"repeat_interval": "0s"}));
    // One-minute points: pending at 0, fires at 120; quiet from 300, resolved at 420.
    let series: Vec<Lv> = [(0, 0.7), (60, 0.7), (120, 0.7), (180, 0.7), (240, 0.7), (300, 0.1), (360, 0.1), (420, 0.1)]
        .iter()
        .map(|&(t, l)| lv(t, l))
        .collect();
    let got = run(&r, &series).await;
    assert_eq!(got, vec![ev(120, "firing", "warning", "fire"), ev(420, "resolved", "warning", "resolve")]);
    // A one-minute blip never fires.
    let got = run(&r, &[lv(1000, 0.9), lv(1060, 0.1), lv(1120, 0.9), lv(1180, 0.2)]).await;
    assert!(got.is_empty(), "{got:?}");
}

#[tokio::test]
async fn hourly_trend_forecast_fires_with_a_connector_for_and_no_per_detector() {
    // The trap: `for: 2m` at the connector, no per_detector block, hourly points.
    let r = rig(json!({"for": "2m", "repeat_interval": "0s"}));
    let tf = |t_h: u64, l: f64| at("trend_forecast", "llm.tpot.p95", t_h * 3600, l, vec![]);
    let got = run(&r, &[tf(0, 0.3), tf(1, 0.7), tf(2, 0.75), tf(3, 0.9)]).await;
    assert_eq!(got, vec![ev(3600, "firing", "warning", "fire"), ev(3 * 3600, "firing", "critical", "escalate")]);
    // The same hourly levels from a detector without built-in defaults never fire: each point
    // finds the previous one older than stale_after (5m) and restarts the pending `for`.
    let z = |t_h: u64, l: f64| at("zscore_skew", "llm.tpot.p95", t_h * 3600, l, vec![]);
    let got = run(&r, &[z(0, 0.7), z(1, 0.7), z(2, 0.75), z(3, 0.9)]).await;
    assert!(got.is_empty(), "{got:?}");
    // A per_detector block that sets other keys keeps the built-in `for: 0s`.
    let r = rig(json!({"for": "10m", "per_detector": {"trend_forecast": {"warning": 0.5}}}));
    let got = run(&r, &[tf(0, 0.55)]).await;
    assert_eq!(got, vec![ev(0, "firing", "warning", "fire")]);
    // Setting trend_forecast's `for` explicitly is obeyed (its stale_after is 3h, so hourly
    // points do build it up).
    let r = rig(json!({"per_detector": {"trend_forecast": {"for": "1h"}}}));
    let got = run(&r, &[tf(0, 0.7), tf(1, 0.7)]).await;
    assert_eq!(got, vec![ev(3600, "firing", "warning", "fire")]);
}

#[tokio::test]
async fn delta_ab_and_slo_burn_fire_on_their_first_point() {
    let r = rig(json!({}));
    let got = run(&r, &[at("delta_ab", "llm.ttft.p95", 0, 0.9, vec![])]).await;
    assert_eq!(got, vec![ev(0, "firing", "critical", "fire")]);
    let got = run(&r, &[at("slo_burn", "llm.tpot.p95", 0, 0.7, vec![kv_str("slo", "tpot")])]).await;
    assert_eq!(got, vec![ev(0, "firing", "warning", "fire")]);
}

/// 0.65 for two minutes (fires at 120), then just below / just above warning every minute until
/// 1800, then quiet.
fn hovering() -> Vec<Lv> {
    let mut v: Vec<Lv> = [0, 60, 120].iter().map(|&t| lv(t, 0.65)).collect();
    v.extend((0..28).map(|k| lv(180 + 60 * k, if k % 2 == 0 { 0.59 } else { 0.61 })));
    v.extend([1860, 1920, 1980].iter().map(|&t| lv(t, 0.3)));
    v
}

#[tokio::test]
async fn a_level_hovering_at_warning_fires_once_and_resolves_after_a_quiet_run() {
    let r = rig(json!({"repeat_interval": "0s"}));
    let got = run(&r, &hovering()).await;
    // Last 0.61 at 1800; the quiet run from 1860 lasts resolve_after (2m) at 1980.
    assert_eq!(got, vec![ev(120, "firing", "warning", "fire"), ev(1980, "resolved", "warning", "resolve")]);
    // With the default repeat_interval the alert repeats but still fires once.
    let r = rig(json!({}));
    let got = run(&r, &hovering()).await;
    assert_eq!(transitions(&got, "fire"), 1, "{got:?}");
    assert_eq!(transitions(&got, "resolve"), 1, "{got:?}");
    // Without hysteresis (the old defaults) the same level flaps: a fire every other minute.
    let r = rig(json!({"for": "0s", "resolve_after": "0s", "repeat_interval": "0s"}));
    let got = run(&r, &hovering()).await;
    assert_eq!(transitions(&got, "fire"), 15, "{got:?}");
}

#[tokio::test]
async fn resolve_below_keeps_an_alert_firing_in_the_band() {
    let r = rig(json!({"for": "0s", "resolve_after": "1m", "resolve_below": 0.4, "repeat_interval": "0s"}));
    let got = run(&r, &[lv(0, 0.7), lv(60, 0.5), lv(120, 0.5), lv(180, 0.45), lv(240, 0.3), lv(300, 0.3)]).await;
    // 0.5 and 0.45 are below warning but not below 0.4: the quiet run starts at 240.
    assert_eq!(got, vec![ev(0, "firing", "warning", "fire"), ev(300, "resolved", "warning", "resolve")]);
    let recs = {
        feed(&r, &[lv(400, 0.7)]).await;
        feed(&r, &[lv(401, 0.1)]).await;
        feed(&r, &[lv(461, 0.1)]).await;
        records(&r.out)
    };
    assert_eq!(f_attr(&recs[1].1, "evidence.threshold"), 0.4, "a resolution reports resolve_below");
}

fn rec_of(r: &Rig) -> LogRecord {
    let mut recs = records(&r.out);
    assert_eq!(recs.len(), 1, "{:?}", recs.iter().map(|(_, r)| summary(r)).collect::<Vec<_>>());
    recs.remove(0).1
}

#[tokio::test]
async fn each_detector_gets_its_name_and_a_summary_a_person_understands() {
    let r = rig0(json!({"links": {"dashboard": "http://grafana/d/iw?var-model={{model}}&var-slo={{slo}}"}}));
    // trend_forecast on an SLO signal: the forecast with its interval.
    let day = 86_400.0;
    feed(
        &r,
        &[at(
            "trend_forecast",
            "llm.tpot.p95",
            0,
            0.7,
            vec![
                kv_str("slo", "tpot-fast"),
                kv_f64("threshold", 0.07),
                kv_f64("value", 0.064),
                kv_f64("slope_per_day", 0.0004),
                kv_f64("eta", 16.2 * day),
                kv_f64("eta_low", 12.4 * day),
                kv_f64("eta_high", 21.0 * day),
            ],
        )],
    )
    .await;
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "alertname"), "LLMBreachForecast");
    assert_eq!(s_attr(&rec, "slo"), "tpot-fast", "slo is part of the identity");
    assert_eq!(
        s_attr(&rec, "alert.summary"),
        "TPOT p95 of llama-3-8b on gpu-0 is rising 0.4 ms/day; SLO tpot-fast (70 ms) breached in about 16 days (12–21)"
    );
    assert_eq!(f_attr(&rec, "alert.threshold"), 0.07);
    assert_eq!(f_attr(&rec, "alert.value"), 0.064);
    assert_eq!(f_attr(&rec, "alert.eta"), 16.2 * day);
    assert_eq!(f_attr(&rec, "alert.eta_low"), 12.4 * day);
    assert_eq!(f_attr(&rec, "alert.eta_high"), 21.0 * day);
    assert_eq!(s_attr(&rec, "alert.dashboard_url"), "http://grafana/d/iw?var-model=llama-3-8b&var-slo=tpot-fast");
    // The detector's own `threshold` does not duplicate the connector's evidence.threshold.
    assert_eq!(rec.attributes.iter().filter(|kv| kv.key == "evidence.threshold").count(), 1);
    assert_eq!(f_attr(&rec, "evidence.threshold"), 0.6);

    // zscore_skew on the queue: value against baseline, in seconds.
    let mut q = at("zscore_skew", "llm.queue.p99", 0, 0.9, vec![kv_f64("value", 2.1), kv_f64("zscore.mean", 0.1)]);
    q.model = "llama";
    q.instance = "127.0.0.1:8000";
    feed(&r, &[q]).await;
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "alertname"), "LLMLatencyAnomaly");
    assert_eq!(
        s_attr(&rec, "alert.summary"),
        "queue p99 of llama on 127.0.0.1:8000 is 2.1 s against a baseline of 100 ms (critical)"
    );

    // kv_pressure: the flagged inputs.
    let kv = at(
        "kv_pressure",
        "llm.kv_cache.usage",
        0,
        0.7,
        vec![
            kv_f64("kv_pressure.usage", 0.97),
            kv_f64("kv_pressure.queue_p99_s", 2.1),
            kv_f64("kv_pressure.hit_rate", 0.9),
            kv_str("kv_pressure.flags", "usage_high,queue_blocking"),
        ],
    );
    feed(&r, &[kv]).await;
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "alertname"), "LLMKvCachePressure");
    assert_eq!(
        s_attr(&rec, "alert.summary"),
        "KV cache of llama-3-8b on gpu-0 is under pressure: usage 97%, queue p99 2.1 s (warning)"
    );

    // delta_ab: candidate against baseline version, threshold in the signal's unit.
    let d = at(
        "delta_ab",
        "llm.ttft.p95",
        0,
        0.9,
        vec![
            kv_str("delta_ab.baseline", "v1"),
            kv_str("delta_ab.candidate", "v2"),
            kv_str("delta_ab.kind", "latency"),
            kv_f64("delta_ab.value_baseline", 0.25),
            kv_f64("delta_ab.value_candidate", 0.295),
            kv_f64("delta_ab.delta_rel", 0.18),
            kv_f64("delta_ab.threshold", 5.0),
        ],
    );
    feed(&r, &[d]).await;
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "alertname"), "LLMVersionRegression");
    assert_eq!(
        s_attr(&rec, "alert.summary"),
        "TTFT p95 of llama-3-8b on gpu-0: version v2 is at 295 ms against 250 ms for v1 (+18%), beyond 255 ms (critical)"
    );
    assert!((f_attr(&rec, "alert.threshold") - 0.255).abs() < 1e-12);

    // slo_burn: the burn rate (score) against the SLO.
    let mut b = at("slo_burn", "llm.tpot.p95", 0, 1.0, vec![kv_str("slo", "tpot-fast"), kv_f64("slo.threshold", 0.07)]);
    b.score = 14.4;
    feed(&r, &[b]).await;
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "alertname"), "LLMSloBurnRate");
    assert_eq!(
        s_attr(&rec, "alert.summary"),
        "TPOT p95 of llama-3-8b on gpu-0 burns the error budget of SLO tpot-fast (70 ms) 14.4× as fast as it allows (page)"
    );
    assert_eq!(f_attr(&rec, "alert.threshold"), 0.07);

    // An unknown detector: LLMDegradation; per_detector.alertname renames.
    feed(&r, &[at("custom", "llm.e2e.p95", 0, 0.9, vec![])]).await;
    assert_eq!(s_attr(&rec_of(&r), "alertname"), "LLMDegradation");
    let r = rig0(json!({"per_detector": {"custom": {"alertname": "MyAlert"}}}));
    feed(&r, &[at("custom", "llm.e2e.p95", 0, 0.9, vec![])]).await;
    assert_eq!(s_attr(&rec_of(&r), "alertname"), "MyAlert");
}

#[tokio::test]
async fn the_pod_comes_from_the_point_or_its_resource_without_changing_the_identity() {
    let r = rig0(json!({"links": {"logs": "http://logs/{{pod}}"}}));
    let mut req = request(&[lv(0, 0.9)]);
    req.resource_metrics[0].resource.as_mut().unwrap().attributes.push(kv_str("k8s.pod.name", "vllm-0"));
    r.node.consume(Payload::Metrics(req)).await.unwrap();
    let rec = rec_of(&r);
    assert_eq!(s_attr(&rec, "k8s.pod.name"), "vllm-0");
    assert_eq!(s_attr(&rec, "alert.logs_url"), "http://logs/vllm-0");
    let id = s_attr(&rec, "alert.id");
    // The same alert from another pod (a restart): the same id, no new fire.
    let mut req = request(&[lv(1, 0.9)]);
    req.resource_metrics[0].resource.as_mut().unwrap().attributes.push(kv_str("k8s.pod.name", "vllm-0-b"));
    r.node.consume(Payload::Metrics(req)).await.unwrap();
    assert!(records(&r.out).is_empty());
    let recs = run(&r, &[lv(2, 0.1)]).await;
    assert_eq!(recs, vec![ev(2, "resolved", "critical", "resolve")]);
    let _ = id;
}

#[test]
fn warnings_name_the_settings_that_can_never_fire() {
    use inferwatch_processors::alerts::AlertsConfig;
    let paths = |v: serde_json::Value| -> Vec<String> {
        AlertsConfig::warnings_of(&v)
            .iter()
            .map(|e| {
                e.path
                    .iter()
                    .map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() })
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect()
    };
    assert!(paths(json!({})).is_empty(), "the defaults warn about nothing");
    assert!(paths(json!({"for": "10m", "stale_after": "1m"})).is_empty(), "trend_forecast keeps its built-ins");
    assert_eq!(
        paths(json!({"per_detector": {"trend_forecast": {"for": "2m", "stale_after": "5m"}}})),
        vec!["per_detector.trend_forecast.for"]
    );
    // for > 0 with the built-in 3h stale_after can fire: no warning.
    assert!(paths(json!({"per_detector": {"trend_forecast": {"for": "2h"}}})).is_empty());
    assert_eq!(
        paths(json!({"per_detector": {"trend_forecast": {"for": "1h", "stale_after": "30m"}}})),
        vec!["per_detector.trend_forecast.for"]
    );
    assert_eq!(paths(json!({"per_detector": {"trend-forecast": {"for": "0s"}}})), vec!["per_detector.trend-forecast"]);
    // Invalid settings are errors, not warnings.
    assert!(paths(json!({"warning": 2.0})).is_empty());
    let w = AlertsConfig::warnings_of(&json!({"per_detector": {"trend_forecast": {"for": "2m", "stale_after": "5m"}}}));
    assert!(w[0].message.contains("never fire"), "{}", w[0].message);
}
