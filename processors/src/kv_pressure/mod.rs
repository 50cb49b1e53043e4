//! Processor `kv_pressure`: KV-cache pressure and fragmentation per (model, version, instance)
//! (docs/detectors/kv_pressure.md).
//!
//! Reads the KV-cache usage, preemption rate, prefix-cache hit rate and queue p99 signals (as
//! `llm_signals` emits them), and the fragmentation index KVF where the allocator state is known
//! (a KVF gauge, or the free runs of the block pool). On each input point it evaluates the
//! conditions on the group's latest fresh values and emits `llm.anomaly.score` (weighted sum of
//! the conditions) and `llm.anomaly.level` at the point's timestamp (without `output_metric`, the
//! group's level only on an input whose own condition is met, else 0). The low-hit-rate condition
//! waits for a warm-up after the group's (re)start (a cold prefix cache is expected then).
//! Semantics: docs/detectors/kv_pressure.md.

pub mod alloc;
pub mod assess;
pub mod state;

use crate::detect::config::nanos;
use crate::detect::limits::SeriesLimits;
use crate::detect::rows::{self, Rows};
use crate::detect::{Output, kv_f64, kv_i64, kv_str};
use arrow_array::{Array, RecordBatch, TimestampNanosecondArray};
use assess::{Flags, Input, Thresholds};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use state::{FreeSpace, Group, GroupKey, Params, State};
use std::collections::BTreeMap;
use std::time::Duration;

/// Version of the checkpoint format written by [`KvPressure`].
pub const STATE_VERSION: u32 = 3;
/// The `detector` attribute of the output.
pub const DETECTOR: &str = "kv_pressure";

/// Settings of `kv_pressure`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct KvPressureConfig {
    /// KV-cache usage fraction (default llm.kv_cache.usage).
    pub usage_metric: String,
    /// Preemptions per second (default llm.preemption.rate).
    pub preemption_metric: String,
    /// Prefix-cache hit rate (default llm.prefix_cache.hit_rate).
    pub hit_rate_metric: String,
    /// Queue time p99 in seconds (default llm.queue.p99).
    pub queue_p99_metric: String,
    /// Fragmentation index KVF, optional (default llm.kv_cache.fragmentation; "" = none).
    pub kvf_metric: String,
    /// Lengths of the free runs of the block pool, one point per run, optional (default llm.kv_cache.free_runs; "" = none).
    pub free_runs_metric: String,
    /// Thresholds of the conditions.
    pub thresholds: Thresholds,
    /// The `metric` attribute of every output ("" = the input's name, the default; a fixed name
    /// gives one alert per group instead of one per input, the input then in `kv_pressure.input`).
    pub output_metric: String,
    /// Age after which an input's latest value no longer counts (default 5m; > 0).
    pub stale_after: GoDuration,
    /// `allowed_lateness` (default 0s), `max_series` (default 1000; groups held, beyond it the
    /// least recently seen 10 % are evicted) and `idle_timeout` (default 10m; event time without
    /// input after which a group is forgotten), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
    /// Event time after a group's (re)start during which a low hit rate is not flagged (default
    /// 10m; 0s = no warm-up).
    pub warmup: GoDuration,
    /// A group point more than this after its previous point is a restart (default 2m; 0s = never).
    pub restart_gap: GoDuration,
    /// Cumulative counters whose drop, or later start time, is a restart of their group (default
    /// vLLM's prefix-cache query counters; read only where the raw scrape is routed here).
    pub reset_metrics: Vec<String>,
}

crate::detect::limits::with_series_limits!(KvPressureConfig, crate::detect::limits::ALL);

