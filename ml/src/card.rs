//! The model card: the JSON file next to a model (`models/NAME.json`) holding its signals, window
//! shape, standardisation, calibration and provenance (docs/lstm-ae.md, the shared contract).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The card format this crate reads.
pub const FORMAT: u32 = 1;
/// Smallest standard deviation used when standardising (the card's `std` is floored at it).
pub const STD_FLOOR: f64 = 1e-6;
/// Largest accepted window length T.
pub const MAX_T: usize = 10_000;
/// Largest accepted number of signals k.
pub const MAX_SIGNALS: usize = 1_000;

/// Why a card cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// The file cannot be read.
    #[error("cannot read model card {path}: {source}")]
    Io {
        /// The card's path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The JSON does not parse into a card.
    #[error("model card {path} is not valid: {source}")]
    Json {
        /// The card's path.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A field violates the contract.
    #[error("model card {path}: {message}")]
    Invalid {
        /// The card's path (or `<memory>`).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The calibration of the reconstruction error on held-out healthy windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// `[quantile, error]` pairs of the held-out error distribution (0.99 is used by the level).
    pub quantiles: Vec<(f64, f64)>,
    /// Error at which the level is 0.6 (default 1.5 × the 0.999 quantile).
    pub warning_error: f64,
    /// Error at which the level is 0.8 (default 3 × the 0.999 quantile).
    pub critical_error: f64,
}

impl Calibration {
    /// The error at quantile `q`, if the card lists it.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.quantiles.iter().find(|(p, _)| (p - q).abs() < 1e-9).map(|&(_, e)| e)
    }
}

/// Structured pruning of the LSTM: how many hidden units were kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pruned {
    /// Hidden units kept.
    pub kept_units: usize,
    /// Hidden units before pruning.
    pub of: usize,
}

/// The fitted PCA of a `pca` card (its `mean_vec` and `components`): window vectors (length
/// T·k, row-major [T, k]) are centred, projected on the components and reconstructed.
#[derive(Debug, Clone, PartialEq)]
pub struct PcaModel {
    /// Mean of the standardised training windows (T·k).
    pub center: Vec<f64>,
    /// Orthonormal components, each of length T·k.
    pub components: Vec<Vec<f64>>,
}

/// A model card (format 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Card {
    /// Card format (1).
    pub format: u32,
    /// Model name (the `metric` attribute of the scores).
    pub name: String,
    /// Detector the card is for (`lstm_ae` or `pca`).
    pub detector: String,
    /// Metric names of the k signals, in tensor order.
    pub signals: Vec<String>,
    /// Accepted `source` attribute (rows with another source are skipped; absent is accepted); null accepts all.
    #[serde(default)]
    pub source: Option<String>,
    /// Window length in steps.
    #[serde(rename = "T")]
    pub t: usize,
    /// Step (bucket) length in seconds.
    pub step_s: f64,
    /// How many buckets a signal's last value is carried forward.
    pub max_fill_steps: u64,
    /// Per-signal mean of the standardisation.
    pub mean: Vec<f64>,
    /// Per-signal standard deviation (floored at [`STD_FLOOR`]).
    pub std: Vec<f64>,
    /// Standardised values are clipped to ±clip.
    pub clip: f64,
    /// Error function (`mse`).
    #[serde(default = "default_error")]
    pub error: String,
    /// Calibration of the error.
    pub calibration: Calibration,
    /// Hidden units of the LSTM (lstm_ae cards).
    #[serde(default)]
    pub hidden: Option<usize>,
    /// LSTM layers (lstm_ae cards).
    #[serde(default)]
    pub layers: Option<usize>,
    /// Pruning, if the model was pruned.
    #[serde(default)]
    pub pruned: Option<Pruned>,
    /// Training provenance (free form).
    #[serde(default)]
    pub training: Option<serde_json::Value>,
    /// Training metrics (free form).
    #[serde(default)]
    pub metrics: Option<serde_json::Value>,
    /// PCA cards: mean of the standardised training windows (T·k, row-major [T, k]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_vec: Option<Vec<f64>>,
    /// PCA cards: orthonormal components, each of length T·k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<Vec<Vec<f64>>>,
}

