//! The scenario file format (YAML; unknown keys are errors). See scenarios/README.md.

use serde::{Deserialize, Serialize};

use crate::engine::{EngineConfig, SimDuration};
use crate::faults::Fault;

fn default_start() -> String {
    "2026-01-05T00:00:00Z".into()
}

/// A scenario: traffic, instances, faults, deploys, the SLO and what to write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (used in the ground truth).
    pub name: String,
    /// What the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Seed of all randomness (arrivals, lengths, noise, bursts, output tokens).
    #[serde(default)]
    pub seed: u64,
    /// Wall-clock time of the simulation's zero, RFC 3339 UTC (default Monday 2026-01-05).
    #[serde(default = "default_start")]
    pub start: String,
    /// Simulated length.
    pub duration: SimDuration,
    /// The engine (same keys as [`EngineConfig`]; `token_events` / `step_events` are set by the runner).
    #[serde(default)]
    pub engine: EngineConfig,
    /// Instances (default: one named `sim-0`).
    #[serde(default)]
    pub instances: Vec<InstanceSpec>,
    /// A fleet of identical replicas (instead of `instances`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetSpec>,
    /// The traffic.
    pub load: LoadSpec,
    /// Version changes (rolling restarts).
    #[serde(default)]
    pub deploys: Vec<Deploy>,
    /// Faults applied to every instance (times relative to the scenario's start).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// The SLO whose first breach the ground truth records.
    pub slo: SloSpec,
    /// Duty-cycle sampling for long scenarios (none: simulate every second).
    #[serde(default)]
    pub simulate: Option<DutyCycle>,
    /// Output options.
    #[serde(default)]
    pub output: OutputSpec,
}

/// One simulated server instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// Instance name (`service.instance.id`).
    pub name: String,
    /// Version label (default: the engine's `version`).
    #[serde(default)]
    pub version: Option<String>,
    /// Faults of this instance only.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Multiplier on `load.qps` for this instance (default 1).
    #[serde(default = "one")]
    pub load_share: f64,
}

fn one() -> f64 {
    1.0
}

fn default_replica_name() -> String {
    "vllm-{i}".into()
}

/// A fleet: `replicas` instances of the scenario's engine and model, each with its own
/// traffic stream, named by the pattern `name` (`{i}` = 0 … N−1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    /// Number of replicas (1..=1000).
    pub replicas: u32,
    /// Name pattern; `{i}` is replaced by the replica's index (default `vllm-{i}`).
    #[serde(default = "default_replica_name")]
    pub name: String,
    /// Per-replica traffic spread: replica i gets `load.qps · (1 + qps_spread · (2u − 1))`,
    /// u uniform in [0, 1) from the seed and i (in [0, 1); default 0: all equal).
    #[serde(default)]
    pub qps_spread: f64,
    /// Initial version of every replica (default: the engine's `version`).
    #[serde(default)]
    pub version: Option<String>,
    /// Faults of a subset of the replicas.
    #[serde(default)]
    pub faults: Vec<FleetFault>,
}

/// A fault applied to some replicas of a fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFault {
    /// The replicas it applies to.
    pub replicas: ReplicaSel,
    /// The fault (the same objects as `faults:`).
    pub fault: Fault,
}

/// A subset of a fleet's replicas: a count `k` (the first k, replicas 0 … k−1) or a list of
/// indices and names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplicaSel {
    /// The first k replicas.
    First(u32),
    /// These replicas.
    List(Vec<ReplicaRef>),
}

/// One replica of a fleet: its index or its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplicaRef {
    /// Index 0 … N−1.
    Index(u32),
    /// Name, as the pattern makes it.
    Name(String),
}

impl FleetSpec {
    /// The name of replica `i`.
    pub fn replica_name(&self, i: u32) -> String {
        self.name.replace("{i}", &i.to_string())
    }

