//! From the latest KV-pressure inputs of a group to condition flags, a score and a level.

use serde::Deserialize;

/// Thresholds of the conditions (defaults: docs/detectors/kv_pressure.md).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// KV-cache usage fraction at or above which usage is high (default 0.9).
    pub usage: f64,
    /// Prefix-cache hit rate below which it is low (default 0.62).
    pub hit_rate: f64,
    /// Queue time p99 in seconds above which the queue blocks (default 0.8).
    pub queue_p99_s: f64,
    /// Preemptions per second above which the engine is preempting (default 0.1).
    pub preemption_rate: f64,
    /// KVF above which the free space is fragmented (default 0.5).
    pub kvf: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { usage: 0.9, hit_rate: 0.62, queue_p99_s: 0.8, preemption_rate: 0.1, kvf: 0.5 }
    }
}

/// The inputs, in the order of [`Inputs::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Input {
    /// KV-cache usage fraction.
    Usage,
    /// Preemptions per second.
    PreemptionRate,
    /// Prefix-cache hit rate.
    HitRate,
    /// Queue time p99, seconds.
    QueueP99,
    /// Fragmentation index KVF.
    Kvf,
}

impl Input {
    /// Every input.
    pub const ALL: [Input; 5] = [Input::Usage, Input::PreemptionRate, Input::HitRate, Input::QueueP99, Input::Kvf];

    /// Index in [`Inputs::values`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The evidence attribute carrying its latest value.
    pub fn evidence_key(self) -> &'static str {
        match self {
            Input::Usage => "kv_pressure.usage",
            Input::PreemptionRate => "kv_pressure.preemption_rate",
            Input::HitRate => "kv_pressure.hit_rate",
            Input::QueueP99 => "kv_pressure.queue_p99_s",
            Input::Kvf => "kv_pressure.kvf",
        }
    }
}

/// The latest fresh value of each input (none: never seen, or stale).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Inputs {
    /// Indexed by [`Input::index`].
    pub values: [Option<f64>; 5],
}

impl Inputs {
    /// The value of `input`.
    pub fn get(&self, input: Input) -> Option<f64> {
        self.values[input.index()]
    }
}

/// The conditions of docs/detectors/kv_pressure.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    /// usage ≥ threshold.
    pub usage_high: bool,
    /// hit rate < threshold.
    pub hit_rate_low: bool,
    /// queue p99 > threshold.
    pub queue_blocking: bool,
    /// preemption rate > threshold.
    pub preempting: bool,
    /// KVF > threshold.
    pub fragmented: bool,
}

/// Score weight of high usage (the five weights sum to 1).
pub const W_USAGE: f64 = 0.20;
/// Score weight of a low prefix-cache hit rate.
pub const W_HIT_RATE: f64 = 0.15;
/// Score weight of queue blocking.
pub const W_QUEUE: f64 = 0.30;
/// Score weight of preemptions.
pub const W_PREEMPTION: f64 = 0.25;
/// Score weight of fragmentation.
pub const W_KVF: f64 = 0.10;

impl Flags {
    /// The conditions the inputs meet (an unknown input meets none).
    pub fn of(inputs: &Inputs, t: &Thresholds) -> Flags {
        let above = |i: Input, th: f64| inputs.get(i).is_some_and(|v| v > th);
        Flags {
            usage_high: inputs.get(Input::Usage).is_some_and(|v| v >= t.usage),
            hit_rate_low: inputs.get(Input::HitRate).is_some_and(|v| v < t.hit_rate),
            queue_blocking: above(Input::QueueP99, t.queue_p99_s),
            preempting: above(Input::PreemptionRate, t.preemption_rate),
            fragmented: above(Input::Kvf, t.kvf),
        }
    }

