//! The alert log records: `llm.degradation.alert` events with state, severity, identity and evidence.

use super::lifecycle::{Kind, Severity, Thresholds, Transition};
use crate::detect::{kv_f64, kv_i64, kv_str};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::fmt::Write;
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
    /// Identity labels (detector, metric, group attributes).
    pub labels: &'a [(String, String)],
    /// Event time of the record.
    pub time: u64,
    /// Thresholds of the alert's detector.
    pub thresholds: Thresholds,
    /// Evidence of the triggering point.
    pub evidence: Option<&'a Evidence>,
}

fn identity_text(labels: &[(String, String)]) -> String {
    let get = |k: &str| labels.iter().find(|(l, _)| l == k).map(|(_, v)| v.as_str()).unwrap_or("?");
    let mut s = format!("{} on {}", get("detector"), get("metric"));
    let group: Vec<String> =
        labels.iter().filter(|(k, _)| k != "detector" && k != "metric").map(|(k, v)| format!("{k}={v}")).collect();
    if !group.is_empty() {
        let _ = write!(s, " ({})", group.join(", "));
    }
    s
}

/// The one-line human summary (the record's body).
pub fn summary(a: &Alert<'_>) -> String {
    let t = a.transition;
    let who = identity_text(a.labels);
    let level = a.evidence.map(|e| e.level);
    match t.kind {
        Kind::Resolve => match level {
            Some(l) => format!("RESOLVED {}: {who}: level {l:.3} < {}", t.severity.as_str(), a.thresholds.warning),
            None => format!("RESOLVED {}: {who}", t.severity.as_str()),
        },
        Kind::Evict => format!("RESOLVED {}: {who}: dropped from the alert state (max_alerts)", t.severity.as_str()),
        Kind::Fire | Kind::Escalate | Kind::Repeat => {
            let extra = if t.kind == Kind::Escalate { " (escalated)" } else { "" };
            let th = a.thresholds.of(t.severity);
            match level {
                Some(l) => format!("FIRING {}{extra}: {who}: level {l:.3} >= {th}", t.severity.as_str()),
                None => format!("FIRING {}{extra}: {who}", t.severity.as_str()),
            }
        }
    }
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
    let mut attrs = vec![
        kv_str("event.name", EVENT_NAME),
        kv_str("alert.state", if resolved { "resolved" } else { "firing" }),
        kv_str("alert.severity", t.severity.as_str()),
        kv_str("alert.id", a.id),
        kv_i64("alert.starts_at", i64::try_from(t.starts_at).unwrap_or(i64::MAX)),
        kv_str("alert.transition", t.kind.as_str()),
    ];
    attrs.extend(a.labels.iter().map(|(k, v)| kv_str(k, v.clone())));
    if let Some(e) = a.evidence {
        attrs.push(kv_f64("evidence.level", e.level));
        if let Some(s) = e.score {
            attrs.push(kv_f64("evidence.score", s));
        }
        let th = if resolved { a.thresholds.warning } else { a.thresholds.of(t.severity) };
        attrs.push(kv_f64("evidence.threshold", th));
        if let Some(eta) = e.breach_eta {
            attrs.push(kv_f64("evidence.breach_eta", eta));
        }
        for kv in &e.attributes {
            attrs.push(KeyValue { key: format!("evidence.{}", kv.key), ..kv.clone() });
        }
    }
    LogRecord {
        time_unix_nano: a.time,
        observed_time_unix_nano: a.time,
        severity_number: sev_num as i32,
        severity_text: sev_text.into(),
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(summary(a))) }),
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
