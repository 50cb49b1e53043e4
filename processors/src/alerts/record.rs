//! The alert log records: `llm.degradation.alert` events with state, severity, identity and evidence.

use super::describe::{self, SHORT_NAMES, Subject, Template};
use super::lifecycle::{Kind, Severity, Thresholds, Transition};
use crate::detect::{kv_f64, kv_i64, kv_str};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::sync::Arc;

/// Event name of every alert record.
pub const EVENT_NAME: &str = "llm.degradation.alert";
/// Instrumentation scope of the records.
pub const SCOPE: &str = "inferwatch.alerts";

/// What the triggering point says (absent for an eviction).
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// The level.
    pub level: f64,
    /// The score at the same time, if the batch held it.
    pub score: Option<f64>,
    /// The breach forecast (seconds) at the same time, if any.
    pub breach_eta: Option<f64>,
    /// The point's own evidence attributes (window, mean, std, ...).
    pub attributes: Vec<KeyValue>,
}

/// One record to build.
#[derive(Debug, Clone)]
pub struct Alert<'a> {
    /// The transition.
    pub transition: &'a Transition,
    /// `alert.id`.
    pub id: &'a str,
    /// `alertname`.
    pub alertname: &'a str,
    /// Identity labels (detector, metric, group attributes).
    pub labels: &'a [(String, String)],
    /// Context attributes of the point (`k8s.pod.name`, ...), not part of the identity.
    pub context: &'a [(String, String)],
    /// Event time of the record.
    pub time: u64,
    /// Thresholds of the alert's detector.
    pub thresholds: Thresholds,
    /// Evidence of the triggering point.
    pub evidence: Option<&'a Evidence>,
    /// Link templates by name (`dashboard` → attribute `alert.dashboard_url`).
    pub links: &'a [(String, Template)],
}

impl Alert<'_> {
    /// Identity and context labels together.
    fn all_labels(&self) -> Vec<(String, String)> {
        self.labels.iter().chain(self.context).cloned().collect()
    }

    /// The value of template variable `name`.
    fn var(&self, all: &[(String, String)], name: &str) -> Option<String> {
        let get = |k: &str| all.iter().find(|(l, _)| l == k).map(|(_, v)| v.clone());
        match name {
            "alertname" => Some(self.alertname.to_string()),
            "severity" => Some(self.transition.severity.as_str().to_string()),
            "alert_id" | "id" => Some(self.id.to_string()),
            "state" => Some(if self.transition.kind.resolves() { "resolved" } else { "firing" }.to_string()),
            _ => match SHORT_NAMES.iter().find(|(s, _)| *s == name) {
                Some((_, attr)) => get(attr),
                None => get(name),
            },
        }
    }
}

fn subject<'a>(a: &'a Alert<'_>, all: &'a [(String, String)]) -> Subject<'a> {
    Subject {
        labels: all,
        evidence: a.evidence.map(|e| e.attributes.as_slice()),
        level: a.evidence.map(|e| e.level),
        score: a.evidence.and_then(|e| e.score),
        breach_eta: a.evidence.and_then(|e| e.breach_eta),
    }
}

/// The one-sentence summary of a record (attribute `alert.summary`).
pub fn summary(a: &Alert<'_>) -> String {
    let all = a.all_labels();
    describe::summary(&subject(a, &all), a.transition.kind, a.transition.severity, a.thresholds.resolve_below)
}

/// The record's body: state, severity, alertname and the summary.
pub fn body(a: &Alert<'_>, summary: &str) -> String {
    let t = a.transition;
    let state = if t.kind.resolves() { "RESOLVED" } else { "FIRING" };
    let extra = if t.kind == Kind::Escalate { " (escalated)" } else { "" };
    format!("{state} {}{extra} {}: {summary}", t.severity.as_str(), a.alertname)
}

