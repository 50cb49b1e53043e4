//! Deterministic synthetic output: token ids, text and top-k log-probabilities as pure
//! functions of (seed, request key, position), so equal prompts give equal answers.

use serde::{Deserialize, Serialize};

const WORDS: &[&str] = &[
    "the",
    "model",
    "answer",
    "is",
    "a",
    "of",
    "to",
    "and",
    "in",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "this",
    "request",
    "token",
    "cache",
    "latency",
    "system",
    "value",
    "data",
    "time",
    "result",
    "user",
    "query",
    "first",
    "second",
    "next",
    "then",
    "also",
    "can",
    "will",
    "should",
    "would",
    "because",
    "when",
    "which",
    "each",
    "more",
    "less",
    "about",
    "from",
    "by",
    "we",
    "you",
    "they",
    "one",
    "two",
    "three",
    "many",
    "some",
    "all",
    "new",
    "good",
    "best",
    "simple",
    "short",
    "long",
    "fast",
    "slow",
    "step",
    "plan",
    "idea",
    "example",
    "case",
    "point",
    "way",
    "part",
    "list",
    "number",
    "small",
    "large",
    "high",
    "low",
    "here",
    "there",
    "so",
    "but",
    "not",
    "only",
    "very",
    "well",
    "recommend",
    "prefer",
    "choose",
    "consider",
    "option",
    "items",
    "order",
    "price",
    "service",
    "quality",
    "support",
    "travel",
    "book",
    "music",
    "movie",
    "food",
    "city",
    "place",
    "day",
    "week",
    "morning",
    "evening",
    "today",
    "tomorrow",
    "summary",
    "details",
    "note",
    "reason",
    "because",
    "therefore",
    "however",
    "finally",
    "sure",
    "thanks",
    "hello",
    "please",
    "great",
    "nice",
    "clear",
    "useful",
    "helpful",
    "possible",
    "likely",
    "general",
];

/// One synthetic output token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyntheticToken {
    /// Token id (below the model's vocabulary size).
    pub id: u32,
    /// Its text (a word, with a leading space except at position 0, or punctuation).
    pub text: String,
    /// Its log-probability.
    pub logprob: f64,
}

