//! The state of `delta_ab`: per group, the open tumbling windows with the values of each version,
//! the ring of closed windows still inside the look-back, eviction, and the checkpoint form.

use super::stats::{XorShift, splitmix64, window_seed};
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Parameters of the state (from the configuration; not checkpointed but `window_ns`).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Window length in ns (> 0).
    pub window_ns: u64,
    /// Idle timeout in ns of event time.
    pub idle_ns: u64,
    /// Most groups held.
    pub max_series: usize,
    /// Most values kept per version and window (beyond: reservoir sampling).
    pub max_samples: usize,
    /// Look-back in ns: a positive multiple of `window_ns` (`window_ns`: each window on its own).
    pub lookback_ns: u64,
    /// Most kept values per version over the look-back (≥ `max_samples`); beyond, the oldest
    /// windows leave the look-back.
    pub max_points: usize,
}

/// Which version a point belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The baseline version (A).
    Baseline,
    /// The candidate version (B).
    Candidate,
}

/// The values of one version in one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// Values kept (all of them up to `max_samples`, then a uniform reservoir).
    pub values: Vec<f64>,
    /// Request-id hash of each value (0: none), parallel to `values`.
    pub ids: Vec<u64>,
    /// Points seen (the sample size reported).
    pub seen: u64,
    /// Reservoir generator state.
    rng: u64,
}

impl Side {
    fn new(seed: u64) -> Self {
        Side { values: Vec::new(), ids: Vec::new(), seen: 0, rng: XorShift::new(seed).state() }
    }

    fn add(&mut self, value: f64, id: u64, cap: usize) {
        self.seen += 1;
        if self.values.len() < cap {
            self.values.push(value);
            self.ids.push(id);
            return;
        }
        // Algorithm R: the i-th point replaces a kept one with probability cap / i.
        let mut rng = XorShift::from_state(self.rng);
        let j = rng.below(self.seen) as usize;
        self.rng = rng.state();
        if j < self.values.len() && j < self.ids.len() {
            self.values[j] = value;
            self.ids[j] = id;
        }
    }
}

/// One tumbling window of one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Inclusive start, ns since the epoch.
    pub start: u64,
    /// Exclusive end, ns since the epoch.
    pub end: u64,
    /// Baseline values.
    pub a: Side,
    /// Candidate values.
    pub b: Side,
}

/// Where a group's output points come from: the resource and scope of its first candidate point
/// (of its first point until a candidate point arrives).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// Resource of the output.
    pub resource: Resource,
    /// Scope of the output.
    pub scope: InstrumentationScope,
    /// Whether they come from a candidate point.
    pub from_candidate: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Group {
    meta: Meta,
    /// Open windows.
    windows: Vec<Window>,
    /// Closed windows that may still enter a later look-back, oldest first.
    ring: VecDeque<Window>,
    last_point: u64,
    last_seen: u64,
}

/// What one evaluation compares: the closed window and the earlier windows of the look-back.
#[derive(Debug, Clone, Copy)]
pub struct Lookback<'a> {
    /// Earlier closed windows inside the look-back, oldest first (empty when the look-back is
    /// one window).
    pub earlier: &'a [Window],
    /// The window just closed (its start seeds the bootstrap; its end is the output time).
    pub current: &'a Window,
}

impl<'a> Lookback<'a> {
    /// Every window of the look-back, oldest first, ending with the current one.
    pub fn windows(&self) -> impl Iterator<Item = &'a Window> + 'a {
        self.earlier.iter().chain(std::iter::once(self.current))
    }

    /// Start of the oldest window used (the look-back actually spans `current.end − start`).
    pub fn start(&self) -> u64 {
        self.earlier.first().map_or(self.current.start, |w| w.start)
    }
}

