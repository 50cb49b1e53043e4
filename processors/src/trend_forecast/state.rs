//! The state of `trend_forecast`: per series its open buckets and rolling history in a
//! [`SeriesMap`] (the cap with least-recently-seen eviction, idle expiry on event time, the
//! checkpoint envelope), and its checkpoint form.

use super::aggregate::{Bucket, History, Statistic};
use crate::detect::series::{MetaRepr, SeriesMap};
pub use crate::detect::series::{RestoreError, SeriesMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq)]
struct Series {
    meta: SeriesMeta,
    /// Open buckets, increasing index (usually one; more while late points are allowed).
    open: Vec<Bucket>,
    history: History,
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

impl Params {
    fn bucket_end(&self, idx: u64) -> u64 {
        idx.saturating_add(1).saturating_mul(self.aggregate_ns.max(1))
    }
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
    series: SeriesMap<u64, Series>,
    /// (bucket end, series id) of every open bucket.
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
        let (p, open) = (self.params, &mut self.open);
        let make = || Ok(meta()?.map(|meta| Series { meta, open: Vec::new(), history: History::default() }));
        let forget = |id: &u64, s: &Series| {
            for b in &s.open {
                open.remove(&(p.bucket_end(b.idx), *id));
            }
        };
        let Some(t) = self.series.try_touch(&id, time, make, forget)? else { return Ok(Err(Skip::Filtered)) };
        let (s, evicted) = (t.state, t.evicted);
        let idx = time / p.aggregate_ns.max(1);
        let pos = match s.open.binary_search_by_key(&idx, |b| b.idx) {
            Ok(pos) => pos,
            Err(pos) => {
                self.open.insert((p.bucket_end(idx), id));
                s.open.insert(pos, Bucket::new(idx));
                pos
            }
        };
        s.open[pos].add(value);
        Ok(Ok(evicted))
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
        let p = self.params;
        let (stat, cap, agg) = (p.statistic, p.history, p.aggregate_ns.max(1));
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
        let n = self.series.expire_idle(watermark, |s| s.open.last().map(|b| p.bucket_end(b.idx)), |_, _| {});
        if n > 0 {
            tracing::debug!(evicted = n, watermark, "trend_forecast: evicted idle series");
        }
        n
    }

    /// Serializes the state (series sorted by id, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.series.snapshot(super::STATE_VERSION, &self.watermark, |_, s| SeriesRepr {
            meta: MetaRepr::from(&s.meta),
            open: s.open.clone(),
            history: s.history.clone(),
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let p = self.params;
        let mut open = BTreeSet::new();
        let (watermark, series) = self.series.restore(super::STATE_VERSION, bytes, |id, s: SeriesRepr| {
            if !s.history.is_valid() || s.open.windows(2).any(|w| w[0].idx >= w[1].idx) {
                return Err(RestoreError::Invalid("bucket order"));
            }
            for b in &s.open {
                open.insert((p.bucket_end(b.idx), *id));
            }
            Ok(Series { meta: s.meta.try_into()?, open: s.open, history: s.history })
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
    open: Vec<Bucket>,
    history: History,
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
