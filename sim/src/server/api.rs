//! The OpenAI-compatible API as vLLM serves it: `/v1/chat/completions` and `/v1/completions`
//! (streamed as SSE `data: {json}\n\n` chunks ending with `data: [DONE]\n\n`, or whole),
//! `/v1/models`, with vLLM's response shapes, usage accounting, logprobs and errors.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::driver::{Clock, Command, ReqEvent, Submission};
use super::prom::{PromState, RequestParams};
use super::prompt::{ChatTurn, PreparedPrompt, choice_key, prepare_chat, prepare_ids, prepare_text};
use super::telemetry::{SpanMeta, TraceParent};
use super::tgi::TgiMetrics;
use super::tgi::trace::Handler;
use super::tgi::validation_ns;
use crate::engine::tokens::{self, mix64, natural_length};
use crate::engine::{FinishReason, RejectReason, RequestId, RequestSpec};

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
    /// Median natural output length in tokens (where the model "emits EOS").
    pub median_output_tokens: f64,
    /// Server start, Unix seconds (`created` of the model card).
    pub started_unix_s: u64,
    /// Next engine request id.
    pub next_id: AtomicU64,
}

/// An OpenAI-style error response: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The parameter at fault, if known.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// 400 BadRequestError.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorInfo {
                message: &self.message,
                kind: self.kind(),
                param: self.param,
                code: self.status.as_u16(),
            },
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The error.
    pub error: ErrorInfo<'a>,
}

/// The fields of an OpenAI-style error.
#[derive(Debug, Serialize)]
pub struct ErrorInfo<'a> {
    /// Human-readable message.
    pub message: &'a str,
    /// `BadRequestError`, `NotFoundError`, ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The parameter at fault.
    pub param: Option<&'static str>,
    /// The HTTP status.
    pub code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = self.status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

fn unavailable() -> ApiError {
    ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "the engine is shutting down".into(), param: None }
}

/// Parses a JSON body into `T`, mapping every failure to a 400 that names the problem.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

// ---------------------------------------------------------------------------------------
// requests

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// Sampling parameters common to both endpoints.
#[derive(Debug, Default, Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    min_tokens: Option<i64>,
    #[serde(default)]
    request_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<Message>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<i64>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: PromptInput,
    #[serde(default = "default_completion_max_tokens")]
    max_tokens: Option<i64>,
    #[serde(default)]
    logprobs: Option<i64>,
    #[serde(flatten)]
    common: Common,
}

fn default_completion_max_tokens() -> Option<i64> {
    Some(16)
}

// ---------------------------------------------------------------------------------------
// planning

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// One choice of the response: one engine request.
#[derive(Clone, Debug)]
struct ChoicePlan {
    prompt: usize,
    key: u64,
    target: u32,
    spec: RequestSpec,
}

/// A validated request.
#[derive(Debug)]
struct Plan {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompts: Vec<PreparedPrompt>,
    choices: Vec<ChoicePlan>,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// Top-k log-probabilities per token (`None`: no logprobs).
    logprobs: Option<u32>,
    seed: u64,
    vocab: u32,
}

fn int_param(v: Option<i64>, name: &'static str, min: i64, max: i64) -> Result<Option<u32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x < min => Err(ApiError {
            param: Some(name),
            ..ApiError::bad_request(format!("{name} must be at least {min}, got {x}."))
        }),
        Some(x) if x > max => Err(ApiError {
            param: Some(name),
            ..ApiError::bad_request(format!("{name} must be at most {max}, got {x}."))
        }),
        Some(x) => Ok(Some(u32::try_from(x).unwrap_or(u32::MAX))),
    }
}

fn request_id(st: &AppState, headers: &HeaderMap, body_id: Option<&str>, prefix: &str) -> String {
    let given = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .or(body_id)
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= 256 && s.chars().all(|c| c.is_ascii_graphic()));
    match given {
        Some(s) => format!("{prefix}-{s}"),
        None => {
            let n = st.next_id.fetch_add(1, Ordering::Relaxed);
            let a = mix64(st.seed ^ mix64(n) ^ st.started_unix_s.rotate_left(32));
            let b = mix64(a ^ u64::from(rand::random::<u32>()));
            format!("{prefix}-{a:016x}{b:016x}")
        }
    }
}

