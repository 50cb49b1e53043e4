//! Pod identity (issue 14): the `resource`, `attributes` and `resourcedetection` processors
//! through their factories, and the k8s.* resource attributes of input spans reaching the
//! golden signals (`llm_signals`), a detector's scores (`zscore_skew`) and an alert (`alerts`).

use inferwatch_core::arrow::{ArrowProcessorFactory, RecordBatch, metrics, spans};
use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, NodeRef, ProcessorFactory};
use inferwatch_core::consumer::Consumer;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::alerts::AlertsFactory;
use inferwatch_processors::attributes::AttributesFactory;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_processors::resource::ResourceFactory;
use inferwatch_processors::resourcedetection::{ResourceDetection, ResourceDetectionConfig, ResourceDetectionFactory};
use inferwatch_processors::zscore_skew::ZscoreSkewFactory;
use inferwatch_testkit::attrs::{attr as get, str_attr};
use inferwatch_testkit::harness::Sink;
use inferwatch_testkit::otlp::{self, kv, logs_request, resource_spans, scope};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use serde_json::json;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
const BASE: u64 = 1_699_999_980 * S;

fn sval(attrs: &[KeyValue], k: &str) -> Option<String> {
    str_attr(attrs, k).map(str::to_string)
}

/// Every payload the sink got so far, decoded, then cleared.
fn decoded(out: &Sink) -> Vec<Payload> {
    out.take().into_iter().map(|p| p.into_decoded().unwrap()).collect()
}

fn ctx(id: &str) -> CreateContext {
    CreateContext::new(ComponentId::parse(id).unwrap(), Arc::new(Telemetry::new()))
}

fn processor(f: &dyn ProcessorFactory, cfg: serde_json::Value, signal: Signal) -> (NodeRef, Arc<Sink>) {
    let out = Sink::new();
    let node = f.create(ctx(f.type_name()), &cfg, signal, out.clone()).unwrap();
    (node, out)
}

fn create_err(f: &dyn ProcessorFactory, cfg: serde_json::Value, signal: Signal) -> String {
    match f.create(ctx(f.type_name()), &cfg, signal, Sink::new()) {
        Ok(_) => panic!("{cfg} must be refused"),
        Err(inferwatch_core::component::ComponentError::Config(e)) => e.dotted(),
        Err(e) => panic!("not a config error: {e}"),
    }
}

fn span(name: &str, kind: i32, attrs: Vec<KeyValue>) -> Span {
    Span { span_id: vec![1; 8], trace_id: vec![2; 16], ..otlp::span(name, kind, attrs) }
}

fn traces(groups: Vec<(Vec<KeyValue>, &str, Vec<Span>)>) -> ExportTraceServiceRequest {
    let resource_spans = groups.into_iter().map(|(res, sc, spans)| resource_spans(res, scope(sc, "1.0"), spans));
    ExportTraceServiceRequest { resource_spans: resource_spans.collect() }
}

