//! Connector `alerts` (metrics → logs): turns the detectors' `llm.anomaly.level` gauges into
//! alert log records with a life cycle on event time.
//!
//! An alert is identified by (detector, metric, the `group_by` attributes present on the
//! point, else on its resource). Level ≥ warning makes it pending; pending for `for` makes it
//! fire (warning or critical by the level then; a later rise to critical emits an escalation);
//! below warning for `resolve_after` resolves it. Each transition to firing or resolved, and
//! each `repeat_interval` of event time while firing, emits one `llm.degradation.alert` log
//! record (docs/alerts.md). Not an Arrow processor: logs have no Arrow schema, so it reads the
//! decoded OTLP payload.

pub mod describe;
pub mod input;
pub mod lifecycle;
pub mod record;

use crate::detect::config::nanos;
use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, ComponentId, ConnectorFactory, CreateContext, FieldError, Node, NodeRef, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::{Checkpoint, StateError};
use lifecycle::{Alerts, Lifecycle, Params, Thresholds};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Version of the checkpoint payload.
pub const STATE_VERSION: u32 = 1;
/// Kind of the checkpoint entry.
pub const STATE_KIND: &str = "alerts";

/// Settings of one detector, overriding the connector's (and the built-in per-detector defaults).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DetectorThresholds {
    /// Warning threshold on the level.
    pub warning: Option<f64>,
    /// Critical threshold on the level.
    pub critical: Option<f64>,
    /// `for` of this detector (default: the built-in one of the detector, else the connector's).
    #[serde(rename = "for")]
    pub for_duration: Option<GoDuration>,
    /// `stale_after` of this detector (default: the built-in one, else the connector's).
    pub stale_after: Option<GoDuration>,
    /// `resolve_after` of this detector (default: the connector's).
    pub resolve_after: Option<GoDuration>,
    /// `resolve_below` of this detector (default: the connector's, at most this warning).
    pub resolve_below: Option<f64>,
    /// `alertname` of this detector's alerts (default: the built-in name, docs/alerts.md).
    pub alertname: Option<String>,
}

/// Settings of the `alerts` connector.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Level at or above which an alert is pending / firing as warning (default 0.6).
    pub warning: f64,
    /// Level at or above which it fires as critical (default 0.8).
    pub critical: f64,
    /// Event time the level must stay ≥ warning before the alert fires (default 2m).
    #[serde(rename = "for")]
    pub for_duration: GoDuration,
    /// Event time the level must stay < `resolve_below` before a firing alert resolves (default 2m).
    pub resolve_after: GoDuration,
    /// Level below which a point of a firing alert counts towards its quiet run (default: warning).
    pub resolve_below: Option<f64>,
    /// Event time between repeated firing records of an unchanged alert (default 5m; 0: never).
    pub repeat_interval: GoDuration,
    /// A pending alert whose previous point is older than this restarts its `for` (default 5m; 0s: never).
    pub stale_after: GoDuration,
    /// Attributes (point, else resource) that, with detector and metric, identify an alert.
    pub group_by: Vec<String>,
    /// Attributes (point, else resource) copied onto each record without being part of its identity.
    pub context: Vec<String>,
    /// Link templates by name: `dashboard: "http://grafana/d/x?var-model={{model}}"` → `alert.dashboard_url`.
    pub links: BTreeMap<String, String>,
    /// Settings per detector name.
    pub per_detector: BTreeMap<String, DetectorThresholds>,
    /// Most alerts held; beyond it the least recently seen 10 % are evicted (default 10000).
    pub max_alerts: usize,
    /// One line per transition in the agent's log (default true; `inferwatch eval` turns it off).
    pub log: bool,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            warning: 0.6,
            critical: 0.8,
            for_duration: GoDuration(Duration::from_secs(120)),
            resolve_after: GoDuration(Duration::from_secs(120)),
            resolve_below: None,
            stale_after: GoDuration(Duration::from_secs(300)),
            repeat_interval: GoDuration(Duration::from_secs(300)),
            group_by: ["gen_ai.request.model", "service.version", "service.instance.id", "detector", "slo"]
                .map(String::from)
                .to_vec(),
            context: ["k8s.pod.name", "k8s.namespace.name", "k8s.node.name"].map(String::from).to_vec(),
            links: BTreeMap::new(),
            per_detector: BTreeMap::new(),
            max_alerts: 10_000,
            log: true,
        }
    }
}

