//! Processor `coupled_model`: the four-signal coupled model (docs/detectors/coupled_model.md), fitted online per group.
//!
//! `L = α·(1/T) + β·F + γ·(1 − Q) + c + ε` (L e2e latency, T throughput, F TTFT, Q quality) is
//! fitted per (model, version, instance) by recursive least squares with exponential forgetting
//! ([`rls`]) on event-time buckets of `align` in which the inputs are joined (last value of
//! each). Each completed bucket emits the coefficients and R² as gauges and, after `min_updates`,
//! the standardised prediction error as `llm.anomaly.score` / `llm.anomaly.level` with its
//! attribution ([`fit`]). Semantics: docs/detectors/coupled_model.md.

pub mod fit;
pub mod rls;
pub mod state;

use crate::detect::config::nanos;
use crate::detect::group;
use crate::detect::level::LevelConfig;
use crate::detect::limits::SeriesLimits;
use crate::detect::rows::{self, Rows};
use crate::detect::{Output, Point, kv_f64, kv_i64, kv_str};
use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt8Array};
use fit::{Model, Shape, Step};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus_client::metrics::counter::Counter;
use prost::Message;
use serde::Deserialize;
use state::{Bucket, Input, Params, State};
use std::collections::HashMap;
use std::time::Duration;

/// Version of the checkpoint format written by [`CoupledModel`].
pub const STATE_VERSION: u32 = 2;
/// The `detector` attribute of the output.
pub const DETECTOR: &str = "coupled_model";
/// Gauge of α (coefficient of 1/T).
pub const ALPHA: &str = "llm.coupled.alpha";
/// Gauge of β (coefficient of F).
pub const BETA: &str = "llm.coupled.beta";
/// Gauge of γ (coefficient of 1 − Q).
pub const GAMMA: &str = "llm.coupled.gamma";
/// Gauge of the exponentially weighted R².
pub const R2: &str = "llm.coupled.r2";

/// Starting values of the coefficients (the study's fit).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Initial {
    /// α (default 0.38).
    pub alpha: f64,
    /// β (default 0.52).
    pub beta: f64,
    /// γ (default 0.29).
    pub gamma: f64,
}

impl Default for Initial {
    fn default() -> Self {
        Initial { alpha: 0.38, beta: 0.52, gamma: 0.29 }
    }
}

/// Settings of `coupled_model`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct CoupledModelConfig {
    /// End-to-end latency L (default llm.e2e.p95).
    pub latency_metric: String,
    /// Throughput T, > 0 (default llm.tokens.output.rate).
    pub throughput_metric: String,
    /// Time to first token F (default llm.ttft.p95).
    pub ttft_metric: String,
    /// Quality Q in [0, 1], optional (default none: Q = 1 and γ not fitted).
    pub quality_metric: Option<String>,
    /// Attributes forming a group (point attribute, else resource attribute).
    pub group_by: Vec<String>,
    /// Length of the tumbling event-time buckets in which the inputs are joined (default 1m).
    pub align: GoDuration,
    /// Forgetting factor λ of the fit, R² and running means (default 0.995; 0.5..=1).
    pub forgetting: f64,
    /// Starting coefficients.
    pub initial: Initial,
    /// Whether an intercept is fitted (default true).
    pub intercept: bool,
    /// Updates before scores are emitted (default 30; ≥ 1).
    pub min_updates: u64,
    /// Standardised residual → level mapping (default 3 → 0, 6 → 1).
    pub residual_level: LevelConfig,
    /// `allowed_lateness` (default 0s), `max_series` (default 10000; groups held, beyond it the
    /// least recently seen 10 % are evicted) and `idle_timeout` (default 1h; > align; event time
    /// without input after which a group is forgotten), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

crate::detect::limits::with_series_limits!(CoupledModelConfig, crate::detect::limits::ALL);

