//! Tests of the `prometheus` receiver: golden conversions of vLLM V1, TGI and OpenMetrics
//! expositions (fixtures built from tests/fixtures/servers/), start times and
//! resets, and real scrapes: of the simulator, of a fake TGI server, of targets that fail.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers, ReceiverFactory};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::prometheus::config::TargetAddr;
use inferwatch_receivers::prometheus::convert::{Converter, SCOPE_NAME, Target, kv};
use inferwatch_receivers::prometheus::parse::{Format, parse};
use inferwatch_receivers::prometheus::{ACCEPT, PrometheusReceiverFactory, SCRAPE_FAILURES, ScrapeError, fetch};
use inferwatch_testkit::harness::Sink as Capture;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const VLLM: &str = include_str!("fixtures/vllm_v1.prom");
const TGI: &str = include_str!("fixtures/tgi.prom");
const OPENMETRICS: &str = include_str!("fixtures/openmetrics.om");

/// The scrape time used by the golden tests.
const T: u64 = 1_800_000_000_000_000_000;
/// `1.7000000005e+09`, the fixture's `_created`, in nanoseconds.
const CREATED: u64 = 1_700_000_000_500_000_000;
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

const TTFT: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL: [f64; 19] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const LATENCY: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
const ITERATION: [f64; 13] = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];

// ---- helpers ------------------------------------------------------------------------------

fn target(job: &str, labels: &[(&str, &str)]) -> Target {
    Target {
        job: job.into(),
        addr: TargetAddr { host: "127.0.0.1".into(), port: 8000 },
        scheme: "http".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        honor_labels: false,
    }
}

fn attrs(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    let mut p: Vec<_> = pairs.to_vec();
    p.sort();
    p.iter().map(|(k, v)| kv(k, v)).collect()
}

fn vllm_attrs(extra: &[(&str, &str)]) -> Vec<KeyValue> {
    let mut p = vec![("model_name", MODEL), ("engine", "0"), ("env", "prod")];
    p.extend_from_slice(extra);
    attrs(&p)
}

fn find<'a>(ms: &'a [Metric], name: &str) -> &'a Metric {
    ms.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no metric {name} in {:?}", names(ms)))
}

fn names(ms: &[Metric]) -> Vec<&str> {
    ms.iter().map(|m| m.name.as_str()).collect()
}

fn histogram(m: &Metric) -> &Histogram {
    match &m.data {
        Some(Data::Histogram(h)) => h,
        other => panic!("{} is not a histogram: {other:?}", m.name),
    }
}

fn sum(m: &Metric) -> &Sum {
    match &m.data {
        Some(Data::Sum(s)) => s,
        other => panic!("{} is not a sum: {other:?}", m.name),
    }
}

fn gauge(m: &Metric) -> &Gauge {
    match &m.data {
        Some(Data::Gauge(g)) => g,
        other => panic!("{} is not a gauge: {other:?}", m.name),
    }
}

fn num(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(NumV::AsDouble(v)) => v,
        other => panic!("{other:?}"),
    }
}

fn attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    kvs.iter().find(|k| k.key == key).and_then(|k| match k.value.as_ref()?.value.as_ref()? {
        AnyV::StringValue(s) => Some(s.as_str()),
        _ => None,
    })
}

fn convert(text: &str, format: Format, t: Target, extra: &[(&str, &str)]) -> Vec<Metric> {
    let expo = parse(text, format).unwrap_or_else(|e| panic!("{e}"));
    let extra: Vec<(String, String)> = extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Converter::new(t).convert(&expo, T, &extra)
}

fn cumulative_histogram(points: Vec<HistogramDataPoint>) -> Option<Data> {
    Some(Data::Histogram(Histogram {
        data_points: points,
        aggregation_temporality: AggregationTemporality::Cumulative as i32,
    }))
}

// ---- golden conversions -------------------------------------------------------------------