fn gauge_req(res: Vec<KeyValue>, names: &[&str]) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource { attributes: res, ..Default::default() }),
            scope_metrics: vec![ScopeMetrics {
                metrics: names
                    .iter()
                    .map(|n| Metric {
                        name: n.to_string(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                attributes: vec![kv("gpu", "0")],
                                time_unix_nano: BASE,
                                value: Some(number_data_point::Value::AsDouble(1.0)),
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            schema_url: String::new(),
        }],
    }
}

fn logs_req(res: Vec<KeyValue>, records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    logs_request(res, None, records)
}

// ---- resource ----------------------------------------------------------------------------------

#[tokio::test]
async fn resource_processor_acts_on_every_signal_and_keeps_encoded_items_as_bytes() {
    let cfg = json!({"attributes": [
        {"key": "deployment.environment", "value": "prod", "action": "insert"},
        {"key": "service.name", "value": "overwritten", "action": "insert"},
        {"key": "cloud.region", "value": "never", "action": "update"},
        {"key": "host.name", "value": "h", "action": "upsert"},
        {"key": "secret", "action": "delete"},
    ]});
    let res = vec![kv("service.name", "vllm"), kv("secret", "s"), kv("host.name", "old")];
    let check = |r: &[KeyValue]| {
        assert_eq!(sval(r, "deployment.environment").as_deref(), Some("prod"));
        assert_eq!(sval(r, "service.name").as_deref(), Some("vllm"), "insert does not overwrite");
        assert_eq!(get(r, "cloud.region"), None, "update does not create");
        assert_eq!(sval(r, "host.name").as_deref(), Some("h"), "upsert updates");
        assert_eq!(get(r, "secret"), None, "delete removes");
    };
    // Traces, encoded: the spans come back byte-identical.
    let (node, out) = processor(&ResourceFactory, cfg.clone(), Signal::Traces);
    let req = traces(vec![(res.clone(), "s", vec![span("a", 2, vec![kv("x", "1")])])]);
    let enc = Encoded::from_decoded(&Payload::Traces(req.clone()));
    node.consume(Payload::Encoded(enc)).await.unwrap();
    let got = decoded(&out);
    let Payload::Traces(t) = &got[0] else { panic!("traces") };
    check(&t.resource_spans[0].resource.as_ref().unwrap().attributes);
    assert_eq!(t.resource_spans[0].scope_spans, req.resource_spans[0].scope_spans);
    // Metrics and logs, decoded.
    let (node, out) = processor(&ResourceFactory, cfg.clone(), Signal::Metrics);
    node.consume(Payload::Metrics(gauge_req(res.clone(), &["m"]))).await.unwrap();
    let Payload::Metrics(m) = &decoded(&out)[0] else { panic!("metrics") };
    check(&m.resource_metrics[0].resource.as_ref().unwrap().attributes);
    let (node, out) = processor(&ResourceFactory, cfg, Signal::Logs);
    node.consume(Payload::Logs(logs_req(res, vec![LogRecord::default()]))).await.unwrap();
    let Payload::Logs(l) = &decoded(&out)[0] else { panic!("logs") };
    check(&l.resource_logs[0].resource.as_ref().unwrap().attributes);
}

#[tokio::test]
async fn resource_processor_passes_an_unchanged_encoded_payload_as_it_came() {
    let (node, out) =
        processor(&ResourceFactory, json!({"attributes": [{"key": "absent", "action": "delete"}]}), Signal::Traces);
    let enc =
        Encoded::from_decoded(&Payload::Traces(traces(vec![(vec![kv("a", "b")], "s", vec![span("x", 1, vec![])])])));
    node.consume(Payload::Encoded(enc.clone())).await.unwrap();
    let got = out.take();
    assert_eq!(got, vec![Payload::Encoded(enc)]);
}

#[test]
fn resource_config_errors_name_the_field() {
    assert_eq!(create_err(&ResourceFactory, json!({}), Signal::Traces), "attributes");
    assert_eq!(
        create_err(&ResourceFactory, json!({"attributes": [{"key": "k", "action": "insert"}]}), Signal::Traces),
        "attributes.0.value"
    );
    let e = ResourceFactory.validate(&json!({"attributes": [], "actions": []})).unwrap_err();
    assert_eq!(e.dotted(), "actions");
}

// ---- attributes --------------------------------------------------------------------------------

#[tokio::test]
async fn attributes_include_exclude_select_spans() {
    let cfg = json!({
        "actions": [{"key": "touched", "value": true, "action": "upsert"}],
        "include": {"match_type": "strict", "services": ["vllm"], "span_kinds": ["SPAN_KIND_SERVER"]},
        "exclude": {"match_type": "regexp", "span_names": ["^health"]},
    });
    let (node, out) = processor(&AttributesFactory, cfg, Signal::Traces);
    let req = traces(vec![
        (
            vec![kv("service.name", "vllm")],
            "s",
            vec![span("llm_request", 2, vec![]), span("healthz", 2, vec![]), span("llm_request", 3, vec![])],
        ),
        (vec![kv("service.name", "other")], "s", vec![span("llm_request", 2, vec![])]),
    ]);
    node.consume(Payload::Traces(req)).await.unwrap();
    let Payload::Traces(t) = &decoded(&out)[0] else { panic!("traces") };
    let touched: Vec<bool> = t
        .resource_spans
        .iter()
        .flat_map(|rs| rs.scope_spans[0].spans.iter())
        .map(|s| get(&s.attributes, "touched").is_some())
        .collect();
    assert_eq!(touched, vec![true, false, false, false]);
}

#[tokio::test]
async fn attributes_match_attributes_resources_and_libraries() {
    let cfg = json!({
        "actions": [{"key": "hit", "value": 1, "action": "insert"}],
        "include": {
            "match_type": "regexp",
            "attributes": [{"key": "http.route", "value": "^/v1/"}, {"key": "present"}],
            "resources": [{"key": "k8s.namespace.name", "value": "llm-.*"}],
            "libraries": [{"name": "^vllm", "version": "^1\\."}],
        },
    });
    let (node, out) = processor(&AttributesFactory, cfg, Signal::Traces);
    let good = || vec![kv("http.route", "/v1/chat"), kv("present", "")];
    let req = traces(vec![
        (
            vec![kv("k8s.namespace.name", "llm-prod")],
            "vllm.engine",
            vec![
                span("a", 2, good()),
                span("b", 2, vec![kv("http.route", "/v1/chat")]),
                span("c", 2, vec![kv("http.route", "/v2/chat"), kv("present", "")]),
            ],
        ),
        (vec![kv("k8s.namespace.name", "default")], "vllm.engine", vec![span("d", 2, good())]),
        (vec![kv("k8s.namespace.name", "llm-prod")], "tgi", vec![span("e", 2, good())]),
    ]);
    node.consume(Payload::Traces(req)).await.unwrap();
    let Payload::Traces(t) = &decoded(&out)[0] else { panic!("traces") };
    let hit: Vec<&str> = t
        .resource_spans
        .iter()
        .flat_map(|rs| rs.scope_spans[0].spans.iter())
        .filter(|s| get(&s.attributes, "hit").is_some())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(hit, vec!["a"]);
}

#[tokio::test]
async fn attributes_on_metric_points_and_log_records() {
    let cfg = json!({
        "actions": [{"key": "gpu", "action": "delete"}, {"key": "pod", "from_attribute": "missing", "default_value": "?", "action": "insert"}],
        "exclude": {"match_type": "strict", "metric_names": ["keep"]},
    });
    let (node, out) = processor(&AttributesFactory, cfg, Signal::Metrics);
    node.consume(Payload::Metrics(gauge_req(vec![], &["change", "keep"]))).await.unwrap();
    let Payload::Metrics(m) = &decoded(&out)[0] else { panic!("metrics") };
    let attrs = |i: usize| match &m.resource_metrics[0].scope_metrics[0].metrics[i].data {
        Some(Data::Gauge(g)) => g.data_points[0].attributes.clone(),
        _ => panic!("gauge"),
    };
    assert_eq!(attrs(0), vec![kv("pod", "?")]);
    assert_eq!(attrs(1), vec![kv("gpu", "0")]);

    let cfg = json!({
        "actions": [{"key": "flag", "value": "x", "action": "insert"}],
        "include": {"match_type": "strict", "log_severity_number": {"min": "WARN", "match_undefined": false}},
        "exclude": {"match_type": "regexp", "log_bodies": ["noisy"]},
    });
    let (node, out) = processor(&AttributesFactory, cfg, Signal::Logs);
    let rec = |sev: i32, body: &str| LogRecord {
        severity_number: sev,
        body: Some(AnyValue { value: Some(Value::StringValue(body.into())) }),
        ..Default::default()
    };
    node.consume(Payload::Logs(logs_req(vec![], vec![rec(13, "a"), rec(9, "b"), rec(17, "noisy!"), rec(0, "c")])))
        .await
        .unwrap();
    let Payload::Logs(l) = &decoded(&out)[0] else { panic!("logs") };
    let flagged: Vec<bool> =
        l.resource_logs[0].scope_logs[0].log_records.iter().map(|r| get(&r.attributes, "flag").is_some()).collect();
    assert_eq!(flagged, vec![true, false, false, false]);
}

#[test]
fn attributes_config_errors_name_the_field() {
    let act = json!([{"key": "k", "value": 1, "action": "insert"}]);
    let cases = [
        (json!({}), Signal::Traces, "actions"),
        (json!({"actions": act, "include": {"services": ["a"]}}), Signal::Traces, "include.match_type"),
        (
            json!({"actions": act, "include": {"match_type": "expr", "services": ["a"]}}),
            Signal::Traces,
            "include.match_type",
        ),
        (json!({"actions": act, "include": {"match_type": "strict"}}), Signal::Traces, "include.match_type"),
        (
            json!({"actions": act, "include": {"match_type": "regexp", "span_names": ["ok", "("]}}),
            Signal::Traces,
            "include.span_names.1",
        ),
        (
            json!({"actions": act, "exclude": {"match_type": "strict", "span_kinds": ["SERVER"]}}),
            Signal::Traces,
            "exclude.span_kinds.0",
        ),
        (
            json!({"actions": act, "include": {"match_type": "strict", "metric_names": ["m"]}}),
            Signal::Traces,
            "include.metric_names",
        ),
        (
            json!({"actions": act, "include": {"match_type": "strict", "span_names": ["s"]}}),
            Signal::Metrics,
            "include.span_names",
        ),
        (
            json!({"actions": act, "include": {"match_type": "strict", "services": ["s"]}}),
            Signal::Logs,
            "include.services",
        ),
        (json!({"actions": act, "include": {"match_type": "strict", "bogus": ["s"]}}), Signal::Logs, "include.bogus"),
        (
            json!({"actions": act, "include": {"match_type": "strict", "log_severity_number": {"min": "LOUD"}}}),
            Signal::Logs,
            "include.log_severity_number",
        ),
    ];
    for (cfg, signal, want) in cases {
        assert_eq!(create_err(&AttributesFactory, cfg.clone(), signal), want, "{cfg}");
    }
}

// ---- resourcedetection -------------------------------------------------------------------------

fn detection(cfg: serde_json::Value, env: &[(&str, &str)]) -> Vec<KeyValue> {
    let c: ResourceDetectionConfig = inferwatch_core::component::parse_config(&cfg).unwrap();
    let env: Vec<(String, String)> = env.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    c.check().unwrap().detect(&|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

const POD_ENV: [(&str, &str); 4] = [
    ("K8S_POD_NAME", "vllm-7d9f-abcde"),
    ("K8S_NAMESPACE_NAME", "llm"),
    ("K8S_NODE_NAME", "gpu-node-3"),
    ("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=from-env,deployment.environment=prod%2Ceu"),
];

#[test]
fn detectors_run_in_order_and_the_first_wins() {
    let got = detection(json!({"detectors": ["k8s_downward_api", "env"]}), &POD_ENV);
    assert_eq!(
        got,
        vec![
            kv("k8s.pod.name", "vllm-7d9f-abcde"),
            kv("k8s.namespace.name", "llm"),
            kv("k8s.node.name", "gpu-node-3"),
            kv("deployment.environment", "prod,eu"),
        ]
    );
    let got = detection(json!({"detectors": ["env", "k8s_downward_api"]}), &POD_ENV);
    assert_eq!(sval(&got, "k8s.pod.name").as_deref(), Some("from-env"));
    let got = detection(json!({"detectors": ["env", "system"], "attributes": ["os.type"]}), &POD_ENV);
    assert_eq!(got.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(), vec!["os.type"]);
}

#[tokio::test]
async fn override_true_replaces_and_false_keeps_the_incoming_value() {
    let detected = detection(json!({"detectors": ["k8s_downward_api"]}), &POD_ENV);
    let req = || traces(vec![(vec![kv("k8s.pod.name", "incoming")], "s", vec![span("a", 2, vec![])])]);
    for (override_existing, want) in [(true, "vllm-7d9f-abcde"), (false, "incoming")] {
        let out = Sink::new();
        let p = ResourceDetection::new(detected.clone(), override_existing, out.clone());
        p.consume(Payload::Encoded(Encoded::from_decoded(&Payload::Traces(req())))).await.unwrap();
        let Payload::Traces(t) = &decoded(&out)[0] else { panic!("traces") };
        let res = &t.resource_spans[0].resource.as_ref().unwrap().attributes;
        assert_eq!(sval(res, "k8s.pod.name").as_deref(), Some(want), "override {override_existing}");
        assert_eq!(sval(res, "k8s.node.name").as_deref(), Some("gpu-node-3"), "missing ones are added either way");
    }
}

#[test]
fn resourcedetection_config_errors_name_the_field() {
    let f = ResourceDetectionFactory;
    let cases = [
        (json!({"detectors": ["env", "ec2"]}), "detectors.1"),
        (json!({"detectors": ["env", "env"]}), "detectors.1"),
        (json!({"detectors": ["system"], "timeout": "0s"}), "timeout"),
        (json!({"detectors": ["system"], "refresh_interval": "1m"}), "refresh_interval"),
        (json!({"detectors": ["system"], "system": {"hostname_sources": ["dns", "os"]}}), "system.hostname_sources.0"),
        (
            json!({"detectors": ["system"], "system": {"resource_attributes": {"host.id": {"enabled": true}}}}),
            "system.resource_attributes.host.id",
        ),
        (
            json!({"detectors": ["k8s_downward_api"], "k8s_downward_api": {"env_vars": {"k8s.pod.ip": "POD_IP"}}}),
            "k8s_downward_api.env_vars.k8s.pod.ip",
        ),
        (json!({"detectors": ["system"], "ec2": {}}), "ec2"),
    ];
    for (cfg, want) in cases {
        assert_eq!(f.validate(&cfg).expect_err(&cfg.to_string()).dotted(), want, "{cfg}");
    }
    // otelcol's defaults and shapes are accepted.
    f.validate(&json!({"detectors": ["env", "system"], "timeout": "2s", "override": false,
        "system": {"hostname_sources": ["os"], "resource_attributes": {"host.arch": {"enabled": true}, "os.description": {"enabled": false}}}}))
        .unwrap();
}

// ---- propagation: spans → golden signals → detector → alert ------------------------------------

fn llm_span(end_s: u64, ttft: f64) -> Span {
    let end = BASE + end_s * S;
    let dbl = |k: &str, v: f64| KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(Value::DoubleValue(v)) }),
        key_strindex: 0,
    };
    let int = |k: &str, v: i64| KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(Value::IntValue(v)) }),
        key_strindex: 0,
    };
    Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        name: "llm_request".into(),
        kind: 2,
        start_time_unix_nano: end - (ttft + 1.0) as u64 * S,
        end_time_unix_nano: end,
        attributes: vec![
            kv("gen_ai.request.model", "llama"),
            int("gen_ai.usage.prompt_tokens", 100),
            int("gen_ai.usage.completion_tokens", 50),
            dbl("gen_ai.latency.time_to_first_token", ttft),
            dbl("gen_ai.latency.e2e", ttft + 1.0),
        ],
        status: Some(Status::default()),
        ..Default::default()
    }
}

