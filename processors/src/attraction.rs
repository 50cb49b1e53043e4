//! Attribute actions in otelcol's shape (`insert`, `update`, `upsert`, `delete`, `hash`,
//! `extract`, `convert`), shared by the `resource` and `attributes` processors.
//!
//! A list of [`ActionConfig`] is checked once into [`Actions`], which then applies the actions
//! in order to one attribute list (`Vec<KeyValue>`) in place and says whether it changed.

use inferwatch_core::component::{FieldError, PathSeg};
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value};
use regex::Regex;
use serde::Deserialize;

/// One action as written in the configuration (otelcol's keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActionConfig {
    /// The attribute acted upon.
    pub key: String,
    /// `insert`, `update`, `upsert`, `delete`, `hash`, `extract` or `convert` (any case).
    pub action: String,
    /// The value set by insert / update / upsert (type from the YAML).
    pub value: Option<serde_json::Value>,
    /// Take the value from this attribute of the same item.
    pub from_attribute: Option<String>,
    /// otelcol's request-context source; refused (no request metadata reaches processors).
    pub from_context: Option<String>,
    /// Value used when the source gives none.
    pub default_value: Option<serde_json::Value>,
    /// delete / hash: regex on keys; extract: regex with named groups on the value.
    pub pattern: Option<String>,
    /// convert: `int`, `double` or `string`.
    pub converted_type: Option<String>,
}

/// Where insert / update / upsert take their value from.
#[derive(Debug, Clone)]
enum Source {
    Value(AnyValue),
    From { key: String, default: Option<AnyValue> },
}

/// The type `convert` converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Int,
    Double,
    Str,
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Source),
    Update(Source),
    Upsert(Source),
    Delete { key: Option<String>, pattern: Option<Regex> },
    Hash { key: Option<String>, pattern: Option<Regex> },
    Extract { key: String, pattern: Regex, names: Vec<String> },
    Convert { key: String, to: Target },
}

/// A checked list of actions, applied in order.
#[derive(Debug, Clone, Default)]
pub struct Actions {
    ops: Vec<(String, Op)>,
}

fn err(path: &[PathSeg], field: &str, message: impl Into<String>) -> FieldError {
    let mut p = path.to_vec();
    p.push(PathSeg::Key(field.into()));
    FieldError { path: p, message: message.into() }
}

/// The OTLP value of a configuration value (strings, numbers, bools, lists, maps).
pub fn any_value_of(v: &serde_json::Value) -> Option<AnyValue> {
    let value = match v {
        serde_json::Value::Null => return None,
        serde_json::Value::Bool(b) => Value::BoolValue(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::IntValue(i),
            None => Value::DoubleValue(n.as_f64()?),
        },
        serde_json::Value::String(s) => Value::StringValue(s.clone()),
        serde_json::Value::Array(a) => {
            Value::ArrayValue(ArrayValue { values: a.iter().filter_map(any_value_of).collect() })
        }
        serde_json::Value::Object(m) => Value::KvlistValue(KeyValueList {
            values: m
                .iter()
                .map(|(k, v)| KeyValue { key: k.clone(), value: any_value_of(v), key_strindex: 0 })
                .collect(),
        }),
    };
    Some(AnyValue { value: Some(value) })
}

fn regex_at(path: &[PathSeg], p: &str) -> Result<Regex, FieldError> {
    Regex::new(p).map_err(|e| err(path, "pattern", format!("invalid regular expression: {e}")))
}

impl Actions {
    /// Checks `list` (at `path` in the component's settings, e.g. `actions`) as otelcol does.
    pub fn new(list: &[ActionConfig], path: &str) -> Result<Actions, FieldError> {
        let mut ops = Vec::with_capacity(list.len());
        for (i, a) in list.iter().enumerate() {
            let mut at: Vec<PathSeg> = path.split('.').map(|s| PathSeg::Key(s.to_string())).collect();
            at.push(PathSeg::Index(i));
            ops.push((a.key.clone(), Self::one(a, &at)?));
        }
        Ok(Actions { ops })
    }

