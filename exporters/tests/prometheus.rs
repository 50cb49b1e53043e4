//! The `prometheus` (pull) and `prometheusremotewrite` exporters: name / label translation
//! golden tests, delta → cumulative accumulation, expiration and the series cap, the HTTP
//! endpoint, and remote-write requests decoded back (snappy + prost) from an in-process server.

use crate::common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use common::{PATIENCE, fast_retry};
use inferwatch_core::component::{ComponentId, CreateContext, ExporterFactory, NodeRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::prometheus::accumulator::{Accumulator, Outcome};
use inferwatch_exporters::prometheus::exposition::{Format, render};
use inferwatch_exporters::prometheus::translate::{self, MetricShape, Settings, label_name, metric_name};
use inferwatch_exporters::prometheus::{PrometheusConfig, PrometheusExporter};
use inferwatch_exporters::prometheusremotewrite::RemoteWriteExporterFactory;
use inferwatch_exporters::prometheusremotewrite::proto::{Label, Sample, TimeSeries, WriteRequest};
use inferwatch_testkit::otlp::{self, gauge, histogram_point, kv, kvs, metrics_request, scope};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum, Summary, SummaryDataPoint,
    metric, number_data_point, summary_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc};

const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;
const DELTA: i32 = AggregationTemporality::Delta as i32;
const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

// ---- payload builders -------------------------------------------------------------------------

fn resource() -> Resource {
    otlp::resource(kvs(&[
        ("service.name", "vllm"),
        ("service.namespace", "llm"),
        ("service.instance.id", "gpu-0:8000"),
        ("host.name", "gpu-node-1"),
        ("k8s.pod.name", "p-1"),
    ]))
}

fn request(resource: Resource, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
    metrics_request(resource.attributes, scope("inferwatch.test", "1.2.3"), metrics)
}

fn number(attrs: Vec<KeyValue>, start: u64, time: u64, v: number_data_point::Value) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attrs,
        start_time_unix_nano: start,
        time_unix_nano: time,
        value: Some(v),
        ..Default::default()
    }
}

fn sum(name: &str, unit: &str, monotonic: bool, temporality: i32, points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(metric::Data::Sum(Sum {
            data_points: points,
            aggregation_temporality: temporality,
            is_monotonic: monotonic,
        })),
        ..Default::default()
    }
}

fn histogram(name: &str, unit: &str, temporality: i32, points: Vec<HistogramDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(metric::Data::Histogram(Histogram { data_points: points, aggregation_temporality: temporality })),
        ..Default::default()
    }
}

fn int(i: i64) -> number_data_point::Value {
    number_data_point::Value::AsInt(i)
}

fn double(d: f64) -> number_data_point::Value {
    number_data_point::Value::AsDouble(d)
}

fn exporter(cfg: serde_json::Value) -> (PrometheusExporter, Arc<Telemetry>, ComponentId) {
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse("prometheus").unwrap();
    let c = PrometheusConfig::from_value(&cfg).unwrap();
    let e = PrometheusExporter::new(&CreateContext::new(id.clone(), telemetry.clone()), &c).unwrap();
    (e, telemetry, id)
}

// ---- names and labels --------------------------------------------------------------------------