impl Default for KvPressureConfig {
    fn default() -> Self {
        KvPressureConfig {
            usage_metric: "llm.kv_cache.usage".into(),
            preemption_metric: "llm.preemption.rate".into(),
            hit_rate_metric: "llm.prefix_cache.hit_rate".into(),
            queue_p99_metric: "llm.queue.p99".into(),
            kvf_metric: "llm.kv_cache.fragmentation".into(),
            free_runs_metric: "llm.kv_cache.free_runs".into(),
            thresholds: Thresholds::default(),
            output_metric: String::new(),
            stale_after: GoDuration(Duration::from_secs(300)),
            limits: SeriesLimits {
                max_series: 1000,
                idle_timeout: GoDuration(Duration::from_secs(600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
            warmup: GoDuration(Duration::from_secs(600)),
            restart_gap: GoDuration(Duration::from_secs(120)),
            reset_metrics: DEFAULT_RESET_METRICS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The default `reset_metrics`: vLLM's prefix-cache query counters, current and older names.
pub const DEFAULT_RESET_METRICS: [&str; 4] = [
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries",
];

/// What a metric name is to this processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// One of the value inputs.
    Value(Input),
    /// One free run of the block pool.
    FreeRun,
    /// A cumulative counter whose reset restarts the warm-up.
    Reset,
}

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    lateness_ns: u64,
    stale_ns: u64,
    warmup_ns: u64,
    thresholds: Thresholds,
    roles: BTreeMap<String, Role>,
    output_metric: String,
}

impl KvPressureConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        let mut roles = BTreeMap::new();
        for (key, name, role, required) in [
            ("usage_metric", &self.usage_metric, Role::Value(Input::Usage), true),
            ("preemption_metric", &self.preemption_metric, Role::Value(Input::PreemptionRate), true),
            ("hit_rate_metric", &self.hit_rate_metric, Role::Value(Input::HitRate), true),
            ("queue_p99_metric", &self.queue_p99_metric, Role::Value(Input::QueueP99), true),
            ("kvf_metric", &self.kvf_metric, Role::Value(Input::Kvf), false),
            ("free_runs_metric", &self.free_runs_metric, Role::FreeRun, false),
        ] {
            if name.is_empty() {
                if required {
                    return Err(FieldError::at(key, "must name a metric"));
                }
                continue;
            }
            if roles.insert(name.clone(), role).is_some() {
                return Err(FieldError::at(key, format!("{name} is already another input")));
            }
        }
        for (i, name) in self.reset_metrics.iter().enumerate() {
            let problem = if name.is_empty() {
                Some("must not be empty".to_string())
            } else if roles.get(name).is_some_and(|r| *r != Role::Reset) {
                Some(format!("{name} is already another input"))
            } else {
                None
            };
            if let Some(p) = problem {
                let mut e = FieldError::at("reset_metrics", p);
                e.path.push(inferwatch_core::component::PathSeg::Index(i));
                return Err(e);
            }
            roles.insert(name.clone(), Role::Reset);
        }
        let t = &self.thresholds;
        let in_unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        for (key, ok) in [
            ("thresholds.usage", in_unit(t.usage)),
            ("thresholds.hit_rate", in_unit(t.hit_rate)),
            ("thresholds.queue_p99_s", non_negative(t.queue_p99_s)),
            ("thresholds.preemption_rate", non_negative(t.preemption_rate)),
            ("thresholds.kvf", in_unit(t.kvf)),
        ] {
            if !ok {
                return Err(FieldError::at(key, "out of range (fractions in [0, 1], others finite and ≥ 0)"));
            }
        }
        let stale_ns = nanos("stale_after", &self.stale_after)?;
        if stale_ns == 0 {
            return Err(FieldError::at("stale_after", "must be greater than 0"));
        }
        let limits = self.limits.check()?;
        Ok(Checked {
            params: Params {
                max_series: limits.max_series,
                idle_ns: limits.idle_ns,
                restart_gap_ns: nanos("restart_gap", &self.restart_gap)?,
            },
            lateness_ns: limits.lateness_ns,
            stale_ns,
            warmup_ns: nanos("warmup", &self.warmup)?,
            thresholds: self.thresholds,
            roles,
            output_metric: self.output_metric.clone(),
        })
    }
}

/// Factory of `kv_pressure`.
pub struct KvPressureFactory;

inferwatch_core::arrow_processor_factory!(KvPressureFactory, "kv_pressure", &[Signal::Metrics]);

impl ArrowProcessorFactory for KvPressureFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<KvPressureConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only(DETECTOR, signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(KvPressure::new(checked, &ctx)))
    }
}