/// A built-in per-detector default: `for` and `stale_after` fitting the detector's cadence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Builtin {
    /// The detector.
    pub detector: &'static str,
    /// Its `for`.
    pub for_s: u64,
    /// Its `stale_after` (`None`: the connector's).
    pub stale_after_s: Option<u64>,
}

/// The built-in per-detector defaults, applied field by field unless `per_detector` sets the field.
/// trend_forecast emits one point per closed aggregate (hourly by default): with `for` > 0 every
/// point would find the previous one stale and restart pending. delta_ab's verdicts and slo_burn's
/// burn-rate rule are already confirmed over their own windows.
pub const BUILTINS: &[Builtin] = &[
    Builtin { detector: "trend_forecast", for_s: 0, stale_after_s: Some(3 * 3600) },
    Builtin { detector: "delta_ab", for_s: 0, stale_after_s: None },
    Builtin { detector: "slo_burn", for_s: 0, stale_after_s: None },
    // Confirmed over its own `for_windows` consecutive windows.
    Builtin { detector: "peer_outlier", for_s: 0, stale_after_s: None },
    // Its decision interval already accumulates the evidence (a 90-s burst is one or two points).
    Builtin { detector: "cusum", for_s: 0, stale_after_s: None },
    // One report is one point (the next 30 are suppressed to 0).
    Builtin { detector: "anomaly_ensemble", for_s: 0, stale_after_s: None },
];

/// The detectors that emit `llm.anomaly.level` in this build (a `per_detector` key naming another
/// is only warned about: an external detector may use it).
pub const KNOWN_DETECTORS: &[&str] = &[
    "zscore_skew",
    "cusum",
    "ewma_chart",
    "anomaly_ensemble",
    "kv_pressure",
    "trend_forecast",
    "delta_ab",
    "coupled_model",
    "lstm_ae",
    "pca",
    "slo_burn",
    "peer_outlier",
];

/// Shortest interval between two points of trend_forecast with its default `aggregate` (1h).
pub const TREND_FORECAST_CADENCE_S: u64 = 3600;

fn thresholds(at: &str, warning: f64, critical: f64) -> Result<Thresholds, FieldError> {
    if !(warning.is_finite() && warning > 0.0 && warning <= 1.0) {
        return Err(FieldError::at(&format!("{at}warning"), format!("must be in (0, 1], got {warning}")));
    }
    if !(critical.is_finite() && critical >= warning && critical <= 1.0) {
        return Err(FieldError::at(
            &format!("{at}critical"),
            format!("must be in [warning, 1] = [{warning}, 1], got {critical}"),
        ));
    }
    Ok(Thresholds { warning, critical, resolve_below: warning, for_ns: None, stale_ns: None, resolve_ns: None })
}

fn resolve_below(at: &str, v: f64, warning: f64) -> Result<f64, FieldError> {
    if !(v.is_finite() && v >= 0.0 && v <= warning) {
        return Err(FieldError::at(at, format!("must be in [0, warning] = [0, {warning}], got {v}")));
    }
    Ok(v)
}

/// A checked configuration in the units the connector uses.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Life-cycle durations and the cap.
    pub params: Params,
    /// Default thresholds.
    pub thresholds: Thresholds,
    /// Thresholds per detector (the built-in defaults merged with `per_detector`).
    pub per_detector: HashMap<String, Thresholds>,
    /// `alertname` per detector given in `per_detector`.
    pub alertnames: HashMap<String, String>,
    /// Grouping attributes.
    pub group_by: Vec<String>,
    /// Context attributes.
    pub context: Vec<String>,
    /// Link templates.
    pub links: Vec<(String, describe::Template)>,
    /// Log each transition.
    pub log: bool,
}

