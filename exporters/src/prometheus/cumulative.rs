//! Prepares OTLP metrics for Prometheus (shared by both exporters): DELTA sums and histograms
//! become cumulative ones (start time = first seen), exponential histograms become classic
//! histograms, and what Prometheus cannot take is removed and counted.
//!
//! Delta rules, per series (resource, scope, metric name / unit / kind, point attributes):
//! - the first point starts the series: its start time (or its time when unset) is kept;
//! - a point whose start time is at or after the time of the last one (contiguous, or after a
//!   gap) is added to the running total;
//! - a point that overlaps the last one (start before its time: a restarted source) resets
//!   the series to that point;
//! - a point not newer than the last one (a duplicate or out of order) is dropped;
//! - histograms whose bounds change reset the series.
//!
//! State is bounded by `max_series` (new series beyond it are dropped and counted) and a series
//! not updated for `idle` (wall clock) is forgotten, so a later point starts it afresh.

use super::translate::{exponential_to_explicit, histogram_is_valid, value_string};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint, number_data_point,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::Xxh3;

const DELTA: i32 = AggregationTemporality::Delta as i32;
const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;
const UNSPECIFIED: i32 = AggregationTemporality::Unspecified as i32;

/// Running total of one delta series.
#[derive(Debug, Clone, PartialEq)]
enum Total {
    Int(i64),
    Double(f64),
    Histogram { count: u64, sum: Option<f64>, bounds: Vec<f64>, counts: Vec<u64>, min: Option<f64>, max: Option<f64> },
}

#[derive(Debug, Clone, PartialEq)]
struct State {
    start_ns: u64,
    time_ns: u64,
    total: Total,
    updated: Instant,
}

/// Undo log of one [`DeltaToCumulative::normalize`] call: the states it replaced.
#[derive(Debug, Default)]
pub struct Undo(Vec<(u128, Option<State>)>);

/// Delta → cumulative state and the other preparations (see the module doc).
#[derive(Debug)]
pub struct DeltaToCumulative {
    series: HashMap<u128, State>,
    max_series: usize,
    idle: Duration,
    last_sweep: Option<Instant>,
}

/// What one normalisation removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Points of metrics Prometheus cannot represent (empty name, unspecified temporality,
    /// no data) or malformed (histogram buckets that do not match their bounds).
    pub invalid: u64,
    /// Delta points older than, or as old as, the last one of their series.
    pub stale: u64,
    /// Delta points of new series refused because `max_series` were held.
    pub over_limit: u64,
}

impl Removed {
    /// All removed points.
    pub fn total(&self) -> u64 {
        self.invalid + self.stale + self.over_limit
    }
}

impl DeltaToCumulative {
    /// Empty state holding at most `max_series` delta series, each forgotten after `idle`.
    pub fn new(max_series: usize, idle: Duration) -> Self {
        DeltaToCumulative { series: HashMap::new(), max_series, idle, last_sweep: None }
    }

    /// Number of delta series held.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether no delta series is held.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Rewrites `req` in place (see the module doc); `now_ns` replaces a zero point time.
    pub fn normalize(&mut self, req: &mut ExportMetricsServiceRequest, now: Instant, now_ns: u64) -> (Removed, Undo) {
        self.sweep(now);
        let mut removed = Removed::default();
        let mut undo = Undo::default();
        for rm in &mut req.resource_metrics {
            let resource = rm.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
            for sm in &mut rm.scope_metrics {
                let (scope_name, scope_version) =
                    sm.scope.as_ref().map(|s| (s.name.clone(), s.version.clone())).unwrap_or_default();
                let mut base = Xxh3::new();
                hash_attrs(&mut base, &resource);
                hash_str(&mut base, &scope_name);
                hash_str(&mut base, &scope_version);
                for m in &mut sm.metrics {
                    let n = inferwatch_core::pdata::metric_point_count(m) as u64;
                    if m.name.is_empty() || !self.prepare(m, now_ns) {
                        removed.invalid += n;
                        m.data = None;
                        continue;
                    }
                    let mut h = base.clone();
                    hash_str(&mut h, &m.name);
                    hash_str(&mut h, &m.unit);
                    self.accumulate(m, &h, now, &mut removed, &mut undo);
                }
                sm.metrics.retain(|m| m.data.is_some());
            }
        }
        (removed, undo)
    }

