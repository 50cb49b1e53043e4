//! `lb-bench`: spans/s and metric points/s per core through the `loadbalancing` exporter with
//! 3 and 10 backends, against the plain `otlp` exporter, in one run, for decoded payloads (as
//! detectors emit them) and encoded ones (validated OTLP bytes as receivers pass them on).
//!
//! The exporters run on one current-thread runtime in the main thread; the CPU time of that
//! thread (`/proc/thread-self/schedstat`: routing, splitting, encoding, gzip, the gRPC client)
//! is what is measured, so the figures are items per second of one core. The OTLP/gRPC sinks
//! (10, on 127.0.0.1) run on another runtime and are not counted. Each mode sends `--batches`
//! payloads of 1 000 spans (50 services, 20 traces each) or 1 000 gauge points (50 services, 20
//! series each), decoded (split by moving prost messages, encoded once per backend) or encoded
//! (split on the wire, passed on without encoding), and waits until every item has arrived.
//! Routing keys: otelcol's defaults (`traceID` for traces, `service` for metrics) and
//! `streamID` for metrics. Each ratio is against `otlp` sending the same form. Prints one JSON
//! document.
//!
//! `cargo run -p inferwatch-exporters --example lb-bench -- --batches 300`
//! (the workspace's `dev` profile is optimized; `--release` for release figures).

use inferwatch_core::component::{ComponentId, CreateContext, Node};
use inferwatch_core::exporterhelper::QueuedExporter;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::OtlpConfig;
use inferwatch_exporters::loadbalancing::{LoadBalancer, LoadBalancingConfig};
use inferwatch_exporters::otlp::GrpcSender;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Count {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n = Payload::Traces(r.into_inner()).item_count() as u64;
        self.0.fetch_add(n, Ordering::Relaxed);
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Count {
    async fn export(
        &self,
        r: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let n = Payload::Metrics(r.into_inner()).item_count() as u64;
        self.0.fetch_add(n, Ordering::Relaxed);
        Ok(tonic::Response::new(Default::default()))
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn kv(k: &str, v: String) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v)) }), key_strindex: 0 }
}

fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope { name: "bench".into(), version: "1".into(), ..Default::default() })
}

