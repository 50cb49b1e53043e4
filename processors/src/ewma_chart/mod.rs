//! Processor `ewma_chart`: an EWMA control chart per series (Roberts 1959; the exact-variance
//! limits of Lucas & Saccucci 1990), written on the detector kit as the example a new detector
//! copies (docs/architecture.md, docs/detectors/ewma_chart.md).
//!
//! Phase I: the first `warmup` finite points of a series estimate its in-control mean μ₀ and
//! standard deviation σ (Welford; σ floored at `min_std` and `min_relative_std`·|μ₀|). Phase II:
//! `z_t = λ·x_t + (1 − λ)·z_{t−1}` from `z_0 = μ₀`, and the score is the chart statistic in
//! units of its own standard deviation, `|z_t − μ₀| / (σ·√(λ/(2−λ)·(1 − (1−λ)^{2t})))`, emitted as
//! `llm.anomaly.score` with its level at the point's timestamp. With the defaults (λ = 0.2, the
//! level's warning 0.6 at score 3) the chart signals at the classic L = 3 limit.

use crate::detect::kv_f64;
use crate::detect::level::LevelConfig;
use crate::detect::limits::{self, Limits, SeriesLimits, with_series_limits};
use crate::detect::point::{self, PointConfig, PointDetector, Scored};
use crate::detect::series::RestoreError;
use inferwatch_core::component::FieldError;
use inferwatch_core::settings::GoDuration;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::Duration;

/// The `detector` attribute of the output.
pub const DETECTOR: &str = "ewma_chart";

/// Settings of `ewma_chart`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct EwmaChartConfig {
    /// Exact names of the metrics to chart (at least one).
    pub metrics: Vec<String>,
    /// Smoothing weight λ of the newest point, in (0, 1] (default 0.2; 1 is a Shewhart chart).
    pub lambda: f64,
    /// Points that estimate the in-control mean and deviation before scoring starts (default 100,
    /// ≥ 2; fewer make σ's estimate noisy and false alarms frequent: docs/detectors/ewma_chart.md).
    pub warmup: u64,
    /// Absolute floor on σ, in the metric's unit (default 0).
    pub min_std: f64,
    /// Floor on σ relative to |μ₀| (default 0.05).
    pub min_relative_std: f64,
    /// Score → level mapping (default 0 → 0, 5 → 1: the alerts' warning 0.6 is at score 3).
    pub level: LevelConfig,
    /// `max_series` (default 10000) and `idle_timeout` (default 1h), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

