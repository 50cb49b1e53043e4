//! SGLang's metrics (tests/fixtures/servers/sglang-0.5.23.metrics.json) recorded from the
//! simulator's real state, where SGLang records them:
//!
//! - the tokenizer manager (`managers/tokenizer_manager.py` `collect_metrics`,
//!   `TokenizerMetricsCollector`): TTFT when a request's first output arrives (a non-streamed
//!   request's outputs arrive batched at its end, so it records its TTFT then, from the
//!   scheduler's first-token time, and no inter-token latency), inter-token latency per streamed
//!   output, and at the end `prompt_tokens_total`, `generation_tokens_total`,
//!   `num_requests_total`, `cached_tokens_total{cache_source="device"}` (when a prefix hit),
//!   e2e latency, per-request TPOT (stop / length only) and the token-length histograms, all
//!   but the last split by `is_streaming`; `num_aborted_requests_total` when a client goes away
//!   (`abort_request`); a failure inside the engine is an abort the scheduler sends back, which
//!   SGLang does not count there (the HTTP status and the span tell it);
//! - the scheduler (`scheduler_components/metrics_reporter.py`): `queue_time_seconds` at a
//!   request's first forward pass, `realtime_tokens_total{mode}` per batch, the retraction
//!   counters per retraction (a preemption here), and its gauges at each stats log: after every
//!   prefill batch, every 40th decode batch (`--decode-log-interval`), and when it goes idle
//!   with stale gauges;
//! - the HTTP middleware: `http_requests_total`, `http_responses_total`, `http_requests_active`;
//! - start-up: the constants (`max_total_num_tokens`, memory, page size, context length).

use std::collections::{BTreeMap, HashMap};

use super::exposition::{
    CONSTANT_GAUGES, E2E_BUCKETS, IS_STREAMING, ITL_BUCKETS, Labels, QUEUE_BUCKETS, SCHEDULER_GAUGES, TOKEN_BUCKETS,
    TTFT_BUCKETS, WEIGHT_LOAD_HELP, Writer,
};
use crate::engine::{EngineEvent, EngineStats, FinishReason, KvSnapshot, Nanos, RequestId, RequestRecord, StepInfo};
use crate::scenario::histo::Histogram;

/// `--decode-log-interval` default: decode batches between two stats logs.
pub const DECODE_LOG_INTERVAL: u64 = 40;
/// `GEN_THROUGHPUT_STALENESS_SECONDS`: the throughput gauge drops to 0 without decode logs.
const GEN_THROUGHPUT_STALENESS_NS: Nanos = 30_000_000_000;
/// SGLang's initial new-token ratio (`0.7 × --schedule-conservativeness`).
const INIT_NEW_TOKEN_RATIO: f64 = 0.7;
/// Its floor (`init × 0.14`).
const MIN_NEW_TOKEN_RATIO: f64 = INIT_NEW_TOKEN_RATIO * 0.14;
/// Its decay per decode batch (`(init − min) / 600`).
const NEW_TOKEN_RATIO_DECAY: f64 = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600.0;

/// The start-up constants of a server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SglangLimits {
    /// Tokens the KV pool holds.
    pub max_total_num_tokens: u64,
    /// Maximum context length.
    pub context_len: u32,
    /// Weights, GiB.
    pub weight_memory_usage_gb: f64,
    /// KV cache, GiB.
    pub kv_cache_memory_usage_gb: f64,
    /// GPU memory available at start-up, GiB.
    pub startup_available_gpu_memory_gb: f64,
    /// How long loading the weights took.
    pub weight_load_duration_seconds: f64,
}

/// What the tokenizer knows of a request in flight.
#[derive(Clone, Copy, Debug)]
struct Live {
    arrival: Nanos,
    stream: bool,
    prompt_tokens: u32,
    tokens: u32,
    first: Option<Nanos>,
    last: Option<Nanos>,
    queued: bool,
}

/// The scheduler gauges' values at the last stats log, in [`SCHEDULER_GAUGES`] order.
type GaugeValues = [f64; SCHEDULER_GAUGES.len()];

fn gauge_index(name: &str) -> usize {
    SCHEDULER_GAUGES.iter().position(|(n, _)| *n == name).unwrap_or(0)
}

