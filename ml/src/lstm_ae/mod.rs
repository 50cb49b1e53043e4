//! Processor `lstm_ae`: an LSTM autoencoder over multi-signal feature windows, run through ONNX
//! Runtime (docs/lstm-ae.md). Scores are the masked reconstruction error of each window,
//! mapped to a level by the card's calibration.

pub mod model;

use crate::card::Card;
use crate::detector::{Detector, LevelOverride, Parts, check_common};
use crate::runtime::{ExecutionProvider, Runtime, RuntimeError, Search};
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use model::OrtModel;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The `detector` attribute of the output.
pub const DETECTOR: &str = "lstm_ae";
/// The default model.
pub const DEFAULT_MODEL: &str = "models/lstm_ae_default.onnx";
/// `inferwatch_lstm_ae_runtime_available{processor}`: 1 with ONNX Runtime loaded, 0 when disabled without it.
pub const RUNTIME_AVAILABLE: inferwatch_core::telemetry::Gauges<1> = inferwatch_core::telemetry::Gauges::new(
    "inferwatch_lstm_ae_runtime_available",
    "1 when a learned detector has ONNX Runtime loaded, 0 when it is disabled without it",
    ["processor"],
);

/// What to do when ONNX Runtime is missing or too old.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissingRuntime {
    /// Refuse to start with one error naming the fix (default).
    #[default]
    Fail,
    /// Warn and pass data through without scoring.
    Disable,
}

/// Settings of `lstm_ae`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LstmAeConfig {
    /// The ONNX model; its card is the same path with `.json`.
    pub model: PathBuf,
    /// The ONNX Runtime library (after `ORT_DYLIB_PATH`, before the search).
    pub runtime_library: Option<PathBuf>,
    /// `fail` or `disable` when the runtime is missing or too old.
    pub on_missing_runtime: OnMissingRuntime,
    /// `cpu` or `cuda` (falls back to the CPU with a log line).
    pub execution_provider: ExecutionProvider,
    /// Most groups held.
    pub max_series: usize,
    /// Event time without a row after which a group is forgotten.
    pub idle_timeout: GoDuration,
    /// Most windows per ONNX Runtime run.
    pub max_batch: usize,
    /// Intra-op threads of the session.
    pub intra_threads: usize,
    /// Overrides of the card's level breakpoints.
    pub level: LevelOverride,
    /// How far behind the newest event time a row may arrive (default 0s).
    pub allowed_lateness: GoDuration,
    /// Bucket step overriding the card's `step_s` (e.g. NAB files of other steps); default: the card's.
    pub step: Option<GoDuration>,
}

impl Default for LstmAeConfig {
    fn default() -> Self {
        LstmAeConfig {
            model: PathBuf::from(DEFAULT_MODEL),
            runtime_library: None,
            on_missing_runtime: OnMissingRuntime::Fail,
            execution_provider: ExecutionProvider::Cpu,
            max_series: 10_000,
            idle_timeout: GoDuration(Duration::from_secs(3600)),
            max_batch: 256,
            intra_threads: 1,
            level: LevelOverride::default(),
            allowed_lateness: GoDuration(Duration::ZERO),
            step: None,
        }
    }
}

impl LstmAeConfig {
    fn check(&self) -> Result<(), FieldError> {
        check_common(self.max_series, self.idle_timeout, self.max_batch, self.allowed_lateness)?;
        check_step(self.step)?;
        if self.intra_threads == 0 {
            return Err(FieldError::at("intra_threads", "must be at least 1"));
        }
        if self.model.as_os_str().is_empty() {
            return Err(FieldError::at("model", "must name an .onnx file"));
        }
        Ok(())
    }
}

/// Factory of `lstm_ae`.
pub struct LstmAeFactory;

inferwatch_core::arrow_processor_factory!(LstmAeFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for LstmAeFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        let c = parse_config::<LstmAeConfig>(cfg)?;
        c.check()?;
        Ok(std::sync::Arc::new(c))
    }

    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        inferwatch_processors::detect::config::metrics_only("lstm_ae", signal)?;
        let cfg = inferwatch_core::component::typed::<LstmAeConfig>(parsed)?;
        create(&ctx, cfg, &Search::from_process(cfg.runtime_library.clone()))
    }
}

