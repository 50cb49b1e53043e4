//! Output-quality signals: the first token's entropy (TLE) and the consistency index (RCI) that
//! `inferwatch bench` measures, read from its span attributes and its OTLP histograms.
//!
//! Both are "lower is better" (TLE in bits, RCI in [0, 1] with 0 identical to the reference);
//! the quality score `llm.quality.score` = 1 − RCI is the "higher is better" Q in [0, 1] that
//! `delta_ab kind: quality` and `coupled_model`'s `quality_metric` expect.

use serde::{Deserialize, Serialize};

/// Span attribute and metric name of the bench's TLE (bits).
pub const TLE_NAME: &str = "inferwatch.bench.tle_bits";
/// Span attribute and metric name of the bench's RCI (in [0, 1]).
pub const RCI_NAME: &str = "inferwatch.bench.rci";

/// A quality signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Qual {
    /// First-token entropy of the top-K log-probabilities, bits.
    Tle,
    /// Consistency index against a reference answer, in [0, 1].
    Rci,
}

impl Qual {
    /// Every quality signal, in output order.
    pub const ALL: [Qual; 2] = [Qual::Tle, Qual::Rci];

    /// Index into per-signal arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The span attribute and bench metric carrying it.
    pub fn source_name(self) -> &'static str {
        match self {
            Qual::Tle => TLE_NAME,
            Qual::Rci => RCI_NAME,
        }
    }

    /// Whether `v` is a value the signal can take (TLE ≥ 0, RCI in [0, 1]; finite).
    pub fn accepts(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                Qual::Tle => v >= 0.0,
                Qual::Rci => (0.0..=1.0).contains(&v),
            }
    }
}

/// A window statistic of a quality signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QStat {
    /// Median.
    P50,
    /// Mean.
    Mean,
}

impl QStat {
    /// Every statistic, in output order.
    pub const ALL: [QStat; 2] = [QStat::P50, QStat::Mean];
}

/// The quality score Q of a mean RCI: 1 − RCI, in [0, 1], higher is better.
pub fn score(rci_mean: f64) -> f64 {
    (1.0 - rci_mean).clamp(0.0, 1.0)
}
