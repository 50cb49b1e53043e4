//! Per-group state of `llm_signals`: open windows, cumulative histograms, previous scraped
//! points; closing on the watermark, eviction, and the checkpoint form.
//!
//! Time is event time only. A span or sample at `t` belongs to window `[k·w, (k+1)·w)` and to
//! flush interval `[j·f, (j+1)·f)`; a window is emitted when the watermark reaches its end, a
//! cumulative histogram at flush boundary `b` holds exactly the requests with `t < b`.

use super::hist::{FixedHist, Lat, window_quantile};
use super::input::{self, InputBucketWindow, InputSplit};
use super::model::GroupKey;
use super::output::{Emitter, Out, Pct, Value};
use super::quality::{QStat, Qual, score};
use super::scraped::{GaugeRole, HistPoint, RateRole, Role, Sample, SampleValue};
use super::spans::Request;
use crate::detect::series::OrderedSeriesMap;
pub use crate::detect::series::RestoreError;
use crate::detect::sketch::DdSketch;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

/// `llm.prefix_cache.low` is 1 below this hit rate (the study flags < 62 %; docs/llm-signals.md).
pub const PREFIX_HIT_RATE_LOW: f64 = 0.62;
/// `llm.queue.blocking` is 1 when the window's queue-time p99 exceeds this (800 ms; docs/llm-signals.md).
pub const QUEUE_BLOCKING_P99_S: f64 = 0.8;
/// Most scraped series tracked per group; further ones are ignored (and counted as evicted).
pub const MAX_SCRAPE_SERIES_PER_GROUP: usize = 4096;

/// Parameters of the state (from the configuration; not checkpointed except window and flush).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Window length, ns (> 0).
    pub window_ns: u64,
    /// Flush interval of the cumulative histograms, ns (> 0).
    pub flush_ns: u64,
    /// Idle timeout, ns of event time.
    pub idle_ns: u64,
    /// Most groups held.
    pub max_series: usize,
    /// DDSketch relative accuracy.
    pub alpha: f64,
}

/// Why an input was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its event time is before the watermark.
    Late,
    /// Its group holds too many scraped series already.
    SeriesFull,
}

/// Aggregates of one span window of one group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct SpanWindow {
    count: u64,
    errors: u64,
    output_tokens: f64,
    input_tokens: f64,
    has_output: bool,
    has_input: bool,
    /// Largest event time in the window.
    last_time: u64,
    sketches: [Option<DdSketch>; 4],
    /// Quality values (TLE, RCI), [`Qual`] order.
    quality: [Option<DdSketch>; 2],
    /// The prompt-length buckets (`input_buckets`; empty until a request carries a prompt length).
    by_input: Vec<InputBucketWindow>,
}

/// Histogram increments of one flush interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Pending {
    hists: [FixedHist; 4],
    last_time: u64,
}

fn empty_hists() -> [FixedHist; 4] {
    Lat::ALL.map(|l| FixedHist::new(l.bounds()))
}

fn request_value(r: &Request, lat: Lat) -> Option<f64> {
    match lat {
        Lat::Ttft => r.ttft,
        Lat::Tpot => r.tpot,
        Lat::E2e => r.e2e,
        Lat::Queue => r.queue,
        Lat::Itl => None,
    }
}

/// Window start of `t` for length `len`.
fn floor(t: u64, len: u64) -> u64 {
    t - t % len
}

/// Span-derived state of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpanState {
    /// Smallest event time seen: start time of the cumulative histograms.
    first_seen: u64,
    windows: BTreeMap<u64, SpanWindow>,
    hists: [FixedHist; 4],
    /// Increments by flush-interval end.
    pending: BTreeMap<u64, Pending>,
    /// Largest event time of the windows closed so far (zero windows follow it for idle_timeout).
    last_window_data: Option<u64>,
    /// Largest event time merged into `hists` (re-emission follows it for idle_timeout).
    last_flush_data: Option<u64>,
    has_output: bool,
    has_input: bool,
}

impl SpanState {
    fn new(first_seen: u64) -> Self {
        SpanState {
            first_seen,
            windows: BTreeMap::new(),
            hists: empty_hists(),
            pending: BTreeMap::new(),
            last_window_data: None,
            last_flush_data: None,
            has_output: false,
            has_input: false,
        }
    }