/// How many of `ring`'s windows (counted from its newest end) join `current` in the look-back:
/// those starting at or after `current.end − lookback_ns`, newest first, as long as the kept
/// values per version stay within `max_points`.
fn lookback_len(ring: &VecDeque<Window>, current: &Window, params: &Params) -> usize {
    let from = current.end.saturating_sub(params.lookback_ns);
    let (mut na, mut nb) = (current.a.values.len(), current.b.values.len());
    let mut n = 0;
    for w in ring.iter().rev() {
        if w.start < from {
            break;
        }
        na += w.a.values.len();
        nb += w.b.values.len();
        if na > params.max_points || nb > params.max_points {
            break;
        }
        n += 1;
    }
    n
}

/// Why a point was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its event time is before the watermark (its window is closed).
    Late,
}

/// Open windows of every group, indexed by window end for closing in order.
pub struct State {
    params: Params,
    groups: BTreeMap<Vec<String>, Group>,
    open: BTreeSet<(u64, Vec<String>)>,
    watermark: u64,
    seq: u64,
    next_idle_check: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, groups: BTreeMap::new(), open: BTreeSet::new(), watermark: 0, seq: 0, next_idle_check: 0 }
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.groups.len()
    }

    /// Adds a point of group `key`. `meta` is called for a new group, and for the first candidate
    /// point of a group whose output metadata came from a baseline point. Returns the number of
    /// groups evicted to make room (`max_series`).
    pub fn add<E>(
        &mut self,
        key: &[String],
        time: u64,
        value: f64,
        which: Which,
        id: u64,
        meta: impl FnOnce() -> Result<(Resource, InstrumentationScope), E>,
    ) -> Result<Result<usize, Skip>, E> {
        if time < self.watermark {
            return Ok(Err(Skip::Late));
        }
        let from_candidate = which == Which::Candidate;
        let mut evicted = 0;
        match self.groups.get_mut(key) {
            Some(g) => {
                if from_candidate && !g.meta.from_candidate {
                    let (resource, scope) = meta()?;
                    g.meta = Meta { resource, scope, from_candidate };
                }
            }
            None => {
                let (resource, scope) = meta()?;
                if self.groups.len() >= self.params.max_series {
                    evicted = self.evict_least_recent();
                }
                self.next_idle_check = self.next_idle_check.min(time.saturating_add(self.params.idle_ns));
                let group = Group {
                    meta: Meta { resource, scope, from_candidate },
                    windows: Vec::new(),
                    ring: VecDeque::new(),
                    last_point: time,
                    last_seen: 0,
                };
                self.groups.insert(key.to_vec(), group);
            }
        }
        self.seq += 1;
        let w = self.params.window_ns;
        let start = time - time % w;
        let cap = self.params.max_samples;
        let Some(g) = self.groups.get_mut(key) else { return Ok(Ok(evicted)) };
        g.last_seen = self.seq;
        g.last_point = g.last_point.max(time);
        let i = match g.windows.iter().rposition(|x| x.start == start) {
            Some(i) => i,
            None => {
                let end = start.saturating_add(w);
                let seed = window_seed(key, start);
                self.open.insert((end, key.to_vec()));
                g.windows.push(Window { start, end, a: Side::new(seed ^ 0xA), b: Side::new(splitmix64(seed ^ 0xB)) });
                g.windows.len() - 1
            }
        };
        if let Some(win) = g.windows.get_mut(i) {
            match which {
                Which::Baseline => win.a.add(value, id, cap),
                Which::Candidate => win.b.add(value, id, cap),
            }
        }
        Ok(Ok(evicted))
    }

    /// Evicts the least recently seen 10 % of `max_series` (and any excess); returns how many.
    fn evict_least_recent(&mut self) -> usize {
        let max = self.params.max_series;
        let excess = (self.groups.len() + 1).saturating_sub(max);
        let n = (max / 10).max(1).max(excess).min(self.groups.len());
        if n == 0 {
            return 0;
        }
        let mut by_age: Vec<(u64, Vec<String>)> = self.groups.iter().map(|(k, g)| (g.last_seen, k.clone())).collect();
        by_age.sort_unstable();
        for (_, key) in by_age.into_iter().take(n) {
            if let Some(g) = self.groups.remove(&key) {
                for w in &g.windows {
                    self.open.remove(&(w.end, key.clone()));
                }
            }
        }
        tracing::debug!(evicted = n, max_series = max, "delta_ab: evicted least recently seen groups");
        n
    }

    /// Closes every window ending at or before `watermark`, in (end, group) order, passing each
    /// with its look-back to `emit`, then keeps it in the group's ring (dropping the windows no
    /// later look-back can use); then forgets idle groups. Returns the number of idle groups
    /// forgotten.
    pub fn close_until(&mut self, watermark: u64, mut emit: impl FnMut(&[String], &Meta, Lookback<'_>)) -> usize {
        if watermark < self.watermark {
            return 0;
        }
        self.watermark = watermark;
        let due: Vec<(u64, Vec<String>)> = self.open.iter().take_while(|(end, _)| *end <= watermark).cloned().collect();
        for (end, key) in due {
            self.open.remove(&(end, key.clone()));
            let Some(g) = self.groups.get_mut(&key) else { continue };
            let Some(i) = g.windows.iter().position(|w| w.end == end) else { continue };
            let w = g.windows.swap_remove(i);
            let n = lookback_len(&g.ring, &w, &self.params);
            // Windows older than this look-back (by time or by `max_points`) never enter a later
            // one: later look-backs start later and hold at least these newer windows.
            let drop = g.ring.len() - n;
            g.ring.drain(..drop);
            emit(&key, &g.meta, Lookback { earlier: g.ring.make_contiguous(), current: &w });
            if self.params.lookback_ns > self.params.window_ns {
                g.ring.push_back(w);
            }
        }
        self.evict_idle()
    }

    fn evict_idle(&mut self) -> usize {
        if self.watermark < self.next_idle_check {
            return 0;
        }
        let idle = self.params.idle_ns;
        let wm = self.watermark;
        let before = self.groups.len();
        self.groups.retain(|_, g| !(g.windows.is_empty() && g.last_point.saturating_add(idle) <= wm));
        self.next_idle_check = self
            .groups
            .values()
            .map(|g| {
                let windows_end = g.windows.iter().map(|w| w.end).max().unwrap_or(0);
                g.last_point.saturating_add(idle).max(windows_end)
            })
            .min()
            .unwrap_or(u64::MAX);
        let n = before - self.groups.len();
        if n > 0 {
            tracing::debug!(evicted = n, watermark = wm, "delta_ab: forgot idle groups");
        }
        n
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let groups = self
            .groups
            .iter()
            .map(|(key, g)| GroupRepr {
                key: key.clone(),
                resource: g.meta.resource.encode_to_vec(),
                scope: g.meta.scope.encode_to_vec(),
                from_candidate: g.meta.from_candidate,
                last_point: g.last_point,
                last_seen: g.last_seen,
                windows: g.windows.clone(),
                ring: g.ring.iter().cloned().collect(),
            })
            .collect();
        postcard::to_allocvec(&SnapshotRepr {
            window_ns: self.params.window_ns,
            watermark: self.watermark,
            seq: self.seq,
            groups,
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let repr: SnapshotRepr = postcard::from_bytes(bytes)?;
        if repr.window_ns != self.params.window_ns {
            return Err(RestoreError::Window { saved: repr.window_ns, configured: self.params.window_ns });
        }
        let w = self.params.window_ns;
        let mut groups = BTreeMap::new();
        let mut open = BTreeSet::new();
        let valid = |win: &Window| {
            let sides_ok =
                [&win.a, &win.b].iter().all(|s| s.values.len() == s.ids.len() && s.values.len() as u64 <= s.seen);
            win.start.is_multiple_of(w) && win.end == win.start.saturating_add(w) && sides_ok
        };
        for g in repr.groups {
            for win in &g.windows {
                if !valid(win) || win.end <= repr.watermark {
                    return Err(RestoreError::Invalid("window"));
                }
                if !open.insert((win.end, g.key.clone())) {
                    return Err(RestoreError::Invalid("duplicate window"));
                }
            }
            let mut prev_end = 0;
            for win in &g.ring {
                if !valid(win) || win.start < prev_end || win.end > repr.watermark {
                    return Err(RestoreError::Invalid("look-back window"));
                }
                prev_end = win.end;
            }
            let meta = Meta {
                resource: Resource::decode(g.resource.as_slice())?,
                scope: InstrumentationScope::decode(g.scope.as_slice())?,
                from_candidate: g.from_candidate,
            };
            let group = Group {
                meta,
                windows: g.windows,
                ring: g.ring.into(),
                last_point: g.last_point,
                last_seen: g.last_seen,
            };
            if groups.insert(g.key, group).is_some() {
                return Err(RestoreError::Invalid("duplicate group"));
            }
        }
        self.groups = groups;
        self.open = open;
        self.watermark = repr.watermark;
        self.seq = repr.seq;
        self.next_idle_check = 0;
        Ok(())
    }
}

/// Why a snapshot could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The bytes do not decode.
    #[error("decode: {0}")]
    Decode(#[from] postcard::Error),
    /// Embedded protobuf metadata does not decode.
    #[error("metadata: {0}")]
    Proto(#[from] prost::DecodeError),
    /// The checkpoint was written with another window length.
    #[error("checkpoint has window {saved} ns, the configuration {configured} ns")]
    Window {
        /// Window of the checkpoint.
        saved: u64,
        /// Window configured now.
        configured: u64,
    },
    /// The state violates an invariant.
    #[error("invalid state: {0}")]
    Invalid(&'static str),
}

#[derive(Serialize, Deserialize)]
struct SnapshotRepr {
    window_ns: u64,
    watermark: u64,
    seq: u64,
    groups: Vec<GroupRepr>,
}

#[derive(Serialize, Deserialize)]
struct GroupRepr {
    key: Vec<String>,
    resource: Vec<u8>,
    scope: Vec<u8>,
    from_candidate: bool,
    last_point: u64,
    last_seen: u64,
    windows: Vec<Window>,
    ring: Vec<Window>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn params(max_series: usize, max_samples: usize) -> Params {
        Params { window_ns: 60 * S, idle_ns: 120 * S, max_series, max_samples, lookback_ns: 60 * S, max_points: 1000 }
    }

    fn meta() -> Result<(Resource, InstrumentationScope), ()> {
        Ok((Resource::default(), InstrumentationScope::default()))
    }

    fn key(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn reservoir_keeps_the_cap_and_counts_every_point() {
        let mut st = State::new(params(10, 50));
        for i in 0..1000 {
            st.add(&key("m"), S + i, i as f64, Which::Baseline, 0, meta).unwrap().unwrap();
        }
        let mut got = Vec::new();
        st.close_until(60 * S, |_, _, l| {
            let w = l.current;
            got.push((w.a.seen, w.a.values.len(), w.b.seen, w.a.values.clone()))
        });
        assert_eq!(got.len(), 1);
        let (seen, kept, b_seen, values) = &got[0];
        assert_eq!((*seen, *kept, *b_seen), (1000, 50, 0));
        assert!(values.iter().any(|&v| v >= 50.0), "later points enter the reservoir");
    }

    #[test]
    fn evicts_least_recent_and_forgets_idle_groups() {
        let mut st = State::new(params(10, 100));
        for g in 0..10 {
            st.add(&key(&g.to_string()), S, 1.0, Which::Baseline, 0, meta).unwrap().unwrap();
        }
        st.add(&key("0"), S, 1.0, Which::Candidate, 0, meta).unwrap().unwrap();
        assert_eq!(st.add(&key("new"), S, 1.0, Which::Baseline, 0, meta).unwrap(), Ok(1));
        assert_eq!(st.series_count(), 10);
        let mut keys = Vec::new();
        st.close_until(60 * S, |k, _, _| keys.push(k[0].clone()));
        assert!(!keys.contains(&"1".to_string()) && keys.contains(&"0".to_string()), "{keys:?}");
        assert_eq!(st.add(&key("0"), 59 * S, 1.0, Which::Baseline, 0, meta).unwrap(), Err(Skip::Late));
        assert_eq!(st.close_until(121 * S, |_, _, _| {}), 10, "no point for idle_timeout");
        assert_eq!(st.series_count(), 0);
    }

    /// Starts (in windows) of the earlier windows and of the current one at each close.
    fn close_all(st: &mut State, until: u64) -> Vec<(Vec<u64>, u64, f64)> {
        let mut got = Vec::new();
        st.close_until(until, |_, _, l| {
            let earlier = l.earlier.iter().map(|w| w.start / (60 * S)).collect();
            got.push((earlier, l.current.start / (60 * S), (l.current.end - l.start()) as f64 / 1e9));
        });
        got
    }

    #[test]
    fn lookback_holds_the_last_windows_and_skips_gaps() {
        let mut st = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) });
        // Points in windows 0, 1, 2, 3 and 6 (none in 4 and 5).
        for w in [0u64, 1, 2, 3, 6] {
            st.add(&key("m"), w * 60 * S + S, 1.0, Which::Baseline, 0, meta).unwrap().unwrap();
        }
        let got = close_all(&mut st, 7 * 60 * S);
        assert_eq!(
            got,
            vec![
                (vec![], 0, 60.0),
                (vec![0], 1, 120.0),
                (vec![0, 1], 2, 180.0),
                (vec![1, 2], 3, 180.0),
                // Window 6's look-back [4, 7) holds no earlier window.
                (vec![], 6, 60.0),
            ]
        );
        assert_eq!(st.groups[&key("m")].ring.len(), 1, "expired windows leave the ring");
    }

    #[test]
    fn max_points_drops_the_oldest_windows() {
        let mut st = State::new(Params { lookback_ns: 600 * S, max_points: 25, ..params(10, 10) });
        for w in 0u64..5 {
            for i in 0..10 {
                st.add(&key("m"), w * 60 * S + i, 1.0, Which::Candidate, 0, meta).unwrap().unwrap();
            }
        }
        let got = close_all(&mut st, 5 * 60 * S);
        // 10 values per window, at most 25 per version: the current window and one earlier one.
        let earlier: Vec<Vec<u64>> = got.iter().map(|g| g.0.clone()).collect();
        assert_eq!(earlier, vec![vec![], vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(got[4].2, 120.0, "the span actually used");
        let g = &st.groups[&key("m")];
        assert!(g.ring.iter().map(|w| w.b.values.len()).sum::<usize>() <= 25);
    }

    #[test]
    fn snapshot_keeps_the_ring_and_refuses_a_broken_one() {
        let mut st = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) });
        for w in 0u64..3 {
            st.add(&key("m"), w * 60 * S, w as f64, Which::Baseline, 7, meta).unwrap().unwrap();
        }
        close_all(&mut st, 2 * 60 * S);
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) });
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        assert_eq!(close_all(&mut other, 3 * 60 * S), close_all(&mut st, 3 * 60 * S));
        let mut broken = st.snapshot().unwrap();
        // Swap the ring's two windows: out of order.
        let mut repr: SnapshotRepr = postcard::from_bytes(&broken).unwrap();
        repr.groups[0].ring.reverse();
        broken = postcard::to_allocvec(&repr).unwrap();
        assert!(matches!(other.restore(&broken), Err(RestoreError::Invalid("look-back window"))));
    }

    #[test]
    fn snapshot_round_trips_and_refuses_another_window() {
        let mut st = State::new(params(10, 100));
        st.add(&key("m"), S, 1.0, Which::Baseline, 7, meta).unwrap().unwrap();
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10, 100));
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        let mut wrong = State::new(Params { window_ns: 30 * S, ..params(10, 100) });
        assert!(matches!(wrong.restore(&bytes), Err(RestoreError::Window { .. })));
        assert!(other.restore(&bytes[..bytes.len() - 2]).is_err());
    }
}
