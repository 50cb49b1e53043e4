//! Evaluation of compiled conditions against one record, with OTTL's comparison rules.

use super::parser::{CmpOp, Key, MathOp};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Av;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Nv;
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, Metric, NumberDataPoint, SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::Event;
use regex::Regex;
use std::borrow::Cow;
use std::cmp::Ordering;

/// A value during evaluation (borrowed from the record where it can be).
#[derive(Debug, Clone)]
pub enum Value<'a> {
    /// `nil`, an absent attribute, an empty `AnyValue`.
    Nil,
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Double(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// Bytes.
    Bytes(Cow<'a, [u8]>),
    /// A map (attributes, a kvlist value).
    Map(&'a [KeyValue]),
    /// A list (an array value).
    List(&'a [AnyValue]),
}

impl Value<'_> {
    /// The type name used in messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Double(_) => "double",
            Value::Str(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::Map(_) => "map",
            Value::List(_) => "list",
        }
    }
}

/// The value of an `AnyValue`.
pub fn any<'a>(v: Option<&'a AnyValue>) -> Value<'a> {
    match v.and_then(|v| v.value.as_ref()) {
        None | Some(Av::StringValueStrindex(_)) => Value::Nil,
        Some(Av::StringValue(s)) => Value::Str(Cow::Borrowed(s)),
        Some(Av::BoolValue(b)) => Value::Bool(*b),
        Some(Av::IntValue(i)) => Value::Int(*i),
        Some(Av::DoubleValue(d)) => Value::Double(*d),
        Some(Av::BytesValue(b)) => Value::Bytes(Cow::Borrowed(b)),
        Some(Av::KvlistValue(kv)) => Value::Map(&kv.values),
        Some(Av::ArrayValue(a)) => Value::List(&a.values),
    }
}

/// The first attribute named `key` (pdata's `Map.Get`), or nil.
pub fn lookup<'a>(attrs: &'a [KeyValue], key: &str) -> Value<'a> {
    attrs.iter().find(|kv| kv.key == key).map_or(Value::Nil, |kv| any(kv.value.as_ref()))
}

/// A runtime failure of a condition (OTTL's errors: indexing a non-map, mixed-type arithmetic, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

