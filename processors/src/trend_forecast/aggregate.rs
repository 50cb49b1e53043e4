//! Event-time aggregates: the points of one series in epoch-aligned buckets of `aggregate`, reduced to
//! one value (mean, max or p95) when the bucket closes, and the rolling history of those values.

use crate::detect::sketch::{DEFAULT_ALPHA, DEFAULT_MAX_BINS, DdSketch};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The statistic of the points of a bucket that becomes its aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Statistic {
    /// Exact mean (compensated sum / count).
    #[default]
    Mean,
    /// Exact maximum.
    Max,
    /// 95th percentile (DDSketch, relative error 1 %).
    P95,
}

impl Statistic {
    /// The statistic's name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Statistic::Mean => "mean",
            Statistic::Max => "max",
            Statistic::P95 => "p95",
        }
    }
}

/// One open bucket of a series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Bucket index: start time / aggregate.
    pub idx: u64,
    /// The points (exact count, sum, max; quantiles within 1 %).
    pub sketch: DdSketch,
}

impl Bucket {
    /// An empty bucket.
    pub fn new(idx: u64) -> Self {
        let sketch = DdSketch::new(DEFAULT_ALPHA, DEFAULT_MAX_BINS).unwrap_or_default();
        Bucket { idx, sketch }
    }

    /// Adds a finite value.
    pub fn add(&mut self, v: f64) {
        self.sketch.add(v);
    }

    /// The bucket's aggregate; `None` when it holds no point.
    pub fn value(&self, stat: Statistic) -> Option<f64> {
        match stat {
            Statistic::Mean => self.sketch.mean(),
            Statistic::Max => self.sketch.max(),
            Statistic::P95 => self.sketch.quantile(0.95),
        }
    }
}

/// The last `capacity` aggregates' worth of closed buckets of one series: (bucket index, value), in
/// increasing index order; buckets without points are absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    points: VecDeque<(u64, f64)>,
}

impl History {
    /// Appends the aggregate of bucket `idx` and forgets those `capacity` or more buckets older. An index
    /// not after the last one is ignored (returns false): buckets close in order.
    pub fn push(&mut self, idx: u64, value: f64, capacity: u64) -> bool {
        if self.points.back().is_some_and(|&(last, _)| last >= idx) || !value.is_finite() {
            return false;
        }
        self.points.push_back((idx, value));
        while self.points.front().is_some_and(|&(first, _)| idx - first >= capacity) {
            self.points.pop_front();
        }
        true
    }

    /// Number of aggregates held.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The aggregates, oldest first.
    pub fn points(&self) -> Vec<(u64, f64)> {
        self.points.iter().copied().collect()
    }

    /// Whether the indices increase strictly and the values are finite (checked on restore).
    pub fn is_valid(&self) -> bool {
        self.points.iter().all(|p| p.1.is_finite())
            && self.points.iter().zip(self.points.iter().skip(1)).all(|(a, b)| a.0 < b.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_statistics() {
        let mut b = Bucket::new(7);
        for v in 1..=100 {
            b.add(v as f64);
        }
        assert_eq!(b.value(Statistic::Mean), Some(50.5));
        assert_eq!(b.value(Statistic::Max), Some(100.0));
        let p95 = b.value(Statistic::P95).unwrap();
        assert!((p95 - 95.0).abs() <= 0.96, "p95 {p95}");
        assert_eq!(Bucket::new(0).value(Statistic::Mean), None);
    }

    #[test]
    fn history_rolls_and_refuses_out_of_order() {
        let mut h = History::default();
        for i in [10, 11, 13, 20] {
            assert!(h.push(i, i as f64, 5));
        }
        assert_eq!(h.points(), vec![(20, 20.0)], "10, 11, 13 are 5+ buckets older than 20");
        assert!(!h.push(20, 1.0, 5) && !h.push(19, 1.0, 5) && !h.push(21, f64::NAN, 5));
        assert!(h.push(22, 22.0, 5));
        assert_eq!(h.points(), vec![(20, 20.0), (22, 22.0)]);
    }
}
