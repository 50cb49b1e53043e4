//! Open-loop arrival processes (constant and Poisson), rate-sweep parsing, and the arrival
//! schedule of a replayed trace ([`TraceSchedule`]: time-scaled, windowed, looped, sampled).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How requests arrive in open-loop mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalKind {
    /// Exponential gaps with mean 1/rate (a Poisson process).
    #[default]
    Poisson,
    /// Equal gaps of 1/rate.
    Constant,
}

/// An endless schedule of arrival offsets from the start, the first at 0.
#[derive(Debug)]
pub struct Arrivals {
    kind: ArrivalKind,
    rate: f64,
    rng: StdRng,
    /// Arrivals produced so far.
    n: u64,
    /// Offset of the next arrival, seconds.
    next: f64,
}

impl Arrivals {
    /// A schedule at `rate` per second (must be positive and finite).
    pub fn new(kind: ArrivalKind, rate: f64, seed: u64) -> Arrivals {
        Arrivals { kind, rate, rng: StdRng::seed_from_u64(seed), n: 0, next: 0.0 }
    }

    /// The rate per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Changes the rate from the next gap on.
    pub fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
    }

    /// One gap drawn from the process, seconds.
    pub fn gap(&mut self) -> f64 {
        match self.kind {
            ArrivalKind::Constant => 1.0 / self.rate,
            ArrivalKind::Poisson => {
                // 1 - U is in (0, 1], so the logarithm is finite.
                let u: f64 = 1.0 - self.rng.random::<f64>();
                -u.ln() / self.rate
            }
        }
    }
}

impl Iterator for Arrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let at = match self.kind {
            // Computed from the index, so no rounding error accumulates.
            ArrivalKind::Constant => self.n as f64 / self.rate,
            ArrivalKind::Poisson => {
                let at = self.next;
                self.next += self.gap();
                at
            }
        };
        self.n += 1;
        Some(Duration::from_secs_f64(at.min(1e12)))
    }
}

/// Parses a rate sweep such as `1,2,4,8` (positive rates per second).
pub fn parse_sweep(s: &str) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let r: f64 = part.parse().map_err(|_| format!("invalid rate {part:?} in the sweep"))?;
        if !r.is_finite() || r <= 0.0 {
            return Err(format!("rates must be positive, got {part:?}"));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err("the sweep names no rate".into());
    }
    Ok(out)
}

/// How a trace's arrivals are replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceTiming {
    /// Time scale: 10 replays ten times faster (> 0).
    pub speed: f64,
    /// Start of the replayed window, trace seconds after the first arrival.
    pub start_s: f64,
    /// Length of the window, trace seconds (none: to the end of the trace).
    pub duration_s: Option<f64>,
    /// Start again at the window's start when it ends, forever.
    pub looped: bool,
    /// Keep each arrival with this probability (seeded; none: keep all).
    pub sample: Option<f64>,
    /// Seed of the sampling.
    pub seed: u64,
}

impl Default for TraceTiming {
    fn default() -> Self {
        TraceTiming { speed: 1.0, start_s: 0.0, duration_s: None, looped: false, sample: None, seed: 0 }
    }
}

impl TraceTiming {
    /// Checks the values; the message names the option.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            return Err(format!("speed must be positive, got {}", self.speed));
        }
        if !(self.start_s.is_finite() && self.start_s >= 0.0) {
            return Err(format!("start must be ≥ 0, got {}", self.start_s));
        }
        if let Some(d) = self.duration_s
            && !(d.is_finite() && d > 0.0)
        {
            return Err(format!("duration must be positive, got {d}"));
        }
        if let Some(p) = self.sample
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(format!("sample must be in (0, 1], got {p}"));
        }
        Ok(())
    }
}

/// One arrival of a replayed trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scheduled {
    /// When to send, from the start of the replay (scaled by the speed).
    pub at: Duration,
    /// The same moment in trace seconds from the window's start (laps included).
    pub trace_s: f64,
    /// Index of the row in the trace.
    pub row: usize,
    /// Which pass over the window (0 first; looping only).
    pub lap: u64,
}

/// The arrival schedule of a trace: its rows' times in a window, scaled, looped and sampled.
/// Rows must be sorted by time. Deterministic in the timing's seed.
#[derive(Debug, Clone)]
pub struct TraceSchedule {
    /// Row times relative to the window's start, trace seconds, for rows `first..`.
    rel: Vec<f64>,
    first: usize,
    period_s: f64,
    timing: TraceTiming,
    lap: u64,
    idx: usize,
}

