//! Processor `anomaly_ensemble`: a general-purpose streaming anomaly detector per series (point
//! anomalies, level shifts, changed patterns), built from the ideas of the strongest NAB entries —
//! context novelty on a quantised grid (CAD OSE), a new-extreme test (HTM's spatial anomaly), a
//! histogram shift test (relative entropy) and HTM's anomaly likelihood with suppression after a
//! report (docs/detectors/anomaly_ensemble.md). The mathematics is in [`ensemble`], std only.
//!
//! `llm.anomaly.score` is the likelihood in decades of tail probability (3 = a tail of 10⁻³, at
//! most 10; a new extreme scores 10); the level maps it linearly (default 0 → 0, 5 → 1: the
//! alerts' warning 0.6 is at a tail of 10⁻³, critical 0.8 at 10⁻⁴).

pub mod ensemble;

use crate::detect::level::LevelConfig;
use crate::detect::limits::{self, Limits, SeriesLimits, with_series_limits};
use crate::detect::point::{self, PointConfig, PointDetector, Scored};
use crate::detect::series::RestoreError;
use crate::detect::{kv_f64, kv_i64};
use ensemble::{CONTEXT_WORDS, Grid, HISTORY, Histogram, Params, State, Window};
use inferwatch_core::component::FieldError;
use inferwatch_core::settings::GoDuration;
use serde::{Deserialize, Serialize};
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

/// The `detector` attribute of the output.
pub const DETECTOR: &str = "anomaly_ensemble";

/// Settings of `anomaly_ensemble`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct AnomalyEnsembleConfig {
    /// Exact names of the metrics to watch (at least one).
    pub metrics: Vec<String>,
    /// Points that learn the quantisation grid before scoring starts (default 150, 2–100000).
    pub warmup: u32,
    /// Grid cells across the warm-up range (default 6, 2–64).
    pub bins: u32,
    /// Time constant of the reference mean, variance and histogram, in points (default 4096, ≥ 2).
    pub reference: u32,
    /// Values of the recent histogram compared with the reference (default 16, 2–1024).
    pub recent: u32,
    /// Points of the raw score's moving average (default 8, 1–1024).
    pub average: u32,
    /// Time constant of the long-run moments of the averaged raw score, in points (default 8000, ≥ 2).
    pub memory: u32,
    /// Points after a report whose level is 0 (default 30; 0: no suppression).
    pub suppress: u32,
    /// Score (decades) at or above which a report starts a suppression (default 3, in (0, 10]).
    pub report_score: f64,
    /// A value beyond the range seen so far by this share of it is a new extreme (default 0.05, ≥ 0).
    pub extreme: f64,
    /// Weight of the new-extreme test in the raw score, next to the novelty's 1 (default 6, ≥ 0).
    pub extreme_weight: f64,
    /// Weight of the histogram shift in the raw score (default 0.5, ≥ 0).
    pub shift_weight: f64,
    /// Score → level mapping (default 0 → 0, 5 → 1: warning 0.6 at score 3, critical 0.8 at 4).
    pub level: LevelConfig,
    /// `max_series` (default 10000) and `idle_timeout` (default 1h), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

