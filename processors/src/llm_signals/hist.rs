//! The latency signals, their fixed bucket lists, cumulative histograms, and Prometheus' `histogram_quantile`.

use serde::{Deserialize, Serialize};

/// `gen_ai.server.time_to_first_token` boundaries (semconv v1.41), seconds.
pub const TTFT_BOUNDS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// `gen_ai.server.time_per_output_token` boundaries (semconv v1.41), seconds.
pub const TPOT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];
/// `gen_ai.server.request.duration` boundaries (semconv v1.41), seconds; also used for `llm.request.queue_time`.
pub const DURATION_BOUNDS: &[f64] =
    &[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];

/// A per-request latency signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Lat {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// End-to-end request duration.
    E2e,
    /// Time queued before scheduling.
    Queue,
    /// Inter-token latency: the interval between consecutive output tokens (scraped only: no
    /// server's request span measures it).
    Itl,
}

impl Lat {
    /// The latency signals a request span measures, in output order (the per-request arrays of
    /// the span state have one slot each).
    pub const ALL: [Lat; 4] = [Lat::Ttft, Lat::Tpot, Lat::E2e, Lat::Queue];

    /// Every windowed latency signal, in output order: [`Lat::ALL`] and [`Lat::Itl`].
    pub const WINDOWED: [Lat; 5] = [Lat::Ttft, Lat::Tpot, Lat::E2e, Lat::Queue, Lat::Itl];

    /// Index into the per-request arrays (`Lat::ALL` order; [`Lat::Itl`], which has no slot,
    /// is 4: look it up with `get`).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Explicit bucket boundaries of the span-derived cumulative histogram.
    pub fn bounds(self) -> &'static [f64] {
        match self {
            Lat::Ttft => TTFT_BOUNDS,
            Lat::Tpot | Lat::Itl => TPOT_BOUNDS,
            Lat::E2e | Lat::Queue => DURATION_BOUNDS,
        }
    }

    /// Name of the cumulative histogram.
    pub fn histogram_name(self) -> &'static str {
        match self {
            Lat::Ttft => "gen_ai.server.time_to_first_token",
            Lat::Tpot => "gen_ai.server.time_per_output_token",
            Lat::E2e => "gen_ai.server.request.duration",
            Lat::Queue => "llm.request.queue_time",
            Lat::Itl => "llm.request.inter_token_latency",
        }
    }

    /// Prefix of the windowed percentile gauges (`<prefix>.p95`).
    pub fn gauge_prefix(self) -> &'static str {
        match self {
            Lat::Ttft => "llm.ttft",
            Lat::Tpot => "llm.tpot",
            Lat::E2e => "llm.e2e",
            Lat::Queue => "llm.queue",
            Lat::Itl => "llm.itl",
        }
    }
}

/// A histogram over one of the fixed bucket lists: per-bucket counts (`bounds.len() + 1`, the
/// last one above the highest bound), count, sum, min and max.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixedHist {
    /// Per-bucket counts; bucket i holds values in (bounds[i-1], bounds[i]].
    pub counts: Vec<u64>,
    /// Number of values.
    pub count: u64,
    /// Sum of the values.
    pub sum: f64,
    /// Smallest value (+∞ when empty).
    pub min: f64,
    /// Largest value (−∞ when empty).
    pub max: f64,
}

impl FixedHist {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &[f64]) -> Self {
        FixedHist { counts: vec![0; bounds.len() + 1], count: 0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }

