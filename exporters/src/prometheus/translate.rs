//! OTLP → Prometheus translation shared by the `prometheus` and `prometheusremotewrite`
//! exporters, following otelcol's `pkg/translator/prometheus` rules:
//!
//! - metric names: characters outside `[a-zA-Z0-9:]` split the name into tokens joined by `_`
//!   (colons are kept), then the unit (`s` → `_seconds`, `By` → `_bytes`, `m/s` →
//!   `_meters_per_second`, `{...}` units ignored), `_total` for monotonic sums and `_ratio`
//!   for gauges of unit `1` are appended (`add_metric_suffixes`);
//! - label names: characters outside `[a-zA-Z0-9_]` become `_`, a leading digit gets `key_`,
//!   a leading single `_` gets `key`; attributes that collide once sanitised are joined with
//!   `;` in the order of their original keys;
//! - `job` = `service.namespace/service.name`, `instance` = `service.instance.id`;
//!   `otel_scope_name` / `otel_scope_version` from the instrumentation scope; a `target_info`
//!   gauge per resource with its other attributes.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, number_data_point,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Label pairs sorted by name, names unique, no empty values (`__name__` not included).
pub type Labels = Vec<(String, String)>;

/// The resource attribute that names the service (part of `job`).
pub const SERVICE_NAME: &str = "service.name";
/// The resource attribute that prefixes `job` as `namespace/name`.
pub const SERVICE_NAMESPACE: &str = "service.namespace";
/// The resource attribute that becomes `instance`.
pub const SERVICE_INSTANCE_ID: &str = "service.instance.id";
/// Name of the per-resource info metric.
pub const TARGET_INFO: &str = "target_info";
/// Label of the instrumentation scope name.
pub const SCOPE_NAME_LABEL: &str = "otel_scope_name";
/// Label of the instrumentation scope version.
pub const SCOPE_VERSION_LABEL: &str = "otel_scope_version";

/// The Prometheus type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FamilyType {
    /// A value that goes up and down (OTLP gauges and non-monotonic sums).
    Gauge,
    /// A monotonic cumulative sum.
    Counter,
    /// A classic histogram (`_bucket{le}`, `_sum`, `_count`).
    Histogram,
    /// A summary (`{quantile}`, `_sum`, `_count`).
    Summary,
}

impl FamilyType {
    /// The name used in `# TYPE` lines.
    pub fn as_str(self) -> &'static str {
        match self {
            FamilyType::Gauge => "gauge",
            FamilyType::Counter => "counter",
            FamilyType::Histogram => "histogram",
            FamilyType::Summary => "summary",
        }
    }
}

/// A translated metric family: its Prometheus name, type and help text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The full metric name (with unit and `_total` suffixes when enabled).
    pub name: String,
    /// The Prometheus type.
    pub kind: FamilyType,
    /// The OTLP description.
    pub help: String,
}

/// The value of one translated data point.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A gauge or counter value.
    Number(f64),
    /// A classic histogram: `counts[i]` is the count of bucket `i` (not cumulative), with
    /// `counts.len() == bounds.len() + 1` (the last bucket is `+Inf`).
    Histogram {
        /// Total number of observations.
        count: u64,
        /// Sum of the observations, when known.
        sum: Option<f64>,
        /// Upper bounds, strictly increasing.
        bounds: Vec<f64>,
        /// Per-bucket counts.
        counts: Vec<u64>,
    },
    /// A summary.
    Summary {
        /// Number of observations.
        count: u64,
        /// Sum of the observations.
        sum: f64,
        /// `(quantile, value)` pairs.
        quantiles: Vec<(f64, f64)>,
    },
}

/// One translated data point of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The family the point belongs to.
    pub family: Arc<Family>,
    /// The series labels (sorted, without `__name__`).
    pub labels: Labels,
    /// Start of the cumulative interval (0: unknown).
    pub start_ns: u64,
    /// Time of the point.
    pub time_ns: u64,
    /// The value.
    pub value: Value,
    /// The point carries the "no recorded value" flag: the series ended.
    pub stale: bool,
}

