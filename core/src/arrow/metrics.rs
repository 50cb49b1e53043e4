//! Metrics ⇄ Arrow: one row per data point (schema in [`super::schema::metrics_schema`]).
//!
//! Rows follow the request order (resource → scope → metric → point). Resource, scope and metric
//! columns are built once per resource / scope / metric and expanded to rows with `take`; point
//! columns are appended row by row into builders sized up front.

use super::ConvError;
use super::anyvalue::{
    AttributesBuilder, AttributesReader, ResourceScopeBuilder, ResourceScopeReader, bin_at, bool_at, finish_offsets,
    index_u32, list_entries, list_item, list_struct, opt_attrs, opt_child, opt_col, prim_at, read_attrs, req_col,
    str_at, struct_fields, timestamps,
};
use super::schema::{self, kind};
use super::series::SeriesHasher;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    UInt64Builder,
};
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Float64Array, Int32Array, Int64Array, ListArray, MapArray,
    PrimitiveArray, RecordBatch, StringArray, StructArray, TimestampNanosecondArray, UInt8Array, UInt32Array,
    UInt64Array,
};
use arrow_buffer::{NullBufferBuilder, OffsetBufferBuilder};
use arrow_schema::FieldRef;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exemplar, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::iter::repeat_n;
use std::sync::Arc;

// ---- OTLP → Arrow ----------------------------------------------------------------------------

