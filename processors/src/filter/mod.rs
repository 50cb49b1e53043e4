//! Processor `filter`: drops spans, span events, metrics, data points and log records for which
//! any of the configured OTTL conditions is true (otelcol-contrib's filterprocessor).
//!
//! Conditions are parsed, type-checked and their regexes compiled at config time
//! ([`compile`]); a syntax error is a config error with the field path and the column.
//! A metric whose data points are all dropped is removed, and so are a scope or resource left
//! with nothing. Dropped items are counted per signal. Reference: docs/configuration.md.

pub mod compile;
pub mod config;
pub mod eval;
pub mod parser;

use async_trait::async_trait;
use config::{Compiled, ErrorMode, FilterConfig, Rule, merge};
use eval::{EvalError, Point, Record};
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal, metric_point_count};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, Metric, NumberDataPoint, SummaryDataPoint,
};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Least time between two logged condition errors (`error_mode: ignore` / `propagate`).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Factory of `filter`.
pub struct FilterFactory;

/// Parses and compiles the settings; all problems merged into one located error.
pub fn compile_settings(cfg: &serde_json::Value) -> Result<Compiled, FieldError> {
    parse_config::<FilterConfig>(cfg)?.compile().map_err(merge)
}

impl ProcessorFactory for FilterFactory {
    fn type_name(&self) -> &'static str {
        "filter"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(Arc::new(compile_settings(cfg)?)))
    }
    fn warnings(&self, cfg: &serde_json::Value) -> Vec<FieldError> {
        match compile_settings(cfg) {
            Ok(c) if !c.has_traces() && !c.has_metrics() && !c.has_logs() => {
                vec![FieldError::at("", "no conditions are configured: the filter passes everything")]
            }
            _ => Vec::new(),
        }
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let rules = inferwatch_core::component::typed::<Arc<Compiled>>(parsed)?.clone();
        Ok(Arc::new(Filter::new(&ctx, rules, signal, next)))
    }
}

/// The counter of items this processor filtered out of `signal`'s pipeline.
pub fn filtered_counter(t: &Telemetry, id: &ComponentId, signal: Signal) -> Counter {
    // otelcol's names (otelcol labels them `filter`; this project names the component `processor`).
    let name = match signal {
        Signal::Traces => "otelcol_processor_filter_spans_filtered",
        Signal::Metrics => "otelcol_processor_filter_datapoints_filtered",
        Signal::Logs => "otelcol_processor_filter_logs_filtered",
    };
    t.component_counter(
        name,
        "Items a filter processor dropped because a condition matched",
        &[("processor", &id.to_string())],
    )
}

/// What one payload's filtering did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Spans, data points or log records removed.
    pub dropped: u64,
    /// Span events removed.
    pub events_dropped: u64,
}

/// The running processor.
pub struct Filter {
    id: String,
    rules: Arc<Compiled>,
    next: ConsumerRef,
    filtered: Counter,
    errors: AtomicU64,
    last_log: parking_lot::Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl Filter {
    /// Builds the processor from compiled rules.
    pub fn new(ctx: &CreateContext, rules: impl Into<Arc<Compiled>>, signal: Signal, next: ConsumerRef) -> Self {
        Filter {
            id: ctx.id.to_string(),
            rules: rules.into(),
            next,
            filtered: filtered_counter(&ctx.telemetry, &ctx.id, signal),
            errors: AtomicU64::new(0),
            last_log: parking_lot::Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Conditions that failed at run time so far.
    pub fn condition_errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn log_error(&self, rule: &Rule, e: &EvalError) {
        let mut last = self.last_log.lock();
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < ERROR_LOG_INTERVAL) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        let suppressed = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(processor = %self.id, condition = %rule.source, error = %e, suppressed,
            error_mode = ?self.rules.error_mode, "filter condition failed");
    }

    /// Whether any rule is true for `r`, applying the error mode to failures.
    fn any_true(&self, rules: &[Rule], r: &Record<'_>) -> Result<bool, EvalError> {
        for rule in rules {
            match rule.cond.eval(r) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    match self.rules.error_mode {
                        ErrorMode::Propagate => {
                            self.log_error(rule, &e);
                            return Err(EvalError(format!("condition `{}` failed: {e}", rule.source)));
                        }
                        ErrorMode::Ignore => self.log_error(rule, &e),
                        ErrorMode::Silent => {}
                    }
                }
            }
        }
        Ok(false)
    }

