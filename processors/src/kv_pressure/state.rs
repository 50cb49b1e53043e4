//! The state of `kv_pressure`: per (model, version, instance) group, the latest value of each
//! input, the start of its warm-up and its reset counters, held in the kit's [`SeriesMap`]
//! (eviction, idle expiry, the checkpoint envelope).

use super::STATE_VERSION;
use super::assess::{Input, Inputs};
use crate::detect::series::SeriesMap;
use serde::{Deserialize, Serialize};

pub use crate::detect::group::GroupKey;
pub use crate::detect::series::RestoreError;

/// The latest value of one input.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latest {
    /// Its event time, ns.
    pub time: u64,
    /// The value.
    pub value: f64,
}

/// The free space of the block pool, when it came as free runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeSpace {
    /// Event time of the snapshot, ns.
    pub time: u64,
    /// Free blocks (sum of the runs).
    pub free_blocks: u64,
    /// Largest run of free blocks.
    pub largest_run: u64,
}

/// Most counter series of `reset_metrics` tracked per group (more are ignored).
pub const MAX_COUNTERS: usize = 16;

/// The latest point of one counter series of `reset_metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    /// The series: metric name and point attributes, `name{k=v,…}` sorted.
    pub key: String,
    /// Event time, ns.
    pub time: u64,
    /// Start time, ns (0: not given).
    pub start: u64,
    /// The value.
    pub value: f64,
}

/// What is known of one group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Group {
    /// Latest value per input, indexed by [`Input::index`].
    pub latest: [Option<Latest>; 5],
    /// Latest free-runs snapshot.
    pub free: Option<FreeSpace>,
    /// Event time of the group's latest (re)start: its first point, the first after a gap, or a
    /// counter reset (ns).
    pub warm_from: u64,
    /// The counters of `reset_metrics` seen for this group.
    pub counters: Vec<Counter>,
    /// Whether the prefix-cache hit rate was ever at or above its threshold: a low hit rate is
    /// pressure only for a cache that used to hit (a workload without shared prefixes never does).
    pub hit_rate_seen_high: bool,
}

impl Group {
    /// Records `value` of `input` at `time` unless a later value is already known.
    pub fn set(&mut self, input: Input, time: u64, value: f64) {
        let slot = &mut self.latest[input.index()];
        if slot.is_none_or(|l| l.time <= time) {
            *slot = Some(Latest { time, value });
        }
    }

    /// Records a point of counter series `key`; true when it is a reset: newer than the series'
    /// previous point and below its value, or with a later start time. The first point of a
    /// series is a baseline only.
    pub fn counter(&mut self, key: &str, time: u64, start: u64, value: f64) -> bool {
        if let Some(c) = self.counters.iter_mut().find(|c| c.key == key) {
            if time <= c.time {
                return false;
            }
            let reset = value < c.value || (start > c.start && c.start != 0);
            *c = Counter { key: c.key.clone(), time, start, value };
            return reset;
        }
        if self.counters.len() < MAX_COUNTERS {
            self.counters.push(Counter { key: key.to_string(), time, start, value });
        }
        false
    }

    /// True while `time` is within `warmup_ns` of the group's latest (re)start.
    pub fn warming_up(&self, time: u64, warmup_ns: u64) -> bool {
        time < self.warm_from.saturating_add(warmup_ns)
    }

    /// The values still fresh at `now`: not older than `stale_ns`.
    pub fn fresh(&self, now: u64, stale_ns: u64) -> Inputs {
        let mut inputs = Inputs::default();
        for (slot, latest) in inputs.values.iter_mut().zip(&self.latest) {
            *slot = latest.filter(|l| l.time.saturating_add(stale_ns) >= now).map(|l| l.value);
        }
        inputs
    }
}

/// Parameters of the state (from the configuration; not checkpointed).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Most groups held.
    pub max_series: usize,
    /// Event time without input after which a group is forgotten, ns.
    pub idle_ns: u64,
    /// A point more than this after the group's previous one starts a new warm-up, ns (0: never).
    pub restart_gap_ns: u64,
}