/// A data point of any metric type.
#[derive(Debug, Clone, Copy)]
pub enum Point<'a> {
    /// Gauge or sum point.
    Number(&'a NumberDataPoint),
    /// Histogram point.
    Histogram(&'a HistogramDataPoint),
    /// Exponential histogram point.
    ExpHistogram(&'a ExponentialHistogramDataPoint),
    /// Summary point.
    Summary(&'a SummaryDataPoint),
}

/// The record a condition is evaluated against, with its enclosing resource and scope.
#[derive(Debug, Clone, Copy, Default)]
pub struct Record<'a> {
    /// The resource.
    pub resource: Option<&'a Resource>,
    /// The instrumentation scope.
    pub scope: Option<&'a InstrumentationScope>,
    /// The span (span and span event contexts).
    pub span: Option<&'a Span>,
    /// The span event.
    pub event: Option<&'a Event>,
    /// The metric (metric and data point contexts).
    pub metric: Option<&'a Metric>,
    /// The data point.
    pub point: Option<Point<'a>>,
    /// The log record.
    pub log: Option<&'a LogRecord>,
}

/// A field a path reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Field {
    ResourceAttributes,
    ResourceDroppedAttributesCount,
    ScopeName,
    ScopeVersion,
    ScopeAttributes,
    ScopeDroppedAttributesCount,
    SpanName,
    SpanKind,
    SpanKindString,
    SpanKindDeprecatedString,
    StatusCode,
    StatusMessage,
    SpanAttributes,
    TraceId,
    TraceIdString,
    SpanId,
    SpanIdString,
    ParentSpanId,
    ParentSpanIdString,
    TraceState,
    SpanStartTime,
    SpanEndTime,
    SpanDroppedAttributesCount,
    SpanDroppedEventsCount,
    SpanDroppedLinksCount,
    EventName,
    EventAttributes,
    EventTime,
    EventDroppedAttributesCount,
    MetricName,
    MetricDescription,
    MetricUnit,
    MetricType,
    MetricAggregationTemporality,
    MetricIsMonotonic,
    PointAttributes,
    PointStartTime,
    PointTime,
    PointValueDouble,
    PointValueInt,
    PointFlags,
    PointCount,
    PointSum,
    LogBody,
    LogSeverityNumber,
    LogSeverityText,
    LogAttributes,
    LogTime,
    LogObservedTime,
    LogTraceId,
    LogTraceIdString,
    LogSpanId,
    LogSpanIdString,
    LogFlags,
    LogEventName,
    LogDroppedAttributesCount,
}

/// OTTL's metric data type numbers (`METRIC_DATA_TYPE_*`).
pub fn metric_type(m: &Metric) -> i64 {
    match &m.data {
        None => 0,
        Some(Data::Gauge(_)) => 1,
        Some(Data::Sum(_)) => 2,
        Some(Data::Histogram(_)) => 3,
        Some(Data::ExponentialHistogram(_)) => 4,
        Some(Data::Summary(_)) => 5,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn kind_name(kind: i32, deprecated: bool) -> &'static str {
    match (kind, deprecated) {
        (1, false) => "Internal",
        (2, false) => "Server",
        (3, false) => "Client",
        (4, false) => "Producer",
        (5, false) => "Consumer",
        (_, false) => "Unspecified",
        (1, true) => "SPAN_KIND_INTERNAL",
        (2, true) => "SPAN_KIND_SERVER",
        (3, true) => "SPAN_KIND_CLIENT",
        (4, true) => "SPAN_KIND_PRODUCER",
        (5, true) => "SPAN_KIND_CONSUMER",
        (_, true) => "SPAN_KIND_UNSPECIFIED",
    }
}

fn ns(t: u64) -> Value<'static> {
    Value::Int(i64::try_from(t).unwrap_or(i64::MAX))
}

fn string(s: &str) -> Value<'_> {
    Value::Str(Cow::Borrowed(s))
}

impl Field {
    /// Reads the field from `r`; a record part the context lacks reads as nil.
    pub fn read<'a>(self, r: &Record<'a>) -> Value<'a> {
        use Field::*;
        let nil = Value::Nil;
        match self {
            ResourceAttributes => r.resource.map_or(nil, |x| Value::Map(&x.attributes)),
            ResourceDroppedAttributesCount => {
                r.resource.map_or(Value::Int(0), |x| Value::Int(x.dropped_attributes_count.into()))
            }
            ScopeName => string(r.scope.map_or("", |s| s.name.as_str())),
            ScopeVersion => string(r.scope.map_or("", |s| s.version.as_str())),
            ScopeAttributes => r.scope.map_or(Value::Map(&[]), |s| Value::Map(&s.attributes)),
            ScopeDroppedAttributesCount => Value::Int(r.scope.map_or(0, |s| s.dropped_attributes_count.into())),
            SpanName
            | SpanKind
            | SpanKindString
            | SpanKindDeprecatedString
            | StatusCode
            | StatusMessage
            | SpanAttributes
            | TraceId
            | TraceIdString
            | SpanId
            | SpanIdString
            | ParentSpanId
            | ParentSpanIdString
            | TraceState
            | SpanStartTime
            | SpanEndTime
            | SpanDroppedAttributesCount
            | SpanDroppedEventsCount
            | SpanDroppedLinksCount => match r.span {
                Some(s) => span_field(self, s),
                None => nil,
            },
            EventName => r.event.map_or(nil, |e| string(&e.name)),
            EventAttributes => r.event.map_or(nil, |e| Value::Map(&e.attributes)),
            EventTime => r.event.map_or(nil, |e| ns(e.time_unix_nano)),
            EventDroppedAttributesCount => r.event.map_or(nil, |e| Value::Int(e.dropped_attributes_count.into())),
            MetricName => r.metric.map_or(nil, |m| string(&m.name)),
            MetricDescription => r.metric.map_or(nil, |m| string(&m.description)),
            MetricUnit => r.metric.map_or(nil, |m| string(&m.unit)),
            MetricType => r.metric.map_or(nil, |m| Value::Int(metric_type(m))),
            MetricAggregationTemporality => r.metric.map_or(nil, |m| {
                Value::Int(match &m.data {
                    Some(Data::Sum(s)) => s.aggregation_temporality.into(),
                    Some(Data::Histogram(h)) => h.aggregation_temporality.into(),
                    Some(Data::ExponentialHistogram(h)) => h.aggregation_temporality.into(),
                    _ => 0,
                })
            }),
            MetricIsMonotonic => {
                r.metric.map_or(nil, |m| Value::Bool(matches!(&m.data, Some(Data::Sum(s)) if s.is_monotonic)))
            }
            PointAttributes | PointStartTime | PointTime | PointValueDouble | PointValueInt | PointFlags
            | PointCount | PointSum => match r.point {
                Some(p) => point_field(self, p),
                None => nil,
            },
            LogBody
            | LogSeverityNumber
            | LogSeverityText
            | LogAttributes
            | LogTime
            | LogObservedTime
            | LogTraceId
            | LogTraceIdString
            | LogSpanId
            | LogSpanIdString
            | LogFlags
            | LogEventName
            | LogDroppedAttributesCount => match r.log {
                Some(l) => log_field(self, l),
                None => nil,
            },
        }
    }
}

