//! The mathematics of `peer_outlier`: each replica's robust baseline from its peers (the median
//! and the MAD of the other replicas, leave-one-out, in O(n log n) for the whole group), the
//! robust z-score with its floored scale, and the consecutive-window rule.

use serde::Deserialize;

/// 1 / Φ⁻¹(3/4): the MAD times this estimates σ of a normal sample.
pub const MAD_TO_SIGMA: f64 = 1.4826;
/// √(π/2): the mean absolute deviation times this estimates σ of a normal sample (twice the
/// mean one-sided deviation, the mean of max(x − median, 0), times this too).
pub const MEAN_DEV_TO_SIGMA: f64 = 1.2533;

/// Which spread of the peers the smoothed relative scale follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Spread {
    /// The bad-side tail: 2 × 1.2533 × mean(max(x − median, 0)) / |median| for higher-is-worse
    /// (the lower tail for lower-is-worse, 1.2533 × mean|x − median| for both).
    Tail,
    /// The centre: 1.4826·MAD / |median|.
    Mad,
}

impl Spread {
    /// The setting's value (`tail`, `mad`).
    pub fn as_str(self) -> &'static str {
        match self {
            Spread::Tail => "tail",
            Spread::Mad => "mad",
        }
    }
}

/// How a replica's windows are combined into a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Persistence {
    /// `for_windows` consecutive windows with z ≥ `threshold` (the behaviour of state version 2).
    Consecutive,
    /// A one-sided CUSUM of the window scores: S = clamp(S + min(z, 2·threshold) − slack, 0,
    /// 2·limit); flagged at S ≥ limit, cleared when S is back at 0.
    Cusum,
}

impl Persistence {
    /// The setting's value (`consecutive`, `cusum`).
    pub fn as_str(self) -> &'static str {
        match self {
            Persistence::Consecutive => "consecutive",
            Persistence::Cusum => "cusum",
        }
    }
}

/// The level of a replica flagged at exactly `threshold` (the alerts' warning level).
pub const FLAGGED_LEVEL: f64 = 0.6;
/// The highest level of a replica worse than `threshold` in fewer than `for_windows`
/// consecutive windows (never reaches [`FLAGGED_LEVEL`]).
pub const PENDING_LEVEL: f64 = 0.5;

/// Which side of the peers is worse for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Worse {
    /// Higher is worse (latency).
    Higher,
    /// Lower is worse (throughput, hit rate).
    Lower,
    /// Both sides (two-sided).
    Both,
}

impl Worse {
    /// The attribute value (`higher`, `lower`, `both`).
    pub fn as_str(self) -> &'static str {
        match self {
            Worse::Higher => "higher",
            Worse::Lower => "lower",
            Worse::Both => "both",
        }
    }

    /// A deviation `d` (value − median) made positive in the bad direction.
    pub fn signed(self, d: f64) -> f64 {
        match self {
            Worse::Higher => d,
            Worse::Lower => -d,
            Worse::Both => d.abs(),
        }
    }
}

/// The median, the MAD and the mean one-sided deviations of a replica's peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    /// Median of the peers' values.
    pub median: f64,
    /// Median absolute deviation of the peers' values from `median`.
    pub mad: f64,
    /// Mean over the peers of max(x − median, 0).
    pub above: f64,
    /// Mean over the peers of max(median − x, 0).
    pub below: f64,
}

impl Baseline {
    /// σ of the peers' tail on the bad side of `worse`: 2 × 1.2533 × `above` (higher), × `below`
    /// (lower), 1.2533 × (`above` + `below`), the mean absolute deviation (both).
    pub fn tail_sigma(&self, worse: Worse) -> f64 {
        match worse {
            Worse::Higher => 2.0 * MEAN_DEV_TO_SIGMA * self.above,
            Worse::Lower => 2.0 * MEAN_DEV_TO_SIGMA * self.below,
            Worse::Both => MEAN_DEV_TO_SIGMA * (self.above + self.below),
        }
    }
}

/// The median of `sorted` without the element at index `skip` (`sorted.len() ≥ 2`).
fn median_without(sorted: &[f64], skip: usize) -> f64 {
    let n = sorted.len() - 1;
    let at = |k: usize| if k < skip { sorted[k] } else { sorted[k + 1] };
    if n % 2 == 1 { at(n / 2) } else { 0.5 * (at(n / 2 - 1) + at(n / 2)) }
}