impl Checked {
    /// The thresholds and durations of `detector`.
    pub fn thresholds_of(&self, detector: &str) -> Thresholds {
        self.per_detector.get(detector).copied().unwrap_or(self.thresholds)
    }

    /// The `alertname` of `detector`'s alerts.
    pub fn alertname_of<'a>(&'a self, detector: &str) -> &'a str {
        self.alertnames.get(detector).map_or_else(|| describe::alertname(detector), String::as_str)
    }
}

fn secs(ns: u64) -> String {
    describe::duration(ns as f64 / 1e9)
}

impl AlertsConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Checked, FieldError> {
        parse_config::<AlertsConfig>(v)?.check()
    }

    /// Settings that are valid but cannot do what they seem to (an alert that can never fire, a
    /// `per_detector` key no detector uses); empty for settings that do not parse.
    pub fn warnings_of(v: &serde_json::Value) -> Vec<FieldError> {
        match parse_config::<AlertsConfig>(v) {
            Ok(c) => match c.check() {
                Ok(checked) => c.warnings(&checked),
                Err(_) => Vec::new(),
            },
            Err(_) => Vec::new(),
        }
    }

    /// The warnings of checked settings (docs/alerts.md, "Warnings").
    pub fn warnings(&self, checked: &Checked) -> Vec<FieldError> {
        let mut out = Vec::new();
        for name in self.per_detector.keys() {
            if !KNOWN_DETECTORS.contains(&name.as_str()) {
                out.push(FieldError::at(
                    &format!("per_detector.{name}"),
                    format!(
                        "no detector of this build is named {name:?} (known: {}); these settings apply only to \
                         points with detector={name:?}",
                        KNOWN_DETECTORS.join(", ")
                    ),
                ));
            }
        }
        let tf = checked.thresholds_of("trend_forecast");
        let for_ns = tf.for_ns.unwrap_or(checked.params.for_ns);
        let stale_ns = tf.stale_ns.unwrap_or(checked.params.stale_ns);
        let cadence_ns = TREND_FORECAST_CADENCE_S * 1_000_000_000;
        if for_ns > 0 && stale_ns > 0 && stale_ns < cadence_ns {
            let user = self.per_detector.get("trend_forecast");
            let key = if user.is_some_and(|d| d.for_duration.is_some()) {
                "per_detector.trend_forecast.for"
            } else {
                "per_detector.trend_forecast.stale_after"
            };
            out.push(FieldError::at(
                key,
                format!(
                    "trend_forecast alerts can never fire: its points come once per aggregate (1h by default), \
                     more than its stale_after {} apart, so each one restarts the pending `for` {} (set its \
                     `for: 0s`, the built-in default, or a stale_after above its aggregate)",
                    secs(stale_ns),
                    secs(for_ns)
                ),
            ));
        }
        out
    }

    /// Checks the settings.
    pub fn check(&self) -> Result<Checked, FieldError> {
        let mut th = thresholds("", self.warning, self.critical)?;
        if let Some(rb) = self.resolve_below {
            th.resolve_below = resolve_below("resolve_below", rb, th.warning)?;
        }
        let mut per_detector = HashMap::new();
        let mut names: Vec<&str> = BUILTINS.iter().map(|b| b.detector).collect();
        names.extend(
            self.per_detector.keys().map(String::as_str).filter(|n| !BUILTINS.iter().any(|b| b.detector == *n)),
        );
        let mut alertnames = HashMap::new();
        for name in names {
            let user = self.per_detector.get(name).cloned().unwrap_or_default();
            let builtin = BUILTINS.iter().find(|b| b.detector == name);
            let at = format!("per_detector.{name}.");
            let w = user.warning.unwrap_or(th.warning);
            let c = user.critical.unwrap_or(th.critical.max(w));
            let mut t = thresholds(&at, w, c)?;
            t.resolve_below = match user.resolve_below {
                Some(rb) => resolve_below(&format!("{at}resolve_below"), rb, w)?,
                None => self.resolve_below.map_or(w, |_| th.resolve_below.min(w)),
            };
            t.for_ns = match &user.for_duration {
                Some(v) => Some(nanos(&format!("{at}for"), v)?),
                None => builtin.map(|b| b.for_s * 1_000_000_000),
            };
            t.stale_ns = match &user.stale_after {
                Some(v) => Some(nanos(&format!("{at}stale_after"), v)?),
                None => builtin.and_then(|b| b.stale_after_s).map(|s| s * 1_000_000_000),
            };
            t.resolve_ns = user.resolve_after.as_ref().map(|v| nanos(&format!("{at}resolve_after"), v)).transpose()?;
            if let Some(n) = &user.alertname {
                if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    return Err(FieldError::at(
                        &format!("{at}alertname"),
                        format!("must be a non-empty Prometheus-style name ([A-Za-z0-9_:]), got {n:?}"),
                    ));
                }
                alertnames.insert(name.to_string(), n.clone());
            }
            per_detector.insert(name.to_string(), t);
        }
        if self.max_alerts == 0 {
            return Err(FieldError::at("max_alerts", "must be at least 1"));
        }
        if self.group_by.iter().any(|k| k.is_empty()) {
            return Err(FieldError::at("group_by", "attribute names must not be empty"));
        }
        if self.context.iter().any(|k| k.is_empty()) {
            return Err(FieldError::at("context", "attribute names must not be empty"));
        }
        let mut links = Vec::new();
        for (name, tpl) in &self.links {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(FieldError::at(
                    &format!("links.{name}"),
                    "link names must be non-empty and [A-Za-z0-9_] (the annotation is <name>_url)",
                ));
            }
            links.push((name.clone(), describe::Template::parse(&format!("links.{name}"), tpl)?));
        }
        Ok(Checked {
            params: Params {
                for_ns: nanos("for", &self.for_duration)?,
                resolve_after_ns: nanos("resolve_after", &self.resolve_after)?,
                repeat_ns: nanos("repeat_interval", &self.repeat_interval)?,
                max_alerts: self.max_alerts,
                stale_ns: nanos("stale_after", &self.stale_after)?,
            },
            thresholds: th,
            per_detector,
            alertnames,
            group_by: self.group_by.clone(),
            context: self.context.clone(),
            links,
            log: self.log,
        })
    }
}

