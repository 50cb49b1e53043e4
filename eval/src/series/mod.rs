//! `inferwatch eval --series DIR`: one detector over labelled series in NAB's layout (a user's
//! own, or the held-out families of [`families`]), scored as alerts would fire — detection delay of
//! each labelled fault, lead before each drift's breach, false alarms per 30 days of unlabelled
//! time — over a sweep of the warning threshold (the trade-off curve), plus NAB's standard score.
//!
//! Alerts are emulated on the detector's `llm.anomaly.level` points as the `alerts` connector
//! fires them: an episode starts when the level has stayed ≥ the threshold for `for` (the
//! detector's built-in `for`: [`alert_for_s`]) and ends when it has stayed below for 2 minutes;
//! an episode is critical when its level reaches 0.8.

pub mod families;

use crate::error::EvalError;
use crate::harness::Point;
use crate::nab::data::{self, NabCorpus, NabFile};
use crate::nab::run;
use inferwatch_core::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Ground truth next to the labels (written by the generator; optional for a user's series).
pub const TRUTH_FILE: &str = "labels/truth.json";
/// A fast fault counts as caught when an alert fires within this many seconds of its onset.
pub const FAST_S: f64 = 300.0;
/// A drift counts as warned when an alert fires at least this many days before the breach.
pub const LEAD_D: f64 = 14.0;
/// Level at which an episode is critical (the alerts connector's default).
pub const CRITICAL: f64 = 0.8;
/// The warning thresholds of the trade-off curve.
pub const THRESHOLDS: [f64; 9] = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];
/// A quiet run this long ends an episode (the connector's `resolve_after`).
const RESOLVE_NS: u64 = 120_000_000_000;
const DAY_NS: f64 = 86_400e9;

/// What a labelled series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Nothing wrong.
    Healthy,
    /// A fault to catch within minutes.
    Fast,
    /// A slow drift to warn of before its breach.
    Drift,
}

/// One file's ground truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesTruth {
    /// What it is.
    pub kind: Kind,
    /// The shape drawn (e.g. `step_short`, `exponential`).
    pub shape: String,
    /// Fault or drift onset.
    pub onset_ns: Option<u64>,
    /// Fault end (drift: the breach).
    pub end_ns: Option<u64>,
    /// Drift: the first SLO breach.
    pub breach_ns: Option<u64>,
    /// The SLO threshold on the value (trend_forecast's `threshold`).
    pub slo_threshold: Option<f64>,
}

/// `for` of a detector's alerts, seconds, as the `alerts` connector has it built in (2 minutes
/// unless the detector confirms over its own windows).
pub fn alert_for_s(detector: &str) -> u64 {
    match detector {
        "cusum" | "anomaly_ensemble" | "trend_forecast" | "delta_ab" | "slo_burn" | "peer_outlier" => 0,
        _ => 120,
    }
}

