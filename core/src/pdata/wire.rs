//! A schema-aware validator for OTLP protobuf that checks and counts without decoding.
//!
//! It walks the wire format of an export request against static descriptors of the OTLP
//! messages: every known field must have its declared wire type, strings must be UTF-8,
//! nested messages are checked recursively (depth-limited like prost), unknown fields are
//! skipped by wire type. What it accepts, prost decodes; a test checks that on every
//! truncation of real requests. It also counts items (spans, data points, log records) and
//! asks for a full decode when ids have invalid lengths, so that path can reject them item
//! by item with a partial success.

use super::Signal;

/// What a field holds on the wire.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// varint (ints, bools, enums, sint).
    Varint,
    /// 8 bytes (fixed64, sfixed64, double).
    I64,
    /// 4 bytes (fixed32).
    I32,
    /// length-delimited UTF-8.
    Str,
    /// length-delimited bytes.
    Bytes,
    /// trace id: 16 bytes or empty.
    TraceId,
    /// span id: 8 bytes or empty.
    SpanId,
    /// repeated varint, packed or not.
    Varints,
    /// repeated 8-byte values, packed or not.
    I64s,
    /// a nested message.
    Msg(&'static Desc),
}

/// A message descriptor.
#[derive(Debug)]
struct Desc {
    fields: &'static [(u32, Kind)],
    /// Messages of this type are the signal's items.
    item: bool,
}

