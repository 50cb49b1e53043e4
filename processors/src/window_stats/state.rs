//! The state of `window_stats`: open windows per series, eviction, and its checkpoint form.

use super::sketch::{DdSketch, SketchError};
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// What a series' derived points carry over from its source points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeriesMeta {
    /// Source metric name.
    pub metric: String,
    /// Source metric unit.
    pub unit: String,
    /// Source resource.
    pub resource: Resource,
    /// Source ResourceMetrics schema_url.
    pub resource_schema_url: String,
    /// Source instrumentation scope.
    pub scope: InstrumentationScope,
    /// Source ScopeMetrics schema_url.
    pub scope_schema_url: String,
    /// Source point attributes.
    pub attributes: Vec<KeyValue>,
}

/// One tumbling window of one series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Inclusive start, ns since the epoch.
    pub start: u64,
    /// Exclusive end, ns since the epoch.
    pub end: u64,
    /// The values of the window.
    pub sketch: DdSketch,
}

#[derive(Debug, Clone, PartialEq)]
struct Series {
    meta: SeriesMeta,
    /// Open windows (usually one; more while late points are allowed).
    windows: Vec<Window>,
    /// Largest event time of a point of this series.
    last_point: u64,
    /// Arrival sequence number of its latest point (for least-recently-seen eviction).
    last_seen: u64,
}

impl Series {
    /// Watermark at which the series is idle: its windows are closed and no point came for `idle` ns.
    fn idle_deadline(&self, idle: u64) -> u64 {
        let windows_end = self.windows.iter().map(|w| w.end).max().unwrap_or(0);
        self.last_point.saturating_add(idle).max(windows_end)
    }
}

/// Parameters of the state (from the configuration; not checkpointed).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Window length in ns (> 0).
    pub window_ns: u64,
    /// Idle timeout in ns of event time.
    pub idle_ns: u64,
    /// Most series held.
    pub max_series: usize,
    /// Relative accuracy of new sketches.
    pub alpha: f64,
    /// Bin bound of new sketches.
    pub max_bins: usize,
}

/// Why a point was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its event time is before the watermark (its window is closed).
    Late,
    /// Its series is new and the metric is not selected.
    Filtered,
}

/// Open windows of every series, indexed by window end for closing in order.
pub struct State {
    params: Params,
    series: HashMap<u64, Series>,
    /// (window end, series id) of every open window.
    open: BTreeSet<(u64, u64)>,
    watermark: u64,
    seq: u64,
    /// No series can be idle before this watermark (a lower bound of every series' idle deadline).
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

