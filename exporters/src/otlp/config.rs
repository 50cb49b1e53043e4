//! Settings of the `otlp` exporter and their checks.

use crate::client_config::{ClientSettings, with_client_settings};
use crate::tls;
use inferwatch_core::component::{FieldError, parse_config};
use inferwatch_core::exporterhelper::ExporterSettings;
use inferwatch_core::settings::{Endpoint, GoDuration};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::metadata::{AsciiMetadataValue, BinaryMetadataKey, BinaryMetadataValue, MetadataKey, MetadataMap};

/// `keepalive` settings (otelcol configgrpc `KeepaliveClientConfig`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveSettings {
    /// Interval of HTTP/2 PINGs (0 disables them).
    pub time: GoDuration,
    /// How long to wait for a PING acknowledgement before closing the connection.
    pub timeout: GoDuration,
    /// Also ping while no request is in flight.
    pub permit_without_stream: bool,
}

impl Default for KeepaliveSettings {
    fn default() -> Self {
        KeepaliveSettings {
            time: GoDuration(Duration::from_secs(10)),
            timeout: GoDuration(Duration::from_secs(10)),
            permit_without_stream: false,
        }
    }
}

/// Settings of the `otlp` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct OtlpConfig {
    /// `host:port`, or `http(s)://host:port` (the scheme chooses plain text or TLS). Required.
    #[serde(default)]
    pub endpoint: Option<Endpoint>,
    /// `tls` (on by default unless `insecure: true` or an `http://` endpoint), `headers` (gRPC
    /// metadata), `auth`, `compression`, `compression_params`.
    #[serde(skip)]
    pub client: ClientSettings,
    /// `timeout` (of one export call; default 5s), `sending_queue`, `retry_on_failure`.
    #[serde(skip)]
    pub exporter: ExporterSettings,
    /// gRPC load-balancing policy: `pick_first` or `round_robin` (one connection is used either way).
    #[serde(default)]
    pub balancer_name: Option<String>,
    /// HTTP/2 keepalive pings.
    #[serde(default)]
    pub keepalive: KeepaliveSettings,
}

with_client_settings!(OtlpConfig, ExporterSettings::with_timeout(Duration::from_secs(5)));

impl OtlpConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: OtlpConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    pub(super) fn check(&self) -> Result<(), FieldError> {
        self.client.compression_params.check().map_err(|e| FieldError::at("compression_params.level", e))?;
        let ep = self.endpoint()?;
        if !ep.path.is_empty() {
            return Err(FieldError::at("endpoint", format!("a gRPC endpoint has no path (got {:?})", ep.path)));
        }
        tls::validate(&self.client.tls)?;
        let t = &self.client.tls;
        let wants_tls = t.ca_file.is_some() || t.cert_file.is_some() || t.insecure_skip_verify;
        if wants_tls && !self.use_tls() {
            let why =
                if ep.scheme.as_deref() == Some("http") { "the endpoint is http://" } else { "tls.insecure is true" };
            return Err(FieldError::at(
                "tls",
                format!("{why} (plain text) but TLS files or insecure_skip_verify are set; use one or the other"),
            ));
        }
        metadata(&self.client.headers)?;
        match self.balancer_name.as_deref() {
            None | Some("") | Some("pick_first") | Some("round_robin") => {}
            Some(b) => {
                return Err(FieldError::at(
                    "balancer_name",
                    format!("unknown balancer {b:?}: use pick_first or round_robin"),
                ));
            }
        }
        self.exporter.check()
    }

    /// The endpoint, or the error that it is missing.
    pub fn endpoint(&self) -> Result<&Endpoint, FieldError> {
        self.endpoint
            .as_ref()
            .ok_or_else(|| FieldError::at("endpoint", "endpoint is required (host:port or http(s)://host:port)"))
    }

    /// Whether the connection uses TLS: `https://` always, `http://` never, else unless `tls.insecure`.
    pub fn use_tls(&self) -> bool {
        match self.endpoint.as_ref().and_then(|e| e.scheme.as_deref()) {
            Some("https") => true,
            Some("http") => false,
            _ => !self.client.tls.insecure,
        }
    }
}

/// Builds the gRPC metadata for `headers` (keys ending in `-bin` are binary metadata).
pub(super) fn metadata(headers: &BTreeMap<String, String>) -> Result<MetadataMap, FieldError> {
    let mut m = MetadataMap::new();
    for (k, v) in headers {
        let at = || format!("headers.{k}");
        if k.ends_with("-bin") {
            let key = BinaryMetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| FieldError::at(&at(), format!("invalid gRPC metadata key {k:?}")))?;
            m.insert_bin(key, BinaryMetadataValue::from_bytes(v.as_bytes()));
        } else {
            let key = MetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| FieldError::at(&at(), format!("invalid gRPC metadata key {k:?}")))?;
            let val = AsciiMetadataValue::try_from(v.as_str())
                .map_err(|_| FieldError::at(&at(), "invalid gRPC metadata value (visible ASCII only)"))?;
            m.insert(key, val);
        }
    }
    Ok(m)
}
