//! Property tests of the OTLP ⇄ Arrow conversion: `from_batch(to_batch(x)) == normalize(x)`.
//!
//! `normalize` only (a) drops resources / scopes / metrics without rows (not representable),
//! (b) moves promoted attributes as the converter does (first occurrence of a promoted key, when it
//! has the column's type, moves after the other attributes in the promoted-column order), and
//! (c) applies the documented identities: an absent resource / scope comes back as an empty one,
//! a span status equal to the default comes back absent. Requests are compared by their protobuf
//! encoding so that NaN values (which are kept bit for bit) compare equal.

use inferwatch_core::arrow::schema::{self, PROMOTED_RESOURCE_ATTRIBUTES, PROMOTED_SPAN_ATTRIBUTES, PromotedType};
use inferwatch_core::arrow::series::series_id;
use inferwatch_core::arrow::{metrics, payload_to_batch, spans};
use inferwatch_core::pdata::{Encoded, Payload};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exemplar, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use prost::Message;

// ---- strategies ------------------------------------------------------------------------------

fn key() -> impl Strategy<Value = String> {
    let special: Vec<String> = PROMOTED_SPAN_ATTRIBUTES
        .iter()
        .map(|(k, _)| k.to_string())
        .chain(PROMOTED_RESOURCE_ATTRIBUTES.iter().map(|k| k.to_string()))
        .collect();
    prop_oneof![3 => "[a-c]{1,2}", 1 => proptest::sample::select(special)]
}

/// Doubles for non-oneof protobuf fields: no -0.0 (protobuf does not encode it, so the Encoded
/// comparison would see 0.0).
fn plain_f64() -> impl Strategy<Value = f64> {
    any::<f64>().prop_map(|d| if d == 0.0 { 0.0 } else { d })
}

fn leaf_value() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        "\\PC{0,6}".prop_map(|s| Some(Value::StringValue(s))),
        any::<bool>().prop_map(|b| Some(Value::BoolValue(b))),
        any::<i64>().prop_map(|i| Some(Value::IntValue(i))),
        any::<f64>().prop_map(|d| Some(Value::DoubleValue(d))),
        vec(any::<u8>(), 0..6).prop_map(|b| Some(Value::BytesValue(b))),
    ]
}

fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = leaf_value().prop_map(|value| AnyValue { value });
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3)
                .prop_map(|values| AnyValue { value: Some(Value::ArrayValue(ArrayValue { values })) }),
            vec((key(), option::weighted(0.9, inner)), 0..3).prop_map(|kvs| AnyValue {
                value: Some(Value::KvlistValue(KeyValueList {
                    values: kvs.into_iter().map(|(key, value)| KeyValue { key, value, key_strindex: 0 }).collect(),
                })),
            }),
        ]
    })
}

/// A value of the promoted column type of `key` (so promotion actually happens often).
fn typed_for(key: &str) -> BoxedStrategy<AnyValue> {
    let ty = PROMOTED_SPAN_ATTRIBUTES.iter().find(|(k, _)| *k == key).map(|(_, t)| *t);
    let is_resource_key = PROMOTED_RESOURCE_ATTRIBUTES.contains(&key);
    match (ty, is_resource_key) {
        (Some(PromotedType::Int), _) => any::<i64>().prop_map(|i| AnyValue { value: Some(Value::IntValue(i)) }).boxed(),
        (Some(PromotedType::Double), _) => {
            any::<f64>().prop_map(|d| AnyValue { value: Some(Value::DoubleValue(d)) }).boxed()
        }
        (Some(PromotedType::Str), _) | (None, true) => {
            "[a-z]{0,4}".prop_map(|s| AnyValue { value: Some(Value::StringValue(s)) }).boxed()
        }
        (None, false) => any_value().boxed(),
    }
}

fn key_value() -> impl Strategy<Value = KeyValue> {
    key()
        .prop_flat_map(|key| {
            let typed = typed_for(&key);
            let value = prop_oneof![2 => typed.prop_map(Some), 2 => any_value().prop_map(Some), 1 => Just(None)];
            (Just(key), value)
        })
        .prop_map(|(key, value)| KeyValue { key, value, key_strindex: 0 })
}

fn attrs() -> impl Strategy<Value = Vec<KeyValue>> {
    vec(key_value(), 0..5)
}

fn resource() -> impl Strategy<Value = Option<Resource>> {
    option::weighted(0.8, (attrs(), any::<u32>())).prop_map(|r| {
        r.map(|(attributes, dropped)| Resource { attributes, dropped_attributes_count: dropped, entity_refs: vec![] })
    })
}

fn scope() -> impl Strategy<Value = Option<InstrumentationScope>> {
    option::weighted(0.8, ("[a-z]{0,3}", "[0-9.]{0,3}", attrs(), any::<u32>())).prop_map(|s| {
        s.map(|(name, version, attributes, dropped_attributes_count)| InstrumentationScope {
            name,
            version,
            attributes,
            dropped_attributes_count,
        })
    })
}

