//! Processor `pca`: the reconstruction-error baseline over the same feature windows as
//! `lstm_ae`. A window (flattened, T·k) is centred, projected on the fitted components and
//! reconstructed; score and level as for `lstm_ae` (docs/lstm-ae.md).

use crate::card::{Card, PcaModel};
use crate::detector::{Detector, LevelOverride, Parts, check_common};
use crate::runtime::RuntimeError;
use crate::score::Reconstructor;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `detector` attribute of the output.
pub const DETECTOR: &str = "pca";
/// The default model card.
pub const DEFAULT_MODEL: &str = "models/pca_default.json";

/// Settings of `pca`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PcaConfig {
    /// The card with the fitted PCA (`mean_vec`, `components`).
    pub model: PathBuf,
    /// Most groups held.
    pub max_series: usize,
    /// Event time without a row after which a group is forgotten.
    pub idle_timeout: GoDuration,
    /// Most windows per scoring run.
    pub max_batch: usize,
    /// Overrides of the card's level breakpoints.
    pub level: LevelOverride,
    /// How far behind the newest event time a row may arrive (default 0s).
    pub allowed_lateness: GoDuration,
    /// Bucket step overriding the card's `step_s`; default: the card's.
    pub step: Option<GoDuration>,
}

impl Default for PcaConfig {
    fn default() -> Self {
        PcaConfig {
            model: PathBuf::from(DEFAULT_MODEL),
            max_series: 10_000,
            idle_timeout: GoDuration(Duration::from_secs(3600)),
            max_batch: 256,
            level: LevelOverride::default(),
            allowed_lateness: GoDuration(Duration::ZERO),
            step: None,
        }
    }
}

/// The PCA reconstruction of windows.
#[derive(Debug, Clone)]
pub struct Pca {
    center: Vec<f64>,
    components: Vec<Vec<f64>>,
}

impl Pca {
    /// From a card's fitted model.
    pub fn new(m: &PcaModel) -> Self {
        Pca { center: m.center.clone(), components: m.components.clone() }
    }

    /// Loads a `pca` card and its model.
    pub fn load(path: &Path) -> Result<(Card, Pca), String> {
        let card = Card::load(path).map_err(|e| e.to_string())?;
        let pca = card
            .pca_model()
            .map(|m| Pca::new(&m))
            .ok_or_else(|| format!("model card {} has no PCA (mean_vec and components)", path.display()))?;
        Ok((card, pca))
    }
}

impl Reconstructor for Pca {
    fn reconstruct(&mut self, x: &[f32], n: usize) -> Result<Vec<f32>, RuntimeError> {
        let d = self.center.len();
        if x.len() != n * d {
            return Err(RuntimeError::Ort(format!("pca: {} values for {n} windows of {d}", x.len())));
        }
        let mut out = Vec::with_capacity(x.len());
        let mut c = vec![0f64; d];
        for w in x.chunks(d) {
            for ((ci, xi), m) in c.iter_mut().zip(w).zip(&self.center) {
                *ci = f64::from(*xi) - m;
            }
            let mut r = self.center.clone();
            for comp in &self.components {
                let coef: f64 = comp.iter().zip(&c).map(|(a, b)| a * b).sum();
                for (ri, a) in r.iter_mut().zip(comp) {
                    *ri += coef * a;
                }
            }
            out.extend(r.iter().map(|v| *v as f32));
        }
        Ok(out)
    }
}

/// Factory of `pca`.
pub struct PcaFactory;

inferwatch_core::arrow_processor_factory!(PcaFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for PcaFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        let c = parse_config::<PcaConfig>(cfg)?;
        check_common(c.max_series, c.idle_timeout, c.max_batch, c.allowed_lateness)?;
        crate::lstm_ae::check_step(c.step)?;
        Ok(std::sync::Arc::new(c))
    }

    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        inferwatch_processors::detect::config::metrics_only("pca", signal)?;
        Ok(Box::new(create(&ctx, inferwatch_core::component::typed::<PcaConfig>(parsed)?)?))
    }
}

/// Builds the processor (public for tests and benchmarks).
pub fn create(ctx: &CreateContext, cfg: &PcaConfig) -> Result<Detector, ComponentError> {
    let (limits, lateness_ns) = check_common(cfg.max_series, cfg.idle_timeout, cfg.max_batch, cfg.allowed_lateness)?;
    crate::lstm_ae::check_step(cfg.step)?;
    let (mut card, pca) = Pca::load(&cfg.model).map_err(|m| ComponentError::Start(format!("{}: {m}", ctx.id)))?;
    crate::lstm_ae::apply_step(&mut card, cfg.step)?;
    let levels = card
        .levels(cfg.level.warning_error, cfg.level.critical_error)
        .map_err(|m| ComponentError::Config(FieldError::at("level", format!("with the card's calibration: {m}"))))?;
    let parts =
        Parts { detector: DETECTOR, card, levels, model: Box::new(pca), limits, max_batch: cfg.max_batch, lateness_ns };
    Ok(Detector::new(ctx, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconstruction_keeps_the_component_span_and_drops_the_rest() {
        // d = 2, one component along (1, 0), centre (1, 1).
        let mut p = Pca { center: vec![1.0, 1.0], components: vec![vec![1.0, 0.0]] };
        let r = p.reconstruct(&[3.0, 5.0, 1.0, 1.0], 2).unwrap();
        assert_eq!(r, vec![3.0, 1.0, 1.0, 1.0]);
        assert!(p.reconstruct(&[1.0], 1).is_err());
    }

    #[test]
    fn step_override_replaces_the_cards_step() {
        let (mut card, _) =
            Pca::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/pca_default.json"))).unwrap();
        assert_eq!(card.step_s, 60.0);
        crate::lstm_ae::apply_step(&mut card, None).unwrap();
        assert_eq!(card.step_ns(), 60_000_000_000);
        crate::lstm_ae::apply_step(&mut card, Some(GoDuration(Duration::from_secs(3600)))).unwrap();
        assert_eq!(card.step_ns(), 3_600_000_000_000);
        assert!(crate::lstm_ae::check_step(Some(GoDuration(Duration::ZERO))).is_err());
        let cfg: PcaConfig = parse_config(&serde_json::json!({"step": "5m"})).unwrap();
        assert_eq!(cfg.step.map(|s| s.0), Some(Duration::from_secs(300)));
    }
}
