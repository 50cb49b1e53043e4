//! Attribute lists (KeyValue) ⇄ the Arrow attributes map column, plus the column helpers and
//! the resource / scope columns that the metrics and spans converters share.
//!
//! An attribute value is a struct `{type, str, bool, int, double, bytes}` (see
//! [`schema::any_value_fields`]); arrays and kvlists are stored as the protobuf encoding of the
//! whole AnyValue in `bytes`. An AnyValue with no value is type EMPTY; a KeyValue without an
//! AnyValue is a map entry whose value struct is null.

use super::ConvError;
use super::schema::{self, value_type};
use arrow_array::builder::{BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Float64Array, Int64Array, ListArray, MapArray, RecordBatch,
    StringArray, StructArray, TimestampNanosecondArray, UInt8Array, UInt32Array,
};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, OffsetBufferBuilder, ScalarBuffer};
use arrow_schema::{DataType, FieldRef, Fields, Schema};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use std::sync::Arc;

// ---- column helpers (shared by the converters) ---------------------------------------------

/// The column `name` of `batch` as `T`; `None` when absent, an error when of another type.
pub(crate) fn opt_col<'a, T: Array + 'static>(batch: &'a RecordBatch, name: &str) -> Result<Option<&'a T>, ConvError> {
    match batch.column_by_name(name) {
        None => Ok(None),
        Some(c) => c
            .as_any()
            .downcast_ref::<T>()
            .map(Some)
            .ok_or_else(|| ConvError::Schema(format!("column {name} has unexpected type {}", c.data_type()))),
    }
}

/// The column `name` of `batch` as `T`; an error when absent or of another type.
pub(crate) fn req_col<'a, T: Array + 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ConvError> {
    opt_col(batch, name)?.ok_or_else(|| ConvError::Schema(format!("missing column {name}")))
}

