//! Prompt handling: a deterministic stand-in tokenizer, Llama-3 chat-template overhead, the
//! request key that seeds the synthetic output, and the prefix the prefix cache can share.

use crate::engine::PromptPrefix;
use crate::engine::tokens::{mix64, prompt_key};

/// Tokens the Llama-3 chat template adds around each message
/// (`<|start_header_id|>`, role, `<|end_header_id|>`, `\n\n`, `<|eot_id|>`).
pub const CHAT_TOKENS_PER_MESSAGE: u32 = 5;
/// Tokens of `<|begin_of_text|>`.
pub const BOS_TOKENS: u32 = 1;
/// Tokens of the generation prompt (`<|start_header_id|>assistant<|end_header_id|>\n\n`).
pub const GENERATION_PROMPT_TOKENS: u32 = 4;

/// Counts tokens the way a BPE tokenizer roughly would, deterministically: a run of letters
/// is one token per 6 characters (rounded up), a run of digits one per 3 (Llama-3 splits
/// numbers into groups of three), a run of line breaks one, any other non-space character
/// one; spaces attach to the following word.
pub fn count_tokens(text: &str) -> u32 {
    #[derive(PartialEq, Clone, Copy)]
    enum Run {
        None,
        Alpha,
        Digit,
        Newline,
    }
    let mut tokens = 0u32;
    let mut run = Run::None;
    let mut len = 0u32;
    let close = |run: Run, len: u32| match run {
        Run::Alpha => len.div_ceil(6),
        Run::Digit => len.div_ceil(3),
        Run::Newline => 1,
        Run::None => 0,
    };
    for c in text.chars() {
        let kind = if c.is_alphabetic() {
            Run::Alpha
        } else if c.is_ascii_digit() {
            Run::Digit
        } else if c == '\n' || c == '\r' {
            Run::Newline
        } else {
            Run::None
        };
        if kind != run || kind == Run::None {
            tokens = tokens.saturating_add(close(run, len));
            len = 0;
            run = kind;
        }
        match kind {
            Run::None => {
                if !c.is_whitespace() {
                    tokens = tokens.saturating_add(1);
                }
            }
            _ => len += 1,
        }
    }
    tokens.saturating_add(close(run, len))
}

/// One chat message reduced to what the simulator needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text content (parts concatenated).
    pub content: String,
}

/// A prompt ready for the engine: its length, the key of its synthetic output and the
/// shareable prefix.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedPrompt {
    /// Prompt length in tokens, template included.
    pub tokens: u32,
    /// Seeds the synthetic output (equal prompts give equal answers).
    pub key: u64,
    /// The part of the prompt another request may share (earlier turns, or the whole prompt).
    pub prefix: Option<PromptPrefix>,
}

/// An image in a chat message: which turn, its content hash and its prompt tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnImage {
    /// Index of the message it belongs to.
    pub turn: usize,
    /// Hash of the image's content (part of the prompt key and prefix).
    pub hash: u64,
    /// Its prompt tokens (placeholders included).
    pub tokens: u32,
}

/// Renders a chat conversation as the Llama-3 template would (for the key) and counts its tokens.
pub fn prepare_chat(turns: &[ChatTurn]) -> PreparedPrompt {
    prepare_chat_with_images(turns, &[])
}

/// [`prepare_chat`] with images: each one adds its tokens to its message and its hash to the
/// rendered prompt (so equal text with other images is another prompt and another prefix).
pub fn prepare_chat_with_images(turns: &[ChatTurn], images: &[TurnImage]) -> PreparedPrompt {
    let mut rendered = String::new();
    let mut tokens = BOS_TOKENS;
    let mut prefix = None;
    for (i, t) in turns.iter().enumerate() {
        if i + 1 == turns.len() && i > 0 {
            // the conversation so far is the prefix a follow-up turn shares
            prefix = Some(PromptPrefix { hash: prompt_key(&rendered), tokens });
        }
        rendered.push_str("<|start_header_id|>");
        rendered.push_str(&t.role);
        rendered.push_str("<|end_header_id|>\n\n");
        for img in images.iter().filter(|m| m.turn == i) {
            rendered.push_str(&format!("<|vision_start|>{:016x}<|vision_end|>", img.hash));
            tokens = tokens.saturating_add(img.tokens);
        }
        rendered.push_str(&t.content);
        rendered.push_str("<|eot_id|>");
        tokens = tokens.saturating_add(CHAT_TOKENS_PER_MESSAGE).saturating_add(count_tokens(&t.content));
    }
    tokens = tokens.saturating_add(GENERATION_PROMPT_TOKENS);
    let key = prompt_key(&rendered);
    PreparedPrompt { tokens, key, prefix: Some(prefix.unwrap_or(PromptPrefix { hash: key, tokens })) }
}

/// A completions prompt given as text (a BOS token is added, as vLLM does for Llama).
pub fn prepare_text(text: &str) -> PreparedPrompt {
    let tokens = BOS_TOKENS.saturating_add(count_tokens(text));
    let key = prompt_key(text);
    // share everything up to the last paragraph break, or the whole prompt
    let prefix = match text.rfind("\n\n") {
        Some(i) if i > 0 => {
            let head = &text[..i];
            PromptPrefix { hash: prompt_key(head), tokens: BOS_TOKENS.saturating_add(count_tokens(head)) }
        }
        _ => PromptPrefix { hash: key, tokens },
    };
    PreparedPrompt { tokens, key, prefix: Some(prefix) }
}

/// A completions prompt given as token ids (no BOS added).
pub fn prepare_ids(ids: &[u32]) -> PreparedPrompt {
    let mut key = 0x1D5_u64;
    for id in ids {
        key = mix64(key ^ u64::from(*id));
    }
    let tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
    PreparedPrompt { tokens, key, prefix: Some(PromptPrefix { hash: key, tokens }) }
}

/// The output key of choice `index`, optionally varied by the request's `seed`.
pub fn choice_key(prompt_key: u64, index: u32, seed: Option<i64>) -> u64 {
    let mut k = prompt_key;
    if index > 0 {
        k = mix64(k ^ u64::from(index).wrapping_mul(0x9E37_79B9));
    }
    if let Some(s) = seed {
        k = mix64(k ^ (s as u64).rotate_left(29));
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_like_a_tokenizer() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("Hello, world!"), 4);
        assert_eq!(count_tokens("internationalization"), 4);
        assert_eq!(count_tokens("12345"), 2);
        assert_eq!(count_tokens("a\n\nb"), 3);
        assert_eq!(count_tokens("héllo wörld"), 2);
    }

    #[test]
    fn chat_prefix_is_the_conversation_so_far() {
        let sys = ChatTurn { role: "system".into(), content: "Be brief.".into() };
        let u1 = ChatTurn { role: "user".into(), content: "Hi".into() };
        let a1 = ChatTurn { role: "assistant".into(), content: "Hello there".into() };
        let u2 = ChatTurn { role: "user".into(), content: "More".into() };
        let one = prepare_chat(&[sys.clone(), u1.clone()]);
        let two = prepare_chat(&[sys.clone(), u1.clone(), a1.clone(), u2]);
        assert!(two.tokens > one.tokens);
        let p = two.prefix.unwrap();
        let head = prepare_chat(&[sys, u1, a1]);
        assert_eq!(p.tokens, head.tokens - GENERATION_PROMPT_TOKENS);
        assert_eq!(one.tokens, 1 + 5 + 3 + 5 + 1 + 4);
        assert_ne!(choice_key(one.key, 1, None), one.key);
        assert_eq!(choice_key(one.key, 0, None), one.key);
    }
}
