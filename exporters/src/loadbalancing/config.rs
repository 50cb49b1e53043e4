//! Settings of the `loadbalancing` exporter and their checks (otelcol-contrib's shape).

use super::resolver::dns::DnsResolverConfig;
use super::resolver::k8s::K8sResolverConfig;
use super::resolver::static_::StaticResolverConfig;
use crate::otlp::OtlpConfig;
use inferwatch_core::component::{FieldError, PathSeg, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::{Endpoint, GoDuration};
use serde::Deserialize;
use std::time::Duration;

/// How long a backend's sends may fail with transport errors before it is marked down
/// (`backend_down_after`, inferwatch's addition) when not set.
pub const DEFAULT_DOWN_AFTER: Duration = Duration::from_secs(5);
/// The endpoint `protocol.otlp` is checked with (each backend's replaces it).
const PLACEHOLDER_ENDPOINT: &str = "127.0.0.1:4317";

/// What routes an item to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingKey {
    /// The trace id of a span or log record (traces, logs; default for traces).
    TraceId,
    /// The resource's `service.name` (all signals; default for metrics and logs).
    Service,
    /// All resource attributes (metrics, logs).
    Resource,
    /// The metric's name (metrics).
    Metric,
    /// The stream: resource, scope, metric name and type, data point attributes (metrics).
    StreamId,
    /// The values of `routing_attributes`, each looked up in the resource, then the scope,
    /// then the item (all signals).
    Attributes,
}

impl RoutingKey {
    /// The key as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingKey::TraceId => "traceID",
            RoutingKey::Service => "service",
            RoutingKey::Resource => "resource",
            RoutingKey::Metric => "metric",
            RoutingKey::StreamId => "streamID",
            RoutingKey::Attributes => "attributes",
        }
    }

    /// Parses a written key.
    pub fn parse(s: &str) -> Option<RoutingKey> {
        Some(match s {
            "traceID" => RoutingKey::TraceId,
            "service" => RoutingKey::Service,
            "resource" => RoutingKey::Resource,
            "metric" => RoutingKey::Metric,
            "streamID" => RoutingKey::StreamId,
            "attributes" => RoutingKey::Attributes,
            _ => return None,
        })
    }

    /// The signals the key can route (otelcol's table).
    pub fn signals(self) -> &'static [Signal] {
        match self {
            RoutingKey::TraceId => &[Signal::Traces, Signal::Logs],
            RoutingKey::Service | RoutingKey::Attributes => &Signal::ALL,
            RoutingKey::Resource => &[Signal::Metrics, Signal::Logs],
            RoutingKey::Metric | RoutingKey::StreamId => &[Signal::Metrics],
        }
    }

    /// otelcol's default for a signal: `traceID` for traces, `service` for metrics and logs.
    pub fn default_for(signal: Signal) -> RoutingKey {
        match signal {
            Signal::Traces => RoutingKey::TraceId,
            Signal::Metrics | Signal::Logs => RoutingKey::Service,
        }
    }
}

/// The settings as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    routing_key: Option<String>,
    #[serde(default)]
    routing_attributes: Vec<String>,
    #[serde(default)]
    protocol: Protocol,
    #[serde(default)]
    resolver: ResolverRaw,
    #[serde(default)]
    backend_down_after: Option<GoDuration>,
    /// otelcol's top-level `timeout` (recent versions): each backend's, over `protocol.otlp`'s.
    #[serde(default)]
    timeout: Option<serde_json::Value>,
    /// otelcol's top-level `sending_queue`: each backend's, over `protocol.otlp`'s.
    #[serde(default)]
    sending_queue: Option<serde_json::Value>,
    /// otelcol's top-level `retry_on_failure`: each backend's, over `protocol.otlp`'s.
    #[serde(default)]
    retry_on_failure: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Protocol {
    #[serde(default)]
    otlp: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolverRaw {
    #[serde(default, rename = "static")]
    static_: Option<StaticResolverConfig>,
    #[serde(default)]
    dns: Option<DnsResolverConfig>,
    #[serde(default)]
    k8s: Option<K8sResolverConfig>,
}

/// The one resolver configured.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolverConfig {
    /// `resolver.static`.
    Static(StaticResolverConfig),
    /// `resolver.dns`.
    Dns(DnsResolverConfig),
    /// `resolver.k8s`.
    K8s(K8sResolverConfig),
}