fn bytes_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(vec![]), vec(any::<u8>(), 8..=8), vec(any::<u8>(), 16..=16), vec(any::<u8>(), 0..20)]
}

fn exemplars() -> impl Strategy<Value = Vec<Exemplar>> {
    let value = option::of(prop_oneof![
        any::<f64>().prop_map(exemplar::Value::AsDouble),
        any::<i64>().prop_map(exemplar::Value::AsInt)
    ]);
    vec((attrs(), any::<u64>(), bytes_id(), bytes_id(), value), 0..3).prop_map(|v| {
        v.into_iter()
            .map(|(filtered_attributes, time_unix_nano, span_id, trace_id, value)| Exemplar {
                filtered_attributes,
                time_unix_nano,
                span_id,
                trace_id,
                value,
            })
            .collect()
    })
}

fn number_points() -> impl Strategy<Value = Vec<NumberDataPoint>> {
    let value = option::of(prop_oneof![
        any::<f64>().prop_map(number_data_point::Value::AsDouble),
        any::<i64>().prop_map(number_data_point::Value::AsInt)
    ]);
    vec((attrs(), any::<u64>(), any::<u64>(), exemplars(), any::<u32>(), value), 0..3).prop_map(|v| {
        v.into_iter()
            .map(|(attributes, start_time_unix_nano, time_unix_nano, exemplars, flags, value)| NumberDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                exemplars,
                flags,
                value,
            })
            .collect()
    })
}

fn histogram_points() -> impl Strategy<Value = Vec<HistogramDataPoint>> {
    let point = (
        (attrs(), any::<u64>(), any::<u64>(), any::<u64>(), option::of(plain_f64())),
        (vec(any::<u64>(), 0..4), vec(plain_f64(), 0..4), exemplars(), any::<u32>()),
        (option::of(plain_f64()), option::of(plain_f64())),
    )
        .prop_map(
            |(
                (attributes, start, time, count, sum),
                (bucket_counts, explicit_bounds, exemplars, flags),
                (min, max),
            )| {
                HistogramDataPoint {
                    attributes,
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    count,
                    sum,
                    bucket_counts,
                    explicit_bounds,
                    exemplars,
                    flags,
                    min,
                    max,
                }
            },
        );
    vec(point, 0..3)
}

fn buckets() -> impl Strategy<Value = Option<Buckets>> {
    option::of(
        (any::<i32>(), vec(any::<u64>(), 0..4)).prop_map(|(offset, bucket_counts)| Buckets { offset, bucket_counts }),
    )
}

fn exp_points() -> impl Strategy<Value = Vec<ExponentialHistogramDataPoint>> {
    let point = (
        (attrs(), any::<u64>(), any::<u64>(), any::<u64>(), option::of(plain_f64()), any::<i32>()),
        (any::<u64>(), buckets(), buckets(), any::<u32>(), exemplars()),
        (option::of(plain_f64()), option::of(plain_f64()), plain_f64()),
    )
        .prop_map(
            |(
                (attributes, start, time, count, sum, scale),
                (zero_count, positive, negative, flags, exemplars),
                (min, max, zero_threshold),
            )| ExponentialHistogramDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: time,
                count,
                sum,
                scale,
                zero_count,
                positive,
                negative,
                flags,
                exemplars,
                min,
                max,
                zero_threshold,
            },
        );
    vec(point, 0..3)
}

fn summary_points() -> impl Strategy<Value = Vec<SummaryDataPoint>> {
    let quantiles =
        vec((plain_f64(), plain_f64()).prop_map(|(quantile, value)| ValueAtQuantile { quantile, value }), 0..4);
    vec((attrs(), any::<u64>(), any::<u64>(), any::<u64>(), plain_f64(), quantiles, any::<u32>()), 0..3).prop_map(|v| {
        v.into_iter()
            .map(|(attributes, start_time_unix_nano, time_unix_nano, count, sum, quantile_values, flags)| {
                SummaryDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    count,
                    sum,
                    quantile_values,
                    flags,
                }
            })
            .collect()
    })
}

fn data() -> impl Strategy<Value = Option<Data>> {
    prop_oneof![
        1 => Just(None),
        3 => number_points().prop_map(|data_points| Some(Data::Gauge(Gauge { data_points }))),
        3 => (number_points(), any::<i32>(), any::<bool>()).prop_map(|(data_points, t, m)| {
            Some(Data::Sum(Sum { data_points, aggregation_temporality: t, is_monotonic: m }))
        }),
        3 => (histogram_points(), any::<i32>())
            .prop_map(|(data_points, t)| Some(Data::Histogram(Histogram { data_points, aggregation_temporality: t }))),
        3 => (exp_points(), any::<i32>()).prop_map(|(data_points, t)| {
            Some(Data::ExponentialHistogram(ExponentialHistogram { data_points, aggregation_temporality: t }))
        }),
        3 => summary_points().prop_map(|data_points| Some(Data::Summary(Summary { data_points }))),
    ]
}

