//! The groups detectors key their state by: the (model, version, instance) [`GroupKey`], and
//! the values of configured `group_by` attributes of a row.

use super::kv_str;
use super::rows::{self, Rows};
use inferwatch_core::arrow::{ConvError, schema};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use serde::{Deserialize, Serialize};

/// The attribute naming the model (as `llm_signals` writes it).
pub const MODEL: &str = "gen_ai.request.model";
/// The point attribute tried for the model when [`MODEL`] is missing (raw vLLM label).
pub const MODEL_FALLBACK: &str = "model_name";

/// A (model, version, instance) group. Ordered by instance, then version, then model, so the
/// groups of one instance and version are adjacent in a sorted map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey {
    /// Instance (`service.instance.id`; "" when absent).
    pub instance: String,
    /// Version (`service.version`; "" when absent).
    pub version: String,
    /// Model (`gen_ai.request.model`; "" when absent).
    pub model: String,
}

impl GroupKey {
    /// A key from its three parts.
    pub fn new(instance: impl Into<String>, version: impl Into<String>, model: impl Into<String>) -> Self {
        GroupKey { instance: instance.into(), version: version.into(), model: model.into() }
    }

    /// The group of `row` (point attributes `attrs`): each part by [`value`] ("" when missing).
    pub fn of(rows: &mut Rows<'_>, row: usize, attrs: &[KeyValue]) -> Result<Self, ConvError> {
        Ok(GroupKey {
            model: value(rows, row, attrs, MODEL, true)?.unwrap_or_default(),
            version: value(rows, row, attrs, schema::SERVICE_VERSION, true)?.unwrap_or_default(),
            instance: value(rows, row, attrs, schema::SERVICE_INSTANCE_ID, true)?.unwrap_or_default(),
        })
    }

    /// The group as point attributes: model, version, instance.
    pub fn attributes(&self) -> Vec<KeyValue> {
        vec![
            kv_str(MODEL, self.model.clone()),
            kv_str(schema::SERVICE_VERSION, self.version.clone()),
            kv_str(schema::SERVICE_INSTANCE_ID, self.instance.clone()),
        ]
    }
}

/// Attribute `key` of `row` as a string: the point attribute (for [`MODEL`] with
/// `model_fallback`, then the point attribute [`MODEL_FALLBACK`]), else the resource attribute.
pub fn value(
    rows: &mut Rows<'_>,
    row: usize,
    attrs: &[KeyValue],
    key: &str,
    model_fallback: bool,
) -> Result<Option<String>, ConvError> {
    let mut v = rows::point_string(attrs, key);
    if v.is_none() && model_fallback && key == MODEL {
        v = rows::point_string(attrs, MODEL_FALLBACK);
    }
    match v {
        Some(v) => Ok(Some(v)),
        None => rows::lookup(rows, row, &[], key),
    }
}

/// The values of the `group_by` attributes of `row`, by [`value`] ("" when missing).
pub fn values(
    group_by: &[String],
    rows: &mut Rows<'_>,
    row: usize,
    attrs: &[KeyValue],
    model_fallback: bool,
) -> Result<Vec<String>, ConvError> {
    let mut key = Vec::with_capacity(group_by.len());
    for g in group_by {
        key.push(value(rows, row, attrs, g, model_fallback)?.unwrap_or_default());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::arrow::metrics;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    fn batch(points: Vec<Vec<KeyValue>>) -> arrow_array::RecordBatch {
        let dps = points
            .into_iter()
            .map(|attributes| NumberDataPoint {
                attributes,
                time_unix_nano: 1,
                value: Some(number_data_point::Value::AsDouble(1.0)),
                ..Default::default()
            })
            .collect();
        let resource = Resource {
            attributes: vec![
                kv_str(MODEL, "res-model"),
                kv_str(schema::SERVICE_VERSION, "v1"),
                kv_str(schema::SERVICE_INSTANCE_ID, "i1"),
            ],
            ..Default::default()
        };
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "m".into(),
                        data: Some(metric::Data::Gauge(Gauge { data_points: dps })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        metrics::to_batch(&req).unwrap()
    }

    #[test]
    fn point_then_fallback_then_resource() {
        let b = batch(vec![
            vec![kv_str(MODEL, "own"), kv_str(MODEL_FALLBACK, "raw"), kv_str(schema::SERVICE_VERSION, "v2")],
            vec![kv_str(MODEL_FALLBACK, "raw")],
            vec![],
        ]);
        let mut rows = Rows::new(&b).unwrap();
        let keys: Vec<GroupKey> = (0..3)
            .map(|r| {
                let attrs = rows.attributes(r).unwrap();
                GroupKey::of(&mut rows, r, &attrs).unwrap()
            })
            .collect();
        assert_eq!(keys[0], GroupKey::new("i1", "v2", "own"));
        assert_eq!(keys[1], GroupKey::new("i1", "v1", "raw"));
        assert_eq!(keys[2], GroupKey::new("i1", "v1", "res-model"));
        let attrs = rows.attributes(1).unwrap();
        let by = vec![MODEL.to_string(), "absent".to_string()];
        assert_eq!(values(&by, &mut rows, 1, &attrs, true).unwrap(), vec!["raw", ""]);
        assert_eq!(values(&by, &mut rows, 1, &attrs, false).unwrap(), vec!["res-model", ""]);
    }

    #[test]
    fn keys_order_by_instance_version_model_and_print_model_first() {
        let mut ks = vec![GroupKey::new("j", "v", "a"), GroupKey::new("i", "w", "a"), GroupKey::new("i", "v", "b")];
        ks.sort();
        assert_eq!(ks, vec![GroupKey::new("i", "v", "b"), GroupKey::new("i", "w", "a"), GroupKey::new("j", "v", "a")]);
        let names: Vec<String> = ks[0].attributes().into_iter().map(|kv| kv.key).collect();
        assert_eq!(names, vec![MODEL, schema::SERVICE_VERSION, schema::SERVICE_INSTANCE_ID]);
    }
}