/// Translation settings shared by both exporters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// Prefix of every metric name (already valid).
    pub namespace: String,
    /// Append unit, `_total` and `_ratio` suffixes.
    pub add_metric_suffixes: bool,
    /// Copy every resource attribute into the labels of each series.
    pub resource_to_telemetry: bool,
    /// Labels added to every series unless a series already has the name (const / external labels).
    pub extra_labels: Labels,
}

/// The OTLP shape a metric name is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricShape {
    /// A gauge.
    Gauge,
    /// A monotonic sum (a counter).
    MonotonicSum,
    /// A non-monotonic sum.
    NonMonotonicSum,
    /// A histogram (explicit or exponential).
    Histogram,
    /// A summary.
    Summary,
}

const UNITS: &[(&str, &str)] = &[
    ("d", "days"),
    ("h", "hours"),
    ("min", "minutes"),
    ("s", "seconds"),
    ("ms", "milliseconds"),
    ("us", "microseconds"),
    ("ns", "nanoseconds"),
    ("By", "bytes"),
    ("KiBy", "kibibytes"),
    ("MiBy", "mebibytes"),
    ("GiBy", "gibibytes"),
    ("TiBy", "tibibytes"),
    ("KBy", "kilobytes"),
    ("MBy", "megabytes"),
    ("GBy", "gigabytes"),
    ("TBy", "terabytes"),
    ("m", "meters"),
    ("V", "volts"),
    ("A", "amperes"),
    ("J", "joules"),
    ("W", "watts"),
    ("g", "grams"),
    ("Cel", "celsius"),
    ("Hz", "hertz"),
    ("1", ""),
    ("%", "percent"),
];

const PER_UNITS: &[(&str, &str)] =
    &[("s", "second"), ("m", "minute"), ("h", "hour"), ("d", "day"), ("w", "week"), ("mo", "month"), ("y", "year")];

