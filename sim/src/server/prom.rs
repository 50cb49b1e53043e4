//! `GET /metrics`: vLLM V1's `vllm:*` metrics in the Prometheus text format 0.0.4, rendered as
//! Python's prometheus_client renders them (counters exposed with `_total` plus a `_created`
//! gauge, histograms with `_bucket` / `_count` / `_sum` / `_created`, floats such as `1.0`
//! and `1.7e+09`, labels `model_name` and `engine`). Names, types, labels and bucket
//! boundaries follow vLLM's source (tests/fixtures/servers/vllm-*.metrics.json).

use std::fmt::Write;

use crate::engine::{EngineConfig, EngineStats, FinishReason, RequestRecord};
/// `vllm:request_num_preemptions` buckets (vLLM 0.33 `loggers.py`).
const NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

use crate::scenario::histo::{
    Histogram, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, PARAMS_N_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS,
    buckets_1_2_5,
};

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which vLLM release's `/metrics` to reproduce (tests/fixtures/servers/vllm-<version>.metrics.json).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum VllmVersion {
    /// vLLM 0.33 (V1, current): 39 families.
    #[default]
    #[value(name = "0.33")]
    V0_33,
    /// vLLM 0.10 (V1 ≤ 0.10): 26 families, deprecated `gpu_*` aliases, `time_per_output_token_seconds`.
    #[value(name = "0.10")]
    V0_10,
    /// vLLM 0.6.6 (the V0 engine): 37 families registered, `model_name` label only, no `_created`.
    #[value(name = "0.6")]
    V0_6,
}

impl std::str::FromStr for VllmVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "0.33" | "0.33.0" => Ok(VllmVersion::V0_33),
            "0.10" | "0.10.0" | "0.1" => Ok(VllmVersion::V0_10),
            "0.6" | "0.6.6" | "0.6.6.post1" => Ok(VllmVersion::V0_6),
            other => Err(format!("vllm_version: {other:?} is not one of 0.33, 0.10, 0.6")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for VllmVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// Accepts `"0.10"` and also an unquoted YAML `0.10` (a float).
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = VllmVersion;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a vLLM version: 0.33, 0.10 or 0.6")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<VllmVersion, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<VllmVersion, E> {
                self.visit_str(&v.to_string())
            }
        }
        d.deserialize_any(V)
    }
}

/// A histogram with its name and help text.
#[derive(Clone, Debug)]
struct Named {
    name: &'static str,
    help: &'static str,
    h: Histogram,
}

/// Indices into [`PromState::hist`].
#[derive(Clone, Copy)]
enum H {
    PromptTokens,
    GenerationTokens,
    IterationTokens,
    MaxNumGenerationTokens,
    ParamsN,
    ParamsMaxTokens,
    Ttft,
    Itl,
    Tpot,
    E2e,
    Queue,
    Inference,
    Prefill,
    Decode,
    NumPreemptions,
    KvComputed,
}

/// Everything `/metrics` shows; the engine driver updates it, the handler renders it.
#[derive(Clone, Debug)]
pub struct PromState {
    model_name: String,
    version: VllmVersion,
    created: f64,
    cache_info: Vec<(&'static str, String)>,
    hist: Vec<Named>,
    /// `vllm:num_requests_running`.
    pub running: usize,
    /// `vllm:num_requests_waiting`.
    pub waiting: usize,
    /// `vllm:kv_cache_usage_perc` (fraction).
    pub kv_usage: f64,
    /// The engine's cumulative counters.
    pub stats: EngineStats,
    /// `vllm:mm_cache_queries`: images passed through the multi-modal processor cache.
    pub mm_cache_queries: u64,
    /// `vllm:mm_cache_hits`: those found in it.
    pub mm_cache_hits: u64,
    /// vLLM V0's 5 s local-log interval: the prompt and generation throughput gauges.
    v0_interval: V0Interval,
    /// Prefix caching on (V0's hit-rate gauges read -1 when off).
    prefix_caching: bool,
    /// V0's CPU swap blocks: its default 4 GiB swap space in KV blocks.
    v0_cpu_blocks: u64,
}

/// What vLLM V0's `PrometheusStatLogger` keeps between its local logs (every 5 s).
#[derive(Clone, Copy, Debug, Default)]
struct V0Interval {
    /// Engine time of the last local log, seconds.
    last_s: f64,
    /// Prompt and generation tokens at that log.
    prompt: u64,
    generation: u64,
    /// The throughputs the last local log set (tokens/s).
    prompt_tps: f64,
    generation_tps: f64,
}

/// vLLM V0's default `--swap-space` (4 GiB).
const V0_SWAP_SPACE_BYTES: f64 = 4.0 * 1024.0 * 1024.0 * 1024.0;
/// vLLM V0's local logging interval (`_LOCAL_LOGGING_INTERVAL_SEC`).
const V0_LOCAL_INTERVAL_S: f64 = 5.0;
/// vLLM 0.6.6's `vllm:iteration_tokens_total` buckets with `--enforce-eager` (metrics.py).
const V0_ITERATION_TOKENS_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8096.0];

/// Per-request parameters that only the frontend knows (`n`, `max_tokens`, `stream`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestParams {
    /// The `n` parameter.
    pub n: u32,
    /// The effective `max_tokens`.
    pub max_tokens: u32,
    /// Whether the response is streamed (SGLang's `is_streaming` label).
    pub stream: bool,
}