/// The truth of every file: `truth.json` where it names the file, else a fast fault per label
/// window (onset = the window's start) and healthy when the file has none.
pub fn truths(dir: &Path, corpus: &NabCorpus) -> Result<BTreeMap<String, Vec<SeriesTruth>>, EvalError> {
    let path = dir.join(TRUTH_FILE);
    let given: BTreeMap<String, SeriesTruth> = match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| EvalError::Data(format!("{}: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(EvalError::Data(format!("{}: {e}", path.display()))),
    };
    Ok(corpus
        .files
        .iter()
        .map(|f| {
            let t = match given.get(&f.name) {
                Some(t) => vec![t.clone()],
                None if f.windows.is_empty() => vec![SeriesTruth {
                    kind: Kind::Healthy,
                    shape: String::new(),
                    onset_ns: None,
                    end_ns: None,
                    breach_ns: None,
                    slo_threshold: None,
                }],
                None => f
                    .windows
                    .iter()
                    .map(|&(a, b)| SeriesTruth {
                        kind: Kind::Fast,
                        shape: "window".into(),
                        onset_ns: Some(a),
                        end_ns: Some(b),
                        breach_ns: None,
                        slo_threshold: None,
                    })
                    .collect(),
            };
            (f.name.clone(), t)
        })
        .collect())
}

/// The built-in processors of `detector` on a series file (`threshold`: its SLO, for trend_forecast).
pub fn builtin(detector: &str, file: &NabFile, threshold: Option<f64>) -> Result<Vec<(String, Value)>, EvalError> {
    let step_s = (file.step_ns() / 1_000_000_000).max(1);
    let idle = "10000h";
    let m = run::METRIC;
    match detector {
        "cusum" => {
            Ok(vec![("cusum".into(), json!({"metrics": [m], "interval": format!("{step_s}s"), "idle_timeout": idle}))])
        }
        "zscore_skew" => Ok(vec![("zscore_skew".into(), json!({"metrics": [m], "window": 50, "idle_timeout": idle}))]),
        "ewma_chart" => Ok(vec![("ewma_chart".into(), json!({"metrics": [m], "idle_timeout": idle}))]),
        "anomaly_ensemble" => Ok(vec![("anomaly_ensemble".into(), json!({"metrics": [m], "idle_timeout": idle}))]),
        "trend_forecast" => {
            let Some(t) = threshold else {
                return Err(EvalError::Config(format!(
                    "{}: trend_forecast needs an SLO threshold in {TRUTH_FILE}",
                    file.name
                )));
            };
            Ok(vec![(
                "trend_forecast".into(),
                json!({"metric": m, "threshold": t, "direction": "above", "statistic": "p95", "idle_timeout": idle}),
            )])
        }
        other => Err(EvalError::Config(format!(
            "no built-in series configuration for {other:?}: built in are cusum, anomaly_ensemble, zscore_skew, ewma_chart, trend_forecast; others need --config FILE"
        ))),
    }
}

/// The placeholder of a `--config` file for the file's SLO threshold (from `truth.json`).
pub const THRESHOLD_VAR: &str = "${env:SLO_THRESHOLD}";

/// `processors` with every string [`THRESHOLD_VAR`] replaced by `threshold` (a number); an error
/// naming the file when the placeholder is used and the file has no threshold.
pub fn with_threshold(
    processors: &[(String, Value)],
    threshold: Option<f64>,
    file: &str,
) -> Result<Vec<(String, Value)>, EvalError> {
    fn walk(v: &mut Value, t: Option<f64>, used: &mut bool) {
        match v {
            Value::String(s) if s == THRESHOLD_VAR => {
                *used = true;
                if let Some(n) = t.and_then(serde_json::Number::from_f64) {
                    *v = Value::Number(n);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, t, used)),
            Value::Object(o) => o.values_mut().for_each(|x| walk(x, t, used)),
            _ => {}
        }
    }
    let mut out = processors.to_vec();
    let mut used = false;
    for (_, v) in &mut out {
        walk(v, threshold, &mut used);
    }
    if used && threshold.is_none() {
        return Err(EvalError::Config(format!(
            "{file}: the config uses {THRESHOLD_VAR} but {TRUTH_FILE} gives no slo_threshold"
        )));
    }
    Ok(out)
}

/// One alert episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Episode {
    /// When it fired.
    pub fire_ns: u64,
    /// Whether its level reached [`CRITICAL`].
    pub critical: bool,
    /// Index of the level point it fired on.
    pub at: usize,
}

/// The episodes of the level points `points` (time order) at warning threshold `warning` and `for` `for_ns`.
pub fn episodes(points: &[(u64, f64)], warning: f64, for_ns: u64) -> Vec<Episode> {
    let mut out: Vec<Episode> = Vec::new();
    let (mut pending, mut firing, mut quiet) = (None::<u64>, false, None::<u64>);
    for (i, &(t, l)) in points.iter().enumerate() {
        if l >= warning {
            // A quiet run that lasted resolve_after up to this point ended the episode before it.
            if firing && quiet.is_some_and(|q| t - q >= RESOLVE_NS) {
                firing = false;
            }
            quiet = None;
            if firing {
                if l >= CRITICAL
                    && let Some(e) = out.last_mut()
                {
                    e.critical = true;
                }
                continue;
            }
            let since = *pending.get_or_insert(t);
            if t - since >= for_ns {
                firing = true;
                out.push(Episode { fire_ns: t, critical: l >= CRITICAL, at: i });
            }
        } else {
            pending = None;
            if firing {
                let q = *quiet.get_or_insert(t);
                if t - q >= RESOLVE_NS {
                    firing = false;
                    quiet = None;
                }
            }
        }
    }
    out
}

