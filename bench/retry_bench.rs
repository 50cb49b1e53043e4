//! `retry-bench`: exporter CPU per item under a 30 % retryable failure rate, re-encoding each
//! attempt (the sender path before encode-once) against encoding once per payload, in one run.
//!
//! Two exporters post to a local HTTP server that answers 503 to 3 requests in 10 and 200 to
//! the rest, with a 1 ms retry back-off: `otlphttp` (protobuf, gzip level 1, decoded trace
//! payloads as the batch processor hands them over; CPU per span) and `prometheusremotewrite`
//! (translation, `WriteRequest` encoding and snappy; CPU per metric point). The exporter and its HTTP client run on one
//! current-thread runtime in the main thread, and the CPU time of that thread
//! (`/proc/thread-self/schedstat`) is what is measured; the server runs on another thread and is
//! not counted. The modes alternate over `--rounds` rounds. Prints one JSON document.
//!
//! Built as an example of `inferwatch-exporters` (it needs no other crate):
//! `cargo run -p inferwatch-exporters --example retry-bench -- --batches 300`
//! (the workspace's `dev` profile is optimized; `--release` for release figures).

use inferwatch_core::component::ComponentId;
use inferwatch_core::consumer::Consumer;
use inferwatch_core::exporterhelper::{QueuedExporter, RequestSender, SendError, Sender};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{GoDuration, QueueSettings, RetrySettings};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::RemoteWriteConfig;
use inferwatch_exporters::otlphttp::{HttpSender, OtlpHttpConfig};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counts encodes and attempts of the sender it wraps.
struct Counting<S> {
    inner: S,
    encodes: AtomicU64,
    attempts: AtomicU64,
}

#[async_trait::async_trait]
impl<S: RequestSender> RequestSender for Counting<S> {
    type Request = S::Request;
    fn encode(&self, data: &Payload) -> Result<Self::Request, SendError> {
        self.encodes.fetch_add(1, Ordering::Relaxed);
        self.inner.encode(data)
    }
    async fn send(&self, r: &Self::Request) -> Result<(), SendError> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        RequestSender::send(&self.inner, r).await
    }
}

/// The path before encode-once: a plain [`Sender`], so every attempt encodes and compresses
/// the payload again.
struct ReEncode<S>(Arc<Counting<S>>);

#[async_trait::async_trait]
impl<S: RequestSender> Sender for ReEncode<S> {
    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        Sender::send(self.0.as_ref(), data).await
    }
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

