//! Prompt datasets (JSONL), reference answers for RCI, and synthetic prompts.

use crate::client::{Message, Prompt};
use crate::quality::Reference;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A dataset or reference file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: {message}", path.display())]
pub struct DatasetError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (0: the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One dataset line: `{"prompt": ...}` or `{"messages": [...]}`, with optional `reference`
/// and `max_tokens`. Other keys (ids, metadata) are ignored.
#[derive(Debug, Deserialize)]
struct LineRaw {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    index: Option<usize>,
}

/// A prompt ready to send.
#[derive(Debug)]
pub struct Item {
    /// The prompt or conversation.
    pub prompt: Prompt,
    /// Reference answer, prepared for RCI.
    pub reference: Option<Arc<Reference>>,
    /// Output limit for this prompt.
    pub max_tokens: Option<u32>,
}

fn read_lines(path: &Path) -> Result<Vec<(usize, LineRaw)>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|e| DatasetError {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot read the file: {e}"),
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let raw: LineRaw = serde_json::from_str(line).map_err(|e| DatasetError {
            path: path.to_path_buf(),
            line: i + 1,
            message: format!("not a JSON object of the expected shape: {e}"),
        })?;
        out.push((i + 1, raw));
    }
    Ok(out)
}

/// Reads a JSONL prompt dataset.
pub fn load(path: &Path) -> Result<Vec<Item>, DatasetError> {
    let mut items = Vec::new();
    for (line, raw) in read_lines(path)? {
        let err = |message: &str| DatasetError { path: path.to_path_buf(), line, message: message.into() };
        let prompt = match (raw.prompt, raw.messages) {
            (Some(p), None) => Prompt::Text(p),
            (None, Some(m)) if !m.is_empty() => Prompt::Messages(m),
            (None, Some(_)) => return Err(err("`messages` is empty")),
            (Some(_), Some(_)) => return Err(err("give either `prompt` or `messages`, not both")),
            (None, None) => return Err(err("each line needs `prompt` (a string) or `messages` (chat messages)")),
        };
        if raw.max_tokens == Some(0) {
            return Err(err("`max_tokens` must be at least 1"));
        }
        items.push(Item {
            prompt,
            reference: raw.reference.as_deref().map(Reference::new),
            max_tokens: raw.max_tokens,
        });
    }
    if items.is_empty() {
        return Err(DatasetError { path: path.to_path_buf(), line: 0, message: "the dataset has no prompt".into() });
    }
    Ok(items)
}

/// Reference answers from `--reference FILE`: JSONL lines with `reference` and a key: `prompt`
/// (exact prompt text), `state` (a dialogue state), `index` (0-based dataset line), or none
/// (the n-th line goes with the n-th prompt).
#[derive(Debug, Default)]
pub struct References {
    by_prompt: HashMap<String, Arc<Reference>>,
    by_state: HashMap<String, Arc<Reference>>,
    by_index: HashMap<usize, Arc<Reference>>,
}

impl References {
    /// Reads a reference file.
    pub fn load(path: &Path) -> Result<References, DatasetError> {
        let mut r = References::default();
        for (n, (line, raw)) in read_lines(path)?.into_iter().enumerate() {
            let Some(text) = raw.reference else {
                return Err(DatasetError { path: path.to_path_buf(), line, message: "missing `reference`".into() });
            };
            let prepared = Reference::new(&text);
            if let Some(p) = raw.prompt {
                r.by_prompt.insert(p, prepared);
            } else if let Some(s) = raw.state {
                r.by_state.insert(s, prepared);
            } else {
                r.by_index.insert(raw.index.unwrap_or(n), prepared);
            }
        }
        Ok(r)
    }

    /// The reference for a prompt text or dataset index.
    pub fn for_prompt(&self, text: &str, index: usize) -> Option<Arc<Reference>> {
        self.by_prompt.get(text).or_else(|| self.by_index.get(&index)).cloned()
    }

    /// The reference for a dialogue state.
    pub fn for_state(&self, state: &str) -> Option<Arc<Reference>> {
        self.by_state.get(state).cloned()
    }
}

const WORDS: &[&str] = &[
    "the", "system", "model", "request", "token", "latency", "cache", "memory", "value", "river", "mountain",
    "history", "science", "music", "garden", "window", "market", "energy", "signal", "network", "question", "answer",
    "story", "city", "people", "water", "light", "table", "paper", "number", "simple", "quiet", "bright", "early",
    "often", "under", "between", "because", "explain", "describe", "compare", "list", "reason", "about", "how", "why",
    "when", "which",
];