/// One point of the trade-off curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Warning threshold on the level.
    pub threshold: f64,
    /// Episodes per 30 days of unlabelled time.
    pub false_alarms_per_30d: f64,
    /// ... of which critical.
    pub critical_per_30d: f64,
    /// Largest count of false episodes on one healthy-30-day-normalised file.
    pub worst_file_per_30d: f64,
    /// Fast faults caught within [`FAST_S`], of `fast`.
    pub fast_caught: usize,
    /// Fast faults.
    pub fast: usize,
    /// Median delay of the detected faults (an alert by the fault's end, or within an hour of the onset), seconds.
    pub median_delay_s: Option<f64>,
    /// Drifts warned ≥ [`LEAD_D`] days before the breach, of `drifts`.
    pub drift_warned: usize,
    /// Drifts with a breach.
    pub drifts: usize,
    /// Median lead of the warned drifts, days.
    pub median_lead_d: Option<f64>,
    /// Drifts whose first alert after the onset carried a forecast.
    pub forecasts: usize,
    /// ... of which the true time to the breach was inside the forecast's interval.
    pub interval_covered: usize,
    /// Median of true time to the breach ÷ forecast ETA at those first alerts (1: exact).
    pub median_eta_ratio: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// One file's run: its rows' first and last times, its truth and its level points (time order).
#[derive(Debug, Clone, Copy)]
pub struct FileLevels<'a> {
    /// First row's time.
    pub first_ns: u64,
    /// Last row's time.
    pub last_ns: u64,
    /// Its truth.
    pub truth: &'a [SeriesTruth],
    /// `(time, level)` points.
    pub levels: &'a [(u64, f64)],
    /// The forecast on each level point, if it has one: `(eta, low, high)` in seconds (evidence
    /// `eta`, `eta_low`, `eta_high` of trend_forecast), parallel to `levels` (may be empty).
    pub etas: &'a [Option<(f64, f64, f64)>],
}

/// The curve point at `threshold` over `files`.
pub fn curve_point(threshold: f64, for_ns: u64, files: &[FileLevels<'_>]) -> CurvePoint {
    let (mut quiet_ns, mut fa, mut crit, mut worst) = (0u64, 0usize, 0usize, 0.0f64);
    let (mut fast, mut fast_caught, mut delays) = (0, 0, Vec::new());
    let (mut drifts, mut warned, mut leads) = (0, 0, Vec::new());
    let (mut forecasts, mut covered, mut ratios) = (0, 0, Vec::new());
    for &FileLevels { first_ns: first, last_ns: last, truth, levels: points, etas } in files {
        let eps = episodes(points, threshold, for_ns);
        // Unlabelled time: before the first onset (the whole file when healthy).
        let quiet_end = truth.iter().filter_map(|t| t.onset_ns).min().unwrap_or(last);
        let span = quiet_end.saturating_sub(first);
        quiet_ns += span;
        let false_eps: Vec<&Episode> = eps.iter().filter(|e| e.fire_ns < quiet_end).collect();
        fa += false_eps.len();
        crit += false_eps.iter().filter(|e| e.critical).count();
        if span as f64 >= DAY_NS {
            worst = worst.max(false_eps.len() as f64 * 30.0 * DAY_NS / span as f64);
        }
        for t in truth {
            let Some(onset) = t.onset_ns else { continue };
            let first_after = eps.iter().find(|e| e.fire_ns >= onset);
            match t.kind {
                Kind::Fast => {
                    fast += 1;
                    if let Some(e) = first_after.filter(|e| {
                        t.end_ns.is_none_or(|end| e.fire_ns <= end.max(onset.saturating_add(3_600_000_000_000)))
                    }) {
                        let d = (e.fire_ns - onset) as f64 / 1e9;
                        delays.push(d);
                        fast_caught += usize::from(d <= FAST_S);
                    }
                }
                Kind::Drift => {
                    let Some(b) = t.breach_ns else { continue };
                    drifts += 1;
                    // As in the scenario scoring: only an alert that forecasts the breach warns of it.
                    let forecasting =
                        eps.iter().find(|e| e.fire_ns >= onset && matches!(etas.get(e.at), Some(Some(_))));
                    if let Some(e) = forecasting.filter(|e| e.fire_ns < b) {
                        let lead = (b - e.fire_ns) as f64 / DAY_NS;
                        if let Some(&Some((eta, lo, hi))) = etas.get(e.at) {
                            let real = lead * 86_400.0;
                            forecasts += 1;
                            covered += usize::from(lo <= real && real <= hi);
                            if eta > 0.0 {
                                ratios.push(real / eta);
                            }
                        }
                        if lead >= LEAD_D {
                            warned += 1;
                            leads.push(lead);
                        }
                    }
                }
                Kind::Healthy => {}
            }
        }
    }
    let per_30d = |n: usize| if quiet_ns > 0 { n as f64 * 30.0 * DAY_NS / quiet_ns as f64 } else { 0.0 };
    CurvePoint {
        threshold,
        false_alarms_per_30d: per_30d(fa),
        critical_per_30d: per_30d(crit),
        worst_file_per_30d: worst,
        fast_caught,
        fast,
        median_delay_s: median(delays),
        drift_warned: warned,
        drifts,
        median_lead_d: median(leads),
        forecasts,
        interval_covered: covered,
        median_eta_ratio: median(ratios),
    }
}

/// One file at the alerts' default warning (0.6).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileScore {
    /// The file.
    pub file: String,
    /// Its truth's shape(s).
    pub shape: String,
    /// Episodes before the first onset (the whole file when healthy).
    pub false_alarms: usize,
    /// ... of which critical.
    pub false_criticals: usize,
    /// When the first 10 false alarms fired (ns), to look them up.
    pub false_alarm_times: Vec<u64>,
    /// First episode after the first onset minus the onset, seconds.
    pub delay_s: Option<f64>,
}

