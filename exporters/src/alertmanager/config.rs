//! Settings of the `alertmanager` exporter and their checks.

use crate::common;
use crate::http::{self};
use crate::tls;
use inferwatch_core::auth::AuthSettings;
use inferwatch_core::component::{FieldError, parse_config};
use inferwatch_core::exporterhelper::ExporterSettings;
use inferwatch_core::settings::{GoDuration, TlsClientSettings};
use reqwest::Url;
use serde::Deserialize;
use std::time::Duration;

/// Settings of the `alertmanager` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Alertmanager's base URL; `/api/v2/alerts` is appended.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Client authenticator extension (`auth: { authenticator: <id> }`, otelcol `configauth`).
    #[serde(default)]
    pub auth: Option<AuthSettings>,
    /// `generatorURL` of every alert.
    #[serde(default = "default_generator_url")]
    pub generator_url: String,
    /// Send resolutions (`endsAt` in the past); otherwise Alertmanager lets alerts time out.
    #[serde(default = "default_true")]
    pub send_resolved: bool,
    /// Wall-clock interval of re-sending still-firing alerts (0: never; Alertmanager then
    /// resolves them after its `resolve_timeout`).
    #[serde(default = "default_repeat")]
    pub repeat: GoDuration,
    /// Client TLS for `https://` endpoints.
    #[serde(default)]
    pub tls: TlsClientSettings,
    /// `timeout` (of one request, connection included; default 5s), `sending_queue` (one
    /// consumer: ordered delivery, also when the key is not given), `retry_on_failure`.
    #[serde(skip)]
    pub exporter: ExporterSettings,
}

common::with_exporter_settings!(
    AlertmanagerConfig,
    ExporterSettings::with_timeout(Duration::from_secs(5)).one_consumer()
);

pub(super) fn default_endpoint() -> String {
    "http://127.0.0.1:9093".into()
}
pub(super) fn default_generator_url() -> String {
    "http://inferwatch/".into()
}
pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_repeat() -> GoDuration {
    GoDuration(Duration::from_secs(60))
}

impl AlertmanagerConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: AlertmanagerConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    pub(super) fn check(&self) -> Result<(), FieldError> {
        self.url()?;
        tls::validate(&self.tls)?;
        self.exporter
            .check_one_consumer("alertmanager: one sending consumer keeps an alert's firing and resolution in order")
    }

    /// The URL alerts are posted to: the endpoint's path + `/api/v2/alerts`.
    pub fn url(&self) -> Result<Url, FieldError> {
        let mut url = http::parse_url("endpoint", &self.endpoint)?;
        let path = format!("{}/api/v2/alerts", url.path().trim_end_matches('/'));
        url.set_path(&path);
        Ok(url)
    }

    /// How far ahead of now a firing alert's `endsAt` is set (3 × repeat; none without repeats).
    pub fn ends_in(&self) -> Option<Duration> {
        common::non_zero(self.repeat.0).map(|r| r * 3)
    }
}
