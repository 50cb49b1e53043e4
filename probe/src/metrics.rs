//! Measurements of a run: HDR histograms of TTFT, ITL, TPOT and e2e, token counts, errors by
//! kind, goodput under SLOs, quality values, and per-window tails for p99 drift.

use crate::client::{ErrorKind, Outcome};
use crate::quality::{tle_bits, tle_uncertain};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Largest latency recorded: one hour, in microseconds (larger values saturate).
const MAX_US: u64 = 3_600_000_000;

/// A histogram of 1..=high with 3 significant digits.
fn hist(high: u64) -> Histogram<u64> {
    // Only called with constant bounds (high ≥ 2, sigfig 3), which hdrhistogram always accepts.
    Histogram::new_with_bounds(1, high.max(2), 3).expect("constant histogram bounds are valid")
}

/// A latency histogram in microseconds with 3 significant digits (0.1 % relative error).
#[derive(Debug, Clone)]
pub struct LatencyHist(Histogram<u64>);

impl Default for LatencyHist {
    fn default() -> Self {
        // The bounds are constants that hdrhistogram accepts.
        LatencyHist(hist(MAX_US))
    }
}

impl LatencyHist {
    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros().clamp(1, MAX_US as u128) as u64;
        self.0.saturating_record(us);
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &LatencyHist) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q`, in seconds.
    pub fn quantile_s(&self, q: f64) -> Option<f64> {
        (self.count() > 0).then(|| self.0.value_at_quantile(q) as f64 / 1e6)
    }

    /// Count, mean, min, max and percentiles in seconds.
    pub fn summary(&self) -> Summary {
        let h = &self.0;
        let n = h.len();
        let q = |q: f64| (n > 0).then(|| h.value_at_quantile(q) as f64 / 1e6);
        Summary {
            count: n,
            mean: (n > 0).then(|| h.mean() / 1e6),
            min: (n > 0).then(|| h.min() as f64 / 1e6),
            max: (n > 0).then(|| h.max() as f64 / 1e6),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
        }
    }
}

/// Distribution summary in seconds (or the metric's unit); `null` when there are no values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Summary {
    /// Number of values.
    pub count: u64,
    /// Mean.
    pub mean: Option<f64>,
    /// Smallest value.
    pub min: Option<f64>,
    /// Largest value.
    pub max: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
}

/// A histogram of non-negative values with a fixed scale (e.g. bits × 1000).
#[derive(Debug, Clone)]
pub struct ScaledHist {
    h: Histogram<u64>,
    scale: f64,
    sum: f64,
}

impl ScaledHist {
    fn new(scale: f64, max: f64) -> ScaledHist {
        let hi = ((max * scale) as u64).max(2);
        ScaledHist { h: hist(hi), scale, sum: 0.0 }
    }

    fn record(&mut self, v: f64) {
        if v.is_finite() {
            // Offset by one so that 0 is representable with a lower bound of 1.
            self.h.saturating_record((v.max(0.0) * self.scale) as u64 + 1);
            self.sum += v.max(0.0);
        }
    }

    fn merge(&mut self, o: &ScaledHist) {
        let _ = self.h.add(&o.h);
        self.sum += o.sum;
    }

    fn count(&self) -> u64 {
        self.h.len()
    }

    fn summary(&self) -> Summary {
        let n = self.h.len();
        let v = |raw: u64| (raw.saturating_sub(1)) as f64 / self.scale;
        let q = |q: f64| (n > 0).then(|| v(self.h.value_at_quantile(q)));
        Summary {
            count: n,
            mean: (n > 0).then(|| self.sum / n as f64),
            min: (n > 0).then(|| v(self.h.min())),
            max: (n > 0).then(|| v(self.h.max())),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
        }
    }
}

/// Service-level objectives for goodput: a request counts when it meets every one given.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Slo {
    /// Time to first token, seconds.
    pub ttft: Option<f64>,
    /// Time per output token, seconds.
    pub tpot: Option<f64>,
    /// End-to-end latency, seconds.
    pub e2e: Option<f64>,
}

impl Slo {
    /// Parses `ttft=500ms,tpot=50ms,e2e=10s` (durations with a unit, or plain seconds).
    pub fn parse(s: &str) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("SLO {part:?}: expected name=duration"))?;
            let d = crate::parse_duration(v.trim()).map_err(|e| format!("SLO {k}: {e}"))?.as_secs_f64();
            match k.trim() {
                "ttft" => slo.ttft = Some(d),
                "tpot" => slo.tpot = Some(d),
                "e2e" | "e2el" => slo.e2e = Some(d),
                other => return Err(format!("unknown SLO {other:?}: use ttft, tpot or e2e")),
            }
        }
        if slo == Slo::default() {
            return Err("--slo names no objective".into());
        }
        Ok(slo)
    }

    /// Whether a successful outcome meets every objective. Without a streamed first token the
    /// TTFT is the e2e latency (the user sees nothing before the whole answer).
    pub fn met(&self, o: &Outcome) -> bool {
        if !o.ok() {
            return false;
        }
        let e2e = o.e2e.as_secs_f64();
        let ttft = o.ttft.map_or(e2e, |d| d.as_secs_f64());
        self.ttft.is_none_or(|t| ttft <= t)
            && self.e2e.is_none_or(|t| e2e <= t)
            && self.tpot.is_none_or(|t| o.tpot().is_none_or(|p| p.as_secs_f64() <= t))
    }
}

/// TTFT and e2e tails of one time window (p99 drift).
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// TTFT of requests that started in the window.
    pub ttft: LatencyHist,
    /// e2e of requests that started in the window.
    pub e2e: LatencyHist,
}

/// Everything measured in one run (or one step of a sweep).
#[derive(Debug, Clone)]
pub struct Recorder {
    /// TTFT of successful streamed requests.
    pub ttft: LatencyHist,
    /// Inter-token (inter-chunk) latencies.
    pub itl: LatencyHist,
    /// Time per output token per request.
    pub tpot: LatencyHist,
    /// End-to-end latency of successful requests.
    pub e2e: LatencyHist,
    /// Requests sent (attempts).
    pub sent: u64,
    /// Successful requests.
    pub completed: u64,
    /// Failed requests.
    pub failed: u64,
    /// Arrivals dropped because too many requests were in flight.
    pub overflow: u64,
    /// Retried attempts.
    pub retries: u64,
    /// Failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// Prompt tokens of successful requests.
    pub input_tokens: u64,
    /// Output tokens of successful requests.
    pub output_tokens: u64,
    /// Successful requests whose server reported `usage`.
    pub usage_reported: u64,
    /// Successful requests meeting every SLO.
    pub slo_met: u64,
    /// TLE of the first token, bits.
    pub tle: Option<ScaledHist>,
    /// Top-K size seen for TLE.
    pub tle_k: usize,
    /// First tokens whose TLE is above the threshold of their K (`quality::tle_threshold_bits`).
    pub tle_uncertain: u64,
    /// RCI per answer.
    pub rci: Option<ScaledHist>,
    /// BLEU per answer.
    pub bleu: Option<ScaledHist>,
    /// Repetition ratio per answer.
    pub repetition: Option<ScaledHist>,
    /// Per-request tokens/s: output tokens / e2e (the study's TPS).
    pub tps: Option<ScaledHist>,
    /// Per-request decode tokens/s: output tokens / (e2e − ttft).
    pub decode_tps: Option<ScaledHist>,
    /// Start of the run.
    pub t0: Instant,
    /// First request start.
    pub first: Option<Instant>,
    /// Last request end.
    pub last: Option<Instant>,
    /// Window length for tail drift, when tracked.
    pub window: Option<Duration>,
    /// Per-window tails.
    pub windows: Vec<Window>,
}

impl Recorder {
    /// An empty recorder whose run starts now.
    pub fn new(t0: Instant) -> Recorder {
        Recorder {
            ttft: LatencyHist::default(),
            itl: LatencyHist::default(),
            tpot: LatencyHist::default(),
            e2e: LatencyHist::default(),
            sent: 0,
            completed: 0,
            failed: 0,
            overflow: 0,
            retries: 0,
            errors: BTreeMap::new(),
            input_tokens: 0,
            output_tokens: 0,
            usage_reported: 0,
            slo_met: 0,
            tle: None,
            tle_k: 0,
            tle_uncertain: 0,
            rci: None,
            bleu: None,
            repetition: None,
            tps: None,
            decode_tps: None,
            t0,
            first: None,
            last: None,
            window: None,
            windows: Vec::new(),
        }
    }

    /// Tracks per-window tails of `len`.
    pub fn with_windows(mut self, len: Duration) -> Recorder {
        self.window = Some(len);
        self
    }

    /// Records one attempt (cancelled ones are ignored).
    pub fn record(&mut self, o: &Outcome, slo: Option<&Slo>) {
        if let Some(e) = &o.error
            && e.kind == ErrorKind::Cancelled
        {
            return;
        }
        self.sent += 1;
        let end = o.start + o.e2e;
        self.first = Some(self.first.map_or(o.start, |f| f.min(o.start)));
        self.last = Some(self.last.map_or(end, |l| l.max(end)));
        if let Some(e) = &o.error {
            self.failed += 1;
            *self.errors.entry(e.kind.name().into_owned()).or_insert(0) += 1;
            return;
        }
        self.completed += 1;
        if let Some(t) = o.ttft {
            self.ttft.record(t);
        }
        for &g in &o.itl {
            self.itl.record(g);
        }
        if let Some(t) = o.tpot() {
            self.tpot.record(t);
        }
        self.e2e.record(o.e2e);
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.usage_reported += u64::from(o.usage_reported);
        if slo.is_some_and(|s| s.met(o)) {
            self.slo_met += 1;
        }
        if let Some(top) = &o.first_top_logprobs
            && let Some(h) = tle_bits(top)
        {
            self.tle.get_or_insert_with(|| ScaledHist::new(1000.0, 64.0)).record(h);
            self.tle_k = self.tle_k.max(top.len());
            self.tle_uncertain += u64::from(tle_uncertain(h, top.len()));
        }
        if let Some(r) = &o.rci {
            self.rci.get_or_insert_with(|| ScaledHist::new(10000.0, 1.0)).record(r.rci);
            self.bleu.get_or_insert_with(|| ScaledHist::new(10000.0, 1.0)).record(r.bleu);
            self.repetition.get_or_insert_with(|| ScaledHist::new(10000.0, 1.0)).record(r.repetition);
        }
        if o.output_tokens > 0 && !o.e2e.is_zero() {
            let tps = o.output_tokens as f64 / o.e2e.as_secs_f64();
            self.tps.get_or_insert_with(|| ScaledHist::new(100.0, 1e7)).record(tps);
            if let Some(t) = o.ttft {
                let decode = o.e2e.saturating_sub(t);
                if o.output_tokens > 1 && !decode.is_zero() {
                    let d = (o.output_tokens - 1) as f64 / decode.as_secs_f64();
                    self.decode_tps.get_or_insert_with(|| ScaledHist::new(100.0, 1e7)).record(d);
                }
            }
        }
        if let Some(len) = self.window {
            let i = (o.start.saturating_duration_since(self.t0).as_secs_f64() / len.as_secs_f64()) as usize;
            if i < 1_000_000 {
                if self.windows.len() <= i {
                    self.windows.resize_with(i + 1, Window::default);
                }
                if let Some(t) = o.ttft {
                    self.windows[i].ttft.record(t);
                }
                self.windows[i].e2e.record(o.e2e);
            }
        }
    }

    /// Adds another recorder's measurements (e.g. the steps of a sweep).
    pub fn merge(&mut self, o: &Recorder) {
        self.ttft.merge(&o.ttft);
        self.itl.merge(&o.itl);
        self.tpot.merge(&o.tpot);
        self.e2e.merge(&o.e2e);
        self.sent += o.sent;
        self.completed += o.completed;
        self.failed += o.failed;
        self.overflow += o.overflow;
        self.retries += o.retries;
        for (k, v) in &o.errors {
            *self.errors.entry(k.clone()).or_insert(0) += v;
        }
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.usage_reported += o.usage_reported;
        self.slo_met += o.slo_met;
        merge_opt(&mut self.tle, &o.tle);
        self.tle_k = self.tle_k.max(o.tle_k);
        self.tle_uncertain += o.tle_uncertain;
        merge_opt(&mut self.rci, &o.rci);
        merge_opt(&mut self.bleu, &o.bleu);
        merge_opt(&mut self.repetition, &o.repetition);
        merge_opt(&mut self.tps, &o.tps);
        merge_opt(&mut self.decode_tps, &o.decode_tps);
        self.first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last = match (self.last, o.last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// TLE summary (bits) and the share of first tokens above the threshold of their top-K
    /// size (`quality::tle_threshold_bits`).
    pub fn tle_summary(&self) -> Option<(Summary, f64)> {
        self.tle.as_ref().map(|h| {
            let n = h.count();
            (h.summary(), if n == 0 { 0.0 } else { self.tle_uncertain as f64 / n as f64 })
        })
    }

    /// RCI, BLEU and repetition summaries.
    pub fn rci_summary(&self) -> Option<(Summary, Summary, Summary)> {
        let r = self.rci.as_ref()?;
        let b = self.bleu.as_ref()?;
        let p = self.repetition.as_ref()?;
        Some((r.summary(), b.summary(), p.summary()))
    }

    /// Per-request TPS summaries (whole request, decode only).
    pub fn tps_summary(&self) -> (Option<Summary>, Option<Summary>) {
        (self.tps.as_ref().map(ScaledHist::summary), self.decode_tps.as_ref().map(ScaledHist::summary))
    }

    /// Number of TLE values.
    pub fn tle_count(&self) -> u64 {
        self.tle.as_ref().map_or(0, ScaledHist::count)
    }
}

fn merge_opt(a: &mut Option<ScaledHist>, b: &Option<ScaledHist>) {
    if let Some(b) = b {
        match a {
            Some(a) => a.merge(b),
            None => *a = Some(b.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RequestError;
    use std::time::SystemTime;

    fn outcome(ttft_ms: u64, itl_ms: &[u64], tokens: u64) -> Outcome {
        let ttft = Duration::from_millis(ttft_ms);
        let itl: Vec<Duration> = itl_ms.iter().map(|&m| Duration::from_millis(m)).collect();
        let e2e = ttft + itl.iter().sum::<Duration>();
        Outcome {
            start: Instant::now(),
            start_wall: SystemTime::now(),
            ttft: Some(ttft),
            itl,
            e2e,
            input_tokens: 10,
            output_tokens: tokens,
            usage_reported: true,
            text: String::new(),
            finish_reason: Some("stop".into()),
            response_id: None,
            response_model: None,
            first_top_logprobs: None,
            rci: None,
            error: None,
            tokens: Vec::new(),
        }
    }

    #[test]
    fn records_and_summarises() {
        let mut r = Recorder::new(Instant::now());
        for i in 1..=100u64 {
            r.record(&outcome(i, &[10, 10, 10], 4), None);
        }
        let s = r.ttft.summary();
        assert_eq!(s.count, 100);
        assert!((s.p50.unwrap() - 0.050).abs() < 0.0001, "{s:?}");
        assert!((s.p99.unwrap() - 0.099).abs() < 0.0001, "{s:?}");
        assert_eq!(r.itl.count(), 300);
        // TPOT = (e2e - ttft) / (4 - 1) = 10 ms.
        let t = r.tpot.summary();
        assert!((t.p50.unwrap() - 0.010).abs() < 0.00002, "{t:?}");
        assert_eq!(r.output_tokens, 400);
    }

    #[test]
    fn errors_by_kind_and_goodput() {
        let slo = Slo::parse("ttft=50ms,tpot=20ms").unwrap();
        let mut r = Recorder::new(Instant::now());
        r.record(&outcome(40, &[10, 10], 3), Some(&slo)); // met
        r.record(&outcome(60, &[10, 10], 3), Some(&slo)); // ttft too slow
        r.record(&outcome(40, &[30, 30], 3), Some(&slo)); // tpot too slow
        let mut bad = outcome(1, &[], 0);
        bad.error = Some(RequestError { kind: ErrorKind::Http(503), message: String::new() });
        r.record(&bad, Some(&slo));
        bad.error = Some(RequestError { kind: ErrorKind::Cancelled, message: String::new() });
        r.record(&bad, Some(&slo));
        assert_eq!((r.sent, r.completed, r.failed, r.slo_met), (4, 3, 1, 1));
        assert_eq!(r.errors.get("http_503"), Some(&1));
    }

    #[test]
    fn slo_parsing() {
        let s = Slo::parse("ttft=500ms,tpot=50ms,e2e=10s").unwrap();
        assert_eq!((s.ttft, s.tpot, s.e2e), (Some(0.5), Some(0.05), Some(10.0)));
        assert_eq!(Slo::parse("e2e=2").unwrap().e2e, Some(2.0));
        assert!(Slo::parse("foo=1s").is_err());
        assert!(Slo::parse("ttft").is_err());
        assert!(Slo::parse("").is_err());
    }

    #[test]
    fn merge_adds_up() {
        let mut a = Recorder::new(Instant::now());
        let mut b = Recorder::new(Instant::now());
        a.record(&outcome(10, &[1], 2), None);
        b.record(&outcome(20, &[1], 2), None);
        a.merge(&b);
        assert_eq!(a.ttft.count(), 2);
        assert_eq!(a.completed, 2);
    }
}