    /// The indices `sel` names (sorted, unique), or a message naming the bad entry.
    pub fn select(&self, sel: &ReplicaSel) -> Result<Vec<u32>, String> {
        let n = self.replicas;
        let mut out: Vec<u32> = match sel {
            ReplicaSel::First(k) if *k <= n => (0..*k).collect(),
            ReplicaSel::First(k) => return Err(format!("{k} is more than the fleet's {n} replicas")),
            ReplicaSel::List(list) => {
                let mut v = Vec::with_capacity(list.len());
                for r in list {
                    v.push(match r {
                        ReplicaRef::Index(i) if *i < n => *i,
                        ReplicaRef::Index(i) => return Err(format!("index {i} is not below {n}")),
                        ReplicaRef::Name(name) => (0..n)
                            .find(|&i| self.replica_name(i) == *name)
                            .ok_or_else(|| format!("unknown replica {name:?}"))?,
                    });
                }
                v
            }
        };
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// The traffic model: a base rate shaped by daily and weekly cycles, noise and bursts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Mean request rate per instance, requests/s, before the cycles (0 with `trace`).
    #[serde(default)]
    pub qps: f64,
    /// A trace as the load shape: arrivals and lengths from the file (the rate model, the
    /// length distributions and `prefix` are then unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<super::load::TraceLoadSpec>,
    /// Every instance receives the same requests (mirrored A/B traffic, same request ids).
    #[serde(default)]
    pub mirror: bool,
    /// Daily cycle.
    #[serde(default)]
    pub daily: Option<Daily>,
    /// Weekly cycle.
    #[serde(default)]
    pub weekly: Option<Weekly>,
    /// Multiplicative log-normal noise.
    #[serde(default)]
    pub noise: Option<Noise>,
    /// Traffic bursts.
    #[serde(default)]
    pub bursts: Option<Bursts>,
    /// Prompt length (the user part; a shared prefix comes on top).
    #[serde(default = "LengthDist::default_prompt")]
    pub prompt: LengthDist,
    /// Natural output length (requests stop there with reason `stop`; `max` is `max_tokens`).
    #[serde(default = "LengthDist::default_output")]
    pub output: LengthDist,
    /// Shared prefixes (system prompts) for the prefix cache.
    #[serde(default)]
    pub prefix: Option<PrefixSpec>,
}

/// Daily cycle: the rate is multiplied by `1 + amplitude · cos(2π (time of day − peak) / 24 h)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Daily {
    /// Relative amplitude in [0, 1).
    pub amplitude: f64,
    /// Time of day of the peak, UTC (default 14h).
    #[serde(default = "Daily::default_peak")]
    pub peak: SimDuration,
}

impl Daily {
    fn default_peak() -> SimDuration {
        SimDuration(14.0 * 3600.0)
    }
}

/// Weekly cycle: Saturdays and Sundays (UTC) get `weekend` times the rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weekly {
    /// Weekend multiplier (> 0).
    pub weekend: f64,
}

/// Noise: every `every`, the rate is multiplied by `exp(sigma · z − sigma² / 2)`, z ~ N(0, 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Noise {
    /// Log-normal sigma (>= 0).
    pub sigma: f64,
    /// Length of a noise interval (default 5m).
    #[serde(default = "Noise::default_every")]
    pub every: SimDuration,
}

impl Noise {
    fn default_every() -> SimDuration {
        SimDuration(300.0)
    }
}

/// Bursts: periods where the rate is multiplied by `factor`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bursts {
    /// Burst starts (relative to the scenario's start).
    #[serde(default)]
    pub at: Vec<SimDuration>,
    /// Additional random bursts per day (Poisson; uniform start times).
    #[serde(default)]
    pub per_day: f64,
    /// Length of a burst (default 10m).
    #[serde(default = "Bursts::default_duration")]
    pub duration: SimDuration,
    /// Rate multiplier during a burst (default 2).
    #[serde(default = "Bursts::default_factor")]
    pub factor: f64,
}

impl Bursts {
    fn default_duration() -> SimDuration {
        SimDuration(600.0)
    }
    fn default_factor() -> f64 {
        2.0
    }
}

/// A log-normal length distribution in tokens, clamped to [min, max].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthDist {
    /// Median.
    pub median: f64,
    /// Log-normal sigma (default 0.8).
    #[serde(default = "LengthDist::default_sigma")]
    pub sigma: f64,
    /// Lower clamp (default 1).
    #[serde(default = "LengthDist::default_min")]
    pub min: u32,
    /// Upper clamp.
    pub max: u32,
}

