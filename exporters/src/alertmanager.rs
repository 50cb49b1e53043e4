//! The `alertmanager` exporter (logs): sends the `llm.degradation.alert` log records of the
//! `alerts` connector to Prometheus Alertmanager, API v2 (`POST /api/v2/alerts`).
//!
//! - Each alert record becomes one Alertmanager alert: labels `alertname` (the record's, e.g.
//!   `LLMSloBurnRate`; `LLMDegradation` when absent), `severity`, `detector`, `metric`, `slo`,
//!   `model` / `version` / `instance` (from `gen_ai.request.model`, `service.version`,
//!   `service.instance.id`) and any other group attribute (name sanitised); annotations
//!   `summary` (`alert.summary`, else the body), `description`, `alert_id`, `value`,
//!   `baseline`, `threshold`, `eta`, `eta_low`, `eta_high`, the links (`alert.X_url` → `X_url`),
//!   Kubernetes context (`k8s.pod.name` → `pod`, ...) and the `evidence_*` values; `startsAt`
//!   from `alert.starts_at`; `endsAt` the resolution time for resolved alerts, `now + 3 ×
//!   repeat` for firing ones; `generatorURL`.
//! - Firing alerts are re-sent every `repeat` (wall clock) so Alertmanager does not time them
//!   out; an escalation (warning → critical changes the `severity` label, hence the
//!   Alertmanager alert) resolves the warning alert.
//! - Other log records are ignored and counted in
//!   `otelcol_processor_dropped_log_records{processor="<exporter id>"}`.
//! - Delivery through the shared sending queue (one consumer, so a resolution never overtakes
//!   its firing) with retries: 429 and 5xx and network errors are retried, other 4xx dropped.

use crate::common;
use crate::otlphttp::parse_retry_after;
use crate::tls;
use async_trait::async_trait;
use inferwatch_core::auth::{AuthSettings, ClientAuth};
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{GoDuration, QueueSettings, RetrySettings, TlsClientSettings};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Event name of the alert records this exporter reads.
pub const EVENT_NAME: &str = "llm.degradation.alert";
/// The `alertname` label of a record without an `alertname` attribute.
pub const ALERT_NAME: &str = "LLMDegradation";
/// Firing alerts remembered for re-sending at most.
pub const MAX_ACTIVE: usize = 10_000;

/// Settings of the `alertmanager` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Alertmanager's base URL; `/api/v2/alerts` is appended.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Client authenticator extension (`auth: { authenticator: <id> }`, otelcol `configauth`).
    #[serde(default)]
    pub auth: Option<AuthSettings>,
    /// Deadline of one request, connection included (0: none).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
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
    /// Sending queue; one consumer (ordered delivery), also when the key is not given.
    #[serde(default = "default_queue", deserialize_with = "queue_one_consumer")]
    pub sending_queue: QueueSettings,
    /// Retries with back-off.
    #[serde(default)]
    pub retry_on_failure: RetrySettings,
}

fn default_endpoint() -> String {
    "http://127.0.0.1:9093".into()
}
fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(5))
}
fn default_generator_url() -> String {
    "http://inferwatch/".into()
}
fn default_true() -> bool {
    true
}
fn default_repeat() -> GoDuration {
    GoDuration(Duration::from_secs(60))
}
fn default_queue() -> QueueSettings {
    QueueSettings { num_consumers: 1, ..QueueSettings::default() }
}

fn queue_one_consumer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<QueueSettings, D::Error> {
    QueueSettings::deserialize_over(d, default_queue())
}

