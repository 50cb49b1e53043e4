//! The split of span-derived TTFT and e2e percentiles by prompt length (`input_buckets`):
//! bucket labels, per-bucket window aggregates and their outputs, and the long/short TTFT ratio.
//!
//! Buckets are upper-exclusive in tokens: with bounds `[1024, 4096, 8192]` a prompt of 1023
//! tokens is `lt_1k`, one of exactly 1024 tokens `1k_4k`, one of 8192 or more `ge_8k`. The
//! outputs are new metrics (`llm.ttft.by_input.*`, `llm.e2e.by_input.*`,
//! `llm.requests.finished.by_input`, `llm.ttft.long_short`); the unsplit series are untouched.

use super::hist::Lat;
use super::model::string_kv;
use super::output::{Emitter, Out, Pct, Value};
use crate::detect::sketch::{DEFAULT_MAX_BINS, DdSketch};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use serde::{Deserialize, Serialize};

/// Point attribute naming the prompt-length bucket (`lt_1k`, `1k_4k`, ...).
pub const INPUT_BUCKET_ATTRIBUTE: &str = "llm.input_bucket";
/// Default `input_buckets`, tokens: < 1k, 1k–4k, 4k–8k, ≥ 8k.
pub const DEFAULT_INPUT_BUCKETS: [u64; 3] = [1024, 4096, 8192];
/// Default `input_ratio_min_requests`: TTFTs each side of `llm.ttft.long_short` needs in a window.
pub const DEFAULT_RATIO_MIN_REQUESTS: u64 = 5;

/// A latency signal split by prompt length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SplitLat {
    /// Time to first token (successful requests).
    Ttft,
    /// End-to-end duration (every request).
    E2e,
}

impl SplitLat {
    /// Every split signal, in output order.
    pub const ALL: [SplitLat; 2] = [SplitLat::Ttft, SplitLat::E2e];

    /// The latency signal it splits.
    pub fn lat(self) -> Lat {
        match self {
            SplitLat::Ttft => Lat::Ttft,
            SplitLat::E2e => Lat::E2e,
        }
    }

    /// Index into [`InputBucketWindow::sketches`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The checked split: bounds (strictly increasing, > 0; empty: no split), their labels, and the
/// ratio's minimum count.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSplit {
    bounds: Vec<u64>,
    labels: Vec<String>,
    min_requests: u64,
}

impl InputSplit {
    /// The split over `bounds` (checked by the configuration: strictly increasing, > 0).
    pub fn new(bounds: &[u64], min_requests: u64) -> Self {
        InputSplit { bounds: bounds.to_vec(), labels: bucket_labels(bounds), min_requests }
    }

    /// The bounds, tokens.
    pub fn bounds(&self) -> &[u64] {
        &self.bounds
    }

    /// The bucket labels, in bucket order (`bounds.len() + 1` of them; none when disabled).
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Number of buckets (0 when disabled).
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split is off (`input_buckets: []`).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The bucket of a prompt of `tokens` (upper-exclusive bounds); `None` when disabled or the
    /// count is not a finite, non-negative number.
    pub fn bucket(&self, tokens: f64) -> Option<usize> {
        if self.is_empty() || !(tokens.is_finite() && tokens >= 0.0) {
            return None;
        }
        Some(self.bounds.partition_point(|b| *b as f64 <= tokens))
    }

    /// Whether per-bucket window aggregates have this split's shape (none, or one per bucket).
    pub fn fits(&self, buckets: &[InputBucketWindow]) -> bool {
        buckets.is_empty() || buckets.len() == self.len()
    }
}

/// A token count as a label part: multiples of 1024 as `<n>k` (`4096` → `4k`), others as digits.
fn token_label(n: u64) -> String {
    if n.is_multiple_of(1024) { format!("{}k", n / 1024) } else { n.to_string() }
}

/// The labels of the buckets of `bounds`: `lt_<b0>`, `<b0>_<b1>`, …, `ge_<bn>` (none when empty).
pub fn bucket_labels(bounds: &[u64]) -> Vec<String> {
    let (Some(first), Some(last)) = (bounds.first(), bounds.last()) else { return Vec::new() };
    let mut v = vec![format!("lt_{}", token_label(*first))];
    v.extend(bounds.windows(2).map(|w| format!("{}_{}", token_label(w[0]), token_label(w[1]))));
    v.push(format!("ge_{}", token_label(*last)));
    v
}

