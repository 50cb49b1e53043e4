//! Prompts of an exact token count: filler words that are one token each, a model of the
//! chat template's overhead (measured with the server's `/tokenize`, or the documented rule),
//! and the multi-turn history of a session.

use super::read::Trace;
use crate::client::{Api, Message, Prompt};
use serde::Serialize;

/// Filler words: lowercase, at most six letters, each one token in the BPE vocabularies of
/// Llama 3, GPT-2/4 and Mistral (with or without a leading space), and one token in the
/// simulator's counting rule (a run of up to six letters).
pub const FILLER: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "it", "by", "at", "from", "this",
    "be", "are", "or", "have", "an", "not", "but", "one", "all", "new", "more", "time", "year", "people", "first",
    "data", "system", "work", "day", "part", "way", "world", "life", "water", "city", "light", "music", "house",
    "book", "story", "game", "power", "state", "group", "number", "market", "family", "school", "model", "value",
    "line", "name", "place", "point", "home", "right", "small",
];

/// Where the token model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenSource {
    /// Measured with the server's vLLM-style `/tokenize` (template included).
    Server,
    /// Measured with a TGI-style `/tokenize` (text only; the chat template from the rule).
    ServerText,
    /// The documented rule (Llama 3's template; the simulator's count).
    Rule,
}

/// How many tokens a prompt of filler words has: `base + per_message × messages + words`
/// (chat), `base + words` (completions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenModel {
    /// Tokens of an empty prompt: BOS and, for chat, the generation prompt.
    pub base: u32,
    /// Tokens the chat template adds per message (0 for completions).
    pub per_message: u32,
    /// Where the numbers came from.
    pub source: TokenSource,
}

impl TokenModel {
    /// The rule: Llama 3's template (as vLLM applies it and the simulator counts it): chat
    /// `<|begin_of_text|>` + 5 per message + 4 for the generation prompt; completions one BOS.
    pub fn rule(api: Api) -> TokenModel {
        match api {
            Api::Chat => TokenModel { base: 1 + 4, per_message: 5, source: TokenSource::Rule },
            _ => TokenModel { base: 1, per_message: 0, source: TokenSource::Rule },
        }
    }

    /// Template tokens of a prompt of `messages` messages.
    pub fn overhead(&self, messages: u32) -> u32 {
        self.base.saturating_add(self.per_message.saturating_mul(messages))
    }
}

/// `words` filler words, separated by single spaces, deterministic in `key`.
pub fn filler(words: u32, key: u64) -> String {
    let mut s = String::with_capacity(words as usize * 5);
    let mut h = key;
    for i in 0..words {
        h = mix64(h ^ u64::from(i));
        if i > 0 {
            s.push(' ');
        }
        s.push_str(FILLER[(h % FILLER.len() as u64) as usize]);
    }
    s
}

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A prompt built for one trace request.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// What to send.
    pub prompt: Prompt,
    /// Tokens the prompt has under the model (the trace's count unless `exact` is false).
    pub tokens: u32,
    /// Whether the count equals the trace's (false when the template or the earlier turns
    /// alone are longer: the new message then has one word).
    pub exact: bool,
}

/// The text key of one turn's user message (`part` 0) or stand-in answer (`part` 1).
fn key(seed: u64, row: usize, lap: u64, part: u64) -> u64 {
    mix64(seed ^ mix64(row as u64 ^ mix64(lap ^ mix64(part.wrapping_add(0xF111)))))
}