fn default_error() -> String {
    "mse".into()
}

impl Card {
    /// Reads and validates the card at `path`.
    pub fn load(path: &Path) -> Result<Card, CardError> {
        let text = std::fs::read_to_string(path).map_err(|source| CardError::Io { path: path.into(), source })?;
        let card: Card = serde_json::from_str(&text).map_err(|source| CardError::Json { path: path.into(), source })?;
        card.validate().map_err(|message| CardError::Invalid { path: path.into(), message })?;
        Ok(card)
    }

    /// The card of a model file: the same path with the extension `.json`.
    pub fn path_for_model(model: &Path) -> PathBuf {
        model.with_extension("json")
    }

    /// Number of signals k.
    pub fn k(&self) -> usize {
        self.signals.len()
    }

    /// Step length in ns (at least 1).
    pub fn step_ns(&self) -> u64 {
        ((self.step_s * 1e9).round() as u64).max(1)
    }

    /// Checks the contract's invariants; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!("format {} is not supported (expected {FORMAT})", self.format));
        }
        let k = self.k();
        if k == 0 || k > MAX_SIGNALS {
            return Err(format!("signals: must list 1..={MAX_SIGNALS} metrics, got {k}"));
        }
        if self.t == 0 || self.t > MAX_T {
            return Err(format!("T: must be in 1..={MAX_T}, got {}", self.t));
        }
        if !(self.step_s.is_finite() && self.step_s > 0.0 && self.step_s * 1e9 < u64::MAX as f64) {
            return Err(format!("step_s: must be a positive number of seconds, got {}", self.step_s));
        }
        if self.mean.len() != k || self.std.len() != k {
            return Err(format!("mean and std: need {k} values each, got {} and {}", self.mean.len(), self.std.len()));
        }
        if self.mean.iter().chain(&self.std).any(|v| !v.is_finite()) {
            return Err("mean and std: must be finite".into());
        }
        if !(self.clip.is_finite() && self.clip > 0.0) {
            return Err(format!("clip: must be a positive number, got {}", self.clip));
        }
        if self.error != "mse" {
            return Err(format!("error: only \"mse\" is supported, got {:?}", self.error));
        }
        check_levels(self.calibration.warning_error, self.calibration.critical_error)
            .map_err(|m| format!("calibration: {m}"))?;
        let n = self.t * k;
        if let Some(m) = &self.mean_vec
            && m.len() != n
        {
            return Err(format!("mean_vec: needs T·k = {n} values, got {}", m.len()));
        }
        if let Some(i) = self.components.iter().flatten().position(|c| c.len() != n) {
            return Err(format!("components[{i}]: needs T·k = {n} values"));
        }
        let pca_values = self.mean_vec.iter().flatten().chain(self.components.iter().flatten().flatten());
        if pca_values.into_iter().any(|v| !v.is_finite()) {
            return Err("mean_vec and components: values must be finite".into());
        }
        Ok(())
    }

    /// The fitted PCA, when the card has `mean_vec` and at least one component.
    pub fn pca_model(&self) -> Option<PcaModel> {
        let center = self.mean_vec.clone()?;
        let components = self.components.clone().filter(|c| !c.is_empty())?;
        Some(PcaModel { center, components })
    }

    /// The level mapping of this card, with optional overrides of the two breakpoints.
    pub fn levels(&self, warning: Option<f64>, critical: Option<f64>) -> Result<Levels, String> {
        let w = warning.unwrap_or(self.calibration.warning_error);
        let c = critical.unwrap_or(self.calibration.critical_error);
        check_levels(w, c)?;
        Ok(Levels::new(self.calibration.quantile(0.99), w, c))
    }
}

fn check_levels(w: f64, c: f64) -> Result<(), String> {
    if !(w.is_finite() && w > 0.0) {
        return Err(format!("warning_error must be a positive number, got {w}"));
    }
    if !(c.is_finite() && c > w) {
        return Err(format!("critical_error must be a number above warning_error ({w}), got {c}"));
    }
    Ok(())
}