    /// The watermark of the last `close_until`.
    pub fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Adds a point. `meta` is called only for a series not held yet (`Ok(None)`: not selected).
    /// Returns the number of series evicted to make room (`max_series`).
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
            self.series.insert(id, Series { meta, windows: Vec::new(), last_point: time, last_seen: 0 });
        }
        self.seq += 1;
        let w = self.params.window_ns;
        let start = time - time % w;
        let Some(s) = self.series.get_mut(&id) else { return Ok(Ok(evicted)) };
        s.last_seen = self.seq;
        s.last_point = s.last_point.max(time);
        let window = match s.windows.iter().rposition(|x| x.start == start) {
            Some(i) => &mut s.windows[i],
            None => {
                let end = start.saturating_add(w);
                let sketch = DdSketch::new(self.params.alpha, self.params.max_bins).unwrap_or_default();
                self.open.insert((end, id));
                s.windows.push(Window { start, end, sketch });
                let last = s.windows.len() - 1;
                &mut s.windows[last]
            }
        };
        window.sketch.add(value);
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
            self.remove(id);
        }
        tracing::debug!(evicted = n, max_series = max, "window_stats: evicted least recently seen series");
        n
    }

    fn remove(&mut self, id: u64) {
        if let Some(s) = self.series.remove(&id) {
            for w in &s.windows {
                self.open.remove(&(w.end, id));
            }
        }
    }

    /// Closes every window ending at or before `watermark`, in (end, series id) order, passing each
    /// to `emit`; then evicts idle series. Returns the number of idle series evicted.
    pub fn close_until(&mut self, watermark: u64, mut emit: impl FnMut(u64, &SeriesMeta, &Window)) -> usize {
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
        self.close_each(due.into_iter(), &mut emit);
        self.evict_idle()
    }

    fn close_each(&mut self, due: impl Iterator<Item = (u64, u64)>, emit: &mut impl FnMut(u64, &SeriesMeta, &Window)) {
        for (end, id) in due {
            let Some(s) = self.series.get_mut(&id) else { continue };
            let Some(i) = s.windows.iter().position(|w| w.end == end) else { continue };
            let w = s.windows.swap_remove(i);
            emit(id, &s.meta, &w);
        }
    }

    fn evict_idle(&mut self) -> usize {
        if self.watermark < self.next_idle_check {
            return 0;
        }
        let idle = self.params.idle_ns;
        let wm = self.watermark;
        let before = self.series.len();
        self.series.retain(|_, s| !(s.windows.is_empty() && s.last_point.saturating_add(idle) <= wm));
        self.next_idle_check = self.series.values().map(|s| s.idle_deadline(idle)).min().unwrap_or(u64::MAX);
        let n = before - self.series.len();
        if n > 0 {
            tracing::debug!(evicted = n, watermark = wm, "window_stats: evicted idle series");
        }
        n
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
                last_point: s.last_point,
                last_seen: s.last_seen,
                meta: MetaRepr::from(&s.meta),
                windows: s.windows.clone(),
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
            for w in &s.windows {
                if w.start >= w.end || !open.insert((w.end, s.id)) {
                    return Err(RestoreError::Invalid("window bounds"));
                }
            }
            if series
                .insert(
                    s.id,
                    Series {
                        meta: s.meta.try_into()?,
                        windows: s.windows,
                        last_point: s.last_point,
                        last_seen: s.last_seen,
                    },
                )
                .is_some()
            {
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
    /// A sketch violates its invariants.
    #[error("sketch: {0}")]
    Sketch(#[from] SketchError),
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
    windows: Vec<Window>,
}

/// Series metadata with the OTLP parts protobuf-encoded (their serde form is JSON-specific).
#[derive(Serialize, Deserialize)]
struct MetaRepr {
    metric: String,
    unit: String,
    resource: Vec<u8>,
    resource_schema_url: String,
    scope: Vec<u8>,
    scope_schema_url: String,
    attributes: Vec<Vec<u8>>,
}

impl From<&SeriesMeta> for MetaRepr {
    fn from(m: &SeriesMeta) -> Self {
        MetaRepr {
            metric: m.metric.clone(),
            unit: m.unit.clone(),
            resource: m.resource.encode_to_vec(),
            resource_schema_url: m.resource_schema_url.clone(),
            scope: m.scope.encode_to_vec(),
            scope_schema_url: m.scope_schema_url.clone(),
            attributes: m.attributes.iter().map(|kv| kv.encode_to_vec()).collect(),
        }
    }
}

impl TryFrom<MetaRepr> for SeriesMeta {
    type Error = prost::DecodeError;

    fn try_from(r: MetaRepr) -> Result<Self, prost::DecodeError> {
        Ok(SeriesMeta {
            metric: r.metric,
            unit: r.unit,
            resource: Resource::decode(r.resource.as_slice())?,
            resource_schema_url: r.resource_schema_url,
            scope: InstrumentationScope::decode(r.scope.as_slice())?,
            scope_schema_url: r.scope_schema_url,
            attributes: r.attributes.iter().map(|b| KeyValue::decode(b.as_slice())).collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn params(max_series: usize) -> Params {
        Params { window_ns: 60 * S, idle_ns: 600 * S, max_series, alpha: 0.01, max_bins: 2048 }
    }

    fn meta(name: &str) -> Result<Option<SeriesMeta>, ()> {
        Ok(Some(SeriesMeta { metric: name.into(), ..Default::default() }))
    }

    fn closed(st: &mut State, wm: u64) -> Vec<(u64, u64, u64, u64)> {
        let mut v = Vec::new();
        st.close_until(wm, |id, _, w| v.push((w.end, id, w.start, w.sketch.count())));
        v
    }

    #[test]
    fn windows_close_in_end_then_series_order() {
        let mut st = State::new(params(10));
        st.add(9, 61 * S, 1.0, || meta("a")).unwrap().unwrap();
        st.add(2, 5 * S, 1.0, || meta("b")).unwrap().unwrap();
        st.add(9, 7 * S, 1.0, || meta("a")).unwrap().unwrap();
        st.add(2, 59 * S, 1.0, || meta("b")).unwrap().unwrap();
        assert!(closed(&mut st, 60 * S - 1).is_empty());
        assert_eq!(closed(&mut st, 60 * S), vec![(60 * S, 2, 0, 2), (60 * S, 9, 0, 1)]);
        assert_eq!(st.add(9, 59 * S, 1.0, || meta("a")).unwrap(), Err(Skip::Late));
        assert_eq!(closed(&mut st, u64::MAX), vec![(120 * S, 9, 60 * S, 1)]);
    }

    #[test]
    fn evicts_least_recently_seen_tenth() {
        let mut st = State::new(params(20));
        for id in 0..20 {
            st.add(id, S, 1.0, || meta("m")).unwrap().unwrap();
        }
        st.add(0, S, 1.0, || meta("m")).unwrap().unwrap(); // 0 is now the most recent
        assert_eq!(st.add(100, S, 1.0, || meta("m")).unwrap(), Ok(2));
        assert_eq!(st.series_count(), 19);
        let mut ids: Vec<u64> = closed(&mut st, 60 * S).into_iter().map(|c| c.1).collect();
        ids.sort_unstable();
        let want: Vec<u64> = [0].into_iter().chain(3..20).chain([100]).collect();
        assert_eq!(ids, want, "series 1 and 2 were the least recently seen");
    }

    #[test]
    fn corrupt_snapshot_is_refused_and_state_kept() {
        let mut st = State::new(params(10));
        st.add(1, S, 1.0, || meta("m")).unwrap().unwrap();
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10));
        assert!(other.restore(&bytes[..bytes.len() / 2]).is_err());
        assert_eq!(other.series_count(), 0);
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
    }
}
