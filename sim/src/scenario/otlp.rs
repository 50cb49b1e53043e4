//! What an instance would have emitted, as OTLP: `llm_request` spans with vLLM V1's
//! attributes, and the scraped `vllm:*` metrics converted the way a Prometheus receiver
//! converts them (counters → cumulative monotonic sums, gauges → gauges, histograms →
//! cumulative histograms, labels `model_name` and `engine`).

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram as OtlpHistogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};

use super::histo::{
    Histogram, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, PARAMS_N_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS,
    buckets_1_2_5,
};
use crate::engine::tokens::mix64;
use crate::engine::{Engine, EngineStats, FinishReason, RequestRecord, StepInfo};

/// Instrumentation scope of vLLM's tracer.
pub const TRACE_SCOPE: &str = "vllm.llm_engine";
/// Instrumentation scope the otelcol Prometheus receiver puts on scraped metrics.
pub const SCRAPE_SCOPE: &str = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver";

/// A string attribute.
pub fn kv_str(key: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        key_strindex: 0,
    }
}

/// An integer attribute.
pub fn kv_int(key: &str, v: i64) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }), key_strindex: 0 }
}

/// A double attribute.
pub fn kv_f64(key: &str, v: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }),
        key_strindex: 0,
    }
}

/// Identity of one simulated instance in its telemetry.
#[derive(Clone, Debug)]
pub struct InstanceIdentity {
    /// `service.name`.
    pub service_name: String,
    /// `service.instance.id`.
    pub instance: String,
    /// `model_name` label.
    pub model_name: String,
    /// Scenario name (`sim.scenario` resource attribute).
    pub scenario: String,
    /// Seed used for trace / span ids.
    pub seed: u64,
    /// Stream of the instance (ids differ between instances).
    pub stream: u64,
}

impl InstanceIdentity {
    /// The resource of this instance at this version.
    pub fn resource(&self, version: &str) -> Resource {
        Resource {
            attributes: vec![
                kv_str("service.name", self.service_name.clone()),
                kv_str("service.instance.id", self.instance.clone()),
                kv_str("service.version", version),
                kv_str("sim.scenario", self.scenario.clone()),
            ],
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        }
    }
}

/// The external request id (equal across mirrored instances).
pub fn request_id(seed: u64, id: u64) -> String {
    format!("cmpl-{:016x}", mix64(seed ^ mix64(id)))
}

/// The `llm_request` SERVER span of a finished request, as vLLM V1 emits it.
pub fn request_span(who: &InstanceIdentity, start_unix_ns: u64, r: &RequestRecord) -> Span {
    let h1 = mix64(who.seed ^ mix64(r.id ^ (who.stream << 56)));
    let h2 = mix64(h1 ^ 0x5EED);
    let h3 = mix64(h2 ^ 0x5EED);
    let mut trace_id = Vec::with_capacity(16);
    trace_id.extend_from_slice(&h1.to_be_bytes());
    trace_id.extend_from_slice(&h2.to_be_bytes());
    let span_id = h3.max(1).to_be_bytes().to_vec();
    let mut attributes = vec![
        kv_str("gen_ai.request.id", request_id(who.seed, r.id)),
        kv_int("gen_ai.usage.prompt_tokens", i64::from(r.prompt_tokens)),
        kv_int("gen_ai.usage.completion_tokens", i64::from(r.completion_tokens)),
        kv_f64("gen_ai.latency.time_to_first_token", r.ttft_s()),
        kv_f64("gen_ai.latency.e2e", r.e2e_s()),
        kv_f64("gen_ai.latency.time_in_queue", r.queue_s()),
        kv_f64("gen_ai.latency.time_in_model_prefill", r.prefill_s()),
        kv_f64("gen_ai.latency.time_in_model_decode", r.decode_s()),
        kv_f64("gen_ai.latency.time_in_model_inference", r.inference_s()),
        kv_int("gen_ai.request.max_tokens", i64::from(r.max_tokens)),
        kv_int("gen_ai.request.n", 1),
    ];
    attributes.push(kv_str("gen_ai.response.finish_reasons", format!("[\"{}\"]", r.finish_reason.as_str())));
    let status = if r.finish_reason == FinishReason::Error {
        Some(Status { message: "engine error".into(), code: status::StatusCode::Error as i32 })
    } else {
        None
    };
    Span {
        trace_id,
        span_id,
        trace_state: String::new(),
        parent_span_id: Vec::new(),
        flags: 0,
        name: "llm_request".into(),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start_unix_ns + r.arrival,
        end_time_unix_nano: start_unix_ns + r.finished,
        attributes,
        dropped_attributes_count: 0,
        events: Vec::new(),
        dropped_events_count: 0,
        links: Vec::new(),
        dropped_links_count: 0,
        status,
    }
}

