//! The held-out series generator (`inferwatch eval --generate DIR --family a|b --seed N`): 1-minute
//! latency percentiles unlike the scenario library — seasonality shapes, traffic growth, deploy
//! steps up and down, holidays, gaps, noise regimes — with fast faults (steps, ramps, bursts) and
//! slow drifts (linear, accelerating, exponential, masked by a deploy) written in NAB's layout
//! (`data/<family>/<name>.csv`, `labels/combined_windows.json`) plus `truth.json` (kind, onset,
//! end, breach, SLO threshold per file). Family `a` is the tuning family, `b` the held-out one:
//! heavier tails (Student t, 3 degrees of freedom), noisier nights, business-hours plateaus,
//! holidays, gaps and larger deploy steps.

use super::{Kind, SeriesTruth, TRUTH_FILE};
use crate::error::EvalError;
use inferwatch_core::civil::civil_from_days;
use inferwatch_core::rng::SplitMix64;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

const MIN_NS: u64 = 60_000_000_000;
const DAY_MIN: u64 = 1440;
/// 2025-01-06 00:00 UTC, a Monday: every generated series starts here.
pub const START_NS: u64 = 1_736_121_600_000_000_000;

/// A family of series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Tuning family: sinusoidal days, mild weekends, Gaussian noise on the log, few deploys.
    A,
    /// Held-out family: plateaus, deep weekends, holidays, gaps, heavy tails, more deploys.
    B,
}

impl Family {
    /// The family named `a` or `b`.
    pub fn parse(s: &str) -> Option<Family> {
        match s.to_ascii_lowercase().as_str() {
            "a" => Some(Family::A),
            "b" => Some(Family::B),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::A => "a",
            Family::B => "b",
        }
    }
}

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Files written.
    pub files: usize,
    /// Rows over all files.
    pub rows: usize,
}

/// The healthy shape of one series: everything but the fault.
struct Shape {
    family: Family,
    base: f64,
    amp: f64,
    weekend: f64,
    growth_per_day: f64,
    deploys: Vec<(u64, f64)>,
    holidays: Vec<u64>,
    gaps: Vec<(u64, u64)>,
    sd: f64,
}

impl Shape {
    fn draw(family: Family, rng: &mut SplitMix64, days: u64) -> Shape {
        let b = family == Family::B;
        let deploys_n = if b { 2 + rng.below(3) } else { 1 + rng.below(2) };
        let deploys = (0..deploys_n)
            .map(|_| {
                let at = rng.below(days * DAY_MIN);
                let f = if b { rng.range(0.8, 1.25) } else { rng.range(0.92, 1.12) };
                (at, f)
            })
            .collect();
        let holidays = if b {
            (0..1 + rng.below(2)).map(|_| 7 + rng.below(days.saturating_sub(7).max(1))).collect()
        } else {
            Vec::new()
        };
        let gaps = if b {
            (0..2 + rng.below(4))
                .map(|_| {
                    let at = rng.below(days * DAY_MIN);
                    (at, at + 10 + rng.below(170))
                })
                .collect()
        } else {
            Vec::new()
        };
        Shape {
            family,
            base: rng.range(0.25, 1.2),
            amp: if b { rng.range(0.3, 0.8) } else { rng.range(0.2, 0.5) },
            weekend: if b { rng.range(0.6, 0.8) } else { rng.range(0.85, 0.95) },
            growth_per_day: rng.range(0.0, if b { 0.15 } else { 0.05 }) / 30.0,
            deploys,
            holidays,
            gaps,
            sd: if b { rng.range(0.05, 0.12) } else { rng.range(0.04, 0.10) },
        }
    }

    /// The daily factor at hour `h` of a working day.
    fn daily(&self, h: f64) -> f64 {
        match self.family {
            Family::A => 1.0 + self.amp * ((h - 9.0) / 24.0 * std::f64::consts::TAU).sin(),
            Family::B => {
                let s = |x: f64| 1.0 / (1.0 + (-x).exp());
                let plateau = s((h - 8.0) / 0.7) - s((h - 19.0) / 0.7);
                let evening = 0.3 * (-((h - 21.0) / 1.5).powi(2)).exp();
                (1.0 - 0.3 * self.amp) + self.amp * (plateau + evening)
            }
        }
    }