/// The result of `--series`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesReport {
    /// Detector label.
    pub detector: String,
    /// Files scored.
    pub files: usize,
    /// Rows over all files.
    pub rows: usize,
    /// `for` used, seconds.
    pub for_s: u64,
    /// The trade-off curve, one point per [`THRESHOLDS`] entry.
    pub curve: Vec<CurvePoint>,
    /// Per file at warning 0.6.
    pub per_file: Vec<FileScore>,
    /// NAB's normalised standard score of the same run.
    pub nab_standard: f64,
    /// Seconds the run took.
    pub elapsed_s: f64,
}

impl SeriesReport {
    /// The curve as a Markdown table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {} files, {} rows, alerts `for` {} s, NAB standard {:.1}\n",
            self.detector, self.files, self.rows, self.for_s, self.nab_standard
        );
        let _ = writeln!(
            s,
            "| warning at | FA / 30 d | critical / 30 d | worst file / 30 d | fast ≤ 5 min | median delay | drift ≥ 14 d | median lead | ETA interval holds | true / ETA |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for c in &self.curve {
            let opt = |v: Option<f64>, unit: &str| v.map_or("–".to_string(), |v| format!("{v:.1} {unit}"));
            let _ = writeln!(
                s,
                "| {:.2} | {:.2} | {:.2} | {:.1} | {}/{} | {} | {}/{} | {} | {}/{} | {} |",
                c.threshold,
                c.false_alarms_per_30d,
                c.critical_per_30d,
                c.worst_file_per_30d,
                c.fast_caught,
                c.fast,
                opt(c.median_delay_s, "s"),
                c.drift_warned,
                c.drifts,
                opt(c.median_lead_d, "d"),
                c.interval_covered,
                c.forecasts,
                c.median_eta_ratio.map_or("–".to_string(), |r| format!("{r:.2}")),
            );
        }
        let noisy: Vec<&FileScore> = self.per_file.iter().filter(|f| f.false_alarms > 0).collect();
        if !noisy.is_empty() {
            let _ = writeln!(s, "\nFiles with false alarms at warning 0.6:");
            for f in noisy {
                let _ = writeln!(s, "  {}: {} ({} critical)", f.file, f.false_alarms, f.false_criticals);
            }
        }
        s
    }
}

