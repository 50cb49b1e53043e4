//! The Arrow schemas of inferwatch: one row per metric data point, one row per span.
//!
//! Column names are constants here so that converters, processors and exporters agree; every
//! column is described in docs/arrow-schema.md. Timestamps are `Timestamp(Nanosecond, "UTC")`
//! holding the OTLP `fixed64` bit pattern (values at or above 2^63 ns read as negative, and
//! convert back exactly).

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// Schema metadata key naming what a batch holds (`metrics` or `spans`).
pub const META_KIND: &str = "inferwatch.schema";
/// Schema metadata key holding the schema version.
pub const META_VERSION: &str = "inferwatch.schema.version";
/// The current schema version (bumped on any incompatible change).
pub const SCHEMA_VERSION: &str = "1";
/// `META_KIND` value of the metrics schema.
pub const KIND_METRICS: &str = "metrics";
/// `META_KIND` value of the spans schema.
pub const KIND_SPANS: &str = "spans";

// ---- shared columns (both schemas) -------------------------------------------------------

/// Index of the ResourceMetrics / ResourceSpans within the batch (regroups rows on the way back).
pub const RESOURCE_INDEX: &str = "resource_index";
/// Resource attributes (map of attribute values; see [`any_value_type`]).
pub const RESOURCE_ATTRIBUTES: &str = "resource_attributes";
/// Resource dropped_attributes_count.
pub const RESOURCE_DROPPED: &str = "resource_dropped_attributes_count";
/// schema_url of the ResourceMetrics / ResourceSpans.
pub const RESOURCE_SCHEMA_URL: &str = "resource_schema_url";
/// Index of the ScopeMetrics / ScopeSpans within its resource.
pub const SCOPE_INDEX: &str = "scope_index";
/// InstrumentationScope name.
pub const SCOPE_NAME: &str = "scope_name";
/// InstrumentationScope version.
pub const SCOPE_VERSION: &str = "scope_version";
/// InstrumentationScope attributes.
pub const SCOPE_ATTRIBUTES: &str = "scope_attributes";
/// InstrumentationScope dropped_attributes_count.
pub const SCOPE_DROPPED: &str = "scope_dropped_attributes_count";
/// schema_url of the ScopeMetrics / ScopeSpans.
pub const SCOPE_SCHEMA_URL: &str = "scope_schema_url";
/// Resource `service.name` as a typed column (removed from `resource_attributes` when a string).
pub const SERVICE_NAME: &str = "service.name";
/// Resource `service.version` as a typed column (removed from `resource_attributes` when a string).
pub const SERVICE_VERSION: &str = "service.version";
/// Resource `service.instance.id` as a typed column (removed from `resource_attributes` when a string).
pub const SERVICE_INSTANCE_ID: &str = "service.instance.id";
/// Attributes of the point or span (map of attribute values).
pub const ATTRIBUTES: &str = "attributes";
/// Event time of the row: point time_unix_nano, span end_time_unix_nano.
pub const TIME: &str = "time_unix_nano";
/// Start time: point start_time_unix_nano, span start_time_unix_nano.
pub const START_TIME: &str = "start_time_unix_nano";
/// Flags of the point or span.
pub const FLAGS: &str = "flags";

// ---- metrics ---------------------------------------------------------------------------

