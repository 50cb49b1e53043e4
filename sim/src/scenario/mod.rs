//! Scenarios on a simulated clock: `inferwatch sim --scenario FILE --out DIR`.
//!
//! [`run_scenario`] reads a scenario (YAML, see scenarios/README.md), runs one engine per
//! instance on a simulated clock with the scenario's load model, deploys and faults, and
//! writes into the output directory:
//!
//! - `traces.jsonl`: one `ExportTraceServiceRequest` per line (otelcol file-exporter format)
//!   with `llm_request` spans as vLLM V1 emits them; a deterministic `output.span_sample`
//!   fraction of the requests is written.
//! - `metrics.jsonl`: one `ExportMetricsServiceRequest` per line, the `vllm:*` metrics of
//!   every instance as a Prometheus receiver would have scraped them every
//!   `output.metrics_interval`, plus `hw.gpu.*` and `sim:kv_cache_fragmentation` gauges.
//! - `ground_truth.json`: fault onsets, the first SLO breach, the SLO and per-window values
//!   ([`slo::GroundTruth`]).
//!
//! Same scenario and seed give byte-identical files.

pub mod calendar;
mod drift;
pub mod fleet;
pub mod histo;
pub mod load;
pub mod otlp;
mod runner;
pub mod slo;
pub mod spec;
pub mod speed;

use std::path::{Path, PathBuf};

pub use runner::{RunSummary, run};
pub use spec::Scenario;

use crate::engine::EngineError;
use crate::faults::{Fault, FaultSet};

/// Errors of loading or running a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The YAML does not parse into a scenario (unknown key, wrong type; with line and column).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with the position.
        message: String,
    },
    /// The scenario parses but is inconsistent.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The engine refused its configuration.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Output serialisation failed.
    #[error("serialising output: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads, parses and validates a scenario file.
pub fn load_scenario(path: &Path) -> Result<Scenario, ScenarioError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })?;
    parse_scenario_in(&text, &path.display().to_string(), path.parent())
}

/// Parses and validates scenario YAML; `origin` names it in errors.
pub fn parse_scenario(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
    parse_scenario_in(text, origin, None)
}

/// Like [`parse_scenario`]; a `load.trace.path` is read relative to `base`.
fn parse_scenario_in(text: &str, origin: &str, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let mut sc: Scenario = serde_saphyr::from_str(text)
        .map_err(|e| ScenarioError::Parse { path: origin.to_string(), message: e.to_string() })?;
    if let Some(t) = &mut sc.load.trace {
        t.load(base).map_err(|message| ScenarioError::Invalid { path: origin.to_string(), message })?;
    }
    validate(&sc).map_err(|message| ScenarioError::Invalid { path: origin.to_string(), message })?;
    Ok(sc)
}

/// Runs the scenario at `path` and writes its telemetry and ground truth into `out_dir`.
pub fn run_scenario(path: &Path, out_dir: &Path) -> Result<RunSummary, ScenarioError> {
    let sc = load_scenario(path)?;
    run(&sc, out_dir)
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(msg()) }
}

/// Semantic checks serde cannot express; the message names the field.
pub fn validate(sc: &Scenario) -> Result<(), String> {
    if let Some(f) = &sc.fleet {
        fleet::check(sc, f)?;
        return validate_plain(&fleet::expand(sc)?);
    }
    if let Some(i) = sc.deploys.iter().position(|d| d.replicas.is_some()) {
        return Err(format!("deploys[{i}].replicas: needs fleet (use instances)"));
    }
    validate_plain(sc)
}

