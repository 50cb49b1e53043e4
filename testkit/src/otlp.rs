//! OTLP builders (attributes, resources, scopes, number and histogram points, gauges, sums,
//! histograms, spans, log records and the three export requests) and readers that flatten a
//! request into what tests assert on.
//!
//! The builders set only what their arguments name; everything else is the protobuf default, so
//! `Struct { field: x, ..builder(..) }` adjusts one field.

use crate::attrs;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use std::collections::BTreeMap;

/// `AGGREGATION_TEMPORALITY_CUMULATIVE`.
pub const CUMULATIVE: i32 = 2;

// ---- attributes ---------------------------------------------------------------------------------

/// An attribute with any value.
pub fn any_kv(key: &str, value: Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

/// A string attribute.
pub fn kv(key: &str, value: &str) -> KeyValue {
    any_kv(key, Value::StringValue(value.into()))
}

/// An int attribute.
pub fn int_kv(key: &str, value: i64) -> KeyValue {
    any_kv(key, Value::IntValue(value))
}

/// A double attribute.
pub fn f64_kv(key: &str, value: f64) -> KeyValue {
    any_kv(key, Value::DoubleValue(value))
}

/// A bool attribute.
pub fn bool_kv(key: &str, value: bool) -> KeyValue {
    any_kv(key, Value::BoolValue(value))
}

/// String attributes from `(key, value)` pairs.
pub fn kvs(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    pairs.iter().map(|(k, v)| kv(k, v)).collect()
}

/// A resource with these attributes.
pub fn resource(attributes: Vec<KeyValue>) -> Resource {
    Resource { attributes, ..Default::default() }
}

/// An instrumentation scope (`version` may be empty).
pub fn scope(name: &str, version: &str) -> InstrumentationScope {
    InstrumentationScope { name: name.into(), version: version.into(), ..Default::default() }
}

// ---- metrics ------------------------------------------------------------------------------------

/// A double number point at `time` (ns) with no start time.
pub fn point(attributes: Vec<KeyValue>, time: u64, value: f64) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        time_unix_nano: time,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    }
}

/// An int number point at `time` (ns) with no start time.
pub fn int_point(attributes: Vec<KeyValue>, time: u64, value: i64) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        time_unix_nano: time,
        value: Some(number_data_point::Value::AsInt(value)),
        ..Default::default()
    }
}

/// A histogram point over `start..time` (ns) with explicit `bounds`, bucket `counts` (one more
/// than the bounds), their total as the count, and `sum`.
pub fn histogram_point(
    attributes: Vec<KeyValue>,
    start: u64,
    time: u64,
    bounds: &[f64],
    counts: &[u64],
    sum: f64,
) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: time,
        count: counts.iter().sum(),
        sum: Some(sum),
        bucket_counts: counts.to_vec(),
        explicit_bounds: bounds.to_vec(),
        ..Default::default()
    }
}

/// A gauge metric.
pub fn gauge(name: &str, unit: &str, data_points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(metric::Data::Gauge(Gauge { data_points })),
        ..Default::default()
    }
}

/// A cumulative sum metric.
pub fn sum(name: &str, unit: &str, data_points: Vec<NumberDataPoint>, is_monotonic: bool) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(metric::Data::Sum(Sum { data_points, aggregation_temporality: CUMULATIVE, is_monotonic })),
        ..Default::default()
    }
}

/// A cumulative histogram metric.
pub fn histogram(name: &str, unit: &str, data_points: Vec<HistogramDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(metric::Data::Histogram(Histogram { data_points, aggregation_temporality: CUMULATIVE })),
        ..Default::default()
    }
}

/// One resource (with these attributes) holding one scope of `metrics`.
pub fn resource_metrics(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    metrics: Vec<Metric>,
) -> ResourceMetrics {
    ResourceMetrics {
        resource: Some(resource(resource_attrs)),
        scope_metrics: vec![ScopeMetrics { scope: scope.into(), metrics, schema_url: String::new() }],
        schema_url: String::new(),
    }
}

