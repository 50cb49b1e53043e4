//! Processor `zscore_skew`: windowed z-score with a skew penalty (docs/detectors/zscore_skew.md), per series, O(1) per point.
//!
//! For each series of the configured metrics, the point at index i = w, w+s, w+2s, … (counting
//! the series' finite points) is scored against the w points before it:
//! `score = |x − mean| / (std + 1e-8) + 0.3·|G1|`, with the standard deviation floored (an
//! absolute and a relative floor, and the quantisation step of a window of few distinct values:
//! see [`window::Floors`]), and emitted as `llm.anomaly.score` and `llm.anomaly.level` at the
//! point's own timestamp. The rolling moments and their accuracy scheme are in [`window`];
//! semantics and outputs: docs/detectors/zscore_skew.md.

pub mod state;
pub mod window;

use crate::detect::adapter::Adapter;
pub use crate::detect::level::LevelConfig;
use crate::detect::limits::{self, Limits, SeriesLimits, with_series_limits};
use crate::detect::rows::column;
use crate::detect::{self, Output, kv_f64, kv_i64};
use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt8Array, UInt64Array};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, metrics, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use serde::Deserialize;
use state::{Params, SeriesMeta, State};
use std::collections::HashSet;
use std::time::Duration;
use window::Path;

/// Version of the checkpoint format written by [`ZscoreSkew`] (2: the detector kit's series map
/// envelope; version 1 checkpoints are refused).
pub const STATE_VERSION: u32 = 2;
/// The `detector` attribute of the output.
pub const DETECTOR: &str = "zscore_skew";
/// Largest accepted `window`.
pub const MAX_WINDOW: usize = 10_000;

/// How windows of few distinct values (bucketed percentiles, integers) are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuantisedConfig {
    /// A window with at most this many distinct values is quantised (default 4; 0 = off; ≤ 16).
    pub max_distinct: usize,
    /// Assumed step of a constant window, relative to |value| (default 0.5).
    pub constant_step: f64,
}

impl Default for QuantisedConfig {
    fn default() -> Self {
        QuantisedConfig { max_distinct: 4, constant_step: 0.5 }
    }
}

/// Settings of `zscore_skew`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct ZscoreSkewConfig {
    /// Exact names of the metrics to score (at least one).
    pub metrics: Vec<String>,
    /// Window length w in points (default 50; 3..=10000, the spec's range is 30..100).
    pub window: usize,
    /// Step s between scored points (default 1; ≥ 1, the spec's range is 1..5).
    pub step: usize,
    /// `max_series` (default 10000; beyond it the least recently seen 10 % are evicted) and
    /// `idle_timeout` (default 1h; > 0), top-level keys; no `allowed_lateness` (no windows).
    #[serde(skip)]
    pub limits: SeriesLimits,
    /// Score → level mapping (default 3 → 0, 6 → 1).
    pub level: LevelConfig,
    /// Absolute floor on the standard deviation, in the metric's unit (default 0).
    pub min_std: f64,
    /// Floor on the standard deviation relative to |mean| (default 0.05).
    pub min_relative_std: f64,
    /// Scale of windows of few distinct values.
    pub quantised: QuantisedConfig,
}

impl Default for ZscoreSkewConfig {
    fn default() -> Self {
        ZscoreSkewConfig {
            metrics: Vec::new(),
            window: 50,
            step: 1,
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(3600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
            level: LevelConfig::default(),
            min_std: 0.0,
            min_relative_std: 0.05,
            quantised: QuantisedConfig::default(),
        }
    }
}

with_series_limits!(ZscoreSkewConfig, limits::NO_LATENESS);

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    step: u64,
    level: LevelConfig,
    floors: window::Floors,
    metrics: HashSet<String>,
}

