//! `inferwatch eval --nab DIR --detector NAME`: a detector over the Numenta Anomaly Benchmark,
//! scored with NAB's rules (docs/eval-nab.md).
//!
//! [`data`] loads the corpus, [`run`] runs the detector per file through the eval harness,
//! [`score`] is the port of NAB's scorer; [`run_nab`] ties them together into a [`NabReport`].

pub mod data;
pub mod run;
pub mod score;

use crate::error::EvalError;
use inferwatch_core::registry::Registry;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// NAB's published board (README "Scoreboard", NAB v1.0): detector, standard, reward low FP, reward low FN.
pub const BOARD: &[(&str, f64, f64, f64)] = &[
    ("Perfect", 100.0, 100.0, 100.0),
    ("ARTime", 74.9, 65.1, 80.4),
    ("Numenta HTM", 70.5, 62.6, 75.2),
    ("CAD OSE", 69.9, 67.0, 73.2),
    ("earthgecko Skyline", 58.2, 46.2, 63.9),
    ("KNN CAD", 58.0, 43.4, 64.8),
    ("Relative Entropy", 54.6, 47.6, 58.8),
    ("Random Cut Forest", 51.7, 38.4, 59.7),
    ("Twitter ADVec v1.0.0", 47.1, 33.6, 53.5),
    ("Windowed Gaussian", 39.6, 20.9, 47.4),
    ("Etsy Skyline", 35.7, 27.1, 44.5),
    ("Bayesian Changepoint", 17.7, 3.2, 32.2),
    ("EXPoSE", 16.4, 3.2, 26.9),
    ("Random", 11.0, 1.2, 19.5),
    ("Null", 0.0, 0.0, 0.0),
];

/// The result of a NAB run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NabReport {
    /// Detector name (or the override file's name).
    pub detector: String,
    /// Files scored.
    pub files: usize,
    /// Rows over all files.
    pub rows: usize,
    /// Label windows over all files.
    pub windows: usize,
    /// `llm.anomaly.level` points received.
    pub level_points: usize,
    /// Level points at no row's timestamp (mapped to the next row).
    pub unmatched_points: usize,
    /// Seconds the detector runs and the scoring took.
    pub elapsed_s: f64,
    /// Per profile: standard, reward_low_FP_rate, reward_low_FN_rate.
    pub profiles: Vec<score::ProfileScore>,
}

impl NabReport {
    /// The normalised score of a profile by NAB name.
    pub fn normalized(&self, profile: &str) -> Option<f64> {
        self.profiles.iter().find(|p| p.profile == profile).map(|p| p.normalized)
    }

    /// The board with this run's row placed by its standard score, as text.
    pub fn table(&self) -> String {
        let get = |i: usize| self.profiles.get(i).map_or(f64::NAN, |p| p.normalized);
        let ours = (format!("inferwatch {} (this run)", self.detector), get(0), get(1), get(2));
        let mut rows: Vec<(String, f64, f64, f64, bool)> =
            BOARD.iter().map(|&(n, a, b, c)| (n.to_string(), a, b, c, false)).collect();
        let at = rows.iter().position(|r| r.1 < ours.1).unwrap_or(rows.len());
        rows.insert(at, (ours.0, ours.1, ours.2, ours.3, true));
        let mut s = String::new();
        let _ = writeln!(s, "NAB v1.1 corpus: {} files, {} rows, {} windows", self.files, self.rows, self.windows);
        let _ = writeln!(s, "{:<40} {:>9} {:>14} {:>14}", "detector", "standard", "reward low FP", "reward low FN");
        for (name, a, b, c, mine) in rows {
            let mark = if mine { "*" } else { " " };
            let _ = writeln!(s, "{mark}{name:<39} {a:>9.1} {b:>14.1} {c:>14.1}");
        }
        for p in &self.profiles {
            let (tp, fp): (u64, u64) = p.files.iter().fold((0, 0), |(t, f), x| (t + x.tp, f + x.fp));
            let det: usize = p.files.iter().map(|f| f.windows_detected).sum();
            let _ = writeln!(
                s,
                "{}: threshold {:.6}, raw {:.2} (null {:.2}, perfect {:.2}), windows detected {det}/{}, \
                 TP rows {tp}, FP rows {fp}",
                p.profile, p.threshold, p.raw, p.null, p.perfect, self.windows
            );
        }
        s
    }

    /// Prints [`NabReport::table`] to stdout.
    pub fn print_table(&self) {
        print!("{}", self.table());
    }
}

/// Scores per-row anomaly scores of every file of `corpus` (same order) on the three profiles.
pub fn score_runs(
    detector: &str,
    corpus: &data::NabCorpus,
    scores: &[Vec<f64>],
) -> Result<Vec<score::ProfileScore>, EvalError> {
    let inputs: Vec<score::FileInput<'_>> = corpus
        .files
        .iter()
        .zip(scores)
        .map(|(f, s)| score::FileInput { name: &f.name, timestamps: &f.timestamps, windows: &f.windows, scores: s })
        .collect();
    if inputs.len() != corpus.files.len() {
        return Err(EvalError::Data(format!(
            "{detector}: scores for {} of {} files",
            inputs.len(),
            corpus.files.len()
        )));
    }
    score::PROFILES.iter().map(|p| score::score_corpus(&inputs, p)).collect()
}

/// Runs `detector` (or the processors of `config_override`) over the NAB corpus in `dir` and scores it.
/// `progress(done, total)` is called after each file.
pub async fn run_nab(
    dir: &Path,
    detector: &str,
    config_override: Option<&Path>,
    registry: Registry,
    progress: &dyn Fn(usize, usize),
) -> Result<NabReport, EvalError> {
    let started = Instant::now();
    let corpus = data::load_corpus(dir)?;
    let fixed = config_override.map(run::override_processors).transpose()?;
    let total = corpus.files.len();
    let (mut scores, mut level_points, mut unmatched) = (Vec::with_capacity(total), 0, 0);
    for (i, file) in corpus.files.iter().enumerate() {
        let processors = match &fixed {
            Some(p) => p.clone(),
            None => run::builtin_processors(detector, file)?,
        };
        let r = run::run_file(file, &processors, registry.clone())
            .await
            .map_err(|e| EvalError::Data(format!("{}: {e}", file.name)))?;
        tracing::debug!(file = %file.name, points = r.points, unmatched = r.unmatched, "NAB file run");
        level_points += r.points;
        unmatched += r.unmatched;
        scores.push(r.scores);
        progress(i + 1, total);
    }
    let profiles = score_runs(detector, &corpus, &scores)?;
    Ok(NabReport {
        detector: detector.to_string(),
        files: total,
        rows: corpus.rows(),
        windows: corpus.windows(),
        level_points,
        unmatched_points: unmatched,
        elapsed_s: started.elapsed().as_secs_f64(),
        profiles,
    })
}
