//! The state of `peer_outlier`: per replica series (metric, group, replica) its open tumbling
//! windows, its streak of windows worse than its peers and where its output goes, held in the
//! kit's ordered [`OrderedSeriesMap`] (a group's replicas are adjacent, read by one range scan
//! when a window closes), with an index of the groups' open windows by end.

use super::STATE_VERSION;
use super::stats::Status;
use crate::detect::series::{MetaRepr, OrderedSeriesMap, RestoreError, SeriesMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A replica series: metric, group values (`group_by` order), replica.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// Metric name.
    pub metric: String,
    /// Values of the `group_by` attributes ("" when missing).
    pub group: Vec<String>,
    /// The replica (value of the replica attribute).
    pub replica: String,
}

/// A window's points of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Acc {
    /// Inclusive start, ns since the epoch (a multiple of the window).
    pub start: u64,
    /// Sum of the values.
    pub sum: f64,
    /// Points.
    pub count: u64,
    /// Value of the latest point (largest event time; ties: the later arrival).
    pub last: f64,
    /// Event time of `last`.
    pub last_time: u64,
}

/// How a replica's window becomes one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// Mean of the window's points.
    Mean,
    /// The latest point of the window.
    Last,
}

impl Acc {
    /// The window's value.
    pub fn value(&self, how: Aggregate) -> f64 {
        match how {
            Aggregate::Mean => self.sum / self.count as f64,
            Aggregate::Last => self.last,
        }
    }
}

/// One replica series.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// Resource and scope of its first point (where its output goes).
    pub meta: SeriesMeta,
    /// Name of the attribute that named the replica (`service.instance.id`, ...).
    pub replica_attribute: String,
    /// Open windows, by start.
    pub windows: Vec<Acc>,
    /// Its status after the window ending at `last_end`.
    pub status: Status,
    /// End of the latest window it was judged in (0: never).
    pub last_end: u64,
    /// Smoothed relative scale of its peers (their `scale_spread` / |median|, an EWMA; NaN: none yet).
    pub rel_scale: f64,
}

/// [`Replica`] in checkpoints.
#[derive(Serialize, Deserialize)]
struct ReplicaRepr {
    meta: MetaRepr,
    replica_attribute: String,
    windows: Vec<Acc>,
    status: Status,
    last_end: u64,
    rel_scale: f64,
}

/// A group's window: (end, metric, group values).
pub type GroupWindow = (u64, String, Vec<String>);

/// Every replica series and the open windows of the groups.
pub struct State {
    window_ns: u64,
    series: OrderedSeriesMap<Key, Replica>,
    open: BTreeSet<GroupWindow>,
    watermark: u64,
}

/// Why a point was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its window is already closed.
    Late,
    /// A new series the caller did not make (not counted).
    NotMade,
}

impl State {
    /// An empty state of windows `window_ns` (> 0), at most `max_series`, forgetting a series
    /// after `idle_ns` of event time without a point.
    pub fn new(window_ns: u64, max_series: usize, idle_ns: u64) -> Self {
        State { window_ns, series: OrderedSeriesMap::new(max_series, idle_ns), open: BTreeSet::new(), watermark: 0 }
    }

    /// Number of replica series held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The replica series `key`, if held.
    pub fn get(&self, key: &Key) -> Option<&Replica> {
        self.series.get(key)
    }

    /// Bytes held, estimated.
    pub fn approx_bytes(&self) -> usize {
        self.series.approx_bytes(|r| {
            r.meta.heap_bytes() + r.windows.capacity() * std::mem::size_of::<Acc>() + r.replica_attribute.len()
        }) + self
            .open
            .iter()
            .map(|(_, m, g)| 64 + m.len() + g.iter().map(|s| 24 + s.len()).sum::<usize>())
            .sum::<usize>()
    }

