//! Arrow → OTLP: [`from_batch`] regroups a metrics batch's rows into resources, scopes and metrics.

use crate::arrow::ConvError;
use crate::arrow::anyvalue::{
    AttributesReader, ResourceScopeReader, bin_at, bool_at, list_entries, list_struct, opt_attrs, opt_child, opt_col,
    prim_at, read_attrs, req_col, str_at,
};
use crate::arrow::schema::{self, kind};
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{
    Array, BinaryArray, BooleanArray, Float64Array, Int32Array, Int64Array, ListArray, MapArray, PrimitiveArray,
    RecordBatch, StringArray, TimestampNanosecondArray, UInt8Array, UInt32Array, UInt64Array,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exemplar, number_data_point,
};

/// Converts a batch of the metrics schema back to an export request.
///
/// Columns are looked up by name; absent optional columns read as null/default. Rows regroup
/// into a new resource when `resource_index` changes, a new scope when `scope_index` changes
/// (or the resource did), a new metric when `metric_index`, `metric_name` or `kind` changes.
pub fn from_batch(batch: &RecordBatch) -> Result<ExportMetricsServiceRequest, ConvError> {
    let r = MetricsReader::new(batch)?;
    let mut out: Vec<ResourceMetrics> = Vec::new();
    let mut prev: Option<(u32, u32, u32, &str, u8)> = None;
    for row in 0..batch.num_rows() {
        let key = (r.rs.resource_index(row), r.rs.scope_index(row), r.metric_index(row), r.name(row), r.kind(row)?);
        let new_resource = prev.is_none_or(|p| p.0 != key.0);
        let new_scope = new_resource || prev.is_some_and(|p| p.1 != key.1);
        let new_metric = new_scope || prev.is_some_and(|p| (p.2, p.3, p.4) != (key.2, key.3, key.4));
        prev = Some(key);
        if new_resource {
            out.push(ResourceMetrics {
                resource: Some(r.rs.resource(row)?),
                scope_metrics: Vec::new(),
                schema_url: r.rs.resource_schema_url(row),
            });
        }
        let rm = last(&mut out)?;
        if new_scope {
            rm.scope_metrics.push(ScopeMetrics {
                scope: Some(r.rs.scope(row)?),
                metrics: Vec::new(),
                schema_url: r.rs.scope_schema_url(row),
            });
        }
        let sm = last(&mut rm.scope_metrics)?;
        if new_metric {
            sm.metrics.push(r.metric(row, key.4)?);
        }
        let m = last(&mut sm.metrics)?;
        r.push_point(row, &mut m.data)?;
    }
    Ok(ExportMetricsServiceRequest { resource_metrics: out })
}

fn last<T>(v: &mut [T]) -> Result<&mut T, ConvError> {
    v.last_mut().ok_or_else(|| ConvError::Schema("internal: regrouping lost its parent".into()))
}

/// A list column of primitives, with its values array looked up once.
struct PrimList<'a, T: arrow_array::ArrowPrimitiveType> {
    list: &'a ListArray,
    values: &'a PrimitiveArray<T>,
}

impl<'a, T: arrow_array::ArrowPrimitiveType> PrimList<'a, T> {
    fn new(batch: &'a RecordBatch, name: &str) -> Result<Option<Self>, ConvError> {
        let Some(list) = opt_col::<ListArray>(batch, name)? else { return Ok(None) };
        let values = list
            .values()
            .as_any()
            .downcast_ref::<PrimitiveArray<T>>()
            .ok_or_else(|| ConvError::Schema(format!("column {name} has unexpected item type")))?;
        Ok(Some(PrimList { list, values }))
    }

    /// The values of `row`; `None` when the column is absent or the row null.
    fn get(this: Option<&Self>, row: usize) -> Result<Option<Vec<T::Native>>, ConvError> {
        let Some(l) = this else { return Ok(None) };
        if l.list.is_null(row) {
            return Ok(None);
        }
        let range = list_entries(l.list, row)?;
        Ok(Some(l.values.values().get(range).map(<[T::Native]>::to_vec).unwrap_or_default()))
    }
}