fn parent(headers: &HeaderMap) -> Option<TraceParent> {
    let tp = headers.get("traceparent")?.to_str().ok()?;
    let ts = headers.get("tracestate").and_then(|v| v.to_str().ok());
    TraceParent::parse(tp, ts)
}

impl AppState {
    fn check_model(&self, model: Option<&str>) -> Result<String, ApiError> {
        match model {
            None | Some("") => Ok(self.served.first().cloned().unwrap_or_default()),
            Some(m) if self.served.iter().any(|s| s == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("The model `{m}` does not exist."),
                param: Some("model"),
            }),
        }
    }

    /// Validates the common parameters and lays out the choices; in the TGI flavour, records
    /// the request and its validation as TGI's handlers do.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        kind: Kind,
        headers: &HeaderMap,
        c: &Common,
        prompts: Vec<PreparedPrompt>,
        max_tokens: Option<i64>,
        logprobs: Option<u32>,
        arrival: u64,
    ) -> Result<(Plan, Vec<Submission>), ApiError> {
        let planned = self.plan_choices(kind, headers, c, prompts, max_tokens, logprobs, arrival);
        if let Some(t) = &self.tgi {
            let mut t = t.lock();
            t.request_received();
            match &planned {
                Ok((_, subs)) => subs.iter().for_each(|s| t.validated(s.spec.prompt_tokens, s.spec.max_tokens)),
                Err(_) => t.validation_failed(),
            }
        }
        planned
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_choices(
        &self,
        kind: Kind,
        headers: &HeaderMap,
        c: &Common,
        prompts: Vec<PreparedPrompt>,
        max_tokens: Option<i64>,
        logprobs: Option<u32>,
        arrival: u64,
    ) -> Result<(Plan, Vec<Submission>), ApiError> {
        let model = self.check_model(c.model.as_deref())?;
        let n = int_param(c.n, "n", 1, MAX_CHOICES as i64)?.unwrap_or(1);
        let temperature = c.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError {
                param: Some("temperature"),
                ..ApiError::bad_request(format!("temperature must be non-negative, got {temperature}."))
            });
        }
        let top_p = c.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError {
                param: Some("top_p"),
                ..ApiError::bad_request(format!("top_p must be in (0, 1], got {top_p}."))
            });
        }
        let user_max = int_param(max_tokens, "max_tokens", 1, i64::from(u32::MAX))?;
        let min_tokens = int_param(c.min_tokens, "min_tokens", 0, i64::from(u32::MAX))?.unwrap_or(0);
        if let Some(m) = user_max
            && min_tokens > m
        {
            return Err(ApiError {
                param: Some("min_tokens"),
                ..ApiError::bad_request(format!(
                    "min_tokens must be less than or equal to max_tokens={m}, got {min_tokens}."
                ))
            });
        }
        let stream = c.stream.unwrap_or(false);
        let so = c.stream_options.as_ref();
        if so.is_some() && !stream {
            return Err(ApiError {
                param: Some("stream_options"),
                ..ApiError::bad_request("Stream options can only be defined when `stream=True`.")
            });
        }
        if prompts.is_empty() {
            return Err(ApiError { param: Some("prompt"), ..ApiError::bad_request("the prompt must not be empty") });
        }
        if prompts.len() * n as usize > MAX_CHOICES {
            return Err(ApiError {
                param: Some("n"),
                ..ApiError::bad_request(format!("at most {MAX_CHOICES} choices (prompts × n) per request"))
            });
        }
        let (what, prefix, handler) = match kind {
            Kind::Chat => ("messages", "chatcmpl", "chat_completions"),
            Kind::Completion => ("prompt", "cmpl", "completions"),
        };
        let len = self.max_model_len;
        let id = request_id(self, headers, c.request_id.as_deref(), prefix);
        let trace = parent(headers);
        let mut choices = Vec::new();
        let mut subs = Vec::new();
        let total = prompts.len() * n as usize;
        for (pi, p) in prompts.iter().enumerate() {
            if p.tokens == 0 {
                return Err(ApiError {
                    param: Some("prompt"),
                    ..ApiError::bad_request("the prompt must not be empty")
                });
            }
            if p.tokens >= len {
                return Err(ApiError::bad_request(format!(
                    "This model's maximum context length is {len} tokens. However, your request has {} input \
                     tokens. Please reduce the length of the input {what}.",
                    p.tokens
                )));
            }
            let max = match user_max {
                Some(m) if u64::from(p.tokens) + u64::from(m) > u64::from(len) => {
                    return Err(ApiError {
                        param: Some("max_tokens"),
                        ..ApiError::bad_request(format!(
                            "This model's maximum context length is {len} tokens. However, you requested {} \
                             tokens ({} in the {what}, {m} in the completion). Please reduce the length of the \
                             {what} or completion.",
                            u64::from(p.tokens) + u64::from(m),
                            p.tokens
                        ))
                    });
                }
                Some(m) => m,
                None => len - p.tokens,
            };
            for i in 0..n {
                let key = choice_key(p.key, i, c.seed);
                let stop_after = if c.ignore_eos.unwrap_or(false) {
                    None
                } else {
                    Some(natural_length(self.seed, key, self.median_output_tokens, max).max(min_tokens).min(max))
                };
                let engine_id: RequestId = self.next_id.fetch_add(1, Ordering::Relaxed);
                let spec = RequestSpec {
                    id: engine_id,
                    arrival: if self.tgi.is_some() { arrival + validation_ns(p.tokens) } else { arrival },
                    prompt_tokens: p.tokens,
                    max_tokens: max,
                    stop_after,
                    prefix: p.prefix,
                };
                let choice = choices.len() as u32;
                let sub_id = if total > 1 { format!("{choice}_{id}") } else { id.clone() };
                subs.push(Submission {
                    spec: spec.clone(),
                    choice,
                    meta: SpanMeta {
                        request_id: sub_id,
                        max_tokens: max,
                        temperature,
                        top_p,
                        n,
                        parent: trace.clone(),
                        handler: Handler {
                            name: handler,
                            group: 0,
                            members: total as u32,
                            seed: (temperature != 0.0)
                                .then(|| c.seed.map_or_else(|| mix64(key ^ self.seed), |s| s as u64)),
                            arrival,
                        },
                    },
                    params: RequestParams { n, max_tokens: max },
                });
                choices.push(ChoicePlan { prompt: pi, key, target: spec.target_output(), spec });
            }
        }
        let group = subs.first().map_or(0, |s| s.spec.id);
        subs.iter_mut().for_each(|s| s.meta.handler.group = group);
        let plan = Plan {
            kind,
            id,
            created: super::telemetry::unix_nanos_now() / 1_000_000_000,
            model,
            prompts,
            choices,
            stream,
            include_usage: so.and_then(|s| s.include_usage).unwrap_or(false),
            continuous_usage: so.and_then(|s| s.continuous_usage_stats).unwrap_or(false),
            logprobs,
            seed: self.seed,
            vocab: self.vocab,
        };
        Ok((plan, subs))
    }
}