/// Everything SGLang's `/metrics` shows, updated by the driver and the HTTP middleware.
#[derive(Debug)]
pub struct SglangMetrics {
    labels: Labels,
    limits: SglangLimits,
    live: HashMap<RequestId, Live>,
    // tokenizer
    ttft: [Option<Histogram>; 2],
    tpot: [Option<Histogram>; 2],
    e2e: [Option<Histogram>; 2],
    itl: Option<Histogram>,
    prompt_hist: Option<Histogram>,
    uncached_hist: Option<Histogram>,
    generation_hist: Option<Histogram>,
    prompt_tokens: [Option<u64>; 2],
    generation_tokens: [Option<u64>; 2],
    num_requests: [Option<u64>; 2],
    cached_device: Option<u64>,
    aborted: Option<u64>,
    // scheduler
    queue_time: Option<Histogram>,
    realtime: [Option<u64>; 3],
    prefill_passes: Option<u64>,
    retracted: Option<[u64; 3]>,
    gauges: GaugeValues,
    pending_prefill: u64,
    pending_prefill_log: bool,
    pending_decode_log: bool,
    decode_batches: u64,
    generated_since_log: u64,
    last_decode_log: Nanos,
    last_gen_throughput: f64,
    new_token_ratio: f64,
    retracted_since_log: u32,
    hits_at_log: u64,
    queries_at_log: u64,
    last_util: f64,
    logged: bool,
    // http
    http_requests: BTreeMap<(String, String), u64>,
    http_responses: BTreeMap<(String, String, String), u64>,
    http_active: BTreeMap<(String, String), i64>,
}

impl SglangMetrics {
    /// The metrics of a freshly started server for `model`.
    pub fn new(model: &str, limits: SglangLimits) -> Self {
        let mut gauges = [0.0; SCHEDULER_GAUGES.len()];
        gauges[gauge_index("sglang:fwd_occupancy")] = f64::NAN;
        gauges[gauge_index("sglang:new_token_ratio")] = INIT_NEW_TOKEN_RATIO;
        SglangMetrics {
            labels: Labels { model: model.to_string(), pid: std::process::id().to_string() },
            limits,
            live: HashMap::new(),
            ttft: [None, None],
            tpot: [None, None],
            e2e: [None, None],
            itl: None,
            prompt_hist: None,
            uncached_hist: None,
            generation_hist: None,
            prompt_tokens: [None; 2],
            generation_tokens: [None; 2],
            num_requests: [None; 2],
            cached_device: None,
            aborted: None,
            queue_time: None,
            realtime: [None; 3],
            prefill_passes: None,
            retracted: None,
            gauges,
            pending_prefill: 0,
            pending_prefill_log: false,
            pending_decode_log: false,
            decode_batches: 0,
            generated_since_log: 0,
            last_decode_log: 0,
            last_gen_throughput: 0.0,
            new_token_ratio: INIT_NEW_TOKEN_RATIO,
            retracted_since_log: 0,
            hits_at_log: 0,
            queries_at_log: 0,
            last_util: 0.0,
            logged: false,
            http_requests: BTreeMap::new(),
            http_responses: BTreeMap::new(),
            http_active: BTreeMap::new(),
        }
    }

    /// A request entered the engine (arrival = the tokenizer's `created_time`).
    pub fn queued(&mut self, id: RequestId, arrival: Nanos, prompt_tokens: u32, stream: bool) {
        self.live.insert(id, Live { arrival, stream, prompt_tokens, tokens: 0, first: None, last: None, queued: true });
    }

    /// Something happened in the engine.
    pub fn engine_event(&mut self, ev: &EngineEvent) {
        match ev {
            EngineEvent::Scheduled { id, t, .. } => {
                if let Some(l) = self.live.get_mut(id)
                    && l.queued
                {
                    l.queued = false;
                    let wait = t.saturating_sub(l.arrival) as f64 / 1e9;
                    self.queue_time.get_or_insert_with(|| Histogram::new(QUEUE_BUCKETS)).observe(wait);
                }
            }
            EngineEvent::Token { id, t, .. } => self.token(*id, *t),
            EngineEvent::Preempted { id, .. } => {
                let (input, output) = self.live.get(id).map_or((0, 0), |l| (l.prompt_tokens, l.tokens));
                let r = self.retracted.get_or_insert([0; 3]);
                r[0] += 1;
                r[1] += u64::from(input);
                r[2] += u64::from(output);
                self.retracted_since_log += 1;
                // retract_decode raises the ratio again
                self.new_token_ratio = INIT_NEW_TOKEN_RATIO;
            }
            EngineEvent::Step(s) => self.step(s),
            EngineEvent::FirstToken { .. } | EngineEvent::Finished { .. } => {}
        }
    }

