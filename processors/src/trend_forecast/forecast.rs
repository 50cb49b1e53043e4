//! The assessment of one series' history: seasons removed, Mann-Kendall on the whole history and on
//! its most recent parts, Theil-Sen slope and interval, the time until the trend line plus the seasonal peak crosses
//! the threshold, and the urgency mapping to a level in [0, 1].

use super::mann_kendall::{self, MkTest};
use super::season::{self, Season};
use super::theil_sen;

/// Parameters of the assessment (from the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The SLO threshold.
    pub threshold: f64,
    /// True when a breach is rising to the threshold, false when falling to it.
    pub above: bool,
    /// Aggregate length, s.
    pub aggregate_s: f64,
    /// Warning horizon, s (critical within a third of it).
    pub horizon_s: f64,
    /// Aggregates in the long window (the whole rolling history).
    pub long: u64,
    /// Aggregates of the recent windows (the most recent parts of the history), longest first.
    pub recent: Vec<u64>,
    /// Least number of aggregates a window needs to be tested.
    pub min_points: usize,
    /// Significance level of the Mann-Kendall test.
    pub significance: f64,
    /// Highest level while a configured season still lacks two periods of history (a weekly swing
    /// cannot be told from a trend within one week).
    pub provisional_cap: f64,
    /// Level the whole history's test must reach before a recent window may report.
    pub history_significance: f64,
    /// Normal quantile of the slope's two-sided confidence interval.
    pub z_conf: f64,
    /// Seasons to remove.
    pub seasons: Vec<Season>,
}

/// The result of one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowResult {
    /// Aggregates tested.
    pub n: usize,
    /// Span of the window, s (first to last aggregate, inclusive).
    pub span_s: f64,
    /// The Mann-Kendall test (Hamed-Rao corrected).
    pub mk: MkTest,
    /// Theil-Sen slope per aggregate of the deseasonalised values (oriented: a rise is toward the threshold).
    pub slope: f64,
    /// Theil-Sen intercept at the window's first aggregate.
    pub intercept: f64,
    /// Sen's confidence interval of the slope (computed only for a significant trend).
    pub interval: Option<(f64, f64)>,
    /// Deseasonalised trend level at the end of the last aggregate, plus the seasonal peak (oriented).
    pub peak_level: f64,
    /// Forecast (s from the end of the last aggregate): None when the trend does not move toward the threshold.
    pub eta: Option<f64>,
    /// Lower end of the forecast's interval (from the slope's upper end).
    pub eta_low: Option<f64>,
    /// Upper end (from the slope's lower end; +∞ when that does not move toward the threshold).
    pub eta_high: Option<f64>,
    /// True when the trend toward the threshold is significant.
    pub significant: bool,
}

/// What the detector reports for one closed aggregate.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// The window whose result is reported (the most urgent significant one, else the long one).
    pub window: WindowResult,
    /// True when the trend level plus the seasonal peak is already at or past the threshold.
    pub breached: bool,
    /// Forecast to report as `llm.slo.breach_eta`: (eta, low, high) in s; None when no breach is forecast.
    pub forecast: Option<(f64, f64, f64)>,
    /// `llm.anomaly.score`: urgency × (1 − p) (1 when breached).
    pub score: f64,
    /// `llm.anomaly.level`: urgency when the trend is significant (1 when breached; at most
    /// `provisional_cap` while a configured season is not fitted yet), else 0.
    pub level: f64,
    /// Slope per day in the metric's units (not oriented).
    pub slope_per_day: f64,
    /// Trend level plus the seasonal peak, in the metric's units (not oriented).
    pub value: f64,
    /// Number of seasons removed.
    pub seasons_fitted: usize,
}

/// Urgency of a forecast `eta_s` (s) for horizon h: 1 at 0, 0.8 at h/3, 0.6 at h, 0 at 2h and beyond,
/// linear in between (so a breach forecast within h is a warning, within h/3 critical).
pub fn urgency(eta_s: f64, horizon_s: f64) -> f64 {
    let h = horizon_s;
    if eta_s.is_nan() || h <= 0.0 {
        return 0.0;
    }
    let e = eta_s.max(0.0);
    if e <= h / 3.0 {
        1.0 - 0.2 * e / (h / 3.0)
    } else if e <= h {
        0.8 - 0.2 * (e - h / 3.0) / (2.0 * h / 3.0)
    } else if e <= 2.0 * h {
        0.6 * (2.0 * h - e) / h
    } else {
        0.0
    }
}