/// Index of the Metric within its scope.
pub const METRIC_INDEX: &str = "metric_index";
/// Stable 64-bit series id (xxh3 of resource, scope, metric name and point attributes).
pub const SERIES_ID: &str = "series_id";
/// Metric name.
pub const METRIC_NAME: &str = "metric_name";
/// Metric description.
pub const METRIC_DESCRIPTION: &str = "metric_description";
/// Metric unit.
pub const METRIC_UNIT: &str = "metric_unit";
/// Metric metadata key/values.
pub const METRIC_METADATA: &str = "metric_metadata";
/// Metric kind: 1 gauge, 2 sum, 3 histogram, 4 exponential histogram, 5 summary.
pub const KIND: &str = "kind";
/// Aggregation temporality (OTLP enum: 0 unspecified, 1 delta, 2 cumulative); null for gauges and summaries.
pub const TEMPORALITY: &str = "temporality";
/// Sum monotonicity; null for other kinds.
pub const IS_MONOTONIC: &str = "is_monotonic";
/// Number point value as f64 (ints converted); null for other kinds and unset values.
pub const VALUE: &str = "value";
/// Number point value when it was an int (exact); null otherwise.
pub const INT_VALUE: &str = "int_value";
/// Histogram / exponential histogram / summary count.
pub const COUNT: &str = "count";
/// Histogram / exponential histogram / summary sum (null when unset).
pub const SUM: &str = "sum";
/// Histogram / exponential histogram min (null when unset).
pub const MIN: &str = "min";
/// Histogram / exponential histogram max (null when unset).
pub const MAX: &str = "max";
/// Histogram bucket counts.
pub const BUCKET_COUNTS: &str = "bucket_counts";
/// Histogram explicit bounds.
pub const EXPLICIT_BOUNDS: &str = "explicit_bounds";
/// Exponential histogram scale.
pub const EXP_SCALE: &str = "exp_scale";
/// Exponential histogram zero_count.
pub const EXP_ZERO_COUNT: &str = "exp_zero_count";
/// Exponential histogram zero_threshold.
pub const EXP_ZERO_THRESHOLD: &str = "exp_zero_threshold";
/// Exponential histogram positive offset.
pub const EXP_POSITIVE_OFFSET: &str = "exp_positive_offset";
/// Exponential histogram positive bucket counts.
pub const EXP_POSITIVE_COUNTS: &str = "exp_positive_bucket_counts";
/// Exponential histogram negative offset.
pub const EXP_NEGATIVE_OFFSET: &str = "exp_negative_offset";
/// Exponential histogram negative bucket counts.
pub const EXP_NEGATIVE_COUNTS: &str = "exp_negative_bucket_counts";
/// Summary quantiles: list of {quantile, value}.
pub const QUANTILES: &str = "quantiles";
/// Exemplars: list of {time_unix_nano, value, int_value, span_id, trace_id, filtered_attributes}.
pub const EXEMPLARS: &str = "exemplars";

/// Metric kind codes of the `kind` column.
pub mod kind {
    /// Gauge.
    pub const GAUGE: u8 = 1;
    /// Sum.
    pub const SUM: u8 = 2;
    /// Histogram.
    pub const HISTOGRAM: u8 = 3;
    /// Exponential histogram.
    pub const EXPONENTIAL_HISTOGRAM: u8 = 4;
    /// Summary.
    pub const SUMMARY: u8 = 5;
}

// ---- spans -----------------------------------------------------------------------------

/// Trace id bytes (16 when valid; kept as received).
pub const TRACE_ID: &str = "trace_id";
/// Span id bytes (8 when valid).
pub const SPAN_ID: &str = "span_id";
/// W3C trace state.
pub const TRACE_STATE: &str = "trace_state";
/// Parent span id bytes (empty for a root span).
pub const PARENT_SPAN_ID: &str = "parent_span_id";
/// Span name.
pub const NAME: &str = "name";
/// Span kind (OTLP enum value).
pub const SPAN_KIND: &str = "kind";
/// end - start in ns (derived convenience column; ignored on the way back).
pub const DURATION: &str = "duration_ns";
/// Status code (OTLP enum value).
pub const STATUS_CODE: &str = "status_code";
/// Status message.
pub const STATUS_MESSAGE: &str = "status_message";
/// Span dropped_attributes_count.
pub const DROPPED_ATTRIBUTES: &str = "dropped_attributes_count";
/// Span dropped_events_count.
pub const DROPPED_EVENTS: &str = "dropped_events_count";
/// Span dropped_links_count.
pub const DROPPED_LINKS: &str = "dropped_links_count";
/// Span events: list of {time_unix_nano, name, attributes, dropped_attributes_count}.
pub const EVENTS: &str = "events";
/// Span links: list of {trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags}.
pub const LINKS: &str = "links";

