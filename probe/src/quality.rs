//! Output-quality probes (probe/README.md, Measurements): first-token entropy (TLE)
//! from top-K log-probabilities, and the consistency index RCI against a reference answer,
//! computed incrementally as tokens stream in.

use std::collections::HashMap;
use std::sync::Arc;

/// TLE in bits of the renormalised top-K distribution: a lower bound on the full entropy.
/// Returns `None` for an empty or non-finite input.
pub fn tle_bits(top_logprobs: &[f64]) -> Option<f64> {
    let finite: Vec<f64> = top_logprobs.iter().copied().filter(|l| l.is_finite()).collect();
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if finite.is_empty() || !max.is_finite() {
        return None;
    }
    // Shift by the maximum for stability; renormalise.
    let z: f64 = finite.iter().map(|l| (l - max).exp()).sum();
    let h = finite
        .iter()
        .map(|l| {
            let p = (l - max).exp() / z;
            if p > 0.0 { -p * p.log2() } else { 0.0 }
        })
        .sum::<f64>();
    Some(h.max(0.0))
}

/// The study's threshold: TLE above this (full vocabulary) reads as highly uncertain. It is
/// out of reach of a top-K TLE (at most log2 K bits: 4.3 for K = 20); see [`tle_threshold_bits`].
pub const TLE_UNCERTAIN_BITS: f64 = 8.5;

/// The threshold as a fraction of the largest entropy the distribution can have (log2 of the
/// number of outcomes). The study's 8.5 bits over a full vocabulary is this fraction of
/// log2 V for V = 2^17 ≈ 131k tokens (Llama 3's 128,256: 16.97 bits, 8.5 / 16.97 = 0.501).
pub const TLE_UNCERTAIN_FRACTION: f64 = 0.5;

/// The TLE above which a first token reads as highly uncertain when the server returned the
/// top `k` log-probabilities: [`TLE_UNCERTAIN_FRACTION`] · log2 k (k = 5: 1.16 bits, k = 20:
/// 2.16 bits), at most [`TLE_UNCERTAIN_BITS`] (the study's full-vocabulary value, reached at
/// k = 2^17). `k` is what the server sent, which may be fewer than asked for (vLLM caps it at
/// `--max-logprobs`, 20 by default); k ≤ 1 gives 0 bits (a one-outcome entropy is always 0, so
/// nothing is above it).
pub fn tle_threshold_bits(k: usize) -> f64 {
    if k <= 1 {
        return 0.0;
    }
    (TLE_UNCERTAIN_FRACTION * (k as f64).log2()).min(TLE_UNCERTAIN_BITS)
}

/// Whether a first-token TLE of `bits` from the top `k` log-probabilities is above
/// [`tle_threshold_bits`] (highly uncertain).
pub fn tle_uncertain(bits: f64, k: usize) -> bool {
    k > 1 && bits > tle_threshold_bits(k)
}

/// RCI weights α (BLEU), β (semantic similarity), γ (repetition); they sum to 1.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RciWeights {
    /// Weight of 1 − BLEU-n.
    pub alpha: f64,
    /// Weight of 1 − S (semantic similarity).
    pub beta: f64,
    /// Weight of the repeated-n-gram ratio.
    pub gamma: f64,
}

impl Default for RciWeights {
    fn default() -> Self {
        RciWeights { alpha: 0.5, beta: 0.3, gamma: 0.2 }
    }
}

impl RciWeights {
    /// Parses `alpha,beta,gamma` (non-negative, not all zero; normalised to sum 1).
    pub fn parse(s: &str) -> Result<RciWeights, String> {
        let v: Vec<f64> = s
            .split(',')
            .map(|x| x.trim().parse::<f64>().map_err(|_| format!("invalid RCI weight {x:?}")))
            .collect::<Result<_, _>>()?;
        let [a, b, g] = v[..] else { return Err(format!("expected three weights alpha,beta,gamma, got {s:?}")) };
        if [a, b, g].iter().any(|x| !x.is_finite() || *x < 0.0) || a + b + g <= 0.0 {
            return Err(format!("RCI weights must be non-negative and not all zero, got {s:?}"));
        }
        let sum = a + b + g;
        Ok(RciWeights { alpha: a / sum, beta: b / sum, gamma: g / sum })
    }