/// The log record of one transition.
pub fn record(a: &Alert<'_>) -> LogRecord {
    let t = a.transition;
    let resolved = t.kind.resolves();
    let (sev_num, sev_text) = match (resolved, t.severity) {
        (true, _) => (SeverityNumber::Info, "INFO"),
        (false, Severity::Warning) => (SeverityNumber::Warn, "WARN"),
        (false, Severity::Critical) => (SeverityNumber::Error, "ERROR"),
    };
    let all = a.all_labels();
    let subject = subject(a, &all);
    let text = describe::summary(&subject, t.kind, t.severity, a.thresholds.resolve_below);
    let mut attrs = vec![
        kv_str("event.name", EVENT_NAME),
        kv_str("alert.state", if resolved { "resolved" } else { "firing" }),
        kv_str("alert.severity", t.severity.as_str()),
        kv_str("alert.id", a.id),
        kv_i64("alert.starts_at", i64::try_from(t.starts_at).unwrap_or(i64::MAX)),
        kv_str("alert.transition", t.kind.as_str()),
        kv_str("alertname", a.alertname),
    ];
    attrs.extend(all.iter().map(|(k, v)| kv_str(k, v.clone())));
    attrs.push(kv_str("alert.summary", text.clone()));
    if a.evidence.is_some() {
        let f = describe::facts(&subject);
        for (k, v) in [
            ("alert.value", f.value),
            ("alert.baseline", f.baseline),
            ("alert.threshold", f.threshold),
            ("alert.eta", f.eta),
            ("alert.eta_low", f.eta_low),
            ("alert.eta_high", f.eta_high),
        ] {
            if let Some(v) = v {
                attrs.push(kv_f64(k, v));
            }
        }
    }
    for (name, tpl) in a.links {
        let url = tpl.render(&|v| a.var(&all, v));
        attrs.push(kv_str(&format!("alert.{name}_url"), url));
    }
    if let Some(e) = a.evidence {
        attrs.push(kv_f64("evidence.level", e.level));
        if let Some(s) = e.score {
            attrs.push(kv_f64("evidence.score", s));
        }
        let th = if resolved { a.thresholds.resolve_below } else { a.thresholds.of(t.severity) };
        attrs.push(kv_f64("evidence.threshold", th));
        if let Some(eta) = e.breach_eta {
            attrs.push(kv_f64("evidence.breach_eta", eta));
        }
        for kv in &e.attributes {
            let key = format!("evidence.{}", kv.key);
            // The connector's own evidence keys win (a detector's `threshold` is in alert.threshold).
            if attrs.iter().any(|x| x.key == key) {
                continue;
            }
            attrs.push(KeyValue { key, ..kv.clone() });
        }
    }
    LogRecord {
        time_unix_nano: a.time,
        observed_time_unix_nano: a.time,
        severity_number: sev_num as i32,
        severity_text: sev_text.into(),
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(body(a, &text))) }),
        attributes: attrs,
        event_name: EVENT_NAME.into(),
        ..Default::default()
    }
}

/// Collects records under their resources.
#[derive(Debug, Default)]
pub struct Records {
    out: Vec<(Arc<Resource>, LogRecord)>,
}

impl Records {
    /// Adds a record under `resource`.
    pub fn push(&mut self, resource: Arc<Resource>, r: LogRecord) {
        self.out.push((resource, r));
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// One logs request; consecutive records of one resource share a ResourceLogs.
    pub fn into_request(self) -> ExportLogsServiceRequest {
        let mut rls: Vec<ResourceLogs> = Vec::new();
        let mut last: Option<Arc<Resource>> = None;
        for (res, rec) in self.out {
            let same = last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &res) || **l == *res);
            if !same || rls.is_empty() {
                rls.push(ResourceLogs {
                    resource: Some((*res).clone()),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(InstrumentationScope { name: SCOPE.into(), ..Default::default() }),
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                last = Some(res);
            }
            if let Some(sl) = rls.last_mut().and_then(|rl| rl.scope_logs.last_mut()) {
                sl.log_records.push(rec);
            }
        }
        ExportLogsServiceRequest { resource_logs: rls }
    }
}