/// The child `name` of a struct array as `T`; `None` when absent, an error when of another type.
pub(crate) fn opt_child<'a, T: Array + 'static>(s: &'a StructArray, name: &str) -> Result<Option<&'a T>, ConvError> {
    match s.column_by_name(name) {
        None => Ok(None),
        Some(c) => c
            .as_any()
            .downcast_ref::<T>()
            .map(Some)
            .ok_or_else(|| ConvError::Schema(format!("struct field {name} has unexpected type {}", c.data_type()))),
    }
}

/// The value at `row` of an optional string column (`None` when absent or null).
pub(crate) fn str_at(a: Option<&StringArray>, row: usize) -> Option<&str> {
    a.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}

/// The value at `row` of an optional binary column (`None` when absent or null).
pub(crate) fn bin_at(a: Option<&BinaryArray>, row: usize) -> Option<&[u8]> {
    a.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}

/// The value at `row` of an optional primitive column (`None` when absent or null).
pub(crate) fn prim_at<T: arrow_array::ArrowPrimitiveType>(
    a: Option<&arrow_array::PrimitiveArray<T>>,
    row: usize,
) -> Option<T::Native> {
    a.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}

/// The value at `row` of an optional boolean column (`None` when absent or null).
pub(crate) fn bool_at(a: Option<&BooleanArray>, row: usize) -> Option<bool> {
    a.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}

/// A Timestamp(ns, UTC) array of OTLP `fixed64` times (bit pattern kept).
pub(crate) fn timestamps(v: Vec<i64>) -> ArrayRef {
    Arc::new(TimestampNanosecondArray::new(ScalarBuffer::from(v), None).with_timezone("UTC"))
}

/// The item field of the list column `name` of `schema`.
pub(crate) fn list_item(schema: &Schema, name: &str) -> Result<FieldRef, ConvError> {
    match schema.field_with_name(name)?.data_type() {
        DataType::List(f) => Ok(f.clone()),
        t => Err(ConvError::Schema(format!("column {name} is {t}, not a list"))),
    }
}

/// The fields of a struct-typed field.
pub(crate) fn struct_fields(f: &FieldRef) -> Result<Fields, ConvError> {
    match f.data_type() {
        DataType::Struct(fields) => Ok(fields.clone()),
        t => Err(ConvError::Schema(format!("field {} is {t}, not a struct", f.name()))),
    }
}

/// Finishes list offsets, failing (not panicking) when they overflow i32.
pub(crate) fn finish_offsets(o: OffsetBufferBuilder<i32>) -> Result<OffsetBuffer<i32>, ConvError> {
    o.try_finish().map_err(|e| ConvError::Schema(format!("list too large for i32 offsets: {e}")))
}

/// A position (index within the request) as u32.
pub(crate) fn index_u32(i: usize) -> Result<u32, ConvError> {
    u32::try_from(i).map_err(|_| ConvError::Schema(format!("index {i} exceeds u32")))
}

/// The entries of `row` of a list column as a range into its values.
pub(crate) fn list_range<O: arrow_array::OffsetSizeTrait>(offsets: &[O], row: usize) -> std::ops::Range<usize> {
    match (offsets.get(row), offsets.get(row + 1)) {
        (Some(s), Some(e)) => s.as_usize()..e.as_usize(),
        _ => 0..0,
    }
}

/// The entry range of `row` of a list column (empty when null), checked against its values.
pub(crate) fn list_entries(list: &ListArray, row: usize) -> Result<std::ops::Range<usize>, ConvError> {
    if list.is_null(row) {
        return Ok(0..0);
    }
    let range = list_range(list.value_offsets(), row);
    if range.start > range.end || range.end > list.values().len() {
        return Err(ConvError::Schema("list offsets exceed its values".into()));
    }
    Ok(range)
}

/// An optional list-of-struct column of `batch` and its struct values.
pub(crate) fn list_struct<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<Option<(&'a ListArray, &'a StructArray)>, ConvError> {
    let Some(list) = opt_col::<ListArray>(batch, name)? else { return Ok(None) };
    let values = list
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(|| ConvError::Schema(format!("column {name} items are not structs")))?;
    Ok(Some((list, values)))
}

// ---- attributes builder --------------------------------------------------------------------

/// Builds an attributes map column ([`schema::attributes_type`]), one row per attribute list.
pub struct AttributesBuilder {
    offsets: OffsetBufferBuilder<i32>,
    row_len: usize,
    keys: StringBuilder,
    nulls: NullBufferBuilder,
    ty: Vec<u8>,
    str: StringBuilder,
    bool: BooleanBuilder,
    int: Int64Builder,
    double: Float64Builder,
    bytes: BinaryBuilder,
    scratch: Vec<u8>,
}

impl AttributesBuilder {
    /// A builder with room for `rows` rows holding `entries` entries in all.
    pub fn with_capacity(rows: usize, entries: usize) -> Self {
        AttributesBuilder {
            offsets: OffsetBufferBuilder::new(rows),
            row_len: 0,
            keys: StringBuilder::with_capacity(entries, entries * 16),
            nulls: NullBufferBuilder::new(entries),
            ty: Vec::with_capacity(entries),
            str: StringBuilder::with_capacity(entries, entries * 16),
            bool: BooleanBuilder::with_capacity(entries),
            int: Int64Builder::with_capacity(entries),
            double: Float64Builder::with_capacity(entries),
            bytes: BinaryBuilder::with_capacity(entries, 0),
            scratch: Vec::new(),
        }
    }

    /// Appends one row holding `kvs`.
    pub fn append(&mut self, kvs: &[KeyValue]) {
        for kv in kvs {
            self.push_entry(kv);
        }
        self.end_row();
    }

    /// Adds one entry to the row being built (ended by [`AttributesBuilder::end_row`]).
    pub fn push_entry(&mut self, kv: &KeyValue) {
        self.keys.append_value(&kv.key);
        self.push_value(kv.value.as_ref());
        self.row_len += 1;
    }

    /// Ends the row being built.
    pub fn end_row(&mut self) {
        self.offsets.push_length(self.row_len);
        self.row_len = 0;
    }

    fn push_value(&mut self, v: Option<&AnyValue>) {
        let Some(v) = v else {
            self.nulls.append_null();
            self.push_parts(value_type::EMPTY, None, None, None, None);
            return;
        };
        self.nulls.append_non_null();
        match &v.value {
            // string_value_strindex (a profiles dictionary reference) has no column: stored as EMPTY.
            None | Some(Value::StringValueStrindex(_)) => self.push_parts(value_type::EMPTY, None, None, None, None),
            Some(Value::StringValue(s)) => {
                self.push_parts(value_type::STRING, Some(s), None, None, None);
            }
            Some(Value::BoolValue(b)) => {
                self.ty.push(value_type::BOOL);
                self.str.append_null();
                self.bool.append_value(*b);
                self.int.append_null();
                self.double.append_null();
                self.bytes.append_null();
            }
            Some(Value::IntValue(i)) => self.push_parts(value_type::INT, None, Some(*i), None, None),
            Some(Value::DoubleValue(d)) => self.push_parts(value_type::DOUBLE, None, None, Some(*d), None),
            Some(Value::BytesValue(b)) => self.push_parts(value_type::BYTES, None, None, None, Some(b)),
            Some(Value::ArrayValue(_)) | Some(Value::KvlistValue(_)) => {
                let ty =
                    if matches!(v.value, Some(Value::ArrayValue(_))) { value_type::ARRAY } else { value_type::KVLIST };
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                // Encoding into a Vec cannot fail (it grows as needed).
                let _ = v.encode(&mut scratch);
                self.push_parts(ty, None, None, None, Some(&scratch));
                self.scratch = scratch;
            }
        }
    }

    fn push_parts(&mut self, ty: u8, s: Option<&str>, i: Option<i64>, d: Option<f64>, b: Option<&[u8]>) {
        self.ty.push(ty);
        self.str.append_option(s);
        self.bool.append_null();
        self.int.append_option(i);
        self.double.append_option(d);
        self.bytes.append_option(b);
    }

    /// Finishes the column.
    pub fn finish(mut self) -> Result<MapArray, ConvError> {
        let children: Vec<ArrayRef> = vec![
            Arc::new(UInt8Array::from(std::mem::take(&mut self.ty))),
            Arc::new(self.str.finish()),
            Arc::new(self.bool.finish()),
            Arc::new(self.int.finish()),
            Arc::new(self.double.finish()),
            Arc::new(self.bytes.finish()),
        ];
        let values = StructArray::try_new(schema::any_value_fields(), children, self.nulls.finish())?;
        let entries_field = Arc::new(schema::attributes_entries_field());
        let entries = StructArray::try_new(
            struct_fields(&entries_field)?,
            vec![Arc::new(self.keys.finish()), Arc::new(values)],
            None,
        )?;
        Ok(MapArray::try_new(entries_field, finish_offsets(self.offsets)?, entries, None, false)?)
    }
}

// ---- attributes reader ---------------------------------------------------------------------

/// Reads attribute lists back from an attributes map column (children looked up once).
pub struct AttributesReader<'a> {
    map: &'a MapArray,
    keys: &'a StringArray,
    values: &'a StructArray,
    ty: &'a UInt8Array,
    str: Option<&'a StringArray>,
    bool: Option<&'a BooleanArray>,
    int: Option<&'a Int64Array>,
    double: Option<&'a Float64Array>,
    bytes: Option<&'a BinaryArray>,
}

