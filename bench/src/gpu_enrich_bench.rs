//! `gpu-enrich-bench`: join throughput of the `gpu_enrich` processor (spans/s) next to a
//! pass-through processor on the same decoded spans, and the ingest rate of GPU samples. Prints
//! one JSON document. See bench/README.md.

use async_trait::async_trait;
use clap::Parser;
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::gpu_enrich::GpuEnrich;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "gpu-enrich-bench", about = "gpu_enrich join throughput against pass-through")]
struct Cli {
    /// Spans joined per repetition.
    #[arg(long, default_value_t = 262_144)]
    spans: usize,
    /// Spans per payload.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// GPUs on the host (all serve the spans).
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Milliseconds between GPU samples (the nvml receiver's default is 200).
    #[arg(long, default_value_t = 200)]
    sample_ms: u64,
    /// Seconds of event time the spans cover.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Repetitions (the best time is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

const MS: u64 = 1_000_000;
const BASE: u64 = 1_700_000_000_000 * MS;
const HOST: &str = "node1";

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

/// Counts the spans it receives.
#[derive(Default)]
struct Count(AtomicU64);

#[async_trait]
impl Consumer for Count {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.fetch_add(data.item_count() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// A processor that forwards payloads untouched.
struct PassThrough(ConsumerRef);

#[async_trait]
impl Consumer for PassThrough {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.consume(data).await
    }
}

/// GPU samples of every GPU every `sample_ms` over `seconds` (+ 2 s): memory, utilisation, power, throttle.
fn samples(cli: &Cli) -> Vec<Payload> {
    let steps = (cli.seconds + 2) * 1000 / cli.sample_ms.max(1);
    (0..steps)
        .map(|k| {
            let ts = BASE + k * cli.sample_ms * MS;
            let metrics = [("hw.gpu.memory.usage", 1e9), ("hw.gpu.utilization", 1e-3), ("hw.power", 0.1)]
                .into_iter()
                .map(|(name, scale)| Metric {
                    name: name.into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: (0..cli.gpus)
                            .map(|g| NumberDataPoint {
                                attributes: vec![
                                    kv("gpu.index", Value::IntValue(g as i64)),
                                    kv("gpu.uuid", Value::StringValue(format!("GPU-{g:08x}"))),
                                ],
                                time_unix_nano: ts,
                                value: Some(number_data_point::Value::AsDouble(((k + g as u64) % 997) as f64 * scale)),
                                ..Default::default()
                            })
                            .collect(),
                    })),
                    ..Default::default()
                })
                .collect();
            Payload::Metrics(ExportMetricsServiceRequest {
                resource_metrics: vec![ResourceMetrics {
                    resource: Some(Resource {
                        attributes: vec![kv("host.name", Value::StringValue(HOST.into()))],
                        ..Default::default()
                    }),
                    scope_metrics: vec![ScopeMetrics { metrics, ..Default::default() }],
                    ..Default::default()
                }],
            })
        })
        .collect()
}

/// vLLM-like request spans ending uniformly over the covered event time.
fn spans(cli: &Cli) -> Vec<Payload> {
    let step = cli.seconds * 1000 * MS / cli.spans.max(1) as u64;
    (0..cli.spans)
        .collect::<Vec<_>>()
        .chunks(cli.batch.max(1))
        .map(|chunk| {
            let spans = chunk
                .iter()
                .map(|&n| {
                    let end = BASE + 2000 * MS + n as u64 * step;
                    Span {
                        trace_id: (n as u128).to_be_bytes().to_vec(),
                        span_id: (n as u64).to_be_bytes().to_vec(),
                        name: "llm_request".into(),
                        start_time_unix_nano: end - 800 * MS,
                        end_time_unix_nano: end,
                        attributes: vec![
                            kv("gen_ai.request.model", Value::StringValue("llama-3-8b".into())),
                            kv("gen_ai.usage.input_tokens", Value::IntValue(512)),
                            kv("gen_ai.usage.output_tokens", Value::IntValue(128)),
                            kv("gen_ai.server.time_to_first_token", Value::DoubleValue(0.12)),
                        ],
                        ..Default::default()
                    }
                })
                .collect();
            Payload::Traces(ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(Resource {
                        attributes: vec![
                            kv("service.name", Value::StringValue("vllm".into())),
                            kv("host.name", Value::StringValue(HOST.into())),
                        ],
                        ..Default::default()
                    }),
                    scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
                    ..Default::default()
                }],
            })
        })
        .collect()
}

/// Best time of `reps` runs of `payloads` through `head` (fresh copies each run, cloned untimed).
async fn best(head: &ConsumerRef, payloads: &[Payload], reps: usize) -> anyhow::Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..reps.max(1) {
        let copies = payloads.to_vec();
        let t0 = Instant::now();
        for p in copies {
            head.consume(p).await?;
        }
        best = best.min(t0.elapsed());
    }
    Ok(best)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let ctx = CreateContext::new(ComponentId::parse("gpu_enrich")?, Arc::new(Telemetry::new()));
        let cfg = json!({"host_name": HOST, "max_samples_per_gpu": 8192});
        let sink_m: ConsumerRef = Arc::new(Count::default());
        let metrics_node = GpuEnrich::build(&ctx, &cfg, Signal::Metrics, sink_m, None)?;
        let sample_payloads = samples(&cli);
        let n_samples: usize = sample_payloads.iter().map(Payload::item_count).sum();
        let t0 = Instant::now();
        for p in sample_payloads {
            metrics_node.consume(p).await?;
        }
        let ingest = t0.elapsed();

        let span_payloads = spans(&cli);
        let n_spans: usize = span_payloads.iter().map(Payload::item_count).sum();
        let sink_e = Arc::new(Count::default());
        let enrich: ConsumerRef = GpuEnrich::build(&ctx, &cfg, Signal::Traces, sink_e.clone(), None)?;
        let sink_p = Arc::new(Count::default());
        let pass: ConsumerRef = Arc::new(PassThrough(sink_p.clone()));
        let t_pass = best(&pass, &span_payloads, cli.reps).await?;
        let t_enrich = best(&enrich, &span_payloads, cli.reps).await?;
        let counts = &metrics_node.shared().counts;
        let rate = |d: Duration| n_spans as f64 / d.as_secs_f64().max(1e-9);
        let out = json!({
            "spans": n_spans,
            "gpus": cli.gpus,
            "gpu_samples": n_samples,
            "samples_per_gpu_and_measurement": n_samples / (3 * cli.gpus.max(1)),
            "ingest_samples_per_s": n_samples as f64 / ingest.as_secs_f64().max(1e-9),
            "pass_through_spans_per_s": rate(t_pass),
            "gpu_enrich_spans_per_s": rate(t_enrich),
            "time_ratio_enrich_vs_pass_through": t_enrich.as_secs_f64() / t_pass.as_secs_f64().max(1e-12),
            "join_ns_per_span": t_enrich.saturating_sub(t_pass).as_nanos() as f64 / n_spans.max(1) as f64,
            "spans_enriched": counts.matched(Signal::Traces),
            "spans_unmatched": counts.unmatched(Signal::Traces),
            "delivered_over_all_reps": [sink_p.0.load(Ordering::Relaxed), sink_e.0.load(Ordering::Relaxed)],
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        anyhow::Ok(())
    })
}