/// The median of a sorted, non-empty slice.
pub fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 { sorted[n / 2] } else { 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]) }
}

/// For every value, the median, the MAD and the mean one-sided deviations of the **other**
/// values (leave-one-out), in input order; empty when fewer than two values (a replica needs at
/// least one peer). Finite input.
///
/// O(n log n): removing the element of rank r leaves a median that depends only on which side
/// of the middle r lies (at most three distinct medians), and for each of those medians the
/// sorted absolute deviations of all values, and their one-sided sums, are built once; the
/// peers' MAD is then the median of that array without the replica's own deviation, their
/// one-sided sums those of all values less the replica's own.
pub fn leave_one_out(values: &[f64]) -> Vec<Baseline> {
    let n = values.len();
    if n < 2 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by(|&a, &b| values[a].total_cmp(&values[b]).then(a.cmp(&b)));
    let sorted: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    // (median bits, sorted |x − median| of every value, Σ max(x − median, 0), Σ max(median − x, 0))
    let mut devs: Vec<(u64, Vec<f64>, f64, f64)> = Vec::with_capacity(3);
    let mut out = vec![Baseline { median: 0.0, mad: 0.0, above: 0.0, below: 0.0 }; n];
    let peers = (n - 1) as f64;
    for (rank, &i) in order.iter().enumerate() {
        let median = median_without(&sorted, rank);
        let k = match devs.iter().position(|(bits, ..)| *bits == median.to_bits()) {
            Some(k) => k,
            None => {
                let mut d: Vec<f64> = sorted.iter().map(|x| (x - median).abs()).collect();
                d.sort_unstable_by(f64::total_cmp);
                let above: f64 = sorted.iter().map(|x| (x - median).max(0.0)).sum();
                let below: f64 = sorted.iter().map(|x| (median - x).max(0.0)).sum();
                devs.push((median.to_bits(), d, above, below));
                devs.len() - 1
            }
        };
        let (_, d, above, below) = &devs[k];
        let x = sorted[rank];
        let own = (x - median).abs();
        // Any index holding the replica's own deviation: equal values leave the same multiset.
        let pos = d.partition_point(|v| v.total_cmp(&own).is_lt()).min(n - 1);
        out[i] = Baseline {
            median,
            mad: median_without(d, pos),
            above: ((above - (x - median).max(0.0)) / peers).max(0.0),
            below: ((below - (median - x).max(0.0)) / peers).max(0.0),
        };
    }
    out
}

/// The rule a window's values are judged by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Robust z at or above which a replica is worse than its peers in a window (> 0).
    pub threshold: f64,
    /// Consecutive windows worse before the replica is flagged (≥ 1).
    pub for_windows: u32,
    /// Fewest peers for a judgement (≥ 1).
    pub min_peers: usize,
    /// Smallest relative deviation from the peer median that can reach `threshold` (≥ 0).
    pub min_relative_deviation: f64,
    /// Smallest absolute deviation, in the metric's unit, that can reach `threshold` (≥ 0).
    pub min_deviation: f64,
    /// Weight of the newest window in the smoothed relative scale (in (0, 1]).
    pub smoothing: f64,
    /// The spread the smoothed relative scale follows.
    pub spread: Spread,
    /// How windows are combined into a flag.
    pub persistence: Persistence,
    /// CUSUM: the z subtracted per window (the drift a healthy replica's scores stay under; ≥ 0).
    pub cusum_slack: f64,
    /// CUSUM: the accumulated evidence at which a replica is flagged (> 0).
    pub cusum_limit: f64,
}

/// One replica's judgement in one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    /// Robust z, positive in the bad direction (the score).
    pub z: f64,
    /// The scale z divides by: 1.4826·MAD, not below the smoothed relative scale, floored.
    pub scale: f64,
    /// Value − peer median.
    pub deviation: f64,
    /// (Value − peer median) / |peer median| (0 when the median is 0).
    pub relative_deviation: f64,
    /// The value beyond which the replica is worse (median ± threshold·scale).
    pub bound: f64,
}

