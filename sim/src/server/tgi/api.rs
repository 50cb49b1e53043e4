//! TGI's own API in the TGI flavour, with TGI 3.3.7's shapes (router/src/lib.rs, server.rs,
//! validation.rs, infer/mod.rs): `POST /generate` (`GenerateResponse`, `x-*` timing
//! headers), `POST /generate_stream` (SSE `data:{StreamResponse}` per token, the last one
//! carrying `generated_text` and `details`; errors as `data:{ErrorResponse}` events in a 200
//! stream), `POST /` (`CompatGenerateRequest`: a stream, or a one-element list of
//! `GenerateResponse`), `POST /tokenize`, `GET /info`, and `GET /` / `/ping` (health).
//!
//! Requests run on the same engine, metrics and handler spans as the OpenAI endpoints: TGI's
//! `tgi_request_count` (once per request, as `generate_internal` does), the input length and
//! max-new-tokens histograms, `tgi_request_failure{err="validation"|"overloaded"}`, and a
//! handler span named `generate` or `generate_stream` with TGI's `parameters` field. Errors
//! are TGI's `{"error", "error_type"}` with its statuses: 422 validation, 429 overloaded
//! (more than `--max-concurrent-requests` in flight), 424 generation, 500 incomplete.
//!
//! Not modelled: the re-queueing of a generation every 1024 tokens (one engine request runs
//! to the end), grammars (accepted, not enforced), watermarking, adapters, and the
//! `compat_generate` parent span of `POST /`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::trace::{Handler, Timings};
use super::{Info, validation_ns};
use crate::engine::tokens::{self, mix64, natural_length, prompt_key};
use crate::engine::{FinishReason, PromptPrefix, RejectReason, RequestId, RequestRecord, RequestSpec};
use crate::server::api::{AppState, json_ok};
use crate::server::driver::{Command, ReqEvent, Submission};
use crate::server::prom::RequestParams;
use crate::server::prompt::{BOS_TOKENS, choice_key, count_tokens, prepare_text};
use crate::server::telemetry::{SpanMeta, TraceParent};

/// `--max-concurrent-requests` default of TGI's launcher.
pub const MAX_CONCURRENT_REQUESTS: u32 = 128;
/// `--max-best-of` default.
pub const MAX_BEST_OF: usize = 2;
/// `--max-stop-sequences` default.
pub const MAX_STOP_SEQUENCES: usize = 4;
/// `--max-top-n-tokens` default.
pub const MAX_TOP_N_TOKENS: u32 = 5;
/// TGI's generation chunk (`DEFAULT_GENERATION_LENGTH`): validation checks at most this many
/// new tokens against `max_total_tokens`.
pub const DEFAULT_GENERATION_LENGTH: u32 = 1024;
/// `x-compute-type` (TGI's `COMPUTE_TYPE` default).
pub const COMPUTE_TYPE: &str = "gpu+optimized";
/// Keep-alive comment interval of axum's `KeepAlive::default()`.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Llama-3's `<|begin_of_text|>`.
const BOS: (u32, &str) = (128_000, "<|begin_of_text|>");

/// What the native handlers share: TGI's limit on requests in flight.
#[derive(Clone, Debug)]
pub struct Native {
    permits: Arc<Semaphore>,
    max_concurrent_requests: usize,
}

impl Native {
    /// At most `max_concurrent_requests` (≥ 1) native requests in flight.
    pub fn new(max_concurrent_requests: usize) -> Self {
        let n = max_concurrent_requests.clamp(1, Semaphore::MAX_PERMITS);
        Native { permits: Arc::new(Semaphore::new(n)), max_concurrent_requests: n }
    }
}

/// The routes of TGI's own API (the TGI flavour merges them into its router).
pub fn routes(max_concurrent_requests: usize) -> Router<Arc<AppState>> {
    Router::new()
        .route("/", post(compat_generate).get(health))
        .route("/generate", post(generate))
        .route("/generate_stream", post(generate_stream))
        .route("/tokenize", post(tokenize))
        .route("/info", get(info))
        .route("/ping", get(health))
        .layer(Extension(Native::new(max_concurrent_requests)))
}

// ---------------------------------------------------------------------------------------------
// Wire shapes (router/src/lib.rs)

/// `GenerateParameters`, field for field (its `Debug` is the span's `parameters` field).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct GenerateParameters {
    /// Generate this many sequences and return the most likely.
    #[serde(default)]
    pub best_of: Option<usize>,
    /// Logits temperature (> 0).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Repetition penalty (> 0).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Frequency penalty (−2..=2).
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Top-k filtering (> 0).
    #[serde(default)]
    pub top_k: Option<i32>,
    /// Nucleus sampling (0 < p < 1).
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Typical decoding mass (0 < p < 1).
    #[serde(default)]
    pub typical_p: Option<f32>,
    /// Sample instead of greedy decoding.
    #[serde(default)]
    pub do_sample: bool,
    /// New tokens at most (default: what fits in `max_total_tokens`).
    #[serde(default)]
    pub max_new_tokens: Option<u32>,
    /// Prepend the prompt to the generated text.
    #[serde(default)]
    pub return_full_text: Option<bool>,
    /// Stop sequences (at most 4).
    #[serde(default)]
    pub stop: Vec<String>,
    /// Keep only the last this many input tokens.
    #[serde(default)]
    pub truncate: Option<usize>,
    /// Watermarking (accepted, not modelled).
    #[serde(default)]
    pub watermark: bool,
    /// Return `details`.
    #[serde(default)]
    pub details: bool,
    /// Return the prompt's tokens (`details.prefill`).
    #[serde(default)]
    pub decoder_input_details: bool,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Top-n alternatives per token (at most 5).
    #[serde(default)]
    pub top_n_tokens: Option<u32>,
    /// Grammar constraint (accepted, not enforced).
    #[serde(default)]
    pub grammar: Option<serde_json::Value>,
    /// LoRA adapter id (accepted, not modelled).
    #[serde(default)]
    pub adapter_id: Option<String>,
}

/// TGI's `default_parameters()`: what a request without `parameters` gets (`do_sample` true).
fn default_parameters() -> GenerateParameters {
    GenerateParameters {
        best_of: None,
        temperature: None,
        repetition_penalty: None,
        frequency_penalty: None,
        top_k: None,
        top_p: None,
        typical_p: None,
        do_sample: true,
        max_new_tokens: None,
        return_full_text: None,
        stop: Vec::new(),
        truncate: None,
        watermark: false,
        details: false,
        decoder_input_details: false,
        seed: None,
        top_n_tokens: None,
        grammar: None,
        adapter_id: None,
    }
}

/// `GenerateRequest` (`/generate`, `/generate_stream`, `/tokenize`).
#[derive(Clone, Debug, Deserialize)]
pub struct GenerateRequest {
    /// The prompt.
    pub inputs: String,
    /// Generation parameters.
    #[serde(default = "default_parameters")]
    pub parameters: GenerateParameters,
}