/// The requests of one prompt-length bucket in one window.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct InputBucketWindow {
    /// Requests (with an input token count) in the bucket.
    pub count: u64,
    /// [`SplitLat`] order.
    pub sketches: [Option<DdSketch>; 2],
}

/// Adds one request of `tokens` prompt tokens with its TTFT and e2e to the window's buckets
/// (created on the first request; nothing when the split is off or `tokens` is `None`).
pub fn add(
    split: &InputSplit,
    buckets: &mut Vec<InputBucketWindow>,
    tokens: Option<f64>,
    value: impl Fn(Lat) -> Option<f64>,
    alpha: f64,
) {
    let Some(i) = tokens.and_then(|t| split.bucket(t)) else { return };
    if buckets.len() != split.len() {
        buckets.resize_with(split.len(), Default::default);
    }
    let Some(b) = buckets.get_mut(i) else { return };
    b.count += 1;
    for sl in SplitLat::ALL {
        if let Some(v) = value(sl.lat()) {
            b.sketches[sl.index()].get_or_insert_with(|| new_sketch(alpha)).add(v);
        }
    }
}

/// An empty sketch of relative accuracy `alpha` (checked by the configuration).
pub fn new_sketch(alpha: f64) -> DdSketch {
    DdSketch::new(alpha, DEFAULT_MAX_BINS).unwrap_or_default()
}

/// The TTFTs of bucket `b`, when at least `min` of them.
fn ttft_with(b: &InputBucketWindow, min: u64) -> Option<&DdSketch> {
    b.sketches[SplitLat::Ttft.index()].as_ref().filter(|s| s.count() >= min.max(1))
}

/// The window's split outputs: per bucket the request count and the percentiles, then the ratio
/// of the TTFT p95 of the longest bucket above the first bound holding at least `min_requests`
/// TTFTs to that of the first bucket (when it holds as many, and its p95 is > 0).
pub fn emit(split: &InputSplit, attrs: &[KeyValue], s: u64, e: u64, buckets: &[InputBucketWindow], em: &mut Emitter) {
    if buckets.len() != split.len() {
        return;
    }
    for (b, label) in buckets.iter().zip(split.labels()) {
        let mut a = attrs.to_vec();
        a.push(string_kv(INPUT_BUCKET_ATTRIBUTE, label));
        em.push(Out::RequestsByInput, s, e, &a, Value::Int(i64::try_from(b.count).unwrap_or(i64::MAX)));
        for sl in SplitLat::ALL {
            if let Some(sk) = b.sketches[sl.index()].as_ref() {
                em.push_percentiles(sk, s, e, &a, |p| Out::ByInput(sl, p));
            }
        }
    }
    let short = buckets.first().and_then(|b| ttft_with(b, split.min_requests));
    let long = buckets.iter().skip(1).rev().find_map(|b| ttft_with(b, split.min_requests));
    let q = Pct::P95.quantile();
    if let (Some(short), Some(long)) = (short.and_then(|s| s.quantile(q)), long.and_then(|l| l.quantile(q)))
        && short > 0.0
    {
        let ratio = long / short;
        if ratio.is_finite() {
            em.push(Out::TtftLongShort, s, e, attrs, Value::Double(ratio));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_bounds() {
        assert_eq!(bucket_labels(&DEFAULT_INPUT_BUCKETS), ["lt_1k", "1k_4k", "4k_8k", "ge_8k"]);
        assert_eq!(bucket_labels(&[500, 2048]), ["lt_500", "500_2k", "ge_2k"]);
        assert_eq!(bucket_labels(&[1000]), ["lt_1000", "ge_1000"]);
        assert!(bucket_labels(&[]).is_empty());
    }

    #[test]
    fn buckets_are_upper_exclusive() {
        let s = InputSplit::new(&DEFAULT_INPUT_BUCKETS, 5);
        let got: Vec<Option<usize>> =
            [0.0, 1023.0, 1024.0, 4095.0, 4096.0, 8191.0, 8192.0, 1e9, -1.0, f64::NAN].map(|t| s.bucket(t)).to_vec();
        assert_eq!(got, [Some(0), Some(0), Some(1), Some(1), Some(2), Some(2), Some(3), Some(3), None, None]);
        assert_eq!(InputSplit::new(&[], 5).bucket(10.0), None, "disabled");
    }
}