/// The checks of a scenario with its instances written out.
fn validate_plain(sc: &Scenario) -> Result<(), String> {
    calendar::parse_rfc3339_utc(&sc.start).map_err(|e| format!("start: {e}"))?;
    check(sc.duration.secs() > 0.0, || "duration: must be > 0".into())?;
    sc.engine.validate().map_err(|e| format!("engine: {e}"))?;
    let l = &sc.load;
    check(l.qps.is_finite() && (0.0..=10_000.0).contains(&l.qps), || "load.qps: must be in [0, 10000]".into())?;
    if let Some(d) = &l.daily {
        check((0.0..1.0).contains(&d.amplitude), || "load.daily.amplitude: must be in [0, 1)".into())?;
    }
    if let Some(w) = &l.weekly {
        check(w.weekend > 0.0 && w.weekend.is_finite(), || "load.weekly.weekend: must be > 0".into())?;
    }
    if let Some(n) = &l.noise {
        check(n.sigma >= 0.0 && n.sigma <= 3.0, || "load.noise.sigma: must be in [0, 3]".into())?;
        check(n.every.secs() >= 1.0, || "load.noise.every: must be >= 1s".into())?;
    }
    if let Some(b) = &l.bursts {
        check(b.factor > 0.0 && b.factor.is_finite(), || "load.bursts.factor: must be > 0".into())?;
        check(b.per_day >= 0.0 && b.per_day <= 100.0, || "load.bursts.per_day: must be in [0, 100]".into())?;
    }
    for (name, d) in [("load.prompt", &l.prompt), ("load.output", &l.output)] {
        check(d.median >= 1.0 && d.sigma >= 0.0 && d.sigma <= 3.0, || format!("{name}: median >= 1, sigma in [0, 3]"))?;
        check(d.min >= 1 && d.min <= d.max, || format!("{name}: need 1 <= min <= max"))?;
    }
    if let Some(p) = &l.prefix {
        check(p.pool >= 1, || "load.prefix.pool: must be >= 1".into())?;
        check(p.tokens < sc.engine.max_model_len, || "load.prefix.tokens: must be < engine.max_model_len".into())?;
        check((0.0..=1.0).contains(&p.share), || "load.prefix.share: must be in [0, 1]".into())?;
        check(p.zipf >= 0.0 && p.zipf <= 5.0, || "load.prefix.zipf: must be in [0, 5]".into())?;
    }
    let mut names: Vec<&str> = sc.instances.iter().map(|i| i.name.as_str()).collect();
    names.sort_unstable();
    check(names.windows(2).all(|w| w[0] != w[1]), || "instances: names must be unique".into())?;
    for (i, inst) in sc.instances.iter().enumerate() {
        check(!inst.name.is_empty(), || format!("instances[{i}].name: must not be empty"))?;
        check(inst.load_share >= 0.0 && inst.load_share.is_finite(), || {
            format!("instances[{i}].load_share: must be >= 0")
        })?;
        FaultSet { faults: inst.faults.clone() }.validate().map_err(|e| format!("instances[{i}].{e}"))?;
    }
    FaultSet { faults: sc.faults.clone() }.validate()?;
    for f in sc.faults.iter().chain(sc.instances.iter().flat_map(|i| i.faults.iter())) {
        if let Fault::SlowDrift(d) = f
            && let Some(b) = d.breach_after
        {
            check(b.secs() > 0.0, || "slow_drift.breach_after: must be > 0".into())?;
        }
    }
    for (i, d) in sc.deploys.iter().enumerate() {
        if let Some(list) = &d.instances {
            for n in list {
                check(names.contains(&n.as_str()) || (sc.instances.is_empty() && n == "sim-0"), || {
                    format!("deploys[{i}].instances: unknown instance {n:?}")
                })?;
            }
        }
        if let Some(c) = &d.cold_start {
            check(c.strength >= 1.0 && c.warmup.secs() > 0.0, || {
                format!("deploys[{i}].cold_start: strength >= 1 and warmup > 0")
            })?;
        }
    }
    let s = &sc.slo;
    check(s.quantile > 0.0 && s.quantile < 1.0, || "slo.quantile: must be in (0, 1)".into())?;
    check(s.threshold.secs() > 0.0, || "slo.threshold: must be > 0".into())?;
    check(s.window.secs() >= 1.0, || "slo.window: must be >= 1s".into())?;
    if let Some(d) = &sc.simulate {
        let w = s.window.nanos();
        let multiple = |x: u64| x > 0 && x.is_multiple_of(w);
        check(multiple(d.window.nanos()), || "simulate.window: must be a positive multiple of slo.window".into())?;
        check(multiple(d.every.nanos()) && d.every.nanos() >= d.window.nanos(), || {
            "simulate.every: must be a multiple of slo.window and >= simulate.window".into()
        })?;
    }
    let o = &sc.output;
    check(o.metrics_interval.secs() >= 0.1, || "output.metrics_interval: must be >= 100ms".into())?;
    check((0.0..=1.0).contains(&o.span_sample), || "output.span_sample: must be in [0, 1]".into())?;
    Ok(())
}
