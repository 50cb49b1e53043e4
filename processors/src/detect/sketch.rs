//! A mergeable DDSketch: quantiles within a relative error α, in a bounded number of bins.
//!
//! Values map to bins by a logarithmic mapping: with γ = (1+α)/(1−α), a positive value v goes
//! to bin i = ⌈ln v / ln γ⌉, i.e. v ∈ (γ^(i−1), γ^i], and bin i answers 2γ^i/(γ+1), which is
//! within α of every value of the bin. Negative values use a mirrored store of |v|; values
//! whose magnitude is below [`DdSketch::min_indexable`] (zeros) are counted in a zero bin.
//! Each sign keeps its bins in a dense array over a contiguous index range; the two arrays
//! together hold at most `max_bins` bins. When a value (or a merge) would need more, the
//! bins of the lowest values are collapsed into their upper neighbour, so the upper
//! quantiles (the ones latency alerts read) keep their accuracy. Count, min, max and the
//! sum (Neumaier-compensated) are kept exactly beside the bins.

use serde::{Deserialize, Serialize};

/// Default relative accuracy α.
pub const DEFAULT_ALPHA: f64 = 0.01;
/// Default bound on the number of bins.
pub const DEFAULT_MAX_BINS: usize = 2048;
/// Smallest accepted α: below it, f64 rounding of the logarithm alone would exceed α.
pub const MIN_ALPHA: f64 = 1e-9;
/// Largest accepted bin bound (a restored sketch claiming more is corrupt).
pub const MAX_MAX_BINS: usize = 1 << 20;

/// Why a sketch cannot be built, merged or restored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchError {
    /// α is outside [`MIN_ALPHA`], 1).
    #[error("relative accuracy must be at least {MIN_ALPHA} and below 1, got {0}")]
    Alpha(f64),
    /// The bin bound is below 2 or above [`MAX_MAX_BINS`].
    #[error("max_bins must be between 2 and {MAX_MAX_BINS}, got {0}")]
    MaxBins(usize),
    /// Two sketches with different α (or bin bounds) cannot be merged.
    #[error("cannot merge sketches of different parameters (alpha {0} vs {1})")]
    Mismatch(f64, f64),
    /// Serialized state violates the sketch's invariants.
    #[error("invalid sketch state: {0}")]
    Invalid(&'static str),
}

/// Which end of a store is kept when it must shrink.
#[derive(Clone, Copy)]
enum Keep {
    /// Keep the highest indices; lower ones collapse into the lowest kept bin.
    High,
    /// Keep the lowest indices; higher ones collapse into the highest kept bin.
    Low,
}

/// Counts over a contiguous range of bin indices `[offset, offset + counts.len())`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct DenseStore {
    offset: i64,
    counts: Vec<u64>,
}

impl DenseStore {
    fn len(&self) -> usize {
        self.counts.len()
    }

    fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    fn hi(&self) -> i64 {
        self.offset + self.counts.len() as i64 - 1
    }

    /// Rebuilds the array over `[lo, hi]`, moving counts outside it to the nearest end.
    fn reshape(&mut self, lo: i64, hi: i64) {
        if self.is_empty() {
            self.offset = lo;
            self.counts = vec![0; (hi - lo + 1) as usize];
            return;
        }
        if lo == self.offset && hi == self.hi() {
            return;
        }
        if lo <= self.offset && hi >= self.hi() {
            // Pure growth: pad on both sides.
            let front = (self.offset - lo) as usize;
            let back = (hi - self.hi()) as usize;
            if front > 0 {
                self.counts.splice(0..0, std::iter::repeat_n(0, front));
            }
            self.counts.resize(self.counts.len() + back, 0);
            self.offset = lo;
            return;
        }
        let mut next = vec![0u64; (hi - lo + 1) as usize];
        for (k, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let j = (self.offset + k as i64).clamp(lo, hi);
            next[(j - lo) as usize] += c;
        }
        self.offset = lo;
        self.counts = next;
    }

