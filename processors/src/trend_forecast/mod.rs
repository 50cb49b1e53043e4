//! Processor `trend_forecast`: the early warning. Per series, hourly (configurable) event-time
//! aggregates feed a rolling history; at each closed aggregate the daily and weekly seasons are
//! removed, a Mann-Kendall test with the Hamed-Rao autocorrelation correction decides whether a
//! trend toward the threshold is significant, a Theil-Sen slope with Sen's interval forecasts when
//! the trend level plus the seasonal peak crosses the threshold, and the detector emits
//! `llm.slo.breach_eta` (s), `llm.anomaly.score` and `llm.anomaly.level`. Semantics, level mapping and
//! state size: docs/detectors/trend_forecast.md.

pub mod aggregate;
pub mod config;
pub mod forecast;
pub mod mann_kendall;
pub mod normal;
pub mod season;
pub mod state;
pub mod theil_sen;

use crate::detect::adapter::Adapter;
use crate::detect::rows::column;
use crate::detect::{self, Output, Point, kv_f64, kv_i64, kv_str};
use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt8Array, UInt64Array};
use config::{Checked, TrendForecastConfig};
use forecast::Assessment;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, metrics, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use state::{Closed, SeriesMeta, Skip, State};

/// Version of the checkpoint format written by [`TrendForecast`] (2: the detector kit's series
/// map envelope; version 1 checkpoints are refused).
pub const STATE_VERSION: u32 = 2;

/// The `detector` attribute of the outputs.
pub const DETECTOR: &str = "trend_forecast";

/// Factory of `trend_forecast`.
pub struct TrendForecastFactory;

inferwatch_core::arrow_processor_factory!(TrendForecastFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for TrendForecastFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<TrendForecastConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only("trend_forecast", signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(TrendForecast::new(checked, &ctx)))
    }
}

/// Which input series an embedded forecast takes, judged on a new series' point attributes.
pub type SeriesFilter = Box<dyn Fn(&[KeyValue]) -> bool + Send>;

/// The running processor.
pub struct TrendForecast {
    cfg: Checked,
    state: State,
    kit: Adapter,
    /// Attributes added to every output (an embedding component's identity, e.g. the SLO's).
    extra: Vec<KeyValue>,
    /// Series selection beyond the metric name (none: every series of the metric).
    accept: Option<SeriesFilter>,
}

impl TrendForecast {
    fn new(cfg: Checked, ctx: &CreateContext) -> Self {
        TrendForecast {
            state: State::new(cfg.state),
            cfg,
            kit: Adapter::new(ctx, "trend_forecast"),
            extra: Vec::new(),
            accept: None,
        }
    }

    /// A forecast run inside another component (the `slo` processor): its outputs carry `extra`
    /// after the input's attributes, and it takes only the series `accept` selects.
    pub fn embedded(cfg: Checked, ctx: &CreateContext, extra: Vec<KeyValue>, accept: SeriesFilter) -> Self {
        TrendForecast { extra, accept: Some(accept), ..Self::new(cfg, ctx) }
    }
}

/// The outputs of one assessment, at the end of the aggregate that closed.
fn push_outputs(out: &mut Output, c: &Closed<'_>, a: &Assessment, threshold: f64, extra: &[KeyValue]) {
    let m = c.meta;
    let w = &a.window;
    let mut evidence: Vec<KeyValue> = extra.to_vec();
    evidence.extend([
        kv_f64("threshold", threshold),
        kv_f64("value", a.value),
        kv_f64("p_value", w.mk.p),
        kv_f64("slope_per_day", a.slope_per_day),
        kv_f64("window", w.span_s),
        kv_i64("points", w.n as i64),
        kv_i64("seasons_fitted", a.seasons_fitted as i64),
    ]);
    if let Some((eta, lo, hi)) = a.forecast {
        evidence.extend([kv_f64("eta", eta), kv_f64("eta_low", lo), kv_f64("eta_high", hi)]);
    }
    out.score(&m.resource, &m.scope, &m.attributes, c.end_ns, DETECTOR, &m.metric, a.score, a.level, &evidence);
    let Some((eta, lo, hi)) = a.forecast else { return };
    if !eta.is_finite() {
        return;
    }
    let mut attrs = vec![kv_str("detector", DETECTOR), kv_str("metric", m.metric.clone())];
    attrs.extend(m.attributes.iter().filter(|kv| kv.key != "detector" && kv.key != "metric").cloned());
    attrs.extend(extra.iter().cloned());
    attrs.extend([kv_f64("eta_low", lo), kv_f64("eta_high", hi), kv_f64("slope_per_day", a.slope_per_day)]);
    attrs.push(kv_f64("p_value", w.mk.p));
    out.push(Point {
        resource: m.resource.clone(),
        scope: m.scope.clone(),
        name: detect::BREACH_ETA,
        unit: "s",
        time_ns: c.end_ns,
        value: eta,
        attributes: attrs,
    });
}

impl ArrowProcessor for TrendForecast {
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
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let ids = column::<UInt64Array>(batch, schema::SERIES_ID)?;
        let names = column::<StringArray>(batch, schema::METRIC_NAME)?;
        let kinds = column::<UInt8Array>(batch, schema::KIND)?;
        let values = column::<Float64Array>(batch, schema::VALUE)?;
        let times = inferwatch_core::arrow::time_column(batch)?;
        let metric = &self.cfg.metric;
        let accept = &self.accept;
        let (mut late, mut evicted) = (0u64, 0usize);
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
                if name != metric.as_str() {
                    return Ok(None);
                }
                let attributes = metrics::row_attributes(batch, row)?;
                if accept.as_ref().is_some_and(|f| !f(&attributes)) {
                    return Ok(None);
                }
                Ok::<_, ConvError>(Some(SeriesMeta {
                    metric: name.to_string(),
                    resource: metrics::row_resource(batch, row)?,
                    scope: metrics::row_scope(batch, row)?,
                    attributes,
                    ..Default::default()
                }))
            })?;
            match added {
                Ok(n) => evicted += n,
                Err(Skip::Late) => late += 1,
                Err(Skip::Filtered) => {}
            }
        }
        self.kit.evicted_max(evicted);
        if late > 0 {
            tracing::debug!(processor = %self.kit.name(), late, "points before the watermark ignored");
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut output = Output::new();
        let (params, threshold, extra) = (&self.cfg.forecast, self.cfg.forecast.threshold, &self.extra);
        let idle = self.state.close_until(watermark_ns, |c| {
            if let Some(a) = forecast::assess(&c.history, params) {
                push_outputs(&mut output, &c, &a, threshold, extra);
            }
        });
        self.kit.evicted_idle(idle);
        output.emit(out)
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.kit.snapshot(self.state.snapshot())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.state = self.kit.restore(State::new(self.cfg.state), bytes, State::restore)?;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}