impl Rule {
    /// The smoothed relative scale after a window with baseline `b`, from the one before
    /// (`previous`, NaN when none): an EWMA with weight `smoothing` of the peers' spread relative
    /// to |median|: [`Baseline::tail_sigma`] on the bad side of `worse` ([`Spread::Tail`]) or
    /// 1.4826·MAD ([`Spread::Mad`]); the previous one kept when the median is 0.
    pub fn smooth(&self, previous: f64, b: Baseline, worse: Worse) -> f64 {
        let spread = match self.spread {
            Spread::Tail => b.tail_sigma(worse),
            Spread::Mad => MAD_TO_SIGMA * b.mad,
        };
        let now = if b.median != 0.0 { spread / b.median.abs() } else { f64::NAN };
        match (previous.is_finite(), now.is_finite()) {
            (true, true) => previous + self.smoothing * (now - previous),
            (false, true) => now,
            _ => previous,
        }
    }

    /// The robust z of `value` against `b` in direction `worse`: (x − median) / scale with
    /// scale = max(1.4826·MAD, rel_scale·|median|, min_relative_deviation·|median| / threshold,
    /// min_deviation / threshold): the window's own MAD, not below the peers' recent typical
    /// spread (`rel_scale`, from [`Rule::smooth`]; NaN: none), and floored so that z reaches
    /// `threshold` only when the replica is also at least `min_relative_deviation` (and
    /// `min_deviation`) away from the median. A scale of 0 (all floors 0, identical peers) gives
    /// z = ±∞ for any difference, 0 for none.
    pub fn judge(&self, value: f64, b: Baseline, worse: Worse, rel_scale: f64) -> Judged {
        let deviation = value - b.median;
        let recent = if rel_scale.is_finite() { rel_scale * b.median.abs() } else { 0.0 };
        let scale = (MAD_TO_SIGMA * b.mad)
            .max(recent)
            .max(self.min_relative_deviation * b.median.abs() / self.threshold)
            .max(self.min_deviation / self.threshold);
        let signed = worse.signed(deviation);
        let z = if scale > 0.0 {
            signed / scale
        } else if signed == 0.0 {
            0.0
        } else {
            signed.signum() * f64::INFINITY
        };
        let relative_deviation = if b.median != 0.0 { deviation / b.median.abs() } else { 0.0 };
        let reach = self.threshold * scale;
        let bound = match worse {
            Worse::Lower => b.median - reach,
            Worse::Higher | Worse::Both => b.median + reach,
        };
        Judged { z, scale, deviation, relative_deviation, bound }
    }

    /// A replica's status after a window in which its z was `z` with `peers` peers, from its
    /// status after the window just before (`previous`; the default when that window was not
    /// judged): worse needs `min_peers` and z ≥ `threshold`; flagged from `for_windows`
    /// consecutive windows worse on, until `for_windows` consecutive windows not worse (or too
    /// few peers) clear it.
    pub fn step(&self, previous: Status, z: f64, peers: usize) -> Status {
        if peers < self.min_peers {
            return Status::default();
        }
        let mut s = previous;
        let worse = z >= self.threshold;
        if worse {
            s.streak = s.streak.saturating_add(1);
            s.calm = 0;
        } else {
            s.streak = 0;
        }
        match self.persistence {
            Persistence::Consecutive => {
                if worse {
                    s.flagged |= s.streak >= self.for_windows;
                } else if s.flagged {
                    s.calm = s.calm.saturating_add(1);
                    if s.calm >= self.for_windows {
                        s = Status::default();
                    }
                }
            }
            Persistence::Cusum => {
                // A window's contribution: its z, capped so that one extreme window cannot flag
                // alone, less the slack; NaN (no scale) counts as nothing.
                let z = if z.is_nan() { 0.0 } else { z.min(2.0 * self.threshold) };
                let e = s.evidence + z - self.cusum_slack;
                s.evidence = if e.is_finite() { e.clamp(0.0, 2.0 * self.cusum_limit) } else { 0.0 };
                if s.evidence >= self.cusum_limit {
                    s.flagged = true;
                } else if s.evidence <= 0.0 {
                    s.flagged = false;
                    s.calm = 0;
                }
                if s.flagged && !worse {
                    s.calm = s.calm.saturating_add(1);
                }
            }
        }
        s
    }

