//! Degradation faults: every mode of scenarios/README.md (Faults), as changes to
//! the engine's cost model, KV allocator and scheduler.
//!
//! A [`FaultSet`] is plain serde data (JSON for `POST /admin/faults`, YAML in scenarios):
//!
//! ```json
//! {"faults": [
//!   {"kind": "queue_blocking", "onset": "30s", "strength": 0.5},
//!   {"kind": "slow_drift", "onset": "2d", "rate_per_day": 0.04},
//!   {"kind": "version_regression", "version": "B", "strength": 5.0}
//! ]}
//! ```
//!
//! Times (`onset`, `ramp`, `until`, ...) are on the engine's clock (seconds since its zero) and
//! accept numbers (seconds) or strings such as `"90s"` or `"2d12h"`. Unknown keys are errors.
//! The engine evaluates the set at the start of every step ([`FaultSet::effects`]).

use serde::{Deserialize, Serialize};

use crate::engine::time::{NANOS_PER_DAY, Nanos, SimDuration};

/// A list of faults, active together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSet {
    /// The faults.
    #[serde(default)]
    pub faults: Vec<Fault>,
}

/// One degradation mode with its timing and strength (JSON: `{"kind": "...", ...}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// See [`ColdStart`].
    ColdStart(ColdStart),
    /// See [`ContextCollapse`].
    ContextCollapse(ContextCollapse),
    /// See [`BatchSaturation`].
    BatchSaturation(BatchSaturation),
    /// See [`KvPressure`].
    KvPressure(KvPressure),
    /// See [`QueueBlocking`].
    QueueBlocking(QueueBlocking),
    /// See [`SlowDrift`].
    SlowDrift(SlowDrift),
    /// See [`VersionRegression`].
    VersionRegression(VersionRegression),
    /// See [`Slowdown`].
    Slowdown(Slowdown),
}

fn d_zero() -> SimDuration {
    SimDuration(0.0)
}

/// Cold-start drift: the first requests after a start or scale-up are slower.
///
/// Every step takes `1 + (strength − 1) · exp(−(t − onset) / warmup)` times as long
/// (CUDA graphs not captured, allocator and kernels cold), and the prefix cache is emptied
/// at `onset` (a restarted process). Moves TTFT, e2e and TPOT of the
/// requests in the first minutes after `onset` up by about `strength` (the study: 3–4×), decaying
/// back to the baseline; nothing before `onset` changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdStart {
    /// When the (re)start happens.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Slowdown factor at `onset` (>= 1; default 3.5).
    #[serde(default = "ColdStart::default_strength")]
    pub strength: f64,
    /// E-folding time of the warm-up (default 60 s).
    #[serde(default = "ColdStart::default_warmup")]
    pub warmup: SimDuration,
}

impl ColdStart {
    fn default_strength() -> f64 {
        3.5
    }
    fn default_warmup() -> SimDuration {
        SimDuration(60.0)
    }
}

/// Context-length collapse: sequences longer than a threshold fall off the fast attention path.
///
/// In every step, the compute and KV-read cost of a sequence longer than `threshold_tokens`
/// (prompt + output so far; every prefill chunk of such a prompt included) is multiplied by
/// `1 + strength · level` (level ramps 0 → 1 over `ramp`).
/// Moves the p95 TTFT / e2e of prompts over ~4k tokens sharply up, far above that of prompts
/// under 1k; short requests feel it only through waiting behind the slow long prefills.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextCollapse {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Extra cost multiple for long sequences (default 3: four times the cost).
    #[serde(default = "ContextCollapse::default_strength")]
    pub strength: f64,
    /// Context length above which the slow path applies (default 4096).
    #[serde(default = "ContextCollapse::default_threshold")]
    pub threshold_tokens: u32,
    /// Time to reach full strength (default 0).
    #[serde(default = "d_zero")]
    pub ramp: SimDuration,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl ContextCollapse {
    fn default_strength() -> f64 {
        3.0
    }
    fn default_threshold() -> u32 {
        4096
    }
}