    /// Restores the states an earlier [`DeltaToCumulative::normalize`] replaced (the payload it
    /// rewrote was not delivered and will be offered again).
    pub fn undo(&mut self, undo: Undo) {
        for (key, prev) in undo.0.into_iter().rev() {
            match prev {
                Some(s) => {
                    self.series.insert(key, s);
                }
                None => {
                    self.series.remove(&key);
                }
            }
        }
    }

    /// Converts exponential histograms, fills zero times, drops malformed histogram points;
    /// false when the whole metric must go.
    fn prepare(&self, m: &mut Metric, now_ns: u64) -> bool {
        if let Some(Data::ExponentialHistogram(e)) = &m.data {
            let h = Histogram {
                data_points: e.data_points.iter().map(exponential_to_explicit).collect(),
                aggregation_temporality: e.aggregation_temporality,
            };
            m.data = Some(Data::Histogram(h));
        }
        let fill = |t: &mut u64| {
            if *t == 0 {
                *t = now_ns;
            }
        };
        match &mut m.data {
            None => false,
            Some(Data::Gauge(g)) => {
                g.data_points.iter_mut().for_each(|p| fill(&mut p.time_unix_nano));
                true
            }
            Some(Data::Sum(s)) => {
                s.data_points.iter_mut().for_each(|p| fill(&mut p.time_unix_nano));
                s.aggregation_temporality != UNSPECIFIED
            }
            Some(Data::Histogram(h)) => {
                h.data_points.iter_mut().for_each(|p| fill(&mut p.time_unix_nano));
                h.aggregation_temporality != UNSPECIFIED
            }
            Some(Data::Summary(s)) => {
                s.data_points.iter_mut().for_each(|p| fill(&mut p.time_unix_nano));
                true
            }
            Some(Data::ExponentialHistogram(_)) => false,
        }
    }

    fn accumulate(&mut self, m: &mut Metric, h: &Xxh3, now: Instant, removed: &mut Removed, undo: &mut Undo) {
        match &mut m.data {
            Some(Data::Histogram(hist)) => {
                let before = hist.data_points.len();
                hist.data_points.retain(histogram_is_valid);
                removed.invalid += (before - hist.data_points.len()) as u64;
                if hist.aggregation_temporality != DELTA {
                    return;
                }
                let mut kept = Vec::with_capacity(hist.data_points.len());
                for mut p in std::mem::take(&mut hist.data_points) {
                    let key = series_key(h, b'h', &p.attributes);
                    if self.add(key, &mut Delta::Histogram(&mut p), now, removed, undo) {
                        kept.push(p);
                    }
                }
                hist.data_points = kept;
                hist.aggregation_temporality = CUMULATIVE;
            }
            Some(Data::Sum(sum)) if sum.aggregation_temporality == DELTA => {
                let kind = if sum.is_monotonic { b'c' } else { b'u' };
                let mut kept = Vec::with_capacity(sum.data_points.len());
                for mut p in std::mem::take(&mut sum.data_points) {
                    let key = series_key(h, kind, &p.attributes);
                    if self.add(key, &mut Delta::Number(&mut p), now, removed, undo) {
                        kept.push(p);
                    }
                }
                sum.data_points = kept;
                sum.aggregation_temporality = CUMULATIVE;
            }
            _ => {}
        }
    }

    /// Folds one delta point into its series and rewrites it as the cumulative value.
    /// False when the point is dropped.
    fn add(&mut self, key: u128, p: &mut Delta<'_>, now: Instant, removed: &mut Removed, undo: &mut Undo) -> bool {
        let (start, time) = p.times();
        let prev = self.series.get(&key).cloned();
        let next = match &prev {
            None => {
                if self.series.len() >= self.max_series {
                    removed.over_limit += 1;
                    return false;
                }
                State { start_ns: if start == 0 { time } else { start }, time_ns: time, total: p.total(), updated: now }
            }
            Some(s) if time <= s.time_ns => {
                removed.stale += 1;
                return false;
            }
            Some(s) if start != 0 && start < s.time_ns => {
                State { start_ns: start, time_ns: time, total: p.total(), updated: now }
            }
            Some(s) => match s.total.plus(&p.total()) {
                Some(total) => State { start_ns: s.start_ns, time_ns: time, total, updated: now },
                // Bounds changed: start again from this point.
                None => State {
                    start_ns: if start == 0 { time } else { start },
                    time_ns: time,
                    total: p.total(),
                    updated: now,
                },
            },
        };
        p.set(&next);
        self.series.insert(key, next);
        undo.0.push((key, prev));
        true
    }

