//! Settings of the `prometheusremotewrite` exporter and their checks.

use super::send::{REMOTE_WRITE_VERSION, RemoteWriteSender};
use crate::common;
use crate::http;
use crate::prometheus::{ResourceToTelemetry, check_labels, check_namespace, translate};
use crate::tls;
use inferwatch_core::auth::AuthSettings;
use inferwatch_core::component::{FieldError, parse_config};
use inferwatch_core::exporterhelper::ExporterSettings;
use inferwatch_core::settings::TlsClientSettings;
use parking_lot::Mutex;
use reqwest::Url;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderName, HeaderValue};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Settings of the `prometheusremotewrite` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct RemoteWriteConfig {
    /// The receiver's URL, e.g. `http://127.0.0.1:9090/api/v1/write`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Extra HTTP headers sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Client authenticator extension (`auth: { authenticator: <id> }`, otelcol `configauth`).
    #[serde(default)]
    pub auth: Option<AuthSettings>,
    /// Client TLS for `https://` URLs.
    #[serde(default)]
    pub tls: TlsClientSettings,
    /// Prefix of every metric name.
    #[serde(default)]
    pub namespace: String,
    /// Labels added to every series (a series' own label of the same name wins).
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// Copy resource attributes into labels.
    #[serde(default)]
    pub resource_to_telemetry_conversion: ResourceToTelemetry,
    /// Append unit, `_total` and `_ratio` suffixes to names.
    #[serde(default = "default_true")]
    pub add_metric_suffixes: bool,
    /// `timeout` (of one request, connection included; default 5s), `sending_queue` (one
    /// consumer, see the module doc, also when the key is not given), `retry_on_failure`.
    #[serde(skip)]
    pub exporter: ExporterSettings,
}

common::with_exporter_settings!(
    RemoteWriteConfig,
    ExporterSettings::with_timeout(Duration::from_secs(5)).one_consumer()
);

pub(super) fn default_true() -> bool {
    true
}

impl RemoteWriteConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: RemoteWriteConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    pub(super) fn check(&self) -> Result<(), FieldError> {
        self.url()?;
        check_namespace(&self.namespace)?;
        check_labels("external_labels", &self.external_labels)?;
        http::headers(&self.headers)?;
        tls::validate(&self.tls)?;
        self.exporter.check_one_consumer(
            "prometheusremotewrite: one sending consumer keeps the samples of each series in order (Prometheus \
             refuses out-of-order samples)",
        )
    }

    /// The receiver's URL.
    pub fn url(&self) -> Result<Url, FieldError> {
        let Some(s) = &self.endpoint else {
            return Err(FieldError::at("endpoint", "endpoint is required (e.g. http://127.0.0.1:9090/api/v1/write)"));
        };
        http::parse_url("endpoint", s)
    }

    /// The translation settings.
    pub fn settings(&self) -> Result<translate::Settings, FieldError> {
        Ok(translate::Settings {
            namespace: self.namespace.clone(),
            add_metric_suffixes: self.add_metric_suffixes,
            resource_to_telemetry: self.resource_to_telemetry_conversion.enabled,
            extra_labels: check_labels("external_labels", &self.external_labels)?,
        })
    }

    /// The sender (HTTP client, headers) for these settings.
    pub fn sender(&self) -> Result<RemoteWriteSender, FieldError> {
        self.check()?;
        let url = self.url()?;
        let client = http::client(&url, &self.tls, self.exporter.timeout(), reqwest::redirect::Policy::none())?;
        let mut h = http::headers(&self.headers)?;
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("snappy"));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"));
        h.insert(
            HeaderName::from_static("x-prometheus-remote-write-version"),
            HeaderValue::from_static(REMOTE_WRITE_VERSION),
        );
        Ok(RemoteWriteSender {
            settings: self.settings()?,
            url,
            headers: h,
            client,
            target_info: RemoteWriteSender::target_info_name(&self.namespace),
            target_times: Mutex::new(HashMap::new()),
            auth: None,
        })
    }
}