struct QuantilesReader<'a> {
    list: &'a ListArray,
    quantile: Option<&'a Float64Array>,
    value: Option<&'a Float64Array>,
}

struct ExemplarsReader<'a> {
    list: &'a ListArray,
    time: Option<&'a TimestampNanosecondArray>,
    value: Option<&'a Float64Array>,
    int_value: Option<&'a Int64Array>,
    span_id: Option<&'a BinaryArray>,
    trace_id: Option<&'a BinaryArray>,
    attrs: Option<AttributesReader<'a>>,
}

/// Every column of a metrics batch, looked up once.
struct MetricsReader<'a> {
    rs: ResourceScopeReader<'a>,
    metric_index: Option<&'a UInt32Array>,
    name: &'a StringArray,
    description: Option<&'a StringArray>,
    unit: Option<&'a StringArray>,
    metadata: Option<AttributesReader<'a>>,
    kind: &'a UInt8Array,
    temporality: Option<&'a Int32Array>,
    is_monotonic: Option<&'a BooleanArray>,
    time: &'a TimestampNanosecondArray,
    start: Option<&'a TimestampNanosecondArray>,
    attrs: Option<AttributesReader<'a>>,
    flags: Option<&'a UInt32Array>,
    value: Option<&'a Float64Array>,
    int_value: Option<&'a Int64Array>,
    count: Option<&'a UInt64Array>,
    sum: Option<&'a Float64Array>,
    min: Option<&'a Float64Array>,
    max: Option<&'a Float64Array>,
    bucket_counts: Option<PrimList<'a, UInt64Type>>,
    explicit_bounds: Option<PrimList<'a, Float64Type>>,
    exp_scale: Option<&'a Int32Array>,
    exp_zero_count: Option<&'a UInt64Array>,
    exp_zero_threshold: Option<&'a Float64Array>,
    exp_pos_offset: Option<&'a Int32Array>,
    exp_pos_counts: Option<PrimList<'a, UInt64Type>>,
    exp_neg_offset: Option<&'a Int32Array>,
    exp_neg_counts: Option<PrimList<'a, UInt64Type>>,
    quantiles: Option<QuantilesReader<'a>>,
    exemplars: Option<ExemplarsReader<'a>>,
}

impl<'a> MetricsReader<'a> {
    fn new(b: &'a RecordBatch) -> Result<Self, ConvError> {
        let quantiles = list_struct(b, schema::QUANTILES)?.map(|(list, s)| -> Result<_, ConvError> {
            Ok(QuantilesReader { list, quantile: opt_child(s, "quantile")?, value: opt_child(s, "value")? })
        });
        let exemplars = list_struct(b, schema::EXEMPLARS)?.map(|(list, s)| -> Result<_, ConvError> {
            Ok(ExemplarsReader {
                list,
                time: opt_child(s, schema::TIME)?,
                value: opt_child(s, schema::VALUE)?,
                int_value: opt_child(s, schema::INT_VALUE)?,
                span_id: opt_child(s, schema::SPAN_ID)?,
                trace_id: opt_child(s, schema::TRACE_ID)?,
                attrs: opt_child::<MapArray>(s, "filtered_attributes")?.map(AttributesReader::new).transpose()?,
            })
        });
        Ok(MetricsReader {
            rs: ResourceScopeReader::new(b)?,
            metric_index: opt_col(b, schema::METRIC_INDEX)?,
            name: req_col(b, schema::METRIC_NAME)?,
            description: opt_col(b, schema::METRIC_DESCRIPTION)?,
            unit: opt_col(b, schema::METRIC_UNIT)?,
            metadata: opt_attrs(b, schema::METRIC_METADATA)?,
            kind: req_col(b, schema::KIND)?,
            temporality: opt_col(b, schema::TEMPORALITY)?,
            is_monotonic: opt_col(b, schema::IS_MONOTONIC)?,
            time: req_col(b, schema::TIME)?,
            start: opt_col(b, schema::START_TIME)?,
            attrs: opt_attrs(b, schema::ATTRIBUTES)?,
            flags: opt_col(b, schema::FLAGS)?,
            value: opt_col(b, schema::VALUE)?,
            int_value: opt_col(b, schema::INT_VALUE)?,
            count: opt_col(b, schema::COUNT)?,
            sum: opt_col(b, schema::SUM)?,
            min: opt_col(b, schema::MIN)?,
            max: opt_col(b, schema::MAX)?,
            bucket_counts: PrimList::new(b, schema::BUCKET_COUNTS)?,
            explicit_bounds: PrimList::new(b, schema::EXPLICIT_BOUNDS)?,
            exp_scale: opt_col(b, schema::EXP_SCALE)?,
            exp_zero_count: opt_col(b, schema::EXP_ZERO_COUNT)?,
            exp_zero_threshold: opt_col(b, schema::EXP_ZERO_THRESHOLD)?,
            exp_pos_offset: opt_col(b, schema::EXP_POSITIVE_OFFSET)?,
            exp_pos_counts: PrimList::new(b, schema::EXP_POSITIVE_COUNTS)?,
            exp_neg_offset: opt_col(b, schema::EXP_NEGATIVE_OFFSET)?,
            exp_neg_counts: PrimList::new(b, schema::EXP_NEGATIVE_COUNTS)?,
            quantiles: quantiles.transpose()?,
            exemplars: exemplars.transpose()?,
        })
    }