fn span_field(f: Field, s: &Span) -> Value<'_> {
    use Field::*;
    match f {
        SpanName => string(&s.name),
        SpanKind => Value::Int(s.kind.into()),
        SpanKindString => string(kind_name(s.kind, false)),
        SpanKindDeprecatedString => string(kind_name(s.kind, true)),
        StatusCode => Value::Int(s.status.as_ref().map_or(0, |st| st.code.into())),
        StatusMessage => string(s.status.as_ref().map_or("", |st| st.message.as_str())),
        SpanAttributes => Value::Map(&s.attributes),
        TraceId => Value::Bytes(Cow::Borrowed(&s.trace_id)),
        TraceIdString => Value::Str(Cow::Owned(hex(&s.trace_id))),
        SpanId => Value::Bytes(Cow::Borrowed(&s.span_id)),
        SpanIdString => Value::Str(Cow::Owned(hex(&s.span_id))),
        ParentSpanId => Value::Bytes(Cow::Borrowed(&s.parent_span_id)),
        ParentSpanIdString => Value::Str(Cow::Owned(hex(&s.parent_span_id))),
        TraceState => string(&s.trace_state),
        SpanStartTime => ns(s.start_time_unix_nano),
        SpanEndTime => ns(s.end_time_unix_nano),
        SpanDroppedAttributesCount => Value::Int(s.dropped_attributes_count.into()),
        SpanDroppedEventsCount => Value::Int(s.dropped_events_count.into()),
        SpanDroppedLinksCount => Value::Int(s.dropped_links_count.into()),
        _ => Value::Nil,
    }
}