    /// Makes the range cover `[lo, hi]`, within `limit` bins; returns true when bins collapsed.
    fn cover(&mut self, lo: i64, hi: i64, limit: usize, keep: Keep) -> bool {
        let (lo, hi) = if self.is_empty() { (lo, hi) } else { (lo.min(self.offset), hi.max(self.hi())) };
        let limit = limit.max(1) as i64;
        let (lo, hi, collapsed) = if hi - lo < limit {
            (lo, hi, false)
        } else {
            match keep {
                Keep::High => (hi - limit + 1, hi, true),
                Keep::Low => (lo, lo + limit - 1, true),
            }
        };
        self.reshape(lo, hi);
        collapsed
    }

    /// Adds `n` at index `idx` (clamped into the range after covering it).
    fn add(&mut self, idx: i64, n: u64, limit: usize, keep: Keep) -> bool {
        let collapsed = self.cover(idx, idx, limit, keep);
        let j = idx.clamp(self.offset, self.hi());
        if let Some(c) = self.counts.get_mut((j - self.offset) as usize) {
            *c += n;
        }
        collapsed
    }

    /// Shrinks to at most `limit` bins, keeping `keep`'s end.
    fn shrink(&mut self, limit: usize, keep: Keep) -> bool {
        if self.len() <= limit || self.is_empty() {
            return false;
        }
        let limit = limit.max(1) as i64;
        match keep {
            Keep::High => self.reshape(self.hi() - limit + 1, self.hi()),
            Keep::Low => self.reshape(self.offset, self.offset + limit - 1),
        }
        true
    }

    /// Adds every bin of `other`, within `limit` bins.
    fn merge(&mut self, other: &DenseStore, limit: usize, keep: Keep) -> bool {
        if other.is_empty() {
            return false;
        }
        let collapsed = self.cover(other.offset, other.hi(), limit, keep);
        for (k, &c) in other.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let j = (other.offset + k as i64).clamp(self.offset, self.hi());
            if let Some(slot) = self.counts.get_mut((j - self.offset) as usize) {
                *slot += c;
            }
        }
        collapsed
    }

    fn total(&self) -> Option<u64> {
        self.counts.iter().try_fold(0u64, |a, &c| a.checked_add(c))
    }

    /// Non-empty bins in ascending index order.
    fn bins(&self) -> impl DoubleEndedIterator<Item = (i64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, c)| **c > 0).map(move |(k, &c)| (self.offset + k as i64, c))
    }
}

/// The serialized form of a [`DdSketch`] (derived values are recomputed and checked on load).
#[derive(Serialize, Deserialize)]
struct SketchRepr {
    alpha: f64,
    max_bins: usize,
    positive: DenseStore,
    negative: DenseStore,
    zero: u64,
    count: u64,
    min: f64,
    max: f64,
    sum: f64,
    sum_compensation: f64,
    collapsed: bool,
}

/// A DDSketch with exact count, min, max and sum kept beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "SketchRepr", try_from = "SketchRepr")]
pub struct DdSketch {
    alpha: f64,
    ln_gamma: f64,
    /// ln((γ+1)/2): the shift from a bin's upper bound to its representative value.
    ln_half_gamma_plus_one: f64,
    min_indexable: f64,
    max_bins: usize,
    positive: DenseStore,
    negative: DenseStore,
    zero: u64,
    count: u64,
    min: f64,
    max: f64,
    sum: f64,
    sum_compensation: f64,
    collapsed: bool,
}

impl Default for DdSketch {
    fn default() -> Self {
        Self::with_params(DEFAULT_ALPHA, DEFAULT_MAX_BINS)
    }
}

impl DdSketch {
    /// A sketch of relative accuracy `alpha` with at most `max_bins` bins.
    pub fn new(alpha: f64, max_bins: usize) -> Result<Self, SketchError> {
        check_alpha(alpha)?;
        if !(2..=MAX_MAX_BINS).contains(&max_bins) {
            return Err(SketchError::MaxBins(max_bins));
        }
        Ok(Self::with_params(alpha, max_bins))
    }