/// SplitMix64: a fast, well-mixed 64-bit hash step.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from a hash.
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// FNV-1a hash of a prompt, the usual request key (equal prompts → equal outputs).
pub fn prompt_key(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn candidate(seed: u64, key: u64, index: u32, rank: u32, vocab: u32) -> (u32, String) {
    let h = mix64(seed ^ mix64(key ^ mix64(u64::from(index) << 8 | u64::from(rank))));
    let r = h % 16;
    let (word_idx, text) = if r == 0 && index > 0 {
        (WORDS.len() as u64, ".".to_string())
    } else if r == 1 && index > 0 {
        (WORDS.len() as u64 + 1, ",".to_string())
    } else {
        let w = (h >> 8) % WORDS.len() as u64;
        let word = WORDS[w as usize];
        (w, if index == 0 { capitalize(word) } else { format!(" {word}") })
    };
    let id = (1000 + word_idx * 7 + u64::from(index == 0)) % u64::from(vocab.max(2));
    (id as u32, text)
}

fn capitalize(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The probability of the chosen token at this position, in [0.35, 0.97].
fn top_prob(seed: u64, key: u64, index: u32) -> f64 {
    0.35 + 0.62 * unit(mix64(seed ^ key.rotate_left(17) ^ u64::from(index).wrapping_mul(0x5851_F42D)))
}

/// The output token at `index` for request `key`.
pub fn token(seed: u64, key: u64, index: u32, vocab: u32) -> SyntheticToken {
    let (id, text) = candidate(seed, key, index, 0, vocab);
    SyntheticToken { id, text, logprob: top_prob(seed, key, index).ln() }
}

/// The `k` most likely tokens at `index` (the chosen one first), probabilities decreasing
/// geometrically after the top one; `k = 0` gives an empty list.
pub fn top_logprobs(seed: u64, key: u64, index: u32, k: u32, vocab: u32) -> Vec<SyntheticToken> {
    let p0 = top_prob(seed, key, index);
    let mut out = Vec::with_capacity(k as usize);
    let rest = 1.0 - p0;
    for rank in 0..k {
        // Alternatives are distinct tokens: redraw (deterministically) on a repeat.
        let mut salt = rank;
        let (mut id, mut text) = candidate(seed, key, index, salt, vocab);
        while rank > 0 && out.iter().any(|t: &SyntheticToken| t.id == id) && salt < rank + 64 * k.max(1) {
            salt += k.max(1);
            (id, text) = candidate(seed, key, index, salt, vocab);
        }
        let p = if rank == 0 { p0 } else { rest * 0.5f64.powi(rank as i32) };
        out.push(SyntheticToken { id, text, logprob: p.max(1e-12).ln() });
    }
    out
}

/// Quality noise: the request key the token at `index` is drawn from. With probability `noise`
/// (a deterministic draw per position) the token comes from another answer (a derived key), so
/// that text departs from the undegraded answer; `noise` ≤ 0 keeps `key`.
pub fn noisy_key(seed: u64, key: u64, index: u32, noise: f64) -> u64 {
    let draw = unit(mix64(seed ^ key.rotate_left(29) ^ u64::from(index).wrapping_mul(0x9E37_79B9)));
    if noise > 0.0 && draw < noise { mix64(key ^ 0x0051_A70F_D15E) } else { key }
}

/// Quality noise on the top-k list: the top probability is scaled by `1 − 0.6 · noise` and the
/// rest shared as before (geometrically), so the first token's entropy rises with `noise`;
/// `noise` ≤ 0 leaves the list as it is. Returns the chosen token's log-probability (`logprob`,
/// unchanged without noise).
pub fn flatten(top: &mut [SyntheticToken], logprob: f64, noise: f64) -> f64 {
    if noise <= 0.0 {
        return logprob;
    }
    let p = logprob.exp() * (1.0 - 0.6 * noise.min(1.0));
    for (rank, t) in top.iter_mut().enumerate() {
        let q = if rank == 0 { p } else { (1.0 - p) * 0.5f64.powi(rank as i32) };
        t.logprob = q.max(1e-12).ln();
    }
    p.ln()
}

/// A natural output length (where the model "emits EOS") for request `key`: log-normal
/// around `median` tokens, at least 1, at most `max_tokens`.
pub fn natural_length(seed: u64, key: u64, median: f64, max_tokens: u32) -> u32 {
    let u1 = unit(mix64(seed ^ key ^ 0xA5A5)).max(1e-12);
    let u2 = unit(mix64(seed.rotate_left(7) ^ key ^ 0x5A5A));
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let len = (median.max(1.0) * (0.6 * z).exp()).round();
    (len.max(1.0) as u32).min(max_tokens.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_alternatives_are_distinct() {
        for i in 0..2000 {
            let alts = top_logprobs(7, prompt_key("hi"), i, 8, 128_256);
            let mut ids: Vec<u32> = alts.iter().map(|t| t.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 8, "token {i}: {alts:?}");
            assert_eq!(alts[0].id, token(7, prompt_key("hi"), i, 128_256).id);
        }
    }

    #[test]
    fn quality_noise_changes_tokens_and_raises_entropy() {
        let key = prompt_key("hi");
        assert!((0..200).all(|i| noisy_key(7, key, i, 0.0) == key));
        let changed = (0..2000).filter(|&i| noisy_key(7, key, i, 0.3) != key).count();
        assert!((450..750).contains(&changed), "about 30 % of 2000: {changed}");
        let entropy = |top: &[SyntheticToken]| {
            let z: f64 = top.iter().map(|t| t.logprob.exp()).sum();
            -top.iter().map(|t| t.logprob.exp() / z).map(|p| p * p.log2()).sum::<f64>()
        };
        let mut top = top_logprobs(7, key, 3, 5, 128_256);
        let (lp0, p0) = (top[0].logprob, top[0].logprob.exp());
        let before = entropy(&top);
        let mut same = top.clone();
        assert_eq!(flatten(&mut same, lp0, 0.0), lp0);
        assert_eq!(same, top, "no noise: unchanged");
        let lp = flatten(&mut top, lp0, 0.5);
        assert!((lp - (p0 * 0.7).ln()).abs() < 1e-12 && top[0].logprob == lp);
        assert!(entropy(&top) > before, "{} vs {before}", entropy(&top));
    }

    #[test]
    fn deterministic_and_in_vocab() {
        let a: Vec<_> = (0..20).map(|i| token(7, prompt_key("hi"), i, 128_256)).collect();
        let b: Vec<_> = (0..20).map(|i| token(7, prompt_key("hi"), i, 128_256)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|t| t.id < 128_256 && t.logprob < 0.0));
        assert_ne!(a, (0..20).map(|i| token(8, prompt_key("hi"), i, 128_256)).collect::<Vec<_>>());
        let top = top_logprobs(7, 3, 4, 5, 128_256);
        assert_eq!(top.len(), 5);
        assert_eq!(top[0], token(7, 3, 4, 128_256));
        assert!(top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        let total: f64 = top.iter().map(|t| t.logprob.exp()).sum();
        assert!(total <= 1.0 + 1e-9);
        let n = natural_length(1, 2, 100.0, 50);
        assert!((1..=50).contains(&n));
    }
}
