//! The OpenAI-compatible HTTP client: request bodies for `/v1/chat/completions` and
//! `/v1/completions`, the SSE parser, and per-request timing (TTFT, ITL, e2e).
//!
//! Works with vLLM, TGI's Messages API and other OpenAI-compatible servers: `usage` may be
//! absent, the first chunk may carry only the role, content deltas may be empty, reasoning
//! models stream `reasoning_content`, and `data:` may come with or without a space.

use crate::quality::{Rci, RciValue, RciWeights, Reference};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// Which OpenAI API to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `/v1/chat/completions` with `messages`.
    #[default]
    Chat,
    /// `/v1/completions` with `prompt`.
    Completions,
}

impl Api {
    /// The `gen_ai.operation.name` of a call.
    pub fn operation(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "text_completion",
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with the given role and text.
    pub fn new(role: &str, content: impl Into<String>) -> Message {
        Message { role: role.to_string(), content: content.into() }
    }
}

/// What a request asks: a bare prompt or a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A single user prompt.
    Text(String),
    /// A whole conversation.
    Messages(Vec<Message>),
}

impl Prompt {
    /// The conversation as chat messages.
    pub fn to_messages(&self) -> Cow<'_, [Message]> {
        match self {
            Prompt::Text(t) => Cow::Owned(vec![Message::new("user", t.clone())]),
            Prompt::Messages(m) => Cow::Borrowed(m),
        }
    }

    /// The prompt as one string (a conversation is rendered as a transcript).
    pub fn to_text(&self) -> Cow<'_, str> {
        match self {
            Prompt::Text(t) => Cow::Borrowed(t),
            Prompt::Messages(m) if m.len() == 1 && m[0].role == "user" => Cow::Borrowed(&m[0].content),
            Prompt::Messages(m) => {
                let mut s = String::new();
                for x in m {
                    s.push_str(&x.role);
                    s.push_str(": ");
                    s.push_str(&x.content);
                    s.push('\n');
                }
                s.push_str("assistant:");
                Cow::Owned(s)
            }
        }
    }

    /// Characters of text in the prompt.
    pub fn char_len(&self) -> usize {
        match self {
            Prompt::Text(t) => t.len(),
            Prompt::Messages(m) => m.iter().map(|x| x.content.len()).sum(),
        }
    }
}

/// A rough token count where the server reports none (4 characters a token).
pub fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

/// Settings shared by every request of a run.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL (`http://host:8000`, `.../v1`, or the full path of the API).
    pub endpoint: String,
    /// Which API.
    pub api: Api,
    /// `model` sent in every request.
    pub model: String,
    /// Ask for a streamed answer.
    pub stream: bool,
    /// Send `stream_options.include_usage` when streaming.
    pub stream_usage: bool,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Accept any TLS certificate.
    pub insecure: bool,
    /// `temperature`, when set.
    pub temperature: Option<f64>,
    /// `ignore_eos` (vLLM extension), when true.
    pub ignore_eos: bool,
    /// Top-K log-probabilities to ask for.
    pub logprobs: Option<u32>,
    /// Idle connections kept per host.
    pub pool_size: usize,
}

/// The URL of the API call for a base endpoint.
pub fn api_url(endpoint: &str, api: Api) -> String {
    let e = endpoint.trim_end_matches('/');
    if e.ends_with("/chat/completions") || e.ends_with("/completions") {
        return e.to_string();
    }
    let path = match api {
        Api::Chat => "chat/completions",
        Api::Completions => "completions",
    };
    if e.ends_with("/v1") { format!("{e}/{path}") } else { format!("{e}/v1/{path}") }
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No complete answer within the deadline.
    Timeout,
    /// The connection could not be made.
    Connect,
    /// An HTTP error status.
    Http(u16),
    /// The server reported an error inside the stream.
    Stream,
    /// A response that is not the expected JSON.
    Decode,
    /// The stream ended without `[DONE]` or a finish reason.
    Incomplete,
    /// The connection broke while reading.
    Transport,
    /// Stopped by the user (not counted as an error).
    Cancelled,
}

