//! The state of `zscore_skew`: one [`Window`] per series in a [`SeriesMap`] (least-recently-seen
//! eviction, idle expiry on event time, the checkpoint envelope), and its checkpoint form.

use super::window::{Window, WindowRepr};
pub use crate::detect::series::SeriesMeta;
use crate::detect::series::{MetaRepr, RestoreError, SeriesMap};
use serde::{Deserialize, Serialize};

/// One series: its window and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// What its scores carry.
    pub meta: SeriesMeta,
    /// The last `window` finite values.
    pub window: Window,
    /// Finite points taken so far (the index of the next point).
    pub seen: u64,
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
    series: SeriesMap<u64, Series>,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        State { params, series: SeriesMap::new(params.max_series, params.idle_ns) }
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
        let (window, distinct) = (self.params.window, self.params.max_distinct);
        let make =
            || Ok(meta()?.map(|meta| Series { meta, window: Window::new(window).with_distinct(distinct), seen: 0 }));
        Ok(match self.series.try_touch(&id, time, make, |_, _| {})? {
            Some(t) => (Some(t.state), t.evicted),
            None => (None, 0),
        })
    }

    /// Forgets series without a point for `idle_timeout` of event time before `watermark`;
    /// returns how many.
    pub fn evict_idle(&mut self, watermark: u64) -> usize {
        self.series.expire_idle(watermark, |_| None, |_, _| {})
    }

    /// Bytes of state held, estimated: the map's slots, each series' struct, ring buffer and metadata.
    pub fn approx_bytes(&self) -> usize {
        self.series.approx_bytes(|s| s.window.heap_bytes() + s.meta.heap_bytes())
    }

    /// Serializes the state (series sorted by id, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.series.snapshot(super::STATE_VERSION, &(), |_, s| SeriesRepr {
            seen: s.seen,
            meta: MetaRepr::from(&s.meta),
            window: s.window.to_repr(),
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error. Windows saved with
    /// another length are resized (newest values kept).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let (window, distinct) = (self.params.window, self.params.max_distinct);
        let ((), series) = self.series.restore(super::STATE_VERSION, bytes, |_, s: SeriesRepr| {
            let w = Window::from_repr(window, s.window).map_err(|e| RestoreError::part("window", e))?;
            if (w.len() as u64) > s.seen {
                return Err(RestoreError::Invalid("window holds more points than the series saw"));
            }
            Ok(Series { meta: s.meta.try_into()?, window: w.with_distinct(distinct), seen: s.seen })
        })?;
        self.series = series;
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct SeriesRepr {
    seen: u64,
    meta: MetaRepr,
    window: WindowRepr,
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