impl Default for CoupledModelConfig {
    fn default() -> Self {
        CoupledModelConfig {
            latency_metric: "llm.e2e.p95".into(),
            throughput_metric: "llm.tokens.output.rate".into(),
            ttft_metric: "llm.ttft.p95".into(),
            quality_metric: None,
            group_by: vec![
                "gen_ai.request.model".into(),
                schema::SERVICE_VERSION.into(),
                schema::SERVICE_INSTANCE_ID.into(),
            ],
            align: GoDuration(Duration::from_secs(60)),
            forgetting: 0.995,
            initial: Initial::default(),
            intercept: true,
            min_updates: 30,
            residual_level: LevelConfig::default(),
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(3600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    shape: Shape,
    theta0: Vec<f64>,
    roles: HashMap<String, Input>,
    latency_metric: String,
    group_by: Vec<String>,
    align_ns: u64,
    lateness_ns: u64,
    lambda: f64,
    min_updates: u64,
    level: LevelConfig,
}

impl CoupledModelConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        let mut roles = HashMap::new();
        let quality = self.quality_metric.as_ref().map(|q| ("quality_metric", q, Input::Quality));
        for (key, name, input) in [
            ("latency_metric", &self.latency_metric, Input::Latency),
            ("throughput_metric", &self.throughput_metric, Input::Throughput),
            ("ttft_metric", &self.ttft_metric, Input::Ttft),
        ]
        .into_iter()
        .chain(quality)
        {
            if name.is_empty() {
                return Err(FieldError::at(key, "must name a metric"));
            }
            if roles.insert(name.clone(), input).is_some() {
                return Err(FieldError::at(key, format!("{name} is already another input")));
            }
        }
        if self.group_by.iter().any(|g| g.is_empty()) {
            return Err(FieldError::at("group_by", "attribute names must not be empty"));
        }
        let align_ns = nanos("align", &self.align)?;
        if align_ns == 0 {
            return Err(FieldError::at("align", "must be greater than 0"));
        }
        if !(self.forgetting.is_finite() && (0.5..=1.0).contains(&self.forgetting)) {
            return Err(FieldError::at("forgetting", format!("must be between 0.5 and 1, got {}", self.forgetting)));
        }
        let Initial { alpha, beta, gamma } = self.initial;
        for (key, v) in [("initial.alpha", alpha), ("initial.beta", beta), ("initial.gamma", gamma)] {
            if !v.is_finite() {
                return Err(FieldError::at(key, format!("must be a finite number, got {v}")));
            }
        }
        if self.min_updates == 0 {
            return Err(FieldError::at("min_updates", "must be at least 1"));
        }
        let LevelConfig { zero, one } = self.residual_level;
        if !(zero.is_finite() && zero >= 0.0) {
            return Err(FieldError::at("residual_level.zero", format!("must be a finite number ≥ 0, got {zero}")));
        }
        if !(one.is_finite() && one > zero) {
            return Err(FieldError::at(
                "residual_level.one",
                format!("must be a finite number above residual_level.zero, got {one}"),
            ));
        }
        let limits = self.limits.check()?;
        if limits.idle_ns <= align_ns {
            return Err(FieldError::at("idle_timeout", "must be longer than align"));
        }
        let shape = Shape { quality: self.quality_metric.is_some(), intercept: self.intercept };
        let mut theta0 = vec![alpha, beta];
        if shape.quality {
            theta0.push(gamma);
        }
        if shape.intercept {
            theta0.push(0.0);
        }
        Ok(Checked {
            params: Params { max_series: limits.max_series, idle_ns: limits.idle_ns, dim: shape.dim() },
            shape,
            theta0,
            roles,
            latency_metric: self.latency_metric.clone(),
            group_by: self.group_by.clone(),
            align_ns,
            lateness_ns: limits.lateness_ns,
            lambda: self.forgetting,
            min_updates: self.min_updates,
            level: self.residual_level,
        })
    }
}

/// Factory of `coupled_model`.
pub struct CoupledModelFactory;

inferwatch_core::arrow_processor_factory!(CoupledModelFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for CoupledModelFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<CoupledModelConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only(DETECTOR, signal)?;
        Ok(Box::new(CoupledModel::from_checked(&ctx, inferwatch_core::component::typed::<Checked>(parsed)?.clone())))
    }
}

/// Input points and buckets not used, by reason, since the start (not checkpointed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Input points with a NaN or infinite value.
    pub non_finite: u64,
    /// Input points out of their domain: T ≤ 0, L or F < 0, Q outside [0, 1].
    pub out_of_domain: u64,
    /// Input points for a bucket already closed.
    pub late: u64,
    /// Closed buckets lacking an input (no output).
    pub incomplete: u64,
    /// Model updates dropped as numerically unusable (P reset).
    pub resets: u64,
}

/// The running processor.
pub struct CoupledModel {
    cfg: Checked,
    state: State,
    name: String,
    evicted_idle: Counter,
    evicted_max: Counter,
    skipped: Skipped,
}

