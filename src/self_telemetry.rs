//! The agent's own telemetry as otelcol sets it up: the `service.telemetry.resource` (with
//! otelcol's `service.name` / `service.instance.id` / `service.version` defaults), and the
//! `metrics.readers[].periodic` OTLP push of the self-metrics registry.
//!
//! Each registry family becomes one observable instrument of an opentelemetry_sdk meter (a
//! counter family a monotonic cumulative sum, a gauge family a gauge), read when the
//! `PeriodicReader` collects; families registered later get their instrument when they are
//! registered. The reader runs on its own thread and exports one collection at a time with the
//! opentelemetry-otlp exporter: an unreachable endpoint costs that thread one export timeout per
//! interval, never a queue and never the pipeline.

use anyhow::Context;
use inferwatch_core::config::{OtlpProtocol, OtlpPushConfig, PeriodicReaderConfig, TelemetryConfig, Temporality};
use inferwatch_core::telemetry::{MetricFamily, MetricKind, Number, NumberKind, Telemetry};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use std::sync::Arc;
use std::time::Duration;

/// The resource of the agent's own telemetry: otelcol's defaults (`service.name`,
/// `service.instance.id`, `service.version`) overridden, extended or removed (a `null` value)
/// by `service.telemetry.resource`, in that order.
pub fn resource(cfg: &TelemetryConfig) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![
        ("service.name".into(), "inferwatch".into()),
        ("service.instance.id".into(), instance_id()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
    ];
    for (k, v) in &cfg.resource {
        out.retain(|(n, _)| n != k);
        if let Some(v) = v {
            out.push((k.clone(), v.clone()));
        }
    }
    out
}

/// A random (version 4) UUID, as otelcol's default `service.instance.id`.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the operating system's randomness.
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        h.finish()
    };
    let (hi, lo) = (word(), word());
    let hi = (hi & !0xf000) | 0x4000; // version 4
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The running periodic readers; [`SelfMetricsPush::shutdown`] makes a last export.
pub struct SelfMetricsPush {
    provider: SdkMeterProvider,
}

impl SelfMetricsPush {
    /// Starts one `PeriodicReader` per configured reader (none: `None`). Must run inside the
    /// Tokio runtime (the gRPC channel's connection task lives there).
    pub fn start(
        readers: &[PeriodicReaderConfig],
        telemetry: &Arc<Telemetry>,
        resource: &[(String, String)],
    ) -> anyhow::Result<Option<SelfMetricsPush>> {
        if readers.is_empty() {
            return Ok(None);
        }
        let mut builder = SdkMeterProvider::builder().with_resource(
            Resource::builder_empty()
                .with_attributes(resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
                .build(),
        );
        for (i, r) in readers.iter().enumerate() {
            let exporter = exporter(&r.exporter, r.timeout)
                .with_context(|| format!("service.telemetry.metrics.readers: periodic reader {i}"))?;
            builder = builder.with_reader(PeriodicReader::builder(exporter).with_interval(r.interval).build());
            tracing::info!(
                endpoint = %r.exporter.endpoint,
                protocol = ?r.exporter.protocol,
                interval = ?r.interval,
                "pushing the agent's own metrics over OTLP"
            );
        }
        let provider = builder.build();
        let scope =
            opentelemetry::InstrumentationScope::builder("inferwatch").with_version(env!("CARGO_PKG_VERSION")).build();
        let meter = provider.meter_with_scope(scope);
        telemetry.on_family(move |f| instrument(&meter, f));
        Ok(Some(SelfMetricsPush { provider }))
    }

    /// Exports once more and stops the readers (off the async threads: the export blocks).
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the last push of the agent's own metrics failed"),
            Err(e) => tracing::warn!(error = %e, "stopping the self-metrics push failed"),
        }
    }
}

/// Attributes of one sample.
fn attributes(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect()
}