/// `CompatGenerateRequest` (`POST /`).
#[derive(Clone, Debug, Deserialize)]
pub struct CompatGenerateRequest {
    /// The prompt.
    pub inputs: String,
    /// Generation parameters.
    #[serde(default = "default_parameters")]
    pub parameters: GenerateParameters,
    /// Answer as an SSE stream.
    #[serde(default)]
    pub stream: bool,
}

/// `Token`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Token {
    /// Token id.
    pub id: u32,
    /// Token text.
    pub text: String,
    /// Log-probability (TGI's `f32`).
    pub logprob: f32,
    /// A special token (EOS).
    pub special: bool,
}

/// `PrefillToken` (the first one's logprob is NaN, serialised as `null`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PrefillToken {
    /// Token id.
    pub id: u32,
    /// Token text.
    pub text: String,
    /// Log-probability.
    pub logprob: f32,
}

/// `SimpleToken` (`/tokenize`): byte offsets into the input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimpleToken {
    /// Token id.
    pub id: u32,
    /// The input bytes `start..stop`.
    pub text: String,
    /// Start byte offset.
    pub start: usize,
    /// End byte offset.
    pub stop: usize,
}

/// `BestOfSequence`.
#[derive(Debug, Serialize)]
pub struct BestOfSequence {
    /// The sequence's text.
    pub generated_text: String,
    /// `length`, `eos_token` or `stop_sequence`.
    pub finish_reason: &'static str,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// Prompt tokens (with `decoder_input_details`).
    pub prefill: Vec<PrefillToken>,
    /// Generated tokens.
    pub tokens: Vec<Token>,
    /// Top-n alternatives per token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
}

/// `Details`.
#[derive(Debug, Serialize)]
pub struct Details {
    /// `length`, `eos_token` or `stop_sequence`.
    pub finish_reason: &'static str,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// The sampling seed (`null` when greedy).
    pub seed: Option<u64>,
    /// Prompt tokens (with `decoder_input_details`).
    pub prefill: Vec<PrefillToken>,
    /// Generated tokens.
    pub tokens: Vec<Token>,
    /// The other sequences of `best_of`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of_sequences: Option<Vec<BestOfSequence>>,
    /// Top-n alternatives per token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
}

/// `GenerateResponse`.
#[derive(Debug, Serialize)]
pub struct GenerateResponse {
    /// The text (after the prompt with `return_full_text`).
    pub generated_text: String,
    /// Details, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

/// `StreamDetails`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StreamDetails {
    /// `length`, `eos_token` or `stop_sequence`.
    pub finish_reason: &'static str,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// Prompt tokens.
    pub input_length: u32,
}

/// `StreamResponse`: one SSE event per token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StreamResponse {
    /// 1-based position of the event.
    pub index: u32,
    /// The token.
    pub token: Token,
    /// Its top-n alternatives.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Token>,
    /// The whole text, on the last event only.
    pub generated_text: Option<String>,
    /// Details, on the last event only (when asked for).
    pub details: Option<StreamDetails>,
}

/// `ErrorResponse`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorResponse {
    /// TGI's message (`InferError`'s `Display`).
    pub error: String,
    /// `validation`, `overloaded`, `generation`, ...
    pub error_type: &'static str,
}

// ---------------------------------------------------------------------------------------------
// Errors (router/src/infer/mod.rs `InferError`, validation.rs `ValidationError`)

/// TGI's `InferError`, as far as the simulator raises it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TgiError {
    /// 422: the request failed validation (the message is `ValidationError`'s).
    #[error("Input validation error: {0}")]
    Validation(String),
    /// 429: more requests in flight than `--max-concurrent-requests`.
    #[error("Model is overloaded")]
    Overloaded,
    /// 424: the generation failed in the engine.
    #[error("Request failed during generation: {0}")]
    Generation(String),
    /// 500: the generation ended without its last token.
    #[error("Incomplete generation")]
    Incomplete,
    /// 500: the stream ended without its last token.
    #[error("Incomplete generation stream")]
    IncompleteStream,
}

impl TgiError {
    /// TGI's `error_type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            TgiError::Validation(_) => "validation",
            TgiError::Overloaded => "overloaded",
            TgiError::Generation(_) => "generation",
            TgiError::Incomplete => "incomplete_generation",
            TgiError::IncompleteStream => "incomplete_generation_stream",
        }
    }

    /// The HTTP status of a non-streamed answer.
    pub fn status(&self) -> StatusCode {
        match self {
            TgiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            TgiError::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            TgiError::Generation(_) => StatusCode::FAILED_DEPENDENCY,
            TgiError::Incomplete | TgiError::IncompleteStream => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorResponse {
        ErrorResponse { error: self.to_string(), error_type: self.error_type() }
    }

    /// The `tgi_request_failure{err}` the router records when the handler raises it (engine
    /// failures and drops are recorded where the generation ends).
    fn failure_label(&self) -> Option<&'static str> {
        match self {
            TgiError::Validation(_) => Some("validation"),
            TgiError::Overloaded => Some("overloaded"),
            TgiError::Incomplete | TgiError::IncompleteStream => Some("incomplete"),
            TgiError::Generation(_) => None,
        }
    }
}

impl IntoResponse for TgiError {
    fn into_response(self) -> Response {
        let mut r = json_ok(&self.body());
        *r.status_mut() = self.status();
        r
    }
}

fn invalid(msg: impl Into<String>) -> TgiError {
    TgiError::Validation(msg.into())
}

// ---------------------------------------------------------------------------------------------
// Tokenizer stand-in

/// Byte ranges of the tokens of `text` under the simulator's tokenizer
/// ([`count_tokens`]: letters in runs of 6, digits in runs of 3, a line-break run, any other
/// non-space character; spaces join the next token). There are `count_tokens(text)` of them.
pub fn token_spans(text: &str) -> Vec<(usize, usize)> {
    #[derive(PartialEq, Clone, Copy)]
    enum Run {
        Alpha,
        Digit,
        Newline,
        Other,
        Space,
    }
    let kind = |c: char| {
        if c.is_alphabetic() {
            Run::Alpha
        } else if c.is_ascii_digit() {
            Run::Digit
        } else if c == '\n' || c == '\r' {
            Run::Newline
        } else if c.is_whitespace() {
            Run::Space
        } else {
            Run::Other
        }
    };
    let mut out: Vec<(usize, usize)> = Vec::new();
    // the open token: its kind, start byte, characters so far
    let mut open: Option<(Run, usize, usize)> = None;
    let mut pending_space: Option<usize> = None;
    for (i, c) in text.char_indices() {
        let k = kind(c);
        let end = i + c.len_utf8();
        if k == Run::Space {
            open = None;
            pending_space.get_or_insert(i);
            continue;
        }
        let limit = match k {
            Run::Alpha => 6,
            Run::Digit => 3,
            Run::Newline => usize::MAX,
            _ => 1,
        };
        match &mut open {
            Some((ok, _, n)) if *ok == k && *n < limit => {
                *n += 1;
                if let Some(last) = out.last_mut() {
                    last.1 = end;
                }
            }
            Some((ok, _, _)) if *ok == k && k != Run::Other => {
                // a long run: the next piece of the same run
                open = Some((k, i, 1));
                out.push((i, end));
            }
            _ => {
                let start = pending_space.take().unwrap_or(i);
                open = Some((k, start, 1));
                out.push((start, end));
            }
        }
        if k == Run::Other {
            open = None;
        }
        pending_space = None;
    }
    out
}