    fn one(a: &ActionConfig, at: &[PathSeg]) -> Result<Op, FieldError> {
        let action = a.action.to_ascii_lowercase();
        let key = (!a.key.is_empty()).then(|| a.key.clone());
        if a.from_context.is_some() {
            return Err(err(
                at,
                "from_context",
                "is not supported by inferwatch (request metadata does not reach processors); use value or from_attribute",
            ));
        }
        let sources = usize::from(a.value.is_some()) + usize::from(a.from_attribute.is_some());
        let no_source = |what: &str| -> Result<(), FieldError> {
            if a.value.is_some() {
                return Err(err(at, "value", format!("action {what} does not use value")));
            }
            if a.from_attribute.is_some() {
                return Err(err(at, "from_attribute", format!("action {what} does not use from_attribute")));
            }
            if a.default_value.is_some() {
                return Err(err(at, "default_value", format!("action {what} does not use default_value")));
            }
            Ok(())
        };
        let no_convert = |what: &str| match a.converted_type {
            Some(_) => Err(err(at, "converted_type", format!("action {what} does not use converted_type"))),
            None => Ok(()),
        };
        let need_key = || key.clone().ok_or_else(|| err(at, "key", format!("is required for action {action}")));
        match action.as_str() {
            "insert" | "update" | "upsert" => {
                need_key()?;
                if a.pattern.is_some() {
                    return Err(err(at, "pattern", format!("action {action} does not use pattern")));
                }
                no_convert(&action)?;
                if sources > 1 {
                    return Err(err(at, "from_attribute", "set only one of value and from_attribute"));
                }
                let default = a.default_value.as_ref().and_then(any_value_of);
                let source = match (&a.value, &a.from_attribute) {
                    (Some(v), None) => {
                        Source::Value(any_value_of(v).ok_or_else(|| err(at, "value", "must not be null"))?)
                    }
                    (None, Some(f)) if f.is_empty() => return Err(err(at, "from_attribute", "must not be empty")),
                    (None, Some(f)) => Source::From { key: f.clone(), default },
                    _ => match default {
                        Some(d) => Source::Value(d),
                        None => {
                            return Err(err(
                                at,
                                "value",
                                format!("action {action} needs one of value, from_attribute or default_value"),
                            ));
                        }
                    },
                };
                Ok(match action.as_str() {
                    "insert" => Op::Insert(source),
                    "update" => Op::Update(source),
                    _ => Op::Upsert(source),
                })
            }
            "delete" | "hash" => {
                no_source(&action)?;
                no_convert(&action)?;
                let pattern = a.pattern.as_deref().map(|p| regex_at(at, p)).transpose()?;
                if key.is_none() && pattern.is_none() {
                    return Err(err(at, "key", format!("action {action} needs key or pattern")));
                }
                Ok(if action == "delete" { Op::Delete { key, pattern } } else { Op::Hash { key, pattern } })
            }
            "extract" => {
                let k = need_key()?;
                no_source(&action)?;
                no_convert(&action)?;
                let p = a.pattern.as_deref().ok_or_else(|| err(at, "pattern", "is required for action extract"))?;
                let pattern = regex_at(at, p)?;
                let names: Vec<String> = pattern.capture_names().flatten().map(str::to_string).collect();
                if names.is_empty() || pattern.captures_len() - 1 != names.len() {
                    return Err(err(at, "pattern", "every group of an extract pattern must be named: (?P<name>...)"));
                }
                Ok(Op::Extract { key: k, pattern, names })
            }
            "convert" => {
                let k = need_key()?;
                no_source(&action)?;
                if a.pattern.is_some() {
                    return Err(err(at, "pattern", "action convert does not use pattern"));
                }
                let to = match a.converted_type.as_deref() {
                    Some("int") => Target::Int,
                    Some("double") => Target::Double,
                    Some("string") => Target::Str,
                    Some(other) => {
                        return Err(err(at, "converted_type", format!("{other:?} is not one of int, double, string")));
                    }
                    None => return Err(err(at, "converted_type", "is required for action convert")),
                };
                Ok(Op::Convert { key: k, to })
            }
            "" => Err(err(at, "action", "is required (insert, update, upsert, delete, hash, extract, convert)")),
            other => Err(err(
                at,
                "action",
                format!("{other:?} is not one of insert, update, upsert, delete, hash, extract, convert"),
            )),
        }
    }