#[test]
fn prometheus_metric_names_follow_otelcol() {
    use MetricShape::*;
    let cases: &[(&str, &str, MetricShape, &str)] = &[
        ("system.filesystem.usage", "By", Gauge, "system_filesystem_usage_bytes"),
        ("system.io", "By", MonotonicSum, "system_io_bytes_total"),
        ("network_transmitted_bytes_total", "By", MonotonicSum, "network_transmitted_bytes_total"),
        ("system.network.dropped", "{packets}", Gauge, "system_network_dropped"),
        ("system.network.dropped", "{packets}", MonotonicSum, "system_network_dropped_total"),
        ("system.network.dropped", "packets", Gauge, "system_network_dropped_packets"),
        ("hw.gpu.memory.utilization", "1", Gauge, "hw_gpu_memory_utilization_ratio"),
        ("hw.fan.speed_ratio", "1", Gauge, "hw_fan_speed_ratio"),
        ("objects", "1", MonotonicSum, "objects_total"),
        ("broken.metric.speed", "km/h", Gauge, "broken_metric_speed_km_per_hour"),
        ("astro.light.speed_limit", "m/s", Gauge, "astro_light_speed_limit_meters_per_second"),
        ("mongodbatlas.process.asserts", "{assertions}/s", Gauge, "mongodbatlas_process_asserts_per_second"),
        ("mongodbatlas.process.oplog.rate", "GiBy/h", Gauge, "mongodbatlas_process_oplog_rate_gibibytes_per_hour"),
        ("broken.metric.success_ratio", "%", Gauge, "broken_metric_success_ratio_percent"),
        ("unsupported.metric.temperature", "°F", Gauge, "unsupported_metric_temperature_F"),
        ("system.disk.operation_time", "s", MonotonicSum, "system_disk_operation_time_seconds_total"),
        ("gen_ai.server.time_to_first_token", "s", Histogram, "gen_ai_server_time_to_first_token_seconds"),
        ("queue.size", "{request}", NonMonotonicSum, "queue_size"),
        ("rpc.latency", "ms", Summary, "rpc_latency_milliseconds"),
        // Colons are kept (vLLM's names), `_total` is not doubled.
        ("vllm:num_requests_running", "", Gauge, "vllm:num_requests_running"),
        ("vllm:prompt_tokens_total", "", MonotonicSum, "vllm:prompt_tokens_total"),
        ("vllm:prompt_tokens", "", MonotonicSum, "vllm:prompt_tokens_total"),
        ("vllm:time_to_first_token_seconds", "s", Histogram, "vllm:time_to_first_token_seconds"),
        // Invalid characters split tokens; runs of them collapse; a leading digit gets `_`.
        ("envoy__rule-engine zlib/buf.error", "", Gauge, "envoy_rule_engine_zlib_buf_error"),
        ("3.14 digits", "", Gauge, "_3_14_digits"),
        ("  \tspaced  name ", "  By\t", Gauge, "spaced_name_bytes"),
    ];
    for (name, unit, shape, want) in cases {
        assert_eq!(metric_name(name, unit, *shape, "", true), *want, "{name} [{unit}] {shape:?}");
        assert!(translate::is_valid_metric_name(want), "{want}");
    }
    assert_eq!(
        metric_name("network.io", "By", MetricShape::MonotonicSum, "system", true),
        "system_network_io_bytes_total"
    );
    // Without suffixes: only invalid characters change, colons and underscores stay.
    assert_eq!(metric_name("system.io", "By", MetricShape::MonotonicSum, "", false), "system_io");
    assert_eq!(metric_name("vllm:e2e__latency", "s", MetricShape::Histogram, "", false), "vllm:e2e__latency");
    assert_eq!(metric_name("network (I/O)", "By", MetricShape::MonotonicSum, "system", false), "system_network_I_O");
    assert_eq!(metric_name("3.14 digits", "By", MetricShape::Gauge, "", false), "_3_14_digits");
}

#[test]
fn prometheus_label_names_are_sanitised() {
    let cases = [
        ("model_name", "model_name"),
        ("http.method", "http_method"),
        ("k8s.pod-name", "k8s_pod_name"),
        ("0day", "key_0day"),
        ("_private", "key_private"),
        ("__name__", "key__name__"),
        ("gen_ai.request.model", "gen_ai_request_model"),
        // A name that sanitises to a leading `_` gets `key` in front, like any other.
        ("ünïcode", "key_n_code"),
        ("a:b", "a_b"),
    ];
    for (k, want) in cases {
        let got = label_name(k);
        assert_eq!(got, want, "{k}");
        assert!(translate::is_valid_label_name(&got), "{got}");
    }
}

