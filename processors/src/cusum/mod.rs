//! Processor `cusum`: fast faults by sequential change detection on the residual from a seasonal
//! baseline, with the false-alarm rate as its parameter (docs/detectors/cusum.md).
//!
//! Per series ([`model`]): the value (by default its logarithm) is predicted by a local level
//! (half-life `level_half_life`) plus a daily and a weekly profile (hourly slots, linearly
//! interpolated, learned over `daily_memory` / `weekly_memory`) — Holt-Winters on residuals
//! clipped at `clip` σ, so a fault moves the baseline little. The residual is standardised by a
//! robust scale per hour of the day and fed to a two-sided CUSUM (Page 1954) with reference
//! `k` = half the smallest shift worth detecting (`shift_sigma`, and in log mode `min_ratio`).
//! The decision intervals are solved from the configured false alarms per 30 days through
//! Siegmund's approximation of the in-control average run length at the point `interval`; the
//! level is 0.6 at the warning interval and 0.8 at the critical one (the alerts' defaults).

pub mod model;

use crate::detect::level::LevelConfig;
use crate::detect::limits::{self, Limits, SeriesLimits, with_series_limits};
use crate::detect::point::{self, PointConfig, PointDetector, Scored};
use crate::detect::series::RestoreError;
use crate::detect::{kv_f64, kv_str};
use inferwatch_core::component::FieldError;
use inferwatch_core::settings::GoDuration;
use model::{Direction, Model, Params};
use serde::Deserialize;
use std::collections::HashSet;
use std::time::Duration;

/// The `detector` attribute of the output.
pub const DETECTOR: &str = "cusum";
/// Level at the warning decision interval (the alerts connector's default warning).
pub const WARNING_LEVEL: f64 = 0.6;
/// Level at the critical decision interval (the alerts connector's default critical).
pub const CRITICAL_LEVEL: f64 = 0.8;
/// The highest level of a point whose change is below `min_ratio` (just under critical).
pub const BELOW_CRITICAL: f64 = 0.79;
/// Seconds in 30 days.
const MONTH_S: f64 = 30.0 * 86_400.0;

/// What the profiles learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Season {
    /// Hour of the day and hour of the week (default).
    #[default]
    Weekly,
    /// Hour of the day only.
    Daily,
    /// No profile: the local level alone.
    None,
}

/// What is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transform {
    /// `ln x` (default): multiplicative changes, points ≤ 0 skipped.
    #[default]
    Log,
    /// `x` itself.
    None,
}

/// Settings of `cusum`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct CusumConfig {
    /// Exact names of the metrics to watch (at least one).
    pub metrics: Vec<String>,
    /// Which changes are scored: above (default), below or both.
    pub direction: Direction,
    /// `log` (default) or `none`.
    pub transform: Transform,
    /// `weekly` (default), `daily` or `none`.
    pub season: Season,
    /// The expected interval between a series' points (default 1m): it turns the rates below into run lengths.
    pub interval: GoDuration,
    /// Warning false alarms per 30 days of in-control data the decision interval is set for (default 0.1).
    pub false_alarms_per_30d: f64,
    /// Critical false alarms per 30 days (default 0.001; at most `false_alarms_per_30d`).
    pub critical_false_alarms_per_30d: f64,
    /// Smallest shift worth detecting, in σ of the residual (default 3).
    pub shift_sigma: f64,
    /// Log transform: smallest ratio to the baseline worth detecting (default 1.5; 1 disables).
    pub min_ratio: f64,
    /// Half-life of the local level (default 30m).
    pub level_half_life: GoDuration,
    /// Memory of the daily profile (default 7d).
    pub daily_memory: GoDuration,
    /// Memory of the weekly profile (default 28d).
    pub weekly_memory: GoDuration,
    /// Memory of the residual scales (default 3d).
    pub scale_memory: GoDuration,
    /// Residuals are clipped at this many σ before they update the baseline (default 3).
    pub clip: f64,
    /// Floor on σ in the scored unit (default 0.01: 1 % in log mode).
    pub min_std: f64,
    /// Points before scoring starts (default 30).
    pub warmup: u64,
    /// Consecutive points needed to reach the warning level from zero (default 2: a lone outlier
    /// of a heavy-tailed series does not alarm; 1 lets one point alarm).
    pub confirm_points: u32,
    /// `max_series` (default 10000) and `idle_timeout` (default 7d: a seasonal baseline must
    /// outlive a quiet night or weekend), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

