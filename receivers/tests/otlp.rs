//! End-to-end tests of the `otlp` receiver over real sockets, with tonic and reqwest clients.

use async_trait::async_trait;
use flate2::Compression;
use flate2::write::GzEncoder;
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::otlp::config::OtlpConfig;
use inferwatch_receivers::otlp::{OtlpReceiver, OtlpReceiverFactory};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::json;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};
use tonic::Code;
use tonic::codec::CompressionEncoding;
use tonic_types::StatusExt;

/// Collects payloads, or answers with a preset error.
#[derive(Default)]
struct Collect {
    got: Mutex<Vec<Payload>>,
    fail: Mutex<Option<ConsumeError>>,
}

#[async_trait]
impl Consumer for Collect {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        self.got.lock().unwrap().push(data);
        Ok(())
    }
}

impl Collect {
    fn take(&self) -> Vec<Payload> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }
    /// The payloads received, in decoded form, and how many arrived undecoded (pass-through).
    fn take_decoded(&self) -> (Vec<Payload>, usize) {
        let got = self.take();
        let encoded = got.iter().filter(|p| matches!(p, Payload::Encoded(_))).count();
        (got.into_iter().map(|p| p.into_decoded().unwrap()).collect(), encoded)
    }
    fn refuse(&self, e: Option<ConsumeError>) {
        *self.fail.lock().unwrap() = e;
    }
}

struct Harness {
    rx: OtlpReceiver,
    telemetry: Arc<Telemetry>,
    sink: Arc<Collect>,
    grpc: SocketAddr,
    http: SocketAddr,
}

impl Harness {
    async fn start() -> Harness {
        Self::start_with(
            json!({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}),
            &Signal::ALL,
        )
        .await
    }

    async fn start_with(cfg: serde_json::Value, signals: &[Signal]) -> Harness {
        let telemetry = Arc::new(Telemetry::new());
        let ctx = CreateContext::new(ComponentId::parse("otlp").unwrap(), telemetry.clone());
        let mut rx = OtlpReceiver::new(ctx, OtlpConfig::from_value(&cfg).unwrap());
        let sink = Arc::new(Collect::default());
        let mut consumers = ReceiverConsumers::default();
        for s in signals {
            consumers.set(*s, sink.clone());
        }
        rx.start(consumers).await.unwrap();
        let a = rx.local_addrs();
        Harness {
            rx,
            telemetry,
            sink,
            grpc: a.grpc.unwrap_or_else(|| "127.0.0.1:1".parse().unwrap()),
            http: a.http.unwrap_or_else(|| "127.0.0.1:1".parse().unwrap()),
        }
    }

    /// Value of a receiver counter, e.g. `("accepted", "spans", "grpc")`.
    fn counter(&self, what: &str, noun: &str, transport: &str) -> u64 {
        let text = self.telemetry.render();
        let prefix = format!("otelcol_receiver_{what}_{noun}_total{{receiver=\"otlp\",transport=\"{transport}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().parse().unwrap()).unwrap_or(0)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    async fn trace_client(&self) -> TraceServiceClient<tonic::transport::Channel> {
        TraceServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
            .send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip)
    }
}