    fn token(&mut self, id: RequestId, t: Nanos) {
        let Some(l) = self.live.get_mut(&id) else { return };
        l.tokens += 1;
        let prev = l.last.replace(t);
        if l.first.is_none() {
            l.first = Some(t);
            if l.stream {
                // the first streamed output: TTFT at once
                let v = t.saturating_sub(l.arrival) as f64 / 1e9;
                self.ttft[1].get_or_insert_with(|| Histogram::new(TTFT_BUCKETS)).observe(v);
            }
        } else if l.stream
            && let Some(p) = prev
        {
            let v = t.saturating_sub(p) as f64 / 1e9;
            self.itl.get_or_insert_with(|| Histogram::new(ITL_BUCKETS)).observe(v);
        }
    }

    fn step(&mut self, s: &StepInfo) {
        self.last_util = s.gpu_util;
        let prefill_tokens = s.num_tokens.saturating_sub(s.decode_seqs);
        if s.prefill_seqs > 0 {
            self.pending_prefill += u64::from(prefill_tokens);
            self.pending_prefill_log = true;
            *self.prefill_passes.get_or_insert(0) += 1;
        }
        if s.decode_seqs > 0 {
            add(&mut self.realtime[2], u64::from(s.decode_seqs));
            self.generated_since_log += u64::from(s.decode_seqs);
            self.decode_batches += 1;
            self.new_token_ratio = (self.new_token_ratio - NEW_TOKEN_RATIO_DECAY).max(MIN_NEW_TOKEN_RATIO);
            if self.decode_batches.is_multiple_of(DECODE_LOG_INTERVAL) {
                self.pending_decode_log = true;
            }
        }
    }

    /// A request ended (finished, failed, or dropped by its client); `cached` is its
    /// prefix-cache hit in tokens.
    pub fn finished(&mut self, r: &RequestRecord) {
        let live = self.live.remove(&r.id);
        let stream = live.is_some_and(|l| l.stream);
        let i = usize::from(stream);
        let ok = matches!(r.finish_reason, FinishReason::Stop | FinishReason::Length);
        if r.finish_reason == FinishReason::Abort {
            *self.aborted.get_or_insert(0) += 1;
        }
        // A batched (non-streamed) request's only output: its TTFT from the scheduler's
        // first-token time; an aborted one records none.
        if !stream
            && r.finish_reason != FinishReason::Abort
            && let Some(first) = r.first_token
        {
            let v = first.saturating_sub(r.arrival) as f64 / 1e9;
            self.ttft[0].get_or_insert_with(|| Histogram::new(TTFT_BUCKETS)).observe(v);
        }
        add(&mut self.prompt_tokens[i], u64::from(r.prompt_tokens));
        add(&mut self.generation_tokens[i], u64::from(r.completion_tokens));
        let cached = r.cached_tokens.min(r.prompt_tokens);
        if cached > 0 {
            add(&mut self.cached_device, u64::from(cached));
        }
        add(&mut self.num_requests[i], 1);
        self.e2e[i].get_or_insert_with(|| Histogram::new(E2E_BUCKETS)).observe(r.e2e_s());
        if ok
            && r.completion_tokens > 1
            && let (Some(first), true) = (r.first_token, r.finished > r.first_token.unwrap_or(u64::MAX))
        {
            let tpot = (r.finished - first) as f64 / 1e9 / f64::from(r.completion_tokens - 1);
            self.tpot[i].get_or_insert_with(|| Histogram::new(ITL_BUCKETS)).observe(tpot);
        }
        let tok = |h: &mut Option<Histogram>, v: u32| {
            h.get_or_insert_with(|| Histogram::new(TOKEN_BUCKETS)).observe(f64::from(v))
        };
        tok(&mut self.prompt_hist, r.prompt_tokens);
        tok(&mut self.uncached_hist, r.prompt_tokens - cached);
        tok(&mut self.generation_hist, r.completion_tokens);
    }