impl<'a> AttributesReader<'a> {
    /// A reader over `map` (an error when its entries are not {key, value struct}).
    pub fn new(map: &'a MapArray) -> Result<Self, ConvError> {
        let entries = map.entries();
        let keys = entries
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| ConvError::Schema("attribute map keys are not Utf8".into()))?;
        let values = entries
            .columns()
            .get(1)
            .and_then(|c| c.as_any().downcast_ref::<StructArray>())
            .ok_or_else(|| ConvError::Schema("attribute map values are not structs".into()))?;
        let ty = opt_child::<UInt8Array>(values, "type")?
            .ok_or_else(|| ConvError::Schema("attribute value struct has no type".into()))?;
        Ok(AttributesReader {
            map,
            keys,
            values,
            ty,
            str: opt_child(values, "str")?,
            bool: opt_child(values, "bool")?,
            int: opt_child(values, "int")?,
            double: opt_child(values, "double")?,
            bytes: opt_child(values, "bytes")?,
        })
    }

    /// The attributes of `row` (empty when the row is null).
    pub fn read(&self, row: usize) -> Result<Vec<KeyValue>, ConvError> {
        if row >= self.map.len() {
            return Err(ConvError::Schema(format!("row {row} out of range")));
        }
        if self.map.is_null(row) {
            return Ok(Vec::new());
        }
        let range = list_range(self.map.value_offsets(), row);
        let mut out = Vec::with_capacity(range.len());
        for j in range {
            if j >= self.keys.len() {
                return Err(ConvError::Schema("attribute map offsets exceed its entries".into()));
            }
            let value = if self.values.is_null(j) { None } else { Some(self.value(j)?) };
            out.push(KeyValue { key: self.keys.value(j).to_string(), value, key_strindex: 0 });
        }
        Ok(out)
    }

    fn value(&self, j: usize) -> Result<AnyValue, ConvError> {
        let missing = |what: &str| ConvError::Schema(format!("attribute value of type {what} has no {what} field"));
        let value = match self.ty.value(j) {
            value_type::EMPTY => None,
            value_type::STRING => {
                Some(Value::StringValue(str_at(self.str, j).ok_or_else(|| missing("str"))?.to_string()))
            }
            value_type::BOOL => Some(Value::BoolValue(bool_at(self.bool, j).ok_or_else(|| missing("bool"))?)),
            value_type::INT => Some(Value::IntValue(prim_at(self.int, j).ok_or_else(|| missing("int"))?)),
            value_type::DOUBLE => Some(Value::DoubleValue(prim_at(self.double, j).ok_or_else(|| missing("double"))?)),
            value_type::BYTES => {
                Some(Value::BytesValue(bin_at(self.bytes, j).ok_or_else(|| missing("bytes"))?.to_vec()))
            }
            t @ (value_type::ARRAY | value_type::KVLIST) => {
                let raw = bin_at(self.bytes, j).ok_or_else(|| missing("bytes"))?;
                let v = AnyValue::decode(raw)?.value;
                match (&v, t) {
                    (Some(Value::ArrayValue(_)), value_type::ARRAY)
                    | (Some(Value::KvlistValue(_)), value_type::KVLIST) => v,
                    _ => return Err(ConvError::Schema(format!("attribute value of type {t} holds another AnyValue"))),
                }
            }
            t => return Err(ConvError::Schema(format!("unknown attribute value type {t}"))),
        };
        Ok(AnyValue { value })
    }
}

