//! The mathematics of `cusum`: a seasonal baseline (a local level plus a daily and a weekly
//! profile, Holt-Winters style, on Huber-clipped residuals), a robust residual scale per hour of
//! the day, and a two-sided CUSUM of the standardised residuals whose decision interval is
//! derived from a target in-control average run length by Siegmund's approximation.

use serde::{Deserialize, Serialize};

/// Siegmund's correction of the decision interval for the overshoot (ρ = 0.583, `2ρ`).
pub const SIEGMUND_OVERSHOOT: f64 = 1.166;
/// `E|Z|` of a standard normal: the mean absolute residual times `1/this` estimates σ.
pub const MEAN_ABS_NORMAL: f64 = 0.797_884_560_802_865_4;
/// The residuals' tail is tracked at this quantile of |z| ...
pub const TAIL_QUANTILE: f64 = 0.99;
/// ... whose normal value is this (z of 0.995).
pub const TAIL_NORMAL_Z: f64 = 2.575_829_303_548_901;
/// Relative step of the tail tracker per point (stochastic approximation of the quantile).
pub const TAIL_RATE: f64 = 0.05;
/// Largest tail factor.
pub const TAIL_MAX: f64 = 10.0;
/// Weight of the newest residual in [`Model::recent`].
pub const RECENT_WEIGHT: f64 = 0.3;
/// Smallest decision interval, in σ (and the least gap between the warning and critical ones).
pub const MIN_INTERVAL: f64 = 1.0;
/// Nanoseconds in a day.
pub const DAY_NS: u64 = 86_400_000_000_000;
/// Nanoseconds in a week.
pub const WEEK_NS: u64 = 7 * DAY_NS;

/// Siegmund's approximation of the in-control average run length, in points, of a one-sided
/// CUSUM `S = max(0, S + z − k)` with N(0, 1) increments and decision interval `h`:
/// `(e^{2kb} − 2kb − 1) / (2k²)` with `b = h + 1.166` (Siegmund 1985, eq. 2.57; `k > 0`).
pub fn siegmund_arl(h: f64, k: f64) -> f64 {
    let u = 2.0 * k * (h + SIEGMUND_OVERSHOOT);
    (u.exp() - u - 1.0) / (2.0 * k * k)
}

/// The decision interval `h ≥ 0` at which [`siegmund_arl`] equals `arl` (points) for reference `k`.
pub fn decision_interval(arl: f64, k: f64) -> f64 {
    // Solve e^u − u − 1 = R for u > 0 by Newton from above (the function is convex and
    // increasing; both starts are above the root: e^u − u − 1 ≥ u²/2, and ≥ R at ln(R + 1) + 1).
    let r = 2.0 * k * k * arl;
    if r == f64::INFINITY {
        return f64::INFINITY;
    }
    if !(r.is_finite() && r > 0.0) {
        return 0.0;
    }
    let mut u = ((r + 1.0).ln() + 1.0).min((2.0 * r).sqrt());
    for _ in 0..64 {
        let g = u.exp() - u - 1.0 - r;
        let step = g / (u.exp() - 1.0);
        u -= step;
        if step.abs() < 1e-12 * u.max(1.0) {
            break;
        }
    }
    (u / (2.0 * k) - SIEGMUND_OVERSHOOT).max(0.0)
}

/// One step of Page's one-sided CUSUM, `min(cap, max(0, s + x − k))`.
pub fn page_step(s: f64, x: f64, k: f64, cap: f64) -> f64 {
    (s + x - k).clamp(0.0, cap)
}

/// Which changes are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Rises (latency, queue length, error ratio).
    #[default]
    Above,
    /// Falls (throughput, cache hit rate).
    Below,
    /// Both.
    Both,
}

/// The model's parameters (checked by the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Score `ln x` (points ≤ 0 are skipped) instead of `x`.
    pub log: bool,
    /// Scored side(s).
    pub direction: Direction,
    /// Smallest shift worth detecting, in σ of the residual.
    pub shift_sigma: f64,
    /// Log mode: smallest ratio worth detecting (the shift is at least `ln(ratio)/σ`).
    pub min_ratio: f64,
    /// Target in-control run length per side at the warning level, in points.
    pub arl_warning: f64,
    /// ... at the critical level.
    pub arl_critical: f64,
    /// Weight of the newest residual in the local level.
    pub alpha_level: f64,
    /// Weight per point in a daily profile slot.
    pub alpha_daily: f64,
    /// Weight per point in a weekly profile slot.
    pub alpha_weekly: f64,
    /// Weight per point in a slot's residual scale.
    pub alpha_scale: f64,
    /// Profile slot length, ns (divides a day).
    pub slot_ns: u64,
    /// Learn the daily profile.
    pub daily: bool,
    /// Learn the weekly profile.
    pub weekly: bool,
    /// Points a scale slot needs before it is used instead of the series' global scale.
    pub scale_min_points: u32,
    /// Residuals are clipped at this many σ before they update the baseline.
    pub clip: f64,
    /// Floor on σ, in the scored unit (log mode: a relative floor).
    pub min_std: f64,
    /// Points before scoring starts.
    pub warmup: u64,
    /// Consecutive points needed to reach the warning interval from zero (one point's increment
    /// is capped at `h_warning / (confirm_points − ½)`; 1: no cap).
    pub confirm_points: u32,
}

