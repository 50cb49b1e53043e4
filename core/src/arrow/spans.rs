//! Spans ⇄ Arrow: one row per span (schema in [`super::schema::spans_schema`]).
//!
//! Attributes listed in [`schema::PROMOTED_SPAN_ATTRIBUTES`] move to typed columns when the
//! first occurrence of the key has the column's type; on the way back they are appended after
//! the remaining map entries, in that list's order.

use super::ConvError;
use super::anyvalue::{
    AttributesBuilder, AttributesReader, ResourceScopeBuilder, ResourceScopeReader, bin_at, finish_offsets, index_u32,
    list_entries, list_item, list_struct, opt_attrs, opt_child, opt_col, prim_at, read_attrs, req_col, str_at,
    struct_fields, timestamps,
};
use super::schema::{self, PROMOTED_SPAN_ATTRIBUTES, PromotedType};
use arrow_array::builder::{BinaryBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{
    ArrayRef, BinaryArray, Float64Array, Int32Array, Int64Array, ListArray, MapArray, RecordBatch, StringArray,
    StructArray, TimestampNanosecondArray, UInt32Array,
};
use arrow_buffer::OffsetBufferBuilder;
use arrow_schema::FieldRef;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use std::sync::Arc;

/// Number of promoted span attribute columns.
const PROMOTED: usize = PROMOTED_SPAN_ATTRIBUTES.len();

/// The promoted column of an attribute key.
fn promoted_column(key: &str) -> Option<usize> {
    PROMOTED_SPAN_ATTRIBUTES.iter().position(|(k, _)| *k == key)
}

// ---- OTLP → Arrow ----------------------------------------------------------------------------

/// Converts a traces export request to a batch of the spans schema.
pub fn to_batch(req: &ExportTraceServiceRequest) -> Result<RecordBatch, ConvError> {
    let schema = schema::spans_schema();
    let (mut rows, mut scopes, mut attr_entries, mut events, mut links) = (0, 0, 0, 0, 0);
    for rs in &req.resource_spans {
        scopes += rs.scope_spans.len();
        for ss in &rs.scope_spans {
            rows += ss.spans.len();
            for s in &ss.spans {
                attr_entries += s.attributes.len();
                events += s.events.len();
                links += s.links.len();
            }
        }
    }
    let mut res = ResourceScopeBuilder::with_capacity(rows, req.resource_spans.len(), scopes);
    let mut cols = SpanColumns::with_capacity(rows, attr_entries, events, links);
    for (ri, rs) in req.resource_spans.iter().enumerate() {
        let ri = index_u32(ri)?;
        res.add_resource(rs.resource.as_ref(), &rs.schema_url);
        for (si, ss) in rs.scope_spans.iter().enumerate() {
            let si = index_u32(si)?;
            res.add_scope(ss.scope.as_ref(), &ss.schema_url);
            res.push_rows(ri, si, ss.spans.len());
            for span in &ss.spans {
                cols.push(span);
            }
        }
    }
    let mut columns = res.finish()?;
    columns.extend(cols.finish(&schema)?);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A promoted attribute column under construction.
enum PromotedBuilder {
    Str(StringBuilder),
    Int(Int64Builder),
    Double(Float64Builder),
}

impl PromotedBuilder {
    fn new(ty: PromotedType, rows: usize) -> Self {
        match ty {
            PromotedType::Str => PromotedBuilder::Str(StringBuilder::with_capacity(rows, rows * 16)),
            PromotedType::Int => PromotedBuilder::Int(Int64Builder::with_capacity(rows)),
            PromotedType::Double => PromotedBuilder::Double(Float64Builder::with_capacity(rows)),
        }
    }

    /// Appends `v` when it has the column's type; false (nothing appended) otherwise.
    fn try_push(&mut self, v: Option<&AnyValue>) -> bool {
        match (self, v.and_then(|v| v.value.as_ref())) {
            (PromotedBuilder::Str(b), Some(Value::StringValue(s))) => b.append_value(s),
            (PromotedBuilder::Int(b), Some(Value::IntValue(i))) => b.append_value(*i),
            (PromotedBuilder::Double(b), Some(Value::DoubleValue(d))) => b.append_value(*d),
            _ => return false,
        }
        true
    }

    fn push_null(&mut self) {
        match self {
            PromotedBuilder::Str(b) => b.append_null(),
            PromotedBuilder::Int(b) => b.append_null(),
            PromotedBuilder::Double(b) => b.append_null(),
        }
    }

    fn finish(self) -> ArrayRef {
        match self {
            PromotedBuilder::Str(mut b) => Arc::new(b.finish()),
            PromotedBuilder::Int(mut b) => Arc::new(b.finish()),
            PromotedBuilder::Double(mut b) => Arc::new(b.finish()),
        }
    }
}

/// The span columns after the resource and scope ones.
struct SpanColumns {
    trace_id: BinaryBuilder,
    span_id: BinaryBuilder,
    trace_state: StringBuilder,
    parent_span_id: BinaryBuilder,
    flags: Vec<u32>,
    name: StringBuilder,
    kind: Vec<i32>,
    start: Vec<i64>,
    end: Vec<i64>,
    duration: Vec<i64>,
    status_code: Vec<i32>,
    status_message: StringBuilder,
    dropped_attributes: Vec<u32>,
    dropped_events: Vec<u32>,
    dropped_links: Vec<u32>,
    promoted: Vec<PromotedBuilder>,
    attrs: AttributesBuilder,
    events: EventsBuilder,
    links: LinksBuilder,
}

impl SpanColumns {
    fn with_capacity(n: usize, attr_entries: usize, events: usize, links: usize) -> Self {
        SpanColumns {
            trace_id: BinaryBuilder::with_capacity(n, n * 16),
            span_id: BinaryBuilder::with_capacity(n, n * 8),
            trace_state: StringBuilder::with_capacity(n, 0),
            parent_span_id: BinaryBuilder::with_capacity(n, n * 8),
            flags: Vec::with_capacity(n),
            name: StringBuilder::with_capacity(n, n * 16),
            kind: Vec::with_capacity(n),
            start: Vec::with_capacity(n),
            end: Vec::with_capacity(n),
            duration: Vec::with_capacity(n),
            status_code: Vec::with_capacity(n),
            status_message: StringBuilder::with_capacity(n, 0),
            dropped_attributes: Vec::with_capacity(n),
            dropped_events: Vec::with_capacity(n),
            dropped_links: Vec::with_capacity(n),
            promoted: PROMOTED_SPAN_ATTRIBUTES.iter().map(|(_, ty)| PromotedBuilder::new(*ty, n)).collect(),
            attrs: AttributesBuilder::with_capacity(n, attr_entries),
            events: EventsBuilder::with_capacity(n, events),
            links: LinksBuilder::with_capacity(n, links),
        }
    }

    fn push(&mut self, s: &Span) {
        self.trace_id.append_value(&s.trace_id);
        self.span_id.append_value(&s.span_id);
        self.trace_state.append_value(&s.trace_state);
        self.parent_span_id.append_value(&s.parent_span_id);
        self.flags.push(s.flags);
        self.name.append_value(&s.name);
        self.kind.push(s.kind);
        self.start.push(s.start_time_unix_nano as i64);
        self.end.push(s.end_time_unix_nano as i64);
        self.duration.push(s.end_time_unix_nano.wrapping_sub(s.start_time_unix_nano) as i64);
        self.status_code.push(s.status.as_ref().map_or(0, |st| st.code));
        self.status_message.append_value(s.status.as_ref().map_or("", |st| st.message.as_str()));
        self.dropped_attributes.push(s.dropped_attributes_count);
        self.dropped_events.push(s.dropped_events_count);
        self.dropped_links.push(s.dropped_links_count);
        let mut seen = [false; PROMOTED];
        let mut filled = [false; PROMOTED];
        for kv in &s.attributes {
            if let Some(c) = promoted_column(&kv.key)
                && !seen[c]
            {
                seen[c] = true;
                if self.promoted[c].try_push(kv.value.as_ref()) {
                    filled[c] = true;
                    continue;
                }
            }
            self.attrs.push_entry(kv);
        }
        self.attrs.end_row();
        for (b, filled) in self.promoted.iter_mut().zip(filled) {
            if !filled {
                b.push_null();
            }
        }
        self.events.append(&s.events);
        self.links.append(&s.links);
    }

    /// trace_id … links, in schema order.
    fn finish(mut self, schema: &arrow_schema::Schema) -> Result<Vec<ArrayRef>, ConvError> {
        let mut v: Vec<ArrayRef> = vec![
            Arc::new(self.trace_id.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(self.trace_state.finish()),
            Arc::new(self.parent_span_id.finish()),
            Arc::new(UInt32Array::from(self.flags)),
            Arc::new(self.name.finish()),
            Arc::new(Int32Array::from(self.kind)),
            timestamps(self.start),
            timestamps(self.end),
            Arc::new(Int64Array::from(self.duration)),
            Arc::new(Int32Array::from(self.status_code)),
            Arc::new(self.status_message.finish()),
            Arc::new(UInt32Array::from(self.dropped_attributes)),
            Arc::new(UInt32Array::from(self.dropped_events)),
            Arc::new(UInt32Array::from(self.dropped_links)),
        ];
        v.extend(self.promoted.into_iter().map(PromotedBuilder::finish));
        v.push(Arc::new(self.attrs.finish()?));
        v.push(Arc::new(self.events.finish(list_item(schema, schema::EVENTS)?)?));
        v.push(Arc::new(self.links.finish(list_item(schema, schema::LINKS)?)?));
        Ok(v)
    }
}

/// The events list column.
struct EventsBuilder {
    offsets: OffsetBufferBuilder<i32>,
    time: Vec<i64>,
    name: StringBuilder,
    attrs: AttributesBuilder,
    dropped: Vec<u32>,
}

impl EventsBuilder {
    fn with_capacity(rows: usize, n: usize) -> Self {
        EventsBuilder {
            offsets: OffsetBufferBuilder::new(rows),
            time: Vec::with_capacity(n),
            name: StringBuilder::with_capacity(n, n * 16),
            attrs: AttributesBuilder::with_capacity(n, n),
            dropped: Vec::with_capacity(n),
        }
    }

    fn append(&mut self, events: &[Event]) {
        for e in events {
            self.time.push(e.time_unix_nano as i64);
            self.name.append_value(&e.name);
            self.attrs.append(&e.attributes);
            self.dropped.push(e.dropped_attributes_count);
        }
        self.offsets.push_length(events.len());
    }

    fn finish(mut self, item: FieldRef) -> Result<ListArray, ConvError> {
        let children: Vec<ArrayRef> = vec![
            timestamps(self.time),
            Arc::new(self.name.finish()),
            Arc::new(self.attrs.finish()?),
            Arc::new(UInt32Array::from(self.dropped)),
        ];
        let values = StructArray::try_new(struct_fields(&item)?, children, None)?;
        Ok(ListArray::try_new(item, finish_offsets(self.offsets)?, Arc::new(values), None)?)
    }
}

/// The links list column.
struct LinksBuilder {
    offsets: OffsetBufferBuilder<i32>,
    trace_id: BinaryBuilder,
    span_id: BinaryBuilder,
    trace_state: StringBuilder,
    attrs: AttributesBuilder,
    dropped: Vec<u32>,
    flags: Vec<u32>,
}

impl LinksBuilder {
    fn with_capacity(rows: usize, n: usize) -> Self {
        LinksBuilder {
            offsets: OffsetBufferBuilder::new(rows),
            trace_id: BinaryBuilder::with_capacity(n, n * 16),
            span_id: BinaryBuilder::with_capacity(n, n * 8),
            trace_state: StringBuilder::with_capacity(n, 0),
            attrs: AttributesBuilder::with_capacity(n, n),
            dropped: Vec::with_capacity(n),
            flags: Vec::with_capacity(n),
        }
    }

    fn append(&mut self, links: &[Link]) {
        for l in links {
            self.trace_id.append_value(&l.trace_id);
            self.span_id.append_value(&l.span_id);
            self.trace_state.append_value(&l.trace_state);
            self.attrs.append(&l.attributes);
            self.dropped.push(l.dropped_attributes_count);
            self.flags.push(l.flags);
        }
        self.offsets.push_length(links.len());
    }

    fn finish(mut self, item: FieldRef) -> Result<ListArray, ConvError> {
        let children: Vec<ArrayRef> = vec![
            Arc::new(self.trace_id.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(self.trace_state.finish()),
            Arc::new(self.attrs.finish()?),
            Arc::new(UInt32Array::from(self.dropped)),
            Arc::new(UInt32Array::from(self.flags)),
        ];
        let values = StructArray::try_new(struct_fields(&item)?, children, None)?;
        Ok(ListArray::try_new(item, finish_offsets(self.offsets)?, Arc::new(values), None)?)
    }
}

// ---- Arrow → OTLP ----------------------------------------------------------------------------

/// Converts a batch of the spans schema back to an export request.
///
/// Columns are looked up by name; absent optional columns read as null/default (`time_unix_nano`
/// is required). Rows regroup into a new resource when `resource_index` changes and a new scope
/// when `scope_index` changes (or the resource did). `duration_ns` is ignored.
pub fn from_batch(batch: &RecordBatch) -> Result<ExportTraceServiceRequest, ConvError> {
    let r = SpansReader::new(batch)?;
    let mut out: Vec<ResourceSpans> = Vec::new();
    let mut prev: Option<(u32, u32)> = None;
    for row in 0..batch.num_rows() {
        let key = (r.rs.resource_index(row), r.rs.scope_index(row));
        let new_resource = prev.is_none_or(|p| p.0 != key.0);
        let new_scope = new_resource || prev.is_some_and(|p| p.1 != key.1);
        prev = Some(key);
        if new_resource {
            out.push(ResourceSpans {
                resource: Some(r.rs.resource(row)?),
                scope_spans: Vec::new(),
                schema_url: r.rs.resource_schema_url(row),
            });
        }
        let rs = out.last_mut().ok_or_else(internal)?;
        if new_scope {
            rs.scope_spans.push(ScopeSpans {
                scope: Some(r.rs.scope(row)?),
                spans: Vec::new(),
                schema_url: r.rs.scope_schema_url(row),
            });
        }
        rs.scope_spans.last_mut().ok_or_else(internal)?.spans.push(r.span(row)?);
    }
    Ok(ExportTraceServiceRequest { resource_spans: out })
}

fn internal() -> ConvError {
    ConvError::Schema("internal: regrouping lost its parent".into())
}

/// A promoted column of a batch.
enum PromotedCol<'a> {
    Str(&'a StringArray),
    Int(&'a Int64Array),
    Double(&'a Float64Array),
}

impl PromotedCol<'_> {
    fn value(&self, row: usize) -> Option<Value> {
        match self {
            PromotedCol::Str(a) => str_at(Some(a), row).map(|s| Value::StringValue(s.to_string())),
            PromotedCol::Int(a) => prim_at(Some(a), row).map(Value::IntValue),
            PromotedCol::Double(a) => prim_at(Some(a), row).map(Value::DoubleValue),
        }
    }
}

struct EventsReader<'a> {
    list: &'a ListArray,
    time: Option<&'a TimestampNanosecondArray>,
    name: Option<&'a StringArray>,
    attrs: Option<AttributesReader<'a>>,
    dropped: Option<&'a UInt32Array>,
}

struct LinksReader<'a> {
    list: &'a ListArray,
    trace_id: Option<&'a BinaryArray>,
    span_id: Option<&'a BinaryArray>,
    trace_state: Option<&'a StringArray>,
    attrs: Option<AttributesReader<'a>>,
    dropped: Option<&'a UInt32Array>,
    flags: Option<&'a UInt32Array>,
}

/// Every column of a spans batch, looked up once.
struct SpansReader<'a> {
    rs: ResourceScopeReader<'a>,
    trace_id: Option<&'a BinaryArray>,
    span_id: Option<&'a BinaryArray>,
    trace_state: Option<&'a StringArray>,
    parent_span_id: Option<&'a BinaryArray>,
    flags: Option<&'a UInt32Array>,
    name: Option<&'a StringArray>,
    kind: Option<&'a Int32Array>,
    start: Option<&'a TimestampNanosecondArray>,
    end: &'a TimestampNanosecondArray,
    status_code: Option<&'a Int32Array>,
    status_message: Option<&'a StringArray>,
    dropped_attributes: Option<&'a UInt32Array>,
    dropped_events: Option<&'a UInt32Array>,
    dropped_links: Option<&'a UInt32Array>,
    promoted: Vec<(&'static str, PromotedCol<'a>)>,
    attrs: Option<AttributesReader<'a>>,
    events: Option<EventsReader<'a>>,
    links: Option<LinksReader<'a>>,
}

fn child_attrs<'a>(s: &'a StructArray) -> Result<Option<AttributesReader<'a>>, ConvError> {
    opt_child::<MapArray>(s, schema::ATTRIBUTES)?.map(AttributesReader::new).transpose()
}