/// Span attributes promoted to typed columns: (attribute key = column name, type).
///
/// An attribute is promoted only when its value has the column's type (string, int or
/// double); otherwise it stays in `attributes`. Promoted keys are removed from the map.
pub const PROMOTED_SPAN_ATTRIBUTES: &[(&str, PromotedType)] = &[
    ("gen_ai.request.id", PromotedType::Str),
    ("gen_ai.request.model", PromotedType::Str),
    ("gen_ai.response.model", PromotedType::Str),
    ("gen_ai.operation.name", PromotedType::Str),
    ("gen_ai.provider.name", PromotedType::Str),
    ("gen_ai.response.finish_reasons", PromotedType::Str),
    ("gen_ai.usage.prompt_tokens", PromotedType::Int),
    ("gen_ai.usage.completion_tokens", PromotedType::Int),
    ("gen_ai.usage.input_tokens", PromotedType::Int),
    ("gen_ai.usage.output_tokens", PromotedType::Int),
    ("gen_ai.request.max_tokens", PromotedType::Int),
    ("gen_ai.latency.time_to_first_token", PromotedType::Double),
    ("gen_ai.latency.e2e", PromotedType::Double),
    ("gen_ai.latency.time_in_queue", PromotedType::Double),
    ("gen_ai.latency.time_in_model_prefill", PromotedType::Double),
    ("gen_ai.latency.time_in_model_decode", PromotedType::Double),
    ("gen_ai.latency.time_in_model_inference", PromotedType::Double),
    ("error.type", PromotedType::Str),
];

/// Resource attributes promoted to typed columns in both schemas.
pub const PROMOTED_RESOURCE_ATTRIBUTES: &[&str] = &[SERVICE_NAME, SERVICE_VERSION, SERVICE_INSTANCE_ID];

/// The type of a promoted attribute column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromotedType {
    /// Utf8, from a string AnyValue.
    Str,
    /// Int64, from an int AnyValue.
    Int,
    /// Float64, from a double AnyValue.
    Double,
}

impl PromotedType {
    /// The Arrow type of the column.
    pub fn data_type(self) -> DataType {
        match self {
            PromotedType::Str => DataType::Utf8,
            PromotedType::Int => DataType::Int64,
            PromotedType::Double => DataType::Float64,
        }
    }
}

// ---- attribute values ------------------------------------------------------------------

/// AnyValue type codes of the `type` field in an attribute value struct.
pub mod value_type {
    /// The AnyValue had no value set.
    pub const EMPTY: u8 = 0;
    /// string_value, in `str`.
    pub const STRING: u8 = 1;
    /// bool_value, in `bool`.
    pub const BOOL: u8 = 2;
    /// int_value, in `int`.
    pub const INT: u8 = 3;
    /// double_value, in `double`.
    pub const DOUBLE: u8 = 4;
    /// bytes_value, in `bytes`.
    pub const BYTES: u8 = 5;
    /// array_value: the AnyValue protobuf-encoded in `bytes`.
    pub const ARRAY: u8 = 6;
    /// kvlist_value: the AnyValue protobuf-encoded in `bytes`.
    pub const KVLIST: u8 = 7;
}

/// The struct an attribute value is stored as: {type, str, bool, int, double, bytes}.
pub fn any_value_type() -> DataType {
    DataType::Struct(any_value_fields())
}

/// Fields of [`any_value_type`].
pub fn any_value_fields() -> Fields {
    Fields::from(vec![
        Field::new("type", DataType::UInt8, false),
        Field::new("str", DataType::Utf8, true),
        Field::new("bool", DataType::Boolean, true),
        Field::new("int", DataType::Int64, true),
        Field::new("double", DataType::Float64, true),
        Field::new("bytes", DataType::Binary, true),
    ])
}

/// Map<Utf8, attribute value> as used by every attributes column (entries keep their order).
pub fn attributes_type() -> DataType {
    DataType::Map(Arc::new(attributes_entries_field()), false)
}

