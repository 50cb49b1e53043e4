//! Seasonality removal: robust per-phase medians of the detrended history, fitted by backfitting.
//!
//! A season has a period and a phase width, both in aggregates: `daily` has one phase per aggregate
//! of the day (hour of day with 1h aggregates); `weekly` has one phase per day of the week (its
//! offset from the daily profile). Phases are taken from the epoch-aligned aggregate index, so they
//! are UTC hours and days. A season is fitted only when the history spans at least two periods.
//!
//! The fit, two passes of:
//! 1. the trend slope: Theil-Sen over the per-block medians of the history minus the current seasonal
//!    estimate (a block is the shortest fitted period; blocks at least half full), so that whole
//!    periods, not the seasonal swing, carry the trend and the trend is not absorbed by the seasons;
//! 2. for each season in turn, the median per phase of (history − slope·t − the other seasons),
//!    centred so that the season's phase medians average to zero.
//!
//! The adjusted series is the history minus the fitted seasons; the seasonal peak is the sum of each
//! season's largest phase value (the largest seasonal excursion any hour of the week reaches).

use super::theil_sen;

/// One seasonal component, in aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Season {
    /// Period (aggregates per day or per week).
    pub period: u64,
    /// Width of one phase (1 for the hour of day; a day's aggregates for the day of the week).
    pub step: u64,
}

impl Season {
    fn phases(&self) -> usize {
        (self.period / self.step.max(1)) as usize
    }

    fn phase(&self, idx: u64) -> usize {
        ((idx % self.period.max(1)) / self.step.max(1)) as usize
    }
}

/// The history with its seasons removed.
#[derive(Debug, Clone, PartialEq)]
pub struct Decomposition {
    /// History minus the fitted seasonal components, point by point.
    pub adjusted: Vec<f64>,
    /// Largest value of the summed seasonal components (0 when none is fitted).
    pub peak: f64,
    /// Number of seasons fitted (those with two periods of history).
    pub fitted: usize,
}

/// Removes the seasons of `seasons` that the history (aggregate indices `idx`, increasing; values `y`)
/// spans twice.
pub fn decompose(idx: &[u64], y: &[f64], seasons: &[Season]) -> Decomposition {
    let n = idx.len().min(y.len());
    let (Some(&first), Some(&last)) = (idx.first(), idx[..n].last()) else {
        return Decomposition { adjusted: Vec::new(), peak: 0.0, fitted: 0 };
    };
    let span = last - first + 1;
    let active: Vec<Season> =
        seasons.iter().copied().filter(|s| s.period >= 2 && s.phases() >= 2 && span >= 2 * s.period).collect();
    if active.is_empty() {
        return Decomposition { adjusted: y[..n].to_vec(), peak: 0.0, fitted: 0 };
    }
    let block = active.iter().map(|s| s.period).min().unwrap_or(1);
    let mut comps: Vec<Vec<f64>> = active.iter().map(|s| vec![0.0; s.phases()]).collect();
    let mut seasonal = vec![0.0; n];
    for _pass in 0..2 {
        let deseason: Vec<f64> = (0..n).map(|i| y[i] - seasonal[i]).collect();
        let slope = block_slope(&idx[..n], &deseason, block);
        let resid: Vec<f64> = (0..n).map(|i| y[i] - slope * (idx[i] - first) as f64).collect();
        for k in 0..active.len() {
            let mut groups: Vec<Vec<f64>> = vec![Vec::new(); active[k].phases()];
            for i in 0..n {
                let others: f64 =
                    (0..active.len()).filter(|&j| j != k).map(|j| comps[j][active[j].phase(idx[i])]).sum();
                if let Some(g) = groups.get_mut(active[k].phase(idx[i])) {
                    g.push(resid[i] - others);
                }
            }
            comps[k] = centred_medians(&mut groups);
        }
        for i in 0..n {
            seasonal[i] = (0..active.len()).map(|k| comps[k][active[k].phase(idx[i])]).sum();
        }
    }
    let peak = comps.iter().map(|c| c.iter().copied().fold(f64::NEG_INFINITY, f64::max)).sum::<f64>();
    Decomposition { adjusted: (0..n).map(|i| y[i] - seasonal[i]).collect(), peak, fitted: active.len() }
}

