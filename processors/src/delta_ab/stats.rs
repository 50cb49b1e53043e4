//! The statistics of `delta_ab`: window statistic, Δ, and a deterministic bootstrap confidence
//! interval (xorshift64* seeded from the window and the group, so replays give the same CI).

use serde::Deserialize;

/// The statistic compared between the two versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Statistic {
    /// Median.
    P50,
    /// 95th percentile.
    P95,
    /// 99th percentile.
    P99,
    /// Arithmetic mean.
    Mean,
}

impl Statistic {
    /// The configuration / attribute name (`p50`, `p95`, `p99`, `mean`).
    pub fn name(self) -> &'static str {
        match self {
            Statistic::P50 => "p50",
            Statistic::P95 => "p95",
            Statistic::P99 => "p99",
            Statistic::Mean => "mean",
        }
    }

    /// The statistic of `values` (reordered in place); `None` when empty.
    pub fn of(self, values: &mut [f64]) -> Option<f64> {
        match self {
            Statistic::P50 => quantile_select(values, 0.5),
            Statistic::P95 => quantile_select(values, 0.95),
            Statistic::P99 => quantile_select(values, 0.99),
            Statistic::Mean => mean(values),
        }
    }
}

/// What the metric measures: fixes the unit of Δ, the threshold and the bad direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Latency in seconds: Δ in ms (B − A), higher is worse.
    Latency,
    /// Throughput: Δ relative, lower is worse.
    Throughput,
    /// Output quality: Δ relative, lower is worse.
    Quality,
}

impl Kind {
    /// The configuration / attribute name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Latency => "latency",
            Kind::Throughput => "throughput",
            Kind::Quality => "quality",
        }
    }

    /// Δ of this kind from the baseline and candidate statistics.
    pub fn delta(self, a: f64, b: f64) -> f64 {
        match self {
            Kind::Latency => (b - a) * 1000.0,
            Kind::Throughput | Kind::Quality => relative(a, b),
        }
    }

    /// Whether a larger Δ is worse (latency) rather than a smaller one.
    pub fn higher_is_worse(self) -> bool {
        self == Kind::Latency
    }
}

/// Relative Δ: (B − A) / max(|A|, 1e-6) (docs/detectors/delta_ab.md).
pub fn relative(a: f64, b: f64) -> f64 {
    (b - a) / a.abs().max(1e-6)
}

/// The mean of `values` (summed in order); `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / values.len() as f64)
}

/// Position of quantile `q` among `n` sorted values: the lower rank and the interpolation weight
/// (linear between closest ranks, h = q·(n−1), numpy's default).
fn rank(n: usize, q: f64) -> (usize, f64) {
    let h = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let lo = (h.floor() as usize).min(n - 1);
    (lo, h - lo as f64)
}

/// Quantile `q` of ascending `sorted` values, interpolated linearly between closest ranks.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let (lo, frac) = rank(sorted.len(), q);
    let v = sorted[lo];
    match sorted.get(lo + 1) {
        Some(&hi) if frac > 0.0 => Some(v + frac * (hi - v)),
        _ => Some(v),
    }
}

/// Same value as [`quantile_sorted`] of the sorted values, by selection (O(n), reorders `values`).
pub fn quantile_select(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let (lo, frac) = rank(values.len(), q);
    let (_, &mut v, upper) = values.select_nth_unstable_by(lo, f64::total_cmp);
    let hi = upper.iter().copied().min_by(f64::total_cmp);
    match hi {
        Some(hi) if frac > 0.0 => Some(v + frac * (hi - v)),
        _ => Some(v),
    }
}

