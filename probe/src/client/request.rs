//! What a request asks: the API, the prompt or conversation, run-wide settings and the
//! per-request specification.

use crate::quality::{RciWeights, Reference};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// Which OpenAI API to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `/v1/chat/completions` with `messages`.
    #[default]
    Chat,
    /// `/v1/completions` with `prompt`.
    Completions,
    /// TGI's own API: `/generate_stream` (or `/generate` without streaming) with `inputs`.
    Tgi,
}

impl Api {
    /// The `gen_ai.operation.name` of a call.
    pub fn operation(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions | Api::Tgi => "text_completion",
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
        Api::Tgi => return super::tgi::url(e, true),
    };
    if e.ends_with("/v1") { format!("{e}/{path}") } else { format!("{e}/v1/{path}") }
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
    /// Extra body fields merged over the request's own (plug-in hooks), when any.
    pub params: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// Keep every chunk that carried output in `Outcome::tokens` (plug-in hooks).
    pub record_tokens: bool,
    /// Image URLs (`data:` or http) sent as `image_url` parts of the last user message,
    /// before its text (chat API only; `--images-per-request`).
    pub images: &'a [String],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(api_url("http://h:8000", Api::Chat), "http://h:8000/v1/chat/completions");
        assert_eq!(api_url("http://h:8000/", Api::Completions), "http://h:8000/v1/completions");
        assert_eq!(api_url("http://h/v1", Api::Chat), "http://h/v1/chat/completions");
        assert_eq!(api_url("http://h/x/v1/completions", Api::Chat), "http://h/x/v1/completions");
    }

    #[test]
    fn transcript() {
        let p = Prompt::Messages(vec![Message::new("user", "hi"), Message::new("assistant", "hello")]);
        assert_eq!(p.to_text(), "user: hi\nassistant: hello\nassistant:");
        assert_eq!(Prompt::Text("x".into()).to_messages()[0], Message::new("user", "x"));
    }
}
