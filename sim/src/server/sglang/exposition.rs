//! SGLang's `/metrics` text: SGLang always runs prometheus_client in multiprocess mode
//! (`utils/common.py` `set_prometheus_multiproc_dir`, `MultiProcessCollector`), so the text is
//! that collector's ([`crate::server::prom::multiprocess`]): no `_created` series, label names
//! sorted, a family without a child absent, gauges of multiprocess mode `all`
//! (`num_retracted_reqs`, `num_paused_reqs`) with a `pid` label. The names, help texts, label
//! names and buckets here are those of `sglang/srt/observability/metrics_collector.py` and
//! `http_request_metrics.py` (tests/fixtures/servers/sglang-0.5.23.metrics.json).

use crate::scenario::histo::Histogram;
use crate::server::prom::multiprocess as mp;

/// `sglang:time_to_first_token_seconds` buckets (from 0.1 s).
pub const TTFT_BUCKETS: &[f64] =
    &[0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0];
/// `sglang:e2e_request_latency_seconds` buckets.
pub const E2E_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0, 1200.0,
    1800.0, 2400.0,
];
/// `sglang:inter_token_latency_seconds` and `request_time_per_output_token_seconds` buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
    0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
];
/// `sglang:queue_time_seconds` buckets (from 0).
pub const QUEUE_BUCKETS: &[f64] = &[
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0,
    1800.0, 2000.0, 2500.0, 3000.0,
];
/// The prompt / uncached prompt / generation token-length histograms' buckets.
pub const TOKEN_BUCKETS: &[f64] = &[
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0, 8000.0, 9000.0,
    10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0, 27500.0, 30000.0, 35000.0, 40000.0, 60000.0,
    80000.0, 100000.0, 200000.0, 300000.0, 400000.0, 600000.0, 800000.0, 1000000.0, 1100000.0,
];