    /// Whether there is no action.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Applies every action in order to `attrs`; returns whether anything changed.
    pub fn apply(&self, attrs: &mut Vec<KeyValue>) -> bool {
        let mut changed = false;
        for (key, op) in &self.ops {
            changed |= apply_one(key, op, attrs);
        }
        changed
    }
}

fn position(attrs: &[KeyValue], key: &str) -> Option<usize> {
    attrs.iter().position(|kv| kv.key == key)
}

fn source_value(s: &Source, attrs: &[KeyValue]) -> Option<AnyValue> {
    match s {
        Source::Value(v) => Some(v.clone()),
        Source::From { key, default } => {
            position(attrs, key).and_then(|i| attrs[i].value.clone()).or_else(|| default.clone())
        }
    }
}

fn set(attrs: &mut Vec<KeyValue>, key: &str, value: AnyValue) -> bool {
    match position(attrs, key) {
        Some(i) => {
            let changed = attrs[i].value.as_ref() != Some(&value);
            attrs[i].value = Some(value);
            changed
        }
        None => {
            attrs.push(KeyValue { key: key.to_string(), value: Some(value), key_strindex: 0 });
            true
        }
    }
}

fn apply_one(key: &str, op: &Op, attrs: &mut Vec<KeyValue>) -> bool {
    match op {
        Op::Insert(s) => {
            if position(attrs, key).is_some() {
                return false;
            }
            source_value(s, attrs).is_some_and(|v| set(attrs, key, v))
        }
        Op::Update(s) => {
            if position(attrs, key).is_none() {
                return false;
            }
            source_value(s, attrs).is_some_and(|v| set(attrs, key, v))
        }
        Op::Upsert(s) => source_value(s, attrs).is_some_and(|v| set(attrs, key, v)),
        Op::Delete { key, pattern } => {
            let before = attrs.len();
            attrs.retain(|kv| !matches_key(kv, key.as_deref(), pattern.as_ref()));
            attrs.len() != before
        }
        Op::Hash { key, pattern } => {
            let mut changed = false;
            for kv in attrs.iter_mut().filter(|kv| matches_key(kv, key.as_deref(), pattern.as_ref())) {
                let hashed = hash_value(kv.value.as_ref());
                kv.value = Some(AnyValue { value: Some(Value::StringValue(hashed)) });
                changed = true;
            }
            changed
        }
        Op::Extract { key, pattern, names } => {
            let Some(s) = position(attrs, key).and_then(|i| match attrs[i].value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            }) else {
                return false;
            };
            let Some(caps) = pattern.captures(&s) else { return false };
            let mut changed = false;
            for name in names {
                if let Some(m) = caps.name(name) {
                    let v = AnyValue { value: Some(Value::StringValue(m.as_str().to_string())) };
                    changed |= set(attrs, name, v);
                }
            }
            changed
        }
        Op::Convert { key, to } => {
            let Some(i) = position(attrs, key) else { return false };
            let Some(new) = attrs[i].value.as_ref().and_then(|v| v.value.as_ref()).and_then(|v| convert(v, *to)) else {
                return false;
            };
            let new = AnyValue { value: Some(new) };
            let changed = attrs[i].value.as_ref() != Some(&new);
            attrs[i].value = Some(new);
            changed
        }
    }
}

fn matches_key(kv: &KeyValue, key: Option<&str>, pattern: Option<&Regex>) -> bool {
    key.is_some_and(|k| kv.key == k) || pattern.is_some_and(|p| p.is_match(&kv.key))
}

fn convert(v: &Value, to: Target) -> Option<Value> {
    match to {
        Target::Int => match v {
            Value::IntValue(i) => Some(Value::IntValue(*i)),
            Value::DoubleValue(d) if d.is_finite() => Some(Value::IntValue(*d as i64)),
            Value::BoolValue(b) => Some(Value::IntValue(i64::from(*b))),
            Value::StringValue(s) => s.parse::<i64>().ok().map(Value::IntValue),
            _ => None,
        },
        Target::Double => match v {
            Value::DoubleValue(d) => Some(Value::DoubleValue(*d)),
            Value::IntValue(i) => Some(Value::DoubleValue(*i as f64)),
            Value::BoolValue(b) => Some(Value::DoubleValue(if *b { 1.0 } else { 0.0 })),
            Value::StringValue(s) => s.parse::<f64>().ok().map(Value::DoubleValue),
            _ => None,
        },
        Target::Str => Some(Value::StringValue(value_as_string(v))),
    }
}