    /// The weights used without a semantic model: β = 0 and α, γ renormalised.
    pub fn without_semantic(self) -> RciWeights {
        let s = self.alpha + self.gamma;
        if s <= 0.0 {
            return RciWeights { alpha: 1.0, beta: 0.0, gamma: 0.0 };
        }
        RciWeights { alpha: self.alpha / s, beta: 0.0, gamma: self.gamma / s }
    }
}

/// BLEU order (n = 4) and repeated-n-gram order (k = 3).
pub const BLEU_N: usize = 4;
/// Repeated-n-gram order for R_k.
pub const REPEAT_K: usize = 3;

/// Splits text into lower-cased words (alphanumeric runs) and single punctuation marks.
pub fn words(text: &str) -> Vec<String> {
    let mut t = Tokenizer::default();
    let mut out = Vec::new();
    t.push(text, &mut |w| out.push(w.to_string()));
    t.finish(&mut |w| out.push(w.to_string()));
    out
}

/// Incremental word splitter: text arrives in arbitrary pieces.
#[derive(Debug, Default, Clone)]
struct Tokenizer {
    partial: String,
}

impl Tokenizer {
    fn push(&mut self, text: &str, emit: &mut dyn FnMut(&str)) {
        for c in text.chars() {
            if c.is_alphanumeric() {
                self.partial.extend(c.to_lowercase());
            } else {
                if !self.partial.is_empty() {
                    emit(&self.partial);
                    self.partial.clear();
                }
                if !c.is_whitespace() && !c.is_control() {
                    let mut b = [0u8; 4];
                    emit(c.encode_utf8(&mut b));
                }
            }
        }
    }

    fn finish(&mut self, emit: &mut dyn FnMut(&str)) {
        if !self.partial.is_empty() {
            emit(&self.partial);
            self.partial.clear();
        }
    }
}

/// Key of an n-gram of word ids (up to 4 ids of 32 bits) with its order.
type Gram = (u8, u128);

fn gram(ids: &[u32]) -> Gram {
    let mut k = 0u128;
    for &i in ids {
        k = (k << 32) | i as u128;
    }
    (ids.len() as u8, k)
}

/// A reference answer prepared once: its vocabulary and n-gram counts (n = 1..=4).
#[derive(Debug)]
pub struct Reference {
    vocab: HashMap<String, u32>,
    counts: HashMap<Gram, u32>,
    len: usize,
}

impl Reference {
    /// Prepares a reference answer.
    pub fn new(text: &str) -> Arc<Reference> {
        let mut vocab = HashMap::new();
        let ids: Vec<u32> = words(text)
            .into_iter()
            .map(|w| {
                let n = vocab.len() as u32;
                *vocab.entry(w).or_insert(n)
            })
            .collect();
        let mut counts = HashMap::new();
        for n in 1..=BLEU_N {
            for win in ids.windows(n) {
                *counts.entry(gram(win)).or_insert(0) += 1;
            }
        }
        Arc::new(Reference { vocab, counts, len: ids.len() })
    }
}

/// RCI of one answer, updated per streamed piece of text in O(1) per word.
#[derive(Debug)]
pub struct Rci {
    reference: Arc<Reference>,
    tokenizer: Tokenizer,
    /// Words outside the reference get ids from here up.
    extra: HashMap<String, u32>,
    /// Last BLEU_N word ids.
    tail: Vec<u32>,
    len: usize,
    cand: HashMap<Gram, u32>,
    matches: [u64; BLEU_N],
    totals: [u64; BLEU_N],
    distinct_k: u64,
}

/// The parts and value of an RCI.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RciValue {
    /// The index, in [0, 1]: 0 is identical to the reference with no repetition.
    pub rci: f64,
    /// BLEU-4 of the answer against the reference.
    pub bleu: f64,
    /// Repeated-trigram ratio of the answer.
    pub repetition: f64,
}

impl Rci {
    /// Starts an answer against `reference`.
    pub fn new(reference: Arc<Reference>) -> Rci {
        Rci {
            reference,
            tokenizer: Tokenizer::default(),
            extra: HashMap::new(),
            tail: Vec::with_capacity(BLEU_N),
            len: 0,
            cand: HashMap::new(),
            matches: [0; BLEU_N],
            totals: [0; BLEU_N],
            distinct_k: 0,
        }
    }

    /// Adds a piece of streamed text.
    pub fn push(&mut self, text: &str) {
        let mut tok = std::mem::take(&mut self.tokenizer);
        tok.push(text, &mut |w| self.word(w));
        self.tokenizer = tok;
    }