fn token_id(piece: &str, vocab: u32) -> u32 {
    (mix64(prompt_key(piece)) % u64::from(vocab.clamp(2, BOS.0))) as u32
}

/// The prompt's tokens as TGI's tokenizer returns them (BOS first, at offsets 0..0).
pub fn tokenize_text(text: &str, vocab: u32) -> Vec<SimpleToken> {
    let mut out = Vec::with_capacity(1 + text.len() / 4);
    out.push(SimpleToken { id: BOS.0, text: String::new(), start: 0, stop: 0 });
    for (start, stop) in token_spans(text) {
        let piece = text.get(start..stop).unwrap_or_default();
        out.push(SimpleToken { id: token_id(piece, vocab), text: piece.to_string(), start, stop });
    }
    out
}

/// The end-of-sequence token a generation that stops by itself ends with.
fn eos_token(vocab: u32, logprob: f32) -> Token {
    let (id, text) = if vocab > 128_001 { (128_001, "<|end_of_text|>") } else { (vocab.saturating_sub(1), "</s>") };
    Token { id, text: text.into(), logprob, special: true }
}

// ---------------------------------------------------------------------------------------------
// Validation (router/src/validation.rs `Validation::validate`)

/// How a generation is planned to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// `max_new_tokens` (or what fits) reached.
    Length,
    /// The model emits EOS (its last token is special).
    Eos,
    /// A stop sequence appeared.
    StopSequence,
}

/// One generation of a request (one per `best_of`).
#[derive(Clone, Debug)]
struct Member {
    key: u64,
    spec: RequestSpec,
    end: End,
}

/// A validated request.
#[derive(Clone, Debug)]
pub struct Valid {
    inputs: String,
    input_length: u32,
    /// The `max_new_tokens` TGI validated (its histogram's value).
    max_new_tokens: u32,
    /// New tokens the generation may run to.
    max_total_new_tokens: u32,
    sampling: bool,
    seed: u64,
    user_seed: Option<u64>,
    key: u64,
    prefix: Option<PromptPrefix>,
    temperature: f32,
    top_p: f32,
    top_n_tokens: u32,
    best_of: usize,
    details: bool,
    decoder_input_details: bool,
    return_full_text: bool,
    stop: Vec<String>,
    /// `Debug` of the parameters (the handler span's `parameters` field).
    parameters: String,
}

/// TGI's `validate_best_of` (`/generate` with `best_of` > 1).
fn validate_best_of(best_of: usize) -> Result<usize, TgiError> {
    if best_of > MAX_BEST_OF {
        return Err(invalid(format!("`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {best_of}")));
    }
    Ok(best_of)
}

/// Validates a request as TGI's router does, in its order; `limits` are
/// (`max_input_tokens`, `max_total_tokens`).
pub fn validate(req: &GenerateRequest, limits: (u32, u32)) -> Result<Valid, TgiError> {
    let p = &req.parameters;
    let (max_input, max_total) = limits;
    let best_of = p.best_of.unwrap_or(1);
    let sampling =
        p.do_sample || p.temperature.is_some() || p.top_k.is_some() || p.top_p.is_some() || p.typical_p.is_some();
    if best_of > 1 && !sampling {
        return Err(invalid("you must use sampling when `best_of` is > 1"));
    }
    let temperature = p.temperature.unwrap_or(1.0);
    if temperature <= 0.0 {
        return Err(invalid("`temperature` must be strictly positive"));
    }
    if p.repetition_penalty.unwrap_or(1.0) <= 0.0 {
        return Err(invalid("`repetition_penalty` must be strictly positive"));
    }
    if !(-2.0..=2.0).contains(&p.frequency_penalty.unwrap_or(0.0)) {
        return Err(invalid("`frequency_penalty` must be >= -2.0 and <= 2.0"));
    }
    let top_p = p.top_p.unwrap_or(1.0);
    if p.top_p.is_some_and(|v| v <= 0.0 || v >= 1.0) {
        return Err(invalid("`top_p` must be > 0.0 and < 1.0"));
    }
    if p.typical_p.is_some_and(|v| v <= 0.0 || v >= 1.0) {
        return Err(invalid("`typical_p` must be > 0.0 and < 1.0"));
    }
    if p.top_k.is_some_and(|v| v <= 0) {
        return Err(invalid("`top_k` must be strictly positive"));
    }
    if p.max_new_tokens == Some(0) {
        return Err(invalid("`max_new_tokens` must be strictly positive"));
    }
    if p.stop.len() > MAX_STOP_SEQUENCES {
        return Err(invalid(format!(
            "`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {}",
            p.stop.len()
        )));
    }
    let seed = match p.seed {
        None => rand::random::<u64>(),
        Some(_) if best_of > 1 => return Err(invalid("`seed` must not be set when `best_of` > 1")),
        Some(s) => s,
    };
    let top_n_tokens = p.top_n_tokens.unwrap_or(0);
    if top_n_tokens > MAX_TOP_N_TOKENS {
        return Err(invalid(format!("`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {top_n_tokens}")));
    }
    if req.inputs.is_empty() {
        return Err(invalid("`inputs` cannot be empty"));
    }
    if let Some(t) = p.truncate
        && (t == 0 || t > max_input as usize)
    {
        return Err(invalid(format!("`truncate` must be strictly positive and less than {max_input}. Given: {t}")));
    }
    let prompt = prepare_text(&req.inputs);
    let input_length = match p.truncate {
        Some(t) => prompt.tokens.min(u32::try_from(t).unwrap_or(u32::MAX)),
        None => prompt.tokens,
    };
    let (max_new_tokens, max_total_new_tokens) = match p.max_new_tokens {
        Some(m) => (m.min(DEFAULT_GENERATION_LENGTH), m),
        None => {
            let m = max_total.saturating_sub(input_length);
            (m.min(DEFAULT_GENERATION_LENGTH), m)
        }
    };
    if u64::from(input_length) + u64::from(max_new_tokens) > u64::from(max_total) {
        return Err(invalid(format!(
            "`inputs` tokens + `max_new_tokens` must be <= {max_total}. Given: {input_length} `inputs` tokens and \
             {max_new_tokens} `max_new_tokens`"
        )));
    }
    if input_length > max_input {
        return Err(invalid(format!("`inputs` must have less than {max_input} tokens. Given: {input_length}")));
    }
    let truncated = input_length < prompt.tokens;
    Ok(Valid {
        inputs: req.inputs.clone(),
        input_length,
        max_new_tokens,
        max_total_new_tokens: max_total_new_tokens.min(max_total.saturating_sub(input_length)).max(1),
        sampling,
        seed,
        user_seed: p.seed,
        key: prompt.key,
        prefix: if truncated { None } else { prompt.prefix },
        temperature,
        top_p,
        top_n_tokens,
        best_of: best_of.max(1),
        details: p.details || p.decoder_input_details,
        decoder_input_details: p.decoder_input_details,
        return_full_text: p.return_full_text.unwrap_or(false),
        stop: p.stop.clone(),
        parameters: format!("{p:?}"),
    })
}