/// `n` spans.
fn spans(n: usize) -> Payload {
    let spans = (0..n)
        .map(|i| Span {
            trace_id: (i as u128 * 0x9e37_79b9_7f4a_7c15).to_be_bytes().to_vec(),
            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
            name: "chat.completions".into(),
            start_time_unix_nano: 1_700_000_000_000_000_000 + i as u64 * 1_000_003,
            end_time_unix_nano: 1_700_000_000_050_000_000 + i as u64 * 1_000_033,
            attributes: vec![
                kv("gen_ai.request.model", "llama-3-70b"),
                kv("gen_ai.system", "vllm"),
                kv("gen_ai.response.id", &format!("chatcmpl-{i:08x}")),
            ],
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

/// `n` gauge points: 16 metrics of `n / 16` series each, with a resource (so `target_info`).
fn points(n: usize) -> Payload {
    let per = (n / 16).max(1);
    let metrics = (0..16)
        .map(|m| Metric {
            name: format!("vllm.metric_{m}"),
            description: "A vLLM gauge.".into(),
            unit: "s".into(),
            data: Some(metric::Data::Gauge(Gauge {
                data_points: (0..per)
                    .map(|i| NumberDataPoint {
                        attributes: vec![kv("gen_ai.request.model", "llama-3-70b"), kv("pod", &format!("vllm-{i}"))],
                        time_unix_nano: 1_700_000_000_000_000_000 + (m * per + i) as u64,
                        value: Some(number_data_point::Value::AsDouble(i as f64 * 0.5)),
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
                attributes: vec![kv("service.name", "vllm"), kv("service.instance.id", "node-1")],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics { metrics, ..Default::default() }],
            ..Default::default()
        }],
    })
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// A server that answers 503 to requests 0, 3 and 6 of every 10 and 200 to the others.
fn serve() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let n = Arc::new(AtomicU64::new(0));
            let app = axum::Router::new().fallback(move |_body: axum::body::Bytes| {
                let n = n.clone();
                async move {
                    let i = n.fetch_add(1, Ordering::Relaxed);
                    if matches!(i % 10, 0 | 3 | 6) {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy")
                    } else {
                        (axum::http::StatusCode::OK, "")
                    }
                }
            });
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(l, app).await;
        });
    });
    addr
}

#[derive(Default)]
struct Totals {
    payloads: u64,
    items: u64,
    encodes: u64,
    attempts: u64,
    cpu_ns: u64,
}

/// Which exporter a run drives.
#[derive(Clone, Copy)]
enum Exporter {
    OtlpHttp,
    RemoteWrite,
}

async fn run(addr: std::net::SocketAddr, ex: Exporter, once: bool, batches: usize, items: usize, t: &mut Totals) {
    match ex {
        Exporter::OtlpHttp => {
            let cfg = serde_json::json!({"endpoint": format!("http://{addr}")});
            let c = OtlpHttpConfig::from_value(&cfg).expect("config");
            let inner = HttpSender::new("otlphttp/bench".into(), &c, Signal::Traces).expect("sender");
            drive(inner, Signal::Traces, once, (0..batches).map(|_| spans(items)).collect(), t).await
        }
        Exporter::RemoteWrite => {
            let cfg = serde_json::json!({"endpoint": format!("http://{addr}/api/v1/write")});
            let inner = RemoteWriteConfig::from_value(&cfg).and_then(|c| c.sender()).expect("sender");
            drive(inner, Signal::Metrics, once, (0..batches).map(|_| points(items)).collect(), t).await
        }
    }
}

/// Delivers `payloads` (built outside the measured time) through a queued `inner`.
async fn drive<S: RequestSender>(inner: S, signal: Signal, once: bool, payloads: Vec<Payload>, t: &mut Totals) {
    let counting = Arc::new(Counting { inner, encodes: AtomicU64::new(0), attempts: AtomicU64::new(0) });
    let sender: Arc<dyn Sender> = if once { counting.clone() } else { Arc::new(ReEncode(counting.clone())) };
    let telemetry = Telemetry::new();
    let metrics = telemetry.exporter(&ComponentId::parse("bench").expect("id"), signal);
    let retry = RetrySettings {
        initial_interval: GoDuration(Duration::from_millis(1)),
        max_interval: GoDuration(Duration::from_millis(1)),
        max_elapsed_time: GoDuration(Duration::ZERO),
        multiplier: 1.0,
        randomization_factor: 0.0,
        enabled: true,
    };
    let queue = QueueSettings { enabled: false, ..QueueSettings::default() };
    let e = QueuedExporter::new("bench".into(), signal, sender, metrics, queue, retry);
    t.items += payloads.iter().map(|p| p.item_count() as u64).sum::<u64>();
    t.payloads += payloads.len() as u64;
    let start = thread_cpu_ns();
    for p in payloads {
        e.consume(p).await.expect("delivered");
    }
    t.cpu_ns += thread_cpu_ns() - start;
    t.encodes += counting.encodes.load(Ordering::Relaxed);
    t.attempts += counting.attempts.load(Ordering::Relaxed);
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let (batches, items, rounds) = (arg("--batches", 300), arg("--items", 512), arg("--rounds", 3));
    let addr = serve();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let per_item = |t: &Totals| t.cpu_ns as f64 / t.items as f64;
    let show = |t: &Totals| {
        let failed = (t.attempts - t.payloads) as f64 / t.attempts as f64;
        serde_json::json!({
            "items": t.items, "payloads": t.payloads, "encodes": t.encodes, "attempts": t.attempts,
            "failed_attempts_pct": (failed * 1000.0).round() / 10.0,
            "cpu_ms": t.cpu_ns / 1_000_000, "cpu_ns_per_item": per_item(t).round(),
        })
    };
    let mut out = serde_json::json!({
        "bench": "retry-bench", "batches": batches, "items_per_batch": items, "rounds": rounds,
        "failure": "503 to 3 requests in 10, 1 ms back-off",
    });
    for (name, ex) in [
        ("otlphttp (protobuf, gzip 1; item = span)", Exporter::OtlpHttp),
        ("prometheusremotewrite (item = gauge point)", Exporter::RemoteWrite),
    ] {
        let (mut re, mut once) = (Totals::default(), Totals::default());
        rt.block_on(async {
            // Warm-up: connections, allocator.
            run(addr, ex, true, batches / 10 + 1, items, &mut Totals::default()).await;
            for _ in 0..rounds {
                run(addr, ex, false, batches, items, &mut re).await;
                run(addr, ex, true, batches, items, &mut once).await;
            }
        });
        out[name] = serde_json::json!({
            "re_encode": show(&re), "encode_once": show(&once),
            "cpu_per_item_ratio_re_encode_over_encode_once": (per_item(&re) / per_item(&once) * 100.0).round() / 100.0,
        });
    }
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
}