impl AlertmanagerConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: AlertmanagerConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.url()?;
        tls::validate(&self.tls)?;
        common::validate_queue(&self.sending_queue)?;
        if self.sending_queue.enabled && self.sending_queue.num_consumers != 1 {
            return Err(FieldError::at(
                "sending_queue.num_consumers",
                "num_consumers must be 1 for alertmanager: one sending consumer keeps an alert's firing and \
                 resolution in order",
            ));
        }
        common::validate_retry(&self.retry_on_failure)?;
        Ok(())
    }

    /// The URL alerts are posted to: the endpoint's path + `/api/v2/alerts`.
    pub fn url(&self) -> Result<Url, FieldError> {
        let s = &self.endpoint;
        let mut url = Url::parse(s).map_err(|e| FieldError::at("endpoint", format!("invalid URL {s:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FieldError::at("endpoint", format!("invalid URL {s:?}: the scheme must be http or https")));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(FieldError::at("endpoint", format!("invalid URL {s:?}: missing host")));
        }
        let path = format!("{}/api/v2/alerts", url.path().trim_end_matches('/'));
        url.set_path(&path);
        Ok(url)
    }

    /// How far ahead of now a firing alert's `endsAt` is set (3 × repeat; none without repeats).
    pub fn ends_in(&self) -> Option<Duration> {
        common::non_zero(self.repeat.0).map(|r| r * 3)
    }
}

/// Factory of the `alertmanager` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct AlertmanagerExporterFactory;

impl ExporterFactory for AlertmanagerExporterFactory {
    fn type_name(&self) -> &'static str {
        "alertmanager"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Logs]
    }

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        AlertmanagerConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        if signal != Signal::Logs {
            return Err(ComponentError::Start(format!("alertmanager exports logs (alert records), not {signal}")));
        }
        let c = AlertmanagerConfig::from_value(cfg)?;
        let mut sender = AlertmanagerSender::new(&c)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        let sender = Arc::new(sender);
        let inner = common::node(&ctx, signal, sender, c.sending_queue.clone(), c.retry_on_failure.clone())?;
        Ok(Arc::new(AlertmanagerExporter {
            name: ctx.id.to_string(),
            inner,
            send_resolved: c.send_resolved,
            repeat: common::non_zero(c.repeat.0),
            active: Arc::new(Mutex::new(Active::default())),
            ignored: ctx.telemetry.processor(&ctx.id, Signal::Logs).dropped,
            stop: CancellationToken::new(),
            task: tokio::sync::Mutex::new(None),
        }))
    }
}

// ---- records → Alertmanager alerts ----------------------------------------------------------

fn value_string(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn attr<'a>(r: &'a LogRecord, key: &str) -> Option<&'a AnyValue> {
    r.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

fn attr_string(r: &LogRecord, key: &str) -> Option<String> {
    attr(r, key).and_then(value_string)
}

/// True for the records of the `alerts` connector.
pub fn is_alert(r: &LogRecord) -> bool {
    (r.event_name == EVENT_NAME || attr_string(r, "event.name").as_deref() == Some(EVENT_NAME))
        && attr_string(r, "alert.state").is_some()
}

