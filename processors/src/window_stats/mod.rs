//! Processor `window_stats`: per-series tumbling-window count, min, max, mean and percentiles.
//!
//! Reads number data points (gauges and sums) of a metrics pipeline, groups them per series
//! into event-time windows aligned to the Unix epoch, and when the pipeline's watermark passes
//! a window's end emits one gauge per statistic, named `<metric>.window.<stat>`. Percentiles
//! come from a [`sketch::DdSketch`] (relative error α); count, min, max and mean are exact.
//! Semantics and the accuracy guarantee: docs/window-stats.md.

pub mod state;

use crate::detect::adapter::Adapter;
use crate::detect::config::nanos;
use crate::detect::limits::{self, SeriesLimits, with_series_limits};
use crate::detect::rows::column;
use crate::detect::sketch;
use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt8Array, UInt64Array};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, metrics, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use serde::Deserialize;
use state::{Params, SeriesMeta, State, Window};
use std::collections::HashSet;
use std::time::Duration;

/// Version of the checkpoint format written by [`WindowStats`] (2: the detector kit's series map
/// envelope; version 1 checkpoints are refused).
pub const STATE_VERSION: u32 = 2;

/// A statistic of a window, emitted as `<metric>.window.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    /// Number of points (int gauge, unit `{point}`).
    Count,
    /// Exact minimum.
    Min,
    /// Exact maximum.
    Max,
    /// Exact mean (compensated sum / count).
    Mean,
    /// Median (sketch).
    P50,
    /// 90th percentile (sketch).
    P90,
    /// 95th percentile (sketch).
    P95,
    /// 99th percentile (sketch).
    P99,
    /// 99.9th percentile (sketch).
    P999,
}

impl Stat {
    /// The default set: count, min, max, mean, p50, p95, p99.
    pub const DEFAULT: [Stat; 7] = [Stat::Count, Stat::Min, Stat::Max, Stat::Mean, Stat::P50, Stat::P95, Stat::P99];

    /// The suffix of the derived metric name.
    pub fn name(self) -> &'static str {
        match self {
            Stat::Count => "count",
            Stat::Min => "min",
            Stat::Max => "max",
            Stat::Mean => "mean",
            Stat::P50 => "p50",
            Stat::P90 => "p90",
            Stat::P95 => "p95",
            Stat::P99 => "p99",
            Stat::P999 => "p999",
        }
    }

    /// Every statistic.
    pub const ALL: [Stat; 9] =
        [Stat::Count, Stat::Min, Stat::Max, Stat::Mean, Stat::P50, Stat::P90, Stat::P95, Stat::P99, Stat::P999];

    /// The quantile of a percentile statistic.
    fn quantile(self) -> Option<f64> {
        match self {
            Stat::P50 => Some(0.5),
            Stat::P90 => Some(0.9),
            Stat::P95 => Some(0.95),
            Stat::P99 => Some(0.99),
            Stat::P999 => Some(0.999),
            _ => None,
        }
    }
}

/// Settings of `window_stats`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct WindowStatsConfig {
    /// Window length (default 1m; > 0); windows are aligned to the Unix epoch.
    pub window: GoDuration,
    /// `allowed_lateness` (default 0s), `max_series` (default 10000; beyond it the least
    /// recently seen 10 % are evicted) and `idle_timeout` (default 10m), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
    /// Relative accuracy α of the percentiles (default 0.01).
    pub relative_accuracy: f64,
    /// Statistics to emit (default count, min, max, mean, p50, p95, p99).
    pub stats: Vec<Stat>,
    /// Metric names to read (exact); empty = every number metric except `*.window.<stat>` ones.
    pub metrics: Vec<String>,
}

impl Default for WindowStatsConfig {
    fn default() -> Self {
        WindowStatsConfig {
            window: GoDuration(Duration::from_secs(60)),
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
            relative_accuracy: sketch::DEFAULT_ALPHA,
            stats: Stat::DEFAULT.to_vec(),
            metrics: Vec::new(),
        }
    }
}

with_series_limits!(WindowStatsConfig, limits::ALL);

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    lateness_ns: u64,
    stats: Vec<Stat>,
    metrics: HashSet<String>,
}