impl ZscoreSkewConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        if self.metrics.is_empty() {
            return Err(FieldError::at("metrics", "must name at least one metric"));
        }
        if let Some(i) = self.metrics.iter().position(|m| m.is_empty()) {
            let mut e = FieldError::at("metrics", "metric names must not be empty");
            e.path.push(inferwatch_core::component::PathSeg::Index(i));
            return Err(e);
        }
        if !(window::MIN_WINDOW..=MAX_WINDOW).contains(&self.window) {
            return Err(FieldError::at(
                "window",
                format!("must be between {} and {MAX_WINDOW} points, got {}", window::MIN_WINDOW, self.window),
            ));
        }
        if self.step == 0 {
            return Err(FieldError::at("step", "must be at least 1"));
        }
        let Limits { max_series, idle_ns, .. } = self.limits.check()?;
        if idle_ns == 0 {
            return Err(FieldError::at("idle_timeout", "must be greater than 0"));
        }
        let LevelConfig { zero, one } = self.level;
        if !zero.is_finite() {
            return Err(FieldError::at("level.zero", format!("must be a finite number, got {zero}")));
        }
        if !(one.is_finite() && one > zero) {
            return Err(FieldError::at("level.one", format!("must be a finite number above level.zero, got {one}")));
        }
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        for (key, v) in [
            ("min_std", self.min_std),
            ("min_relative_std", self.min_relative_std),
            ("quantised.constant_step", self.quantised.constant_step),
        ] {
            if !non_negative(v) {
                return Err(FieldError::at(key, format!("must be a finite number ≥ 0, got {v}")));
            }
        }
        let max_distinct = self.quantised.max_distinct;
        if max_distinct > window::MAX_DISTINCT {
            return Err(FieldError::at(
                "quantised.max_distinct",
                format!("must be at most {}, got {max_distinct}", window::MAX_DISTINCT),
            ));
        }
        Ok(Checked {
            params: Params { window: self.window, max_series, idle_ns, max_distinct },
            step: self.step as u64,
            level: self.level,
            floors: window::Floors {
                min_std: self.min_std,
                min_relative_std: self.min_relative_std,
                constant_step: if max_distinct == 0 { 0.0 } else { self.quantised.constant_step },
            },
            metrics: self.metrics.iter().cloned().collect(),
        })
    }
}

/// Factory of `zscore_skew`.
pub struct ZscoreSkewFactory;

inferwatch_core::arrow_processor_factory!(ZscoreSkewFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for ZscoreSkewFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<ZscoreSkewConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only("zscore_skew", signal)?;
        Ok(Box::new(ZscoreSkew::from_checked(&ctx, inferwatch_core::component::typed::<Checked>(parsed)?.clone())))
    }
}

/// How many scores took each path since the start (see [`window::Path`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// From the running sums.
    pub fast: u64,
    /// After rebuilding the sums.
    pub rebuilt: u64,
    /// From the exact two-pass path.
    pub exact: u64,
}

/// The running processor.
pub struct ZscoreSkew {
    cfg: Checked,
    state: State,
    kit: Adapter,
    paths: PathCounts,
}

impl ZscoreSkew {
    /// A processor with the settings `cfg` (as `create_arrow` builds it; public for benchmarks).
    pub fn new(ctx: &CreateContext, cfg: &serde_json::Value) -> Result<Self, ComponentError> {
        Ok(Self::from_checked(ctx, parse_config::<ZscoreSkewConfig>(cfg)?.check()?))
    }

    /// A processor with settings already parsed and checked.
    fn from_checked(ctx: &CreateContext, cfg: Checked) -> Self {
        ZscoreSkew {
            state: State::new(cfg.params),
            cfg,
            kit: Adapter::new(ctx, "zscore_skew"),
            paths: PathCounts::default(),
        }
    }

    /// Bytes of state held, estimated (see [`State::approx_bytes`]).
    pub fn approx_state_bytes(&self) -> usize {
        self.state.approx_bytes()
    }

    /// How many scores took each computation path.
    pub fn path_counts(&self) -> PathCounts {
        self.paths
    }
}