impl Params {
    /// Slots in a day.
    pub fn day_slots(&self) -> usize {
        (DAY_NS / self.slot_ns.max(1)) as usize
    }

    /// The reference `k` for a residual scale `sigma` (half the smallest shift worth detecting).
    pub fn reference(&self, sigma: f64) -> f64 {
        let shift = if self.log && self.min_ratio > 1.0 && sigma > 0.0 {
            self.shift_sigma.max(self.min_ratio.ln() / sigma)
        } else {
            self.shift_sigma
        };
        shift / 2.0
    }

    /// Per-side ARLs (two-sided charts split the rate between the sides).
    fn side_arl(&self, arl: f64) -> f64 {
        if self.direction == Direction::Both { 2.0 * arl } else { arl }
    }

    /// Decision intervals `(warning, critical)` for reference `k`: Siegmund's, at least
    /// [`MIN_INTERVAL`] and the critical one at least [`MIN_INTERVAL`] above the warning one (for a
    /// large `k` the formula gives 0: one point past `k` would already be rarer than the rate).
    pub fn intervals(&self, k: f64) -> (f64, f64) {
        let w = decision_interval(self.side_arl(self.arl_warning), k).max(MIN_INTERVAL);
        let c = decision_interval(self.side_arl(self.arl_critical), k).max(w + MIN_INTERVAL);
        (w, c)
    }
}

/// One series' model state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Model {
    /// Points taken.
    pub n: u64,
    /// Local level (in the scored unit).
    pub level: f64,
    /// Mean absolute residual of the series (the scale while slots are young).
    pub abs_dev: f64,
    /// Daily profile, one value per slot (empty when not learned).
    pub daily: Vec<f32>,
    /// Weekly profile, one value per slot of the week (empty when not learned).
    pub weekly: Vec<f32>,
    /// Interpolation weight seen per daily profile slot.
    pub daily_n: Vec<f32>,
    /// Interpolation weight seen per weekly profile slot.
    pub weekly_n: Vec<f32>,
    /// Mean absolute residual per slot of the day.
    pub slot_dev: Vec<f32>,
    /// Interpolation weight seen per slot of the day (points, fractionally).
    pub slot_n: Vec<f32>,
    /// Upper CUSUM.
    pub up: f64,
    /// Lower CUSUM.
    pub down: f64,
    /// Tail factor (≥ 1): the 0.99 quantile of |r|/σ over its normal value, tracked outside alarms.
    pub tail: f64,
    /// Exponentially smoothed residual (weight [`RECENT_WEIGHT`]): the recent change that decides
    /// whether a shift is material.
    pub recent: f64,
}

/// A scored point's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The CUSUM statistic of the scored side (the larger of both).
    pub stat: f64,
    /// Its side: +1 above, −1 below.
    pub side: i8,
    /// The baseline predicted for the point, in the scored unit.
    pub baseline: f64,
    /// The residual scale σ used.
    pub sigma: f64,
    /// The standardised residual.
    pub z: f64,
    /// The reference `k`.
    pub k: f64,
    /// Decision interval at the warning level.
    pub h_warning: f64,
    /// ... at the critical level.
    pub h_critical: f64,
    /// The smoothed recent residual (scored unit).
    pub recent: f64,
}

/// Interpolation of a slot profile: the two slots around `t` and their weights.
fn around(t_ns: u64, period_ns: u64, slot_ns: u64) -> (usize, usize, f64) {
    let slots = (period_ns / slot_ns) as usize;
    let pos = (t_ns % period_ns) as f64 / slot_ns as f64 - 0.5;
    let lo = pos.floor();
    let w1 = pos - lo;
    let i0 = (lo as i64).rem_euclid(slots as i64) as usize;
    (i0, (i0 + 1) % slots, w1)
}