impl ErrorKind {
    /// The name used in reports and as `error.type`.
    pub fn name(self) -> Cow<'static, str> {
        match self {
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Connect => "connect".into(),
            ErrorKind::Http(s) => format!("http_{s}").into(),
            ErrorKind::Stream => "stream_error".into(),
            ErrorKind::Decode => "decode".into(),
            ErrorKind::Incomplete => "incomplete".into(),
            ErrorKind::Transport => "transport".into(),
            ErrorKind::Cancelled => "cancelled".into(),
        }
    }
}

/// A failed request: the kind and what the server or transport said.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Details (truncated).
    pub message: String,
}

/// What one request did, measured on the client.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// When the request was sent.
    pub start: Instant,
    /// The same moment on the wall clock.
    pub start_wall: SystemTime,
    /// Time to the first output token (streaming only).
    pub ttft: Option<Duration>,
    /// Gaps between successive chunks that carried output.
    pub itl: Vec<Duration>,
    /// Time to the end of the answer.
    pub e2e: Duration,
    /// Prompt tokens (from `usage`, else estimated).
    pub input_tokens: u64,
    /// Output tokens (from `usage`, else counted from the stream or estimated).
    pub output_tokens: u64,
    /// Whether the server reported `usage`.
    pub usage_reported: bool,
    /// The answer text (kept only when asked for).
    pub text: String,
    /// The finish reason of the first choice.
    pub finish_reason: Option<String>,
    /// `id` of the response.
    pub response_id: Option<String>,
    /// `model` of the response.
    pub response_model: Option<String>,
    /// Top-K log-probabilities of the first output token.
    pub first_top_logprobs: Option<Vec<f64>>,
    /// RCI against the reference, when one was given.
    pub rci: Option<RciValue>,
    /// Set when the request failed.
    pub error: Option<RequestError>,
}

impl Outcome {
    fn new(start: Instant, start_wall: SystemTime) -> Outcome {
        Outcome {
            start,
            start_wall,
            ttft: None,
            itl: Vec::new(),
            e2e: Duration::ZERO,
            input_tokens: 0,
            output_tokens: 0,
            usage_reported: false,
            text: String::new(),
            finish_reason: None,
            response_id: None,
            response_model: None,
            first_top_logprobs: None,
            rci: None,
            error: None,
        }
    }

    /// Time per output token after the first: (e2e − ttft) / (output tokens − 1).
    pub fn tpot(&self) -> Option<Duration> {
        let ttft = self.ttft?;
        if self.output_tokens < 2 || self.error.is_some() {
            return None;
        }
        Some(self.e2e.saturating_sub(ttft) / (self.output_tokens - 1).min(u32::MAX as u64) as u32)
    }

    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct RequestSpec<'a> {
    /// The prompt or conversation.
    pub prompt: &'a Prompt,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Keep the answer text in the outcome.
    pub keep_text: bool,
    /// Reference answer for RCI.
    pub reference: Option<Arc<Reference>>,
    /// RCI weights.
    pub rci_weights: RciWeights,
    /// W3C `traceparent` to send.
    pub traceparent: Option<String>,
    /// Deadline of the whole request.
    pub timeout: Duration,
}

/// An HTTP client for one endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    parsed: reqwest::Url,
    cfg: Arc<ClientConfig>,
    auth: Option<String>,
}

