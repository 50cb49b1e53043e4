//! OTLP → Arrow: [`to_batch`] converts a request; [`MetricsBatchBuilder`] appends rows one
//! by one (derived data), laying them out exactly as [`to_batch`] would.

use crate::arrow::ConvError;
use crate::arrow::anyvalue::{
    AttributesBuilder, ResourceScopeBuilder, finish_offsets, index_u32, list_item, struct_fields, timestamps,
};
use crate::arrow::schema::{self, kind};
use crate::arrow::series::SeriesHasher;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    UInt64Builder,
};
use arrow_array::{ArrayRef, Float64Array, ListArray, RecordBatch, StructArray, UInt8Array, UInt32Array, UInt64Array};
use arrow_buffer::{NullBufferBuilder, OffsetBufferBuilder};
use arrow_schema::FieldRef;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogramDataPoint, Gauge, HistogramDataPoint, Metric, NumberDataPoint, Sum, SummaryDataPoint,
    exemplar, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::iter::repeat_n;
use std::sync::Arc;

/// Converts a metrics export request to a batch of the metrics schema.
pub fn to_batch(req: &ExportMetricsServiceRequest) -> Result<RecordBatch, ConvError> {
    let sizes = Sizes::of(req);
    let mut parts = Parts::with_capacity(&sizes, req.resource_metrics.len());
    for (ri, rm) in req.resource_metrics.iter().enumerate() {
        let ri = index_u32(ri)?;
        parts.rs.add_resource(rm.resource.as_ref(), &rm.schema_url);
        let res_attrs = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        for (si, sm) in rm.scope_metrics.iter().enumerate() {
            let si = index_u32(si)?;
            parts.rs.add_scope(sm.scope.as_ref(), &sm.schema_url);
            for (mi, m) in sm.metrics.iter().enumerate() {
                let mi = index_u32(mi)?;
                let n = point_count(m);
                if n == 0 {
                    continue;
                }
                let table_row = parts.metrics.add(m)?;
                parts.hasher.set_prefix(res_attrs, sm.scope.as_ref(), &m.name);
                parts.points.push_metric(m, &mut parts.hasher);
                parts.rows(Cursor { resource: ri, scope: si, metric: mi, table_row }, n);
            }
        }
    }
    parts.finish()
}

/// Where the next rows go: the resource and scope positions (as `resource_index` /
/// `scope_index`), the metric's position in its scope and its entry in the metric table.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    resource: u32,
    scope: u32,
    metric: u32,
    table_row: u32,
}

/// The columns of a metrics batch being built, shared by [`to_batch`] and
/// [`MetricsBatchBuilder`] so that both lay out the same rows identically.
struct Parts {
    rs: ResourceScopeBuilder,
    metrics: MetricTable,
    points: PointColumns,
    hasher: SeriesHasher,
    metric_index: Vec<u32>,
    metric_take: Vec<u32>,
}

impl Parts {
    fn with_capacity(sizes: &Sizes, resources: usize) -> Self {
        Parts {
            rs: ResourceScopeBuilder::with_capacity(sizes.rows, resources, sizes.scopes),
            metrics: MetricTable::with_capacity(sizes.metrics),
            points: PointColumns::with_capacity(sizes),
            hasher: SeriesHasher::default(),
            metric_index: Vec::with_capacity(sizes.rows),
            metric_take: Vec::with_capacity(sizes.rows),
        }
    }

    /// Records that `n` point rows were appended at `at`.
    fn rows(&mut self, at: Cursor, n: usize) {
        self.rs.push_rows(at.resource, at.scope, n);
        self.metric_index.extend(repeat_n(at.metric, n));
        self.metric_take.extend(repeat_n(at.table_row, n));
    }

    fn finish(mut self) -> Result<RecordBatch, ConvError> {
        let schema = schema::metrics_schema();
        let mut columns = self.rs.finish()?;
        columns.push(Arc::new(UInt32Array::from(self.metric_index)));
        columns.push(Arc::new(UInt64Array::from(std::mem::take(&mut self.points.series_id))));
        columns.extend(self.metrics.finish(&UInt32Array::from(self.metric_take))?);
        columns.extend(self.points.finish(&schema)?);
        Ok(RecordBatch::try_new(schema, columns)?)
    }
}

/// Builds a metrics-schema batch by appending rows: a resource, its scopes, their metrics and
/// each metric's points, in that order. The batch is the one [`to_batch`] makes of the request
/// these calls describe (same rows, same columns), so derived data is written as Arrow without
/// an OTLP request in between. A scope needs a resource, a metric a scope and a point a metric
/// before it; otherwise the call fails with [`ConvError::Schema`].
pub struct MetricsBatchBuilder {
    parts: Parts,
    /// Resources added, scopes of the open resource, metrics of the open scope.
    resources: u32,
    scopes: u32,
    metrics: u32,
    /// The open resource's attributes and the open scope, for the series ids.
    resource_attributes: Vec<KeyValue>,
    scope: Option<InstrumentationScope>,
    open: Open,
    rows: usize,
}

/// The innermost open element of a [`MetricsBatchBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Nothing,
    Resource,
    Scope,
    /// A metric, with its entry in the metric table.
    Metric(u32),
}

