//! The seed corpus: small valid and near-valid inputs for every target, made from typed
//! OTLP requests and the repository's fixtures. `inferwatch-fuzz gen-corpus` writes them to
//! `fuzz/corpus/<target>/`; the checked-in files are what the runs start from.

use inferwatch_core::arrow::payload_to_batch;
use inferwatch_core::pdata::Payload;
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsPartialSuccess, ExportLogsServiceRequest};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

fn kv(key: &str, v: AnyV) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(v: &str) -> AnyV {
    AnyV::StringValue(v.into())
}

fn resource(service: &str) -> Option<Resource> {
    Some(Resource { attributes: vec![kv("service.name", s(service))], ..Default::default() })
}

fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope { name: "fuzz".into(), version: "1".into(), ..Default::default() })
}

const T0: u64 = 1_700_000_000_000_000_000;

fn span(i: u8, trace_len: usize) -> Span {
    Span {
        trace_id: vec![i + 1; trace_len],
        span_id: vec![i + 2; 8],
        parent_span_id: if i.is_multiple_of(2) { Vec::new() } else { vec![9; 8] },
        name: format!("chat {i}"),
        kind: 2,
        start_time_unix_nano: T0 + u64::from(i) * 1000,
        end_time_unix_nano: T0 + u64::from(i) * 1000 + 500_000_000,
        attributes: vec![
            kv("gen_ai.request.model", s("llama")),
            kv("gen_ai.usage.input_tokens", AnyV::IntValue(42)),
            kv("ratio", AnyV::DoubleValue(0.5)),
            kv("stream", AnyV::BoolValue(true)),
            kv("raw", AnyV::BytesValue(vec![0, 1, 2])),
            kv("list", AnyV::ArrayValue(ArrayValue { values: vec![AnyValue { value: Some(AnyV::IntValue(1)) }] })),
            kv("map", AnyV::KvlistValue(KeyValueList { values: vec![kv("k", s("v"))] })),
        ],
        events: vec![Event { time_unix_nano: T0 + 5, name: "first_token".into(), ..Default::default() }],
        links: vec![Link { trace_id: vec![7; 16], span_id: vec![8; 8], ..Default::default() }],
        status: Some(Status { code: 2, message: "timeout".into() }),
        ..Default::default()
    }
}

/// One span.
pub fn traces_small() -> ExportTraceServiceRequest {
    let mut sp = span(0, 16);
    sp.attributes.truncate(1);
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource("fuzz"),
            scope_spans: vec![ScopeSpans { scope: scope(), spans: vec![sp], ..Default::default() }],
            ..Default::default()
        }],
    }
}

/// Two resources, three spans with every attribute type, events, links and status.
pub fn traces_rich() -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![
            ResourceSpans {
                resource: resource("vllm"),
                scope_spans: vec![ScopeSpans {
                    scope: scope(),
                    spans: vec![span(0, 16), span(1, 16)],
                    schema_url: "s".into(),
                }],
                ..Default::default()
            },
            ResourceSpans {
                resource: resource("tgi"),
                scope_spans: vec![ScopeSpans { scope: scope(), spans: vec![span(2, 16)], ..Default::default() }],
                ..Default::default()
            },
        ],
    }
}

/// A span whose trace id has 15 bytes (the partial-rejection path).
pub fn traces_bad_id() -> ExportTraceServiceRequest {
    let mut r = traces_rich();
    r.resource_spans[0].scope_spans[0].spans[1] = span(1, 15);
    r
}

fn exemplar() -> Exemplar {
    Exemplar {
        filtered_attributes: vec![kv("x", s("y"))],
        time_unix_nano: T0,
        span_id: vec![1; 8],
        trace_id: vec![2; 16],
        value: Some(opentelemetry_proto::tonic::metrics::v1::exemplar::Value::AsDouble(1.5)),
    }
}

fn metric(name: &str, data: Data) -> Metric {
    Metric { name: name.into(), unit: "1".into(), description: "d".into(), data: Some(data), ..Default::default() }
}

fn number(v: NumV) -> NumberDataPoint {
    NumberDataPoint {
        attributes: vec![kv("model", s("m"))],
        start_time_unix_nano: T0 - 1,
        time_unix_nano: T0,
        value: Some(v),
        exemplars: vec![exemplar()],
        ..Default::default()
    }
}