/// Installs rustls' ring provider once (reqwest is built without a default provider).
pub fn install_crypto_provider() {
    // An error only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A message as sent, borrowing the prompt's text.
#[derive(Serialize)]
struct MessageRef<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<Vec<MessageRef<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<StreamChoice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct StreamChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Full {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Vec<FullChoice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct FullChoice {
    #[serde(default)]
    message: Option<FullMessage>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct FullMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

/// Top-K logprobs of the first token in a choice's `logprobs` (chat or completions shape),
/// and the number of tokens the chunk's logprobs describe.
fn first_logprobs(lp: &serde_json::Value) -> (Option<Vec<f64>>, Option<usize>) {
    use serde_json::Value;
    // Chat: {"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}
    if let Some(Value::Array(content)) = lp.get("content") {
        let top = content
            .first()
            .and_then(|t| t.get("top_logprobs"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.get("logprob").and_then(Value::as_f64)).collect::<Vec<_>>());
        return (top, Some(content.len()));
    }
    // Completions: {"tokens": [...], "top_logprobs": [{"tok": lp, ...}, ...]}
    let n = lp.get("tokens").and_then(Value::as_array).map(Vec::len);
    let top = lp
        .get("top_logprobs")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_f64).collect::<Vec<_>>());
    (top, n)
}

/// Server-sent events, split from a byte stream: calls back with each event's `data`.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser with nothing buffered.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds bytes; `on_event` gets the data of every complete event. Returns false on a
    /// line that is not UTF-8.
    pub fn feed(&mut self, bytes: &[u8], on_event: &mut dyn FnMut(&str)) -> bool {
        let mut ok = true;
        let mut rest: &[u8] = bytes;
        if !self.buf.is_empty() {
            // Complete the buffered partial line first.
            match rest.iter().position(|&b| b == b'\n') {
                None => {
                    self.buf.extend_from_slice(rest);
                    return true;
                }
                Some(i) => {
                    let mut line = std::mem::take(&mut self.buf);
                    line.extend_from_slice(&rest[..i]);
                    ok &= self.line(&line, on_event);
                    rest = &rest[i + 1..];
                }
            }
        }
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = (&rest[..i], &rest[i + 1..]);
            // Fast path for the usual shape, one `data:` line and a blank line in the same
            // read: hand the slice over without copying it.
            if !self.has_data
                && let Some(v) = data_value(line)
            {
                let blank = match after {
                    [b'\n', ..] => Some(1),
                    [b'\r', b'\n', ..] => Some(2),
                    _ => None,
                };
                if let Some(n) = blank {
                    match std::str::from_utf8(v) {
                        Ok(v) => on_event(v),
                        Err(_) => ok = false,
                    }
                    rest = &after[n..];
                    continue;
                }
            }
            ok &= self.line(line, on_event);
            rest = after;
        }
        self.buf.extend_from_slice(rest);
        ok
    }

    /// Ends the stream: dispatches an event that lacked its closing blank line.
    pub fn finish(&mut self, on_event: &mut dyn FnMut(&str)) -> bool {
        let mut ok = true;
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            ok = self.line(&line, on_event);
        }
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
        ok
    }

    fn line(&mut self, line: &[u8], on_event: &mut dyn FnMut(&str)) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
                self.data.clear();
                self.has_data = false;
            }
            return true;
        }
        if line[0] == b':' {
            return true; // comment / keep-alive
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field != b"data" {
            return true; // event:, id:, retry: are not used by these APIs
        }
        let Ok(v) = std::str::from_utf8(value) else { return false };
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(v);
        self.has_data = true;
        true
    }
}

/// The value of a `data:` line (`data: x` or `data:x`, CR stripped).
fn data_value(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let v = line.strip_prefix(b"data:")?;
    Some(v.strip_prefix(b" ").unwrap_or(v))
}

/// Per-request state while the stream is read.
struct StreamState {
    start: Instant,
    last: Option<Instant>,
    keep_text: bool,
    want_logprobs: bool,
    rci: Option<Rci>,
    done: bool,
    streamed_tokens: u64,
    usage: Option<Usage>,
    error: Option<RequestError>,
}

