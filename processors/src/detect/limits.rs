//! The limits of a detector's per-series state, `max_series`, `idle_timeout` and
//! `allowed_lateness`: one struct ([`SeriesLimits`]) whose keys sit at the top level of every
//! detector's configuration, and one check ([`SeriesLimits::check`]).
//!
//! A detector config holds the limits in a `#[serde(skip)] limits: SeriesLimits` field, derives
//! its own keys with `#[serde(remote = "Self")]` (an inherent `deserialize`) and gets its
//! `Deserialize` from [`with_series_limits!`], which reads the map through [`Split`]: the limit
//! keys the detector accepts go to its limits as they are read (starting from the detector's
//! defaults, its `Default`'s `limits`), its own keys to the derived code, and any other key is
//! refused with serde's message (`unknown field `x`, expected one of ...`, both sets of keys
//! listed). Errors are raised while the key or value is read, so their path is the key's path.
//! (serde's `flatten` loses the path of an error in a flattened field and cannot take the
//! defaults of the detector.)

use inferwatch_core::component::FieldError;
use inferwatch_core::settings::GoDuration;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};
use std::fmt;

/// Every key a [`SeriesLimits`] reads.
pub const ALL: &[&str] = &["max_series", "idle_timeout", "allowed_lateness"];
/// The keys of a detector without windows (no `allowed_lateness`).
pub const NO_LATENESS: &[&str] = &["max_series", "idle_timeout"];

/// A duration a limit is written in, as nanoseconds.
pub trait LimitDuration: Copy {
    /// The duration in ns, or the error at `key` when it does not fit.
    fn nanos(&self, key: &str) -> Result<u64, FieldError>;
}

impl LimitDuration for GoDuration {
    fn nanos(&self, key: &str) -> Result<u64, FieldError> {
        super::config::nanos(key, self)
    }
}

/// The limits of a detector's per-series state, as configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesLimits<D = GoDuration> {
    /// Most series held; beyond it the least recently seen 10 % are evicted.
    pub max_series: usize,
    /// Event time without a point after which a series is forgotten.
    pub idle_timeout: D,
    /// How late a point may arrive and still count.
    pub allowed_lateness: D,
}

/// [`SeriesLimits`] checked, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most series held (≥ 1).
    pub max_series: usize,
    /// Idle timeout, ns of event time.
    pub idle_ns: u64,
    /// Allowed lateness, ns of event time.
    pub lateness_ns: u64,
}

impl<D: LimitDuration> SeriesLimits<D> {
    /// The limits in ns: `max_series` at least 1, durations that fit in u64 ns.
    pub fn check(&self) -> Result<Limits, FieldError> {
        if self.max_series == 0 {
            return Err(FieldError::at("max_series", "must be at least 1"));
        }
        Ok(Limits {
            max_series: self.max_series,
            idle_ns: self.idle_timeout.nanos("idle_timeout")?,
            lateness_ns: self.allowed_lateness.nanos("allowed_lateness")?,
        })
    }

    /// Reads the value of limit key `key` from `map`.
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error>
    where
        D: Deserialize<'de>,
    {
        match key {
            "max_series" => self.max_series = map.next_value()?,
            "idle_timeout" => self.idle_timeout = map.next_value()?,
            _ => self.allowed_lateness = map.next_value()?,
        }
        Ok(())
    }
}

/// serde's `unknown field` message, listing the struct's own keys and the limit keys.
fn unknown_field(field: &str, own: &[&str], limits: &[&str]) -> String {
    let all: Vec<String> = own.iter().chain(limits).map(|k| format!("`{k}`")).collect();
    match all.as_slice() {
        [] => format!("unknown field `{field}`, there are no fields"),
        [a] => format!("unknown field `{field}`, expected {a}"),
        [a, b] => format!("unknown field `{field}`, expected {a} or {b}"),
        _ => format!("unknown field `{field}`, expected one of {}", all.join(", ")),
    }
}

/// A deserializer that reads a detector config's map, giving the limit keys in `keys` to
/// `limits` and the struct's own keys to the struct; any other key is an error at that key.
pub struct Split<'l, D, T> {
    inner: D,
    limits: &'l mut SeriesLimits<T>,
    keys: &'static [&'static str],
}

impl<'l, D, T> Split<'l, D, T> {
    /// Reads through `inner`, the limit keys `keys` (of [`ALL`]) into `limits`.
    pub fn new(inner: D, limits: &'l mut SeriesLimits<T>, keys: &'static [&'static str]) -> Self {
        Split { inner, limits, keys }
    }
}

impl<'de, D: Deserializer<'de>, T: LimitDuration + Deserialize<'de>> Deserializer<'de> for Split<'_, D, T> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = SplitVisitor { visitor, limits: self.limits, fields, keys: self.keys };
        self.inner.deserialize_struct(name, fields, v)
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(SplitVisitor { visitor, limits: self.limits, fields: &[], keys: self.keys })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

struct SplitVisitor<'l, V, T> {
    visitor: V,
    limits: &'l mut SeriesLimits<T>,
    fields: &'static [&'static str],
    keys: &'static [&'static str],
}

impl<'de, V: Visitor<'de>, T: LimitDuration + Deserialize<'de>> Visitor<'de> for SplitVisitor<'_, V, T> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(SplitMap { map, limits: self.limits, fields: self.fields, keys: self.keys })
    }
}

struct SplitMap<'l, A, T> {
    map: A,
    limits: &'l mut SeriesLimits<T>,
    fields: &'static [&'static str],
    keys: &'static [&'static str],
}

