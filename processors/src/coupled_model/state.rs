//! The state of `coupled_model`: per group, the open aligned buckets (last value of each input)
//! and the online model; least-recently-seen eviction, idle expiry, and the checkpoint form.

use super::fit::Model;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The inputs joined in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// End-to-end latency L.
    Latency,
    /// Throughput T.
    Throughput,
    /// Time to first token F.
    Ttft,
    /// Quality Q in [0, 1].
    Quality,
}

impl Input {
    /// Slot of the input in [`Bucket::values`].
    pub fn index(self) -> usize {
        match self {
            Input::Latency => 0,
            Input::Throughput => 1,
            Input::Ttft => 2,
            Input::Quality => 3,
        }
    }
}

/// The latest value of one input in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latest {
    /// Its event time, ns.
    pub time: u64,
    /// The value.
    pub value: f64,
}

/// One aligned bucket of one group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Bucket {
    /// Latest value per input, indexed by [`Input::index`].
    pub values: [Option<Latest>; 4],
    /// Protobuf-encoded resource of the latest latency point (the outputs carry it).
    pub resource: Vec<u8>,
    /// Protobuf-encoded scope of the latest latency point.
    pub scope: Vec<u8>,
}

impl Bucket {
    /// Records `value` of `input` at `time` unless a later value is already known (ties: the
    /// later arrival wins); returns whether it was taken.
    pub fn set(&mut self, input: Input, time: u64, value: f64) -> bool {
        let slot = &mut self.values[input.index()];
        let take = slot.is_none_or(|l| l.time <= time);
        if take {
            *slot = Some(Latest { time, value });
        }
        take
    }

    /// The value of `input`, if any.
    pub fn get(&self, input: Input) -> Option<Latest> {
        self.values[input.index()]
    }
}

/// One group: its open buckets (by bucket index) and its model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Open buckets, by index (event time / align).
    pub buckets: BTreeMap<u64, Bucket>,
    /// The online model.
    pub model: Model,
    last_point: u64,
    last_seen: u64,
}

/// Parameters of the state (from the configuration; not checkpointed).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Most groups held.
    pub max_series: usize,
    /// Event time without input after which a group is forgotten, ns.
    pub idle_ns: u64,
    /// Number of coefficients of a model.
    pub dim: usize,
}

/// Every group.
pub struct State {
    params: Params,
    /// Groups by their `group_by` values.
    pub groups: BTreeMap<Vec<String>, Group>,
    /// Buckets below this index are closed (a point for one is late).
    pub closed_below: u64,
    seq: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, groups: BTreeMap::new(), closed_below: 0, seq: 0 }
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.groups.len()
    }

    /// The group `key` after a point at `time` (created with `model()` if new, evicting the least
    /// recently seen 10 % at `max_series`), and the number of groups evicted.
    pub fn touch(&mut self, key: &[String], time: u64, model: impl FnOnce() -> Model) -> (usize, Option<&mut Group>) {
        let mut evicted = 0;
        if !self.groups.contains_key(key) {
            if self.groups.len() >= self.params.max_series {
                evicted = self.evict_least_recent();
            }
            let g = Group { buckets: BTreeMap::new(), model: model(), last_point: time, last_seen: 0 };
            self.groups.insert(key.to_vec(), g);
        }
        self.seq += 1;
        let seq = self.seq;
        match self.groups.get_mut(key) {
            Some(g) => {
                g.last_seen = seq;
                g.last_point = g.last_point.max(time);
                (evicted, Some(g))
            }
            None => (evicted, None),
        }
    }

    fn evict_least_recent(&mut self) -> usize {
        let max = self.params.max_series;
        let excess = (self.groups.len() + 1).saturating_sub(max);
        let n = (max / 10).max(1).max(excess).min(self.groups.len());
        let mut by_age: Vec<(u64, Vec<String>)> = self.groups.iter().map(|(k, g)| (g.last_seen, k.clone())).collect();
        by_age.sort_unstable();
        for (_, key) in by_age.into_iter().take(n) {
            self.groups.remove(&key);
        }
        tracing::debug!(evicted = n, max_series = max, "coupled_model: evicted least recently seen groups");
        n
    }

    /// Forgets groups without open buckets and without input for `idle_ns` before `watermark`;
    /// returns how many.
    pub fn expire(&mut self, watermark: u64) -> usize {
        let idle = self.params.idle_ns;
        let before = self.groups.len();
        self.groups.retain(|_, g| !g.buckets.is_empty() || g.last_point.saturating_add(idle) > watermark);
        before - self.groups.len()
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let groups: Vec<(&Vec<String>, &Group)> = self.groups.iter().collect();
        postcard::to_allocvec(&(self.seq, self.closed_below, groups))
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let (seq, closed_below, list): (u64, u64, Vec<(Vec<String>, Group)>) = postcard::from_bytes(bytes)?;
        let mut groups = BTreeMap::new();
        for (k, g) in list {
            if !g.model.is_valid(self.params.dim) {
                return Err(RestoreError::Invalid("a model does not fit the configured terms (quality / intercept)"));
            }
            if groups.insert(k, g).is_some() {
                return Err(RestoreError::Invalid("duplicate group"));
            }
        }
        self.groups = groups;
        self.seq = seq;
        self.closed_below = closed_below;
        Ok(())
    }
}

/// Why a snapshot could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The bytes do not decode.
    #[error("decode: {0}")]
    Decode(#[from] postcard::Error),
    /// The state violates an invariant.
    #[error("invalid state: {0}")]
    Invalid(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_series: usize) -> Params {
        Params { max_series, idle_ns: 100, dim: 3 }
    }

    fn key(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    fn model() -> Model {
        Model::new(vec![0.0; 3], 1e6)
    }

    #[test]
    fn bucket_keeps_the_latest_value() {
        let mut b = Bucket::default();
        assert!(b.set(Input::Ttft, 10, 1.0));
        assert!(!b.set(Input::Ttft, 5, 2.0), "an older point does not replace a newer one");
        assert!(b.set(Input::Ttft, 10, 3.0), "a tie goes to the later arrival");
        assert_eq!(b.get(Input::Ttft), Some(Latest { time: 10, value: 3.0 }));
        assert_eq!(b.get(Input::Latency), None);
    }

    #[test]
    fn eviction_expiry_and_snapshot() {
        let mut st = State::new(params(3));
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            st.touch(&key(k), i as u64, model);
        }
        st.touch(&key("a"), 3, model);
        assert_eq!(st.touch(&key("d"), 4, model).0, 1);
        assert!(!st.groups.contains_key(&key("b")), "b was the least recently seen");
        st.groups.get_mut(&key("c")).unwrap().buckets.insert(0, Bucket::default());
        assert_eq!(st.expire(104), 2, "a (3) and d (4) are idle; c has an open bucket");
        assert_eq!(st.series_count(), 1);
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(3));
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        assert!(other.restore(&bytes[..bytes.len() - 1]).is_err());
        let mut wrong_dim = State::new(Params { dim: 4, ..params(3) });
        assert!(matches!(wrong_dim.restore(&bytes), Err(RestoreError::Invalid(_))));
        assert_eq!(wrong_dim.series_count(), 0);
    }
}