/// xorshift64* (Vigna): small, fast and reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from any seed (mixed, never zero).
    pub fn new(seed: u64) -> Self {
        XorShift(splitmix64(seed).max(1))
    }

    /// The state (to checkpoint).
    pub fn state(self) -> u64 {
        self.0
    }

    /// A generator continuing from a checkpointed state (zero is replaced by one).
    pub fn from_state(state: u64) -> Self {
        XorShift(state.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (multiply-shift; `n` > 0, else 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// SplitMix64 finaliser.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of `bytes` continuing from `h` (start with [`FNV_OFFSET`]).
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// FNV-1a offset basis.
pub const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;

/// A stable 64-bit hash of a string key list (each part length-prefixed).
pub fn hash_key(parts: &[String]) -> u64 {
    parts.iter().fold(FNV_OFFSET, |h, p| fnv1a(fnv1a(h, &(p.len() as u64).to_le_bytes()), p.as_bytes()))
}

/// The bootstrap seed of one group's window: the same window and group always give the same CI.
pub fn window_seed(group: &[String], window_start: u64) -> u64 {
    splitmix64(hash_key(group) ^ splitmix64(window_start))
}

/// The data compared in one window.
#[derive(Debug, Clone, Copy)]
pub enum Sample<'a> {
    /// Independent samples of A and B (compared by window).
    Unpaired {
        /// Baseline values.
        a: &'a [f64],
        /// Candidate values.
        b: &'a [f64],
    },
    /// Pairs (a[i], b[i]) of the same request on both versions.
    Paired {
        /// Baseline values.
        a: &'a [f64],
        /// Candidate values, same length.
        b: &'a [f64],
    },
}

/// Point estimate and bootstrap interval of Δ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The baseline statistic.
    pub a: f64,
    /// The candidate statistic.
    pub b: f64,
    /// Δ of the kind (ms for latency, relative otherwise).
    pub delta: f64,
    /// Relative Δ (B − A) / max(|A|, 1e-6).
    pub delta_rel: f64,
    /// Lower end of the confidence interval of Δ.
    pub ci_low: f64,
    /// Upper end of the confidence interval of Δ.
    pub ci_high: f64,
}

/// Bootstrap settings.
#[derive(Debug, Clone, Copy)]
pub struct Bootstrap {
    /// Statistic compared.
    pub statistic: Statistic,
    /// Kind of Δ.
    pub kind: Kind,
    /// Number of resamples (≥ 1).
    pub resamples: usize,
    /// Confidence level in (0, 1).
    pub confidence: f64,
}

impl Bootstrap {
    /// Δ and its percentile-bootstrap interval; `None` when a side is empty. Unpaired samples are
    /// resampled independently; pairs are resampled together (index i takes a[i] and b[i]).
    pub fn estimate(&self, sample: Sample<'_>, seed: u64) -> Option<Estimate> {
        let (a, b, paired) = match sample {
            Sample::Unpaired { a, b } => (a, b, false),
            Sample::Paired { a, b } => (a, b, true),
        };
        if a.is_empty() || b.is_empty() || (paired && a.len() != b.len()) {
            return None;
        }
        let sa = self.statistic.of(&mut a.to_vec())?;
        let sb = self.statistic.of(&mut b.to_vec())?;
        let mut rng = XorShift::new(seed);
        let mut ra = Vec::with_capacity(a.len());
        let mut rb = Vec::with_capacity(b.len());
        let mut deltas = Vec::with_capacity(self.resamples);
        for _ in 0..self.resamples.max(1) {
            ra.clear();
            rb.clear();
            if paired {
                for _ in 0..a.len() {
                    let i = rng.below(a.len() as u64) as usize;
                    ra.push(a[i]);
                    rb.push(b[i]);
                }
            } else {
                ra.extend((0..a.len()).map(|_| a[rng.below(a.len() as u64) as usize]));
                rb.extend((0..b.len()).map(|_| b[rng.below(b.len() as u64) as usize]));
            }
            let (Some(x), Some(y)) = (self.statistic.of(&mut ra), self.statistic.of(&mut rb)) else { continue };
            let d = self.kind.delta(x, y);
            if d.is_finite() {
                deltas.push(d);
            }
        }
        deltas.sort_unstable_by(f64::total_cmp);
        let tail = (1.0 - self.confidence) / 2.0;
        let delta = self.kind.delta(sa, sb);
        let ci_low = quantile_sorted(&deltas, tail).unwrap_or(delta);
        let ci_high = quantile_sorted(&deltas, 1.0 - tail).unwrap_or(delta);
        Some(Estimate { a: sa, b: sb, delta, delta_rel: relative(sa, sb), ci_low, ci_high })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_closest_ranks() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 10.0];
        assert_eq!(quantile_sorted(&sorted, 0.5), Some(3.0));
        // h = 0.95 * 4 = 3.8: 4 + 0.8 * 6
        assert!((quantile_sorted(&sorted, 0.95).unwrap() - 8.8).abs() < 1e-12);
        assert_eq!(quantile_sorted(&sorted, 1.0), Some(10.0));
        assert_eq!(quantile_sorted(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile_sorted(&[], 0.5), None);
        let mut shuffled = [10.0, 3.0, 1.0, 4.0, 2.0];
        assert_eq!(quantile_select(&mut shuffled, 0.95), quantile_sorted(&sorted, 0.95));
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
    }

    #[test]
    fn kinds_give_ms_or_relative_deltas() {
        assert!((Kind::Latency.delta(0.100, 0.1055) - 5.5).abs() < 1e-9);
        assert!((Kind::Throughput.delta(100.0, 90.0) + 0.1).abs() < 1e-12);
        assert_eq!(relative(0.0, 1e-6), 1.0, "the denominator is at least 1e-6");
    }

    #[test]
    fn xorshift_is_reproducible_and_in_range() {
        let mut a = XorShift::new(42);
        let mut b = XorShift::new(42);
        let xs: Vec<u64> = (0..100).map(|_| a.below(7)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(7)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| x < 7));
        assert!((0..7).all(|v| xs.contains(&v)), "every value appears in 100 draws");
        assert_ne!(XorShift::new(0).state(), 0);
        assert_ne!(window_seed(&["m".into()], 0), window_seed(&["m".into()], 600));
        assert_ne!(window_seed(&["a".into(), "b".into()], 0), window_seed(&["ab".into()], 0));
    }

    #[test]
    fn paired_shift_has_a_point_interval() {
        let a: Vec<f64> = (0..200).map(|i| 0.05 + (i as f64 * 0.37).sin().abs() * 0.2).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 0.004).collect();
        let boot = Bootstrap { statistic: Statistic::P95, kind: Kind::Latency, resamples: 200, confidence: 0.95 };
        let e = boot.estimate(Sample::Paired { a: &a, b: &b }, 1).unwrap();
        for v in [e.delta, e.ci_low, e.ci_high] {
            assert!((v - 4.0).abs() < 1e-6, "{e:?}");
        }
        let u = boot.estimate(Sample::Unpaired { a: &a, b: &b }, 1).unwrap();
        assert!(u.ci_high - u.ci_low > 1.0, "unpaired resampling sees the spread: {u:?}");
        assert!(boot.estimate(Sample::Unpaired { a: &a, b: &[] }, 1).is_none());
    }
}