/// A Prometheus label name for an attribute key: invalid characters become `_`.
pub fn label_name(key: &str) -> String {
    let mut s: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// `ns` since the epoch as RFC 3339 UTC with milliseconds (`2023-11-14T22:13:20.000Z`).
pub fn rfc3339(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let ms = (ns % 1_000_000_000) / 1_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// How records become alerts.
#[derive(Debug, Clone)]
pub struct Render {
    /// `generatorURL`.
    pub generator_url: String,
    /// `endsAt` of firing alerts is now + this (none: left unset).
    pub ends_in: Option<Duration>,
}

/// The Alertmanager API v2 alert of one alert record (`None` for other records).
pub fn to_alert(r: &LogRecord, now: SystemTime, render: &Render) -> Option<Value> {
    if !is_alert(r) {
        return None;
    }
    let state = attr_string(r, "alert.state").unwrap_or_default();
    let severity = attr_string(r, "alert.severity").unwrap_or_else(|| "warning".into());
    let alertname = attr_string(r, "alertname").filter(|n| !n.is_empty()).unwrap_or_else(|| ALERT_NAME.into());
    let mut labels = Map::new();
    labels.insert("alertname".into(), alertname.clone().into());
    labels.insert("severity".into(), severity.clone().into());
    let mut annotations = Map::new();
    for kv in &r.attributes {
        let Some(v) = kv.value.as_ref().and_then(value_string) else { continue };
        let k = kv.key.as_str();
        if let Some(e) = k.strip_prefix("evidence.") {
            annotations.insert(label_name(&format!("evidence_{e}")), v.into());
            continue;
        }
        if let Some(a) = k.strip_prefix("alert.") {
            let name = match a {
                "value" | "baseline" | "threshold" | "eta" | "eta_low" | "eta_high" => Some(a),
                url if url.ends_with("_url") => Some(url),
                _ => None,
            };
            if let Some(n) = name.filter(|_| !v.is_empty()) {
                annotations.insert(label_name(n), v.into());
            }
            continue;
        }
        if k == "event.name" || k == "alertname" || v.is_empty() {
            continue;
        }
        // Kubernetes context (a pod changes on every restart) is not part of the alert's identity.
        if let Some(rest) = k.strip_prefix("k8s.") {
            let name = rest.strip_suffix(".name").filter(|n| !n.contains('.')).unwrap_or(rest);
            annotations.entry(label_name(name)).or_insert(v.into());
            continue;
        }
        let name = match k {
            "gen_ai.request.model" => "model".to_string(),
            "service.version" => "version".to_string(),
            "service.instance.id" => "instance".to_string(),
            other => label_name(other),
        };
        labels.entry(name).or_insert(v.into());
    }
    let summary = match attr_string(r, "alert.summary").filter(|s| !s.is_empty()) {
        Some(s) => s,
        None => match r.body.as_ref().and_then(value_string) {
            Some(b) => b,
            None => format!("{alertname} {severity} {state}"),
        },
    };
    annotations.insert("summary".into(), summary.into());
    annotations.insert("description".into(), description(r, &state, &severity).into());
    if let Some(id) = attr_string(r, "alert.id") {
        annotations.insert("alert_id".into(), id.into());
    }
    let starts_ns = match attr(r, "alert.starts_at").and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::IntValue(i)) if *i > 0 => *i as u64,
        _ => r.time_unix_nano,
    };
    let now_ns = unix_ns(now);
    let mut alert = json!({
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(starts_ns),
        "generatorURL": render.generator_url,
    });
    let ends = if state == "resolved" {
        // Never in the future: a clock ahead of Alertmanager's must not keep the alert active.
        Some(r.time_unix_nano.min(now_ns).max(starts_ns))
    } else {
        render.ends_in.map(|d| now_ns.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    };
    if let (Some(e), Some(obj)) = (ends, alert.as_object_mut()) {
        obj.insert("endsAt".into(), rfc3339(e).into());
    }
    Some(alert)
}

fn description(r: &LogRecord, state: &str, severity: &str) -> String {
    let get = |k: &str| attr_string(r, k).unwrap_or_else(|| "?".into());
    let (level, th) = (get("evidence.level"), get("evidence.threshold"));
    if state == "resolved" {
        format!(
            "Detector {} on {}: the {severity} alert resolved (anomaly level {level}, threshold {th}).",
            get("detector"),
            get("metric")
        )
    } else {
        format!(
            "Detector {} on {}: anomaly level {level} reached the {severity} threshold {th} (score {}).",
            get("detector"),
            get("metric"),
            get("evidence.score")
        )
    }
}

/// The alerts of every alert record of `req`, and the number of other records.
pub fn to_alerts(req: &ExportLogsServiceRequest, now: SystemTime, render: &Render) -> (Vec<Value>, usize) {
    let mut out = Vec::new();
    let mut other = 0;
    for r in req.resource_logs.iter().flat_map(|rl| &rl.scope_logs).flat_map(|sl| &sl.log_records) {
        match to_alert(r, now, render) {
            Some(a) => out.push(a),
            None => other += 1,
        }
    }
    (out, other)
}

// ---- sender ---------------------------------------------------------------------------------

/// One `POST /api/v2/alerts` per attempt.
pub struct AlertmanagerSender {
    client: reqwest::Client,
    url: Url,
    render: Render,
    auth: Option<Arc<dyn ClientAuth>>,
}

impl AlertmanagerSender {
    /// Builds the HTTP client for these settings.
    pub fn new(c: &AlertmanagerConfig) -> Result<Self, FieldError> {
        c.check()?;
        let url = c.url()?;
        let tls_config = if url.scheme() == "https" {
            tls::client_config(&c.tls).map_err(tls::TlsError::into_field_error)?
        } else {
            tls::plaintext_client_config().map_err(tls::TlsError::into_field_error)?
        };
        let mut b = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config)
            .user_agent(common::USER_AGENT)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(t) = common::non_zero(c.timeout.0) {
            b = b.timeout(t).connect_timeout(t);
        }
        let client = b.build().map_err(|e| FieldError::at("tls", format!("cannot build the HTTP client: {e}")))?;
        Ok(AlertmanagerSender {
            client,
            url,
            render: Render { generator_url: c.generator_url.clone(), ends_in: c.ends_in() },
            auth: None,
        })
    }
}