/// The running processor.
pub struct KvPressure {
    cfg: Checked,
    state: State,
    name: String,
    evicted_idle: Counter,
    evicted_max: Counter,
}

/// The free runs of one group at one time, collected over a batch.
struct PendingRuns {
    runs: Vec<u64>,
    resource: Resource,
    scope: InstrumentationScope,
}

/// The series of a counter point: `name{k=v,…}`, the point attributes sorted by key.
fn counter_key(name: &str, attrs: &[KeyValue]) -> String {
    let mut pairs: Vec<(&str, String)> = attrs
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.as_str(), v)
        })
        .collect();
    pairs.sort();
    let body: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name}{{{}}}", body.join(","))
}

/// The input attributes of an output: the point's own, then the group's where the point lacks them.
fn with_group(mut attrs: Vec<KeyValue>, key: &GroupKey) -> Vec<KeyValue> {
    for kv in key.attributes() {
        if !attrs.iter().any(|a| a.key == kv.key) {
            attrs.push(kv);
        }
    }
    attrs
}

impl Checked {
    /// The `metric` attribute of an output for input `name`.
    fn metric<'a>(&'a self, name: &'a str) -> &'a str {
        if self.output_metric.is_empty() { name } else { &self.output_metric }
    }

    /// Score, level and evidence of group `g` at `now`, for a point of input metric `input` (of
    /// role `role`). During the group's warm-up, and until its hit rate has once been at or above
    /// the threshold, a low hit rate meets no condition (the others are unchanged). Without
    /// `output_metric` each input is its own alert, so the group's level goes only on the inputs
    /// whose condition is met (0 on the others: one queue-blocking window is one alert, not four).
    fn evaluate(&self, g: &Group, now: u64, input: &str, role: Input) -> (f64, f64, Vec<KeyValue>) {
        let inputs = g.fresh(now, self.stale_ns);
        let mut flags = Flags::of(&inputs, &self.thresholds);
        let warming = inputs.get(Input::HitRate).is_some() && g.warming_up(now, self.warmup_ns);
        if warming || !g.hit_rate_seen_high {
            flags.hit_rate_low = false;
        }
        let mut evidence: Vec<KeyValue> =
            Input::ALL.iter().filter_map(|&i| inputs.get(i).map(|v| kv_f64(i.evidence_key(), v))).collect();
        if warming {
            let left = g.warm_from.saturating_add(self.warmup_ns).saturating_sub(now);
            evidence.push(kv_f64("kv_pressure.warmup_left_s", left as f64 / 1e9));
        }
        if let Some(f) = g.free.filter(|f| f.time.saturating_add(self.stale_ns) >= now) {
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            evidence.push(kv_i64("kv_pressure.free_blocks", count(f.free_blocks)));
            evidence.push(kv_i64("kv_pressure.largest_free_run", count(f.largest_run)));
        }
        evidence.push(kv_str("kv_pressure.flags", flags.names()));
        if !self.output_metric.is_empty() {
            evidence.push(kv_str("kv_pressure.input", input));
        }
        let level = if self.output_metric.is_empty() && !flags.involves(role) { 0.0 } else { flags.level() };
        (flags.score(), level, evidence)
    }
}