    fn word(&mut self, w: &str) {
        let id = match self.reference.vocab.get(w) {
            Some(&id) => id,
            None => {
                let base = self.reference.vocab.len() as u32;
                let n = base + self.extra.len() as u32;
                *self.extra.entry(w.to_string()).or_insert(n)
            }
        };
        if self.tail.len() == BLEU_N {
            self.tail.remove(0);
        }
        self.tail.push(id);
        self.len += 1;
        for n in 1..=self.tail.len() {
            let g = gram(&self.tail[self.tail.len() - n..]);
            let c = self.cand.entry(g).or_insert(0);
            *c += 1;
            self.totals[n - 1] += 1;
            // Clipped matches grow while the candidate count stays within the reference count.
            if *c <= self.reference.counts.get(&g).copied().unwrap_or(0) {
                self.matches[n - 1] += 1;
            }
            if n == REPEAT_K && *c == 1 {
                self.distinct_k += 1;
            }
        }
    }

    /// The value so far (the last partial word counted).
    pub fn value(&self, w: RciWeights) -> RciValue {
        let mut tail = self.tokenizer.clone();
        let mut copy = None;
        tail.finish(&mut |word| copy = Some(word.to_string()));
        match copy {
            // Evaluate on a clone so that a later push can still extend the partial word.
            Some(word) => {
                let mut c = Rci {
                    reference: self.reference.clone(),
                    tokenizer: Tokenizer::default(),
                    extra: self.extra.clone(),
                    tail: self.tail.clone(),
                    len: self.len,
                    cand: self.cand.clone(),
                    matches: self.matches,
                    totals: self.totals,
                    distinct_k: self.distinct_k,
                };
                c.word(&word);
                c.value_complete(w)
            }
            None => self.value_complete(w),
        }
    }

    /// Finishes the answer and returns its value.
    pub fn finish(mut self, w: RciWeights) -> RciValue {
        let mut tok = std::mem::take(&mut self.tokenizer);
        tok.finish(&mut |word| self.word(word));
        self.value_complete(w)
    }

    fn value_complete(&self, w: RciWeights) -> RciValue {
        let bleu = self.bleu();
        let k = self.totals[REPEAT_K - 1];
        let repetition = if k == 0 { 0.0 } else { (k - self.distinct_k) as f64 / k as f64 };
        // No semantic model: S is not available, β = 0 with α, γ renormalised.
        let w = w.without_semantic();
        let rci = (w.alpha * (1.0 - bleu) + w.gamma * repetition).clamp(0.0, 1.0);
        RciValue { rci, bleu, repetition }
    }

    /// BLEU-4 with uniform weights, the brevity penalty, and add-one smoothing of the
    /// precisions for n ≥ 2 (Lin and Och, 2004) so that short answers do not score zero.
    fn bleu(&self) -> f64 {
        let c = self.len as f64;
        let r = self.reference.len as f64;
        if self.len == 0 || self.matches[0] == 0 {
            return 0.0;
        }
        let mut log_sum = 0.0;
        for n in 0..BLEU_N {
            let (m, t) = (self.matches[n] as f64, self.totals[n] as f64);
            let p = if n == 0 { m / t } else { (m + 1.0) / (t + 1.0) };
            log_sum += p.ln() / BLEU_N as f64;
        }
        let bp = if c > r { 1.0 } else { (1.0 - r / c).exp() };
        (bp * log_sum.exp()).clamp(0.0, 1.0)
    }
}

