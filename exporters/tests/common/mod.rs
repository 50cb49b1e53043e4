//! Shared fixtures for the exporter integration tests: payloads, a test PKI, exporter wiring.
#![allow(dead_code)]

use inferwatch_core::component::{ComponentId, CreateContext, ExporterFactory, NodeRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::{ExporterMetrics, Telemetry};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a test waits for something that should happen promptly before failing.
pub const PATIENCE: Duration = Duration::from_secs(10);

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

fn resource() -> Option<Resource> {
    Some(Resource { attributes: vec![kv("service.name", "vllm"), kv("host.name", "gpu-node-1")], ..Default::default() })
}

/// A payload of `n` items of `signal` with distinct contents.
pub fn payload(signal: Signal, n: usize) -> Payload {
    match signal {
        Signal::Traces => Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: resource(),
                scope_spans: vec![ScopeSpans {
                    spans: (0..n)
                        .map(|i| Span {
                            name: format!("decode-{i}"),
                            trace_id: vec![0x5a; 16],
                            span_id: vec![i as u8 + 1; 8],
                            start_time_unix_nano: 1_700_000_000_000_000_000 + i as u64,
                            end_time_unix_nano: 1_700_000_000_100_000_000 + i as u64,
                            attributes: vec![kv("gen_ai.request.model", "llama-3-8b")],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }),
        Signal::Metrics => Payload::Metrics(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "vllm:num_requests_running".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: (0..n)
                                .map(|i| NumberDataPoint {
                                    time_unix_nano: 1_700_000_000_000_000_000 + i as u64,
                                    value: Some(number_data_point::Value::AsDouble(i as f64 + 0.5)),
                                    attributes: vec![kv("gpu", &i.to_string())],
                                    ..Default::default()
                                })
                                .collect(),
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }),
        Signal::Logs => Payload::Logs(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: resource(),
                scope_logs: vec![ScopeLogs {
                    log_records: (0..n)
                        .map(|i| LogRecord {
                            time_unix_nano: 1_700_000_000_000_000_000 + i as u64,
                            severity_text: "WARN".into(),
                            body: Some(AnyValue {
                                value: Some(any_value::Value::StringValue(format!("kv cache {i}"))),
                            }),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }),
    }
}

/// An exporter built through its factory, with its self-metrics.
pub struct Built {
    pub node: NodeRef,
    pub metrics: ExporterMetrics,
}

/// Creates and starts an exporter of `factory` for `signal` from JSON settings.
pub async fn start(factory: &dyn ExporterFactory, cfg: serde_json::Value, signal: Signal) -> Built {
    factory.validate(&cfg).unwrap_or_else(|e| panic!("validate {cfg}: {e} at {:?}", e.path));
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse(factory.type_name()).unwrap();
    let metrics = telemetry.exporter(&id, signal);
    let node =
        factory.create(CreateContext::new(id, telemetry), &cfg, signal).unwrap_or_else(|e| panic!("create {cfg}: {e}"));
    node.start().await.unwrap();
    Built { node, metrics }
}

impl Built {
    /// Shuts down with a generous deadline; returns items dropped.
    pub async fn stop(&self) -> u64 {
        self.node.shutdown(Instant::now() + PATIENCE).await
    }
}

/// Retry settings with millisecond intervals.
pub fn fast_retry() -> serde_json::Value {
    serde_json::json!({"enabled": true, "initial_interval": "1ms", "max_interval": "5ms",
        "max_elapsed_time": "20s", "randomization_factor": 0})
}

/// A test PKI on disk: a CA, a server certificate for localhost / 127.0.0.1, a client certificate.
pub struct Pki {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl Pki {
    /// Generates the PKI into a fresh temporary directory.
    pub fn generate(tag: &str) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let dir = std::env::temp_dir().join(format!("inferwatch-exporters-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();

        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "inferwatch test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let leaf = |sans: Vec<String>, cn: &str, eku: ExtendedKeyUsagePurpose| {
            let mut p = CertificateParams::new(sans).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            p.extended_key_usages = vec![eku];
            p.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert_pem, server_key_pem) =
            leaf(vec!["localhost".into(), "127.0.0.1".into()], "localhost", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert_pem, client_key_pem) = leaf(vec![], "inferwatch agent", ExtendedKeyUsagePurpose::ClientAuth);

        let pki = Pki { dir, ca_pem: ca_cert.pem(), server_cert_pem, server_key_pem };
        std::fs::write(pki.ca_file(), &pki.ca_pem).unwrap();
        std::fs::write(pki.client_cert_file(), client_cert_pem).unwrap();
        std::fs::write(pki.client_key_file(), client_key_pem).unwrap();
        pki
    }

    /// Path of the CA certificate.
    pub fn ca_file(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }

    /// Path of the client certificate.
    pub fn client_cert_file(&self) -> String {
        self.dir.join("client.pem").display().to_string()
    }

    /// Path of the client key.
    pub fn client_key_file(&self) -> String {
        self.dir.join("client.key").display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