/// A key of the split map.
enum Key {
    /// One of the struct's own keys.
    Own(String),
    /// One of the limit keys.
    Limit(&'static str),
}

/// Reads a key, refusing one that is neither the struct's nor a limit key (inside the key's
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
            Ok(Key::Limit(k))
        } else {
            Err(E::custom(unknown_field(v, self.fields, self.keys)))
        }
    }
}

impl<'de, A: MapAccess<'de>, T: LimitDuration + Deserialize<'de>> MapAccess<'de> for SplitMap<'_, A, T> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        loop {
            match self.map.next_key_seed(KeySeed { fields: self.fields, keys: self.keys })? {
                None => return Ok(None),
                Some(Key::Own(k)) => return seed.deserialize(k.into_deserializer()).map(Some),
                Some(Key::Limit(k)) => self.limits.read(k, &mut self.map)?,
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// `Deserialize` for a detector config whose own keys are derived with
/// `#[serde(remote = "Self")]` and whose `limits: SeriesLimits<_>` field is `#[serde(skip)]`;
/// `$keys` are the limit keys it accepts ([`ALL`] or [`NO_LATENESS`]), their defaults those of
/// its `Default`.
macro_rules! with_series_limits {
    ($t:ty, $keys:expr) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let mut limits = <$t as Default>::default().limits;
                // The inherent (derived) `deserialize`, over the split map.
                let mut v = <$t>::deserialize($crate::detect::limits::Split::new(d, &mut limits, $keys))?;
                v.limits = limits;
                Ok(v)
            }
        }
    };
}
pub(crate) use with_series_limits;

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::{PathSeg, parse_config};
    use serde_json::json;
    use std::time::Duration;

    /// A detector config as the detectors write theirs.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields, default)]
    struct Demo {
        window: u32,
        nested: Nested,
        #[serde(skip)]
        limits: SeriesLimits,
    }

    #[derive(Debug, Clone, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Nested {
        x: u32,
    }

    impl Default for Demo {
        fn default() -> Self {
            Demo {
                window: 5,
                nested: Nested::default(),
                limits: SeriesLimits {
                    max_series: 77,
                    idle_timeout: GoDuration(Duration::from_secs(60)),
                    allowed_lateness: GoDuration(Duration::from_secs(1)),
                },
            }
        }
    }

    with_series_limits!(Demo, ALL);

    /// The same without `allowed_lateness`.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields, default)]
    struct Windowless {
        window: u32,
        #[serde(skip)]
        limits: SeriesLimits,
    }

    impl Default for Windowless {
        fn default() -> Self {
            Windowless { window: 1, limits: Demo::default().limits }
        }
    }

    with_series_limits!(Windowless, NO_LATENESS);

    #[test]
    fn limit_keys_are_read_beside_the_own_keys_with_the_detectors_defaults() {
        let d: Demo = parse_config(&json!({"window": 3})).unwrap();
        assert_eq!((d.window, d.limits), (3, Demo::default().limits));
        let d: Demo = parse_config(&json!({"idle_timeout": "2m", "window": 4, "max_series": 9})).unwrap();
        assert_eq!(d.window, 4);
        let l = d.limits.check().unwrap();
        assert_eq!(l, Limits { max_series: 9, idle_ns: 120_000_000_000, lateness_ns: 1_000_000_000 });
        let d: Demo = parse_config(&serde_json::Value::Null).unwrap();
        assert_eq!(d.limits.max_series, 77);
    }

    #[test]
    fn errors_carry_the_key_path_and_serdes_messages() {
        let key = |k: &str| PathSeg::Key(k.into());
        for (cfg, path) in [
            (json!({"idle_timeout": "soon"}), vec![key("idle_timeout")]),
            (json!({"max_series": "x"}), vec![key("max_series")]),
            (json!({"allowed_lateness": -1}), vec![key("allowed_lateness")]),
            (json!({"window": "a"}), vec![key("window")]),
            (json!({"nested": {"y": 1}}), vec![key("nested"), key("y")]),
            (json!({"windw": 1}), vec![key("windw")]),
        ] {
            let e = parse_config::<Demo>(&cfg).unwrap_err();
            assert_eq!(e.path, path, "{cfg}: {}", e.message);
        }
        let e = parse_config::<Demo>(&json!({"windw": 1})).unwrap_err();
        assert_eq!(
            e.message,
            "unknown field `windw`, expected one of `window`, `nested`, `max_series`, `idle_timeout`, `allowed_lateness`"
        );
        let e = parse_config::<Windowless>(&json!({"allowed_lateness": "1s"})).unwrap_err();
        assert_eq!(e.path, vec![key("allowed_lateness")]);
        assert_eq!(
            e.message,
            "unknown field `allowed_lateness`, expected one of `window`, `max_series`, `idle_timeout`"
        );
    }

    #[test]
    fn check_refuses_zero_series_and_durations_beyond_u64_ns() {
        let mut l = Demo::default().limits;
        l.max_series = 0;
        assert_eq!(l.check().unwrap_err().path, vec![PathSeg::Key("max_series".into())]);
        l.max_series = 1;
        l.idle_timeout = GoDuration(Duration::from_secs(u64::MAX));
        let e = l.check().unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("idle_timeout".into())]);
        assert!(e.message.ends_with("is too long (at most ~584 years)"), "{}", e.message);
        l.idle_timeout = GoDuration(Duration::ZERO);
        l.allowed_lateness = GoDuration(Duration::from_secs(u64::MAX));
        assert_eq!(l.check().unwrap_err().path, vec![PathSeg::Key("allowed_lateness".into())]);
    }
}
