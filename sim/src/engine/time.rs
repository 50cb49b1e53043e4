//! Simulated time: nanosecond instants and human-readable durations ("90s", "2d12h", 1.5).

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant or a span on the engine's clock, in nanoseconds since the engine's zero.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Nanoseconds in one day.
pub const NANOS_PER_DAY: u64 = 86_400 * NANOS_PER_SEC;

/// Converts seconds (clamped at 0) to nanoseconds.
pub fn secs_to_nanos(s: f64) -> Nanos {
    if s.is_finite() && s > 0.0 { (s * 1e9).round() as Nanos } else { 0 }
}

/// Converts nanoseconds to seconds.
pub fn nanos_to_secs(n: Nanos) -> f64 {
    n as f64 / 1e9
}

/// A duration in seconds that deserializes from a number (seconds) or a string with units
/// (Go's `ns`, `us`, `ms`, `s`, `m`, `h` plus `d` and `w`, concatenable: `"1d12h"`, `"500ms"`,
/// `"2.5m"`; see [`parse_duration`]); it serializes as a number of seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct SimDuration(pub f64);

impl SimDuration {
    /// The duration in seconds.
    pub fn secs(self) -> f64 {
        self.0
    }

    /// The duration in nanoseconds (negative clamps to 0).
    pub fn nanos(self) -> Nanos {
        secs_to_nanos(self.0)
    }

    /// A duration of `s` seconds.
    pub fn from_secs(s: f64) -> Self {
        SimDuration(s)
    }
}

/// Parses a duration string such as `"1d12h"`, `"90s"`, `"250ms"` or a bare number of seconds,
/// in seconds: the workspace's one duration syntax ([`inferwatch_core::settings::parse_go_duration`]:
/// Go's units plus `d` and `w`), with `min` accepted for `m` as scenario files always could.
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(v) = t.parse::<f64>() {
        return check(v, text);
    }
    let t = min_alias(t);
    inferwatch_core::settings::parse_go_duration(&t)
        .map(|d| d.as_secs_f64())
        .map_err(|e| format!("invalid duration {text:?}: {}", e.reason))
}

/// `text` with each unit `min` (a number before it, a number or the end after it: `1h30min`)
/// written `m`; any other `min` ("5mins") is left for the parser to refuse.
fn min_alias(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let number_before = i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.');
        let unit_ends = b.get(i + 3).is_none_or(|c| c.is_ascii_digit() || *c == b'.');
        if number_before && b[i..].starts_with(b"min") && unit_ends {
            out.push('m');
            i += 3;
            continue;
        }
        let Some(c) = text[i..].chars().next() else { break };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn check(v: f64, text: &str) -> Result<f64, String> {
    if v.is_finite() && v >= 0.0 { Ok(v) } else { Err(format!("invalid duration {text:?}: must be >= 0")) }
}

impl Serialize for SimDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for SimDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SimDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration: seconds as a number, or a string like \"90s\", \"2d12h\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<SimDuration, E> {
                check(v, &v.to_string()).map(SimDuration).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SimDuration, E> {
                Ok(SimDuration(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SimDuration, E> {
                check(v as f64, &v.to_string()).map(SimDuration).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SimDuration, E> {
                parse_duration(v).map(SimDuration).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("90s"), Ok(90.0));
        assert_eq!(parse_duration("1d12h"), Ok(129_600.0));
        assert_eq!(parse_duration("250ms"), Ok(0.25));
        assert_eq!(parse_duration("2.5m"), Ok(150.0));
        assert_eq!(parse_duration("3"), Ok(3.0));
        assert_eq!(parse_duration("1w"), Ok(604_800.0));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("10").is_ok());
    }

    #[test]
    fn parses_the_shared_syntax() {
        assert_eq!(parse_duration("7d"), Ok(604_800.0));
        assert_eq!(parse_duration("1w2d"), Ok(777_600.0));
        assert_eq!(parse_duration("1h30min"), Ok(5400.0));
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("1.5h"), Ok(5400.0));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1h 30m").is_err());
        assert!(parse_duration("1000000w").is_err());
        // `min` is a unit only as a whole unit token.
        assert_eq!(parse_duration("2min"), Ok(120.0));
        assert_eq!(parse_duration("1.5min30s"), Ok(120.0));
        assert!(parse_duration("5mins").is_err(), "5mins must not read as 5 ms");
        assert!(parse_duration("2minutes").is_err());
        assert_eq!(parse_duration("3ms"), Ok(0.003));
    }
}