/// Registers one observable instrument reading `f` at each collection.
fn instrument(meter: &Meter, f: &Arc<MetricFamily>) {
    let name = f.name().to_string();
    let help = f.help().to_string();
    let unit = f.unit().map_or("", |u| u.ucum());
    let fam = f.clone();
    // The instruments stay registered with the provider; their handles are not needed.
    match (f.kind(), f.number_kind()) {
        (MetricKind::Counter, NumberKind::Int) => {
            meter
                .u64_observable_counter(name)
                .with_description(help)
                .with_unit(unit)
                .with_callback(move |o| {
                    for (l, v) in fam.samples() {
                        if let Number::U64(v) = v {
                            o.observe(v, &attributes(&l));
                        }
                    }
                })
                .build();
        }
        (MetricKind::Counter, NumberKind::Float) => {
            meter
                .f64_observable_counter(name)
                .with_description(help)
                .with_unit(unit)
                .with_callback(move |o| {
                    for (l, v) in fam.samples() {
                        o.observe(v.as_f64(), &attributes(&l));
                    }
                })
                .build();
        }
        (MetricKind::Gauge, NumberKind::Int) => {
            meter
                .i64_observable_gauge(name)
                .with_description(help)
                .with_unit(unit)
                .with_callback(move |o| {
                    for (l, v) in fam.samples() {
                        if let Number::I64(v) = v {
                            o.observe(v, &attributes(&l));
                        }
                    }
                })
                .build();
        }
        (MetricKind::Gauge, NumberKind::Float) => {
            meter
                .f64_observable_gauge(name)
                .with_description(help)
                .with_unit(unit)
                .with_callback(move |o| {
                    for (l, v) in fam.samples() {
                        o.observe(v.as_f64(), &attributes(&l));
                    }
                })
                .build();
        }
    }
}

/// The URL an HTTP exporter posts to: the endpoint's own path, or `/v1/metrics` when it has
/// none (as otelcol's configuration schema does).
fn http_url(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    match rest.find('/') {
        Some(i) if rest.len() > i + 1 => endpoint.to_string(),
        _ => format!("{}/v1/metrics", endpoint.trim_end_matches('/')),
    }
}

/// The gRPC endpoint with a scheme (`host:port` gets `http://` when insecure, else `https://`).
fn grpc_url(c: &OtlpPushConfig) -> String {
    if c.endpoint.contains("://") {
        c.endpoint.clone()
    } else {
        format!("{}://{}", if c.use_tls() { "https" } else { "http" }, c.endpoint)
    }
}

fn read(path: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {path:?}"))
}

/// Builds the OTLP metric exporter; one export (with its retries) takes at most
/// `min(exporter.timeout, reader timeout)`.
fn exporter(c: &OtlpPushConfig, reader_timeout: Duration) -> anyhow::Result<opentelemetry_otlp::MetricExporter> {
    let timeout = c.timeout.min(reader_timeout);
    let temporality = match c.temporality {
        Temporality::Cumulative => opentelemetry_sdk::metrics::Temporality::Cumulative,
        Temporality::Delta => opentelemetry_sdk::metrics::Temporality::Delta,
        Temporality::LowMemory => opentelemetry_sdk::metrics::Temporality::LowMemory,
    };
    let compression = c.gzip.then_some(opentelemetry_otlp::Compression::Gzip);
    let built = match c.protocol {
        OtlpProtocol::Grpc => {
            let mut b = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(grpc_url(c))
                .with_timeout(timeout)
                .with_metadata(metadata(&c.headers)?);
            if let Some(z) = compression {
                b = b.with_compression(z);
            }
            if c.use_tls() {
                use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
                let mut tls = ClientTlsConfig::new();
                tls = match &c.certificate {
                    Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
                    None => tls.with_native_roots(),
                };
                if let (Some(cert), Some(key)) = (&c.client_certificate, &c.client_key) {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                b = b.with_tls_config(tls);
            }
            b.with_temporality(temporality).build()
        }
        OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => {
            let protocol = if c.protocol == OtlpProtocol::HttpJson {
                opentelemetry_otlp::Protocol::HttpJson
            } else {
                opentelemetry_otlp::Protocol::HttpBinary
            };
            let mut b = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(protocol)
                .with_endpoint(http_url(&c.endpoint))
                .with_timeout(timeout)
                .with_http_client(http_client(c, timeout)?)
                .with_headers(c.headers.iter().cloned().collect());
            if let Some(z) = compression {
                b = b.with_compression(z);
            }
            b.with_temporality(temporality).build()
        }
    };
    built.context("cannot build the OTLP metric exporter")
}

/// gRPC metadata from the headers (ASCII values).
fn metadata(headers: &[(String, String)]) -> anyhow::Result<opentelemetry_otlp::tonic_types::metadata::MetadataMap> {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let name = reqwest::header::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
            .with_context(|| format!("invalid header name {k:?}"))?;
        let value =
            reqwest::header::HeaderValue::from_str(v).with_context(|| format!("invalid value of header {k:?}"))?;
        map.append(name, value);
    }
    Ok(opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(map))
}