fn points_of(req: &ExportMetricsServiceRequest, name: &str) -> Vec<(Vec<KeyValue>, Vec<KeyValue>)> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let res = rm.resource.clone().unwrap_or_default().attributes;
        for sm in &rm.scope_metrics {
            for m in sm.metrics.iter().filter(|m| m.name == name) {
                if let Some(Data::Gauge(g)) = &m.data {
                    out.extend(g.data_points.iter().map(|p| (res.clone(), p.attributes.clone())));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn pod_identity_reaches_golden_signals_detector_scores_and_alerts() {
    // The sidecar's detection from the Downward API environment, on spans without identity.
    let detected = detection(json!({"detectors": ["k8s_downward_api"]}), &POD_ENV);
    let out = Sink::new();
    let rd = ResourceDetection::new(detected, true, out.clone());
    let pod_res = vec![kv("service.name", "vllm"), kv("service.instance.id", "i-1")];
    // Six 60 s windows of spans: steady TTFT, then a jump in the last.
    for w in 0..6u64 {
        let ttft = if w == 5 { 3.0 } else { 0.10 + 0.01 * (w % 2) as f64 };
        let spans = (0..5).map(|i| llm_span(w * 60 + 10 + i * 5, ttft + 0.001 * i as f64)).collect();
        rd.consume(Payload::Traces(traces(vec![(pod_res.clone(), "vllm", spans)]))).await.unwrap();
    }
    let mut llm = LlmSignalsFactory.create_arrow(ctx("llm_signals"), &json!({"window": "1m"}), Signal::Traces).unwrap();
    let mut derived: Vec<RecordBatch> = Vec::new();
    for p in decoded(&out) {
        let Payload::Traces(t) = p else { panic!("traces") };
        llm.process(&spans::to_batch(&t).unwrap(), &mut derived).unwrap();
    }
    llm.advance(BASE + 6 * 60 * S, &mut derived).unwrap();
    let golden: Vec<ExportMetricsServiceRequest> = derived.iter().map(|b| metrics::from_batch(b).unwrap()).collect();
    let p95: Vec<_> = golden.iter().flat_map(|r| points_of(r, "llm.ttft.p95")).collect();
    assert_eq!(p95.len(), 6, "one p95 per window");
    for (_, attrs) in &p95 {
        assert_eq!(sval(attrs, "k8s.pod.name").as_deref(), Some("vllm-7d9f-abcde"));
        assert_eq!(sval(attrs, "k8s.namespace.name").as_deref(), Some("llm"));
        assert_eq!(sval(attrs, "k8s.node.name").as_deref(), Some("gpu-node-3"));
        assert_eq!(sval(attrs, "service.instance.id").as_deref(), Some("i-1"));
    }

    // A detector on the golden signals keeps the input's attributes on its scores.
    let zcfg = json!({"metrics": ["llm.ttft.p95"], "window": 4, "level": {"zero": 1, "one": 2}});
    let mut z = ZscoreSkewFactory.create_arrow(ctx("zscore_skew"), &zcfg, Signal::Metrics).unwrap();
    let mut scores: Vec<RecordBatch> = Vec::new();
    for b in &derived {
        z.process(b, &mut scores).unwrap();
    }
    z.advance(BASE + 6 * 60 * S, &mut scores).unwrap();
    let score_reqs: Vec<ExportMetricsServiceRequest> = scores.iter().map(|b| metrics::from_batch(b).unwrap()).collect();
    let levels: Vec<_> = score_reqs.iter().flat_map(|r| points_of(r, "llm.anomaly.level")).collect();
    assert!(!levels.is_empty(), "the jump is scored");
    assert!(levels.iter().all(|(_, a)| sval(a, "k8s.pod.name").as_deref() == Some("vllm-7d9f-abcde")));

    // The alert says which pod.
    let alerts_out = Sink::new();
    let alerts = AlertsFactory
        .create(ctx("alerts"), &json!({"for": "0s"}), Signal::Metrics, Signal::Logs, alerts_out.clone())
        .unwrap();
    for r in score_reqs {
        alerts.consume(Payload::Metrics(r)).await.unwrap();
    }
    let records: Vec<LogRecord> = decoded(&alerts_out)
        .into_iter()
        .flat_map(|p| match p {
            Payload::Logs(l) => l
                .resource_logs
                .into_iter()
                .flat_map(|rl| rl.scope_logs)
                .flat_map(|sl| sl.log_records)
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    let firing: Vec<&LogRecord> =
        records.iter().filter(|r| sval(&r.attributes, "alert.state").as_deref() == Some("firing")).collect();
    assert!(!firing.is_empty(), "the jump fires an alert: {records:?}");
    for r in firing {
        assert_eq!(sval(&r.attributes, "k8s.pod.name").as_deref(), Some("vllm-7d9f-abcde"));
        assert_eq!(sval(&r.attributes, "k8s.namespace.name").as_deref(), Some("llm"));
        assert_eq!(sval(&r.attributes, "k8s.node.name").as_deref(), Some("gpu-node-3"));
    }
}

#[test]
fn identity_is_part_of_the_group_and_bounded_by_max_series() {
    // Two pods without service.instance.id stay two series; max_series still bounds them.
    let pod = |name: &str| vec![kv("service.name", "vllm"), kv("k8s.pod.name", name)];
    let req = traces(vec![
        (pod("p-1"), "vllm", vec![llm_span(10, 0.1)]),
        (pod("p-2"), "vllm", vec![llm_span(11, 0.2)]),
        (pod("p-3"), "vllm", vec![llm_span(12, 0.3)]),
    ]);
    let mut llm = LlmSignalsFactory
        .create_arrow(ctx("llm_signals"), &json!({"window": "1m", "max_series": 2}), Signal::Traces)
        .unwrap();
    let mut out = Vec::new();
    llm.process(&spans::to_batch(&req).unwrap(), &mut out).unwrap();
    assert!(llm.series_count() <= 2, "max_series bounds the groups");
    let mut unbounded =
        LlmSignalsFactory.create_arrow(ctx("llm_signals"), &json!({"window": "1m"}), Signal::Traces).unwrap();
    unbounded.process(&spans::to_batch(&req).unwrap(), &mut out).unwrap();
    unbounded.advance(BASE + 60 * S, &mut out).unwrap();
    let pods: std::collections::BTreeSet<String> = out
        .iter()
        .flat_map(|b| points_of(&metrics::from_batch(b).unwrap(), "llm.ttft.p95"))
        .filter_map(|(_, a)| sval(&a, "k8s.pod.name"))
        .collect();
    assert_eq!(pods.into_iter().collect::<Vec<_>>(), vec!["p-1", "p-2", "p-3"]);
    // An identity attribute that clashes with llm_signals' own is refused, naming the index.
    let e = LlmSignalsFactory
        .validate_arrow(&json!({"identity_attributes": ["k8s.pod.name", "service.version"]}))
        .unwrap_err();
    assert_eq!(e.dotted(), "identity_attributes.1");
}
