//! The limits of a detector's per-series state, `max_series`, `idle_timeout` and
//! `allowed_lateness`: one struct ([`SeriesLimits`]) whose keys sit at the top level of every
//! detector's configuration, and one check ([`SeriesLimits::check`]).
//!
//! A detector config holds the limits in a `#[serde(skip)] limits: SeriesLimits` field, derives
//! its own keys with `#[serde(remote = "Self")]` (an inherent `deserialize`) and gets its
//! `Deserialize` from [`with_series_limits!`], which reads the map through core's
//! [`Split`](inferwatch_core::config::split::Split): the limit keys the detector accepts go to
//! its limits as they are read (starting from the detector's defaults, its `Default`'s
//! `limits`), its own keys to the derived code, and any other key is refused with serde's
//! message (`unknown field `x`, expected one of ...`, both sets of keys listed). Errors are raised while the key or value is read, so their path is the key's path.
//! (serde's `flatten` loses the path of an error in a flattened field and cannot take the
//! defaults of the detector.)

use inferwatch_core::component::FieldError;
use inferwatch_core::config::split::SplitKeys;
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use serde::de::MapAccess;

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
}

impl<'de, D: LimitDuration + Deserialize<'de>> SplitKeys<'de> for SeriesLimits<D> {
    const KEYS: &'static [&'static str] = ALL;

    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "max_series" => self.max_series = map.next_value()?,
            "idle_timeout" => self.idle_timeout = map.next_value()?,
            _ => self.allowed_lateness = map.next_value()?,
        }
        Ok(())
    }
}

/// `Deserialize` for a detector config whose own keys are derived with
/// `#[serde(remote = "Self")]` and whose `limits: SeriesLimits<_>` field is `#[serde(skip)]`;
/// `$keys` are the limit keys it accepts ([`ALL`] or [`NO_LATENESS`]), their defaults those of
/// its `Default`.
macro_rules! with_series_limits {
    ($t:ty, $keys:expr) => {
        inferwatch_core::split_deserialize!($t, limits, <$t as Default>::default().limits, $keys);
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