    fn sweep(&mut self, now: Instant) {
        let every = (self.idle / 10).max(Duration::from_secs(1));
        if self.last_sweep.is_some_and(|t| now.saturating_duration_since(t) < every) {
            return;
        }
        self.last_sweep = Some(now);
        let idle = self.idle;
        self.series.retain(|_, s| now.saturating_duration_since(s.updated) < idle);
    }
}

/// A delta point being folded.
enum Delta<'a> {
    Number(&'a mut NumberDataPoint),
    Histogram(&'a mut HistogramDataPoint),
}

impl Delta<'_> {
    fn times(&self) -> (u64, u64) {
        match self {
            Delta::Number(p) => (p.start_time_unix_nano, p.time_unix_nano),
            Delta::Histogram(p) => (p.start_time_unix_nano, p.time_unix_nano),
        }
    }

    fn total(&self) -> Total {
        match self {
            Delta::Number(p) => match p.value {
                Some(number_data_point::Value::AsInt(i)) => Total::Int(i),
                Some(number_data_point::Value::AsDouble(d)) => Total::Double(d),
                None => Total::Int(0),
            },
            Delta::Histogram(p) => Total::Histogram {
                count: p.count,
                sum: p.sum,
                bounds: p.explicit_bounds.clone(),
                counts: p.bucket_counts.clone(),
                min: p.min,
                max: p.max,
            },
        }
    }

    fn set(&mut self, s: &State) {
        match (self, &s.total) {
            (Delta::Number(p), Total::Int(i)) => {
                p.start_time_unix_nano = s.start_ns;
                p.value = Some(number_data_point::Value::AsInt(*i));
            }
            (Delta::Number(p), Total::Double(d)) => {
                p.start_time_unix_nano = s.start_ns;
                p.value = Some(number_data_point::Value::AsDouble(*d));
            }
            (Delta::Histogram(p), Total::Histogram { count, sum, bounds, counts, min, max }) => {
                p.start_time_unix_nano = s.start_ns;
                p.count = *count;
                p.sum = *sum;
                p.explicit_bounds = bounds.clone();
                p.bucket_counts = counts.clone();
                p.min = *min;
                p.max = *max;
            }
            _ => {}
        }
    }
}

impl Total {
    /// `self + d`, or `None` when they cannot be added (histogram bounds differ).
    fn plus(&self, d: &Total) -> Option<Total> {
        Some(match (self, d) {
            (Total::Int(a), Total::Int(b)) => Total::Int(a.saturating_add(*b)),
            (Total::Int(a), Total::Double(b)) => Total::Double(*a as f64 + b),
            (Total::Double(a), Total::Int(b)) => Total::Double(a + *b as f64),
            (Total::Double(a), Total::Double(b)) => Total::Double(a + b),
            (
                Total::Histogram { count, sum, bounds, counts, min, max },
                Total::Histogram { count: c2, sum: s2, bounds: b2, counts: k2, min: mi2, max: ma2 },
            ) => {
                if bounds != b2 || counts.len() != k2.len() {
                    return None;
                }
                Total::Histogram {
                    count: count.saturating_add(*c2),
                    sum: match (sum, s2) {
                        (Some(a), Some(b)) => Some(a + b),
                        _ => None,
                    },
                    bounds: bounds.clone(),
                    counts: counts.iter().zip(k2).map(|(a, b)| a.saturating_add(*b)).collect(),
                    min: pick(*min, *mi2, f64::min),
                    max: pick(*max, *ma2, f64::max),
                }
            }
            _ => return None,
        })
    }
}

fn pick(a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(f(x, y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn hash_str(h: &mut Xxh3, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

fn hash_attrs(h: &mut Xxh3, attrs: &[KeyValue]) {
    let mut sorted: Vec<(&str, String)> =
        attrs.iter().map(|kv| (kv.key.as_str(), value_string(kv.value.as_ref()))).collect();
    sorted.sort();
    h.update(&(sorted.len() as u64).to_le_bytes());
    for (k, v) in sorted {
        hash_str(h, k);
        hash_str(h, &v);
    }
}

fn series_key(base: &Xxh3, kind: u8, attrs: &[KeyValue]) -> u128 {
    let mut h = base.clone();
    h.update(&[kind]);
    hash_attrs(&mut h, attrs);
    h.digest128()
}