impl WindowStatsConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        let window_ns = nanos("window", &self.window)?;
        if window_ns == 0 {
            return Err(FieldError::at("window", "must be greater than 0"));
        }
        let limits = self.limits.check()?;
        let alpha = self.relative_accuracy;
        if !(alpha.is_finite() && (sketch::MIN_ALPHA..1.0).contains(&alpha)) {
            return Err(FieldError::at(
                "relative_accuracy",
                format!("must be between {} and 1 (exclusive), got {alpha}", sketch::MIN_ALPHA),
            ));
        }
        if self.stats.is_empty() {
            return Err(FieldError::at("stats", "must name at least one statistic"));
        }
        if self.metrics.iter().any(|m| m.is_empty()) {
            return Err(FieldError::at("metrics", "metric names must not be empty"));
        }
        let mut stats = self.stats.clone();
        stats.sort_unstable();
        stats.dedup();
        Ok(Checked {
            params: Params {
                window_ns,
                idle_ns: limits.idle_ns,
                max_series: limits.max_series,
                alpha,
                max_bins: sketch::DEFAULT_MAX_BINS,
            },
            lateness_ns: limits.lateness_ns,
            stats,
            metrics: self.metrics.iter().cloned().collect(),
        })
    }
}

/// Factory of `window_stats`.
pub struct WindowStatsFactory;

inferwatch_core::arrow_processor_factory!(WindowStatsFactory, "window_stats", &[Signal::Metrics]);

impl ArrowProcessorFactory for WindowStatsFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<WindowStatsConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only("window_stats", signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(WindowStats::new(checked, &ctx)))
    }
}

/// The running processor.
pub struct WindowStats {
    cfg: Checked,
    state: State,
    kit: Adapter,
}

impl WindowStats {
    fn new(cfg: Checked, ctx: &CreateContext) -> Self {
        WindowStats { state: State::new(cfg.params), cfg, kit: Adapter::new(ctx, "window_stats") }
    }
}

/// Collects the derived points of closed windows into one export request.
#[derive(Default)]
struct Derived {
    out: Vec<ResourceMetrics>,
}

impl Derived {
    /// Adds the statistics `stats` of window `w` of a series described by `meta`.
    fn push(&mut self, stats: &[Stat], meta: &SeriesMeta, w: &Window) {
        let metrics: Vec<Metric> = stats.iter().filter_map(|&s| stat_metric(s, meta, w)).collect();
        if metrics.is_empty() {
            return;
        }
        // Consecutive windows of the same resource and scope share one ResourceMetrics / ScopeMetrics.
        let same = self.out.last().is_some_and(|rm| {
            rm.resource.as_ref() == Some(&meta.resource)
                && rm.schema_url == meta.resource_schema_url
                && rm
                    .scope_metrics
                    .last()
                    .is_some_and(|sm| sm.scope.as_ref() == Some(&meta.scope) && sm.schema_url == meta.scope_schema_url)
        });
        match self.out.last_mut().and_then(|rm| rm.scope_metrics.last_mut()) {
            Some(sm) if same => sm.metrics.extend(metrics),
            _ => self.out.push(ResourceMetrics {
                resource: Some(meta.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(meta.scope.clone()),
                    metrics,
                    schema_url: meta.scope_schema_url.clone(),
                }],
                schema_url: meta.resource_schema_url.clone(),
            }),
        }
    }
}

/// One derived gauge with one point for statistic `stat` of window `w`.
fn stat_metric(stat: Stat, meta: &SeriesMeta, w: &Window) -> Option<Metric> {
    let s = &w.sketch;
    let value = match stat {
        Stat::Count => number_data_point::Value::AsInt(i64::try_from(s.count()).unwrap_or(i64::MAX)),
        Stat::Min => number_data_point::Value::AsDouble(s.min()?),
        Stat::Max => number_data_point::Value::AsDouble(s.max()?),
        Stat::Mean => number_data_point::Value::AsDouble(s.mean()?),
        p => number_data_point::Value::AsDouble(s.quantile(p.quantile()?)?),
    };
    let unit = if stat == Stat::Count { "{point}".to_string() } else { meta.unit.clone() };
    Some(Metric {
        name: format!("{}.window.{}", meta.metric, stat.name()),
        description: String::new(),
        unit,
        metadata: Vec::new(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![NumberDataPoint {
                attributes: meta.attributes.clone(),
                start_time_unix_nano: w.start,
                time_unix_nano: w.end,
                exemplars: Vec::new(),
                flags: 0,
                value: Some(value),
            }],
        })),
    })
}