fn point_field(f: Field, p: Point<'_>) -> Value<'_> {
    use Field::*;
    let (attrs, start, time, flags) = match p {
        Point::Number(x) => (&x.attributes, x.start_time_unix_nano, x.time_unix_nano, x.flags),
        Point::Histogram(x) => (&x.attributes, x.start_time_unix_nano, x.time_unix_nano, x.flags),
        Point::ExpHistogram(x) => (&x.attributes, x.start_time_unix_nano, x.time_unix_nano, x.flags),
        Point::Summary(x) => (&x.attributes, x.start_time_unix_nano, x.time_unix_nano, x.flags),
    };
    match f {
        PointAttributes => Value::Map(attrs),
        PointStartTime => ns(start),
        PointTime => ns(time),
        PointFlags => Value::Int(flags.into()),
        // As pdata: the other type's getter reads zero; non-number points have no value.
        PointValueDouble => match p {
            Point::Number(x) => Value::Double(match x.value {
                Some(Nv::AsDouble(d)) => d,
                _ => 0.0,
            }),
            _ => Value::Nil,
        },
        PointValueInt => match p {
            Point::Number(x) => Value::Int(match x.value {
                Some(Nv::AsInt(i)) => i,
                _ => 0,
            }),
            _ => Value::Nil,
        },
        PointCount => match p {
            Point::Number(_) => Value::Nil,
            Point::Histogram(x) => ns(x.count),
            Point::ExpHistogram(x) => ns(x.count),
            Point::Summary(x) => ns(x.count),
        },
        PointSum => match p {
            Point::Number(_) => Value::Nil,
            Point::Histogram(x) => Value::Double(x.sum.unwrap_or(0.0)),
            Point::ExpHistogram(x) => Value::Double(x.sum.unwrap_or(0.0)),
            Point::Summary(x) => Value::Double(x.sum),
        },
        _ => Value::Nil,
    }
}

fn log_field(f: Field, l: &LogRecord) -> Value<'_> {
    use Field::*;
    match f {
        LogBody => any(l.body.as_ref()),
        LogSeverityNumber => Value::Int(l.severity_number.into()),
        LogSeverityText => string(&l.severity_text),
        LogAttributes => Value::Map(&l.attributes),
        LogTime => ns(l.time_unix_nano),
        LogObservedTime => ns(l.observed_time_unix_nano),
        LogTraceId => Value::Bytes(Cow::Borrowed(&l.trace_id)),
        LogTraceIdString => Value::Str(Cow::Owned(hex(&l.trace_id))),
        LogSpanId => Value::Bytes(Cow::Borrowed(&l.span_id)),
        LogSpanIdString => Value::Str(Cow::Owned(hex(&l.span_id))),
        LogFlags => Value::Int(l.flags.into()),
        LogEventName => string(&l.event_name),
        LogDroppedAttributesCount => Value::Int(l.dropped_attributes_count.into()),
        _ => Value::Nil,
    }
}

/// A compiled value expression.
#[derive(Debug)]
pub enum Val {
    /// A constant (literals and enums).
    Const(Const),
    /// A field with index keys.
    Path(Field, Vec<Key>),
    /// Arithmetic.
    Math(Box<Val>, MathOp, Box<Val>),
    /// A condition used as a value (`IsMatch(...) == true`).
    Cond(Box<Cond>),
    /// A value converter.
    Call(ValFn, Box<Val>, Vec<Key>),
}

/// A constant value (owned).
#[derive(Debug, Clone, PartialEq)]
pub enum Const {
    /// `nil`
    Nil,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A double.
    Double(f64),
    /// A string.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl Const {
    fn value(&self) -> Value<'_> {
        match self {
            Const::Nil => Value::Nil,
            Const::Bool(b) => Value::Bool(*b),
            Const::Int(i) => Value::Int(*i),
            Const::Double(d) => Value::Double(*d),
            Const::Str(s) => Value::Str(Cow::Borrowed(s)),
            Const::Bytes(b) => Value::Bytes(Cow::Borrowed(b)),
        }
    }
}

/// Converters that return a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValFn {
    /// `Len(v)`: characters of a string, entries of a map or list, bytes.
    Len,
    /// `Int(v)`: an int from a number, bool or numeric string; nil otherwise.
    Int,
    /// `Double(v)`: a double from a number, bool or numeric string; nil otherwise.
    Double,
    /// `String(v)`: the string form of a value.
    String,
}

/// Type tests of `IsString(v)` and its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeTest {
    /// `IsString`
    String,
    /// `IsInt`
    Int,
    /// `IsDouble`
    Double,
    /// `IsBool`
    Bool,
    /// `IsMap`
    Map,
    /// `IsList`
    List,
}

/// A compiled condition.
#[derive(Debug)]
pub enum Cond {
    /// `true` / `false`.
    Const(bool),
    /// Any true.
    Or(Vec<Cond>),
    /// All true.
    And(Vec<Cond>),
    /// Negation.
    Not(Box<Cond>),
    /// A comparison.
    Cmp(Val, CmpOp, Val),
    /// `IsMatch(target, "regex")` (regex compiled once, unanchored as Go's `MatchString`).
    IsMatch(Val, Box<Regex>),
    /// `IsString(v)`, ...
    IsType(TypeTest, Val),
    /// `HasAttrKeyOnDatapoint(key)`: some point of the metric has the attribute.
    HasAttrKey(String),
    /// `HasAttrOnDatapoint(key, value)`: some point of the metric has the attribute with that string value.
    HasAttr(String, String),
}

