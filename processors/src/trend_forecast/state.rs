//! The state of `trend_forecast`: per series its open buckets and rolling history, the cap with
//! least-recently-seen eviction, idle expiry on event time, and the checkpoint form.

use super::aggregate::{Bucket, History, Statistic};
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// What a series' outputs carry over from its input points.
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

#[derive(Debug, Clone, PartialEq)]
struct Series {
    meta: SeriesMeta,
    /// Open buckets, increasing index (usually one; more while late points are allowed).
    open: Vec<Bucket>,
    history: History,
    /// Largest event time of a point of this series.
    last_point: u64,
    /// Arrival sequence number of its latest point (least-recently-seen eviction).
    last_seen: u64,
}

/// Parameters of the state (from the configuration; not checkpointed).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Aggregate (bucket) length in ns, > 0.
    pub aggregate_ns: u64,
    /// Aggregates kept in the rolling history.
    pub history: u64,
    /// Event time without a point after which a series is forgotten, ns.
    pub idle_ns: u64,
    /// Most series held.
    pub max_series: usize,
    /// Statistic of a bucket's points.
    pub statistic: Statistic,
}

/// Why a point was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its event time is before the watermark (its bucket is closed).
    Late,
    /// Its series is new and the metric is not the configured one.
    Filtered,
}

/// A bucket that closed: its series, end time and the series' history including it.
pub struct Closed<'a> {
    /// Series id.
    pub id: u64,
    /// The series' metadata.
    pub meta: &'a SeriesMeta,
    /// End of the bucket, ns (the outputs' timestamp).
    pub end_ns: u64,
    /// The rolling history, oldest first, ending with this bucket.
    pub history: Vec<(u64, f64)>,
}