/// A synthetic prompt of about `tokens` tokens (one common word each), deterministic in
/// `(seed, index)` and different per index so that prefix caches do not hide the prefill.
pub fn synthetic_prompt(tokens: usize, seed: u64, index: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ index);
    let mut s = format!("Request {index}:");
    for _ in 0..tokens.saturating_sub(2) {
        s.push(' ');
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

/// Where prompts come from: the dataset (round robin) or a pool of synthetic prompts.
#[derive(Debug)]
pub struct PromptSource {
    items: Vec<Arc<Item>>,
    next: AtomicU64,
}

/// Synthetic prompts are drawn from a pool of this many.
const SYNTHETIC_POOL: u64 = 1024;

impl PromptSource {
    /// Prompts from a dataset, with references attached from `refs` where the line has none.
    pub fn from_items(items: Vec<Item>, refs: Option<&References>) -> PromptSource {
        let items = items
            .into_iter()
            .enumerate()
            .map(|(i, mut it)| {
                if it.reference.is_none()
                    && let Some(r) = refs
                {
                    it.reference = r.for_prompt(&it.prompt.to_text(), i);
                }
                Arc::new(it)
            })
            .collect();
        PromptSource { items, next: AtomicU64::new(0) }
    }

    /// A pool of synthetic prompts of about `tokens` tokens.
    pub fn synthetic(tokens: usize, seed: u64, refs: Option<&References>) -> PromptSource {
        let items = (0..SYNTHETIC_POOL)
            .map(|i| Item {
                prompt: Prompt::Text(synthetic_prompt(tokens, seed, i)),
                reference: None,
                max_tokens: None,
            })
            .collect();
        PromptSource::from_items(items, refs)
    }

    /// The next prompt and its sequence number.
    pub fn next(&self) -> (u64, Arc<Item>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let len = self.items.len().max(1) as u64;
        // `items` is never empty: both constructors fill it.
        (n, self.items[(n % len) as usize].clone())
    }

    /// Number of distinct prompts.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no prompts.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("iw-probe-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn loads_both_shapes() {
        let p = temp(
            "ds.jsonl",
            "{\"prompt\": \"hi\", \"reference\": \"hello\", \"max_tokens\": 5, \"id\": 3}\n\n\
             {\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}]}\n",
        );
        let items = load(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].prompt, Prompt::Text("hi".into()));
        assert!(items[0].reference.is_some());
        assert_eq!(items[0].max_tokens, Some(5));
        assert!(matches!(items[1].prompt, Prompt::Messages(_)));
    }

    #[test]
    fn bad_line_has_its_number() {
        let p = temp("bad.jsonl", "{\"prompt\": \"a\"}\n{\"nothing\": 1}\n");
        let e = load(&p).unwrap_err();
        let _ = std::fs::remove_file(&p);
        assert_eq!(e.line, 2, "{e}");
        let p = temp("bad2.jsonl", "{\"prompt\": \"a\"}\n\n{oops\n");
        let e = load(&p).unwrap_err();
        let _ = std::fs::remove_file(&p);
        assert_eq!(e.line, 3);
    }

    #[test]
    fn references_by_key() {
        let p = temp(
            "refs.jsonl",
            "{\"prompt\": \"q1\", \"reference\": \"a1\"}\n{\"state\": \"greeting\", \"reference\": \"hi\"}\n\
             {\"reference\": \"third\"}\n",
        );
        let r = References::load(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert!(r.for_prompt("q1", 99).is_some());
        assert!(r.for_state("greeting").is_some());
        assert!(r.for_prompt("other", 2).is_some());
        assert!(r.for_prompt("other", 1).is_none());
    }

    #[test]
    fn synthetic_is_deterministic() {
        assert_eq!(synthetic_prompt(16, 1, 2), synthetic_prompt(16, 1, 2));
        assert_ne!(synthetic_prompt(16, 1, 2), synthetic_prompt(16, 1, 3));
        assert_eq!(synthetic_prompt(16, 1, 2).split_whitespace().count(), 16);
        let s = PromptSource::synthetic(8, 0, None);
        let (a, _) = s.next();
        let (b, _) = s.next();
        assert_eq!((a, b), (0, 1));
    }
}
