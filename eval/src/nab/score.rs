//! The NAB scorer, a port of NAB v1.1's `nab/sweeper.py` (`calcSweepScore`, `calcScoreByThreshold`,
//! `scoreDataSet`), the corpus-wide threshold optimisation of `nab/optimizer.py` and the
//! normalisation of `nab/runner.py`. Differences from the Python are listed in docs/eval-nab.md.

use crate::error::EvalError;
use serde::Serialize;
use std::collections::HashMap;

/// Fraction of each file's rows that is not scored (NAB's `probationaryPercent`).
pub const PROBATION_PERCENT: f64 = 0.15;
/// The threshold that detects nothing; the first entry of every sweep.
pub const START_THRESHOLD: f64 = 1.1;

/// An application profile: the weights of NAB's cost matrix (`config/profiles.json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Profile {
    /// Profile name as NAB writes it.
    pub name: &'static str,
    /// A_TP: earned by a detection at a window's left edge.
    pub tp_weight: f64,
    /// A_FP: weight of the sigmoid penalty of a detection outside every window.
    pub fp_weight: f64,
    /// A_FN: cost of a window without detection.
    pub fn_weight: f64,
}

/// NAB's standard profile.
pub const STANDARD: Profile = Profile { name: "standard", tp_weight: 1.0, fp_weight: 0.11, fn_weight: 1.0 };
/// NAB's reward_low_FP_rate profile.
pub const REWARD_LOW_FP: Profile =
    Profile { name: "reward_low_FP_rate", tp_weight: 1.0, fp_weight: 0.22, fn_weight: 1.0 };
/// NAB's reward_low_FN_rate profile.
pub const REWARD_LOW_FN: Profile =
    Profile { name: "reward_low_FN_rate", tp_weight: 1.0, fp_weight: 0.11, fn_weight: 2.0 };
/// The three profiles, in the order NAB's board lists them.
pub const PROFILES: [Profile; 3] = [STANDARD, REWARD_LOW_FP, REWARD_LOW_FN];

/// The standard sigmoid.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// NAB's scaled sigmoid: `2·sigmoid(−5y) − 1`, and −1 beyond y = 3.
pub fn scaled_sigmoid(y: f64) -> f64 {
    if y > 3.0 { -1.0 } else { 2.0 * sigmoid(-5.0 * y) - 1.0 }
}

/// Rows at the start of a file of `n` rows that are not scored: min(floor(0.15·n), 0.15·5000).
pub fn probationary_length(n: usize) -> f64 {
    (PROBATION_PERCENT * n as f64).floor().min(PROBATION_PERCENT * 5000.0)
}

/// One scorable row (NAB's `AnomalyPoint` after the probationary rows are dropped).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPoint {
    /// The detector's anomaly score.
    pub anomaly: f64,
    /// What the row adds (outside windows) or may earn (inside a window) when detected, weighted.
    pub sweep: f64,
    /// Corpus-wide id of the window holding the row, if any.
    pub window: Option<usize>,
}

/// The score and row counts at one threshold (NAB's `ThresholdScore`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThresholdScore {
    /// Rows with an anomaly score at or above it are detections.
    pub threshold: f64,
    /// Raw NAB score.
    pub score: f64,
    /// Detected rows inside windows.
    pub tp: u64,
    /// Undetected rows outside windows.
    pub tn: u64,
    /// Detected rows outside windows.
    pub fp: u64,
    /// Undetected rows inside windows.
    #[serde(rename = "fn")]
    pub fn_: u64,
}

struct Open {
    id: usize,
    end: u64,
    right: usize,
    width: f64,
}

/// NAB's `calcSweepScore` for one file: appends its scorable rows to `out` and returns how many
/// windows the file has (the ids given are `first_window_id ..`). `windows` are (start, end)
/// timestamps; a window is entered at the row whose timestamp equals its start and left after the
/// row whose timestamp equals its end, exactly as NAB does.
pub fn sweep_file(
    timestamps: &[u64],
    windows: &[(u64, u64)],
    scores: &[f64],
    profile: &Profile,
    first_window_id: usize,
    out: &mut Vec<SweepPoint>,
) -> Result<usize, EvalError> {
    if timestamps.len() != scores.len() {
        return Err(EvalError::Data(format!("{} anomaly scores for {} rows", scores.len(), timestamps.len())));
    }
    let first_index = |t: u64| {
        timestamps
            .iter()
            .position(|&x| x == t)
            .ok_or_else(|| EvalError::Data(format!("a window limit ({t} ns) is not a row's timestamp")))
    };
    let max_tp = scaled_sigmoid(-1.0);
    let probation = probationary_length(timestamps.len());
    let mut next = 0;
    let mut cur: Option<Open> = None;
    let mut prev: Option<(usize, f64)> = None;
    for (i, (&t, &a)) in timestamps.iter().zip(scores).enumerate() {
        if let Some(&(start, end)) = windows.get(next)
            && t == start
        {
            let right = first_index(end)?;
            let left = first_index(start)?;
            cur = Some(Open { id: first_window_id + next, end, right, width: (right as f64 - left as f64 + 1.0) });
            next += 1;
        }
        let sweep = match &cur {
            Some(w) => {
                let position = -(w.right as f64 - i as f64 + 1.0) / w.width;
                scaled_sigmoid(position) * profile.tp_weight / max_tp
            }
            None => {
                let unweighted = match prev {
                    None => -1.0,
                    Some((right, width)) => scaled_sigmoid((right as f64 - i as f64).abs() / (width - 1.0)),
                };
                unweighted * profile.fp_weight
            }
        };
        if i as f64 >= probation {
            let anomaly = if a.is_nan() { 0.0 } else { a };
            out.push(SweepPoint { anomaly, sweep, window: cur.as_ref().map(|w| w.id) });
        }
        if let Some(w) = &cur
            && t == w.end
        {
            prev = Some((w.right, w.width));
            cur = None;
        }
    }
    Ok(windows.len())
}

