//! The `alertmanager` exporter against an in-process Alertmanager stub (axum): the exact JSON
//! of `POST /api/v2/alerts`, resolution, escalation, re-sending while firing, retries on 5xx
//! and no retries on 4xx.

use crate::common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use common::{PATIENCE, fast_retry};
use inferwatch_core::component::{ComponentId, CreateContext, ExporterFactory, NodeRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::{ExporterMetrics, Telemetry};
use inferwatch_exporters::alertmanager::{AlertmanagerExporterFactory, rfc3339};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, mpsc};

const S: u64 = 1_000_000_000;
/// Event times well in the past (2023-11-14T22:13:20Z).
const T0: u64 = 1_700_000_000 * S;

fn s(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

fn f(k: &str, v: f64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }),
        ..Default::default()
    }
}

fn i(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }),
        ..Default::default()
    }
}

/// An alert record as the `alerts` connector writes it.
fn alert(id: &str, state: &str, severity: &str, t: u64, starts_at: u64, level: f64) -> LogRecord {
    let sev = match (state, severity) {
        ("resolved", _) => 9,
        (_, "critical") => 17,
        _ => 13,
    };
    LogRecord {
        time_unix_nano: t,
        observed_time_unix_nano: t,
        severity_number: sev,
        event_name: "llm.degradation.alert".into(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(format!("{} {severity}: zscore_skew", state.to_uppercase()))),
        }),
        attributes: vec![
            s("event.name", "llm.degradation.alert"),
            s("alert.state", state),
            s("alert.severity", severity),
            s("alert.id", id),
            i("alert.starts_at", starts_at as i64),
            s("alert.transition", "fire"),
            s("detector", "zscore_skew"),
            s("metric", "llm.ttft.p95"),
            s("gen_ai.request.model", "llama-3-8b"),
            s("service.version", "v2"),
            s("service.instance.id", "gpu-0"),
            s("k8s.pod.name", "pod-1"),
            f("evidence.level", level),
            f("evidence.score", 4.5),
            f("evidence.threshold", 0.8),
            i("evidence.window", 50),
        ],
        ..Default::default()
    }
}

fn logs(records: Vec<LogRecord>) -> Payload {
    Payload::Logs(ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    })
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A stub Alertmanager: every body posted to /api/v2/alerts goes to the channel; answers with
/// the scripted statuses in order, then 200.
#[derive(Clone)]
struct Stub {
    script: Arc<Mutex<VecDeque<u16>>>,
    tx: mpsc::UnboundedSender<Value>,
}

async fn receive(State(st): State<Stub>, body: Bytes) -> axum::http::StatusCode {
    let v: Value = serde_json::from_slice(&body).expect("a JSON body");
    let _ = st.tx.send(v);
    let code = st.script.lock().await.pop_front().unwrap_or(200);
    axum::http::StatusCode::from_u16(code).unwrap()
}