// ---------------------------------------------------------------------------------------------
// Planning and output

/// Where a stop sequence first appears in the output of `key` within `limit` tokens: the
/// number of tokens up to and including the one that completes it.
fn stop_sequence_at(seed: u64, key: u64, vocab: u32, limit: u32, stop: &[String]) -> Option<u32> {
    let stop: Vec<&String> = stop.iter().filter(|s| !s.is_empty()).collect();
    if stop.is_empty() {
        return None;
    }
    let longest = stop.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut tail = String::new();
    for i in 0..limit {
        tail.push_str(&tokens::token(seed, key, i, vocab).text);
        if stop.iter().any(|s| tail.contains(s.as_str())) {
            return Some(i + 1);
        }
        if tail.len() > 4 * longest + 64 {
            let mut cut = tail.len() - 2 * longest;
            while !tail.is_char_boundary(cut) {
                cut -= 1;
            }
            tail.drain(..cut);
        }
    }
    None
}

struct Planned {
    valid: Valid,
    members: Vec<Member>,
    subs: Vec<Submission>,
}

fn plan(st: &AppState, headers: &HeaderMap, valid: Valid, handler: &'static str, arrival: u64) -> Planned {
    let parent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(|tp| TraceParent::parse(tp, headers.get("tracestate").and_then(|v| v.to_str().ok())));
    let n = valid.best_of as u32;
    let max = valid.max_total_new_tokens;
    let mut members = Vec::with_capacity(valid.best_of);
    let mut subs = Vec::with_capacity(valid.best_of);
    for i in 0..n {
        let key = choice_key(valid.key, i, valid.user_seed.map(|s| s as i64));
        let natural = natural_length(st.seed, key, st.median_output_tokens, max);
        let stop_at = stop_sequence_at(st.seed, key, st.vocab, natural, &valid.stop);
        let (stop_after, end) = match stop_at {
            Some(k) if k < max => (k, End::StopSequence),
            Some(k) => (k, End::Length),
            None if natural < max => (natural, End::Eos),
            None => (natural, End::Length),
        };
        let id: RequestId = st.next_id.fetch_add(1, Ordering::Relaxed);
        let spec = RequestSpec {
            id,
            arrival: arrival + validation_ns(valid.input_length),
            prompt_tokens: valid.input_length,
            max_tokens: max,
            stop_after: Some(stop_after),
            prefix: valid.prefix,
        };
        subs.push(Submission {
            spec: spec.clone(),
            choice: i,
            meta: SpanMeta {
                request_id: format!("{id}"),
                max_tokens: max,
                temperature: f64::from(valid.temperature),
                top_p: f64::from(valid.top_p),
                n,
                parent: parent.clone(),
                handler: Handler {
                    name: handler,
                    group: 0,
                    members: n,
                    seed: valid.sampling.then_some(valid.seed),
                    arrival,
                    parameters: Some(valid.parameters.clone()),
                },
            },
            params: RequestParams { n, max_tokens: max, stream: handler == "generate_stream" },
        });
        members.push(Member { key, spec, end });
    }
    let group = subs.first().map_or(0, |s| s.spec.id);
    subs.iter_mut().for_each(|s| s.meta.handler.group = group);
    Planned { valid, members, subs }
}

/// Assembles the tokens and texts of the generations of one request.
struct Out {
    valid: Valid,
    members: Vec<Member>,
    seed: u64,
    vocab: u32,
    /// Per generation: tokens so far, its text, and its end.
    gens: Vec<GenOut>,
    remaining: usize,
}

#[derive(Default)]
struct GenOut {
    tokens: Vec<Token>,
    top: Vec<Vec<Token>>,
    text: String,
    record: Option<RequestRecord>,
}

impl Out {
    fn new(p: &Planned, seed: u64, vocab: u32) -> Self {
        Out {
            valid: p.valid.clone(),
            members: p.members.clone(),
            seed,
            vocab,
            gens: p.members.iter().map(|_| GenOut::default()).collect(),
            remaining: p.members.len(),
        }
    }

    /// Output token `index` of generation `g`, with its top-n alternatives.
    fn token(&self, g: usize, index: u32) -> (Token, Vec<Token>) {
        let m = &self.members[g];
        let t = tokens::token(self.seed, m.key, index, self.vocab);
        let last = index + 1 >= m.spec.target_output();
        let token = if last && m.end == End::Eos {
            eos_token(self.vocab, t.logprob as f32)
        } else {
            Token { id: t.id, text: t.text, logprob: t.logprob as f32, special: false }
        };
        let top = match self.valid.top_n_tokens {
            0 => Vec::new(),
            n => tokens::top_logprobs(self.seed, m.key, index, n, self.vocab)
                .into_iter()
                .map(|x| Token { id: x.id, text: x.text, logprob: x.logprob as f32, special: false })
                .collect(),
        };
        (token, top)
    }

    fn push(&mut self, g: usize, index: u32) -> (Token, Vec<Token>) {
        let (tok, top) = self.token(g, index);
        let o = &mut self.gens[g];
        if !tok.special {
            o.text.push_str(&tok.text);
        }
        o.tokens.push(tok.clone());
        o.top.push(top.clone());
        (tok, top)
    }

    /// Records a finished generation; the error when it did not end normally.
    fn finished(&mut self, g: usize, record: RequestRecord) -> Option<TgiError> {
        let o = &mut self.gens[g];
        if o.record.is_some() {
            return None;
        }
        let reason = record.finish_reason;
        o.record = Some(record);
        self.remaining = self.remaining.saturating_sub(1);
        match reason {
            FinishReason::Stop | FinishReason::Length => None,
            FinishReason::Error => Some(TgiError::Generation("the KV cache could not hold the request".into())),
            FinishReason::Abort => Some(TgiError::Incomplete),
        }
    }

