//! The state of `window_stats`: open windows per series in a [`SeriesMap`] (eviction, idle
//! expiry, the checkpoint envelope), indexed by window end, and its checkpoint form.

use crate::detect::series::{MetaRepr, SeriesMap};
pub use crate::detect::series::{RestoreError, SeriesMeta};
use crate::detect::sketch::DdSketch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

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
}

impl Series {
    /// The watermark its windows close at (`None`: no window open).
    fn open_until(&self) -> Option<u64> {
        self.windows.iter().map(|w| w.end).max()
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
    series: SeriesMap<u64, Series>,
    /// (window end, series id) of every open window.
    open: BTreeSet<(u64, u64)>,
    watermark: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params) -> Self {
        let series = SeriesMap::new(params.max_series, params.idle_ns);
        State { params, series, open: BTreeSet::new(), watermark: 0 }
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
        let open = &mut self.open;
        let make = || Ok(meta()?.map(|meta| Series { meta, windows: Vec::new() }));
        let forget = |id: &u64, s: &Series| {
            for w in &s.windows {
                open.remove(&(w.end, *id));
            }
        };
        let Some(t) = self.series.try_touch(&id, time, make, forget)? else { return Ok(Err(Skip::Filtered)) };
        let (s, evicted) = (t.state, t.evicted);
        let w = self.params.window_ns;
        let start = time - time % w;
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
        for (end, id) in due {
            let Some(s) = self.series.get_mut(&id) else { continue };
            let Some(i) = s.windows.iter().position(|w| w.end == end) else { continue };
            let w = s.windows.swap_remove(i);
            emit(id, &s.meta, &w);
        }
        let n = self.series.expire_idle(watermark, Series::open_until, |_, _| {});
        if n > 0 {
            tracing::debug!(evicted = n, watermark, "window_stats: evicted idle series");
        }
        n
    }

    /// Serializes the state (series sorted by id, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.series.snapshot(super::STATE_VERSION, &self.watermark, |_, s| SeriesRepr {
            meta: MetaRepr::from(&s.meta),
            windows: s.windows.clone(),
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let mut open = BTreeSet::new();
        let (watermark, series) = self.series.restore(super::STATE_VERSION, bytes, |id, s: SeriesRepr| {
            for w in &s.windows {
                if w.start >= w.end || !open.insert((w.end, *id)) {
                    return Err(RestoreError::Invalid("window bounds"));
                }
            }
            Ok(Series { meta: s.meta.try_into()?, windows: s.windows })
        })?;
        self.series = series;
        self.open = open;
        self.watermark = watermark;
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct SeriesRepr {
    meta: MetaRepr,
    windows: Vec<Window>,
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
