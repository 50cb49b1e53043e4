//! The Arrow processor shared by `lstm_ae` and `pca`: feature windows per group, the windows that
//! close in one watermark advance scored together (in runs of `max_batch`), and the
//! `llm.anomaly.score` / `llm.anomaly.level` output.

use crate::card::{Card, Levels};
use crate::features::{Dropped, Features, Limits, Window};
use crate::score::{Reconstructor, Scored, score_windows};
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{ArrowProcessor, ConvError, Needs, schema};
use inferwatch_core::component::{CreateContext, FieldError};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use inferwatch_processors::detect::{Output, kv_f64, kv_i64, kv_str};
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;

/// Version of the checkpoint format of [`Detector`]: its [`Features`]' (2: the detector kit's
/// series map).
pub const STATE_VERSION: u32 = crate::features::STATE_VERSION;

/// Optional overrides of the card's level breakpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LevelOverride {
    /// Error at which the level is 0.6 (default: the card's `calibration.warning_error`).
    pub warning_error: Option<f64>,
    /// Error at which the level is 0.8 (default: the card's `calibration.critical_error`).
    pub critical_error: Option<f64>,
}

/// Checks the settings both detectors share; returns the limits in ns.
pub fn check_common(
    max_series: usize,
    idle_timeout: GoDuration,
    max_batch: usize,
    lateness: GoDuration,
) -> Result<(Limits, u64), FieldError> {
    if max_series == 0 {
        return Err(FieldError::at("max_series", "must be at least 1"));
    }
    if max_batch == 0 {
        return Err(FieldError::at("max_batch", "must be at least 1"));
    }
    let idle_ns = u64::try_from(idle_timeout.0.as_nanos())
        .map_err(|_| FieldError::at("idle_timeout", format!("{idle_timeout} is too long")))?;
    if idle_ns == 0 {
        return Err(FieldError::at("idle_timeout", "must be greater than 0"));
    }
    let lateness_ns = u64::try_from(lateness.0.as_nanos())
        .map_err(|_| FieldError::at("allowed_lateness", format!("{lateness} is too long")))?;
    Ok((Limits { max_series, idle_ns }, lateness_ns))
}

/// What a [`Detector`] is built from.
pub struct Parts {
    /// `lstm_ae` or `pca` (the `detector` attribute and the evidence prefix).
    pub detector: &'static str,
    /// The validated card.
    pub card: Card,
    /// The level mapping.
    pub levels: Levels,
    /// The model.
    pub model: Box<dyn Reconstructor>,
    /// Group limits.
    pub limits: Limits,
    /// Most windows per model run.
    pub max_batch: usize,
    /// Allowed lateness (ns).
    pub lateness_ns: u64,
}

/// The running processor.
pub struct Detector {
    parts: Parts,
    features: Features,
    name: String,
    counted: Dropped,
    evicted_idle: Counter,
    evicted_max: Counter,
    resource: Resource,
    scope: InstrumentationScope,
    keys: [String; 3],
    runs: u64,
}

impl Detector {
    /// A processor for component `ctx.id`.
    pub fn new(ctx: &CreateContext, parts: Parts) -> Self {
        let d = parts.detector;
        Detector {
            features: Features::new(&parts.card, parts.limits),
            name: ctx.id.to_string(),
            counted: Dropped::default(),
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
            resource: Resource { attributes: vec![kv_str(schema::SERVICE_NAME, "inferwatch")], ..Default::default() },
            scope: InstrumentationScope { name: format!("inferwatch.{d}"), ..Default::default() },
            keys: [format!("{d}.error"), format!("{d}.top_signal"), format!("{d}.missing")],
            runs: 0,
            parts,
        }
    }

    /// Model runs made so far (one per `max_batch` windows of an advance).
    pub fn model_runs(&self) -> u64 {
        self.runs
    }

    /// Scores windows directly (no state), as an advance would.
    pub fn score(&mut self, windows: &[Window]) -> Result<Vec<Scored>, crate::runtime::RuntimeError> {
        let (t, k) = (self.parts.card.t, self.parts.card.k());
        self.runs += windows.len().div_ceil(self.parts.max_batch.max(1)) as u64;
        score_windows(self.parts.model.as_mut(), windows, t, k, self.parts.max_batch)
    }

    fn count_dropped(&mut self) {
        let now = self.features.dropped();
        self.evicted_idle.inc_by(now.evicted_idle - self.counted.evicted_idle);
        self.evicted_max.inc_by(now.evicted_max - self.counted.evicted_max);
        if now.late > self.counted.late {
            tracing::debug!(processor = %self.name, late = now.late - self.counted.late, "rows of closed buckets skipped");
        }
        self.counted = now;
    }
}

impl ArrowProcessor for Detector {
    fn needs(&self) -> Needs {
        Needs {
            signal: Signal::Metrics,
            columns: vec![
                schema::METRIC_NAME,
                schema::KIND,
                schema::VALUE,
                schema::TIME,
                schema::SERVICE_VERSION,
                schema::SERVICE_INSTANCE_ID,
                schema::RESOURCE_ATTRIBUTES,
                schema::ATTRIBUTES,
            ],
        }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.parts.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        self.features.push_batch(batch)?;
        self.count_dropped();
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let windows = self.features.advance(watermark_ns);
        if !windows.is_empty() {
            match self.score(&windows) {
                Ok(scores) => {
                    let mut o = Output::new();
                    let signals = &self.parts.card.signals;
                    for (w, s) in windows.iter().zip(scores) {
                        let top = signals.get(s.top_signal).map(String::as_str).unwrap_or_default();
                        o.score(
                            &self.resource,
                            &self.scope,
                            &w.group.attributes(),
                            w.end_ns,
                            self.parts.detector,
                            &self.parts.card.name,
                            s.error,
                            self.parts.levels.level(s.error),
                            &[
                                kv_f64(&self.keys[0], s.error),
                                kv_str(&self.keys[1], top),
                                kv_i64(&self.keys[2], s.missing as i64),
                            ],
                        );
                    }
                    o.emit(out)?;
                }
                Err(e) => {
                    tracing::warn!(processor = %self.name, windows = windows.len(), error = %e, "model run failed; windows not scored");
                }
            }
        }
        if watermark_ns != u64::MAX {
            self.features.evict_idle(watermark_ns);
        }
        self.count_dropped();
        Ok(())
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.features
            .snapshot()
            .map_err(|e| StateError::Corrupt { key: self.name.clone(), message: format!("cannot serialize: {e}") })
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let mut fresh = Features::new(&self.parts.card, self.parts.limits);
        fresh.restore(bytes).map_err(|e| StateError::Corrupt { key: self.name.clone(), message: e.to_string() })?;
        self.features = fresh;
        self.counted = Dropped::default();
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.features.group_count()
    }
}