/// Why a buffer is not a valid OTLP request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not valid protobuf for the schema.
    #[error("invalid protobuf: {0}")]
    Malformed(&'static str),
    /// Well-formed, but some ids have invalid lengths: decode it to reject those items one by one.
    #[error("invalid trace or span id length")]
    NeedsDecode,
    /// Well-formed, but over an input limit: refused whole (decoding it would not help).
    #[error("{0}")]
    Limit(&'static str),
}

const MAX_DEPTH: usize = 100;

/// Most attributes on one message (resource, scope, span, event, link, data point, exemplar,
/// log record) and most entries of one `kvlistValue`.
pub const MAX_ATTRIBUTES: usize = 1024;

macro_rules! desc {
    ($name:ident, $item:expr, [$(($n:expr, $k:expr)),* $(,)?]) => {
        static $name: Desc = Desc { fields: &[$(($n, $k)),*], item: $item };
    };
}

use Kind::*;

desc!(
    ANY_VALUE,
    false,
    [(1, Str), (2, Varint), (3, Varint), (4, I64), (5, Msg(&ARRAY_VALUE)), (6, Msg(&KV_LIST)), (7, Bytes), (8, Varint)]
);
desc!(ARRAY_VALUE, false, [(1, Msg(&ANY_VALUE))]);
desc!(KV_LIST, false, [(1, Msg(&KEY_VALUE))]);
desc!(KEY_VALUE, false, [(1, Str), (2, Msg(&ANY_VALUE)), (3, Varint)]);
desc!(SCOPE, false, [(1, Str), (2, Str), (3, Msg(&KEY_VALUE)), (4, Varint)]);
desc!(ENTITY_REF, false, [(1, Str), (2, Str), (3, Str), (4, Str)]);
desc!(RESOURCE, false, [(1, Msg(&KEY_VALUE)), (2, Varint), (3, Msg(&ENTITY_REF))]);

desc!(TRACE_REQUEST, false, [(1, Msg(&RESOURCE_SPANS))]);
desc!(RESOURCE_SPANS, false, [(1, Msg(&RESOURCE)), (2, Msg(&SCOPE_SPANS)), (3, Str)]);
desc!(SCOPE_SPANS, false, [(1, Msg(&SCOPE)), (2, Msg(&SPAN)), (3, Str)]);
desc!(
    SPAN,
    true,
    [
        (1, TraceId),
        (2, SpanId),
        (3, Str),
        (4, SpanId),
        (16, I32),
        (5, Str),
        (6, Varint),
        (7, I64),
        (8, I64),
        (9, Msg(&KEY_VALUE)),
        (10, Varint),
        (11, Msg(&EVENT)),
        (12, Varint),
        (13, Msg(&LINK)),
        (14, Varint),
        (15, Msg(&STATUS)),
    ]
);
desc!(EVENT, false, [(1, I64), (2, Str), (3, Msg(&KEY_VALUE)), (4, Varint)]);
desc!(LINK, false, [(1, TraceId), (2, SpanId), (3, Str), (4, Msg(&KEY_VALUE)), (5, Varint), (6, I32)]);
desc!(STATUS, false, [(1, Varint), (2, Str), (3, Varint)]);

desc!(LOGS_REQUEST, false, [(1, Msg(&RESOURCE_LOGS))]);
desc!(RESOURCE_LOGS, false, [(1, Msg(&RESOURCE)), (2, Msg(&SCOPE_LOGS)), (3, Str)]);
desc!(SCOPE_LOGS, false, [(1, Msg(&SCOPE)), (2, Msg(&LOG_RECORD)), (3, Str)]);
desc!(
    LOG_RECORD,
    true,
    [
        (1, I64),
        (11, I64),
        (2, Varint),
        (3, Str),
        (5, Msg(&ANY_VALUE)),
        (6, Msg(&KEY_VALUE)),
        (7, Varint),
        (8, I32),
        (9, TraceId),
        (10, SpanId),
        (12, Str),
    ]
);

desc!(METRICS_REQUEST, false, [(1, Msg(&RESOURCE_METRICS))]);
desc!(RESOURCE_METRICS, false, [(1, Msg(&RESOURCE)), (2, Msg(&SCOPE_METRICS)), (3, Str)]);
desc!(SCOPE_METRICS, false, [(1, Msg(&SCOPE)), (2, Msg(&METRIC)), (3, Str)]);
desc!(
    METRIC,
    false,
    [
        (1, Str),
        (2, Str),
        (3, Str),
        (12, Msg(&KEY_VALUE)),
        (5, Msg(&GAUGE)),
        (7, Msg(&SUM)),
        (9, Msg(&HISTOGRAM)),
        (10, Msg(&EXP_HISTOGRAM)),
        (11, Msg(&SUMMARY)),
    ]
);
desc!(GAUGE, false, [(1, Msg(&NUMBER_DP))]);
desc!(SUM, false, [(1, Msg(&NUMBER_DP)), (2, Varint), (3, Varint)]);
desc!(HISTOGRAM, false, [(1, Msg(&HISTOGRAM_DP)), (2, Varint)]);
desc!(EXP_HISTOGRAM, false, [(1, Msg(&EXP_HISTOGRAM_DP)), (2, Varint)]);
desc!(SUMMARY, false, [(1, Msg(&SUMMARY_DP))]);
desc!(EXEMPLAR, false, [(7, Msg(&KEY_VALUE)), (2, I64), (3, I64), (6, I64), (4, SpanId), (5, TraceId)]);
desc!(
    NUMBER_DP,
    true,
    [(7, Msg(&KEY_VALUE)), (2, I64), (3, I64), (4, I64), (6, I64), (5, Msg(&EXEMPLAR)), (8, Varint)]
);
desc!(
    HISTOGRAM_DP,
    true,
    [
        (9, Msg(&KEY_VALUE)),
        (2, I64),
        (3, I64),
        (4, I64),
        (5, I64),
        (6, I64s),
        (7, I64s),
        (8, Msg(&EXEMPLAR)),
        (10, Varint),
        (11, I64),
        (12, I64),
    ]
);
desc!(BUCKETS, false, [(1, Varint), (2, Varints)]);
desc!(
    EXP_HISTOGRAM_DP,
    true,
    [
        (1, Msg(&KEY_VALUE)),
        (2, I64),
        (3, I64),
        (4, I64),
        (5, I64),
        (6, Varint),
        (7, I64),
        (8, Msg(&BUCKETS)),
        (9, Msg(&BUCKETS)),
        (10, Varint),
        (11, Msg(&EXEMPLAR)),
        (12, I64),
        (13, I64),
        (14, I64),
    ]
);
desc!(
    SUMMARY_DP,
    true,
    [(7, Msg(&KEY_VALUE)), (2, I64), (3, I64), (4, I64), (5, I64), (6, Msg(&QUANTILE)), (8, Varint)]
);
desc!(QUANTILE, false, [(1, I64), (2, I64)]);

fn request_desc(signal: Signal) -> &'static Desc {
    match signal {
        Signal::Traces => &TRACE_REQUEST,
        Signal::Metrics => &METRICS_REQUEST,
        Signal::Logs => &LOGS_REQUEST,
    }
}