/// The attributes of `row` of an attributes map column.
pub fn attributes_at(col: &MapArray, row: usize) -> Result<Vec<KeyValue>, ConvError> {
    AttributesReader::new(col)?.read(row)
}

/// An optional attributes column of `batch` (absent → `None`).
pub(crate) fn opt_attrs<'a>(batch: &'a RecordBatch, name: &str) -> Result<Option<AttributesReader<'a>>, ConvError> {
    opt_col::<MapArray>(batch, name)?.map(AttributesReader::new).transpose()
}

/// Reads `row` of an optional attributes column (absent → empty).
pub(crate) fn read_attrs(r: Option<&AttributesReader<'_>>, row: usize) -> Result<Vec<KeyValue>, ConvError> {
    r.map_or(Ok(Vec::new()), |r| r.read(row))
}

// ---- resource and scope columns ------------------------------------------------------------

/// Builds the 13 resource and scope columns shared by both schemas. Resources and scopes are
/// built once each and expanded to rows with `take`.
pub(crate) struct ResourceScopeBuilder {
    service: [StringBuilder; 3],
    res_attrs: AttributesBuilder,
    res_dropped: Vec<u32>,
    res_schema_url: StringBuilder,
    scope_name: StringBuilder,
    scope_version: StringBuilder,
    scope_attrs: AttributesBuilder,
    scope_dropped: Vec<u32>,
    scope_schema_url: StringBuilder,
    resource_index: Vec<u32>,
    scope_index: Vec<u32>,
    res_take: Vec<u32>,
    scope_take: Vec<u32>,
}

