//! Cumulative engine counters: the source of the `vllm:*` counters.

use serde::{Deserialize, Serialize};

/// Monotonic counters since the engine was created.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Prompt tokens of requests that reached their first token (`vllm:prompt_tokens_total`).
    pub prompt_tokens: u64,
    /// Output tokens emitted (`vllm:generation_tokens_total`).
    pub generation_tokens: u64,
    /// Prompt tokens served from the prefix cache, counted with `prompt_tokens` at a
    /// request's first token (`vllm:prompt_tokens_cached_total`).
    pub prompt_tokens_cached: u64,
    /// Prefix-cache queried tokens (`vllm:prefix_cache_queries_total`).
    pub prefix_queries: u64,
    /// Prefix-cache hit tokens (`vllm:prefix_cache_hits_total`).
    pub prefix_hits: u64,
    /// Preemptions (`vllm:num_preemptions_total`).
    pub preemptions: u64,
    /// Finished requests by reason, indexed by [`crate::engine::FinishReason::index`]
    /// (`vllm:request_success_total{finished_reason}`).
    pub finished: [u64; 4],
    /// Requests refused at submission.
    pub rejected: u64,
    /// Engine steps run.
    pub steps: u64,
    /// Tokens processed by steps (prefill chunks + decodes).
    pub step_tokens: u64,
    /// Nanoseconds spent in steps (GPU busy).
    pub busy_ns: u64,
    /// Busy nanoseconds weighted by the step's GPU utilisation.
    pub util_ns: f64,
}
