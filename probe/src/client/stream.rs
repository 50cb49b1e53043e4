//! Per-request state while a streamed answer is read: TTFT, ITL, tokens, usage and errors.

use super::outcome::{ErrorKind, Outcome, RequestError, truncate};
use super::wire::{Chunk, Usage, first_logprobs};
use crate::quality::Rci;
use std::borrow::Cow;
use std::time::Instant;

/// Per-request state while the stream is read.
pub(super) struct StreamState {
    pub(super) start: Instant,
    pub(super) last: Option<Instant>,
    pub(super) keep_text: bool,
    pub(super) record_tokens: bool,
    pub(super) want_logprobs: bool,
    pub(super) rci: Option<Rci>,
    pub(super) done: bool,
    pub(super) streamed_tokens: u64,
    pub(super) usage: Option<Usage>,
    pub(super) error: Option<RequestError>,
}

impl StreamState {
    pub(super) fn event(&mut self, data: &str, now: Instant, out: &mut Outcome) {
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
                if self.record_tokens {
                    out.tokens.push(super::outcome::TokenEvent {
                        at: now - self.start,
                        text: content.to_string(),
                        reasoning: reasoning.to_string(),
                        tokens,
                    });
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
