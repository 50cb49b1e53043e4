//! The state of `coupled_model`: per group, the open aligned buckets (last value of each input)
//! and the online model, held in the kit's [`OrderedSeriesMap`] (eviction, idle expiry, the
//! checkpoint envelope).

use super::STATE_VERSION;
use super::fit::Model;
use crate::detect::series::OrderedSeriesMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::detect::series::RestoreError;

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
    /// Groups by their `group_by` values, in key order (the order of the outputs).
    pub series: OrderedSeriesMap<Vec<String>, Group>,
    /// Buckets below this index are closed (a point for one is late).
    pub closed_below: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, series: OrderedSeriesMap::new(params.max_series, params.idle_ns), closed_below: 0 }
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The group `key` after a point at `time` (created with `model()` if new, evicting the least
    /// recently seen 10 % at `max_series`), and the number of groups evicted.
    pub fn touch(&mut self, key: Vec<String>, time: u64, model: impl FnOnce() -> Model) -> (usize, Option<&mut Group>) {
        let make = || Group { buckets: BTreeMap::new(), model: model() };
        let Some(t) = self.series.touch(&key, time, make, |_, _| {}) else { return (0, None) };
        if t.evicted > 0 {
            tracing::debug!(
                evicted = t.evicted,
                max_series = self.params.max_series,
                "coupled_model: evicted least recently seen groups"
            );
        }
        (t.evicted, Some(t.state))
    }

    /// Forgets groups without open buckets and without input for `idle_ns` before `watermark`;
    /// returns how many.
    pub fn expire(&mut self, watermark: u64) -> usize {
        self.series.expire_idle(watermark, |g| (!g.buckets.is_empty()).then_some(0), |_, _| {})
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.series.snapshot(STATE_VERSION, &self.closed_below, |_, g| g)
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let dim = self.params.dim;
        let (closed_below, series) = self.series.restore(STATE_VERSION, bytes, |_, g: Group| {
            if !g.model.is_valid(dim) {
                return Err(RestoreError::Invalid("a model does not fit the configured terms (quality / intercept)"));
            }
            Ok(g)
        })?;
        self.series = series;
        self.closed_below = closed_below;
        Ok(())
    }
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
            st.touch(key(k), i as u64, model);
        }
        st.touch(key("a"), 3, model);
        assert_eq!(st.touch(key("d"), 4, model).0, 1);
        assert!(!st.series.contains_key(&key("b")), "b was the least recently seen");
        st.series.get_mut(&key("c")).unwrap().buckets.insert(0, Bucket::default());
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