fn chat_turns(messages: &[Message]) -> Result<Vec<ChatTurn>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError { param: Some("messages"), ..ApiError::bad_request("messages must not be empty") });
    }
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::bad_request("a content part of type \"text\" needs \"text\""));
                        }
                        (other, _) => {
                            return Err(ApiError::bad_request(format!(
                                "content parts of type {other:?} are not supported by this model (text only)"
                            )));
                        }
                    }
                }
                s
            }
        };
        out.push(ChatTurn { role: m.role.clone(), content });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// handlers

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrival = st.clock.now();
    let r: Result<ChatRequest, ApiError> = parse_body(&body);
    let planned = r.and_then(|req| {
        let turns = chat_turns(&req.messages)?;
        let logprobs = if req.logprobs.unwrap_or(false) {
            Some(int_param(req.top_logprobs, "top_logprobs", 0, i64::from(MAX_LOGPROBS))?.unwrap_or(0))
        } else if req.top_logprobs.is_some_and(|k| k > 0) {
            return Err(ApiError {
                param: Some("top_logprobs"),
                ..ApiError::bad_request("when using `top_logprobs`, `logprobs` must be set to true.")
            });
        } else {
            None
        };
        let max = req.max_completion_tokens.or(req.max_tokens);
        st.plan(Kind::Chat, &headers, &req.common, vec![prepare_chat(&turns)], max, logprobs, arrival)
    });
    respond(st, planned).await
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrival = st.clock.now();
    let r: Result<CompletionRequest, ApiError> = parse_body(&body);
    let planned = r.and_then(|req| {
        let prompts = match &req.prompt {
            PromptInput::Text(t) => vec![prepare_text(t)],
            PromptInput::Texts(ts) => ts.iter().map(|t| prepare_text(t)).collect(),
            PromptInput::Ids(ids) => vec![prepare_ids(ids)],
            PromptInput::IdLists(l) => l.iter().map(|ids| prepare_ids(ids)).collect(),
        };
        let logprobs = int_param(req.logprobs, "logprobs", 0, i64::from(MAX_LOGPROBS))?;
        st.plan(Kind::Completion, &headers, &req.common, prompts, req.max_tokens, logprobs, arrival)
    });
    respond(st, planned).await
}