    fn finish_reason(&self, g: usize) -> &'static str {
        match self.gens[g].record.as_ref().map(|r| r.finish_reason) {
            Some(FinishReason::Length) => "length",
            _ => match self.members[g].end {
                End::StopSequence => "stop_sequence",
                End::Eos => "eos_token",
                End::Length => "length",
            },
        }
    }

    fn full_text(&self, g: usize) -> String {
        if self.valid.return_full_text {
            format!("{}{}", self.valid.inputs, self.gens[g].text)
        } else {
            self.gens[g].text.clone()
        }
    }

    fn seed(&self) -> Option<u64> {
        self.valid.sampling.then_some(self.valid.seed)
    }

    fn prefill(&self) -> Vec<PrefillToken> {
        if !self.valid.decoder_input_details {
            return Vec::new();
        }
        let toks = tokenize_text(&self.valid.inputs, self.vocab);
        let skip = toks.len().saturating_sub(self.valid.input_length as usize);
        toks.into_iter()
            .skip(skip)
            .enumerate()
            .map(|(i, t)| PrefillToken {
                id: t.id,
                text: if t.id == BOS.0 { BOS.1.to_string() } else { t.text },
                logprob: if i == 0 { f32::NAN } else { -(1.0 + (mix64(u64::from(t.id)) % 700) as f32 / 100.0) },
            })
            .collect()
    }

    /// The generation TGI returns for `best_of`: the highest mean token logprob.
    fn best(&self) -> usize {
        let mut best = 0;
        let mut max = f32::MIN;
        for (i, g) in self.gens.iter().enumerate() {
            let mean = g.tokens.iter().map(|t| t.logprob).sum::<f32>() / g.tokens.len().max(1) as f32;
            if mean > max {
                best = i;
                max = mean;
            }
        }
        best
    }

    fn response(&mut self) -> (GenerateResponse, usize) {
        let best = self.best();
        let details = self.valid.details.then(|| {
            let best_of_sequences = (self.gens.len() > 1).then(|| {
                (0..self.gens.len())
                    .filter(|&i| i != best)
                    .map(|i| BestOfSequence {
                        generated_text: self.full_text(i),
                        finish_reason: self.finish_reason(i),
                        generated_tokens: self.gens[i].tokens.len() as u32,
                        seed: self.seed(),
                        prefill: self.prefill(),
                        tokens: self.gens[i].tokens.clone(),
                        top_tokens: self.top_tokens(i),
                    })
                    .collect()
            });
            Details {
                finish_reason: self.finish_reason(best),
                generated_tokens: self.gens[best].tokens.len() as u32,
                seed: self.seed(),
                prefill: self.prefill(),
                tokens: self.gens[best].tokens.clone(),
                best_of_sequences,
                top_tokens: self.top_tokens(best),
            }
        });
        (GenerateResponse { generated_text: self.full_text(best), details }, best)
    }

    fn top_tokens(&self, g: usize) -> Vec<Vec<Token>> {
        if self.valid.top_n_tokens == 0 { Vec::new() } else { self.gens[g].top.clone() }
    }
}

/// Aborts the engine requests of a handler that went away before they finished.
struct AbortGuard {
    ids: Vec<RequestId>,
    cmd: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.cmd.send(Command::Abort(std::mem::take(&mut self.ids)));
        }
    }
}

fn failed(st: &AppState, e: &TgiError) {
    if let (Some(t), Some(label)) = (&st.tgi, e.failure_label()) {
        t.lock().failure(label);
    }
}

/// TGI's `generate_internal` / `generate_stream` up to the engine: counts the request,
/// takes a permit, validates, records the validation metrics and submits.
async fn start(
    st: &Arc<AppState>,
    native: &Native,
    headers: &HeaderMap,
    req: &GenerateRequest,
    handler: &'static str,
    arrival: u64,
) -> Result<(Out, mpsc::UnboundedReceiver<ReqEvent>, AbortGuard, OwnedSemaphorePermit), TgiError> {
    if let Some(t) = &st.tgi {
        t.lock().request_received();
    }
    let r = async {
        let best_of = req.parameters.best_of.unwrap_or(1);
        if handler == "generate_stream" {
            if best_of != 1 {
                return Err(invalid("`best_of` != 1 is not supported when streaming tokens"));
            }
            if req.parameters.decoder_input_details {
                return Err(invalid("`decoder_input_details` == true is not supported when streaming tokens"));
            }
        } else if best_of > 1 {
            validate_best_of(best_of)?;
        }
        let permit = native.permits.clone().try_acquire_owned().map_err(|_| TgiError::Overloaded)?;
        let valid = validate(req, (st.max_model_len.saturating_sub(1).max(1), st.max_model_len))?;
        Ok((permit, valid))
    }
    .await;
    let (permit, valid) = r.inspect_err(|e| failed(st, e))?;
    if let Some(t) = &st.tgi {
        let mut t = t.lock();
        (0..valid.best_of).for_each(|_| t.input_validated(valid.input_length, valid.max_new_tokens));
    }
    let planned = plan(st, headers, valid, handler, arrival);
    let out = Out::new(&planned, st.seed, st.vocab);
    let ids: Vec<RequestId> = planned.subs.iter().map(|s| s.spec.id).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    if st.cmd.send(Command::Submit { subs: planned.subs, events: tx, reply: reply_tx }).is_err() {
        return Err(TgiError::Incomplete);
    }
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(r)) => {
            let e = invalid(match r {
                RejectReason::TooLong => "`inputs` tokens + `max_new_tokens` exceed the model's capacity".to_string(),
                other => other.to_string(),
            });
            failed(st, &e);
            return Err(e);
        }
        Err(_) => return Err(TgiError::Incomplete),
    }
    Ok((out, rx, AbortGuard { ids, cmd: st.cmd.clone(), armed: true }, permit))
}