    /// The noiseless healthy value at minute `i`.
    fn level(&self, i: u64) -> f64 {
        let day = i / DAY_MIN;
        let h = (i % DAY_MIN) as f64 / 60.0;
        let off = day % 7 >= 5 || self.holidays.contains(&day);
        let d = if off { 1.0 + (self.daily(h) - 1.0) * 0.4 } else { self.daily(h) };
        let w = if off { self.weekend } else { 1.0 };
        let deploy: f64 = self.deploys.iter().filter(|&&(at, _)| i >= at).map(|&(_, f)| f).product();
        self.base * d * w * deploy * (1.0 + self.growth_per_day * day as f64)
    }

    /// The noise factor at minute `i`.
    fn noise(&self, rng: &mut SplitMix64, i: u64) -> f64 {
        let z = match self.family {
            Family::A => rng.normal(),
            Family::B => {
                // Student t(3), scaled to unit variance (× √(1/3)); nights 50 % noisier.
                let chi: f64 = (0..3).map(|_| rng.normal().powi(2)).sum();
                let t = rng.normal() / (chi / 3.0).sqrt() / 3f64.sqrt();
                let h = (i % DAY_MIN) as f64 / 60.0;
                t * if !(7.0..22.0).contains(&h) { 1.5 } else { 1.0 }
            }
        };
        (self.sd * z).exp()
    }

    fn gap(&self, i: u64) -> bool {
        self.gaps.iter().any(|&(a, b)| (a..b).contains(&i))
    }

    /// The largest hourly mean of the noiseless values over the first `days` (the breach rule's
    /// 60-minute mean).
    fn peak(&self, days: u64) -> f64 {
        (0..days * 24).map(|h| (0..60).map(|m| self.level(h * 60 + m)).sum::<f64>() / 60.0).fold(0.0, f64::max)
    }
}

/// The fast-fault shapes, and the drift shapes.
const FAST: [&str; 4] = ["step_short", "step_long", "ramp", "burst"];
const DRIFT: [&str; 4] = ["linear", "accelerating", "exponential", "masked"];