/// The spans of one instance in one export.
pub fn resource_spans(who: &InstanceIdentity, version: &str, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(who.resource(version)),
        scope_spans: vec![ScopeSpans {
            scope: Some(InstrumentationScope { name: TRACE_SCOPE.into(), ..Default::default() }),
            spans,
            schema_url: String::new(),
        }],
        schema_url: String::new(),
    }
}

/// The histograms and counter baselines behind one instance's `/metrics`.
#[derive(Clone, Debug)]
pub struct VllmMetrics {
    hist: Vec<(&'static str, Histogram)>,
    baseline: EngineStats,
    /// Process start (cumulative start time), Unix ns.
    pub start_unix_ns: u64,
    last_util: Option<(u64, f64, u64)>,
}

const H_TTFT: usize = 0;
const H_ITL: usize = 1;
const H_TPOT: usize = 2;
const H_E2E: usize = 3;
const H_QUEUE: usize = 4;
const H_PREFILL: usize = 5;
const H_DECODE: usize = 6;
const H_INFERENCE: usize = 7;
const H_PROMPT: usize = 8;
const H_GEN: usize = 9;
const H_MAX_GEN: usize = 10;
const H_MAX_TOKENS: usize = 11;
const H_N: usize = 12;
const H_KV_COMPUTED: usize = 13;
const H_ITER: usize = 14;

impl VllmMetrics {
    /// Empty metrics for an engine with this `max_model_len`, started at `start_unix_ns`.
    pub fn new(max_model_len: u32, start_unix_ns: u64) -> Self {
        let tok = buckets_1_2_5(max_model_len);
        let hist = vec![
            ("vllm:time_to_first_token_seconds", Histogram::new(TTFT_BUCKETS)),
            ("vllm:inter_token_latency_seconds", Histogram::new(ITL_BUCKETS)),
            ("vllm:request_time_per_output_token_seconds", Histogram::new(ITL_BUCKETS)),
            ("vllm:e2e_request_latency_seconds", Histogram::new(REQUEST_LATENCY_BUCKETS)),
            ("vllm:request_queue_time_seconds", Histogram::new(REQUEST_LATENCY_BUCKETS)),
            ("vllm:request_prefill_time_seconds", Histogram::new(REQUEST_LATENCY_BUCKETS)),
            ("vllm:request_decode_time_seconds", Histogram::new(REQUEST_LATENCY_BUCKETS)),
            ("vllm:request_inference_time_seconds", Histogram::new(REQUEST_LATENCY_BUCKETS)),
            ("vllm:request_prompt_tokens", Histogram::new(&tok)),
            ("vllm:request_generation_tokens", Histogram::new(&tok)),
            ("vllm:request_max_num_generation_tokens", Histogram::new(&tok)),
            ("vllm:request_params_max_tokens", Histogram::new(&tok)),
            ("vllm:request_params_n", Histogram::new(PARAMS_N_BUCKETS)),
            ("vllm:request_prefill_kv_computed_tokens", Histogram::new(&tok)),
            ("vllm:iteration_tokens_total", Histogram::new(ITERATION_TOKENS_BUCKETS)),
        ];
        VllmMetrics { hist, baseline: EngineStats::default(), start_unix_ns, last_util: Some((start_unix_ns, 0.0, 0)) }
    }