/// Batch saturation: above a knee of concurrent sequences, each step gets disproportionately
/// slower (memory stalls, scheduler thrash) and the GPU's useful utilisation falls.
///
/// With `n` running sequences above `knee`, a step takes `1 + strength · (n − knee) / knee`
/// times as long, so aggregate tokens/s falls as concurrency rises past the knee, and the
/// reported GPU utilisation is multiplied by `1 − util_drop · min(1, strength · (n − knee) / knee)`
/// (the study: ~22 % lower). Moves aggregate TPS down and TPOT / e2e up at high load only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSaturation {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Slope of the slowdown past the knee (default 1).
    #[serde(default = "BatchSaturation::default_strength")]
    pub strength: f64,
    /// Concurrent sequences where saturation begins (default 128).
    #[serde(default = "BatchSaturation::default_knee")]
    pub knee: u32,
    /// Largest relative drop of GPU utilisation (default 0.22).
    #[serde(default = "BatchSaturation::default_util_drop")]
    pub util_drop: f64,
    /// Time to reach full strength (default 0).
    #[serde(default = "d_zero")]
    pub ramp: SimDuration,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl BatchSaturation {
    fn default_strength() -> f64 {
        1.0
    }
    fn default_knee() -> u32 {
        128
    }
    fn default_util_drop() -> f64 {
        0.22
    }
}

/// KV-cache pressure and fragmentation: part of the block pool is lost and prefix-cache
/// entries are invalidated.
///
/// A fraction `strength · level` (at most 0.95) of the KV blocks is pinned by a phantom
/// owner, taken from wherever the free list hands them out so the remaining free space is
/// full of holes (fragmentation index KVF rises); `kv_cache_usage_perc` counts them as used.
/// Fewer blocks mean allocation failures, preemptions and recompute
/// (`vllm:num_preemptions_total` up), and each prefix-cache lookup is invalidated with
/// probability `strength · level`, so the prefix hit rate falls (below the study's 62 %).
/// TTFT and e2e rise through recompute and longer queues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPressure {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Fraction of the pool pinned and probability of prefix invalidation (default 0.5).
    #[serde(default = "KvPressure::default_strength")]
    pub strength: f64,
    /// Time to reach full strength (default 0).
    #[serde(default = "d_zero")]
    pub ramp: SimDuration,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl KvPressure {
    fn default_strength() -> f64 {
        0.5
    }
}

/// Queue blocking: the scheduler periodically stops admitting waiting requests (head-of-line
/// blocking behind a stuck request, a blocking tokenizer or adapter load).
///
/// From `onset`, in every `period` the first `strength · period` seconds admit nothing from
/// the waiting queue; running requests keep decoding. Requests arriving in a stall wait for
/// its end, so queue time p99 ≈ `strength · period` (defaults 0.5 · 4 s: about 2 s, above
/// the 800 ms rule of docs/llm-signals.md) and `vllm:num_requests_waiting` spikes. Throughput barely moves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueBlocking {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Fraction of each period with admission stalled, in [0, 1) (default 0.5).
    #[serde(default = "QueueBlocking::default_strength")]
    pub strength: f64,
    /// Stall cycle length (default 4 s).
    #[serde(default = "QueueBlocking::default_period")]
    pub period: SimDuration,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl QueueBlocking {
    fn default_strength() -> f64 {
        0.5
    }
    fn default_period() -> SimDuration {
        SimDuration(4.0)
    }
}

/// Slow drift: a leak / growing fragmentation that makes every step a little slower each day.
///
/// Every step takes `1 + rate_per_day · days_since_onset` times as long (gather overhead of
/// an increasingly scattered KV cache), and optionally `leak_per_day · days` of the KV pool
/// (at most 0.9) is leaked like [`KvPressure`]'s pinned blocks. TTFT / TPOT / e2e
/// percentiles creep up day after day, superlinearly once queueing sets in; the scenario
/// runner can choose `rate_per_day` so that the SLO breach comes N days after onset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowDrift {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Relative step-time growth per day (default 0.05).
    #[serde(default = "SlowDrift::default_rate")]
    pub rate_per_day: f64,
    /// Fraction of the KV pool leaked per day (default 0).
    #[serde(default)]
    pub leak_per_day: f64,
    /// Scenarios only: the scenario runner replaces `rate_per_day` with the rate that makes
    /// the scenario's SLO first breach this long after `onset` (the engine ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breach_after: Option<SimDuration>,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl SlowDrift {
    fn default_rate() -> f64 {
        0.05
    }
}