impl PromState {
    /// Empty metrics for `model_name` served by an engine with `cfg`; `created_unix_s` is
    /// the process start (the `_created` series).
    pub fn new(model_name: &str, cfg: &EngineConfig, created_unix_s: f64) -> Self {
        let tok = buckets_1_2_5(cfg.max_model_len);
        let n = |name, help, b: &[f64]| Named { name, help, h: Histogram::new(b) };
        let hist = vec![
            n("vllm:request_prompt_tokens", "Number of prefill tokens processed.", &tok),
            n("vllm:request_generation_tokens", "Number of generation tokens processed.", &tok),
            n(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_TOKENS_BUCKETS,
            ),
            n(
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                &tok,
            ),
            n("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS),
            n("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", &tok),
            n("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
            n("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
            n(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                ITL_BUCKETS,
            ),
            n(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_LATENCY_BUCKETS,
            ),
            n(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            n(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            n(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            n(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            n(
                "vllm:request_num_preemptions",
                "Histogram of the number of times a request was preempted.",
                NUM_PREEMPTIONS_BUCKETS,
            ),
            n(
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                &tok,
            ),
        ];
        let b = |v: bool| if v { "True" } else { "False" }.to_string();
        // vLLM 0.33's CacheConfig fields (`metrics_info()`: every instance field as a string),
        // in declaration order; what the sim does not model is at vLLM's default.
        let none = || "None".to_string();
        let cache_info = vec![
            ("block_size", cfg.block_size.to_string()),
            ("user_specified_block_size", none()),
            ("kv_cache_layout", none()),
            ("prefix_match_unit", none()),
            ("gpu_memory_utilization", fmt_float(cfg.gpu_memory_utilization)),
            ("cache_dtype", "auto".to_string()),
            ("is_attention_free", b(false)),
            ("num_gpu_blocks_override", cfg.num_gpu_blocks_override.map_or_else(none, |n| n.to_string())),
            ("sliding_window", none()),
            ("enable_prefix_caching", b(cfg.enable_prefix_caching)),
            ("prefix_caching_hash_algo", "sha256".to_string()),
            ("prefix_cache_retention_interval", none()),
            ("kv_cache_dtype_skip_layers", none()),
            ("mamba_page_size_padded", none()),
            ("skip_page_size_padded", none()),
            ("mamba_block_size", none()),
            ("mamba_cache_dtype", none()),
            ("mamba_ssm_cache_dtype", none()),
            ("mamba_cache_mode", none()),
            ("enable_mamba_shared_prefix_checkpoint", none()),
            ("replayssm_buffer_len", none()),
            ("use_replayssm", none()),
            ("use_kda_recoverssm", none()),
            ("num_gpu_blocks", cfg.num_gpu_blocks().to_string()),
            ("num_cpu_blocks", "0".to_string()),
            ("simple_cpu_offload_num_blocks", none()),
            ("effective_attention_block_size", none()),
            ("kv_cache_size_tokens", none()),
            ("kv_cache_max_concurrency", none()),
            ("hash_block_size", none()),
            ("cache_hit_alignment_tokens", none()),
            ("kv_sharing_fast_prefill", none()),
            ("swa_bounded_replay", none()),
            ("kv_cache_memory_bytes", none()),
            ("kv_offloading_size", none()),
            ("kv_offloading_backend", none()),
        ];
        PromState {
            model_name: model_name.to_string(),
            version: VllmVersion::default(),
            created: created_unix_s,
            cache_info,
            hist,
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            stats: EngineStats::default(),
            mm_cache_queries: 0,
            mm_cache_hits: 0,
            v0_interval: V0Interval::default(),
            prefix_caching: cfg.enable_prefix_caching,
            v0_cpu_blocks: (V0_SWAP_SPACE_BYTES
                / (cfg.model().kv_bytes_per_token() * f64::from(cfg.block_size)).max(1.0))
                as u64,
        }
    }

    /// Renders the families of vLLM `version` instead of 0.33's.
    pub fn with_vllm_version(mut self, version: VllmVersion) -> Self {
        self.version = version;
        if version == VllmVersion::V0_6 {
            // V0's shorter bucket lists (vllm/engine/metrics.py): TTFT up to 10 s, the per-token
            // interval up to 2.5 s, request latencies up to 60 s, eager-mode step sizes.
            let cut = |b: &[f64], last: f64| b.iter().copied().filter(|x| *x <= last).collect::<Vec<f64>>();
            for n in &mut self.hist {
                let bounds = match n.name {
                    "vllm:time_to_first_token_seconds" => cut(TTFT_BUCKETS, 10.0),
                    "vllm:inter_token_latency_seconds" => cut(ITL_BUCKETS, 2.5),
                    "vllm:iteration_tokens_total" => V0_ITERATION_TOKENS_BUCKETS.to_vec(),
                    name if name.ends_with("_seconds") => cut(REQUEST_LATENCY_BUCKETS, 60.0),
                    _ => continue,
                };
                n.h = Histogram::new(&bounds);
            }
            // vLLM 0.6.6's CacheConfig fields (`metrics_info()`), swap space 4 GiB.
            let old = std::mem::take(&mut self.cache_info);
            let get = |k: &str| old.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            self.cache_info = vec![
                ("block_size", get("block_size")),
                ("gpu_memory_utilization", get("gpu_memory_utilization")),
                ("swap_space_bytes", (V0_SWAP_SPACE_BYTES as u64).to_string()),
                ("num_gpu_blocks_override", get("num_gpu_blocks_override")),
                ("cache_dtype", get("cache_dtype")),
                ("is_attention_free", get("is_attention_free")),
                ("sliding_window", get("sliding_window")),
                ("enable_prefix_caching", get("enable_prefix_caching")),
                ("cpu_offload_gb", "0".into()),
                ("num_gpu_blocks", get("num_gpu_blocks")),
                ("num_cpu_blocks", self.v0_cpu_blocks.to_string()),
            ];
            return self;
        }
        if version == VllmVersion::V0_10 {
            // vLLM 0.10's CacheConfig fields, in declaration order.
            let keep = |k: &str| {
                [
                    "block_size",
                    "gpu_memory_utilization",
                    "cache_dtype",
                    "is_attention_free",
                    "num_gpu_blocks_override",
                    "sliding_window",
                    "enable_prefix_caching",
                    "prefix_caching_hash_algo",
                ]
                .contains(&k)
            };
            let old = std::mem::take(&mut self.cache_info);
            let get = |k: &str| old.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            let mut info: Vec<(&'static str, String)> = Vec::new();
            for (k, v) in &old {
                if keep(k) {
                    info.push((k, v.clone()));
                }
                match *k {
                    "gpu_memory_utilization" => info.push(("swap_space", "4".into())),
                    "prefix_caching_hash_algo" => {
                        info.push(("cpu_offload_gb", "0".into()));
                        info.push(("calculate_kv_scales", "False".into()));
                        info.push(("cpu_kvcache_space_bytes", "None".into()));
                        info.push(("mamba_page_size_padded", "None".into()));
                        info.push(("num_gpu_blocks", get("num_gpu_blocks")));
                        info.push(("num_cpu_blocks", "None".into()));
                    }
                    _ => {}
                }
            }
            self.cache_info = info;
        }
        self
    }

    fn h(&mut self, which: H) -> &mut Histogram {
        &mut self.hist[which as usize].h
    }

    /// Records the first token of a request that arrived at `ttft_s` seconds before it.
    pub fn observe_ttft(&mut self, ttft_s: f64) {
        self.h(H::Ttft).observe(ttft_s);
    }

    /// Records one inter-token interval.
    pub fn observe_itl(&mut self, itl_s: f64) {
        self.h(H::Itl).observe(itl_s);
    }

    /// Records one engine step's token count.
    pub fn observe_step_tokens(&mut self, tokens: u32) {
        self.h(H::IterationTokens).observe(f64::from(tokens));
    }

    /// Records one engine step that ended at engine time `end_s` (seconds): its token count,
    /// and for vLLM V0 the local log of every 5 s that sets the throughput gauges (from the
    /// engine counters as last published).
    pub fn observe_step(&mut self, tokens: u32, end_s: f64) {
        self.observe_step_tokens(tokens);
        let iv = &mut self.v0_interval;
        let dt = end_s - iv.last_s;
        if dt >= V0_LOCAL_INTERVAL_S {
            iv.prompt_tps = self.stats.prompt_tokens.saturating_sub(iv.prompt) as f64 / dt;
            iv.generation_tps = self.stats.generation_tokens.saturating_sub(iv.generation) as f64 / dt;
            iv.prompt = self.stats.prompt_tokens;
            iv.generation = self.stats.generation_tokens;
            iv.last_s = end_s;
        }
    }

    /// Records a finished request (vLLM's `finished_request` stats).
    pub fn observe_finished(&mut self, r: &RequestRecord, p: RequestParams) {
        self.h(H::E2e).observe(r.e2e_s());
        self.h(H::Queue).observe(r.queue_s());
        if r.scheduled.is_some() {
            self.h(H::Prefill).observe(r.prefill_s());
            self.h(H::Inference).observe(r.inference_s());
        }
        if r.first_token.is_some() {
            self.h(H::Decode).observe(r.decode_s());
        }
        if r.completion_tokens >= 2 {
            let tpot = r.tpot_s();
            self.h(H::Tpot).observe(tpot);
        }
        self.h(H::PromptTokens).observe(f64::from(r.prompt_tokens));
        self.h(H::GenerationTokens).observe(f64::from(r.completion_tokens));
        self.h(H::MaxNumGenerationTokens).observe(f64::from(p.max_tokens));
        self.h(H::ParamsMaxTokens).observe(f64::from(p.max_tokens));
        self.h(H::ParamsN).observe(f64::from(p.n));
        self.h(H::KvComputed).observe(f64::from(r.prefill_kv_computed_tokens()));
        self.h(H::NumPreemptions).observe(f64::from(r.preemptions));
    }

    /// The exposition text: the 39 `vllm:` families vLLM 0.33.0 registers by default, in its
    /// registration order (`vllm/v1/metrics/loggers.py`, then `perf.py`).
    pub fn render(&self) -> String {
        if self.version == VllmVersion::V0_6 {
            return self.render_v0();
        }
        let mut out = String::with_capacity(48 * 1024);
        let base = [("model_name", self.model_name.as_str()), ("engine", "0")];
        let s = &self.stats;
        let v33 = self.version == VllmVersion::V0_33;
        let with = |k: &'static str, v: &'static str| [base[0], base[1], (k, v)];
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            &[(&base, self.running as f64)],
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &[(&base, self.waiting as f64)],
        );
        if !v33 {
            gauge(
                &mut out,
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                &[(&base, self.kv_usage)],
            );
            let plain = |out: &mut String, name: &str, help: &str, v: u64| {
                counter(out, name, help, &[(&base, v as f64)], self.created);
            };
            plain(
                &mut out,
                "vllm:gpu_prefix_cache_queries",
                "GPU prefix cache queries, in terms of number of queriedtokens. \
                 DEPRECATED: Use vllm:prefix_cache_queries instead.",
                s.prefix_queries,
            );
            plain(
                &mut out,
                "vllm:gpu_prefix_cache_hits",
                "GPU prefix cache hits, in terms of number of cached tokens. \
                 DEPRECATED: Use vllm:prefix_cache_hits instead.",
                s.prefix_hits,
            );
        }
        // The sim has no LoRA budget, KV transfer or blocked states: every waiting request
        // waits for capacity, `deferred` stays 0.
        let (capacity, deferred) = (with("reason", "capacity"), with("reason", "deferred"));
        let sleep = [
            with("sleep_state", "discard_all"),
            with("sleep_state", "weights_offloaded"),
            with("sleep_state", "awake"),
        ];
        if v33 {
            gauge(
                &mut out,
                "vllm:num_requests_waiting_by_reason",
                "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; \
             'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). \
             Sum of all reasons equals vllm:num_requests_waiting.",
                &[(&capacity, self.waiting as f64), (&deferred, 0.0)],
            );
            // No sleep mode in the sim: always awake (as vLLM without `/sleep`).
            gauge(
                &mut out,
                "vllm:engine_sleep_state",
                "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; \
             weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                &[(&sleep[0], 0.0), (&sleep[1], 0.0), (&sleep[2], 1.0)],
            );
        }
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            &[(&base, self.kv_usage)],
        );
        let plain = |out: &mut String, name: &str, help: &str, v: u64| {
            counter(out, name, help, &[(&base, v as f64)], self.created);
        };
        plain(
            &mut out,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_queries,
        );
        plain(
            &mut out,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_hits,
        );
        // No KV connector in the sim: the external counters stay 0; the multi-modal cache
        // counts image_url parts (api/media.rs).
        if v33 {
            plain(
                &mut out,
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, \
             in terms of number of queried tokens.",
                0,
            );
            plain(
                &mut out,
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, \
             in terms of number of cached tokens.",
                0,
            );
            plain(
                &mut out,
                "vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.",
                self.mm_cache_queries,
            );
            plain(
                &mut out,
                "vllm:mm_cache_hits",
                "Multi-modal cache hits, in terms of number of cached items.",
                self.mm_cache_hits,
            );
        }
        plain(&mut out, "vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions);
        plain(&mut out, "vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens);
        let cached = s.prompt_tokens_cached.min(s.prompt_tokens);
        if v33 {
            let by_source = [
                with("source", "local_compute"),
                with("source", "local_cache_hit"),
                with("source", "external_kv_transfer"),
            ];
            counter(
                &mut out,
                "vllm:prompt_tokens_by_source",
                "Number of prompt tokens by source.",
                &[
                    (&by_source[0], (s.prompt_tokens - cached) as f64),
                    (&by_source[1], cached as f64),
                    (&by_source[2], 0.0),
                ],
                self.created,
            );
            plain(&mut out, "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", cached);
            // Every cache hit of the sim comes from its one device-memory prefix cache.
            let tiers = ["device", "host", "p2p", "disk", "external_unspecified"].map(|t| with("source", t));
            let tier_children: Vec<(&[(&str, &str)], f64)> =
                tiers.iter().enumerate().map(|(i, l)| (&l[..], if i == 0 { cached as f64 } else { 0.0 })).collect();
            counter(
                &mut out,
                "vllm:prompt_tokens_cached_by_source",
                "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to \
             DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at \
             admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
                &tier_children,
                self.created,
            );
        }
        plain(&mut out, "vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens);
        // vLLM 0.33's FinishReason strings. The sim's engine has no repetition detector and no
        // fault ends a request that way, so `repetition` stays 0.
        let mut reasons: Vec<([(&str, &str); 3], f64)> = FinishReason::ALL
            .iter()
            .map(|r| (with("finished_reason", r.as_str()), s.finished[r.index()] as f64))
            .collect();
        if v33 {
            reasons.push((with("finished_reason", "repetition"), 0.0));
        } else if let Some((_, err)) = reasons.pop() {
            // vLLM 0.10 has no `error` reason: an engine-side failure aborts the request.
            if let Some((_, abort)) = reasons.last_mut() {
                *abort += err;
            }
        }
        let children: Vec<(&[(&str, &str)], f64)> = reasons.iter().map(|(l, v)| (&l[..], *v)).collect();
        counter(&mut out, "vllm:request_success", "Count of successfully processed requests.", &children, self.created);
        // No queue limits (`max_num_queued_reqs/_tokens`) in the sim: no admission rejections.
        // vLLM registers this one without the `engine` label.
        if v33 {
            let adm = [[base[0], ("reason", "max_num_queued_reqs")], [base[0], ("reason", "max_num_queued_tokens")]];
            counter(
                &mut out,
                "vllm:admission_rejections",
                "Number of admission attempts rejected by a queue limit, by reason.",
                &[(&adm[0], 0.0), (&adm[1], 0.0)],
                self.created,
            );
        }
        for n in &self.hist {
            let (name, help) = match (self.version, n.name) {
                (VllmVersion::V0_33, name) => (name, n.help),
                (
                    VllmVersion::V0_10,
                    "vllm:request_time_per_output_token_seconds"
                    | "vllm:request_num_preemptions"
                    | "vllm:request_prefill_kv_computed_tokens",
                ) => continue,
                // 0.10's name of the per-step interval (an inter-token latency).
                (VllmVersion::V0_10, "vllm:inter_token_latency_seconds") => {
                    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.")
                }
                (VllmVersion::V0_10 | VllmVersion::V0_6, name) => (name, n.help),
            };
            histogram(&mut out, name, help, &base, &n.h, self.created);
        }
        let mut info: Vec<(&str, &str)> = self.cache_info.iter().map(|(k, v)| (*k, v.as_str())).collect();
        info.push(("engine", "0"));
        gauge(&mut out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", &[(&info, 1.0)]);
        // PerfMetricsProm is registered unconditionally; without `--enable-mfu-metrics` (the
        // default) its counters stay 0.
        if !v33 {
            return out;
        }
        plain(
            &mut out,
            "vllm:estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
            0,
        );
        plain(
            &mut out,
            "vllm:estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            0,
        );
        plain(
            &mut out,
            "vllm:estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
            0,
        );
        out
    }
}

impl PromState {
    /// vLLM 0.6.6's (V0) `/metrics`: a MultiProcessCollector registry (the OpenAI server runs
    /// the engine in another process), so no `_created`, label names sorted, `model_name` only,
    /// and a family shows once it has a child: the gauges and counters from the engine's first
    /// stats log (V0 logs while idle too), the histograms from their first observation,
    /// `request_success_total` one reason at a time. Families in the capture's order
    /// (tests/fixtures/servers/vllm-0.6.6.post1.prom).
    fn render_v0(&self) -> String {
        use multiprocess as mp;
        let mut out = String::with_capacity(32 * 1024);
        let m = [("model_name", self.model_name.as_str())];
        let s = &self.stats;
        let hist = |name: &str| self.hist.iter().find(|n| n.name == name).map(|n| &n.h);
        let h = |out: &mut String, name: &str, help: &str, from: &str| {
            if let Some(hh) = hist(from).filter(|hh| hh.count > 0) {
                mp::histogram(out, name, help, &[(&m, hh)]);
            }
        };
        h(
            &mut out,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            "vllm:iteration_tokens_total",
        );
        h(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "vllm:time_to_first_token_seconds",
        );
        h(
            &mut out,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            "vllm:inter_token_latency_seconds",
        );
        h(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            "vllm:e2e_request_latency_seconds",
        );
        h(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            "vllm:request_queue_time_seconds",
        );
        h(
            &mut out,
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            "vllm:request_prefill_time_seconds",
        );
        h(
            &mut out,
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            "vllm:request_inference_time_seconds",
        );
        h(
            &mut out,
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            "vllm:request_decode_time_seconds",
        );
        h(&mut out, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "vllm:request_prompt_tokens");
        h(
            &mut out,
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            "vllm:request_generation_tokens",
        );
        h(
            &mut out,
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            "vllm:request_max_num_generation_tokens",
        );
        h(&mut out, "vllm:request_params_n", "Histogram of the n request parameter.", "vllm:request_params_n");
        h(
            &mut out,
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            "vllm:request_params_max_tokens",
        );
        // V0 observes the same per-request queue time into its older family too.
        h(
            &mut out,
            "vllm:time_in_queue_requests",
            "Histogram of the time the request spent in the queue in seconds.",
            "vllm:request_queue_time_seconds",
        );
        // No LoRA in the sim: the info gauge holds the time of the last stats log.
        let lora = [("max_lora", "0"), ("running_lora_adapters", ""), ("waiting_lora_adapters", "")];
        let now_s = super::telemetry::unix_nanos_now() as f64 / 1e9;
        mp::gauge(&mut out, "vllm:lora_requests_info", "Running stats on lora requests.", &[(&lora, now_s)]);
        let info: Vec<(&str, &str)> = self.cache_info.iter().map(|(k, v)| (*k, v.as_str())).collect();
        mp::gauge(&mut out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", &[(&info, 1.0)]);
        let c = |out: &mut String, name: &str, help: &str, v: u64| mp::counter(out, name, help, &[(&m, v as f64)]);
        c(&mut out, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", s.preemptions);
        c(&mut out, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens);
        c(&mut out, "vllm:generation_tokens_total", "Number of generation tokens processed.", s.generation_tokens);
        // Children per reason as they occur (vllm/sequence.py: stop, length, abort); an
        // engine-side failure aborts the request in V0.
        let idx = |r: FinishReason| s.finished[r.index()];
        let reasons = [
            ("length", idx(FinishReason::Length)),
            ("stop", idx(FinishReason::Stop)),
            ("abort", idx(FinishReason::Abort) + idx(FinishReason::Error)),
        ];
        let labels: Vec<[(&str, &str); 2]> = reasons.iter().map(|(r, _)| [("finished_reason", *r), m[0]]).collect();
        let children: Vec<(&[(&str, &str)], f64)> =
            labels.iter().zip(reasons).filter(|(_, (_, v))| *v > 0).map(|(l, (_, v))| (&l[..], v as f64)).collect();
        if !children.is_empty() {
            mp::counter(&mut out, "vllm:request_success_total", "Count of successfully processed requests.", &children);
        }
        let g = |out: &mut String, name: &str, help: &str, v: f64| mp::gauge(out, name, help, &[(&m, v)]);
        g(&mut out, "vllm:num_requests_running", "Number of requests currently running on GPU.", self.running as f64);
        g(&mut out, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting as f64);
        g(&mut out, "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", self.kv_usage);
        // No swapping to CPU in the sim (it recomputes preempted requests).
        g(&mut out, "vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", 0.0);
        g(&mut out, "vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0.0);
        // V0's block hit rates: -1 with prefix caching off (V0's default); the sim's prefix
        // cache hits are token-granular, read as the rate of queried tokens found.
        let (gpu_hit, cpu_hit) = if !self.prefix_caching {
            (-1.0, -1.0)
        } else if s.prefix_queries == 0 {
            (0.0, 0.0)
        } else {
            (s.prefix_hits as f64 / s.prefix_queries as f64, 0.0)
        };
        g(&mut out, "vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", gpu_hit);
        g(&mut out, "vllm:cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate.", cpu_hit);
        let iv = &self.v0_interval;
        g(&mut out, "vllm:avg_prompt_throughput_toks_per_s", "Average prefill throughput in tokens/s.", iv.prompt_tps);
        g(
            &mut out,
            "vllm:avg_generation_throughput_toks_per_s",
            "Average generation throughput in tokens/s.",
            iv.generation_tps,
        );
        out
    }
}

/// prometheus_client's multiprocess exposition (`MultiProcessCollector`, as vLLM V0 and SGLang
/// serve it): `# HELP` and `# TYPE` per family, label names sorted (`le` among them), a
/// histogram child as `_sum`, cumulative `_bucket`s, `_count`, no `_created`; counters are
/// named with their `_total`. Floats as [`fmt_float`].
pub mod multiprocess {
    use super::{Histogram, escape_help, escape_label, fmt_float};
    use std::fmt::Write;

    /// One child: its labels and value.
    pub type Child<'a, V> = (&'a [(&'a str, &'a str)], V);

    fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], le: Option<&str>, v: f64) {
        let mut all: Vec<(&str, &str)> = labels.to_vec();
        if let Some(le) = le {
            all.push(("le", le));
        }
        all.sort_by(|a, b| a.0.cmp(b.0));
        out.push_str(name);
        if !all.is_empty() {
            out.push('{');
            for (i, (k, val)) in all.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape_label(val));
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(&fmt_float(v));
        out.push('\n');
    }

    fn header(out: &mut String, name: &str, help: &str, kind: &str) {
        let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(out, "# TYPE {name} {kind}");
    }

    /// A gauge family.
    pub fn gauge(out: &mut String, name: &str, help: &str, children: &[Child<'_, f64>]) {
        header(out, name, help, "gauge");
        for (labels, v) in children {
            sample(out, name, labels, None, *v);
        }
    }

    /// A counter family; `name` ends with `_total` (the `# TYPE` line names it so too).
    pub fn counter(out: &mut String, name: &str, help: &str, children: &[Child<'_, f64>]) {
        header(out, name, help, "counter");
        for (labels, v) in children {
            sample(out, name, labels, None, *v);
        }
    }

    /// A histogram family.
    pub fn histogram(out: &mut String, name: &str, help: &str, children: &[Child<'_, &Histogram>]) {
        header(out, name, help, "histogram");
        let (sum, bucket, count) = (format!("{name}_sum"), format!("{name}_bucket"), format!("{name}_count"));
        for (labels, h) in children {
            sample(out, &sum, labels, None, h.sum);
            let mut acc = 0u64;
            for (i, b) in h.bounds.iter().enumerate() {
                acc += h.counts.get(i).copied().unwrap_or(0);
                sample(out, &bucket, labels, Some(&fmt_float(*b)), acc as f64);
            }
            acc += h.counts.get(h.bounds.len()).copied().unwrap_or(0);
            sample(out, &bucket, labels, Some("+Inf"), acc as f64);
            sample(out, &count, labels, None, acc as f64);
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], extra: Option<(&str, &str)>, v: f64) {
    out.push_str(name);
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        let mut first = true;
        for (k, val) in labels.iter().copied().chain(extra) {
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(out, "{k}=\"{}\"", escape_label(val));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&fmt_float(v));
    out.push('\n');
}

fn gauge(out: &mut String, name: &str, help: &str, children: &[(&[(&str, &str)], f64)]) {
    header(out, name, help, "gauge");
    for (labels, v) in children {
        sample(out, name, labels, None, *v);
    }
}

fn counter(out: &mut String, name: &str, help: &str, children: &[(&[(&str, &str)], f64)], created: f64) {
    let total = format!("{name}_total");
    header(out, &total, help, "counter");
    for (labels, v) in children {
        sample(out, &total, labels, None, *v);
    }
    let c = format!("{name}_created");
    header(out, &c, help, "gauge");
    for (labels, _) in children {
        sample(out, &c, labels, None, created);
    }
}

fn histogram(out: &mut String, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram, created: f64) {
    header(out, name, help, "histogram");
    let bucket = format!("{name}_bucket");
    let mut acc = 0u64;
    for (i, b) in h.bounds.iter().enumerate() {
        acc += h.counts.get(i).copied().unwrap_or(0);
        sample(out, &bucket, labels, Some(("le", &fmt_float(*b))), acc as f64);
    }
    acc += h.counts.get(h.bounds.len()).copied().unwrap_or(0);
    sample(out, &bucket, labels, Some(("le", "+Inf")), acc as f64);
    sample(out, &format!("{name}_count"), labels, None, acc as f64);
    sample(out, &format!("{name}_sum"), labels, None, h.sum);
    let c = format!("{name}_created");
    header(out, &c, help, "gauge");
    sample(out, &c, labels, None, created);
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
}

/// Formats a float as prometheus_client's `floatToGoString` does: Python's `repr`
/// (`1.0`, `0.001`, `1e-05`, `1e+16`), `+Inf` / `-Inf` / `NaN`, and Go-style exponents for
/// positive values of a million and more (`1.7e+09`).
pub fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    let s = py_repr(v);
    if v > 0.0
        && let Some(dot) = s.find('.')
        && dot > 6
    {
        let digits = format!("{}.{}{}", &s[..1], &s[1..dot], &s[dot + 1..]);
        let mantissa = digits.trim_end_matches(['0', '.']);
        return format!("{mantissa}e+0{}", dot - 1);
    }
    s
}

/// Python's `repr(float)`: shortest round-trip digits, positional for 1e-4 ≤ |v| < 1e16.
fn py_repr(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{v:e}"); // e.g. "-1.2345e-5", shortest round-trip digits
    let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                format!("{digits}{}.0", "0".repeat((int_len - n) as usize))
            } else {
                format!("{}.{}", &digits[..int_len as usize], &digits[int_len as usize..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits.clone() };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// A parser of the text format and the comparison with a fixture table
/// (tests/fixtures/servers/<server>-<version>.metrics.json), for the table tests.
#[cfg(test)]
pub(crate) mod table_test {
    use std::collections::{BTreeMap, BTreeSet};

    /// One family of an exposition: its type, help and samples (name, labels).
    #[derive(Debug, Default)]
    pub struct Family {
        /// `# TYPE`.
        pub kind: String,
        /// `# HELP` (unescaped).
        pub help: String,
        /// Samples: name and labels in their written order.
        pub samples: Vec<(String, Vec<(String, String)>)>,
    }

    fn labels(s: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while let Some((k, r)) = rest.split_once("=\"") {
            let mut v = String::new();
            let mut chars = r.char_indices();
            let mut end = r.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(if n == 'n' { '\n' } else { n });
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            out.push((k.trim_start_matches(',').to_string(), v));
            rest = &r[end..];
        }
        out
    }

    /// Families by their `# TYPE` name (samples attributed to the family declared last).
    pub fn parse(text: &str) -> BTreeMap<String, Family> {
        let mut out: BTreeMap<String, Family> = BTreeMap::new();
        let mut current = String::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(r) = line.strip_prefix("# HELP ") {
                let (n, h) = r.split_once(' ').unwrap_or((r, ""));
                out.entry(n.to_string()).or_default().help = h.replace("\\n", "\n").replace("\\\\", "\\");
            } else if let Some(r) = line.strip_prefix("# TYPE ") {
                let (n, k) = r.split_once(' ').unwrap_or((r, ""));
                out.entry(n.to_string()).or_default().kind = k.to_string();
                current = n.to_string();
            } else {
                let (head, _value) = line.rsplit_once(' ').unwrap_or((line, ""));
                let (name, ls) = match head.split_once('{') {
                    Some((n, l)) => (n, labels(l.trim_end_matches('}'))),
                    None => (head, Vec::new()),
                };
                out.entry(current.clone()).or_default().samples.push((name.to_string(), ls));
            }
        }
        out
    }

    /// Every difference between `fams` and the table's rows (by registered name), as lines:
    /// type, help, label *sets* (`extra` adds label names to a family, e.g. `pid`), label
    /// values, buckets of every child.
    pub fn compare(
        fams: &BTreeMap<String, Family>,
        table: &serde_json::Value,
        extra: &dyn Fn(&serde_json::Value) -> Vec<String>,
    ) -> Vec<String> {
        let rows: BTreeMap<&str, &serde_json::Value> = table["families"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str().map(|n| (n, r))).collect())
            .unwrap_or_default();
        let mut problems = Vec::new();
        for (name, f) in fams {
            let Some(row) = rows.get(name.as_str()) else {
                problems.push(format!("{name}: not in the table"));
                continue;
            };
            if row["type"].as_str() != Some(f.kind.as_str()) {
                problems.push(format!("{name}: type {} vs {}", f.kind, row["type"]));
            }
            if row["help"].as_str() != Some(f.help.as_str()) {
                problems.push(format!("{name}: help {:?} vs {}", f.help, row["help"]));
            }
            let mut want: BTreeSet<String> = row["labelnames"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default();
            want.extend(extra(row));
            let mut children: BTreeMap<Vec<(String, String)>, Vec<String>> = BTreeMap::new();
            for (sname, ls) in &f.samples {
                let set: BTreeSet<String> = ls.iter().map(|(k, _)| k.clone()).filter(|k| k != "le").collect();
                if set != want {
                    problems.push(format!("{name}: sample {sname} labels {set:?} vs {want:?}"));
                }
                for (k, v) in ls {
                    if let Some(vals) = row["label_values"][k].as_array()
                        && !vals.iter().any(|x| x.as_str() == Some(v.as_str()))
                    {
                        problems.push(format!("{name}: {k}={v:?} not among {vals:?}"));
                    }
                }
                if sname.ends_with("_bucket") {
                    let mut key: Vec<(String, String)> = ls.iter().filter(|(k, _)| k != "le").cloned().collect();
                    key.sort();
                    let le = ls.iter().find(|(k, _)| k == "le").map(|(_, v)| v.clone()).unwrap_or_default();
                    children.entry(key).or_default().push(le);
                }
            }
            if let Some(b) = row["buckets"].as_array() {
                let mut want: Vec<f64> = b.iter().filter_map(serde_json::Value::as_f64).collect();
                want.push(f64::INFINITY);
                for les in children.values() {
                    let got: Vec<f64> = les
                        .iter()
                        .map(|v| if v == "+Inf" { f64::INFINITY } else { v.parse().unwrap_or(f64::NAN) })
                        .collect();
                    if got != want {
                        problems.push(format!("{name}: buckets {got:?} vs {want:?}"));
                    }
                }
            }
        }
        problems
    }

    /// The `# TYPE` names of a fixture capture.
    pub fn capture_families(text: &str) -> BTreeSet<String> {
        parse(text).into_keys().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_prometheus_client() {
        for (v, s) in [
            (1.0, "1.0"),
            (0.0, "0.0"),
            (0.001, "0.001"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (2560.0, "2560.0"),
            (123456.0, "123456.0"),
            (1234567.0, "1.234567e+06"),
            (1_700_000_000.0, "1.7e+09"),
            (1_737_212_345.678_9, "1.7372123456789e+09"),
            (0.3, "0.3"),
            (1e16, "1e+16"),
            (-2.5, "-2.5"),
            (12.345, "12.345"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(fmt_float(v), s, "{v}");
        }
    }

    #[test]
    fn renders_histograms_cumulatively() {
        let cfg = EngineConfig::default();
        let mut st = PromState::new("m", &cfg, 1_700_000_000.0);
        st.observe_ttft(0.003);
        st.observe_ttft(0.5);
        st.observe_ttft(5000.0);
        let text = st.render();
        assert!(text.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.001\"} 0.0\n")
        );
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.005\"} 1.0\n")
        );
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.5\"} 2.0\n")
        );
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"+Inf\"} 3.0\n")
        );
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"} 3.0\n"));
        assert!(text.contains("# TYPE vllm:prompt_tokens_total counter\n"));
        assert!(text.contains("vllm:prompt_tokens_created{model_name=\"m\",engine=\"0\"} 1.7e+09\n"));
        assert!(
            text.contains("vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"abort\"} 0.0\n")
        );
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\","));
    }

    /// The families (`# TYPE` lines other than prometheus_client's `_created` gauges).
    fn families(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' ').map(|(n, _)| n))
            .filter(|n| !n.ends_with("_created"))
            .collect()
    }

    #[test]
    fn families_per_vllm_version() {
        let cfg = EngineConfig::default();
        let v33 = PromState::new("m", &cfg, 1.0).render();
        let f33 = families(&v33);
        assert_eq!(f33.len(), 39, "{f33:?}");
        for n in ["vllm:request_num_preemptions", "vllm:prompt_tokens_cached_total", "vllm:admission_rejections_total"]
        {
            assert!(f33.contains(&n), "{n}");
        }
        assert!(v33.contains("vllm:admission_rejections_total{model_name=\"m\",reason=\"max_num_queued_reqs\"} 0.0\n"));
        assert!(v33.contains("finished_reason=\"repetition\"} 0.0\n"));
        let v10 = PromState::new("m", &cfg, 1.0).with_vllm_version(VllmVersion::V0_10).render();
        let f10 = families(&v10);
        assert_eq!(f10.len(), 26, "{f10:?}");
        assert!(f10.contains(&"vllm:time_per_output_token_seconds") && f10.contains(&"vllm:gpu_cache_usage_perc"));
        assert!(!f10.contains(&"vllm:inter_token_latency_seconds"));
        assert!(!v10.contains("finished_reason=\"error\"") && !v10.contains("repetition"));
        assert!(v10.contains("swap_space=\"4\""), "0.10's CacheConfig fields");
        assert_eq!("0.10".parse::<VllmVersion>(), Ok(VllmVersion::V0_10));
        assert_eq!("0.6".parse::<VllmVersion>(), Ok(VllmVersion::V0_6));
        assert_eq!("0.6.6.post1".parse::<VllmVersion>(), Ok(VllmVersion::V0_6));
        assert!("0.7".parse::<VllmVersion>().is_err());
    }

    fn fixture(name: &str) -> String {
        let p = format!("{}/../tests/fixtures/servers/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn finished(id: u64, fr: FinishReason) -> RequestRecord {
        RequestRecord {
            id,
            arrival: 0,
            scheduled: Some(1_000_000),
            first_token: Some(30_000_000),
            last_token: Some(90_000_000),
            finished: 90_000_000,
            prompt_tokens: 40,
            completion_tokens: 4,
            max_tokens: 16,
            cached_tokens: 0,
            preemptions: 0,
            finish_reason: fr,
        }
    }

    /// vLLM 0.6.6 (V0): the exposition against the table read from its source (families,
    /// types, help, label sets, buckets), and against the capture's family set after traffic.
    #[test]
    fn v0_exposition_is_vllm_0_6_6s() {
        use table_test::{capture_families, compare, parse};
        let table: serde_json::Value =
            serde_json::from_str(&fixture("vllm-0.6.6.post1.metrics.json")).expect("fixture json");
        let cfg = EngineConfig::default();
        let mut st = PromState::new("m", &cfg, 1.0).with_vllm_version(VllmVersion::V0_6);
        let none = |_: &serde_json::Value| Vec::new();
        let idle = parse(&st.render());
        assert_eq!(compare(&idle, &table, &none), Vec::<String>::new());
        assert!(idle.values().all(|f| f.kind != "histogram"), "no histogram child before an observation");
        assert!(!idle.contains_key("vllm:request_success_total"), "reasons appear lazily");
        assert!(!st.render().contains("_created"), "multiprocess: no _created");
        for (i, fr) in [FinishReason::Stop, FinishReason::Length, FinishReason::Stop].into_iter().enumerate() {
            st.observe_ttft(0.02);
            st.observe_itl(0.03);
            st.observe_step(48, 6.0 * (i as f64 + 1.0));
            st.observe_finished(&finished(i as u64, fr), RequestParams { n: 1, max_tokens: 16, stream: false });
            st.stats.finished[fr.index()] += 1;
            st.stats.prompt_tokens += 40;
            st.stats.generation_tokens += 4;
        }
        let text = st.render();
        let fams = parse(&text);
        let problems = compare(&fams, &table, &none);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let capture = capture_families(&fixture("vllm-0.6.6.post1.prom"));
        let ours: std::collections::BTreeSet<String> = fams.keys().cloned().collect();
        assert_eq!(ours, capture, "the 29 families a V0 server shows after traffic");
        assert!(text.contains("vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 2.0\n"), "{text}");
        assert!(!text.contains("finished_reason=\"abort\""), "no abort yet: no abort child");
        assert!(text.contains("vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.0\n"));
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"m\"} 3.0\n"),
            "sorted labels, cumulative buckets: {text}"
        );
        assert!(text.contains("vllm:avg_generation_throughput_toks_per_s{model_name=\"m\"} "));
        // Llama-3-8B: 128 KiB of KV per token, 2 MiB per block, 4 GiB of swap (as the capture)
        assert!(text.contains("num_cpu_blocks=\"2048\""), "{text}");
        assert!(text.contains("swap_space_bytes=\"4294967296\""));
        let off = EngineConfig { enable_prefix_caching: false, ..EngineConfig::default() };
        let st = PromState::new("m", &off, 1.0).with_vllm_version(VllmVersion::V0_6);
        assert!(st.render().contains("vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} -1.0\n"), "-1 when off");
    }
}