/// The entries field of [`attributes_type`].
pub fn attributes_entries_field() -> Field {
    Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", any_value_type(), true),
        ])),
        false,
    )
}

/// Timestamp(ns, UTC).
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

fn list_of_struct(fields: Vec<Field>) -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Struct(Fields::from(fields)), true)))
}

fn metadata(kind: &str) -> HashMap<String, String> {
    HashMap::from([(META_KIND.to_string(), kind.to_string()), (META_VERSION.to_string(), SCHEMA_VERSION.to_string())])
}

fn resource_and_scope_fields() -> Vec<Field> {
    vec![
        Field::new(RESOURCE_INDEX, DataType::UInt32, false),
        Field::new(SERVICE_NAME, DataType::Utf8, true),
        Field::new(SERVICE_VERSION, DataType::Utf8, true),
        Field::new(SERVICE_INSTANCE_ID, DataType::Utf8, true),
        Field::new(RESOURCE_ATTRIBUTES, attributes_type(), false),
        Field::new(RESOURCE_DROPPED, DataType::UInt32, false),
        Field::new(RESOURCE_SCHEMA_URL, DataType::Utf8, false),
        Field::new(SCOPE_INDEX, DataType::UInt32, false),
        Field::new(SCOPE_NAME, DataType::Utf8, false),
        Field::new(SCOPE_VERSION, DataType::Utf8, false),
        Field::new(SCOPE_ATTRIBUTES, attributes_type(), false),
        Field::new(SCOPE_DROPPED, DataType::UInt32, false),
        Field::new(SCOPE_SCHEMA_URL, DataType::Utf8, false),
    ]
}

/// Exemplar struct fields.
pub fn exemplar_fields() -> Vec<Field> {
    vec![
        Field::new(TIME, timestamp_type(), false),
        Field::new(VALUE, DataType::Float64, true),
        Field::new(INT_VALUE, DataType::Int64, true),
        Field::new(SPAN_ID, DataType::Binary, false),
        Field::new(TRACE_ID, DataType::Binary, false),
        Field::new("filtered_attributes", attributes_type(), false),
    ]
}

/// Summary quantile struct fields.
pub fn quantile_fields() -> Vec<Field> {
    vec![Field::new("quantile", DataType::Float64, false), Field::new("value", DataType::Float64, false)]
}

/// Span event struct fields.
pub fn event_fields() -> Vec<Field> {
    vec![
        Field::new(TIME, timestamp_type(), false),
        Field::new(NAME, DataType::Utf8, false),
        Field::new(ATTRIBUTES, attributes_type(), false),
        Field::new(DROPPED_ATTRIBUTES, DataType::UInt32, false),
    ]
}

/// Span link struct fields.
pub fn link_fields() -> Vec<Field> {
    vec![
        Field::new(TRACE_ID, DataType::Binary, false),
        Field::new(SPAN_ID, DataType::Binary, false),
        Field::new(TRACE_STATE, DataType::Utf8, false),
        Field::new(ATTRIBUTES, attributes_type(), false),
        Field::new(DROPPED_ATTRIBUTES, DataType::UInt32, false),
        Field::new(FLAGS, DataType::UInt32, false),
    ]
}