impl Default for MetricsBatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsBatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        let sizes = Sizes { rows: 0, scopes: 0, metrics: 0, attr_entries: 0, exemplars: 0 };
        MetricsBatchBuilder {
            parts: Parts::with_capacity(&sizes, 0),
            resources: 0,
            scopes: 0,
            metrics: 0,
            resource_attributes: Vec::new(),
            scope: None,
            open: Open::Nothing,
            rows: 0,
        }
    }

    /// Starts a resource (a ResourceMetrics); the scopes added next belong to it.
    pub fn resource(&mut self, resource: Option<&Resource>, schema_url: &str) -> Result<(), ConvError> {
        self.resources = next(self.resources)?;
        self.parts.rs.add_resource(resource, schema_url);
        self.resource_attributes = resource.map(|r| r.attributes.clone()).unwrap_or_default();
        self.scopes = 0;
        self.open = Open::Resource;
        Ok(())
    }

    /// Starts a scope (a ScopeMetrics) of the open resource; the metrics added next belong to it.
    pub fn scope(&mut self, scope: Option<&InstrumentationScope>, schema_url: &str) -> Result<(), ConvError> {
        if self.open == Open::Nothing {
            return Err(misuse("a scope before any resource"));
        }
        self.scopes = next(self.scopes)?;
        self.parts.rs.add_scope(scope, schema_url);
        self.scope = scope.cloned();
        self.metrics = 0;
        self.open = Open::Scope;
        Ok(())
    }

    /// Starts a gauge of the open scope; the points added next belong to it.
    pub fn gauge(&mut self, name: &str, description: &str, unit: &str) -> Result<(), ConvError> {
        self.metric(name, description, unit, (kind::GAUGE, None, None))
    }

    /// Starts a sum of the open scope with its temporality (OTLP enum value) and monotonicity.
    pub fn sum(
        &mut self,
        name: &str,
        description: &str,
        unit: &str,
        temporality: i32,
        monotonic: bool,
    ) -> Result<(), ConvError> {
        self.metric(name, description, unit, (kind::SUM, Some(temporality), Some(monotonic)))
    }

    fn metric(&mut self, name: &str, description: &str, unit: &str, k: MetricKindColumns) -> Result<(), ConvError> {
        if matches!(self.open, Open::Nothing | Open::Resource) {
            return Err(misuse("a metric before any scope"));
        }
        self.metrics = next(self.metrics)?;
        let table_row = self.parts.metrics.add_entry(name, description, unit, &[], k)?;
        self.parts.hasher.set_prefix(&self.resource_attributes, self.scope.as_ref(), name);
        self.open = Open::Metric(table_row);
        Ok(())
    }

    /// Appends a point with a double value (no start time, flags or exemplars) to the open metric.
    pub fn double_point(&mut self, attributes: &[KeyValue], time_unix_nano: u64, value: f64) -> Result<(), ConvError> {
        let at = self.cursor()?;
        let points = &mut self.parts.points;
        points.common(&mut self.parts.hasher, attributes, time_unix_nano, 0, 0);
        points.exemplars.append(&[]);
        points.number(Some(&number_data_point::Value::AsDouble(value)));
        self.parts.rows(at, 1);
        self.rows += 1;
        Ok(())
    }

    /// Appends a number point to the open metric (a gauge or a sum).
    pub fn number_point(&mut self, p: &NumberDataPoint) -> Result<(), ConvError> {
        let at = self.cursor()?;
        let points = &mut self.parts.points;
        points.common(&mut self.parts.hasher, &p.attributes, p.time_unix_nano, p.start_time_unix_nano, p.flags);
        points.exemplars.append(&p.exemplars);
        points.number(p.value.as_ref());
        self.parts.rows(at, 1);
        self.rows += 1;
        Ok(())
    }

    fn cursor(&self) -> Result<Cursor, ConvError> {
        let Open::Metric(table_row) = self.open else { return Err(misuse("a point before any metric")) };
        // Each count is at least 1 here: a metric is open, so are its scope and resource.
        Ok(Cursor { resource: self.resources - 1, scope: self.scopes - 1, metric: self.metrics - 1, table_row })
    }

    /// Rows (points) appended so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True when no point was appended.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The batch of every point appended (no rows when none was).
    pub fn finish(self) -> Result<RecordBatch, ConvError> {
        self.parts.finish()
    }
}

/// `n + 1`, or an error past `u32::MAX` (the index columns are u32).
fn next(n: u32) -> Result<u32, ConvError> {
    n.checked_add(1).ok_or_else(|| ConvError::Schema("more than u32::MAX resources, scopes or metrics".into()))
}

fn misuse(what: &str) -> ConvError {
    ConvError::Schema(format!("metrics batch builder: {what}"))
}

/// A metric's `kind`, `temporality` and `is_monotonic` columns.
type MetricKindColumns = (u8, Option<i32>, Option<bool>);

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
        let k = match &m.data {
            Some(Data::Gauge(_)) | None => (kind::GAUGE, None, None),
            Some(Data::Sum(s)) => (kind::SUM, Some(s.aggregation_temporality), Some(s.is_monotonic)),
            Some(Data::Histogram(h)) => (kind::HISTOGRAM, Some(h.aggregation_temporality), None),
            Some(Data::ExponentialHistogram(h)) => (kind::EXPONENTIAL_HISTOGRAM, Some(h.aggregation_temporality), None),
            Some(Data::Summary(_)) => (kind::SUMMARY, None, None),
        };
        self.add_entry(&m.name, &m.description, &m.unit, &m.metadata, k)
    }

    /// Adds a metric entry from its parts; returns its entry index.
    fn add_entry(
        &mut self,
        name: &str,
        description: &str,
        unit: &str,
        metadata: &[KeyValue],
        (k, temporality, monotonic): MetricKindColumns,
    ) -> Result<u32, ConvError> {
        let index = index_u32(self.kind.len())?;
        self.name.append_value(name);
        self.description.append_value(description);
        self.unit.append_value(unit);
        self.metadata.append(metadata);
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