fn timestamp(i: u64) -> String {
    let t = START_NS / 1_000_000_000 + i * 60;
    let (y, m, d) = civil_from_days((t / 86_400) as i64);
    let s = t % 86_400;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// One file: its rows (minute index, value) and its truth.
struct Series {
    name: String,
    rows: Vec<(u64, f64)>,
    truth: SeriesTruth,
}

fn healthy(fam: Family, rng: &mut SplitMix64, n: usize) -> Series {
    let days = 45;
    let shape = Shape::draw(fam, rng, days);
    let threshold = shape.peak(days) * rng.range(1.8, 2.4);
    let rows =
        (0..days * DAY_MIN).filter(|&i| !shape.gap(i)).map(|i| (i, shape.level(i) * shape.noise(rng, i))).collect();
    let truth = SeriesTruth {
        kind: Kind::Healthy,
        shape: "healthy".into(),
        onset_ns: None,
        end_ns: None,
        breach_ns: None,
        slo_threshold: Some(threshold),
    };
    Series { name: format!("healthy_{n:02}.csv"), rows, truth }
}

fn fast(fam: Family, rng: &mut SplitMix64, n: usize) -> Series {
    let days = 28;
    let shape = Shape::draw(fam, rng, days);
    let kind = FAST[n % FAST.len()];
    let onset = (21 + rng.below(6)) * DAY_MIN + rng.below(DAY_MIN);
    let mag = rng.range(2.0, 5.0);
    let (len, ramp) = match kind {
        "step_short" => (10 + rng.below(11), 0),
        "step_long" => (30 + rng.below(31), 0),
        "ramp" => (30, 15),
        _ => (2, 0),
    };
    let threshold = shape.peak(days) * rng.range(1.8, 2.4);
    let factor = |i: u64| -> f64 {
        let Some(d) = i.checked_sub(onset).filter(|&d| d < len) else { return 1.0 };
        if kind == "burst" {
            // 90 s: one whole minute at the magnitude and half of the next.
            return if d == 0 { mag } else { 1.0 + (mag - 1.0) * 0.5 };
        }
        if d < ramp { 1.0 + (mag - 1.0) * (d + 1) as f64 / ramp as f64 } else { mag }
    };
    let rows = (0..days * DAY_MIN)
        .filter(|&i| !shape.gap(i) || (onset..onset + len).contains(&i))
        .map(|i| (i, shape.level(i) * factor(i) * shape.noise(rng, i)))
        .collect();
    let truth = SeriesTruth {
        kind: Kind::Fast,
        shape: kind.into(),
        onset_ns: Some(START_NS + onset * MIN_NS),
        end_ns: Some(START_NS + (onset + len) * MIN_NS),
        breach_ns: None,
        slo_threshold: Some(threshold),
    };
    Series { name: format!("fast_{kind}_{n:02}.csv"), rows, truth }
}

fn drift(fam: Family, rng: &mut SplitMix64, n: usize) -> Series {
    let kind = DRIFT[n % DRIFT.len()];
    let onset_day = 14;
    let span_days = 21 + rng.below(15);
    let days = onset_day + span_days + 5;
    let mut shape = Shape::draw(fam, rng, days);
    // Deploys only before the onset (the masked shape adds its own step down).
    shape.deploys.retain(|&(at, _)| at < onset_day * DAY_MIN);
    let onset = onset_day * DAY_MIN;
    let span = span_days * DAY_MIN;
    let peak = shape.peak(days);
    let threshold = peak * rng.range(1.5, 2.0);
    let mask = if kind == "masked" { 0.8 } else { 1.0 };
    // The multiplier that brings the seasonal peak to the threshold at the end of the span.
    let reach = threshold / peak / mask;
    if kind == "masked" {
        shape.deploys.push((onset + span / 3, mask));
    }
    let factor = |i: u64| -> f64 {
        let tau = i.saturating_sub(onset) as f64 / span as f64;
        match kind {
            "linear" => 1.0 + (reach - 1.0) * tau,
            "accelerating" => 1.0 + (reach - 1.0) * tau * tau,
            "exponential" => reach.powf(tau),
            _ => 1.0 + (reach - 1.0) * tau,
        }
    };
    let rows: Vec<(u64, f64)> = (0..days * DAY_MIN)
        .filter(|&i| !shape.gap(i))
        .map(|i| (i, shape.level(i) * factor(i) * shape.noise(rng, i)))
        .collect();
    // The breach: the first minute whose trailing 60-minute mean is above the threshold.
    let mut sum = 0.0;
    let mut breach = None;
    for (j, &(i, v)) in rows.iter().enumerate() {
        sum += v;
        if j >= 60 {
            sum -= rows[j - 60].1;
            if i >= onset && sum / 60.0 > threshold {
                breach = Some(i);
                break;
            }
        }
    }
    let truth = SeriesTruth {
        kind: Kind::Drift,
        shape: kind.into(),
        onset_ns: Some(START_NS + onset * MIN_NS),
        end_ns: breach.map(|b| START_NS + b * MIN_NS),
        breach_ns: breach.map(|b| START_NS + b * MIN_NS),
        slo_threshold: Some(threshold),
    };
    Series { name: format!("drift_{kind}_{n:02}.csv"), rows, truth }
}

/// Writes family `family` drawn from `seed` into `dir`: 8 healthy series (45 days), 12 fast
/// faults (28 days, the fault on day 21–27) and 8 slow drifts (onset day 14, breach 21–35 days
/// later).
pub fn generate(dir: &Path, family: Family, seed: u64) -> Result<Generated, EvalError> {
    let fam = family.name();
    let data = dir.join("data").join(fam);
    let labels = dir.join("labels");
    for d in [&data, &labels] {
        std::fs::create_dir_all(d).map_err(|e| EvalError::Data(format!("{}: {e}", d.display())))?;
    }
    let mut rng = SplitMix64(seed ^ if family == Family::B { 0xB0B0_B0B0 } else { 0xA0A0_A0A0 });
    let mut all: Vec<Series> = Vec::new();
    all.extend((0..8).map(|n| healthy(family, &mut rng, n)));
    all.extend((0..12).map(|n| fast(family, &mut rng, n)));
    all.extend((0..8).map(|n| drift(family, &mut rng, n)));
    let mut windows = serde_json::Map::new();
    let mut truth = BTreeMap::new();
    let mut rows = 0;
    for s in &all {
        let mut csv = String::with_capacity(s.rows.len() * 32 + 16);
        csv.push_str("timestamp,value\n");
        for &(i, v) in &s.rows {
            let _ = writeln!(csv, "{},{v:.6}", timestamp(i));
        }
        rows += s.rows.len();
        let path = data.join(&s.name);
        std::fs::write(&path, csv).map_err(|e| EvalError::Data(format!("{}: {e}", path.display())))?;
        let key = format!("{fam}/{}", s.name);
        // The label window is the first row at or after the onset through the last row at or
        // before the end (NAB places windows on row timestamps).
        let win: Vec<serde_json::Value> = match (s.truth.onset_ns, s.truth.end_ns) {
            (Some(a), Some(b)) => {
                let at = |t: u64| s.rows.iter().map(|&(i, _)| i).find(|&i| START_NS + i * MIN_NS >= t);
                let before = |t: u64| s.rows.iter().map(|&(i, _)| i).rev().find(|&i| START_NS + i * MIN_NS <= t);
                match (at(a), before(b)) {
                    (Some(x), Some(y)) if y >= x => vec![serde_json::json!([timestamp(x), timestamp(y)])],
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        windows.insert(key.clone(), serde_json::Value::Array(win));
        truth.insert(key, s.truth.clone());
    }
    let write_json = |path: &Path, v: &serde_json::Value| {
        let text = serde_json::to_string_pretty(v).map_err(|e| EvalError::Data(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| EvalError::Data(format!("{}: {e}", path.display())))
    };
    // Two families may share a directory: merge with what is there.
    let merge = |path: &Path, new: serde_json::Map<String, serde_json::Value>| -> serde_json::Value {
        let mut old = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&t).ok())
            .unwrap_or_default();
        old.retain(|k, _| !k.starts_with(&format!("{fam}/")));
        old.extend(new);
        serde_json::Value::Object(old)
    };
    let wpath = dir.join(crate::nab::data::WINDOWS_FILE);
    write_json(&wpath, &merge(&wpath, windows))?;
    let tpath = dir.join(TRUTH_FILE);
    let tmap = serde_json::to_value(&truth).map_err(|e| EvalError::Data(e.to_string()))?;
    let tmap = tmap.as_object().cloned().unwrap_or_default();
    write_json(&tpath, &merge(&tpath, tmap))?;
    Ok(Generated { files: all.len(), rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_nab_rows_from_the_start() {
        assert_eq!(timestamp(0), "2025-01-06 00:00:00");
        assert_eq!(timestamp(1441), "2025-01-07 00:01:00");
        let parsed = crate::nab::data::parse_timestamp(&timestamp(90_000)).unwrap();
        assert_eq!(parsed, START_NS + 90_000 * MIN_NS);
    }

    #[test]
    fn drifts_breach_late_enough_and_faults_sit_in_their_window() {
        let mut rng = SplitMix64(1);
        for n in 0..8 {
            let s = drift(Family::B, &mut rng, n);
            let (Some(o), Some(b)) = (s.truth.onset_ns, s.truth.breach_ns) else { panic!("{}: no breach", s.name) };
            let days = (b - o) as f64 / 86_400e9;
            assert!((18.0..40.0).contains(&days), "{}: breach {days:.1} d after the onset", s.name);
        }
        for n in 0..4 {
            let s = fast(Family::A, &mut rng, n);
            let o = s.truth.onset_ns.unwrap();
            let before: Vec<f64> = s.rows.iter().filter(|r| START_NS + r.0 * MIN_NS < o).map(|r| r.1).collect();
            let at = s.rows.iter().find(|r| START_NS + r.0 * MIN_NS == o).map(|r| r.1).unwrap();
            let prev = s.rows.iter().rev().find(|r| START_NS + r.0 * MIN_NS < o).map(|r| r.1).unwrap();
            assert!(!before.is_empty() && at > 1.2 * prev, "{}: {prev} → {at}", s.name);
        }
    }
}