impl CoupledModel {
    /// A processor with the settings `cfg` (as `create_arrow` builds it).
    pub fn new(ctx: &CreateContext, cfg: &serde_json::Value) -> Result<Self, ComponentError> {
        Ok(Self::from_checked(ctx, parse_config::<CoupledModelConfig>(cfg)?.check()?))
    }

    /// A processor with settings already parsed and checked.
    fn from_checked(ctx: &CreateContext, cfg: Checked) -> Self {
        CoupledModel {
            state: State::new(cfg.params),
            cfg,
            name: ctx.id.to_string(),
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
            skipped: Skipped::default(),
        }
    }

    /// What was skipped since the start.
    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> StateError {
        StateError::Corrupt { key: self.name.clone(), message: message.to_string() }
    }
}

/// Whether `value` of `input` is in its domain.
fn in_domain(input: Input, value: f64) -> bool {
    match input {
        Input::Latency | Input::Ttft => value >= 0.0,
        Input::Throughput => value > 0.0,
        Input::Quality => (0.0..=1.0).contains(&value),
    }
}

impl Checked {
    /// The group of a row: each `group_by` attribute from the point, else the resource ("" when
    /// neither has it); `gen_ai.request.model` falls back to the point attribute `model_name`.
    fn group_of(&self, rows: &mut Rows<'_>, row: usize, attrs: &[KeyValue]) -> Result<Vec<String>, ConvError> {
        group::values(&self.group_by, rows, row, attrs, true)
    }

    /// The group's output attributes (the non-empty `group_by` values).
    fn group_attributes(&self, key: &[String]) -> Vec<KeyValue> {
        self.group_by.iter().zip(key).filter(|(_, v)| !v.is_empty()).map(|(k, v)| kv_str(k, v.clone())).collect()
    }

    /// The outputs of one closed bucket with all inputs: gauges of the coefficients and R², and
    /// (after `min_updates`) score and level with their evidence.
    fn emit(
        &self,
        out: &mut Output,
        key: &[String],
        bucket: &Bucket,
        joined: &Joined,
        model: &Model,
        step: &Step,
    ) -> Result<(), ConvError> {
        let resource = Resource::decode(bucket.resource.as_slice())?;
        let scope = InstrumentationScope::decode(bucket.scope.as_slice())?;
        let group = self.group_attributes(key);
        let theta = model.theta();
        // The coefficients are in the units of the inputs (docs/detectors/coupled_model.md):
        // no unit, so no `_ratio`; R² is a fraction of variance, a true ratio.
        let mut gauges = vec![(ALPHA, theta[0], ""), (BETA, theta[1], "")];
        if self.shape.quality {
            gauges.push((GAMMA, theta[2], ""));
        }
        let r2 = model.r2();
        if let Some(r2) = r2 {
            gauges.push((R2, r2, "1"));
        }
        for (name, value, unit) in gauges {
            out.push(Point {
                resource: resource.clone(),
                scope: scope.clone(),
                name,
                unit,
                time_ns: joined.time,
                value,
                attributes: group.clone(),
            });
        }
        let (Some(score), Some(std)) = (step.score, step.residual_std) else { return Ok(()) };
        if step.updates_before < self.min_updates {
            return Ok(());
        }
        let mut evidence = vec![
            kv_f64("coupled.predicted", step.predicted),
            kv_f64("coupled.residual", step.residual),
            kv_f64("coupled.residual_std", std),
        ];
        evidence
            .extend(step.contributions.iter().map(|(t, c)| kv_f64(&format!("coupled.contribution.{}", t.name()), *c)));
        evidence.push(kv_str("coupled.attribution", step.attribution));
        evidence.push(kv_f64("coupled.latency", joined.latency));
        evidence.push(kv_f64("coupled.throughput", joined.throughput));
        evidence.push(kv_f64("coupled.ttft", joined.ttft));
        if let Some(q) = joined.quality {
            evidence.push(kv_f64("coupled.quality", q));
        }
        if let Some(r2) = r2 {
            evidence.push(kv_f64("coupled.r2", r2));
        }
        evidence.push(kv_i64("coupled.updates", i64::try_from(step.updates_before).unwrap_or(i64::MAX)));
        let level = self.level.level(score);
        out.score(&resource, &scope, &group, joined.time, DETECTOR, &self.latency_metric, score, level, &evidence);
        Ok(())
    }
}

/// The inputs of one complete bucket.
struct Joined {
    /// Output time: the latency point's event time.
    time: u64,
    latency: f64,
    throughput: f64,
    ttft: f64,
    quality: Option<f64>,
}