/// Maps an Alertmanager response status: 429 and 5xx are retryable, other statuses permanent.
pub fn classify(status: u16, message: String, retry_after: Option<Duration>) -> SendError {
    if status == 429 || (500..600).contains(&status) {
        SendError::Retryable { message, retry_after }
    } else {
        SendError::Permanent(message)
    }
}

#[async_trait]
impl Sender for AlertmanagerSender {
    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let decoded = data.decoded().map_err(|e| SendError::Permanent(format!("cannot decode the payload: {e}")))?;
        let Payload::Logs(req) = decoded.as_ref() else {
            return Err(SendError::Permanent(format!("alertmanager exports logs, got {}", data.signal())));
        };
        let (alerts, _) = to_alerts(req, SystemTime::now(), &self.render);
        if alerts.is_empty() {
            return Ok(());
        }
        let body = serde_json::to_vec(&alerts).map_err(|e| SendError::Permanent(format!("cannot encode: {e}")))?;
        let mut auth_headers = reqwest::header::HeaderMap::new();
        client_auth::apply_client_auth(self.auth.as_ref(), &mut auth_headers)?;
        let resp = self
            .client
            .post(self.url.clone())
            .headers(auth_headers)
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                let message = format!("POST {} failed: {e}", self.url);
                if e.is_builder() {
                    SendError::Permanent(message)
                } else {
                    SendError::Retryable { message, retry_after: None }
                }
            })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let text = resp.text().await.unwrap_or_default();
        let short: String = text.trim().chars().take(256).collect();
        Err(classify(status.as_u16(), format!("HTTP {status} from {}: {short}", self.url), retry_after))
    }
}

// ---- node: active alerts and re-sending -----------------------------------------------------

/// Firing alerts by `alert.id`, with an insertion counter for eviction.
#[derive(Default)]
struct Active {
    map: HashMap<String, (u64, LogRecord)>,
    seq: u64,
}

impl Active {
    fn insert(&mut self, id: String, r: LogRecord) {
        if !self.map.contains_key(&id)
            && self.map.len() >= MAX_ACTIVE
            && let Some(oldest) = self.map.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
        self.seq += 1;
        self.map.insert(id, (self.seq, r));
    }

    fn records(&self) -> Vec<LogRecord> {
        let mut v: Vec<&(u64, LogRecord)> = self.map.values().collect();
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, r)| r.clone()).collect()
    }
}

/// `r` turned into its resolution at event time `t` (for a replaced severity).
fn resolved_copy(r: &LogRecord, t: u64) -> LogRecord {
    let mut c = r.clone();
    c.time_unix_nano = t;
    for kv in c.attributes.iter_mut() {
        if kv.key == "alert.state" {
            kv.value = Some(AnyValue { value: Some(any_value::Value::StringValue("resolved".into())) });
        }
    }
    c
}

fn logs(records: Vec<LogRecord>) -> Payload {
    Payload::Logs(ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    })
}