    fn metric_index(&self, row: usize) -> u32 {
        prim_at(self.metric_index, row).unwrap_or(0)
    }

    fn name(&self, row: usize) -> &'a str {
        str_at(Some(self.name), row).unwrap_or_default()
    }

    fn kind(&self, row: usize) -> Result<u8, ConvError> {
        prim_at(Some(self.kind), row).ok_or_else(|| ConvError::Schema(format!("null {} at row {row}", schema::KIND)))
    }

    /// A metric (with no points yet) from the metric columns of `row`.
    fn metric(&self, row: usize, k: u8) -> Result<Metric, ConvError> {
        let temporality = prim_at(self.temporality, row).unwrap_or(0);
        let data = match k {
            kind::GAUGE => Data::Gauge(Gauge { data_points: Vec::new() }),
            kind::SUM => Data::Sum(Sum {
                data_points: Vec::new(),
                aggregation_temporality: temporality,
                is_monotonic: bool_at(self.is_monotonic, row).unwrap_or(false),
            }),
            kind::HISTOGRAM => {
                Data::Histogram(Histogram { data_points: Vec::new(), aggregation_temporality: temporality })
            }
            kind::EXPONENTIAL_HISTOGRAM => Data::ExponentialHistogram(ExponentialHistogram {
                data_points: Vec::new(),
                aggregation_temporality: temporality,
            }),
            kind::SUMMARY => Data::Summary(Summary { data_points: Vec::new() }),
            k => return Err(ConvError::Schema(format!("unknown metric kind code {k} at row {row}"))),
        };
        Ok(Metric {
            name: self.name(row).to_string(),
            description: str_at(self.description, row).unwrap_or_default().to_string(),
            unit: str_at(self.unit, row).unwrap_or_default().to_string(),
            metadata: read_attrs(self.metadata.as_ref(), row)?,
            data: Some(data),
        })
    }

    /// Appends the point of `row` to the metric's data (whose kind matches the row's).
    fn push_point(&self, row: usize, data: &mut Option<Data>) -> Result<(), ConvError> {
        let attributes = read_attrs(self.attrs.as_ref(), row)?;
        let time_unix_nano = prim_at(Some(self.time), row).unwrap_or(0) as u64;
        let start_time_unix_nano = prim_at(self.start, row).unwrap_or(0) as u64;
        let flags = prim_at(self.flags, row).unwrap_or(0);
        let count = prim_at(self.count, row).unwrap_or(0);
        match data {
            Some(Data::Gauge(Gauge { data_points })) | Some(Data::Sum(Sum { data_points, .. })) => {
                let value = match (prim_at(self.int_value, row), prim_at(self.value, row)) {
                    (Some(i), _) => Some(number_data_point::Value::AsInt(i)),
                    (None, Some(d)) => Some(number_data_point::Value::AsDouble(d)),
                    (None, None) => None,
                };
                data_points.push(NumberDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    exemplars: self.exemplars(row)?,
                    flags,
                    value,
                });
            }
            Some(Data::Histogram(h)) => h.data_points.push(HistogramDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count,
                sum: prim_at(self.sum, row),
                bucket_counts: PrimList::get(self.bucket_counts.as_ref(), row)?.unwrap_or_default(),
                explicit_bounds: PrimList::get(self.explicit_bounds.as_ref(), row)?.unwrap_or_default(),
                exemplars: self.exemplars(row)?,
                flags,
                min: prim_at(self.min, row),
                max: prim_at(self.max, row),
            }),
            Some(Data::ExponentialHistogram(h)) => h.data_points.push(ExponentialHistogramDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count,
                sum: prim_at(self.sum, row),
                scale: prim_at(self.exp_scale, row).unwrap_or(0),
                zero_count: prim_at(self.exp_zero_count, row).unwrap_or(0),
                positive: buckets(self.exp_pos_offset, self.exp_pos_counts.as_ref(), row)?,
                negative: buckets(self.exp_neg_offset, self.exp_neg_counts.as_ref(), row)?,
                flags,
                exemplars: self.exemplars(row)?,
                min: prim_at(self.min, row),
                max: prim_at(self.max, row),
                zero_threshold: prim_at(self.exp_zero_threshold, row).unwrap_or(0.0),
            }),
            Some(Data::Summary(s)) => s.data_points.push(SummaryDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count,
                sum: prim_at(self.sum, row).unwrap_or(0.0),
                quantile_values: self.quantiles(row)?,
                flags,
            }),
            None => return Err(ConvError::Schema("internal: metric without data".into())),
        }
        Ok(())
    }

    fn exemplars(&self, row: usize) -> Result<Vec<Exemplar>, ConvError> {
        let Some(e) = &self.exemplars else { return Ok(Vec::new()) };
        if e.list.is_null(row) {
            return Ok(Vec::new());
        }
        list_entries(e.list, row)?
            .map(|j| {
                let value = match (prim_at(e.int_value, j), prim_at(e.value, j)) {
                    (Some(i), _) => Some(exemplar::Value::AsInt(i)),
                    (None, Some(d)) => Some(exemplar::Value::AsDouble(d)),
                    (None, None) => None,
                };
                Ok(Exemplar {
                    filtered_attributes: read_attrs(e.attrs.as_ref(), j)?,
                    time_unix_nano: prim_at(e.time, j).unwrap_or(0) as u64,
                    span_id: bin_at(e.span_id, j).unwrap_or_default().to_vec(),
                    trace_id: bin_at(e.trace_id, j).unwrap_or_default().to_vec(),
                    value,
                })
            })
            .collect()
    }

    fn quantiles(&self, row: usize) -> Result<Vec<ValueAtQuantile>, ConvError> {
        let Some(q) = &self.quantiles else { return Ok(Vec::new()) };
        if q.list.is_null(row) {
            return Ok(Vec::new());
        }
        Ok(list_entries(q.list, row)?
            .map(|j| ValueAtQuantile {
                quantile: prim_at(q.quantile, j).unwrap_or(0.0),
                value: prim_at(q.value, j).unwrap_or(0.0),
            })
            .collect())
    }
}

fn buckets(
    offset: Option<&Int32Array>,
    counts: Option<&PrimList<'_, UInt64Type>>,
    row: usize,
) -> Result<Option<Buckets>, ConvError> {
    let offset = prim_at(offset, row);
    let counts = PrimList::get(counts, row)?;
    if offset.is_none() && counts.is_none() {
        return Ok(None);
    }
    Ok(Some(Buckets { offset: offset.unwrap_or(0), bucket_counts: counts.unwrap_or_default() }))
}