impl TraceSchedule {
    /// The schedule of rows at `times` (trace seconds, sorted) under `timing`.
    pub fn new(times: &[f64], timing: TraceTiming) -> Result<TraceSchedule, String> {
        timing.validate()?;
        let start = timing.start_s;
        let end = timing.duration_s.map_or(f64::INFINITY, |d| start + d);
        let first = times.partition_point(|&t| t < start);
        let last = times.partition_point(|&t| t < end);
        if first >= last {
            return Err(format!("the window [{start} s, {end} s) of the trace holds no request"));
        }
        let rel: Vec<f64> = times[first..last].iter().map(|t| t - start).collect();
        let period_s = match timing.duration_s {
            Some(d) => d,
            None => {
                // The span plus one mean gap, so the loop's seam looks like any other gap.
                let span = rel[rel.len() - 1];
                let n = rel.len() as f64;
                let gap = if rel.len() > 1 { (span - rel[0]) / (n - 1.0) } else { 1.0 };
                span + if gap > 0.0 { gap } else { 1.0 }
            }
        };
        Ok(TraceSchedule { rel, first, period_s, timing, lap: 0, idx: 0 })
    }

    /// Rows in the window (one lap, before sampling).
    pub fn rows_per_lap(&self) -> usize {
        self.rel.len()
    }

    /// Length of one lap, trace seconds.
    pub fn period_s(&self) -> f64 {
        self.period_s
    }

    /// The timing.
    pub fn timing(&self) -> &TraceTiming {
        &self.timing
    }

    /// Moves to the first arrival at or after `wall_s` seconds from the start of the replay.
    pub fn seek(&mut self, wall_s: f64) {
        let t = (wall_s.max(0.0)) * self.timing.speed;
        let lap = (t / self.period_s).floor();
        if !self.timing.looped && lap >= 1.0 {
            self.lap = 1;
            self.idx = self.rel.len();
            return;
        }
        self.lap = lap.min(1e15) as u64;
        let within = t - self.lap as f64 * self.period_s;
        self.idx = self.rel.partition_point(|&x| x < within);
    }

    /// Whether `row` is kept on `lap` by the sampling.
    pub fn keeps(&self, row: usize, lap: u64) -> bool {
        match self.timing.sample {
            None => true,
            Some(p) if p >= 1.0 => true,
            Some(p) => {
                let h = mix64(self.timing.seed ^ mix64(row as u64 ^ mix64(lap.wrapping_add(0x7A5E))));
                ((h >> 11) as f64 / (1u64 << 53) as f64) < p
            }
        }
    }
}

impl Iterator for TraceSchedule {
    type Item = Scheduled;

    fn next(&mut self) -> Option<Scheduled> {
        loop {
            if self.idx >= self.rel.len() {
                if !self.timing.looped {
                    return None;
                }
                self.idx = 0;
                self.lap += 1;
            }
            let (i, lap) = (self.idx, self.lap);
            self.idx += 1;
            let row = self.first + i;
            if !self.keeps(row, lap) {
                continue;
            }
            let trace_s = lap as f64 * self.period_s + self.rel[i];
            let wall = trace_s / self.timing.speed;
            return Some(Scheduled { at: Duration::from_secs_f64(wall.clamp(0.0, 1e12)), trace_s, row, lap });
        }
    }
}