/// The running exporter: tracks firing alerts and feeds the queued sender.
pub struct AlertmanagerExporter {
    name: String,
    inner: NodeRef,
    send_resolved: bool,
    repeat: Option<Duration>,
    active: Arc<Mutex<Active>>,
    ignored: Counter,
    stop: CancellationToken,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl AlertmanagerExporter {
    /// The records to send for `req`, updating the firing set.
    fn outgoing(&self, req: &ExportLogsServiceRequest) -> Vec<LogRecord> {
        let mut out = Vec::new();
        let mut ignored = 0u64;
        let mut active = self.active.lock();
        for r in req.resource_logs.iter().flat_map(|rl| &rl.scope_logs).flat_map(|sl| &sl.log_records) {
            if !is_alert(r) {
                ignored += 1;
                continue;
            }
            let id = attr_string(r, "alert.id").unwrap_or_default();
            let severity = attr_string(r, "alert.severity");
            let firing = attr_string(r, "alert.state").as_deref() == Some("firing");
            let prev = if firing {
                active.map.get(&id).map(|(_, p)| p.clone())
            } else {
                active.map.remove(&id).map(|(_, p)| p)
            };
            if let Some(p) = prev
                && attr_string(&p, "alert.severity") != severity
                && (firing || self.send_resolved)
            {
                // Another severity is another Alertmanager alert: resolve the old one.
                out.push(resolved_copy(&p, r.time_unix_nano));
            }
            if firing {
                active.insert(id, r.clone());
                out.push(r.clone());
            } else if self.send_resolved {
                out.push(r.clone());
            }
        }
        if ignored > 0 {
            tracing::debug!(exporter = %self.name, records = ignored, "log records that are not alerts ignored");
            self.ignored.inc_by(ignored);
        }
        out
    }
}

#[async_trait]
impl Consumer for AlertmanagerExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let decoded = data.decoded().map_err(|e| ConsumeError::Permanent(format!("cannot decode logs: {e}")))?;
        let Payload::Logs(req) = decoded.as_ref() else { return Ok(()) };
        let out = self.outgoing(req);
        if out.is_empty() {
            return Ok(());
        }
        self.inner.consume(logs(out)).await
    }
}

#[async_trait]
impl Node for AlertmanagerExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.inner.start().await?;
        let Some(every) = self.repeat else { return Ok(()) };
        let (inner, active, stop, name) =
            (self.inner.clone(), self.active.clone(), self.stop.clone(), self.name.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let records = active.lock().records();
                if records.is_empty() {
                    continue;
                }
                let n = records.len();
                if let Err(e) = inner.consume(logs(records)).await {
                    tracing::warn!(exporter = %name, alerts = n, error = %e, "re-sending firing alerts failed; next try in one interval");
                }
            }
        });
        *self.task.lock().await = Some(task);
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        self.stop.cancel();
        if let Some(t) = self.task.lock().await.take() {
            let _ = t.await;
        }
        self.inner.shutdown(deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123_456_789), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(4_107_542_399 * 1_000_000_000), "2100-02-28T23:59:59.000Z");
    }

    #[test]
    fn label_names_are_sanitised() {
        assert_eq!(label_name("gen_ai.request.model"), "gen_ai_request_model");
        assert_eq!(label_name("9x"), "_9x");
        assert_eq!(label_name(""), "_");
    }

    #[test]
    fn status_mapping() {
        for s in [429, 500, 502, 503, 504] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
        }
        for s in [400, 404, 422] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
        }
    }

    #[test]
    fn settings() {
        let c = AlertmanagerConfig::from_value(&serde_json::Value::Null).unwrap();
        assert_eq!(c.url().unwrap().as_str(), "http://127.0.0.1:9093/api/v2/alerts");
        assert_eq!(c.ends_in(), Some(Duration::from_secs(180)));
        assert_eq!(c.sending_queue.num_consumers, 1);
        let c = AlertmanagerConfig::from_value(&json!({"endpoint": "http://am:9093/prefix/", "repeat": "0s"})).unwrap();
        assert_eq!(c.url().unwrap().as_str(), "http://am:9093/prefix/api/v2/alerts");
        assert_eq!(c.ends_in(), None);
        for (v, key) in [
            (json!({"endpoint": "ftp://x"}), "endpoint"),
            (json!({"sending_queue": {"num_consumers": 4}}), "num_consumers"),
            (json!({"bogus": 1}), "bogus"),
        ] {
            let e = AlertmanagerConfig::from_value(&v).unwrap_err();
            assert!(format!("{:?}", e.path).contains(key), "{v}: {e:?}");
        }
    }
}