async fn stub(script: Vec<u16>) -> (String, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Stub { script: Arc::new(Mutex::new(script.into())), tx };
    let app = Router::new().route("/am/api/v2/alerts", axum::routing::post(receive)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/am"), rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Value>) -> Value {
    tokio::time::timeout(PATIENCE, rx.recv()).await.expect("a request in time").expect("the stub is up")
}

struct Rig {
    node: NodeRef,
    metrics: ExporterMetrics,
    telemetry: Arc<Telemetry>,
}

async fn start(cfg: Value) -> Rig {
    AlertmanagerExporterFactory.validate(&cfg).unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse("alertmanager").unwrap();
    let metrics = telemetry.exporter(&id, Signal::Logs);
    let node =
        AlertmanagerExporterFactory.create(CreateContext::new(id, telemetry.clone()), &cfg, Signal::Logs).unwrap();
    node.start().await.unwrap();
    Rig { node, metrics, telemetry }
}

fn expected(severity: &str, starts_at: u64, level: f64) -> Value {
    json!({
        "labels": {
            "alertname": "LLMDegradation",
            "severity": severity,
            "detector": "zscore_skew",
            "metric": "llm.ttft.p95",
            "model": "llama-3-8b",
            "version": "v2",
            "instance": "gpu-0",
        },
        "annotations": {
            "summary": format!("FIRING {severity}: zscore_skew"),
            "pod": "pod-1",
            "description": format!(
                "Detector zscore_skew on llm.ttft.p95: anomaly level {level} reached the {severity} threshold 0.8 (score 4.5)."),
            "alert_id": "a1",
            "evidence_level": level.to_string(),
            "evidence_score": "4.5",
            "evidence_threshold": "0.8",
            "evidence_window": "50",
        },
        "startsAt": rfc3339(starts_at),
        "generatorURL": "http://inferwatch.example/alerts",
    })
}

/// Removes `endsAt` and returns it (RFC 3339 of one fixed width: strings compare as times).
fn take_ends_at(alert: &mut Value) -> String {
    let e = alert.as_object_mut().unwrap().remove("endsAt").expect("endsAt");
    e.as_str().unwrap().to_string()
}

#[tokio::test]
async fn firing_and_resolved_alerts_are_posted_as_api_v2_json() {
    let (url, mut rx) = stub(vec![]).await;
    let r = start(json!({"endpoint": url, "generator_url": "http://inferwatch.example/alerts", "repeat": "1m",
        "retry_on_failure": fast_retry()}))
    .await;
    let before = now_ns();
    // One alert record and one unrelated record in the same payload.
    let mut plain = LogRecord { time_unix_nano: T0, ..Default::default() };
    plain.attributes.push(s("event.name", "something.else"));
    r.node.consume(logs(vec![alert("a1", "firing", "critical", T0, T0, 0.85), plain])).await.unwrap();
    let mut body = next(&mut rx).await;
    let after = now_ns();
    let arr = body.as_array_mut().unwrap();
    assert_eq!(arr.len(), 1, "{arr:?}");
    // Firing: endsAt = now + 3 × repeat.
    let ends = take_ends_at(&mut arr[0]);
    assert!(rfc3339(before + 180 * S) <= ends && ends <= rfc3339(after + 180 * S), "endsAt {ends} not now + 3m");
    assert_eq!(arr[0], expected("critical", T0, 0.85));

    // Resolved at T0+60s (in the past): endsAt = that time, startsAt unchanged.
    let mut res = alert("a1", "resolved", "critical", T0 + 60 * S, T0, 0.1);
    res.body = Some(AnyValue { value: Some(any_value::Value::StringValue("RESOLVED critical: zscore_skew".into())) });
    r.node.consume(logs(vec![res])).await.unwrap();
    let body = next(&mut rx).await;
    let a = &body[0];
    assert_eq!(a["endsAt"], rfc3339(T0 + 60 * S));
    assert_eq!(a["startsAt"], rfc3339(T0));
    assert_eq!(a["labels"]["severity"], "critical");
    assert_eq!(a["annotations"]["summary"], "RESOLVED critical: zscore_skew");
    assert_eq!(
        a["annotations"]["description"],
        "Detector zscore_skew on llm.ttft.p95: the critical alert resolved (anomaly level 0.1, threshold 0.8)."
    );
    r.node.shutdown(Instant::now() + PATIENCE).await;
    assert_eq!(r.metrics.sent.get(), 2);
    let text = r.telemetry.render();
    assert!(
        text.lines().any(|l| l.starts_with("otelcol_processor_dropped_log_records")
            && l.contains("processor=\"alertmanager\"")
            && l.ends_with(" 1")),
        "{text}"
    );
}

#[test]
fn the_connectors_names_summary_facts_and_links_become_labels_and_annotations() {
    use inferwatch_exporters::alertmanager::{Render, to_alert};
    let mut r = alert("b2", "firing", "warning", T0, T0, 0.7);
    r.attributes
        .splice(6..6, [s("alertname", "LLMBreachForecast"), s("slo", "tpot-fast"), s("k8s.namespace.name", "serving")]);
    r.attributes.extend([
        s("alert.summary", "TPOT p95 of llama-3-8b on gpu-0 is rising 0.4 ms/day; SLO tpot-fast (70 ms) breached in about 16 days (12–21)"),
        f("alert.value", 0.064),
        f("alert.threshold", 0.07),
        f("alert.eta", 1_382_400.0),
        f("alert.eta_low", 1_036_800.0),
        f("alert.eta_high", 1_814_400.0),
        s("alert.dashboard_url", "http://grafana/d/iw?var-model=llama-3-8b"),
        s("alert.runbook_url", "https://runbooks/LLMBreachForecast"),
    ]);
    let render = Render { generator_url: "http://g/".into(), ends_in: None };
    let a = to_alert(&r, SystemTime::now(), &render).unwrap();
    assert_eq!(
        a["labels"],
        json!({"alertname": "LLMBreachForecast", "severity": "warning", "detector": "zscore_skew",
               "metric": "llm.ttft.p95", "slo": "tpot-fast", "model": "llama-3-8b", "version": "v2",
               "instance": "gpu-0"})
    );
    let ann = &a["annotations"];
    assert!(ann["summary"].as_str().unwrap().starts_with("TPOT p95 of llama-3-8b on gpu-0 is rising"), "{ann}");
    assert_eq!(ann["pod"], "pod-1");
    assert_eq!(ann["namespace"], "serving");
    assert_eq!(ann["value"], "0.064");
    assert_eq!(ann["threshold"], "0.07");
    assert_eq!(ann["eta"], "1382400");
    assert_eq!(ann["eta_low"], "1036800");
    assert_eq!(ann["eta_high"], "1814400");
    assert_eq!(ann["dashboard_url"], "http://grafana/d/iw?var-model=llama-3-8b");
    assert_eq!(ann["runbook_url"], "https://runbooks/LLMBreachForecast");
    assert!(ann.get("summary_url").is_none() && ann.get("alert_summary").is_none(), "{ann}");
}

#[tokio::test]
async fn server_errors_are_retried_until_accepted() {
    let (url, mut rx) = stub(vec![503, 500]).await;
    let r = start(json!({"endpoint": url, "generator_url": "http://inferwatch.example/alerts",
        "retry_on_failure": fast_retry()}))
    .await;
    r.node.consume(logs(vec![alert("a1", "firing", "critical", T0, T0, 0.85)])).await.unwrap();
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let mut b = next(&mut rx).await;
        take_ends_at(&mut b[0]);
        bodies.push(b);
    }
    // The same alert three times (endsAt aside, which is computed at each attempt).
    for b in &bodies {
        assert_eq!(b, &json!([expected("critical", T0, 0.85)]));
    }
    r.node.shutdown(Instant::now() + PATIENCE).await;
    assert_eq!(r.metrics.sent.get(), 1);
    assert_eq!(r.metrics.send_failed.get(), 0);
    assert!(rx.try_recv().is_err(), "no fourth request");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let (url, mut rx) = stub(vec![400]).await;
    let r = start(json!({"endpoint": url, "retry_on_failure": fast_retry()})).await;
    r.node.consume(logs(vec![alert("a1", "firing", "warning", T0, T0, 0.7)])).await.unwrap();
    next(&mut rx).await;
    r.node.shutdown(Instant::now() + PATIENCE).await;
    assert_eq!(r.metrics.send_failed.get(), 1);
    assert_eq!(r.metrics.sent.get(), 0);
    assert!(rx.try_recv().is_err(), "no retry after 400");
}

