//! The whole agent with an `nvml` receiver on a host without NVML: it starts, logs one clear line
//! naming the reason, reports healthy, and another pipeline (otlp → otlp exporter) delivers.

use inferwatch_core::config;
use inferwatch_core::graph::Service;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_testkit::capture;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Log output of the agent, shared with the subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_with_nvml_and_no_gpu_runs_the_other_pipelines() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();

    let (sink, captured) = capture::grpc().await;
    let (http, health) = (free_port(), free_port());
    // An explicit missing library makes the reason the same on hosts that do have a GPU.
    let yaml = format!(
        r#"
receivers:
  nvml:
    collection_interval: 50ms
    library_path: /nonexistent/libnvidia-ml.so.1
  otlp:
    protocols:
      http: {{ endpoint: "127.0.0.1:{http}" }}
exporters:
  debug: {{ verbosity: basic }}
  otlp:
    endpoint: "{sink}"
    tls: {{ insecure: true }}
    retry_on_failure: {{ initial_interval: 10ms }}
extensions:
  health_check: {{ endpoint: "127.0.0.1:{health}" }}
service:
  extensions: [health_check]
  pipelines:
    metrics/gpu: {{ receivers: [nvml], exporters: [debug] }}
    traces: {{ receivers: [otlp], exporters: [otlp] }}
"#
    );
    let cfg = config::load_str("nvml.yaml", &yaml, &|_| None).unwrap();
    let reg = inferwatch::components::registry();
    assert!(config::validate(&cfg, &reg).is_empty());
    let mut svc = Service::build(&cfg, &reg, Arc::new(Telemetry::new())).unwrap();
    svc.start().await.expect("the agent starts without a GPU");
    assert!(svc.status().is_running());

    let client = reqwest::Client::new();
    let ok = client.get(format!("http://127.0.0.1:{health}/")).send().await.unwrap();
    assert_eq!(ok.status(), 200, "healthy");

    let body = r#"{"resourceSpans":[{"resource":{},"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10",
        "spanId":"0102030405060708","name":"llm_request","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let resp = client
        .post(format!("http://127.0.0.1:{http}/v1/traces"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    tokio::time::timeout(Duration::from_secs(20), captured.wait_until("a span", |c| !c.spans().is_empty()))
        .await
        .unwrap_or_else(|_| {
            panic!("the traces pipeline delivers; log:\n{}", String::from_utf8_lossy(&logs.0.lock().unwrap()))
        });
    let names: Vec<String> = captured.spans().into_iter().map(|(_, _, s)| s.name).collect();
    assert_eq!(names, vec!["llm_request".to_string()]);

    svc.shutdown(Duration::from_secs(5)).await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("no GPU telemetry")).collect();
    assert_eq!(lines.len(), 1, "exactly one line about the missing GPU:\n{text}");
    let line = lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("no NVML library"), "{line}");
    assert!(line.contains("/nonexistent/libnvidia-ml.so.1"), "{line}");
    assert!(line.contains("reason=\"no_library\"") || line.contains("reason=no_library"), "{line}");
    assert!(!text.contains("ERROR"), "no errors logged:\n{text}");
}