/// BLEU-4 of `candidate` against `reference` (the same smoothing as RCI).
pub fn bleu(candidate: &str, reference: &str) -> f64 {
    let mut r = Rci::new(Reference::new(reference));
    r.push(candidate);
    r.finish(RciWeights::default()).bleu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tle_of_uniform_top_k_is_log2_k() {
        let l = (0.25f64).ln();
        assert!((tle_bits(&[l, l, l, l]).unwrap() - 2.0).abs() < 1e-12);
        // Renormalised: the absolute level of the logprobs does not matter.
        let l = (0.01f64).ln();
        assert!((tle_bits(&[l; 8]).unwrap() - 3.0).abs() < 1e-12);
        assert_eq!(tle_bits(&[0.0]).unwrap(), 0.0);
        assert!(tle_bits(&[]).is_none());
        // A peaked distribution: p = (0.9, 0.1) → 0.469 bits.
        let h = tle_bits(&[(0.9f64).ln(), (0.1f64).ln()]).unwrap();
        assert!((h - 0.4689955935892812).abs() < 1e-12, "{h}");
    }

    #[test]
    fn tle_threshold_scales_with_k() {
        // Half of the largest entropy log2 K.
        assert!((tle_threshold_bits(20) - 0.5 * 20f64.log2()).abs() < 1e-12);
        assert!((tle_threshold_bits(4) - 1.0).abs() < 1e-12);
        assert_eq!(tle_threshold_bits(1), 0.0);
        assert_eq!(tle_threshold_bits(0), 0.0);
        // The study's full-vocabulary 8.5 bits at K = 2^17, and never above it.
        assert!((tle_threshold_bits(1 << 17) - TLE_UNCERTAIN_BITS).abs() < 1e-12);
        assert_eq!(tle_threshold_bits(1 << 20), TLE_UNCERTAIN_BITS);
        // Reachable for every K ≥ 2: the uniform top K (log2 K bits) is above it.
        for k in [2usize, 5, 20, 100] {
            let l = (1.0 / k as f64).ln();
            let uniform = tle_bits(&vec![l; k]).unwrap();
            assert!(tle_uncertain(uniform, k), "k {k}");
            // A peaked distribution is not.
            let mut peaked = vec![(0.01f64 / k as f64).ln(); k];
            peaked[0] = (0.99f64).ln();
            assert!(!tle_uncertain(tle_bits(&peaked).unwrap(), k), "k {k}");
        }
        assert!(!tle_uncertain(0.0, 1));
    }

    #[test]
    fn identical_answer_scores_zero() {
        let text = "The quick brown fox jumps over the lazy dog near the river bank.";
        let mut r = Rci::new(Reference::new(text));
        r.push(text);
        let v = r.finish(RciWeights::default());
        assert!((v.bleu - 1.0).abs() < 1e-12, "{v:?}");
        assert_eq!(v.repetition, 0.0);
        assert!(v.rci.abs() < 1e-12);
    }

    #[test]
    fn incremental_equals_whole() {
        let reference = "Paris is the capital and largest city of France, on the Seine.";
        let answer = "The capital of France is Paris, a large city on the river Seine. Paris is the capital.";
        let whole = {
            let mut r = Rci::new(Reference::new(reference));
            r.push(answer);
            r.finish(RciWeights::default())
        };
        // Stream in awkward pieces that split words.
        let mut r = Rci::new(Reference::new(reference));
        let chars: Vec<char> = answer.chars().collect();
        for piece in chars.chunks(3) {
            r.push(&piece.iter().collect::<String>());
            let mid = r.value(RciWeights::default());
            assert!((0.0..=1.0).contains(&mid.rci));
        }
        assert_eq!(r.value(RciWeights::default()), whole);
        assert_eq!(r.finish(RciWeights::default()), whole);
        assert!(whole.bleu > 0.0 && whole.bleu < 1.0, "{whole:?}");
    }

    #[test]
    fn repetition_raises_rci() {
        let reference = "one two three four five six";
        let mut rep = Rci::new(Reference::new(reference));
        rep.push("one two three one two three one two three");
        let v = rep.finish(RciWeights::default());
        // 7 trigrams, 3 distinct → 4/7 repeated.
        assert!((v.repetition - 4.0 / 7.0).abs() < 1e-12, "{v:?}");
        let mut clean = Rci::new(Reference::new(reference));
        clean.push("one two three four five six");
        assert!(v.rci > clean.finish(RciWeights::default()).rci);
    }

    #[test]
    fn weights() {
        let w = RciWeights::parse("1,1,2").unwrap();
        assert_eq!((w.alpha, w.beta, w.gamma), (0.25, 0.25, 0.5));
        let ns = RciWeights::default().without_semantic();
        assert!((ns.alpha + ns.gamma - 1.0).abs() < 1e-12 && ns.beta == 0.0);
        assert!(RciWeights::parse("1,2").is_err());
        assert!(RciWeights::parse("-1,1,1").is_err());
    }

    #[test]
    fn bleu_of_unrelated_text_is_zero() {
        assert_eq!(bleu("alpha beta gamma", "delta epsilon zeta"), 0.0);
        assert!((bleu("a b c d e", "a b c d e") - 1.0).abs() < 1e-12);
    }
}
