//! The state of `zscore_skew`: one [`Window`] per series, least-recently-seen eviction, idle
//! expiry on event time, and the checkpoint form.

use super::window::{Window, WindowError, WindowRepr};
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What a series' scores carry over from its points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeriesMeta {
    /// Input metric name.
    pub metric: String,
    /// Input resource.
    pub resource: Resource,
    /// Input instrumentation scope.
    pub scope: InstrumentationScope,
    /// Input point attributes.
    pub attributes: Vec<KeyValue>,
}

impl SeriesMeta {
    /// Heap bytes, estimated (strings and vectors, not allocator overhead).
    fn heap_bytes(&self) -> usize {
        fn kvs(v: &[KeyValue]) -> usize {
            v.iter().map(|kv| std::mem::size_of::<KeyValue>() + kv.key.len() + kv.encoded_len()).sum()
        }
        self.metric.len()
            + kvs(&self.resource.attributes)
            + self.scope.name.len()
            + self.scope.version.len()
            + kvs(&self.scope.attributes)
            + kvs(&self.attributes)
    }
}

/// One series: its window and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// What its scores carry.
    pub meta: SeriesMeta,
    /// The last `window` finite values.
    pub window: Window,
    /// Finite points taken so far (the index of the next point).
    pub seen: u64,
    /// Largest event time of its points (ns).
    pub last_time: u64,
    /// Arrival sequence number of its latest point (for least-recently-seen eviction).
    last_seen: u64,
}

/// Parameters of the state (from the configuration; not checkpointed).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Window length in points.
    pub window: usize,
    /// Most series held.
    pub max_series: usize,
    /// Event time without a point after which a series is forgotten (ns).
    pub idle_ns: u64,
    /// Distinct values each window tracks (`quantised.max_distinct`; 0 = none).
    pub max_distinct: usize,
}