    fn add(&mut self, t: u64, req: &Request, p: &Params, split: &InputSplit) {
        self.first_seen = self.first_seen.min(t);
        let win = self.windows.entry(floor(t, p.window_ns)).or_default();
        win.count += 1;
        win.errors += u64::from(req.error);
        win.last_time = win.last_time.max(t);
        if let Some(o) = req.output_tokens {
            win.output_tokens += o;
            win.has_output = true;
            self.has_output = true;
        }
        if let Some(i) = req.input_tokens {
            win.input_tokens += i;
            win.has_input = true;
            self.has_input = true;
        }
        for (q, v) in [(Qual::Tle, req.tle), (Qual::Rci, req.rci)] {
            if let Some(v) = v {
                win.quality[q.index()].get_or_insert_with(|| input::new_sketch(p.alpha)).add(v);
            }
        }
        input::add(split, &mut win.by_input, req.input_tokens, |lat| request_value(req, lat), p.alpha);
        let flush_end = floor(t, p.flush_ns).saturating_add(p.flush_ns);
        for lat in Lat::ALL {
            let Some(v) = request_value(req, lat) else { continue };
            win.sketches[lat.index()].get_or_insert_with(|| input::new_sketch(p.alpha)).add(v);
            let pending =
                self.pending.entry(flush_end).or_insert_with(|| Pending { hists: empty_hists(), last_time: 0 });
            pending.hists[lat.index()].add(lat.bounds(), v);
            pending.last_time = pending.last_time.max(t);
        }
    }

    /// Emits the windows ending and the flushes due in (prev, wm]. Zero windows (no request)
    /// and unchanged histograms are emitted while within idle_timeout of the last data, except
    /// at the end of input.
    fn close(&mut self, attrs: &[KeyValue], prev: u64, wm: u64, p: &Params, split: &InputSplit, em: &mut Emitter) {
        let end_of_input = wm == u64::MAX;
        let (w, f) = (p.window_ns, p.flush_ns);
        let mut e = floor(prev, w).saturating_add(w);
        while e <= wm && e > prev {
            let s = e - w;
            if let Some(win) = self.windows.remove(&s) {
                self.last_window_data = Some(self.last_window_data.unwrap_or(0).max(win.last_time));
                self.emit_window(attrs, s, e, Some(&win), p, em);
                input::emit(split, attrs, s, e, &win.by_input, em);
            } else if !end_of_input && self.last_window_data.is_some_and(|d| e <= d.saturating_add(p.idle_ns)) {
                self.emit_window(attrs, s, e, None, p, em);
            } else {
                // Jump to the next window holding data.
                match self.windows.range(s..).next() {
                    Some((&next, _)) => e = next.saturating_add(w),
                    None => break,
                }
                continue;
            }
            match e.checked_add(w) {
                Some(n) => e = n,
                None => break,
            }
        }
        let mut b = floor(prev, f).saturating_add(f);
        while b <= wm && b > prev {
            let due: Vec<u64> = self.pending.range(..=b).map(|(k, _)| *k).collect();
            let had_data = !due.is_empty();
            for k in due {
                if let Some(d) = self.pending.remove(&k) {
                    for (h, inc) in self.hists.iter_mut().zip(&d.hists) {
                        h.merge(inc);
                    }
                    self.last_flush_data = Some(self.last_flush_data.unwrap_or(0).max(d.last_time));
                }
            }
            let alive = !end_of_input && self.last_flush_data.is_some_and(|d| b <= d.saturating_add(p.idle_ns));
            if had_data || alive {
                for lat in Lat::ALL {
                    let h = &self.hists[lat.index()];
                    if h.count > 0 {
                        em.push(Out::Hist(lat), self.first_seen, b, attrs, Value::Hist(lat.bounds(), h.clone()));
                    }
                }
                match b.checked_add(f) {
                    Some(n) => b = n,
                    None => break,
                }
            } else {
                match self.pending.keys().next() {
                    Some(&next) => b = next,
                    None => break,
                }
            }
        }
    }