fn interp(v: &[f32], (i0, i1, w1): (usize, usize, f64)) -> f64 {
    match (v.get(i0), v.get(i1)) {
        (Some(&a), Some(&b)) => f64::from(a) * (1.0 - w1) + f64::from(b) * w1,
        _ => 0.0,
    }
}

/// Moves the two slots around a point towards `r` by their interpolation weights, each at
/// `max(alpha, 1/weight seen)`: a running mean of the slot's residuals until its memory is
/// reached (the warm start), exponential after.
fn nudge(v: &mut [f32], seen: &mut [f32], (i0, i1, w1): (usize, usize, f64), alpha: f64, r: f64) {
    for (i, w) in [(i0, 1.0 - w1), (i1, w1)] {
        let (Some(x), Some(n)) = (v.get_mut(i), seen.get_mut(i)) else { continue };
        if w <= 0.0 {
            continue;
        }
        *n += w as f32;
        let a = (w * alpha.max(1.0 / f64::from(*n))).min(1.0);
        *x += (a * r) as f32;
    }
}

impl Model {
    /// A new series' state with its profiles sized for `p`.
    pub fn new(p: &Params) -> Model {
        let d = p.day_slots();
        Model {
            daily: if p.daily { vec![0.0; d] } else { Vec::new() },
            weekly: if p.weekly { vec![0.0; 7 * d] } else { Vec::new() },
            daily_n: if p.daily { vec![0.0; d] } else { Vec::new() },
            weekly_n: if p.weekly { vec![0.0; 7 * d] } else { Vec::new() },
            slot_dev: vec![0.0; d],
            slot_n: vec![0.0; d],
            tail: 1.0,
            ..Model::default()
        }
    }

    /// True when the profile sizes fit `p` and every number is finite.
    pub fn valid_for(&self, p: &Params) -> bool {
        let d = p.day_slots();
        let sized = self.daily.len() == if p.daily { d } else { 0 }
            && self.weekly.len() == if p.weekly { 7 * d } else { 0 }
            && self.daily_n.len() == self.daily.len()
            && self.weekly_n.len() == self.weekly.len()
            && self.slot_dev.len() == d
            && self.slot_n.len() == d;
        let finite = [self.level, self.abs_dev, self.up, self.down, self.recent].iter().all(|v| v.is_finite())
            && [&self.daily, &self.weekly, &self.daily_n, &self.weekly_n, &self.slot_dev, &self.slot_n]
                .iter()
                .all(|v| v.iter().all(|x| x.is_finite()));
        let tail = self.tail.is_finite() && (1.0..=TAIL_MAX).contains(&self.tail);
        sized && finite && tail && self.abs_dev >= 0.0 && self.up >= 0.0 && self.down >= 0.0
    }

    /// The baseline predicted at `t_ns` (scored unit).
    pub fn baseline(&self, p: &Params, t_ns: u64) -> f64 {
        let day = around(t_ns, DAY_NS, p.slot_ns);
        let week = around(t_ns, WEEK_NS, p.slot_ns);
        self.level + interp(&self.daily, day) + interp(&self.weekly, week)
    }

    /// The residual scale σ at `t_ns`: the mean absolute residual's (per hour of the day once the
    /// hour has history) times the tail factor.
    pub fn sigma(&self, p: &Params, t_ns: u64) -> f64 {
        (self.core_sigma(p, t_ns) * self.tail.max(1.0)).max(p.min_std)
    }

    /// σ from the mean absolute residual alone.
    fn core_sigma(&self, p: &Params, t_ns: u64) -> f64 {
        let day = around(t_ns, DAY_NS, p.slot_ns);
        let min = p.scale_min_points as f32;
        let young = self.slot_n.get(day.0).is_none_or(|&n| n < min) || self.slot_n.get(day.1).is_none_or(|&n| n < min);
        let dev = if young { self.abs_dev } else { interp(&self.slot_dev, day) };
        (dev / MEAN_ABS_NORMAL).max(p.min_std)
    }

