//! What every degradation detector shares: the `llm.anomaly.score` / `llm.anomaly.level` output
//! (and other derived gauges), written into one metrics-schema RecordBatch per call ([`output`]).

pub mod adapter;
pub mod config;
pub mod group;
pub mod level;
pub mod limits;
pub mod output;
pub mod point;
pub mod rows;
pub mod series;
pub mod sketch;

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

pub use output::{Output, Point};

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
    fn linear_level_clamps() {
        assert_eq!(linear_level(2.0, 3.0, 6.0), 0.0);
        assert_eq!(linear_level(4.5, 3.0, 6.0), 0.5);
        assert_eq!(linear_level(9.0, 3.0, 6.0), 1.0);
        assert_eq!(linear_level(f64::NAN, 3.0, 6.0), 0.0);
        assert_eq!(linear_level(f64::INFINITY, 3.0, 6.0), 1.0);
    }
}