fn metric() -> impl Strategy<Value = Metric> {
    // Few names, so consecutive metrics often share one (metric_index must keep them apart).
    ("[ab]", "\\PC{0,4}", "[a-z]{0,2}", attrs(), data()).prop_map(|(name, description, unit, metadata, data)| Metric {
        name,
        description,
        unit,
        metadata,
        data,
    })
}

fn metrics_request() -> impl Strategy<Value = ExportMetricsServiceRequest> {
    let scope_metrics = (scope(), vec(metric(), 0..4), "[a-z]{0,2}")
        .prop_map(|(scope, metrics, schema_url)| ScopeMetrics { scope, metrics, schema_url });
    let resource_metrics = (resource(), vec(scope_metrics, 0..3), "[a-z]{0,2}")
        .prop_map(|(resource, scope_metrics, schema_url)| ResourceMetrics { resource, scope_metrics, schema_url });
    vec(resource_metrics, 0..3).prop_map(|resource_metrics| ExportMetricsServiceRequest { resource_metrics })
}

fn span() -> impl Strategy<Value = Span> {
    let event = (any::<u64>(), "[a-z]{0,3}", attrs(), any::<u32>()).prop_map(
        |(time_unix_nano, name, attributes, dropped_attributes_count)| Event {
            time_unix_nano,
            name,
            attributes,
            dropped_attributes_count,
        },
    );
    let link = (bytes_id(), bytes_id(), "[a-z=,]{0,4}", attrs(), any::<u32>(), any::<u32>()).prop_map(
        |(trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags)| Link {
            trace_id,
            span_id,
            trace_state,
            attributes,
            dropped_attributes_count,
            flags,
        },
    );
    let status = option::of(("\\PC{0,3}", 0..3i32).prop_map(|(message, code)| Status { message, code }));
    (
        (bytes_id(), bytes_id(), "[a-z=,]{0,4}", bytes_id(), any::<u32>(), "[a-z]{0,4}", any::<i32>()),
        (any::<u64>(), any::<u64>(), vec(key_value(), 0..8), any::<u32>(), any::<u32>(), any::<u32>()),
        (vec(event, 0..3), vec(link, 0..3), status),
    )
        .prop_map(
            |(
                (trace_id, span_id, trace_state, parent_span_id, flags, name, kind),
                (start, end, attributes, dropped_attributes_count, dropped_events_count, dropped_links_count),
                (events, links, status),
            )| Span {
                trace_id,
                span_id,
                trace_state,
                parent_span_id,
                flags,
                name,
                kind,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes,
                dropped_attributes_count,
                events,
                dropped_events_count,
                links,
                dropped_links_count,
                status,
            },
        )
}

fn traces_request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let scope_spans = (scope(), vec(span(), 0..4), "[a-z]{0,2}").prop_map(|(scope, spans, schema_url)| ScopeSpans {
        scope,
        spans,
        schema_url,
    });
    let resource_spans = (resource(), vec(scope_spans, 0..3), "[a-z]{0,2}")
        .prop_map(|(resource, scope_spans, schema_url)| ResourceSpans { resource, scope_spans, schema_url });
    vec(resource_spans, 0..3).prop_map(|resource_spans| ExportTraceServiceRequest { resource_spans })
}

// ---- normalization ---------------------------------------------------------------------------

/// Moves the first occurrence of each promoted key, when `typed` accepts its value, after the
/// other attributes, in the order of `keys`.
fn promote(attrs: &mut Vec<KeyValue>, keys: &[&str], typed: impl Fn(&str, &Option<Value>) -> bool) {
    let mut moved = Vec::new();
    for key in keys {
        if let Some(i) = attrs.iter().position(|kv| kv.key == *key)
            && typed(key, &attrs[i].value.as_ref().and_then(|v| v.value.clone()))
        {
            moved.push(attrs.remove(i));
        }
    }
    attrs.extend(moved);
}

fn normalize_resource(r: Option<Resource>) -> Option<Resource> {
    let mut r = r.unwrap_or_default();
    promote(&mut r.attributes, PROMOTED_RESOURCE_ATTRIBUTES, |_, v| matches!(v, Some(Value::StringValue(_))));
    Some(r)
}

