//! Reading the number points of a metrics batch for a detector: name, time, value, point
//! attributes, and each row's resource and scope (decoded once per resource / scope of the batch);
//! and the typed column look-ups every detector uses.

use arrow_array::{
    Array, Float64Array, MapArray, RecordBatch, StringArray, TimestampNanosecondArray, UInt8Array, UInt32Array,
};
use inferwatch_core::arrow::anyvalue::AttributesReader;
use inferwatch_core::arrow::{ConvError, metrics, schema};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::HashMap;

/// The metrics-schema columns [`Rows`] reads (what a processor built on it declares in `needs`).
pub const COLUMNS: &[&str] = &[
    schema::RESOURCE_INDEX,
    schema::SCOPE_INDEX,
    schema::METRIC_NAME,
    schema::KIND,
    schema::VALUE,
    schema::TIME,
    schema::SERVICE_NAME,
    schema::SERVICE_VERSION,
    schema::SERVICE_INSTANCE_ID,
    schema::RESOURCE_ATTRIBUTES,
    schema::SCOPE_NAME,
    schema::SCOPE_VERSION,
    schema::SCOPE_ATTRIBUTES,
    schema::ATTRIBUTES,
];

/// One number data point (gauge or sum) with a finite value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NumberPoint<'a> {
    /// Metric name.
    pub name: &'a str,
    /// Event time, ns since the epoch.
    pub time: u64,
    /// The value.
    pub value: f64,
}

/// The rows of one metrics batch.
pub struct Rows<'a> {
    batch: &'a RecordBatch,
    names: &'a StringArray,
    kinds: &'a UInt8Array,
    values: &'a Float64Array,
    times: &'a TimestampNanosecondArray,
    attrs: Option<AttributesReader<'a>>,
    resource_index: Option<&'a UInt32Array>,
    scope_index: Option<&'a UInt32Array>,
    resources: HashMap<u32, Resource>,
    scopes: HashMap<(u32, u32), InstrumentationScope>,
    scratch_resource: Resource,
    scratch_scope: InstrumentationScope,
}

/// The column `name` of `batch` as `T`; an error when absent or of another type.
pub fn column<'a, T: Array + 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ConvError> {
    opt_column(batch, name)
        .ok_or_else(|| ConvError::Schema(format!("detector input: no column {name} of the expected type")))
}

/// The column `name` of `batch` as `T`; `None` when absent or of another type.
pub fn opt_column<'a, T: Array + 'static>(batch: &'a RecordBatch, name: &str) -> Option<&'a T> {
    batch.column_by_name(name).and_then(|c| c.as_any().downcast_ref::<T>())
}

impl<'a> Rows<'a> {
    /// A reader over `batch` (metrics schema).
    pub fn new(batch: &'a RecordBatch) -> Result<Self, ConvError> {
        let attrs = match opt_column::<MapArray>(batch, schema::ATTRIBUTES) {
            Some(m) => Some(AttributesReader::new(m)?),
            None => None,
        };
        Ok(Rows {
            batch,
            names: column(batch, schema::METRIC_NAME)?,
            kinds: column(batch, schema::KIND)?,
            values: column(batch, schema::VALUE)?,
            times: inferwatch_core::arrow::time_column(batch)?,
            attrs,
            resource_index: opt_column(batch, schema::RESOURCE_INDEX),
            scope_index: opt_column(batch, schema::SCOPE_INDEX),
            resources: HashMap::new(),
            scopes: HashMap::new(),
            scratch_resource: Resource::default(),
            scratch_scope: InstrumentationScope::default(),
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    /// True when the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }

    /// Row `row` as a number point; `None` for other kinds, a missing value or a non-finite one.
    pub fn number(&self, row: usize) -> Option<NumberPoint<'a>> {
        if row >= self.len() {
            return None;
        }
        let kind = self.kinds.value(row);
        if (kind != schema::kind::GAUGE && kind != schema::kind::SUM) || self.values.is_null(row) {
            return None;
        }
        let value = self.values.value(row);
        if !value.is_finite() {
            return None;
        }
        // The column holds the OTLP fixed64 bit pattern.
        Some(NumberPoint { name: self.names.value(row), time: self.times.value(row) as u64, value })
    }

    /// The point attributes of `row`.
    pub fn attributes(&self, row: usize) -> Result<Vec<KeyValue>, ConvError> {
        match &self.attrs {
            Some(r) => r.read(row),
            None => Ok(Vec::new()),
        }
    }

    /// The resource of `row` (with the promoted `service.*` attributes).
    pub fn resource(&mut self, row: usize) -> Result<&Resource, ConvError> {
        let Some(idx) = self.resource_index.filter(|c| row < c.len()).map(|c| c.value(row)) else {
            self.scratch_resource = metrics::row_resource(self.batch, row)?;
            return Ok(&self.scratch_resource);
        };
        if !self.resources.contains_key(&idx) {
            let r = metrics::row_resource(self.batch, row)?;
            self.resources.insert(idx, r);
        }
        self.resources.get(&idx).ok_or_else(|| ConvError::Schema("resource cache".into()))
    }

    /// The instrumentation scope of `row`.
    pub fn scope(&mut self, row: usize) -> Result<&InstrumentationScope, ConvError> {
        let key = match (self.resource_index, self.scope_index) {
            (Some(r), Some(s)) if row < r.len() && row < s.len() => (r.value(row), s.value(row)),
            _ => {
                self.scratch_scope = metrics::row_scope(self.batch, row)?;
                return Ok(&self.scratch_scope);
            }
        };
        if !self.scopes.contains_key(&key) {
            let s = metrics::row_scope(self.batch, row)?;
            self.scopes.insert(key, s);
        }
        self.scopes.get(&key).ok_or_else(|| ConvError::Schema("scope cache".into()))
    }
}

/// The value of attribute `key` (the first one of that key).
pub fn find<'k>(attrs: &'k [KeyValue], key: &str) -> Option<&'k AnyValue> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

/// A scalar attribute value as a string (strings as is, numbers and bools printed).
pub fn scalar_string(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Attribute `key` of a point as a string: its point attribute, else `None`.
pub fn point_string(point: &[KeyValue], key: &str) -> Option<String> {
    find(point, key).and_then(scalar_string)
}

/// Attribute `key` as a string: the point attribute, else the resource attribute of `row`.
pub fn lookup(rows: &mut Rows<'_>, row: usize, point: &[KeyValue], key: &str) -> Result<Option<String>, ConvError> {
    if let Some(v) = point_string(point, key) {
        return Ok(Some(v));
    }
    Ok(find(&rows.resource(row)?.attributes, key).and_then(scalar_string))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{kv_f64, kv_i64, kv_str};

    #[test]
    fn scalar_attributes_print_as_strings() {
        let attrs = vec![kv_str("s", "x"), kv_i64("i", 3), kv_f64("d", 0.5)];
        assert_eq!(point_string(&attrs, "s").as_deref(), Some("x"));
        assert_eq!(point_string(&attrs, "i").as_deref(), Some("3"));
        assert_eq!(point_string(&attrs, "d").as_deref(), Some("0.5"));
        assert_eq!(point_string(&attrs, "none"), None);
    }
}
