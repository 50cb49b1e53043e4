//! `GET /metrics`: vLLM V1's `vllm:*` metrics in the Prometheus text format 0.0.4, rendered as
//! Python's prometheus_client renders them (counters exposed with `_total` plus a `_created`
//! gauge, histograms with `_bucket` / `_count` / `_sum` / `_created`, floats such as `1.0`
//! and `1.7e+09`, labels `model_name` and `engine`). Names, types, labels and bucket
//! boundaries follow shared/reference/llm-telemetry.md §2.

use std::fmt::Write;

use crate::engine::{EngineConfig, EngineStats, FinishReason, RequestRecord};
use crate::scenario::histo::{
    Histogram, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, PARAMS_N_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS,
    buckets_1_2_5,
};

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    KvComputed,
}

/// Everything `/metrics` shows; the engine driver updates it, the handler renders it.
#[derive(Clone, Debug)]
pub struct PromState {
    model_name: String,
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
}

/// Per-request parameters that only the frontend knows (`n`, `max_tokens`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestParams {
    /// The `n` parameter.
    pub n: u32,
    /// The effective `max_tokens`.
    pub max_tokens: u32,
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
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                &tok,
            ),
        ];
        let b = |v: bool| if v { "True" } else { "False" }.to_string();
        let cache_info = vec![
            ("block_size", cfg.block_size.to_string()),
            ("gpu_memory_utilization", fmt_float(cfg.gpu_memory_utilization)),
            ("swap_space", "4".to_string()),
            ("cache_dtype", "auto".to_string()),
            ("is_attention_free", b(false)),
            ("num_gpu_blocks_override", cfg.num_gpu_blocks_override.map_or("None".to_string(), |n| n.to_string())),
            ("sliding_window", "None".to_string()),
            ("enable_prefix_caching", b(cfg.enable_prefix_caching)),
            ("prefix_caching_hash_algo", "sha256".to_string()),
            ("cpu_offload_gb", "0".to_string()),
            ("calculate_kv_scales", b(false)),
            ("num_gpu_blocks", cfg.num_gpu_blocks().to_string()),
            ("num_cpu_blocks", "None".to_string()),
        ];
        PromState {
            model_name: model_name.to_string(),
            created: created_unix_s,
            cache_info,
            hist,
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            stats: EngineStats::default(),
        }
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
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(32 * 1024);
        let base = [("model_name", self.model_name.as_str()), ("engine", "0")];
        let s = &self.stats;
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            &base,
            self.running as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &base,
            self.waiting as f64,
        );
        gauge(&mut out, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", &base, self.kv_usage);
        let counters: [(&str, &str, u64); 5] = [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.prefix_queries,
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
        ];
        for (name, help, v) in counters {
            counter(&mut out, name, help, &[(&base, v as f64)], self.created);
        }
        let reasons: Vec<[(&str, &str); 3]> =
            FinishReason::ALL.iter().map(|r| [base[0], base[1], ("finished_reason", r.as_str())]).collect();
        let children: Vec<(&[(&str, &str)], f64)> =
            FinishReason::ALL.iter().zip(&reasons).map(|(r, l)| (&l[..], s.finished[r.index()] as f64)).collect();
        counter(&mut out, "vllm:request_success", "Count of successfully processed requests.", &children, self.created);
        for n in &self.hist {
            histogram(&mut out, n.name, n.help, &base, &n.h, self.created);
        }
        let mut info: Vec<(&str, &str)> = self.cache_info.iter().map(|(k, v)| (*k, v.as_str())).collect();
        info.push(("engine", "0"));
        gauge(&mut out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", &info, 1.0);
        out
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

fn gauge(out: &mut String, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
    header(out, name, help, "gauge");
    sample(out, name, labels, None, v);
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
}