    fn emit_window(&self, attrs: &[KeyValue], s: u64, e: u64, win: Option<&SpanWindow>, p: &Params, em: &mut Emitter) {
        let secs = p.window_ns as f64 / 1e9;
        let count = win.map_or(0, |w| w.count);
        em.push(Out::RequestsFinished, s, e, attrs, Value::Int(i64::try_from(count).unwrap_or(i64::MAX)));
        em.push(Out::RequestRate, s, e, attrs, Value::Double(count as f64 / secs));
        let (out_tokens, in_tokens) = match win {
            Some(w) => {
                if w.count > 0 {
                    em.push(Out::ErrorRate, s, e, attrs, Value::Double(w.errors as f64 / w.count as f64));
                }
                (w.has_output.then_some(w.output_tokens), w.has_input.then_some(w.input_tokens))
            }
            None => (self.has_output.then_some(0.0), self.has_input.then_some(0.0)),
        };
        if let Some(o) = out_tokens {
            em.push(Out::TokensOutput, s, e, attrs, Value::Double(o / secs));
        }
        if let Some(i) = in_tokens {
            em.push(Out::TokensInput, s, e, attrs, Value::Double(i / secs));
        }
        let Some(win) = win else { return };
        for lat in Lat::ALL {
            let Some(sk) = win.sketches[lat.index()].as_ref().filter(|s| s.count() > 0) else { continue };
            em.push_percentiles(sk, s, e, attrs, |pct| Out::Pct(lat, pct));
            if lat == Lat::Queue
                && let Some(p99) = sk.quantile(Pct::P99.quantile())
            {
                em.push(Out::QueueBlocking, s, e, attrs, Value::Int(i64::from(p99 > QUEUE_BLOCKING_P99_S)));
            }
        }
        for q in Qual::ALL {
            let Some(sk) = win.quality[q.index()].as_ref().filter(|s| s.count() > 0) else { continue };
            emit_quality(attrs, s, e, q, sk.quantile(0.5), sk.mean(), em);
        }
    }

    fn drained(&self) -> bool {
        self.windows.is_empty() && self.pending.is_empty()
    }

    fn is_valid(&self) -> bool {
        let shaped = |h: &[FixedHist; 4]| Lat::ALL.iter().all(|l| h[l.index()].counts.len() == l.bounds().len() + 1);
        shaped(&self.hists) && self.pending.values().all(|p| shaped(&p.hists))
    }
}

/// The previous point of a scraped series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SeriesPrev {
    time: u64,
    /// Start time when meaningful (0 < start < time), else 0.
    start: u64,
    value: f64,
    hist: Option<HistPoint>,
}

/// Aggregates of one scrape window of one group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct ScrapeWindow {
    /// Last value per gauge series: (time, value).
    gauges: BTreeMap<(GaugeRole, u64), (u64, f64)>,
    /// Increase and the time it covers (ns) per counter series.
    rates: BTreeMap<(RateRole, u64), (f64, u64)>,
    /// Summed increases per latency signal.
    hists: BTreeMap<Lat, WindowHist>,
    /// Summed increases per quality signal (the bench's TLE and RCI histograms).
    quality: BTreeMap<Qual, WindowHist>,
}

/// The quality outputs of one window: p50, mean and, for RCI, the score 1 − mean.
fn emit_quality(attrs: &[KeyValue], s: u64, e: u64, q: Qual, p50: Option<f64>, mean: Option<f64>, em: &mut Emitter) {
    for (stat, v) in [(QStat::P50, p50), (QStat::Mean, mean)] {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            em.push(Out::Quality(q, stat), s, e, attrs, Value::Double(v));
        }
    }
    if q == Qual::Rci
        && let Some(m) = mean.filter(|m| m.is_finite())
    {
        em.push(Out::QualityScore, s, e, attrs, Value::Double(score(m)));
    }
}

