//! Attribute lookups in a `&[KeyValue]`: typed getters (`None` when absent or of another type),
//! strict ones that panic, and the attributes as text.

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::BTreeMap;

/// The value of attribute `key`, if present and set.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

/// A string attribute (`None` when absent or not a string).
pub fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key)? {
        Value::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

/// An int attribute (`None` when absent or not an int).
pub fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        Value::IntValue(v) => Some(*v),
        _ => None,
    }
}

/// A double attribute (`None` when absent or not a double).
pub fn f64_attr(attrs: &[KeyValue], key: &str) -> Option<f64> {
    match attr(attrs, key)? {
        Value::DoubleValue(v) => Some(*v),
        _ => None,
    }
}

/// A bool attribute (`None` when absent or not a bool).
pub fn bool_attr(attrs: &[KeyValue], key: &str) -> Option<bool> {
    match attr(attrs, key)? {
        Value::BoolValue(v) => Some(*v),
        _ => None,
    }
}

/// A string attribute that must be there: panics naming the key otherwise.
pub fn str_of<'a>(attrs: &'a [KeyValue], key: &str) -> &'a str {
    match attr(attrs, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key}: expected a string, got {other:?}"),
    }
}

/// An int attribute that must be there: panics naming the key otherwise.
pub fn int_of(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("{key}: expected an int, got {other:?}"),
    }
}

/// A double attribute that must be there: panics naming the key otherwise.
pub fn f64_of(attrs: &[KeyValue], key: &str) -> f64 {
    match attr(attrs, key) {
        Some(Value::DoubleValue(v)) => *v,
        other => panic!("{key}: expected a double, got {other:?}"),
    }
}

/// The attributes of a resource (none when there is no resource).
pub fn resource_attrs(resource: Option<&Resource>) -> &[KeyValue] {
    resource.map_or(&[], |r| r.attributes.as_slice())
}

/// A value as text: strings as they are, ints and doubles as `Display` writes them, anything
/// else (and no value) as its `Debug`.
pub fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// Every attribute as `key → text` (see [`text`]).
pub fn strings(attrs: &[KeyValue]) -> BTreeMap<String, String> {
    attrs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

/// Every attribute as `(key, text)` in the order they came (see [`text`]).
pub fn pairs(attrs: &[KeyValue]) -> Vec<(String, String)> {
    attrs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{bool_kv, f64_kv, int_kv, kv};

    #[test]
    fn typed_lookups_find_by_key_and_refuse_other_types() {
        let a = vec![kv("s", "x"), int_kv("i", -3), f64_kv("d", 0.5), bool_kv("b", true)];
        assert_eq!(str_attr(&a, "s"), Some("x"));
        assert_eq!(int_attr(&a, "i"), Some(-3));
        assert_eq!(f64_attr(&a, "d"), Some(0.5));
        assert_eq!(bool_attr(&a, "b"), Some(true));
        assert_eq!(str_attr(&a, "i"), None, "an int is not a string");
        assert_eq!(int_attr(&a, "d"), None, "a double is not an int");
        assert_eq!(f64_attr(&a, "missing"), None);
        assert_eq!((str_of(&a, "s"), int_of(&a, "i"), f64_of(&a, "d")), ("x", -3, 0.5));
        let t = strings(&a);
        assert_eq!(t["s"], "x");
        assert_eq!(t["i"], "-3");
        assert_eq!(t["d"], "0.5");
        assert_eq!(t["b"], "Some(BoolValue(true))", "other values as their Debug");
        assert_eq!(pairs(&a)[1], ("i".to_string(), "-3".to_string()));
    }

    #[test]
    #[should_panic(expected = "d: expected an int")]
    fn strict_lookup_names_the_key() {
        int_of(&[f64_kv("d", 1.0)], "d");
    }

    #[test]
    fn resource_attrs_of_nothing_is_empty() {
        assert!(resource_attrs(None).is_empty());
        let r = Resource { attributes: vec![kv("service.name", "vllm")], ..Default::default() };
        assert_eq!(str_attr(resource_attrs(Some(&r)), "service.name"), Some("vllm"));
    }
}