impl ResourceScopeBuilder {
    /// A builder for `rows` rows of `resources` resources and `scopes` scopes.
    pub(crate) fn with_capacity(rows: usize, resources: usize, scopes: usize) -> Self {
        ResourceScopeBuilder {
            service: std::array::from_fn(|_| StringBuilder::with_capacity(resources, resources * 16)),
            res_attrs: AttributesBuilder::with_capacity(resources, resources * 8),
            res_dropped: Vec::with_capacity(resources),
            res_schema_url: StringBuilder::with_capacity(resources, 0),
            scope_name: StringBuilder::with_capacity(scopes, scopes * 16),
            scope_version: StringBuilder::with_capacity(scopes, scopes * 8),
            scope_attrs: AttributesBuilder::with_capacity(scopes, 0),
            scope_dropped: Vec::with_capacity(scopes),
            scope_schema_url: StringBuilder::with_capacity(scopes, 0),
            resource_index: Vec::with_capacity(rows),
            scope_index: Vec::with_capacity(rows),
            res_take: Vec::with_capacity(rows),
            scope_take: Vec::with_capacity(rows),
        }
    }

    /// Adds a resource (promoting `service.*` string attributes); its rows follow.
    pub(crate) fn add_resource(&mut self, resource: Option<&Resource>, schema_url: &str) {
        let attrs = resource.map_or(&[][..], |r| &r.attributes[..]);
        let mut seen = [false; 3];
        let mut promoted: [Option<&str>; 3] = [None; 3];
        for kv in attrs {
            if let Some(c) = schema::PROMOTED_RESOURCE_ATTRIBUTES.iter().position(|k| *k == kv.key)
                && !seen[c]
            {
                seen[c] = true;
                if let Some(AnyValue { value: Some(Value::StringValue(s)) }) = &kv.value {
                    promoted[c] = Some(s);
                    continue;
                }
            }
            self.res_attrs.push_entry(kv);
        }
        self.res_attrs.end_row();
        for (b, v) in self.service.iter_mut().zip(promoted) {
            b.append_option(v);
        }
        self.res_dropped.push(resource.map_or(0, |r| r.dropped_attributes_count));
        self.res_schema_url.append_value(schema_url);
    }

    /// Adds a scope of the last resource; its rows follow.
    pub(crate) fn add_scope(&mut self, scope: Option<&InstrumentationScope>, schema_url: &str) {
        self.scope_name.append_value(scope.map_or("", |s| s.name.as_str()));
        self.scope_version.append_value(scope.map_or("", |s| s.version.as_str()));
        self.scope_attrs.append(scope.map_or(&[][..], |s| &s.attributes[..]));
        self.scope_dropped.push(scope.map_or(0, |s| s.dropped_attributes_count));
        self.scope_schema_url.append_value(schema_url);
    }

    /// Adds `n` rows of the last resource and scope, at positions `resource_index` / `scope_index`.
    pub(crate) fn push_rows(&mut self, resource_index: u32, scope_index: u32, n: usize) {
        let res = self.res_dropped.len().saturating_sub(1) as u32;
        let scope = self.scope_dropped.len().saturating_sub(1) as u32;
        self.resource_index.extend(std::iter::repeat_n(resource_index, n));
        self.scope_index.extend(std::iter::repeat_n(scope_index, n));
        self.res_take.extend(std::iter::repeat_n(res, n));
        self.scope_take.extend(std::iter::repeat_n(scope, n));
    }

    /// The 13 columns, in schema order.
    pub(crate) fn finish(self) -> Result<Vec<ArrayRef>, ConvError> {
        let res_take = UInt32Array::from(self.res_take);
        let scope_take = UInt32Array::from(self.scope_take);
        let take_res = |a: ArrayRef| arrow_select::take::take(a.as_ref(), &res_take, None);
        let take_scope = |a: ArrayRef| arrow_select::take::take(a.as_ref(), &scope_take, None);
        let [mut name, mut version, mut instance] = self.service;
        let (mut res_url, mut scope_name, mut scope_version, mut scope_url) =
            (self.res_schema_url, self.scope_name, self.scope_version, self.scope_schema_url);
        Ok(vec![
            Arc::new(UInt32Array::from(self.resource_index)),
            take_res(Arc::new(name.finish()))?,
            take_res(Arc::new(version.finish()))?,
            take_res(Arc::new(instance.finish()))?,
            take_res(Arc::new(self.res_attrs.finish()?))?,
            take_res(Arc::new(UInt32Array::from(self.res_dropped)))?,
            take_res(Arc::new(res_url.finish()))?,
            Arc::new(UInt32Array::from(self.scope_index)),
            take_scope(Arc::new(scope_name.finish()))?,
            take_scope(Arc::new(scope_version.finish()))?,
            take_scope(Arc::new(self.scope_attrs.finish()?))?,
            take_scope(Arc::new(UInt32Array::from(self.scope_dropped)))?,
            take_scope(Arc::new(scope_url.finish()))?,
        ])
    }
}