/// The scheduler's gauges, in `SchedulerMetricsCollector.log_stats` order, with their help
/// texts (every one is set at each stats log).
pub const SCHEDULER_GAUGES: &[(&str, &str)] = &[
    ("sglang:num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    ("sglang:gen_throughput", "The generation throughput (token/s)."),
    ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    ("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    ("sglang:token_usage", "The token usage."),
    ("sglang:full_token_usage", "The token usage for full attention layers."),
    ("sglang:swa_token_usage", "The token usage for SWA layers."),
    ("sglang:mamba_usage", "The token usage for Mamba layers."),
    ("sglang:num_used_tokens", "The number of used tokens."),
    ("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool."),
    ("sglang:kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV cache pool."),
    ("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool."),
    ("sglang:swa_available_tokens", "Number of free token slots in the SWA pool (hybrid-SWA only)."),
    ("sglang:swa_evictable_tokens", "Number of evictable (radix-cached) token slots in the SWA pool."),
    ("sglang:swa_used_tokens", "Number of actively used token slots in the SWA pool."),
    ("sglang:mamba_available_tokens", "Number of free state slots in the mamba SSM pool (hybrid-SSM only)."),
    ("sglang:mamba_evictable_tokens", "Number of evictable (radix-cached) state slots in the mamba SSM pool."),
    ("sglang:mamba_used_tokens", "Number of actively used state slots in the mamba SSM pool."),
    (
        "sglang:spec_accept_length",
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    ),
    ("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    (
        "sglang:spec_cap_length",
        "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled).",
    ),
    (
        "sglang:spec_block_accept_length",
        "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode).",
    ),
    ("sglang:spec_num_steps", "Currently active speculative_num_steps."),
    (
        "sglang:spec_num_draft_tokens",
        "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
    ),
    ("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue."),
    ("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    ("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    ("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    (
        "sglang:num_decode_host_receive_queue_reqs",
        "Requests in the decode transfer queue receiving into host memory or waiting for device admission.",
    ),
    (
        "sglang:num_decode_deferred_kv_release_reqs",
        "The number of failed decode requests whose KV allocations are held pending transfer drain acknowledgement or timeout.",
    ),
    ("sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."),
    (
        "sglang:prealloc_full_token_usage",
        "Share of the full-attention KV pool held by decode requests whose KV transfer is pending (preallocated, not yet running); same capacity basis as sglang:full_token_usage.",
    ),
    (
        "sglang:prealloc_swa_token_usage",
        "Share of the SWA KV pool held by decode requests whose KV transfer is pending; same capacity basis as sglang:swa_token_usage.",
    ),
    ("sglang:utilization", "The utilization."),
    ("sglang:fwd_occupancy", "Forward pass GPU occupancy percentage."),
    ("sglang:new_token_ratio", "The new token ratio."),
    ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("sglang:num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
];

/// The constants the scheduler emits once at start-up (`emit_constants`).
pub const CONSTANT_GAUGES: &[(&str, &str)] = &[
    ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("sglang:weight_memory_usage_gb", "Memory used by model weights in GB."),
    ("sglang:kv_cache_memory_usage_gb", "Memory used by the KV cache pools in GB."),
    ("sglang:max_running_requests_under_SLO", "The maximum number of running requests under SLO."),
    ("sglang:page_size", "KV cache page size in tokens."),
    ("sglang:num_pages", "Number of KV cache pages."),
    ("sglang:context_len", "Maximum context length."),
    ("sglang:startup_available_gpu_memory_gb", "Available GPU memory in GB at startup."),
];

/// Help of `sglang:weight_load_duration_seconds`.
pub const WEIGHT_LOAD_HELP: &str = "Wall time of the most recent update_weights_from_<source> call on this scheduler \
     rank (seconds). `source` label is one of: disk, distributed, tensor, ipc. Event-detection via \
     changes(...[<range>]) > 0 — no separate counter needed.";

/// The `is_streaming` label values, by index (0: non-streaming, 1: streaming).
pub const IS_STREAMING: [&str; 2] = ["false", "true"];

/// The label sets of one server: the scheduler's (`model_name`, `engine_type`, `tp_rank`,
/// `pp_rank`, `moe_ep_rank`) and the tokenizer's (`model_name`, `engine_type`), for a unified
/// (not disaggregated) single-GPU server.
#[derive(Clone, Debug)]
pub struct Labels {
    /// The served model name.
    pub model: String,
    /// This process's id (the `pid` label of mode-`all` gauges).
    pub pid: String,
}

impl Labels {
    /// The scheduler's labels.
    pub fn scheduler(&self) -> [(&str, &str); 5] {
        [
            ("model_name", self.model.as_str()),
            ("engine_type", "unified"),
            ("tp_rank", "0"),
            ("pp_rank", "0"),
            ("moe_ep_rank", "0"),
        ]
    }

    /// The scheduler's labels plus `pid` (multiprocess mode `all`).
    pub fn scheduler_pid(&self) -> [(&str, &str); 6] {
        let [a, b, c, d, e] = self.scheduler();
        [a, b, c, d, e, ("pid", self.pid.as_str())]
    }

    /// The scheduler's labels plus one more.
    pub fn scheduler_and<'a>(&'a self, k: &'a str, v: &'a str) -> [(&'a str, &'a str); 6] {
        let [a, b, c, d, e] = self.scheduler();
        [a, b, c, d, e, (k, v)]
    }

    /// The tokenizer's labels.
    pub fn tokenizer(&self) -> [(&str, &str); 2] {
        [("model_name", self.model.as_str()), ("engine_type", "unified")]
    }

    /// The tokenizer's labels plus one more.
    pub fn tokenizer_and<'a>(&'a self, k: &'a str, v: &'a str) -> [(&'a str, &'a str); 3] {
        let [a, b] = self.tokenizer();
        [a, b, (k, v)]
    }
}

/// Writes families into one exposition text.
#[derive(Debug, Default)]
pub struct Writer {
    /// The text so far.
    pub out: String,
}

impl Writer {
    /// A gauge family with these children.
    pub fn gauge(&mut self, name: &str, help: &str, children: &[(&[(&str, &str)], f64)]) {
        if !children.is_empty() {
            mp::gauge(&mut self.out, name, help, children);
        }
    }

    /// A counter family (`name` without `_total`); absent without children.
    pub fn counter(&mut self, name: &str, help: &str, children: &[(&[(&str, &str)], f64)]) {
        if !children.is_empty() {
            mp::counter(&mut self.out, &format!("{name}_total"), help, children);
        }
    }

    /// A histogram family; absent without children.
    pub fn histogram(&mut self, name: &str, help: &str, children: &[(&[(&str, &str)], &Histogram)]) {
        if !children.is_empty() {
            mp::histogram(&mut self.out, name, help, children);
        }
    }
}