/// Builds the prompt of `row` on `lap`: for a session, the earlier turns (their user messages
/// and stand-in answers of the trace's output length, the same text each time) followed by a
/// new user message sized so that the whole prompt has the row's `input_tokens`.
pub fn build(trace: &Trace, row: usize, lap: u64, seed: u64, api: Api, model: &TokenModel) -> Built {
    // The session's turns up to this one, oldest first (bounded by the trace's size).
    let mut chain = vec![row];
    let mut cur = row;
    while let Some(p) = trace.rows.get(cur).and_then(|r| r.prev) {
        cur = p as usize;
        chain.push(cur);
    }
    chain.reverse();
    let mut messages: Vec<Message> = Vec::new();
    let mut text = String::new();
    let mut history_words = 0u32;
    let mut tokens = 0u32;
    let mut exact = true;
    for (k, &r) in chain.iter().enumerate() {
        let Some(tr) = trace.rows.get(r) else { break };
        let n_messages = 2 * k as u32 + 1;
        let fixed = match api {
            Api::Chat => model.overhead(n_messages),
            _ => model.base,
        };
        let need = fixed.saturating_add(history_words);
        let words = tr.input_tokens.saturating_sub(need).max(1);
        let last = k + 1 == chain.len();
        if last {
            exact = need.saturating_add(words) == tr.input_tokens;
            tokens = need.saturating_add(words);
        }
        let user = filler(words, key(seed, r, lap, 0));
        match api {
            Api::Chat => messages.push(Message::new("user", user)),
            _ => {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(&user);
            }
        }
        history_words = history_words.saturating_add(words);
        if !last {
            let answer = filler(tr.output_tokens, key(seed, r, lap, 1));
            match api {
                Api::Chat => messages.push(Message::new("assistant", answer)),
                _ => {
                    text.push(' ');
                    text.push_str(&answer);
                }
            }
            history_words = history_words.saturating_add(tr.output_tokens);
        }
    }
    let prompt = match api {
        Api::Chat => Prompt::Messages(messages),
        _ => Prompt::Text(text),
    };
    Built { prompt, tokens, exact }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn filler_is_deterministic_and_one_word_a_token() {
        assert_eq!(filler(50, 1), filler(50, 1));
        assert_ne!(filler(50, 1), filler(50, 2));
        assert_eq!(filler(50, 1).split(' ').count(), 50);
        assert_eq!(filler(0, 1), "");
        assert!(FILLER.iter().all(|w| w.len() <= 6 && w.chars().all(|c| c.is_ascii_lowercase())));
        // Two requests share no 16-word prefix block (prefix caching sees distinct prompts).
        let a: Vec<String> = (0..200).map(|i| filler(16, key(0, i, 0, 0))).collect();
        let mut b = a.clone();
        b.sort();
        b.dedup();
        assert_eq!(b.len(), a.len());
    }

    #[test]
    fn sessions_carry_their_history() {
        let t = Trace::parse(
            "timestamp,input_tokens,output_tokens,session_id\n0,40,7,s\n1,30,3,\n2,100,9,s\n3,20,5,s\n",
            Path::new("t.csv"),
        )
        .unwrap();
        let m = TokenModel::rule(Api::Chat);
        let first = build(&t, 0, 0, 1, Api::Chat, &m);
        let Prompt::Messages(m1) = &first.prompt else { panic!("chat") };
        assert_eq!(m1.len(), 1);
        assert_eq!(m1[0].content.split(' ').count() as u32, 40 - 10);
        assert_eq!((first.tokens, first.exact), (40, true));
        let second = build(&t, 2, 0, 1, Api::Chat, &m);
        let Prompt::Messages(m2) = &second.prompt else { panic!("chat") };
        assert_eq!(m2.len(), 3);
        assert_eq!(m2[0], m1[0], "the earlier turn is sent again verbatim");
        assert_eq!(m2[1].role, "assistant");
        assert_eq!(m2[1].content.split(' ').count(), 7);
        // 100 = 5 + 3·5 + 30 + 7 + new words
        assert_eq!(m2[2].content.split(' ').count(), 100 - 20 - 37);
        assert!(second.exact);
        // The third turn is shorter than its history: one word, not exact.
        let third = build(&t, 3, 0, 1, Api::Chat, &m);
        assert!(!third.exact);
        assert!(third.tokens > 20);
        // Another lap gives other text.
        assert_ne!(build(&t, 0, 1, 1, Api::Chat, &m).prompt, first.prompt);
        // Completions: one text, the history as its prefix.
        let c = TokenModel::rule(Api::Completions);
        let Prompt::Text(a) = build(&t, 0, 0, 1, Api::Completions, &c).prompt else { panic!("text") };
        let Prompt::Text(b) = build(&t, 2, 0, 1, Api::Completions, &c).prompt else { panic!("text") };
        assert!(b.starts_with(&a));
        assert_eq!(a.split(' ').count(), 39);
        assert_eq!(b.split(' ').count(), 99);
    }
}