    fn list(&self) -> [(bool, f64, &'static str); 5] {
        [
            (self.usage_high, W_USAGE, "usage_high"),
            (self.hit_rate_low, W_HIT_RATE, "hit_rate_low"),
            (self.queue_blocking, W_QUEUE, "queue_blocking"),
            (self.preempting, W_PREEMPTION, "preempting"),
            (self.fragmented, W_KVF, "fragmented"),
        ]
    }

    /// Whether `input` takes part in a condition met (its own condition is met).
    pub fn involves(&self, input: Input) -> bool {
        match input {
            Input::Usage => self.usage_high,
            Input::PreemptionRate => self.preempting,
            Input::HitRate => self.hit_rate_low,
            Input::QueueP99 => self.queue_blocking,
            Input::Kvf => self.fragmented,
        }
    }

    /// Number of conditions met.
    pub fn count(&self) -> usize {
        self.list().iter().filter(|f| f.0).count()
    }

    /// The score: the weighted sum of the conditions met, in [0, 1].
    pub fn score(&self) -> f64 {
        self.list().iter().filter(|f| f.0).map(|f| f.1).sum()
    }

    /// The critical combinations: queue blocking, or preemptions while usage is high.
    pub fn critical(&self) -> bool {
        self.queue_blocking || (self.preempting && self.usage_high)
    }

    /// The level: 0 with no condition; with a critical combination 0.8 + 0.05 per further
    /// condition (at most 1); otherwise 0.6 + 0.05 per further condition (at most 0.75, a warning).
    pub fn level(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        let extra = 0.05 * (n - 1) as f64;
        if self.critical() { (0.8 + extra).min(1.0) } else { (0.6 + extra).min(0.75) }
    }

    /// The names of the conditions met, comma-separated (empty when none).
    pub fn names(&self) -> String {
        self.list().iter().filter(|f| f.0).map(|f| f.2).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(v: [Option<f64>; 5]) -> Flags {
        Flags::of(&Inputs { values: v }, &Thresholds::default())
    }

    #[test]
    fn single_conditions_warn_and_critical_ones_page() {
        let none = inputs([Some(0.5), Some(0.0), Some(0.9), Some(0.1), Some(0.1)]);
        assert_eq!((none.count(), none.score(), none.level(), none.names()), (0, 0.0, 0.0, String::new()));
        let usage = inputs([Some(0.9), None, None, None, None]);
        assert_eq!((usage.names(), usage.level()), ("usage_high".to_string(), 0.6));
        let hit = inputs([None, None, Some(0.61), None, None]);
        assert_eq!((hit.names(), hit.score(), hit.level()), ("hit_rate_low".to_string(), W_HIT_RATE, 0.6));
        assert_eq!(inputs([None, None, Some(0.62), None, None]).count(), 0, "62 % is not below 62 %");
        assert_eq!(inputs([None, None, None, Some(0.8), None]).count(), 0, "800 ms is not above 800 ms");
        let queue = inputs([None, None, None, Some(0.81), None]);
        assert_eq!((queue.names(), queue.level()), ("queue_blocking".to_string(), 0.8));
        let preempt = inputs([Some(0.5), Some(0.5), None, None, None]);
        assert_eq!((preempt.names(), preempt.level()), ("preempting".to_string(), 0.6), "without high usage");
        let both = inputs([Some(0.95), Some(0.5), None, None, None]);
        assert_eq!(both.names(), "usage_high,preempting");
        assert!((both.level() - 0.85).abs() < 1e-12 && (both.score() - 0.45).abs() < 1e-12);
        let two_mild = inputs([Some(0.95), None, Some(0.3), None, Some(0.6)]);
        assert_eq!(two_mild.names(), "usage_high,hit_rate_low,fragmented");
        assert!((two_mild.level() - 0.7).abs() < 1e-12, "still a warning: {}", two_mild.level());
        let queue_only = inputs([Some(0.17), Some(0.0), Some(0.9), Some(2.4), None]);
        let involved: Vec<bool> = Input::ALL.iter().map(|&i| queue_only.involves(i)).collect();
        assert_eq!(involved, [false, false, false, true, false], "only the queue meets its condition");
        assert!(Input::ALL.iter().all(|&i| both.involves(i) == matches!(i, Input::Usage | Input::PreemptionRate)));
        let all = inputs([Some(1.0), Some(2.0), Some(0.1), Some(3.0), Some(0.9)]);
        assert_eq!((all.count(), all.level()), (5, 1.0));
        assert!((all.score() - 1.0).abs() < 1e-12, "the weights sum to 1");
        assert!(Input::ALL.iter().all(|&i| all.involves(i)));
    }
}