fn spans(batch: u64) -> Payload {
    let rs = (0..50)
        .map(|s| ResourceSpans {
            resource: Some(Resource { attributes: vec![kv("service.name", format!("svc-{s}"))], ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                scope: scope(),
                spans: (0..20u64)
                    .map(|i| Span {
                        trace_id: ((batch as u128) << 64 | (s as u128) << 32 | i as u128).to_be_bytes().to_vec(),
                        span_id: (i + 1).to_be_bytes().to_vec(),
                        name: "chat".into(),
                        kind: 2,
                        start_time_unix_nano: 1_700_000_000_000_000_000 + batch,
                        end_time_unix_nano: 1_700_000_000_100_000_000 + batch,
                        attributes: vec![kv("gen_ai.request.model", format!("m{}", i % 4))],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    Payload::Traces(ExportTraceServiceRequest { resource_spans: rs })
}

fn points(batch: u64) -> Payload {
    let rm = (0..50)
        .map(|s| ResourceMetrics {
            resource: Some(Resource { attributes: vec![kv("service.name", format!("svc-{s}"))], ..Default::default() }),
            scope_metrics: vec![ScopeMetrics {
                scope: scope(),
                metrics: vec![Metric {
                    name: "vllm:num_requests_running".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: (0..20)
                            .map(|i| NumberDataPoint {
                                attributes: vec![kv("series", format!("s{i}"))],
                                time_unix_nano: 1_700_000_000_000_000_000 + batch,
                                value: Some(number_data_point::Value::AsDouble(i as f64)),
                                ..Default::default()
                            })
                            .collect(),
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    Payload::Metrics(ExportMetricsServiceRequest { resource_metrics: rm })
}

fn otlp_settings() -> serde_json::Value {
    serde_json::json!({"tls": {"insecure": true}, "timeout": "10s",
        "sending_queue": {"queue_size": 100000, "num_consumers": 4}})
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let batches: u64 =
        args.iter().position(|a| a == "--batches").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(200);

    // Ten sinks on their own runtime.
    let count = Count::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let c = count.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() else { return };
        rt.block_on(async move {
            let mut addrs = Vec::new();
            for _ in 0..10 {
                let Ok(l) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { return };
                let Ok(a) = l.local_addr() else { return };
                addrs.push(a.to_string());
                let c = c.clone();
                tokio::spawn(async move {
                    let incoming = tonic::transport::server::TcpIncoming::from(l);
                    let _ = tonic::transport::Server::builder()
                        .add_service(
                            TraceServiceServer::new(c.clone())
                                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                                .max_decoding_message_size(64 << 20),
                        )
                        .add_service(
                            MetricsServiceServer::new(c)
                                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                                .max_decoding_message_size(64 << 20),
                        )
                        .serve_with_incoming(incoming)
                        .await;
                });
            }
            let _ = tx.send(addrs);
            std::future::pending::<()>().await;
        });
    });
    let addrs = rx.recv()?;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut results = serde_json::Map::new();
    rt.block_on(async {
        let modes = [
            ("spans", Signal::Traces, spans as fn(u64) -> Payload, "traceID"),
            ("metric_points", Signal::Metrics, points, "service"),
            ("metric_points_stream_id", Signal::Metrics, points, "streamID"),
        ];
        for (label, signal, make, key) in modes {
          let mut forms = serde_json::Map::new();
          for form_name in ["decoded", "encoded", "encoded_decoding"] {
                let encoded = form_name != "decoded";
            let mut per_core = serde_json::Map::new();
            let form = |p: Payload| -> Payload {
                if encoded { Payload::Encoded(Encoded::from_decoded(&p)) } else { p }
            };
            for backends in [0usize, 3, 10] {
                let t = Arc::new(Telemetry::new());
                let node: Arc<dyn Node> = if backends == 0 {
                    let mut s = otlp_settings();
                    s["endpoint"] = serde_json::Value::String(addrs[0].clone());
                    let c = OtlpConfig::from_value(&s)?;
                    let sender = GrpcSender::new("otlp".into(), &c)?;
                    let metrics = t.exporter(&ComponentId::parse("otlp")?, signal);
                    let q = &c.exporter;
                    Arc::new(QueuedExporter::new(
                        "otlp".into(),
                        signal,
                        Arc::new(sender),
                        metrics,
                        q.sending_queue.clone(),
                        q.retry_on_failure.clone(),
                    ))
                } else {
                    let v = serde_json::json!({"protocol": {"otlp": otlp_settings()}, "routing_key": key,
                        "resolver": {"static": {"hostnames": addrs[..backends].to_vec()}}});
                    let c = LoadBalancingConfig::from_value(&v)?;
                    let ctx = CreateContext::new(ComponentId::parse("loadbalancing")?, t.clone());
                    Arc::new(LoadBalancer::new(&ctx, Arc::new(c), signal)?)
                };
                node.start().await?;
                // Warm-up: connections made.
                node.consume(form(make(1_000_000))).await?;
                let base = count.0.load(Ordering::Relaxed) + 1000;
                while count.0.load(Ordering::Relaxed) < base {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let payloads: Vec<Payload> = (0..batches).map(|b| form(make(b))).collect();
                let items: u64 = payloads.iter().map(|p| p.item_count() as u64).sum();
                let (cpu0, wall0) = (thread_cpu_ns(), Instant::now());
                for p in payloads {
                    // The old path for encoded payloads: decoded in the exporter, split, encoded
                    // again per backend.
                    let p = if form_name == "encoded_decoding" { p.into_decoded()? } else { p };
                    node.consume(p).await?;
                }
                while count.0.load(Ordering::Relaxed) < base + items {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let cpu = (thread_cpu_ns() - cpu0) as f64 / 1e9;
                let wall = wall0.elapsed().as_secs_f64();
                node.shutdown(Instant::now() + Duration::from_secs(5)).await;
                let name = if backends == 0 { "otlp".to_string() } else { format!("loadbalancing_{backends}") };
                per_core.insert(
                    name,
                    serde_json::json!({"items": items, "cpu_s": cpu, "wall_s": wall,
                        "items_per_cpu_s": (items as f64 / cpu).round(), "items_per_wall_s": (items as f64 / wall).round()}),
                );
            }
            let base = per_core["otlp"]["items_per_cpu_s"].as_f64().unwrap_or(1.0);
            for k in ["loadbalancing_3", "loadbalancing_10"] {
                let v = per_core[k]["items_per_cpu_s"].as_f64().unwrap_or(0.0);
                per_core.insert(format!("{k}_ratio"), serde_json::json!((v / base * 1000.0).round() / 1000.0));
            }
            forms.insert(form_name.into(), per_core.into());
          }
          results.insert(label.into(), forms.into());
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    results.insert("batches".into(), batches.into());
    results.insert("profile".into(), if cfg!(debug_assertions) { "dev" } else { "release" }.into());
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}
