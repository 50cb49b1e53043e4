//! Cumulative Prometheus-style histograms with vLLM's exact bucket boundaries
//! (tests/fixtures/servers/vllm-*.metrics.json).

/// TTFT buckets (`vllm:time_to_first_token_seconds`).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// ITL / TPOT buckets.
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Request-latency buckets (e2e, queue, prefill, decode, inference).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// `vllm:iteration_tokens_total` buckets.
pub const ITERATION_TOKENS_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
/// `vllm:request_params_n` buckets.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, … up to the limit.
pub fn buckets_1_2_5(max: u32) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exp = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let v = m * exp;
            if v > u64::from(max) {
                return out;
            }
            out.push(v as f64);
        }
        exp *= 10;
    }
}

/// A cumulative histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds (+Inf implied).
    pub bounds: Vec<f64>,
    /// Per-bucket counts (not cumulative), `bounds.len() + 1` entries.
    pub counts: Vec<u64>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these bounds.
    pub fn new(bounds: &[f64]) -> Self {
        Histogram { bounds: bounds.to_vec(), counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Records `n` observations of `v` (Prometheus `le` semantics: v ≤ bound).
    pub fn observe_n(&mut self, v: f64, n: u64) {
        if n == 0 || !v.is_finite() {
            return;
        }
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += n;
        self.sum += v * n as f64;
        self.count += n;
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        self.observe_n(v, 1);
    }

    /// Empties it (process restart).
    pub fn reset(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.sum = 0.0;
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five() {
        assert_eq!(buckets_1_2_5(4096), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]);
        assert_eq!(buckets_1_2_5(8192).last(), Some(&5000.0));
    }

    #[test]
    fn le_semantics() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(1.0);
        h.observe(1.5);
        h.observe_n(9.0, 2);
        assert_eq!(h.counts, vec![1, 1, 2]);
        assert_eq!(h.count, 4);
    }
}