/// Version regression: one version is a few ms slower per prefill and a few % slower per
/// decode step than another.
///
/// Applies only to engines whose version label equals `version` (all engines when absent):
/// `strength` ms are added to every step that contains prefill work (TTFT p95 up by about
/// `strength` ms; default 5) and decode-only steps take `1 / (1 − throughput_loss)` times
/// as long (aggregate TPS down by `throughput_loss`). Compare the A and B series.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionRegression {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Version the regression ships in (none: every version).
    #[serde(default)]
    pub version: Option<String>,
    /// Milliseconds added to each step with prefill work (default 5).
    #[serde(default = "VersionRegression::default_strength")]
    pub strength: f64,
    /// Fractional throughput loss of decode steps, in [0, 1) (default 0).
    #[serde(default)]
    pub throughput_loss: f64,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl VersionRegression {
    fn default_strength() -> f64 {
        5.0
    }
}

/// Slowdown: one replica gets uniformly slower (a throttled or degraded GPU, a noisy neighbour).
///
/// From `onset`, every step takes `1 + (factor − 1) · level` times as long (level ramps 0 → 1
/// over `ramp`). At low load TTFT, TPOT and e2e rise by about `factor − 1` (30 % at 1.3), more
/// once queueing sets in. Nothing else changes: the fleet's other replicas are the baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slowdown {
    /// Start.
    #[serde(default = "d_zero")]
    pub onset: SimDuration,
    /// Step-time multiplier at full strength (>= 1; default 1.3).
    #[serde(default = "Slowdown::default_factor")]
    pub factor: f64,
    /// Time to reach full strength (default 0).
    #[serde(default = "d_zero")]
    pub ramp: SimDuration,
    /// End (none: forever).
    #[serde(default)]
    pub until: Option<SimDuration>,
}

impl Slowdown {
    fn default_factor() -> f64 {
        1.3
    }
}

/// What the active faults do to one engine step (the product of all of them).
#[derive(Clone, Debug, PartialEq)]
pub struct FaultEffects {
    /// Multiplier on the whole step time (cold start, slow drift).
    pub step_mult: f64,
    /// Multiplier on decode-only steps (version regression throughput loss).
    pub decode_mult: f64,
    /// Nanoseconds added to steps with prefill work (version regression).
    pub prefill_extra_ns: Nanos,
    /// Context length above which `long_ctx_mult` applies.
    pub long_ctx_threshold: u32,
    /// Cost multiplier of long sequences (context collapse; 1 = none).
    pub long_ctx_mult: f64,
    /// Batch-saturation knee (concurrent sequences).
    pub batch_knee: u32,
    /// Batch-saturation slope (0 = none).
    pub batch_slope: f64,
    /// Batch-saturation largest utilisation drop.
    pub util_drop: f64,
    /// Fraction of the KV pool pinned (KV pressure, slow-drift leak).
    pub kv_pinned_frac: f64,
    /// Probability that a prefix-cache lookup is invalidated.
    pub prefix_invalidate: f64,
    /// While `Some(t)`: admission from the waiting queue is stalled until `t`.
    pub stall_until: Option<Nanos>,
}

impl Default for FaultEffects {
    fn default() -> Self {
        FaultEffects {
            step_mult: 1.0,
            decode_mult: 1.0,
            prefill_extra_ns: 0,
            long_ctx_threshold: u32::MAX,
            long_ctx_mult: 1.0,
            batch_knee: u32::MAX,
            batch_slope: 0.0,
            util_drop: 0.0,
            kv_pinned_frac: 0.0,
            prefix_invalidate: 0.0,
            stall_until: None,
        }
    }
}

impl FaultEffects {
    /// Step multiplier from batch saturation at `n` running sequences.
    pub fn saturation_mult(&self, n: u32) -> f64 {
        if n > self.batch_knee && self.batch_slope > 0.0 {
            1.0 + self.batch_slope * f64::from(n - self.batch_knee) / f64::from(self.batch_knee.max(1))
        } else {
            1.0
        }
    }

    /// GPU utilisation factor at `n` running sequences (1 = no drop).
    pub fn util_factor(&self, n: u32) -> f64 {
        let excess = self.saturation_mult(n) - 1.0;
        1.0 - self.util_drop * excess.min(1.0)
    }
}