impl Default for AnomalyEnsembleConfig {
    fn default() -> Self {
        let p = Params::default();
        AnomalyEnsembleConfig {
            metrics: Vec::new(),
            warmup: p.warmup,
            bins: p.bins,
            reference: p.window as u32,
            recent: p.short as u32,
            average: p.average as u32,
            memory: p.memory as u32,
            suppress: p.suppress,
            report_score: p.report_score,
            extreme: p.extreme,
            extreme_weight: p.extreme_weight,
            shift_weight: p.shift_weight,
            level: LevelConfig { zero: 0.0, one: 5.0 },
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(3600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

with_series_limits!(AnomalyEnsembleConfig, limits::NO_LATENESS);

impl PointConfig for AnomalyEnsembleConfig {
    type Detector = Checked;

    fn check(&self) -> Result<(Checked, Limits), FieldError> {
        if self.metrics.is_empty() || self.metrics.iter().any(String::is_empty) {
            return Err(FieldError::at("metrics", "must name at least one metric, none empty"));
        }
        let ranges: [(&str, u32, u32, u32); 6] = [
            ("warmup", self.warmup, 2, 100_000),
            ("bins", self.bins, 2, 64),
            ("reference", self.reference, 2, u32::MAX),
            ("recent", self.recent, 2, 1024),
            ("average", self.average, 1, 1024),
            ("memory", self.memory, 2, u32::MAX),
        ];
        for (key, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(FieldError::at(key, format!("must be in {lo}..={hi}, got {v}")));
            }
        }
        if !(self.report_score > 0.0 && self.report_score <= ensemble::MAX_SCORE) {
            return Err(FieldError::at("report_score", format!("must be in (0, 10], got {}", self.report_score)));
        }
        let nonneg =
            [("extreme", self.extreme), ("extreme_weight", self.extreme_weight), ("shift_weight", self.shift_weight)];
        for (key, v) in nonneg {
            if !(v.is_finite() && v >= 0.0) {
                return Err(FieldError::at(key, format!("must be a finite number ≥ 0, got {v}")));
            }
        }
        let LevelConfig { zero, one } = self.level;
        if !zero.is_finite() {
            return Err(FieldError::at("level.zero", format!("must be a finite number, got {zero}")));
        }
        if !(one.is_finite() && one > zero) {
            return Err(FieldError::at("level.one", format!("must be a finite number above level.zero, got {one}")));
        }
        let limits = self.limits.check()?;
        if limits.idle_ns == 0 {
            return Err(FieldError::at("idle_timeout", "must be greater than 0"));
        }
        let params = Params {
            warmup: self.warmup,
            bins: self.bins,
            window: self.reference as usize,
            short: self.recent as usize,
            average: self.average as usize,
            memory: f64::from(self.memory),
            suppress: self.suppress,
            report_score: self.report_score,
            extreme: self.extreme,
            extreme_weight: self.extreme_weight,
            shift_weight: self.shift_weight,
            ..Params::default()
        };
        Ok((Checked { metrics: self.metrics.iter().cloned().collect(), params, level: self.level }, limits))
    }
}

/// The checked configuration: the detector the processor runs.
#[derive(Debug, Clone)]
pub struct Checked {
    metrics: HashSet<String>,
    params: Params,
    level: LevelConfig,
}

impl Checked {
    /// The detector's parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }
}

impl PointDetector for Checked {
    const NAME: &'static str = DETECTOR;
    const STATE_VERSION: u32 = 1;
    type Series = State;
    type Repr = SeriesRepr;

    fn metrics(&self) -> &HashSet<String> {
        &self.metrics
    }

    fn new_series(&self) -> State {
        State::new(&self.params)
    }

    fn score(&self, s: &mut State, _time_ns: u64, x: f64) -> Option<Scored> {
        let st = s.push(&self.params, x)?;
        let evidence = vec![
            kv_f64("value", x),
            kv_f64("ensemble.raw", st.raw),
            kv_f64("ensemble.novelty", st.novelty),
            kv_f64("ensemble.shift", st.shift),
            kv_f64("ensemble.surprise", st.surprise),
            kv_i64("ensemble.extreme", i64::from(st.extreme)),
            kv_f64("ensemble.tail", st.tail),
            kv_f64("ensemble.unsuppressed", st.unsuppressed),
            kv_f64("ensemble.baseline", s.ref_mean),
            kv_i64("warmup", i64::from(self.params.warmup)),
        ];
        Some(Scored { score: st.score, level: self.level.level(st.score), evidence })
    }

    fn series_repr(&self, s: &State) -> SeriesRepr {
        SeriesRepr {
            n: s.n,
            grid: s.grid.map(|g| (g.lo, g.width)),
            warm: s.warm.clone(),
            ref_mean: s.ref_mean,
            ref_var: s.ref_var,
            ref_n: s.ref_n,
            ref_hist: s.ref_hist.clone(),
            recent: s.recent.values.iter().copied().collect(),
            recent_sums: (s.recent.origin, s.recent.sum, s.recent.sum2),
            cells: s.cells.iter().copied().collect(),
            contexts: s.contexts.clone(),
            raws: s.raws.iter().copied().collect(),
            avg: (s.avg_mean, s.avg_var, s.avg_n),
            quiet: s.quiet,
            seen: (s.min_seen, s.max_seen),
        }
    }

    fn restore_series(&self, r: SeriesRepr) -> Result<State, RestoreError> {
        let p = &self.params;
        let bad = |m: &'static str| Err(RestoreError::Invalid(m));
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if r.warm.len() > p.warmup as usize
            || r.recent.len() > p.short
            || r.cells.len() > HISTORY
            || r.raws.len() > p.average
            || r.ref_hist.len() != p.bins as usize + 2
            || r.contexts.len() != CONTEXT_WORDS
        {
            return bad("buffer lengths do not match the configuration");
        }
        let (origin, sum, sum2) = r.recent_sums;
        let (avg_mean, avg_var, avg_n) = r.avg;
        let (min_seen, max_seen) = r.seen;
        let scalars = [r.ref_mean, r.ref_var, origin, sum, sum2, avg_mean, avg_var];
        if !(finite(&r.warm) && finite(&r.recent) && finite(&r.ref_hist) && finite(&r.raws) && finite(&scalars))
            || r.ref_var < 0.0
            || avg_var < 0.0
            || (r.grid.is_some() && !(min_seen.is_finite() && max_seen.is_finite() && min_seen <= max_seen))
        {
            return bad("moments or buffers not finite");
        }
        let grid = match r.grid {
            Some((lo, width)) if lo.is_finite() && width.is_finite() && width > 0.0 => Some(Grid { lo, width }),
            Some(_) => return bad("grid not finite or of zero width"),
            None => None,
        };
        let mut recent_hist = Histogram::new(p.bins);
        if let Some(g) = grid {
            for &v in &r.recent {
                recent_hist.count(g.cell(v, p.bins), true);
            }
        } else if !r.recent.is_empty() {
            return bad("recent values before the grid");
        }
        let contexts_set = r.contexts.iter().map(|w| w.count_ones()).sum();
        Ok(State {
            n: r.n,
            grid,
            warm: r.warm,
            ref_mean: r.ref_mean,
            ref_var: r.ref_var,
            ref_n: r.ref_n,
            ref_hist: r.ref_hist,
            recent: Window { cap: p.short, values: VecDeque::from(r.recent), origin, sum, sum2 },
            recent_hist,
            cells: VecDeque::from(r.cells),
            contexts: r.contexts,
            contexts_set,
            raws: VecDeque::from(r.raws),
            avg_mean,
            avg_var,
            avg_n,
            quiet: r.quiet.min(p.suppress),
            min_seen,
            max_seen,
        })
    }
}

/// The checkpoint form of one series (the recent histogram and the set bit count are rebuilt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesRepr {
    /// Points taken.
    pub n: u64,
    /// Grid (lower end, cell width), once fixed.
    pub grid: Option<(f64, f64)>,
    /// Warm-up values.
    pub warm: Vec<f64>,
    /// Reference mean.
    pub ref_mean: f64,
    /// Reference variance.
    pub ref_var: f64,
    /// Values the reference has taken.
    pub ref_n: u64,
    /// Reference histogram shares.
    pub ref_hist: Vec<f64>,
    /// Recent values, oldest first.
    pub recent: Vec<f64>,
    /// Their origin, sum and sum of squares.
    pub recent_sums: (f64, f64, f64),
    /// Last quantised values.
    pub cells: Vec<i64>,
    /// Context bit set.
    pub contexts: Vec<u64>,
    /// Last raw scores.
    pub raws: Vec<f64>,
    /// Long-run mean, variance and count of the averaged raw score.
    pub avg: (f64, f64, u64),
    /// Points left in the suppression.
    pub quiet: u32,
    /// Smallest and largest value seen.
    pub seen: (f64, f64),
}

point::point_factory!(AnomalyEnsembleFactory, AnomalyEnsembleConfig, DETECTOR);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked_with_the_field_named() {
        let bad = |v: serde_json::Value| point::parse::<AnomalyEnsembleConfig>(&v).map(|_| ());
        assert_eq!(bad(serde_json::json!({"metrics": []})).unwrap_err().dotted(), "metrics");
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "warmup": 1})).unwrap_err().dotted(), "warmup");
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "bins": 65})).unwrap_err().dotted(), "bins");
        // A NaN cannot come through JSON: build the config directly.
        let c = AnomalyEnsembleConfig {
            metrics: vec!["m".into()],
            level: LevelConfig { zero: f64::NAN, one: 5.0 },
            ..AnomalyEnsembleConfig::default()
        };
        assert_eq!(c.check().unwrap_err().dotted(), "level.zero");
        assert_eq!(
            bad(serde_json::json!({"metrics": ["m"], "report_score": 0.0})).unwrap_err().dotted(),
            "report_score"
        );
        assert_eq!(
            bad(serde_json::json!({"metrics": ["m"], "shift_weight": -1.0})).unwrap_err().dotted(),
            "shift_weight"
        );
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "max_series": 0})).unwrap_err().dotted(), "max_series");
        let e = bad(serde_json::json!({"metrics": ["m"], "warmpu": 30})).unwrap_err();
        assert!(e.message.contains("warmup"), "{e}");
        assert!(bad(serde_json::json!({"metrics": ["m"], "suppress": 0, "idle_timeout": "2h"})).is_ok());
    }

    #[test]
    fn erfc_and_the_log_score_are_right_at_known_points() {
        assert!((ensemble::erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((ensemble::gaussian_tail(1.0) - 0.158_655_25).abs() < 1e-7);
        assert!((ensemble::gaussian_tail(3.0) / 1.349_898e-3 - 1.0).abs() < 1e-5);
        assert!((ensemble::gaussian_tail(-2.0) - 0.977_249_87).abs() < 1e-7);
        assert!((ensemble::log_score(1e-3) - 3.0).abs() < 1e-6);
        assert_eq!(ensemble::log_score(0.0), 10.0);
        assert_eq!(ensemble::log_score(1.0), 0.0);
    }
}