/// A value as otelcol's `AsString` renders it (scalars plainly, lists and maps as JSON).
pub fn value_as_string(v: &Value) -> String {
    match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::BytesValue(b) => hex(b),
        other => to_json(other).to_string(),
    }
}

fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::StringValue(s) => serde_json::Value::String(s.clone()),
        Value::IntValue(i) => serde_json::Value::from(*i),
        Value::DoubleValue(d) => serde_json::Value::from(*d),
        Value::BoolValue(b) => serde_json::Value::Bool(*b),
        Value::BytesValue(b) => serde_json::Value::String(hex(b)),
        Value::ArrayValue(a) => serde_json::Value::Array(
            a.values.iter().map(|x| x.value.as_ref().map(to_json).unwrap_or(serde_json::Value::Null)).collect(),
        ),
        Value::KvlistValue(m) => serde_json::Value::Object(
            m.values
                .iter()
                .map(|kv| {
                    let v = kv.value.as_ref().and_then(|x| x.value.as_ref()).map(to_json);
                    (kv.key.clone(), v.unwrap_or(serde_json::Value::Null))
                })
                .collect(),
        ),
        Value::StringValueStrindex(i) => serde_json::Value::from(*i),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// otelcol's `hash`: SHA-1 (hex) of a string's bytes, of an int's or double's 8 little-endian
/// bytes, of a bool as one byte; empty for other values.
pub fn hash_value(v: Option<&AnyValue>) -> String {
    let bytes: Vec<u8> = match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.as_bytes().to_vec(),
        Some(Value::BoolValue(b)) => vec![u8::from(*b)],
        Some(Value::IntValue(i)) => i.to_le_bytes().to_vec(),
        Some(Value::DoubleValue(d)) => d.to_bits().to_le_bytes().to_vec(),
        _ => return String::new(),
    };
    hex(&sha1(&bytes))
}

