//! The mapping of a detector's raw score to its `llm.anomaly.level`: linear between two scores,
//! as configured (`zscore_skew`'s `level`, `coupled_model`'s `residual_level`).

use serde::Deserialize;

/// The linear mapping of the score to the level: `zero` → 0, `one` → 1, clamped.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LevelConfig {
    /// Score at and below which the level is 0 (default 3).
    pub zero: f64,
    /// Score at and above which the level is 1 (default 6).
    pub one: f64,
}

impl Default for LevelConfig {
    fn default() -> Self {
        LevelConfig { zero: 3.0, one: 6.0 }
    }
}

impl LevelConfig {
    /// The level of `score` (see [`super::linear_level`]).
    pub fn level(&self, score: f64) -> f64 {
        super::linear_level(score, self.zero, self.one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_partial_settings() {
        assert_eq!(LevelConfig::default(), LevelConfig { zero: 3.0, one: 6.0 });
        let l: LevelConfig = serde_json::from_value(serde_json::json!({"one": 10.0})).unwrap();
        assert_eq!(l, LevelConfig { zero: 3.0, one: 10.0 });
        assert_eq!(l.level(6.5), 0.5);
        assert!(serde_json::from_value::<LevelConfig>(serde_json::json!({"half": 1.0})).is_err());
    }
}