impl Default for CusumConfig {
    fn default() -> Self {
        CusumConfig {
            metrics: Vec::new(),
            direction: Direction::Above,
            transform: Transform::Log,
            season: Season::Weekly,
            interval: GoDuration(Duration::from_secs(60)),
            false_alarms_per_30d: 0.1,
            critical_false_alarms_per_30d: 0.001,
            shift_sigma: 3.0,
            min_ratio: 1.5,
            level_half_life: GoDuration(Duration::from_secs(1800)),
            daily_memory: GoDuration(Duration::from_secs(7 * 86_400)),
            weekly_memory: GoDuration(Duration::from_secs(28 * 86_400)),
            scale_memory: GoDuration(Duration::from_secs(3 * 86_400)),
            clip: 3.0,
            min_std: 0.01,
            warmup: 30,
            confirm_points: 2,
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(7 * 86_400)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

with_series_limits!(CusumConfig, limits::NO_LATENESS);

/// The weight per point of an exponential memory of `points` points (`1/points`, at most 1).
fn weight(points: f64) -> f64 {
    if points > 1.0 { 1.0 / points } else { 1.0 }
}

impl PointConfig for CusumConfig {
    type Detector = Checked;

    fn check(&self) -> Result<(Checked, Limits), FieldError> {
        if self.metrics.is_empty() || self.metrics.iter().any(String::is_empty) {
            return Err(FieldError::at("metrics", "must name at least one metric, none empty"));
        }
        let interval = self.interval.0.as_secs_f64();
        if interval <= 0.0 || interval > 86_400.0 {
            return Err(FieldError::at("interval", "must be in (0s, 24h]"));
        }
        let positive = |key: &str, v: f64| -> Result<(), FieldError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(FieldError::at(key, format!("must be a finite number > 0, got {v}")))
            }
        };
        positive("false_alarms_per_30d", self.false_alarms_per_30d)?;
        positive("critical_false_alarms_per_30d", self.critical_false_alarms_per_30d)?;
        if self.critical_false_alarms_per_30d > self.false_alarms_per_30d {
            return Err(FieldError::at(
                "critical_false_alarms_per_30d",
                format!("must be at most false_alarms_per_30d ({})", self.false_alarms_per_30d),
            ));
        }
        let within = |key: &str, v: f64, lo: f64, hi: f64| -> Result<(), FieldError> {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(FieldError::at(key, format!("must be in [{lo}, {hi}], got {v}")))
            }
        };
        within("shift_sigma", self.shift_sigma, 0.1, 20.0)?;
        within("clip", self.clip, 0.5, 20.0)?;
        if !(self.min_ratio.is_finite() && self.min_ratio >= 1.0) {
            return Err(FieldError::at("min_ratio", format!("must be a finite number ≥ 1, got {}", self.min_ratio)));
        }
        if !(self.min_std.is_finite() && self.min_std > 0.0) {
            return Err(FieldError::at("min_std", format!("must be a finite number > 0, got {}", self.min_std)));
        }
        if self.confirm_points == 0 {
            return Err(FieldError::at("confirm_points", "must be at least 1"));
        }
        if self.warmup < 2 {
            return Err(FieldError::at("warmup", format!("must be at least 2 points, got {}", self.warmup)));
        }
        for (key, d) in [
            ("level_half_life", &self.level_half_life),
            ("daily_memory", &self.daily_memory),
            ("weekly_memory", &self.weekly_memory),
            ("scale_memory", &self.scale_memory),
        ] {
            if d.0.is_zero() {
                return Err(FieldError::at(key, "must be greater than 0"));
            }
        }
        let limits = self.limits.check()?;
        if limits.idle_ns == 0 {
            return Err(FieldError::at("idle_timeout", "must be greater than 0"));
        }
        let slot_ns = 3_600_000_000_000u64;
        let per_slot = 3600.0 / interval;
        let half_life_points = self.level_half_life.0.as_secs_f64() / interval;
        let points_per_30d = MONTH_S / interval;
        if !(points_per_30d / self.critical_false_alarms_per_30d).is_finite() {
            return Err(FieldError::at(
                "critical_false_alarms_per_30d",
                "is too small: its run length is not a finite number",
            ));
        }
        let params = Params {
            log: self.transform == Transform::Log,
            direction: self.direction,
            shift_sigma: self.shift_sigma,
            min_ratio: self.min_ratio,
            arl_warning: points_per_30d / self.false_alarms_per_30d,
            arl_critical: points_per_30d / self.critical_false_alarms_per_30d,
            alpha_level: 1.0 - 0.5f64.powf(1.0 / half_life_points.max(1e-9)),
            alpha_daily: weight(self.daily_memory.0.as_secs_f64() / 86_400.0 * per_slot),
            alpha_weekly: weight(self.weekly_memory.0.as_secs_f64() / (7.0 * 86_400.0) * per_slot),
            alpha_scale: weight(self.scale_memory.0.as_secs_f64() / 86_400.0 * per_slot),
            slot_ns,
            daily: self.season != Season::None,
            weekly: self.season == Season::Weekly,
            scale_min_points: (per_slot.ceil() as u32).max(10),
            clip: self.clip,
            min_std: self.min_std,
            warmup: self.warmup,
            confirm_points: self.confirm_points,
        };
        Ok((Checked { metrics: self.metrics.iter().cloned().collect(), params }, limits))
    }
}

