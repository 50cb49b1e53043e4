//! The `prometheusremotewrite` exporter: Prometheus remote write 1.0 (otelcol's
//! `prometheusremotewriteexporter`) to any receiver (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, Thanos receive, VictoriaMetrics, ...).
//!
//! - Protobuf `WriteRequest` ([`proto`]), snappy block-compressed, with `Content-Encoding:
//!   snappy`, `Content-Type: application/x-protobuf`, `X-Prometheus-Remote-Write-Version: 0.1.0`.
//! - The same translation as the `prometheus` exporter (shared `translate`), the same
//!   preparation (DELTA sums and histograms accumulated into cumulative ones, exponential
//!   histograms converted to classic buckets; what cannot be sent is dropped and counted in
//!   `otelcol_processor_dropped_metric_points{processor="<exporter id>"}`).
//! - Ordered per series: payloads are prepared one at a time and queued in arrival order, and
//!   ONE sending consumer delivers them (`sending_queue.num_consumers` must be 1), retrying a
//!   request before the next is sent, so one series never has two requests in flight. Samples
//!   of a series within a request are sorted by time.
//! - HTTP 5xx and 429 are retried (honouring `Retry-After`); other 4xx are permanent: the
//!   request is dropped and counted in `otelcol_exporter_send_failed_metric_points`.

pub mod proto;
pub mod sender;

use crate::common;
use crate::prometheus::cumulative::DeltaToCumulative;
use crate::prometheus::{ResourceToTelemetry, check_labels, check_namespace, translate, unix_now_ns};
use crate::tls;
use async_trait::async_trait;
use inferwatch_core::auth::AuthSettings;
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{GoDuration, QueueSettings, RetrySettings, TlsClientSettings};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use reqwest::Url;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use sender::{REMOTE_WRITE_VERSION, RemoteWriteSender};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Delta series whose running totals are kept at most.
pub const DELTA_MAX_SERIES: usize = 100_000;
/// A delta series not updated for this long is forgotten (its next point starts it afresh).
pub const DELTA_IDLE: Duration = Duration::from_secs(300);

/// Settings of the `prometheusremotewrite` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
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
    /// Deadline of one request, connection included (0: none).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
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
    /// Sending queue; one consumer (see the module doc), also when the key is not given.
    #[serde(default = "default_queue", deserialize_with = "queue_one_consumer")]
    pub sending_queue: QueueSettings,
    /// Retries with back-off.
    #[serde(default)]
    pub retry_on_failure: RetrySettings,
}

fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(5))
}

fn default_true() -> bool {
    true
}

fn default_queue() -> QueueSettings {
    QueueSettings { num_consumers: 1, ..QueueSettings::default() }
}

/// `sending_queue` as written: absent keys take the defaults, `num_consumers` 1.
fn queue_one_consumer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<QueueSettings, D::Error> {
    QueueSettings::deserialize_over(d, default_queue())
}

impl RemoteWriteConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: RemoteWriteConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.url()?;
        check_namespace(&self.namespace)?;
        check_labels("external_labels", &self.external_labels)?;
        headers(&self.headers)?;
        tls::validate(&self.tls)?;
        common::validate_queue(&self.sending_queue)?;
        if self.sending_queue.enabled && self.sending_queue.num_consumers != 1 {
            return Err(FieldError::at(
                "sending_queue.num_consumers",
                "num_consumers must be 1 for prometheusremotewrite: one sending consumer keeps the samples of \
                 each series in order (Prometheus refuses out-of-order samples)",
            ));
        }
        common::validate_retry(&self.retry_on_failure)?;
        Ok(())
    }

    /// The receiver's URL.
    pub fn url(&self) -> Result<Url, FieldError> {
        let Some(s) = &self.endpoint else {
            return Err(FieldError::at("endpoint", "endpoint is required (e.g. http://127.0.0.1:9090/api/v1/write)"));
        };
        let url = Url::parse(s).map_err(|e| FieldError::at("endpoint", format!("invalid URL {s:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FieldError::at("endpoint", format!("invalid URL {s:?}: the scheme must be http or https")));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(FieldError::at("endpoint", format!("invalid URL {s:?}: missing host")));
        }
        Ok(url)
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
        let tls_config = if url.scheme() == "https" {
            tls::client_config(&self.tls).map_err(tls::TlsError::into_field_error)?
        } else {
            tls::plaintext_client_config().map_err(tls::TlsError::into_field_error)?
        };
        let mut b = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config)
            .user_agent(common::USER_AGENT)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(t) = common::non_zero(self.timeout.0) {
            b = b.timeout(t).connect_timeout(t);
        }
        let client = b.build().map_err(|e| FieldError::at("tls", format!("cannot build the HTTP client: {e}")))?;
        let mut h = headers(&self.headers)?;
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

/// Builds the header map for `headers`.
fn headers(h: &BTreeMap<String, String>) -> Result<HeaderMap, FieldError> {
    let mut m = HeaderMap::new();
    for (k, v) in h {
        let at = format!("headers.{k}");
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| FieldError::at(&at, format!("invalid HTTP header name {k:?}")))?;
        let mut value = HeaderValue::from_str(v).map_err(|_| FieldError::at(&at, "invalid HTTP header value"))?;
        value.set_sensitive(true);
        m.insert(name, value);
    }
    Ok(m)
}

/// Factory of the `prometheusremotewrite` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct RemoteWriteExporterFactory;

impl ExporterFactory for RemoteWriteExporterFactory {
    fn type_name(&self) -> &'static str {
        "prometheusremotewrite"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Metrics]
    }

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        RemoteWriteConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        if signal != Signal::Metrics {
            return Err(ComponentError::Start(format!("exporter \"{}\" exports metrics only, not {signal}", ctx.id)));
        }
        let c = RemoteWriteConfig::from_value(cfg)?;
        let mut sender = c.sender()?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        let inner = common::node(&ctx, signal, Arc::new(sender), c.sending_queue.clone(), c.retry_on_failure.clone())?;
        Ok(Arc::new(RemoteWriteExporter {
            name: ctx.id.to_string(),
            delta: Mutex::new(DeltaToCumulative::new(DELTA_MAX_SERIES, DELTA_IDLE)),
            order: tokio::sync::Mutex::new(()),
            inner,
            dropped: ctx.telemetry.processor(&ctx.id, Signal::Metrics).dropped,
        }))
    }
}

