use super::*;
use crate::arrow::ConvError;
use crate::arrow::schema;
use crate::arrow::series::series_id;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{Array, RecordBatch, UInt8Array};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::AnyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exemplar, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::sync::Arc;

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), key_strindex: 0 }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

fn number(t: u64, v: Option<number_data_point::Value>, attrs: Vec<KeyValue>) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attrs,
        start_time_unix_nano: t.saturating_sub(10),
        time_unix_nano: t,
        exemplars: vec![],
        flags: 0,
        value: v,
    }
}

fn metric(name: &str, data: Data) -> Metric {
    Metric {
        name: name.into(),
        description: format!("{name} desc"),
        unit: "1".into(),
        metadata: vec![kv("m", Value::BoolValue(true))],
        data: Some(data),
    }
}

/// A request with every kind; the resource has `service.name` (string, promoted) and
/// `service.version` (int, stays in the map).
fn request() -> ExportMetricsServiceRequest {
    let exemplar = Exemplar {
        filtered_attributes: vec![kv("e", s("x"))],
        time_unix_nano: u64::MAX - 1,
        span_id: vec![1; 8],
        trace_id: vec![],
        value: Some(exemplar::Value::AsInt(-4)),
    };
    let mut gauge_point = number(1_000, Some(number_data_point::Value::AsDouble(1.5)), vec![kv("gpu", s("0"))]);
    gauge_point.exemplars = vec![exemplar.clone(), Exemplar { value: None, ..exemplar }];
    let gauge = Data::Gauge(Gauge {
        data_points: vec![
            gauge_point,
            number(u64::MAX, Some(number_data_point::Value::AsInt(i64::MIN)), vec![kv("gpu", s("1"))]),
            number(3_000, None, vec![]),
        ],
    });
    let sum = Data::Sum(Sum {
        data_points: vec![number(5, Some(number_data_point::Value::AsInt(7)), vec![])],
        aggregation_temporality: 2,
        is_monotonic: true,
    });
    let hist = Data::Histogram(Histogram {
        data_points: vec![HistogramDataPoint {
            attributes: vec![kv("route", s("/v1"))],
            start_time_unix_nano: 1,
            time_unix_nano: 2,
            count: 6,
            sum: None,
            bucket_counts: vec![1, 2, 3],
            explicit_bounds: vec![0.5, 1.0],
            exemplars: vec![],
            flags: 1,
            min: Some(0.1),
            max: None,
        }],
        aggregation_temporality: 1,
    });
    let exp = Data::ExponentialHistogram(ExponentialHistogram {
        data_points: vec![ExponentialHistogramDataPoint {
            count: 9,
            sum: Some(12.5),
            scale: -3,
            zero_count: 2,
            positive: Some(Buckets { offset: -2, bucket_counts: vec![4, 3] }),
            negative: None,
            min: None,
            max: Some(8.0),
            zero_threshold: 1e-9,
            time_unix_nano: 10,
            ..Default::default()
        }],
        aggregation_temporality: 2,
    });
    let summary = Data::Summary(Summary {
        data_points: vec![SummaryDataPoint {
            count: 4,
            sum: 10.0,
            quantile_values: vec![
                ValueAtQuantile { quantile: 0.5, value: 2.0 },
                ValueAtQuantile { quantile: 0.99, value: 4.0 },
            ],
            time_unix_nano: 11,
            ..Default::default()
        }],
    });
    ExportMetricsServiceRequest {
        resource_metrics: vec![
            ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", s("vllm")),
                        kv("host", s("h1")),
                        kv("service.version", Value::IntValue(3)),
                    ],
                    dropped_attributes_count: 1,
                    entity_refs: vec![],
                }),
                scope_metrics: vec![
                    ScopeMetrics {
                        scope: Some(InstrumentationScope {
                            name: "a".into(),
                            version: "1".into(),
                            ..Default::default()
                        }),
                        metrics: vec![metric("g", gauge), metric("s", sum)],
                        schema_url: "scope-url".into(),
                    },
                    ScopeMetrics {
                        scope: Some(InstrumentationScope::default()),
                        metrics: vec![metric("h", hist), metric("e", exp), metric("q", summary)],
                        schema_url: String::new(),
                    },
                ],
                schema_url: "res-url".into(),
            },
            ResourceMetrics {
                resource: Some(Resource::default()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope::default()),
                    // Same name twice in a row: metric_index keeps them apart.
                    metrics: vec![
                        metric("g", Data::Gauge(Gauge { data_points: vec![number(1, None, vec![])] })),
                        metric("g", Data::Gauge(Gauge { data_points: vec![number(2, None, vec![])] })),
                    ],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            },
        ],
    }
}