/// NAB's `calcScoreByThreshold`: the score at every distinct anomaly score, from `START_THRESHOLD`
/// (nothing detected) down to the lowest score (everything detected), in that order.
pub fn score_by_threshold(points: &[SweepPoint], profile: &Profile) -> Vec<ThresholdScore> {
    let mut sorted: Vec<&SweepPoint> = points.iter().collect();
    sorted.sort_by(|a, b| b.anomaly.total_cmp(&a.anomaly));
    // Score parts in NAB's dict order: "fp" first, then windows by first appearance in the sorted list.
    let mut parts: Vec<f64> = vec![0.0];
    let mut slot: HashMap<usize, usize> = HashMap::new();
    for p in &sorted {
        if let Some(w) = p.window {
            slot.entry(w).or_insert_with(|| {
                parts.push(-profile.fn_weight);
                parts.len() - 1
            });
        }
    }
    let total = |parts: &[f64]| parts.iter().fold(0.0, |s, v| s + v);
    let mut tn = sorted.iter().filter(|p| p.window.is_none()).count() as u64;
    let mut fn_ = sorted.len() as u64 - tn;
    let (mut tp, mut fp) = (0u64, 0u64);
    let mut threshold = START_THRESHOLD;
    let mut out = Vec::new();
    for p in sorted {
        if p.anomaly != threshold {
            out.push(ThresholdScore { threshold, score: total(&parts), tp, tn, fp, fn_ });
            threshold = p.anomaly;
        }
        match p.window.and_then(|w| slot.get(&w)) {
            Some(&s) => {
                tp += 1;
                fn_ -= 1;
                parts[s] = parts[s].max(p.sweep);
            }
            None => {
                fp += 1;
                tn -= 1;
                parts[0] += p.sweep;
            }
        }
    }
    out.push(ThresholdScore { threshold, score: total(&parts), tp, tn, fp, fn_ });
    out
}

/// The best entry of a sweep (the first, i.e. highest threshold, among equal scores).
pub fn best(sweep: &[ThresholdScore]) -> Option<ThresholdScore> {
    sweep.iter().fold(None, |b: Option<ThresholdScore>, s| match b {
        Some(b) if b.score >= s.score => Some(b),
        _ => Some(*s),
    })
}

/// NAB's `scoreDataSet` row choice: the entry at `threshold`, else the last one above it. When every
/// entry is above it (NAB returns no row there) the last entry, i.e. every row detected.
pub fn at_threshold(sweep: &[ThresholdScore], threshold: f64) -> Option<ThresholdScore> {
    let mut prev = None;
    for s in sweep {
        if s.threshold == threshold {
            return Some(*s);
        }
        if s.threshold < threshold {
            return prev;
        }
        prev = Some(*s);
    }
    prev
}

/// One file to score: its timestamps, windows and the detector's anomaly score per row.
#[derive(Debug, Clone, Copy)]
pub struct FileInput<'a> {
    /// Path relative to `data/`.
    pub name: &'a str,
    /// Row timestamps in file order.
    pub timestamps: &'a [u64],
    /// Label windows (start, end timestamps).
    pub windows: &'a [(u64, u64)],
    /// Anomaly score per row, in [0, 1].
    pub scores: &'a [f64],
}

/// Counts and score of one file at the profile's threshold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileScore {
    /// Path relative to `data/`.
    pub file: String,
    /// Raw NAB score of the file.
    pub score: f64,
    /// Detected rows inside windows.
    pub tp: u64,
    /// Detected rows outside windows.
    pub fp: u64,
    /// Undetected rows inside windows.
    #[serde(rename = "fn")]
    pub fn_: u64,
    /// Undetected rows outside windows.
    pub tn: u64,
    /// Windows of the file.
    pub windows: usize,
    /// Windows with at least one detection.
    pub windows_detected: usize,
}

