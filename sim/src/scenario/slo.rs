//! SLO evaluation over windows and the ground-truth file.

use std::collections::BTreeMap;

use serde::Serialize;

use super::spec::{SloMetric, SloSpec};
use crate::engine::{Nanos, RequestRecord};
use crate::faults::Fault;

/// The value of the SLO's metric for one request, if it has one.
pub fn slo_value(metric: SloMetric, r: &RequestRecord) -> Option<f64> {
    match metric {
        SloMetric::Ttft => Some(if r.first_token.is_some() { r.ttft_s() } else { r.e2e_s() }),
        SloMetric::E2e => Some(r.e2e_s()),
        SloMetric::Queue => Some(r.queue_s()),
        SloMetric::Tpot => (r.completion_tokens >= 2).then(|| r.tpot_s()),
    }
}

/// The `q` quantile of `v` (nearest rank on the sorted values; `v` is sorted in place).
pub fn quantile(v: &mut [f32], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(f32::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(f64::from(v[rank - 1]))
}

/// Collects the SLO metric per window (by arrival time) for one instance.
#[derive(Clone, Debug)]
pub struct SloTracker {
    spec: SloSpec,
    window: Nanos,
    windows: BTreeMap<u64, Vec<f32>>,
}

/// One evaluated window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowResult {
    /// Window index (start = index × window).
    pub index: u64,
    /// Requests counted.
    pub count: usize,
    /// The quantile, seconds.
    pub value: f64,
    /// Evaluated (enough requests) and above the threshold.
    pub breach: bool,
}

impl SloTracker {
    /// A tracker for this SLO.
    pub fn new(spec: &SloSpec) -> Self {
        SloTracker { spec: spec.clone(), window: spec.window.nanos().max(1), windows: BTreeMap::new() }
    }

    /// Adds a finished request.
    pub fn add(&mut self, r: &RequestRecord) {
        if let Some(v) = slo_value(self.spec.metric, r) {
            self.windows.entry(r.arrival / self.window).or_default().push(v as f32);
        }
    }

    /// Every window with at least one request, in time order.
    pub fn evaluate(&mut self) -> Vec<WindowResult> {
        let (q, thr, min) = (self.spec.quantile, self.spec.threshold.secs(), self.spec.min_requests as usize);
        self.windows
            .iter_mut()
            .filter_map(|(&index, v)| {
                let count = v.len();
                let value = quantile(v, q)?;
                Some(WindowResult { index, count, value, breach: count >= min.max(1) && value > thr })
            })
            .collect()
    }

    /// The quantile `q` of all values of windows starting at or after `from`.
    pub fn overall(&self, q: f64, from: Nanos) -> Option<f64> {
        let first = from.div_ceil(self.window);
        let mut all: Vec<f32> = self.windows.range(first..).flat_map(|(_, v)| v.iter().copied()).collect();
        quantile(&mut all, q)
    }

    /// Every value of the windows starting at or after `from`.
    pub fn values_from(&self, from: Nanos) -> impl Iterator<Item = f32> + '_ {
        let first = from.div_ceil(self.window);
        self.windows.range(first..).flat_map(|(_, v)| v.iter().copied())
    }
}

/// The SLO as written in the ground truth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SloTruth {
    /// `ttft`, `e2e`, `queue` or `tpot`.
    pub metric: &'static str,
    /// The quantile.
    pub quantile: f64,
    /// The bound, seconds.
    pub threshold_s: f64,
    /// Window length, seconds.
    pub window_s: f64,
    /// Minimum requests for a window to count.
    pub min_requests: u32,
}

/// A fault as applied, with its onset.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultTruth {
    /// Kind.
    pub kind: &'static str,
    /// Onset, Unix ns.
    pub onset_unix_nano: u64,
    /// Nominal breach (slow drift with `breach_after`), Unix ns.
    pub nominal_breach_unix_nano: Option<u64>,
    /// The fault as the engine ran it (a solved slow drift carries its `rate_per_day`).
    pub spec: Fault,
}

/// One deploy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeployTruth {
    /// When, Unix ns.
    pub at_unix_nano: u64,
    /// New version.
    pub version: String,
    /// Instances.
    pub instances: Vec<String>,
}

/// Per-instance truth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceTruth {
    /// `service.instance.id`.
    pub name: String,
    /// Initial version.
    pub version: String,
    /// Faults (deploy cold starts excluded).
    pub faults: Vec<FaultTruth>,
    /// Earliest fault onset, Unix ns.
    pub fault_onset_unix_nano: Option<u64>,
    /// Start of the first breaching window, Unix ns.
    pub first_breach_unix_nano: Option<u64>,
    /// The SLO quantile in that window, seconds.
    pub first_breach_value_s: Option<f64>,
    /// Windows evaluated / breaching.
    pub windows_evaluated: u64,
    /// Windows above the threshold.
    pub windows_breached: u64,
    /// Requests submitted / refused.
    pub requests: u64,
    /// Requests refused at submission.
    pub rejected: u64,
    /// Every window with requests: `[start offset s, requests, quantile s]`.
    pub slo_windows: Vec<(f64, u64, f64)>,
}