fn lookup(table: &[(&str, &'static str)], unit: &str) -> Option<&'static str> {
    table.iter().find(|(k, _)| *k == unit).map(|(_, v)| *v)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ':'
}

/// The main and `per_` unit suffixes of an OTLP unit (before cleaning).
fn unit_suffixes(unit: &str) -> (String, String) {
    let mut parts = unit.splitn(2, '/');
    let main = parts.next().map(str::trim).unwrap_or_default();
    let main = if main.is_empty() || main.contains(['{', '}']) {
        String::new()
    } else {
        lookup(UNITS, main).map(str::to_string).unwrap_or_else(|| main.to_string())
    };
    let per = match parts.next().map(str::trim) {
        Some(p) if !p.is_empty() && !p.contains(['{', '}']) => {
            let p = lookup(PER_UNITS, p).map(str::to_string).unwrap_or_else(|| p.to_string());
            format!("per_{p}")
        }
        _ => String::new(),
    };
    (main, per)
}

/// Invalid characters become `_`, runs of `_` collapse, a leading `_` goes.
fn clean_unit(unit: &str) -> String {
    let mut out = String::with_capacity(unit.len());
    for c in unit.chars() {
        let c = if is_name_char(c) { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out.trim_start_matches('_').to_string()
}

/// The Prometheus name of an OTLP metric (otelcol's `BuildCompliantName`).
pub fn metric_name(name: &str, unit: &str, shape: MetricShape, namespace: &str, add_suffixes: bool) -> String {
    if !add_suffixes {
        let cleaned: Vec<&str> =
            name.split(|c: char| !(is_name_char(c) || c == '_')).filter(|t| !t.is_empty()).collect();
        let base = cleaned.join("_");
        if !namespace.is_empty() {
            return format!("{namespace}_{base}");
        }
        return if base.starts_with(|c: char| c.is_ascii_digit()) { format!("_{base}") } else { base };
    }
    let mut tokens: Vec<String> =
        name.split(|c: char| !is_name_char(c)).filter(|t| !t.is_empty()).map(String::from).collect();
    let (main, per) = unit_suffixes(unit);
    let mut main = clean_unit(&main);
    let mut per = clean_unit(&per);
    if tokens.contains(&main) {
        main.clear();
    }
    if per == "per_" {
        per.clear();
    } else {
        per = per.trim_end_matches('_').to_string();
        if tokens.contains(&per) {
            per.clear();
        }
    }
    if !per.is_empty() {
        main = main.trim_end_matches('_').to_string();
    }
    if !main.is_empty() {
        tokens.push(main);
    }
    if !per.is_empty() {
        tokens.push(per);
    }
    if shape == MetricShape::MonotonicSum {
        tokens.retain(|t| t != "total");
        tokens.push("total".into());
    }
    if unit == "1" && shape == MetricShape::Gauge {
        tokens.retain(|t| t != "ratio");
        tokens.push("ratio".into());
    }
    if !namespace.is_empty() {
        tokens.insert(0, namespace.to_string());
    }
    let joined = tokens.join("_");
    if joined.starts_with(|c: char| c.is_ascii_digit()) { format!("_{joined}") } else { joined }
}

/// Whether `s` is a valid Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn is_valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `s` is a valid Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub fn is_valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The Prometheus label name of an attribute key (empty for an empty key).
///
/// A name that would start with `__` (reserved by Prometheus, e.g. `__name__`) also gets `key`.
pub fn label_name(key: &str) -> String {
    if key.is_empty() {
        return String::new();
    }
    let s: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("key_{s}")
    } else if s.starts_with('_') {
        format!("key{s}")
    } else {
        s
    }
}

/// An attribute value as a label value (pdata's `AsString`).
pub fn value_string(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        // A string-table index only means something inside a profiles payload.
        None | Some(Any::StringValueStrindex(_)) => String::new(),
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::DoubleValue(d)) => format_float(*d),
        Some(Any::BytesValue(b)) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(b)
        }
        Some(other) => json_of(other).to_string(),
    }
}

fn json_of(v: &Any) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Any::StringValue(s) => J::String(s.clone()),
        Any::StringValueStrindex(_) => J::Null,
        Any::BoolValue(b) => J::Bool(*b),
        Any::IntValue(i) => J::from(*i),
        Any::DoubleValue(d) => serde_json::Number::from_f64(*d).map(J::Number).unwrap_or(J::Null),
        Any::BytesValue(_) => J::String(value_string(Some(&AnyValue { value: Some(v.clone()) }))),
        Any::ArrayValue(a) => {
            J::Array(a.values.iter().map(|x| x.value.as_ref().map(json_of).unwrap_or(J::Null)).collect())
        }
        Any::KvlistValue(kv) => J::Object(
            kv.values
                .iter()
                .map(|e| {
                    (e.key.clone(), e.value.as_ref().and_then(|x| x.value.as_ref()).map(json_of).unwrap_or(J::Null))
                })
                .collect(),
        ),
    }
}

/// A float as Prometheus label values and the text format write it: shortest round-trip
/// digits without exponent (Go's `FormatFloat(f, 'f', -1, 64)`), `+Inf`, `-Inf`, `NaN`.
pub fn format_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f == f64::INFINITY {
        "+Inf".into()
    } else if f == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{f}")
    }
}