/// `request()` as it comes back: `service.name` moves after the other resource attributes.
fn expected() -> ExportMetricsServiceRequest {
    let mut r = request();
    let attrs = &mut r.resource_metrics[0].resource.as_mut().unwrap().attributes;
    let name = attrs.remove(0);
    attrs.push(name);
    r
}

#[test]
fn every_kind_round_trips() {
    let batch = to_batch(&request()).unwrap();
    assert_eq!(batch.schema(), schema::metrics_schema());
    assert_eq!(batch.num_rows(), 3 + 1 + 1 + 1 + 1 + 2);
    assert_eq!(from_batch(&batch).unwrap(), expected());
}

#[test]
fn columns_hold_what_the_schema_says() {
    let b = to_batch(&request()).unwrap();
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    let kinds = col(schema::KIND);
    let kinds = kinds.as_primitive::<arrow_array::types::UInt8Type>();
    assert_eq!(kinds.values().to_vec(), vec![1, 1, 1, 2, 3, 4, 5, 1, 1]);
    let value = col(schema::VALUE);
    let value = value.as_primitive::<Float64Type>();
    let int_value = col(schema::INT_VALUE);
    let int_value = int_value.as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!((value.value(0), int_value.is_null(0)), (1.5, true));
    assert_eq!((value.value(1), int_value.value(1)), (i64::MIN as f64, i64::MIN));
    assert!(value.is_null(2) && int_value.is_null(2), "unset value oneof is null in both");
    assert!(value.is_null(4), "histograms have no value");
    let temporality = col(schema::TEMPORALITY);
    let temporality = temporality.as_primitive::<arrow_array::types::Int32Type>();
    let t: Vec<Option<i32>> = temporality.iter().collect();
    assert_eq!(t, vec![None, None, None, Some(2), Some(1), Some(2), None, None, None]);
    let mono = col(schema::IS_MONOTONIC);
    let mono: Vec<Option<bool>> = mono.as_boolean().iter().collect();
    assert_eq!(mono[3], Some(true));
    assert_eq!(mono.iter().filter(|m| m.is_some()).count(), 1, "only sums have is_monotonic");
    let time = crate::arrow::time_column(&b).unwrap();
    assert_eq!(time.value(1) as u64, u64::MAX, "u64 bit pattern kept");
    let sum = col(schema::SUM);
    let sum = sum.as_primitive::<Float64Type>();
    assert!(sum.is_null(4) && sum.value(5) == 12.5 && sum.value(6) == 10.0);
    let buckets = col(schema::BUCKET_COUNTS);
    let buckets = buckets.as_list::<i32>();
    assert!(buckets.is_null(0) && buckets.is_valid(4) && buckets.is_null(5));
    let neg = col(schema::EXP_NEGATIVE_OFFSET);
    assert!(neg.is_null(5), "absent negative buckets are null");
    let quantiles = col(schema::QUANTILES);
    let quantiles = quantiles.as_list::<i32>();
    assert!(quantiles.is_null(5) && quantiles.value(6).len() == 2);
    let exemplars = col(schema::EXEMPLARS);
    let exemplars = exemplars.as_list::<i32>();
    assert_eq!(exemplars.null_count(), 0, "exemplars are never null");
    assert_eq!((exemplars.value(0).len(), exemplars.value(1).len()), (2, 0));
    let idx = |n: &str| col(n).as_primitive::<arrow_array::types::UInt32Type>().values().to_vec();
    assert_eq!(idx(schema::RESOURCE_INDEX), vec![0, 0, 0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(idx(schema::SCOPE_INDEX), vec![0, 0, 0, 0, 1, 1, 1, 0, 0]);
    assert_eq!(idx(schema::METRIC_INDEX), vec![0, 0, 0, 1, 0, 1, 2, 0, 1]);
}

#[test]
fn service_attributes_are_promoted_only_when_strings() {
    let b = to_batch(&request()).unwrap();
    let name = b.column_by_name(schema::SERVICE_NAME).unwrap();
    let name = name.as_string::<i32>();
    assert_eq!((name.value(0), name.is_null(7)), ("vllm", true));
    assert!(b.column_by_name(schema::SERVICE_VERSION).unwrap().is_null(0), "int service.version not promoted");
    let res = b.column_by_name(schema::RESOURCE_ATTRIBUTES).unwrap().as_map();
    let keys: Vec<String> = crate::arrow::anyvalue::attributes_at(res, 0).unwrap().into_iter().map(|k| k.key).collect();
    assert_eq!(keys, vec!["host", "service.version"]);
}

#[test]
fn series_id_matches_series_module() {
    let req = request();
    let b = to_batch(&req).unwrap();
    let ids = b.column_by_name(schema::SERIES_ID).unwrap().as_primitive::<UInt64Type>().values().to_vec();
    let rm = &req.resource_metrics[0];
    let res = &rm.resource.as_ref().unwrap().attributes;
    let g = &rm.scope_metrics[0];
    let Some(Data::Gauge(gauge)) = &g.metrics[0].data else { panic!() };
    assert_eq!(ids[0], series_id(res, g.scope.as_ref(), "g", &gauge.data_points[0].attributes));
    assert_ne!(ids[0], ids[1], "different point attributes");
    // The id recomputed from the converted-back resource (promoted key moved) is the same.
    let back = row_resource(&b, 0).unwrap();
    let scope = row_scope(&b, 0).unwrap();
    assert_eq!(ids[1], series_id(&back.attributes, Some(&scope), "g", &row_attributes(&b, 1).unwrap()));
}

#[test]
fn row_helpers_read_one_row() {
    let b = to_batch(&request()).unwrap();
    let r = row_resource(&b, 2).unwrap();
    assert_eq!(r, expected().resource_metrics[0].resource.clone().unwrap());
    assert_eq!(row_scope(&b, 4).unwrap(), InstrumentationScope::default());
    assert_eq!(row_scope(&b, 0).unwrap().name, "a");
    assert_eq!(row_attributes(&b, 4).unwrap(), vec![kv("route", s("/v1"))]);
    assert!(row_resource(&b, 99).is_err());
}

#[test]
fn unknown_kind_code_is_a_schema_error() {
    let b = to_batch(&request()).unwrap();
    let i = b.schema().index_of(schema::KIND).unwrap();
    let mut cols = b.columns().to_vec();
    cols[i] = Arc::new(UInt8Array::from(vec![1, 1, 1, 2, 3, 4, 5, 9, 9]));
    let bad = RecordBatch::try_new(b.schema(), cols).unwrap();
    match from_batch(&bad) {
        Err(ConvError::Schema(m)) => assert!(m.contains("unknown metric kind code 9"), "{m}"),
        other => panic!("expected a schema error, got {other:?}"),
    }
}

#[test]
fn projected_batches_convert_and_required_columns_are_checked() {
    let b = to_batch(&request()).unwrap();
    let keep = |names: &[&str]| {
        let idx: Vec<usize> = names.iter().map(|n| b.schema().index_of(n).unwrap()).collect();
        b.project(&idx).unwrap()
    };
    let p = keep(&[schema::TIME, schema::METRIC_NAME, schema::KIND, schema::VALUE, schema::METRIC_INDEX]);
    let back = from_batch(&p).unwrap();
    assert_eq!(back.resource_metrics.len(), 1, "no resource_index: one resource");
    let scope = &back.resource_metrics[0].scope_metrics[0];
    let names: Vec<&str> = scope.metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, vec!["g", "s", "h", "e", "q", "g", "g"]);
    let Some(Data::Gauge(g)) = &scope.metrics[0].data else { panic!() };
    assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(1.5)));
    assert_eq!(g.data_points[1].time_unix_nano, u64::MAX);
    for missing in [schema::TIME, schema::METRIC_NAME, schema::KIND] {
        let names: Vec<&str> =
            [schema::TIME, schema::METRIC_NAME, schema::KIND].into_iter().filter(|n| *n != missing).collect();
        assert!(matches!(from_batch(&keep(&names)), Err(ConvError::Schema(m)) if m.contains(missing)));
    }
}