    /// The engine's state after an advance to `now`: logs the scheduler's stats when SGLang
    /// would (after a prefill batch, at the decode log interval, or idle with stale gauges).
    pub fn engine_state(&mut self, now: Nanos, running: usize, waiting: usize, kv: &KvSnapshot, stats: &EngineStats) {
        let prefill = self.pending_prefill_log;
        let decode = self.pending_decode_log;
        let idle_stale = running == 0 && self.gauges[gauge_index("sglang:num_running_reqs")] != 0.0;
        if !(prefill || decode || idle_stale || !self.logged) {
            return;
        }
        let g = |name: &str| gauge_index(name);
        if decode {
            let gap = now.saturating_sub(self.last_decode_log).max(1) as f64 / 1e9;
            self.last_gen_throughput = self.generated_since_log as f64 / gap;
            self.generated_since_log = 0;
            self.last_decode_log = now;
            self.gauges[g("sglang:is_cuda_graph")] = 1.0;
        }
        if now.saturating_sub(self.last_decode_log) > GEN_THROUGHPUT_STALENESS_NS {
            self.last_gen_throughput = 0.0;
        }
        let mut throughput = self.last_gen_throughput;
        if prefill {
            let hits = stats.prefix_hits.saturating_sub(self.hits_at_log);
            let queries = stats.prefix_queries.saturating_sub(self.queries_at_log);
            self.hits_at_log = stats.prefix_hits;
            self.queries_at_log = stats.prefix_queries;
            self.gauges[g("sglang:cache_hit_rate")] = if queries > 0 { hits as f64 / queries as f64 } else { 0.0 };
            if self.pending_prefill > 0 {
                add(&mut self.realtime[0], self.pending_prefill);
            }
            if hits > 0 {
                add(&mut self.realtime[1], hits);
            }
            self.pending_prefill = 0;
            self.pending_prefill_log = false;
            self.gauges[g("sglang:is_cuda_graph")] = 0.0;
        }
        if !(prefill || decode) {
            // the idle refresh
            throughput = 0.0;
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO;
        }
        let block = u64::from(kv.block_size);
        let total = self.limits.max_total_num_tokens.max(1);
        let free = (u64::from(kv.free_blocks) * block).min(total);
        let used = total - free;
        let usage = used as f64 / total as f64;
        let set = |gs: &mut GaugeValues, name: &str, v: f64| gs[gauge_index(name)] = v;
        let gs = &mut self.gauges;
        set(gs, "sglang:num_running_reqs", running as f64);
        set(gs, "sglang:num_queue_reqs", waiting as f64);
        set(gs, "sglang:gen_throughput", throughput);
        set(gs, "sglang:decode_sum_seq_lens", if running == 0 { 0.0 } else { used as f64 });
        set(gs, "sglang:token_usage", usage);
        set(gs, "sglang:full_token_usage", usage);
        set(gs, "sglang:num_used_tokens", used as f64);
        set(gs, "sglang:kv_available_tokens", free as f64);
        set(gs, "sglang:kv_used_tokens", used as f64);
        set(gs, "sglang:utilization", if running == 0 { 0.0 } else { self.last_util });
        set(gs, "sglang:new_token_ratio", self.new_token_ratio);
        self.retracted_since_log = 0;
        self.pending_decode_log = false;
        self.logged = true;
    }

    /// The HTTP middleware saw a request start.
    pub fn http_started(&mut self, endpoint: &str, method: &str) {
        let key = (endpoint.to_string(), method.to_string());
        *self.http_requests.entry(key.clone()).or_insert(0) += 1;
        *self.http_active.entry(key).or_insert(0) += 1;
    }

    /// The HTTP middleware saw its response.
    pub fn http_finished(&mut self, endpoint: &str, method: &str, status: u16) {
        self.http_abandoned(endpoint, method);
        *self.http_responses.entry((endpoint.to_string(), method.to_string(), status.to_string())).or_insert(0) += 1;
    }

    /// A request left the handler without a response (its client went away).
    pub fn http_abandoned(&mut self, endpoint: &str, method: &str) {
        if let Some(a) = self.http_active.get_mut(&(endpoint.to_string(), method.to_string())) {
            *a = a.saturating_sub(1);
        }
    }

    /// A counter's value by family name (tokens and requests summed over `is_streaming`).
    pub fn counter(&self, name: &str) -> u64 {
        let sum = |v: &[Option<u64>]| v.iter().flatten().sum();
        match name {
            "sglang:num_requests_total" => sum(&self.num_requests),
            "sglang:prompt_tokens_total" => sum(&self.prompt_tokens),
            "sglang:generation_tokens_total" => sum(&self.generation_tokens),
            "sglang:num_aborted_requests_total" => self.aborted.unwrap_or(0),
            "sglang:cached_tokens_total" => self.cached_device.unwrap_or(0),
            "sglang:num_retracted_requests_total" => self.retracted.map_or(0, |r| r[0]),
            _ => 0,
        }
    }