/// Runs `detector` (or the processors of `config_override`) over every file of `dir` and scores it.
pub async fn run_series(
    dir: &Path,
    detector: &str,
    config_override: Option<&Path>,
    registry: Registry,
    progress: &dyn Fn(usize, usize),
) -> Result<SeriesReport, EvalError> {
    let started = std::time::Instant::now();
    let corpus = data::load_corpus(dir)?;
    let truth = truths(dir, &corpus)?;
    let fixed = config_override.map(run::override_processors).transpose()?;
    let for_ns = alert_for_s(detector) * 1_000_000_000;
    let mut levels: Vec<Vec<(u64, f64)>> = Vec::with_capacity(corpus.files.len());
    let mut etas: Vec<Vec<Option<(f64, f64, f64)>>> = Vec::with_capacity(corpus.files.len());
    let mut rows_scores = Vec::with_capacity(corpus.files.len());
    for (i, file) in corpus.files.iter().enumerate() {
        let t = truth.get(&file.name).map(Vec::as_slice).unwrap_or_default();
        let threshold = t.iter().find_map(|t| t.slo_threshold);
        let processors = match &fixed {
            Some(p) => with_threshold(p, threshold, &file.name)?,
            None => builtin(detector, file, threshold)?,
        };
        let mut points: Vec<Point> = run::level_points(file, &processors, registry.clone()).await?;
        points.sort_by_key(|p| p.time_ns);
        rows_scores.push(run::row_scores(file, &points).0);
        levels.push(points.iter().map(|p| (p.time_ns, p.value.clamp(0.0, 1.0))).collect());
        let num = |p: &Point, k: &str| p.attrs.get(k).and_then(|v| v.parse::<f64>().ok());
        etas.push(
            points
                .iter()
                .map(|p| Some((num(p, "eta")?, num(p, "eta_low")?, num(p, "eta_high").unwrap_or(f64::INFINITY))))
                .collect(),
        );
        progress(i + 1, corpus.files.len());
    }
    let files: Vec<FileLevels<'_>> = corpus
        .files
        .iter()
        .zip(levels.iter().zip(&etas))
        .map(|(f, (l, e))| FileLevels {
            first_ns: f.timestamps.first().copied().unwrap_or(0),
            last_ns: f.timestamps.last().copied().unwrap_or(0),
            truth: truth.get(&f.name).map(Vec::as_slice).unwrap_or_default(),
            levels: l.as_slice(),
            etas: e.as_slice(),
        })
        .collect();
    let curve = THRESHOLDS.iter().map(|&th| curve_point(th, for_ns, &files)).collect();
    let per_file = corpus
        .files
        .iter()
        .zip(&files)
        .map(|(f, &FileLevels { last_ns: last, truth, levels: points, .. })| {
            let eps = episodes(points, 0.6, for_ns);
            let onset = truth.iter().filter_map(|t| t.onset_ns).min();
            let quiet_end = onset.unwrap_or(last);
            let false_eps: Vec<&Episode> = eps.iter().filter(|e| e.fire_ns < quiet_end).collect();
            FileScore {
                file: f.name.clone(),
                shape: truth.iter().map(|t| t.shape.as_str()).collect::<Vec<_>>().join(","),
                false_alarms: false_eps.len(),
                false_criticals: false_eps.iter().filter(|e| e.critical).count(),
                false_alarm_times: false_eps.iter().take(10).map(|e| e.fire_ns).collect(),
                delay_s: onset.and_then(|o| eps.iter().find(|e| e.fire_ns >= o).map(|e| (e.fire_ns - o) as f64 / 1e9)),
            }
        })
        .collect();
    let profiles = crate::nab::score_runs(detector, &corpus, &rows_scores)?;
    Ok(SeriesReport {
        detector: detector.to_string(),
        files: corpus.files.len(),
        rows: corpus.rows(),
        for_s: for_ns / 1_000_000_000,
        curve,
        per_file,
        nab_standard: profiles.first().map_or(f64::NAN, |p| p.normalized),
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 60_000_000_000;

    #[test]
    fn the_threshold_placeholder_is_filled_per_file() {
        let procs = vec![(
            "trend_forecast".to_string(),
            json!({"metric": "nab.value", "threshold": THRESHOLD_VAR, "x": [THRESHOLD_VAR]}),
        )];
        let got = with_threshold(&procs, Some(1.5), "f").unwrap();
        assert_eq!(got[0].1, json!({"metric": "nab.value", "threshold": 1.5, "x": [1.5]}));
        let err = with_threshold(&procs, None, "a/f.csv").unwrap_err().to_string();
        assert!(err.contains("a/f.csv") && err.contains("slo_threshold"), "{err}");
        // Without the placeholder a missing threshold is fine.
        let plain = vec![("cusum".to_string(), json!({"metrics": ["nab.value"]}))];
        assert_eq!(with_threshold(&plain, None, "f").unwrap(), plain);
    }

    #[test]
    fn episodes_need_their_for_and_end_after_a_quiet_run() {
        let pts: Vec<(u64, f64)> = [0.0, 0.7, 0.7, 0.7, 0.1, 0.7, 0.1, 0.1, 0.1, 0.9, 0.9]
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u64 * M, l))
            .collect();
        // for 0: fires at 1; the dip at 4 is shorter than 2 min, so 5 continues it; quiet 6..8 ends it; 9 fires critical.
        let e = episodes(&pts, 0.6, 0);
        assert_eq!(
            e,
            vec![Episode { fire_ns: M, critical: false, at: 1 }, Episode { fire_ns: 9 * M, critical: true, at: 9 }]
        );
        // for 2m: 1..3 holds for 2 min → fires at 3; 9..10 holds only 1 min.
        let e = episodes(&pts, 0.6, 2 * M);
        assert_eq!(e, vec![Episode { fire_ns: 3 * M, critical: false, at: 3 }]);
        // A higher threshold sees only the critical run.
        assert_eq!(episodes(&pts, 0.8, 0).len(), 1);
    }

    #[test]
    fn the_curve_counts_false_alarms_delays_and_leads_on_a_known_case() {
        let day = 86_400_000_000_000u64;
        let truth = |kind, shape: &str, onset_ns, end_ns, breach_ns| {
            [SeriesTruth { kind, shape: shape.into(), onset_ns, end_ns, breach_ns, slo_threshold: None }]
        };
        let healthy = truth(Kind::Healthy, "", None, None, None);
        let fast = truth(Kind::Fast, "step", Some(10 * day), Some(10 * day + 30 * M), None);
        let drift = truth(Kind::Drift, "linear", Some(5 * day), None, Some(30 * day));
        // Healthy 30 days: two episodes, one at level 0.7, one at 0.85.
        let h: Vec<(u64, f64)> = vec![(day, 0.7), (2 * day, 0.0), (3 * day, 0.85), (4 * day, 0.0), (30 * day, 0.0)];
        // Fast: an alarm 3 minutes after the onset at 0.65.
        let f: Vec<(u64, f64)> = vec![(0, 0.0), (10 * day + 3 * M, 0.65), (10 * day + 4 * M, 0.0), (11 * day, 0.0)];
        // Drift: 0.75 on day 12 (18 days before the breach).
        let d: Vec<(u64, f64)> = vec![(0, 0.0), (12 * day, 0.75), (12 * day + 10 * M, 0.0), (31 * day, 0.0)];
        // Its alert forecast the breach in 15 d (12–20 d): the true 18 d is inside, ratio 1.2.
        let de = vec![None, Some((15.0 * 86_400.0, 12.0 * 86_400.0, 20.0 * 86_400.0)), None, None];
        let files = [
            FileLevels { first_ns: 0, last_ns: 30 * day, truth: &healthy, levels: &h, etas: &[] },
            FileLevels { first_ns: 0, last_ns: 11 * day, truth: &fast, levels: &f, etas: &[] },
            FileLevels { first_ns: 0, last_ns: 31 * day, truth: &drift, levels: &d, etas: &de },
        ];
        let at = |th| curve_point(th, 0, &files);
        // Quiet time: 30 + 10 + 5 = 45 days; 2 false episodes → 1.33 per 30 days, 1 critical.
        let c = at(0.6);
        assert!((c.false_alarms_per_30d - 2.0 * 30.0 / 45.0).abs() < 1e-9, "{c:?}");
        assert!((c.critical_per_30d - 30.0 / 45.0).abs() < 1e-9);
        assert!((c.worst_file_per_30d - 2.0).abs() < 1e-9);
        assert_eq!((c.fast_caught, c.fast, c.median_delay_s), (1, 1, Some(180.0)));
        assert_eq!((c.drift_warned, c.drifts), (1, 1));
        assert!((c.median_lead_d.unwrap() - 18.0).abs() < 1e-9);
        assert_eq!((c.forecasts, c.interval_covered), (1, 1));
        assert!((c.median_eta_ratio.unwrap() - 1.2).abs() < 1e-9);
        // At 0.8 only the critical false alarm is left, and neither fault is caught.
        let c = at(0.8);
        assert!((c.false_alarms_per_30d - 30.0 / 45.0).abs() < 1e-9);
        assert_eq!((c.fast_caught, c.drift_warned), (0, 0));
    }
}