    /// Takes the value `y` (already in the scored unit) at `t_ns`; the step once warm.
    pub fn push(&mut self, p: &Params, t_ns: u64, y: f64) -> Option<Step> {
        if self.n == 0 {
            self.n = 1;
            self.level = y;
            return None;
        }
        let baseline = self.baseline(p, t_ns);
        let raw = self.core_sigma(p, t_ns);
        let (core, sigma) = (raw.max(p.min_std), (raw * self.tail.max(1.0)).max(p.min_std));
        let r = y - baseline;
        self.recent += RECENT_WEIGHT * (r - self.recent);
        let recent = self.recent;
        let warm = self.n >= p.warmup;
        let step = warm.then(|| {
            let z = r / sigma;
            let k = p.reference(sigma);
            let (h_warning, h_critical) = p.intervals(k);
            let cap = 2.0 * h_critical.max(1.0);
            // One point moves the statistic by at most h_warning / (confirm_points − ½), so that
            // `confirm_points` strong points in a row signal and fewer do not (Lucas & Crosier's
            // robust CUSUM: a lone outlier does not signal).
            let most =
                if p.confirm_points > 1 { k + h_warning / (f64::from(p.confirm_points) - 0.5) } else { f64::INFINITY };
            if p.direction != Direction::Below {
                self.up = page_step(self.up, z.min(most), k, cap);
            }
            if p.direction != Direction::Above {
                self.down = page_step(self.down, (-z).min(most), k, cap);
            }
            let (stat, side) = if self.up >= self.down { (self.up, 1) } else { (self.down, -1) };
            Step { stat, side, baseline, sigma, z, k, h_warning, h_critical, recent }
        });
        // Outside alarms the scales and the tail learn; the level and the profiles always do (clipped).
        let alarming = step.is_some_and(|s| s.stat >= s.h_warning);
        self.learn(p, t_ns, r, sigma, core, !alarming);
        step
    }

    /// Updates the level, the profiles and (with `scales`) the scales and the tail with the
    /// residual `r` (σ before it, `core` without the tail factor).
    fn learn(&mut self, p: &Params, t_ns: u64, r: f64, sigma: f64, core: f64, scales: bool) {
        self.n = self.n.saturating_add(1);
        let bound = p.clip * sigma;
        let rc = r.clamp(-bound, bound);
        // The first points learn the level and the scale as running means.
        let start = 1.0 / self.n as f64;
        self.level += p.alpha_level.max(start) * rc;
        let day = around(t_ns, DAY_NS, p.slot_ns);
        let week = around(t_ns, WEEK_NS, p.slot_ns);
        nudge(&mut self.daily, &mut self.daily_n, day, p.alpha_daily, rc);
        nudge(&mut self.weekly, &mut self.weekly_n, week, p.alpha_weekly, rc);
        if !scales {
            return;
        }
        // Tail: P(|r| > tail · 2.576 core) is driven to 1 − 0.99.
        let exceeds = r.abs() > self.tail * TAIL_NORMAL_Z * core;
        let nudge_tail = if exceeds { TAIL_QUANTILE } else { TAIL_QUANTILE - 1.0 };
        self.tail = (self.tail * (1.0 + TAIL_RATE * nudge_tail)).clamp(1.0, TAIL_MAX);
        // Scales: mean absolute residual, the residual clipped at 2·clip σ so one outlier moves little.
        let a = r.abs().min(2.0 * bound);
        let first = self.n == 2;
        self.abs_dev = if first { a } else { self.abs_dev + p.alpha_scale.max(start) * (a - self.abs_dev) };
        let (i0, i1, w1) = day;
        for (i, w) in [(i0, 1.0 - w1), (i1, w1)] {
            let (Some(n), Some(d)) = (self.slot_n.get_mut(i), self.slot_dev.get_mut(i)) else { continue };
            if w <= 0.0 {
                continue;
            }
            *n += w as f32;
            let alpha = (w * p.alpha_scale.max(1.0 / f64::from(*n))).min(1.0);
            *d += (alpha * (a - f64::from(*d))) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_interval_inverts_siegmund() {
        for &k in &[0.25, 0.5, 1.0, 2.0] {
            for &arl in &[100.0, 1_000.0, 43_200.0, 1e6] {
                let h = decision_interval(arl, k);
                let back = siegmund_arl(h, k);
                assert!(h > 0.0 && (back / arl - 1.0).abs() < 1e-9, "k {k} arl {arl}: h {h} → {back}");
            }
        }
        // The textbook pair: k = 0.5, h = 5 → ARL ≈ 938 (Montgomery's table: 930 exact).
        assert!((siegmund_arl(5.0, 0.5) - 938.0).abs() < 2.0, "{}", siegmund_arl(5.0, 0.5));
    }

    #[test]
    fn interpolation_weights_sum_to_one_and_wrap() {
        let slot = 3_600_000_000_000;
        assert_eq!(around(0, DAY_NS, slot), (23, 0, 0.5));
        assert_eq!(around(slot / 2, DAY_NS, slot), (0, 1, 0.0));
        let (i0, i1, w) = around(DAY_NS - 1, DAY_NS, slot);
        assert_eq!((i0, i1), (23, 0));
        assert!((w - 0.5).abs() < 1e-9);
    }
}
