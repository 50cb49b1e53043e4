//! Synthetic vLLM-like telemetry for the Arrow benchmarks: scraped gauges per series and
//! `llm_request` spans with the gen_ai attributes vLLM sets.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span::SpanKind};

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

const METRICS: [&str; 8] = [
    "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prefix_cache_hit_rate",
    "llm.ttft.p95",
    "llm.tpot.p95",
    "llm.e2e.p99",
    "llm.queue.p99",
];

/// Start of the synthetic data (2026-01-01T00:00:00Z) in ns.
pub const T0: u64 = 1_767_225_600_000_000_000;

/// One metrics request per step: `series` series (8 metrics × series/8 instances), one point each,
/// `steps_per_request` consecutive 1 s steps per request.
pub fn metrics_requests(points: usize, series: usize, steps_per_request: usize) -> Vec<ExportMetricsServiceRequest> {
    let instances = series.div_ceil(METRICS.len()).max(1);
    let steps = points.div_ceil(instances * METRICS.len());
    let mut out = Vec::new();
    let mut step = 0;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while step < steps {
        let upto = (step + steps_per_request).min(steps);
        let mut rms = Vec::with_capacity(instances);
        for inst in 0..instances {
            let resource = Resource {
                attributes: vec![
                    kv("service.name", s("vllm")),
                    kv("service.version", s("0.11.0")),
                    kv("service.instance.id", s(&format!("pod-{inst}"))),
                    kv("host.name", s(&format!("node-{}", inst / 4))),
                ],
                ..Default::default()
            };
            let metrics = METRICS
                .iter()
                .map(|name| {
                    let points = (step..upto)
                        .map(|k| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let t = T0 + k as u64 * 1_000_000_000;
                            NumberDataPoint {
                                attributes: vec![kv("model_name", s("llama-3-8b")), kv("engine", s("0"))],
                                start_time_unix_nano: T0,
                                time_unix_nano: t,
                                value: Some(number_data_point::Value::AsDouble((x % 10_000) as f64 / 1000.0)),
                                ..Default::default()
                            }
                        })
                        .collect();
                    Metric {
                        name: (*name).into(),
                        unit: "s".into(),
                        data: Some(Data::Gauge(Gauge { data_points: points })),
                        ..Default::default()
                    }
                })
                .collect();
            rms.push(ResourceMetrics {
                resource: Some(resource),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope { name: "prometheus".into(), ..Default::default() }),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        out.push(ExportMetricsServiceRequest { resource_metrics: rms });
        step = upto;
    }
    out
}

/// `requests` requests of `batch` vLLM `llm_request` spans each.
pub fn span_requests(requests: usize, batch: usize) -> Vec<ExportTraceServiceRequest> {
    (0..requests)
        .map(|r| {
            let spans = (0..batch)
                .map(|i| {
                    let n = (r * batch + i) as u64;
                    let start = T0 + n * 10_000_000;
                    let mut trace_id = [0u8; 16];
                    trace_id[..8].copy_from_slice(&n.to_be_bytes());
                    trace_id[8] = 1;
                    Span {
                        trace_id: trace_id.to_vec(),
                        span_id: (n + 1).to_be_bytes().to_vec(),
                        name: "llm_request".into(),
                        kind: SpanKind::Server as i32,
                        start_time_unix_nano: start,
                        end_time_unix_nano: start + 800_000_000,
                        attributes: vec![
                            kv("gen_ai.request.id", s(&format!("cmpl-{n}"))),
                            kv("gen_ai.usage.prompt_tokens", Value::IntValue(512)),
                            kv("gen_ai.usage.completion_tokens", Value::IntValue(128)),
                            kv("gen_ai.latency.time_to_first_token", Value::DoubleValue(0.05 + (n % 7) as f64 * 0.01)),
                            kv("gen_ai.latency.e2e", Value::DoubleValue(0.8)),
                            kv("gen_ai.latency.time_in_queue", Value::DoubleValue(0.002)),
                            kv("gen_ai.latency.time_in_model_prefill", Value::DoubleValue(0.04)),
                            kv("gen_ai.latency.time_in_model_decode", Value::DoubleValue(0.75)),
                            kv("gen_ai.latency.time_in_model_inference", Value::DoubleValue(0.79)),
                            kv("gen_ai.request.max_tokens", Value::IntValue(256)),
                            kv("gen_ai.request.temperature", Value::DoubleValue(0.7)),
                            kv("gen_ai.request.top_p", Value::DoubleValue(0.95)),
                        ],
                        ..Default::default()
                    }
                })
                .collect();
            ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(Resource {
                        attributes: vec![kv("service.name", s("vllm")), kv("service.version", s("0.11.0"))],
                        ..Default::default()
                    }),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(InstrumentationScope { name: "vllm.llm_engine".into(), ..Default::default() }),
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            }
        })
        .collect()
}
