//! A component config map read by two structs: the component's own keys by its derived
//! `Deserialize` (`#[serde(remote = "Self")]`, an inherent `deserialize`), and the keys of a
//! shared settings struct ([`SplitKeys`], held in a `#[serde(skip)]` field) by that struct as
//! they are read. Any other key is refused with serde's own message (`unknown field `x`,
//! expected one of ...`, both sets of keys listed), raised while the key is read, so that the
//! error's path is the key's path; errors inside a shared value keep their paths too. (serde's
//! `flatten` cannot be combined with `deny_unknown_fields`, loses the paths of errors inside,
//! and cannot start from the component's defaults.)
//!
//! [`split_deserialize!`](crate::split_deserialize) writes the `Deserialize` impl.

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use std::fmt;

/// Settings whose keys sit at the top level of a component's config map.
pub trait SplitKeys<'de> {
    /// Every key these settings read, in the order serde's message lists them.
    const KEYS: &'static [&'static str];

    /// Reads the value of `key` (one of [`SplitKeys::KEYS`]) from `map`.
    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

/// serde's `unknown field` message, listing the struct's own keys and then the shared keys.
pub fn unknown_field(field: &str, own: &[&str], shared: &[&str]) -> String {
    let all: Vec<String> = own.iter().chain(shared).map(|k| format!("`{k}`")).collect();
    match all.as_slice() {
        [] => format!("unknown field `{field}`, there are no fields"),
        [a] => format!("unknown field `{field}`, expected {a}"),
        [a, b] => format!("unknown field `{field}`, expected {a} or {b}"),
        _ => format!("unknown field `{field}`, expected one of {}", all.join(", ")),
    }
}

/// A deserializer that reads a struct's map, giving the shared keys to `shared` and the
/// struct's own keys to the struct; any other key is an error at that key.
pub struct Split<'s, D, S> {
    inner: D,
    shared: &'s mut S,
    keys: &'static [&'static str],
}

impl<'s, D, S> Split<'s, D, S> {
    /// Reads through `inner`, every key of `S` into `shared` (which holds the defaults).
    pub fn new<'de>(inner: D, shared: &'s mut S) -> Self
    where
        S: SplitKeys<'de>,
    {
        Split { inner, shared, keys: S::KEYS }
    }

    /// Accepts only `keys` (some of `S`'s keys) as shared keys.
    pub fn only(self, keys: &'static [&'static str]) -> Self {
        Split { keys, ..self }
    }
}

impl<'de, D: Deserializer<'de>, S: SplitKeys<'de>> Deserializer<'de> for Split<'_, D, S> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = SplitVisitor { visitor, shared: self.shared, fields, keys: self.keys };
        self.inner.deserialize_struct(name, fields, v)
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(SplitVisitor { visitor, shared: self.shared, fields: &[], keys: self.keys })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

struct SplitVisitor<'s, V, S> {
    visitor: V,
    shared: &'s mut S,
    fields: &'static [&'static str],
    keys: &'static [&'static str],
}

impl<'de, V: Visitor<'de>, S: SplitKeys<'de>> Visitor<'de> for SplitVisitor<'_, V, S> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(SplitMap { map, shared: self.shared, fields: self.fields, keys: self.keys })
    }
}

struct SplitMap<'s, A, S> {
    map: A,
    shared: &'s mut S,
    fields: &'static [&'static str],
    keys: &'static [&'static str],
}

/// A key of the split map.
enum Key {
    /// One of the struct's own keys.
    Own(String),
    /// One of the shared keys.
    Shared(&'static str),
}

/// Reads a key, refusing one that is neither the struct's nor a shared key (inside the key's
/// deserialization, so that the error's path ends with the key).
struct KeySeed {
    fields: &'static [&'static str],
    keys: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        if self.fields.contains(&v) {
            Ok(Key::Own(v.to_string()))
        } else if let Some(k) = self.keys.iter().find(|k| **k == v) {
            Ok(Key::Shared(k))
        } else {
            Err(E::custom(unknown_field(v, self.fields, self.keys)))
        }
    }
}

impl<'de, A: MapAccess<'de>, S: SplitKeys<'de>> MapAccess<'de> for SplitMap<'_, A, S> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        loop {
            match self.map.next_key_seed(KeySeed { fields: self.fields, keys: self.keys })? {
                None => return Ok(None),
                Some(Key::Own(k)) => return seed.deserialize(k.into_deserializer()).map(Some),
                Some(Key::Shared(k)) => self.shared.read(k, &mut self.map)?,
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// `Deserialize` for `$t`, whose own keys are derived with `#[serde(remote = "Self")]` and
/// whose `$field` (a [`SplitKeys`](crate::config::split::SplitKeys), `#[serde(skip)]`) reads
/// the shared keys of the same map, starting from `$init`; `$keys`, when given, are the only
/// shared keys accepted (see [`Split::only`](crate::config::split::Split::only)).
#[macro_export]
macro_rules! split_deserialize {
    ($t:ty, $field:ident, $init:expr $(, $keys:expr)? $(,)?) => {
        impl<'de> ::serde::Deserialize<'de> for $t {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let mut shared = $init;
                let split = $crate::config::split::Split::new(d, &mut shared)$(.only($keys))?;
                // The inherent (derived) `deserialize`, over the split map.
                let mut v = <$t>::deserialize(split)?;
                v.$field = shared;
                Ok(v)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{PathSeg, parse_config};
    use serde::Deserialize;
    use serde_json::json;

    /// Shared settings: `a` and `b`.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Shared {
        a: u32,
        b: bool,
    }

    impl<'de> SplitKeys<'de> for Shared {
        const KEYS: &'static [&'static str] = &["a", "b"];

        fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
            match key {
                "a" => self.a = map.next_value()?,
                _ => self.b = map.next_value()?,
            }
            Ok(())
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields)]
    struct Own {
        #[serde(default)]
        x: u32,
        #[serde(skip)]
        shared: Shared,
    }
    crate::split_deserialize!(Own, shared, Shared { a: 7, b: false });

    #[derive(Debug, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields)]
    struct OnlyA {
        #[serde(skip)]
        shared: Shared,
    }
    crate::split_deserialize!(OnlyA, shared, Shared::default(), &["a"]);

    #[test]
    fn shared_keys_go_to_the_shared_struct_over_its_defaults() {
        let c: Own = parse_config(&json!({"x": 1, "b": true})).unwrap();
        assert_eq!((c.x, c.shared), (1, Shared { a: 7, b: true }));
        let c: Own = parse_config(&json!({"a": 3})).unwrap();
        assert_eq!((c.x, c.shared), (0, Shared { a: 3, b: false }));
    }

    #[test]
    fn unknown_keys_list_both_sets_at_the_key() {
        let e = parse_config::<Own>(&json!({"x": 1, "c": 2})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("c".into())]);
        assert_eq!(e.message, "unknown field `c`, expected one of `x`, `a`, `b`");
        let e = parse_config::<OnlyA>(&json!({"b": true})).unwrap_err();
        assert_eq!(e.message, "unknown field `b`, expected `a`");
    }

    #[test]
    fn errors_in_shared_values_keep_their_path() {
        let e = parse_config::<Own>(&json!({"a": "no"})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("a".into())]);
        assert!(e.message.contains("invalid type"), "{}", e.message);
    }
}