/// Open buckets and histories of every series.
pub struct State {
    params: Params,
    series: HashMap<u64, Series>,
    /// (bucket end, series id) of every open bucket.
    open: BTreeSet<(u64, u64)>,
    watermark: u64,
    seq: u64,
    /// No series can be idle before this watermark.
    next_idle_check: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, series: HashMap::new(), open: BTreeSet::new(), watermark: 0, seq: 0, next_idle_check: 0 }
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Adds a point. `meta` is called only for a series not held yet (`Ok(None)`: not selected).
    /// Returns the number of series evicted to make room.
    pub fn add<E>(
        &mut self,
        id: u64,
        time: u64,
        value: f64,
        meta: impl FnOnce() -> Result<Option<SeriesMeta>, E>,
    ) -> Result<Result<usize, Skip>, E> {
        if time < self.watermark {
            return Ok(Err(Skip::Late));
        }
        let mut evicted = 0;
        if !self.series.contains_key(&id) {
            let Some(meta) = meta()? else { return Ok(Err(Skip::Filtered)) };
            if self.series.len() >= self.params.max_series {
                evicted = self.evict_least_recent();
            }
            self.next_idle_check = self.next_idle_check.min(time.saturating_add(self.params.idle_ns));
            let s = Series { meta, open: Vec::new(), history: History::default(), last_point: time, last_seen: 0 };
            self.series.insert(id, s);
        }
        self.seq += 1;
        let agg = self.params.aggregate_ns.max(1);
        let idx = time / agg;
        let Some(s) = self.series.get_mut(&id) else { return Ok(Ok(evicted)) };
        s.last_seen = self.seq;
        s.last_point = s.last_point.max(time);
        let pos = match s.open.binary_search_by_key(&idx, |b| b.idx) {
            Ok(p) => p,
            Err(p) => {
                self.open.insert((idx.saturating_add(1).saturating_mul(agg), id));
                s.open.insert(p, Bucket::new(idx));
                p
            }
        };
        s.open[pos].add(value);
        Ok(Ok(evicted))
    }

    /// Evicts the least recently seen 10 % of `max_series` (and any excess); returns how many.
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
            if let Some(s) = self.series.remove(&id) {
                for b in &s.open {
                    let end = self.bucket_end(b.idx);
                    self.open.remove(&(end, id));
                }
            }
        }
        tracing::debug!(evicted = n, max_series = max, "trend_forecast: evicted least recently seen series");
        n
    }

    fn bucket_end(&self, idx: u64) -> u64 {
        idx.saturating_add(1).saturating_mul(self.params.aggregate_ns.max(1))
    }

    /// Closes every bucket ending at or before `watermark`, in (end, series id) order: appends its
    /// aggregate to the series' history and passes the result to `on_close`. Then evicts idle series;
    /// returns how many.
    pub fn close_until(&mut self, watermark: u64, mut on_close: impl FnMut(Closed<'_>)) -> usize {
        if watermark < self.watermark {
            return 0;
        }
        self.watermark = watermark;
        let due = if watermark == u64::MAX {
            std::mem::take(&mut self.open)
        } else {
            let rest = self.open.split_off(&(watermark + 1, 0));
            std::mem::replace(&mut self.open, rest)
        };
        let (stat, cap, agg) = (self.params.statistic, self.params.history, self.params.aggregate_ns.max(1));
        for (end, id) in due {
            let Some(s) = self.series.get_mut(&id) else { continue };
            let idx = end / agg - 1;
            let Ok(pos) = s.open.binary_search_by_key(&idx, |b| b.idx) else { continue };
            let bucket = s.open.remove(pos);
            let Some(value) = bucket.value(stat) else { continue };
            if !s.history.push(idx, value, cap) {
                tracing::debug!(series = id, idx, "trend_forecast: bucket out of order or not finite, ignored");
                continue;
            }
            on_close(Closed { id, meta: &s.meta, end_ns: end, history: s.history.points() });
        }
        self.evict_idle()
    }

    fn evict_idle(&mut self) -> usize {
        if self.watermark < self.next_idle_check {
            return 0;
        }
        let (idle, wm) = (self.params.idle_ns, self.watermark);
        let before = self.series.len();
        self.series.retain(|_, s| !(s.open.is_empty() && s.last_point.saturating_add(idle) <= wm));
        let agg = self.params.aggregate_ns.max(1);
        self.next_idle_check = self
            .series
            .values()
            .map(|s| {
                let open_end = s.open.last().map_or(0, |b| b.idx.saturating_add(1).saturating_mul(agg));
                s.last_point.saturating_add(idle).max(open_end)
            })
            .min()
            .unwrap_or(u64::MAX);
        let n = before - self.series.len();
        if n > 0 {
            tracing::debug!(evicted = n, watermark = wm, "trend_forecast: evicted idle series");
        }
        n
    }

    /// Serializes the state (series sorted by id, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut ids: Vec<u64> = self.series.keys().copied().collect();
        ids.sort_unstable();
        let series = ids
            .into_iter()
            .filter_map(|id| self.series.get(&id).map(|s| (id, s)))
            .map(|(id, s)| SeriesRepr {
                id,
                last_point: s.last_point,
                last_seen: s.last_seen,
                meta: MetaRepr::from(&s.meta),
                open: s.open.clone(),
                history: s.history.clone(),
            })
            .collect();
        postcard::to_allocvec(&SnapshotRepr { watermark: self.watermark, seq: self.seq, series })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let repr: SnapshotRepr = postcard::from_bytes(bytes)?;
        let mut series = HashMap::with_capacity(repr.series.len());
        let mut open = BTreeSet::new();
        for s in repr.series {
            if !s.history.is_valid() || s.open.windows(2).any(|w| w[0].idx >= w[1].idx) {
                return Err(RestoreError::Invalid("bucket order"));
            }
            for b in &s.open {
                open.insert((self.bucket_end(b.idx), s.id));
            }
            let meta = s.meta.try_into()?;
            let value =
                Series { meta, open: s.open, history: s.history, last_point: s.last_point, last_seen: s.last_seen };
            if series.insert(s.id, value).is_some() {
                return Err(RestoreError::Invalid("duplicate series"));
            }
        }
        self.series = series;
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
    /// The state violates an invariant.
    #[error("invalid state: {0}")]
    Invalid(&'static str),
}

#[derive(Serialize, Deserialize)]
struct SnapshotRepr {
    watermark: u64,
    seq: u64,
    series: Vec<SeriesRepr>,
}

#[derive(Serialize, Deserialize)]
struct SeriesRepr {
    id: u64,
    last_point: u64,
    last_seen: u64,
    meta: MetaRepr,
    open: Vec<Bucket>,
    history: History,
}

/// Series metadata with the OTLP parts protobuf-encoded.
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

    const H: u64 = 3_600_000_000_000;

    fn params(max_series: usize) -> Params {
        Params { aggregate_ns: H, history: 4, idle_ns: 10 * H, max_series, statistic: Statistic::Mean }
    }

    fn meta() -> Result<Option<SeriesMeta>, ()> {
        Ok(Some(SeriesMeta { metric: "m".into(), ..Default::default() }))
    }

    type ClosedRow = (u64, u64, Vec<(u64, f64)>);

    fn close(st: &mut State, wm: u64) -> Vec<ClosedRow> {
        let mut v = Vec::new();
        st.close_until(wm, |c| v.push((c.end_ns, c.id, c.history)));
        v
    }

    #[test]
    fn buckets_close_in_order_into_a_rolling_history() {
        let mut st = State::new(params(10));
        st.add(1, H + 5, 2.0, meta).unwrap().unwrap();
        st.add(1, 2 * H - 1, 4.0, meta).unwrap().unwrap();
        st.add(1, 0, 1.0, meta).unwrap().unwrap();
        assert!(close(&mut st, H - 1).is_empty());
        assert_eq!(close(&mut st, 2 * H), vec![(H, 1, vec![(0, 1.0)]), (2 * H, 1, vec![(0, 1.0), (1, 3.0)])]);
        assert_eq!(st.add(1, 2 * H - 1, 1.0, meta).unwrap(), Err(Skip::Late));
        for i in 2..7 {
            st.add(1, i * H, i as f64, meta).unwrap().unwrap();
        }
        let last = close(&mut st, 7 * H).pop().unwrap();
        assert_eq!(last.2, vec![(3, 3.0), (4, 4.0), (5, 5.0), (6, 6.0)], "history of 4 aggregates");
    }

    #[test]
    fn evicts_least_recent_and_idle() {
        let mut st = State::new(params(10));
        for id in 0..10 {
            st.add(id, 0, 1.0, meta).unwrap().unwrap();
        }
        st.add(0, 1, 1.0, meta).unwrap().unwrap();
        assert_eq!(st.add(99, 2, 1.0, meta).unwrap(), Ok(1));
        assert_eq!(st.series_count(), 10);
        let ids: BTreeSet<u64> = close(&mut st, H).into_iter().map(|c| c.1).collect();
        assert!(!ids.contains(&1) && ids.contains(&0) && ids.contains(&99));
        st.add(5, 5 * H, 1.0, meta).unwrap().unwrap();
        assert_eq!(st.close_until(10 * H + 5, |_| {}), 9, "all but series 5 idle for 10h");
        assert_eq!(st.series_count(), 1);
    }

    #[test]
    fn corrupt_snapshot_is_refused_and_state_kept() {
        let mut st = State::new(params(10));
        st.add(1, 0, 1.0, meta).unwrap().unwrap();
        close(&mut st, H);
        st.add(1, H, 1.0, meta).unwrap().unwrap();
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10));
        assert!(other.restore(&bytes[..bytes.len() - 3]).is_err());
        assert_eq!(other.series_count(), 0);
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
    }
}