/// The exporter node: prepares each payload (delta → cumulative) in arrival order, then hands
/// it to the queued sender.
pub struct RemoteWriteExporter {
    name: String,
    delta: Mutex<DeltaToCumulative>,
    /// Held while a payload is prepared and queued, so queue order is preparation order.
    order: tokio::sync::Mutex<()>,
    inner: NodeRef,
    dropped: Counter,
}

#[async_trait]
impl Consumer for RemoteWriteExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let mut req = match data.into_decoded() {
            Ok(Payload::Metrics(r)) => r,
            Ok(other) => {
                return Err(ConsumeError::Permanent(format!(
                    "exporter {} takes metrics, got {}",
                    self.name,
                    other.signal()
                )));
            }
            Err(e) => {
                return Err(ConsumeError::Permanent(format!("exporter {}: cannot decode the payload: {e}", self.name)));
            }
        };
        let _order = self.order.lock().await;
        let (removed, undo) = self.delta.lock().normalize(&mut req, Instant::now(), unix_now_ns());
        let result = self.inner.consume(Payload::Metrics(req)).await;
        match &result {
            // Nothing of it was kept and the sender will offer it again: forget its deltas.
            Err(e) if e.is_retryable() => self.delta.lock().undo(undo),
            _ => {
                if removed.total() > 0 {
                    self.dropped.inc_by(removed.total());
                    tracing::debug!(exporter = %self.name, invalid = removed.invalid, out_of_order = removed.stale,
                        over_limit = removed.over_limit, "prometheusremotewrite dropped points it cannot send");
                }
            }
        }
        result
    }
}

#[async_trait]
impl Node for RemoteWriteExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.inner.start().await
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        self.inner.shutdown(deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::PathSeg;
    use serde_json::json;

    #[test]
    fn defaults() {
        let c = RemoteWriteConfig::from_value(&json!({"endpoint": "http://127.0.0.1:9090/api/v1/write"})).unwrap();
        assert_eq!(c.timeout.0, Duration::from_secs(5));
        assert_eq!(c.sending_queue.num_consumers, 1);
        assert!(c.sending_queue.enabled);
        assert!(c.add_metric_suffixes);
        let q = json!({"endpoint": "http://p:1/w", "sending_queue": {"queue_size": 7}});
        let c2 = RemoteWriteConfig::from_value(&q).unwrap();
        assert_eq!((c2.sending_queue.num_consumers, c2.sending_queue.queue_size), (1, 7));
        let s = c.sender().unwrap();
        assert_eq!(s.headers.get(CONTENT_ENCODING).unwrap(), "snappy");
        assert_eq!(s.headers.get(CONTENT_TYPE).unwrap(), "application/x-protobuf");
        assert_eq!(s.headers.get("x-prometheus-remote-write-version").unwrap(), "0.1.0");
    }

    #[test]
    fn bad_settings_point_at_the_field() {
        let key = |p: &[PathSeg]| -> Vec<String> {
            p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
        };
        let ok = "http://p:9090/api/v1/write";
        let cases = [
            (json!({}), vec!["endpoint"]),
            (json!({"endpoint": "p:9090"}), vec!["endpoint"]),
            (json!({"endpoint": "ftp://p/x"}), vec!["endpoint"]),
            (json!({"endpoint": ok, "sending_queue": {"num_consumers": 4}}), vec!["sending_queue", "num_consumers"]),
            (json!({"endpoint": ok, "external_labels": {"__x": "1"}}), vec!["external_labels", "__x"]),
            (json!({"endpoint": ok, "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
            (json!({"endpoint": ok, "namespace": "a-b"}), vec!["namespace"]),
            (json!({"endpoint": ok, "remote_write_queue": {}}), vec!["remote_write_queue"]),
        ];
        for (v, path) in cases {
            let e = RemoteWriteExporterFactory.validate(&v).expect_err(&v.to_string());
            assert_eq!(key(&e.path), path, "{v}: {}", e.message);
        }
        // A disabled queue sends in the caller's task: num_consumers does not matter then.
        let v = json!({"endpoint": ok, "sending_queue": {"enabled": false, "num_consumers": 4}});
        assert!(RemoteWriteExporterFactory.validate(&v).is_ok());
    }
}