impl<'a> SpansReader<'a> {
    fn new(b: &'a RecordBatch) -> Result<Self, ConvError> {
        let mut promoted = Vec::with_capacity(PROMOTED);
        for (key, ty) in PROMOTED_SPAN_ATTRIBUTES {
            let col = match ty {
                PromotedType::Str => opt_col(b, key)?.map(PromotedCol::Str),
                PromotedType::Int => opt_col(b, key)?.map(PromotedCol::Int),
                PromotedType::Double => opt_col(b, key)?.map(PromotedCol::Double),
            };
            promoted.extend(col.map(|c| (*key, c)));
        }
        let events = match list_struct(b, schema::EVENTS)? {
            None => None,
            Some((list, s)) => Some(EventsReader {
                list,
                time: opt_child(s, schema::TIME)?,
                name: opt_child(s, schema::NAME)?,
                attrs: child_attrs(s)?,
                dropped: opt_child(s, schema::DROPPED_ATTRIBUTES)?,
            }),
        };
        let links = match list_struct(b, schema::LINKS)? {
            None => None,
            Some((list, s)) => Some(LinksReader {
                list,
                trace_id: opt_child(s, schema::TRACE_ID)?,
                span_id: opt_child(s, schema::SPAN_ID)?,
                trace_state: opt_child(s, schema::TRACE_STATE)?,
                attrs: child_attrs(s)?,
                dropped: opt_child(s, schema::DROPPED_ATTRIBUTES)?,
                flags: opt_child(s, schema::FLAGS)?,
            }),
        };
        Ok(SpansReader {
            rs: ResourceScopeReader::new(b)?,
            trace_id: opt_col(b, schema::TRACE_ID)?,
            span_id: opt_col(b, schema::SPAN_ID)?,
            trace_state: opt_col(b, schema::TRACE_STATE)?,
            parent_span_id: opt_col(b, schema::PARENT_SPAN_ID)?,
            flags: opt_col(b, schema::FLAGS)?,
            name: opt_col(b, schema::NAME)?,
            kind: opt_col(b, schema::SPAN_KIND)?,
            start: opt_col(b, schema::START_TIME)?,
            end: req_col(b, schema::TIME)?,
            status_code: opt_col(b, schema::STATUS_CODE)?,
            status_message: opt_col(b, schema::STATUS_MESSAGE)?,
            dropped_attributes: opt_col(b, schema::DROPPED_ATTRIBUTES)?,
            dropped_events: opt_col(b, schema::DROPPED_EVENTS)?,
            dropped_links: opt_col(b, schema::DROPPED_LINKS)?,
            promoted,
            attrs: opt_attrs(b, schema::ATTRIBUTES)?,
            events,
            links,
        })
    }