/// SHA-1 of `data` (FIPS 180-4), for otelcol-compatible `hash` values; not used for security.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), key_strindex: 0 }
    }
    fn s(v: &str) -> Value {
        Value::StringValue(v.into())
    }
    fn actions(v: serde_json::Value) -> Result<Actions, FieldError> {
        let list: Vec<ActionConfig> = serde_json::from_value(v).unwrap();
        Actions::new(&list, "actions")
    }
    fn get<'a>(attrs: &'a [KeyValue], k: &str) -> Option<&'a Value> {
        attrs.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn insert_update_upsert_delete() {
        let a = actions(json!([
            {"key": "present", "value": "new", "action": "insert"},
            {"key": "absent_i", "value": 7, "action": "INSERT"},
            {"key": "absent_u", "value": "x", "action": "update"},
            {"key": "other", "value": true, "action": "update"},
            {"key": "absent_up", "value": 1.5, "action": "upsert"},
            {"key": "present2", "value": "up", "action": "upsert"},
            {"key": "gone", "action": "delete"},
        ]))
        .unwrap();
        let mut attrs = vec![kv("present", s("old")), kv("other", s("o")), kv("present2", s("p")), kv("gone", s("g"))];
        assert!(a.apply(&mut attrs));
        assert_eq!(get(&attrs, "present"), Some(&s("old")), "insert must not overwrite");
        assert_eq!(get(&attrs, "absent_i"), Some(&Value::IntValue(7)));
        assert_eq!(get(&attrs, "absent_u"), None, "update must not create");
        assert_eq!(get(&attrs, "other"), Some(&Value::BoolValue(true)));
        assert_eq!(get(&attrs, "absent_up"), Some(&Value::DoubleValue(1.5)));
        assert_eq!(get(&attrs, "present2"), Some(&s("up")));
        assert_eq!(get(&attrs, "gone"), None);
        // Idempotent second run: nothing changes.
        assert!(!a.apply(&mut attrs));
    }

    #[test]
    fn from_attribute_default_pattern_delete_hash() {
        let a = actions(json!([
            {"key": "copy", "from_attribute": "src", "action": "insert"},
            {"key": "nocopy", "from_attribute": "missing", "action": "insert"},
            {"key": "dflt", "from_attribute": "missing", "default_value": "d", "action": "upsert"},
            {"pattern": "^secret\\.", "action": "delete"},
            {"key": "email", "action": "hash"},
        ]))
        .unwrap();
        let mut attrs = vec![kv("src", s("v")), kv("secret.a", s("1")), kv("secret.b", s("2")), kv("email", s("abc"))];
        a.apply(&mut attrs);
        assert_eq!(get(&attrs, "copy"), Some(&s("v")));
        assert_eq!(get(&attrs, "nocopy"), None);
        assert_eq!(get(&attrs, "dflt"), Some(&s("d")));
        assert!(get(&attrs, "secret.a").is_none() && get(&attrs, "secret.b").is_none());
        assert_eq!(get(&attrs, "email"), Some(&s("a9993e364706816aba3e25717850c26c9cd0d89d")));
    }

    #[test]
    fn extract_and_convert() {
        let a = actions(json!([
            {"key": "url", "pattern": "^/api/(?P<version>v\\d+)/(?P<resource>\\w+)", "action": "extract"},
            {"key": "code", "action": "convert", "converted_type": "int"},
            {"key": "bad", "action": "convert", "converted_type": "int"},
            {"key": "n", "action": "convert", "converted_type": "string"},
        ]))
        .unwrap();
        let mut attrs =
            vec![kv("url", s("/api/v2/users")), kv("code", s("200")), kv("bad", s("x")), kv("n", Value::IntValue(3))];
        a.apply(&mut attrs);
        assert_eq!(get(&attrs, "version"), Some(&s("v2")));
        assert_eq!(get(&attrs, "resource"), Some(&s("users")));
        assert_eq!(get(&attrs, "url"), Some(&s("/api/v2/users")));
        assert_eq!(get(&attrs, "code"), Some(&Value::IntValue(200)));
        assert_eq!(get(&attrs, "bad"), Some(&s("x")), "an unconvertible value stays");
        assert_eq!(get(&attrs, "n"), Some(&s("3")));
    }

    #[test]
    fn sha1_vectors() {
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha1(long)), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    }

    #[test]
    fn config_errors_name_the_field() {
        let path = |e: FieldError| e.dotted();
        let cases = [
            (json!([{"key": "k", "action": "insert"}]), "actions.0.value"),
            (json!([{"key": "k", "value": 1, "action": "rename"}]), "actions.0.action"),
            (json!([{"key": "k", "value": 1, "from_attribute": "a", "action": "upsert"}]), "actions.0.from_attribute"),
            (json!([{"value": 1, "action": "insert"}]), "actions.0.key"),
            (json!([{"key": "k", "value": 1, "pattern": "x", "action": "insert"}]), "actions.0.pattern"),
            (json!([{"key": "ok", "action": "delete"}, {"action": "delete"}]), "actions.1.key"),
            (json!([{"key": "k", "action": "delete", "value": 1}]), "actions.0.value"),
            (json!([{"key": "k", "action": "extract"}]), "actions.0.pattern"),
            (json!([{"key": "k", "action": "extract", "pattern": "(\\d+)"}]), "actions.0.pattern"),
            (json!([{"key": "k", "action": "delete", "pattern": "("}]), "actions.0.pattern"),
            (json!([{"key": "k", "action": "convert"}]), "actions.0.converted_type"),
            (json!([{"key": "k", "action": "convert", "converted_type": "bool"}]), "actions.0.converted_type"),
            (json!([{"key": "k", "action": "insert", "from_context": "metadata.x"}]), "actions.0.from_context"),
        ];
        for (cfg, want) in cases {
            let e = actions(cfg.clone()).expect_err(&cfg.to_string());
            assert_eq!(path(e), want, "{cfg}");
        }
    }
}