/// Assesses a history (aggregate index, value; increasing index); `None` below `min_points` aggregates.
pub fn assess(history: &[(u64, f64)], p: &Params) -> Option<Assessment> {
    if history.len() < p.min_points.max(3) {
        return None;
    }
    let sign = if p.above { 1.0 } else { -1.0 };
    let idx: Vec<u64> = history.iter().map(|h| h.0).collect();
    let y: Vec<f64> = history.iter().map(|h| sign * h.1).collect();
    let dec = season::decompose(&idx, &y, &p.seasons);
    let threshold = sign * p.threshold;
    let last = *idx.last()?;
    let long = window(&idx, &dec.adjusted, 0, dec.peak, threshold, p)?;
    let recent: Vec<WindowResult> = p
        .recent
        .iter()
        .filter(|&&w| w < p.long)
        .filter_map(|&w| {
            let from = idx.partition_point(|&i| i + w <= last);
            (history.len() - from >= p.min_points.max(3))
                .then(|| window(&idx, &dec.adjusted, from, dec.peak, threshold, p))
                .flatten()
        })
        .collect();
    let current = recent.last().copied().unwrap_or(long);
    let breached = current.peak_level >= threshold;
    let urgency_of = |w: &WindowResult| w.eta.map_or(0.0, |e| urgency(e, p.horizon_s));
    // The whole history must trend the same way (p ≤ history_significance); a recent window that is
    // significant on its own may then report a more urgent forecast (a trend that started inside the
    // history is steeper there than over the whole of it).
    let mut chosen = long;
    let gate = long.mk.p <= p.history_significance && long.mk.s > 0 && long.slope > 0.0;
    if gate {
        for w in recent.iter().filter(|w| w.significant) {
            if urgency_of(w) > urgency_of(&chosen) {
                chosen = *w;
            }
        }
    }
    let u = urgency_of(&chosen);
    let provisional = dec.fitted < p.seasons.len();
    let (score, level, forecast) = if breached {
        (1.0, 1.0, Some((0.0, 0.0, 0.0)))
    } else if chosen.significant {
        let fc = chosen.eta.map(|e| (e, chosen.eta_low.unwrap_or(e), chosen.eta_high.unwrap_or(f64::INFINITY)));
        (u * (1.0 - chosen.mk.p), if provisional { u.min(p.provisional_cap) } else { u }, fc)
    } else {
        (u * (1.0 - chosen.mk.p), 0.0, None)
    };
    let per_day = 86_400.0 / p.aggregate_s;
    Some(Assessment {
        window: chosen,
        breached,
        forecast,
        score,
        level,
        slope_per_day: sign * chosen.slope * per_day,
        value: sign * current.peak_level,
        seasons_fitted: dec.fitted,
    })
}