impl Default for EwmaChartConfig {
    fn default() -> Self {
        EwmaChartConfig {
            metrics: Vec::new(),
            lambda: 0.2,
            warmup: 100,
            min_std: 0.0,
            min_relative_std: 0.05,
            level: LevelConfig { zero: 0.0, one: 5.0 },
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(3600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

with_series_limits!(EwmaChartConfig, limits::NO_LATENESS);

impl PointConfig for EwmaChartConfig {
    type Detector = Checked;

    fn check(&self) -> Result<(Checked, Limits), FieldError> {
        if self.metrics.is_empty() || self.metrics.iter().any(String::is_empty) {
            return Err(FieldError::at("metrics", "must name at least one metric, none empty"));
        }
        if !(self.lambda > 0.0 && self.lambda <= 1.0) {
            return Err(FieldError::at("lambda", format!("must be in (0, 1], got {}", self.lambda)));
        }
        if self.warmup < 2 {
            return Err(FieldError::at("warmup", format!("must be at least 2 points, got {}", self.warmup)));
        }
        for (key, v) in [("min_std", self.min_std), ("min_relative_std", self.min_relative_std)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(FieldError::at(key, format!("must be a finite number ≥ 0, got {v}")));
            }
        }
        let LevelConfig { zero, one } = self.level;
        if !(zero.is_finite() && one.is_finite() && one > zero) {
            return Err(FieldError::at("level.one", format!("must be a finite number above level.zero, got {one}")));
        }
        let limits = self.limits.check()?;
        if limits.idle_ns == 0 {
            return Err(FieldError::at("idle_timeout", "must be greater than 0"));
        }
        let chart = Chart {
            lambda: self.lambda,
            warmup: self.warmup,
            min_std: self.min_std,
            min_relative_std: self.min_relative_std,
        };
        Ok((Checked { metrics: self.metrics.iter().cloned().collect(), chart, level: self.level }, limits))
    }
}

/// The checked configuration: the detector the processor runs.
#[derive(Debug, Clone)]
pub struct Checked {
    metrics: HashSet<String>,
    chart: Chart,
    level: LevelConfig,
}

impl PointDetector for Checked {
    const NAME: &'static str = DETECTOR;
    const STATE_VERSION: u32 = 1;
    type Series = Ewma;
    type Repr = Ewma;

    fn metrics(&self) -> &HashSet<String> {
        &self.metrics
    }

    fn new_series(&self) -> Ewma {
        Ewma::default()
    }

    fn score(&self, e: &mut Ewma, _time_ns: u64, x: f64) -> Option<Scored> {
        let sc = e.push(&self.chart, x)?;
        let evidence = vec![
            kv_f64("value", x),
            kv_f64("ewma.z", sc.z),
            kv_f64("ewma.baseline", sc.baseline),
            kv_f64("ewma.std", sc.std),
            kv_f64("ewma.lambda", self.chart.lambda),
            crate::detect::kv_i64("warmup", self.chart.warmup as i64),
        ];
        Some(Scored { score: sc.score, level: self.level.level(sc.score), evidence })
    }

    fn series_repr(&self, e: &Ewma) -> Ewma {
        *e
    }

    fn restore_series(&self, e: Ewma) -> Result<Ewma, RestoreError> {
        if e.n > 0 && !(e.mean.is_finite() && e.m2 >= 0.0 && e.z.is_finite()) {
            return Err(RestoreError::Invalid("chart moments not finite"));
        }
        Ok(e)
    }
}

/// The chart's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chart {
    /// Weight of the newest point.
    pub lambda: f64,
    /// Phase-I points.
    pub warmup: u64,
    /// Absolute σ floor.
    pub min_std: f64,
    /// Relative σ floor.
    pub min_relative_std: f64,
}

/// One series' chart: phase-I moments, then the EWMA statistic.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Ewma {
    /// Points taken.
    pub n: u64,
    /// Phase-I running mean (μ₀ once warm).
    pub mean: f64,
    /// Phase-I sum of squared deviations (Welford).
    pub m2: f64,
    /// The EWMA statistic (μ₀ at the end of phase I).
    pub z: f64,
    /// `(1 − λ)^{2t}` for the exact variance of `z_t`.
    pub decay: f64,
}

/// A phase-II point's score and what it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// `|z − μ₀| / σ_z`.
    pub score: f64,
    /// The EWMA statistic after the point.
    pub z: f64,
    /// μ₀.
    pub baseline: f64,
    /// σ (floored).
    pub std: f64,
}

impl Ewma {
    /// Takes `x`; the score once phase I is over.
    pub fn push(&mut self, c: &Chart, x: f64) -> Option<Score> {
        if self.n < c.warmup {
            self.n += 1;
            let d = x - self.mean;
            self.mean += d / self.n as f64;
            self.m2 += d * (x - self.mean);
            self.z = self.mean;
            self.decay = 1.0;
            return None;
        }
        self.n += 1;
        let std = (self.m2 / (c.warmup - 1) as f64).sqrt().max(c.min_std).max(c.min_relative_std * self.mean.abs());
        self.z = c.lambda * x + (1.0 - c.lambda) * self.z;
        self.decay *= (1.0 - c.lambda) * (1.0 - c.lambda);
        let sigma_z = std * (c.lambda / (2.0 - c.lambda) * (1.0 - self.decay)).sqrt();
        let dev = (self.z - self.mean).abs();
        let score = if sigma_z > 0.0 {
            dev / sigma_z
        } else if dev > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        Some(Score { score, z: self.z, baseline: self.mean, std })
    }
}