    fn with_params(alpha: f64, max_bins: usize) -> Self {
        let ln_gamma = alpha.ln_1p() - (-alpha).ln_1p();
        let gamma = ln_gamma.exp();
        DdSketch {
            alpha,
            ln_gamma,
            ln_half_gamma_plus_one: ((gamma + 1.0) / 2.0).ln(),
            min_indexable: f64::MIN_POSITIVE * gamma,
            max_bins,
            positive: DenseStore::default(),
            negative: DenseStore::default(),
            zero: 0,
            count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sum: 0.0,
            sum_compensation: 0.0,
            collapsed: false,
        }
    }

    /// The relative accuracy α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Magnitudes below this are counted as zero (≈ 2.2e-308 · γ).
    pub fn min_indexable(&self) -> f64 {
        self.min_indexable
    }

    /// Number of values added (non-finite values are not added).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Exact smallest value, if any.
    pub fn min(&self) -> Option<f64> {
        (self.count > 0).then_some(self.min)
    }

    /// Exact largest value, if any.
    pub fn max(&self) -> Option<f64> {
        (self.count > 0).then_some(self.max)
    }

    /// Sum of the values (Neumaier-compensated).
    pub fn sum(&self) -> f64 {
        self.sum + self.sum_compensation
    }

    /// Mean of the values, if any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum() / self.count as f64)
    }

    /// Whether bins were ever collapsed (the α guarantee then holds only above the collapsed range).
    pub fn is_collapsed(&self) -> bool {
        self.collapsed
    }

    /// Number of bins held (both signs; the zero bin not counted).
    pub fn bin_count(&self) -> usize {
        self.positive.len() + self.negative.len()
    }

    fn index(&self, magnitude: f64) -> i64 {
        // Saturating cast; magnitudes are finite and ≥ min_indexable, so |index| ≤ ~709/ln γ.
        (magnitude.ln() / self.ln_gamma).ceil() as i64
    }

    fn value_of(&self, index: i64) -> f64 {
        (index as f64 * self.ln_gamma - self.ln_half_gamma_plus_one).exp()
    }

    /// Adds one value; NaN and ±∞ are ignored (returns false).
    pub fn add(&mut self, v: f64) -> bool {
        if !v.is_finite() {
            return false;
        }
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.add_to_sum(v);
        if v > self.min_indexable {
            let limit = self.max_bins - usize::from(!self.negative.is_empty());
            self.collapsed |= self.positive.add(self.index(v), 1, limit, Keep::High);
        } else if v < -self.min_indexable {
            let limit = self.max_bins.saturating_sub(self.positive.len()).max(1);
            self.collapsed |= self.negative.add(self.index(-v), 1, limit, Keep::Low);
        } else {
            self.zero += 1;
        }
        self.fit();
        true
    }

    fn add_to_sum(&mut self, v: f64) {
        // Neumaier's variant of Kahan summation.
        let t = self.sum + v;
        if self.sum.abs() >= v.abs() {
            self.sum_compensation += (self.sum - t) + v;
        } else {
            self.sum_compensation += (v - t) + self.sum;
        }
        self.sum = t;
    }

    /// Collapses the lowest values' bins until both stores fit in `max_bins`.
    fn fit(&mut self) {
        if self.positive.len() + self.negative.len() <= self.max_bins {
            return;
        }
        // The most negative values are the lowest: shrink the negative store first (to one bin).
        let neg_target = self.max_bins.saturating_sub(self.positive.len()).max(1);
        self.collapsed |= self.negative.shrink(neg_target, Keep::Low);
        if self.positive.len() + self.negative.len() > self.max_bins {
            let pos_target = self.max_bins - self.negative.len();
            self.collapsed |= self.positive.shrink(pos_target, Keep::High);
        }
    }

    /// Adds every value of `other` (same α and bin bound); quantiles then answer for both inputs.
    pub fn merge(&mut self, other: &DdSketch) -> Result<(), SketchError> {
        if self.alpha != other.alpha || self.max_bins != other.max_bins {
            return Err(SketchError::Mismatch(self.alpha, other.alpha));
        }
        if other.count == 0 {
            return Ok(());
        }
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.add_to_sum(other.sum);
        self.add_to_sum(other.sum_compensation);
        self.zero += other.zero;
        self.collapsed |= other.collapsed;
        let limit = self.max_bins - usize::from(!self.negative.is_empty() || !other.negative.is_empty());
        self.collapsed |= self.positive.merge(&other.positive, limit, Keep::High);
        let limit = self.max_bins.saturating_sub(self.positive.len()).max(1);
        self.collapsed |= self.negative.merge(&other.negative, limit, Keep::Low);
        self.fit();
        Ok(())
    }

    /// The value at rank ⌊q·(n−1)⌋ of the sorted input, within α (relative) while not collapsed;
    /// `None` when empty or `q` is not in [0, 1]. Ranks 0 and n−1 answer the exact min and max.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = lower_rank(q, self.count);
        if rank == 0 {
            return Some(self.min);
        }
        if rank == self.count - 1 {
            return Some(self.max);
        }
        let clamp = |v: f64| v.max(self.min).min(self.max);
        let mut seen = 0u64;
        // Most negative first: the negative store's highest indices.
        for (i, c) in self.negative.bins().rev() {
            seen += c;
            if seen > rank {
                return Some(clamp(-self.value_of(i)));
            }
        }
        seen += self.zero;
        if seen > rank {
            return Some(clamp(0.0));
        }
        for (i, c) in self.positive.bins() {
            seen += c;
            if seen > rank {
                return Some(clamp(self.value_of(i)));
            }
        }
        Some(self.max)
    }
}