/// Builds the processor with an explicit library search (the factory uses this process's).
pub fn create(
    ctx: &CreateContext,
    cfg: &LstmAeConfig,
    search: &Search,
) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
    cfg.check()?;
    let start = |m: String| ComponentError::Start(format!("{}: {m}", ctx.id));
    let card_path = Card::path_for_model(&cfg.model);
    let mut card = Card::load(&card_path).map_err(|e| start(e.to_string()))?;
    apply_step(&mut card, cfg.step)?;
    if card.detector != DETECTOR {
        return Err(start(format!("card {} is for detector {:?}, not {DETECTOR}", card_path.display(), card.detector)));
    }
    let levels = card
        .levels(cfg.level.warning_error, cfg.level.critical_error)
        .map_err(|m| ComponentError::Config(FieldError::at("level", format!("with the card's calibration: {m}"))))?;
    let rt = match Runtime::load(search) {
        Ok(rt) => rt,
        Err(e @ (RuntimeError::NotFound { .. } | RuntimeError::Load { .. })) => {
            return match cfg.on_missing_runtime {
                OnMissingRuntime::Fail => Err(start(e.to_string())),
                OnMissingRuntime::Disable => {
                    tracing::warn!(processor = %ctx.id, error = %e, "lstm_ae disabled (on_missing_runtime: disable): data passes through unscored");
                    RUNTIME_AVAILABLE.get(&ctx.telemetry, [&ctx.id.to_string()]).set(0);
                    Ok(Box::new(Disabled))
                }
            };
        }
        Err(e) => return Err(start(e.to_string())),
    };
    let model = OrtModel::open(&rt, &cfg.model, &card, cfg.execution_provider, cfg.intra_threads)
        .map_err(|e| start(e.to_string()))?;
    RUNTIME_AVAILABLE.get(&ctx.telemetry, [&ctx.id.to_string()]).set(1);
    tracing::info!(
        processor = %ctx.id, model = %cfg.model.display(), library = %rt.library().display(),
        provider = model.provider().as_str(), "lstm_ae ready"
    );
    let (limits, lateness_ns) = check_common(cfg.max_series, cfg.idle_timeout, cfg.max_batch, cfg.allowed_lateness)?;
    let parts = Parts {
        detector: DETECTOR,
        card,
        levels,
        model: Box::new(model),
        limits,
        max_batch: cfg.max_batch,
        lateness_ns,
    };
    Ok(Box::new(Detector::new(ctx, parts)))
}

/// Checks a `step` override: a positive duration.
pub fn check_step(step: Option<GoDuration>) -> Result<(), FieldError> {
    match step {
        Some(s) if s.0.is_zero() => Err(FieldError::at("step", "must be greater than 0")),
        _ => Ok(()),
    }
}

/// Replaces the card's `step_s` by a `step` override (and checks the card again).
pub fn apply_step(card: &mut Card, step: Option<GoDuration>) -> Result<(), FieldError> {
    if let Some(s) = step {
        card.step_s = s.0.as_secs_f64();
        card.validate().map_err(|m| FieldError::at("step", m))?;
    }
    Ok(())
}

/// `lstm_ae` without a runtime (`on_missing_runtime: disable`): reads nothing, emits nothing.
pub struct Disabled;

impl ArrowProcessor for Disabled {
    fn needs(&self) -> Needs {
        Needs { signal: Signal::Metrics, columns: Vec::new() }
    }
    fn allowed_lateness_ns(&self) -> u64 {
        0
    }
    fn process(&mut self, _batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        Ok(())
    }
    fn advance(&mut self, _watermark_ns: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        Ok(())
    }
    fn state_version(&self) -> u32 {
        crate::detector::STATE_VERSION
    }
    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        Ok(Vec::new())
    }
    fn restore(&mut self, _bytes: &[u8]) -> Result<(), StateError> {
        Ok(())
    }
    fn series_count(&self) -> usize {
        0
    }
}
