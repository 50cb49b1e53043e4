//! The stable 64-bit series id of a metric data point.
//!
//! `series_id` = xxh3_64 (seed 0) of a canonical byte encoding:
//!
//! 1. resource attributes sorted by key: u32 LE count, then each attribute;
//! 2. scope name, scope version (each a string; no scope = two empty strings);
//! 3. metric name (a string);
//! 4. point attributes sorted by key: u32 LE count, then each attribute.
//!
//! A string is its u32 LE byte length then its UTF-8 bytes. An attribute is its key (a string),
//! then a one-byte type tag (the [`super::schema::value_type`] codes; 8 = string_value_strindex,
//! 0xFF = KeyValue without a value) and the value: string/bytes length-prefixed, bool one byte,
//! int i64 LE, double the f64 bit pattern LE, strindex i32 LE, array/kvlist the length-prefixed
//! protobuf encoding of the ArrayValue / KeyValueList. Attributes with the same key are ordered
//! by their encoded value, so attribute order never changes the id.

use super::schema::value_type;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use prost::Message;
use std::cmp::Ordering;

/// Type tag of a string_value_strindex value in the encoding.
const TAG_STRINDEX: u8 = 8;
/// Type tag of a KeyValue without an AnyValue.
const TAG_NO_VALUE: u8 = 0xFF;

/// The series id of a data point (see the module docs for the encoding).
pub fn series_id(
    resource_attrs: &[KeyValue],
    scope: Option<&InstrumentationScope>,
    metric_name: &str,
    point_attrs: &[KeyValue],
) -> u64 {
    let mut h = SeriesHasher::default();
    h.set_prefix(resource_attrs, scope, metric_name);
    h.hash(point_attrs)
}

/// Computes series ids of many points of one metric, encoding the resource/scope/metric part once.
#[derive(Debug, Default)]
pub struct SeriesHasher {
    buf: Vec<u8>,
    prefix_len: usize,
    order: Vec<usize>,
}

impl SeriesHasher {
    /// Sets the resource, scope and metric the next points belong to.
    pub fn set_prefix(&mut self, resource_attrs: &[KeyValue], scope: Option<&InstrumentationScope>, metric_name: &str) {
        self.buf.clear();
        self.push_sorted(resource_attrs);
        push_str(&mut self.buf, scope.map_or("", |s| s.name.as_str()));
        push_str(&mut self.buf, scope.map_or("", |s| s.version.as_str()));
        push_str(&mut self.buf, metric_name);
        self.prefix_len = self.buf.len();
    }

    /// The series id of a point with `point_attrs` under the current prefix.
    pub fn hash(&mut self, point_attrs: &[KeyValue]) -> u64 {
        self.buf.truncate(self.prefix_len);
        self.push_sorted(point_attrs);
        xxhash_rust::xxh3::xxh3_64(&self.buf)
    }

    fn push_sorted(&mut self, attrs: &[KeyValue]) {
        self.buf.extend_from_slice(&(attrs.len() as u32).to_le_bytes());
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(0..attrs.len());
        order.sort_unstable_by(|&a, &b| cmp_kv(&attrs[a], &attrs[b]));
        for &i in &order {
            push_kv(&mut self.buf, &attrs[i]);
        }
        self.order = order;
    }
}

fn cmp_kv(a: &KeyValue, b: &KeyValue) -> Ordering {
    a.key.cmp(&b.key).then_with(|| {
        // Same key (invalid OTLP, but possible): order by encoded value, allocating only here.
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        push_kv(&mut ea, a);
        push_kv(&mut eb, b);
        ea.cmp(&eb)
    })
}

fn push_str(buf: &mut Vec<u8>, s: &str) {
    push_bytes(buf, s.as_bytes());
}

fn push_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
    buf.extend_from_slice(b);
}

fn push_message<M: Message>(buf: &mut Vec<u8>, m: &M) {
    buf.extend_from_slice(&(m.encoded_len() as u32).to_le_bytes());
    // Encoding into a Vec cannot fail (it grows as needed).
    let _ = m.encode(buf);
}