/// Every group.
pub struct State {
    params: Params,
    series: SeriesMap<GroupKey, Group>,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, series: SeriesMap::new(params.max_series, params.idle_ns) }
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The group `key` after a point at `time` (created if new, evicting the least recently seen
    /// 10 % at `max_series`), and the number of groups evicted. A new group starts its warm-up at
    /// `time`, and so does one whose previous point is more than `restart_gap` before `time`.
    pub fn touch(&mut self, key: &GroupKey, time: u64) -> (usize, Option<&mut Group>) {
        let gap = self.params.restart_gap_ns;
        let Some(t) = self.series.touch(key, time, || Group { warm_from: time, ..Group::default() }, |_, _| {}) else {
            return (0, None);
        };
        if t.evicted > 0 {
            tracing::debug!(
                evicted = t.evicted,
                max_series = self.params.max_series,
                "kv_pressure: evicted least recently seen groups"
            );
        }
        // The group's largest event time before this point.
        if let Some(previous) = t.previous_time
            && gap > 0
            && time > previous.saturating_add(gap)
        {
            t.state.warm_from = time;
        }
        (t.evicted, Some(t.state))
    }

    /// Forgets groups without input for `idle_ns` before `watermark`; returns how many.
    pub fn expire(&mut self, watermark: u64) -> usize {
        self.series.expire_idle(watermark, |_| None, |_, _| {})
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.series.snapshot(STATE_VERSION, &(), |_, g| g)
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let ((), series) = self.series.restore(STATE_VERSION, bytes, |_, g: Group| Ok(g))?;
        self.series = series;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn key(m: &str) -> GroupKey {
        GroupKey::new("i", "v1", m)
    }

    #[test]
    fn latest_values_go_stale_and_never_move_back() {
        let mut g = Group::default();
        g.set(Input::Usage, 10 * S, 0.5);
        g.set(Input::Usage, 5 * S, 0.99);
        g.set(Input::QueueP99, 2 * S, 1.0);
        let f = g.fresh(10 * S, 5 * S);
        assert_eq!(f.get(Input::Usage), Some(0.5), "an older point does not replace a newer one");
        assert_eq!(f.get(Input::QueueP99), None, "8 s old with stale_after 5 s");
        assert_eq!(g.fresh(7 * S, 5 * S).get(Input::QueueP99), Some(1.0));
    }

    #[test]
    fn warm_up_starts_at_the_first_point_a_gap_and_a_counter_reset() {
        let mut st = State::new(Params { max_series: 3, idle_ns: 3600 * S, restart_gap_ns: 120 * S });
        let g = st.touch(&key("a"), 100 * S).1.unwrap();
        assert_eq!(g.warm_from, 100 * S);
        assert!(g.warming_up(699 * S, 600 * S) && !g.warming_up(700 * S, 600 * S));
        st.touch(&key("a"), 220 * S);
        assert_eq!(st.touch(&key("a"), 50 * S).1.unwrap().warm_from, 100 * S, "a gap of exactly 120 s, a late point");
        assert_eq!(st.touch(&key("a"), 341 * S).1.unwrap().warm_from, 341 * S, "121 s after the previous point");
        let g = st.touch(&key("a"), 350 * S).1.unwrap();
        assert!(!g.counter("q{}", 350 * S, 0, 10.0), "the first point is a baseline");
        assert!(!g.counter("q{}", 360 * S, 0, 12.0));
        assert!(!g.counter("q{}", 360 * S, 0, 1.0), "not newer: ignored");
        assert!(g.counter("q{}", 370 * S, 0, 3.0), "a drop");
        assert!(!g.counter("q{}", 380 * S, 5 * S, 4.0), "a start time where there was none");
        assert!(g.counter("q{}", 390 * S, 385 * S, 9.0), "a later start time");
        assert!(!g.counter("q{}", 400 * S, 385 * S, 9.0), "equal value, same start");
        for i in 0..20 {
            g.counter(&format!("c{i}"), 400 * S, 0, 1.0);
        }
        assert_eq!(g.counters.len(), MAX_COUNTERS);
    }

    #[test]
    fn eviction_expiry_and_snapshot() {
        let mut st = State::new(Params { max_series: 3, idle_ns: 60 * S, restart_gap_ns: 0 });
        for (i, m) in ["a", "b", "c"].iter().enumerate() {
            st.touch(&key(m), i as u64 * S).1.unwrap().set(Input::Usage, i as u64 * S, 0.1);
        }
        st.touch(&key("a"), 3 * S);
        assert_eq!(st.touch(&key("d"), 4 * S).0, 1);
        assert!(!st.series.contains_key(&key("b")), "b was the least recently seen");
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(Params { max_series: 3, idle_ns: 60 * S, restart_gap_ns: 0 });
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        assert!(other.restore(&bytes[..bytes.len() - 1]).is_err());
        assert_eq!(st.expire(62 * S), 1, "c (last point 2 s) is idle at 62 s");
        assert_eq!(st.series_count(), 2);
    }
}