/// The piecewise-linear map from a window's error to the anomaly level: through (0, 0),
/// (q99, 0.5), (warning, 0.6), (critical, 0.8), (2·critical − warning, 1.0), clamped to [0, 1].
/// The q99 point is left out when it is not strictly between 0 and `warning`.
#[derive(Debug, Clone, PartialEq)]
pub struct Levels {
    points: Vec<(f64, f64)>,
}

impl Levels {
    /// The mapping through the contract's breakpoints (`warning < critical`, both positive).
    pub fn new(q99: Option<f64>, warning: f64, critical: f64) -> Levels {
        let mut points = vec![(0.0, 0.0)];
        if let Some(q) = q99.filter(|q| q.is_finite() && *q > 0.0 && *q < warning) {
            points.push((q, 0.5));
        }
        points.extend([(warning, 0.6), (critical, 0.8), (2.0 * critical - warning, 1.0)]);
        Levels { points }
    }

    /// The breakpoints (error, level), increasing.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }

    /// The level of an error (NaN → 0, +∞ → 1).
    pub fn level(&self, error: f64) -> f64 {
        if error.is_nan() || error <= 0.0 {
            return 0.0;
        }
        for pair in self.points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            if error <= x1 {
                return y0 + (y1 - y0) * (error - x0) / (x1 - x0);
            }
        }
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn card_json() -> serde_json::Value {
        serde_json::json!({
            "format": 1, "name": "t", "detector": "lstm_ae", "signals": ["a", "b"], "source": "scrape",
            "T": 3, "step_s": 60, "max_fill_steps": 2, "mean": [1.0, 2.0], "std": [0.5, 0.0], "clip": 10.0,
            "error": "mse",
            "calibration": {"quantiles": [[0.5, 0.1], [0.99, 0.4], [1.0, 0.9]], "warning_error": 0.6, "critical_error": 1.2},
            "hidden": 4, "layers": 1, "pruned": null
        })
    }

    #[test]
    fn level_mapping_at_its_breakpoints() {
        let card: Card = serde_json::from_value(card_json()).unwrap();
        card.validate().unwrap();
        let l = card.levels(None, None).unwrap();
        let at = |e: f64| l.level(e);
        assert_eq!(at(0.0), 0.0);
        assert!((at(0.2) - 0.25).abs() < 1e-12);
        assert!((at(0.4) - 0.5).abs() < 1e-12);
        assert!((at(0.5) - 0.55).abs() < 1e-12);
        assert!((at(0.6) - 0.6).abs() < 1e-12);
        assert!((at(0.9) - 0.7).abs() < 1e-12);
        assert!((at(1.2) - 0.8).abs() < 1e-12);
        assert!((at(1.8) - 1.0).abs() < 1e-12);
        assert_eq!(at(5.0), 1.0);
        assert_eq!(at(f64::NAN), 0.0);
        assert_eq!(at(f64::INFINITY), 1.0);
        // Overrides move the breakpoints; a q99 above the warning is left out.
        let o = card.levels(Some(0.3), Some(0.5)).unwrap();
        assert_eq!(o.points(), &[(0.0, 0.0), (0.3, 0.6), (0.5, 0.8), (0.7, 1.0)]);
        assert!(card.levels(Some(0.5), Some(0.5)).is_err());
    }

    #[test]
    fn invalid_cards_name_the_field() {
        let mut v = card_json();
        v["mean"] = serde_json::json!([1.0]);
        let c: Card = serde_json::from_value(v).unwrap();
        assert!(c.validate().unwrap_err().contains("mean and std"));
        let mut v = card_json();
        v["T"] = serde_json::json!(0);
        let c: Card = serde_json::from_value(v).unwrap();
        assert!(c.validate().unwrap_err().starts_with("T:"));
        let mut v = card_json();
        v["calibration"]["critical_error"] = serde_json::json!(0.1);
        let c: Card = serde_json::from_value(v).unwrap();
        assert!(c.validate().unwrap_err().contains("critical_error"));
    }
}
