//! Fuzz-style end-to-end test of the OTLP/HTTP receiver: hundreds of random and mutated
//! protobuf and JSON bodies, plain or gzip (valid, corrupt, truncated, a bomb), over HTTP/1.1
//! and h2c. Every answer must be 2xx or 4xx, never a 5xx or a dropped connection, whatever
//! was forwarded must decode, and a valid request afterwards must still succeed.

use async_trait::async_trait;
use flate2::Compression;
use flate2::write::GzEncoder;
use futures::future::join_all;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::otlp::OtlpReceiver;
use inferwatch_receivers::otlp::config::OtlpConfig;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Number of random requests sent.
const CASES: usize = 1500;
/// Requests in flight at once.
const CONCURRENCY: usize = 16;
/// The receiver's body limit (after decompression), small enough for a gzip bomb to hit it.
const LIMIT: usize = 256 * 1024;

/// Accepts everything; records payloads that arrived encoded but do not decode.
#[derive(Default)]
struct Check {
    accepted: Mutex<usize>,
    undecodable: Mutex<Vec<String>>,
}

#[async_trait]
impl Consumer for Check {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        if let Err(e) = data.into_decoded() {
            self.undecodable.lock().unwrap().push(e.to_string());
        }
        *self.accepted.lock().unwrap() += 1;
        Ok(())
    }
}

fn kv(key: &str, v: AnyV) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn attrs() -> Vec<KeyValue> {
    vec![
        kv("model", AnyV::StringValue("m1".into())),
        kv("n", AnyV::IntValue(-3)),
        kv("arr", AnyV::ArrayValue(ArrayValue { values: vec![AnyValue { value: Some(AnyV::DoubleValue(0.5)) }] })),
    ]
}

fn traces() -> Vec<u8> {
    let span = |name: &str| Span {
        trace_id: (1..=16).collect(),
        span_id: vec![7; 8],
        parent_span_id: vec![6; 8],
        name: name.into(),
        kind: 2,
        start_time_unix_nano: 1,
        end_time_unix_nano: 2,
        attributes: attrs(),
        events: vec![Event { name: "tok".into(), time_unix_nano: 3, ..Default::default() }],
        links: vec![Link { trace_id: vec![9; 16], span_id: vec![8; 8], ..Default::default() }],
        status: Some(Status { code: 2, message: "boom".into() }),
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans { spans: vec![span("a"), span("b")], ..Default::default() }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn metrics() -> Vec<u8> {
    let point = |v| NumberDataPoint {
        attributes: attrs(),
        time_unix_nano: 5,
        value: Some(v),
        exemplars: vec![Exemplar { trace_id: vec![1; 16], span_id: vec![2; 8], ..Default::default() }],
        ..Default::default()
    };
    let metric = |name: &str, data| Metric { name: name.into(), data: Some(data), ..Default::default() };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    metric("g", Data::Gauge(Gauge { data_points: vec![point(NumV::AsDouble(1.5))] })),
                    metric(
                        "s",
                        Data::Sum(Sum {
                            data_points: vec![point(NumV::AsInt(4))],
                            aggregation_temporality: 2,
                            is_monotonic: true,
                        }),
                    ),
                    metric(
                        "h",
                        Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                count: 3,
                                bucket_counts: vec![1, 2],
                                explicit_bounds: vec![0.5],
                                ..Default::default()
                            }],
                            aggregation_temporality: 1,
                        }),
                    ),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn logs() -> Vec<u8> {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: 3,
                    severity_number: 13,
                    body: Some(AnyValue { value: Some(AnyV::StringValue("kv cache at 95%".into())) }),
                    attributes: attrs(),
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

const TRACES_JSON: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"vllm"}}]},
  "scopeSpans":[{"scope":{"name":"s","version":"1"},"spans":[{"traceId":"5b8efff798038103d269b633813fc60c",
  "spanId":"eee19b7ec3c1b174","name":"op","kind":"SPAN_KIND_SERVER","startTimeUnixNano":"1","endTimeUnixNano":2,
  "attributes":[{"key":"n","value":{"intValue":"42"}},{"key":"a","value":{"arrayValue":{"values":[{"boolValue":true}]}}}],
  "status":{"code":"STATUS_CODE_ERROR","message":"timeout"}}]}]}]}"#;

const METRICS_JSON: &str = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"tokens","unit":"1","sum":{
  "aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","isMonotonic":true,"dataPoints":[{"asInt":"42",
  "startTimeUnixNano":"1","timeUnixNano":"2","exemplars":[{"asDouble":1,"traceId":"5b8efff798038103d269b633813fc60c"}],
  "attributes":[{"key":"model","value":{"stringValue":"m"}}]}]}},
  {"name":"g","gauge":{"dataPoints":[{"asDouble":0.5}]}}]}]}]}"#;

const LOGS_JSON: &str = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"3",
  "severityNumber":"SEVERITY_NUMBER_WARN","severityText":"WARN","body":{"stringValue":"kv cache at 95%"},
  "traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174"}]}]}]}"#;

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// Random byte edits: flips, random bytes, insertions, deletions, truncation, splices.
fn mutate_bytes(b: &mut Vec<u8>, rng: &mut StdRng) {
    for _ in 0..rng.random_range(1..4) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let i = rng.random_range(0..b.len());
        match rng.random_range(0..7) {
            0 => b[i] ^= 1 << rng.random_range(0..8),
            1 => b[i] = rng.random(),
            2 => b.insert(i, rng.random()),
            3 => {
                b.remove(i);
            }
            4 => b.truncate(i),
            5 => {
                // Duplicate a slice (repeated fields, repeated JSON tokens).
                let j = rng.random_range(i..=b.len().min(i + 32));
                let dup = b[i..j].to_vec();
                b.splice(i..i, dup);
            }
            _ => {
                // Length-like bytes: large varints and odd punctuation.
                let junk: &[u8] =
                    [&[0xff, 0xff, 0xff, 0xff, 0x0f][..], b"\"", b"{[", b"]}", b"\xc3", b"\\u"][rng.random_range(0..6)];
                b.splice(i..i, junk.iter().copied());
            }
        }
    }
}