    /// Adds a point of series `key` at `time`; a new series is made by `make` (`Ok(None)`: not
    /// made). Returns the series evicted at `max_series` to make room.
    pub fn add<E>(
        &mut self,
        key: &Key,
        time: u64,
        value: f64,
        make: impl FnOnce() -> Result<Option<Replica>, E>,
    ) -> Result<Result<usize, Skip>, E> {
        let w = self.window_ns;
        let start = time - time % w;
        let end = start.saturating_add(w);
        if end <= self.watermark {
            return Ok(Err(Skip::Late));
        }
        let Some(t) = self.series.try_touch(key, time, make, |_, _| {})? else { return Ok(Err(Skip::NotMade)) };
        let evicted = t.evicted;
        let r = t.state;
        let i = match r.windows.binary_search_by_key(&start, |a| a.start) {
            Ok(i) => i,
            Err(i) => {
                r.windows.insert(i, Acc { start, sum: 0.0, count: 0, last: value, last_time: time });
                i
            }
        };
        if let Some(a) = r.windows.get_mut(i) {
            a.sum += value;
            a.count += 1;
            if time >= a.last_time {
                a.last = value;
                a.last_time = time;
            }
        }
        if !self.open.contains(&(end, key.metric.clone(), key.group.clone())) {
            self.open.insert((end, key.metric.clone(), key.group.clone()));
        }
        Ok(Ok(evicted))
    }

    /// Closes every group window ending at or before `watermark`, in (end, metric, group) order:
    /// `judge` gets the group window and its replicas with a value in it (key, replica, window
    /// value, in replica order) and returns each one's new status and smoothed relative scale
    /// (same order); the windows are
    /// then dropped. Afterwards (unless `watermark` is the end of input) idle series are
    /// forgotten; returns how many.
    pub fn close_until(
        &mut self,
        watermark: u64,
        how: Aggregate,
        mut judge: impl FnMut(&GroupWindow, &[(&Key, &Replica, f64)]) -> Vec<(Status, f64)>,
    ) -> usize {
        if watermark <= self.watermark {
            return 0;
        }
        self.watermark = watermark;
        let w = self.window_ns;
        while let Some(first) = self.open.first() {
            if first.0 > watermark {
                break;
            }
            let Some(gw) = self.open.pop_first() else { break };
            let start = gw.0.saturating_sub(w);
            let from = Key { metric: gw.1.clone(), group: gw.2.clone(), replica: String::new() };
            let members: Vec<(&Key, &Replica, f64)> = self
                .series
                .range(from..)
                .take_while(|(k, _)| k.metric == gw.1 && k.group == gw.2)
                .filter_map(|(k, s)| {
                    let r = &s.state;
                    let a = r.windows.iter().find(|a| a.start == start)?;
                    Some((k, r, a.value(how)))
                })
                .collect();
            if members.is_empty() {
                continue;
            }
            let streaks = judge(&gw, &members);
            let keys: Vec<Key> = members.iter().map(|(k, _, _)| (*k).clone()).collect();
            for (k, (status, rel_scale)) in keys.iter().zip(streaks) {
                if let Some(r) = self.series.get_mut(k) {
                    r.status = status;
                    r.rel_scale = rel_scale;
                    r.last_end = gw.0;
                    r.windows.retain(|a| a.start != start);
                }
            }
        }
        if watermark == u64::MAX {
            return 0;
        }
        self.series.expire_idle(watermark, |r| r.windows.first().map(|a| a.start.saturating_add(w)), |_, _| {})
    }