/// Sends an abort for requests whose handler went away before they finished.
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

async fn respond(st: Arc<AppState>, planned: Result<(Plan, Vec<Submission>), ApiError>) -> Response {
    let (plan, subs) = match planned {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let ids: Vec<RequestId> = subs.iter().map(|s| s.spec.id).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    if st.cmd.send(Command::Submit { subs, events: tx, reply: reply_tx }).is_err() {
        return unavailable().into_response();
    }
    let rejected = |st: &AppState| {
        if let Some(t) = &st.tgi {
            t.lock().failure("validation");
        }
    };
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(RejectReason::TooLong)) => {
            rejected(&st);
            return ApiError::bad_request("the request exceeds the model's maximum context length").into_response();
        }
        Ok(Err(r)) => {
            rejected(&st);
            return ApiError::bad_request(format!("the engine refused the request: {r:?}")).into_response();
        }
        Err(_) => return unavailable().into_response(),
    }
    let guard = AbortGuard { ids, cmd: st.cmd.clone(), armed: true };
    let out = Output::new(plan);
    if out.plan.stream { stream_response(out, rx, guard) } else { whole_response(out, rx, guard).await }
}

// ---------------------------------------------------------------------------------------
// output (typed, so that keys come out in vLLM's (pydantic's) field order)

/// Top log-probabilities of one completions token: a JSON object in rank order.
struct TopMap(Vec<(String, f64)>);

impl Serialize for TopMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct CompletionLogprobs {
    text_offset: Vec<usize>,
    token_logprobs: Vec<f64>,
    tokens: Vec<String>,
    top_logprobs: Vec<TopMap>,
}

#[derive(Serialize)]
struct TopLogprob {
    token: String,
    logprob: f64,
    bytes: Vec<u8>,
}

#[derive(Serialize)]
struct ChatLogprob {
    token: String,
    logprob: f64,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize)]
struct ChatLogprobs {
    content: Vec<ChatLogprob>,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u32,
    total_tokens: u32,
    completion_tokens: u32,
    /// Present (as null) in whole responses, absent in stream chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<Value>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatChunkChoice<'a> {
    index: usize,
    delta: Delta<'a>,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'static str>,
    /// Only on the last chunk of a choice (as null).
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Value>,
}

#[derive(Serialize)]
struct CompletionChunkChoice<'a> {
    index: usize,
    text: &'a str,
    logprobs: Option<CompletionLogprobs>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<Value>,
}

/// A stream chunk; chat chunks omit unset `usage`, completion chunks show it as null.
#[derive(Serialize)]
struct Chunk<'a, C: Serialize> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "UsageField::skip")]
    usage: UsageField,
}

enum UsageField {
    Absent,
    Null,
    Some(Usage),
}

impl UsageField {
    fn skip(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}

impl Serialize for UsageField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UsageField::Some(u) => u.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<Value>,
    annotations: Option<Value>,
    audio: Option<Value>,
    function_call: Option<Value>,
    tool_calls: Vec<Value>,
    reasoning_content: Option<Value>,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: usize,
    message: ChatMessage<'a>,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<Value>,
}

#[derive(Serialize)]
struct ChatResponse<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChatChoice<'a>>,
    service_tier: Option<Value>,
    system_fingerprint: Option<Value>,
    usage: Usage,
    prompt_logprobs: Option<Value>,
    kv_transfer_params: Option<Value>,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: usize,
    text: &'a str,
    logprobs: Option<CompletionLogprobs>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<Value>,
    prompt_logprobs: Option<Value>,
}

