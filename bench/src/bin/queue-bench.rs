//! `queue-bench`: spans/s through `QueuedExporter` into a no-op sender with the in-memory
//! sending queue, the persistent queue (`file_storage`, `fsync: false`) and the persistent queue
//! with `fsync: true`, in one process, with the ratios to the memory queue. Prints one JSON
//! document.

use async_trait::async_trait;
use clap::Parser;
use inferwatch_core::component::{ComponentId, Node};
use inferwatch_core::consumer::Consumer;
use inferwatch_core::exporterhelper::{QueuedExporter, SendError, Sender};
use inferwatch_core::extension::file_storage::FileStorage;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{QueueSettings, RetrySettings};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "queue-bench", about = "sending queue throughput: memory vs disk vs disk with fsync")]
struct Cli {
    /// Spans per batch (one consume call).
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Batches per run.
    #[arg(long, default_value_t = 2000)]
    batches: usize,
    /// Batches per run with fsync (each is one device sync unless grouped).
    #[arg(long, default_value_t = 500)]
    fsync_batches: usize,
    /// Concurrent callers (receivers' request tasks).
    #[arg(long, default_value_t = 8)]
    callers: usize,
    /// Where the disk queues go (a fresh subdirectory, removed afterwards).
    #[arg(long, default_value = "/tmp")]
    dir: String,
}

struct Noop;
#[async_trait]
impl Sender for Noop {
    async fn send(&self, _d: &Payload) -> Result<(), SendError> {
        Ok(())
    }
}

fn batch(n: usize) -> Payload {
    let kv = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    };
    let spans = (0..n)
        .map(|i| Span {
            trace_id: vec![7; 16],
            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
            name: "chat.completions".into(),
            start_time_unix_nano: 1_700_000_000_000_000_000 + i as u64,
            end_time_unix_nano: 1_700_000_000_050_000_000 + i as u64,
            attributes: vec![kv("gen_ai.request.model", "llama-3-70b"), kv("gen_ai.system", "vllm")],
            ..Default::default()
        })
        .collect();
    Payload::Traces(ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    })
}

async fn run(label: &str, storage: Option<FileStorage>, cli: &Cli, batches: usize) -> anyhow::Result<f64> {
    let t = Telemetry::new();
    let id = ComponentId::parse("otlp/bench")?;
    let m = t.exporter(&id, Signal::Traces);
    let q = QueueSettings { queue_size: 100_000, ..Default::default() };
    let queue = match &storage {
        Some(s) => Some(QueuedExporter::open_disk(s, label, Signal::Traces, &q, m.clone())?),
        None => None,
    };
    let e = Arc::new(match queue {
        Some(queue) => QueuedExporter::with_queue(
            label.into(),
            Signal::Traces,
            Arc::new(Noop),
            m.clone(),
            q,
            RetrySettings::default(),
            Some(queue),
        ),
        None => {
            QueuedExporter::new(label.into(), Signal::Traces, Arc::new(Noop), m.clone(), q, RetrySettings::default())
        }
    });
    e.start().await?;
    let template = batch(cli.batch);
    let start = Instant::now();
    let per = batches.div_ceil(cli.callers);
    let mut tasks = Vec::new();
    for _ in 0..cli.callers {
        let (e, p) = (e.clone(), template.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                e.consume(p.clone()).await?;
            }
            Ok::<_, inferwatch_core::ConsumeError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    // Acknowledged to the callers; now wait until everything has been sent.
    let total = (per * cli.callers * cli.batch) as u64;
    while m.sent.get() < total {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    e.shutdown(Instant::now() + Duration::from_secs(10)).await;
    Ok(total as f64 / secs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = std::path::Path::new(&cli.dir).join(format!("inferwatch-queue-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let storage = |fsync| FileStorage { directory: root.clone(), fsync, timeout: Duration::from_secs(1) };
    let memory = run("memory", None, &cli, cli.batches).await?;
    let disk = run("disk", Some(storage(false)), &cli, cli.batches).await?;
    let disk_fsync = run("disk-fsync", Some(storage(true)), &cli, cli.fsync_batches).await?;
    let _ = std::fs::remove_dir_all(&root);
    let doc = json!({
        "batch_spans": cli.batch,
        "callers": cli.callers,
        "spans_per_s": {"memory": memory.round(), "disk": disk.round(), "disk_fsync": disk_fsync.round()},
        "ratio_to_memory": {"disk": disk / memory, "disk_fsync": disk_fsync / memory},
        "ratio_fsync_to_disk": disk_fsync / disk,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