/// Applies index keys to a value.
fn index<'a>(mut v: Value<'a>, keys: &[Key]) -> Result<Value<'a>, EvalError> {
    for k in keys {
        v = match (v, k) {
            (Value::Nil, _) => return Ok(Value::Nil),
            (Value::Map(m), Key::Str(s)) => lookup(m, s),
            (Value::List(l), Key::Int(i)) => match usize::try_from(*i).ok().and_then(|i| l.get(i)) {
                Some(x) => any(Some(x)),
                None => return Err(EvalError(format!("index {i} out of bounds of a list of {}", l.len()))),
            },
            (Value::Map(_), Key::Int(i)) => {
                return Err(EvalError(format!("a map cannot be indexed by the integer {i}")));
            }
            (Value::List(_), Key::Str(s)) => {
                return Err(EvalError(format!("a list cannot be indexed by the key {s:?}")));
            }
            (other, k) => {
                let k = match k {
                    Key::Str(s) => format!("{s:?}"),
                    Key::Int(i) => i.to_string(),
                };
                return Err(EvalError(format!("type {} does not support indexing (key {k})", other.type_name())));
            }
        };
    }
    Ok(v)
}

/// OTTL's string form of a value (StringLikeGetter): numbers, bools, hex bytes, JSON maps and lists.
pub fn string_like(v: &Value<'_>) -> Option<String> {
    Some(match v {
        Value::Nil => return None,
        Value::Str(s) => s.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => format_double(*d),
        Value::Bytes(b) => hex(b),
        Value::Map(_) | Value::List(_) => to_json(v).to_string(),
    })
}

/// Go's `strconv.FormatFloat(d, 'f', -1, 64)`.
fn format_double(d: f64) -> String {
    if d.is_nan() {
        "NaN".into()
    } else if d.is_infinite() {
        if d > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{d}")
    }
}

fn to_json(v: &Value<'_>) -> serde_json::Value {
    match v {
        Value::Nil => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::Double(d) => serde_json::Number::from_f64(*d).map_or(serde_json::Value::Null, serde_json::Value::Number),
        Value::Str(s) => s.as_ref().into(),
        Value::Bytes(b) => hex(b).into(),
        Value::Map(m) => {
            serde_json::Value::Object(m.iter().map(|kv| (kv.key.clone(), to_json(&any(kv.value.as_ref())))).collect())
        }
        Value::List(l) => serde_json::Value::Array(l.iter().map(|x| to_json(&any(Some(x)))).collect()),
    }
}

/// Go's float ordering: `None` when either side is NaN (every operator but `!=` is false).
fn cmp_f64(a: f64, b: f64) -> Option<Ordering> {
    a.partial_cmp(&b)
}

/// OTTL's comparison of two values (LANGUAGE.md, "Comparison Rules"): ints and doubles compare
/// numerically (as float64 when mixed), strings and bytes bytewise, bools with false < true;
/// values of different types are "not equal" (`!=` true, every other operator false).
pub fn compare(a: &Value<'_>, op: CmpOp, b: &Value<'_>) -> bool {
    let ord: Option<Ordering> = match (a, b) {
        (Value::Nil, Value::Nil) => Some(Ordering::Equal),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Double(x), Value::Double(y)) => cmp_f64(*x, *y),
        (Value::Int(x), Value::Double(y)) => cmp_f64(*x as f64, *y),
        (Value::Double(x), Value::Int(y)) => cmp_f64(*x, *y as f64),
        (Value::Str(x), Value::Str(y)) => Some(x.as_ref().cmp(y.as_ref())),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.as_ref().cmp(y.as_ref())),
        (Value::Map(_), Value::Map(_)) | (Value::List(_), Value::List(_)) => {
            // Only equality is defined for maps and lists.
            let eq = to_json(a) == to_json(b);
            return match op {
                CmpOp::Eq => eq,
                CmpOp::Ne => !eq,
                _ => false,
            };
        }
        _ => None,
    };
    match (ord, op) {
        (None, CmpOp::Ne) => true,
        (None, _) => false,
        (Some(o), CmpOp::Eq) => o == Ordering::Equal,
        (Some(o), CmpOp::Ne) => o != Ordering::Equal,
        (Some(o), CmpOp::Lt) => o == Ordering::Less,
        (Some(o), CmpOp::Le) => o != Ordering::Greater,
        (Some(o), CmpOp::Gt) => o == Ordering::Greater,
        (Some(o), CmpOp::Ge) => o != Ordering::Less,
    }
}