impl StreamState {
    fn event(&mut self, data: &str, now: Instant, out: &mut Outcome) {
        if self.error.is_some() || self.done {
            return;
        }
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        if data.is_empty() {
            return;
        }
        let chunk: Chunk<'_> = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(e) => {
                self.error = Some(RequestError { kind: ErrorKind::Decode, message: format!("bad chunk: {e}") });
                return;
            }
        };
        if let Some(err) = chunk.error {
            let msg = err.get("message").and_then(|m| m.as_str()).map_or_else(|| err.to_string(), str::to_string);
            self.error = Some(RequestError { kind: ErrorKind::Stream, message: truncate(&msg) });
            return;
        }
        if out.response_id.is_none() {
            out.response_id = chunk.id.filter(|s| !s.is_empty()).map(Cow::into_owned);
        }
        if out.response_model.is_none() {
            out.response_model = chunk.model.map(Cow::into_owned);
        }
        if let Some(u) = chunk.usage
            && (u.prompt_tokens.is_some() || u.completion_tokens.is_some())
        {
            self.usage = Some(u);
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index != 0 {
                continue;
            }
            let (content, reasoning) = match choice.delta {
                Some(d) => (d.content, d.reasoning_content.or(d.reasoning)),
                None => (choice.text, None),
            };
            let content = content.unwrap_or_default();
            let reasoning = reasoning.unwrap_or_default();
            let (top, lp_tokens) = match &choice.logprobs {
                Some(lp) if !lp.is_null() => first_logprobs(lp),
                _ => (None, None),
            };
            let tokens = match lp_tokens {
                Some(n) => n as u64,
                None => u64::from(!content.is_empty() || !reasoning.is_empty()),
            };
            if tokens > 0 {
                match self.last {
                    None => out.ttft = Some(now - self.start),
                    Some(prev) => out.itl.push(now - prev),
                }
                self.last = Some(now);
                self.streamed_tokens += tokens;
                if self.want_logprobs && out.first_top_logprobs.is_none() {
                    out.first_top_logprobs = top;
                }
            }
            if !content.is_empty() {
                if let Some(r) = &mut self.rci {
                    r.push(&content);
                }
                if self.keep_text {
                    out.text.push_str(&content);
                }
            }
            if let Some(f) = choice.finish_reason {
                out.finish_reason = Some(f.into_owned());
            }
        }
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn transport_error(e: &reqwest::Error) -> RequestError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() {
        ErrorKind::Connect
    } else if e.is_decode() {
        ErrorKind::Decode
    } else {
        ErrorKind::Transport
    };
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    RequestError { kind, message: truncate(&msg) }
}