/// One random request: (path, content type, content encoding, body).
fn random_request(rng: &mut StdRng) -> (&'static str, &'static str, Option<&'static str>, Vec<u8>) {
    const PATHS: [&str; 3] = ["/v1/traces", "/v1/metrics", "/v1/logs"];
    let signal = rng.random_range(0..3);
    let json = rng.random_bool(0.5);
    let mut body = match (signal, json) {
        (0, false) => traces(),
        (1, false) => metrics(),
        (2, false) => logs(),
        (0, true) => TRACES_JSON.as_bytes().to_vec(),
        (1, true) => METRICS_JSON.as_bytes().to_vec(),
        _ => LOGS_JSON.as_bytes().to_vec(),
    };
    match rng.random_range(0..10) {
        0 => body = (0..rng.random_range(0..512)).map(|_| rng.random()).collect(),
        1 | 2 => {} // unchanged
        _ => mutate_bytes(&mut body, rng),
    }
    // Mostly the matching path and content type; sometimes the wrong ones.
    let path = if rng.random_bool(0.85) { PATHS[signal] } else { PATHS[rng.random_range(0..3)] };
    let ct = match (json, rng.random_range(0..12)) {
        (_, 0) => "application/json; charset=utf-8",
        (_, 1) => "APPLICATION/X-PROTOBUF",
        (_, 2) => "text/plain",
        (true, 3) | (false, 4) => "application/x-protobuf",
        (false, 3) | (true, 4) => "application/json",
        (true, _) => "application/json",
        (false, _) => "application/x-protobuf",
    };
    let (encoding, body) = match rng.random_range(0..12) {
        0..=4 => (None, body),
        5 | 6 => (Some("gzip"), gzip(&body)),
        7 => {
            let mut g = gzip(&body);
            mutate_bytes(&mut g, rng);
            (Some("gzip"), g)
        }
        8 => {
            let mut g = gzip(&body);
            g.truncate(rng.random_range(0..g.len()));
            (Some("gzip"), g)
        }
        // Not gzip at all, or trailing garbage after a gzip member.
        9 => (Some("gzip"), body),
        10 => {
            let mut g = gzip(&body);
            g.extend((0..rng.random_range(1..20)).map(|_| rng.random::<u8>()));
            (Some(["gzip", "deflate", "br", "identity", "x-nope"][rng.random_range(0..5)]), g)
        }
        // A gzip bomb: a little compressed data that expands past the limit.
        _ => (Some("gzip"), gzip(&vec![b' '; LIMIT * 4])),
    };
    (path, ct, encoding, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn random_bodies_get_2xx_or_4xx_and_the_server_keeps_serving() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("otlp").unwrap(), telemetry);
    let cfg = json!({"protocols": {"http": {"endpoint": "127.0.0.1:0", "max_request_body_size": LIMIT}}});
    let mut rx = OtlpReceiver::new(ctx, OtlpConfig::from_value(&cfg).unwrap());
    let sink = Arc::new(Check::default());
    let mut consumers = ReceiverConsumers::default();
    for s in Signal::ALL {
        consumers.set(s, sink.clone());
    }
    rx.start(consumers).await.unwrap();
    let base = format!("http://{}", rx.local_addrs().http.unwrap());
    let h1 = reqwest::Client::new();
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();

    let mut rng = StdRng::seed_from_u64(0x0_77e1);
    let requests: Vec<_> = (0..CASES).map(|_| random_request(&mut rng)).collect();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for (batch_no, batch) in requests.chunks(CONCURRENCY).enumerate() {
        let sends = batch.iter().enumerate().map(|(i, (path, ct, enc, body))| {
            let client = if (batch_no + i) % 3 == 0 { &h2 } else { &h1 };
            let mut rb = client.post(format!("{base}{path}")).header("content-type", *ct).body(body.clone());
            if let Some(e) = enc {
                rb = rb.header("content-encoding", *e);
            }
            async move {
                let r = rb.send().await;
                let r = r.unwrap_or_else(|e| panic!("no answer ({e:?}) to {path} {ct} {enc:?} {body:?}"));
                let status = r.status();
                let text = r.bytes().await.unwrap_or_else(|e| panic!("answer body lost ({e:?}) for {body:?}"));
                assert!(
                    status.is_success() || status.is_client_error(),
                    "{status} ({text:?}) for {path} {ct} {enc:?} {body:?}"
                );
                status.as_u16()
            }
        });
        for s in join_all(sends).await {
            *statuses.entry(s).or_default() += 1;
        }
    }
    println!("statuses: {statuses:?}");
    // Both outcomes must be well represented, or the mutations test nothing.
    let ok = statuses.get(&200).copied().unwrap_or(0);
    let bad = statuses.get(&400).copied().unwrap_or(0);
    assert!(ok > CASES / 20 && bad > CASES / 10, "{statuses:?}");
    assert!(sink.undecodable.lock().unwrap().is_empty(), "{:?}", sink.undecodable.lock().unwrap());

    // Still serving, on both protocols.
    let before = *sink.accepted.lock().unwrap();
    for client in [&h1, &h2] {
        let r = client
            .post(format!("{base}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(traces())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = client
            .post(format!("{base}/v1/metrics"))
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(gzip(METRICS_JSON.as_bytes()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(*sink.accepted.lock().unwrap(), before + 4);
    rx.shutdown().await;
}