fn span_typed(key: &str, v: &Option<Value>) -> bool {
    let ty = PROMOTED_SPAN_ATTRIBUTES.iter().find(|(k, _)| *k == key).map(|(_, t)| *t);
    matches!(
        (ty, v),
        (Some(PromotedType::Str), Some(Value::StringValue(_)))
            | (Some(PromotedType::Int), Some(Value::IntValue(_)))
            | (Some(PromotedType::Double), Some(Value::DoubleValue(_)))
    )
}

fn point_count(m: &Metric) -> usize {
    match &m.data {
        None => 0,
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
    }
}

fn normalize_metrics(mut req: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest {
    for rm in &mut req.resource_metrics {
        rm.resource = normalize_resource(rm.resource.take());
        for sm in &mut rm.scope_metrics {
            sm.scope = Some(sm.scope.take().unwrap_or_default());
            sm.metrics.retain(|m| point_count(m) > 0);
        }
        rm.scope_metrics.retain(|sm| !sm.metrics.is_empty());
    }
    req.resource_metrics.retain(|rm| !rm.scope_metrics.is_empty());
    req
}

fn normalize_traces(mut req: ExportTraceServiceRequest) -> ExportTraceServiceRequest {
    let span_keys: Vec<&str> = PROMOTED_SPAN_ATTRIBUTES.iter().map(|(k, _)| *k).collect();
    for rs in &mut req.resource_spans {
        rs.resource = normalize_resource(rs.resource.take());
        for ss in &mut rs.scope_spans {
            ss.scope = Some(ss.scope.take().unwrap_or_default());
            for s in &mut ss.spans {
                promote(&mut s.attributes, &span_keys, span_typed);
                if s.status == Some(Status::default()) {
                    s.status = None;
                }
            }
        }
        rs.scope_spans.retain(|ss| !ss.spans.is_empty());
    }
    req.resource_spans.retain(|rs| !rs.scope_spans.is_empty());
    req
}

/// Series ids of every point of `req`, in row order, computed from the OTLP request directly.
fn expected_series_ids(req: &ExportMetricsServiceRequest) -> Vec<u64> {
    let mut ids = Vec::new();
    for rm in &req.resource_metrics {
        let res = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let mut id = |attrs: &[KeyValue]| ids.push(series_id(res, sm.scope.as_ref(), &m.name, attrs));
                match &m.data {
                    None => {}
                    Some(Data::Gauge(Gauge { data_points: p })) | Some(Data::Sum(Sum { data_points: p, .. })) => {
                        p.iter().for_each(|p| id(&p.attributes))
                    }
                    Some(Data::Histogram(h)) => h.data_points.iter().for_each(|p| id(&p.attributes)),
                    Some(Data::ExponentialHistogram(h)) => h.data_points.iter().for_each(|p| id(&p.attributes)),
                    Some(Data::Summary(s)) => s.data_points.iter().for_each(|p| id(&p.attributes)),
                }
            }
        }
    }
    ids
}

// ---- properties ------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn metrics_round_trip(req in metrics_request()) {
        let batch = metrics::to_batch(&req).unwrap();
        prop_assert_eq!(batch.schema(), schema::metrics_schema());
        let back = metrics::from_batch(&batch).unwrap();
        let want = normalize_metrics(req.clone());
        if back.encode_to_vec() != want.encode_to_vec() {
            prop_assert_eq!(back, want);
        }
        let ids = batch
            .column_by_name(schema::SERIES_ID)
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::UInt64Array>()
            .unwrap()
            .values()
            .to_vec();
        prop_assert_eq!(ids, expected_series_ids(&req));
        let encoded = Payload::Encoded(Encoded::from_decoded(&Payload::Metrics(req)));
        prop_assert_eq!(payload_to_batch(&encoded).unwrap(), batch);
    }

    #[test]
    fn traces_round_trip(req in traces_request()) {
        let batch = spans::to_batch(&req).unwrap();
        prop_assert_eq!(batch.schema(), schema::spans_schema());
        let back = spans::from_batch(&batch).unwrap();
        let want = normalize_traces(req.clone());
        if back.encode_to_vec() != want.encode_to_vec() {
            prop_assert_eq!(back, want);
        }
        let encoded = Payload::Encoded(Encoded::from_decoded(&Payload::Traces(req)));
        prop_assert_eq!(payload_to_batch(&encoded).unwrap(), batch);
    }

    #[test]
    fn series_id_ignores_attribute_order(
        res in attrs(), point in attrs(), seed in any::<u64>(), name in "[a-z]{0,4}", s in scope()
    ) {
        let shuffle = |v: &[KeyValue]| {
            let mut v = v.to_vec();
            let n = v.len().max(1);
            v.rotate_left((seed as usize) % n);
            if seed & 1 == 1 {
                v.reverse();
            }
            v
        };
        prop_assert_eq!(
            series_id(&shuffle(&res), s.as_ref(), &name, &shuffle(&point)),
            series_id(&res, s.as_ref(), &name, &point)
        );
    }
}