#[test]
fn golden_vllm_v1() {
    let ms = convert(VLLM, Format::Text, target("vllm", &[("env", "prod")]), &[]);
    assert_eq!(
        names(&ms),
        [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
            "vllm:request_success",
            "vllm:num_preemptions",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:iteration_tokens_total",
            "vllm:cache_config_info",
        ],
        "counters lose _total, the _created gauges are folded in, the iteration_tokens_total histogram keeps its name"
    );

    // A gauge, whole.
    assert_eq!(
        find(&ms, "vllm:kv_cache_usage_perc"),
        &Metric {
            name: "vllm:kv_cache_usage_perc".into(),
            description: "KV-cache usage. 1 means 100 percent usage.".into(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint {
                    attributes: vllm_attrs(&[]),
                    time_unix_nano: T,
                    value: Some(NumV::AsDouble(0.4375)),
                    ..Default::default()
                }]
            })),
            ..Default::default()
        }
    );

    // A counter, whole: cumulative, monotonic, started at its _created.
    assert_eq!(
        find(&ms, "vllm:prompt_tokens"),
        &Metric {
            name: "vllm:prompt_tokens".into(),
            description: "Number of prefill tokens processed.".into(),
            data: Some(Data::Sum(Sum {
                data_points: vec![NumberDataPoint {
                    attributes: vllm_attrs(&[]),
                    start_time_unix_nano: CREATED,
                    time_unix_nano: T,
                    value: Some(NumV::AsDouble(12345.0)),
                    ..Default::default()
                }],
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        }
    );
    let success = sum(find(&ms, "vllm:request_success"));
    let by_reason: Vec<(&str, f64, u64)> = success
        .data_points
        .iter()
        .map(|p| (attr(&p.attributes, "finished_reason").unwrap(), num(p), p.start_time_unix_nano))
        .collect();
    assert_eq!(
        by_reason,
        [("stop", 40.0, CREATED), ("length", 7.0, CREATED), ("abort", 1.0, CREATED), ("error", 0.0, CREATED)]
    );
    assert_eq!(success.data_points[0].attributes, vllm_attrs(&[("finished_reason", "stop")]));

    // A histogram, whole: de-cumulated buckets, bounds without +Inf, one overflow observation.
    assert_eq!(
        find(&ms, "vllm:time_to_first_token_seconds"),
        &Metric {
            name: "vllm:time_to_first_token_seconds".into(),
            description: "Histogram of time to first token in seconds.".into(),
            data: cumulative_histogram(vec![HistogramDataPoint {
                attributes: vllm_attrs(&[]),
                start_time_unix_nano: CREATED,
                time_unix_nano: T,
                count: 49,
                sum: Some(18.25),
                bucket_counts: vec![0, 0, 0, 1, 2, 3, 4, 5, 15, 12, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                explicit_bounds: TTFT.to_vec(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    );
    let expect = |name: &str, bounds: &[f64], counts: Vec<u64>, count: u64, s: f64| {
        let h = histogram(find(&ms, name));
        assert_eq!(h.aggregation_temporality, AggregationTemporality::Cumulative as i32, "{name}");
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, bounds, "{name}");
        assert_eq!(p.bucket_counts, counts, "{name}");
        assert_eq!((p.count, p.sum, p.start_time_unix_nano), (count, Some(s), CREATED), "{name}");
        assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count, "{name}");
    };
    let mut itl = vec![100, 300, 500, 100, 10, 2];
    itl.resize(20, 0);
    expect("vllm:inter_token_latency_seconds", &ITL, itl, 1012, 30.5);
    let mut e2e = vec![0, 0, 2, 3, 5, 10, 10, 15, 3];
    e2e.resize(22, 0);
    expect("vllm:e2e_request_latency_seconds", &LATENCY, e2e, 48, 120.0);
    let mut it = vec![5, 45, 30, 40, 80, 60, 40, 10];
    it.resize(14, 0);
    expect("vllm:iteration_tokens_total", &ITERATION, it, 310, 19000.0);

    // The info-style gauge keeps every label.
    let info = gauge(find(&ms, "vllm:cache_config_info"));
    assert_eq!(info.data_points.len(), 1);
    let p = &info.data_points[0];
    assert_eq!(num(p), 1.0);
    assert_eq!(
        p.attributes,
        attrs(&[
            ("block_size", "16"),
            ("gpu_memory_utilization", "0.9"),
            ("swap_space", "4"),
            ("cache_dtype", "auto"),
            ("is_attention_free", "False"),
            ("num_gpu_blocks_override", "None"),
            ("sliding_window", "None"),
            ("enable_prefix_caching", "True"),
            ("prefix_caching_hash_algo", "sha256"),
            ("cpu_offload_gb", "0"),
            ("calculate_kv_scales", "False"),
            ("num_gpu_blocks", "27000"),
            ("num_cpu_blocks", "None"),
            ("engine", "0"),
            ("env", "prod"),
        ])
    );
}

/// TGI's `*duration` buckets: 0.0001 multiplied by 1.5 before each of 35 pushes.
fn tgi_duration_buckets() -> Vec<f64> {
    let mut b = 0.0001f64;
    (0..35)
        .map(|_| {
            b *= 1.5;
            b
        })
        .collect()
}

#[test]
fn golden_tgi() {
    let ms = convert(TGI, Format::Text, target("tgi", &[]), &[("model_name", "bigscience/bloom-560m")]);
    assert_eq!(
        names(&ms),
        [
            "tgi_request_count",
            "tgi_request_success",
            "tgi_request_failure",
            "tgi_batch_inference_count",
            "tgi_queue_size",
            "tgi_batch_current_size",
            "tgi_batch_max_total_tokens",
            "tgi_request_duration",
            "tgi_request_queue_duration",
            "tgi_batch_inference_duration",
            "tgi_request_skipped_tokens",
        ],
        "TGI counters have no _total and keep their names"
    );
    for m in &ms {
        let points: Vec<&[KeyValue]> = match &m.data {
            Some(Data::Sum(s)) => s.data_points.iter().map(|p| p.attributes.as_slice()).collect(),
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| p.attributes.as_slice()).collect(),
            Some(Data::Histogram(h)) => h.data_points.iter().map(|p| p.attributes.as_slice()).collect(),
            Some(Data::Summary(s)) => s.data_points.iter().map(|p| p.attributes.as_slice()).collect(),
            other => panic!("{other:?}"),
        };
        assert!(!points.is_empty(), "{}", m.name);
        for a in points {
            assert_eq!(attr(a, "model_name"), Some("bigscience/bloom-560m"), "{} gets the model", m.name);
        }
    }
    let count = sum(find(&ms, "tgi_request_count"));
    assert!(count.is_monotonic);
    assert_eq!(count.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    assert_eq!(
        count.data_points,
        vec![NumberDataPoint {
            attributes: attrs(&[("model_name", "bigscience/bloom-560m")]),
            start_time_unix_nano: T,
            time_unix_nano: T,
            value: Some(NumV::AsDouble(10.0)),
            ..Default::default()
        }],
        "no _created: the first point starts at its own time"
    );
    let failures: Vec<(&str, f64)> = sum(find(&ms, "tgi_request_failure"))
        .data_points
        .iter()
        .map(|p| (attr(&p.attributes, "err").unwrap(), num(p)))
        .collect();
    assert_eq!(failures, [("validation", 1.0), ("overloaded", 1.0)]);
    assert_eq!(num(&gauge(find(&ms, "tgi_queue_size")).data_points[0]), 2.0);

    let buckets = tgi_duration_buckets();
    assert_eq!(buckets.len(), 35);
    let d = histogram(find(&ms, "tgi_request_duration"));
    let p = &d.data_points[0];
    assert_eq!(p.explicit_bounds, buckets);
    let mut counts = vec![0u64; 36];
    counts[20] = 3;
    counts[23] = 5;
    assert_eq!(p.bucket_counts, counts);
    assert_eq!((p.count, p.sum), (8, Some(9.5)));
    assert_eq!(find(&ms, "tgi_request_duration").description, "Total time spent processing the request (e2e latency)");

    let inf = histogram(find(&ms, "tgi_batch_inference_duration"));
    let per_method: Vec<(&str, u64, usize)> = inf
        .data_points
        .iter()
        .map(|p| (attr(&p.attributes, "method").unwrap(), p.count, p.explicit_bounds.len()))
        .collect();
    assert_eq!(per_method, [("prefill", 9, 35), ("decode", 120, 35)]);
    assert_eq!(inf.data_points[1].bucket_counts[10], 100);
    assert_eq!(inf.data_points[1].bucket_counts[15], 20);

    let Some(Data::Summary(s)) = &find(&ms, "tgi_request_skipped_tokens").data else { panic!("summary") };
    let p = &s.data_points[0];
    let q = |quantile, value| ValueAtQuantile { quantile, value };
    assert_eq!(
        p.quantile_values,
        vec![q(0.0, 0.0), q(0.5, 1.0), q(0.9, 2.0), q(0.95, 3.0), q(0.99, 3.0), q(0.999, 3.0), q(1.0, 3.0)]
    );
    assert_eq!((p.count, p.sum, p.start_time_unix_nano, p.time_unix_nano), (8, 12.0, T, T));
}

#[test]
fn golden_openmetrics() {
    let ms = convert(OPENMETRICS, Format::OpenMetrics, target("om", &[]), &[]);
    assert_eq!(
        names(&ms),
        [
            "vllm:prompt_tokens",
            "build_info",
            "engine_state",
            "request_latency_seconds",
            "temperature_celsius",
            "rpc_seconds"
        ]
    );
    let c = sum(find(&ms, "vllm:prompt_tokens"));
    assert_eq!(c.data_points.len(), 1, "the exemplar is not a sample");
    let p = &c.data_points[0];
    assert_eq!((num(p), p.start_time_unix_nano, p.time_unix_nano), (42.0, 1_700_000_000_250_000_000, T));
    assert!(p.exemplars.is_empty());

    let info = find(&ms, "build_info");
    assert_eq!(info.description, "Build information, with \"quotes\" and a \\ backslash.");
    let p = &gauge(info).data_points[0];
    assert_eq!(p.attributes, attrs(&[("version", "1.2.3"), ("path", "C:\\bin"), ("quote", "say \"hi\"")]));
    assert_eq!(num(p), 1.0);

    let states: Vec<(&str, f64)> = gauge(find(&ms, "engine_state"))
        .data_points
        .iter()
        .map(|p| (attr(&p.attributes, "engine_state").unwrap(), num(p)))
        .collect();
    assert_eq!(states, [("awake", 1.0), ("sleeping", 0.0)]);

    let lat = find(&ms, "request_latency_seconds");
    assert_eq!((lat.unit.as_str(), lat.description.as_str()), ("seconds", "Request latency."));
    assert_eq!(
        histogram(lat).data_points,
        vec![HistogramDataPoint {
            start_time_unix_nano: 1_700_000_000_000_000_000,
            time_unix_nano: T,
            count: 6,
            sum: Some(4.5),
            bucket_counts: vec![2, 3, 1],
            explicit_bounds: vec![0.1, 1.0],
            ..Default::default()
        }]
    );

    let temp = find(&ms, "temperature_celsius");
    assert_eq!(temp.unit, "celsius");
    let pts = &gauge(temp).data_points;
    assert_eq!((num(&pts[0]), pts[0].time_unix_nano), (21.5, 1_700_000_002_125_000_000), "own timestamp");
    assert!(num(&pts[1]).is_nan());
    assert_eq!((num(&pts[2]), pts[2].time_unix_nano), (f64::NEG_INFINITY, T));

    let Some(Data::Summary(s)) = &find(&ms, "rpc_seconds").data else { panic!("summary") };
    let p = &s.data_points[0];
    let qs: Vec<(f64, f64)> = p.quantile_values.iter().map(|q| (q.quantile, q.value)).collect();
    assert_eq!(qs, [(0.5, 0.2), (0.99, 0.9)], "quantiles sorted");
    assert_eq!((p.count, p.sum, p.start_time_unix_nano), (10, 3.0, 1_700_000_000_000_000_000));
}

#[test]
fn resource_and_scope_are_otelcols() {
    let expo = parse("up_like 1\n", Format::Text).unwrap();
    let mut c = Converter::new(target("vllm", &[]));
    let metrics = c.convert(&expo, T, &[]);
    let req = c.request(metrics);
    let rm = &req.resource_metrics[0];
    assert_eq!(
        rm.resource.as_ref().unwrap().attributes,
        vec![
            kv("service.name", "vllm"),
            kv("service.instance.id", "127.0.0.1:8000"),
            kv("server.address", "127.0.0.1"),
            kv("server.port", "8000"),
            kv("url.scheme", "http"),
        ]
    );
    assert_eq!(rm.scope_metrics[0].scope.as_ref().unwrap().name, SCOPE_NAME);
    assert_eq!(rm.scope_metrics[0].metrics[0].name, "up_like");
}

// ---- start times and resets ---------------------------------------------------------------

#[test]
fn resets_start_a_new_interval() {
    let text = |c: f64, n: u64, s: f64| {
        format!(
            "# TYPE reqs_total counter\nreqs_total{{a=\"1\"}} {c}\n\
             # TYPE lat histogram\nlat_bucket{{le=\"1\"}} {n}\nlat_bucket{{le=\"+Inf\"}} {n}\nlat_sum {s}\nlat_count {n}\n\
             # TYPE rpc summary\nrpc_sum {s}\nrpc_count {n}\n"
        )
    };
    let mut conv = Converter::new(target("j", &[]));
    let starts = |conv: &mut Converter, body: &str, t: u64| -> (u64, u64, u64) {
        let expo = parse(body, Format::Text).unwrap();
        let ms = conv.convert(&expo, t, &[]);
        let c = sum(find(&ms, "reqs")).data_points[0].start_time_unix_nano;
        let h = histogram(find(&ms, "lat")).data_points[0].start_time_unix_nano;
        let Some(Data::Summary(s)) = &find(&ms, "rpc").data else { panic!() };
        (c, h, s.data_points[0].start_time_unix_nano)
    };
    let (t1, t2, t3, t4) = (10_000_000_000, 20_000_000_000, 30_000_000_000, 40_000_000_000);
    assert_eq!(starts(&mut conv, &text(5.0, 3, 1.5), t1), (t1, t1, t1), "first point: start = time");
    assert_eq!(starts(&mut conv, &text(9.0, 4, 2.5), t2), (t1, t1, t1), "growth keeps the start");
    let reset = t3 - 1_000_000;
    assert_eq!(starts(&mut conv, &text(2.0, 1, 0.5), t3), (reset, reset, reset), "a drop: time - 1 ms");
    assert_eq!(starts(&mut conv, &text(3.0, 2, 0.7), t4), (reset, reset, reset));
    assert_eq!(conv.tracked_series(), 3);
}

#[test]
fn created_moves_with_a_restart() {
    let body = |v: f64, created: &str| {
        format!("# TYPE c_total counter\nc_total {v}\n# TYPE c_created gauge\nc_created {created}\n")
    };
    let mut conv = Converter::new(target("j", &[]));
    let start = |conv: &mut Converter, b: &str, t: u64| {
        let expo = parse(b, Format::Text).unwrap();
        sum(find(&conv.convert(&expo, t, &[]), "c")).data_points[0].start_time_unix_nano
    };
    assert_eq!(start(&mut conv, &body(7.0, "1.7e+09"), T), 1_700_000_000_000_000_000);
    assert_eq!(start(&mut conv, &body(1.0, "1.75e+09"), T + 1), 1_750_000_000_000_000_000);
}

// ---- the receiver -------------------------------------------------------------------------

/// The scrapes of `instance`: their metrics.
fn scrapes_of<'a>(reqs: &'a [ExportMetricsServiceRequest], instance: &str) -> Vec<&'a [Metric]> {
    reqs.iter()
        .flat_map(|r| &r.resource_metrics)
        .filter(|rm| attr(&rm.resource.as_ref().unwrap().attributes, "service.instance.id") == Some(instance))
        .map(|rm| rm.scope_metrics[0].metrics.as_slice())
        .collect()
}

/// The scrapes of `instance` that succeeded.
fn good_scrapes<'a>(reqs: &'a [ExportMetricsServiceRequest], instance: &str) -> Vec<&'a [Metric]> {
    scrapes_of(reqs, instance).into_iter().filter(|ms| up(ms) == 1.0).collect()
}

fn up(ms: &[Metric]) -> f64 {
    num(&gauge(find(ms, "up")).data_points[0])
}

async fn start_receiver(cfg: serde_json::Value) -> (Box<dyn Receiver>, Arc<Capture>, Arc<Telemetry>) {
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("prometheus").unwrap(), telemetry.clone());
    let f = PrometheusReceiverFactory;
    f.validate(&cfg).unwrap();
    let mut r = f.create(ctx, &cfg).unwrap();
    let cap = Capture::new();
    r.start(ReceiverConsumers { metrics: Some(cap.clone()), ..Default::default() }).await.unwrap();
    (r, cap, telemetry)
}

/// A port nothing listens on.
async fn dead_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_the_simulator_and_survives_a_dead_target() {
    let sim = inferwatch_sim::server::SimServer::start(inferwatch_sim::server::SimArgs {
        port: 0,
        served_model_name: vec!["sim-model".into()],
        seed: Some(7),
        ..Default::default()
    })
    .await
    .unwrap();
    let sim_addr = sim.local_addr().to_string();
    let dead = format!("127.0.0.1:{}", dead_port().await);
    let (mut r, cap, telemetry) = start_receiver(json!({"config": {"scrape_configs": [
        {"job_name": "vllm", "scrape_interval": "300ms", "static_configs": [{"targets": [sim_addr]}]},
        {"job_name": "dead", "scrape_interval": "100ms", "scrape_timeout": "100ms",
         "static_configs": [{"targets": [dead]}]},
    ]}}))
    .await;

    cap.wait_metrics("two scrapes of the simulator and three of the dead target", |reqs| {
        good_scrapes(reqs, &sim_addr).len() >= 2 && scrapes_of(reqs, &dead).len() >= 3
    })
    .await;
    let reqs = cap.metrics();
    let sim_scrapes = good_scrapes(&reqs, &sim_addr);
    let ms = sim_scrapes[1];
    let samples = num(&gauge(find(ms, "scrape_samples_scraped")).data_points[0]);
    assert!(samples > 100.0, "{samples}");
    for name in ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"] {
        let p = &gauge(find(ms, name)).data_points[0];
        assert_eq!(attr(&p.attributes, "model_name"), Some("sim-model"), "{name}");
    }
    let prompt = sum(find(ms, "vllm:prompt_tokens"));
    assert!(prompt.is_monotonic);
    let p = &prompt.data_points[0];
    assert_eq!(attr(&p.attributes, "model_name"), Some("sim-model"));
    assert!(p.start_time_unix_nano > 0 && p.start_time_unix_nano < p.time_unix_nano, "start from _created");
    let first_prompt = &sum(find(sim_scrapes[0], "vllm:prompt_tokens")).data_points[0];
    assert_eq!(first_prompt.start_time_unix_nano, p.start_time_unix_nano, "a stable start time");
    let ttft = histogram(find(ms, "vllm:time_to_first_token_seconds"));
    assert_eq!(ttft.data_points[0].explicit_bounds, TTFT);
    let info = &gauge(find(ms, "vllm:cache_config_info")).data_points[0];
    assert!(attr(&info.attributes, "num_gpu_blocks").is_some_and(|n| n.parse::<u64>().is_ok()));
    assert!(!names(ms).iter().any(|n| n.ends_with("_created")));

    let dead_scrapes = scrapes_of(&reqs, &dead);
    for ms in &dead_scrapes {
        assert_eq!(up(ms), 0.0);
        assert_eq!(names(ms), HEALTH);
    }
    assert!(SCRAPE_FAILURES.get(&telemetry, ["dead", &dead, "unreachable"]).get() >= 3);
    assert_eq!(SCRAPE_FAILURES.get(&telemetry, ["vllm", &sim_addr, "unreachable"]).get(), 0);

    let stopped = tokio::time::timeout(Duration::from_secs(5), r.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown is prompt");
    let n = cap.metrics().len();
    // Give a stopped loop the chance to misbehave: a scrape of the dead target is due within 100 ms.
    tokio::time::timeout(Duration::from_millis(300), cap.wait_metrics("nothing", |r| r.len() > n)).await.ok();
    assert_eq!(cap.metrics().len(), n, "no scrape after shutdown");
    sim.shutdown().await;
}

/// The scrape-health series, in the order every scrape has them.
const HEALTH: [&str; 5] = [
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

/// The health series of one scrape: name → (point attributes, value).
fn health(ms: &[Metric]) -> std::collections::BTreeMap<String, (Vec<(String, String)>, f64)> {
    HEALTH
        .iter()
        .map(|name| {
            let points = &gauge(find(ms, name)).data_points;
            assert_eq!(points.len(), 1, "{name}");
            let attrs = points[0]
                .attributes
                .iter()
                .map(|kv| (kv.key.clone(), attr(std::slice::from_ref(kv), &kv.key).unwrap_or_default().to_string()))
                .collect();
            (name.to_string(), (attrs, num(&points[0])))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_series_carry_their_targets_labels() {
    let fake = Arc::new(Fake::default());
    *fake.answer.lock().unwrap() = text_answer("# TYPE a gauge\na{k=\"1\"} 1\na{k=\"2\"} 2\nb 3\n");
    let addr = serve_fake(fake).await;
    let dead = format!("127.0.0.1:{}", dead_port().await);
    let (mut r, cap, _) = start_receiver(json!({"config": {"scrape_configs": [
        {"job_name": "live", "scrape_interval": "100ms", "scrape_timeout": "100ms",
         "static_configs": [{"targets": [addr], "labels": {"env": "prod"}}],
         "relabel_configs": [{"target_label": "zone", "replacement": "z1"}],
         "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": "b", "action": "drop"}]},
        {"job_name": "refused", "scrape_interval": "100ms", "scrape_timeout": "100ms",
         "static_configs": [{"targets": [dead], "labels": {"env": "dev"}}]},
    ]}}))
    .await;
    cap.wait_metrics("two scrapes of each target", |reqs| {
        good_scrapes(reqs, &addr).len() >= 2 && scrapes_of(reqs, &dead).len() >= 2
    })
    .await;
    r.shutdown().await;
    let reqs = cap.metrics();
    let job_of = |instance: &str| -> Vec<String> {
        reqs.iter()
            .flat_map(|r| &r.resource_metrics)
            .map(|rm| &rm.resource.as_ref().unwrap().attributes)
            .filter(|a| attr(a, "service.instance.id") == Some(instance))
            .map(|a| attr(a, "service.name").unwrap_or_default().to_string())
            .collect()
    };
    assert!(job_of(&addr).iter().all(|j| j == "live"), "{:?}", job_of(&addr));
    assert!(job_of(&dead).iter().all(|j| j == "refused"), "{:?}", job_of(&dead));
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    let live = good_scrapes(&reqs, &addr);
    let (first, second) = (health(live[0]), health(live[1]));
    for (name, (attrs, _)) in first.iter().chain(&second) {
        assert_eq!(attrs, &vec![s("env", "prod"), s("zone", "z1")], "{name}");
    }
    assert_eq!(first["scrape_samples_scraped"].1, 3.0);
    assert_eq!(first["scrape_samples_post_metric_relabeling"].1, 2.0, "b is dropped");
    assert_eq!(first["scrape_series_added"].1, 2.0, "the first scrape adds every kept series");
    assert_eq!(second["scrape_series_added"].1, 0.0, "the same series again");
    let p = &gauge(find(live[0], "a")).data_points[0];
    assert_eq!(attr(&p.attributes, "env"), Some("prod"), "scraped points have the same target labels");
    for ms in scrapes_of(&reqs, &dead) {
        assert_eq!(names(ms), HEALTH, "a refused scrape has the health series only");
        let h = health(ms);
        assert_eq!(h["up"].1, 0.0);
        for (name, (attrs, v)) in &h {
            assert_eq!(attrs, &vec![s("env", "dev")], "{name}");
            if name != "scrape_duration_seconds" && name != "up" {
                assert_eq!(*v, 0.0, "{name}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_url_carries_the_scrapes() {
    // The "proxy" answers any absolute-form GET of /metrics; the target itself does not exist.
    let proxy = Arc::new(Fake::default());
    *proxy.answer.lock().unwrap() = text_answer("through_proxy 1\n");
    let proxy_addr = serve_fake(proxy.clone()).await;
    let target = format!("127.0.0.1:{}", dead_port().await);
    let (mut r, cap, _) = start_receiver(json!({"config": {"scrape_configs": [{"job_name": "p",
        "scrape_interval": "250ms", "proxy_url": format!("http://{proxy_addr}"), "no_proxy": "10.0.0.0/8",
        "static_configs": [{"targets": [target]}]}]}}))
    .await;
    cap.wait_metrics("a scrape through the proxy", |reqs| !good_scrapes(reqs, &target).is_empty()).await;
    r.shutdown().await;
    let reqs = cap.metrics();
    assert_eq!(num(&gauge(find(good_scrapes(&reqs, &target)[0], "through_proxy")).data_points[0]), 1.0);
}

/// A fake exporter whose answer the test sets; it records what scrapers ask.
#[derive(Default)]
struct Fake {
    answer: Mutex<(u16, String, String)>,
    info_hits: AtomicUsize,
    accept: Mutex<Vec<String>>,
    queries: Mutex<Vec<String>>,
}

async fn fake_metrics(State(f): State<Arc<Fake>>, headers: HeaderMap, req: Request) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    f.accept.lock().unwrap().push(accept);
    f.queries.lock().unwrap().push(req.uri().query().unwrap_or_default().to_string());
    let (status, ct, body) = f.answer.lock().unwrap().clone();
    (StatusCode::from_u16(status).unwrap(), [(header::CONTENT_TYPE, ct)], body)
}

async fn fake_info(State(f): State<Arc<Fake>>) -> impl IntoResponse {
    f.info_hits.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({"model_id": "bigscience/bloom-560m", "model_sha": "x", "max_total_tokens": 2048}))
}

async fn serve_fake(f: Arc<Fake>) -> String {
    let app = Router::new()
        .route("/metrics", get(fake_metrics))
        .route("/info", get(fake_info))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late 1\n"
            }),
        )
        .with_state(f);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn text_answer(body: &str) -> (u16, String, String) {
    (200, "text/plain; version=0.0.4; charset=utf-8".into(), body.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgi_targets_get_their_model_from_info() {
    let fake = Arc::new(Fake::default());
    *fake.answer.lock().unwrap() = text_answer(TGI);
    let addr = serve_fake(fake.clone()).await;
    let (mut r, cap, _) = start_receiver(json!({"config": {"scrape_configs": [{"job_name": "tgi",
        "scrape_interval": "250ms", "params": {"format": ["prometheus"]},
        "static_configs": [{"targets": [addr]}]}]}}))
    .await;
    cap.wait_metrics("three scrapes", |reqs| good_scrapes(reqs, &addr).len() >= 3).await;
    r.shutdown().await;
    let reqs = cap.metrics();
    for ms in good_scrapes(&reqs, &addr) {
        let p = &sum(find(ms, "tgi_request_count")).data_points[0];
        assert_eq!(attr(&p.attributes, "model_name"), Some("bigscience/bloom-560m"));
        let h = &histogram(find(ms, "tgi_request_duration")).data_points[0];
        assert_eq!(attr(&h.attributes, "model_name"), Some("bigscience/bloom-560m"));
    }
    // Asked once, then cached (a failed scrape, unlikely here, would clear the cache).
    let failed = scrapes_of(&reqs, &addr).len() - good_scrapes(&reqs, &addr).len();
    let hits = fake.info_hits.load(Ordering::SeqCst);
    assert!(hits >= 1 && hits <= 1 + failed, "{hits} /info requests for {failed} failed scrapes");
    assert!(fake.accept.lock().unwrap().iter().all(|a| a == ACCEPT));
    assert!(fake.queries.lock().unwrap().iter().all(|q| q == "format=prometheus"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_tgi_model_wins() {
    let fake = Arc::new(Fake::default());
    *fake.answer.lock().unwrap() = text_answer(TGI);
    let addr = serve_fake(fake.clone()).await;
    let (mut r, cap, _) = start_receiver(json!({"config": {"scrape_configs": [{"job_name": "tgi",
        "scrape_interval": "250ms", "static_configs": [{"targets": [addr]}]}]}, "tgi": {"model": "my-model"}}))
    .await;
    cap.wait_metrics("two scrapes", |reqs| good_scrapes(reqs, &addr).len() >= 2).await;
    r.shutdown().await;
    let reqs = cap.metrics();
    let ms = good_scrapes(&reqs, &addr)[1];
    let p = &sum(find(ms, "tgi_request_success")).data_points[0];
    assert_eq!(attr(&p.attributes, "model_name"), Some("my-model"));
    assert_eq!(fake.info_hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_by_reason_and_scraping_goes_on() {
    let fake = Arc::new(Fake::default());
    *fake.answer.lock().unwrap() = (500, "text/plain".into(), "oops".into());
    let addr = serve_fake(fake.clone()).await;
    let (mut r, cap, telemetry) = start_receiver(json!({"config": {"scrape_configs": [{"job_name": "j",
        "scrape_interval": "250ms", "static_configs": [{"targets": [addr]}]}]}}))
    .await;
    let failures = |reason: &str| SCRAPE_FAILURES.get(&telemetry, ["j", &addr, reason]).get();
    cap.wait_metrics("an HTTP 500", |_| failures("http_status") >= 1).await;

    *fake.answer.lock().unwrap() = text_answer("ok 1\nbroken{ 2\n");
    cap.wait_metrics("a parse failure", |_| failures("parse") >= 1).await;

    *fake.answer.lock().unwrap() = text_answer("# TYPE c_total counter\nc_total 3\n");
    cap.wait_metrics("a good scrape after the failures", |reqs| {
        scrapes_of(reqs, &addr).last().is_some_and(|ms| up(ms) == 1.0)
    })
    .await;
    r.shutdown().await;
    let reqs = cap.metrics();
    let scrapes = scrapes_of(&reqs, &addr);
    assert!(scrapes.iter().any(|ms| up(ms) == 0.0));
    let last = scrapes.last().unwrap();
    assert_eq!(num(&sum(find(last, "c")).data_points[0]), 3.0);
    assert_eq!(failures("unreachable"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_limits_size_and_time() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Arc::new(Fake::default());
    *fake.answer.lock().unwrap() =
        (200, "application/openmetrics-text; version=1.0.0".into(), "x 1\n".repeat(1000) + "# EOF\n");
    let addr = serve_fake(fake.clone()).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url: reqwest::Url = format!("http://{addr}/metrics").parse().unwrap();
    let (body, format) = fetch(&client, &url, Duration::from_secs(5), 1 << 20).await.unwrap();
    assert_eq!((body.len(), format), (4006, Format::OpenMetrics));
    let e = fetch(&client, &url, Duration::from_secs(5), 1000).await.unwrap_err();
    assert!(matches!(e, ScrapeError::TooLarge { .. }), "{e}");
    assert_eq!(e.reason(), "too_large");
    let slow: reqwest::Url = format!("http://{addr}/slow").parse().unwrap();
    let e = fetch(&client, &slow, Duration::from_millis(100), 1 << 20).await.unwrap_err();
    assert_eq!(e.reason(), "timeout", "{e}");
    let missing: reqwest::Url = format!("http://{addr}/nope").parse().unwrap();
    let e = fetch(&client, &missing, Duration::from_secs(5), 1 << 20).await.unwrap_err();
    assert!(matches!(e, ScrapeError::HttpStatus { status: 404, .. }), "{e}");
}