fn span(name: &str, trace_id: Vec<u8>) -> Span {
    Span {
        trace_id,
        span_id: vec![0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x74],
        name: name.into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_500_000_000,
        attributes: vec![KeyValue {
            key: "llm.model".into(),
            value: Some(AnyValue { value: Some(AnyV::StringValue("m1".into())) }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn trace_id() -> Vec<u8> {
    (1..=16).collect()
}

fn traces(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    }
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// reqwest is built without a TLS provider choice; plain-HTTP clients still need one installed.
fn tls_provider() {
    // Err means another test installed it first.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn http() -> reqwest::Client {
    tls_provider();
    reqwest::Client::new()
}

fn h2() -> reqwest::Client {
    tls_provider();
    reqwest::Client::builder().http2_prior_knowledge().build().unwrap()
}

/// Sends one raw gRPC frame; returns (grpc-status, grpc-message) from the trailers-only answer.
async fn raw_grpc(addr: SocketAddr, path: &str, flag: u8, body: &[u8], gzip: bool) -> (i32, String) {
    let mut frame = vec![flag];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    let mut req = h2()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(frame);
    if gzip {
        req = req.header("grpc-encoding", "gzip");
    }
    let resp = req.send().await.unwrap();
    let h = resp.headers();
    let code = h.get("grpc-status").expect("trailers-only error answer").to_str().unwrap().parse().unwrap();
    let msg = h.get("grpc-message").map(|m| percent_decode(m.as_bytes())).unwrap_or_default();
    (code, msg)
}

/// Decodes the %XX escapes of a `grpc-message` header.
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

const TRACE_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

#[tokio::test(flavor = "multi_thread")]
async fn grpc_gzip_traces_arrive_exactly_and_are_counted() {
    let mut h = Harness::start().await;
    let req = traces(vec![span("a", trace_id()), span("b", trace_id())]);
    let resp = h.trace_client().await.export(req.clone()).await.unwrap().into_inner();
    assert_eq!(resp, ExportTraceServiceResponse { partial_success: None });
    // Valid protobuf travels on undecoded, and is exactly what was sent.
    assert_eq!(h.sink.take_decoded(), (vec![Payload::Traces(req)], 1));
    assert_eq!(h.counter("accepted", "spans", "grpc"), 2);
    assert_eq!(h.counter("refused", "spans", "grpc"), 0);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_metrics_and_logs() {
    let mut h = Harness::start().await;
    let m = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "kv_cache_usage".into(),
                    data: Some(Data::Gauge(Gauge {
                        data_points: vec![
                            NumberDataPoint {
                                time_unix_nano: 5,
                                value: Some(NumV::AsDouble(0.5)),
                                ..Default::default()
                            },
                            NumberDataPoint { time_unix_nano: 6, value: Some(NumV::AsInt(7)), ..Default::default() },
                        ],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut mc = MetricsServiceClient::connect(format!("http://{}", h.grpc)).await.unwrap();
    let r = mc.export(m.clone()).await.unwrap().into_inner();
    assert_eq!(r.partial_success, None);
    let l = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    body: Some(AnyValue { value: Some(AnyV::StringValue("hi".into())) }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut lc = LogsServiceClient::connect(format!("http://{}", h.grpc))
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip);
    lc.export(l.clone()).await.unwrap();
    assert_eq!(h.sink.take_decoded(), (vec![Payload::Metrics(m), Payload::Logs(l)], 2));
    assert_eq!(h.counter("accepted", "metric_points", "grpc"), 2);
    assert_eq!(h.counter("accepted", "log_records", "grpc"), 1);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn signals_without_consumer_are_not_served() {
    let mut h = Harness::start_with(
        json!({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}),
        &[Signal::Traces],
    )
    .await;
    let mut mc = MetricsServiceClient::connect(format!("http://{}", h.grpc)).await.unwrap();
    let e = mc.export(ExportMetricsServiceRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let r =
        http().post(h.url("/v1/metrics")).header("content-type", "application/json").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 404);
    // An unknown method of a served service is UNIMPLEMENTED too.
    let (code, _) = raw_grpc(h.grpc, "/opentelemetry.proto.collector.trace.v1.TraceService/Nope", 0, &[], false).await;
    assert_eq!(code, Code::Unimplemented as i32);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_malformed_input_is_invalid_argument_and_server_keeps_serving() {
    let mut h = Harness::start().await;
    // Field 1 (resource_spans) with the varint wire type: not decodable.
    let (code, msg) = raw_grpc(h.grpc, TRACE_EXPORT, 0, &[0x08, 0x05], false).await;
    assert_eq!(code, Code::InvalidArgument as i32, "{msg}");
    assert!(msg.contains("invalid protobuf"), "{msg}");
    // A valid request cut short.
    let full = traces(vec![span("a", trace_id())]).encode_to_vec();
    let (code, msg) = raw_grpc(h.grpc, TRACE_EXPORT, 0, &full[..full.len() - 5], false).await;
    assert_eq!(code, Code::InvalidArgument as i32, "{msg}");
    // Compressed flag with a body that is not gzip.
    let (code, msg) = raw_grpc(h.grpc, TRACE_EXPORT, 1, b"not gzip at all", true).await;
    assert_eq!(code, Code::InvalidArgument as i32, "{msg}");
    assert!(msg.contains("decompress"), "{msg}");
    // Spans with invalid ids: partial success.
    let req = traces(vec![span("ok", trace_id()), span("bad", vec![1, 2, 3])]);
    let r = h.trace_client().await.export(req).await.unwrap().into_inner();
    let ps = r.partial_success.unwrap();
    assert_eq!(ps.rejected_spans, 1);
    assert!(ps.error_message.contains("trace_id must be 16 bytes, got 3"), "{}", ps.error_message);
    let got = h.sink.take();
    assert_eq!(got.len(), 1);
    let Payload::Traces(t) = &got[0] else { panic!("decoded for item-by-item rejection: {got:?}") };
    assert_eq!(t.resource_spans[0].scope_spans[0].spans[0].name, "ok");
    assert_eq!(h.counter("accepted", "spans", "grpc"), 1);
    assert_eq!(h.counter("refused", "spans", "grpc"), 1);
    // Still serving.
    h.trace_client().await.export(traces(vec![span("c", trace_id())])).await.unwrap();
    assert_eq!(h.counter("accepted", "spans", "grpc"), 2);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_optional_ids_are_cleared_not_forwarded() {
    let mut h = Harness::start().await;
    // A span link with a short trace id points nowhere: dropped and counted on the span.
    let mut s = span("with-links", trace_id());
    s.links = vec![
        opentelemetry_proto::tonic::trace::v1::span::Link {
            trace_id: vec![9; 5],
            span_id: vec![1; 8],
            ..Default::default()
        },
        opentelemetry_proto::tonic::trace::v1::span::Link {
            trace_id: trace_id(),
            span_id: vec![1; 8],
            ..Default::default()
        },
    ];
    let r = h.trace_client().await.export(traces(vec![s])).await.unwrap().into_inner();
    assert_eq!(r.partial_success, None);
    // A log record with a short trace id is kept, without trace context.
    let l = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord { trace_id: vec![1, 2, 3], span_id: vec![1; 8], ..Default::default() }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = http()
        .post(h.url("/v1/logs"))
        .header("content-type", "application/x-protobuf")
        .body(l.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (got, encoded) = h.sink.take_decoded();
    assert_eq!(encoded, 0, "requests with invalid ids are decoded and cleaned");
    let Payload::Traces(t) = &got[0] else { panic!("{got:?}") };
    let span = &t.resource_spans[0].scope_spans[0].spans[0];
    assert_eq!((span.links.len(), span.dropped_links_count), (1, 1));
    let Payload::Logs(lr) = &got[1] else { panic!("{got:?}") };
    let rec = &lr.resource_logs[0].scope_logs[0].log_records[0];
    assert!(rec.trace_id.is_empty() && rec.span_id.is_empty(), "{rec:?}");
    assert_eq!(h.counter("accepted", "log_records", "http"), 1);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_refusals_carry_retry_info() {
    let mut h = Harness::start().await;
    h.sink.refuse(Some(ConsumeError::refused(
        RefuseReason::MemoryLimit,
        Some(Duration::from_secs(3)),
        "over soft limit",
    )));
    let req = traces(vec![span("a", trace_id()), span("b", trace_id())]);
    let e = h.trace_client().await.export(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("over soft limit"), "{}", e.message());
    assert_eq!(e.get_details_retry_info().unwrap().retry_delay, Some(Duration::from_secs(3)));
    h.sink.refuse(Some(ConsumeError::refused(RefuseReason::QueueFull, None, "queue full")));
    let e = h.trace_client().await.export(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(e.get_details_retry_info().unwrap().retry_delay, Some(Duration::from_secs(1)));
    h.sink.refuse(Some(ConsumeError::Permanent("never".into())));
    let e = h.trace_client().await.export(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(h.counter("refused", "spans", "grpc"), 6);
    assert_eq!(h.counter("accepted", "spans", "grpc"), 0);
    h.sink.refuse(None);
    h.trace_client().await.export(req).await.unwrap();
    assert_eq!(h.counter("accepted", "spans", "grpc"), 2);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_protobuf_plain_and_gzip() {
    let mut h = Harness::start().await;
    let req = traces(vec![span("a", trace_id())]);
    let body = req.encode_to_vec();
    for (gz, client) in [(false, http()), (true, http()), (false, h2())] {
        let mut rb = client.post(h.url("/v1/traces")).header("content-type", "application/x-protobuf");
        rb = if gz { rb.header("content-encoding", "gzip").body(gzip(&body)) } else { rb.body(body.clone()) };
        let r = rb.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/x-protobuf");
        let resp = ExportTraceServiceResponse::decode(r.bytes().await.unwrap()).unwrap();
        assert_eq!(resp.partial_success, None);
    }
    let want = vec![Payload::Traces(req.clone()), Payload::Traces(req.clone()), Payload::Traces(req)];
    assert_eq!(h.sink.take_decoded(), (want, 3));
    assert_eq!(h.counter("accepted", "spans", "http"), 3);
    h.rx.shutdown().await;
}

/// Hand-written OTLP/JSON as the spec shows it: hex ids, int64 as strings, enum names, unknown fields.
const TRACES_JSON: &str = r#"{
  "resourceSpans": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
    "scopeSpans": [{
      "scope": {"name": "vllm.tracing", "version": "0.6"},
      "spans": [{
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": "EEE19B7EC3C1B174",
        "parentSpanId": "EEE19B7EC3C1B173",
        "name": "llm_request",
        "kind": "SPAN_KIND_SERVER",
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": 1544712661000000000,
        "attributes": [
          {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "9007199254740993"}},
          {"key": "ttft", "value": {"doubleValue": 0.125}}
        ],
        "status": {"code": "STATUS_CODE_ERROR", "message": "timeout"},
        "aFieldFromTheFuture": {"nested": [1, 2, 3]}
      }]
    }]
  }]
}"#;

#[tokio::test(flavor = "multi_thread")]
async fn http_json_values_arrive_exactly() {
    let mut h = Harness::start().await;
    for gz in [false, true] {
        let mut rb = http().post(h.url("/v1/traces")).header("content-type", "application/json");
        rb = if gz {
            rb.header("content-encoding", "gzip").body(gzip(TRACES_JSON.as_bytes()))
        } else {
            rb.body(TRACES_JSON)
        };
        let r = rb.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/json");
        assert_eq!(r.text().await.unwrap(), "{}");
    }
    let got = h.sink.take();
    assert_eq!(got.len(), 2);
    let Payload::Traces(t) = &got[0] else { panic!("{got:?}") };
    let rs = &t.resource_spans[0];
    assert_eq!(rs.resource.as_ref().unwrap().attributes[0].key, "service.name");
    let ss = &rs.scope_spans[0];
    assert_eq!(ss.scope.as_ref().unwrap().version, "0.6");
    let s = &ss.spans[0];
    assert_eq!(
        s.trace_id,
        vec![0x5b, 0x8e, 0xff, 0xf7, 0x98, 0x03, 0x81, 0x03, 0xd2, 0x69, 0xb6, 0x33, 0x81, 0x3f, 0xc6, 0x0c]
    );
    assert_eq!(s.span_id, vec![0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x74]);
    assert_eq!(s.parent_span_id, vec![0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x73]);
    assert_eq!(s.kind, SpanKind::Server as i32);
    assert_eq!(s.start_time_unix_nano, 1_544_712_660_000_000_000);
    assert_eq!(s.end_time_unix_nano, 1_544_712_661_000_000_000);
    assert_eq!(s.attributes[0].value.as_ref().unwrap().value, Some(AnyV::IntValue(9_007_199_254_740_993)));
    assert_eq!(s.attributes[1].value.as_ref().unwrap().value, Some(AnyV::DoubleValue(0.125)));
    let st = s.status.as_ref().unwrap();
    assert_eq!((st.code, st.message.as_str()), (StatusCode::Error as i32, "timeout"));
    assert_eq!(got[0], got[1]);
    assert_eq!(h.counter("accepted", "spans", "http"), 2);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_json_metrics_and_logs() {
    let mut h = Harness::start().await;
    let m = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"tokens","unit":"1","sum":{
        "aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","isMonotonic":true,
        "dataPoints":[{"asInt":"42","startTimeUnixNano":"1","timeUnixNano":"2","attributes":[{"key":"model","value":{"stringValue":"m"}}]}]}}]}]}]}"#;
    let r = http().post(h.url("/v1/metrics")).header("content-type", "application/json").body(m).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let l = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"3","severityNumber":"SEVERITY_NUMBER_WARN",
        "severityText":"WARN","body":{"stringValue":"kv cache at 95%"},"traceId":"5b8efff798038103d269b633813fc60c"}]}]}]}"#;
    let r = http().post(h.url("/v1/logs")).header("content-type", "application/json").body(l).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let got = h.sink.take();
    let Payload::Metrics(mr) = &got[0] else { panic!("{got:?}") };
    let Some(Data::Sum(sum)) = &mr.resource_metrics[0].scope_metrics[0].metrics[0].data else { panic!("{mr:?}") };
    assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    assert!(sum.is_monotonic);
    assert_eq!(sum.data_points[0].value, Some(NumV::AsInt(42)));
    assert_eq!((sum.data_points[0].start_time_unix_nano, sum.data_points[0].time_unix_nano), (1, 2));
    let Payload::Logs(lr) = &got[1] else { panic!("{got:?}") };
    let rec = &lr.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(rec.severity_number, SeverityNumber::Warn as i32);
    assert_eq!(rec.time_unix_nano, 3);
    assert_eq!(rec.trace_id.len(), 16);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_malformed_bodies_are_400_with_a_reason() {
    let mut h = Harness::start().await;
    let url = h.url("/v1/traces");
    // Bad protobuf: google.rpc.Status in protobuf.
    let r =
        http().post(&url).header("content-type", "application/x-protobuf").body(vec![0x08, 0x05]).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");
    let st = tonic_types::Status::decode(r.bytes().await.unwrap()).unwrap();
    assert_eq!(st.code, Code::InvalidArgument as i32);
    assert!(st.message.contains("invalid protobuf"), "{}", st.message);
    // Bad JSON: google.rpc.Status in JSON.
    let r = http()
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"resourceSpans": [zz]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["code"], 3);
    assert!(v["message"].as_str().unwrap().contains("invalid JSON"), "{v}");
    // Well-formed JSON, bad id.
    let r = http()
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz"}]}]}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(v["message"].as_str().unwrap().contains("spans[0].traceId"), "{v}");
    // Bad gzip.
    let r = http()
        .post(&url)
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", "gzip")
        .body(b"definitely not gzip".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let st = tonic_types::Status::decode(r.bytes().await.unwrap()).unwrap();
    assert!(st.message.contains("failed to read the request body"), "{}", st.message);
    // Unsupported content type.
    let r = http().post(&url).header("content-type", "text/plain").body("x").send().await.unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.text().await.unwrap().contains("application/x-protobuf"));
    // Wrong method and unknown path.
    assert_eq!(http().get(&url).send().await.unwrap().status(), 405);
    assert_eq!(http().post(h.url("/v1/nope")).send().await.unwrap().status(), 404);
    assert!(h.sink.take().is_empty());
    // Still serving.
    let r = http().post(&url).header("content-type", "application/json").body(TRACES_JSON).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(h.sink.take().len(), 1);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_partial_success_for_invalid_ids() {
    let mut h = Harness::start().await;
    let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"good"},
        {"traceId":"5b8efff798","spanId":"eee19b7ec3c1b174","name":"short"}]}]}]}"#;
    let r =
        http().post(h.url("/v1/traces")).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["partialSuccess"]["rejectedSpans"], 1, "{v}");
    assert!(v["partialSuccess"]["errorMessage"].as_str().unwrap().contains("\"short\""), "{v}");
    let got = h.sink.take();
    let Payload::Traces(t) = &got[0] else { panic!() };
    assert_eq!(t.resource_spans[0].scope_spans[0].spans.len(), 1);
    assert_eq!(t.resource_spans[0].scope_spans[0].spans[0].name, "good");
    assert_eq!(h.counter("accepted", "spans", "http"), 1);
    assert_eq!(h.counter("refused", "spans", "http"), 1);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_refusals_are_429_or_503_with_retry_after() {
    let mut h = Harness::start().await;
    let body = traces(vec![span("a", trace_id())]).encode_to_vec();
    let post = || http().post(h.url("/v1/traces")).header("content-type", "application/x-protobuf").body(body.clone());
    h.sink.refuse(Some(ConsumeError::refused(
        RefuseReason::MemoryLimit,
        Some(Duration::from_secs(3)),
        "over soft limit",
    )));
    let r = post().send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "3");
    let st = tonic_types::Status::decode(r.bytes().await.unwrap()).unwrap();
    assert_eq!(st.code, Code::ResourceExhausted as i32);
    h.sink.refuse(Some(ConsumeError::refused(RefuseReason::ShuttingDown, None, "stopping")));
    let r = post().send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    h.sink.refuse(Some(ConsumeError::Permanent("never".into())));
    assert_eq!(post().send().await.unwrap().status(), 400);
    assert_eq!(h.counter("refused", "spans", "http"), 3);
    h.sink.refuse(None);
    assert_eq!(post().send().await.unwrap().status(), 200);
    assert_eq!(h.counter("accepted", "spans", "http"), 1);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_body_limit_applies_after_decompression() {
    let mut h = Harness::start_with(
        json!({"protocols": {"http": {"endpoint": "127.0.0.1:0", "max_request_body_size": 1000}}}),
        &Signal::ALL,
    )
    .await;
    assert!(h.rx.local_addrs().grpc.is_none());
    let big = vec![b' '; 5000];
    let r = http()
        .post(h.url("/v1/traces"))
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let r = http()
        .post(h.url("/v1/traces"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzip(&big))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    h.rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_cors_and_custom_paths() {
    let mut h = Harness::start_with(
        json!({"protocols": {"http": {"endpoint": "127.0.0.1:0", "traces_url_path": "custom/traces",
            "cors": {"allowed_origins": ["https://*.example.com"], "max_age": 60},
            "response_headers": {"x-served-by": "inferwatch"}}}}),
        &Signal::ALL,
    )
    .await;
    let r = http()
        .request(reqwest::Method::OPTIONS, h.url("/custom/traces"))
        .header("origin", "https://ui.example.com")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://ui.example.com");
    assert_eq!(r.headers()["access-control-max-age"], "60");
    let r = http()
        .post(h.url("/custom/traces"))
        .header("origin", "https://evil.example.org")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert_eq!(r.headers()["x-served-by"], "inferwatch");
    assert_eq!(http().post(h.url("/v1/traces")).send().await.unwrap().status(), 404);
    h.rx.shutdown().await;
}

/// Blocks in `consume` until released, telling the test when a request is in flight.
struct Gate {
    entered: Mutex<Option<oneshot::Sender<()>>>,
    release: Notify,
}

#[async_trait]
impl Consumer for Gate {
    async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            let _ = tx.send(());
        }
        self.release.notified().await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_waits_for_in_flight_requests_then_refuses_connections() {
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("otlp/gate").unwrap(), telemetry);
    let cfg = json!({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}});
    let mut rx = OtlpReceiver::new(ctx, OtlpConfig::from_value(&cfg).unwrap());
    let (tx, entered) = oneshot::channel();
    let gate = Arc::new(Gate { entered: Mutex::new(Some(tx)), release: Notify::new() });
    let mut consumers = ReceiverConsumers::default();
    consumers.set(Signal::Traces, gate.clone());
    rx.start(consumers).await.unwrap();
    let addrs = rx.local_addrs();
    let http_addr = addrs.http.unwrap();
    let body = traces(vec![span("a", trace_id())]).encode_to_vec();
    let in_flight = tokio::spawn(async move {
        http()
            .post(format!("http://{http_addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map(|r| r.status())
    });
    // A guard against hanging forever if the request never reaches the consumer.
    tokio::time::timeout(Duration::from_secs(30), entered).await.expect("request reached the consumer").unwrap();
    {
        let shutdown = rx.shutdown();
        tokio::pin!(shutdown);
        // The first poll cancels the servers; the in-flight request keeps shutdown pending.
        assert!(futures::poll!(&mut shutdown).is_pending());
        gate.release.notify_one();
        assert_eq!(in_flight.await.unwrap().unwrap(), 200);
        shutdown.await;
    }
    assert_eq!(rx.local_addrs(), Default::default());
    assert!(tokio::net::TcpStream::connect(http_addr).await.is_err());
    assert!(tokio::net::TcpStream::connect(addrs.grpc.unwrap()).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_errors_name_the_endpoint() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = taken.local_addr().unwrap().port();
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("otlp").unwrap(), telemetry);
    let cfg = json!({"protocols": {"grpc": {"endpoint": format!("127.0.0.1:{port}")}}});
    let mut rx = OtlpReceiverFactory.create(ctx, &cfg).unwrap();
    let err = rx.start(ReceiverConsumers::default()).await.unwrap_err();
    assert!(matches!(err, ComponentError::Start(_)));
    assert!(err.to_string().contains(&format!("address 127.0.0.1:{port} already in use")), "{err}");
    rx.shutdown().await;
}

#[test]
fn factory_validates_and_registers() {
    let f = OtlpReceiverFactory;
    assert_eq!(f.type_name(), "otlp");
    assert_eq!(f.signals(), &Signal::ALL);
    assert!(f.validate(&json!({"protocols": {"grpc": null}})).is_ok());
    let e = f.validate(&json!({})).unwrap_err();
    assert!(e.message.contains("at least one protocol"), "{}", e.message);
    assert!(f.validate(&json!({"protocols": {"http": {"bogus": 1}}})).is_err());
    let mut reg = inferwatch_core::registry::Registry::new();
    inferwatch_receivers::register(&mut reg);
    assert!(reg.receiver("otlp").is_some());
}