    /// A scheduler gauge's value at the last stats log.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        SCHEDULER_GAUGES.iter().position(|(n, _)| *n == name).map(|i| self.gauges[i])
    }

    /// The exposition text of `GET /metrics`, families in the order of a real capture
    /// (tests/fixtures/servers/sglang-0.5.23.prom).
    pub fn render(&self) -> String {
        let mut w = Writer { out: String::with_capacity(64 * 1024) };
        let lb = &self.labels;
        let sched = lb.scheduler();
        let tok = lb.tokenizer();
        // http middleware gauges (multiprocess mode livesum)
        let none: [(&str, &str); 0] = [];
        w.gauge("sglang:routing_keys_active", "Number of unique routing keys with active requests", &[(&none, 0.0)]);
        let active: Vec<[(&str, &str); 2]> =
            self.http_active.keys().map(|(e, m)| [("endpoint", e.as_str()), ("method", m.as_str())]).collect();
        let children: Vec<(&[(&str, &str)], f64)> =
            active.iter().zip(self.http_active.values()).map(|(l, v)| (&l[..], *v as f64)).collect();
        w.gauge("sglang:http_requests_active", "Number of currently active HTTP requests", &children);
        // histograms
        let one = |h| single(&sched, h);
        w.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", &one(&self.queue_time));
        let streaming: Vec<[(&str, &str); 3]> =
            IS_STREAMING.iter().map(|s| lb.tokenizer_and("is_streaming", s)).collect();
        let split = |hs| by_stream(&streaming, hs);
        let tone = |h| single(&tok, h);
        w.histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &split(&self.ttft),
        );
        w.histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &tone(&self.itl),
        );
        w.histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            &split(&self.e2e),
        );
        w.histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            &split(&self.tpot),
        );
        w.histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", &tone(&self.prompt_hist));
        w.histogram(
            "sglang:uncached_prompt_tokens_histogram",
            "Histogram of uncached (compute) prompt token length.",
            &tone(&self.uncached_hist),
        );
        w.histogram(
            "sglang:generation_tokens_histogram",
            "Histogram of generation token length.",
            &tone(&self.generation_hist),
        );
        // multiprocess mode `all` gauges: one child per process, with its pid
        if self.logged {
            let pid = lb.scheduler_pid();
            w.gauge(
                "sglang:num_retracted_reqs",
                "The number of retracted requests.",
                &[(&pid, f64::from(self.retracted_since_log))],
            );
            w.gauge("sglang:num_paused_reqs", "The number of paused requests by async weight sync.", &[(&pid, 0.0)]);
        }
        // counters
        let modes = ["prefill_compute", "prefill_cache", "decode"].map(|m| lb.scheduler_and("mode", m));
        let children: Vec<(&[(&str, &str)], f64)> =
            self.realtime.iter().zip(&modes).filter_map(|(v, l)| v.map(|v| (&l[..], v as f64))).collect();
        w.counter(
            "sglang:realtime_tokens",
            "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.",
            &children,
        );
        let prefill_none = lb.scheduler_and("mode", "prefill_none");
        let passes: Vec<(&[(&str, &str)], f64)> =
            self.prefill_passes.map(|v| (&prefill_none[..], v as f64)).into_iter().collect();
        w.counter("sglang:cuda_graph_passes", "Total number of forward passes categorized by CUDA graph.", &passes);
        let split_c = |vs| counts_by_stream(&streaming, vs);
        w.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", &split_c(&self.prompt_tokens));
        w.counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            &split_c(&self.generation_tokens),
        );
        w.counter("sglang:num_requests", "Number of requests processed.", &split_c(&self.num_requests));
        let req_labels: Vec<[(&str, &str); 2]> =
            self.http_requests.keys().map(|(e, m)| [("endpoint", e.as_str()), ("method", m.as_str())]).collect();
        let children: Vec<(&[(&str, &str)], f64)> =
            req_labels.iter().zip(self.http_requests.values()).map(|(l, v)| (&l[..], *v as f64)).collect();
        w.counter("sglang:http_requests", "Total number of HTTP requests by endpoint and method", &children);
        let resp_labels: Vec<[(&str, &str); 3]> = self
            .http_responses
            .keys()
            .map(|(e, m, s)| [("endpoint", e.as_str()), ("method", m.as_str()), ("status_code", s.as_str())])
            .collect();
        let children: Vec<(&[(&str, &str)], f64)> =
            resp_labels.iter().zip(self.http_responses.values()).map(|(l, v)| (&l[..], *v as f64)).collect();
        w.counter("sglang:http_responses", "Total number of HTTP responses by endpoint and status code", &children);
        let device = lb.tokenizer_and("cache_source", "device");
        let cached: Vec<(&[(&str, &str)], f64)> =
            self.cached_device.map(|v| (&device[..], v as f64)).into_iter().collect();
        w.counter("sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).", &cached);
        let aborted: Vec<(&[(&str, &str)], f64)> = self.aborted.map(|v| (&tok[..], v as f64)).into_iter().collect();
        w.counter("sglang:num_aborted_requests", "Number of requests aborted.", &aborted);
        if let Some([n, input, output]) = self.retracted {
            w.counter("sglang:num_retracted_requests", "Total number of retracted requests.", &[(&sched, n as f64)]);
            w.counter(
                "sglang:num_retracted_input_tokens",
                "Total number of retracted input tokens.",
                &[(&sched, input as f64)],
            );
            w.counter(
                "sglang:num_retracted_output_tokens",
                "Total number of retracted output tokens.",
                &[(&sched, output as f64)],
            );
        }
        // The CPU monitor threads: the sim tokenizes and detokenizes in this one process, so
        // its CPU time is the tokenizer's and the detokenizer's stays 0.
        let cpu = process_cpu_seconds();
        let (t, d) = ([("component", "tokenizer")], [("component", "detokenizer")]);
        w.counter(
            "sglang:process_cpu_seconds",
            "Total CPU time consumed by this process (user + system)",
            &[(&t, cpu), (&d, 0.0)],
        );
        // the scheduler's gauges (mostrecent), then its constants
        if self.logged {
            for (i, (name, help)) in SCHEDULER_GAUGES.iter().enumerate() {
                w.gauge(name, help, &[(&sched, self.gauges[i])]);
            }
        }
        let l = &self.limits;
        for (name, help) in CONSTANT_GAUGES {
            let v = match *name {
                "sglang:max_total_num_tokens" | "sglang:num_pages" => l.max_total_num_tokens as f64,
                "sglang:weight_memory_usage_gb" => l.weight_memory_usage_gb,
                "sglang:kv_cache_memory_usage_gb" => l.kv_cache_memory_usage_gb,
                "sglang:page_size" => 1.0,
                "sglang:context_len" => f64::from(l.context_len),
                "sglang:startup_available_gpu_memory_gb" => l.startup_available_gpu_memory_gb,
                _ => 0.0,
            };
            w.gauge(name, help, &[(&sched, v)]);
        }
        let disk = lb.scheduler_and("source", "disk");
        w.gauge("sglang:weight_load_duration_seconds", WEIGHT_LOAD_HELP, &[(&disk, l.weight_load_duration_seconds)]);
        w.out
    }
}