/// The A/B comparison of a two-instance scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AbTruth {
    /// Baseline instance (the first).
    pub baseline: String,
    /// Candidate instance (the second).
    pub candidate: String,
    /// The metric compared (the SLO's).
    pub metric: &'static str,
    /// Quantile compared (0.95).
    pub quantile: f64,
    /// From this time on (the latest regression onset, else the start), Unix ns.
    pub from_unix_nano: u64,
    /// Baseline quantile, seconds.
    pub baseline_s: f64,
    /// Candidate quantile, seconds.
    pub candidate_s: f64,
    /// candidate − baseline, milliseconds.
    pub delta_ms: f64,
    /// The regression the scenario injected, milliseconds (version_regression strength).
    pub injected_ms: f64,
}

/// The ground-truth file (`ground_truth.json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroundTruth {
    /// Format version (1).
    pub format: u32,
    /// Scenario name.
    pub scenario: String,
    /// Description.
    pub description: String,
    /// Seed.
    pub seed: u64,
    /// Start, RFC 3339.
    pub start: String,
    /// Start, Unix ns.
    pub start_time_unix_nano: u64,
    /// End, Unix ns.
    pub end_time_unix_nano: u64,
    /// The SLO.
    pub slo: SloTruth,
    /// True when no fault is injected (deploys may happen).
    pub healthy: bool,
    /// Earliest fault onset over the instances, Unix ns.
    pub fault_onset_unix_nano: Option<u64>,
    /// Earliest first breach over the instances, Unix ns.
    pub first_breach_unix_nano: Option<u64>,
    /// Duty-cycle sampling `[window s, every s]`, if any.
    pub sampling: Option<(f64, f64)>,
    /// Simulated segments `[start offset s, end offset s]`.
    pub segments: Vec<(f64, f64)>,
    /// Fraction of spans written.
    pub span_sample: f64,
    /// Metric sample interval, seconds.
    pub metrics_interval_s: f64,
    /// Deploys.
    pub deploys: Vec<DeployTruth>,
    /// Instances.
    pub instances: Vec<InstanceTruth>,
    /// A/B comparison (two instances only, not for fleets).
    pub ab: Option<AbTruth>,
    /// Fleet scenarios only: faulted replicas, versions per replica, the rollout's pooled A/B.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetTruth>,
}

/// One replica of a fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaTruth {
    /// `service.instance.id`.
    pub name: String,
    /// Its traffic relative to `load.qps`.
    pub load_share: f64,
    /// The versions it runs: `[from Unix ns, version]`, the first at the start.
    pub versions: Vec<(u64, String)>,
    /// Whether a fault hits it (a version regression only while it runs that version).
    pub faulted: bool,
    /// Kinds of the faults that hit it.
    pub fault_kinds: Vec<&'static str>,
    /// When the first of them starts hitting it, Unix ns.
    pub fault_onset_unix_nano: Option<u64>,
}

/// The pooled A/B of a partial rollout: the replicas on the new version against the others.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutTruth {
    /// Version of the replicas not in the rollout.
    pub baseline_version: String,
    /// The rolled-out version.
    pub candidate_version: String,
    /// The deploy, Unix ns.
    pub at_unix_nano: u64,
    /// Replicas on the baseline version.
    pub baseline_replicas: Vec<String>,
    /// Replicas on the candidate version.
    pub candidate_replicas: Vec<String>,
    /// The metric compared (the SLO's).
    pub metric: &'static str,
    /// Quantile compared (0.95).
    pub quantile: f64,
    /// Requests arriving from here on are compared (after the deploy's warm-up and any regression onset), Unix ns.
    pub from_unix_nano: u64,
    /// Baseline requests compared.
    pub n_baseline: u64,
    /// Candidate requests compared.
    pub n_candidate: u64,
    /// Baseline quantile over its replicas' requests pooled, seconds.
    pub baseline_s: f64,
    /// Candidate quantile over its replicas' requests pooled, seconds.
    pub candidate_s: f64,
    /// candidate − baseline, milliseconds.
    pub delta_ms: f64,
    /// The regression injected for the candidate version, milliseconds (0: A/A).
    pub injected_ms: f64,
}

/// The fleet section of the ground truth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetTruth {
    /// The model every replica serves (`gen_ai.request.model` / `model_name`).
    pub model: String,
    /// Every replica.
    pub replicas: Vec<ReplicaTruth>,
    /// Names of the faulted replicas.
    pub faulted: Vec<String>,
    /// The last partial rollout's pooled comparison, if any.
    pub rollout: Option<RolloutTruth>,
}
