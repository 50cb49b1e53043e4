//! The state of `delta_ab`: per group, the open tumbling windows with the values of each version,
//! eviction, and the checkpoint form.

use super::stats::{XorShift, splitmix64, window_seed};
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

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
    windows: Vec<Window>,
    last_point: u64,
    last_seen: u64,
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

    /// Closes every window ending at or before `watermark`, in (end, group) order, passing each to
    /// `emit`; then forgets idle groups. Returns the number of idle groups forgotten.
    pub fn close_until(&mut self, watermark: u64, mut emit: impl FnMut(&[String], &Meta, &Window)) -> usize {
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
            emit(&key, &g.meta, &w);
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
        for g in repr.groups {
            for win in &g.windows {
                let sides_ok =
                    [&win.a, &win.b].iter().all(|s| s.values.len() == s.ids.len() && s.values.len() as u64 <= s.seen);
                if win.start % w != 0 || win.end != win.start.saturating_add(w) || !sides_ok {
                    return Err(RestoreError::Invalid("window"));
                }
                if !open.insert((win.end, g.key.clone())) {
                    return Err(RestoreError::Invalid("duplicate window"));
                }
            }
            let meta = Meta {
                resource: Resource::decode(g.resource.as_slice())?,
                scope: InstrumentationScope::decode(g.scope.as_slice())?,
                from_candidate: g.from_candidate,
            };
            let group = Group { meta, windows: g.windows, last_point: g.last_point, last_seen: g.last_seen };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn params(max_series: usize, max_samples: usize) -> Params {
        Params { window_ns: 60 * S, idle_ns: 120 * S, max_series, max_samples }
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
        st.close_until(60 * S, |_, _, w| got.push((w.a.seen, w.a.values.len(), w.b.seen, w.a.values.clone())));
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