/// The checked configuration: the detector the processor runs.
#[derive(Debug, Clone)]
pub struct Checked {
    metrics: HashSet<String>,
    params: Params,
}

impl Checked {
    /// The model parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }
}

/// The level of CUSUM statistic `s`: 0.6 at `h_warning`, 0.8 at `h_critical`, linear from 0 below
/// the warning interval and between the two, rising to 1 at twice the critical interval.
pub fn level(s: f64, h_warning: f64, h_critical: f64) -> f64 {
    if h_warning <= 0.0 {
        return if s > 0.0 { 1.0 } else { 0.0 };
    }
    if s < h_warning {
        return LevelConfig { zero: 0.0, one: h_warning / WARNING_LEVEL }.level(s);
    }
    if s < h_critical {
        let f = (s - h_warning) / (h_critical - h_warning);
        return WARNING_LEVEL + f * (CRITICAL_LEVEL - WARNING_LEVEL);
    }
    let f = if h_critical > 0.0 { (s - h_critical) / h_critical } else { 1.0 };
    (CRITICAL_LEVEL + f * (1.0 - CRITICAL_LEVEL)).min(1.0)
}

impl PointDetector for Checked {
    const NAME: &'static str = DETECTOR;
    const STATE_VERSION: u32 = 1;
    type Series = Model;
    type Repr = Model;

    fn metrics(&self) -> &HashSet<String> {
        &self.metrics
    }

    fn new_series(&self) -> Model {
        Model::new(&self.params)
    }

    fn score(&self, m: &mut Model, time_ns: u64, x: f64) -> Option<Scored> {
        let p = &self.params;
        let y = if p.log {
            if x <= 0.0 {
                return None;
            }
            x.ln()
        } else {
            x
        };
        let s = m.push(p, time_ns, y)?;
        let baseline = if p.log { s.baseline.exp() } else { s.baseline };
        let mut evidence = vec![
            kv_f64("value", x),
            kv_f64("cusum.baseline", baseline),
            kv_f64("cusum.sigma", s.sigma),
            kv_f64("cusum.z", s.z),
            kv_f64("cusum.k", s.k),
            kv_f64("cusum.h_warning", s.h_warning),
            kv_f64("cusum.h_critical", s.h_critical),
            kv_str("cusum.side", if s.side > 0 { "above" } else { "below" }),
        ];
        let mut lvl = level(s.stat, s.h_warning, s.h_critical);
        if p.log {
            let ratio = x / baseline;
            evidence.push(kv_f64("cusum.ratio", ratio));
            // Critical means certain and material: while the recent (smoothed) change is within
            // min_ratio of the baseline the level stays below critical however long it has lasted.
            let recent = s.recent.exp();
            let change = if s.side > 0 { recent } else { 1.0 / recent };
            if p.min_ratio > 1.0 && change < p.min_ratio {
                lvl = lvl.min(BELOW_CRITICAL);
            }
        }
        Some(Scored { score: s.stat, level: lvl, evidence })
    }