impl KvPressure {
    fn new(cfg: Checked, ctx: &CreateContext) -> Self {
        KvPressure {
            state: State::new(cfg.params),
            cfg,
            name: ctx.id.to_string(),
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
        }
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> StateError {
        StateError::Corrupt { key: self.name.clone(), message: message.to_string() }
    }
}

impl ArrowProcessor for KvPressure {
    fn needs(&self) -> Needs {
        let mut columns = rows::COLUMNS.to_vec();
        columns.push(schema::START_TIME);
        Needs { signal: Signal::Metrics, columns }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut rows = Rows::new(batch)?;
        let starts = batch
            .column_by_name(schema::START_TIME)
            .and_then(|c| c.as_any().downcast_ref::<TimestampNanosecondArray>());
        let cfg = &self.cfg;
        let mut output = Output::new();
        let mut evicted = 0usize;
        let mut runs: BTreeMap<(GroupKey, u64), PendingRuns> = BTreeMap::new();
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else { continue };
            let Some(&role) = cfg.roles.get(p.name) else { continue };
            let attrs = rows.attributes(row)?;
            // Model: point `gen_ai.request.model`, point `model_name`, resource; version and
            // instance: point attribute, else resource attribute.
            let key = GroupKey::of(&mut rows, row, &attrs)?;
            let input = match role {
                Role::Value(input) => input,
                Role::FreeRun => {
                    if p.value >= 0.0 {
                        let pending = match runs.entry((key, p.time)) {
                            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                            std::collections::btree_map::Entry::Vacant(e) => e.insert(PendingRuns {
                                runs: Vec::new(),
                                resource: rows.resource(row)?.clone(),
                                scope: rows.scope(row)?.clone(),
                            }),
                        };
                        pending.runs.push(p.value.round() as u64);
                    }
                    continue;
                }
                Role::Reset => {
                    // The column holds the OTLP fixed64 bit pattern; 0 = no start time.
                    let start = starts.filter(|c| row < c.len() && !c.is_null(row)).map_or(0, |c| c.value(row) as u64);
                    let series = counter_key(p.name, &attrs);
                    let (n, group) = self.state.touch(&key, p.time);
                    evicted += n;
                    if let Some(g) = group
                        && g.counter(&series, p.time, start, p.value)
                    {
                        g.warm_from = g.warm_from.max(p.time);
                        tracing::debug!(processor = %self.name, counter = %series, "kv_pressure: counter reset, warm-up restarts");
                    }
                    continue;
                }
            };
            let (n, group) = self.state.touch(&key, p.time);
            evicted += n;
            let Some(group) = group else { continue };
            group.set(input, p.time, p.value);
            if input == Input::HitRate && p.value >= cfg.thresholds.hit_rate {
                group.hit_rate_seen_high = true;
            }
            let (score, level, evidence) = cfg.evaluate(group, p.time, p.name, input);
            let resource = rows.resource(row)?.clone();
            let scope = rows.scope(row)?;
            let attrs = with_group(attrs, &key);
            output.score(&resource, scope, &attrs, p.time, DETECTOR, cfg.metric(p.name), score, level, &evidence);
        }
        let free_runs_metric = cfg.roles.iter().find(|(_, r)| **r == Role::FreeRun).map(|(n, _)| n.as_str());
        for ((key, time), pending) in runs {
            let (n, group) = self.state.touch(&key, time);
            evicted += n;
            let Some(group) = group else { continue };
            group.set(Input::Kvf, time, alloc::kvf(&pending.runs));
            if group.free.is_none_or(|f| f.time <= time) {
                group.free = Some(FreeSpace {
                    time,
                    free_blocks: pending.runs.iter().fold(0u64, |s, &r| s.saturating_add(r)),
                    largest_run: pending.runs.iter().copied().max().unwrap_or(0),
                });
            }
            let input = free_runs_metric.unwrap_or_default();
            let (score, level, evidence) = cfg.evaluate(group, time, input, Input::Kvf);
            let metric = cfg.metric(input);
            output.score(
                &pending.resource,
                &pending.scope,
                &key.attributes(),
                time,
                DETECTOR,
                metric,
                score,
                level,
                &evidence,
            );
        }
        if evicted > 0 {
            self.evicted_max.inc_by(evicted as u64);
            tracing::debug!(processor = %self.name, evicted, "kv_pressure: groups evicted at max_series");
        }
        output.emit(out)
    }

    fn advance(&mut self, watermark_ns: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let idle = self.state.expire(watermark_ns);
        if idle > 0 {
            self.evicted_idle.inc_by(idle as u64);
            tracing::debug!(processor = %self.name, idle, "kv_pressure: forgot idle groups");
        }
        Ok(())
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.state.snapshot().map_err(|e| self.corrupt(format!("cannot serialize kv_pressure state: {e}")))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let mut fresh = State::new(self.cfg.params);
        fresh.restore(bytes).map_err(|e| self.corrupt(format!("kv_pressure state: {e}")))?;
        self.state = fresh;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}