impl ResolverConfig {
    /// The resolver's name in `otelcol_loadbalancer_num_resolutions_total{resolver}`.
    pub fn kind(&self) -> &'static str {
        match self {
            ResolverConfig::Static(_) => "static",
            ResolverConfig::Dns(_) => "dns",
            ResolverConfig::K8s(_) => "k8s",
        }
    }
}

/// The checked settings of a `loadbalancing` exporter.
#[derive(Debug, Clone)]
pub struct LoadBalancingConfig {
    /// `routing_key` as written (`None`: the signal's default).
    pub routing_key: Option<RoutingKey>,
    /// `routing_attributes` (with `routing_key: attributes`).
    pub routing_attributes: Vec<String>,
    /// `protocol.otlp`, checked, with a placeholder endpoint that each backend replaces.
    pub otlp: OtlpConfig,
    /// The resolver.
    pub resolver: ResolverConfig,
    /// How long a backend's sends may fail with transport errors before it is marked down
    /// (0: never marked down).
    pub backend_down_after: Duration,
}

/// `e` located under `prefix`.
fn under(prefix: &[&str], mut e: FieldError) -> FieldError {
    let mut path: Vec<PathSeg> = prefix.iter().map(|k| PathSeg::Key((*k).to_string())).collect();
    path.append(&mut e.path);
    e.path = path;
    e
}

impl LoadBalancingConfig {
    /// Parses and checks the settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let raw: Raw = parse_config(v)?;
        let routing_key = match raw.routing_key.as_deref() {
            None | Some("") => None,
            Some(k) => Some(RoutingKey::parse(k).ok_or_else(|| {
                FieldError::at(
                    "routing_key",
                    format!(
                        "unknown routing key {k:?}: use traceID, service, resource, metric, streamID or attributes"
                    ),
                )
            })?),
        };
        if routing_key == Some(RoutingKey::Attributes) {
            if raw.routing_attributes.is_empty() {
                return Err(FieldError::at(
                    "routing_attributes",
                    "routing_key: attributes needs the attribute keys to route by (routing_attributes: [...])",
                ));
            }
            if let Some(i) = raw.routing_attributes.iter().position(String::is_empty) {
                return Err(FieldError {
                    path: vec![PathSeg::Key("routing_attributes".into()), PathSeg::Index(i)],
                    message: "an attribute key cannot be empty".into(),
                });
            }
        } else if !raw.routing_attributes.is_empty() {
            return Err(FieldError::at(
                "routing_attributes",
                "routing_attributes is used only with routing_key: attributes",
            ));
        }
        let top = [
            ("timeout", &raw.timeout),
            ("sending_queue", &raw.sending_queue),
            ("retry_on_failure", &raw.retry_on_failure),
        ];
        let otlp = otlp_settings(raw.protocol.otlp.as_ref(), &top)?;
        let resolver = match (raw.resolver.static_, raw.resolver.dns, raw.resolver.k8s) {
            (Some(s), None, None) => {
                s.check().map_err(|e| under(&["resolver", "static"], e))?;
                ResolverConfig::Static(s)
            }
            (None, Some(d), None) => {
                d.check().map_err(|e| under(&["resolver", "dns"], e))?;
                ResolverConfig::Dns(d)
            }
            (None, None, Some(k)) => {
                k.check().map_err(|e| under(&["resolver", "k8s"], e))?;
                ResolverConfig::K8s(k)
            }
            (None, None, None) => {
                return Err(FieldError::at("resolver", "a resolver is required: one of static, dns or k8s"));
            }
            _ => return Err(FieldError::at("resolver", "only one resolver may be set: static, dns or k8s")),
        };
        let backend_down_after = raw.backend_down_after.map(|d| d.0).unwrap_or(DEFAULT_DOWN_AFTER);
        Ok(LoadBalancingConfig {
            routing_key,
            routing_attributes: raw.routing_attributes,
            otlp,
            resolver,
            backend_down_after,
        })
    }

    /// The routing key of a pipeline of `signal`: the one set, or otelcol's default; a key that
    /// cannot route `signal` is an error at `routing_key`.
    pub fn key_for(&self, signal: Signal) -> Result<RoutingKey, FieldError> {
        let k = self.routing_key.unwrap_or_else(|| RoutingKey::default_for(signal));
        if !k.signals().contains(&signal) {
            let fits: Vec<&str> = k.signals().iter().map(|s| s.as_str()).collect();
            return Err(FieldError::at(
                "routing_key",
                format!("routing_key {} cannot route {signal} (it routes {})", k.as_str(), fits.join(", ")),
            ));
        }
        Ok(k)
    }

    /// `protocol.otlp` with `endpoint` set to `backend`.
    pub fn otlp_for(&self, backend: &str) -> Result<OtlpConfig, FieldError> {
        let mut c = self.otlp.clone();
        c.endpoint = Some(Endpoint::parse(backend).map_err(|e| FieldError::at("endpoint", e.to_string()))?);
        Ok(c)
    }
}