/// Adds `new`, a window increase of one series, to the group's window histogram of its signal:
/// a signal's own family replaces a fallback, a fallback beside its own family is not read,
/// histograms of one kind and equal bounds are summed (other bounds: skipped, logged).
fn merge_window_hist(slot: Entry<'_, impl Ord, WindowHist>, new: WindowHist, series: u64) {
    match slot {
        Entry::Vacant(v) => {
            v.insert(new);
        }
        Entry::Occupied(mut o) => {
            let w = o.get_mut();
            if w.fallback && !new.fallback {
                *w = new; // the signal's own family wins over a fallback
            } else if w.fallback != new.fallback {
                // a fallback family beside the signal's own: not read
            } else if w.bounds == new.bounds {
                w.counts.iter_mut().zip(&new.counts).for_each(|(c, b)| *c += b);
                w.sum += new.sum;
            } else {
                tracing::debug!(series, "llm_signals: histogram bounds differ in a group");
            }
        }
    }
}

/// The summed increases of a group's histograms of one latency signal in one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct WindowHist {
    bounds: Vec<f64>,
    /// Per-bucket increases (`bounds.len() + 1`).
    counts: Vec<u64>,
    /// Increase of the sums.
    sum: f64,
    /// From a [`Role::LatencyFallback`] family (replaced by a [`Role::Latency`] one).
    fallback: bool,
}

/// Scrape-derived state of a group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct ScrapeState {
    series: BTreeMap<u64, SeriesPrev>,
    windows: BTreeMap<u64, ScrapeWindow>,
}

/// The increase since the previous point and the ns it covers (`time > prev.time`). After a reset
/// (a lower value, a later start time, or `reset_other`) the counter counted from 0 somewhere in
/// the interval, so the increase is the new value, over the whole interval (as Prometheus'
/// `rate`; a reset's start time may be synthetic, e.g. the receiver's `time − 1 ms`).
fn increase(prev: &SeriesPrev, time: u64, start: u64, value: f64, reset_other: bool) -> (f64, u64) {
    let restarted = start != 0 && prev.start != 0 && start > prev.start;
    let reset = reset_other || value < prev.value || restarted;
    (if reset { value } else { value - prev.value }, time - prev.time)
}

impl ScrapeState {
    fn add(&mut self, s: Sample, p: &Params) -> Result<(), Skip> {
        let ws = floor(s.time, p.window_ns);
        let start = if s.start > 0 && s.start < s.time { s.start } else { 0 };
        if let (Role::Gauge(g), SampleValue::Number(v)) = (s.role, &s.value) {
            let slot = self.windows.entry(ws).or_default().gauges.entry((g, s.series)).or_insert((0, *v));
            if s.time >= slot.0 {
                *slot = (s.time, *v);
            }
            return Ok(());
        }
        let full = self.series.len() >= MAX_SCRAPE_SERIES_PER_GROUP;
        let prev = match self.series.entry(s.series) {
            Entry::Vacant(v) => {
                if full {
                    return Err(Skip::SeriesFull);
                }
                // An OTLP push with its start time (the bench's quality histograms, whose first
                // export already holds data): it counted from zero at `start`.
                let zero = match (s.role, &s.value) {
                    (Role::Quality(_), SampleValue::Hist(h)) if start != 0 => Some(HistPoint {
                        bounds: h.bounds.clone(),
                        counts: vec![0; h.counts.len()],
                        count: 0,
                        sum: 0.0,
                    }),
                    _ => None,
                };
                if let Some(zero) = zero {
                    v.insert(SeriesPrev { time: start, start, value: 0.0, hist: Some(zero) })
                } else {
                    let (value, hist) = match s.value {
                        SampleValue::Number(v) => (v, None),
                        SampleValue::Hist(h) => (h.sum, Some(h)),
                    };
                    v.insert(SeriesPrev { time: s.time, start, value, hist });
                    return Ok(());
                }
            }
            Entry::Occupied(o) => o.into_mut(),
        };
        if s.time <= prev.time {
            return Ok(()); // a repeated or out-of-order point adds nothing
        }
        match (s.role, s.value) {
            (Role::Counter(r), SampleValue::Number(v)) => {
                let inc = increase(prev, s.time, start, v, false);
                *prev = SeriesPrev { time: s.time, start, value: v, hist: None };
                add_rate(self.windows.entry(ws).or_default(), r, s.series, inc);
            }
            (
                role @ (Role::Latency(_) | Role::LatencyFallback(_) | Role::HistSum(_) | Role::Quality(_)),
                SampleValue::Hist(h),
            ) => {
                let Some(old) = prev.hist.take().filter(|o| o.bounds == h.bounds) else {
                    // First histogram point of this shape: a new baseline.
                    *prev = SeriesPrev { time: s.time, start, value: h.sum, hist: Some(h) };
                    return Ok(());
                };
                let decreased = h.count < old.count || h.counts.iter().zip(&old.counts).any(|(n, o)| n < o);
                let restarted = start != 0 && prev.start != 0 && start > prev.start;
                let (sum_inc, dt) = increase(prev, s.time, start, h.sum, decreased || restarted);
                let buckets: Vec<u64> = if decreased || restarted {
                    h.counts.clone()
                } else {
                    h.counts.iter().zip(&old.counts).map(|(n, o)| n - o).collect()
                };
                let win = self.windows.entry(ws).or_default();
                match role {
                    Role::Latency(_) | Role::LatencyFallback(_) => {
                        for (lat, fallback) in role.targets() {
                            let new = WindowHist {
                                bounds: h.bounds.clone(),
                                counts: buckets.clone(),
                                sum: sum_inc,
                                fallback,
                            };
                            merge_window_hist(win.hists.entry(lat), new, s.series);
                        }
                    }
                    Role::Quality(q) => {
                        let new =
                            WindowHist { bounds: h.bounds.clone(), counts: buckets, sum: sum_inc, fallback: false };
                        merge_window_hist(win.quality.entry(q), new, s.series);
                    }
                    Role::HistSum(r) => add_rate(win, r, s.series, (sum_inc, dt)),
                    _ => {}
                }
                *prev = SeriesPrev { time: s.time, start, value: h.sum, hist: Some(h) };
            }
            _ => {}
        }
        Ok(())
    }

