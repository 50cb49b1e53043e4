//! TGI's metrics (tests/fixtures/servers/tgi-*.metrics.json) recorded from the simulator's
//! real state, where TGI's router records them:
//!
//! - handlers (`server.rs`): `tgi_request_count` once in the OpenAI handler and once more in
//!   `generate_internal` / `generate_stream_internal` per generation, so a chat completion
//!   counts 2 (as in TGI); at the end of a generation `tgi_request_success` and the request
//!   histograms (`tgi_request_duration`, `_validation_duration`, `_queue_duration`,
//!   `_inference_duration`, `_mean_time_per_token_duration`, `tgi_request_generated_tokens`);
//! - validation (`validation.rs`): `tgi_request_input_length`, `tgi_request_max_new_tokens`,
//!   or `tgi_request_failure{err="validation"}`;
//! - queue and batching loop (`backends/v3`): `tgi_queue_size`, `tgi_batch_current_size`,
//!   `tgi_batch_current_max_tokens` (input + max new tokens of the running requests),
//!   `tgi_batch_next_size`, `tgi_batch_concat{reason}`, `tgi_batch_inference_count` /
//!   `_success{method}` and the `tgi_batch_*_duration{method}` histograms (an engine step
//!   that prefills is a `prefill` call, one that decodes a `decode` call; a step doing both
//!   is split by tokens), `tgi_request_skipped_tokens` (0 per generated token: no
//!   speculation), `tgi_request_failure{err="generation"|"dropped"}`;
//! - start-up: `tgi_batch_max_total_tokens` (the KV cache's capacity in tokens).

use std::collections::{HashMap, HashSet};

use super::exposition::{Matcher, Registry};
use super::trace::Timings;
use crate::engine::{EngineEvent, FinishReason, RequestId, RequestRecord, StepInfo};

/// Steps without onboarding after which TGI concatenates a new batch whatever its size
/// (`--max-waiting-tokens` default).
const MAX_WAITING_TOKENS: u32 = 20;
/// Modelled detokenisation time per sequence of a batch call (`tgi_batch_decode_duration`).
const DETOKENIZE_S_PER_SEQ: f64 = 10e-6;
/// Modelled batch filtering and sending time per call (`tgi_batch_filter_duration`).
const FILTER_S: f64 = 50e-6;

/// The limits TGI derives its buckets and `/info` from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TgiLimits {
    /// `--max-input-tokens` (default: max total tokens − 1).
    pub max_input_tokens: u32,
    /// `--max-total-tokens` (the model length).
    pub max_total_tokens: u32,
    /// `--max-batch-total-tokens` (what the KV cache holds).
    pub max_batch_total_tokens: u64,
}

/// TGI's 35 duration buckets: 0.0001 × 1.5^k, k = 1..=35, computed as its router does.
pub fn duration_buckets() -> Vec<f64> {
    let mut value = 0.0001;
    (0..35)
        .map(|_| {
            value *= 1.5;
            value
        })
        .collect()
}

/// 100 linear buckets `(max / 100) · k`, k = 1..=100 (input length, generated tokens).
pub fn linear_buckets(max: u32) -> Vec<f64> {
    (0..100).map(|x| (f64::from(max) / 100.0) * f64::from(x + 1)).collect()
}

const DESCRIPTIONS: &[(&str, &str)] = &[
    ("tgi_request_success", "Number of successful requests"),
    ("tgi_request_duration", "Request duration"),
    ("tgi_request_validation_duration", "Request validation duration"),
    ("tgi_request_queue_duration", "Request queue duration"),
    ("tgi_request_inference_duration", "Request inference duration"),
    ("tgi_request_mean_time_per_token_duration", "Mean time per token per request"),
    ("tgi_request_generated_tokens", "Generated tokens per request"),
    ("tgi_batch_inference_count", "Inference calls per method (prefill or decode)"),
    ("tgi_request_count", "Total number of requests"),
    ("tgi_batch_inference_success", "Number of successful inference calls per method (prefill or decode)"),
    ("tgi_batch_current_size", "Current batch size"),
    ("tgi_queue_size", "Current queue size"),
    ("tgi_batch_current_max_tokens", "Maximum tokens for the current batch"),
    ("tgi_request_max_new_tokens", "Maximum new tokens per request"),
    ("tgi_batch_inference_duration", "Batch inference duration"),
    ("tgi_batch_forward_duration", "Batch forward duration per method (prefill or decode)"),
    ("tgi_request_skipped_tokens", "Speculated tokens per request"),
    (
        "tgi_batch_filter_duration",
        "Time spent filtering batches and sending generated tokens per method (prefill or decode)",
    ),
    ("tgi_batch_decode_duration", "Time spent decoding a batch per method (prefill or decode)"),
    ("tgi_request_input_length", "Input token length per request"),
    ("tgi_batch_next_size", "Batch size of the next batch"),
];

