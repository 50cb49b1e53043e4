//! What every degradation detector shares: the `llm.anomaly.score` / `llm.anomaly.level` output
//! (and other derived gauges), built as one metrics-schema RecordBatch per call.

use inferwatch_core::arrow::{ConvError, RecordBatch, metrics};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Name of the raw score gauge (Prometheus `llm_anomaly_score`).
pub const SCORE: &str = "llm.anomaly.score";
/// Name of the normalised level gauge, in [0, 1] (Prometheus `llm_anomaly_level`).
pub const LEVEL: &str = "llm.anomaly.level";
/// Unit of [`SCORE`] and [`LEVEL`]: none. A score or a severity level is not a fraction of
/// anything, and unit `1` would make the Prometheus name end in `_ratio`.
pub const SCORE_UNIT: &str = "";
/// Name of the forecast gauge of `trend_forecast`, seconds until the predicted breach.
pub const BREACH_ETA: &str = "llm.slo.breach_eta";

/// A string attribute.
pub fn kv_str(k: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

/// A double attribute.
pub fn kv_f64(k: &str, v: f64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }),
        ..Default::default()
    }
}

/// An int attribute.
pub fn kv_i64(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }),
        ..Default::default()
    }
}

/// One derived gauge point: where it comes from and what it says.
#[derive(Debug, Clone)]
pub struct Point {
    /// Resource of the input series (kept so the output joins the input).
    pub resource: Resource,
    /// Scope of the input series.
    pub scope: InstrumentationScope,
    /// Gauge name (`llm.anomaly.score`, `llm.anomaly.level`, `llm.slo.breach_eta`, ...).
    pub name: &'static str,
    /// Unit of the gauge (`s`, `1` for a true ratio, empty for none).
    pub unit: &'static str,
    /// Event time (ns): the input point's timestamp.
    pub time_ns: u64,
    /// The value.
    pub value: f64,
    /// Attributes: `detector`, `metric`, the input point's attributes, evidence.
    pub attributes: Vec<KeyValue>,
}

/// Collects derived points and turns them into one batch.
#[derive(Debug, Default)]
pub struct Output {
    points: Vec<Point>,
}

impl Output {
    /// An empty output.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a point.
    pub fn push(&mut self, p: Point) {
        self.points.push(p);
    }

    /// Adds a score and its level for one input point: `detector`, `metric` and the input's
    /// attributes first, then `evidence`.
    #[allow(clippy::too_many_arguments)]
    pub fn score(
        &mut self,
        resource: &Resource,
        scope: &InstrumentationScope,
        input_attributes: &[KeyValue],
        time_ns: u64,
        detector: &str,
        metric: &str,
        score: f64,
        level: f64,
        evidence: &[KeyValue],
    ) {
        let mut attrs = Vec::with_capacity(2 + input_attributes.len() + evidence.len());
        attrs.push(kv_str("detector", detector));
        attrs.push(kv_str("metric", metric));
        attrs.extend(input_attributes.iter().filter(|kv| kv.key != "detector" && kv.key != "metric").cloned());
        attrs.extend(evidence.iter().cloned());
        for (name, value) in [(SCORE, score), (LEVEL, level)] {
            self.points.push(Point {
                resource: resource.clone(),
                scope: scope.clone(),
                name,
                unit: SCORE_UNIT,
                time_ns,
                value,
                attributes: attrs.clone(),
            });
        }
    }

    /// Number of points collected.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The points as one OTLP request: consecutive points of the same resource and scope share
    /// a ResourceMetrics / ScopeMetrics, in which the points of one name share a Metric.
    pub fn into_request(self) -> ExportMetricsServiceRequest {
        let mut out: Vec<ResourceMetrics> = Vec::new();
        for p in self.points {
            let dp = NumberDataPoint {
                attributes: p.attributes,
                time_unix_nano: p.time_ns,
                value: Some(number_data_point::Value::AsDouble(p.value)),
                ..Default::default()
            };
            let same_resource = out.last().is_some_and(|rm| rm.resource.as_ref() == Some(&p.resource));
            if !same_resource {
                out.push(ResourceMetrics { resource: Some(p.resource.clone()), ..Default::default() });
            }
            let Some(rm) = out.last_mut() else { continue };
            let same_scope = rm.scope_metrics.last().is_some_and(|sm| sm.scope.as_ref() == Some(&p.scope));
            if !same_scope {
                rm.scope_metrics.push(ScopeMetrics { scope: Some(p.scope.clone()), ..Default::default() });
            }
            let Some(sm) = rm.scope_metrics.last_mut() else { continue };
            // A scope holds few metric names: find this one's Metric (score and level alternate).
            let idx = match sm.metrics.iter().position(|m| m.name == p.name) {
                Some(i) => i,
                None => {
                    sm.metrics.push(Metric {
                        name: p.name.into(),
                        unit: p.unit.into(),
                        data: Some(Data::Gauge(Gauge { data_points: Vec::new() })),
                        ..Default::default()
                    });
                    sm.metrics.len() - 1
                }
            };
            if let Some(Metric { data: Some(Data::Gauge(g)), .. }) = sm.metrics.get_mut(idx) {
                g.data_points.push(dp);
            }
        }
        ExportMetricsServiceRequest { resource_metrics: out }
    }

    /// The points as a metrics-schema batch (none when empty), appended to `out`.
    pub fn emit(self, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        if self.points.is_empty() {
            return Ok(());
        }
        out.push(metrics::to_batch(&self.into_request())?);
        Ok(())
    }
}

/// Maps a raw score to a level in [0, 1]: `0` at or below `zero`, `1` at or above `one`, linear
/// between (NaN maps to 0).
pub fn linear_level(score: f64, zero: f64, one: f64) -> f64 {
    if !score.is_finite() {
        return if score == f64::INFINITY { 1.0 } else { 0.0 };
    }
    if one <= zero {
        return if score >= one { 1.0 } else { 0.0 };
    }
    ((score - zero) / (one - zero)).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_and_level_become_two_gauges_with_the_input_attributes() {
        let mut o = Output::new();
        let r = Resource { attributes: vec![kv_str("service.name", "vllm")], ..Default::default() };
        let s = InstrumentationScope::default();
        o.score(
            &r,
            &s,
            &[kv_str("model_name", "m")],
            10,
            "zscore_skew",
            "llm.ttft.p95",
            4.2,
            0.7,
            &[kv_i64("window", 50)],
        );
        o.score(&r, &s, &[kv_str("model_name", "m")], 20, "zscore_skew", "llm.ttft.p95", 1.0, 0.0, &[]);
        let req = o.into_request();
        assert_eq!(req.resource_metrics.len(), 1);
        let ms = &req.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, vec![SCORE, LEVEL]);
        let Some(Data::Gauge(g)) = &ms[0].data else { panic!("gauge") };
        assert_eq!(g.data_points.len(), 2);
        let keys: Vec<&str> = g.data_points[0].attributes.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, vec!["detector", "metric", "model_name", "window"]);
        assert_eq!(g.data_points[0].time_unix_nano, 10);
    }

    #[test]
    fn linear_level_clamps() {
        assert_eq!(linear_level(2.0, 3.0, 6.0), 0.0);
        assert_eq!(linear_level(4.5, 3.0, 6.0), 0.5);
        assert_eq!(linear_level(9.0, 3.0, 6.0), 1.0);
        assert_eq!(linear_level(f64::NAN, 3.0, 6.0), 0.0);
        assert_eq!(linear_level(f64::INFINITY, 3.0, 6.0), 1.0);
    }
}