/// Every series held.
pub struct State {
    params: Params,
    series: HashMap<u64, Series>,
    seq: u64,
    /// No series can be idle before this watermark.
    next_idle_check: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, series: HashMap::new(), seq: 0, next_idle_check: 0 }
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The series `id`, created with `meta()` when new (`Ok(None)` from `meta`: not selected, not
    /// created). Also returns how many series were evicted to make room.
    pub fn series<E>(
        &mut self,
        id: u64,
        time: u64,
        meta: impl FnOnce() -> Result<Option<SeriesMeta>, E>,
    ) -> Result<(Option<&mut Series>, usize), E> {
        let mut evicted = 0;
        if !self.series.contains_key(&id) {
            let Some(meta) = meta()? else { return Ok((None, 0)) };
            if self.series.len() >= self.params.max_series {
                evicted = self.evict_least_recent();
            }
            self.next_idle_check = self.next_idle_check.min(time.saturating_add(self.params.idle_ns));
            self.series.insert(
                id,
                Series {
                    meta,
                    window: Window::new(self.params.window).with_distinct(self.params.max_distinct),
                    seen: 0,
                    last_time: time,
                    last_seen: 0,
                },
            );
        }
        self.seq += 1;
        let seq = self.seq;
        let Some(s) = self.series.get_mut(&id) else { return Ok((None, evicted)) };
        s.last_seen = seq;
        s.last_time = s.last_time.max(time);
        Ok((Some(s), evicted))
    }

    /// Evicts the least recently seen 10 % of `max_series` (at least one); returns how many.
    fn evict_least_recent(&mut self) -> usize {
        let max = self.params.max_series;
        let excess = (self.series.len() + 1).saturating_sub(max);
        let n = (max / 10).max(1).max(excess).min(self.series.len());
        if n == 0 {
            return 0;
        }
        let mut by_age: Vec<(u64, u64)> = self.series.iter().map(|(id, s)| (s.last_seen, *id)).collect();
        if n < by_age.len() {
            by_age.select_nth_unstable(n - 1);
        }
        for &(_, id) in &by_age[..n] {
            self.series.remove(&id);
        }
        tracing::debug!(evicted = n, max_series = max, "zscore_skew: evicted least recently seen series");
        n
    }

    /// Forgets series without a point for `idle_timeout` of event time before `watermark`;
    /// returns how many.
    pub fn evict_idle(&mut self, watermark: u64) -> usize {
        if watermark < self.next_idle_check {
            return 0;
        }
        let idle = self.params.idle_ns;
        let before = self.series.len();
        self.series.retain(|_, s| s.last_time.saturating_add(idle) > watermark);
        self.next_idle_check = self.series.values().map(|s| s.last_time.saturating_add(idle)).min().unwrap_or(u64::MAX);
        before - self.series.len()
    }

    /// Bytes of state held, estimated: the map's slots, each series' struct, ring buffer and metadata.
    pub fn approx_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, Series)>() + 1;
        self.series.capacity() * slot
            + self.series.values().map(|s| s.window.heap_bytes() + s.meta.heap_bytes()).sum::<usize>()
    }

    /// Serializes the state (series sorted by id, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut ids: Vec<&u64> = self.series.keys().collect();
        ids.sort_unstable();
        let series = ids
            .into_iter()
            .filter_map(|id| self.series.get(id).map(|s| (*id, s)))
            .map(|(id, s)| SeriesRepr {
                id,
                seen: s.seen,
                last_time: s.last_time,
                last_seen: s.last_seen,
                meta: MetaRepr::from(&s.meta),
                window: s.window.to_repr(),
            })
            .collect();
        postcard::to_allocvec(&SnapshotRepr { seq: self.seq, series })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error. Windows saved with
    /// another length are resized (newest values kept).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let repr: SnapshotRepr = postcard::from_bytes(bytes)?;
        let mut series = HashMap::with_capacity(repr.series.len());
        for s in repr.series {
            let window = Window::from_repr(self.params.window, s.window)?.with_distinct(self.params.max_distinct);
            if (window.len() as u64) > s.seen {
                return Err(RestoreError::Invalid("window holds more points than the series saw"));
            }
            let restored = Series {
                meta: s.meta.try_into()?,
                window,
                seen: s.seen,
                last_time: s.last_time,
                last_seen: s.last_seen,
            };
            if series.insert(s.id, restored).is_some() {
                return Err(RestoreError::Invalid("duplicate series"));
            }
        }
        self.series = series;
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
    /// A window violates its invariants.
    #[error("window: {0}")]
    Window(#[from] WindowError),
    /// The state violates an invariant.
    #[error("invalid state: {0}")]
    Invalid(&'static str),
}

#[derive(Serialize, Deserialize)]
struct SnapshotRepr {
    seq: u64,
    series: Vec<SeriesRepr>,
}

#[derive(Serialize, Deserialize)]
struct SeriesRepr {
    id: u64,
    seen: u64,
    last_time: u64,
    last_seen: u64,
    meta: MetaRepr,
    window: WindowRepr,
}

/// Series metadata with the OTLP parts protobuf-encoded (their serde form is JSON-specific).
#[derive(Serialize, Deserialize)]
struct MetaRepr {
    metric: String,
    resource: Vec<u8>,
    scope: Vec<u8>,
    attributes: Vec<Vec<u8>>,
}

impl From<&SeriesMeta> for MetaRepr {
    fn from(m: &SeriesMeta) -> Self {
        MetaRepr {
            metric: m.metric.clone(),
            resource: m.resource.encode_to_vec(),
            scope: m.scope.encode_to_vec(),
            attributes: m.attributes.iter().map(|kv| kv.encode_to_vec()).collect(),
        }
    }
}

impl TryFrom<MetaRepr> for SeriesMeta {
    type Error = prost::DecodeError;

    fn try_from(r: MetaRepr) -> Result<Self, prost::DecodeError> {
        Ok(SeriesMeta {
            metric: r.metric,
            resource: Resource::decode(r.resource.as_slice())?,
            scope: InstrumentationScope::decode(r.scope.as_slice())?,
            attributes: r.attributes.iter().map(|b| KeyValue::decode(b.as_slice())).collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_series: usize) -> Params {
        Params { window: 3, max_series, idle_ns: 100, max_distinct: 4 }
    }

    fn meta() -> Result<Option<SeriesMeta>, ()> {
        Ok(Some(SeriesMeta { metric: "m".into(), ..Default::default() }))
    }

    #[test]
    fn evicts_least_recently_seen_and_idle() {
        let mut st = State::new(params(20));
        for id in 0..20 {
            assert_eq!(st.series(id, 10, meta).unwrap().1, 0);
        }
        st.series(0, 10, meta).unwrap();
        assert_eq!(st.series(100, 10, meta).unwrap().1, 2);
        assert!(st.series.contains_key(&0) && !st.series.contains_key(&1) && !st.series.contains_key(&2));
        st.series(5, 60, meta).unwrap();
        assert_eq!(st.evict_idle(109), 0);
        assert_eq!(st.evict_idle(110), 18);
        assert_eq!(st.series_count(), 1);
        assert_eq!(st.evict_idle(160), 1);
    }

    #[test]
    fn corrupt_snapshot_is_refused_and_state_kept() {
        let mut st = State::new(params(10));
        for v in [1.0, 2.0, 4.0, 7.0] {
            let (s, _) = st.series(1, 1, meta).unwrap();
            let s = s.unwrap();
            s.window.push(v);
            s.seen += 1;
        }
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10));
        assert!(other.restore(&bytes[..bytes.len() / 2]).is_err());
        assert_eq!(other.series_count(), 0);
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
    }
}
