//! The `prometheus` exporter: serves the latest value of every series on a pull endpoint
//! (otelcol's `prometheusexporter`).
//!
//! - Names and labels follow otelcol's translation ([`translate`]): unit suffixes, `_total`,
//!   `job` / `instance` from the service attributes, `otel_scope_name` / `otel_scope_version`,
//!   one `target_info` gauge per resource.
//! - Cumulative sums and histograms are served as received (start times kept); DELTA sums and
//!   histograms are accumulated into cumulative ones ([`cumulative`]); gauges keep their last
//!   value; summaries stay summaries; exponential histograms are converted to classic buckets.
//! - A series not updated for `metric_expiration` (wall clock) disappears. At most `max_series`
//!   series are held: points of new series beyond that, points older than the stored one,
//!   malformed points and families whose name is taken by another type are dropped and
//!   counted in `otelcol_processor_dropped_metric_points{processor="<exporter id>"}`.
//! - `GET /metrics` answers in the text format 0.0.4, or in OpenMetrics when
//!   `enable_open_metrics` is set and the scraper asks for it in `Accept`.

pub mod accumulator;
pub mod cumulative;
pub mod exposition;
pub mod server;
pub mod translate;

use accumulator::{Accumulator, Outcome};
use async_trait::async_trait;
use cumulative::DeltaToCumulative;
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{GoDuration, HostPort};
use inferwatch_core::telemetry::ExporterMetrics;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `resource_to_telemetry_conversion` (otelcol's key).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ResourceToTelemetry {
    /// Copy every resource attribute into the labels of each series.
    #[serde(default)]
    pub enabled: bool,
}

/// Settings of the `prometheus` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    /// `host:port` the endpoint listens on (`GET /metrics`).
    #[serde(default)]
    pub endpoint: Option<HostPort>,
    /// Server TLS of the endpoint (otelcol `tls`); absent = plain text.
    #[serde(default)]
    pub tls: Option<inferwatch_core::tls::server::TlsServerSettings>,
    /// The authenticator extension that checks every scrape (otelcol `auth`).
    #[serde(default)]
    pub auth: Option<inferwatch_core::auth::AuthSettings>,
    /// Prefix of every metric name.
    #[serde(default)]
    pub namespace: String,
    /// Labels added to every series (a series' own label of the same name wins).
    #[serde(default)]
    pub const_labels: BTreeMap<String, String>,
    /// A series not updated for this long (wall clock) disappears.
    #[serde(default = "default_expiration")]
    pub metric_expiration: GoDuration,
    /// Copy resource attributes into labels.
    #[serde(default)]
    pub resource_to_telemetry_conversion: ResourceToTelemetry,
    /// Append unit, `_total` and `_ratio` suffixes to names.
    #[serde(default = "default_true")]
    pub add_metric_suffixes: bool,
    /// Answer in OpenMetrics when the scraper asks for it.
    #[serde(default)]
    pub enable_open_metrics: bool,
    /// Most series held; points of new series beyond it are dropped and counted.
    #[serde(default = "default_max_series")]
    pub max_series: usize,
}

fn default_expiration() -> GoDuration {
    GoDuration(Duration::from_secs(300))
}

fn default_true() -> bool {
    true
}

fn default_max_series() -> usize {
    100_000
}

/// Checks a `namespace` setting (empty, or a valid metric name prefix).
pub(crate) fn check_namespace(ns: &str) -> Result<(), FieldError> {
    if !ns.is_empty() && !translate::is_valid_metric_name(ns) {
        return Err(FieldError::at("namespace", format!("namespace {ns:?} must match [a-zA-Z_:][a-zA-Z0-9_:]*")));
    }
    Ok(())
}

/// Checks a map of labels added to every series; returns them as sorted labels.
pub(crate) fn check_labels(key: &str, labels: &BTreeMap<String, String>) -> Result<translate::Labels, FieldError> {
    for k in labels.keys() {
        if !translate::is_valid_label_name(k) || k.starts_with("__") {
            return Err(FieldError::at(
                &format!("{key}.{k}"),
                format!("{k:?} is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"),
            ));
        }
    }
    Ok(labels.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect())
}