fn push_kv(buf: &mut Vec<u8>, kv: &KeyValue) {
    push_str(buf, &kv.key);
    let Some(v) = &kv.value else {
        buf.push(TAG_NO_VALUE);
        return;
    };
    match &v.value {
        None => buf.push(value_type::EMPTY),
        Some(Value::StringValue(s)) => {
            buf.push(value_type::STRING);
            push_str(buf, s);
        }
        Some(Value::BoolValue(b)) => buf.extend_from_slice(&[value_type::BOOL, u8::from(*b)]),
        Some(Value::IntValue(i)) => {
            buf.push(value_type::INT);
            buf.extend_from_slice(&i.to_le_bytes());
        }
        Some(Value::DoubleValue(d)) => {
            buf.push(value_type::DOUBLE);
            buf.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        Some(Value::BytesValue(b)) => {
            buf.push(value_type::BYTES);
            push_bytes(buf, b);
        }
        Some(Value::ArrayValue(a)) => {
            buf.push(value_type::ARRAY);
            push_message(buf, a);
        }
        Some(Value::KvlistValue(l)) => {
            buf.push(value_type::KVLIST);
            push_message(buf, l);
        }
        Some(Value::StringValueStrindex(i)) => {
            buf.push(TAG_STRINDEX);
            buf.extend_from_slice(&i.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue};

    fn kv(key: &str, v: Value) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), key_strindex: 0 }
    }

    fn scope(name: &str, version: &str) -> InstrumentationScope {
        InstrumentationScope { name: name.into(), version: version.into(), ..Default::default() }
    }

    fn base() -> (Vec<KeyValue>, InstrumentationScope, &'static str, Vec<KeyValue>) {
        (
            vec![kv("service.name", Value::StringValue("vllm".into())), kv("host", Value::StringValue("h1".into()))],
            scope("inferwatch", "1.0"),
            "gen_ai.tokens",
            vec![
                kv("model", Value::StringValue("llama".into())),
                kv("gpu", Value::IntValue(3)),
                kv("ratio", Value::DoubleValue(0.25)),
                kv("ok", Value::BoolValue(true)),
                kv("raw", Value::BytesValue(vec![1, 2, 3])),
                kv("arr", Value::ArrayValue(ArrayValue { values: vec![AnyValue { value: Some(Value::IntValue(1)) }] })),
            ],
        )
    }

    fn id(r: &[KeyValue], s: &InstrumentationScope, m: &str, p: &[KeyValue]) -> u64 {
        series_id(r, Some(s), m, p)
    }

    const GOLDEN_SMALL: u64 = 0x964b_83e6_a9b8_5708;

    #[test]
    fn golden_value() {
        let (r, s, m, p) = base();
        // Changing the encoding changes this value: bump the schema version and update it deliberately.
        assert_eq!(id(&r, &s, m, &p), 0xfa76_0cdc_6900_b2db, "got {:#x}", id(&r, &s, m, &p));
    }

    #[test]
    fn encoding_is_the_documented_one() {
        let r = vec![kv("b", Value::IntValue(1)), kv("a", Value::StringValue("x".into()))];
        let p = vec![kv("k", Value::BoolValue(true))];
        let mut want: Vec<u8> = Vec::new();
        want.extend(2u32.to_le_bytes());
        want.extend([1, 0, 0, 0, b'a', value_type::STRING, 1, 0, 0, 0, b'x']);
        want.extend([1, 0, 0, 0, b'b', value_type::INT]);
        want.extend(1i64.to_le_bytes());
        want.extend([1, 0, 0, 0, b's', 1, 0, 0, 0, b'v', 1, 0, 0, 0, b'm']);
        want.extend(1u32.to_le_bytes());
        want.extend([1, 0, 0, 0, b'k', value_type::BOOL, 1]);
        let got = id(&r, &scope("s", "v"), "m", &p);
        assert_eq!(got, xxhash_rust::xxh3::xxh3_64(&want));
        assert_eq!(got, GOLDEN_SMALL, "got {got:#x}");
    }

    #[test]
    fn attribute_order_does_not_matter() {
        let (mut r, s, m, mut p) = base();
        let a = id(&r, &s, m, &p);
        r.reverse();
        p.reverse();
        assert_eq!(id(&r, &s, m, &p), a);
        p.rotate_left(2);
        assert_eq!(id(&r, &s, m, &p), a);
        // Duplicate keys: still order independent.
        p.push(kv("model", Value::StringValue("other".into())));
        let b = id(&r, &s, m, &p);
        assert_ne!(a, b);
        p.reverse();
        assert_eq!(id(&r, &s, m, &p), b);
    }

    #[test]
    fn every_part_changes_the_id() {
        let (r, s, m, p) = base();
        let a = id(&r, &s, m, &p);
        let mut r2 = r.clone();
        r2[1] = kv("host", Value::StringValue("h2".into()));
        assert_ne!(id(&r2, &s, m, &p), a, "resource attribute value");
        assert_ne!(id(&r[..1], &s, m, &p), a, "resource attribute removed");
        assert_ne!(id(&r, &scope("other", "1.0"), m, &p), a, "scope name");
        assert_ne!(id(&r, &scope("inferwatch", "1.1"), m, &p), a, "scope version");
        assert_ne!(id(&r, &s, "gen_ai.tokens2", &p), a, "metric name");
        let mut p2 = p.clone();
        p2[1] = kv("gpu", Value::IntValue(4));
        assert_ne!(id(&r, &s, m, &p2), a, "point attribute value");
        p2[1] = kv("gpu", Value::DoubleValue(3.0));
        assert_ne!(id(&r, &s, m, &p2), a, "point attribute type");
        p2[1] = kv("gpu", Value::StringValue("3".into()));
        assert_ne!(id(&r, &s, m, &p2), a, "point attribute type (string)");
        assert_ne!(id(&r, &s, m, &p[1..]), a, "point attribute removed");
        // A resource attribute is not the same as a point attribute with the same key/value.
        let mut p3 = p.clone();
        p3.push(r[1].clone());
        assert_ne!(id(&r[..1], &s, m, &p3), a, "attribute moved between resource and point");
        // Length prefixes keep name/version boundaries apart.
        assert_ne!(id(&r, &scope("ab", "c"), m, &p), id(&r, &scope("a", "bc"), m, &p));
    }

    #[test]
    fn hasher_matches_series_id_across_points() {
        let (r, s, m, p) = base();
        let mut h = SeriesHasher::default();
        h.set_prefix(&r, Some(&s), m);
        assert_eq!(h.hash(&p), id(&r, &s, m, &p));
        assert_eq!(h.hash(&p[2..]), id(&r, &s, m, &p[2..]));
        assert_eq!(h.hash(&[]), id(&r, &s, m, &[]));
        assert_eq!(series_id(&r, None, m, &p), id(&r, &scope("", ""), m, &p));
    }
}
