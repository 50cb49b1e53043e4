//! End to end with the Rust OpenTelemetry SDK as the client: SDK → inferwatch (otlp receiver,
//! batch, otlp exporter) → a capturing OTLP/gRPC server. Compares ids, names, attributes,
//! metric values and log bodies, over gRPC and over HTTP (protobuf and JSON).

use inferwatch_core::config;
use inferwatch_core::graph::Service;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_testkit::attrs::{resource_attrs, str_attr};
use inferwatch_testkit::capture::{self, Captured};
use opentelemetry::KeyValue;
use opentelemetry::logs::{AnyValue, LogRecord, Logger, LoggerProvider, Severity};
use opentelemetry::metrics::MeterProvider;
use opentelemetry::trace::{Span, TraceContextExt, Tracer, TracerProvider};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_sdk::Resource;
use std::sync::Arc;
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts an agent whose pipelines end in the sink; returns it and its gRPC and HTTP ports.
async fn start_agent(sink: std::net::SocketAddr) -> (Service, u16, u16) {
    // reqwest is built without a default TLS provider in this workspace; the SDK's client needs one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (g, h) = (free_port(), free_port());
    let yaml = format!(
        r#"
receivers:
  otlp:
    protocols:
      grpc: {{ endpoint: "127.0.0.1:{g}" }}
      http: {{ endpoint: "127.0.0.1:{h}" }}
processors:
  batch: {{ timeout: 20ms }}
exporters:
  otlp:
    endpoint: "{sink}"
    tls: {{ insecure: true }}
    retry_on_failure: {{ initial_interval: 10ms }}
service:
  pipelines:
    traces: {{ receivers: [otlp], processors: [batch], exporters: [otlp] }}
    metrics: {{ receivers: [otlp], processors: [batch], exporters: [otlp] }}
    logs: {{ receivers: [otlp], processors: [batch], exporters: [otlp] }}
"#
    );
    let cfg = config::load_str("test.yaml", &yaml, &|_| None).unwrap();
    let reg = inferwatch::components::registry();
    assert!(config::validate(&cfg, &reg).is_empty());
    let mut svc = Service::build(&cfg, &reg, Arc::new(Telemetry::new())).unwrap();
    svc.start().await.unwrap();
    (svc, g, h)
}

/// A received span: name, trace id, span id, attributes (debug-printed), resource service.name.
type SeenSpan = (String, Vec<u8>, Vec<u8>, Vec<(String, String)>, String);

fn span_names(c: &Captured) -> Vec<SeenSpan> {
    let mut out = Vec::new();
    for req in c.traces().iter() {
        for rs in &req.resource_spans {
            let service =
                str_attr(resource_attrs(rs.resource.as_ref()), "service.name").unwrap_or_default().to_string();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    let attrs = s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), format!("{:?}", kv.value.as_ref().and_then(|v| v.value.clone()))))
                        .collect();
                    out.push((s.name.clone(), s.trace_id.clone(), s.span_id.clone(), attrs, service.clone()));
                }
            }
        }
    }
    out
}

fn send_spans(provider: &opentelemetry_sdk::trace::SdkTracerProvider, prefix: &str) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let tracer = provider.tracer("e2e");
    let mut sent = Vec::new();
    for i in 0..5 {
        let mut span = tracer
            .span_builder(format!("{prefix}-{i}"))
            .with_attributes(vec![
                KeyValue::new("gen_ai.request.model", "llama-3-8b"),
                KeyValue::new("gen_ai.usage.output_tokens", 100 + i as i64),
                KeyValue::new("ratio", 0.5),
            ])
            .start(&tracer);
        span.set_attribute(KeyValue::new("ok", true));
        let ctx = span.span_context().clone();
        span.end();
        sent.push((format!("{prefix}-{i}"), ctx.trace_id().to_bytes().to_vec(), ctx.span_id().to_bytes().to_vec()));
    }
    let _ = opentelemetry::Context::current().span();
    sent
}