type Children<'a, V> = Vec<(&'a [(&'a str, &'a str)], V)>;

fn single<'a>(labels: &'a [(&'a str, &'a str)], h: &'a Option<Histogram>) -> Children<'a, &'a Histogram> {
    h.as_ref().map(|h| vec![(labels, h)]).unwrap_or_default()
}

fn by_stream<'a>(labels: &'a [[(&'a str, &'a str); 3]], hs: &'a [Option<Histogram>; 2]) -> Children<'a, &'a Histogram> {
    hs.iter().zip(labels).filter_map(|(h, l)| h.as_ref().map(|h| (&l[..], h))).collect()
}

fn counts_by_stream<'a>(labels: &'a [[(&'a str, &'a str); 3]], vs: &[Option<u64>; 2]) -> Children<'a, f64> {
    vs.iter().zip(labels).filter_map(|(v, l)| v.map(|v| (&l[..], v as f64))).collect()
}

fn add(c: &mut Option<u64>, by: u64) {
    *c.get_or_insert(0) += by;
}

/// This process's user + system CPU time in seconds (Linux `/proc/self/stat`; 0 elsewhere).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // fields after the parenthesised command name; utime and stime are fields 14 and 15
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // rest starts at field 3 (state): utime is field 14 → index 11
    (ticks(11) + ticks(12)) / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::prom::table_test::{capture_families, compare, parse};

    fn fixture(name: &str) -> String {
        let p = format!("{}/../tests/fixtures/servers/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn limits() -> SglangLimits {
        SglangLimits {
            max_total_num_tokens: 40_000,
            context_len: 8192,
            weight_memory_usage_gb: 14.96,
            kv_cache_memory_usage_gb: 4.88,
            startup_available_gpu_memory_gb: 21.56,
            weight_load_duration_seconds: 11.5,
        }
    }

    fn kv(free_blocks: u32) -> KvSnapshot {
        KvSnapshot {
            total_blocks: 2500,
            used_blocks: 2500 - free_blocks,
            pinned_blocks: 0,
            free_blocks,
            block_size: 16,
            usage: 1.0 - f64::from(free_blocks) / 2500.0,
            fragmentation: 0.0,
            largest_free_run: free_blocks,
        }
    }

    fn step(start: Nanos, end: Nanos, num_tokens: u32, decode_seqs: u32, prefill_seqs: u32) -> EngineEvent {
        EngineEvent::Step(StepInfo { start, end, num_tokens, decode_seqs, prefill_seqs, gpu_util: 0.8 })
    }

    fn record(id: u64, fr: FinishReason, cached: u32) -> RequestRecord {
        RequestRecord {
            id,
            arrival: 0,
            scheduled: Some(2_000_000),
            first_token: Some(150_000_000),
            last_token: Some(190_000_000),
            finished: 190_000_000,
            prompt_tokens: 120,
            completion_tokens: 3,
            max_tokens: 8,
            cached_tokens: cached,
            preemptions: 0,
            finish_reason: fr,
        }
    }

    /// One streamed and one whole request, a retraction, a client abort and HTTP traffic.
    fn driven() -> SglangMetrics {
        let mut m = SglangMetrics::new("m", limits());
        let stats = EngineStats { prefix_queries: 240, prefix_hits: 16, ..EngineStats::default() };
        m.engine_state(0, 0, 0, &kv(2500), &EngineStats::default());
        m.http_started("/v1/chat/completions", "POST");
        m.queued(1, 0, 120, true);
        m.queued(2, 0, 120, false);
        m.queued(3, 0, 120, true);
        for id in 1..=3 {
            m.engine_event(&EngineEvent::Scheduled { id, t: 2_000_000, resumed: false });
        }
        m.engine_event(&step(2_000_000, 150_000_000, 344, 0, 3));
        m.engine_event(&EngineEvent::Token { id: 1, index: 0, t: 150_000_000 });
        m.engine_event(&EngineEvent::Token { id: 2, index: 0, t: 150_000_000 });
        m.engine_state(150_000_000, 3, 0, &kv(2480), &stats);
        for (k, t) in [(1u32, 170_000_000), (2, 190_000_000)] {
            m.engine_event(&step(t - 20_000_000, t, 2, 2, 0));
            m.engine_event(&EngineEvent::Token { id: 1, index: k, t });
            m.engine_event(&EngineEvent::Token { id: 2, index: k, t });
        }
        m.engine_event(&EngineEvent::Preempted { id: 3, t: 170_000_000 });
        m.finished(&record(1, FinishReason::Stop, 16));
        m.finished(&record(2, FinishReason::Length, 0));
        m.finished(&RequestRecord { first_token: None, completion_tokens: 0, ..record(3, FinishReason::Abort, 0) });
        m.http_finished("/v1/chat/completions", "POST", 200);
        m.http_started("/metrics", "GET");
        m.engine_state(190_000_000, 0, 0, &kv(2500), &stats);
        m
    }

    /// The sim's SGLang exposition against the table read from SGLang 0.5.23's source: every
    /// family it shows is one SGLang registers, with its type, help, label set (plus `pid` on
    /// the multiprocess-mode-`all` gauges), label values and buckets; and it shows every
    /// family of the capture.
    #[test]
    fn exposition_is_sglang_0_5_23s() {
        let table: serde_json::Value = serde_json::from_str(&fixture("sglang-0.5.23.metrics.json")).expect("json");
        let pid = |row: &serde_json::Value| {
            let all = row["type"] == "gauge" && row.get("multiprocess_mode").is_none_or(|m| m.is_null() || m == "all");
            if all { vec!["pid".to_string()] } else { Vec::new() }
        };
        let fresh = parse(&SglangMetrics::new("m", limits()).render());
        assert!(compare(&fresh, &table, &pid).is_empty(), "{:?}", compare(&fresh, &table, &pid));
        assert!(!fresh.contains_key("sglang:time_to_first_token_seconds"), "no child before a request");
        let m = driven();
        let text = m.render();
        let fams = parse(&text);
        let problems = compare(&fams, &table, &pid);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let capture = capture_families(&fixture("sglang-0.5.23.prom"));
        assert_eq!(capture.len(), 49);
        let missing: Vec<&String> = capture.iter().filter(|n| !fams.contains_key(*n)).collect();
        assert!(missing.is_empty(), "capture families missing: {missing:?}");
        assert!(!text.contains("_created"));
        // sorted label names, `pid` on the mode-`all` gauges
        assert!(text.contains(&format!(
            "sglang:num_retracted_reqs{{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pid=\"{}\",pp_rank=\"0\",tp_rank=\"0\"}} ",
            std::process::id()
        )));
        assert!(text.contains(
            "sglang:time_to_first_token_seconds_bucket{engine_type=\"unified\",is_streaming=\"true\",le=\"0.2\",model_name=\"m\"} 1.0\n"
        ), "{text}");
    }

    #[test]
    fn records_where_sglang_does() {
        let m = driven();
        assert_eq!(m.counter("sglang:num_requests_total"), 3);
        assert_eq!(m.counter("sglang:num_aborted_requests_total"), 1, "the client abort");
        assert_eq!(m.counter("sglang:cached_tokens_total"), 16);
        assert_eq!(m.counter("sglang:num_retracted_requests_total"), 1);
        assert_eq!(m.counter("sglang:generation_tokens_total"), 6);
        let text = m.render();
        // streamed: TTFT at its first token, ITL per later token; batched: TTFT only
        assert!(text.contains("sglang:time_to_first_token_seconds_count{engine_type=\"unified\",is_streaming=\"true\",model_name=\"m\"} 1.0\n"));
        assert!(text.contains("sglang:time_to_first_token_seconds_count{engine_type=\"unified\",is_streaming=\"false\",model_name=\"m\"} 1.0\n"));
        assert!(
            text.contains("sglang:inter_token_latency_seconds_count{engine_type=\"unified\",model_name=\"m\"} 2.0\n"),
            "{text}"
        );
        // TPOT for stop/length only: (190 − 150) ms / 2
        assert!(text.contains("sglang:request_time_per_output_token_seconds_sum{engine_type=\"unified\",is_streaming=\"true\",model_name=\"m\"} 0.02\n"), "{text}");
        assert!(text.contains("sglang:queue_time_seconds_count{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 3.0\n"));
        assert!(text.contains(
            "sglang:http_responses_total{endpoint=\"/v1/chat/completions\",method=\"POST\",status_code=\"200\"} 1.0\n"
        ));
        assert!(text.contains("sglang:http_requests_active{endpoint=\"/metrics\",method=\"GET\"} 1.0\n"));
        assert!(text.contains("mode=\"prefill_cache\""), "prefix hits counted as cached prefill tokens");
        // gauges: the prefill log set the hit rate (16 / 240); the idle refresh zeroed running
        assert_eq!(m.gauge("sglang:cache_hit_rate"), Some(16.0 / 240.0));
        assert_eq!(m.gauge("sglang:num_running_reqs"), Some(0.0));
        assert_eq!(m.gauge("sglang:token_usage"), Some(0.0));
    }

    #[test]
    fn gauges_log_at_prefill_and_every_40th_decode_batch() {
        let mut m = SglangMetrics::new("m", limits());
        let stats = EngineStats::default();
        m.engine_state(0, 0, 0, &kv(2500), &stats);
        m.queued(1, 0, 10, true);
        m.engine_event(&step(0, 1_000_000, 10, 0, 1));
        m.engine_state(1_000_000, 1, 4, &kv(2000), &stats);
        assert_eq!(m.gauge("sglang:num_queue_reqs"), Some(4.0));
        assert_eq!(m.gauge("sglang:token_usage"), Some(0.2));
        for i in 0..39u64 {
            m.engine_event(&step(1_000_000 + i * 1_000_000, 2_000_000 + i * 1_000_000, 1, 1, 0));
            m.engine_state(2_000_000 + i * 1_000_000, 1, 2, &kv(1000), &stats);
        }
        assert_eq!(m.gauge("sglang:num_queue_reqs"), Some(4.0), "no log between decode intervals");
        m.engine_event(&step(40_000_000, 41_000_000, 1, 1, 0));
        m.engine_state(41_000_000, 1, 2, &kv(1000), &stats);
        assert_eq!(m.gauge("sglang:num_queue_reqs"), Some(2.0), "the 40th decode batch logs");
        assert_eq!(m.gauge("sglang:token_usage"), Some(0.6));
        assert!(m.gauge("sglang:gen_throughput").is_some_and(|v| v > 0.0));
    }
}