/// Factory of the `alerts` connector.
pub struct AlertsFactory;

impl ConnectorFactory for AlertsFactory {
    fn type_name(&self) -> &'static str {
        "alerts"
    }
    fn signal_pairs(&self) -> &'static [(Signal, Signal)] {
        &[(Signal::Metrics, Signal::Logs)]
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(AlertsConfig::from_value(cfg)?))
    }
    fn warnings(&self, cfg: &serde_json::Value) -> Vec<FieldError> {
        AlertsConfig::warnings_of(cfg)
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        if (from, to) != (Signal::Metrics, Signal::Logs) {
            return Err(ComponentError::Start(format!("alerts connects metrics to logs, not {from} to {to}")));
        }
        let c = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Arc::new(AlertsConnector::new(&ctx, c, next)))
    }
}

/// The running connector.
pub struct AlertsConnector {
    name: String,
    checked: Checked,
    engine: Arc<Mutex<Lifecycle>>,
    order: tokio::sync::Mutex<()>,
    next: ConsumerRef,
    emitted: Counter,
    evicted: Counter,
    unidentified: Counter,
    alerts: Gauge,
    stopping: AtomicBool,
    warned_stale: Mutex<HashSet<String>>,
}

impl AlertsConnector {
    /// Builds the connector and registers its checkpoint with the host's state registry.
    pub fn new(ctx: &CreateContext, checked: Checked, next: ConsumerRef) -> Self {
        let engine = Arc::new(Mutex::new(Lifecycle::new(checked.params)));
        ctx.host.state.register(Arc::new(AlertsCheckpoint { key: checkpoint_key(&ctx.id), engine: engine.clone() }));
        let pipeline = format!("metrics->logs/{}", ctx.id);
        AlertsConnector {
            name: ctx.id.to_string(),
            checked,
            engine,
            order: tokio::sync::Mutex::new(()),
            next,
            emitted: ctx.telemetry.derived_points(&ctx.id),
            evicted: ctx.telemetry.series_evicted(&ctx.id, "max_alerts"),
            unidentified: ctx.telemetry.processor(&ctx.id, Signal::Metrics).dropped,
            alerts: ctx.telemetry.series(&ctx.id, &pipeline),
            stopping: AtomicBool::new(false),
            warned_stale: Mutex::new(HashSet::new()),
        }
    }

