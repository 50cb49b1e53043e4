//! A bounded ring of one measurement's samples of one GPU, kept sorted by timestamp, with the
//! backward as-of lookup the join uses.

use std::collections::VecDeque;

/// What an insert does with a sample whose timestamp is already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// The later arrival wins.
    Replace,
    /// The larger value wins (throttle flags of several reasons at one instant: any set).
    Max,
}

/// Samples `(timestamp ns, value)` sorted by timestamp, at most `cap`; the oldest go first.
#[derive(Debug, Clone)]
pub struct SampleRing {
    buf: VecDeque<(u64, f64)>,
    cap: usize,
}

impl SampleRing {
    /// An empty ring holding at most `cap` samples (at least one).
    pub fn new(cap: usize) -> Self {
        SampleRing { buf: VecDeque::new(), cap: cap.max(1) }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Inserts in timestamp order: O(1) for in-order samples, a binary search and a shift for
    /// late ones. When full, the oldest sample is dropped; a sample older than everything held in
    /// a full ring is dropped instead. Returns false when the sample was not kept.
    pub fn insert(&mut self, ts: u64, value: f64, merge: Merge) -> bool {
        let at = self.buf.partition_point(|s| s.0 < ts);
        if let Some(s) = self.buf.get_mut(at)
            && s.0 == ts
        {
            s.1 = match merge {
                Merge::Replace => value,
                Merge::Max => s.1.max(value),
            };
            return true;
        }
        if self.buf.len() >= self.cap {
            if at == 0 {
                return false;
            }
            self.buf.pop_front();
            self.buf.insert(at - 1, (ts, value));
        } else if at == self.buf.len() {
            self.buf.push_back((ts, value));
        } else {
            self.buf.insert(at, (ts, value));
        }
        true
    }

    /// The latest sample with `ts ≤ t` and `t − ts ≤ tolerance` (backward as-of), if any.
    pub fn as_of(&self, t: u64, tolerance: u64) -> Option<(u64, f64)> {
        let n = self.buf.partition_point(|s| s.0 <= t);
        let s = *self.buf.get(n.checked_sub(1)?)?;
        (t - s.0 <= tolerance).then_some(s)
    }

    /// Oldest and newest timestamps held.
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.buf.front()?.0, self.buf.back()?.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_of_is_backward_with_inclusive_tolerance() {
        let mut r = SampleRing::new(8);
        for (ts, v) in [(10, 1.0), (20, 2.0), (30, 3.0)] {
            assert!(r.insert(ts, v, Merge::Replace));
        }
        assert_eq!(r.as_of(9, 100), None, "before any sample");
        assert_eq!(r.as_of(10, 0), Some((10, 1.0)), "exact time");
        assert_eq!(r.as_of(25, 5), Some((20, 2.0)), "edge: t - ts == tolerance");
        assert_eq!(r.as_of(26, 5), None, "just outside the tolerance");
        assert_eq!(r.as_of(1000, 970), Some((30, 3.0)));
    }

    #[test]
    fn late_samples_go_in_place_and_duplicates_merge() {
        let mut r = SampleRing::new(8);
        r.insert(30, 3.0, Merge::Replace);
        r.insert(10, 1.0, Merge::Replace);
        r.insert(20, 2.0, Merge::Replace);
        assert_eq!(r.as_of(29, 100), Some((20, 2.0)));
        r.insert(20, 5.0, Merge::Replace);
        assert_eq!(r.as_of(20, 0), Some((20, 5.0)));
        r.insert(20, 1.0, Merge::Max);
        assert_eq!(r.as_of(20, 0), Some((20, 5.0)));
        assert_eq!(r.len(), 3);
        assert_eq!(r.span(), Some((10, 30)));
    }

    #[test]
    fn full_ring_drops_the_oldest() {
        let mut r = SampleRing::new(3);
        for ts in [10, 20, 30, 40] {
            r.insert(ts, ts as f64, Merge::Replace);
        }
        assert_eq!(r.span(), Some((20, 40)));
        assert!(!r.insert(5, 0.0, Merge::Replace), "older than all of a full ring");
        assert!(r.insert(25, 25.0, Merge::Replace));
        assert_eq!(r.span(), Some((25, 40)));
        assert_eq!(r.len(), 3);
        assert_eq!(r.as_of(27, 10), Some((25, 25.0)));
    }
}