    /// Filters a traces request in place.
    pub fn traces(&self, req: &mut ExportTraceServiceRequest) -> Result<Outcome, EvalError> {
        let mut out = Outcome::default();
        let (span_rules, event_rules) = (&self.rules.span, &self.rules.spanevent);
        for rs in &mut req.resource_spans {
            let resource = rs.resource.as_ref();
            for ss in &mut rs.scope_spans {
                let scope = ss.scope.as_ref();
                let mut err = None;
                ss.spans.retain_mut(|span| {
                    if err.is_some() {
                        return true;
                    }
                    let r = Record { resource, scope, span: Some(span), ..Default::default() };
                    match self.any_true(span_rules, &r) {
                        Ok(true) => {
                            out.dropped += 1;
                            return false;
                        }
                        Ok(false) => {}
                        Err(e) => {
                            err = Some(e);
                            return true;
                        }
                    }
                    if !event_rules.is_empty() && !span.events.is_empty() {
                        let mut events = std::mem::take(&mut span.events);
                        events.retain(|ev| {
                            if err.is_some() {
                                return true;
                            }
                            let r = Record { resource, scope, span: Some(span), event: Some(ev), ..Default::default() };
                            match self.any_true(event_rules, &r) {
                                Ok(drop) => {
                                    out.events_dropped += u64::from(drop);
                                    !drop
                                }
                                Err(e) => {
                                    err = Some(e);
                                    true
                                }
                            }
                        });
                        span.events = events;
                    }
                    true
                });
                if let Some(e) = err {
                    return Err(e);
                }
            }
            rs.scope_spans.retain(|ss| !ss.spans.is_empty());
        }
        req.resource_spans.retain(|rs| !rs.scope_spans.is_empty());
        Ok(out)
    }

    /// Filters a metrics request in place.
    pub fn metrics(&self, req: &mut ExportMetricsServiceRequest) -> Result<Outcome, EvalError> {
        let mut out = Outcome::default();
        for rm in &mut req.resource_metrics {
            let resource = rm.resource.as_ref();
            for sm in &mut rm.scope_metrics {
                let scope = sm.scope.as_ref();
                let mut err = None;
                sm.metrics.retain_mut(|m| {
                    if err.is_some() {
                        return true;
                    }
                    let r = Record { resource, scope, metric: Some(m), ..Default::default() };
                    match self.any_true(&self.rules.metric, &r) {
                        Ok(true) => {
                            out.dropped += metric_point_count(m) as u64;
                            return false;
                        }
                        Ok(false) => {}
                        Err(e) => {
                            err = Some(e);
                            return true;
                        }
                    }
                    if self.rules.datapoint.is_empty() {
                        return true;
                    }
                    let before = metric_point_count(m) as u64;
                    match self.points(m, Record { resource, scope, ..Default::default() }) {
                        Ok(n) => {
                            out.dropped += n;
                            // A metric whose points were all dropped goes with them.
                            !(before > 0 && n == before)
                        }
                        Err(e) => {
                            err = Some(e);
                            true
                        }
                    }
                });
                if let Some(e) = err {
                    return Err(e);
                }
            }
            rm.scope_metrics.retain(|sm| !sm.metrics.is_empty());
        }
        req.resource_metrics.retain(|rm| !rm.scope_metrics.is_empty());
        Ok(out)
    }

    /// Drops the data points of `m` that a datapoint rule matches; how many.
    fn points(&self, m: &mut Metric, base: Record<'_>) -> Result<u64, EvalError> {
        // The points are taken out so the metric (name, type) can be read while they are filtered.
        let mut pts = match m.data.as_mut() {
            None => return Ok(0),
            Some(Data::Gauge(g)) => Pts::Number(std::mem::take(&mut g.data_points)),
            Some(Data::Sum(s)) => Pts::Number(std::mem::take(&mut s.data_points)),
            Some(Data::Histogram(h)) => Pts::Histogram(std::mem::take(&mut h.data_points)),
            Some(Data::ExponentialHistogram(h)) => Pts::Exp(std::mem::take(&mut h.data_points)),
            Some(Data::Summary(s)) => Pts::Summary(std::mem::take(&mut s.data_points)),
        };
        let base = Record { metric: Some(&*m), ..base };
        let res = match &mut pts {
            Pts::Number(v) => self.retain_points(v, base),
            Pts::Histogram(v) => self.retain_points(v, base),
            Pts::Exp(v) => self.retain_points(v, base),
            Pts::Summary(v) => self.retain_points(v, base),
        };
        match (m.data.as_mut(), pts) {
            (Some(Data::Gauge(g)), Pts::Number(v)) => g.data_points = v,
            (Some(Data::Sum(s)), Pts::Number(v)) => s.data_points = v,
            (Some(Data::Histogram(h)), Pts::Histogram(v)) => h.data_points = v,
            (Some(Data::ExponentialHistogram(h)), Pts::Exp(v)) => h.data_points = v,
            (Some(Data::Summary(s)), Pts::Summary(v)) => s.data_points = v,
            _ => {}
        }
        res
    }

