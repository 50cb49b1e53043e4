//! The scenario runner's `ground_truth.json` (format 1, scenarios/README.md), the fields eval scores with.

use crate::error::EvalError;
use serde::Deserialize;
use std::path::Path;

/// The SLO of a scenario.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Slo {
    /// `ttft`, `tpot`, `e2e` or `queue`.
    pub metric: String,
    /// The quantile, e.g. 0.95.
    pub quantile: f64,
    /// The threshold in seconds.
    pub threshold_s: f64,
    /// The SLO window in seconds.
    pub window_s: f64,
}

/// One fault of an instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Fault {
    /// The fault kind (`slow_drift`, `queue_blocking`, ...).
    pub kind: String,
    /// When it starts.
    pub onset_unix_nano: u64,
}

/// One instance of the scenario.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Instance {
    /// `service.instance.id`.
    pub name: String,
    /// Its faults.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Its first breaching SLO window, if any.
    #[serde(default)]
    pub first_breach_unix_nano: Option<u64>,
}

/// The A/B comparison of a two-instance scenario.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Ab {
    /// Instance of the baseline.
    pub baseline: String,
    /// Instance of the candidate.
    pub candidate: String,
    /// Measured Δ of the compared quantile in ms.
    pub delta_ms: f64,
}

/// A deploy (a cold start that is not a fault).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Deploy {
    /// When.
    pub at_unix_nano: u64,
    /// The new version.
    pub version: String,
}

/// What eval reads of `ground_truth.json`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct GroundTruth {
    /// The scenario's name.
    pub scenario: String,
    /// Its description.
    #[serde(default)]
    pub description: String,
    /// Start of simulated time.
    pub start_time_unix_nano: u64,
    /// End of simulated time.
    pub end_time_unix_nano: u64,
    /// The SLO.
    pub slo: Slo,
    /// True when no fault was injected.
    pub healthy: bool,
    /// Earliest fault onset.
    #[serde(default)]
    pub fault_onset_unix_nano: Option<u64>,
    /// Start of the first breaching SLO window.
    #[serde(default)]
    pub first_breach_unix_nano: Option<u64>,
    /// Deploys.
    #[serde(default)]
    pub deploys: Vec<Deploy>,
    /// Instances.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// The A/B comparison, for two-instance scenarios.
    #[serde(default)]
    pub ab: Option<Ab>,
    /// Fleet scenarios: faulted replicas and the rollout.
    #[serde(default)]
    pub fleet: Option<Fleet>,
}

/// One replica of a fleet.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Replica {
    /// `service.instance.id`.
    pub name: String,
    /// Whether a fault hits it.
    #[serde(default)]
    pub faulted: bool,
    /// When it starts being hit.
    #[serde(default)]
    pub fault_onset_unix_nano: Option<u64>,
}

/// The pooled A/B of a partial rollout.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Rollout {
    /// Version of the replicas not in the rollout.
    pub baseline_version: String,
    /// The rolled-out version.
    pub candidate_version: String,
    /// The deploy.
    pub at_unix_nano: u64,
    /// Replicas on the candidate version.
    #[serde(default)]
    pub candidate_replicas: Vec<String>,
    /// Measured Δ of the pooled p95 in ms.
    pub delta_ms: f64,
    /// Injected regression in ms (0: A/A).
    #[serde(default)]
    pub injected_ms: f64,
}

/// The fleet section of the ground truth.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Fleet {
    /// The model served.
    #[serde(default)]
    pub model: String,
    /// Every replica.
    pub replicas: Vec<Replica>,
    /// The rollout, if any.
    #[serde(default)]
    pub rollout: Option<Rollout>,
}

/// What kind of case a scenario is, for scoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// No fault, one version: any alert is a false alarm.
    Healthy,
    /// Two versions on mirrored traffic: delta_ab's case (regression or A/A control).
    Ab,
    /// A slow drift: the early warning's case (lead time before the breach).
    Drift,
    /// A fast fault: detection delay after the onset.
    Fast,
    /// A fleet: which replica is named, and the rollout's pooled verdict.
    Fleet,
}

impl GroundTruth {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<GroundTruth, EvalError> {
        let text = std::fs::read(path).map_err(|e| EvalError::io(path, e))?;
        serde_json::from_slice(&text).map_err(|e| EvalError::Data(format!("{}: {e}", path.display())))
    }

    /// The kind of case.
    pub fn kind(&self) -> Kind {
        let kinds: Vec<&str> = self.instances.iter().flat_map(|i| &i.faults).map(|f| f.kind.as_str()).collect();
        if self.fleet.is_some() {
            Kind::Fleet
        } else if self.ab.is_some() {
            Kind::Ab
        } else if self.healthy || kinds.is_empty() {
            Kind::Healthy
        } else if kinds.contains(&"slow_drift") {
            Kind::Drift
        } else {
            Kind::Fast
        }
    }

    /// Simulated days.
    pub fn days(&self) -> f64 {
        self.end_time_unix_nano.saturating_sub(self.start_time_unix_nano) as f64 / 86_400e9
    }

    /// The llm_signals metric that tracks the SLO (`llm.<metric>.p<quantile·100>`).
    pub fn slo_signal(&self) -> String {
        let q = (self.slo.quantile * 100.0).round() as u32;
        format!("llm.{}.p{q}", self.slo.metric)
    }
}
