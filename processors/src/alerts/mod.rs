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

pub mod input;
pub mod lifecycle;
pub mod record;

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
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Version of the checkpoint payload.
pub const STATE_VERSION: u32 = 1;
/// Kind of the checkpoint entry.
pub const STATE_KIND: &str = "alerts";

/// Thresholds of one detector, overriding the connector's.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DetectorThresholds {
    /// Warning threshold on the level.
    pub warning: Option<f64>,
    /// Critical threshold on the level.
    pub critical: Option<f64>,
    /// `for` of this detector (default: the connector's).
    #[serde(rename = "for")]
    pub for_duration: Option<GoDuration>,
    /// `stale_after` of this detector (default: the connector's).
    pub stale_after: Option<GoDuration>,
}

/// Settings of the `alerts` connector.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Level at or above which an alert is pending / firing as warning (default 0.6).
    pub warning: f64,
    /// Level at or above which it fires as critical (default 0.8).
    pub critical: f64,
    /// Event time the level must stay ≥ warning before the alert fires (default 0s).
    #[serde(rename = "for")]
    pub for_duration: GoDuration,
    /// Event time the level must stay < warning before a firing alert resolves (default 0s).
    pub resolve_after: GoDuration,
    /// Event time between repeated firing records of an unchanged alert (default 5m; 0: never).
    pub repeat_interval: GoDuration,
    /// A pending alert whose previous point is older than this restarts its `for` (default 5m; 0s: never).
    pub stale_after: GoDuration,
    /// Attributes (point, else resource) that, with detector and metric, identify an alert.
    pub group_by: Vec<String>,
    /// Thresholds per detector name.
    pub per_detector: BTreeMap<String, DetectorThresholds>,
    /// Most alerts held; beyond it the least recently seen 10 % are evicted (default 10000).
    pub max_alerts: usize,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            warning: 0.6,
            critical: 0.8,
            for_duration: GoDuration(Duration::ZERO),
            resolve_after: GoDuration(Duration::ZERO),
            stale_after: GoDuration(Duration::from_secs(300)),
            repeat_interval: GoDuration(Duration::from_secs(300)),
            group_by: ["gen_ai.request.model", "service.version", "service.instance.id", "detector"]
                .map(String::from)
                .to_vec(),
            per_detector: BTreeMap::new(),
            max_alerts: 10_000,
        }
    }
}

fn nanos(key: &str, d: &GoDuration) -> Result<u64, FieldError> {
    u64::try_from(d.0.as_nanos()).map_err(|_| FieldError::at(key, format!("{d} is too long (at most ~584 years)")))
}

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
    Ok(Thresholds { warning, critical, for_ns: None, stale_ns: None })
}

/// A checked configuration in the units the connector uses.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Life-cycle durations and the cap.
    pub params: Params,
    /// Default thresholds.
    pub thresholds: Thresholds,
    /// Thresholds per detector.
    pub per_detector: HashMap<String, Thresholds>,
    /// Grouping attributes.
    pub group_by: Vec<String>,
}

impl AlertsConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Checked, FieldError> {
        parse_config::<AlertsConfig>(v)?.check()
    }

    /// Checks the settings.
    pub fn check(&self) -> Result<Checked, FieldError> {
        let th = thresholds("", self.warning, self.critical)?;
        let mut per_detector = HashMap::new();
        for (name, d) in &self.per_detector {
            let w = d.warning.unwrap_or(th.warning);
            let c = d.critical.unwrap_or(th.critical.max(w));
            let mut t = thresholds(&format!("per_detector.{name}."), w, c)?;
            t.for_ns = d.for_duration.as_ref().map(|v| nanos(&format!("per_detector.{name}.for"), v)).transpose()?;
            t.stale_ns =
                d.stale_after.as_ref().map(|v| nanos(&format!("per_detector.{name}.stale_after"), v)).transpose()?;
            per_detector.insert(name.clone(), t);
        }
        if self.max_alerts == 0 {
            return Err(FieldError::at("max_alerts", "must be at least 1"));
        }
        if self.group_by.iter().any(|k| k.is_empty()) {
            return Err(FieldError::at("group_by", "attribute names must not be empty"));
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
            group_by: self.group_by.clone(),
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
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        AlertsConfig::from_value(cfg).map(|_| ())
    }
    fn create(
        &self,
        ctx: CreateContext,
        cfg: &serde_json::Value,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        if (from, to) != (Signal::Metrics, Signal::Logs) {
            return Err(ComponentError::Start(format!("alerts connects metrics to logs, not {from} to {to}")));
        }
        let c = AlertsConfig::from_value(cfg)?;
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
        let x = input::extract(req, &self.checked.group_by);
        if x.unidentified > 0 {
            tracing::debug!(connector = %self.name, points = x.unidentified,
                "llm.anomaly.level points without detector / metric attributes ignored");
            self.unidentified.inc_by(x.unidentified);
        }
        let mut out = record::Records::default();
        let mut engine = self.engine.lock();
        let evicted_before = engine.evicted();
        for p in &x.levels {
            let detector = p.labels.first().map(|(_, v)| v.as_str()).unwrap_or_default();
            let th = self.checked.per_detector.get(detector).copied().unwrap_or(self.checked.thresholds);
            let (tr, evicted) = engine.observe(&p.key, &p.labels, p.time, p.level, th);
            for ev in evicted {
                let det = ev.labels.first().map(|(_, v)| v.as_str()).unwrap_or_default();
                let th = self.checked.per_detector.get(det).copied().unwrap_or(self.checked.thresholds);
                let id = input::alert_id(&ev.key);
                let a = record::Alert {
                    transition: &ev.transition,
                    id: &id,
                    labels: &ev.labels,
                    time: p.time,
                    thresholds: th,
                    evidence: None,
                };
                out.push(Arc::new(Default::default()), record::record(&a));
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
                labels: &p.labels,
                time: p.time,
                thresholds: th,
                evidence: Some(&evidence),
            };
            out.push(p.resource.clone(), record::record(&a));
        }
        self.evicted.inc_by(engine.evicted() - evicted_before);
        self.alerts.set(engine.len() as i64);
        out
    }

    /// Sends records downstream, retrying refusals until accepted or stopping.
    async fn send(&self, records: record::Records) {
        let n = records.len();
        let payload = Payload::Logs(records.into_request());
        let mut backoff = Duration::from_millis(10);
        loop {
            match self.next.consume(payload.clone()).await {
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