#[tokio::test]
async fn escalation_resolves_the_warning_alert_and_firing_ones_are_re_sent() {
    let (url, mut rx) = stub(vec![]).await;
    let r = start(json!({"endpoint": url, "repeat": "200ms", "retry_on_failure": fast_retry()})).await;
    r.node.consume(logs(vec![alert("a1", "firing", "warning", T0, T0, 0.7)])).await.unwrap();
    let b = next(&mut rx).await;
    assert_eq!(b[0]["labels"]["severity"], "warning");
    r.node.consume(logs(vec![alert("a1", "firing", "critical", T0 + 60 * S, T0, 0.9)])).await.unwrap();
    // The escalation is one request: the warning alert ends at the escalation's time, the
    // critical one fires; re-sends (every 200 ms) hold only the critical one.
    let b = loop {
        let b = next(&mut rx).await;
        if b.as_array().unwrap().len() == 2 {
            break b;
        }
        assert_eq!(b[0]["labels"]["severity"], "warning", "a re-send before the escalation: {b}");
    };
    assert_eq!(b[0]["labels"]["severity"], "warning");
    assert_eq!(b[0]["endsAt"], rfc3339(T0 + 60 * S));
    assert_eq!(b[1]["labels"]["severity"], "critical");
    let resend = next(&mut rx).await;
    assert_eq!(resend.as_array().unwrap().len(), 1);
    assert_eq!(resend[0]["labels"]["severity"], "critical");
    assert_eq!(resend[0]["startsAt"], rfc3339(T0));
    let mut first = b[1].clone();
    let mut again = resend[0].clone();
    let (e1, e2) = (take_ends_at(&mut first), take_ends_at(&mut again));
    assert!(e2 > e1, "endsAt refreshed by the re-send");
    assert_eq!(first, again);

    // Resolved: a later re-send no longer carries it (another alert b1 is firing by then).
    r.node.consume(logs(vec![alert("a1", "resolved", "critical", T0 + 120 * S, T0, 0.1)])).await.unwrap();
    r.node.consume(logs(vec![alert("b1", "firing", "warning", T0 + 120 * S, T0 + 120 * S, 0.7)])).await.unwrap();
    let mut seen_b_alone = false;
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let b = next(&mut rx).await;
        let ids: Vec<&str> =
            b.as_array().unwrap().iter().map(|a| a["annotations"]["alert_id"].as_str().unwrap()).collect();
        if ids == ["b1"] {
            // The direct send of b1 or a re-send: either way a1 is not re-sent after it resolved.
            seen_b_alone = true;
            let b2 = next(&mut rx).await;
            let ids2: Vec<&str> =
                b2.as_array().unwrap().iter().map(|a| a["annotations"]["alert_id"].as_str().unwrap()).collect();
            assert_eq!(ids2, ["b1"], "re-send after a1 resolved");
            break;
        }
    }
    assert!(seen_b_alone);
    r.node.shutdown(Instant::now() + PATIENCE).await;
}
