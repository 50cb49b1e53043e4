//! Planning: a request's parameters validated as vLLM validates them, and its choices laid
//! out as engine requests (with their span metadata and TGI bookkeeping).

use std::sync::atomic::Ordering;

use axum::http::{HeaderMap, StatusCode};

use super::error::ApiError;
use super::media::MAX_IMAGES_PER_PROMPT;
use super::wire::{Common, Content, Message};
use super::{AppState, MAX_CHOICES};
use crate::engine::tokens::{mix64, natural_length};
use crate::engine::{RequestId, RequestSpec};
use crate::server::driver::Submission;
use crate::server::prom::RequestParams;
use crate::server::prompt::{ChatTurn, PreparedPrompt, TurnImage, choice_key, prepare_chat, prepare_chat_with_images};
use crate::server::telemetry::{SpanMeta, TraceParent};
use crate::server::tgi::trace::Handler;
use crate::server::tgi::validation_ns;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// One choice of the response: one engine request.
#[derive(Clone, Debug)]
pub(super) struct ChoicePlan {
    pub(super) prompt: usize,
    pub(super) key: u64,
    pub(super) target: u32,
    pub(super) spec: RequestSpec,
}

/// A validated request.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) kind: Kind,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) prompts: Vec<PreparedPrompt>,
    pub(super) choices: Vec<ChoicePlan>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) continuous_usage: bool,
    /// Top-k log-probabilities per token (`None`: no logprobs).
    pub(super) logprobs: Option<u32>,
    pub(super) seed: u64,
    pub(super) vocab: u32,
    /// `--quality-noise` (0: the undegraded answers).
    pub(super) quality_noise: f64,
}

pub(super) fn int_param(v: Option<i64>, name: &'static str, min: i64, max: i64) -> Result<Option<u32>, ApiError> {
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

pub(super) fn request_id(st: &AppState, headers: &HeaderMap, body_id: Option<&str>, prefix: &str) -> String {
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

pub(super) fn parent(headers: &HeaderMap) -> Option<TraceParent> {
    let tp = headers.get("traceparent")?.to_str().ok()?;
    let ts = headers.get("tracestate").and_then(|v| v.to_str().ok());
    TraceParent::parse(tp, ts)
}

impl AppState {
    pub(super) fn check_model(&self, model: Option<&str>) -> Result<String, ApiError> {
        match model {
            None | Some("") => Ok(self.served.first().cloned().unwrap_or_default()),
            // TGI ignores `model` (huggingface_hub sends "dummy"): it answers as its model id
            Some(_) if self.tgi.is_some() => Ok(self.served.first().cloned().unwrap_or_default()),
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
    pub(super) fn plan(
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
    pub(super) fn plan_choices(
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
                            parameters: None,
                        },
                    },
                    params: RequestParams { n, max_tokens: max, stream },
                });
                choices.push(ChoicePlan { prompt: pi, key, target: spec.target_output(), spec });
            }
        }
        let group = subs.first().map_or(0, |s| s.spec.id);
        subs.iter_mut().for_each(|s| s.meta.handler.group = group);
        let plan = Plan {
            kind,
            id,
            created: crate::server::telemetry::unix_nanos_now() / 1_000_000_000,
            model,
            prompts,
            choices,
            stream,
            include_usage: so.and_then(|s| s.include_usage).unwrap_or(false),
            continuous_usage: so.and_then(|s| s.continuous_usage_stats).unwrap_or(false),
            logprobs,
            seed: self.seed,
            vocab: self.vocab,
            quality_noise: self.quality_noise,
        };
        Ok((plan, subs))
    }
}

/// The image URLs of a conversation: (message index, URL), in order.
pub(super) type ImageRefs<'a> = Vec<(usize, &'a str)>;

/// The text of each message and the image URLs it carries.
pub(super) fn chat_turns(messages: &[Message]) -> Result<(Vec<ChatTurn>, ImageRefs<'_>), ApiError> {
    if messages.is_empty() {
        return Err(ApiError { param: Some("messages"), ..ApiError::bad_request("messages must not be empty") });
    }
    let mut out = Vec::with_capacity(messages.len());
    let mut images = Vec::new();
    for (mi, m) in messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text, &p.image_url) {
                        ("text", Some(t), _) => s.push_str(t),
                        ("text", None, _) => {
                            return Err(ApiError::bad_request("a content part of type \"text\" needs \"text\""));
                        }
                        ("image_url", _, Some(u)) => images.push((mi, u.url.as_str())),
                        ("image_url", _, None) => {
                            return Err(ApiError::bad_request(
                                "a content part of type \"image_url\" needs \"image_url\": {\"url\": ...}",
                            ));
                        }
                        (other, _, _) => {
                            return Err(ApiError::bad_request(format!(
                                "content parts of type {other:?} are not supported by this model (text and image_url only)"
                            )));
                        }
                    }
                }
                s
            }
        };
        out.push(ChatTurn { role: m.role.clone(), content });
    }
    Ok((out, images))
}

impl AppState {
    /// The prompt of a chat request: its messages, and its images loaded (concurrently),
    /// checked and charged to the prompt by the Qwen2-VL rule (`media`); every image passes
    /// through the multi-modal processor cache (`vllm:mm_cache_*`). A bad image is a 400
    /// naming the message, the part and the reason, as vLLM answers.
    pub(super) async fn chat_prompt(&self, messages: &[Message]) -> Result<PreparedPrompt, ApiError> {
        let (turns, urls) = chat_turns(messages)?;
        if urls.is_empty() {
            return Ok(prepare_chat(&turns));
        }
        if urls.len() > MAX_IMAGES_PER_PROMPT {
            return Err(ApiError::bad_request(format!(
                "At most {MAX_IMAGES_PER_PROMPT} image(s) may be provided in one prompt, got {}.",
                urls.len()
            )));
        }
        let loaded = futures::future::join_all(urls.iter().map(|(_, u)| self.media.load(u))).await;
        let mut ok = Vec::with_capacity(loaded.len());
        for (n, ((turn, _), r)) in urls.iter().zip(loaded).enumerate() {
            match r {
                Ok(img) => ok.push(img),
                Err(e) => {
                    return Err(ApiError::bad_request(format!(
                        "Failed to load image {} (in message {turn}): {e}",
                        n + 1
                    )));
                }
            }
        }
        let (queries, hits) = self.media.process(&ok);
        {
            let mut p = self.prom.lock();
            p.mm_cache_queries += queries;
            p.mm_cache_hits += hits;
        }
        let images: Vec<TurnImage> = urls
            .iter()
            .zip(&ok)
            .map(|((turn, _), img)| TurnImage { turn: *turn, hash: img.info.hash, tokens: img.tokens })
            .collect();
        Ok(prepare_chat_with_images(&turns, &images))
    }
}
