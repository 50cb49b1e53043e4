//! Start times of cumulative series and reset detection, as otelcol's `true_reset_point`
//! adjuster (processor/metricstarttimeprocessor, the successor of the prometheus receiver's
//! initial-point adjuster) does them:
//!
//! - a series' `_created` value, when present and before the point, is its start time;
//! - otherwise the first point of a series starts at its own time (start = time), and later
//!   points keep that start;
//! - a counter that goes down, or a histogram / summary whose count or sum goes down (or a
//!   histogram bucket that does), is a reset: the start becomes the point's time minus 1 ms.
//!
//! Series not seen for [`FORGET_AFTER`] successful scrapes are forgotten.

use std::collections::HashMap;

/// Successful scrapes after which an absent series is forgotten.
pub const FORGET_AFTER: u64 = 10;
/// What a reset point's start is moved back from its time.
const RESET_OFFSET_NS: u64 = 1_000_000;

/// The last values of one cumulative series, to detect a reset.
#[derive(Debug, Clone, PartialEq)]
pub enum Last {
    /// A counter's value.
    Value(f64),
    /// A histogram's count, sum and cumulative bucket counts (one per bound, +Inf excluded).
    Histogram {
        /// Count.
        count: u64,
        /// Sum (0 when absent).
        sum: f64,
        /// Cumulative count per bound.
        buckets: Vec<u64>,
    },
    /// A summary's count and sum.
    Summary {
        /// Count.
        count: u64,
        /// Sum.
        sum: f64,
    },
}

impl Last {
    /// Whether `self` (the new point) is lower than `prev`: a reset.
    fn is_reset_from(&self, prev: &Last) -> bool {
        match (self, prev) {
            (Last::Value(v), Last::Value(p)) => v < p,
            (Last::Histogram { count, sum, buckets }, Last::Histogram { count: pc, sum: ps, buckets: pb }) => {
                count < pc || sum < ps || (buckets.len() == pb.len() && buckets.iter().zip(pb).any(|(b, p)| b < p))
            }
            (Last::Summary { count, sum }, Last::Summary { count: pc, sum: ps }) => count < pc || sum < ps,
            // The type changed: start over.
            _ => true,
        }
    }
}

struct Entry {
    start_ns: u64,
    last: Last,
    seen: u64,
}

/// Start times of the cumulative series of one target.
#[derive(Default)]
pub struct StartTimes {
    series: HashMap<u64, Entry>,
    generation: u64,
}

impl StartTimes {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The start time of the point of series `key` at `time_ns` with value `last`.
    pub fn start(&mut self, key: u64, time_ns: u64, created_ns: Option<u64>, last: Last) -> u64 {
        let generation = self.generation;
        if let Some(c) = created_ns.filter(|&c| c > 0 && c < time_ns) {
            self.series.insert(key, Entry { start_ns: c, last, seen: generation });
            return c;
        }
        match self.series.get_mut(&key) {
            None => {
                self.series.insert(key, Entry { start_ns: time_ns, last, seen: generation });
                time_ns
            }
            Some(e) => {
                if last.is_reset_from(&e.last) {
                    e.start_ns = time_ns.saturating_sub(RESET_OFFSET_NS).max(1);
                }
                e.last = last;
                e.seen = generation;
                e.start_ns
            }
        }
    }

    /// Ends one successful scrape: forgets series absent for [`FORGET_AFTER`] scrapes.
    pub fn end_scrape(&mut self) {
        let g = self.generation;
        self.series.retain(|_, e| g.saturating_sub(e.seen) < FORGET_AFTER);
        self.generation += 1;
    }

    /// Number of series tracked.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether no series is tracked.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_point_then_kept_then_reset() {
        let mut s = StartTimes::new();
        assert_eq!(s.start(1, 1_000_000_000, None, Last::Value(5.0)), 1_000_000_000);
        s.end_scrape();
        assert_eq!(s.start(1, 2_000_000_000, None, Last::Value(7.0)), 1_000_000_000);
        s.end_scrape();
        assert_eq!(s.start(1, 3_000_000_000, None, Last::Value(2.0)), 2_999_000_000, "reset: time - 1ms");
        s.end_scrape();
        assert_eq!(s.start(1, 4_000_000_000, None, Last::Value(3.0)), 2_999_000_000);
    }

    #[test]
    fn created_wins_and_histograms_reset_on_any_decrease() {
        let mut s = StartTimes::new();
        assert_eq!(s.start(9, 5_000, Some(1_000), Last::Value(1.0)), 1_000);
        assert_eq!(s.start(9, 6_000, Some(7_000), Last::Value(2.0)), 1_000, "a created after the point is ignored");
        let h = |count, sum, b: &[u64]| Last::Histogram { count, sum, buckets: b.to_vec() };
        s.start(2, 10_000_000, None, h(4, 2.0, &[1, 3]));
        assert_eq!(s.start(2, 20_000_000, None, h(5, 2.5, &[2, 4])), 10_000_000);
        assert_eq!(s.start(2, 30_000_000, None, h(5, 2.5, &[1, 4])), 29_000_000, "bucket went down");
        s.start(3, 10_000_000, None, Last::Summary { count: 3, sum: 1.0 });
        assert_eq!(s.start(3, 20_000_000, None, Last::Summary { count: 3, sum: 0.5 }), 19_000_000);
    }

    #[test]
    fn absent_series_are_forgotten() {
        let mut s = StartTimes::new();
        s.start(1, 10, None, Last::Value(1.0));
        s.end_scrape(); // the scrape that saw it
        for _ in 0..FORGET_AFTER {
            assert_eq!(s.len(), 1);
            s.end_scrape();
        }
        assert!(s.is_empty());
    }
}