    /// The level of status `s` with z `z` now: flagged and worse now, 0.6 + 0.4·min(1, (z −
    /// threshold) / threshold) (1 at twice the threshold, the alerts' critical 0.8 at 1.5×);
    /// flagged and not worse now (clearing), [`FLAGGED_LEVEL`]; not flagged,
    /// `PENDING_LEVEL`·streak / for_windows (0 when not worse now, always below the warning).
    pub fn level(&self, s: Status, z: f64) -> f64 {
        if !s.flagged {
            let pending = match self.persistence {
                Persistence::Consecutive => f64::from(s.streak.min(self.for_windows)) / f64::from(self.for_windows),
                Persistence::Cusum => (s.evidence / self.cusum_limit).clamp(0.0, 1.0),
            };
            return PENDING_LEVEL * pending;
        }
        if s.streak == 0 {
            return FLAGGED_LEVEL;
        }
        let extra = ((z - self.threshold) / self.threshold).clamp(0.0, 1.0);
        FLAGGED_LEVEL + (1.0 - FLAGGED_LEVEL) * if extra.is_nan() { 1.0 } else { extra }
    }
}

/// Where a replica stands after its latest window.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, Deserialize)]
pub struct Status {
    /// Consecutive windows worse than its peers.
    pub streak: u32,
    /// Consecutive windows not worse while flagged.
    pub calm: u32,
    /// Flagged: `for_windows` worse in a row, not yet cleared by as many not worse (consecutive);
    /// the evidence reached `cusum_limit` and has not fallen back to 0 (cusum).
    pub flagged: bool,
    /// The CUSUM's accumulated evidence (0 with `consecutive`).
    pub evidence: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(values: &[f64], i: usize) -> Baseline {
        let mut peers: Vec<f64> = values.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, v)| *v).collect();
        peers.sort_by(f64::total_cmp);
        let median = median_sorted(&peers);
        let mut d: Vec<f64> = peers.iter().map(|x| (x - median).abs()).collect();
        d.sort_by(f64::total_cmp);
        let k = peers.len() as f64;
        let above = peers.iter().map(|x| (x - median).max(0.0)).sum::<f64>() / k;
        let below = peers.iter().map(|x| (median - x).max(0.0)).sum::<f64>() / k;
        Baseline { median, mad: median_sorted(&d), above, below }
    }

    fn bl(median: f64, mad: f64) -> Baseline {
        Baseline { median, mad, above: 0.0, below: 0.0 }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn leave_one_out_equals_the_naive_computation(
            values in prop::collection::vec(prop_oneof![Just(1.0), Just(2.0), 0.0f64..10.0, -5.0f64..5.0], 2..40)
        ) {
            let got = leave_one_out(&values);
            prop_assert_eq!(got.len(), values.len());
            for (i, g) in got.iter().enumerate() {
                let want = naive(&values, i);
                prop_assert_eq!((g.median, g.mad), (want.median, want.mad), "index {} of {:?}", i, values);
                prop_assert!(close(g.above, want.above) && close(g.below, want.below), "index {} of {:?}: {:?} vs {:?}", i, values, g, want);
            }
        }
    }

    #[test]
    fn small_groups() {
        assert!(leave_one_out(&[1.0]).is_empty());
        assert!(leave_one_out(&[]).is_empty());
        let two = leave_one_out(&[1.0, 3.0]);
        assert_eq!(two, vec![bl(3.0, 0.0), bl(1.0, 0.0)]);
        // One-sided means of the peers: [1.0, 1.1, 0.9, 1.0] around 1.0 for the outlier.
        let b4 = leave_one_out(&[1.0, 1.1, 0.9, 1.0, 5.0])[4];
        assert!(close(b4.above, 0.025) && close(b4.below, 0.025), "{b4:?}");
        // An outlier does not move its own baseline: its peers' median is the others'.
        let b = leave_one_out(&[1.0, 1.1, 0.9, 1.0, 5.0]);
        assert_eq!(b[4].median, 1.0);
        assert!((b[4].mad - 0.05).abs() < 1e-12, "{:?}", b[4]);
        assert!((b[0].median - 1.05).abs() < 1e-12);
    }

    fn rule() -> Rule {
        Rule {
            threshold: 3.0,
            for_windows: 3,
            min_peers: 3,
            min_relative_deviation: 0.1,
            min_deviation: 0.0,
            smoothing: 0.1,
            spread: Spread::Mad,
            persistence: Persistence::Consecutive,
            cusum_slack: 1.0,
            cusum_limit: 6.0,
        }
    }

    #[test]
    fn the_floor_needs_the_relative_deviation_to_reach_the_threshold() {
        let r = rule();
        // Peers within 1 %: MAD·1.4826 ≈ 0.0148, the floor 0.1·1/3 ≈ 0.033 wins.
        let b = bl(1.0, 0.01);
        let j = r.judge(1.09, b, Worse::Higher, f64::NAN);
        assert!(j.z < 3.0, "9 % is below min_relative_deviation: {j:?}");
        assert!((j.scale - 0.1 / 3.0).abs() < 1e-12);
        assert!((j.bound - 1.1).abs() < 1e-12);
        let j = r.judge(1.11, b, Worse::Higher, f64::NAN);
        assert!(j.z > 3.0 && (j.relative_deviation - 0.11).abs() < 1e-12, "{j:?}");
        // A wide fleet: the MAD wins.
        let b = bl(1.0, 0.2);
        let j = r.judge(1.5, b, Worse::Higher, f64::NAN);
        assert!((j.scale - 0.2 * MAD_TO_SIGMA).abs() < 1e-12 && j.z < 3.0);
        // Directions.
        assert!(r.judge(0.5, bl(1.0, 0.01), Worse::Higher, f64::NAN).z < 0.0);
        assert!(r.judge(0.5, bl(1.0, 0.01), Worse::Lower, f64::NAN).z > 3.0);
        assert!(r.judge(0.5, bl(1.0, 0.01), Worse::Both, f64::NAN).z > 3.0);
        let low = r.judge(0.5, bl(1.0, 0.01), Worse::Lower, f64::NAN);
        assert!((low.bound - 0.9).abs() < 1e-12);
        // No floor and identical peers: any difference is infinitely far.
        let r0 = Rule { min_relative_deviation: 0.0, ..r };
        assert_eq!(r0.judge(1.01, bl(1.0, 0.0), Worse::Higher, f64::NAN).z, f64::INFINITY);
        assert_eq!(r0.judge(1.0, bl(1.0, 0.0), Worse::Higher, f64::NAN).z, 0.0);
    }

    #[test]
    fn the_recent_spread_floors_a_chance_tight_window() {
        let r = Rule { min_relative_deviation: 0.0, ..rule() };
        let tight = bl(1.0, 0.005);
        // The peers usually spread 10 %: one tight window does not make 5 % a 3σ outlier.
        let s = r.smooth(0.1, tight, Worse::Higher);
        assert!((s - (0.1 + 0.1 * (MAD_TO_SIGMA * 0.005 - 0.1))).abs() < 1e-12);
        let j = r.judge(1.05, tight, Worse::Higher, s);
        assert!(j.z < 1.0, "{j:?}");
        assert!(r.judge(1.05, tight, Worse::Higher, f64::NAN).z > 3.0);
        // A wider window than usual wins at once.
        let wide = bl(1.0, 0.2);
        assert_eq!(r.judge(1.05, wide, Worse::Higher, 0.1).scale, MAD_TO_SIGMA * 0.2);
        assert_eq!(r.smooth(f64::NAN, wide, Worse::Higher), MAD_TO_SIGMA * 0.2);
        assert_eq!(r.smooth(0.3, bl(0.0, 0.0), Worse::Higher), 0.3);
    }

    #[test]
    fn the_tail_scale_follows_the_bad_side_of_the_peers() {
        let r = Rule { min_relative_deviation: 0.0, spread: Spread::Tail, ..rule() };
        // Peers mostly at the median, a few far above: the MAD is 0, the upper tail is not.
        let peers = [1.0, 1.0, 1.0, 1.0, 1.0, 1.5, 2.1, 1.0];
        let mut values = peers.to_vec();
        values.push(1.6);
        let b = leave_one_out(&values)[8];
        assert_eq!((b.median, b.mad), (1.0, 0.0));
        assert!(close(b.above, 1.6 / 8.0) && b.below == 0.0, "{b:?}");
        let s = r.smooth(f64::NAN, b, Worse::Higher);
        assert!(close(s, 2.0 * MEAN_DEV_TO_SIGMA * 0.2), "{s}");
        // +60 % is a 3σ outlier by the MAD alone, not against the peers' tail.
        assert!(r.judge(1.6, b, Worse::Higher, f64::NAN).z > 3.0);
        let j = r.judge(1.6, b, Worse::Higher, s);
        assert!(j.z < 3.0 && close(j.scale, s), "{j:?}");
        // Direction-aware: nothing below the median, so lower-is-worse has no tail to follow...
        assert_eq!(r.smooth(f64::NAN, b, Worse::Lower), 0.0);
        // ...and both sides take the mean absolute deviation.
        assert!(close(r.smooth(f64::NAN, b, Worse::Both), MEAN_DEV_TO_SIGMA * 0.2));
        let low = Baseline { median: 2.0, mad: 0.0, above: 0.1, below: 0.4 };
        assert!(close(r.smooth(f64::NAN, low, Worse::Lower), 2.0 * MEAN_DEV_TO_SIGMA * 0.4 / 2.0));
        // The MAD spread, kept as a setting, ignores the tail.
        let m = Rule { spread: Spread::Mad, ..r };
        assert_eq!(m.smooth(f64::NAN, b, Worse::Higher), 0.0);
    }

    #[test]
    fn cusum_accumulates_caps_one_window_and_clears_at_zero() {
        let r = Rule { persistence: Persistence::Cusum, cusum_slack: 1.0, cusum_limit: 6.0, ..rule() };
        // threshold 3: one extreme window adds at most 2·3 − 1 = 5 < 6, so it cannot flag alone.
        let s1 = r.step(Status::default(), 100.0, 3);
        assert_eq!((s1.evidence, s1.flagged, s1.streak), (5.0, false, 1));
        assert!(r.level(s1, 100.0) < FLAGGED_LEVEL);
        // z = 2.5 (below the threshold) adds 1.5 per window: flagged at the 4th.
        let mut s = Status::default();
        for i in 1..=4 {
            s = r.step(s, 2.5, 3);
            assert_eq!(s.flagged, i == 4, "window {i}: {s:?}");
        }
        assert_eq!(s.streak, 0);
        assert_eq!(r.level(s, 2.5), FLAGGED_LEVEL);
        // Evidence is capped at 2·limit and drains by the slack once the scores fall to 0.
        for _ in 0..20 {
            s = r.step(s, 6.0, 3);
        }
        assert_eq!(s.evidence, 12.0);
        for i in 1..=12 {
            s = r.step(s, 0.0, 3);
            assert_eq!(s.flagged, i < 12, "window {i}: {s:?}");
        }
        assert_eq!(s, Status::default());
        assert_eq!(r.step(Status { evidence: 5.0, ..Status::default() }, f64::NAN, 3).evidence, 4.0);
        assert_eq!(r.step(s1, 9.0, 2), Status::default(), "too few peers");
    }

    #[test]
    fn status_and_level() {
        let r = rule();
        let st = |streak, calm, flagged| Status { streak, calm, flagged, evidence: 0.0 };
        assert_eq!(r.step(Status::default(), 3.5, 3), st(1, 0, false));
        assert_eq!(r.step(st(2, 0, false), 3.5, 3), st(3, 0, true));
        assert_eq!(r.step(st(2, 0, false), 2.9, 3), st(0, 0, false));
        assert_eq!(r.step(st(5, 0, true), 9.0, 2), Status::default(), "too few peers");
        // Flagged: one window below does not clear it, for_windows in a row do.
        assert_eq!(r.step(st(5, 0, true), 1.0, 3), st(0, 1, true));
        assert_eq!(r.step(st(0, 1, true), 4.0, 3), st(1, 0, true));
        assert_eq!(r.step(st(0, 2, true), 1.0, 3), Status::default());
        assert_eq!(r.level(Status::default(), 9.0), 0.0);
        assert!(r.level(st(2, 0, false), 9.0) < FLAGGED_LEVEL);
        assert_eq!(r.level(st(3, 0, true), 3.0), FLAGGED_LEVEL);
        assert!((r.level(st(3, 0, true), 4.5) - 0.8).abs() < 1e-12);
        assert_eq!(r.level(st(7, 0, true), 100.0), 1.0);
        assert_eq!(r.level(st(7, 0, true), f64::INFINITY), 1.0);
        assert_eq!(r.level(st(0, 1, true), 0.0), FLAGGED_LEVEL, "held while clearing");
    }
}