#[derive(Serialize)]
struct CompletionResponse<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<CompletionChoice<'a>>,
    service_tier: Option<Value>,
    system_fingerprint: Option<Value>,
    usage: Usage,
    kv_transfer_params: Option<Value>,
}

/// One generated token with its log-probabilities.
struct Tok {
    text: String,
    logprob: f64,
    top: Vec<tokens::SyntheticToken>,
}

struct ChoiceOut {
    text: String,
    tokens: u32,
    logprobs: Vec<Tok>,
    finish: Option<FinishReason>,
    started: bool,
}

struct Output {
    plan: Plan,
    choices: Vec<ChoiceOut>,
    remaining: usize,
}

fn chat_logprob(t: &Tok, k: u32) -> ChatLogprob {
    ChatLogprob {
        token: t.text.clone(),
        logprob: t.logprob,
        bytes: t.text.as_bytes().to_vec(),
        top_logprobs: t
            .top
            .iter()
            .take(k as usize)
            .map(|x| TopLogprob { token: x.text.clone(), logprob: x.logprob, bytes: x.text.as_bytes().to_vec() })
            .collect(),
    }
}

fn completion_logprobs(toks: &[&Tok], k: u32, offset: usize) -> CompletionLogprobs {
    let mut off = offset;
    let mut text_offset = Vec::with_capacity(toks.len());
    for t in toks {
        text_offset.push(off);
        off += t.text.chars().count();
    }
    let top_logprobs = toks
        .iter()
        .map(|t| {
            let mut m: Vec<(String, f64)> = Vec::new();
            for x in t.top.iter().take(k.max(1) as usize) {
                if !m.iter().any(|(s, _)| *s == x.text) {
                    m.push((x.text.clone(), x.logprob));
                }
            }
            TopMap(m)
        })
        .collect();
    CompletionLogprobs {
        text_offset,
        token_logprobs: toks.iter().map(|t| t.logprob).collect(),
        tokens: toks.iter().map(|t| t.text.clone()).collect(),
        top_logprobs,
    }
}

impl Output {
    fn new(plan: Plan) -> Self {
        let choices = plan
            .choices
            .iter()
            .map(|_| ChoiceOut { text: String::new(), tokens: 0, logprobs: Vec::new(), finish: None, started: false })
            .collect();
        let remaining = plan.choices.len();
        Output { plan, choices, remaining }
    }

    fn token(&self, choice: usize, index: u32) -> Tok {
        let key = self.plan.choices[choice].key;
        let t = tokens::token(self.plan.seed, key, index, self.plan.vocab);
        let top = match self.plan.logprobs {
            Some(k) => tokens::top_logprobs(self.plan.seed, key, index, k.max(1), self.plan.vocab),
            None => Vec::new(),
        };
        Tok { text: t.text, logprob: t.logprob, top }
    }

    /// The finish reason the engine will report with the token at `index` (if it is the last).
    fn finish_at(&self, choice: usize, index: u32) -> Option<FinishReason> {
        let c = &self.plan.choices[choice];
        if index + 1 < c.target {
            return None;
        }
        Some(if c.spec.stop_after.is_some_and(|n| n < c.spec.max_tokens) {
            FinishReason::Stop
        } else {
            FinishReason::Length
        })
    }

    fn usage(&self, details: bool) -> Usage {
        let p: u32 = self.plan.prompts.iter().map(|p| p.tokens).sum();
        let c: u32 = self.choices.iter().map(|c| c.tokens).sum();
        Usage {
            prompt_tokens: p,
            total_tokens: p + c,
            completion_tokens: c,
            prompt_tokens_details: details.then_some(Value::Null),
        }
    }