    /// Records a finished request in the per-request histograms.
    pub fn observe_record(&mut self, r: &RequestRecord) {
        let h = &mut self.hist;
        if r.first_token.is_some() {
            h[H_TTFT].1.observe(r.ttft_s());
        }
        if r.completion_tokens >= 2 {
            h[H_TPOT].1.observe(r.tpot_s());
        }
        h[H_E2E].1.observe(r.e2e_s());
        h[H_QUEUE].1.observe(r.queue_s());
        if r.scheduled.is_some() {
            h[H_PREFILL].1.observe(r.prefill_s());
            h[H_DECODE].1.observe(r.decode_s());
            h[H_INFERENCE].1.observe(r.inference_s());
        }
        h[H_PROMPT].1.observe(f64::from(r.prompt_tokens));
        h[H_GEN].1.observe(f64::from(r.completion_tokens));
        h[H_MAX_GEN].1.observe(f64::from(r.max_tokens));
        h[H_MAX_TOKENS].1.observe(f64::from(r.max_tokens));
        h[H_N].1.observe(1.0);
        h[H_KV_COMPUTED].1.observe(f64::from(r.prefill_kv_computed_tokens()));
    }

    /// Records an engine step (iteration tokens; one ITL per decoding sequence).
    pub fn observe_step(&mut self, s: &StepInfo) {
        self.hist[H_ITER].1.observe(f64::from(s.num_tokens));
        self.hist[H_ITL].1.observe_n((s.end - s.start) as f64 / 1e9, u64::from(s.decode_seqs));
    }

    /// A process restart: counters and histograms start again from zero at `start_unix_ns`.
    pub fn reset(&mut self, stats: &EngineStats, start_unix_ns: u64) {
        self.baseline = stats.clone();
        self.start_unix_ns = start_unix_ns;
        self.rebase_util(stats, start_unix_ns);
        for (_, h) in &mut self.hist {
            h.reset();
        }
    }

    /// Restarts the GPU-utilisation averaging at `t_unix_ns` (after a simulated gap).
    pub fn rebase_util(&mut self, stats: &EngineStats, t_unix_ns: u64) {
        self.last_util = Some((t_unix_ns, stats.util_ns, stats.busy_ns));
    }