/// The 0-based rank ⌊q·(n−1)⌋ (lower nearest rank) of quantile `q` among `n` values.
pub fn lower_rank(q: f64, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    ((q * (n - 1) as f64).floor().max(0.0) as u64).min(n - 1)
}

fn check_alpha(alpha: f64) -> Result<(), SketchError> {
    if alpha.is_finite() && (MIN_ALPHA..1.0).contains(&alpha) { Ok(()) } else { Err(SketchError::Alpha(alpha)) }
}

impl From<DdSketch> for SketchRepr {
    fn from(s: DdSketch) -> Self {
        SketchRepr {
            alpha: s.alpha,
            max_bins: s.max_bins,
            positive: s.positive,
            negative: s.negative,
            zero: s.zero,
            count: s.count,
            min: s.min,
            max: s.max,
            sum: s.sum,
            sum_compensation: s.sum_compensation,
            collapsed: s.collapsed,
        }
    }
}

impl TryFrom<SketchRepr> for DdSketch {
    type Error = SketchError;

    fn try_from(r: SketchRepr) -> Result<Self, SketchError> {
        let mut s = DdSketch::new(r.alpha, r.max_bins)?;
        if r.positive.len() + r.negative.len() > r.max_bins {
            return Err(SketchError::Invalid("more bins than max_bins"));
        }
        // Real indices stay within ±~745 / ln γ < 2^40 (α ≥ MIN_ALPHA); anything far beyond is corrupt.
        const INDEX_BOUND: i64 = 1 << 48;
        for store in [&r.positive, &r.negative] {
            if !(-INDEX_BOUND..=INDEX_BOUND).contains(&store.offset) {
                return Err(SketchError::Invalid("bin index out of range"));
            }
        }
        let binned = r
            .positive
            .total()
            .zip(r.negative.total())
            .and_then(|(p, n)| p.checked_add(n))
            .and_then(|t| t.checked_add(r.zero));
        if binned != Some(r.count) {
            return Err(SketchError::Invalid("bin counts do not add up to count"));
        }
        let finite = r.min.is_finite() && r.max.is_finite() && r.sum.is_finite() && r.sum_compensation.is_finite();
        if r.count > 0 && !(finite && r.min <= r.max) {
            return Err(SketchError::Invalid("min, max or sum not finite"));
        }
        s.positive = r.positive;
        s.negative = r.negative;
        s.zero = r.zero;
        s.count = r.count;
        s.min = r.min;
        s.max = r.max;
        s.sum = r.sum;
        s.sum_compensation = r.sum_compensation;
        s.collapsed = r.collapsed;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const QS: [f64; 6] = [0.0, 0.01, 0.5, 0.95, 0.99, 1.0];
    /// Slack for f64 rounding of the logarithm at a bin boundary.
    const ROUNDING: f64 = 1e-12;

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[lower_rank(q, sorted.len() as u64) as usize]
    }