/// One gauge point.
pub fn metrics_small() -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("fuzz"),
            scope_metrics: vec![ScopeMetrics {
                scope: scope(),
                metrics: vec![metric("g", Data::Gauge(Gauge { data_points: vec![number(NumV::AsDouble(0.25))] }))],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Every metric type.
pub fn metrics_rich() -> ExportMetricsServiceRequest {
    let hist = HistogramDataPoint {
        attributes: vec![kv("le_model", s("m"))],
        time_unix_nano: T0,
        count: 3,
        sum: Some(1.5),
        bucket_counts: vec![1, 2],
        explicit_bounds: vec![0.5],
        exemplars: vec![exemplar()],
        min: Some(0.1),
        max: Some(1.0),
        ..Default::default()
    };
    let exp = ExponentialHistogramDataPoint {
        time_unix_nano: T0,
        count: 4,
        sum: Some(2.0),
        scale: -2,
        zero_count: 1,
        positive: Some(Buckets { offset: 1, bucket_counts: vec![1, 2] }),
        negative: Some(Buckets { offset: -1, bucket_counts: vec![1] }),
        ..Default::default()
    };
    let summary = SummaryDataPoint {
        time_unix_nano: T0,
        count: 2,
        sum: 3.0,
        quantile_values: vec![ValueAtQuantile { quantile: 0.5, value: 1.0 }],
        ..Default::default()
    };
    let mut r = metrics_small();
    r.resource_metrics[0].scope_metrics[0].metrics.extend([
        metric(
            "tokens",
            Data::Sum(Sum {
                data_points: vec![number(NumV::AsInt(42))],
                aggregation_temporality: 2,
                is_monotonic: true,
            }),
        ),
        metric("h", Data::Histogram(Histogram { data_points: vec![hist], aggregation_temporality: 2 })),
        metric(
            "e",
            Data::ExponentialHistogram(ExponentialHistogram { data_points: vec![exp], aggregation_temporality: 1 }),
        ),
        metric("s", Data::Summary(Summary { data_points: vec![summary] })),
    ]);
    r
}

fn log(body: AnyV) -> LogRecord {
    LogRecord {
        time_unix_nano: T0,
        observed_time_unix_nano: T0 + 1,
        severity_number: 13,
        severity_text: "WARN".into(),
        body: Some(AnyValue { value: Some(body) }),
        attributes: vec![kv("n", s("v"))],
        trace_id: vec![3; 16],
        span_id: vec![4; 8],
        event_name: "e".into(),
        ..Default::default()
    }
}

fn logs_of(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource("fuzz"),
            scope_logs: vec![ScopeLogs { scope: scope(), log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    }
}

/// Two log records.
pub fn logs_rich() -> ExportLogsServiceRequest {
    logs_of(vec![
        log(s("kv cache at 95%")),
        log(AnyV::KvlistValue(KeyValueList { values: vec![kv("a", AnyV::ArrayValue(ArrayValue::default()))] })),
    ])
}

/// One record of the `alerts` connector, firing.
pub fn alert_logs() -> ExportLogsServiceRequest {
    let mut r = log(s("p99 latency up"));
    r.event_name = inferwatch_exporters::alertmanager::EVENT_NAME.into();
    r.attributes = vec![kv("alert.state", s("firing")), kv("detector", s("latency")), kv("model", s("m"))];
    logs_of(vec![r])
}

fn http(status: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n").into_bytes();
    for h in headers {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

fn arrow_files(p: &Payload) -> Vec<(String, Vec<u8>)> {
    let Ok(batch) = payload_to_batch(p) else { return Vec::new() };
    let mut out = Vec::new();
    let mut stream = Vec::new();
    if let Ok(mut w) = arrow_ipc::writer::StreamWriter::try_new(&mut stream, batch.schema_ref()) {
        let _ = w.write(&batch);
        let _ = w.finish();
    }
    out.push(("stream.arrows".to_string(), stream));
    let mut file = Vec::new();
    if let Ok(mut w) = arrow_ipc::writer::FileWriter::try_new(&mut file, batch.schema_ref()) {
        let _ = w.write(&batch);
        let _ = w.finish();
    }
    out.push(("file.arrow".to_string(), file));
    let mut pq = Vec::new();
    if let Ok(mut w) = parquet::arrow::ArrowWriter::try_new(&mut pq, batch.schema(), None) {
        let _ = w.write(&batch);
        let _ = w.close();
    }
    out.push(("file.parquet".to_string(), pq));
    out
}

/// Every seed: (target, file name, bytes).
pub fn generate() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |t: &'static str, name: &str, b: Vec<u8>| out.push((t, name.to_string(), b));
    // Protobuf requests, valid and near-valid.
    let traces = [("small", traces_small()), ("rich", traces_rich()), ("bad_id", traces_bad_id())];
    let metrics = [("small", metrics_small()), ("rich", metrics_rich())];
    let logs = [("rich", logs_rich()), ("alert", alert_logs())];
    for (n, r) in &traces {
        add("otlp_proto_traces", &format!("{n}.pb"), r.encode_to_vec());
        add("otlp_http_receiver", &format!("traces_{n}.pb"), r.encode_to_vec());
        add("otlp_json_traces", &format!("{n}.json"), serde_json::to_vec(r).unwrap_or_default());
        add("replay_jsonl", &format!("traces_{n}.json"), serde_json::to_vec(r).unwrap_or_default());
    }
    for (t, mut full) in [
        ("otlp_proto_traces", traces_rich().encode_to_vec()),
        ("otlp_proto_metrics", metrics_rich().encode_to_vec()),
        ("otlp_proto_logs", logs_rich().encode_to_vec()),
    ] {
        add(t, "empty.pb", Vec::new());
        full.truncate(full.len() - 7);
        add(t, "truncated.pb", full);
    }
    for (n, r) in &metrics {
        add("otlp_proto_metrics", &format!("{n}.pb"), r.encode_to_vec());
        add("otlp_http_receiver", &format!("metrics_{n}.pb"), r.encode_to_vec());
        add("otlp_json_metrics", &format!("{n}.json"), serde_json::to_vec(r).unwrap_or_default());
        add("replay_jsonl", &format!("metrics_{n}.json"), serde_json::to_vec(r).unwrap_or_default());
    }
    for (n, r) in &logs {
        add("otlp_proto_logs", &format!("{n}.pb"), r.encode_to_vec());
        add("otlp_http_receiver", &format!("logs_{n}.pb"), r.encode_to_vec());
        add("otlp_json_logs", &format!("{n}.json"), serde_json::to_vec(r).unwrap_or_default());
        add("replay_jsonl", &format!("logs_{n}.json"), serde_json::to_vec(r).unwrap_or_default());
    }
    // OTLP/JSON in the forms the normalisation handles: enum names, snake_case, numbers as strings.
    add(
        "otlp_json_traces",
        "names.json",
        br#"{"resource_spans":[{"scopeSpans":[{"spans":[{"trace_id":"0102030405060708090a0b0c0d0e0f10","span_id":"0102030405060708","kind":"SPAN_KIND_CLIENT","droppedAttributesCount":"2","status":{"code":"STATUS_CODE_ERROR"},"startTimeUnixNano":"1","attributes":[{"key":"a","value":null}]}]}]}]}"#.to_vec(),
    );
    add(
        "otlp_json_metrics",
        "names.json",
        br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","isMonotonic":true,"dataPoints":[{"asInt":"42","timeUnixNano":"2"}]}},{"name":"bad","gauge":{"dataPoints":[{"asDouble":"x"}]}}]}]}]}"#.to_vec(),
    );
    add(
        "otlp_json_logs",
        "names.json",
        br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"severityNumber":"SEVERITY_NUMBER_WARN","body":{"intValue":"-5"},"observedTimeUnixNano":4}]}]}]}"#.to_vec(),
    );
    // Arrow IPC and Parquet recordings of spans and metrics.
    for (n, p) in [
        ("traces", Payload::Traces(traces_rich())),
        ("metrics", Payload::Metrics(metrics_rich())),
        ("small", Payload::Traces(traces_small())),
    ] {
        for (f, bytes) in arrow_files(&p) {
            let t = if f.ends_with(".parquet") { "replay_parquet" } else { "replay_arrow_ipc" };
            add(t, &format!("{n}_{f}"), bytes);
        }
    }
    // Prometheus expositions (the receivers' test fixtures, and small hand-made ones).
    let fixtures: [(&str, &[u8]); 3] = [
        ("vllm_v1.prom", include_bytes!("../../receivers/tests/fixtures/vllm_v1.prom")),
        ("tgi.prom", include_bytes!("../../receivers/tests/fixtures/tgi.prom")),
        ("openmetrics.om", include_bytes!("../../receivers/tests/fixtures/openmetrics.om")),
    ];
    for (n, b) in fixtures {
        add("prometheus_text", n, b.to_vec());
        add("openmetrics", n, b.to_vec());
    }
    let small = b"# HELP req_total Requests.\n# TYPE req_total counter\nreq_total{code=\"200\",path=\"/a\\\"b\"} 12 1700000000000\n\
# TYPE lat histogram\nlat_bucket{le=\"0.1\"} 1\nlat_bucket{le=\"+Inf\"} 3\nlat_sum 0.7\nlat_count 3\n\
# TYPE q summary\nq{quantile=\"0.5\"} 0.2\nq_sum 1\nq_count 4\nup NaN\n";
    add("prometheus_text", "small.prom", small.to_vec());
    let om = b"# TYPE req counter\n# UNIT req requests\nreq_total{a=\"b\"} 1.5 1700000000.5 # {trace_id=\"abc\"} 1.0 1700000000.1\n\
req_created 1699999999.0\n# TYPE s stateset\ns{s=\"a\"} 1\ns{s=\"b\"} 0\n# TYPE i info\ni_info{v=\"1\"} 1\n# EOF\n";
    add("openmetrics", "small.om", om.to_vec());
    add(
        "tgi_info",
        "info.json",
        br#"{"model_id":"bigscience/bloom-560m","model_dtype":"torch.float16","max_total_tokens":2048}"#.to_vec(),
    );
    add("tgi_info", "blank.json", br#"{"model_id":"  "}"#.to_vec());
    add("tgi_info", "nested.json", br#"[{"model_id":1},{"a":[[[[]]]]}]"#.to_vec());
    // Configuration: the shipped pipeline, the golden error cases and a dense one.
    add("config_yaml", "pipeline.yaml", include_bytes!("../../pipeline.yaml").to_vec());
    let golden: [(&str, &[u8]); 4] = [
        ("malformed_duration.yaml", include_bytes!("../../tests/e2e/golden/malformed_duration.yaml")),
        ("many_errors.yaml", include_bytes!("../../tests/e2e/golden/many_errors.yaml")),
        ("undefined_component.yaml", include_bytes!("../../tests/e2e/golden/undefined_component.yaml")),
        ("slo_typo.yaml", include_bytes!("../../tests/e2e/golden/slo_typo.yaml")),
    ];
    for (n, b) in golden {
        add("config_yaml", n, b.to_vec());
    }
    add(
        "config_yaml",
        "anchors.yaml",
        b"receivers:\n  otlp/in:\n    protocols:\n      grpc: {endpoint: \"${env:GRPC:-127.0.0.1:4317}\"}\n      http: ~\n\
processors:\n  batch/fast: {send_batch_size: 0x10, timeout: 1.5e2ms}\n  memory_limiter: &d {check_interval: 1s, limit_percentage: 80, spike_limit_percentage: 20}\n\
exporters:\n  debug: {verbosity: basic}\n  otlp/x:\n    <<: *d\n    endpoint: ${env:X}\n    headers: {a: !!str 1, note: |\n        literal $$ text\n      }\n\
service:\n  pipelines:\n    traces: {receivers: [otlp/in], processors: [memory_limiter, batch/fast], exporters: [debug]}\n"
            .to_vec(),
    );
    // Retry-After values.
    for (i, v) in [
        "120",
        "0",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        " 5 ",
        "503 7",
    ]
    .iter()
    .enumerate()
    {
        add("retry_after", &format!("{i}.txt"), v.as_bytes().to_vec());
    }
    // HTTP responses for the exporters.
    let partial = ExportTraceServiceResponse {
        partial_success: Some(ExportTracePartialSuccess { rejected_spans: 3, error_message: "too old".into() }),
    }
    .encode_to_vec();
    let logs_partial = opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse {
        partial_success: Some(ExportLogsPartialSuccess { rejected_log_records: -1, error_message: "x".into() }),
    }
    .encode_to_vec();
    let rpc_status = [0x08, 0x03, 0x12, 0x03, b'b', b'a', b'd'];
    let responses: Vec<(&str, Vec<u8>)> = vec![
        ("ok_partial_proto", http("200 OK", &["Content-Type: application/x-protobuf"], &partial)),
        ("ok_partial_json", http("200 OK", &["Content-Type: application/json"], br#"{"partialSuccess":{"rejectedSpans":"3","errorMessage":"too old"}}"#)),
        ("ok_empty", http("200 OK", &[], b"")),
        ("ok_logs_partial", http("200 OK", &["Content-Type: application/x-protobuf"], &logs_partial)),
        ("429_retry", http("429 Too Many Requests", &["Retry-After: 7"], b"slow down")),
        ("503_date", http("503 Service Unavailable", &["Retry-After: Wed, 21 Oct 2015 07:28:00 GMT"], b"")),
        ("400_status", http("400 Bad Request", &["Content-Type: application/x-protobuf"], &rpc_status)),
        ("400_json", http("400 Bad Request", &["Content-Type: application/json"], br#"{"code":3,"message":"bad"}"#)),
        ("307", http("307 Temporary Redirect", &["Location: /v1/traces"], b"")),
        ("chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n4\r\n{\"pa\r\n0\r\n\r\n".to_vec()),
        ("short_body", b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\nabc".to_vec()),
    ];
    for t in ["otlphttp_response", "alertmanager_response", "remotewrite_response"] {
        for (n, b) in &responses {
            add(t, &format!("{n}.http"), b.clone());
        }
    }
    out
}