/// Everything TGI's `/metrics` shows, updated by the handlers and the engine driver.
#[derive(Debug)]
pub struct TgiMetrics {
    reg: Registry,
    budgets: HashMap<RequestId, u64>,
    in_batch: HashSet<RequestId>,
    batch_tokens: u64,
    admitted: u32,
    waiting_tokens: u32,
    queue_touched: bool,
    batch_touched: bool,
}

impl TgiMetrics {
    /// The metrics of a freshly started router.
    pub fn new(limits: TgiLimits) -> Self {
        let mut reg = Registry::new(vec![
            (Matcher::Suffix("duration"), duration_buckets()),
            (Matcher::Full("tgi_request_input_length"), linear_buckets(limits.max_input_tokens)),
            (Matcher::Full("tgi_request_generated_tokens"), linear_buckets(limits.max_total_tokens)),
            (Matcher::Full("tgi_request_max_new_tokens"), linear_buckets(limits.max_total_tokens)),
            (Matcher::Full("tgi_batch_next_size"), (1..=1024).map(f64::from).collect()),
        ]);
        for (name, help) in DESCRIPTIONS {
            reg.describe(name, help);
        }
        reg.set("tgi_batch_max_total_tokens", limits.max_batch_total_tokens as f64);
        TgiMetrics {
            reg,
            budgets: HashMap::new(),
            in_batch: HashSet::new(),
            batch_tokens: 0,
            admitted: 0,
            waiting_tokens: 1,
            queue_touched: false,
            batch_touched: false,
        }
    }

    /// An OpenAI handler received a request (its own `tgi_request_count`).
    pub fn request_received(&mut self) {
        self.reg.increment("tgi_request_count", None, 1);
    }

    /// Validation accepted one generation of it.
    pub fn validated(&mut self, input_length: u32, max_new_tokens: u32) {
        self.reg.increment("tgi_request_count", None, 1);
        self.reg.record("tgi_request_input_length", None, f64::from(input_length));
        self.reg.record("tgi_request_max_new_tokens", None, f64::from(max_new_tokens));
    }

    /// Validation accepted a generation of a request already counted (TGI's `/generate`
    /// counts its request once, then validates each `best_of` generation).
    pub fn input_validated(&mut self, input_length: u32, max_new_tokens: u32) {
        self.reg.record("tgi_request_input_length", None, f64::from(input_length));
        self.reg.record("tgi_request_max_new_tokens", None, f64::from(max_new_tokens));
    }

    /// Validation refused it.
    pub fn validation_failed(&mut self) {
        self.reg.increment("tgi_request_count", None, 1);
        self.failure("validation");
    }

    /// `tgi_request_failure{err}`.
    pub fn failure(&mut self, err: &'static str) {
        self.reg.increment("tgi_request_failure", Some(("err", err)), 1);
    }

    /// A generation entered the queue; `budget` is its input + max new tokens.
    pub fn queued(&mut self, id: RequestId, budget: u64) {
        self.budgets.insert(id, budget);
        self.queue_touched = true;
        self.reg.add("tgi_queue_size", 1.0);
    }

    /// Something happened in the engine.
    pub fn engine_event(&mut self, ev: &EngineEvent) {
        match ev {
            EngineEvent::Scheduled { id, .. } => {
                self.admitted += 1;
                self.batch_touched = true;
                if self.in_batch.insert(*id) {
                    self.batch_tokens += self.budgets.get(id).copied().unwrap_or(0);
                }
            }
            EngineEvent::Preempted { id, .. } => self.leave_batch(*id),
            EngineEvent::Token { .. } => self.reg.record("tgi_request_skipped_tokens", None, 0.0),
            EngineEvent::Step(s) => self.step(s),
            EngineEvent::FirstToken { .. } | EngineEvent::Finished { .. } => {}
        }
    }