    fn span(&self, row: usize) -> Result<Span, ConvError> {
        let mut attributes = read_attrs(self.attrs.as_ref(), row)?;
        for (key, col) in &self.promoted {
            if let Some(v) = col.value(row) {
                attributes.push(KeyValue {
                    key: key.to_string(),
                    value: Some(AnyValue { value: Some(v) }),
                    key_strindex: 0,
                });
            }
        }
        let code = prim_at(self.status_code, row).unwrap_or(0);
        let message = str_at(self.status_message, row).unwrap_or_default();
        let status = (code != 0 || !message.is_empty()).then(|| Status { message: message.to_string(), code });
        Ok(Span {
            trace_id: bin_at(self.trace_id, row).unwrap_or_default().to_vec(),
            span_id: bin_at(self.span_id, row).unwrap_or_default().to_vec(),
            trace_state: str_at(self.trace_state, row).unwrap_or_default().to_string(),
            parent_span_id: bin_at(self.parent_span_id, row).unwrap_or_default().to_vec(),
            flags: prim_at(self.flags, row).unwrap_or(0),
            name: str_at(self.name, row).unwrap_or_default().to_string(),
            kind: prim_at(self.kind, row).unwrap_or(0),
            start_time_unix_nano: prim_at(self.start, row).unwrap_or(0) as u64,
            end_time_unix_nano: prim_at(Some(self.end), row).unwrap_or(0) as u64,
            attributes,
            dropped_attributes_count: prim_at(self.dropped_attributes, row).unwrap_or(0),
            events: self.events(row)?,
            dropped_events_count: prim_at(self.dropped_events, row).unwrap_or(0),
            links: self.links(row)?,
            dropped_links_count: prim_at(self.dropped_links, row).unwrap_or(0),
            status,
        })
    }