/// One request covering every kind, with every label rule, rendered in the text format.
#[test]
fn prometheus_golden_exposition() {
    let attrs = vec![
        kv("http.method", "GET"),
        kv("http-method", "POST"),
        kv("0day", "x"),
        kv("_private", "y"),
        kv("empty", ""),
        kv("env", "prod"),
    ];
    let req = request(
        resource(),
        vec![
            Metric {
                description: "GPU KV-cache usage.\nA fraction, \\ not a percent.".into(),
                ..gauge(
                    "vllm:gpu_cache_usage_perc",
                    "1",
                    vec![number(vec![kv("model_name", "llama")], 0, T0, double(0.25))],
                )
            },
            sum("http.server.requests", "{request}", true, CUMULATIVE, vec![number(attrs, T0 - 60 * SEC, T0, int(7))]),
            histogram(
                "gen_ai.server.time_to_first_token",
                "s",
                CUMULATIVE,
                vec![histogram_point(
                    vec![kv("gen_ai.request.model", "m\"1")],
                    T0 - 60 * SEC,
                    T0,
                    &[0.1, 0.5, 1.0],
                    &[1, 2, 3, 0],
                    3.25,
                )],
            ),
            Metric {
                name: "rpc.latency".into(),
                unit: "ms".into(),
                data: Some(metric::Data::Summary(Summary {
                    data_points: vec![SummaryDataPoint {
                        time_unix_nano: T0,
                        count: 10,
                        sum: 150.0,
                        quantile_values: vec![
                            summary_data_point::ValueAtQuantile { quantile: 0.5, value: 12.0 },
                            summary_data_point::ValueAtQuantile { quantile: 0.99, value: 40.0 },
                        ],
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            },
            sum("queue.size", "{request}", false, CUMULATIVE, vec![number(vec![], T0 - SEC, T0, int(3))]),
        ],
    );
    let (e, telemetry, id) = exporter(json!({"endpoint": "127.0.0.1:0", "const_labels": {"env": "test"}}));
    assert_eq!(e.ingest(req, Instant::now(), T0), 0);
    let common = r#"env="test",instance="gpu-0:8000",job="llm/vllm""#;
    let model = r#"env="test",gen_ai_request_model="m\"1",instance="gpu-0:8000",job="llm/vllm""#;
    let scope = r#"otel_scope_name="inferwatch.test",otel_scope_version="1.2.3""#;
    let want = format!(
        r#"# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_bucket{{{model},{scope},le="0.1"}} 1
gen_ai_server_time_to_first_token_seconds_bucket{{{model},{scope},le="0.5"}} 3
gen_ai_server_time_to_first_token_seconds_bucket{{{model},{scope},le="1"}} 6
gen_ai_server_time_to_first_token_seconds_bucket{{{model},{scope},le="+Inf"}} 6
gen_ai_server_time_to_first_token_seconds_sum{{{model},{scope}}} 3.25
gen_ai_server_time_to_first_token_seconds_count{{{model},{scope}}} 6
# TYPE http_server_requests_total counter
http_server_requests_total{{env="prod",http_method="POST;GET",instance="gpu-0:8000",job="llm/vllm",key_0day="x",key_private="y",{scope}}} 7
# TYPE queue_size gauge
queue_size{{{common},{scope}}} 3
# TYPE rpc_latency_milliseconds summary
rpc_latency_milliseconds{{{common},{scope},quantile="0.5"}} 12
rpc_latency_milliseconds{{{common},{scope},quantile="0.99"}} 40
rpc_latency_milliseconds_sum{{{common},{scope}}} 150
rpc_latency_milliseconds_count{{{common},{scope}}} 10
# HELP target_info Target metadata
# TYPE target_info gauge
target_info{{env="test",host_name="gpu-node-1",instance="gpu-0:8000",job="llm/vllm",k8s_pod_name="p-1"}} 1
# HELP vllm:gpu_cache_usage_perc_ratio GPU KV-cache usage.\nA fraction, \\ not a percent.
# TYPE vllm:gpu_cache_usage_perc_ratio gauge
vllm:gpu_cache_usage_perc_ratio{{{common},model_name="llama",{scope}}} 0.25
"#
    );
    let got = e.render(Format::Text);
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}");
    // Nothing was dropped.
    assert_eq!(telemetry.processor(&id, Signal::Metrics).dropped.get(), 0);

    // OpenMetrics: counter families lose `_total` in their metadata, the text ends with # EOF.
    let om = e.render(Format::OpenMetrics);
    assert!(om.contains("# TYPE http_server_requests counter\nhttp_server_requests_total{"), "{om}");
    assert!(om.ends_with("# EOF\n"), "{om}");
}

#[test]
fn prometheus_resource_attributes_become_labels_when_asked() {
    let req = request(resource(), vec![gauge("g", "", vec![number(vec![kv("host.name", "own")], 0, T0, int(1))])]);
    let s = Settings { add_metric_suffixes: true, resource_to_telemetry: true, ..Default::default() };
    let points = s.translate(&req);
    let g = points.iter().find(|p| p.family.name == "g").unwrap();
    let labels: Vec<(&str, &str)> = g.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        labels,
        vec![
            ("host_name", "own"), // the point's own attribute wins over the resource's
            ("instance", "gpu-0:8000"),
            ("job", "llm/vllm"),
            ("k8s_pod_name", "p-1"),
            ("otel_scope_name", "inferwatch.test"),
            ("otel_scope_version", "1.2.3"),
            ("service_instance_id", "gpu-0:8000"),
            ("service_name", "vllm"),
            ("service_namespace", "llm"),
        ]
    );
    // Only the service identity: no target_info; no service.name: no job.
    let bare = Resource { attributes: vec![kv("service.instance.id", "i-1")], ..Default::default() };
    let points =
        Settings::default().translate(&request(bare, vec![gauge("g", "", vec![number(vec![], 0, T0, int(1))])]));
    assert_eq!(points.len(), 1);
    assert_eq!(
        points[0].labels,
        vec![
            ("instance".to_string(), "i-1".to_string()),
            ("otel_scope_name".into(), "inferwatch.test".into()),
            ("otel_scope_version".into(), "1.2.3".into()),
        ]
    );
}

// ---- accumulation --------------------------------------------------------------------------------

fn value_of(e: &PrometheusExporter, series_prefix: &str) -> Vec<String> {
    e.render(Format::Text).lines().filter(|l| l.starts_with(series_prefix)).map(str::to_string).collect()
}

#[test]
fn prometheus_delta_sums_accumulate_into_a_cumulative_counter() {
    let (e, telemetry, id) = exporter(json!({"endpoint": "127.0.0.1:0"}));
    let now = Instant::now();
    let delta = |start: u64, end: u64, v: i64| {
        request(
            resource(),
            vec![sum("tokens", "{token}", true, DELTA, vec![number(vec![kv("m", "a")], start, end, int(v))])],
        )
    };
    // Contiguous deltas add up; the start time stays the first one.
    assert_eq!(e.ingest(delta(T0, T0 + SEC, 5), now, T0), 0);
    assert_eq!(e.ingest(delta(T0 + SEC, T0 + 2 * SEC, 7), now, T0), 0);
    // A gap (no delta for (2s, 3s]) is still added: the loss cannot be known.
    assert_eq!(e.ingest(delta(T0 + 3 * SEC, T0 + 4 * SEC, 1), now, T0), 0);
    let got = value_of(&e, "tokens_total{");
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].ends_with("} 13"), "{got:?}");
    // A duplicate (same end time) is dropped and counted.
    assert_eq!(e.ingest(delta(T0 + 3 * SEC, T0 + 4 * SEC, 1), now, T0), 1);
    assert!(value_of(&e, "tokens_total{")[0].ends_with("} 13"));
    assert_eq!(telemetry.processor(&id, Signal::Metrics).dropped.get(), 1);
    // An overlapping delta (a restarted source) starts the series again.
    assert_eq!(e.ingest(delta(T0 + 2 * SEC, T0 + 5 * SEC, 4), now, T0), 0);
    assert!(value_of(&e, "tokens_total{")[0].ends_with("} 4"), "{:?}", value_of(&e, "tokens_total{"));

    // Delta histograms add bucket by bucket while the bounds stay; new bounds restart.
    let h = |start: u64, end: u64, bounds: &[f64], counts: &[u64], s: f64| {
        request(
            resource(),
            vec![histogram("lat", "s", DELTA, vec![histogram_point(vec![], start, end, bounds, counts, s)])],
        )
    };
    assert_eq!(e.ingest(h(T0, T0 + SEC, &[1.0, 2.0], &[1, 0, 0], 0.5), now, T0), 0);
    assert_eq!(e.ingest(h(T0 + SEC, T0 + 2 * SEC, &[1.0, 2.0], &[0, 2, 1], 6.5), now, T0), 0);
    let got = value_of(&e, "lat_seconds_");
    let want = [r#"le="1"} 1"#, r#"le="2"} 3"#, r#"le="+Inf"} 4"#, "} 7", "} 4"];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.ends_with(w), "{g} should end with {w}");
    }
    assert_eq!(e.ingest(h(T0 + 2 * SEC, T0 + 3 * SEC, &[5.0], &[2, 0], 3.0), now, T0), 0);
    let got = value_of(&e, "lat_seconds_bucket");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].ends_with(r#"le="5"} 2"#), "{got:?}");
}

#[test]
fn prometheus_cumulative_points_keep_their_start_and_older_points_are_ignored() {
    let (e, _t, _id) = exporter(json!({"endpoint": "127.0.0.1:0"}));
    let now = Instant::now();
    let c = |time: u64, v: f64| {
        request(resource(), vec![sum("c", "", true, CUMULATIVE, vec![number(vec![], T0, time, double(v))])])
    };
    assert_eq!(e.ingest(c(T0 + 2 * SEC, 10.0), now, T0), 0);
    // Older than what is stored: dropped (counted), the newer value stays.
    assert_eq!(e.ingest(c(T0 + SEC, 4.0), now, T0), 1);
    assert!(value_of(&e, "c_total{")[0].ends_with("} 10"));
    assert_eq!(e.ingest(c(T0 + 3 * SEC, 11.5), now, T0), 0);
    assert!(value_of(&e, "c_total{")[0].ends_with("} 11.5"));
    // Unspecified temporality cannot be served: dropped and counted.
    let bad = request(resource(), vec![sum("u", "", true, 0, vec![number(vec![], 0, T0, int(1))])]);
    assert_eq!(e.ingest(bad, now, T0), 1);
    assert!(value_of(&e, "u").is_empty());
}

#[test]
fn prometheus_series_expire_after_metric_expiration() {
    let (e, _t, _id) = exporter(json!({"endpoint": "127.0.0.1:0", "metric_expiration": "5m"}));
    let t0 = Instant::now();
    let g = |name: &str| request(resource(), vec![gauge(name, "", vec![number(vec![], 0, T0, int(1))])]);
    e.ingest(g("old"), t0, T0);
    e.ingest(g("fresh"), t0 + Duration::from_secs(200), T0);
    // 301 s after "old" and 101 s after "fresh": only "old" is gone (and its target_info stays,
    // refreshed by "fresh").
    e.ingest(g("fresh"), t0 + Duration::from_secs(301), T0);
    let text = e.render(Format::Text);
    assert!(!text.contains("\nold{"), "{text}");
    assert!(text.contains("\nfresh{"), "{text}");
    assert!(text.contains("\ntarget_info{"), "{text}");

    // The accumulator on its own: kept just before the deadline, gone at it.
    let mut acc = Accumulator::new(10, Duration::from_secs(60));
    let p = Settings::default().translate(&g("x")).remove(0);
    assert_eq!(acc.add(p, t0), Outcome::Stored);
    assert_eq!(acc.expire(t0 + Duration::from_secs(59)), 0);
    assert_eq!(acc.len(), 1);
    assert_eq!(acc.expire(t0 + Duration::from_secs(60)), 1);
    assert!(acc.is_empty());
    assert_eq!(render(&acc, Format::Text), "");
}

#[test]
fn prometheus_series_over_max_series_are_dropped_and_counted() {
    let (e, telemetry, id) = exporter(json!({"endpoint": "127.0.0.1:0", "max_series": 3}));
    let points: Vec<NumberDataPoint> = (0..5).map(|i| number(vec![kv("i", &i.to_string())], 0, T0, int(i))).collect();
    let bare = Resource { attributes: vec![kv("service.name", "s")], ..Default::default() };
    assert_eq!(e.ingest(request(bare.clone(), vec![gauge("g", "", points)]), Instant::now(), T0), 2);
    assert_eq!(value_of(&e, "g{").len(), 3);
    assert_eq!(telemetry.processor(&id, Signal::Metrics).dropped.get(), 2);
    // A series already held is still updated at the cap.
    let again = vec![number(vec![kv("i", "0")], 0, T0 + SEC, int(42))];
    assert_eq!(e.ingest(request(bare, vec![gauge("g", "", again)]), Instant::now(), T0), 0);
    assert!(value_of(&e, "g{").iter().any(|l| l.contains(r#"i="0""#) && l.ends_with(" 42")));
}

// ---- the HTTP endpoint ------------------------------------------------------------------------------

fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

#[tokio::test]
async fn prometheus_endpoint_serves_text_and_negotiates_open_metrics() {
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse("prometheus").unwrap();
    let cfg = json!({"endpoint": "127.0.0.1:0", "enable_open_metrics": true});
    let c = PrometheusConfig::from_value(&cfg).unwrap();
    let e = Arc::new(PrometheusExporter::new(&CreateContext::new(id.clone(), telemetry.clone()), &c).unwrap());
    let node: NodeRef = e.clone();
    node.start().await.unwrap();
    let addr = e.local_addr().unwrap();
    let payload =
        request(resource(), vec![sum("requests", "", true, CUMULATIVE, vec![number(vec![], T0, T0 + SEC, int(3))])]);
    node.consume(Payload::Metrics(payload)).await.unwrap();
    assert_eq!(telemetry.exporter(&id, Signal::Metrics).sent.get(), 1);

    let client = http_client();
    let url = format!("http://{addr}/metrics");
    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let text = r.text().await.unwrap();
    assert!(text.contains("# TYPE requests_total counter\nrequests_total{"), "{text}");
    let r = client
        .get(&url)
        .header("accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let om = r.text().await.unwrap();
    assert!(om.contains("# TYPE requests counter\nrequests_total{") && om.ends_with("# EOF\n"), "{om}");

    // The port is taken now: a second exporter on it fails to start, saying why.
    let c2 = PrometheusConfig::from_value(&json!({"endpoint": addr.to_string()})).unwrap();
    let other = PrometheusExporter::new(&CreateContext::new(id.clone(), telemetry.clone()), &c2).unwrap();
    let err = inferwatch_core::component::Node::start(&other).await.unwrap_err().to_string();
    assert!(err.contains("cannot listen on") && err.contains(&addr.to_string()), "{err}");

    node.shutdown(Instant::now() + PATIENCE).await;
    assert!(http_client().get(&url).send().await.is_err(), "the endpoint is closed after shutdown");
}

#[tokio::test]
async fn prometheus_open_metrics_is_not_served_unless_enabled() {
    let (e, _t, _id) = exporter(json!({"endpoint": "127.0.0.1:0"}));
    let e = Arc::new(e);
    let node: NodeRef = e.clone();
    node.start().await.unwrap();
    let url = format!("http://{}/metrics", e.local_addr().unwrap());
    let r = http_client().get(&url).header("accept", "application/openmetrics-text").send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    node.shutdown(Instant::now() + PATIENCE).await;
}

// ---- remote write -------------------------------------------------------------------------------------

/// What the test receiver got: headers and the decoded request.
struct Got {
    headers: HeaderMap,
    request: WriteRequest,
}

/// A scripted answer: the status and an optional Retry-After.
type Reply = (u16, Option<&'static str>);

#[derive(Clone)]
struct Receiver {
    /// Statuses to answer with, in order (200 once it runs out), with an optional Retry-After.
    script: Arc<Mutex<VecDeque<Reply>>>,
    tx: mpsc::UnboundedSender<Got>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> axum::response::Response {
    let raw = snap::raw::Decoder::new().decompress_vec(&body).expect("snappy block format");
    let request = WriteRequest::decode(raw.as_slice()).expect("a WriteRequest");
    let _ = r.tx.send(Got { headers, request });
    let (status, retry_after) = r.script.lock().await.pop_front().unwrap_or((200, None));
    let mut b = axum::http::Response::builder().status(status);
    if let Some(ra) = retry_after {
        b = b.header("retry-after", ra);
    }
    b.body(axum::body::Body::from("answer")).unwrap()
}

async fn remote_receiver(script: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Got>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Receiver { script: Arc::new(Mutex::new(script.into())), tx };
    let app = Router::new().route("/api/v1/write", axum::routing::post(receive)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/api/v1/write"), rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Got>) -> Got {
    tokio::time::timeout(PATIENCE, rx.recv()).await.expect("a request in time").expect("the receiver is up")
}

fn series(labels: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
    let mut labels: Vec<Label> =
        labels.iter().map(|(k, v)| Label { name: k.to_string(), value: v.to_string() }).collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    TimeSeries { labels, samples: samples.iter().map(|(t, v)| Sample { timestamp: *t, value: *v }).collect() }
}

fn sorted(mut ts: Vec<TimeSeries>) -> Vec<TimeSeries> {
    ts.sort_by(|a, b| a.labels.cmp(&b.labels));
    ts
}

fn remote_exporter(url: &str, extra: serde_json::Value) -> (NodeRef, Arc<Telemetry>, ComponentId) {
    let mut cfg =
        json!({"endpoint": url, "external_labels": {"via": "remote_write"}, "retry_on_failure": fast_retry()});
    if let (Some(c), Some(x)) = (cfg.as_object_mut(), extra.as_object()) {
        c.extend(x.clone());
    }
    RemoteWriteExporterFactory.validate(&cfg).unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse("prometheusremotewrite").unwrap();
    let node = RemoteWriteExporterFactory
        .create(CreateContext::new(id.clone(), telemetry.clone()), &cfg, Signal::Metrics)
        .unwrap();
    (node, telemetry, id)
}

#[tokio::test]
async fn prometheus_remote_write_request_decodes_to_the_expected_series() {
    let (url, mut rx) = remote_receiver(vec![]).await;
    let (node, telemetry, id) = remote_exporter(&url, json!({}));
    node.start().await.unwrap();
    let ms = |ns: u64| (ns / 1_000_000) as i64;
    // A counter with two points of one series given newest first, a delta counter, a histogram.
    let req = request(
        resource(),
        vec![
            sum(
                "vllm:prompt_tokens",
                "",
                true,
                CUMULATIVE,
                vec![
                    number(vec![kv("model_name", "llama")], T0, T0 + 2 * SEC, int(30)),
                    number(vec![kv("model_name", "llama")], T0, T0 + SEC, int(10)),
                ],
            ),
            sum("generated", "{token}", true, DELTA, vec![number(vec![], T0, T0 + SEC, int(4))]),
            histogram(
                "ttft",
                "s",
                CUMULATIVE,
                vec![histogram_point(vec![], T0, T0 + SEC, &[0.5, 1.0], &[2, 1, 1], 2.5)],
            ),
        ],
    );
    node.consume(Payload::Metrics(req)).await.unwrap();
    let got = next(&mut rx).await;
    assert_eq!(got.headers["content-encoding"], "snappy");
    assert_eq!(got.headers["content-type"], "application/x-protobuf");
    assert_eq!(got.headers["x-prometheus-remote-write-version"], "0.1.0");

    let base = [
        ("job", "llm/vllm"),
        ("instance", "gpu-0:8000"),
        ("otel_scope_name", "inferwatch.test"),
        ("otel_scope_version", "1.2.3"),
        ("via", "remote_write"),
    ];
    let with = |name: &str, more: &[(&'static str, &'static str)]| {
        let mut l: Vec<(&str, &str)> = vec![("__name__", name)];
        l.extend_from_slice(&base);
        l.extend_from_slice(more);
        l.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>()
    };
    let s = |labels: Vec<(String, String)>, samples: &[(i64, f64)]| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        series(&l, samples)
    };
    let t1 = ms(T0 + SEC);
    let want = vec![
        s(with("vllm:prompt_tokens_total", &[("model_name", "llama")]), &[(t1, 10.0), (ms(T0 + 2 * SEC), 30.0)]),
        s(with("generated_total", &[]), &[(t1, 4.0)]),
        s(with("ttft_seconds_bucket", &[("le", "0.5")]), &[(t1, 2.0)]),
        s(with("ttft_seconds_bucket", &[("le", "1")]), &[(t1, 3.0)]),
        s(with("ttft_seconds_bucket", &[("le", "+Inf")]), &[(t1, 4.0)]),
        s(with("ttft_seconds_sum", &[]), &[(t1, 2.5)]),
        s(with("ttft_seconds_count", &[]), &[(t1, 4.0)]),
        series(
            &[
                ("__name__", "target_info"),
                ("job", "llm/vllm"),
                ("instance", "gpu-0:8000"),
                ("host_name", "gpu-node-1"),
                ("k8s_pod_name", "p-1"),
                ("via", "remote_write"),
            ],
            &[(ms(T0 + 2 * SEC), 1.0)],
        ),
    ];
    assert_eq!(sorted(got.request.timeseries.clone()), sorted(want));
    for ts in &got.request.timeseries {
        assert!(ts.labels.windows(2).all(|w| w[0].name < w[1].name), "labels sorted: {:?}", ts.labels);
    }
    let families: Vec<&str> = got.request.metadata.iter().map(|m| m.metric_family_name.as_str()).collect();
    assert_eq!(families, vec!["vllm:prompt_tokens_total", "generated_total", "ttft_seconds", "target_info"]);

    // The next delta continues the running total.
    let req = request(
        resource(),
        vec![sum("generated", "{token}", true, DELTA, vec![number(vec![], T0 + SEC, T0 + 3 * SEC, int(6))])],
    );
    node.consume(Payload::Metrics(req)).await.unwrap();
    let got = next(&mut rx).await;
    let generated =
        got.request.timeseries.iter().find(|t| t.labels.iter().any(|l| l.value == "generated_total")).unwrap();
    assert_eq!(generated.samples, vec![Sample { timestamp: ms(T0 + 3 * SEC), value: 10.0 }]);
    // target_info never goes back in time, even when a later request's points are older.
    let req = request(resource(), vec![gauge("late", "", vec![number(vec![], 0, T0, int(1))])]);
    node.consume(Payload::Metrics(req)).await.unwrap();
    let got = next(&mut rx).await;
    let ti = got.request.timeseries.iter().find(|t| t.labels.iter().any(|l| l.value == "target_info")).unwrap();
    assert_eq!(ti.samples[0].timestamp, ms(T0 + 3 * SEC));

    assert_eq!(node.shutdown(Instant::now() + PATIENCE).await, 0);
    let m = telemetry.exporter(&id, Signal::Metrics);
    assert_eq!(m.sent.get(), 6);
    assert_eq!(m.send_failed.get(), 0);
}

#[tokio::test]
async fn prometheus_remote_write_retries_5xx_and_429_and_drops_on_4xx() {
    let (url, mut rx) = remote_receiver(vec![(503, None), (429, Some("0")), (200, None), (400, None)]).await;
    let (node, telemetry, id) = remote_exporter(&url, json!({}));
    node.start().await.unwrap();
    let g = |v: i64, t: u64| request(resource(), vec![gauge("g", "", vec![number(vec![], 0, t, int(v))])]);
    node.consume(Payload::Metrics(g(1, T0))).await.unwrap();
    // Three attempts of the same request: 503, 429, then accepted.
    let attempts: Vec<WriteRequest> =
        vec![next(&mut rx).await.request, next(&mut rx).await.request, next(&mut rx).await.request];
    assert!(attempts.windows(2).all(|w| w[0] == w[1]), "a retry resends the same request");
    node.consume(Payload::Metrics(g(2, T0 + SEC))).await.unwrap();
    let _refused = next(&mut rx).await;
    assert_eq!(node.shutdown(Instant::now() + PATIENCE).await, 0);
    let m = telemetry.exporter(&id, Signal::Metrics);
    assert_eq!(m.sent.get(), 1);
    assert_eq!(m.send_failed.get(), 1, "the 400 is permanent: dropped and counted, not retried");
    assert!(rx.try_recv().is_err(), "no retry after a 4xx");
}
