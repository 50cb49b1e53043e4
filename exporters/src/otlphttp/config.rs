//! Settings of the `otlphttp` exporter and their checks.

use crate::client_config::{ClientSettings, with_client_settings};
use crate::http::{self};
use crate::tls;
use inferwatch_core::component::{FieldError, parse_config};
use inferwatch_core::exporterhelper::ExporterSettings;
use inferwatch_core::pdata::Signal;
use reqwest::Url;
use serde::Deserialize;
use std::time::Duration;

/// Body encoding of OTLP/HTTP requests.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Binary protobuf (`application/x-protobuf`).
    #[default]
    Proto,
    /// OTLP/JSON (`application/json`).
    Json,
}

impl Encoding {
    /// The request `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Proto => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// Settings of the `otlphttp` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct OtlpHttpConfig {
    /// Base URL; `/v1/traces`, `/v1/metrics`, `/v1/logs` are appended to its path.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Full URL for traces, replacing `endpoint` + `/v1/traces`.
    #[serde(default)]
    pub traces_endpoint: Option<String>,
    /// Full URL for metrics.
    #[serde(default)]
    pub metrics_endpoint: Option<String>,
    /// Full URL for logs.
    #[serde(default)]
    pub logs_endpoint: Option<String>,
    /// Body encoding (`proto` by default, or `json`).
    #[serde(default)]
    pub encoding: Encoding,
    /// `timeout` (of one request, connection included; default 30s), `sending_queue`,
    /// `retry_on_failure`.
    #[serde(skip)]
    pub exporter: ExporterSettings,
    /// `tls` (for `https://` URLs), `headers` (HTTP), `auth`, `compression`, `compression_params`.
    #[serde(skip)]
    pub client: ClientSettings,
}

with_client_settings!(OtlpHttpConfig, ExporterSettings::with_timeout(Duration::from_secs(30)));

impl OtlpHttpConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: OtlpHttpConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    pub(super) fn check(&self) -> Result<(), FieldError> {
        self.client.compression_params.check().map_err(|e| FieldError::at("compression_params.level", e))?;
        if self.endpoint.is_none()
            && self.traces_endpoint.is_none()
            && self.metrics_endpoint.is_none()
            && self.logs_endpoint.is_none()
        {
            return Err(FieldError::at(
                "endpoint",
                "endpoint is required (or traces_endpoint / metrics_endpoint / logs_endpoint)",
            ));
        }
        for s in Signal::ALL {
            self.signal_url(s)?;
        }
        tls::validate(&self.client.tls)?;
        http::headers(&self.client.headers)?;
        self.exporter.check()
    }

    /// The URL `signal` is sent to, if one is configured.
    pub fn signal_url(&self, signal: Signal) -> Result<Option<Url>, FieldError> {
        let (key, over) = match signal {
            Signal::Traces => ("traces_endpoint", &self.traces_endpoint),
            Signal::Metrics => ("metrics_endpoint", &self.metrics_endpoint),
            Signal::Logs => ("logs_endpoint", &self.logs_endpoint),
        };
        if let Some(u) = over {
            return parse_url(key, u, self.client.tls.insecure).map(Some);
        }
        let Some(base) = &self.endpoint else { return Ok(None) };
        let mut url = parse_url("endpoint", base, self.client.tls.insecure)?;
        let path = format!("{}/v1/{}", url.path().trim_end_matches('/'), signal.as_str());
        url.set_path(&path);
        Ok(Some(url))
    }
}

/// Parses an `http(s)://` URL; a bare `host:port` gets `https://` (or `http://` with `tls.insecure`).
pub(super) fn parse_url(key: &str, s: &str, insecure: bool) -> Result<Url, FieldError> {
    let full =
        if s.contains("://") { s.to_string() } else { format!("{}://{s}", if insecure { "http" } else { "https" }) };
    let url = Url::parse(&full).map_err(|e| FieldError::at(key, format!("invalid URL {s:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: the scheme must be http or https")));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: missing host")));
    }
    Ok(url)
}
