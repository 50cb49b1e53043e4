//! The drift part of `inferwatch demo`: `scenarios/slow_drift_30d.yaml` (built in) simulated into
//! a cache and replayed through eval's default pipeline on its own clock, in seconds; the first
//! forecast warning against the actual SLO breach, as a line, a terminal chart and an SVG.

use anyhow::Context;
use inferwatch_eval::chart::{self, Mark};
use inferwatch_eval::harness::Point;
use inferwatch_eval::report::human;
use inferwatch_eval::scenario::{self, ScenarioRun, score::Firing};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The scenario's name (its file stem: the cache folder and the chart are named after it).
pub const NAME: &str = "slow_drift_30d";
/// The scenario replayed (the library's file, built into the binary).
pub const SCENARIO: &str = include_str!("../../scenarios/slow_drift_30d.yaml");
/// The detector of the forecast warning.
const FORECAST_DETECTOR: &str = "trend_forecast";
/// Rows of the terminal chart.
const CHART_ROWS: usize = 12;
const DAY_S: f64 = 86_400.0;

/// Starts the replay on a thread of its own (with its own runtime, so the live part keeps its
/// threads); the thread returns the text to print.
pub fn spawn(
    out: PathBuf,
    template: Option<String>,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<String>>> {
    std::thread::Builder::new()
        .name("demo-drift".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(replay(&out, template.as_deref()))
        })
        .context("starting the drift replay")
}

/// Simulates (or takes from the cache under `out`) and evaluates the scenario through `template`
/// (eval's default pipeline when `None`); writes the SVG chart into `out`; returns the text to print.
pub async fn replay(out: &Path, template: Option<&str>) -> anyhow::Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let yaml = out.join(format!("{NAME}.yaml"));
    if std::fs::read_to_string(&yaml).ok().as_deref() != Some(SCENARIO) {
        std::fs::write(&yaml, SCENARIO).with_context(|| format!("writing {}", yaml.display()))?;
    }
    let cache = out.join("cache");
    let (dir, sim_s) = scenario::simulate(&yaml, &cache).await?;
    prune(&cache, &dir);
    let mut run = scenario::evaluate(&dir, template, inferwatch::components::registry()).await?;
    run.wall_sim_s = sim_s;
    let svg = out.join(format!("{NAME}.svg"));
    chart::draw(&run, &svg)?;
    Ok(render(&run, &svg))
}

/// Removes the cache folders of this scenario other than `keep` (older builds or texts).
fn prune(cache: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let ours = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{NAME}-")));
        if ours && p != keep && !p.to_string_lossy().ends_with(".tmp") {
            let _ = std::fs::remove_dir_all(&p);
        }
    }
}

/// The warning to show: the first forecast alert after the onset, else the first alert of any detector.
fn warning(run: &ScenarioRun) -> Option<&Firing> {
    let onset = run.outcome.onset_ns.unwrap_or(0);
    let after = || run.firings.iter().filter(move |f| f.time_ns >= onset);
    after().find(|f| f.detector == FORECAST_DETECTOR).or_else(|| after().next())
}

/// The breach forecast at `time_ns`: of the `llm.slo.breach_eta` points of the latest assessment
/// at or before it (within an hour of it, else within a day), the nearest breach, as (eta, low,
/// high) in seconds.
fn forecast_at(eta: &[Point], time_ns: u64) -> Option<(f64, Option<f64>, Option<f64>)> {
    const HOUR: u64 = 3_600_000_000_000;
    let before = |within: u64| {
        eta.iter().filter(move |p| p.time_ns <= time_ns && time_ns - p.time_ns <= within && p.value.is_finite())
    };
    let p = before(HOUR)
        .min_by(|a, b| a.value.total_cmp(&b.value))
        .or_else(|| before(24 * HOUR).max_by_key(|p| p.time_ns))?;
    let bound = |k: &str| p.attrs.get(k).and_then(|v| v.parse::<f64>().ok());
    Some((p.value, bound("eta_low"), bound("eta_high")))
}

/// `12` (days, rounded), `∞` for an unbounded end.
fn days(s: f64) -> String {
    if s.is_finite() { format!("{:.0}", s / DAY_S) } else { "∞".into() }
}

/// The SLO as people say it: `tpot p95 SLO 70 ms`.
fn slo_name(run: &ScenarioRun) -> String {
    let slo = &run.truth.slo;
    format!("{} p{:.0} SLO {:.0} ms", slo.metric, slo.quantile * 100.0, slo.threshold_s * 1e3)
}

/// The text of the drift part: the headline, the chart, where the SVG is.
pub fn render(run: &ScenarioRun, svg: &Path) -> String {
    let t = &run.truth;
    let day = |ns: u64| (ns as f64 - t.start_time_unix_nano as f64) / 1e9 / DAY_S;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nDRIFT: {NAME} ({:.0} simulated days{}; detectors {:.1} s): {}",
        t.days(),
        if run.wall_sim_s > 0.0 { format!(" simulated in {:.1} s", run.wall_sim_s) } else { ", cached".into() },
        run.wall_eval_s,
        t.description
    );
    let breach = t.first_breach_unix_nano;
    let breach_text = breach.map_or("no breach".to_string(), |b| format!("actual breach day {:.1}", day(b)));
    let mut marks = Vec::new();
    match warning(run) {
        Some(w) => {
            let kind = if w.detector == FORECAST_DETECTOR { "FORECAST WARNING" } else { "EARLY WARNING" };
            let eta = match forecast_at(&run.eta, w.time_ns) {
                Some((eta, lo, hi)) => {
                    let range = match (lo, hi) {
                        (Some(lo), Some(hi)) => format!(" ({}–{} d)", days(lo), days(hi)),
                        _ => String::new(),
                    };
                    format!("breach in ~{} d{range}", days(eta))
                }
                None => "breach forecast not reported".into(),
            };
            let lead = breach.map(|b| format!(" (lead {:.1} d)", (b as f64 - w.time_ns as f64) / 1e9 / DAY_S));
            let _ = writeln!(
                s,
                "{kind} day {:.1} ({} {}): {} {eta}; {breach_text}{}",
                day(w.time_ns),
                w.detector,
                w.severity,
                slo_name(run),
                lead.unwrap_or_default()
            );
            marks.push(Mark {
                symbol: 'W',
                time_ns: w.time_ns,
                label: format!("first warning day {:.1}", day(w.time_ns)),
            });
            if let Some(first) = run.outcome.first_alert.as_ref().filter(|f| f.time_ns < w.time_ns) {
                let _ =
                    writeln!(s, "  (earlier: {} {} on day {:.1})", first.detector, first.severity, day(first.time_ns));
            }
        }
        None => {
            let _ = writeln!(s, "NO WARNING: no alert after the onset; {} {breach_text}", slo_name(run));
        }
    }
    let o = &run.outcome;
    let _ = writeln!(
        s,
        "eval target \"{}\": {}; false alarms {} ({} critical); first alert lead {}",
        o.target,
        if o.pass { "met" } else { "NOT met" },
        o.false_alarms,
        o.false_criticals,
        o.lead_s.map_or("-".to_string(), human)
    );
    let _ = writeln!(s, "\n{}", chart::text(run, &marks, CHART_ROWS));
    let _ = write!(s, "\nDRIFT CHART (SVG): {}", svg.display());
    s
}