/// Reads the resource and scope columns back (each one optional; absent → default).
pub(crate) struct ResourceScopeReader<'a> {
    resource_index: Option<&'a UInt32Array>,
    service: [Option<&'a StringArray>; 3],
    res_attrs: Option<AttributesReader<'a>>,
    res_dropped: Option<&'a UInt32Array>,
    res_schema_url: Option<&'a StringArray>,
    scope_index: Option<&'a UInt32Array>,
    scope_name: Option<&'a StringArray>,
    scope_version: Option<&'a StringArray>,
    scope_attrs: Option<AttributesReader<'a>>,
    scope_dropped: Option<&'a UInt32Array>,
    scope_schema_url: Option<&'a StringArray>,
}

impl<'a> ResourceScopeReader<'a> {
    /// Looks the columns up by name.
    pub(crate) fn new(batch: &'a RecordBatch) -> Result<Self, ConvError> {
        Ok(ResourceScopeReader {
            resource_index: opt_col(batch, schema::RESOURCE_INDEX)?,
            service: [
                opt_col(batch, schema::SERVICE_NAME)?,
                opt_col(batch, schema::SERVICE_VERSION)?,
                opt_col(batch, schema::SERVICE_INSTANCE_ID)?,
            ],
            res_attrs: opt_attrs(batch, schema::RESOURCE_ATTRIBUTES)?,
            res_dropped: opt_col(batch, schema::RESOURCE_DROPPED)?,
            res_schema_url: opt_col(batch, schema::RESOURCE_SCHEMA_URL)?,
            scope_index: opt_col(batch, schema::SCOPE_INDEX)?,
            scope_name: opt_col(batch, schema::SCOPE_NAME)?,
            scope_version: opt_col(batch, schema::SCOPE_VERSION)?,
            scope_attrs: opt_attrs(batch, schema::SCOPE_ATTRIBUTES)?,
            scope_dropped: opt_col(batch, schema::SCOPE_DROPPED)?,
            scope_schema_url: opt_col(batch, schema::SCOPE_SCHEMA_URL)?,
        })
    }

    /// resource_index of `row` (0 when absent).
    pub(crate) fn resource_index(&self, row: usize) -> u32 {
        prim_at(self.resource_index, row).unwrap_or(0)
    }

    /// scope_index of `row` (0 when absent).
    pub(crate) fn scope_index(&self, row: usize) -> u32 {
        prim_at(self.scope_index, row).unwrap_or(0)
    }

    /// The resource of `row`: map entries, then the promoted `service.*` columns.
    pub(crate) fn resource(&self, row: usize) -> Result<Resource, ConvError> {
        let mut attributes = read_attrs(self.res_attrs.as_ref(), row)?;
        for (key, col) in schema::PROMOTED_RESOURCE_ATTRIBUTES.iter().zip(self.service) {
            if let Some(s) = str_at(col, row) {
                attributes.push(string_kv(key, s));
            }
        }
        Ok(Resource {
            attributes,
            dropped_attributes_count: prim_at(self.res_dropped, row).unwrap_or(0),
            entity_refs: Vec::new(),
        })
    }

    /// The resource schema_url of `row`.
    pub(crate) fn resource_schema_url(&self, row: usize) -> String {
        str_at(self.res_schema_url, row).unwrap_or_default().to_string()
    }

    /// The scope of `row`.
    pub(crate) fn scope(&self, row: usize) -> Result<InstrumentationScope, ConvError> {
        Ok(InstrumentationScope {
            name: str_at(self.scope_name, row).unwrap_or_default().to_string(),
            version: str_at(self.scope_version, row).unwrap_or_default().to_string(),
            attributes: read_attrs(self.scope_attrs.as_ref(), row)?,
            dropped_attributes_count: prim_at(self.scope_dropped, row).unwrap_or(0),
        })
    }