    /// Adds one value (finite, checked by the caller) using `bounds` (the ones it was built with).
    pub fn add(&mut self, bounds: &[f64], v: f64) {
        let i = bounds.partition_point(|b| *b < v);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Adds every value of `other` (same bounds).
    pub fn merge(&mut self, other: &FixedHist) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

/// Prometheus' `histogram_quantile(q, …)` over per-bucket counts (`counts.len() == bounds.len() + 1`,
/// the last bucket unbounded): linear interpolation inside the bucket holding rank `q·n`, the lowest
/// bucket starting at 0, and the highest finite bound when the rank falls in the +Inf bucket.
/// `None` when there are no observations, `q` is outside [0, 1], or the shapes disagree.
pub fn histogram_quantile(q: f64, bounds: &[f64], counts: &[u64]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || counts.len() != bounds.len() + 1 || bounds.is_empty() {
        return None;
    }
    let mut cumulative = Vec::with_capacity(counts.len());
    let mut acc = 0f64;
    for c in counts {
        acc += *c as f64;
        cumulative.push(acc);
    }
    let observations = acc;
    if observations <= 0.0 {
        return None;
    }
    let rank = q * observations;
    // sort.Search over the finite buckets: the first whose cumulative count reaches the rank.
    let finite = bounds.len();
    let b = cumulative[..finite].partition_point(|c| *c < rank);
    if b == finite {
        return Some(bounds[finite - 1]);
    }
    if b == 0 && bounds[0] <= 0.0 {
        return Some(bounds[0]);
    }
    let end = bounds[b];
    let (start, below) = if b > 0 { (bounds[b - 1], cumulative[b - 1]) } else { (0.0, 0.0) };
    let in_bucket = cumulative[b] - below;
    if in_bucket <= 0.0 {
        return Some(start);
    }
    Some(start + (end - start) * ((rank - below) / in_bucket))
}

/// The window quantile of a scraped histogram delta: [`histogram_quantile`], except when every
/// observation fell into **one** bucket. Interpolation there only restates the bucket's bounds
/// (vLLM's first request-latency bucket is (0, 0.3 s]: a queue time of 6 ms would read 0.15 s),
/// so every quantile is then the window's mean `sum / count`, clamped to that bucket
/// (`[lower, upper]`, the lowest bucket starting at 0, the `+Inf` bucket unbounded above).
/// Without a finite, non-negative `sum` it falls back to [`histogram_quantile`].
pub fn window_quantile(q: f64, bounds: &[f64], counts: &[u64], sum: Option<f64>) -> Option<f64> {
    let interpolated = histogram_quantile(q, bounds, counts)?;
    let mut occupied = counts.iter().enumerate().filter(|(_, c)| **c > 0);
    let (Some((i, &n)), None) = (occupied.next(), occupied.next()) else { return Some(interpolated) };
    let Some(sum) = sum.filter(|s| s.is_finite() && *s >= 0.0) else { return Some(interpolated) };
    let lower = match i.checked_sub(1).and_then(|j| bounds.get(j)) {
        Some(b) => *b,
        None => bounds.first().map_or(0.0, |b| b.min(0.0)),
    };
    let upper = bounds.get(i).copied().unwrap_or(f64::INFINITY);
    Some((sum / n as f64).max(lower).min(upper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_upper_inclusive() {
        let b = [1.0, 2.0];
        let mut h = FixedHist::new(&b);
        for v in [0.5, 1.0, 1.5, 2.0, 3.0] {
            h.add(&b, v);
        }
        assert_eq!(h.counts, vec![2, 2, 1]);
        assert_eq!((h.count, h.sum, h.min, h.max), (5, 8.0, 0.5, 3.0));
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        // buckets le=1: 10, le=2: 30 (cum 40), +Inf: 0 (cum 40)
        let b = [1.0, 2.0];
        assert_eq!(histogram_quantile(0.5, &b, &[10, 30, 0]), Some(1.0 + (20.0 - 10.0) / 30.0));
        assert_eq!(histogram_quantile(0.2, &b, &[10, 30, 0]), Some(0.8), "first bucket starts at 0");
        assert_eq!(histogram_quantile(0.99, &b, &[10, 30, 5]), Some(2.0), "rank in +Inf: highest finite bound");
        assert_eq!(histogram_quantile(0.5, &b, &[0, 0, 0]), None);
        assert_eq!(histogram_quantile(1.5, &b, &[1, 0, 0]), None);
        assert_eq!(histogram_quantile(0.5, &b, &[1, 0]), None);
    }

    #[test]
    fn one_bucket_windows_report_the_clamped_mean() {
        // vLLM 0.33's request-latency buckets start at 0.3 s: 100 queue times, mean 5.9 ms.
        let b = [0.3, 0.5, 0.8];
        for q in [0.5, 0.95, 0.99] {
            let v = window_quantile(q, &b, &[100, 0, 0, 0], Some(0.5914887)).unwrap();
            assert!((v - 0.005914887).abs() < 1e-12, "q {q}: {v}");
        }
        assert_eq!(histogram_quantile(0.5, &b, &[100, 0, 0, 0]), Some(0.15), "what interpolation says");
        // A mean outside the bucket (an inconsistent sum) is clamped to it.
        assert_eq!(window_quantile(0.5, &b, &[0, 4, 0, 0], Some(0.4)), Some(0.3));
        assert_eq!(window_quantile(0.5, &b, &[0, 4, 0, 0], Some(4.0)), Some(0.5));
        // The +Inf bucket: the mean, at least the highest bound (interpolation: the bound).
        assert_eq!(window_quantile(0.99, &b, &[0, 0, 0, 2], Some(3.0)), Some(1.5));
        assert_eq!(window_quantile(0.99, &b, &[0, 0, 0, 2], Some(1.0)), Some(0.8));
        // Two buckets: interpolation as before; no sum: interpolation.
        assert_eq!(window_quantile(0.5, &b, &[1, 1, 0, 0], Some(0.5)), histogram_quantile(0.5, &b, &[1, 1, 0, 0]));
        assert_eq!(window_quantile(0.5, &b, &[4, 0, 0, 0], None), Some(0.15));
        assert_eq!(window_quantile(0.5, &b, &[4, 0, 0, 0], Some(f64::NAN)), Some(0.15));
        assert_eq!(window_quantile(0.5, &b, &[0, 0, 0, 0], Some(1.0)), None);
        // A first bound at 0 (SGLang's queue time): that bucket holds only 0.
        assert_eq!(window_quantile(0.5, &[0.0, 0.001], &[3, 0, 0], Some(0.0)), Some(0.0));
    }
}
