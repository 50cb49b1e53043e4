//! `arrow-bench`: the cost of the Arrow data plane, measured in one process against the floor of
//! merely decoding the same OTLP protobuf. See bench/README.md ("Arrow plane").

mod arrow;

use anyhow::Context;
use arrow::data;
use async_trait::async_trait;
use clap::{Parser, Subcommand};
use inferwatch_core::arrow::stage::{ArrowStage, StageContext};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Parser)]
#[command(name = "arrow-bench", about = "Arrow data plane benchmarks (ratios against OTLP decode)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// OTLP → Arrow → OTLP conversion of metrics and spans, next to protobuf decode.
    Convert {
        /// Metric data points.
        #[arg(long, default_value_t = 1_000_000)]
        points: usize,
        /// Spans.
        #[arg(long, default_value_t = 262_144)]
        spans: usize,
        /// Repetitions (the best is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// Replay-style throughput through the window_stats processor, next to protobuf decode.
    WindowStats {
        /// Metric data points.
        #[arg(long, default_value_t = 1_000_000)]
        points: usize,
        /// Series.
        #[arg(long, default_value_t = 800)]
        series: usize,
        /// Repetitions (the best is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// llm_signals (traces → metrics) on vLLM llm_request spans, next to the pass-through path
    /// (schema validation of the same protobuf, what an OTLP pipeline without Arrow does) and decode.
    LlmSignals {
        /// Spans.
        #[arg(long, default_value_t = 262_144)]
        spans: usize,
        /// Repetitions (the best is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// Write a recording of `points` metric points as Parquet (for timing `inferwatch replay`).
    Record {
        /// Metric data points.
        #[arg(long, default_value_t = 1_000_000)]
        points: usize,
        /// Series.
        #[arg(long, default_value_t = 800)]
        series: usize,
        /// Output directory (a `metrics/` folder is written in it).
        #[arg(long)]
        out: PathBuf,
    },
}

fn best(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn convert(points: usize, spans: usize, reps: usize) -> anyhow::Result<serde_json::Value> {
    use inferwatch_core::arrow::{metrics, spans as sp};
    let mreqs: Vec<Vec<u8>> = data::metrics_requests(points, 800, 5).iter().map(|r| r.encode_to_vec()).collect();
    let sreqs: Vec<Vec<u8>> = data::span_requests(spans.div_ceil(512), 512).iter().map(|r| r.encode_to_vec()).collect();
    let n_points = points.div_ceil(800) * 800;
    let n_spans = sreqs.len() * 512;
    let m_decode = best(reps, || {
        for b in &mreqs {
            std::hint::black_box(ExportMetricsServiceRequest::decode(b.as_slice())?);
        }
        Ok(())
    })?;
    let m_to = best(reps, || {
        for b in &mreqs {
            let r = ExportMetricsServiceRequest::decode(b.as_slice())?;
            std::hint::black_box(metrics::to_batch(&r)?);
        }
        Ok(())
    })?;
    let batches: Vec<_> = mreqs
        .iter()
        .map(|b| Ok(metrics::to_batch(&ExportMetricsServiceRequest::decode(b.as_slice())?)?))
        .collect::<anyhow::Result<_>>()?;
    let m_back = best(reps, || {
        for b in &batches {
            std::hint::black_box(metrics::from_batch(b)?);
        }
        Ok(())
    })?;
    let s_decode = best(reps, || {
        for b in &sreqs {
            std::hint::black_box(ExportTraceServiceRequest::decode(b.as_slice())?);
        }
        Ok(())
    })?;
    let s_to = best(reps, || {
        for b in &sreqs {
            let r = ExportTraceServiceRequest::decode(b.as_slice())?;
            std::hint::black_box(sp::to_batch(&r)?);
        }
        Ok(())
    })?;
    let sbatches: Vec<_> = sreqs
        .iter()
        .map(|b| Ok(sp::to_batch(&ExportTraceServiceRequest::decode(b.as_slice())?)?))
        .collect::<anyhow::Result<_>>()?;
    let s_back = best(reps, || {
        for b in &sbatches {
            std::hint::black_box(sp::from_batch(b)?);
        }
        Ok(())
    })?;
    let rate = |n: usize, t: f64| (n as f64 / t).round();
    Ok(serde_json::json!({
        "metrics": {
            "points": n_points,
            "decode_points_per_s": rate(n_points, m_decode),
            "decode_and_to_arrow_points_per_s": rate(n_points, m_to),
            "to_arrow_points_per_s": rate(n_points, (m_to - m_decode).max(1e-9)),
            "from_arrow_points_per_s": rate(n_points, m_back),
            "decode_and_to_arrow_over_decode": m_to / m_decode,
        },
        "spans": {
            "spans": n_spans,
            "decode_spans_per_s": rate(n_spans, s_decode),
            "decode_and_to_arrow_spans_per_s": rate(n_spans, s_to),
            "to_arrow_spans_per_s": rate(n_spans, (s_to - s_decode).max(1e-9)),
            "from_arrow_spans_per_s": rate(n_spans, s_back),
            "decode_and_to_arrow_over_decode": s_to / s_decode,
        }
    }))
}

struct Count(AtomicU64);

#[async_trait]
impl Consumer for Count {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.fetch_add(data.item_count() as u64, Ordering::Relaxed);
        Ok(())
    }
}

async fn window_stats(points: usize, series: usize, reps: usize) -> anyhow::Result<serde_json::Value> {
    let generated = data::metrics_requests(points, series, 10);
    let points: usize = generated.iter().map(|r| Payload::Metrics(r.clone()).item_count()).sum();
    let reqs: Vec<Vec<u8>> = generated.iter().map(|r| r.encode_to_vec()).collect();
    let decode = best(reps, || {
        for b in &reqs {
            std::hint::black_box(ExportMetricsServiceRequest::decode(b.as_slice())?);
        }
        Ok(())
    })?;
    let mut registry = inferwatch_core::registry::Registry::new();
    inferwatch_processors::register(&mut registry);
    let factory = registry.processor("window_stats").and_then(|f| f.arrow()).context("no window_stats")?;
    let mut best_t = f64::INFINITY;
    let mut derived = 0;
    for _ in 0..reps.max(1) {
        let telemetry = Arc::new(Telemetry::new());
        let host = Host::new();
        let id = ComponentId::parse("window_stats").map_err(|e| anyhow::anyhow!("{e}"))?;
        let ctx = CreateContext { id: id.clone(), telemetry: telemetry.clone(), host: host.clone() };
        let proc = factory.create_arrow(ctx, &serde_json::json!({"window": "1m"}), Signal::Metrics)?;
        let sink = Arc::new(Count(AtomicU64::new(0)));
        let stage = ArrowStage::build(
            StageContext { pipeline: "metrics".into(), telemetry, host },
            vec![(id, proc)],
            Signal::Metrics,
            sink.clone(),
        )?;
        let t = Instant::now();
        for b in &reqs {
            let r = ExportMetricsServiceRequest::decode(b.as_slice())?;
            stage.consume(Payload::Metrics(r)).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        inferwatch_core::component::Node::end_of_input(stage.as_ref()).await;
        best_t = best_t.min(t.elapsed().as_secs_f64());
        derived = sink.0.load(Ordering::Relaxed) as usize - points;
    }
    Ok(serde_json::json!({
        "points": points,
        "series": series,
        "decode_points_per_s": (points as f64 / decode).round(),
        "window_stats_points_per_s": (points as f64 / best_t).round(),
        "window_stats_over_decode": best_t / decode,
        "derived_points": derived,
    }))
}

async fn llm_signals(spans: usize, reps: usize) -> anyhow::Result<serde_json::Value> {
    use inferwatch_core::pdata::Encoded;
    let reqs: Vec<bytes::Bytes> =
        data::span_requests(spans.div_ceil(512), 512).iter().map(|r| bytes::Bytes::from(r.encode_to_vec())).collect();
    let n = reqs.len() * 512;
    let validate = best(reps, || {
        for b in &reqs {
            std::hint::black_box(Encoded::new(Signal::Traces, b.clone()).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        Ok(())
    })?;
    let decode = best(reps, || {
        for b in &reqs {
            std::hint::black_box(ExportTraceServiceRequest::decode(b.as_ref())?);
        }
        Ok(())
    })?;
    let mut registry = inferwatch_core::registry::Registry::new();
    inferwatch_processors::register(&mut registry);
    let factory = registry.connector("llm_signals").context("no llm_signals connector")?;
    let mut best_t = f64::INFINITY;
    let mut derived = 0;
    for _ in 0..reps.max(1) {
        let telemetry = Arc::new(Telemetry::new());
        let id = ComponentId::parse("llm_signals").map_err(|e| anyhow::anyhow!("{e}"))?;
        let ctx = CreateContext { id, telemetry, host: Host::new() };
        let sink = Arc::new(Count(AtomicU64::new(0)));
        let node = factory.create(ctx, &serde_json::json!({}), Signal::Traces, Signal::Metrics, sink.clone())?;
        let t = Instant::now();
        for b in &reqs {
            // As the pipeline gets it: validated protobuf, decoded and converted once by the stage.
            let p = Payload::Encoded(Encoded::new(Signal::Traces, b.clone()).map_err(|e| anyhow::anyhow!("{e}"))?);
            node.consume(p).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        node.end_of_input().await;
        best_t = best_t.min(t.elapsed().as_secs_f64());
        derived = sink.0.load(Ordering::Relaxed);
    }
    Ok(serde_json::json!({
        "spans": n,
        "pass_through_validate_spans_per_s": (n as f64 / validate).round(),
        "decode_spans_per_s": (n as f64 / decode).round(),
        "llm_signals_spans_per_s": (n as f64 / best_t).round(),
        "llm_signals_over_pass_through": best_t / validate,
        "llm_signals_over_decode": best_t / decode,
        "derived_points": derived,
    }))
}

fn record(points: usize, series: usize, out: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    let dir = out.join("metrics");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("recording.parquet");
    let file = std::fs::File::create(&path)?;
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?)).build();
    let mut w = ArrowWriter::try_new(file, inferwatch_core::arrow::schema::metrics_schema(), Some(props))?;
    let mut n = 0;
    for r in data::metrics_requests(points, series, 10) {
        let b = inferwatch_core::arrow::metrics::to_batch(&r)?;
        n += b.num_rows();
        w.write(&b)?;
    }
    w.close()?;
    Ok(serde_json::json!({"path": path, "points": n, "bytes": std::fs::metadata(&path)?.len()}))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let v = match cli.cmd {
        Cmd::Convert { points, spans, reps } => convert(points, spans, reps)?,
        Cmd::WindowStats { points, series, reps } => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(window_stats(points, series, reps))?
        }
        Cmd::LlmSignals { spans, reps } => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(llm_signals(spans, reps))?
        }
        Cmd::Record { points, series, out } => record(points, series, &out)?,
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