impl ArrowProcessor for ZscoreSkew {
    fn needs(&self) -> Needs {
        Needs {
            signal: Signal::Metrics,
            columns: vec![
                schema::SERIES_ID,
                schema::METRIC_NAME,
                schema::KIND,
                schema::VALUE,
                schema::TIME,
                schema::SERVICE_NAME,
                schema::SERVICE_VERSION,
                schema::SERVICE_INSTANCE_ID,
                schema::RESOURCE_ATTRIBUTES,
                schema::RESOURCE_DROPPED,
                schema::SCOPE_NAME,
                schema::SCOPE_VERSION,
                schema::SCOPE_ATTRIBUTES,
                schema::SCOPE_DROPPED,
                schema::ATTRIBUTES,
            ],
        }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        0
    }

    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let ids = column::<UInt64Array>(batch, schema::SERIES_ID)?;
        let names = column::<StringArray>(batch, schema::METRIC_NAME)?;
        let kinds = column::<UInt8Array>(batch, schema::KIND)?;
        let values = column::<Float64Array>(batch, schema::VALUE)?;
        let times = inferwatch_core::arrow::time_column(batch)?;
        let (w, step, level, floors) = (self.cfg.params.window as u64, self.cfg.step, self.cfg.level, self.cfg.floors);
        let filter = &self.cfg.metrics;
        let mut output = Output::new();
        let (mut evicted, mut skipped) = (0usize, 0usize);
        for row in 0..batch.num_rows() {
            let kind = kinds.value(row);
            if (kind != schema::kind::GAUGE && kind != schema::kind::SUM) || values.is_null(row) {
                continue;
            }
            let x = values.value(row);
            if !x.is_finite() {
                skipped += 1;
                continue;
            }
            // The column holds the OTLP fixed64 bit pattern.
            let time = times.value(row) as u64;
            let (series, n) = self.state.series(ids.value(row), time, || {
                let name = names.value(row);
                if !filter.contains(name) {
                    return Ok::<_, ConvError>(None);
                }
                Ok(Some(SeriesMeta {
                    metric: name.to_string(),
                    resource: metrics::row_resource(batch, row)?,
                    scope: metrics::row_scope(batch, row)?,
                    attributes: metrics::row_attributes(batch, row)?,
                    ..Default::default()
                }))
            })?;
            evicted += n;
            let Some(s) = series else { continue };
            let i = s.seen;
            if i >= w
                && (i - w) % step == 0
                && let Some(sc) = s.window.score(x)
            {
                let sc = sc.floored(&floors, s.window.quantum());
                match sc.path {
                    Path::Fast => self.paths.fast += 1,
                    Path::Rebuilt => self.paths.rebuilt += 1,
                    Path::Exact => self.paths.exact += 1,
                }
                let m = &s.meta;
                output.score(
                    &m.resource,
                    &m.scope,
                    &m.attributes,
                    time,
                    DETECTOR,
                    &m.metric,
                    sc.score,
                    detect::linear_level(sc.score, level.zero, level.one),
                    &[
                        kv_i64("window", w as i64),
                        kv_f64("zscore.mean", sc.mean),
                        kv_f64("zscore.std", sc.std),
                        kv_f64("zscore.scale", sc.scale),
                        kv_f64("zscore.skew", sc.skew),
                        kv_f64("value", x),
                    ],
                );
            }
            s.window.push(x);
            s.seen += 1;
        }
        self.kit.evicted_max(evicted);
        if skipped > 0 {
            tracing::debug!(processor = %self.kit.name(), skipped, "NaN or infinite points skipped");
        }
        output.emit(out)
    }

    fn advance(&mut self, watermark_ns: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        // The end of input (u64::MAX) has nothing to emit: the series are kept, not counted as idle.
        if watermark_ns == u64::MAX {
            return Ok(());
        }
        let idle = self.state.evict_idle(watermark_ns);
        self.kit.evicted_idle(idle);
        Ok(())
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.kit.snapshot(self.state.snapshot())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.state = self.kit.restore(State::new(self.cfg.params), bytes, State::restore)?;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}