/// Reads a varint at `*pos`.
fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*pos).ok_or(WireError::Malformed("truncated varint"))?;
        *pos += 1;
        if i == 9 && b > 1 {
            return Err(WireError::Malformed("varint overflow"));
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(WireError::Malformed("varint too long"))
}

/// Takes `n` bytes at `*pos`.
fn take<'a>(buf: &'a [u8], pos: &mut usize, n: u64) -> Result<&'a [u8], WireError> {
    let n = usize::try_from(n).map_err(|_| WireError::Malformed("length overflow"))?;
    let end = pos.checked_add(n).ok_or(WireError::Malformed("length overflow"))?;
    let s = buf.get(*pos..end).ok_or(WireError::Malformed("truncated field"))?;
    *pos = end;
    Ok(s)
}

/// Validation state: items counted and whether a full decode is needed.
struct Walk {
    items: usize,
    bad_ids: bool,
}

impl Walk {
    fn message(&mut self, desc: &'static Desc, buf: &[u8], depth: usize) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::Malformed("recursion limit reached"));
        }
        if desc.item {
            self.items += 1;
        }
        // A span must carry both ids (an empty field is absent on the wire).
        let is_span = std::ptr::eq(desc, &SPAN);
        // A metric's data fields are a oneof, decoded as prost does: a member that repeats the
        // previous one merges into it (the points of both count), a different member replaces
        // it (only the new one's points count).
        let is_metric = std::ptr::eq(desc, &METRIC);
        let (mut data_field, mut data_points) = (0u64, 0usize);
        let (mut has_trace_id, mut has_span_id) = (false, false);
        let mut attributes = 0usize;
        let mut pos = 0;
        while pos < buf.len() {
            let key = varint(buf, &mut pos)?;
            let wire = (key & 7) as u8;
            let field = key >> 3;
            if field == 0 || field > u64::from(u32::MAX >> 3) {
                return Err(WireError::Malformed("invalid field number"));
            }
            let kind = desc.fields.iter().find(|(n, _)| u64::from(*n) == field).map(|(_, k)| *k);
            match (kind, wire) {
                (Some(Varint), 0) | (Some(Varints), 0) | (None, 0) => {
                    varint(buf, &mut pos)?;
                }
                (Some(I64), 1) | (Some(I64s), 1) | (None, 1) => {
                    take(buf, &mut pos, 8)?;
                }
                (Some(I32), 5) | (None, 5) => {
                    take(buf, &mut pos, 4)?;
                }
                (_, 2) => {
                    let len = varint(buf, &mut pos)?;
                    let body = take(buf, &mut pos, len)?;
                    match kind {
                        Some(Str) => {
                            std::str::from_utf8(body).map_err(|_| WireError::Malformed("invalid UTF-8 in a string"))?;
                        }
                        Some(TraceId) if !(body.is_empty() || body.len() == 16) => self.bad_ids = true,
                        Some(SpanId) if !(body.is_empty() || body.len() == 8) => self.bad_ids = true,
                        Some(TraceId) if field == 1 => has_trace_id = !body.is_empty(),
                        Some(SpanId) if field == 2 => has_span_id = !body.is_empty(),
                        Some(I64s) if body.len() % 8 != 0 => {
                            return Err(WireError::Malformed("packed fixed64 length is not a multiple of 8"));
                        }
                        Some(Varints) => {
                            let mut p = 0;
                            while p < body.len() {
                                varint(body, &mut p)?;
                            }
                        }
                        Some(Msg(d)) if is_metric && matches!(field, 5 | 7 | 9 | 10 | 11) => {
                            if field != data_field {
                                self.items -= data_points;
                                data_points = 0;
                                data_field = field;
                            }
                            let before = self.items;
                            self.message(d, body, depth + 1)?;
                            data_points += self.items - before;
                        }
                        Some(Msg(d)) => {
                            if std::ptr::eq(d, &KEY_VALUE) {
                                attributes += 1;
                                if attributes > MAX_ATTRIBUTES {
                                    return Err(WireError::Limit(
                                        "more than 1024 attributes on one resource, scope, span, event, link, \
                                         data point or log record (or entries in one kvlist value)",
                                    ));
                                }
                            }
                            self.message(d, body, depth + 1)?
                        }
                        Some(Varint) | Some(I64) | Some(I32) => {
                            return Err(WireError::Malformed("wire type mismatch"));
                        }
                        _ => {}
                    }
                }
                (None, 3) | (None, 4) => return Err(WireError::Malformed("groups are not supported")),
                (None, _) => return Err(WireError::Malformed("invalid wire type")),
                (Some(_), _) => return Err(WireError::Malformed("wire type mismatch")),
            }
        }
        if is_span && !(has_trace_id && has_span_id) {
            self.bad_ids = true;
        }
        Ok(())
    }
}