    /// The metrics of this instance scraped at `t_unix_ns`.
    pub fn scrape(&mut self, who: &InstanceIdentity, engine: &Engine, t_unix_ns: u64) -> ResourceMetrics {
        let cfg = engine.config();
        let labels = || vec![kv_str("model_name", who.model_name.clone()), kv_str("engine", "0")];
        let start = self.start_unix_ns.min(t_unix_ns);
        let gauge = |name: &str, v: f64, attrs: Vec<KeyValue>| Metric {
            name: name.into(),
            data: Some(metric::Data::Gauge(Gauge { data_points: vec![number(attrs, 0, t_unix_ns, v)] })),
            ..Default::default()
        };
        let counter = |name: &str, points: Vec<NumberDataPoint>| Metric {
            name: name.into(),
            data: Some(metric::Data::Sum(Sum {
                data_points: points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let s = engine.stats();
        let b = &self.baseline;
        let c = |now: u64, base: u64| now.saturating_sub(base) as f64;
        let mut metrics = vec![
            gauge("vllm:num_requests_running", engine.num_running() as f64, labels()),
            gauge("vllm:num_requests_waiting", engine.num_waiting() as f64, labels()),
            gauge("vllm:kv_cache_usage_perc", engine.kv_usage(), labels()),
        ];
        let mut info = labels();
        info.retain(|kv| kv.key == "engine");
        info.extend([
            kv_str("block_size", cfg.block_size.to_string()),
            kv_str("num_gpu_blocks", cfg.num_gpu_blocks().to_string()),
            kv_str("gpu_memory_utilization", cfg.gpu_memory_utilization.to_string()),
            kv_str("cache_dtype", "auto"),
            kv_str("enable_prefix_caching", if cfg.enable_prefix_caching { "True" } else { "False" }),
        ]);
        metrics.push(gauge("vllm:cache_config_info", 1.0, info));
        for (name, now, base) in [
            ("vllm:prompt_tokens_total", s.prompt_tokens, b.prompt_tokens),
            ("vllm:generation_tokens_total", s.generation_tokens, b.generation_tokens),
            ("vllm:num_preemptions_total", s.preemptions, b.preemptions),
            ("vllm:prefix_cache_queries_total", s.prefix_queries, b.prefix_queries),
            ("vllm:prefix_cache_hits_total", s.prefix_hits, b.prefix_hits),
        ] {
            metrics.push(counter(name, vec![number(labels(), start, t_unix_ns, c(now, base))]));
        }
        let success = FinishReason::ALL
            .iter()
            .map(|r| {
                let mut a = labels();
                a.push(kv_str("finished_reason", r.as_str()));
                number(a, start, t_unix_ns, c(s.finished[r.index()], b.finished[r.index()]))
            })
            .collect();
        metrics.push(counter("vllm:request_success_total", success));
        for (name, h) in &self.hist {
            metrics.push(Metric {
                name: (*name).into(),
                data: Some(metric::Data::Histogram(OtlpHistogram {
                    data_points: vec![HistogramDataPoint {
                        attributes: labels(),
                        start_time_unix_nano: start,
                        time_unix_nano: t_unix_ns,
                        count: h.count,
                        sum: Some(h.sum),
                        bucket_counts: h.counts.clone(),
                        explicit_bounds: h.bounds.clone(),
                        ..Default::default()
                    }],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                })),
                ..Default::default()
            });
        }
        // GPU view (what an NVML receiver beside it would report) and the allocator's state
        let gpu = vec![kv_str("hw.id", "gpu-0"), kv_str("hw.type", "gpu"), kv_str("hw.model", cfg.gpu().name.clone())];
        let util = match self.last_util {
            Some((t0, u0, b0)) if t_unix_ns > t0 => {
                let busy = s.busy_ns.saturating_sub(b0) as f64;
                let dt = (t_unix_ns - t0) as f64;
                if busy > 0.0 { ((s.util_ns - u0) / dt).clamp(0.0, 1.0) } else { 0.0 }
            }
            _ => 0.0,
        };
        self.last_util = Some((t_unix_ns, s.util_ns, s.busy_ns));
        metrics.push(gauge("hw.gpu.utilization", util, gpu.clone()));
        metrics.push(gauge("hw.gpu.memory.usage", engine.vram_used_bytes().round(), gpu.clone()));
        metrics.push(gauge("hw.gpu.memory.limit", (cfg.gpu().memory_gib * 1073741824.0).round(), gpu));
        metrics.push(gauge("sim:kv_cache_fragmentation", engine.kv_snapshot().fragmentation, labels()));
        ResourceMetrics {
            resource: Some(who.resource(engine.version())),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope { name: SCRAPE_SCOPE.into(), ..Default::default() }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }
}

fn number(attributes: Vec<KeyValue>, start: u64, t: u64, v: f64) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: t,
        exemplars: Vec::new(),
        flags: 0,
        value: Some(number_data_point::Value::AsDouble(v)),
    }
}

/// Fields that keep their value even when it is the default (oneof members and optional
/// fields whose presence carries meaning).
const KEEP: &[&str] = &[
    "asDouble",
    "asInt",
    "stringValue",
    "intValue",
    "doubleValue",
    "boolValue",
    "sum",
    "count",
    "bucketCounts",
    "value",
];

/// Drops object fields holding default values (`""`, `0`, `"0"`, `false`, `[]`, `{}`), as
/// OTLP/JSON allows, to keep the JSON lines small; oneof members and `sum` / `count` stay.
pub fn compact(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            map.retain(|k, val| {
                compact(val);
                if KEEP.contains(&k.as_str()) {
                    return true;
                }
                !match val {
                    Value::Null => true,
                    Value::Bool(b) => !*b,
                    Value::Number(n) => n.as_f64() == Some(0.0),
                    Value::String(s) => s.is_empty() || s == "0",
                    Value::Array(a) => a.is_empty(),
                    Value::Object(o) => o.is_empty(),
                }
            });
        }
        Value::Array(a) => a.iter_mut().for_each(compact),
        _ => {}
    }
}