    fn events(&self, row: usize) -> Result<Vec<Event>, ConvError> {
        let Some(e) = &self.events else { return Ok(Vec::new()) };
        list_entries(e.list, row)?
            .map(|j| {
                Ok(Event {
                    time_unix_nano: prim_at(e.time, j).unwrap_or(0) as u64,
                    name: str_at(e.name, j).unwrap_or_default().to_string(),
                    attributes: read_attrs(e.attrs.as_ref(), j)?,
                    dropped_attributes_count: prim_at(e.dropped, j).unwrap_or(0),
                })
            })
            .collect()
    }

    fn links(&self, row: usize) -> Result<Vec<Link>, ConvError> {
        let Some(l) = &self.links else { return Ok(Vec::new()) };
        list_entries(l.list, row)?
            .map(|j| {
                Ok(Link {
                    trace_id: bin_at(l.trace_id, j).unwrap_or_default().to_vec(),
                    span_id: bin_at(l.span_id, j).unwrap_or_default().to_vec(),
                    trace_state: str_at(l.trace_state, j).unwrap_or_default().to_string(),
                    attributes: read_attrs(l.attrs.as_ref(), j)?,
                    dropped_attributes_count: prim_at(l.dropped, j).unwrap_or(0),
                    flags: prim_at(l.flags, j).unwrap_or(0),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::resource::v1::Resource;

    fn kv(key: &str, v: Value) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), key_strindex: 0 }
    }

    fn span(name: &str, attributes: Vec<KeyValue>) -> Span {
        Span {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
            name: name.into(),
            kind: 2,
            start_time_unix_nano: 100,
            end_time_unix_nano: 350,
            attributes,
            ..Default::default()
        }
    }

    fn request() -> ExportTraceServiceRequest {
        let full = Span {
            trace_state: "k=v".into(),
            parent_span_id: vec![9; 8],
            flags: 0x301,
            dropped_attributes_count: 1,
            dropped_events_count: 2,
            dropped_links_count: 3,
            events: vec![
                Event {
                    time_unix_nano: 200,
                    name: "first_token".into(),
                    attributes: vec![],
                    dropped_attributes_count: 0,
                },
                Event {
                    time_unix_nano: u64::MAX,
                    name: String::new(),
                    attributes: vec![kv("n", Value::IntValue(1))],
                    dropped_attributes_count: 4,
                },
            ],
            links: vec![Link {
                trace_id: vec![1; 16],
                span_id: vec![],
                trace_state: "t".into(),
                attributes: vec![kv("l", Value::BoolValue(false))],
                dropped_attributes_count: 5,
                flags: 1,
            }],
            status: Some(Status { message: "boom".into(), code: 2 }),
            ..span(
                "chat",
                vec![
                    kv("gen_ai.request.model", Value::StringValue("llama".into())),
                    kv("other", Value::DoubleValue(1.0)),
                    kv("gen_ai.usage.input_tokens", Value::IntValue(12)),
                    // Wrong type: stays in the map.
                    kv("gen_ai.usage.output_tokens", Value::StringValue("34".into())),
                    kv("gen_ai.latency.e2e", Value::DoubleValue(0.25)),
                    // Duplicate of a promoted key: only the first occurrence is promoted.
                    kv("gen_ai.request.model", Value::StringValue("second".into())),
                ],
            )
        };
        // First occurrence has the wrong type: nothing promoted, both stay in the map.
        let dup_wrong_first = span(
            "dup",
            vec![kv("gen_ai.latency.e2e", Value::IntValue(1)), kv("gen_ai.latency.e2e", Value::DoubleValue(2.0))],
        );
        let empty_ids = Span { trace_id: vec![], span_id: vec![], end_time_unix_nano: 50, ..span("backwards", vec![]) };
        ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    resource: Some(Resource {
                        attributes: vec![kv("service.name", Value::StringValue("router".into()))],
                        ..Default::default()
                    }),
                    scope_spans: vec![
                        ScopeSpans {
                            scope: Some(InstrumentationScope { name: "s".into(), ..Default::default() }),
                            spans: vec![full, dup_wrong_first],
                            schema_url: "u".into(),
                        },
                        ScopeSpans {
                            scope: Some(InstrumentationScope::default()),
                            spans: vec![empty_ids],
                            schema_url: String::new(),
                        },
                    ],
                    schema_url: String::new(),
                },
                ResourceSpans {
                    resource: Some(Resource::default()),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(InstrumentationScope::default()),
                        spans: vec![span("x", vec![])],
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                },
            ],
        }
    }

    /// `request()` as it comes back: promoted attributes after the map, in PROMOTED_SPAN_ATTRIBUTES order.
    fn expected() -> ExportTraceServiceRequest {
        let mut r = request();
        r.resource_spans[0].scope_spans[0].spans[0].attributes = vec![
            kv("other", Value::DoubleValue(1.0)),
            kv("gen_ai.usage.output_tokens", Value::StringValue("34".into())),
            kv("gen_ai.request.model", Value::StringValue("second".into())),
            kv("gen_ai.request.model", Value::StringValue("llama".into())),
            kv("gen_ai.usage.input_tokens", Value::IntValue(12)),
            kv("gen_ai.latency.e2e", Value::DoubleValue(0.25)),
        ];
        r
    }

    #[test]
    fn spans_round_trip() {
        let b = to_batch(&request()).unwrap();
        assert_eq!(b.schema(), schema::spans_schema());
        assert_eq!(b.num_rows(), 4);
        assert_eq!(from_batch(&b).unwrap(), expected());
    }

    #[test]
    fn promoted_columns_and_duration() {
        let b = to_batch(&request()).unwrap();
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let model = col("gen_ai.request.model");
        assert_eq!(model.as_string::<i32>().iter().collect::<Vec<_>>(), vec![Some("llama"), None, None, None]);
        let input = col("gen_ai.usage.input_tokens");
        assert_eq!(input.as_primitive::<Int64Type>().value(0), 12);
        assert!(col("gen_ai.usage.output_tokens").is_null(0), "a string is not promoted into an int column");
        let e2e = col("gen_ai.latency.e2e");
        let e2e = e2e.as_primitive::<Float64Type>();
        assert_eq!((e2e.value(0), e2e.is_null(1)), (0.25, true));
        let attrs = col(schema::ATTRIBUTES);
        let kept: Vec<String> =
            crate::arrow::anyvalue::attributes_at(attrs.as_map(), 0).unwrap().into_iter().map(|k| k.key).collect();
        assert_eq!(kept, vec!["other", "gen_ai.usage.output_tokens", "gen_ai.request.model"]);
        let duration = col(schema::DURATION);
        let duration = duration.as_primitive::<Int64Type>();
        assert_eq!((duration.value(0), duration.value(2)), (250, -50), "end - start, wrapping");
        let end = crate::arrow::time_column(&b).unwrap();
        assert_eq!(end.value(0), 350, "time_unix_nano is the end time");
        let events = col(schema::EVENTS);
        let links = col(schema::LINKS);
        assert_eq!((events.null_count(), links.null_count()), (0, 0));
        assert_eq!(events.as_list::<i32>().value_offsets(), &[0, 2, 2, 2, 2]);
        let service = col(schema::SERVICE_NAME);
        assert_eq!(
            service.as_string::<i32>().iter().collect::<Vec<_>>(),
            vec![Some("router"); 3].into_iter().chain([None]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn default_status_comes_back_as_none() {
        let mut req = request();
        req.resource_spans[1].scope_spans[0].spans[0].status = Some(Status::default());
        let back = from_batch(&to_batch(&req).unwrap()).unwrap();
        assert_eq!(back.resource_spans[1].scope_spans[0].spans[0].status, None);
        assert_eq!(
            back.resource_spans[0].scope_spans[0].spans[0].status,
            Some(Status { message: "boom".into(), code: 2 })
        );
    }

    #[test]
    fn end_time_is_required_and_other_columns_optional() {
        let b = to_batch(&request()).unwrap();
        let without = |name: &str| {
            let idx: Vec<usize> = (0..b.num_columns()).filter(|&i| b.schema().field(i).name() != name).collect();
            b.project(&idx).unwrap()
        };
        assert!(matches!(from_batch(&without(schema::TIME)), Err(ConvError::Schema(m)) if m.contains(schema::TIME)));
        let back = from_batch(&without("gen_ai.request.model")).unwrap();
        let attrs = &back.resource_spans[0].scope_spans[0].spans[0].attributes;
        assert_eq!(attrs.iter().filter(|k| k.key == "gen_ai.request.model").count(), 1, "only the map's copy");
        let back = from_batch(&without(schema::EVENTS)).unwrap();
        assert!(back.resource_spans[0].scope_spans[0].spans[0].events.is_empty());
    }
}