point::point_factory!(EwmaChartFactory, EwmaChartConfig, DETECTOR);

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart { lambda: 0.2, warmup: 100, min_std: 0.0, min_relative_std: 0.0 }
    }

    /// A deterministic pseudo-normal sequence (sum of 12 uniforms − 6) around `mean` with sd `sd`.
    fn noise(seed: u64, n: usize, mean: f64, sd: f64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n).map(|_| mean + sd * ((0..12).map(|_| next()).sum::<f64>() - 6.0)).collect()
    }

    #[test]
    fn phase_one_estimates_then_scores_in_units_of_the_statistic() {
        let c = chart();
        let mut e = Ewma::default();
        let xs = noise(1, 100, 10.0, 1.0);
        assert!(xs.iter().all(|&x| e.push(&c, x).is_none()), "no score during warm-up");
        let mean = xs.iter().sum::<f64>() / 100.0;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 99.0).sqrt();
        let sc = e.push(&c, mean + 1.0).unwrap();
        assert!((sc.baseline - mean).abs() < 1e-12 && (sc.std - sd).abs() < 1e-12, "{sc:?}");
        // First phase-II point: z = μ₀ + λ·1, σ_z = σ·λ (exact variance at t = 1).
        assert!((sc.z - (mean + 0.2)).abs() < 1e-12);
        assert!((sc.score - 0.2 / (sd * 0.2)).abs() < 1e-9, "{}", sc.score);
    }

    #[test]
    fn a_one_sigma_shift_is_caught_faster_than_by_a_shewhart_chart() {
        // Warm-up, 100 points in control, then the mean moves by 1σ; 60 seeds. Known-parameter
        // out-of-control ARLs at 1σ: EWMA(0.2, 3) ≈ 10.5, Shewhart 3σ ≈ 44.
        let c = chart();
        let shewhart = Chart { lambda: 1.0, ..c };
        let first_over = |c: &Chart, xs: &[f64]| {
            let mut e = Ewma::default();
            xs.iter().enumerate().find_map(|(i, &x)| e.push(c, x).filter(|s| s.score > 3.0).map(|_| i))
        };
        let (mut ewma, mut plain, mut early) = (Vec::new(), Vec::new(), 0);
        for seed in 0..60 {
            let xs: Vec<f64> =
                noise(7 + seed, 200, 100.0, 5.0).into_iter().chain(noise(1000 + seed, 300, 105.0, 5.0)).collect();
            match (first_over(&c, &xs), first_over(&shewhart, &xs)) {
                (Some(a), Some(b)) if a >= 200 && b >= 200 => {
                    ewma.push((a - 200) as f64);
                    plain.push((b - 200) as f64);
                }
                (a, _) => early += u32::from(a.is_none_or(|a| a < 200)),
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(ewma.len() >= 30 && early <= 25, "{} clean runs, {early} EWMA false alarms", ewma.len());
        assert!(mean(&ewma) < 20.0, "EWMA mean delay {}", mean(&ewma));
        assert!(mean(&ewma) < 0.6 * mean(&plain), "EWMA {} vs Shewhart {}", mean(&ewma), mean(&plain));
    }

    /// Signal runs (entries above the 3σ limit) in `series` in-control series of 1,000 phase-II
    /// points each, after a warm-up of `warmup` points.
    fn in_control_runs(warmup: u64, series: u64) -> u32 {
        let c = Chart { warmup, ..chart() };
        let mut signals = 0;
        for seed in 0..series {
            let mut e = Ewma::default();
            let mut over = false;
            for x in noise(100 + seed, 1000 + warmup as usize, 0.0, 1.0) {
                let now = e.push(&c, x).is_some_and(|s| s.score > 3.0);
                signals += u32::from(now && !over);
                over = now;
            }
        }
        signals
    }

    #[test]
    fn in_control_false_alarms_follow_the_run_length_and_the_warm_up() {
        // λ = 0.2, L = 3 with known parameters: in-control ARL ≈ 560 points (Lucas & Saccucci
        // 1990). Estimated from phase I, σ's error shortens it: about 320 points at a warm-up of
        // 100 and 160 at 30 (Jones, Champ & Rigdon 2001 describe the effect). 40 series of 1,000
        // points: expect ~125 runs at 100 and about twice as many at 30.
        let (long, short) = (in_control_runs(100, 40), in_control_runs(30, 40));
        assert!((50..250).contains(&long), "{long} signal runs in 40,000 in-control points");
        assert!(short as f64 > 1.4 * long as f64, "warm-up 30: {short} runs, 100: {long}");
    }

    #[test]
    fn config_is_checked_with_the_field_named() {
        let bad = |v: serde_json::Value| point::parse::<EwmaChartConfig>(&v).map(|_| ());
        assert_eq!(bad(serde_json::json!({"metrics": []})).unwrap_err().dotted(), "metrics");
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "lambda": 0.0})).unwrap_err().dotted(), "lambda");
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "warmup": 1})).unwrap_err().dotted(), "warmup");
        assert_eq!(bad(serde_json::json!({"metrics": ["m"], "max_series": 0})).unwrap_err().dotted(), "max_series");
        let e = bad(serde_json::json!({"metrics": ["m"], "lamda": 0.3})).unwrap_err();
        assert!(e.message.contains("lambda"), "{e}");
        assert!(bad(serde_json::json!({"metrics": ["m"], "lambda": 0.1, "idle_timeout": "2h"})).is_ok());
    }
}