async fn flush_traces(p: opentelemetry_sdk::trace::SdkTracerProvider) {
    tokio::task::spawn_blocking(move || {
        p.force_flush().unwrap();
        p.shutdown().unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_traces_over_grpc_and_http_arrive_intact() {
    let (sink, captured) = capture::grpc().await;
    let (svc, g, h) = start_agent(sink).await;

    let mut expected = Vec::new();
    for (proto, prefix) in [("grpc", "g"), ("http-proto", "hp"), ("http-json", "hj")] {
        let exporter = match proto {
            "grpc" => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(format!("http://127.0.0.1:{g}"))
                .build()
                .unwrap(),
            p => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(if p == "http-json" { Protocol::HttpJson } else { Protocol::HttpBinary })
                .with_endpoint(format!("http://127.0.0.1:{h}/v1/traces"))
                .build()
                .unwrap(),
        };
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(format!("svc-{prefix}")).build())
            .build();
        expected.extend(send_spans(&provider, prefix).into_iter().map(|s| (s, format!("svc-{prefix}"))));
        flush_traces(provider).await;
    }
    captured.wait_until("15 spans", |c| span_names(c).len() >= 15).await;
    let got = span_names(&captured);
    assert_eq!(got.len(), 15, "every span exactly once");
    for ((name, tid, sid), service) in &expected {
        let g = got.iter().find(|s| &s.0 == name).unwrap_or_else(|| panic!("span {name} missing"));
        assert_eq!(&g.1, tid, "trace id of {name}");
        assert_eq!(&g.2, sid, "span id of {name}");
        assert_eq!(&g.4, service, "resource service.name of {name}");
        let attrs: std::collections::HashMap<_, _> = g.3.iter().cloned().collect();
        assert_eq!(attrs["gen_ai.request.model"], "Some(StringValue(\"llama-3-8b\"))");
        let idx: i64 = name.rsplit('-').next().unwrap().parse().unwrap();
        assert_eq!(attrs["gen_ai.usage.output_tokens"], format!("Some(IntValue({}))", 100 + idx));
        assert_eq!(attrs["ratio"], "Some(DoubleValue(0.5))");
        assert_eq!(attrs["ok"], "Some(BoolValue(true))");
    }
    svc.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_metrics_and_logs_over_grpc_arrive_intact() {
    let (sink, captured) = capture::grpc().await;
    let (svc, g, _h) = start_agent(sink).await;

    let mexp = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://127.0.0.1:{g}"))
        .build()
        .unwrap();
    let mp = opentelemetry_sdk::metrics::SdkMeterProvider::builder().with_periodic_exporter(mexp).build();
    let meter = mp.meter("e2e");
    let counter = meter.u64_counter("llm.requests").build();
    counter.add(3, &[KeyValue::new("model", "a")]);
    counter.add(4, &[KeyValue::new("model", "b")]);
    counter.add(1, &[KeyValue::new("model", "a")]);
    let hist = meter.f64_histogram("llm.ttft").with_unit("s").build();
    hist.record(0.25, &[]);
    hist.record(0.75, &[]);

    let lexp = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://127.0.0.1:{g}"))
        .build()
        .unwrap();
    let lp = opentelemetry_sdk::logs::SdkLoggerProvider::builder().with_batch_exporter(lexp).build();
    let logger = lp.logger("e2e");
    for (i, sev) in [Severity::Info, Severity::Warn, Severity::Error].into_iter().enumerate() {
        let mut r = logger.create_log_record();
        r.set_body(AnyValue::from(format!("log line {i}")));
        r.set_severity_number(sev);
        r.add_attribute("i", i as i64);
        logger.emit(r);
    }
    tokio::task::spawn_blocking(move || {
        mp.force_flush().unwrap();
        lp.force_flush().unwrap();
        mp.shutdown().unwrap();
        lp.shutdown().unwrap();
    })
    .await
    .unwrap();

    captured
        .wait_until("metrics and logs", |c| {
            !c.metrics().is_empty() && c.logs().iter().map(|r| r.resource_logs.len()).sum::<usize>() > 0
        })
        .await;
    captured
        .wait_until("3 log records", |c| {
            c.logs()
                .iter()
                .flat_map(|r| &r.resource_logs)
                .flat_map(|r| &r.scope_logs)
                .map(|s| s.log_records.len())
                .sum::<usize>()
                >= 3
        })
        .await;

    // Metrics: the counter sums per attribute set and the histogram count/sum.
    let metrics = captured.metrics();
    let all: Vec<_> = metrics
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .collect();
    let counter = all.iter().find(|m| m.name == "llm.requests").expect("counter arrived");
    let Some(Data::Sum(sum)) = &counter.data else { panic!("counter is a sum") };
    let mut by_model: Vec<(String, i64)> = sum
        .data_points
        .iter()
        .map(|p| {
            let model = format!("{:?}", p.attributes[0].value.as_ref().and_then(|v| v.value.clone()));
            let v = match p.value {
                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i)) => i,
                _ => -1,
            };
            (model, v)
        })
        .collect();
    by_model.sort();
    assert_eq!(
        by_model,
        vec![("Some(StringValue(\"a\"))".to_string(), 4), ("Some(StringValue(\"b\"))".to_string(), 4)]
    );
    let h = all.iter().find(|m| m.name == "llm.ttft").expect("histogram arrived");
    assert_eq!(h.unit, "s");
    let Some(Data::Histogram(hd)) = &h.data else { panic!("histogram") };
    assert_eq!(hd.data_points[0].count, 2);
    assert_eq!(hd.data_points[0].sum, Some(1.0));

    let logs = captured.logs();
    let mut bodies: Vec<(String, i32)> = logs
        .iter()
        .flat_map(|r| &r.resource_logs)
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .map(|l| {
            let body = match l.body.as_ref().and_then(|b| b.value.clone()) {
                Some(Value::StringValue(s)) => s,
                other => format!("{other:?}"),
            };
            (body, l.severity_number)
        })
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        vec![("log line 0".to_string(), 9), ("log line 1".to_string(), 13), ("log line 2".to_string(), 17)]
    );
    svc.shutdown(Duration::from_secs(5)).await;
}