impl PrometheusConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: PrometheusConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FieldError> {
        if self.endpoint.is_none() {
            return Err(FieldError::at("endpoint", "endpoint is required (host:port to serve /metrics on)"));
        }
        check_namespace(&self.namespace)?;
        check_labels("const_labels", &self.const_labels)?;
        if self.metric_expiration.0.is_zero() {
            return Err(FieldError::at("metric_expiration", "metric_expiration must be positive"));
        }
        if self.max_series == 0 {
            return Err(FieldError::at("max_series", "max_series must be positive"));
        }
        Ok(())
    }

    /// The translation settings.
    pub fn settings(&self) -> Result<translate::Settings, FieldError> {
        Ok(translate::Settings {
            namespace: self.namespace.clone(),
            add_metric_suffixes: self.add_metric_suffixes,
            resource_to_telemetry: self.resource_to_telemetry_conversion.enabled,
            extra_labels: check_labels("const_labels", &self.const_labels)?,
        })
    }
}

/// Factory of the `prometheus` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct PrometheusExporterFactory;

impl ExporterFactory for PrometheusExporterFactory {
    fn type_name(&self) -> &'static str {
        "prometheus"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Metrics]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(PrometheusConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        if signal != Signal::Metrics {
            return Err(ComponentError::Start(format!("exporter \"{}\" exports metrics only, not {signal}", ctx.id)));
        }
        let c = inferwatch_core::component::typed::<PrometheusConfig>(parsed)?;
        Ok(Arc::new(PrometheusExporter::new(&ctx, c)?))
    }
}

/// The exporter node: accumulates what it receives; the endpoint serves it.
pub struct PrometheusExporter {
    name: String,
    endpoint: String,
    tls: Option<inferwatch_core::tls::server::TlsServerSettings>,
    auth: Option<inferwatch_core::auth::AuthSettings>,
    host: Arc<inferwatch_core::host::Host>,
    listener_metrics: inferwatch_core::telemetry::ListenerMetrics,
    settings: translate::Settings,
    open_metrics: bool,
    state: Arc<Mutex<Accumulator>>,
    delta: Mutex<DeltaToCumulative>,
    server: tokio::sync::Mutex<Option<server::Server>>,
    local_addr: Mutex<Option<SocketAddr>>,
    metrics: ExporterMetrics,
    dropped: Counter,
    last_warning: Mutex<Option<Instant>>,
}

/// Nanoseconds since the Unix epoch now.
pub(crate) fn unix_now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl PrometheusExporter {
    /// Builds the node (the endpoint is bound by `start`).
    pub fn new(ctx: &CreateContext, c: &PrometheusConfig) -> Result<Self, FieldError> {
        c.check()?;
        let endpoint = c.endpoint.as_ref().map(HostPort::to_bind_string).unwrap_or_default();
        Ok(PrometheusExporter {
            name: ctx.id.to_string(),
            endpoint,
            tls: c.tls.clone(),
            auth: c.auth.clone(),
            host: ctx.host.clone(),
            listener_metrics: ctx.telemetry.listener(&ctx.id.to_string()),
            settings: c.settings()?,
            open_metrics: c.enable_open_metrics,
            state: Arc::new(Mutex::new(Accumulator::new(c.max_series, c.metric_expiration.0))),
            delta: Mutex::new(DeltaToCumulative::new(c.max_series, c.metric_expiration.0)),
            server: tokio::sync::Mutex::new(None),
            local_addr: Mutex::new(None),
            metrics: ctx.telemetry.exporter(&ctx.id, Signal::Metrics),
            dropped: ctx.telemetry.processor(&ctx.id, Signal::Metrics).dropped,
            last_warning: Mutex::new(None),
        })
    }

    /// The address the endpoint is bound to, once started.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        *self.local_addr.lock()
    }

    /// The exposition as a scrape in `format` would get it now.
    pub fn render(&self, format: exposition::Format) -> String {
        let mut acc = self.state.lock();
        acc.expire(Instant::now());
        exposition::render(&acc, format)
    }

    /// Takes one request into the state at `now` (`now_ns` stamps points without a time);
    /// returns the number of points dropped.
    pub fn ingest(&self, mut req: ExportMetricsServiceRequest, now: Instant, now_ns: u64) -> u64 {
        let mut delta = self.delta.lock();
        let (removed, _undo) = delta.normalize(&mut req, now, now_ns);
        let points = self.settings.translate(&req);
        let mut acc = self.state.lock();
        acc.expire(now);
        let (mut over, mut stale, mut conflict) = (0u64, 0u64, 0u64);
        for p in points {
            match acc.add(p, now) {
                Outcome::Stored | Outcome::Removed => {}
                Outcome::Stale => stale += 1,
                Outcome::OverLimit => over += 1,
                Outcome::TypeConflict => conflict += 1,
            }
        }
        drop(acc);
        drop(delta);
        let dropped = removed.total() + over + stale + conflict;
        if dropped > 0 {
            self.dropped.inc_by(dropped);
            self.warn(removed, over + removed.over_limit, stale + removed.stale, conflict, now);
        }
        dropped
    }

    fn warn(&self, removed: cumulative::Removed, over: u64, stale: u64, conflict: u64, now: Instant) {
        let mut last = self.last_warning.lock();
        if last.is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(60)) {
            return;
        }
        *last = Some(now);
        tracing::warn!(exporter = %self.name, invalid = removed.invalid, over_max_series = over, out_of_order = stale,
            type_conflicts = conflict,
            "prometheus exporter dropped points (counted in otelcol_processor_dropped_metric_points); \
             this warning repeats at most once a minute");
    }
}