    /// Number of alerts held (pending or firing).
    pub fn alert_count(&self) -> usize {
        self.engine.lock().len()
    }

    /// Runs the life cycle over one metrics request; returns the records to emit.
    pub fn process(
        &self,
        req: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
    ) -> record::Records {
        let x = input::extract(req, &self.checked.group_by, &self.checked.context);
        if x.unidentified > 0 {
            tracing::debug!(connector = %self.name, points = x.unidentified,
                "llm.anomaly.level points without detector / metric attributes ignored");
            self.unidentified.inc_by(x.unidentified);
        }
        let mut out = record::Records::default();
        let mut engine = self.engine.lock();
        let evicted_before = engine.evicted();
        let links = &self.checked.links;
        for p in &x.levels {
            let detector = p.labels.first().map(|(_, v)| v.as_str()).unwrap_or_default();
            let th = self.checked.thresholds_of(detector);
            let (tr, evicted) = engine.observe(&p.key, &p.labels, p.time, p.level, th);
            if let Some(gap) = engine.stale_restart() {
                self.warn_stale(detector, gap, th);
            }
            for ev in evicted {
                let det = ev.labels.first().map(|(_, v)| v.as_str()).unwrap_or_default();
                let id = input::alert_id(&ev.key);
                let a = record::Alert {
                    transition: &ev.transition,
                    id: &id,
                    alertname: self.checked.alertname_of(det),
                    labels: &ev.labels,
                    context: &[],
                    time: p.time,
                    thresholds: self.checked.thresholds_of(det),
                    evidence: None,
                    links,
                };
                let rec = record::record(&a);
                if self.checked.log {
                    Self::log_transition(&self.name, &rec);
                }
                out.push(Arc::new(Default::default()), rec);
            }
            let Some(tr) = tr else { continue };
            let lookup = (p.key.clone(), p.time);
            let evidence = record::Evidence {
                level: p.level,
                score: x.scores.get(&lookup).copied(),
                breach_eta: x.etas.get(&lookup).copied(),
                attributes: p.evidence.clone(),
            };
            let id = input::alert_id(&p.key);
            let a = record::Alert {
                transition: &tr,
                id: &id,
                alertname: self.checked.alertname_of(detector),
                labels: &p.labels,
                context: &p.context,
                time: p.time,
                thresholds: th,
                evidence: Some(&evidence),
                links,
            };
            let rec = record::record(&a);
            if self.checked.log {
                Self::log_transition(&self.name, &rec);
            }
            out.push(p.resource.clone(), rec);
        }
        self.evicted.inc_by(engine.evicted() - evicted_before);
        self.alerts.set(engine.len() as i64);
        out
    }