    fn choice_usage(&self, choice: usize) -> UsageField {
        if !self.plan.continuous_usage {
            return match self.plan.kind {
                Kind::Chat => UsageField::Absent,
                Kind::Completion => UsageField::Null,
            };
        }
        let p = self.plan.prompts[self.plan.choices[choice].prompt].tokens;
        let c = self.choices[choice].tokens;
        UsageField::Some(Usage {
            prompt_tokens: p,
            total_tokens: p + c,
            completion_tokens: c,
            prompt_tokens_details: None,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.plan.kind, chunk) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn chunk<C: Serialize>(&self, choices: Vec<C>, usage: UsageField) -> Bytes {
        sse(&Chunk {
            id: &self.plan.id,
            object: self.object(true),
            created: self.plan.created,
            model: &self.plan.model,
            choices,
            usage,
        })
    }

    fn whole(&self) -> Result<Vec<u8>, serde_json::Error> {
        let k = self.plan.logprobs;
        let fr = |c: &ChoiceOut| c.finish.map(FinishReason::as_str);
        match self.plan.kind {
            Kind::Chat => serde_json::to_vec(&ChatResponse {
                id: &self.plan.id,
                object: self.object(false),
                created: self.plan.created,
                model: &self.plan.model,
                choices: self
                    .choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| ChatChoice {
                        index,
                        message: ChatMessage {
                            role: "assistant",
                            content: &c.text,
                            refusal: None,
                            annotations: None,
                            audio: None,
                            function_call: None,
                            tool_calls: Vec::new(),
                            reasoning_content: None,
                        },
                        logprobs: k
                            .map(|k| ChatLogprobs { content: c.logprobs.iter().map(|t| chat_logprob(t, k)).collect() }),
                        finish_reason: fr(c),
                        stop_reason: None,
                    })
                    .collect(),
                service_tier: None,
                system_fingerprint: None,
                usage: self.usage(true),
                prompt_logprobs: None,
                kv_transfer_params: None,
            }),
            Kind::Completion => serde_json::to_vec(&CompletionResponse {
                id: &self.plan.id,
                object: self.object(false),
                created: self.plan.created,
                model: &self.plan.model,
                choices: self
                    .choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| CompletionChoice {
                        index,
                        text: &c.text,
                        logprobs: k.map(|k| completion_logprobs(&c.logprobs.iter().collect::<Vec<_>>(), k, 0)),
                        finish_reason: fr(c),
                        stop_reason: None,
                        prompt_logprobs: None,
                    })
                    .collect(),
                service_tier: None,
                system_fingerprint: None,
                usage: self.usage(true),
                kv_transfer_params: None,
            }),
        }
    }

    /// SSE chunks for one token of one choice.
    fn token_chunks(&mut self, choice: usize, index: u32, out: &mut VecDeque<Bytes>) {
        let tok = self.token(choice, index);
        let finish = self.finish_at(choice, index).map(FinishReason::as_str);
        let first = !self.choices[choice].started;
        self.choices[choice].started = true;
        if first && self.plan.kind == Kind::Chat {
            let c = ChatChunkChoice {
                index: choice,
                delta: Delta { role: Some("assistant"), content: "" },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            };
            out.push_back(self.chunk(vec![c], self.choice_usage(choice)));
        }
        let offset = self.choices[choice].text.chars().count();
        let c = &mut self.choices[choice];
        c.text.push_str(&tok.text);
        c.tokens += 1;
        let k = self.plan.logprobs;
        let usage = self.choice_usage(choice);
        let stop_reason = finish.map(|_| Value::Null);
        let bytes = match self.plan.kind {
            Kind::Chat => self.chunk(
                vec![ChatChunkChoice {
                    index: choice,
                    delta: Delta { role: None, content: &tok.text },
                    logprobs: k.map(|k| ChatLogprobs { content: vec![chat_logprob(&tok, k)] }),
                    finish_reason: finish,
                    stop_reason,
                }],
                usage,
            ),
            Kind::Completion => self.chunk(
                vec![CompletionChunkChoice {
                    index: choice,
                    text: &tok.text,
                    logprobs: k.map(|k| completion_logprobs(&[&tok], k, offset)),
                    finish_reason: finish,
                    stop_reason: None,
                }],
                usage,
            ),
        };
        out.push_back(bytes);
    }

    /// The final usage chunk (`choices: []`).
    fn usage_chunk(&self) -> Bytes {
        self.chunk::<Value>(Vec::new(), UsageField::Some(self.usage(false)))
    }

    /// Records a finished choice; returns the error when it did not end normally.
    fn finished(&mut self, choice: usize, reason: FinishReason) -> Option<ApiError> {
        let c = &mut self.choices[choice];
        if c.finish.is_some() {
            return None;
        }
        c.finish = Some(reason);
        self.remaining = self.remaining.saturating_sub(1);
        match reason {
            FinishReason::Stop | FinishReason::Length => None,
            FinishReason::Abort => Some(unavailable()),
            FinishReason::Error => Some(engine_error()),
        }
    }
}