    fn series_repr(&self, m: &Model) -> Model {
        m.clone()
    }

    fn restore_series(&self, m: Model) -> Result<Model, RestoreError> {
        if m.valid_for(&self.params) {
            Ok(m)
        } else {
            Err(RestoreError::Invalid("cusum state does not fit the settings"))
        }
    }
}

point::point_factory!(CusumFactory, CusumConfig, DETECTOR);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_breakpoints() {
        assert_eq!(level(0.0, 4.0, 6.0), 0.0);
        assert!((level(2.0, 4.0, 6.0) - 0.3).abs() < 1e-12);
        assert!((level(4.0, 4.0, 6.0) - 0.6).abs() < 1e-12);
        assert!((level(5.0, 4.0, 6.0) - 0.7).abs() < 1e-12);
        assert!((level(6.0, 4.0, 6.0) - 0.8).abs() < 1e-12);
        assert_eq!(level(12.0, 4.0, 6.0), 1.0);
        assert_eq!(level(100.0, 4.0, 6.0), 1.0);
        // The intervals the model uses are ≥ 1 apart, and each maps to its level.
        let c: CusumConfig = serde_json::from_value(serde_json::json!({"metrics": ["m"]})).unwrap();
        let (d, _) = c.check().unwrap();
        for k in [0.5, 2.0, 20.0] {
            let (w, c) = d.params().intervals(k);
            assert!(w >= 1.0 && c >= w + 1.0, "k {k}: {w} {c}");
            assert!((level(w, w, c) - 0.6).abs() < 1e-12 && (level(c, w, c) - 0.8).abs() < 1e-12);
        }
    }

    #[test]
    fn config_is_checked_with_the_field_named() {
        let bad = |v: serde_json::Value| point::parse::<CusumConfig>(&v).map(|_| ());
        assert_eq!(bad(serde_json::json!({"metrics": []})).unwrap_err().dotted(), "metrics");
        let m = |extra: serde_json::Value| {
            let mut v = serde_json::json!({"metrics": ["m"]});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            bad(v).err().map(|e| e.dotted())
        };
        assert_eq!(m(serde_json::json!({"false_alarms_per_30d": 0.0})).as_deref(), Some("false_alarms_per_30d"));
        assert_eq!(
            m(serde_json::json!({"false_alarms_per_30d": 0.1, "critical_false_alarms_per_30d": 1.0})).as_deref(),
            Some("critical_false_alarms_per_30d")
        );
        assert_eq!(m(serde_json::json!({"min_ratio": 0.5})).as_deref(), Some("min_ratio"));
        assert_eq!(m(serde_json::json!({"shift_sigma": 1e300})).as_deref(), Some("shift_sigma"));
        assert_eq!(m(serde_json::json!({"clip": 1e-300})).as_deref(), Some("clip"));
        assert_eq!(
            m(serde_json::json!({"false_alarms_per_30d": 1e-300, "critical_false_alarms_per_30d": 1e-310})).as_deref(),
            Some("critical_false_alarms_per_30d")
        );
        assert_eq!(m(serde_json::json!({"interval": "0s"})).as_deref(), Some("interval"));
        assert_eq!(m(serde_json::json!({"level_half_life": "0s"})).as_deref(), Some("level_half_life"));
        assert!(m(serde_json::json!({"direction": "sideways"})).is_some());
        assert_eq!(m(serde_json::json!({"season": "daily", "direction": "both", "transform": "none"})), None);
    }
}