impl Client {
    /// Builds the client (no connection is made yet).
    pub fn new(cfg: ClientConfig) -> Result<Client, String> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(cfg.pool_size.max(1))
            .pool_idle_timeout(Duration::from_secs(60))
            .tls_danger_accept_invalid_certs(cfg.insecure)
            .user_agent(concat!("inferwatch-bench/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let url = api_url(&cfg.endpoint, cfg.api);
        let parsed = reqwest::Url::parse(&url).map_err(|e| format!("invalid --endpoint {:?}: {e}", cfg.endpoint))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("invalid --endpoint {:?}: the scheme must be http or https", cfg.endpoint));
        }
        let auth = cfg.api_key.as_ref().filter(|k| !k.is_empty()).map(|k| format!("Bearer {k}"));
        Ok(Client { http, url, parsed, cfg: Arc::new(cfg), auth })
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The JSON body of a request.
    pub fn body(&self, spec: &RequestSpec<'_>) -> Vec<u8> {
        let c = &self.cfg;
        let text;
        let (m, p) = match c.api {
            Api::Chat => {
                let m = match spec.prompt {
                    Prompt::Text(t) => vec![MessageRef { role: "user", content: t }],
                    Prompt::Messages(m) => {
                        m.iter().map(|x| MessageRef { role: &x.role, content: &x.content }).collect()
                    }
                };
                (Some(m), None)
            }
            Api::Completions => {
                text = spec.prompt.to_text();
                (None, Some(&text[..]))
            }
        };
        let (logprobs, top_logprobs) = match (c.logprobs, c.api) {
            (None, _) => (None, None),
            (Some(k), Api::Chat) => (Some(serde_json::Value::Bool(true)), Some(k)),
            (Some(k), Api::Completions) => (Some(serde_json::Value::from(k)), None),
        };
        let body = Body {
            model: &c.model,
            messages: m,
            prompt: p,
            max_tokens: spec.max_tokens,
            stream: c.stream,
            stream_options: (c.stream && c.stream_usage).then_some(StreamOptions { include_usage: true }),
            temperature: c.temperature,
            logprobs,
            top_logprobs,
            ignore_eos: c.ignore_eos.then_some(true),
        };
        // Serialising plain structs and strings cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Sends one request and measures it. Never fails: errors are in the outcome.
    pub async fn execute(&self, spec: &RequestSpec<'_>, cancel: &CancellationToken) -> Outcome {
        let body = self.body(spec);
        let start_wall = SystemTime::now();
        let start = Instant::now();
        let mut out = Outcome::new(start, start_wall);
        let run = self.run(spec, body, start, &mut out);
        let err = tokio::select! {
            r = tokio::time::timeout(spec.timeout, run) => match r {
                Ok(r) => r.err(),
                Err(_) => Some(RequestError {
                    kind: ErrorKind::Timeout,
                    message: format!("no complete answer within {:?}", spec.timeout),
                }),
            },
            _ = cancel.cancelled() => Some(RequestError { kind: ErrorKind::Cancelled, message: "stopped".into() }),
        };
        if out.e2e.is_zero() {
            out.e2e = start.elapsed();
        }
        if out.input_tokens == 0 && !out.usage_reported {
            out.input_tokens = estimate_tokens(spec.prompt.char_len());
        }
        out.error = err;
        out
    }

    async fn run(
        &self,
        spec: &RequestSpec<'_>,
        body: Vec<u8>,
        start: Instant,
        out: &mut Outcome,
    ) -> Result<(), RequestError> {
        let mut req =
            self.http.post(self.parsed.clone()).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        if self.cfg.stream {
            req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        if let Some(a) = &self.auth {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(tp) = &spec.traceparent {
            req = req.header("traceparent", tp);
        }
        let mut resp = req.send().await.map_err(|e| transport_error(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(RequestError { kind: ErrorKind::Http(status.as_u16()), message: truncate(text.trim()) });
        }
        let is_sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !self.cfg.stream || !is_sse {
            let bytes = resp.bytes().await.map_err(|e| transport_error(&e))?;
            out.e2e = start.elapsed();
            return self.full(spec, &bytes, out);
        }
        let mut st = StreamState {
            start,
            last: None,
            keep_text: spec.keep_text,
            want_logprobs: self.cfg.logprobs.is_some(),
            rci: spec.reference.clone().map(Rci::new),
            done: false,
            streamed_tokens: 0,
            usage: None,
            error: None,
        };
        let mut sse = SseParser::new();
        loop {
            let chunk = resp.chunk().await.map_err(|e| transport_error(&e))?;
            let now = Instant::now();
            let ok = match &chunk {
                Some(b) => sse.feed(b, &mut |d| st.event(d, now, out)),
                None => sse.finish(&mut |d| st.event(d, now, out)),
            };
            if !ok && st.error.is_none() {
                st.error = Some(RequestError { kind: ErrorKind::Decode, message: "the stream is not UTF-8".into() });
            }
            if let Some(e) = st.error.take() {
                out.e2e = now - start;
                return Err(e);
            }
            if chunk.is_none() || st.done {
                out.e2e = now - start;
                if chunk.is_some() {
                    // Read the end of the body (it follows [DONE] at once) so that the
                    // connection goes back to the pool instead of being closed: at once when
                    // it is there already, else in the background.
                    use futures::FutureExt;
                    let ended = loop {
                        match resp.chunk().now_or_never() {
                            Some(Ok(Some(_))) => continue,
                            Some(_) => break true,
                            None => break false,
                        }
                    };
                    if !ended {
                        tokio::spawn(async move {
                            let drain = async { while let Ok(Some(_)) = resp.chunk().await {} };
                            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                        });
                    }
                }
                break;
            }
        }
        match st.usage {
            Some(u) => {
                out.usage_reported = true;
                out.input_tokens = u.prompt_tokens.unwrap_or(0);
                out.output_tokens = u.completion_tokens.unwrap_or(st.streamed_tokens);
            }
            None => out.output_tokens = st.streamed_tokens,
        }
        if let Some(r) = st.rci {
            out.rci = Some(r.finish(spec.rci_weights));
        }
        if !st.done && out.finish_reason.is_none() {
            return Err(RequestError {
                kind: ErrorKind::Incomplete,
                message: "the stream ended without [DONE] or a finish reason".into(),
            });
        }
        Ok(())
    }

    fn full(&self, spec: &RequestSpec<'_>, bytes: &[u8], out: &mut Outcome) -> Result<(), RequestError> {
        let full: Full = serde_json::from_slice(bytes).map_err(|e| {
            // An error object in a 200 response.
            let msg = serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()
                .and_then(|v| v.get("error").map(|e| e.to_string()))
                .unwrap_or_else(|| format!("bad response: {e}"));
            RequestError { kind: ErrorKind::Decode, message: truncate(&msg) }
        })?;
        out.response_id = full.id;
        out.response_model = full.model;
        let text = match full.choices.into_iter().next() {
            Some(c) => {
                out.finish_reason = c.finish_reason;
                if self.cfg.logprobs.is_some() {
                    out.first_top_logprobs = c.logprobs.as_ref().and_then(|lp| first_logprobs(lp).0);
                }
                let reasoning = c.message.as_ref().and_then(|m| m.reasoning_content.clone()).unwrap_or_default();
                let text = c.message.and_then(|m| m.content).or(c.text).unwrap_or_default();
                (text, reasoning)
            }
            None => (String::new(), String::new()),
        };
        match full.usage {
            Some(u) if u.completion_tokens.is_some() => {
                out.usage_reported = true;
                out.input_tokens = u.prompt_tokens.unwrap_or(0);
                out.output_tokens = u.completion_tokens.unwrap_or(0);
            }
            _ => out.output_tokens = estimate_tokens(text.0.len() + text.1.len()),
        }
        if let Some(r) = &spec.reference {
            let mut rci = Rci::new(r.clone());
            rci.push(&text.0);
            out.rci = Some(rci.finish(spec.rci_weights));
        }
        if spec.keep_text {
            out.text = text.0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for b in pieces {
            assert!(p.feed(b, &mut |d| out.push(d.to_string())));
        }
        assert!(p.finish(&mut |d| out.push(d.to_string())));
        out
    }

    #[test]
    fn sse_vllm_style() {
        let s = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(events(&[s]), vec!["{\"a\":1}", "{\"a\":2}", "[DONE]"]);
    }

    #[test]
    fn sse_split_anywhere_crlf_comments_no_space() {
        let s: &[u8] = b": ping\r\n\r\ndata:{\"a\":1}\r\n\r\nevent: message\r\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]";
        for cut in 0..s.len() {
            let (a, b) = s.split_at(cut);
            assert_eq!(events(&[a, b]), vec!["{\"a\":1}", "x\ny", "[DONE]"], "cut at {cut}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = s.chunks(1).collect();
        assert_eq!(events(&bytes), vec!["{\"a\":1}", "x\ny", "[DONE]"]);
    }

    #[test]
    fn urls() {
        assert_eq!(api_url("http://h:8000", Api::Chat), "http://h:8000/v1/chat/completions");
        assert_eq!(api_url("http://h:8000/", Api::Completions), "http://h:8000/v1/completions");
        assert_eq!(api_url("http://h/v1", Api::Chat), "http://h/v1/chat/completions");
        assert_eq!(api_url("http://h/x/v1/completions", Api::Chat), "http://h/x/v1/completions");
    }

    #[test]
    fn logprobs_shapes() {
        let chat = serde_json::json!({"content": [{"token": "a", "logprob": -0.1,
            "top_logprobs": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -2.3}]}]});
        assert_eq!(first_logprobs(&chat), (Some(vec![-0.1, -2.3]), Some(1)));
        let cmpl = serde_json::json!({"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
            "top_logprobs": [{"a": -0.1, "b": -2.3}, {"b": -0.2}]});
        let (top, n) = first_logprobs(&cmpl);
        assert_eq!(n, Some(2));
        let mut top = top.unwrap();
        top.sort_by(f64::total_cmp);
        assert_eq!(top, vec![-2.3, -0.1]);
    }

    #[test]
    fn transcript() {
        let p = Prompt::Messages(vec![Message::new("user", "hi"), Message::new("assistant", "hello")]);
        assert_eq!(p.to_text(), "user: hi\nassistant: hello\nassistant:");
        assert_eq!(Prompt::Text("x".into()).to_messages()[0], Message::new("user", "x"));
    }
}