    fn sketch_of(values: &[f64]) -> DdSketch {
        let mut s = DdSketch::default();
        for &v in values {
            assert!(s.add(v));
        }
        s
    }

    fn assert_within(values: &[f64], s: &DdSketch) -> Result<(), TestCaseError> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        prop_assert!(!s.is_collapsed());
        for q in QS {
            let want = exact(&sorted, q);
            let got = s.quantile(q).unwrap();
            let err = if want == 0.0 { got.abs() } else { ((got - want) / want).abs() };
            prop_assert!(
                err <= s.alpha() + ROUNDING,
                "q={q}: got {got}, exact {want}, relative error {err} > {}",
                s.alpha()
            );
        }
        Ok(())
    }

    /// Magnitudes spread log-uniformly over 8 decades (one sign fits in ~920 bins at α = 0.01).
    fn log_uniform() -> impl Strategy<Value = f64> {
        (-4.0f64..4.0).prop_map(|e| 10f64.powf(e))
    }

    /// Pareto(1): 1 / u for u in (1e-6, 1], a heavy right tail up to 1e6.
    fn pareto() -> impl Strategy<Value = f64> {
        (1e-6f64..=1.0).prop_map(|u| 1.0 / u)
    }

    fn values() -> impl Strategy<Value = Vec<f64>> {
        prop_oneof![
            // positive, moderate
            prop::collection::vec(0.001f64..10_000.0, 1..400),
            // mixed sign, uniform
            prop::collection::vec(-1.0e6f64..1.0e6, 1..400),
            // heavy-tailed, positive
            prop::collection::vec(pareto(), 1..400),
            // heavy-tailed, both signs
            prop::collection::vec((log_uniform(), any::<bool>()).prop_map(|(v, neg)| if neg { -v } else { v }), 1..400),
            // with zeros (about a third) and repeated values
            prop::collection::vec(
                prop_oneof![Just(0.0), Just(-0.0), Just(1.0), 0.5f64..2.0, -3.0f64..-0.1, log_uniform()],
                1..400
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn quantiles_within_alpha(values in values()) {
            assert_within(&values, &sketch_of(&values))?;
        }

        #[test]
        fn quantiles_within_alpha_at_other_accuracies(values in values(), alpha in 0.01f64..0.2) {
            let mut s = DdSketch::new(alpha, DEFAULT_MAX_BINS).unwrap();
            for &v in &values {
                s.add(v);
            }
            assert_within(&values, &s)?;
        }

        #[test]
        fn merge_equals_sketch_of_concatenation(all in values(), split in any::<prop::sample::Index>()) {
            let (a, b) = all.split_at(split.index(all.len() + 1));
            let mut merged = sketch_of(a);
            merged.merge(&sketch_of(b)).unwrap();
            let whole = sketch_of(&all);
            prop_assert_eq!(merged.count(), whole.count());
            prop_assert_eq!(merged.min(), whole.min());
            prop_assert_eq!(merged.max(), whole.max());
            for q in QS {
                prop_assert_eq!(merged.quantile(q), whole.quantile(q), "q={}", q);
            }
            assert_within(&all, &merged)?;
        }

        #[test]
        fn serde_round_trip(values in values()) {
            let s = sketch_of(&values);
            let bytes = postcard::to_allocvec(&s).unwrap();
            let back: DdSketch = postcard::from_bytes(&bytes).unwrap();
            prop_assert_eq!(&back, &s);
            for q in QS {
                prop_assert_eq!(back.quantile(q), s.quantile(q));
            }
        }
    }

    #[test]
    fn exact_count_min_max_mean() {
        let s = sketch_of(&[3.0, -1.0, 0.0, 10.0]);
        assert_eq!(s.count(), 4);
        assert_eq!(s.min(), Some(-1.0));
        assert_eq!(s.max(), Some(10.0));
        assert_eq!(s.mean(), Some(3.0));
        assert_eq!(s.quantile(0.5), Some(0.0), "rank 1 of [-1, 0, 3, 10] is the zero");
    }

    #[test]
    fn compensated_sum_keeps_small_terms() {
        let mut s = DdSketch::default();
        s.add(1e16);
        for _ in 0..1000 {
            s.add(1.0);
        }
        s.add(-1e16);
        assert_eq!(s.sum(), 1000.0, "plain f64 summation would give 0");
    }

    #[test]
    fn non_finite_values_are_ignored() {
        let mut s = DdSketch::default();
        assert!(!s.add(f64::NAN));
        assert!(!s.add(f64::INFINITY));
        assert!(s.add(2.0));
        assert_eq!(s.count(), 1);
        assert_eq!(s.quantile(0.5), Some(2.0));
        assert_eq!(DdSketch::default().quantile(0.5), None);
        assert_eq!(s.quantile(1.5), None);
    }

    #[test]
    fn collapses_lowest_bins_and_keeps_upper_quantiles() {
        let mut s = DdSketch::new(0.01, 64).unwrap();
        let values: Vec<f64> = (0..2000).map(|i| 1.01f64.powi(i)).collect();
        for &v in &values {
            s.add(v);
        }
        s.add(-5.0);
        assert!(s.is_collapsed());
        assert!(s.bin_count() <= 64, "{} bins", s.bin_count());
        let mut sorted = values.clone();
        sorted.push(-5.0);
        sorted.sort_by(f64::total_cmp);
        for q in [0.99, 0.995] {
            let want = exact(&sorted, q);
            let got = s.quantile(q).unwrap();
            assert!(((got - want) / want).abs() <= 0.01 + ROUNDING, "q={q}: {got} vs {want}");
        }
        // The lowest values lost accuracy: the median now answers from a collapsed bin.
        let want = exact(&sorted, 0.5);
        assert!(s.quantile(0.5).unwrap() > want * 1.02);
        assert_eq!(s.min(), Some(-5.0));
    }

    #[test]
    fn merge_refuses_other_alpha() {
        let mut a = DdSketch::new(0.01, 2048).unwrap();
        let b = DdSketch::new(0.02, 2048).unwrap();
        assert!(matches!(a.merge(&b), Err(SketchError::Mismatch(..))));
    }

    #[test]
    fn parameters_are_checked() {
        assert!(DdSketch::new(0.0, 2048).is_err());
        assert!(DdSketch::new(1.0, 2048).is_err());
        assert!(DdSketch::new(f64::NAN, 2048).is_err());
        assert!(DdSketch::new(0.01, 1).is_err());
        assert!(DdSketch::new(0.5, 2).is_ok());
    }

    #[test]
    fn corrupt_state_is_refused() {
        let s = sketch_of(&[1.0, 2.0, 3.0]);
        let mut repr = SketchRepr::from(s);
        repr.count = 4;
        let bytes = postcard::to_allocvec(&repr).unwrap();
        assert!(postcard::from_bytes::<DdSketch>(&bytes).is_err());
        let mut repr = SketchRepr::from(sketch_of(&[1.0]));
        repr.positive.offset = i64::MIN;
        let bytes = postcard::to_allocvec(&repr).unwrap();
        assert!(postcard::from_bytes::<DdSketch>(&bytes).is_err());
    }
}