    /// Writes one readable line per alert transition to the agent's log (`ALERT FIRING critical
    /// LLMKvCachePressure: <summary>`): a firing alert at WARN, a resolved one at INFO.
    fn log_transition(connector: &str, rec: &opentelemetry_proto::tonic::logs::v1::LogRecord) {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        let Some(Value::StringValue(body)) = rec.body.as_ref().and_then(|b| b.value.as_ref()) else { return };
        let body = body.replace(['\n', '\r'], " ");
        if body.starts_with("RESOLVED") {
            tracing::info!(connector, "ALERT {body}");
        } else {
            tracing::warn!(connector, "ALERT {body}");
        }
    }

    /// Warns, once per detector, that its pending alerts restart because its points arrive more
    /// than `stale_after` apart: with `for` > 0 they can never fire.
    fn warn_stale(&self, detector: &str, gap_ns: u64, th: Thresholds) {
        let mut warned = self.warned_stale.lock();
        if warned.contains(detector) {
            return;
        }
        warned.insert(detector.to_string());
        let p = self.checked.params;
        tracing::warn!(
            connector = %self.name,
            detector,
            gap = %secs(gap_ns),
            stale_after = %secs(th.stale_ns.unwrap_or(p.stale_ns)),
            r#for = %secs(th.for_ns.unwrap_or(p.for_ns)),
            "a pending alert restarted its `for`: this detector's points came further apart than stale_after; if \
             they always do, its alerts never fire (set per_detector.{detector}.for: 0s or a longer stale_after)"
        );
    }

    /// Sends records downstream, retrying refusals until accepted or stopping.
    async fn send(&self, records: record::Records) {
        let n = records.len();
        let payload = Payload::Logs(records.into_request());
        let mut backoff = Duration::from_millis(10);
        let mut first = true;
        loop {
            // Retries offer records this connector already holds: a full queue counts them once.
            let offer = self.next.consume(payload.clone());
            let result = if first { offer.await } else { inferwatch_core::exporterhelper::offer_held(offer).await };
            first = false;
            match result {
                Ok(()) => {
                    self.emitted.inc_by(n as u64);
                    return;
                }
                Err(e) if e.is_retryable() && !self.stopping.load(Ordering::SeqCst) => {
                    let wait = match &e {
                        ConsumeError::Refused { retry_after: Some(d), .. } => *d,
                        _ => backoff,
                    };
                    tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(connector = %self.name, error = %e, records = n, "alert records dropped");
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl Consumer for AlertsConnector {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        if data.signal() != Signal::Metrics {
            return Ok(());
        }
        let decoded = data.decoded().map_err(|e| ConsumeError::Permanent(format!("cannot decode metrics: {e}")))?;
        let Payload::Metrics(req) = decoded.as_ref() else { return Ok(()) };
        let _order = self.order.lock().await;
        let records = self.process(req);
        if !records.is_empty() {
            self.send(records).await;
        }
        Ok(())
    }
}

#[async_trait]
impl Node for AlertsConnector {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        self.stopping.store(true, Ordering::SeqCst);
        0
    }
}

/// The checkpoint key of connector `id`.
pub fn checkpoint_key(id: &ComponentId) -> String {
    format!("alerts/{id}")
}

struct AlertsCheckpoint {
    key: String,
    engine: Arc<Mutex<Lifecycle>>,
}

impl Checkpoint for AlertsCheckpoint {
    fn key(&self) -> String {
        self.key.clone()
    }
    fn kind(&self) -> &'static str {
        STATE_KIND
    }
    fn version(&self) -> u32 {
        STATE_VERSION
    }
    fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
        let engine = self.engine.lock();
        postcard::to_stdvec(engine.state())
            .map(Some)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })
    }
    fn restore(&self, bytes: &[u8]) -> Result<(), StateError> {
        let state: Alerts = postcard::from_bytes(bytes)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })?;
        self.engine.lock().set_state(state);
        Ok(())
    }
}