    fn leave_batch(&mut self, id: RequestId) {
        if self.in_batch.remove(&id) {
            self.batch_tokens = self.batch_tokens.saturating_sub(self.budgets.get(&id).copied().unwrap_or(0));
        }
    }

    fn step(&mut self, s: &StepInfo) {
        if self.admitted > 0 {
            self.reg.record("tgi_batch_next_size", None, f64::from(self.admitted));
            if self.in_batch.len() > self.admitted as usize {
                let reason = if self.waiting_tokens >= MAX_WAITING_TOKENS { "wait_exceeded" } else { "backpressure" };
                self.reg.increment("tgi_batch_concat", Some(("reason", reason)), 1);
            }
            self.admitted = 0;
            self.waiting_tokens = 1;
        }
        let seconds = s.end.saturating_sub(s.start) as f64 / 1e9;
        let prefill_tokens = f64::from(s.num_tokens.saturating_sub(s.decode_seqs));
        let decode_tokens = f64::from(s.decode_seqs);
        let tokens = (prefill_tokens + decode_tokens).max(1.0);
        match (s.prefill_seqs > 0, s.decode_seqs > 0) {
            (true, true) => {
                self.call("prefill", seconds * prefill_tokens / tokens, s.prefill_seqs);
                self.call("decode", seconds * decode_tokens / tokens, s.decode_seqs);
            }
            (true, false) => self.call("prefill", seconds, s.prefill_seqs),
            (false, _) => self.call("decode", seconds, s.decode_seqs.max(1)),
        }
    }

    /// One prefill or decode call of the batching loop.
    fn call(&mut self, method: &'static str, forward_s: f64, seqs: u32) {
        let m = Some(("method", method));
        let detokenize = DETOKENIZE_S_PER_SEQ * f64::from(seqs);
        self.reg.increment("tgi_batch_inference_count", m, 1);
        self.reg.record("tgi_batch_forward_duration", m, forward_s);
        self.reg.record("tgi_batch_decode_duration", m, detokenize);
        self.reg.record("tgi_batch_filter_duration", m, FILTER_S);
        self.reg.record("tgi_batch_inference_duration", m, forward_s + detokenize + FILTER_S);
        self.reg.increment("tgi_batch_inference_success", m, 1);
        if method == "decode" {
            self.waiting_tokens += 1;
        }
    }

    /// A generation ended (finished, failed or dropped by its client).
    pub fn finished(&mut self, r: &RequestRecord, t: &Timings) {
        self.leave_batch(r.id);
        self.budgets.remove(&r.id);
        match r.finish_reason {
            FinishReason::Stop | FinishReason::Length => {
                self.reg.increment("tgi_request_success", None, 1);
                self.reg.record("tgi_request_duration", None, t.total.as_secs_f64());
                self.reg.record("tgi_request_validation_duration", None, t.validation.as_secs_f64());
                self.reg.record("tgi_request_queue_duration", None, t.queue.as_secs_f64());
                self.reg.record("tgi_request_inference_duration", None, t.inference.as_secs_f64());
                self.reg.record("tgi_request_mean_time_per_token_duration", None, t.time_per_token.as_secs_f64());
                self.reg.record("tgi_request_generated_tokens", None, f64::from(r.completion_tokens));
            }
            FinishReason::Error => self.failure("generation"),
            FinishReason::Abort => self.failure("dropped"),
        }
    }

    /// The engine's queue and batch now.
    pub fn engine_state(&mut self, waiting: usize, running: usize) {
        if self.queue_touched {
            self.reg.set("tgi_queue_size", waiting as f64);
        }
        if self.batch_touched {
            self.reg.set("tgi_batch_current_size", running as f64);
            self.reg.set("tgi_batch_current_max_tokens", if running == 0 { 0.0 } else { self.batch_tokens as f64 });
        }
    }

    /// A counter's value (0 if never incremented).
    pub fn counter(&self, name: &str, label: Option<(&'static str, &'static str)>) -> u64 {
        self.reg.counter(name, label).unwrap_or(0)
    }