    fn close(&mut self, attrs: &[KeyValue], wm: u64, p: &Params, em: &mut Emitter) {
        let w = p.window_ns;
        if let Some(limit) = wm.checked_sub(w) {
            let due: Vec<u64> = self.windows.range(..=limit).map(|(k, _)| *k).collect();
            for s in due {
                if let Some(win) = self.windows.remove(&s) {
                    emit_scrape_window(attrs, s, s + w, &win, em);
                }
            }
        }
        self.series.retain(|_, prev| prev.time.saturating_add(p.idle_ns) > wm);
    }

    fn is_valid(&self) -> bool {
        self.series.values().all(|s| s.hist.as_ref().is_none_or(HistPoint::is_valid))
            && self
                .windows
                .values()
                .all(|w| w.hists.values().chain(w.quality.values()).all(|h| h.counts.len() == h.bounds.len() + 1))
    }
}

fn add_rate(win: &mut ScrapeWindow, role: RateRole, series: u64, (inc, dt): (f64, u64)) {
    if !inc.is_finite() || inc < 0.0 || dt == 0 {
        return;
    }
    let slot = win.rates.entry((role, series)).or_insert((0.0, 0));
    slot.0 += inc;
    slot.1 += dt;
}

/// Σ over the series of `role` of increase / covered seconds; `None` when no series of it.
fn rate(win: &ScrapeWindow, role: RateRole) -> Option<f64> {
    let mut any = false;
    let mut total = 0.0;
    for (_, (inc, dt)) in win.rates.iter().filter(|((r, _), _)| *r == role) {
        any = true;
        total += inc / (*dt as f64 / 1e9);
    }
    any.then_some(total)
}