fn math<'a>(a: Value<'a>, op: MathOp, b: Value<'a>) -> Result<Value<'a>, EvalError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(Value::Int(match op {
            MathOp::Add => x.wrapping_add(y),
            MathOp::Sub => x.wrapping_sub(y),
            MathOp::Mul => x.wrapping_mul(y),
            MathOp::Div if y == 0 => return Err(EvalError("attempted to divide by 0".into())),
            MathOp::Div => x.wrapping_div(y),
        })),
        (Value::Double(x), Value::Double(y)) => Ok(Value::Double(match op {
            MathOp::Add => x + y,
            MathOp::Sub => x - y,
            MathOp::Mul => x * y,
            MathOp::Div if y == 0.0 => return Err(EvalError("attempted to divide by 0".into())),
            MathOp::Div => x / y,
        })),
        (a, b) => Err(EvalError(format!(
            "arithmetic on {} and {} is not supported (both sides must be int, or both double)",
            a.type_name(),
            b.type_name()
        ))),
    }
}

fn call<'a>(f: ValFn, v: Value<'a>) -> Value<'a> {
    match f {
        ValFn::Len => match v {
            Value::Str(s) => Value::Int(s.chars().count() as i64),
            Value::Bytes(b) => Value::Int(b.len() as i64),
            Value::Map(m) => Value::Int(m.len() as i64),
            Value::List(l) => Value::Int(l.len() as i64),
            _ => Value::Nil,
        },
        ValFn::Int => match v {
            Value::Int(i) => Value::Int(i),
            Value::Double(d) if d.is_finite() => Value::Int(d.trunc() as i64),
            Value::Bool(b) => Value::Int(b.into()),
            Value::Str(s) => s.trim().parse::<i64>().map_or(Value::Nil, Value::Int),
            _ => Value::Nil,
        },
        ValFn::Double => match v {
            Value::Int(i) => Value::Double(i as f64),
            Value::Double(d) => Value::Double(d),
            Value::Bool(b) => Value::Double(if b { 1.0 } else { 0.0 }),
            Value::Str(s) => s.trim().parse::<f64>().map_or(Value::Nil, Value::Double),
            _ => Value::Nil,
        },
        ValFn::String => string_like(&v).map_or(Value::Nil, |s| Value::Str(Cow::Owned(s))),
    }
}

impl Val {
    /// Evaluates to a value.
    pub fn eval<'a>(&'a self, r: &Record<'a>) -> Result<Value<'a>, EvalError> {
        match self {
            Val::Const(c) => Ok(c.value()),
            Val::Path(f, keys) => index(f.read(r), keys),
            Val::Math(a, op, b) => math(a.eval(r)?, *op, b.eval(r)?),
            Val::Cond(c) => c.eval(r).map(Value::Bool),
            Val::Call(f, arg, keys) => index(call(*f, arg.eval(r)?), keys),
        }
    }
}

fn points_have(m: &Metric, pred: impl Fn(&[KeyValue]) -> bool) -> bool {
    match &m.data {
        None => false,
        Some(Data::Gauge(g)) => g.data_points.iter().any(|p| pred(&p.attributes)),
        Some(Data::Sum(s)) => s.data_points.iter().any(|p| pred(&p.attributes)),
        Some(Data::Histogram(h)) => h.data_points.iter().any(|p| pred(&p.attributes)),
        Some(Data::ExponentialHistogram(h)) => h.data_points.iter().any(|p| pred(&p.attributes)),
        Some(Data::Summary(s)) => s.data_points.iter().any(|p| pred(&p.attributes)),
    }
}