/// Median per phase, centred on the phases that have data; 0 for phases without data.
fn centred_medians(groups: &mut [Vec<f64>]) -> Vec<f64> {
    let medians: Vec<Option<f64>> = groups.iter_mut().map(|g| theil_sen::median(g)).collect();
    let present: Vec<f64> = medians.iter().flatten().copied().collect();
    let centre = if present.is_empty() { 0.0 } else { present.iter().sum::<f64>() / present.len() as f64 };
    medians.iter().map(|m| m.map_or(0.0, |v| v - centre)).collect()
}

/// Theil-Sen slope per aggregate of the medians of blocks of `block` aggregates (blocks at least half
/// full; all non-empty blocks when fewer than two are); 0 when there are fewer than two blocks.
fn block_slope(idx: &[u64], y: &[f64], block: u64) -> f64 {
    let block = block.max(1);
    let mut blocks: Vec<(u64, Vec<f64>)> = Vec::new();
    for (&i, &v) in idx.iter().zip(y) {
        let b = i / block;
        match blocks.last_mut() {
            Some((last, vals)) if *last == b => vals.push(v),
            _ => blocks.push((b, vec![v])),
        }
    }
    let full = blocks.iter().filter(|(_, v)| 2 * v.len() as u64 >= block).count();
    let keep = |v: &Vec<f64>| full < 2 || 2 * v.len() as u64 >= block;
    let (mut t, mut m) = (Vec::new(), Vec::new());
    for (b, mut vals) in blocks {
        if keep(&vals)
            && let Some(med) = theil_sen::median(&mut vals)
        {
            t.push(b as f64);
            m.push(med);
        }
    }
    theil_sen::slope(&t, &m).map_or(0.0, |s| s / block as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Season = Season { period: 24, step: 1 };
    const WEEK: Season = Season { period: 168, step: 24 };

    fn daily_profile(h: u64) -> f64 {
        (2.0 * std::f64::consts::PI * (h % 24) as f64 / 24.0).sin()
    }

    #[test]
    fn removes_a_daily_profile_and_keeps_the_trend() {
        let idx: Vec<u64> = (1000..1000 + 24 * 10).collect();
        let y: Vec<f64> = idx.iter().map(|&i| 5.0 + 0.01 * (i - 1000) as f64 + daily_profile(i)).collect();
        let d = decompose(&idx, &y, &[DAY]);
        assert_eq!(d.fitted, 1);
        let t: Vec<f64> = idx.iter().map(|&i| (i - 1000) as f64).collect();
        let s = theil_sen::slope(&t, &d.adjusted).unwrap();
        assert!((s - 0.01).abs() < 1e-3, "trend kept: {s}");
        let resid_max = t.iter().zip(&d.adjusted).map(|(t, a)| (a - 5.0 - 0.01 * t).abs()).fold(0.0, f64::max);
        assert!(resid_max < 0.06, "seasonal swing removed: {resid_max}");
        assert!((d.peak - 1.0).abs() < 0.06, "peak {}", d.peak);
    }

    #[test]
    fn weekly_day_offsets_need_two_weeks() {
        let offs = [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0];
        let f = |i: u64| 2.0 + offs[((i % 168) / 24) as usize] + daily_profile(i);
        let idx: Vec<u64> = (0..24 * 13).collect();
        let y: Vec<f64> = idx.iter().map(|&i| f(i)).collect();
        assert_eq!(decompose(&idx, &y, &[DAY, WEEK]).fitted, 1, "13 days: weekly not fitted");
        let idx: Vec<u64> = (0..24 * 14).collect();
        let y: Vec<f64> = idx.iter().map(|&i| f(i)).collect();
        let d = decompose(&idx, &y, &[DAY, WEEK]);
        assert_eq!(d.fitted, 2);
        let spread = d.adjusted.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b))
            - d.adjusted.iter().fold(f64::INFINITY, |a, &b| a.min(b));
        assert!(spread < 1e-9, "daily + day-of-week removed exactly: {spread}");
        // Peak: daily max 1 plus the weekday offset above the centre (5/7 of a week at 0, 2/7 at −1).
        assert!((d.peak - (1.0 + 2.0 / 7.0)).abs() < 1e-9, "peak {}", d.peak);
    }
}
