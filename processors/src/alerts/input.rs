//! Reading the detectors' output: `llm.anomaly.level` points with their identity, and the
//! `llm.anomaly.score` / `llm.slo.breach_eta` points of the same alert and time as evidence.

use crate::detect::{BREACH_ETA, LEVEL, SCORE};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, metric::Data, number_data_point};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::HashMap;
use std::sync::Arc;

/// One `llm.anomaly.level` point, with what identifies its alert.
#[derive(Debug, Clone)]
pub struct LevelPoint {
    /// Resource of the point (the log record goes out under it).
    pub resource: Arc<Resource>,
    /// Alert key: detector, metric and the group attributes present, canonically joined.
    pub key: String,
    /// Identity labels: `detector`, `metric`, then the group attributes present (config order).
    pub labels: Vec<(String, String)>,
    /// Context attributes present (point, else resource), not part of the identity (`k8s.pod.name`).
    pub context: Vec<(String, String)>,
    /// Event time (ns).
    pub time: u64,
    /// The level.
    pub level: f64,
    /// The point's other attributes (not detector, metric or grouping): the detector's evidence.
    pub evidence: Vec<KeyValue>,
}

/// What one metrics request holds for the alerts connector.
#[derive(Debug, Default)]
pub struct Extract {
    /// Level points, sorted by event time (stable).
    pub levels: Vec<LevelPoint>,
    /// `llm.anomaly.score` by (alert key, time).
    pub scores: HashMap<(String, u64), f64>,
    /// `llm.slo.breach_eta` (seconds) by (alert key, time).
    pub etas: HashMap<(String, u64), f64>,
    /// Level points without a `detector` or `metric` attribute (skipped).
    pub unidentified: u64,
}

/// A scalar attribute value as a string; `None` for arrays, maps, bytes and empty values.
pub fn value_string(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn find<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

/// The alert key of a set of identity labels.
pub fn key_of(labels: &[(String, String)]) -> String {
    let mut s = String::new();
    for (k, v) in labels {
        s.push_str(k);
        s.push('\u{1f}');
        s.push_str(v);
        s.push('\u{1e}');
    }
    s
}

/// The stable id of an alert key: FNV-1a 64 as 16 hex digits (the same in every build).
pub fn alert_id(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn number(p: &NumberDataPoint) -> Option<f64> {
    match p.value? {
        number_data_point::Value::AsDouble(d) => Some(d),
        number_data_point::Value::AsInt(i) => Some(i as f64),
    }
}

/// Identity labels of a point: `detector`, `metric` from its attributes, then each of
/// `group_by` found in the point's attributes, else in the resource's.
fn identity(attrs: &[KeyValue], resource: &Resource, group_by: &[String]) -> Option<Vec<(String, String)>> {
    let detector = find(attrs, "detector").and_then(value_string).filter(|s| !s.is_empty())?;
    let metric = find(attrs, "metric").and_then(value_string).filter(|s| !s.is_empty())?;
    let mut labels = vec![("detector".to_string(), detector), ("metric".to_string(), metric)];
    for k in group_by {
        if k == "detector" || k == "metric" {
            continue;
        }
        let v = find(attrs, k).or_else(|| find(&resource.attributes, k)).and_then(value_string);
        if let Some(v) = v {
            labels.push((k.clone(), v));
        }
    }
    Some(labels)
}

/// The `context` attributes of a point found in its attributes, else its resource's, that are
/// not identity labels already.
fn context_of(
    attrs: &[KeyValue],
    resource: &Resource,
    labels: &[(String, String)],
    context: &[String],
) -> Vec<(String, String)> {
    context
        .iter()
        .filter(|k| !labels.iter().any(|(l, _)| l == *k))
        .filter_map(|k| {
            let v = find(attrs, k).or_else(|| find(&resource.attributes, k)).and_then(value_string)?;
            (!v.is_empty()).then(|| (k.clone(), v))
        })
        .collect()
}

/// Reads the level, score and breach-ETA points of `req`, grouping by `group_by` and copying
/// the `context` attributes.
pub fn extract(req: &ExportMetricsServiceRequest, group_by: &[String], context: &[String]) -> Extract {
    let mut out = Extract::default();
    for rm in &req.resource_metrics {
        let resource = Arc::new(rm.resource.clone().unwrap_or_default());
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let name = m.name.as_str();
                if name != LEVEL && name != SCORE && name != BREACH_ETA {
                    continue;
                }
                let points = match &m.data {
                    Some(Data::Gauge(g)) => &g.data_points,
                    Some(Data::Sum(s)) => &s.data_points,
                    _ => continue,
                };
                for p in points {
                    let Some(value) = number(p) else { continue };
                    let Some(labels) = identity(&p.attributes, &resource, group_by) else {
                        if name == LEVEL {
                            out.unidentified += 1;
                        }
                        continue;
                    };
                    let key = key_of(&labels);
                    let time = p.time_unix_nano;
                    match name {
                        SCORE => {
                            out.scores.insert((key, time), value);
                        }
                        BREACH_ETA => {
                            out.etas.insert((key, time), value);
                        }
                        _ => {
                            let ctx = context_of(&p.attributes, &resource, &labels, context);
                            let evidence = p
                                .attributes
                                .iter()
                                .filter(|kv| !labels.iter().chain(&ctx).any(|(k, _)| *k == kv.key))
                                .cloned()
                                .collect();
                            out.levels.push(LevelPoint {
                                resource: resource.clone(),
                                key,
                                labels,
                                context: ctx,
                                time,
                                level: value,
                                evidence,
                            });
                        }
                    }
                }
            }
        }
    }
    out.levels.sort_by_key(|p| p.time);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        // FNV-1a 64 of the empty string is the offset basis.
        assert_eq!(alert_id(""), "cbf29ce484222325");
        assert_eq!(alert_id("a"), "af63dc4c8601ec8c");
        let k1 = key_of(&[("detector".into(), "d".into()), ("metric".into(), "m1".into())]);
        let k2 = key_of(&[("detector".into(), "d".into()), ("metric".into(), "m".into()), ("1".into(), "".into())]);
        assert_ne!(k1, k2);
        assert_ne!(alert_id(&k1), alert_id(&k2));
    }
}