    /// The exposition text of `GET /metrics`.
    pub fn render(&self) -> String {
        self.reg.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StepInfo;

    fn limits() -> TgiLimits {
        TgiLimits { max_input_tokens: 8191, max_total_tokens: 8192, max_batch_total_tokens: 40_000 }
    }

    #[test]
    fn buckets_are_tgis() {
        let d = duration_buckets();
        assert_eq!(d.len(), 35);
        assert!((d[0] - 0.00015).abs() < 1e-12 && (d[34] - 145.610_961).abs() < 1e-5, "{d:?}");
        let l = linear_buckets(8191);
        assert_eq!((l.len(), l[0], l[99]), (100, 81.91, 8191.0));
    }

    #[test]
    fn records_a_request_and_the_batching_loop() {
        let mut m = TgiMetrics::new(limits());
        assert!(m.render().starts_with("# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens 40000\n"));
        assert!(!m.render().contains("tgi_request_count"), "untouched metrics are absent");
        m.request_received();
        m.validated(12, 4);
        m.queued(1, 16);
        m.engine_state(1, 0);
        m.engine_event(&EngineEvent::Scheduled { id: 1, t: 0, resumed: false });
        m.engine_state(0, 1);
        assert!(m.render().contains("tgi_batch_current_max_tokens 16\n"));
        let step = |start, end, num_tokens, decode_seqs, prefill_seqs| StepInfo {
            start,
            end,
            num_tokens,
            decode_seqs,
            prefill_seqs,
            gpu_util: 1.0,
        };
        m.engine_event(&EngineEvent::Step(step(0, 1_000_000, 12, 0, 1)));
        m.engine_event(&EngineEvent::Token { id: 1, index: 0, t: 1_000_000 });
        m.engine_event(&EngineEvent::Step(step(1_000_000, 2_000_000, 1, 1, 0)));
        m.engine_event(&EngineEvent::Token { id: 1, index: 1, t: 2_000_000 });
        let r = RequestRecord {
            id: 1,
            arrival: 0,
            scheduled: Some(0),
            first_token: Some(1_000_000),
            last_token: Some(2_000_000),
            finished: 2_000_000,
            prompt_tokens: 12,
            completion_tokens: 2,
            max_tokens: 4,
            cached_tokens: 0,
            preemptions: 0,
            finish_reason: FinishReason::Stop,
        };
        m.finished(&r, &Timings::of(&r, 0));
        m.engine_state(0, 0);
        assert_eq!(m.counter("tgi_request_count", None), 2);
        assert_eq!(m.counter("tgi_request_success", None), 1);
        assert_eq!(m.counter("tgi_batch_inference_count", Some(("method", "prefill"))), 1);
        assert_eq!(m.counter("tgi_batch_inference_count", Some(("method", "decode"))), 1);
        let text = m.render();
        for want in [
            "tgi_request_skipped_tokens_count 2\n",
            "tgi_request_generated_tokens_sum 2\n",
            "tgi_request_input_length_sum 12\n",
            "tgi_batch_next_size_bucket{le=\"1\"} 1\n",
            "tgi_batch_forward_duration_sum{method=\"prefill\"} 0.001\n",
            "tgi_request_mean_time_per_token_duration_sum 0.001\n",
            "tgi_queue_size 0\n",
            "tgi_batch_current_size 0\n",
            "tgi_batch_current_max_tokens 0\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        m.validation_failed();
        assert_eq!(m.counter("tgi_request_failure", Some(("err", "validation"))), 1);
        assert_eq!(m.counter("tgi_request_count", None), 3);
        for (reason, err) in [(FinishReason::Error, "generation"), (FinishReason::Abort, "dropped")] {
            let failed = RequestRecord { id: 2, finish_reason: reason, ..r.clone() };
            m.finished(&failed, &Timings::of(&failed, 0));
            assert_eq!(m.counter("tgi_request_failure", Some(("err", err))), 1, "{err}");
        }
        assert_eq!(m.counter("tgi_request_success", None), 1, "failures are not successes");
        assert!(m.render().contains("tgi_request_duration_count 1\n"), "nor timed");
    }
}
