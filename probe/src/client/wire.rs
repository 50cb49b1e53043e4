//! The JSON bodies: the request sent, and the streamed chunks and whole responses received
//! (borrowing from the buffer where they can).

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A message as sent, borrowing the prompt's text.
#[derive(Serialize)]
pub(super) struct MessageRef<'a> {
    pub(super) role: &'a str,
    pub(super) content: ContentRef<'a>,
}

/// A message's content: plain text, or OpenAI content parts (images, then the text).
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum ContentRef<'a> {
    Text(&'a str),
    Parts(Vec<PartRef<'a>>),
}

/// One content part: `{"type": "text", "text"}` or `{"type": "image_url", "image_url": {"url"}}`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum PartRef<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: UrlRef<'a> },
}

#[derive(Serialize)]
pub(super) struct UrlRef<'a> {
    pub(super) url: &'a str,
}

#[derive(Serialize)]
pub(super) struct Body<'a> {
    pub(super) model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) messages: Option<Vec<MessageRef<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prompt: Option<&'a str>,
    pub(super) max_tokens: u32,
    pub(super) stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) logprobs: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) top_logprobs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ignore_eos: Option<bool>,
}

#[derive(Serialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: bool,
}

#[derive(Deserialize, Default)]
pub(super) struct Usage {
    #[serde(default)]
    pub(super) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(super) completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct Chunk<'a> {
    #[serde(default, borrow)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) choices: Option<Vec<StreamChoice<'a>>>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
    #[serde(default)]
    pub(super) error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
pub(super) struct StreamChoice<'a> {
    #[serde(default)]
    pub(super) index: u32,
    #[serde(default, borrow)]
    pub(super) delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) logprobs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(default, borrow)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(super) struct Full {
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) choices: Vec<FullChoice>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
}

#[derive(Deserialize)]
pub(super) struct FullChoice {
    #[serde(default)]
    pub(super) message: Option<FullMessage>,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
    #[serde(default)]
    pub(super) logprobs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
pub(super) struct FullMessage {
    #[serde(default)]
    pub(super) content: Option<String>,
    #[serde(default)]
    pub(super) reasoning_content: Option<String>,
}

/// Top-K logprobs of the first token in a choice's `logprobs` (chat or completions shape),
/// and the number of tokens the chunk's logprobs describe.
pub(super) fn first_logprobs(lp: &serde_json::Value) -> (Option<Vec<f64>>, Option<usize>) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