/// Linear ramp level in [0, 1] at time t for a fault with onset, ramp and optional end.
fn level(t: Nanos, onset: SimDuration, ramp: SimDuration, until: Option<SimDuration>) -> f64 {
    let on = onset.nanos();
    if t < on || until.is_some_and(|u| t >= u.nanos()) {
        return 0.0;
    }
    let r = ramp.nanos();
    if r == 0 { 1.0 } else { ((t - on) as f64 / r as f64).min(1.0) }
}

impl Fault {
    /// The kind's name as in JSON (`cold_start`, `queue_blocking`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::ColdStart(_) => "cold_start",
            Fault::ContextCollapse(_) => "context_collapse",
            Fault::BatchSaturation(_) => "batch_saturation",
            Fault::KvPressure(_) => "kv_pressure",
            Fault::QueueBlocking(_) => "queue_blocking",
            Fault::SlowDrift(_) => "slow_drift",
            Fault::VersionRegression(_) => "version_regression",
            Fault::Slowdown(_) => "slowdown",
        }
    }

    /// The onset on the engine's clock.
    pub fn onset(&self) -> SimDuration {
        match self {
            Fault::ColdStart(f) => f.onset,
            Fault::ContextCollapse(f) => f.onset,
            Fault::BatchSaturation(f) => f.onset,
            Fault::KvPressure(f) => f.onset,
            Fault::QueueBlocking(f) => f.onset,
            Fault::SlowDrift(f) => f.onset,
            Fault::VersionRegression(f) => f.onset,
            Fault::Slowdown(f) => f.onset,
        }
    }

    /// Shifts every time of the fault by `secs` (used to make a run-time fault relative to now).
    pub fn shift(&mut self, secs: f64) {
        let sh = |d: &mut SimDuration| d.0 = (d.0 + secs).max(0.0);
        let sh_opt = |d: &mut Option<SimDuration>| {
            if let Some(x) = d {
                x.0 = (x.0 + secs).max(0.0);
            }
        };
        match self {
            Fault::ColdStart(f) => sh(&mut f.onset),
            Fault::ContextCollapse(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::BatchSaturation(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::KvPressure(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::QueueBlocking(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::SlowDrift(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::VersionRegression(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
            Fault::Slowdown(f) => {
                sh(&mut f.onset);
                sh_opt(&mut f.until)
            }
        }
    }

    /// Whether the fault changes anything at time `t` for an engine with this version.
    pub fn is_active(&self, t: Nanos, version: &str) -> bool {
        let mut fx = FaultEffects::default();
        self.apply(t, version, &mut fx);
        fx != FaultEffects::default()
    }

    /// Checks ranges; returns a description of the first problem.
    pub fn validate(&self) -> Result<(), String> {
        let finite_nonneg = |v: f64, what: &str| {
            if v.is_finite() && v >= 0.0 { Ok(()) } else { Err(format!("{}: {what} must be >= 0", self.kind())) }
        };
        match self {
            Fault::ColdStart(f) => {
                if !(f.strength.is_finite() && f.strength >= 1.0) {
                    return Err("cold_start: strength (slowdown factor) must be >= 1".into());
                }
                if f.warmup.0 <= 0.0 {
                    return Err("cold_start: warmup must be > 0".into());
                }
                Ok(())
            }
            Fault::ContextCollapse(f) => {
                if f.threshold_tokens == 0 {
                    return Err("context_collapse: threshold_tokens must be > 0".into());
                }
                finite_nonneg(f.strength, "strength")
            }
            Fault::BatchSaturation(f) => {
                if f.knee == 0 {
                    return Err("batch_saturation: knee must be > 0".into());
                }
                if !(0.0..=1.0).contains(&f.util_drop) {
                    return Err("batch_saturation: util_drop must be in [0, 1]".into());
                }
                finite_nonneg(f.strength, "strength")
            }
            Fault::KvPressure(f) => {
                if !(0.0..=0.95).contains(&f.strength) {
                    return Err("kv_pressure: strength (pinned fraction) must be in [0, 0.95]".into());
                }
                Ok(())
            }
            Fault::QueueBlocking(f) => {
                if !(0.0..1.0).contains(&f.strength) {
                    return Err("queue_blocking: strength (stalled fraction) must be in [0, 1)".into());
                }
                if f.period.0 <= 0.0 {
                    return Err("queue_blocking: period must be > 0".into());
                }
                Ok(())
            }
            Fault::SlowDrift(f) => {
                finite_nonneg(f.rate_per_day, "rate_per_day")?;
                finite_nonneg(f.leak_per_day, "leak_per_day")
            }
            Fault::VersionRegression(f) => {
                if !(0.0..1.0).contains(&f.throughput_loss) {
                    return Err("version_regression: throughput_loss must be in [0, 1)".into());
                }
                finite_nonneg(f.strength, "strength")
            }
            Fault::Slowdown(f) => {
                if !(f.factor.is_finite() && f.factor >= 1.0) {
                    return Err("slowdown: factor must be >= 1".into());
                }
                Ok(())
            }
        }
    }

    /// Folds this fault's effect at time `t` into `fx`.
    pub fn apply(&self, t: Nanos, version: &str, fx: &mut FaultEffects) {
        match self {
            Fault::ColdStart(f) => {
                let on = f.onset.nanos();
                if t >= on {
                    let age = (t - on) as f64 / 1e9;
                    fx.step_mult *= 1.0 + (f.strength - 1.0) * (-age / f.warmup.0.max(1e-9)).exp();
                }
            }
            Fault::ContextCollapse(f) => {
                let l = level(t, f.onset, f.ramp, f.until);
                if l > 0.0 {
                    fx.long_ctx_threshold = fx.long_ctx_threshold.min(f.threshold_tokens);
                    fx.long_ctx_mult *= 1.0 + f.strength * l;
                }
            }
            Fault::BatchSaturation(f) => {
                let l = level(t, f.onset, f.ramp, f.until);
                if l > 0.0 {
                    fx.batch_knee = fx.batch_knee.min(f.knee);
                    fx.batch_slope += f.strength * l;
                    fx.util_drop = fx.util_drop.max(f.util_drop);
                }
            }
            Fault::KvPressure(f) => {
                let l = level(t, f.onset, f.ramp, f.until);
                if l > 0.0 {
                    fx.kv_pinned_frac = (fx.kv_pinned_frac + f.strength * l).min(0.95);
                    fx.prefix_invalidate = 1.0 - (1.0 - fx.prefix_invalidate) * (1.0 - f.strength * l);
                }
            }
            Fault::QueueBlocking(f) => {
                let l = level(t, f.onset, SimDuration(0.0), f.until);
                if l > 0.0 && f.strength > 0.0 {
                    let period = f.period.nanos().max(1);
                    let stall = (f.strength * period as f64) as Nanos;
                    let start = f.onset.nanos() + (t - f.onset.nanos()) / period * period;
                    let mut end = start + stall;
                    if let Some(u) = f.until {
                        end = end.min(u.nanos());
                    }
                    if t < end {
                        fx.stall_until = Some(fx.stall_until.map_or(end, |e| e.max(end)));
                    }
                }
            }
            Fault::SlowDrift(f) => {
                let l = level(t, f.onset, SimDuration(0.0), f.until);
                if l > 0.0 {
                    let days = (t - f.onset.nanos()) as f64 / NANOS_PER_DAY as f64;
                    fx.step_mult *= 1.0 + f.rate_per_day * days;
                    fx.kv_pinned_frac = (fx.kv_pinned_frac + (f.leak_per_day * days).min(0.9)).min(0.95);
                }
            }
            Fault::VersionRegression(f) => {
                let applies = f.version.as_deref().is_none_or(|v| v == version);
                if applies && level(t, f.onset, SimDuration(0.0), f.until) > 0.0 {
                    fx.prefill_extra_ns += (f.strength.max(0.0) * 1e6) as Nanos;
                    fx.decode_mult /= 1.0 - f.throughput_loss;
                }
            }
            Fault::Slowdown(f) => {
                let l = level(t, f.onset, f.ramp, f.until);
                if l > 0.0 {
                    fx.step_mult *= 1.0 + (f.factor - 1.0) * l;
                }
            }
        }
    }
}

impl FaultSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks every fault.
    pub fn validate(&self) -> Result<(), String> {
        for (i, f) in self.faults.iter().enumerate() {
            f.validate().map_err(|e| format!("faults[{i}]: {e}"))?;
        }
        Ok(())
    }

    /// The combined effects at time `t` on an engine with this version label.
    pub fn effects(&self, t: Nanos, version: &str) -> FaultEffects {
        let mut fx = FaultEffects::default();
        for f in &self.faults {
            f.apply(t, version, &mut fx);
        }
        fx
    }

    /// True when a cold start begins in `(after, upto]` (the engine then empties its caches).
    pub fn cold_start_between(&self, after: Option<Nanos>, upto: Nanos) -> bool {
        self.faults.iter().any(|f| match f {
            Fault::ColdStart(c) => {
                let on = c.onset.nanos();
                on <= upto && after.is_none_or(|a| on > a)
            }
            _ => false,
        })
    }

    /// Parses and validates a set from JSON.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let set: FaultSet = serde_json::from_str(text).map_err(|e| e.to_string())?;
        set.validate()?;
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_roundtrip_and_unknown_keys() {
        let set = FaultSet::from_json(
            r#"{"faults":[{"kind":"queue_blocking","onset":"30s","strength":0.5},
                {"kind":"slow_drift","onset":172800,"rate_per_day":0.04},
                {"kind":"version_regression","version":"B"}]}"#,
        )
        .unwrap();
        assert_eq!(set.faults.len(), 3);
        assert_eq!(set.faults[0].onset(), SimDuration(30.0));
        let back = FaultSet::from_json(&serde_json::to_string(&set).unwrap()).unwrap();
        assert_eq!(back, set);
        let err = FaultSet::from_json(r#"{"faults":[{"kind":"queue_blocking","strenght":0.5}]}"#).unwrap_err();
        assert!(err.contains("strenght"), "{err}");
        assert!(FaultSet::from_json(r#"{"faults":[{"kind":"nope"}]}"#).is_err());
        assert!(FaultSet::from_json(r#"{"faults":[{"kind":"queue_blocking","strength":1.5}]}"#).is_err());
    }

    #[test]
    fn queue_blocking_stalls_periodically() {
        let set =
            FaultSet::from_json(r#"{"faults":[{"kind":"queue_blocking","onset":10,"strength":0.25,"period":4}]}"#)
                .unwrap();
        let s = 1_000_000_000;
        assert_eq!(set.effects(9 * s, "v").stall_until, None);
        assert_eq!(set.effects(10 * s, "v").stall_until, Some(11 * s));
        assert_eq!(set.effects(11 * s, "v").stall_until, None);
        assert_eq!(set.effects(14 * s + 5, "v").stall_until, Some(15 * s));
    }

    #[test]
    fn version_regression_targets_one_version() {
        let set =
            FaultSet::from_json(r#"{"faults":[{"kind":"version_regression","version":"B","strength":5}]}"#).unwrap();
        assert_eq!(set.effects(0, "A").prefill_extra_ns, 0);
        assert_eq!(set.effects(0, "B").prefill_extra_ns, 5_000_000);
        assert!(set.faults[0].is_active(0, "B"));
        assert!(!set.faults[0].is_active(0, "A"));
    }

    #[test]
    fn slowdown_ramps_to_its_factor() {
        let set = FaultSet::from_json(r#"{"faults":[{"kind":"slowdown","onset":10,"factor":1.3,"ramp":10}]}"#).unwrap();
        let s = 1_000_000_000;
        assert_eq!(set.effects(9 * s, "v").step_mult, 1.0);
        assert!((set.effects(15 * s, "v").step_mult - 1.15).abs() < 1e-9);
        assert!((set.effects(30 * s, "v").step_mult - 1.3).abs() < 1e-9);
        assert!(FaultSet::from_json(r#"{"faults":[{"kind":"slowdown","factor":0.9}]}"#).is_err());
    }

    #[test]
    fn cold_start_decays_and_drift_grows() {
        let set = FaultSet::from_json(r#"{"faults":[{"kind":"cold_start","strength":4,"warmup":10}]}"#).unwrap();
        assert!((set.effects(0, "v").step_mult - 4.0).abs() < 1e-9);
        assert!(set.effects(100_000_000_000, "v").step_mult < 1.001);
        let d = FaultSet::from_json(r#"{"faults":[{"kind":"slow_drift","onset":"1d","rate_per_day":0.1}]}"#).unwrap();
        assert_eq!(d.effects(NANOS_PER_DAY / 2, "v").step_mult, 1.0);
        assert!((d.effects(11 * NANOS_PER_DAY, "v").step_mult - 2.0).abs() < 1e-9);
    }
}
