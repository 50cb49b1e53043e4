//! Alert records → Alertmanager API v2 alerts.

use super::{ALERT_NAME, EVENT_NAME};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use serde_json::{Map, Value, json};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(super) fn value_string(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(super) fn attr<'a>(r: &'a LogRecord, key: &str) -> Option<&'a AnyValue> {
    r.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

pub(super) fn attr_string(r: &LogRecord, key: &str) -> Option<String> {
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

pub(super) fn unix_ns(t: SystemTime) -> u64 {
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

pub(super) fn description(r: &LogRecord, state: &str, severity: &str) -> String {
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