    /// The scope schema_url of `row`.
    pub(crate) fn scope_schema_url(&self, row: usize) -> String {
        str_at(self.scope_schema_url, row).unwrap_or_default().to_string()
    }
}

/// A KeyValue holding a string.
pub(crate) fn string_kv(key: &str, s: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(Value::StringValue(s.to_string())) }),
        key_strindex: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};

    fn kv(key: &str, value: Option<Value>) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value }), key_strindex: 0 }
    }

    fn every_type() -> Vec<KeyValue> {
        let nested = KeyValueList { values: vec![kv("inner", Some(Value::IntValue(-3)))] };
        vec![
            kv("s", Some(Value::StringValue("x".into()))),
            kv("b", Some(Value::BoolValue(true))),
            kv("i", Some(Value::IntValue(i64::MIN))),
            kv("d", Some(Value::DoubleValue(-0.5))),
            kv("y", Some(Value::BytesValue(vec![0, 255]))),
            kv(
                "a",
                Some(Value::ArrayValue(ArrayValue {
                    values: vec![
                        AnyValue { value: Some(Value::KvlistValue(nested.clone())) },
                        AnyValue { value: None },
                    ],
                })),
            ),
            kv("k", Some(Value::KvlistValue(nested))),
            kv("e", None),
            KeyValue { key: "none".into(), value: None, key_strindex: 0 },
            kv("s", Some(Value::StringValue("duplicate keys kept".into()))),
        ]
    }

    #[test]
    fn every_value_type_round_trips_in_order() {
        let rows = vec![every_type(), vec![], vec![kv("only", Some(Value::IntValue(7)))]];
        let mut b = AttributesBuilder::with_capacity(0, 0);
        for r in &rows {
            b.append(r);
        }
        let map = b.finish().unwrap();
        assert_eq!(map.data_type(), &schema::attributes_type());
        assert_eq!(map.len(), 3);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(&attributes_at(&map, i).unwrap(), r, "row {i}");
        }
        assert!(attributes_at(&map, 3).is_err());
    }

    #[test]
    fn value_struct_uses_the_type_codes() {
        let mut b = AttributesBuilder::with_capacity(1, 4);
        b.append(&every_type());
        let map = b.finish().unwrap();
        let values = map.entries().column(1).as_any().downcast_ref::<StructArray>().unwrap();
        let ty = values.column(0).as_any().downcast_ref::<UInt8Array>().unwrap();
        let codes: Vec<u8> = (0..ty.len()).map(|i| ty.value(i)).collect();
        use value_type::*;
        assert_eq!(codes, vec![STRING, BOOL, INT, DOUBLE, BYTES, ARRAY, KVLIST, EMPTY, EMPTY, STRING]);
        assert!(values.is_null(8), "KeyValue without value is a null struct");
        assert!(values.is_valid(7), "AnyValue without value is an EMPTY struct");
        let bytes = values.column(5).as_any().downcast_ref::<BinaryArray>().unwrap();
        let decoded = AnyValue::decode(bytes.value(6)).unwrap();
        assert!(matches!(decoded.value, Some(Value::KvlistValue(ref l)) if l.values.len() == 1));
    }

    #[test]
    fn unknown_type_code_is_an_error() {
        let mut b = AttributesBuilder::with_capacity(1, 1);
        b.append(&[kv("i", Some(Value::IntValue(1)))]);
        let map = b.finish().unwrap();
        let (field, offsets, entries, nulls, ordered) = map.into_parts();
        let (efields, mut ecols, enulls) = entries.into_parts();
        let values = ecols[1].as_any().downcast_ref::<StructArray>().unwrap().clone();
        let (vfields, mut vcols, vnulls) = values.into_parts();
        vcols[0] = Arc::new(UInt8Array::from(vec![42u8]));
        ecols[1] = Arc::new(StructArray::new(vfields, vcols, vnulls));
        let map = MapArray::new(field, offsets, StructArray::new(efields, ecols, enulls), nulls, ordered);
        assert!(matches!(attributes_at(&map, 0), Err(ConvError::Schema(_))));
    }
}