/// SplitMix64 finaliser: a well-mixed 64-bit hash step.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_within(kind: ArrivalKind, rate: f64, secs: f64, seed: u64) -> usize {
        Arrivals::new(kind, rate, seed).take_while(|d| d.as_secs_f64() < secs).count()
    }

    #[test]
    fn constant_is_exact() {
        assert_eq!(count_within(ArrivalKind::Constant, 50.0, 2.0, 1), 100);
        assert_eq!(count_within(ArrivalKind::Constant, 3.0, 10.0, 1), 30);
        let v: Vec<f64> = Arrivals::new(ArrivalKind::Constant, 4.0, 0).take(3).map(|d| d.as_secs_f64()).collect();
        assert_eq!(v, vec![0.0, 0.25, 0.5]);
    }

    #[test]
    fn poisson_counts_have_poisson_mean_and_variance() {
        // 400 windows of 1 s at 20/s: mean ≈ 20, variance ≈ 20 (index of dispersion ≈ 1).
        let mut a = Arrivals::new(ArrivalKind::Poisson, 20.0, 7);
        let mut counts = vec![0u32; 400];
        for d in a.by_ref() {
            let w = d.as_secs_f64() as usize;
            if w >= counts.len() {
                break;
            }
            counts[w] += 1;
        }
        let n = counts.len() as f64;
        let mean = counts.iter().map(|&c| c as f64).sum::<f64>() / n;
        let var = counts.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((mean - 20.0).abs() < 0.6, "mean {mean}");
        assert!((var / mean - 1.0).abs() < 0.25, "dispersion {}", var / mean);
        // The constant process has no variance at all.
        let c = count_within(ArrivalKind::Constant, 20.0, 400.0, 7);
        assert_eq!(c, 8000);
    }

    #[test]
    fn same_seed_same_schedule() {
        let a: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 3).take(50).collect();
        let b: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 3).take(50).collect();
        let c: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 4).take(50).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    fn times() -> Vec<f64> {
        vec![0.0, 1.0, 2.0, 5.0, 9.0]
    }

    #[test]
    fn trace_speed_scales_offsets() {
        let t = TraceTiming { speed: 10.0, ..TraceTiming::default() };
        let v: Vec<(f64, usize)> =
            TraceSchedule::new(&times(), t).unwrap().map(|s| (s.at.as_secs_f64(), s.row)).collect();
        assert_eq!(v, vec![(0.0, 0), (0.1, 1), (0.2, 2), (0.5, 3), (0.9, 4)]);
        assert!(TraceSchedule::new(&times(), TraceTiming { speed: 0.0, ..t }).is_err());
    }

    #[test]
    fn trace_window_and_loop() {
        // Window [1, 6): rows 1, 2, 3 at 0, 1, 4; looping with period 5.
        let t = TraceTiming { start_s: 1.0, duration_s: Some(5.0), looped: true, ..TraceTiming::default() };
        let s = TraceSchedule::new(&times(), t).unwrap();
        assert_eq!((s.rows_per_lap(), s.period_s()), (3, 5.0));
        let v: Vec<(f64, usize, u64)> = s.take(7).map(|s| (s.trace_s, s.row, s.lap)).collect();
        assert_eq!(v, vec![(0.0, 1, 0), (1.0, 2, 0), (4.0, 3, 0), (5.0, 1, 1), (6.0, 2, 1), (9.0, 3, 1), (10.0, 1, 2)]);
        // Without a window the period is the span plus one mean gap: 9 + 9/4.
        let mut s = TraceSchedule::new(&times(), TraceTiming { looped: true, ..TraceTiming::default() }).unwrap();
        assert_eq!(s.period_s(), 11.25);
        assert_eq!(s.nth(5).map(|x| (x.trace_s, x.row)), Some((11.25, 0)));
        // Seeking lands on the first arrival at or after the time, in any lap.
        let mut s = TraceSchedule::new(&times(), TraceTiming { looped: true, ..TraceTiming::default() }).unwrap();
        s.seek(11.25 + 1.5);
        assert_eq!(s.next().map(|x| (x.row, x.lap)), Some((2, 1)));
        let mut s = TraceSchedule::new(&times(), TraceTiming::default()).unwrap();
        s.seek(20.0);
        assert_eq!(s.next(), None);
        let e = TraceSchedule::new(&times(), TraceTiming { start_s: 10.0, ..TraceTiming::default() });
        assert!(e.is_err());
        // Without looping the schedule ends.
        assert_eq!(TraceSchedule::new(&times(), TraceTiming::default()).unwrap().count(), 5);
    }

    #[test]
    fn trace_sampling_is_seeded_and_proportional() {
        let many: Vec<f64> = (0..20_000).map(|i| i as f64 * 0.01).collect();
        let t = TraceTiming { sample: Some(0.25), seed: 3, ..TraceTiming::default() };
        let a: Vec<usize> = TraceSchedule::new(&many, t).unwrap().map(|s| s.row).collect();
        let b: Vec<usize> = TraceSchedule::new(&many, t).unwrap().map(|s| s.row).collect();
        let c: Vec<usize> = TraceSchedule::new(&many, TraceTiming { seed: 4, ..t }).unwrap().map(|s| s.row).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let share = a.len() as f64 / many.len() as f64;
        assert!((share - 0.25).abs() < 0.015, "kept {share}");
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        // Each lap draws afresh.
        let looped = TraceTiming { looped: true, ..t };
        let lap1: Vec<usize> =
            TraceSchedule::new(&many, looped).unwrap().filter(|s| s.lap == 1).take(100).map(|s| s.row).collect();
        assert_ne!(&lap1[..], &a[..100]);
        assert!(TraceSchedule::new(&many, TraceTiming { sample: Some(1.5), ..t }).is_err());
    }

    #[test]
    fn sweep_parsing() {
        assert_eq!(parse_sweep("1,2, 4,8").unwrap(), vec![1.0, 2.0, 4.0, 8.0]);
        assert!(parse_sweep("1,-2").is_err());
        assert!(parse_sweep("x").is_err());
        assert!(parse_sweep("").is_err());
    }
}