    /// Serializes the state (series in key order: equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let header = (self.window_ns, self.watermark);
        self.series.snapshot(STATE_VERSION, &header, |_, r| ReplicaRepr {
            meta: MetaRepr::from(&r.meta),
            replica_attribute: r.replica_attribute.clone(),
            windows: r.windows.clone(),
            status: r.status,
            last_end: r.last_end,
            rel_scale: r.rel_scale,
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let w = self.window_ns;
        let ((window_ns, watermark), series): ((u64, u64), _) =
            self.series.restore(STATE_VERSION, bytes, |_, r: ReplicaRepr| {
                let meta = SeriesMeta::try_from(r.meta)?;
                Ok(Replica {
                    meta,
                    replica_attribute: r.replica_attribute,
                    windows: r.windows,
                    status: r.status,
                    last_end: r.last_end,
                    rel_scale: r.rel_scale,
                })
            })?;
        if window_ns != w {
            return Err(RestoreError::Params { what: "window", found: window_ns, expected: w });
        }
        let mut open = BTreeSet::new();
        for (k, slot) in series.iter() {
            let r = &slot.state;
            let mut prev: Option<u64> = None;
            for a in &r.windows {
                let ok = a.start.is_multiple_of(w)
                    && a.start.saturating_add(w) > watermark
                    && a.count > 0
                    && a.sum.is_finite()
                    && a.last.is_finite()
                    && prev.is_none_or(|p| p < a.start)
                    && a.last_time >= a.start
                    && a.last_time - a.start < w;
                if !ok {
                    return Err(RestoreError::Invalid("window"));
                }
                prev = Some(a.start);
                open.insert((a.start.saturating_add(w), k.metric.clone(), k.group.clone()));
            }
            let scale_ok = r.rel_scale.is_nan() || (r.rel_scale.is_finite() && r.rel_scale >= 0.0);
            let evidence_ok = r.status.evidence.is_finite() && r.status.evidence >= 0.0;
            if r.last_end > watermark || (r.status != Status::default() && r.last_end == 0) || !scale_ok || !evidence_ok
            {
                return Err(RestoreError::Invalid("streak"));
            }
        }
        self.series = series;
        self.open = open;
        self.watermark = watermark;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 60;

    fn st(streak: u32) -> Status {
        Status { streak, ..Status::default() }
    }

    fn key(r: &str) -> Key {
        Key { metric: "m".into(), group: vec!["g".into()], replica: r.into() }
    }

    fn make(r: &str) -> impl FnOnce() -> Result<Option<Replica>, ()> + '_ {
        move || {
            Ok(Some(Replica {
                meta: SeriesMeta { metric: "m".into(), ..Default::default() },
                replica_attribute: r.into(),
                windows: Vec::new(),
                status: Status::default(),
                last_end: 0,
                rel_scale: f64::NAN,
            }))
        }
    }

    #[test]
    fn windows_close_per_group_with_each_replicas_value() {
        let mut s = State::new(W, 100, 10 * W);
        for (r, t, v) in [("a", 1, 1.0), ("a", 2, 3.0), ("b", 5, 4.0), ("a", 61, 9.0)] {
            assert_eq!(s.add(&key(r), t, v, make(r)).unwrap(), Ok(0));
        }
        let mut seen = Vec::new();
        s.close_until(60, Aggregate::Mean, |gw, m| {
            seen.push((gw.0, m.iter().map(|(k, _, v)| (k.replica.clone(), *v)).collect::<Vec<_>>()));
            vec![(st(1), 0.1); m.len()]
        });
        assert_eq!(seen, vec![(60, vec![("a".to_string(), 2.0), ("b".to_string(), 4.0)])]);
        assert_eq!(s.get(&key("a")).map(|r| (r.status.streak, r.last_end, r.windows.len())), Some((1, 60, 1)));
        // Late: the window [0, 60) is closed.
        assert_eq!(s.add(&key("a"), 59, 1.0, make("a")).unwrap(), Err(Skip::Late));
        let mut last = Vec::new();
        s.close_until(120, Aggregate::Last, |_, m| {
            last.extend(m.iter().map(|(_, _, v)| *v));
            vec![(st(0), 0.1); m.len()]
        });
        assert_eq!(last, vec![9.0]);
    }

    #[test]
    fn snapshot_round_trips_and_refuses_another_window() {
        let mut s = State::new(W, 100, 10 * W);
        s.add(&key("a"), 1, 1.0, make("a")).unwrap().unwrap();
        s.add(&key("b"), 70, 2.0, make("b")).unwrap().unwrap();
        s.close_until(60, Aggregate::Mean, |_, m| vec![(st(2), 0.1); m.len()]);
        let bytes = s.snapshot().unwrap();
        let mut t = State::new(W, 100, 10 * W);
        t.restore(&bytes).unwrap();
        assert_eq!(t.snapshot().unwrap(), bytes);
        assert_eq!(t.get(&key("a")).map(|r| r.status.streak), Some(2));
        let mut other = State::new(2 * W, 100, 10 * W);
        assert!(matches!(other.restore(&bytes), Err(RestoreError::Params { what: "window", .. })));
        assert_eq!(other.series_count(), 0);
        assert!(t.restore(&bytes[..bytes.len() - 3]).is_err());
        assert_eq!(t.series_count(), 2);
    }
}