/// Converts a metrics export request to a batch of the metrics schema.
pub fn to_batch(req: &ExportMetricsServiceRequest) -> Result<RecordBatch, ConvError> {
    let schema = schema::metrics_schema();
    let sizes = Sizes::of(req);
    let mut rs = ResourceScopeBuilder::with_capacity(sizes.rows, req.resource_metrics.len(), sizes.scopes);
    let mut metrics = MetricTable::with_capacity(sizes.metrics);
    let mut points = PointColumns::with_capacity(&sizes);
    let mut hasher = SeriesHasher::default();
    let mut metric_index = Vec::with_capacity(sizes.rows);
    let mut metric_take = Vec::with_capacity(sizes.rows);
    for (ri, rm) in req.resource_metrics.iter().enumerate() {
        let ri = index_u32(ri)?;
        rs.add_resource(rm.resource.as_ref(), &rm.schema_url);
        let res_attrs = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        for (si, sm) in rm.scope_metrics.iter().enumerate() {
            let si = index_u32(si)?;
            rs.add_scope(sm.scope.as_ref(), &sm.schema_url);
            for (mi, m) in sm.metrics.iter().enumerate() {
                let mi = index_u32(mi)?;
                let n = point_count(m);
                if n == 0 {
                    continue;
                }
                let table_row = metrics.add(m)?;
                hasher.set_prefix(res_attrs, sm.scope.as_ref(), &m.name);
                points.push_metric(m, &mut hasher);
                rs.push_rows(ri, si, n);
                metric_index.extend(repeat_n(mi, n));
                metric_take.extend(repeat_n(table_row, n));
            }
        }
    }
    let mut columns = rs.finish()?;
    columns.push(Arc::new(UInt32Array::from(metric_index)));
    columns.push(Arc::new(UInt64Array::from(std::mem::take(&mut points.series_id))));
    columns.extend(metrics.finish(&UInt32Array::from(metric_take))?);
    columns.extend(points.finish(&schema)?);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Sizes of a request, for builder capacities.
struct Sizes {
    rows: usize,
    scopes: usize,
    metrics: usize,
    attr_entries: usize,
    exemplars: usize,
}

impl Sizes {
    fn of(req: &ExportMetricsServiceRequest) -> Sizes {
        let mut s = Sizes { rows: 0, scopes: 0, metrics: 0, attr_entries: 0, exemplars: 0 };
        for rm in &req.resource_metrics {
            s.scopes += rm.scope_metrics.len();
            for sm in &rm.scope_metrics {
                s.metrics += sm.metrics.len();
                for m in &sm.metrics {
                    s.rows += point_count(m);
                    for_each_point(m, |attrs, exemplars| {
                        s.attr_entries += attrs.len();
                        s.exemplars += exemplars;
                    });
                }
            }
        }
        s
    }
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

/// Calls `f(attributes, exemplar count)` for every point of `m`.
fn for_each_point(m: &Metric, mut f: impl FnMut(&[KeyValue], usize)) {
    match &m.data {
        None => {}
        Some(Data::Gauge(Gauge { data_points: p })) | Some(Data::Sum(Sum { data_points: p, .. })) => {
            p.iter().for_each(|p| f(&p.attributes, p.exemplars.len()))
        }
        Some(Data::Histogram(h)) => h.data_points.iter().for_each(|p| f(&p.attributes, p.exemplars.len())),
        Some(Data::ExponentialHistogram(h)) => h.data_points.iter().for_each(|p| f(&p.attributes, p.exemplars.len())),
        Some(Data::Summary(s)) => s.data_points.iter().for_each(|p| f(&p.attributes, 0)),
    }
}

/// Metric-level columns, one entry per metric (expanded to rows with `take`).
struct MetricTable {
    name: StringBuilder,
    description: StringBuilder,
    unit: StringBuilder,
    metadata: AttributesBuilder,
    kind: Vec<u8>,
    temporality: Int32Builder,
    is_monotonic: BooleanBuilder,
}

impl MetricTable {
    fn with_capacity(n: usize) -> Self {
        MetricTable {
            name: StringBuilder::with_capacity(n, n * 24),
            description: StringBuilder::with_capacity(n, n * 24),
            unit: StringBuilder::with_capacity(n, n * 4),
            metadata: AttributesBuilder::with_capacity(n, 0),
            kind: Vec::with_capacity(n),
            temporality: Int32Builder::with_capacity(n),
            is_monotonic: BooleanBuilder::with_capacity(n),
        }
    }

    /// Adds a metric (which has data); returns its entry index.
    fn add(&mut self, m: &Metric) -> Result<u32, ConvError> {
        let (k, temporality, monotonic) = match &m.data {
            Some(Data::Gauge(_)) | None => (kind::GAUGE, None, None),
            Some(Data::Sum(s)) => (kind::SUM, Some(s.aggregation_temporality), Some(s.is_monotonic)),
            Some(Data::Histogram(h)) => (kind::HISTOGRAM, Some(h.aggregation_temporality), None),
            Some(Data::ExponentialHistogram(h)) => (kind::EXPONENTIAL_HISTOGRAM, Some(h.aggregation_temporality), None),
            Some(Data::Summary(_)) => (kind::SUMMARY, None, None),
        };
        let index = index_u32(self.kind.len())?;
        self.name.append_value(&m.name);
        self.description.append_value(&m.description);
        self.unit.append_value(&m.unit);
        self.metadata.append(&m.metadata);
        self.kind.push(k);
        self.temporality.append_option(temporality);
        self.is_monotonic.append_option(monotonic);
        Ok(index)
    }

    /// metric_name … is_monotonic, expanded to rows.
    fn finish(mut self, rows: &UInt32Array) -> Result<Vec<ArrayRef>, ConvError> {
        let take = |a: ArrayRef| arrow_select::take::take(a.as_ref(), rows, None);
        Ok(vec![
            take(Arc::new(self.name.finish()))?,
            take(Arc::new(self.description.finish()))?,
            take(Arc::new(self.unit.finish()))?,
            take(Arc::new(self.metadata.finish()?))?,
            take(Arc::new(UInt8Array::from(self.kind)))?,
            take(Arc::new(self.temporality.finish()))?,
            take(Arc::new(self.is_monotonic.finish()))?,
        ])
    }
}

/// Per-point columns.
struct PointColumns {
    series_id: Vec<u64>,
    time: Vec<i64>,
    start: Vec<i64>,
    attrs: AttributesBuilder,
    flags: Vec<u32>,
    value: Float64Builder,
    int_value: Int64Builder,
    count: UInt64Builder,
    sum: Float64Builder,
    min: Float64Builder,
    max: Float64Builder,
    bucket_counts: ListBuilder<UInt64Builder>,
    explicit_bounds: ListBuilder<Float64Builder>,
    exp_scale: Int32Builder,
    exp_zero_count: UInt64Builder,
    exp_zero_threshold: Float64Builder,
    exp_pos_offset: Int32Builder,
    exp_pos_counts: ListBuilder<UInt64Builder>,
    exp_neg_offset: Int32Builder,
    exp_neg_counts: ListBuilder<UInt64Builder>,
    quantiles: QuantilesBuilder,
    exemplars: ExemplarsBuilder,
}

impl PointColumns {
    fn with_capacity(s: &Sizes) -> Self {
        let n = s.rows;
        PointColumns {
            series_id: Vec::with_capacity(n),
            time: Vec::with_capacity(n),
            start: Vec::with_capacity(n),
            attrs: AttributesBuilder::with_capacity(n, s.attr_entries),
            flags: Vec::with_capacity(n),
            value: Float64Builder::with_capacity(n),
            int_value: Int64Builder::with_capacity(n),
            count: UInt64Builder::with_capacity(n),
            sum: Float64Builder::with_capacity(n),
            min: Float64Builder::with_capacity(n),
            max: Float64Builder::with_capacity(n),
            bucket_counts: ListBuilder::with_capacity(UInt64Builder::new(), n),
            explicit_bounds: ListBuilder::with_capacity(Float64Builder::new(), n),
            exp_scale: Int32Builder::with_capacity(n),
            exp_zero_count: UInt64Builder::with_capacity(n),
            exp_zero_threshold: Float64Builder::with_capacity(n),
            exp_pos_offset: Int32Builder::with_capacity(n),
            exp_pos_counts: ListBuilder::with_capacity(UInt64Builder::new(), n),
            exp_neg_offset: Int32Builder::with_capacity(n),
            exp_neg_counts: ListBuilder::with_capacity(UInt64Builder::new(), n),
            quantiles: QuantilesBuilder::with_capacity(n),
            exemplars: ExemplarsBuilder::with_capacity(n, s.exemplars),
        }
    }

    fn push_metric(&mut self, m: &Metric, hasher: &mut SeriesHasher) {
        match &m.data {
            None => {}
            Some(Data::Gauge(Gauge { data_points })) | Some(Data::Sum(Sum { data_points, .. })) => {
                for p in data_points {
                    self.common(hasher, &p.attributes, p.time_unix_nano, p.start_time_unix_nano, p.flags);
                    self.exemplars.append(&p.exemplars);
                    self.number(p.value.as_ref());
                }
            }
            Some(Data::Histogram(h)) => {
                for p in &h.data_points {
                    self.common(hasher, &p.attributes, p.time_unix_nano, p.start_time_unix_nano, p.flags);
                    self.exemplars.append(&p.exemplars);
                    self.histogram(p);
                }
            }
            Some(Data::ExponentialHistogram(h)) => {
                for p in &h.data_points {
                    self.common(hasher, &p.attributes, p.time_unix_nano, p.start_time_unix_nano, p.flags);
                    self.exemplars.append(&p.exemplars);
                    self.exponential(p);
                }
            }
            Some(Data::Summary(s)) => {
                for p in &s.data_points {
                    self.common(hasher, &p.attributes, p.time_unix_nano, p.start_time_unix_nano, p.flags);
                    self.exemplars.append(&[]);
                    self.summary(p);
                }
            }
        }
    }

    fn common(&mut self, hasher: &mut SeriesHasher, attrs: &[KeyValue], time: u64, start: u64, flags: u32) {
        self.series_id.push(hasher.hash(attrs));
        self.time.push(time as i64);
        self.start.push(start as i64);
        self.attrs.append(attrs);
        self.flags.push(flags);
    }

    fn number(&mut self, v: Option<&number_data_point::Value>) {
        match v {
            Some(number_data_point::Value::AsDouble(d)) => {
                self.value.append_value(*d);
                self.int_value.append_null();
            }
            Some(number_data_point::Value::AsInt(i)) => {
                self.value.append_value(*i as f64);
                self.int_value.append_value(*i);
            }
            None => {
                self.value.append_null();
                self.int_value.append_null();
            }
        }
        self.stats(None, None, None, None);
        self.no_histogram();
        self.no_exponential();
        self.quantiles.append(None);
    }

    fn histogram(&mut self, p: &HistogramDataPoint) {
        self.no_number();
        self.stats(Some(p.count), p.sum, p.min, p.max);
        self.bucket_counts.values().append_slice(&p.bucket_counts);
        self.bucket_counts.append(true);
        self.explicit_bounds.values().append_slice(&p.explicit_bounds);
        self.explicit_bounds.append(true);
        self.no_exponential();
        self.quantiles.append(None);
    }

    fn exponential(&mut self, p: &ExponentialHistogramDataPoint) {
        self.no_number();
        self.stats(Some(p.count), p.sum, p.min, p.max);
        self.no_histogram();
        self.exp_scale.append_value(p.scale);
        self.exp_zero_count.append_value(p.zero_count);
        self.exp_zero_threshold.append_value(p.zero_threshold);
        push_buckets(&mut self.exp_pos_offset, &mut self.exp_pos_counts, p.positive.as_ref());
        push_buckets(&mut self.exp_neg_offset, &mut self.exp_neg_counts, p.negative.as_ref());
        self.quantiles.append(None);
    }

    fn summary(&mut self, p: &SummaryDataPoint) {
        self.no_number();
        self.stats(Some(p.count), Some(p.sum), None, None);
        self.no_histogram();
        self.no_exponential();
        self.quantiles.append(Some(&p.quantile_values));
    }

    fn no_number(&mut self) {
        self.value.append_null();
        self.int_value.append_null();
    }

    fn stats(&mut self, count: Option<u64>, sum: Option<f64>, min: Option<f64>, max: Option<f64>) {
        self.count.append_option(count);
        self.sum.append_option(sum);
        self.min.append_option(min);
        self.max.append_option(max);
    }

    fn no_histogram(&mut self) {
        self.bucket_counts.append(false);
        self.explicit_bounds.append(false);
    }

    fn no_exponential(&mut self) {
        self.exp_scale.append_null();
        self.exp_zero_count.append_null();
        self.exp_zero_threshold.append_null();
        push_buckets(&mut self.exp_pos_offset, &mut self.exp_pos_counts, None);
        push_buckets(&mut self.exp_neg_offset, &mut self.exp_neg_counts, None);
    }

    /// time_unix_nano … exemplars (series_id is taken out before).
    fn finish(mut self, schema: &arrow_schema::Schema) -> Result<Vec<ArrayRef>, ConvError> {
        Ok(vec![
            timestamps(self.time),
            timestamps(self.start),
            Arc::new(self.attrs.finish()?),
            Arc::new(UInt32Array::from(self.flags)),
            Arc::new(self.value.finish()),
            Arc::new(self.int_value.finish()),
            Arc::new(self.count.finish()),
            Arc::new(self.sum.finish()),
            Arc::new(self.min.finish()),
            Arc::new(self.max.finish()),
            Arc::new(self.bucket_counts.finish()),
            Arc::new(self.explicit_bounds.finish()),
            Arc::new(self.exp_scale.finish()),
            Arc::new(self.exp_zero_count.finish()),
            Arc::new(self.exp_zero_threshold.finish()),
            Arc::new(self.exp_pos_offset.finish()),
            Arc::new(self.exp_pos_counts.finish()),
            Arc::new(self.exp_neg_offset.finish()),
            Arc::new(self.exp_neg_counts.finish()),
            Arc::new(self.quantiles.finish(list_item(schema, schema::QUANTILES)?)?),
            Arc::new(self.exemplars.finish(list_item(schema, schema::EXEMPLARS)?)?),
        ])
    }
}

fn push_buckets(offset: &mut Int32Builder, counts: &mut ListBuilder<UInt64Builder>, b: Option<&Buckets>) {
    match b {
        Some(b) => {
            offset.append_value(b.offset);
            counts.values().append_slice(&b.bucket_counts);
            counts.append(true);
        }
        None => {
            offset.append_null();
            counts.append(false);
        }
    }
}

/// The quantiles list column (null for non-summary rows).
struct QuantilesBuilder {
    offsets: OffsetBufferBuilder<i32>,
    nulls: NullBufferBuilder,
    quantile: Vec<f64>,
    value: Vec<f64>,
}

impl QuantilesBuilder {
    fn with_capacity(rows: usize) -> Self {
        QuantilesBuilder {
            offsets: OffsetBufferBuilder::new(rows),
            nulls: NullBufferBuilder::new(rows),
            quantile: Vec::new(),
            value: Vec::new(),
        }
    }

    fn append(&mut self, q: Option<&[ValueAtQuantile]>) {
        self.nulls.append(q.is_some());
        let q = q.unwrap_or_default();
        self.quantile.extend(q.iter().map(|v| v.quantile));
        self.value.extend(q.iter().map(|v| v.value));
        self.offsets.push_length(q.len());
    }

    fn finish(mut self, item: FieldRef) -> Result<ListArray, ConvError> {
        let children: Vec<ArrayRef> =
            vec![Arc::new(Float64Array::from(self.quantile)), Arc::new(Float64Array::from(self.value))];
        let values = StructArray::try_new(struct_fields(&item)?, children, None)?;
        Ok(ListArray::try_new(item, finish_offsets(self.offsets)?, Arc::new(values), self.nulls.finish())?)
    }
}

/// The exemplars list column (never null).
struct ExemplarsBuilder {
    offsets: OffsetBufferBuilder<i32>,
    time: Vec<i64>,
    value: Float64Builder,
    int_value: Int64Builder,
    span_id: BinaryBuilder,
    trace_id: BinaryBuilder,
    attrs: AttributesBuilder,
}

impl ExemplarsBuilder {
    fn with_capacity(rows: usize, n: usize) -> Self {
        ExemplarsBuilder {
            offsets: OffsetBufferBuilder::new(rows),
            time: Vec::with_capacity(n),
            value: Float64Builder::with_capacity(n),
            int_value: Int64Builder::with_capacity(n),
            span_id: BinaryBuilder::with_capacity(n, n * 8),
            trace_id: BinaryBuilder::with_capacity(n, n * 16),
            attrs: AttributesBuilder::with_capacity(n, 0),
        }
    }

    fn append(&mut self, exemplars: &[Exemplar]) {
        for e in exemplars {
            self.time.push(e.time_unix_nano as i64);
            match e.value {
                Some(exemplar::Value::AsDouble(d)) => {
                    self.value.append_value(d);
                    self.int_value.append_null();
                }
                Some(exemplar::Value::AsInt(i)) => {
                    self.value.append_value(i as f64);
                    self.int_value.append_value(i);
                }
                None => {
                    self.value.append_null();
                    self.int_value.append_null();
                }
            }
            self.span_id.append_value(&e.span_id);
            self.trace_id.append_value(&e.trace_id);
            self.attrs.append(&e.filtered_attributes);
        }
        self.offsets.push_length(exemplars.len());
    }

    fn finish(mut self, item: FieldRef) -> Result<ListArray, ConvError> {
        let children: Vec<ArrayRef> = vec![
            timestamps(self.time),
            Arc::new(self.value.finish()),
            Arc::new(self.int_value.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(self.trace_id.finish()),
            Arc::new(self.attrs.finish()?),
        ];
        let values = StructArray::try_new(struct_fields(&item)?, children, None)?;
        Ok(ListArray::try_new(item, finish_offsets(self.offsets)?, Arc::new(values), None)?)
    }
}

// ---- Arrow → OTLP ----------------------------------------------------------------------------

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

fn check_row(batch: &RecordBatch, row: usize) -> Result<(), ConvError> {
    if row < batch.num_rows() {
        Ok(())
    } else {
        Err(ConvError::Schema(format!("row {row} out of range (batch has {} rows)", batch.num_rows())))
    }
}

/// The resource of one row (of a metrics or spans batch): its attributes with the promoted
/// `service.*` columns appended.
pub fn row_resource(batch: &RecordBatch, row: usize) -> Result<Resource, ConvError> {
    check_row(batch, row)?;
    ResourceScopeReader::new(batch)?.resource(row)
}

/// The instrumentation scope of one row (of a metrics or spans batch).
pub fn row_scope(batch: &RecordBatch, row: usize) -> Result<InstrumentationScope, ConvError> {
    check_row(batch, row)?;
    ResourceScopeReader::new(batch)?.scope(row)
}

/// The point (or span) attributes of one row; empty when the batch has no attributes column.
pub fn row_attributes(batch: &RecordBatch, row: usize) -> Result<Vec<KeyValue>, ConvError> {
    check_row(batch, row)?;
    read_attrs(opt_attrs(batch, schema::ATTRIBUTES)?.as_ref(), row)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrow::series::series_id;
    use arrow_array::cast::AsArray;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;

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
        let keys: Vec<String> =
            crate::arrow::anyvalue::attributes_at(res, 0).unwrap().into_iter().map(|k| k.key).collect();
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
}