/// Sanitised labels of attribute lists: later lists override earlier ones for the same key;
/// keys that collide once sanitised are joined with `;` in key order; empty values are left out.
fn attribute_labels(lists: &[&[KeyValue]], skip: &[&str]) -> BTreeMap<String, String> {
    let mut by_key: BTreeMap<&str, String> = BTreeMap::new();
    for list in lists {
        for kv in *list {
            if kv.key.is_empty() || skip.contains(&kv.key.as_str()) {
                continue;
            }
            by_key.insert(kv.key.as_str(), value_string(kv.value.as_ref()));
        }
    }
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in by_key {
        if v.is_empty() {
            continue;
        }
        let name = label_name(k);
        match out.get_mut(&name) {
            Some(existing) => {
                existing.push(';');
                existing.push_str(&v);
            }
            None => {
                out.insert(name, v);
            }
        }
    }
    out
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

/// `job` and `instance` of a resource (otelcol's rule), when it has them.
pub fn job_instance(resource: &[KeyValue]) -> (Option<String>, Option<String>) {
    let job = attr(resource, SERVICE_NAME).map(|n| {
        let name = value_string(Some(n));
        match attr(resource, SERVICE_NAMESPACE).map(|ns| value_string(Some(ns))) {
            Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
            _ => name,
        }
    });
    let instance = attr(resource, SERVICE_INSTANCE_ID).map(|v| value_string(Some(v)));
    (job.filter(|s| !s.is_empty()), instance.filter(|s| !s.is_empty()))
}

/// What every series of one resource / scope shares.
struct Context {
    /// Resource attributes copied to labels (`resource_to_telemetry`), sanitised.
    job: Option<String>,
    instance: Option<String>,
    scope_name: String,
    scope_version: String,
}

impl Settings {
    /// The labels of one data point.
    fn labels(&self, resource: &[KeyValue], point: &[KeyValue], ctx: &Context) -> Labels {
        let lists: Vec<&[KeyValue]> = if self.resource_to_telemetry { vec![resource, point] } else { vec![point] };
        let mut m = attribute_labels(&lists, &[]);
        for (k, v) in [(SCOPE_NAME_LABEL, &ctx.scope_name), (SCOPE_VERSION_LABEL, &ctx.scope_version)] {
            if !v.is_empty() {
                m.insert(k.to_string(), v.clone());
            }
        }
        self.finish(m, ctx)
    }

    /// Adds job / instance (which override attributes) and the extra labels (which do not).
    fn finish(&self, mut m: BTreeMap<String, String>, ctx: &Context) -> Labels {
        if let Some(j) = &ctx.job {
            m.insert("job".into(), j.clone());
        }
        if let Some(i) = &ctx.instance {
            m.insert("instance".into(), i.clone());
        }
        for (k, v) in &self.extra_labels {
            if !v.is_empty() {
                m.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        m.into_iter().collect()
    }

    fn family(&self, name: &str, unit: &str, shape: MetricShape, kind: FamilyType, help: &str) -> Arc<Family> {
        Arc::new(Family {
            name: metric_name(name, unit, shape, &self.namespace, self.add_metric_suffixes),
            kind,
            help: help.to_string(),
        })
    }

    /// Translates every data point of `req`, plus one `target_info` point per resource that
    /// has attributes besides the service identity. Metrics of unspecified temporality, with an
    /// empty name or with malformed histograms are left out (the normaliser counts them).
    pub fn translate(&self, req: &ExportMetricsServiceRequest) -> Vec<Point> {
        let mut out = Vec::new();
        for rm in &req.resource_metrics {
            let resource: &[KeyValue] = rm.resource.as_ref().map(|r| r.attributes.as_slice()).unwrap_or_default();
            let (job, instance) = job_instance(resource);
            let first = out.len();
            for sm in &rm.scope_metrics {
                let (scope_name, scope_version) =
                    sm.scope.as_ref().map(|s| (s.name.clone(), s.version.clone())).unwrap_or_default();
                let ctx = Context { job: job.clone(), instance: instance.clone(), scope_name, scope_version };
                for m in &sm.metrics {
                    if m.name.is_empty() {
                        continue;
                    }
                    self.translate_metric(m, resource, &ctx, &mut out);
                }
            }
            if out.len() > first {
                let latest = out[first..].iter().map(|p| p.time_ns).max().unwrap_or(0);
                if let Some(t) = self.target_info(resource, job, instance, latest) {
                    out.push(t);
                }
            }
        }
        out
    }

    fn translate_metric(
        &self,
        m: &opentelemetry_proto::tonic::metrics::v1::Metric,
        resource: &[KeyValue],
        ctx: &Context,
        out: &mut Vec<Point>,
    ) {
        let unspecified = AggregationTemporality::Unspecified as i32;
        match &m.data {
            Some(Data::Gauge(g)) => {
                let fam = self.family(&m.name, &m.unit, MetricShape::Gauge, FamilyType::Gauge, &m.description);
                for p in &g.data_points {
                    out.push(self.number(&fam, resource, ctx, p));
                }
            }
            Some(Data::Sum(s)) if s.aggregation_temporality != unspecified => {
                let (shape, kind) = if s.is_monotonic {
                    (MetricShape::MonotonicSum, FamilyType::Counter)
                } else {
                    (MetricShape::NonMonotonicSum, FamilyType::Gauge)
                };
                let fam = self.family(&m.name, &m.unit, shape, kind, &m.description);
                for p in &s.data_points {
                    out.push(self.number(&fam, resource, ctx, p));
                }
            }
            Some(Data::Histogram(h)) if h.aggregation_temporality != unspecified => {
                let fam = self.family(&m.name, &m.unit, MetricShape::Histogram, FamilyType::Histogram, &m.description);
                for p in &h.data_points {
                    if let Some(v) = histogram_value(p) {
                        out.push(Point {
                            family: fam.clone(),
                            labels: self.labels(resource, &p.attributes, ctx),
                            start_ns: p.start_time_unix_nano,
                            time_ns: p.time_unix_nano,
                            value: v,
                            stale: p.flags & 1 != 0,
                        });
                    }
                }
            }
            Some(Data::ExponentialHistogram(h)) if h.aggregation_temporality != unspecified => {
                let fam = self.family(&m.name, &m.unit, MetricShape::Histogram, FamilyType::Histogram, &m.description);
                for p in &h.data_points {
                    let c = exponential_to_explicit(p);
                    if let Some(v) = histogram_value(&c) {
                        out.push(Point {
                            family: fam.clone(),
                            labels: self.labels(resource, &p.attributes, ctx),
                            start_ns: p.start_time_unix_nano,
                            time_ns: p.time_unix_nano,
                            value: v,
                            stale: p.flags & 1 != 0,
                        });
                    }
                }
            }
            Some(Data::Summary(s)) => {
                let fam = self.family(&m.name, &m.unit, MetricShape::Summary, FamilyType::Summary, &m.description);
                for p in &s.data_points {
                    out.push(Point {
                        family: fam.clone(),
                        labels: self.labels(resource, &p.attributes, ctx),
                        start_ns: p.start_time_unix_nano,
                        time_ns: p.time_unix_nano,
                        value: Value::Summary {
                            count: p.count,
                            sum: p.sum,
                            quantiles: p.quantile_values.iter().map(|q| (q.quantile, q.value)).collect(),
                        },
                        stale: p.flags & 1 != 0,
                    });
                }
            }
            _ => {}
        }
    }

    fn number(&self, fam: &Arc<Family>, resource: &[KeyValue], ctx: &Context, p: &NumberDataPoint) -> Point {
        Point {
            family: fam.clone(),
            labels: self.labels(resource, &p.attributes, ctx),
            start_ns: p.start_time_unix_nano,
            time_ns: p.time_unix_nano,
            value: Value::Number(number_value(p)),
            stale: p.flags & 1 != 0,
        }
    }

    fn target_info(
        &self,
        resource: &[KeyValue],
        job: Option<String>,
        instance: Option<String>,
        time_ns: u64,
    ) -> Option<Point> {
        let m = attribute_labels(&[resource], &[SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_INSTANCE_ID]);
        if m.is_empty() {
            return None;
        }
        let ctx = Context { job, instance, scope_name: String::new(), scope_version: String::new() };
        let name = if self.namespace.is_empty() {
            TARGET_INFO.to_string()
        } else {
            format!("{}_{TARGET_INFO}", self.namespace)
        };
        Some(Point {
            family: Arc::new(Family { name, kind: FamilyType::Gauge, help: "Target metadata".into() }),
            labels: self.finish(m, &ctx),
            start_ns: 0,
            time_ns,
            value: Value::Number(1.0),
            stale: false,
        })
    }
}

/// The value of a number point as f64.
pub fn number_value(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsDouble(d)) => d,
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        None => 0.0,
    }
}

/// Whether a histogram point is well formed: buckets match the bounds (or there are none)
/// and the bounds strictly increase.
pub fn histogram_is_valid(p: &HistogramDataPoint) -> bool {
    let shape_ok = p.bucket_counts.is_empty() || p.bucket_counts.len() == p.explicit_bounds.len() + 1;
    let sorted = p.explicit_bounds.windows(2).all(|w| w[0] < w[1]);
    let finite = p.explicit_bounds.iter().all(|b| !b.is_nan());
    shape_ok && sorted && finite
}

fn histogram_value(p: &HistogramDataPoint) -> Option<Value> {
    if !histogram_is_valid(p) {
        return None;
    }
    let (bounds, counts) = if p.bucket_counts.is_empty() {
        (Vec::new(), vec![p.count])
    } else {
        (p.explicit_bounds.clone(), p.bucket_counts.clone())
    };
    Some(Value::Histogram { count: p.count, sum: p.sum, bounds, counts })
}

/// Converts an exponential histogram point into a classic one with the same observations:
/// one explicit bucket per populated exponential bucket (upper bounds `base^(index+1)` for
/// positive buckets, `-base^index` for negative ones, the zero bucket up to `zero_threshold`).
pub fn exponential_to_explicit(p: &ExponentialHistogramDataPoint) -> HistogramDataPoint {
    let scale = p.scale.clamp(-10, 20);
    let base = 2f64.powf(2f64.powi(-scale));
    let bound = |index: i64| base.powf(index as f64);
    let mut bounds: Vec<f64> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let push = |upper: f64, count: u64, bounds: &mut Vec<f64>, counts: &mut Vec<u64>| {
        if !upper.is_finite() {
            // Beyond f64 (extreme scales): these observations are counted in +Inf below.
            return;
        }
        match bounds.last() {
            Some(last) if upper <= *last => {
                // Bounds that round to the same float merge into the bucket before.
                if let Some(c) = counts.last_mut() {
                    *c = c.saturating_add(count);
                }
            }
            _ => {
                bounds.push(upper);
                counts.push(count);
            }
        }
    };
    if let Some(neg) = &p.negative {
        // Most negative first: bucket i covers [-base^(offset+i+1), -base^(offset+i)).
        for (i, c) in neg.bucket_counts.iter().enumerate().rev() {
            let index = i64::from(neg.offset) + i as i64;
            push(-bound(index), *c, &mut bounds, &mut counts);
        }
    }
    if p.zero_count > 0 || p.zero_threshold > 0.0 {
        push(p.zero_threshold.max(0.0), p.zero_count, &mut bounds, &mut counts);
    }
    if let Some(pos) = &p.positive {
        for (i, c) in pos.bucket_counts.iter().enumerate() {
            let index = i64::from(pos.offset) + i as i64;
            push(bound(index + 1), *c, &mut bounds, &mut counts);
        }
    }
    // Observations above the last bound (none, by construction) go to +Inf.
    let listed: u64 = counts.iter().sum();
    counts.push(p.count.saturating_sub(listed));
    HistogramDataPoint {
        attributes: p.attributes.clone(),
        start_time_unix_nano: p.start_time_unix_nano,
        time_unix_nano: p.time_unix_nano,
        count: p.count,
        sum: p.sum,
        bucket_counts: counts,
        explicit_bounds: bounds,
        exemplars: Vec::new(),
        flags: p.flags,
        min: p.min,
        max: p.max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_buckets_become_classic_ones() {
        use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
        // scale 0: base 2. Positive offset 1: buckets (2,4], (4,8]; negative offset 0: [-2,-1).
        let p = ExponentialHistogramDataPoint {
            scale: 0,
            count: 10,
            zero_count: 1,
            positive: Some(Buckets { offset: 1, bucket_counts: vec![3, 4] }),
            negative: Some(Buckets { offset: 0, bucket_counts: vec![2] }),
            ..Default::default()
        };
        let h = exponential_to_explicit(&p);
        assert_eq!(h.explicit_bounds, vec![-1.0, 0.0, 4.0, 8.0]);
        assert_eq!(h.bucket_counts, vec![2, 1, 3, 4, 0]);
        assert!(histogram_is_valid(&h));
    }

    #[test]
    fn value_strings_follow_pdata() {
        let v = |x: Any| value_string(Some(&AnyValue { value: Some(x) }));
        assert_eq!(v(Any::IntValue(-3)), "-3");
        assert_eq!(v(Any::DoubleValue(0.25)), "0.25");
        assert_eq!(v(Any::DoubleValue(2.0)), "2");
        assert_eq!(v(Any::BoolValue(true)), "true");
        assert_eq!(v(Any::BytesValue(vec![1, 2, 3])), "AQID");
        assert_eq!(value_string(None), "");
    }
}
