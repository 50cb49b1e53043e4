//! `inferwatch eval --scenarios DIR`: each scenario of the library is simulated (or taken from
//! the cache), fed through a detector pipeline on its own simulated clock, and its alerts are
//! scored against the ground truth.

pub mod feed;
pub mod fleet;
pub mod pipeline;
pub mod score;
pub mod truth;

use crate::error::EvalError;
use crate::harness::{Harness, Point};
use inferwatch_core::registry::Registry;
use score::{Firing, Outcome};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use truth::GroundTruth;

/// What one scenario's evaluation produced.
#[derive(Debug, Clone)]
pub struct ScenarioRun {
    /// The ground truth.
    pub truth: GroundTruth,
    /// The verdict.
    pub outcome: Outcome,
    /// Every alert that fired.
    pub firings: Vec<Firing>,
    /// The SLO's signal, every instance and source (`scrape`, `spans`).
    pub signal: Vec<Point>,
    /// trend_forecast's breach ETA points.
    pub eta: Vec<Point>,
    /// Lines fed.
    pub lines: u64,
    /// Wall seconds simulating (0 when cached) and evaluating.
    pub wall_sim_s: f64,
    /// Wall seconds of the pipeline run.
    pub wall_eval_s: f64,
}

/// The scenario files (`*.yaml`) of a directory, sorted by name.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, EvalError> {
    let rd = std::fs::read_dir(dir).map_err(|e| EvalError::io(dir, e))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    v.sort();
    Ok(v)
}

/// The cache folder of a scenario file: its stem and a hash of its text and the simulator's version.
fn cache_dir(cache: &Path, yaml: &Path, text: &[u8]) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    // The build: a rebuilt simulator must not reuse output of the old one.
    let build = std::env::current_exe().ok().and_then(|p| std::fs::metadata(p).ok()).and_then(|m| m.modified().ok());
    build.hash(&mut h);
    let stem = yaml.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    cache.join(format!("{stem}-{:016x}", h.finish()))
}

/// Simulates `yaml` into the cache unless it is there already; returns its folder and the wall seconds spent.
pub async fn simulate(yaml: &Path, cache: &Path) -> Result<(PathBuf, f64), EvalError> {
    let text = std::fs::read(yaml).map_err(|e| EvalError::io(yaml, e))?;
    let dir = cache_dir(cache, yaml, &text);
    if dir.join("ground_truth.json").is_file() {
        return Ok((dir, 0.0));
    }
    let tmp = PathBuf::from(format!("{}.tmp", dir.display()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| EvalError::io(&tmp, e))?;
    let started = std::time::Instant::now();
    let (y, t) = (yaml.to_path_buf(), tmp.clone());
    let result = tokio::task::spawn_blocking(move || inferwatch_sim::scenario::run_scenario(&y, &t))
        .await
        .map_err(|e| EvalError::Scenario { name: yaml.display().to_string(), message: e.to_string() })?;
    result.map_err(|e| EvalError::Scenario { name: yaml.display().to_string(), message: e.to_string() })?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| EvalError::io(&dir, e))?;
    Ok((dir, started.elapsed().as_secs_f64()))
}

/// Runs one scenario's output folder through `config` (the default pipeline when None) and scores it.
pub async fn evaluate(dir: &Path, config: Option<&str>, registry: Registry) -> Result<ScenarioRun, EvalError> {
    let truth = GroundTruth::read(&dir.join("ground_truth.json"))?;
    let vars = pipeline::variables(&truth);
    let yaml = match config {
        Some(template) => substitute(template, &vars),
        None => pipeline::default_config(&truth),
    };
    let started = std::time::Instant::now();
    let harness = Harness::start(&yaml, registry).await?;
    let lines = feed::feed_dir(&harness, dir).await?;
    let captured = harness.finish().await?;
    let firings = score::firings(captured.records());
    let outcome = score::score(&truth, &firings);
    let signal = captured.points(&truth.slo_signal());
    Ok(ScenarioRun {
        eta: captured.points("llm.slo.breach_eta"),
        truth,
        outcome,
        firings,
        signal,
        lines,
        wall_sim_s: 0.0,
        wall_eval_s: started.elapsed().as_secs_f64(),
    })
}

/// Replaces `${env:NAME}` of the scenario variables in a user's template (other text untouched).
pub fn substitute(template: &str, vars: &std::collections::BTreeMap<&'static str, String>) -> String {
    let mut s = template.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("${{env:{k}}}"), v);
    }
    s
}