/// Whether `name` is a metric this processor derives (`<metric>.window.<stat>`).
fn is_derived_name(name: &str) -> bool {
    name.rsplit_once(".window.").is_some_and(|(_, stat)| Stat::ALL.iter().any(|s| s.name() == stat))
}

/// Whether points of metric `name` are read: listed in `metrics`, or, with no list, any metric
/// but the derived ones of another `window_stats` before this one in the same stage.
fn selected(filter: &HashSet<String>, name: &str) -> bool {
    if filter.is_empty() { !is_derived_name(name) } else { filter.contains(name) }
}

fn string_at(batch: &RecordBatch, name: &str, row: usize) -> Result<String, ConvError> {
    let c = column::<StringArray>(batch, name)?;
    Ok(if c.is_null(row) { String::new() } else { c.value(row).to_string() })
}

/// Reads what a new series' derived points carry from row `row`.
fn series_meta(batch: &RecordBatch, row: usize, metric: &str) -> Result<SeriesMeta, ConvError> {
    Ok(SeriesMeta {
        metric: metric.to_string(),
        unit: string_at(batch, schema::METRIC_UNIT, row)?,
        resource: metrics::row_resource(batch, row)?,
        resource_schema_url: string_at(batch, schema::RESOURCE_SCHEMA_URL, row)?,
        scope: metrics::row_scope(batch, row)?,
        scope_schema_url: string_at(batch, schema::SCOPE_SCHEMA_URL, row)?,
        attributes: metrics::row_attributes(batch, row)?,
    })
}

impl ArrowProcessor for WindowStats {
    fn needs(&self) -> Needs {
        Needs {
            signal: Signal::Metrics,
            columns: vec![
                schema::SERIES_ID,
                schema::METRIC_NAME,
                schema::METRIC_UNIT,
                schema::KIND,
                schema::VALUE,
                schema::TIME,
                schema::SERVICE_NAME,
                schema::SERVICE_VERSION,
                schema::SERVICE_INSTANCE_ID,
                schema::RESOURCE_ATTRIBUTES,
                schema::RESOURCE_DROPPED,
                schema::RESOURCE_SCHEMA_URL,
                schema::SCOPE_NAME,
                schema::SCOPE_VERSION,
                schema::SCOPE_ATTRIBUTES,
                schema::SCOPE_DROPPED,
                schema::SCOPE_SCHEMA_URL,
                schema::ATTRIBUTES,
            ],
        }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let ids = column::<UInt64Array>(batch, schema::SERIES_ID)?;
        let names = column::<StringArray>(batch, schema::METRIC_NAME)?;
        let kinds = column::<UInt8Array>(batch, schema::KIND)?;
        let values = column::<Float64Array>(batch, schema::VALUE)?;
        let times = inferwatch_core::arrow::time_column(batch)?;
        let filter = &self.cfg.metrics;
        let mut late = 0u64;
        let mut evicted = 0usize;
        for row in 0..batch.num_rows() {
            let kind = kinds.value(row);
            if (kind != schema::kind::GAUGE && kind != schema::kind::SUM) || values.is_null(row) {
                continue;
            }
            let value = values.value(row);
            if !value.is_finite() {
                continue;
            }
            // The column holds the OTLP fixed64 bit pattern.
            let time = times.value(row) as u64;
            let added = self.state.add(ids.value(row), time, value, || {
                let name = names.value(row);
                if !selected(filter, name) {
                    return Ok(None);
                }
                series_meta(batch, row, name).map(Some)
            })?;
            match added {
                Ok(n) => evicted += n,
                Err(state::Skip::Late) => late += 1,
                Err(state::Skip::Filtered) => {}
            }
        }
        self.kit.evicted_max(evicted);
        if late > 0 {
            tracing::debug!(processor = %self.kit.name(), late, "points before the watermark ignored");
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut derived = Derived::default();
        let stats = &self.cfg.stats;
        let idle = self.state.close_until(watermark_ns, |_, meta, w| derived.push(stats, meta, w));
        self.kit.evicted_idle(idle);
        if !derived.out.is_empty() {
            out.push(metrics::to_batch(&ExportMetricsServiceRequest { resource_metrics: derived.out })?);
        }
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