impl LengthDist {
    fn default_sigma() -> f64 {
        0.8
    }
    fn default_min() -> u32 {
        1
    }
    fn default_prompt() -> Self {
        LengthDist { median: 400.0, sigma: 0.8, min: 8, max: 6000 }
    }
    fn default_output() -> Self {
        LengthDist { median: 150.0, sigma: 0.6, min: 1, max: 1024 }
    }
}

/// Shared prefixes: a fraction `share` of requests starts with one of `pool` system prompts
/// of `tokens` tokens, chosen with a Zipf law of exponent `zipf`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Distinct prefixes.
    pub pool: u32,
    /// Tokens per prefix.
    pub tokens: u32,
    /// Fraction of requests with a prefix (default 1).
    #[serde(default = "one")]
    pub share: f64,
    /// Zipf exponent of the prefix popularity (default 1).
    #[serde(default = "one")]
    pub zipf: f64,
}

/// A deploy: the version label changes, the prefix cache empties, the counters restart
/// (new process start time) and an optional cold start begins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deploy {
    /// When.
    pub at: SimDuration,
    /// The new version label.
    pub version: String,
    /// Instances affected (default all).
    #[serde(default)]
    pub instances: Option<Vec<String>>,
    /// With `fleet`: the replicas affected, instead of `instances` (a count k: the first k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaSel>,
    /// Cold start after the deploy (default: none).
    #[serde(default)]
    pub cold_start: Option<DeployColdStart>,
}

/// Cold start of a deploy (see [`crate::faults::ColdStart`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployColdStart {
    /// Slowdown factor right after the deploy (>= 1).
    pub strength: f64,
    /// E-folding time (default 30 s).
    #[serde(default = "DeployColdStart::default_warmup")]
    pub warmup: SimDuration,
}

impl DeployColdStart {
    fn default_warmup() -> SimDuration {
        SimDuration(30.0)
    }
}

/// The per-request latency an SLO is defined on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// End-to-end latency.
    E2e,
    /// Queue time.
    Queue,
    /// Time per output token.
    Tpot,
}

impl SloMetric {
    /// The name used in the ground truth.
    pub fn as_str(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::E2e => "e2e",
            SloMetric::Queue => "queue",
            SloMetric::Tpot => "tpot",
        }
    }
}

/// SLO: the `quantile` of `metric` over each `window` must stay at or below `threshold`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSpec {
    /// The latency.
    pub metric: SloMetric,
    /// The quantile in (0, 1), e.g. 0.95.
    pub quantile: f64,
    /// The bound.
    pub threshold: SimDuration,
    /// Window length (default 5m); requests count in the window of their arrival.
    #[serde(default = "SloSpec::default_window")]
    pub window: SimDuration,
    /// Windows with fewer requests are not evaluated (default 20).
    #[serde(default = "SloSpec::default_min_requests")]
    pub min_requests: u32,
}

impl SloSpec {
    fn default_window() -> SimDuration {
        SimDuration(300.0)
    }
    fn default_min_requests() -> u32 {
        20
    }
}

/// Duty-cycle sampling: simulate only the first `window` of every `every` (both multiples
/// of the SLO window), plus the SLO windows at each deploy and fault onset. Between windows
/// the engine drains and the clock jumps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DutyCycle {
    /// Simulated part of each period.
    pub window: SimDuration,
    /// Period.
    pub every: SimDuration,
}

/// What the runner writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSpec {
    /// Interval of the `vllm:*` metric samples (a Prometheus scrape interval; default 15s).
    pub metrics_interval: SimDuration,
    /// Fraction of `llm_request` spans written (deterministic by request; default 0.05).
    pub span_sample: f64,
    /// `service.name` of the resource (default `vllm`).
    pub service_name: String,
    /// `model_name` label and served model name (default: the engine's model name).
    pub model_name: Option<String>,
}

impl Default for OutputSpec {
    fn default() -> Self {
        OutputSpec {
            metrics_interval: SimDuration(15.0),
            span_sample: 0.05,
            service_name: "vllm".into(),
            model_name: None,
        }
    }
}
