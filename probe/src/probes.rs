//! The study's probes (`--probe ttft|tps|p99-drift`) and the p99-drift analysis: per-window
//! p99, its Theil–Sen slope, and a Mann–Kendall trend test.

use crate::metrics::{Summary, Window};
use serde::Serialize;
use std::time::Duration;

/// A study probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeKind {
    /// Requests with max_tokens 1, one at a time: TTFT mean and percentiles.
    Ttft,
    /// 128 new tokens per request, one at a time: tokens per second.
    Tps,
    /// Steady load (default 5 minutes at 50 QPS): the slope of the per-window p99.
    #[value(name = "p99-drift")]
    P99Drift,
}

impl ProbeKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Ttft => "ttft",
            ProbeKind::Tps => "tps",
            ProbeKind::P99Drift => "p99-drift",
        }
    }
}

/// p99 of one window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DriftWindow {
    /// Window start from the beginning of the run, seconds.
    pub start_s: f64,
    /// Requests that started in the window and succeeded.
    pub count: u64,
    /// p99 TTFT, seconds.
    pub ttft_p99: Option<f64>,
    /// p99 e2e, seconds.
    pub e2e_p99: Option<f64>,
}

/// A trend estimate over the windows' p99.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Trend {
    /// Windows used (those with enough requests for a p99).
    pub windows: usize,
    /// Theil–Sen slope of p99, seconds per minute.
    pub slope_s_per_min: f64,
    /// Least-squares slope, seconds per minute.
    pub ols_slope_s_per_min: f64,
    /// R² of the least-squares line.
    pub r2: f64,
    /// Mann–Kendall S statistic.
    pub mann_kendall_s: i64,
    /// Two-sided p-value of the Mann–Kendall test (normal approximation).
    pub p_value: f64,
    /// Last minus first p99, relative to the first.
    pub relative_change: f64,
    /// Whether the tail worsens: an increasing trend with p < 0.05.
    pub worsening: bool,
}

/// The result of the p99-drift probe.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Drift {
    /// Window length, seconds.
    pub window_s: f64,
    /// Per-window p99.
    pub windows: Vec<DriftWindow>,
    /// Trend of the e2e p99.
    pub e2e: Option<Trend>,
    /// Trend of the TTFT p99.
    pub ttft: Option<Trend>,
}

/// A window needs this many requests for its p99 to count.
const MIN_WINDOW_COUNT: u64 = 10;

/// Analyses per-window tails.
pub fn drift(windows: &[Window], len: Duration) -> Drift {
    let w = len.as_secs_f64();
    let rows: Vec<DriftWindow> = windows
        .iter()
        .enumerate()
        .map(|(i, win)| DriftWindow {
            start_s: i as f64 * w,
            count: win.e2e.count(),
            ttft_p99: win.ttft.quantile_s(0.99),
            e2e_p99: win.e2e.quantile_s(0.99),
        })
        .collect();
    // The last window is usually partial; like sparse ones, it only counts with enough requests.
    let series = |f: fn(&DriftWindow) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.count >= MIN_WINDOW_COUNT)
            .filter_map(|r| f(r).map(|v| ((r.start_s + w / 2.0) / 60.0, v)))
            .collect()
    };
    Drift { window_s: w, e2e: trend(&series(|r| r.e2e_p99)), ttft: trend(&series(|r| r.ttft_p99)), windows: rows }
}

/// Trend of (minutes, value) points; `None` with fewer than three.
pub fn trend(pts: &[(f64, f64)]) -> Option<Trend> {
    let n = pts.len();
    if n < 3 {
        return None;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    let mut s: i64 = 0;
    for i in 0..n {
        for j in i + 1..n {
            let (dx, dy) = (pts[j].0 - pts[i].0, pts[j].1 - pts[i].1);
            if dx != 0.0 {
                slopes.push(dy / dx);
            }
            s += if dy > 0.0 {
                1
            } else if dy < 0.0 {
                -1
            } else {
                0
            };
        }
    }
    slopes.sort_by(f64::total_cmp);
    let theil_sen = median(&slopes);
    let nf = n as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx = pts.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
    let sxy = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>();
    let syy = pts.iter().map(|p| (p.1 - my).powi(2)).sum::<f64>();
    let ols = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let r2 = if sxx > 0.0 && syy > 0.0 { (sxy * sxy) / (sxx * syy) } else { 0.0 };
    let var = nf * (nf - 1.0) * (2.0 * nf + 5.0) / 18.0;
    let z = match s {
        0 => 0.0,
        s if s > 0 => (s as f64 - 1.0) / var.sqrt(),
        s => (s as f64 + 1.0) / var.sqrt(),
    };
    let p = erfc(z.abs() / std::f64::consts::SQRT_2).clamp(0.0, 1.0);
    let (first, last) = (pts[0].1, pts[n - 1].1);
    let relative_change = if first > 0.0 { (last - first) / first } else { 0.0 };
    Some(Trend {
        windows: n,
        slope_s_per_min: theil_sen,
        ols_slope_s_per_min: ols,
        r2,
        mann_kendall_s: s,
        p_value: p,
        relative_change,
        worsening: s > 0 && p < 0.05 && theil_sen > 0.0,
    })
}

fn median(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Complementary error function (Numerical Recipes' erfc, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Results of `--probe ttft` / `--probe tps`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeReport {
    /// Which probe.
    pub kind: ProbeKind,
    /// TTFT (streamed) or e2e (not streamed) of max_tokens-1 requests, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft: Option<Summary>,
    /// Per-request output tokens / e2e (the study's TPS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tps: Option<Summary>,
    /// Per-request output tokens after the first / (e2e − ttft).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_tps: Option<Summary>,
    /// Mean output tokens per request (TPS probes ask for 128).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_output_tokens: Option<f64>,
    /// The p99-drift analysis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rising_series_is_worsening() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 0.5, 0.1 + 0.01 * i as f64)).collect();
        let t = trend(&pts).unwrap();
        assert!((t.slope_s_per_min - 0.02).abs() < 1e-12, "{t:?}");
        assert!((t.ols_slope_s_per_min - 0.02).abs() < 1e-12);
        assert!((t.r2 - 1.0).abs() < 1e-12);
        assert_eq!(t.mann_kendall_s, 45);
        assert!(t.p_value < 0.001, "{t:?}");
        assert!(t.worsening);
    }

    #[test]
    fn flat_noisy_series_is_not() {
        let v = [0.10, 0.12, 0.09, 0.11, 0.10, 0.12, 0.09, 0.11, 0.10, 0.11];
        let pts: Vec<(f64, f64)> = v.iter().enumerate().map(|(i, &y)| (i as f64, y)).collect();
        let t = trend(&pts).unwrap();
        assert!(!t.worsening, "{t:?}");
        assert!(t.p_value > 0.2);
        assert!(trend(&pts[..2]).is_none());
    }

    #[test]
    fn erfc_values() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-7);
    }
}