fn header_value(v: impl ToString) -> HeaderValue {
    HeaderValue::from_str(&v.to_string()).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// `POST /generate` (and `POST /` without `stream`): the whole answer.
async fn whole(st: Arc<AppState>, native: Native, headers: HeaderMap, req: GenerateRequest, list: bool) -> Response {
    let arrival = st.clock.now();
    let chars = req.inputs.chars().count();
    let (mut out, mut rx, mut guard, _permit) = match start(&st, &native, &headers, &req, "generate", arrival).await {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    while out.remaining > 0 {
        match rx.recv().await {
            Some(ReqEvent::Token { choice, index, .. }) => {
                out.push(choice as usize, index);
            }
            Some(ReqEvent::Finished { choice, record }) => {
                if let Some(e) = out.finished(choice as usize, record) {
                    guard.armed = out.remaining > 0;
                    failed(&st, &e);
                    return e.into_response();
                }
            }
            None => {
                let e = TgiError::Incomplete;
                failed(&st, &e);
                return e.into_response();
            }
        }
    }
    guard.armed = false;
    let (resp, best) = out.response();
    let mut r = if list { json_ok(&[resp]) } else { json_ok(&resp) };
    if let Some(rec) = &out.gens[best].record {
        let t = Timings::of(rec, arrival);
        let h = r.headers_mut();
        let ms = |d: Duration| header_value(d.as_millis());
        let pairs = [
            ("x-compute-type", HeaderValue::from_static(COMPUTE_TYPE)),
            ("x-compute-time", header_value(t.total.as_secs_f64())),
            ("x-compute-characters", header_value(chars)),
            ("x-total-time", ms(t.total)),
            ("x-validation-time", ms(t.validation)),
            ("x-queue-time", ms(t.queue)),
            ("x-inference-time", ms(t.inference)),
            ("x-time-per-token", ms(t.time_per_token)),
            ("x-prompt-tokens", header_value(out.valid.input_length)),
            ("x-generated-tokens", header_value(rec.completion_tokens)),
        ];
        for (k, v) in pairs {
            h.insert(HeaderName::from_static(k), v);
        }
    }
    r
}

/// One SSE event as TGI's axum 0.7 writes it: `data:{json}\n\n` (no space after the colon).
pub fn sse_event<T: Serialize>(v: &T) -> Bytes {
    let mut buf = b"data:".to_vec();
    if serde_json::to_writer(&mut buf, v).is_err() {
        buf.truncate(5);
        let e = ErrorResponse {
            error: "Stream event serialization error".into(),
            error_type: "stream_serialization_error",
        };
        let _ = serde_json::to_writer(&mut buf, &e);
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

struct StreamState {
    st: Arc<AppState>,
    out: Option<(Out, mpsc::UnboundedReceiver<ReqEvent>, AbortGuard, OwnedSemaphorePermit)>,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl StreamState {
    fn on_event(&mut self, ev: Option<ReqEvent>) {
        let Some((out, _, guard, _)) = self.out.as_mut() else {
            self.done = true;
            return;
        };
        match ev {
            Some(ReqEvent::Token { index, .. }) => {
                let (token, top_tokens) = out.push(0, index);
                let last = index + 1 >= out.members[0].spec.target_output();
                if !last {
                    self.pending.push_back(sse_event(&StreamResponse {
                        index: index + 1,
                        token,
                        top_tokens,
                        generated_text: None,
                        details: None,
                    }));
                }
                // the last token waits for the engine's Finished (its details need the record)
            }
            Some(ReqEvent::Finished { record, .. }) => {
                if let Some(e) = out.finished(0, record) {
                    guard.armed = false;
                    failed(&self.st, &e);
                    self.pending.push_back(sse_event(&e.body()));
                    self.done = true;
                    return;
                }
                guard.armed = false;
                let g = &out.gens[0];
                let (Some(token), Some(top_tokens)) = (g.tokens.last().cloned(), g.top.last().cloned()) else {
                    let e = TgiError::IncompleteStream;
                    failed(&self.st, &e);
                    self.pending.push_back(sse_event(&e.body()));
                    self.done = true;
                    return;
                };
                let details = out.valid.details.then(|| StreamDetails {
                    finish_reason: out.finish_reason(0),
                    generated_tokens: g.tokens.len() as u32,
                    seed: out.seed(),
                    input_length: out.valid.input_length,
                });
                self.pending.push_back(sse_event(&StreamResponse {
                    index: g.tokens.len() as u32,
                    token,
                    top_tokens: if out.valid.top_n_tokens == 0 { Vec::new() } else { top_tokens },
                    generated_text: Some(out.full_text(0)),
                    details,
                }));
                self.done = true;
            }
            None => {
                let e = TgiError::IncompleteStream;
                failed(&self.st, &e);
                self.pending.push_back(sse_event(&e.body()));
                self.done = true;
            }
        }
    }
}

/// `POST /generate_stream` (and `POST /` with `stream`): SSE, errors included.
async fn streamed(st: Arc<AppState>, native: Native, headers: HeaderMap, req: GenerateRequest) -> Response {
    let arrival = st.clock.now();
    let chars = req.inputs.chars().count();
    let mut state = StreamState { st: st.clone(), out: None, pending: VecDeque::new(), done: false };
    match start(&st, &native, &headers, &req, "generate_stream", arrival).await {
        Ok(x) => state.out = Some(x),
        Err(e) => {
            state.pending.push_back(sse_event(&e.body()));
            state.done = true;
        }
    }
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            let (_, rx, _, _) = s.out.as_mut()?;
            match tokio::time::timeout(KEEP_ALIVE, rx.recv()).await {
                Ok(ev) => s.on_event(ev),
                Err(_) => s.pending.push_back(Bytes::from_static(b":\n\n")),
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(HeaderName::from_static("x-compute-type"), HeaderValue::from_static(COMPUTE_TYPE));
    h.insert(HeaderName::from_static("x-compute-characters"), header_value(chars));
    h.insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    r
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// `POST /generate`.
pub async fn generate(
    State(st): State<Arc<AppState>>,
    Extension(native): Extension<Native>,
    headers: HeaderMap,
    body: Result<Json<GenerateRequest>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(req)) => whole(st, native, headers, req, false).await,
        Err(rejection) => rejection.into_response(),
    }
}

/// `POST /generate_stream`.
pub async fn generate_stream(
    State(st): State<Arc<AppState>>,
    Extension(native): Extension<Native>,
    headers: HeaderMap,
    body: Result<Json<GenerateRequest>, JsonRejection>,
) -> Response {
    match body {
        Ok(Json(req)) => streamed(st, native, headers, req).await,
        Err(rejection) => rejection.into_response(),
    }
}

/// `POST /`: streamed or whole by `stream`; `return_full_text` defaults to true (the model's
/// pipeline tag is `text-generation`).
pub async fn compat_generate(
    State(st): State<Arc<AppState>>,
    Extension(native): Extension<Native>,
    headers: HeaderMap,
    body: Result<Json<CompatGenerateRequest>, JsonRejection>,
) -> Response {
    let Json(mut req) = match body {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    let compat_return_full_text =
        Info::new("", &st.root, st.max_model_len, st.seed).model_pipeline_tag.as_deref() == Some("text-generation");
    req.parameters.return_full_text.get_or_insert(compat_return_full_text);
    let inner = GenerateRequest { inputs: req.inputs, parameters: req.parameters };
    if req.stream { streamed(st, native, headers, inner).await } else { whole(st, native, headers, inner, true).await }
}

/// `POST /tokenize`: the prompt's tokens with byte offsets.
pub async fn tokenize(State(st): State<Arc<AppState>>, body: Result<Json<GenerateRequest>, JsonRejection>) -> Response {
    let req = match body {
        Ok(Json(r)) => r,
        Err(rejection) => return rejection.into_response(),
    };
    let mut toks = tokenize_text(&req.inputs, st.vocab);
    if let Some(t) = req.parameters.truncate
        && t < toks.len()
    {
        toks.drain(..toks.len() - t);
    }
    json_ok(&toks)
}

/// `GET /info` with this router's `--max-concurrent-requests`.
pub async fn info(State(st): State<Arc<AppState>>, Extension(native): Extension<Native>) -> Response {
    let model = st.served.first().map(String::as_str).unwrap_or_default();
    let mut info = Info::new(model, &st.root, st.max_model_len, st.seed);
    info.max_concurrent_requests = native.max_concurrent_requests;
    json_ok(&info)
}

/// `GET /` and `GET /ping`: TGI's health check (200, empty body).
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// How many prompt tokens the simulator counts for `inputs` (BOS included).
pub fn input_tokens(inputs: &str) -> u32 {
    BOS_TOKENS.saturating_add(count_tokens(inputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{Flavor, SimArgs, SimServer};
    use serde_json::{Value, json};

    fn req(v: Value) -> GenerateRequest {
        serde_json::from_value(v).unwrap()
    }

    fn err(v: Value) -> String {
        match validate(&req(v), (8191, 8192)) {
            Err(TgiError::Validation(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tokens_follow_the_simulators_count() {
        for text in ["", "Hello, world!", "internationalization 12345\n\nnext  line", "héllo wörld ", "a\tb", "   "] {
            let spans = token_spans(text);
            assert_eq!(spans.len() as u32, count_tokens(text), "{text:?}: {spans:?}");
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{text:?}: ordered, disjoint");
            assert!(spans.iter().all(|&(a, b)| text.get(a..b).is_some_and(|s| !s.trim_matches(' ').is_empty())));
            assert_eq!(tokenize_text(text, 128_256).len() as u32, input_tokens(text));
        }
        let t = tokenize_text("Hello world", 128_256);
        assert_eq!((t[0].id, t[0].start, t[0].stop, t[0].text.as_str()), (128_000, 0, 0, ""));
        assert_eq!((t[1].text.as_str(), t[1].start, t[1].stop), ("Hello", 0, 5));
        assert_eq!((t[2].text.as_str(), t[2].start, t[2].stop), (" world", 5, 11), "the space joins the word");
        assert_eq!(token_spans("internationalization"), vec![(0, 6), (6, 12), (12, 18), (18, 20)]);
    }

    #[test]
    fn validation_errors_are_tgis() {
        assert_eq!(
            err(json!({"inputs": "x", "parameters": {"temperature": 0.0}})),
            "`temperature` must be strictly positive"
        );
        assert_eq!(err(json!({"inputs": "x", "parameters": {"top_p": 1.0}})), "`top_p` must be > 0.0 and < 1.0");
        assert_eq!(err(json!({"inputs": "x", "parameters": {"top_k": 0}})), "`top_k` must be strictly positive");
        assert_eq!(
            err(json!({"inputs": "x", "parameters": {"max_new_tokens": 0}})),
            "`max_new_tokens` must be strictly positive"
        );
        assert_eq!(err(json!({"inputs": "", "parameters": {}})), "`inputs` cannot be empty");
        assert_eq!(
            err(json!({"inputs": "x", "parameters": {"stop": ["a", "b", "c", "d", "e"]}})),
            "`stop` supports up to 4 stop sequences. Given: 5"
        );
        assert_eq!(
            err(json!({"inputs": "x", "parameters": {"best_of": 2}})),
            "you must use sampling when `best_of` is > 1"
        );
        assert_eq!(
            err(json!({"inputs": "x", "parameters": {"best_of": 2, "do_sample": true, "seed": 1}})),
            "`seed` must not be set when `best_of` > 1"
        );
        let long = validate(&req(json!({"inputs": "hi there", "parameters": {"max_new_tokens": 2000}})), (999, 1000));
        assert_eq!(
            long.err().map(|e| e.to_string()).as_deref(),
            Some(
                "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1000. Given: 3 `inputs` tokens \
                 and 1024 `max_new_tokens`"
            ),
            "validation checks one chunk of at most 1024 tokens"
        );
        // a max_new_tokens above 1024 passes when one chunk fits
        let v = validate(&req(json!({"inputs": "hi", "parameters": {"max_new_tokens": 5000}})), (8191, 8192)).unwrap();
        assert_eq!((v.max_new_tokens, v.max_total_new_tokens), (1024, 5000));
        assert_eq!(
            err(json!({"inputs": "a b c d", "parameters": {"truncate": 9000}})),
            "`truncate` must be strictly positive and less than 8191. Given: 9000"
        );
        let too_long = "word ".repeat(20);
        assert_eq!(
            validate(&req(json!({"inputs": too_long, "parameters": {"max_new_tokens": 1}})), (10, 100)).err(),
            Some(invalid("`inputs` must have less than 10 tokens. Given: 21"))
        );
        // without `parameters`, TGI samples (do_sample defaults to true there only)
        assert!(validate(&req(json!({"inputs": "x"})), (8191, 8192)).unwrap().sampling);
        assert!(!validate(&req(json!({"inputs": "x", "parameters": {}})), (8191, 8192)).unwrap().sampling);
        let e = TgiError::Validation("`top_k` must be strictly positive".into());
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            serde_json::to_value(e.body()).unwrap(),
            json!({"error": "Input validation error: `top_k` must be strictly positive", "error_type": "validation"})
        );
        assert_eq!(TgiError::Overloaded.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(TgiError::Overloaded.body().error, "Model is overloaded");
    }

    async fn server(max_concurrent_requests: u32) -> SimServer {
        // reqwest is built without a default TLS provider; an error means one is installed
        let _ = rustls::crypto::ring::default_provider().install_default();
        let args = SimArgs {
            port: 0,
            served_model_name: vec!["m".into()],
            seed: Some(7),
            flavor: Flavor::Tgi,
            gpu: Some(crate::server::GpuName::Mi300x),
            max_concurrent_requests,
            ..SimArgs::default()
        };
        SimServer::start(args).await.unwrap()
    }

    async fn post(url: String, body: &Value) -> reqwest::Response {
        let http = reqwest::Client::new();
        http.post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap()
    }

    /// Whether `keys` appear in this order in the JSON text (serde_json's `Value` sorts them).
    fn in_order(text: &str, keys: &[&str]) -> bool {
        let pos: Vec<Option<usize>> = keys.iter().map(|k| text.find(&format!("\"{k}\":"))).collect();
        pos.iter().all(Option::is_some) && pos.windows(2).all(|w| w[0] < w[1])
    }

    fn events(body: &str) -> Vec<Value> {
        assert!(body.ends_with("\n\n"), "{body:?}");
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let data = e.strip_prefix("data:").unwrap_or_else(|| panic!("{e:?}"));
                assert!(!data.starts_with(' '), "TGI writes `data:` without a space");
                if data.contains("\"token\":") {
                    assert!(in_order(data, &["index", "token", "generated_text", "details"]), "{data}");
                    assert!(in_order(data, &["id", "text", "logprob", "special"]), "{data}");
                }
                serde_json::from_str(data).unwrap()
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn generate_stream_has_tgis_event_shape() {
        let s = server(128).await;
        let body = json!({"inputs": "Tell me a story", "parameters": {"max_new_tokens": 5, "details": true}});
        let r = post(format!("{}/generate_stream", s.base_url()), &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        assert_eq!(r.headers()["x-accel-buffering"], "no");
        let ev = events(&r.text().await.unwrap());
        assert_eq!(ev.len(), 5, "{ev:?}");
        let mut text = String::new();
        for (i, e) in ev.iter().enumerate() {
            assert_eq!(e.as_object().unwrap().len(), 4, "no top_tokens unless asked: {e}");
            assert_eq!(e["index"], json!(i + 1));
            let t = e["token"].as_object().unwrap();
            assert_eq!(t.len(), 4, "{e}");
            assert_eq!(t["special"], json!(false), "max_new_tokens reached: no EOS");
            text.push_str(t["text"].as_str().unwrap());
            if i < 4 {
                assert_eq!((&e["generated_text"], &e["details"]), (&Value::Null, &Value::Null));
            }
        }
        let last = &ev[4];
        assert_eq!(last["generated_text"], json!(text));
        let input_length = input_tokens("Tell me a story");
        assert_eq!(
            last["details"],
            json!({"finish_reason": "length", "generated_tokens": 5, "seed": null, "input_length": input_length}),
            "greedy (parameters given, no do_sample): no seed"
        );

        // whole: the same tokens, details with the token list; compat route wraps it in a list
        let r = post(format!("{}/generate", s.base_url()), &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-generated-tokens"], "5");
        assert_eq!(r.headers()["x-prompt-tokens"], input_length.to_string().as_str());
        let g: Value = r.text().await.unwrap().parse().unwrap();
        assert_eq!(g["generated_text"], json!(text));
        assert_eq!(g["details"]["tokens"].as_array().unwrap().len(), 5);
        assert_eq!(g["details"]["prefill"], json!([]));
        let r = post(format!("{}/", s.base_url()), &body).await;
        let c: Value = r.text().await.unwrap().parse().unwrap();
        assert_eq!(c[0]["generated_text"], json!(format!("Tell me a story{text}")), "return_full_text by default");

        // best_of: the other sequence in details; decoder_input_details: the prompt's tokens
        let b = json!({"inputs": "Tell me a story", "parameters": {"max_new_tokens": 3, "best_of": 2,
            "do_sample": true, "decoder_input_details": true, "top_n_tokens": 2}});
        let g: Value = post(format!("{}/generate", s.base_url()), &b).await.text().await.unwrap().parse().unwrap();
        let d = &g["details"];
        assert_eq!(d["best_of_sequences"].as_array().map(Vec::len), Some(1), "{g}");
        assert!(d["seed"].is_u64(), "sampling reports its seed: {g}");
        let prefill = d["prefill"].as_array().unwrap();
        assert_eq!(prefill.len() as u32, input_length);
        assert_eq!((&prefill[0]["text"], &prefill[0]["logprob"]), (&json!("<|begin_of_text|>"), &Value::Null));
        assert_eq!(
            d["top_tokens"].as_array().map(|t| t.iter().map(|x| x.as_array().unwrap().len()).collect()),
            Some(vec![2, 2, 2])
        );

        // an EOS ends with a special token that is not in the text
        let long = json!({"inputs": "Tell me a story", "parameters": {"details": true}});
        let g: Value = post(format!("{}/generate", s.base_url()), &long).await.text().await.unwrap().parse().unwrap();
        let toks = g["details"]["tokens"].as_array().unwrap();
        assert_eq!(g["details"]["finish_reason"], "eos_token", "{g}");
        assert_eq!(toks.last().unwrap()["special"], json!(true));
        assert!(toks[..toks.len() - 1].iter().all(|t| t["special"] == json!(false)));
        s.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_are_tgis_and_counted() {
        let s = server(1).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("{}{p}", s.base_url());
        let bad = json!({"inputs": "x", "parameters": {"temperature": 0.0}});
        let r = post(url("/generate"), &bad).await;
        assert_eq!(r.status(), 422);
        let e: Value = r.text().await.unwrap().parse().unwrap();
        assert_eq!(
            e,
            json!({"error": "Input validation error: `temperature` must be strictly positive", "error_type": "validation"})
        );
        // in a stream, an error is an event of a 200 response
        let r = post(url("/generate_stream"), &bad).await;
        assert_eq!(r.status(), 200);
        assert_eq!(events(&r.text().await.unwrap()), vec![e.clone()]);
        let r = post(url("/generate_stream"), &json!({"inputs": "x", "parameters": {"best_of": 2}})).await;
        assert_eq!(
            events(&r.text().await.unwrap())[0]["error"],
            "Input validation error: `best_of` != 1 is not supported when streaming tokens"
        );
        // a body that is not a GenerateRequest: axum's rejection, not counted
        let r = post(url("/generate"), &json!({"prompt": "x"})).await;
        assert_eq!(r.status(), 422);
        // one request in flight: the next is overloaded
        let long = json!({"inputs": "x", "parameters": {"max_new_tokens": 4000}});
        let mut held = post(url("/generate_stream"), &long).await;
        assert!(held.chunk().await.unwrap().is_some(), "the first token arrived");
        let r = post(url("/generate"), &json!({"inputs": "y"})).await;
        assert_eq!(r.status(), 429);
        assert_eq!(
            r.text().await.unwrap().parse::<Value>().unwrap(),
            json!({"error": "Model is overloaded", "error_type": "overloaded"})
        );
        drop(held);
        let info: Value = http.get(url("/info")).send().await.unwrap().text().await.unwrap().parse().unwrap();
        assert_eq!(info["max_concurrent_requests"], 1);
        let m = http.get(url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(m.contains("tgi_request_failure{err=\"validation\"} 3\n"), "{m}");
        assert!(m.contains("tgi_request_failure{err=\"overloaded\"} 1\n"), "{m}");
        assert!(m.contains("tgi_request_count 5\n"), "5 counted: 3 invalid, 1 held, 1 overloaded\n{m}");
        let t: Value =
            post(url("/tokenize"), &json!({"inputs": "Hello world"})).await.text().await.unwrap().parse().unwrap();
        assert_eq!(t[1], json!({"id": t[1]["id"], "text": "Hello", "start": 0, "stop": 5}));
        assert_eq!(t.as_array().unwrap().len(), 3);
        // Ids: numbers, one per piece, the same piece the same id in another request.
        let again: Value =
            post(url("/tokenize"), &json!({"inputs": "Hello"})).await.text().await.unwrap().parse().unwrap();
        assert!(t[1]["id"].as_u64().is_some() && t[1]["id"] == again[1]["id"], "{t} {again}");
        assert_ne!(t[1]["id"], t[2]["id"], "{t}");
        s.shutdown().await;
    }
}