/// `protocol.otlp` parsed and checked as the `otlp` exporter's settings; an `endpoint` there is
/// ignored (as otelcol does: each backend's endpoint replaces it), with a warning.
///
/// `top` are the top-level `timeout` / `sending_queue` / `retry_on_failure` (otelcol's newer
/// shape): set, each replaces `protocol.otlp`'s and applies to every backend. A persistent
/// queue (`sending_queue.storage`) is refused.
fn otlp_settings(
    v: Option<&serde_json::Value>,
    top: &[(&str, &Option<serde_json::Value>)],
) -> Result<OtlpConfig, FieldError> {
    let mut map = match v {
        None | Some(serde_json::Value::Null) => serde_json::Map::new(),
        Some(serde_json::Value::Object(m)) => m.clone(),
        Some(_) => return Err(FieldError::at("protocol.otlp", "expected a map of the otlp exporter's settings")),
    };
    let storage_msg = "a persistent queue is not supported per backend: a removed backend's queue would stay on \
        disk for an endpoint that may never return, and re-adding the endpoint while it retires hits the queue's \
        lock; durability comes from the sender's own upstream queue and the receiver's acknowledgement";
    if has_storage(map.get("sending_queue")) {
        return Err(FieldError::at("protocol.otlp.sending_queue.storage", storage_msg));
    }
    for (k, val) in top {
        if let Some(val) = val {
            if *k == "sending_queue" && has_storage(Some(val)) {
                return Err(FieldError::at("sending_queue.storage", storage_msg));
            }
            // Checked where it is written: a bad top-level value names the top-level field.
            let mut probe = serde_json::Map::new();
            probe.insert((*k).to_string(), val.clone());
            probe.insert("endpoint".into(), serde_json::Value::String(PLACEHOLDER_ENDPOINT.into()));
            OtlpConfig::from_value(&serde_json::Value::Object(probe))?;
            tracing::warn!(field = %k, "loadbalancing: top-level {k} applies to each backend's exporter here \
                (otelcol applies it to the load balancer as a whole), replacing protocol.otlp.{k}");
            map.insert((*k).to_string(), val.clone());
        }
    }
    // Reported by the factory's `warnings`.
    map.remove("endpoint");
    map.insert("endpoint".into(), serde_json::Value::String(PLACEHOLDER_ENDPOINT.into()));
    OtlpConfig::from_value(&serde_json::Value::Object(map)).map_err(|e| under(&["protocol", "otlp"], e))
}

/// Whether a `sending_queue` value sets `storage`.
fn has_storage(q: Option<&serde_json::Value>) -> bool {
    q.and_then(|q| q.get("storage")).is_some_and(|s| !s.is_null() && s.as_str() != Some(""))
}