impl Cond {
    /// Evaluates the condition (short-circuiting `and` / `or` left to right, as OTTL does).
    pub fn eval(&self, r: &Record<'_>) -> Result<bool, EvalError> {
        match self {
            Cond::Const(b) => Ok(*b),
            Cond::Or(v) => {
                for c in v {
                    if c.eval(r)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Cond::And(v) => {
                for c in v {
                    if !c.eval(r)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Cond::Not(c) => Ok(!c.eval(r)?),
            Cond::Cmp(a, op, b) => Ok(compare(&a.eval(r)?, *op, &b.eval(r)?)),
            Cond::IsMatch(target, re) => Ok(string_like(&target.eval(r)?).is_some_and(|s| re.is_match(s.as_str()))),
            Cond::IsType(t, v) => {
                let v = v.eval(r)?;
                Ok(matches!(
                    (t, v),
                    (TypeTest::String, Value::Str(_))
                        | (TypeTest::Int, Value::Int(_))
                        | (TypeTest::Double, Value::Double(_))
                        | (TypeTest::Bool, Value::Bool(_))
                        | (TypeTest::Map, Value::Map(_))
                        | (TypeTest::List, Value::List(_))
                ))
            }
            Cond::HasAttrKey(k) => Ok(r.metric.is_some_and(|m| points_have(m, |a| a.iter().any(|kv| kv.key == *k)))),
            Cond::HasAttr(k, v) => Ok(r
                .metric
                .is_some_and(|m| points_have(m, |a| matches!(lookup(a, k), Value::Str(s) if s == v.as_str())))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value<'_> {
        Value::Str(Cow::Borrowed(x))
    }

    #[test]
    fn comparison_rules() {
        use CmpOp::*;
        assert!(compare(&Value::Int(1), Eq, &Value::Double(1.0)));
        assert!(compare(&Value::Int(2), Gt, &Value::Double(1.5)));
        assert!(compare(&Value::Double(1.5), Lt, &Value::Int(2)));
        assert!(compare(&Value::Int(i64::MAX), Gt, &Value::Int(i64::MAX - 1)), "ints compare as ints");
        // Different types: not equal; ordering false.
        assert!(!compare(&s("1"), Eq, &Value::Int(1)));
        assert!(compare(&s("1"), Ne, &Value::Int(1)));
        assert!(!compare(&s("5"), Lt, &Value::Int(9)));
        assert!(!compare(&s("5"), Gt, &Value::Int(1)));
        // nil
        assert!(compare(&Value::Nil, Eq, &Value::Nil));
        assert!(compare(&s(""), Ne, &Value::Nil));
        assert!(!compare(&Value::Nil, Le, &Value::Int(0)));
        // NaN: every operator but != is false.
        assert!(!compare(&Value::Double(f64::NAN), Eq, &Value::Double(f64::NAN)));
        assert!(compare(&Value::Double(f64::NAN), Ne, &Value::Double(f64::NAN)));
        assert!(!compare(&Value::Double(f64::NAN), Ge, &Value::Int(0)));
        // strings bytewise, bools false < true
        assert!(compare(&s("B"), Lt, &s("a")));
        assert!(compare(&Value::Bool(false), Lt, &Value::Bool(true)));
    }

    #[test]
    fn math_type_errors() {
        assert!(math(Value::Int(1), MathOp::Add, Value::Double(1.0)).is_err());
        assert!(math(Value::Int(1), MathOp::Div, Value::Int(0)).is_err());
        assert!(matches!(math(Value::Int(7), MathOp::Div, Value::Int(2)), Ok(Value::Int(3))));
        assert!(math(s("a"), MathOp::Add, s("b")).is_err());
    }

    #[test]
    fn string_like_forms() {
        assert_eq!(string_like(&Value::Double(1.5)).as_deref(), Some("1.5"));
        assert_eq!(string_like(&Value::Double(3.0)).as_deref(), Some("3"));
        assert_eq!(string_like(&Value::Bytes(Cow::Borrowed(&[0xab, 1]))).as_deref(), Some("ab01"));
        assert_eq!(string_like(&Value::Nil), None);
    }
}
