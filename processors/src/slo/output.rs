//! The series `slo` exports per objective and group, built as one metrics batch per call.

use super::DETECTOR;
use super::config::Objective;
use super::ledger::{Assessment, Ledger, Severity, WINDOWS};
use crate::detect::{LEVEL, SCORE, SCORE_UNIT, kv_f64, kv_str};
use inferwatch_core::arrow::{ConvError, RecordBatch, metrics};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric::Data,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Cumulative count of events (monotonic sum).
pub const EVENTS: &str = "llm.slo.events";
/// Cumulative count of good events (monotonic sum).
pub const GOOD_EVENTS: &str = "llm.slo.good_events";
/// Burn rate per window (gauge, attribute `window`).
pub const BURN_RATE: &str = "llm.slo.burn_rate";
/// Error budget remaining over the period (gauge, 1 = untouched, ≤ 0 = spent).
pub const BUDGET_REMAINING: &str = "llm.slo.error_budget.remaining";
/// The objective's target (gauge).
pub const OBJECTIVE: &str = "llm.slo.objective";

/// The attributes naming an objective, on every output of it (the forecast's too).
pub fn identity(o: &Objective) -> Vec<KeyValue> {
    let mut v = vec![kv_str("slo", o.name.clone()), kv_str("slo.signal", o.sli.signal_name())];
    let th = o.sli.threshold();
    if th.is_finite() {
        v.push(kv_f64("slo.threshold", th));
    }
    v.push(kv_f64("slo.target", o.target));
    v
}

/// The metrics of one call, by name, in a fixed order.
#[derive(Default)]
pub struct Points {
    metrics: Vec<Metric>,
}

impl Points {
    fn metric(&mut self, name: &str, unit: &str, sum: bool) -> Option<&mut Vec<NumberDataPoint>> {
        let idx = match self.metrics.iter().position(|m| m.name == name) {
            Some(i) => i,
            None => {
                let data = if sum {
                    Data::Sum(Sum {
                        data_points: Vec::new(),
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: true,
                    })
                } else {
                    Data::Gauge(Gauge { data_points: Vec::new() })
                };
                self.metrics.push(Metric {
                    name: name.into(),
                    unit: unit.into(),
                    data: Some(data),
                    ..Default::default()
                });
                self.metrics.len() - 1
            }
        };
        match &mut self.metrics.get_mut(idx)?.data {
            Some(Data::Sum(s)) => Some(&mut s.data_points),
            Some(Data::Gauge(g)) => Some(&mut g.data_points),
            _ => None,
        }
    }

    fn push(&mut self, name: &str, unit: &str, sum: Option<u64>, time: u64, value: f64, attrs: Vec<KeyValue>) {
        let dp = NumberDataPoint {
            attributes: attrs,
            start_time_unix_nano: sum.unwrap_or(0),
            time_unix_nano: time,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        };
        if let Some(points) = self.metric(name, unit, sum.is_some()) {
            points.push(dp);
        }
    }

    /// The series of one group at event time `t`.
    pub fn group(&mut self, o: &Objective, key: &[(String, String)], l: &Ledger, value: f64, t: u64, a: &Assessment) {
        let mut base = identity(o);
        base.extend(key.iter().map(|(k, v)| kv_str(k, v.clone())));
        let start = Some(l.first_ns.min(t.saturating_sub(1)));
        self.push(EVENTS, "{event}", start, t, l.cumulative.total, base.clone());
        self.push(GOOD_EVENTS, "{event}", start, t, l.cumulative.good, base.clone());
        for (w, b) in WINDOWS.iter().zip(a.burn) {
            let mut attrs = base.clone();
            attrs.push(kv_str("window", w.label));
            self.push(BURN_RATE, "{burn_rate}", None, t, b, attrs);
        }
        self.push(BUDGET_REMAINING, "1", None, t, a.budget_remaining, base.clone());
        self.push(OBJECTIVE, "1", None, t, o.target, base.clone());
        if !o.burn_rate_alerts {
            return;
        }
        let mut attrs = vec![kv_str("detector", DETECTOR), kv_str("metric", o.sli.signal_name())];
        attrs.extend(base);
        attrs.push(kv_f64("value", value));
        let th = o.sli.threshold();
        if th.is_finite() {
            attrs.push(kv_f64("threshold", th));
        }
        attrs.push(kv_f64("error_budget.remaining", a.budget_remaining));
        if let Some(r) = a.fired {
            let (lw, sw) = (WINDOWS[r.long], WINDOWS[r.short]);
            attrs.extend([
                kv_str("severity_rule", if r.severity == Severity::Page { "page" } else { "ticket" }),
                kv_str("window_long", lw.label),
                kv_str("window_short", sw.label),
                kv_f64("burn_rate", a.burn[r.long]),
                kv_f64("burn_rate_long", a.burn[r.long]),
                kv_f64("burn_rate_short", a.burn[r.short]),
                kv_f64("burn_rate_factor", r.factor),
            ]);
        } else {
            attrs.push(kv_f64("burn_rate", a.burn[2]));
        }
        self.push(SCORE, SCORE_UNIT, None, t, a.score, attrs.clone());
        self.push(LEVEL, SCORE_UNIT, None, t, a.level(), attrs);
    }

    /// The points as one metrics batch (none when empty), appended to `out`.
    pub fn emit(self, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        if self.metrics.is_empty() {
            return Ok(());
        }
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv_str("service.name", "inferwatch")],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "inferwatch.slo".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics: self.metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        out.push(metrics::to_batch(&req)?);
        Ok(())
    }
}