/// A metrics request of one resource and one scope.
pub fn metrics_request(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    metrics: Vec<Metric>,
) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest { resource_metrics: vec![resource_metrics(resource_attrs, scope, metrics)] }
}

// ---- traces -------------------------------------------------------------------------------------

/// A span with a name, a kind (`SpanKind as i32`) and attributes; no ids, no times.
pub fn span(name: &str, kind: i32, attributes: Vec<KeyValue>) -> Span {
    Span { name: name.into(), kind, attributes, ..Default::default() }
}

/// One resource (with these attributes) holding one scope of `spans`.
pub fn resource_spans(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    spans: Vec<Span>,
) -> ResourceSpans {
    ResourceSpans {
        resource: Some(resource(resource_attrs)),
        scope_spans: vec![ScopeSpans { scope: scope.into(), spans, schema_url: String::new() }],
        schema_url: String::new(),
    }
}

/// A traces request of one resource and one scope.
pub fn traces_request(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    spans: Vec<Span>,
) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest { resource_spans: vec![resource_spans(resource_attrs, scope, spans)] }
}

// ---- logs ---------------------------------------------------------------------------------------

/// A log record with a severity, its text and a body.
pub fn log_record(severity_number: i32, severity_text: &str, body: Value) -> LogRecord {
    LogRecord {
        severity_number,
        severity_text: severity_text.into(),
        body: Some(AnyValue { value: Some(body) }),
        ..Default::default()
    }
}

/// One resource (with these attributes) holding one scope of `records`.
pub fn resource_logs(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    records: Vec<LogRecord>,
) -> ResourceLogs {
    ResourceLogs {
        resource: Some(resource(resource_attrs)),
        scope_logs: vec![ScopeLogs { scope: scope.into(), log_records: records, schema_url: String::new() }],
        schema_url: String::new(),
    }
}

/// A logs request of one resource and one scope.
pub fn logs_request(
    resource_attrs: Vec<KeyValue>,
    scope: impl Into<Option<InstrumentationScope>>,
    records: Vec<LogRecord>,
) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest { resource_logs: vec![resource_logs(resource_attrs, scope, records)] }
}

// ---- readers ------------------------------------------------------------------------------------

/// Every span of `req` with its resource attributes and scope name, in order.
pub fn spans_of(req: &ExportTraceServiceRequest) -> Vec<(Vec<KeyValue>, String, Span)> {
    let mut out = Vec::new();
    for rs in &req.resource_spans {
        let res = attrs::resource_attrs(rs.resource.as_ref()).to_vec();
        for ss in &rs.scope_spans {
            let scope = ss.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            out.extend(ss.spans.iter().map(|s| (res.clone(), scope.clone(), s.clone())));
        }
    }
    out
}

/// Every metric of `req` with its resource attributes and scope name, in order.
pub fn metrics_of(req: &ExportMetricsServiceRequest) -> Vec<(Vec<KeyValue>, String, Metric)> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let res = attrs::resource_attrs(rm.resource.as_ref()).to_vec();
        for sm in &rm.scope_metrics {
            let scope = sm.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            out.extend(sm.metrics.iter().map(|m| (res.clone(), scope.clone(), m.clone())));
        }
    }
    out
}

/// Every log record of `req` with its resource attributes and scope name, in order.
pub fn logs_of(req: &ExportLogsServiceRequest) -> Vec<(Vec<KeyValue>, String, LogRecord)> {
    let mut out = Vec::new();
    for rl in &req.resource_logs {
        let res = attrs::resource_attrs(rl.resource.as_ref()).to_vec();
        for sl in &rl.scope_logs {
            let scope = sl.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            out.extend(sl.log_records.iter().map(|r| (res.clone(), scope.clone(), r.clone())));
        }
    }
    out
}

/// One double gauge point flattened with its metric, resource and scope (attributes as text,
/// see [`attrs::strings`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GaugePoint {
    /// Metric name.
    pub name: String,
    /// Metric unit.
    pub unit: String,
    /// Scope name.
    pub scope: String,
    /// Resource attributes.
    pub resource: BTreeMap<String, String>,
    /// Point attributes.
    pub attrs: BTreeMap<String, String>,
    /// Start time (ns).
    pub start: u64,
    /// Time (ns).
    pub time: u64,
    /// Value.
    pub value: f64,
}

