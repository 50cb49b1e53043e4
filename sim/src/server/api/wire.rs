//! The JSON shapes of the API: request bodies as read, and responses, stream chunks and model
//! cards as written (typed, so that keys come out in vLLM's (pydantic's) field order).

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Default, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: Option<bool>,
    #[serde(default)]
    pub(super) continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content: `{"type": "text", "text"}` or
/// `{"type": "image_url", "image_url": {"url", "detail"}}` (other types are refused).
#[derive(Debug, Deserialize)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) image_url: Option<ImageUrl>,
}

/// The `image_url` of an image part: a `data:` URL (base64) or an http(s) URL. OpenAI's
/// `detail` is ignored, as vLLM ignores it.
#[derive(Debug, Deserialize)]
pub(super) struct ImageUrl {
    pub(super) url: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct Message {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Option<Content>,
}

/// Sampling parameters common to both endpoints.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Common {
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) temperature: Option<f64>,
    #[serde(default)]
    pub(super) top_p: Option<f64>,
    #[serde(default)]
    pub(super) n: Option<i64>,
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default)]
    pub(super) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(super) seed: Option<i64>,
    #[serde(default)]
    pub(super) ignore_eos: Option<bool>,
    #[serde(default)]
    pub(super) min_tokens: Option<i64>,
    #[serde(default)]
    pub(super) request_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ChatRequest {
    pub(super) messages: Vec<Message>,
    #[serde(default)]
    pub(super) max_tokens: Option<i64>,
    #[serde(default)]
    pub(super) max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub(super) logprobs: Option<bool>,
    #[serde(default)]
    pub(super) top_logprobs: Option<i64>,
    #[serde(flatten)]
    pub(super) common: Common,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
pub(super) struct CompletionRequest {
    pub(super) prompt: PromptInput,
    #[serde(default = "default_completion_max_tokens")]
    pub(super) max_tokens: Option<i64>,
    #[serde(default)]
    pub(super) logprobs: Option<i64>,
    #[serde(flatten)]
    pub(super) common: Common,
}

pub(super) fn default_completion_max_tokens() -> Option<i64> {
    Some(16)
}

/// Top log-probabilities of one completions token: a JSON object in rank order.
pub(super) struct TopMap(pub(super) Vec<(String, f64)>);

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
pub(super) struct CompletionLogprobs {
    pub(super) text_offset: Vec<usize>,
    pub(super) token_logprobs: Vec<f64>,
    pub(super) tokens: Vec<String>,
    pub(super) top_logprobs: Vec<TopMap>,
}

#[derive(Serialize)]
pub(super) struct TopLogprob {
    pub(super) token: String,
    pub(super) logprob: f64,
    pub(super) bytes: Vec<u8>,
}

#[derive(Serialize)]
pub(super) struct ChatLogprob {
    pub(super) token: String,
    pub(super) logprob: f64,
    pub(super) bytes: Vec<u8>,
    pub(super) top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize)]
pub(super) struct ChatLogprobs {
    pub(super) content: Vec<ChatLogprob>,
}

#[derive(Serialize)]
pub(super) struct Usage {
    pub(super) prompt_tokens: u32,
    pub(super) total_tokens: u32,
    pub(super) completion_tokens: u32,
    /// Present (as null) in whole responses, absent in stream chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prompt_tokens_details: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<&'static str>,
    pub(super) content: &'a str,
}

#[derive(Serialize)]
pub(super) struct ChatChunkChoice<'a> {
    pub(super) index: usize,
    pub(super) delta: Delta<'a>,
    pub(super) logprobs: Option<ChatLogprobs>,
    pub(super) finish_reason: Option<&'static str>,
    /// Only on the last chunk of a choice (as null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stop_reason: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct CompletionChunkChoice<'a> {
    pub(super) index: usize,
    pub(super) text: &'a str,
    pub(super) logprobs: Option<CompletionLogprobs>,
    pub(super) finish_reason: Option<&'static str>,
    pub(super) stop_reason: Option<Value>,
}

/// A stream chunk; chat chunks omit unset `usage`, completion chunks show it as null.
#[derive(Serialize)]
pub(super) struct Chunk<'a, C: Serialize> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) model: &'a str,
    pub(super) choices: Vec<C>,
    #[serde(skip_serializing_if = "UsageField::skip")]
    pub(super) usage: UsageField,
}

pub(super) enum UsageField {
    Absent,
    Null,
    Some(Usage),
}

impl UsageField {
    pub(super) fn skip(&self) -> bool {
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
pub(super) struct ChatMessage<'a> {
    pub(super) role: &'static str,
    pub(super) content: &'a str,
    pub(super) refusal: Option<Value>,
    pub(super) annotations: Option<Value>,
    pub(super) audio: Option<Value>,
    pub(super) function_call: Option<Value>,
    pub(super) tool_calls: Vec<Value>,
    pub(super) reasoning_content: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct ChatChoice<'a> {
    pub(super) index: usize,
    pub(super) message: ChatMessage<'a>,
    pub(super) logprobs: Option<ChatLogprobs>,
    pub(super) finish_reason: Option<&'static str>,
    pub(super) stop_reason: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct ChatResponse<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) model: &'a str,
    pub(super) choices: Vec<ChatChoice<'a>>,
    pub(super) service_tier: Option<Value>,
    pub(super) system_fingerprint: Option<Value>,
    pub(super) usage: Usage,
    pub(super) prompt_logprobs: Option<Value>,
    pub(super) kv_transfer_params: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct CompletionChoice<'a> {
    pub(super) index: usize,
    pub(super) text: &'a str,
    pub(super) logprobs: Option<CompletionLogprobs>,
    pub(super) finish_reason: Option<&'static str>,
    pub(super) stop_reason: Option<Value>,
    pub(super) prompt_logprobs: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct CompletionResponse<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) model: &'a str,
    pub(super) choices: Vec<CompletionChoice<'a>>,
    pub(super) service_tier: Option<Value>,
    pub(super) system_fingerprint: Option<Value>,
    pub(super) usage: Usage,
    pub(super) kv_transfer_params: Option<Value>,
}

#[derive(Serialize)]
pub(super) struct ModelPermission {
    pub(super) id: String,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) allow_create_engine: bool,
    pub(super) allow_sampling: bool,
    pub(super) allow_logprobs: bool,
    pub(super) allow_search_indices: bool,
    pub(super) allow_view: bool,
    pub(super) allow_fine_tuning: bool,
    pub(super) organization: &'static str,
    pub(super) group: Option<Value>,
    pub(super) is_blocking: bool,
}

#[derive(Serialize)]
pub(super) struct ModelCard<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) owned_by: &'static str,
    pub(super) root: &'a str,
    pub(super) parent: Option<Value>,
    pub(super) max_model_len: u32,
    pub(super) permission: Vec<ModelPermission>,
}

#[derive(Serialize)]
pub(super) struct ModelList<'a> {
    pub(super) object: &'static str,
    pub(super) data: Vec<ModelCard<'a>>,
}
