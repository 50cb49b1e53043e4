//! `filter`: OTTL conditions per context (precedence, not, regex, nil, numeric and enum
//! comparisons), whole-metric drops, error_mode on run-time errors, the legacy include/exclude
//! form, config errors with paths and columns, and the filtered-items counter.

use inferwatch_core::component::{ComponentId, CreateContext, NodeRef, PathSeg, ProcessorFactory};
use inferwatch_core::consumer::{ConsumeError, ConsumerRef};
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::registry::Registry;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::filter::FilterFactory;
use inferwatch_testkit::harness::Sink;
use inferwatch_testkit::otlp::{any_kv as kv, log_record as log, logs_request, scope, span, traces_request};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Av;
use opentelemetry_proto::tonic::common::v1::{KeyValue, KeyValueList};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Nv;
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::Event;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use serde_json::json;
use std::sync::Arc;

struct Setup {
    node: NodeRef,
    sink: Arc<Sink>,
    telemetry: Arc<Telemetry>,
}

fn setup(id: &str, cfg: serde_json::Value, signal: Signal) -> Setup {
    let telemetry = Arc::new(Telemetry::new());
    let sink = Sink::new();
    let ctx = CreateContext::new(ComponentId::parse(id).unwrap(), telemetry.clone());
    let next: ConsumerRef = sink.clone();
    let node = FilterFactory.create(ctx, &cfg, signal, next).unwrap();
    Setup { node, sink, telemetry }
}

fn s(v: &str) -> Av {
    Av::StringValue(v.into())
}

fn traces(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    traces_request(vec![kv("service.name", s(service))], scope("vllm", "0.8"), spans)
}

fn names(p: &[Payload]) -> Vec<String> {
    let mut out = Vec::new();
    for p in p {
        match p.decoded().unwrap().as_ref() {
            Payload::Traces(r) => {
                for rs in &r.resource_spans {
                    for ss in &rs.scope_spans {
                        out.extend(ss.spans.iter().map(|s| s.name.clone()));
                    }
                }
            }
            Payload::Logs(r) => {
                for rl in &r.resource_logs {
                    for sl in &rl.scope_logs {
                        out.extend(sl.log_records.iter().map(|l| l.severity_text.clone()));
                    }
                }
            }
            Payload::Metrics(r) => {
                for rm in &r.resource_metrics {
                    for sm in &rm.scope_metrics {
                        for m in &sm.metrics {
                            let pts: Vec<String> = match &m.data {
                                Some(Data::Gauge(g)) => g.data_points.iter().map(point_label).collect(),
                                Some(Data::Sum(g)) => g.data_points.iter().map(point_label).collect(),
                                Some(Data::Histogram(h)) => {
                                    h.data_points.iter().map(|p| format!("h{}", p.count)).collect()
                                }
                                _ => vec![],
                            };
                            out.push(format!("{}[{}]", m.name, pts.join(",")));
                        }
                    }
                }
            }
            Payload::Encoded(_) => unreachable!(),
        }
    }
    out
}

fn point_label(p: &NumberDataPoint) -> String {
    let id = p.attributes.iter().find(|kv| kv.key == "id").and_then(|kv| kv.value.clone()).and_then(|v| v.value);
    match id {
        Some(Av::StringValue(s)) => s,
        _ => "?".into(),
    }
}

/// Runs one traces request through a span filter; the names of the spans kept.
async fn kept_spans(conditions: &[&str], spans: Vec<Span>) -> Vec<String> {
    let st = setup("filter", json!({"traces": {"span": conditions}}), Signal::Traces);
    st.node.consume(Payload::Traces(traces("api", spans))).await.unwrap();
    names(&st.sink.take())
}