/// Validates an encoded export request of `signal` and returns its item count.
pub fn validate(signal: Signal, buf: &[u8]) -> Result<usize, WireError> {
    let mut w = Walk { items: 0, bad_ids: false };
    w.message(request_desc(signal), buf, 0)?;
    if w.bad_ids {
        return Err(WireError::NeedsDecode);
    }
    Ok(w.items)
}

/// Splits a validated request into its top-level resource entries, each with its item count.
/// Every returned range is itself a valid request holding that one entry.
pub fn resource_entries(signal: Signal, buf: &[u8]) -> Result<Vec<(std::ops::Range<usize>, usize)>, WireError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let key = varint(buf, &mut pos)?;
        let items = if key == (1 << 3 | 2) {
            let len = varint(buf, &mut pos)?;
            let body = take(buf, &mut pos, len)?;
            let desc = match request_desc(signal).fields.first() {
                Some((_, Msg(d))) => *d,
                _ => return Err(WireError::Malformed("descriptor")),
            };
            let mut w = Walk { items: 0, bad_ids: false };
            w.message(desc, body, 1)?;
            w.items
        } else {
            // An unknown top-level field: skip it, keeping it with the next entry.
            match key & 7 {
                0 => {
                    varint(buf, &mut pos)?;
                }
                1 => {
                    take(buf, &mut pos, 8)?;
                }
                5 => {
                    take(buf, &mut pos, 4)?;
                }
                2 => {
                    let len = varint(buf, &mut pos)?;
                    take(buf, &mut pos, len)?;
                }
                _ => return Err(WireError::Malformed("invalid wire type")),
            }
            0
        };
        out.push((start..pos, items));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
        NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
        exponential_histogram_data_point, metric::Data, number_data_point, summary_data_point,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
    use prost::Message;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn attrs() -> Vec<KeyValue> {
        let kv =
            |k: &str, v: Value| KeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), key_strindex: 0 };
        vec![
            kv("s", Value::StringValue("x".into())),
            kv("i", Value::IntValue(-7)),
            kv("d", Value::DoubleValue(1.5)),
            kv("b", Value::BoolValue(true)),
            kv("y", Value::BytesValue(vec![1, 2, 3])),
            kv("a", Value::ArrayValue(ArrayValue { values: vec![AnyValue { value: Some(Value::IntValue(1)) }] })),
            kv("m", Value::KvlistValue(KeyValueList { values: vec![kv("n", Value::StringValue("y".into()))] })),
        ]
    }

    fn resource() -> Option<Resource> {
        Some(Resource { attributes: attrs(), dropped_attributes_count: 1, entity_refs: vec![] })
    }

    fn traces() -> Vec<u8> {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            parent_span_id: vec![3; 8],
            name: "n".into(),
            kind: 2,
            start_time_unix_nano: 5,
            end_time_unix_nano: 6,
            attributes: attrs(),
            events: vec![span::Event {
                time_unix_nano: 1,
                name: "e".into(),
                attributes: attrs(),
                dropped_attributes_count: 0,
            }],
            links: vec![span::Link {
                trace_id: vec![4; 16],
                span_id: vec![5; 8],
                attributes: attrs(),
                ..Default::default()
            }],
            status: Some(Status { message: "m".into(), code: 2 }),
            flags: 0x101,
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: resource(),
                scope_spans: vec![ScopeSpans { spans: vec![span.clone(), span], ..Default::default() }],
                schema_url: "u".into(),
            }],
        }
        .encode_to_vec()
    }

    fn metrics() -> Vec<u8> {
        let ndp = NumberDataPoint {
            attributes: attrs(),
            start_time_unix_nano: 1,
            time_unix_nano: 2,
            value: Some(number_data_point::Value::AsInt(3)),
            ..Default::default()
        };
        let metric = |data| Metric { name: "m".into(), unit: "s".into(), data: Some(data), ..Default::default() };
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        metric(Data::Gauge(Gauge { data_points: vec![ndp.clone()] })),
                        metric(Data::Sum(Sum {
                            data_points: vec![ndp.clone(), ndp],
                            aggregation_temporality: 2,
                            is_monotonic: true,
                        })),
                        metric(Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                count: 3,
                                sum: Some(1.0),
                                bucket_counts: vec![1, 2],
                                explicit_bounds: vec![0.5],
                                ..Default::default()
                            }],
                            aggregation_temporality: 2,
                        })),
                        metric(Data::ExponentialHistogram(ExponentialHistogram {
                            data_points: vec![ExponentialHistogramDataPoint {
                                scale: -2,
                                positive: Some(exponential_histogram_data_point::Buckets {
                                    offset: -1,
                                    bucket_counts: vec![1, 300],
                                }),
                                ..Default::default()
                            }],
                            aggregation_temporality: 1,
                        })),
                        metric(Data::Summary(Summary {
                            data_points: vec![SummaryDataPoint {
                                quantile_values: vec![summary_data_point::ValueAtQuantile {
                                    quantile: 0.5,
                                    value: 2.0,
                                }],
                                ..Default::default()
                            }],
                        })),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    fn logs() -> Vec<u8> {
        let rec = LogRecord {
            time_unix_nano: 1,
            severity_number: 9,
            severity_text: "INFO".into(),
            body: Some(AnyValue { value: Some(Value::StringValue("hello".into())) }),
            attributes: attrs(),
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            event_name: "ev".into(),
            ..Default::default()
        };
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: resource(),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![rec.clone(), rec, LogRecord::default()],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    fn prost_ok(signal: Signal, buf: &[u8]) -> bool {
        match signal {
            Signal::Traces => ExportTraceServiceRequest::decode(buf).is_ok(),
            Signal::Metrics => ExportMetricsServiceRequest::decode(buf).is_ok(),
            Signal::Logs => ExportLogsServiceRequest::decode(buf).is_ok(),
        }
    }

    /// The items prost decodes from `buf`, if it decodes.
    fn prost_count(signal: Signal, buf: &[u8]) -> Option<usize> {
        Some(match signal {
            Signal::Traces => ExportTraceServiceRequest::decode(buf)
                .ok()?
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum(),
            Signal::Metrics => ExportMetricsServiceRequest::decode(buf)
                .ok()?
                .resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .map(|m| match &m.data {
                    Some(Data::Gauge(g)) => g.data_points.len(),
                    Some(Data::Sum(g)) => g.data_points.len(),
                    Some(Data::Histogram(g)) => g.data_points.len(),
                    Some(Data::ExponentialHistogram(g)) => g.data_points.len(),
                    Some(Data::Summary(g)) => g.data_points.len(),
                    None => 0,
                })
                .sum(),
            Signal::Logs => ExportLogsServiceRequest::decode(buf)
                .ok()?
                .resource_logs
                .iter()
                .flat_map(|r| &r.scope_logs)
                .map(|s| s.log_records.len())
                .sum(),
        })
    }

    /// A request holding one metric whose encoding is `metric`, wrapped by hand (field 2 of
    /// ScopeMetrics, field 2 of ResourceMetrics, field 1 of the request).
    fn wrap_metric(metric: &[u8]) -> Vec<u8> {
        let wrap = |field: u32, body: &[u8]| {
            let mut v = Vec::new();
            prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut v);
            prost::encoding::encode_varint(body.len() as u64, &mut v);
            v.extend_from_slice(body);
            v
        };
        wrap(1, &wrap(2, &wrap(2, metric)))
    }

    /// The fuzz harness's minimised input: a metric whose `gauge` field appears twice. prost
    /// merges both occurrences, so both sets of points count.
    #[test]
    fn a_repeated_data_field_counts_the_points_of_every_occurrence() {
        let inputs: [&[u8]; 2] = [
            include_bytes!("../../../fuzz/corpus/otlp_proto_metrics/regress-repeated-gauge.pb"),
            include_bytes!("../../../fuzz/corpus/otlp_http_receiver/regress-repeated-gauge.pb"),
        ];
        for buf in inputs {
            let theirs = prost_count(Signal::Metrics, buf).expect("prost decodes the regress input");
            assert_eq!(validate(Signal::Metrics, buf), Ok(theirs));
            assert!(theirs > 0);
        }

        let gauge = |n: usize| {
            Metric {
                data: Some(Data::Gauge(Gauge { data_points: vec![NumberDataPoint::default(); n] })),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let sum = |n: usize| {
            Metric {
                data: Some(Data::Sum(Sum { data_points: vec![NumberDataPoint::default(); n], ..Default::default() })),
                ..Default::default()
            }
            .encode_to_vec()
        };
        // gauge 3 + gauge 4 merge: 7; gauge 3, sum 2, gauge 4: the last gauge alone, 4.
        for (parts, want) in [
            (vec![gauge(3), gauge(4)], 7),
            (vec![gauge(3), sum(2), gauge(4)], 4),
            (vec![sum(2), sum(5), gauge(1), gauge(1)], 2),
        ] {
            let top = wrap_metric(&parts.concat());
            assert_eq!(prost_count(Signal::Metrics, &top), Some(want));
            assert_eq!(validate(Signal::Metrics, &top), Ok(want));
        }
    }

    /// Randomised: metrics made of random sequences of data fields (each occurrence merged or
    /// replaced as prost does), then byte-mutated; whatever the validator counts equals what
    /// prost decodes.
    #[test]
    fn the_count_equals_prosts_on_repeated_and_mutated_data_fields() {
        let mut rng = StdRng::seed_from_u64(11);
        let member = |kind: u32, n: usize| {
            let data = match kind {
                0 => Data::Gauge(Gauge { data_points: vec![NumberDataPoint::default(); n] }),
                1 => Data::Sum(Sum { data_points: vec![NumberDataPoint::default(); n], ..Default::default() }),
                2 => Data::Histogram(Histogram {
                    data_points: vec![HistogramDataPoint::default(); n],
                    ..Default::default()
                }),
                3 => Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: vec![ExponentialHistogramDataPoint::default(); n],
                    ..Default::default()
                }),
                _ => Data::Summary(Summary { data_points: vec![SummaryDataPoint::default(); n] }),
            };
            Metric { name: "m".into(), data: Some(data), ..Default::default() }.encode_to_vec()
        };
        let mut checked = 0;
        for _ in 0..3000 {
            let parts: Vec<Vec<u8>> =
                (0..rng.random_range(1..6)).map(|_| member(rng.random_range(0..3), rng.random_range(0..4))).collect();
            let mut b = wrap_metric(&parts.concat());
            for _ in 0..rng.random_range(0..3) {
                let i = rng.random_range(0..b.len());
                match rng.random_range(0..3) {
                    0 => b[i] = rng.random(),
                    1 => b.insert(i, rng.random()),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            if let Ok(n) = validate(Signal::Metrics, &b) {
                assert_eq!(Some(n), prost_count(Signal::Metrics, &b), "count differs from prost's on {b:?}");
                checked += 1;
            }
        }
        assert!(checked > 1000, "only {checked} inputs were valid");
    }

    #[test]
    fn attribute_count_is_limited() {
        let kv = |i: usize| KeyValue {
            key: format!("k{i}"),
            value: Some(AnyValue { value: Some(Value::IntValue(i as i64)) }),
            ..Default::default()
        };
        let req = |n: usize| {
            ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(Resource { attributes: (0..n).map(kv).collect(), ..Default::default() }),
                    ..Default::default()
                }],
            }
            .encode_to_vec()
        };
        assert!(validate(Signal::Traces, &req(MAX_ATTRIBUTES)).is_ok());
        assert!(matches!(validate(Signal::Traces, &req(MAX_ATTRIBUTES + 1)), Err(WireError::Limit(_))));
    }

    #[test]
    fn counts_items_of_every_signal() {
        assert_eq!(validate(Signal::Traces, &traces()), Ok(2));
        assert_eq!(validate(Signal::Metrics, &metrics()), Ok(6));
        assert_eq!(validate(Signal::Logs, &logs()), Ok(3));
        assert_eq!(validate(Signal::Traces, &[]), Ok(0));
        let no_ids = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span { name: "x".into(), ..Default::default() }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        assert_eq!(validate(Signal::Traces, &no_ids.encode_to_vec()), Err(WireError::NeedsDecode));
    }

    #[test]
    fn a_metric_with_two_data_fields_counts_the_last_one() {
        let gauge = Metric {
            name: "g".into(),
            data: Some(Data::Gauge(Gauge { data_points: vec![NumberDataPoint::default(); 3] })),
            ..Default::default()
        }
        .encode_to_vec();
        let sum = Metric {
            data: Some(Data::Sum(Sum { data_points: vec![NumberDataPoint::default(); 2], ..Default::default() })),
            ..Default::default()
        }
        .encode_to_vec();
        // Both encodings concatenated are one Metric holding gauge then sum: prost keeps the sum.
        let metric: Vec<u8> = gauge.into_iter().chain(sum).collect();
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric::decode(metric.as_slice()).unwrap()],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        // Wrap it by hand (prost would drop the gauge): field 2 of ScopeMetrics, field 2 of
        // ResourceMetrics, field 1 of the request.
        let wrap = |field: u32, body: &[u8]| {
            let mut v = Vec::new();
            prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut v);
            prost::encoding::encode_varint(body.len() as u64, &mut v);
            v.extend_from_slice(body);
            v
        };
        let top = wrap(1, &wrap(2, &wrap(2, &metric)));
        let decoded = ExportMetricsServiceRequest::decode(top.as_slice()).unwrap();
        assert_eq!(decoded, req);
        assert_eq!(validate(Signal::Metrics, &top), Ok(2));
    }

    /// Fuzz-style: random truncations, byte flips, insertions and deletions of real requests.
    /// Whatever the validator accepts, prost must decode (we never forward undecodable data);
    /// and what prost decodes, the validator accepts or sends to the decoding path.
    #[test]
    fn mutations_never_pass_what_prost_rejects() {
        let mut rng = StdRng::seed_from_u64(7);
        for (signal, base) in [(Signal::Traces, traces()), (Signal::Metrics, metrics()), (Signal::Logs, logs())] {
            for _ in 0..4000 {
                let mut b = base.clone();
                for _ in 0..rng.random_range(1..4) {
                    if b.is_empty() {
                        break;
                    }
                    let i = rng.random_range(0..b.len());
                    match rng.random_range(0..4) {
                        0 => b[i] = rng.random(),
                        1 => b.truncate(i),
                        2 => b.insert(i, rng.random()),
                        _ => {
                            b.remove(i);
                        }
                    }
                }
                let ours = validate(signal, &b);
                let theirs = prost_ok(signal, &b);
                if let Ok(n) = ours {
                    assert!(theirs, "{signal}: validator accepted what prost rejects: {b:?}");
                    assert_eq!(Some(n), prost_count(signal, &b), "{signal}: count differs from prost's on {b:?}");
                }
                if theirs {
                    assert!(
                        ours.is_ok() || ours == Err(WireError::NeedsDecode) || b.iter().any(|&x| x & 7 == 3),
                        "{signal}: validator rejected what prost decodes ({ours:?})"
                    );
                }
            }
        }
    }
}
