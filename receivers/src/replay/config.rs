//! Settings of the `replay` receiver.

use inferwatch_core::component::{FieldError, parse_config};
use serde::Deserialize;
use std::path::PathBuf;

/// Default rows per chunk fed to the pipeline from Arrow inputs.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// `receivers: { replay: { include, speed, batch_size } }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplayConfig {
    /// Files or directories (read recursively) replayed under `inferwatch run`;
    /// `inferwatch replay --input` replaces them.
    pub include: Vec<PathBuf>,
    /// 0 = as fast as possible; N = N times real time by the data's timestamps.
    pub speed: f64,
    /// Rows per chunk fed to the pipeline (Arrow inputs).
    pub batch_size: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig { include: Vec::new(), speed: 0.0, batch_size: DEFAULT_BATCH_SIZE }
    }
}

impl ReplayConfig {
    /// Parses and checks the settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let cfg: ReplayConfig = parse_config(v)?;
        if !cfg.speed.is_finite() || cfg.speed < 0.0 {
            return Err(FieldError::at("speed", "must be 0 (as fast as possible) or a positive number"));
        }
        if cfg.batch_size == 0 {
            return Err(FieldError::at("batch_size", "must be greater than 0"));
        }
        if let Some(i) = cfg.include.iter().position(|p| p.as_os_str().is_empty()) {
            return Err(FieldError {
                path: vec![
                    inferwatch_core::component::PathSeg::Key("include".into()),
                    inferwatch_core::component::PathSeg::Index(i),
                ],
                message: "empty path".into(),
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::PathSeg;
    use serde_json::json;

    #[test]
    fn defaults_and_values() {
        let c = ReplayConfig::from_value(&json!(null)).unwrap();
        assert_eq!(c, ReplayConfig::default());
        assert_eq!(c.batch_size, 8192);
        let c = ReplayConfig::from_value(&json!({"include": ["a", "b/"], "speed": 60, "batch_size": 10})).unwrap();
        assert_eq!(c.include, vec![PathBuf::from("a"), PathBuf::from("b/")]);
        assert_eq!(c.speed, 60.0);
        assert_eq!(c.batch_size, 10);
    }

    #[test]
    fn bad_values_are_located() {
        let e = ReplayConfig::from_value(&json!({"speed": -1})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("speed".into())]);
        let e = ReplayConfig::from_value(&json!({"batch_size": 0})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("batch_size".into())]);
        let e = ReplayConfig::from_value(&json!({"includes": []})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("includes".into())]);
        let e = ReplayConfig::from_value(&json!({"include": ["a", ""]})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("include".into()), PathSeg::Index(1)]);
    }
}
