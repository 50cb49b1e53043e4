//! The step-time cost model: a roofline over the weights and KV bytes read and the FLOPs of
//! the batch, plus a fixed per-step overhead, modified by the active faults.

use super::config::EngineConfig;
use crate::faults::FaultEffects;

/// One sequence's work in a step: `tokens` new tokens on top of `context` already computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqWork {
    /// Tokens processed this step (1 for a decode, a chunk for a prefill).
    pub tokens: u32,
    /// Tokens already in the KV cache before this step.
    pub context: u32,
    /// The sequence's whole length (prompt + output so far).
    pub total: u32,
}

/// Derived constants of the cost model.
#[derive(Clone, Debug)]
pub struct CostModel {
    overhead_ns: f64,
    weight_bytes: f64,
    kv_bytes_per_token: f64,
    bytes_per_ns: f64,
    flops_per_ns: f64,
    linear_flops_per_token: f64,
    attn_flops_per_token_ctx: f64,
}

/// Accumulates one step's work; see [`CostModel::finish`].
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    flops: f64,
    kv_tokens: f64,
    /// Tokens processed.
    pub tokens: u32,
    /// Sequences with prefill work.
    pub prefill_seqs: u32,
    /// Sequences decoding one token.
    pub decode_seqs: u32,
}

impl CostModel {
    /// The model for this configuration.
    pub fn new(cfg: &EngineConfig) -> Self {
        let g = cfg.gpu();
        let m = cfg.model();
        CostModel {
            overhead_ns: g.step_overhead_us * 1e3,
            weight_bytes: m.weight_bytes(),
            kv_bytes_per_token: m.kv_bytes_per_token(),
            bytes_per_ns: g.effective_bandwidth_gbs,
            flops_per_ns: g.effective_tflops * 1e3,
            linear_flops_per_token: 2.0 * m.params,
            attn_flops_per_token_ctx: 4.0 * f64::from(m.num_layers) * f64::from(m.hidden_size),
        }
    }

    /// Adds one sequence's work to `acc`, applying context collapse from `fx` (all the work of a
    /// sequence longer than the threshold is slowed, every chunk of its prefill included).
    pub fn add(&self, acc: &mut StepCost, w: SeqWork, is_prefill: bool, fx: &FaultEffects) {
        let n = f64::from(w.tokens);
        let c = f64::from(w.context);
        let mut flops = self.linear_flops_per_token * n + self.attn_flops_per_token_ctx * n * (c + (n + 1.0) / 2.0);
        let mut kv = c + n;
        if w.total > fx.long_ctx_threshold {
            flops *= fx.long_ctx_mult;
            kv *= fx.long_ctx_mult;
        }
        acc.flops += flops;
        acc.kv_tokens += kv;
        acc.tokens += w.tokens;
        if is_prefill {
            acc.prefill_seqs += 1;
        } else {
            acc.decode_seqs += 1;
        }
    }

    /// The step's duration in ns for `running` concurrent sequences under `fx`.
    pub fn finish(&self, acc: &StepCost, running: u32, fx: &FaultEffects) -> u64 {
        let mem = (self.weight_bytes + self.kv_bytes_per_token * acc.kv_tokens) / self.bytes_per_ns;
        let compute = acc.flops / self.flops_per_ns;
        let mut t = mem.max(compute) * fx.saturation_mult(running) * fx.step_mult;
        if acc.prefill_seqs == 0 {
            t *= fx.decode_mult;
        }
        t += self.overhead_ns;
        let mut ns = t.max(1.0).round() as u64;
        if acc.prefill_seqs > 0 {
            ns += fx.prefill_extra_ns;
        }
        ns
    }
}