static METRICS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut f = resource_and_scope_fields();
    f.extend([
        Field::new(METRIC_INDEX, DataType::UInt32, false),
        Field::new(SERIES_ID, DataType::UInt64, false),
        Field::new(METRIC_NAME, DataType::Utf8, false),
        Field::new(METRIC_DESCRIPTION, DataType::Utf8, false),
        Field::new(METRIC_UNIT, DataType::Utf8, false),
        Field::new(METRIC_METADATA, attributes_type(), false),
        Field::new(KIND, DataType::UInt8, false),
        Field::new(TEMPORALITY, DataType::Int32, true),
        Field::new(IS_MONOTONIC, DataType::Boolean, true),
        Field::new(TIME, timestamp_type(), false),
        Field::new(START_TIME, timestamp_type(), false),
        Field::new(ATTRIBUTES, attributes_type(), false),
        Field::new(FLAGS, DataType::UInt32, false),
        Field::new(VALUE, DataType::Float64, true),
        Field::new(INT_VALUE, DataType::Int64, true),
        Field::new(COUNT, DataType::UInt64, true),
        Field::new(SUM, DataType::Float64, true),
        Field::new(MIN, DataType::Float64, true),
        Field::new(MAX, DataType::Float64, true),
        Field::new(BUCKET_COUNTS, list_of(DataType::UInt64), true),
        Field::new(EXPLICIT_BOUNDS, list_of(DataType::Float64), true),
        Field::new(EXP_SCALE, DataType::Int32, true),
        Field::new(EXP_ZERO_COUNT, DataType::UInt64, true),
        Field::new(EXP_ZERO_THRESHOLD, DataType::Float64, true),
        Field::new(EXP_POSITIVE_OFFSET, DataType::Int32, true),
        Field::new(EXP_POSITIVE_COUNTS, list_of(DataType::UInt64), true),
        Field::new(EXP_NEGATIVE_OFFSET, DataType::Int32, true),
        Field::new(EXP_NEGATIVE_COUNTS, list_of(DataType::UInt64), true),
        Field::new(QUANTILES, list_of_struct(quantile_fields()), true),
        Field::new(EXEMPLARS, list_of_struct(exemplar_fields()), false),
    ]);
    Arc::new(Schema::new_with_metadata(f, metadata(KIND_METRICS)))
});

static SPANS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut f = resource_and_scope_fields();
    f.extend([
        Field::new(TRACE_ID, DataType::Binary, false),
        Field::new(SPAN_ID, DataType::Binary, false),
        Field::new(TRACE_STATE, DataType::Utf8, false),
        Field::new(PARENT_SPAN_ID, DataType::Binary, false),
        Field::new(FLAGS, DataType::UInt32, false),
        Field::new(NAME, DataType::Utf8, false),
        Field::new(SPAN_KIND, DataType::Int32, false),
        Field::new(START_TIME, timestamp_type(), false),
        Field::new(TIME, timestamp_type(), false),
        Field::new(DURATION, DataType::Int64, false),
        Field::new(STATUS_CODE, DataType::Int32, false),
        Field::new(STATUS_MESSAGE, DataType::Utf8, false),
        Field::new(DROPPED_ATTRIBUTES, DataType::UInt32, false),
        Field::new(DROPPED_EVENTS, DataType::UInt32, false),
        Field::new(DROPPED_LINKS, DataType::UInt32, false),
    ]);
    for (key, ty) in PROMOTED_SPAN_ATTRIBUTES {
        f.push(Field::new(*key, ty.data_type(), true));
    }
    f.extend([
        Field::new(ATTRIBUTES, attributes_type(), false),
        Field::new(EVENTS, list_of_struct(event_fields()), false),
        Field::new(LINKS, list_of_struct(link_fields()), false),
    ]);
    Arc::new(Schema::new_with_metadata(f, metadata(KIND_SPANS)))
});

/// The metrics schema: one row per data point.
pub fn metrics_schema() -> SchemaRef {
    METRICS.clone()
}

/// The spans schema: one row per span.
pub fn spans_schema() -> SchemaRef {
    SPANS.clone()
}

/// Which signal a batch's schema holds, from its metadata.
pub fn signal_of(schema: &Schema) -> Option<crate::pdata::Signal> {
    match schema.metadata().get(META_KIND).map(String::as_str) {
        Some(KIND_METRICS) => Some(crate::pdata::Signal::Metrics),
        Some(KIND_SPANS) => Some(crate::pdata::Signal::Traces),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_have_unique_column_names() {
        for s in [metrics_schema(), spans_schema()] {
            let mut names: Vec<&String> = s.fields().iter().map(|f| f.name()).collect();
            let n = names.len();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), n);
        }
        assert_eq!(signal_of(&metrics_schema()), Some(crate::pdata::Signal::Metrics));
        assert_eq!(signal_of(&spans_schema()), Some(crate::pdata::Signal::Traces));
    }
}