/// Tests and fits the points `from..` of the deseasonalised history.
fn window(idx: &[u64], adjusted: &[f64], from: usize, peak: f64, threshold: f64, p: &Params) -> Option<WindowResult> {
    let first = *idx.get(from)?;
    let t: Vec<f64> = idx[from..].iter().map(|&i| (i - first) as f64).collect();
    let y = &adjusted[from..];
    let mut slopes = theil_sen::pairwise_slopes(&t, y);
    let slope = theil_sen::median(&mut slopes)?;
    let intercept = theil_sen::intercept(&t, y, slope)?;
    let correction = mann_kendall::hamed_rao_factor(&t, y, slope);
    let mk = mann_kendall::test(y, correction);
    let significant = mk.p <= p.significance && mk.s > 0 && slope > 0.0;
    let interval =
        if significant { theil_sen::interval(&mut slopes, mk.var_s * mk.correction, p.z_conf) } else { None };
    let t_end = t.last().copied().unwrap_or(0.0) + 1.0;
    // A bucket's aggregate sits at its middle; its end is half an aggregate later.
    let peak_level = intercept + slope * (t_end - 0.5) + peak;
    let gap = threshold - peak_level;
    let to_s = |per_bucket: f64| (gap / per_bucket) * p.aggregate_s;
    let toward = |s: f64| s > 0.0 && s.is_finite();
    let (eta, eta_low, eta_high) = if gap <= 0.0 {
        (Some(0.0), Some(0.0), Some(0.0))
    } else {
        let (lo, hi) = interval.unwrap_or((f64::NAN, f64::NAN));
        (toward(slope).then(|| to_s(slope)), toward(hi).then(|| to_s(hi)), toward(lo).then(|| to_s(lo)))
    };
    Some(WindowResult {
        n: y.len(),
        span_s: t_end * p.aggregate_s,
        mk,
        slope,
        intercept,
        interval,
        peak_level,
        eta,
        eta_low,
        eta_high,
        significant,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urgency_mapping_meets_the_alert_levels() {
        let h = 21.0;
        assert_eq!(urgency(0.0, h), 1.0);
        assert!((urgency(7.0, h) - 0.8).abs() < 1e-12);
        assert!((urgency(21.0, h) - 0.6).abs() < 1e-12);
        assert!(urgency(6.9, h) > 0.8 && urgency(20.9, h) > 0.6 && urgency(21.1, h) < 0.6);
        assert_eq!(urgency(42.0, h), 0.0);
        assert_eq!(urgency(f64::INFINITY, h), 0.0);
        assert_eq!(urgency(f64::NAN, h), 0.0);
        let mut prev = 2.0;
        for i in 0..100 {
            let u = urgency(i as f64 * 0.5, h);
            assert!(u <= prev && (0.0..=1.0).contains(&u));
            prev = u;
        }
    }

    fn params() -> Params {
        Params {
            threshold: 10.0,
            above: true,
            aggregate_s: 3600.0,
            horizon_s: 21.0 * 86_400.0,
            long: 336,
            recent: vec![168],
            min_points: 72,
            significance: 0.01,
            history_significance: 0.05,
            provisional_cap: 0.5,
            z_conf: 1.645,
            seasons: vec![],
        }
    }

    #[test]
    fn a_clean_line_forecasts_its_crossing() {
        // 0.1 per hour from 0 at hour 0 reaches 10 at hour 100; the history ends with hour 79.
        let h: Vec<(u64, f64)> = (0..80).map(|i| (1000 + i, 0.1 * i as f64)).collect();
        let a = assess(&h, &params()).unwrap();
        let (eta, lo, hi) = a.forecast.unwrap();
        // Level at the end of hour 79 (t = 80, midpoint convention: 0.1 · 79.5 = 7.95) → 20.5 h to go.
        assert!((eta - 20.5 * 3600.0).abs() < 1e-6, "eta {eta}");
        assert!((lo - eta).abs() < 1e-6 && (hi - eta).abs() < 1e-6, "exact line: no spread");
        assert!(a.level > 0.8 && a.window.significant && !a.breached);
        assert!((a.slope_per_day - 2.4).abs() < 1e-9);
        // Downward with direction below: the mirror image.
        let h: Vec<(u64, f64)> = (0..80).map(|i| (1000 + i, -0.1 * i as f64)).collect();
        let a = assess(&h, &Params { threshold: -10.0, above: false, ..params() }).unwrap();
        assert!((a.forecast.unwrap().0 - 20.5 * 3600.0).abs() < 1e-6);
        assert!((a.slope_per_day + 2.4).abs() < 1e-9);
        // Away from the threshold: level 0, no forecast.
        let a = assess(&h, &params()).unwrap();
        assert_eq!((a.level, a.forecast), (0.0, None));
    }

    #[test]
    fn past_the_threshold_is_breached() {
        let h: Vec<(u64, f64)> = (0..80).map(|i| (i, 11.0 + if i % 2 == 0 { 0.1 } else { -0.1 })).collect();
        let a = assess(&h, &params()).unwrap();
        assert!(a.breached);
        assert_eq!((a.level, a.score, a.forecast), (1.0, 1.0, Some((0.0, 0.0, 0.0))));
        assert!(assess(&h[..71], &params()).is_none(), "below min_points");
    }
}