impl Joined {
    fn of(bucket: &Bucket, quality: bool) -> Option<Joined> {
        let latency = bucket.get(Input::Latency)?;
        let q = if quality { Some(bucket.get(Input::Quality)?.value) } else { None };
        Some(Joined {
            time: latency.time,
            latency: latency.value,
            throughput: bucket.get(Input::Throughput)?.value,
            ttft: bucket.get(Input::Ttft)?.value,
            quality: q,
        })
    }
}

impl ArrowProcessor for CoupledModel {
    fn needs(&self) -> Needs {
        Needs { signal: Signal::Metrics, columns: rows::COLUMNS.to_vec() }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut rows = Rows::new(batch)?;
        let names = rows::column::<StringArray>(batch, schema::METRIC_NAME)?;
        let kinds = rows::column::<UInt8Array>(batch, schema::KIND)?;
        let values = rows::column::<Float64Array>(batch, schema::VALUE)?;
        let cfg = &self.cfg;
        let mut evicted = 0usize;
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else {
                let number = matches!(kinds.value(row), schema::kind::GAUGE | schema::kind::SUM);
                if number && !values.is_null(row) && cfg.roles.contains_key(names.value(row)) {
                    self.skipped.non_finite += 1;
                }
                continue;
            };
            let Some(&input) = cfg.roles.get(p.name) else { continue };
            if !in_domain(input, p.value) {
                self.skipped.out_of_domain += 1;
                continue;
            }
            let b = p.time / cfg.align_ns;
            if b < self.state.closed_below {
                self.skipped.late += 1;
                continue;
            }
            let attrs = rows.attributes(row)?;
            let key = cfg.group_of(&mut rows, row, &attrs)?;
            let (n, group) = self.state.touch(key, p.time, || Model::new(cfg.theta0.clone(), rls::DEFAULT_DELTA));
            evicted += n;
            let Some(group) = group else { continue };
            let bucket = group.buckets.entry(b).or_default();
            if bucket.set(input, p.time, p.value) && input == Input::Latency {
                bucket.resource = rows.resource(row)?.encode_to_vec();
                bucket.scope = rows.scope(row)?.encode_to_vec();
            }
        }
        if evicted > 0 {
            self.evicted_max.inc_by(evicted as u64);
            tracing::debug!(processor = %self.name, evicted, "coupled_model: groups evicted at max_series");
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        // Bucket b covers [b·align, (b+1)·align): it is complete once the watermark reaches its end.
        let limit = if watermark_ns == u64::MAX { u64::MAX } else { watermark_ns / self.cfg.align_ns };
        let cfg = &self.cfg;
        let mut output = Output::new();
        let (mut incomplete, mut resets) = (0u64, 0u64);
        if limit > self.state.closed_below {
            self.state.closed_below = limit;
            for (key, group) in self.state.series.iter_mut() {
                while let Some(entry) = group.buckets.first_entry() {
                    if *entry.key() >= limit {
                        break;
                    }
                    let bucket = entry.remove();
                    let Some(joined) = Joined::of(&bucket, cfg.shape.quality) else {
                        incomplete += 1;
                        continue;
                    };
                    let x = cfg.shape.regressors(joined.throughput, joined.ttft, joined.quality.unwrap_or(1.0));
                    let step = group.model.step(cfg.shape, &x, joined.latency, cfg.lambda);
                    if step.reset {
                        resets += 1;
                    }
                    cfg.emit(&mut output, key, &bucket, &joined, &group.model, &step)?;
                }
            }
        }
        self.skipped.incomplete += incomplete;
        self.skipped.resets += resets;
        if resets > 0 {
            tracing::warn!(processor = %self.name, resets, "coupled_model: numerically unusable updates dropped, P reset");
        }
        if incomplete > 0 {
            tracing::debug!(processor = %self.name, incomplete, "coupled_model: buckets closed without every input");
        }
        // The end of input (u64::MAX) closes every bucket but leaves the groups (not idle).
        if watermark_ns != u64::MAX {
            let idle = self.state.expire(watermark_ns);
            if idle > 0 {
                self.evicted_idle.inc_by(idle as u64);
                tracing::debug!(processor = %self.name, idle, "coupled_model: forgot idle groups");
            }
        }
        output.emit(out)
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.state.snapshot().map_err(|e| self.corrupt(format!("cannot serialize coupled_model state: {e}")))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let mut fresh = State::new(self.cfg.params);
        fresh.restore(bytes).map_err(|e| self.corrupt(format!("coupled_model state: {e}")))?;
        self.state = fresh;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}
