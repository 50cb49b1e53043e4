//! Output assembly: the synthetic tokens of each choice, their logprobs, usage, finish
//! reasons, and the whole response or the stream chunks built from them.

use std::collections::VecDeque;

use axum::body::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::error::{ApiError, engine_error, unavailable};
use super::plan::{Kind, Plan};
use super::sse::sse;
use super::wire::{
    ChatChoice, ChatChunkChoice, ChatLogprob, ChatLogprobs, ChatMessage, ChatResponse, Chunk, CompletionChoice,
    CompletionChunkChoice, CompletionLogprobs, CompletionResponse, Delta, TopLogprob, TopMap, Usage, UsageField,
};
use crate::engine::FinishReason;
use crate::engine::tokens;

/// One generated token with its log-probabilities.
pub(super) struct Tok {
    pub(super) text: String,
    pub(super) logprob: f64,
    pub(super) top: Vec<tokens::SyntheticToken>,
}

pub(super) struct ChoiceOut {
    pub(super) text: String,
    pub(super) tokens: u32,
    pub(super) logprobs: Vec<Tok>,
    pub(super) finish: Option<FinishReason>,
    pub(super) started: bool,
}

pub(super) struct Output {
    pub(super) plan: Plan,
    pub(super) choices: Vec<ChoiceOut>,
    pub(super) remaining: usize,
}

pub(super) fn chat_logprob(t: &Tok, k: u32) -> ChatLogprob {
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

pub(super) fn completion_logprobs(toks: &[&Tok], k: u32, offset: usize) -> CompletionLogprobs {
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
    pub(super) fn new(plan: Plan) -> Self {
        let choices = plan
            .choices
            .iter()
            .map(|_| ChoiceOut { text: String::new(), tokens: 0, logprobs: Vec::new(), finish: None, started: false })
            .collect();
        let remaining = plan.choices.len();
        Output { plan, choices, remaining }
    }

    pub(super) fn token(&self, choice: usize, index: u32) -> Tok {
        let noise = self.plan.quality_noise;
        let key = tokens::noisy_key(self.plan.seed, self.plan.choices[choice].key, index, noise);
        let t = tokens::token(self.plan.seed, key, index, self.plan.vocab);
        let mut top = match self.plan.logprobs {
            Some(k) => tokens::top_logprobs(self.plan.seed, key, index, k.max(1), self.plan.vocab),
            None => Vec::new(),
        };
        let logprob = tokens::flatten(&mut top, t.logprob, noise);
        Tok { text: t.text, logprob, top }
    }

    /// The finish reason the engine will report with the token at `index` (if it is the last).
    pub(super) fn finish_at(&self, choice: usize, index: u32) -> Option<FinishReason> {
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

    pub(super) fn usage(&self, details: bool) -> Usage {
        let p: u32 = self.plan.prompts.iter().map(|p| p.tokens).sum();
        let c: u32 = self.choices.iter().map(|c| c.tokens).sum();
        Usage {
            prompt_tokens: p,
            total_tokens: p + c,
            completion_tokens: c,
            prompt_tokens_details: details.then_some(Value::Null),
        }
    }

    pub(super) fn choice_usage(&self, choice: usize) -> UsageField {
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

    pub(super) fn object(&self, chunk: bool) -> &'static str {
        match (self.plan.kind, chunk) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    pub(super) fn chunk<C: Serialize>(&self, choices: Vec<C>, usage: UsageField) -> Bytes {
        sse(&Chunk {
            id: &self.plan.id,
            object: self.object(true),
            created: self.plan.created,
            model: &self.plan.model,
            choices,
            usage,
        })
    }

    pub(super) fn whole(&self) -> Result<Vec<u8>, serde_json::Error> {
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
    pub(super) fn token_chunks(&mut self, choice: usize, index: u32, out: &mut VecDeque<Bytes>) {
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
    pub(super) fn usage_chunk(&self) -> Bytes {
        self.chunk::<Value>(Vec::new(), UsageField::Some(self.usage(false)))
    }

    /// Records a finished choice; returns the error when it did not end normally.
    pub(super) fn finished(&mut self, choice: usize, reason: FinishReason) -> Option<ApiError> {
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