#[test]
fn metrics_without_points_have_no_rows() {
    let mut req = request();
    req.resource_metrics[0].scope_metrics[0].metrics.push(Metric { name: "empty".into(), ..Default::default() });
    req.resource_metrics.push(ResourceMetrics::default());
    let b = to_batch(&req).unwrap();
    assert_eq!(b.num_rows(), 9);
    assert_eq!(from_batch(&b).unwrap(), expected());
    let empty = to_batch(&ExportMetricsServiceRequest::default()).unwrap();
    assert_eq!((empty.num_rows(), empty.schema()), (0, schema::metrics_schema()));
    assert_eq!(from_batch(&empty).unwrap(), ExportMetricsServiceRequest::default());
}

/// A request shaped as derived output is: gauges and a sum of double and int points, two
/// resources (one repeated after the other), two scopes in the first.
fn derived_request() -> ExportMetricsServiceRequest {
    let res = |name: &str| Resource {
        attributes: vec![kv("service.name", s(name)), kv("host.name", s("h"))],
        ..Default::default()
    };
    let scope = |n: &str| InstrumentationScope { name: n.into(), version: "1".into(), ..Default::default() };
    let dp = |t: u64, v: f64, a: &str| NumberDataPoint {
        attributes: vec![kv("metric", s(a))],
        time_unix_nano: t,
        value: Some(number_data_point::Value::AsDouble(v)),
        ..Default::default()
    };
    let gauge = |name: &str, unit: &str, points: Vec<NumberDataPoint>| Metric {
        name: name.into(),
        unit: unit.into(),
        data: Some(Data::Gauge(Gauge { data_points: points })),
        ..Default::default()
    };
    let int_sum = Metric {
        name: "derived.count".into(),
        description: "a sum".into(),
        data: Some(Data::Sum(Sum {
            data_points: vec![NumberDataPoint {
                time_unix_nano: 7,
                start_time_unix_nano: 3,
                flags: 1,
                value: Some(number_data_point::Value::AsInt(-4)),
                ..Default::default()
            }],
            aggregation_temporality: 2,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let sm = |sc: InstrumentationScope, metrics: Vec<Metric>| ScopeMetrics {
        scope: Some(sc),
        metrics,
        schema_url: String::new(),
    };
    let rm = |r: Resource, scope_metrics: Vec<ScopeMetrics>| ResourceMetrics {
        resource: Some(r),
        scope_metrics,
        schema_url: String::new(),
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![
            rm(
                res("a"),
                vec![
                    sm(
                        scope("s1"),
                        vec![
                            gauge("llm.anomaly.score", "", vec![dp(10, 4.2, "x"), dp(20, 1.0, "y")]),
                            gauge("llm.anomaly.level", "", vec![dp(10, 0.7, "x"), dp(20, 0.0, "y")]),
                        ],
                    ),
                    sm(scope("s2"), vec![gauge("llm.slo.breach_eta", "s", vec![dp(30, 86_400.0, "x")]), int_sum]),
                ],
            ),
            rm(res("b"), vec![sm(scope("s1"), vec![gauge("llm.anomaly.score", "", vec![dp(40, f64::NAN, "z")])])]),
            rm(res("a"), vec![sm(scope("s1"), vec![gauge("llm.anomaly.score", "", vec![dp(50, -1.5, "x")])])]),
        ],
    }
}

#[test]
fn the_row_builder_makes_the_batch_to_batch_makes() {
    let req = derived_request();
    let mut b = MetricsBatchBuilder::new();
    for rm in &req.resource_metrics {
        b.resource(rm.resource.as_ref(), &rm.schema_url).unwrap();
        for sm in &rm.scope_metrics {
            b.scope(sm.scope.as_ref(), &sm.schema_url).unwrap();
            for m in &sm.metrics {
                match &m.data {
                    Some(Data::Gauge(g)) => {
                        b.gauge(&m.name, &m.description, &m.unit).unwrap();
                        for p in &g.data_points {
                            let Some(number_data_point::Value::AsDouble(v)) = p.value else { panic!("double") };
                            b.double_point(&p.attributes, p.time_unix_nano, v).unwrap();
                        }
                    }
                    Some(Data::Sum(su)) => {
                        b.sum(&m.name, &m.description, &m.unit, su.aggregation_temporality, su.is_monotonic).unwrap();
                        for p in &su.data_points {
                            b.number_point(p).unwrap();
                        }
                    }
                    _ => panic!("only gauges and sums here"),
                }
            }
        }
    }
    assert_eq!(b.len(), 8);
    let built = b.finish().unwrap();
    let converted = to_batch(&req).unwrap();
    assert_eq!(built.num_rows(), 8);
    assert!(crate::arrow::same_bytes(&built, &converted), "{built:?}\n{converted:?}");
    // And a batch that differs in one value is not the same.
    let mut other = req.clone();
    other.resource_metrics[2].scope_metrics[0].metrics[0].data =
        Some(Data::Gauge(Gauge { data_points: vec![NumberDataPoint { time_unix_nano: 50, ..Default::default() }] }));
    assert!(!crate::arrow::same_bytes(&built, &to_batch(&other).unwrap()));
}

#[test]
fn the_row_builder_refuses_rows_without_their_parents() {
    let mut b = MetricsBatchBuilder::new();
    assert!(b.scope(None, "").is_err());
    b.resource(None, "").unwrap();
    assert!(b.gauge("g", "", "").is_err());
    b.scope(None, "").unwrap();
    assert!(b.double_point(&[], 1, 1.0).is_err());
    b.gauge("g", "", "").unwrap();
    b.double_point(&[], 1, 1.0).unwrap();
    assert_eq!(b.finish().unwrap().num_rows(), 1);
    assert_eq!(MetricsBatchBuilder::new().finish().unwrap().num_rows(), 0);
}