/// A blocking reqwest client (the reader's thread has no async runtime) with the agent's rustls
/// configuration: `certificate` as the only root, else the platform's; the client identity when set.
fn http_client(c: &OtlpPushConfig, timeout: Duration) -> anyhow::Result<reqwest::blocking::Client> {
    use inferwatch_core::tls::client;
    let tls = if c.use_tls() {
        let s = inferwatch_core::settings::TlsClientSettings {
            ca_file: c.certificate.clone(),
            cert_file: c.client_certificate.clone(),
            key_file: c.client_key.clone(),
            ..Default::default()
        };
        client::client_config(&s)?
    } else {
        client::plaintext_client_config()?
    };
    // reqwest's blocking client runs a runtime of its own: build it off the async threads.
    std::thread::spawn(move || {
        reqwest::blocking::Client::builder().timeout(timeout).tls_backend_preconfigured(tls).build()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the HTTP client panicked"))?
    .context("cannot build the HTTP client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_defaults_are_overridden_extended_and_removed() {
        let cfg = TelemetryConfig {
            resource: vec![
                ("service.name".into(), Some("edge-agent".into())),
                ("service.version".into(), None),
                ("k8s.pod.name".into(), Some("p-0".into())),
            ],
            ..Default::default()
        };
        let r = resource(&cfg);
        let keys: Vec<&str> = r.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["service.instance.id", "service.name", "k8s.pod.name"]);
        assert_eq!(r[1].1, "edge-agent");
        let id = &r[0].1;
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "version 4: {id}");
        assert!("89ab".contains(&id[19..20]), "variant: {id}");
        assert_ne!(instance_id(), instance_id());
        let d = resource(&TelemetryConfig::default());
        assert_eq!(d[0], ("service.name".to_string(), "inferwatch".to_string()));
        assert_eq!(d[2], ("service.version".to_string(), env!("CARGO_PKG_VERSION").to_string()));
    }

    #[test]
    fn http_endpoints_get_the_metrics_path_only_when_they_have_none() {
        assert_eq!(http_url("http://localhost:4318"), "http://localhost:4318/v1/metrics");
        assert_eq!(http_url("http://localhost:4318/"), "http://localhost:4318/v1/metrics");
        assert_eq!(http_url("https://h:1/otlp/v1/metrics"), "https://h:1/otlp/v1/metrics");
        let mut c = OtlpPushConfig {
            protocol: OtlpProtocol::Grpc,
            endpoint: "127.0.0.1:4317".into(),
            headers: vec![],
            gzip: false,
            timeout: Duration::from_secs(1),
            insecure: true,
            certificate: None,
            client_certificate: None,
            client_key: None,
            temporality: Temporality::Cumulative,
        };
        assert_eq!(grpc_url(&c), "http://127.0.0.1:4317");
        c.insecure = false;
        assert_eq!(grpc_url(&c), "https://127.0.0.1:4317");
    }
}