    fn retain_points<P: AsPoint>(&self, v: &mut Vec<P>, base: Record<'_>) -> Result<u64, EvalError> {
        let mut err = None;
        let before = v.len();
        v.retain(|p| {
            if err.is_some() {
                return true;
            }
            let r = Record { point: Some(p.as_point()), ..base };
            match self.any_true(&self.rules.datapoint, &r) {
                Ok(drop) => !drop,
                Err(e) => {
                    err = Some(e);
                    true
                }
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok((before - v.len()) as u64),
        }
    }

    /// Filters a logs request in place.
    pub fn logs(&self, req: &mut ExportLogsServiceRequest) -> Result<Outcome, EvalError> {
        let mut out = Outcome::default();
        for rl in &mut req.resource_logs {
            let resource = rl.resource.as_ref();
            for sl in &mut rl.scope_logs {
                let scope = sl.scope.as_ref();
                let mut err = None;
                sl.log_records.retain(|l| {
                    if err.is_some() {
                        return true;
                    }
                    let r = Record { resource, scope, log: Some(l), ..Default::default() };
                    match self.any_true(&self.rules.log, &r) {
                        Ok(drop) => {
                            out.dropped += u64::from(drop);
                            !drop
                        }
                        Err(e) => {
                            err = Some(e);
                            true
                        }
                    }
                });
                if let Some(e) = err {
                    return Err(e);
                }
            }
            rl.scope_logs.retain(|sl| !sl.log_records.is_empty());
        }
        req.resource_logs.retain(|rl| !rl.scope_logs.is_empty());
        Ok(out)
    }

    /// Filters a payload: `None` when nothing is left to pass on.
    pub fn process(&self, data: Payload) -> Result<Option<Payload>, ConsumeError> {
        let applies = match data.signal() {
            Signal::Traces => self.rules.has_traces(),
            Signal::Metrics => self.rules.has_metrics(),
            Signal::Logs => self.rules.has_logs(),
        };
        if !applies {
            return Ok(Some(data));
        }
        let (mut decoded, original) = match data {
            Payload::Encoded(e) => match e.decode() {
                Ok(d) => (d, Some(e)),
                Err(err) => return Err(ConsumeError::Permanent(format!("filter: cannot decode the payload: {err}"))),
            },
            other => (other, None),
        };
        let res = match &mut decoded {
            Payload::Traces(r) => self.traces(r),
            Payload::Metrics(r) => self.metrics(r),
            Payload::Logs(r) => self.logs(r),
            Payload::Encoded(_) => Ok(Outcome::default()),
        };
        let outcome = res.map_err(|e| ConsumeError::Permanent(format!("filter {}: {e}", self.id)))?;
        self.filtered.inc_by(outcome.dropped);
        if outcome.dropped == 0 && outcome.events_dropped == 0 {
            // Nothing removed: pass the payload on as it came (no re-encoding).
            return Ok(Some(original.map_or(decoded, Payload::Encoded)));
        }
        let empty = match &decoded {
            Payload::Traces(r) => r.resource_spans.is_empty(),
            Payload::Metrics(r) => r.resource_metrics.is_empty(),
            Payload::Logs(r) => r.resource_logs.is_empty(),
            Payload::Encoded(_) => false,
        };
        Ok((!empty).then_some(decoded))
    }
}

/// A data point type of the proto.
trait AsPoint {
    fn as_point(&self) -> Point<'_>;
}

impl AsPoint for NumberDataPoint {
    fn as_point(&self) -> Point<'_> {
        Point::Number(self)
    }
}
impl AsPoint for HistogramDataPoint {
    fn as_point(&self) -> Point<'_> {
        Point::Histogram(self)
    }
}
impl AsPoint for ExponentialHistogramDataPoint {
    fn as_point(&self) -> Point<'_> {
        Point::ExpHistogram(self)
    }
}
impl AsPoint for SummaryDataPoint {
    fn as_point(&self) -> Point<'_> {
        Point::Summary(self)
    }
}

enum Pts {
    Number(Vec<NumberDataPoint>),
    Histogram(Vec<HistogramDataPoint>),
    Exp(Vec<ExponentialHistogramDataPoint>),
    Summary(Vec<SummaryDataPoint>),
}

#[async_trait]
impl Consumer for Filter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        match self.process(data)? {
            Some(d) => self.next.consume(d).await,
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Node for Filter {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
