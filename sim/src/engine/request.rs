//! Requests going in, per-request timing records coming out.

use serde::{Deserialize, Serialize};

use super::time::{Nanos, nanos_to_secs};

/// The engine's key for a request (the server maps its external string ids to these).
pub type RequestId = u64;

/// A shared prompt prefix (a system prompt, the earlier turns of a conversation) that the
/// prefix cache can serve: requests with the same `hash` share their first `tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptPrefix {
    /// Identity of the prefix content.
    pub hash: u64,
    /// Its length in tokens (at most the prompt length).
    pub tokens: u32,
}

/// A request submitted to the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Unique id while the request is in the engine.
    pub id: RequestId,
    /// Frontend arrival time (TTFT and e2e are measured from here).
    pub arrival: Nanos,
    /// Prompt length in tokens (>= 1).
    pub prompt_tokens: u32,
    /// Output limit (`max_tokens`, >= 1); reaching it finishes with reason `length`.
    pub max_tokens: u32,
    /// The natural output length (where the model would emit EOS); below `max_tokens` the
    /// request finishes with reason `stop` after this many tokens. `None`: run to `max_tokens`.
    pub stop_after: Option<u32>,
    /// Shared prefix for the prefix cache, if any.
    pub prefix: Option<PromptPrefix>,
}

impl RequestSpec {
    /// A request of `prompt_tokens` that generates exactly `max_tokens`, with no prefix.
    pub fn new(id: RequestId, arrival: Nanos, prompt_tokens: u32, max_tokens: u32) -> Self {
        RequestSpec { id, arrival, prompt_tokens, max_tokens, stop_after: None, prefix: None }
    }

    /// The number of tokens this request will generate if it is not aborted.
    pub fn target_output(&self) -> u32 {
        match self.stop_after {
            Some(n) => n.clamp(1, self.max_tokens.max(1)),
            None => self.max_tokens.max(1),
        }
    }
}

/// Why a request finished (vLLM's `finished_reason` label values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The model emitted EOS (`stop_after` reached).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Aborted by the client.
    Abort,
    /// Failed inside the engine.
    Error,
}

impl FinishReason {
    /// All reasons, in the order of [`FinishReason::index`].
    pub const ALL: [FinishReason; 4] =
        [FinishReason::Stop, FinishReason::Length, FinishReason::Abort, FinishReason::Error];

    /// The label value (`stop`, `length`, `abort`, `error`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }

    /// Index into per-reason counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Everything the engine knows about a finished request: the source of the `llm_request`
/// span attributes and of the per-request `vllm:*` histograms.
///
/// Intervals follow vLLM V1: queue = first scheduled
/// − arrival, prefill = first token − first scheduled, decode = last token − first token,
/// inference = last token − first scheduled, so queue + prefill + decode = e2e exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request's id.
    pub id: RequestId,
    /// Frontend arrival.
    pub arrival: Nanos,
    /// First time the scheduler took it into the running batch (`None` if never scheduled).
    pub scheduled: Option<Nanos>,
    /// When its first output token was emitted.
    pub first_token: Option<Nanos>,
    /// When its last output token was emitted.
    pub last_token: Option<Nanos>,
    /// When it left the engine.
    pub finished: Nanos,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens generated.
    pub completion_tokens: u32,
    /// `max_tokens` as requested.
    pub max_tokens: u32,
    /// Prompt tokens served from the prefix cache at its first scheduling.
    pub cached_tokens: u32,
    /// Times it was preempted (each one recomputes its KV cache).
    pub preemptions: u32,
    /// Why it finished.
    pub finish_reason: FinishReason,
}

fn span(from: Option<Nanos>, to: Option<Nanos>) -> f64 {
    match (from, to) {
        (Some(a), Some(b)) => nanos_to_secs(b.saturating_sub(a)),
        _ => 0.0,
    }
}

impl RequestRecord {
    /// Arrival to first token, seconds (0 if none).
    pub fn ttft_s(&self) -> f64 {
        span(Some(self.arrival), self.first_token)
    }

    /// Arrival to finish, seconds.
    pub fn e2e_s(&self) -> f64 {
        span(Some(self.arrival), Some(self.finished))
    }

    /// Arrival to first scheduling, seconds (the whole life if never scheduled).
    pub fn queue_s(&self) -> f64 {
        span(Some(self.arrival), Some(self.scheduled.unwrap_or(self.finished)))
    }

    /// First scheduling to first token, seconds.
    pub fn prefill_s(&self) -> f64 {
        span(self.scheduled, self.first_token)
    }

    /// First token to last token, seconds.
    pub fn decode_s(&self) -> f64 {
        span(self.first_token, self.last_token)
    }

    /// First scheduling to last token, seconds.
    pub fn inference_s(&self) -> f64 {
        span(self.scheduled, self.last_token)
    }

    /// Mean time per output token after the first (TPOT), seconds; 0 with fewer than 2 tokens.
    pub fn tpot_s(&self) -> f64 {
        if self.completion_tokens < 2 { 0.0 } else { self.decode_s() / f64::from(self.completion_tokens - 1) }
    }

    /// Prompt tokens whose KV had to be computed (not served by the prefix cache).
    pub fn prefill_kv_computed_tokens(&self) -> u32 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}