#[async_trait]
impl Consumer for PrometheusExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let n = data.item_count() as u64;
        let req = match data.into_decoded() {
            Ok(Payload::Metrics(r)) => r,
            Ok(other) => {
                return Err(ConsumeError::Permanent(format!(
                    "exporter {} takes metrics, got {}",
                    self.name,
                    other.signal()
                )));
            }
            Err(e) => {
                self.metrics.send_failed.inc_by(n);
                return Err(ConsumeError::Permanent(format!("exporter {}: cannot decode the payload: {e}", self.name)));
            }
        };
        let dropped = self.ingest(req, Instant::now(), unix_now_ns());
        self.metrics.sent.inc_by(n.saturating_sub(dropped));
        Ok(())
    }
}

#[async_trait]
impl Node for PrometheusExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        let served = server::Served { state: self.state.clone(), open_metrics: self.open_metrics };
        let auth = match &self.auth {
            Some(a) => {
                Some(a.server(&self.host).map_err(|e| ComponentError::Start(format!("exporter {}: {e}", self.name)))?)
            }
            None => None,
        };
        let listen = server::Listen { tls: self.tls.clone(), auth, metrics: self.listener_metrics.clone() };
        let s = server::Server::start_with(&self.endpoint, listen, served)
            .await
            .map_err(|e| ComponentError::Start(format!("exporter {}: {e}", self.name)))?;
        tracing::info!(exporter = %self.name, endpoint = %s.local_addr, "serving Prometheus metrics on /metrics");
        *self.local_addr.lock() = Some(s.local_addr);
        *self.server.lock().await = Some(s);
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        if let Some(s) = self.server.lock().await.take() {
            s.stop(deadline).await;
        }
        *self.local_addr.lock() = None;
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::PathSeg;
    use serde_json::json;

    #[test]
    fn defaults_follow_otelcol() {
        let c = PrometheusConfig::from_value(&json!({"endpoint": "127.0.0.1:8889"})).unwrap();
        assert_eq!(c.metric_expiration.0, Duration::from_secs(300));
        assert!(c.add_metric_suffixes);
        assert!(!c.enable_open_metrics);
        assert!(!c.resource_to_telemetry_conversion.enabled);
        assert_eq!(c.max_series, 100_000);
    }

    #[test]
    fn bad_settings_point_at_the_field() {
        let key = |p: &[PathSeg]| -> Vec<String> {
            p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
        };
        let cases = [
            (json!({}), vec!["endpoint"]),
            (json!({"endpoint": "http://x:1"}), vec!["endpoint"]),
            (json!({"endpoint": "x:1", "namespace": "1bad"}), vec!["namespace"]),
            (json!({"endpoint": "x:1", "const_labels": {"bad-key": "v"}}), vec!["const_labels", "bad-key"]),
            (json!({"endpoint": "x:1", "metric_expiration": "0s"}), vec!["metric_expiration"]),
            (json!({"endpoint": "x:1", "max_series": 0}), vec!["max_series"]),
            (
                json!({"endpoint": "x:1", "resource_to_telemetry_conversion": {"on": true}}),
                vec!["resource_to_telemetry_conversion", "on"],
            ),
            (json!({"endpoint": "x:1", "unknown": 1}), vec!["unknown"]),
        ];
        for (v, path) in cases {
            let e = PrometheusExporterFactory.validate(&v).expect_err(&v.to_string());
            assert_eq!(key(&e.path), path, "{v}: {}", e.message);
        }
    }
}
