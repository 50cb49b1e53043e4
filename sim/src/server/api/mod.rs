//! The OpenAI-compatible API as vLLM serves it: `/v1/chat/completions` and `/v1/completions`
//! (streamed as SSE `data: {json}\n\n` chunks ending with `data: [DONE]\n\n`, or whole),
//! `/v1/models`, with vLLM's response shapes, usage accounting, logprobs and errors.
//!
//! Cut by concern: `wire` (the JSON shapes read and written, typed so that keys come out in
//! vLLM's (pydantic's) field order), `error` (OpenAI-style errors), `plan` (validating a
//! request and laying out its choices as engine requests), `handlers` (the axum handlers and
//! the whole-response path), `output` (assembling choices, usage and logprobs from engine
//! events) and `sse` (the streamed response); the shared [`AppState`] is here.

mod error;
mod handlers;
mod media;
mod output;
mod plan;
mod sse;
mod wire;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::driver::{Clock, Command};
use super::prom::PromState;
use super::sglang::SglangMetrics;
use super::tgi::TgiMetrics;

pub use error::{ApiError, ErrorBody, ErrorInfo, parse_body};
pub use handlers::{chat_completions, completions, json_ok, models};
pub use media::MediaState;

/// Most top log-probabilities a request may ask for (vLLM's default `--max-logprobs`).
pub const MAX_LOGPROBS: u32 = 20;
/// Most choices (`n` × prompts) in one request.
pub const MAX_CHOICES: usize = 256;

/// What every handler shares.
pub struct AppState {
    /// Commands to the engine driver.
    pub cmd: mpsc::UnboundedSender<Command>,
    /// Engine clock.
    pub clock: Clock,
    /// `/metrics` state.
    pub prom: Arc<Mutex<PromState>>,
    /// TGI's metrics, in the TGI flavour (its `/metrics` then shows these).
    pub tgi: Option<Arc<Mutex<TgiMetrics>>>,
    /// SGLang's metrics, in the SGLang flavour (its `/metrics` then shows these).
    pub sglang: Option<Arc<Mutex<SglangMetrics>>>,
    /// Served model names (`--served-model-name`); the first one labels the metrics.
    pub served: Vec<String>,
    /// The model behind them (`root` in `/v1/models`).
    pub root: String,
    /// `max_model_len`.
    pub max_model_len: u32,
    /// Seed of the synthetic output.
    pub seed: u64,
    /// Vocabulary size (synthetic token ids).
    pub vocab: u32,
    /// `--quality-noise`: share of output tokens drawn from another answer, and how much the
    /// top log-probability is flattened (0: off).
    pub quality_noise: f64,
    /// Median natural output length in tokens (where the model "emits EOS").
    pub median_output_tokens: f64,
    /// Server start, Unix seconds (`created` of the model card).
    pub started_unix_s: u64,
    /// Next engine request id.
    pub next_id: AtomicU64,
    /// Image loading and the multi-modal processor cache (`media`).
    pub media: MediaState,
}