impl GaugePoint {
    /// A point attribute's text (empty when absent).
    pub fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map_or("", String::as_str)
    }

    /// A point attribute read as a number; panics when absent or not a number.
    pub fn num(&self, key: &str) -> f64 {
        self.attr(key).parse().unwrap_or_else(|_| panic!("{key} is not a number in {self:?}"))
    }
}

/// Every point of `req`, each of which must be a double gauge point (panics naming the metric
/// otherwise).
pub fn gauge_points(req: &ExportMetricsServiceRequest) -> Vec<GaugePoint> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let resource = attrs::strings(attrs::resource_attrs(rm.resource.as_ref()));
        for sm in &rm.scope_metrics {
            let scope = sm.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            for m in &sm.metrics {
                let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{} is not a gauge", m.name) };
                for p in &g.data_points {
                    let Some(number_data_point::Value::AsDouble(value)) = p.value else {
                        panic!("{}: not a double: {:?}", m.name, p.value)
                    };
                    out.push(GaugePoint {
                        name: m.name.clone(),
                        unit: m.unit.clone(),
                        scope: scope.clone(),
                        resource: resource.clone(),
                        attrs: attrs::strings(&p.attributes),
                        start: p.start_time_unix_nano,
                        time: p.time_unix_nano,
                        value,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_set_what_they_name_and_readers_flatten_it() {
        let req = metrics_request(
            vec![kv("service.name", "vllm")],
            scope("sim", "1"),
            vec![
                gauge("g", "s", vec![point(vec![kv("model", "m1")], 7, 0.25)]),
                gauge("h", "1", vec![point(vec![], 8, 2.0), point(vec![int_kv("i", 3)], 9, 3.0)]),
            ],
        );
        let sm = &req.resource_metrics[0].scope_metrics[0];
        assert_eq!(sm.scope.as_ref().map(|s| (s.name.as_str(), s.version.as_str())), Some(("sim", "1")));
        let pts = gauge_points(&req);
        assert_eq!(pts.len(), 3);
        assert_eq!((pts[0].name.as_str(), pts[0].unit.as_str(), pts[0].time, pts[0].value), ("g", "s", 7, 0.25));
        assert_eq!(pts[0].attr("model"), "m1");
        assert_eq!(pts[0].attr("none"), "");
        assert_eq!(pts[2].num("i"), 3.0);
        assert_eq!(pts[1].resource["service.name"], "vllm");
        assert_eq!(pts[1].scope, "sim");
        assert_eq!(metrics_of(&req).len(), 2);
    }

    #[test]
    #[should_panic(expected = "c is not a gauge")]
    fn gauge_points_refuse_a_sum() {
        gauge_points(&metrics_request(vec![], None, vec![sum("c", "1", vec![point(vec![], 1, 1.0)], true)]));
    }

    #[test]
    fn histogram_point_counts_its_buckets() {
        let h = histogram_point(vec![], 1, 2, &[0.1, 1.0], &[1, 2, 3], 4.5);
        assert_eq!((h.count, h.sum, h.bucket_counts.len(), h.explicit_bounds.len()), (6, Some(4.5), 3, 2));
        let m = histogram("x", "s", vec![h]);
        assert!(matches!(m.data, Some(metric::Data::Histogram(ref h)) if h.aggregation_temporality == CUMULATIVE));
    }

    #[test]
    fn spans_and_logs_read_back_with_their_resource_and_scope() {
        let t = traces_request(vec![kv("service.name", "a")], scope("vllm", ""), vec![span("x", 2, vec![])]);
        let got = spans_of(&t);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (attrs::str_attr(&got[0].0, "service.name"), got[0].1.as_str(), got[0].2.name.as_str()),
            (Some("a"), "vllm", "x")
        );
        let l = logs_request(vec![], None, vec![log_record(9, "INFO", Value::StringValue("hi".into()))]);
        let got = logs_of(&l);
        assert_eq!((got[0].1.as_str(), got[0].2.severity_number), ("", 9));
    }
}
