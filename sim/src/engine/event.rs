//! What the engine reports as simulated time passes.

use serde::{Deserialize, Serialize};

use super::request::{RequestId, RequestRecord};
use super::time::Nanos;

/// Why [`crate::engine::Engine::submit`] refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// prompt + max_tokens exceeds `max_model_len` (vLLM answers HTTP 400).
    TooLong,
    /// prompt_tokens or max_tokens is 0.
    Empty,
    /// A request with this id is already in the engine.
    DuplicateId,
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RejectReason::TooLong => "prompt_tokens + max_tokens exceeds max_model_len",
            RejectReason::Empty => "prompt_tokens and max_tokens must be at least 1",
            RejectReason::DuplicateId => "a request with this id is already in the engine",
        })
    }
}

/// One engine step, for iteration-level metrics (`vllm:iteration_tokens_total`, ITL).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    /// Step start.
    pub start: Nanos,
    /// Step end (when its tokens are emitted).
    pub end: Nanos,
    /// Tokens processed (prefill chunks + decodes).
    pub num_tokens: u32,
    /// Sequences that emitted a token at `end` after having emitted one before (each one is
    /// an inter-token interval of `end - start` or longer).
    pub decode_seqs: u32,
    /// Sequences whose (partial) prefill ran in this step.
    pub prefill_seqs: u32,
    /// GPU utilisation during the step in [0, 1] (drops under batch saturation).
    pub gpu_util: f64,
}

/// An event produced by [`crate::engine::Engine::advance_to`], in time order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EngineEvent {
    /// The request entered the running batch (the first time: end of its queue time; later
    /// times: resumed after a preemption).
    Scheduled {
        /// Request.
        id: RequestId,
        /// When.
        t: Nanos,
        /// True when it resumes after a preemption.
        resumed: bool,
    },
    /// The first output token was emitted.
    FirstToken {
        /// Request.
        id: RequestId,
        /// When.
        t: Nanos,
    },
    /// An output token was emitted (only with `token_events`; index 0 is the first token).
    Token {
        /// Request.
        id: RequestId,
        /// Output position, 0-based.
        index: u32,
        /// When.
        t: Nanos,
    },
    /// The request lost its KV blocks and went back to the waiting queue (recompute).
    Preempted {
        /// Request.
        id: RequestId,
        /// When.
        t: Nanos,
    },
    /// The request finished; the record has every timing.
    Finished {
        /// Timings and counts.
        record: RequestRecord,
    },
    /// One engine step ended (only with `step_events`).
    Step(StepInfo),
}

impl EngineEvent {
    /// The event's time.
    pub fn time(&self) -> Nanos {
        match self {
            EngineEvent::Scheduled { t, .. }
            | EngineEvent::FirstToken { t, .. }
            | EngineEvent::Token { t, .. }
            | EngineEvent::Preempted { t, .. } => *t,
            EngineEvent::Finished { record } => record.finished,
            EngineEvent::Step(s) => s.end,
        }
    }
}