fn engine_error() -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: "the engine failed the request (the KV cache could not hold it)".into(),
        param: None,
    }
}

/// One SSE event: `data: {json}\n\n`.
fn sse<T: Serialize>(v: &T) -> Bytes {
    let mut buf = b"data: ".to_vec();
    if serde_json::to_writer(&mut buf, v).is_err() {
        buf.truncate(6);
        buf.extend_from_slice(br#"{"error": {"message": "cannot serialise the chunk", "type": "InternalServerError", "param": null, "code": 500}}"#);
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

async fn whole_response(mut out: Output, mut rx: mpsc::UnboundedReceiver<ReqEvent>, mut guard: AbortGuard) -> Response {
    while out.remaining > 0 {
        match rx.recv().await {
            Some(ReqEvent::Token { choice, index, .. }) => {
                let choice = choice as usize;
                let tok = out.token(choice, index);
                let c = &mut out.choices[choice];
                c.text.push_str(&tok.text);
                c.tokens += 1;
                if out.plan.logprobs.is_some() {
                    c.logprobs.push(tok);
                }
            }
            Some(ReqEvent::Finished { choice, record }) => {
                if let Some(err) = out.finished(choice as usize, record.finish_reason) {
                    guard.armed = out.remaining > 0;
                    return err.into_response();
                }
            }
            None => return unavailable().into_response(),
        }
    }
    guard.armed = false;
    match out.whole() {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("cannot serialise the response: {e}"),
            param: None,
        }
        .into_response(),
    }
}

struct StreamState {
    out: Output,
    rx: mpsc::UnboundedReceiver<ReqEvent>,
    guard: AbortGuard,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl StreamState {
    fn on_event(&mut self, ev: Option<ReqEvent>) {
        match ev {
            Some(ReqEvent::Token { choice, index, .. }) => {
                self.out.token_chunks(choice as usize, index, &mut self.pending)
            }
            Some(ReqEvent::Finished { choice, record }) => {
                if let Some(err) = self.out.finished(choice as usize, record.finish_reason) {
                    self.pending.push_back(sse(&err.body()));
                    self.end();
                } else if self.out.remaining == 0 {
                    if self.out.plan.include_usage {
                        self.pending.push_back(self.out.usage_chunk());
                    }
                    self.end();
                }
            }
            None => {
                self.pending.push_back(sse(&unavailable().body()));
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.guard.armed = self.out.remaining > 0;
        self.done = true;
    }
}

fn stream_response(out: Output, rx: mpsc::UnboundedReceiver<ReqEvent>, guard: AbortGuard) -> Response {
    let state = StreamState { out, rx, guard, pending: VecDeque::new(), done: false };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            let ev = s.rx.recv().await;
            s.on_event(ev);
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[derive(Serialize)]
struct ModelPermission {
    id: String,
    object: &'static str,
    created: u64,
    allow_create_engine: bool,
    allow_sampling: bool,
    allow_logprobs: bool,
    allow_search_indices: bool,
    allow_view: bool,
    allow_fine_tuning: bool,
    organization: &'static str,
    group: Option<Value>,
    is_blocking: bool,
}

#[derive(Serialize)]
struct ModelCard<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: &'a str,
    parent: Option<Value>,
    max_model_len: u32,
    permission: Vec<ModelPermission>,
}

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelCard<'a>>,
}

/// A 200 response with `v` as JSON (keys in field order).
pub fn json_ok<T: Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("cannot serialise the response: {e}"),
            param: None,
        }
        .into_response(),
    }
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data = st
        .served
        .iter()
        .map(|name| ModelCard {
            id: name,
            object: "model",
            created: st.started_unix_s,
            owned_by: "vllm",
            root: &st.root,
            parent: None,
            max_model_len: st.max_model_len,
            permission: vec![ModelPermission {
                id: format!("modelperm-{:016x}", mix64(st.seed ^ tokens::prompt_key(name))),
                object: "model_permission",
                created: st.started_unix_s,
                allow_create_engine: false,
                allow_sampling: true,
                allow_logprobs: true,
                allow_search_indices: false,
                allow_view: true,
                allow_fine_tuning: false,
                organization: "*",
                group: None,
                is_blocking: false,
            }],
        })
        .collect();
    json_ok(&ModelList { object: "list", data })
}