/// A detector's result on one profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileScore {
    /// Profile name.
    pub profile: String,
    /// The threshold optimised over the corpus.
    pub threshold: f64,
    /// Raw score: the sum of the files' scores at the threshold.
    pub raw: f64,
    /// Raw score of NAB's null detector (constant 0.5, optimised like any detector).
    pub null: f64,
    /// Raw score of a perfect detector: windows × A_TP.
    pub perfect: f64,
    /// 100 · (raw − null) / (perfect − null).
    pub normalized: f64,
    /// Per file.
    pub files: Vec<FileScore>,
}

/// Sweep rows of every file, and per file its rows' range in the vector.
fn sweep_corpus(
    files: &[FileInput<'_>],
    profile: &Profile,
    score_of: &dyn Fn(&FileInput<'_>) -> Vec<f64>,
) -> Result<(Vec<SweepPoint>, Vec<std::ops::Range<usize>>), EvalError> {
    let mut all = Vec::new();
    let mut ranges = Vec::with_capacity(files.len());
    let mut next_id = 0;
    for f in files {
        let start = all.len();
        let scores = score_of(f);
        next_id += sweep_file(f.timestamps, f.windows, &scores, profile, next_id, &mut all)
            .map_err(|e| EvalError::Data(format!("{}: {e}", f.name)))?;
        ranges.push(start..all.len());
    }
    Ok((all, ranges))
}

/// Scores a corpus on one profile as NAB does: one threshold for the whole corpus maximising the total,
/// then each file scored at it, the raw score their sum, normalised between the null and perfect detectors.
pub fn score_corpus(files: &[FileInput<'_>], profile: &Profile) -> Result<ProfileScore, EvalError> {
    let (all, ranges) = sweep_corpus(files, profile, &|f| f.scores.to_vec())?;
    let threshold = best(&score_by_threshold(&all, profile)).map_or(START_THRESHOLD, |b| b.threshold);
    let mut raw = 0.0;
    let mut per_file = Vec::with_capacity(files.len());
    for (f, r) in files.iter().zip(ranges) {
        let pts = &all[r];
        let s = at_threshold(&score_by_threshold(pts, profile), threshold)
            .ok_or_else(|| EvalError::Data(format!("{}: empty sweep", f.name)))?;
        raw += s.score;
        let mut detected: Vec<usize> =
            pts.iter().filter(|p| p.anomaly >= s.threshold && s.threshold <= 1.0).filter_map(|p| p.window).collect();
        detected.dedup();
        per_file.push(FileScore {
            file: f.name.to_string(),
            score: s.score,
            tp: s.tp,
            fp: s.fp,
            fn_: s.fn_,
            tn: s.tn,
            windows: f.windows.len(),
            windows_detected: detected.len(),
        });
    }
    let null = null_score(files, profile)?;
    let perfect = files.iter().map(|f| f.windows.len()).sum::<usize>() as f64 * profile.tp_weight;
    let normalized = if perfect > null { 100.0 * (raw - null) / (perfect - null) } else { 0.0 };
    Ok(ProfileScore { profile: profile.name.to_string(), threshold, raw, null, perfect, normalized, files: per_file })
}

/// Raw score of NAB's null detector (anomaly score 0.5 on every row) after threshold optimisation.
pub fn null_score(files: &[FileInput<'_>], profile: &Profile) -> Result<f64, EvalError> {
    let (all, _) = sweep_corpus(files, profile, &|f| vec![0.5; f.timestamps.len()])?;
    Ok(best(&score_by_threshold(&all, profile)).map_or(0.0, |b| b.score))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_sigmoid_matches_nab_docstring() {
        assert!((scaled_sigmoid(-1.0) - 0.98661).abs() < 1e-5);
        assert!((scaled_sigmoid(-0.5) - 0.84828).abs() < 1e-5);
        assert_eq!(scaled_sigmoid(0.0), 0.0);
        assert!((scaled_sigmoid(1.0) + 0.98661).abs() < 1e-5);
        assert_eq!(scaled_sigmoid(3.0001), -1.0);
    }

    #[test]
    fn probation_is_capped_at_750_rows() {
        assert_eq!(probationary_length(100), 15.0);
        assert_eq!(probationary_length(4032), 604.0);
        assert_eq!(probationary_length(22_695), 750.0);
    }

    #[test]
    fn at_threshold_follows_nab_row_choice() {
        let pts = [
            SweepPoint { anomaly: 0.9, sweep: -0.1, window: None },
            SweepPoint { anomaly: 0.5, sweep: -0.2, window: None },
        ];
        let sweep = score_by_threshold(&pts, &STANDARD);
        assert_eq!(sweep.iter().map(|s| s.threshold).collect::<Vec<_>>(), vec![1.1, 0.9, 0.5]);
        // 0.7 is between: the row above it (0.9), i.e. detections with score ≥ 0.7.
        assert_eq!(at_threshold(&sweep, 0.7).map(|s| s.fp), Some(1));
        assert_eq!(at_threshold(&sweep, 0.5).map(|s| s.fp), Some(2));
        assert_eq!(at_threshold(&sweep, 0.1).map(|s| s.fp), Some(2));
    }
}