fn counter(t: &Telemetry, line_prefix: &str) -> f64 {
    let text = t.render();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn health_check_spans_are_dropped_and_counted() {
    let cfg = json!({
        "error_mode": "ignore",
        "traces": {"span": [
            r#"attributes["http.route"] == "/health""#,
            r#"IsMatch(name, "^GET /(ready|live)z$")"#,
        ]}
    });
    let st = setup("filter/health", cfg, Signal::Traces);
    let spans = vec![
        span("GET /health", 2, vec![kv("http.route", s("/health"))]),
        span("GET /readyz", 2, vec![]),
        span("POST /v1/chat/completions", 2, vec![kv("http.route", s("/v1/chat/completions"))]),
        span("GET /livez/x", 2, vec![]),
    ];
    st.node.consume(Payload::Traces(traces("vllm", spans))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["POST /v1/chat/completions", "GET /livez/x"]);
    let n = counter(&st.telemetry, "otelcol_processor_filter_spans_filtered_total{processor=\"filter/health\"}");
    assert_eq!(n, 2.0, "{}", st.telemetry.render());
}

#[tokio::test]
async fn or_binds_looser_than_and() {
    // a or b and c == a or (b and c): a span with a true, b and c false is dropped; under
    // (a or b) and c it would be kept.
    let a = r#"name == "a""#;
    let cond = format!(r#"{a} or attributes["b"] == true and attributes["c"] == true"#);
    let spans = vec![
        span("a", 1, vec![]),
        span("x", 1, vec![kv("b", Av::BoolValue(true))]),
        span("y", 1, vec![kv("b", Av::BoolValue(true)), kv("c", Av::BoolValue(true))]),
    ];
    assert_eq!(kept_spans(&[&cond], spans.clone()).await, vec!["x"]);
    let grouped = format!(r#"({a} or attributes["b"] == true) and attributes["c"] == true"#);
    assert_eq!(kept_spans(&[&grouped], spans).await, vec!["a", "x"]);
}

#[tokio::test]
async fn not_binds_tighter_than_and() {
    let spans = vec![span("a", 2, vec![]), span("b", 3, vec![]), span("c", 2, vec![])];
    // (not name == "a") and kind == SERVER: only "c".
    assert_eq!(kept_spans(&[r#"not name == "a" and kind == SPAN_KIND_SERVER"#], spans.clone()).await, vec!["a", "b"]);
    assert_eq!(kept_spans(&[r#"not (name == "a" or kind == SPAN_KIND_CLIENT)"#], spans).await, vec!["a", "b"]);
}

#[tokio::test]
async fn regex_is_unanchored_and_matches_non_strings_by_their_text() {
    let spans = vec![
        span("GET /api/v1/users", 2, vec![kv("code", Av::IntValue(503))]),
        span("GET /apiv2", 2, vec![kv("code", Av::IntValue(200))]),
        span("POST /x", 2, vec![]),
    ];
    assert_eq!(kept_spans(&[r#"IsMatch(name, "/api/v\\d")"#], spans.clone()).await, vec!["GET /apiv2", "POST /x"]);
    // An int attribute is matched by its decimal text; a missing one never matches.
    assert_eq!(kept_spans(&[r#"IsMatch(attributes["code"], "^5..$")"#], spans).await, vec!["GET /apiv2", "POST /x"]);
}

#[tokio::test]
async fn nil_comparisons_test_attribute_existence() {
    let spans = vec![
        span("with", 1, vec![kv("user.id", s("u1"))]),
        span("without", 1, vec![]),
        span("empty-value", 1, vec![KeyValue { key: "user.id".into(), value: None, ..Default::default() }]),
    ];
    assert_eq!(kept_spans(&[r#"attributes["user.id"] != nil"#], spans.clone()).await, vec!["without", "empty-value"]);
    assert_eq!(kept_spans(&[r#"attributes["user.id"] == nil"#], spans.clone()).await, vec!["with"]);
    assert_eq!(kept_spans(&[r#"resource.attributes["k8s.pod.name"] == nil"#], spans).await, Vec::<String>::new());
}

#[tokio::test]
async fn ints_and_doubles_compare_numerically_and_other_types_are_not_equal() {
    let spans = vec![
        span("int-200", 1, vec![kv("v", Av::IntValue(200))]),
        span("double-499.5", 1, vec![kv("v", Av::DoubleValue(499.5))]),
        span("int-500", 1, vec![kv("v", Av::IntValue(500))]),
        span("string-600", 1, vec![kv("v", s("600"))]),
    ];
    assert_eq!(kept_spans(&[r#"attributes["v"] >= 499.5"#], spans.clone()).await, vec!["int-200", "string-600"]);
    assert_eq!(
        kept_spans(&[r#"attributes["v"] == 500.0"#], spans.clone()).await,
        vec!["int-200", "double-499.5", "string-600"]
    );
    // A string is neither less nor greater than an int, and != is true.
    assert_eq!(
        kept_spans(&[r#"attributes["v"] < 1000 and attributes["v"] > 0"#], spans.clone()).await,
        vec!["string-600"]
    );
    assert_eq!(kept_spans(&[r#"attributes["v"] != 600"#], spans).await, Vec::<String>::new());
}

#[tokio::test]
async fn span_enums_and_status() {
    let mut err = span("failed", 3, vec![]);
    err.status = Some(Status { code: 2, message: "boom".into() });
    let spans = vec![span("server", 2, vec![]), span("internal", 1, vec![]), err];
    assert_eq!(kept_spans(&["kind == SPAN_KIND_INTERNAL"], spans.clone()).await, vec!["server", "failed"]);
    assert_eq!(kept_spans(&["status.code != STATUS_CODE_ERROR"], spans.clone()).await, vec!["failed"]);
    assert_eq!(kept_spans(&[r#"kind.string == "Server""#], spans.clone()).await, vec!["internal", "failed"]);
    assert_eq!(
        kept_spans(
            &[r#"resource.attributes["service.name"] == "api" and instrumentation_scope.name == "vllm""#],
            spans
        )
        .await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn span_duration_by_arithmetic() {
    let mut fast = span("fast", 1, vec![]);
    fast.start_time_unix_nano = 1_000;
    fast.end_time_unix_nano = 2_000;
    let mut slow = span("slow", 1, vec![]);
    slow.start_time_unix_nano = 1_000;
    slow.end_time_unix_nano = 5_000_001_000;
    assert_eq!(
        kept_spans(&["end_time_unix_nano - start_time_unix_nano < 1000000"], vec![fast, slow]).await,
        vec!["slow"]
    );
}

#[tokio::test]
async fn span_events_are_dropped_and_the_span_stays() {
    let mut s1 = span("with-events", 1, vec![]);
    s1.events = vec![
        Event { name: "exception".into(), ..Default::default() },
        Event { name: "gc".into(), ..Default::default() },
    ];
    let cfg =
        json!({"traces": {"spanevent": [r#"name == "gc" and span.name == "with-events""#, r#"name == "exception""#]}});
    let st = setup("filter", cfg, Signal::Traces);
    st.node.consume(Payload::Traces(traces("api", vec![s1]))).await.unwrap();
    let out = st.sink.take();
    let Payload::Traces(r) = &out[0] else { panic!() };
    let sp = &r.resource_spans[0].scope_spans[0].spans[0];
    assert_eq!(sp.name, "with-events");
    assert!(sp.events.is_empty(), "{:?}", sp.events);
    // Span events are not spans: the spans counter stays at zero.
    assert_eq!(counter(&st.telemetry, "otelcol_processor_filter_spans_filtered_total{processor=\"filter\"}"), 0.0);
}

fn gauge(name: &str, ids: &[(&str, f64)]) -> Metric {
    let data_points = ids
        .iter()
        .map(|(id, v)| NumberDataPoint {
            attributes: vec![kv("id", s(id))],
            value: Some(Nv::AsDouble(*v)),
            ..Default::default()
        })
        .collect();
    Metric { name: name.into(), data: Some(Data::Gauge(Gauge { data_points })), ..Default::default() }
}

fn int_sum(name: &str, ids: &[(&str, i64)]) -> Metric {
    let data_points = ids
        .iter()
        .map(|(id, v)| NumberDataPoint {
            attributes: vec![kv("id", s(id))],
            value: Some(Nv::AsInt(*v)),
            ..Default::default()
        })
        .collect();
    Metric {
        name: name.into(),
        data: Some(Data::Sum(Sum { data_points, aggregation_temporality: 2, is_monotonic: true })),
        ..Default::default()
    }
}

fn metrics_req(groups: Vec<Vec<Metric>>) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: groups
            .into_iter()
            .enumerate()
            .map(|(i, metrics)| ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv("host.name", s(&format!("h{i}")))],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics { metrics, ..Default::default() }],
                ..Default::default()
            })
            .collect(),
    }
}

#[tokio::test]
async fn datapoints_drop_and_a_metric_left_without_points_is_removed() {
    let cfg = json!({"metrics": {"datapoint": [
        r#"metric.name == "vllm:gpu_cache_usage_perc" and value_double < 0.5"#,
        r#"metric.type == METRIC_DATA_TYPE_SUM and value_int == 0"#,
    ]}});
    let st = setup("filter/noisy", cfg, Signal::Metrics);
    let req = metrics_req(vec![
        vec![
            gauge("vllm:gpu_cache_usage_perc", &[("a", 0.1), ("b", 0.9)]),
            gauge("vllm:num_requests_running", &[("c", 0.0)]),
        ],
        // Every point of this resource goes: the metric, its scope and the resource are removed.
        vec![int_sum("vllm:request_success", &[("d", 0), ("e", 0)])],
    ]);
    st.node.consume(Payload::Metrics(req)).await.unwrap();
    let out = st.sink.take();
    assert_eq!(names(&out), vec!["vllm:gpu_cache_usage_perc[b]", "vllm:num_requests_running[c]"]);
    let Payload::Metrics(r) = &out[0] else { panic!() };
    assert_eq!(r.resource_metrics.len(), 1, "the emptied resource is removed");
    let n = counter(&st.telemetry, "otelcol_processor_filter_datapoints_filtered_total{processor=\"filter/noisy\"}");
    assert_eq!(n, 3.0);
}

#[tokio::test]
async fn metric_context_drops_whole_metrics_and_checks_points() {
    let cfg = json!({"metrics": {"metric": [
        r#"IsMatch(name, "^vllm:.*_bucket$")"#,
        r#"HasAttrOnDatapoint("id", "noisy")"#,
        r#"type == METRIC_DATA_TYPE_HISTOGRAM and HasAttrKeyOnDatapoint("le")"#,
    ]}});
    let st = setup("filter", cfg, Signal::Metrics);
    let hist = Metric {
        name: "latency".into(),
        data: Some(Data::Histogram(Histogram {
            data_points: vec![HistogramDataPoint {
                attributes: vec![kv("le", s("0.5"))],
                count: 4,
                ..Default::default()
            }],
            aggregation_temporality: 2,
        })),
        ..Default::default()
    };
    let req = metrics_req(vec![vec![
        gauge("vllm:e2e_bucket", &[("a", 1.0)]),
        gauge("kept", &[("a", 1.0), ("b", 2.0)]),
        gauge("series", &[("ok", 1.0), ("noisy", 2.0)]),
        hist,
    ]]);
    st.node.consume(Payload::Metrics(req)).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["kept[a,b]"]);
    assert_eq!(counter(&st.telemetry, "otelcol_processor_filter_datapoints_filtered_total{processor=\"filter\"}"), 4.0);
}

#[tokio::test]
async fn datapoint_conditions_read_histograms() {
    let cfg = json!({"metrics": {"datapoint": ["count < 10 and sum == nil", "count < 10"]}});
    let st = setup("filter", cfg, Signal::Metrics);
    let mk = |count| HistogramDataPoint { count, ..Default::default() };
    let hist = Metric {
        name: "h".into(),
        data: Some(Data::Histogram(Histogram { data_points: vec![mk(3), mk(30)], aggregation_temporality: 2 })),
        ..Default::default()
    };
    st.node.consume(Payload::Metrics(metrics_req(vec![vec![hist]]))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["h[h30]"]);
}

fn logs(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    logs_request(vec![], None, records)
}

#[tokio::test]
async fn log_records_by_severity_and_body() {
    // Indexing a string body is an error in OTTL: `ignore` makes it false for those records.
    let cfg = json!({"error_mode": "ignore", "logs": {"log_record": [
        "severity_number < SEVERITY_NUMBER_INFO",
        r#"IsMatch(body, "GET /metrics")"#,
        r#"body["event"] == "heartbeat""#,
    ]}});
    let st = setup("filter", cfg, Signal::Logs);
    let map = Av::KvlistValue(KeyValueList { values: vec![kv("event", s("heartbeat"))] });
    let recs = vec![
        log(5, "DEBUG", s("x")),
        log(9, "INFO", s("GET /metrics 200")),
        log(13, "WARN", s("slow request")),
        log(9, "INFO-map", map),
        log(17, "ERROR", Av::IntValue(1)),
    ];
    st.node.consume(Payload::Logs(logs(recs))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["WARN", "ERROR"]);
    assert_eq!(counter(&st.telemetry, "otelcol_processor_filter_logs_filtered_total{processor=\"filter\"}"), 3.0);
}

/// `attributes["a"]["b"]` on a string attribute is a run-time error in OTTL, and so is
/// arithmetic mixing int and double.
const FAILING: &str = r#"attributes["a"]["b"] == 1"#;

fn error_spans() -> Vec<Span> {
    vec![span("bad", 1, vec![kv("a", s("text"))]), span("drop-me", 1, vec![]), span("keep", 1, vec![])]
}

#[tokio::test]
async fn error_mode_propagate_refuses_the_payload() {
    let cfg = json!({"traces": {"span": [FAILING, r#"name == "drop-me""#]}});
    let st = setup("filter", cfg, Signal::Traces);
    let e = st.node.consume(Payload::Traces(traces("api", error_spans()))).await.unwrap_err();
    assert!(matches!(&e, ConsumeError::Permanent(m) if m.contains("does not support indexing")), "{e}");
    assert!(st.sink.take().is_empty(), "nothing passes on after a propagated error");
}

#[tokio::test]
async fn error_mode_ignore_and_silent_treat_the_condition_as_false() {
    for mode in ["ignore", "silent"] {
        let cfg = json!({"error_mode": mode, "traces": {"span": [FAILING, r#"name == "drop-me""#]}});
        let st = setup("filter", cfg, Signal::Traces);
        st.node.consume(Payload::Traces(traces("api", error_spans()))).await.unwrap();
        // The failing condition is false for "bad"; the next condition still drops "drop-me".
        assert_eq!(names(&st.sink.take()), vec!["bad", "keep"], "{mode}");
    }
    let cfg = json!({"error_mode": "ignore", "traces": {"span": [r#"attributes["n"] * 2 > 3"#]}});
    let st = setup("filter", cfg, Signal::Traces);
    let spans =
        vec![span("double", 1, vec![kv("n", Av::DoubleValue(2.0))]), span("int", 1, vec![kv("n", Av::IntValue(2))])];
    st.node.consume(Payload::Traces(traces("api", spans))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["double"], "int * int works; double * int is an error, so false");
}

#[tokio::test]
async fn comparing_a_string_with_an_int_is_not_an_error() {
    // OTTL: values of different types are "not equal"; no error even under propagate.
    let cfg = json!({"traces": {"span": [r#"attributes["a"] > 5"#]}});
    let st = setup("filter", cfg, Signal::Traces);
    st.node.consume(Payload::Traces(traces("api", error_spans()))).await.unwrap();
    assert_eq!(names(&st.sink.take()).len(), 3);
}

#[tokio::test]
async fn encoded_payloads_pass_unchanged_or_filtered() {
    let cfg = json!({"traces": {"span": [r#"name == "drop""#]}});
    let st = setup("filter", cfg, Signal::Traces);
    let keep = Payload::Traces(traces("api", vec![span("a", 1, vec![])]));
    let enc = Encoded::from_decoded(&keep);
    let bytes = enc.to_vec();
    st.node.consume(Payload::Encoded(enc)).await.unwrap();
    let out = st.sink.take();
    assert!(matches!(&out[0], Payload::Encoded(e) if e.to_vec() == bytes), "passed on as it came");
    let mixed = Payload::Traces(traces("api", vec![span("drop", 1, vec![]), span("b", 1, vec![])]));
    st.node.consume(Payload::Encoded(Encoded::from_decoded(&mixed))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["b"]);
    // Everything dropped: nothing is passed on at all.
    let all = Payload::Traces(traces("api", vec![span("drop", 1, vec![])]));
    st.node.consume(all).await.unwrap();
    assert!(st.sink.take().is_empty());
}

#[tokio::test]
async fn signals_without_conditions_pass_through() {
    let cfg = json!({"logs": {"log_record": ["true"]}});
    let st = setup("filter", cfg, Signal::Traces);
    st.node.consume(Payload::Traces(traces("api", vec![span("a", 1, vec![])]))).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["a"]);
}

#[tokio::test]
async fn legacy_span_include_exclude() {
    let cfg = json!({"spans": {
        "include": {"match_type": "regexp", "services": ["^(api|web)$"]},
        "exclude": {"match_type": "strict", "span_names": ["GET /health"], "attributes": [{"Key": "internal"}]}
    }});
    let st = setup("filter", cfg, Signal::Traces);
    let spans = vec![
        span("GET /health", 2, vec![kv("internal", Av::BoolValue(true))]),
        span("GET /health", 2, vec![]),
        span("POST /x", 2, vec![]),
    ];
    st.node.consume(Payload::Traces(traces("api", spans.clone()))).await.unwrap();
    st.node.consume(Payload::Traces(traces("batch-job", spans))).await.unwrap();
    // Excluded only when the name AND the attribute match; other services are not included.
    assert_eq!(names(&st.sink.take()), vec!["GET /health", "POST /x"]);
}

#[tokio::test]
async fn legacy_metric_names_and_log_severity() {
    let cfg = json!({"metrics": {"exclude": {"match_type": "regexp", "metric_names": ["^go_", "_bucket$"]}}});
    let st = setup("filter", cfg, Signal::Metrics);
    let req =
        metrics_req(vec![vec![gauge("go_gc", &[("a", 1.0)]), gauge("vllm:x", &[("a", 1.0)]), gauge("y_bucket", &[])]]);
    st.node.consume(Payload::Metrics(req)).await.unwrap();
    assert_eq!(names(&st.sink.take()), vec!["vllm:x[a]"]);

    let cfg = json!({"logs": {"include": {"match_type": "strict", "severity_number": {"min": "WARN", "match_undefined": false}}}});
    let st = setup("filter", cfg, Signal::Logs);
    st.node
        .consume(Payload::Logs(logs(vec![log(9, "INFO", s("a")), log(13, "WARN", s("b")), log(0, "NONE", s("c"))])))
        .await
        .unwrap();
    assert_eq!(names(&st.sink.take()), vec!["WARN"]);
}

fn validate(cfg: serde_json::Value) -> inferwatch_core::component::FieldError {
    FilterFactory.validate(&cfg).unwrap_err()
}

#[test]
fn config_errors_name_the_path_and_column_of_every_bad_condition() {
    let e = validate(json!({"traces": {"span": [
        r#"name == "ok""#,
        r#"attributes["http.route" == "/health""#,
    ], "spanevent": ["name = 1"]},
    "metrics": {"datapoint": [r#"IsMatch(metric.name, "(")"#]}}));
    assert_eq!(e.path, vec![PathSeg::Key("traces".into()), PathSeg::Key("span".into()), PathSeg::Index(1)]);
    assert!(
        e.message.starts_with("column 25 of `attributes[\"http.route\" == \"/health\"`: expected `]`"),
        "{}",
        e.message
    );
    assert!(e.message.contains("2 more problems"), "{}", e.message);
    assert!(e.message.contains("traces.spanevent[0]: column 6 of `name = 1`"), "{}", e.message);
    assert!(e.message.contains("metrics.datapoint[0]: column 22 of"), "{}", e.message);
    assert!(e.message.contains("invalid regular expression"), "{}", e.message);

    let e = validate(json!({"error_mode": "loud"}));
    assert_eq!(e.path, vec![PathSeg::Key("error_mode".into())]);
    let e = validate(json!({"logs": {"log_record": ["severity_number > SEVERITY_NUMBER_LOUD"]}}));
    assert!(e.message.contains("unknown enum `SEVERITY_NUMBER_LOUD`"), "{}", e.message);
    let e = validate(json!({"metrics": {"exclude": {"match_type": "expr", "expressions": ["MetricName == \"x\""]}}}));
    assert!(e.message.contains("not supported; write OTTL"), "{}", e.message);
    let e = validate(
        json!({"spans": {"exclude": {"match_type": "strict", "span_names": ["a"]}}, "traces": {"span": ["true"]}}),
    );
    assert!(e.message.contains("cannot be used together"), "{}", e.message);
    let e = validate(json!({"spans": {"exclude": {"match_type": "regexp"}}}));
    assert!(e.message.contains("at least one of services"), "{}", e.message);
    assert!(FilterFactory.validate(&json!({"traces": {"span": [r#"attributes["http.route"] == "/health""#]}})).is_ok());
    // No conditions at all: valid, with a warning.
    assert!(FilterFactory.validate(&json!(null)).is_ok());
    assert_eq!(FilterFactory.warnings(&json!(null)).len(), 1);
}

#[test]
fn validate_of_a_whole_config_lists_every_bad_condition() {
    let text = r#"
receivers:
  otlp:
    protocols:
      grpc:
exporters:
  debug:
processors:
  filter/health:
    error_mode: ignore
    traces:
      span:
        - 'attributes["http.route"] == "/health"'
        - 'attributes["http.route"] == "/ready" or'
        - 'kind == SPAN_KIND_SERVR'
service:
  pipelines:
    traces:
      receivers: [otlp]
      processors: [filter/health]
      exporters: [debug]
"#;
    let cfg = inferwatch_core::config::load_str("pipeline.yaml", text, &|_| None).unwrap();
    let mut reg = Registry::new();
    inferwatch_processors::register(&mut reg);
    let errors = inferwatch_core::config::validate(&cfg, &reg);
    let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let filter: Vec<&String> = all.iter().filter(|e| e.contains("processors.filter/health")).collect();
    assert!(!filter.is_empty(), "{all:#?}");
    let text = filter.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
    assert!(text.contains("processors.filter/health.traces.span[1]"), "{text}");
    assert!(text.contains("column 40 of"), "{text}");
    assert!(text.contains("traces.span[2]: column 9"), "{text}");
    assert!(text.contains("SPAN_KIND_SERVER"), "{text}");
}