fn emit_scrape_window(attrs: &[KeyValue], s: u64, e: u64, win: &ScrapeWindow, em: &mut Emitter) {
    let gauge = |role: GaugeRole| win.gauges.iter().filter(move |((r, _), _)| *r == role).map(|(_, (_, v))| *v);
    if let Some(kv) =
        gauge(GaugeRole::KvUsage).reduce(f64::max).or_else(|| gauge(GaugeRole::KvUsageLegacy).reduce(f64::max))
    {
        em.push(Out::KvUsage, s, e, attrs, Value::Double(kv));
    }
    for (role, out) in [(GaugeRole::Waiting, Out::Waiting), (GaugeRole::Running, Out::Running)] {
        if let Some(v) = gauge(role).reduce(|a, b| a + b) {
            em.push(out, s, e, attrs, Value::Double(v));
        }
    }
    let (ok, err, other) =
        (rate(win, RateRole::RequestsOk), rate(win, RateRole::RequestsErr), rate(win, RateRole::RequestsOther));
    // Every request: SGLang's own counter, else the sum of the outcomes (vLLM, TGI).
    let all = rate(win, RateRole::RequestsAll).or_else(|| {
        (ok.is_some() || err.is_some() || other.is_some())
            .then(|| ok.unwrap_or(0.0) + err.unwrap_or(0.0) + other.unwrap_or(0.0))
    });
    if let Some(all) = all {
        em.push(Out::RequestRate, s, e, attrs, Value::Double(all));
        if all > 0.0 {
            em.push(Out::ErrorRate, s, e, attrs, Value::Double((err.unwrap_or(0.0) / all).min(1.0)));
        }
    }
    for (role, out) in [
        (RateRole::OutputTokens, Out::TokensOutput),
        (RateRole::InputTokens, Out::TokensInput),
        (RateRole::Preemptions, Out::PreemptionRate),
    ] {
        if let Some(v) = rate(win, role) {
            em.push(out, s, e, attrs, Value::Double(v));
        }
    }
    let counted = match (rate(win, RateRole::PrefixHits), rate(win, RateRole::PrefixQueries)) {
        (Some(hits), Some(queries)) if queries > 0.0 => Some(hits / queries),
        _ => None,
    };
    // Else a hit-rate gauge (SGLang, vLLM V0), the mean over the group's series; V0's −1 (off) is skipped.
    let gauged = || {
        let v: Vec<f64> = gauge(GaugeRole::PrefixHitRate).filter(|v| (0.0..=1.0).contains(v)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    if let Some(hit_rate) = counted.or_else(gauged) {
        em.push(Out::PrefixHitRate, s, e, attrs, Value::Double(hit_rate));
        em.push(Out::PrefixLow, s, e, attrs, Value::Int(i64::from(hit_rate < PREFIX_HIT_RATE_LOW)));
    }
    for (lat, h) in &win.hists {
        let quantile = |q: f64| window_quantile(q, &h.bounds, &h.counts, Some(h.sum));
        for pct in Pct::ALL {
            if let Some(v) = quantile(pct.quantile()) {
                em.push(Out::Pct(*lat, pct), s, e, attrs, Value::Double(v));
            }
        }
        if *lat == Lat::Queue
            && let Some(p99) = quantile(Pct::P99.quantile())
        {
            em.push(Out::QueueBlocking, s, e, attrs, Value::Int(i64::from(p99 > QUEUE_BLOCKING_P99_S)));
        }
    }
    for (q, h) in &win.quality {
        let n: u64 = h.counts.iter().sum();
        if n == 0 {
            continue;
        }
        let p50 = window_quantile(0.5, &h.bounds, &h.counts, Some(h.sum));
        emit_quality(attrs, s, e, *q, p50, Some(h.sum / n as f64), em);
    }
}

/// What a group holds, by source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum GroupData {
    Spans(Box<SpanState>),
    Scrape(ScrapeState),
}

impl GroupData {
    /// `None` when no window or flush is pending (the group may be idle), else `Some(0)`.
    fn open(&self) -> Option<u64> {
        let drained = match self {
            GroupData::Spans(s) => s.drained(),
            GroupData::Scrape(s) => s.windows.is_empty(),
        };
        (!drained).then_some(0)
    }

    /// Whether every open span window's prompt-length buckets have the shape of `split`.
    fn split_fits(&self, split: &InputSplit) -> bool {
        match self {
            GroupData::Spans(st) => st.windows.values().all(|w| split.fits(&w.by_input)),
            GroupData::Scrape(_) => true,
        }
    }

    fn is_valid_for(&self, key: &GroupKey) -> bool {
        match (self, key.source) {
            (GroupData::Spans(st), super::model::Source::Spans) => st.is_valid(),
            (GroupData::Scrape(st), super::model::Source::Scrape) => st.is_valid(),
            _ => false,
        }
    }
}

/// The state of one `llm_signals` processor: one (source, model, version, instance) group per
/// key, in key order.
pub struct State {
    params: Params,
    /// The prompt-length split of the span windows (`input_buckets`).
    split: Arc<InputSplit>,
    watermark: u64,
    groups: OrderedSeriesMap<GroupKey, GroupData>,
}

/// The checkpoint header beside the groups.
#[derive(Serialize, Deserialize)]
struct Header {
    window_ns: u64,
    flush_ns: u64,
    watermark: u64,
    /// `input_buckets` the windows were split by.
    input_buckets: Vec<u64>,
}

impl State {
    /// An empty state splitting span windows by `split`.
    pub fn new(params: Params, split: Arc<InputSplit>) -> Self {
        State { params, split, watermark: 0, groups: OrderedSeriesMap::new(params.max_series, params.idle_ns) }
    }

    /// The watermark of the last `advance`.
    pub fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.groups.len()
    }

    /// The group of `key`, created (evicting at `max_series`) when new; with the number evicted.
    fn group(
        &mut self,
        key: &GroupKey,
        time: u64,
        make: impl FnOnce() -> GroupData,
    ) -> Option<(&mut GroupData, usize)> {
        self.groups.touch(key, time, make, |_, _| {}).map(|t| (t.state, t.evicted))
    }

    /// Adds one request span ended at `time`; returns the number of groups evicted for room.
    pub fn add_request(&mut self, key: GroupKey, time: u64, req: &Request) -> Result<usize, Skip> {
        if time < self.watermark {
            return Err(Skip::Late);
        }
        let p = self.params;
        let split = Arc::clone(&self.split);
        let Some((g, evicted)) = self.group(&key, time, || GroupData::Spans(Box::new(SpanState::new(time)))) else {
            return Ok(0);
        };
        if let GroupData::Spans(s) = g {
            s.add(time, req, &p, &split);
        }
        Ok(evicted)
    }

    /// Adds one scraped sample; returns the number of groups evicted for room.
    pub fn add_sample(&mut self, key: GroupKey, sample: Sample) -> Result<usize, Skip> {
        if sample.time < self.watermark {
            return Err(Skip::Late);
        }
        let p = self.params;
        let Some((g, evicted)) = self.group(&key, sample.time, || GroupData::Scrape(ScrapeState::default())) else {
            return Ok(0);
        };
        if let GroupData::Scrape(s) = g {
            s.add(sample, &p)?;
        }
        Ok(evicted)
    }

    /// Moves the watermark to `wm`: emits what closes into `em`, then drops idle groups (returned).
    pub fn advance(&mut self, wm: u64, em: &mut Emitter) -> usize {
        if wm <= self.watermark {
            return 0;
        }
        let prev = self.watermark;
        self.watermark = wm;
        let p = self.params;
        for (key, g) in self.groups.iter_mut() {
            let attrs = key.attributes();
            match g {
                GroupData::Spans(s) => s.close(&attrs, prev, wm, &p, &self.split, em),
                GroupData::Scrape(s) => s.close(&attrs, wm, &p, em),
            }
        }
        self.groups.expire_idle(wm, GroupData::open, |_, _| {})
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let header = Header {
            window_ns: self.params.window_ns,
            flush_ns: self.params.flush_ns,
            watermark: self.watermark,
            input_buckets: self.split.bounds().to_vec(),
        };
        self.groups.snapshot(super::STATE_VERSION, &header, |_, g| g)
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let (h, groups): (Header, _) = self.groups.restore(super::STATE_VERSION, bytes, |key, g: GroupData| {
            if g.is_valid_for(key) { Ok(g) } else { Err(RestoreError::Invalid("group state")) }
        })?;
        if h.input_buckets != self.split.bounds() {
            return Err(RestoreError::Part {
                what: "input_buckets",
                message: format!("written with {:?}, configured {:?}", h.input_buckets, self.split.bounds()),
            });
        }
        if !groups.iter().all(|(_, g)| g.state.split_fits(&self.split)) {
            return Err(RestoreError::Invalid("prompt-length buckets of a window"));
        }
        for (what, found, expected) in
            [("window", h.window_ns, self.params.window_ns), ("flush_interval", h.flush_ns, self.params.flush_ns)]
        {
            if found != expected {
                return Err(RestoreError::Params { what, found, expected });
            }
        }
        self.watermark = h.watermark;
        self.groups = groups;
        Ok(())
    }
}
