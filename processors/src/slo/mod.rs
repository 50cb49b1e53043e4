//! Processor `slo`: service-level objectives declared once. Per objective and group it counts
//! good and total events from llm_signals' windowed signals, computes the burn rate on the SRE
//! Workbook's windows and its multiwindow, multi-burn-rate rules (page 1h/5m at 14.4× and
//! 6h/30m at 6×, ticket 1d/2h at 3× and 3d/6h at 1×), the error budget remaining over the
//! period, and runs an embedded `trend_forecast` on the objective's signal and threshold for the
//! breach forecast. Everything on event time. Semantics: docs/detectors/slo.md.

pub mod config;
pub mod ledger;
pub mod openslo;
mod output;

use crate::detect::rows::{self, Rows};
use crate::detect::series::SeriesMap;
use crate::trend_forecast::{SeriesFilter, TrendForecast};
use arrow_array::{Array, RecordBatch, TimestampNanosecondArray};
use config::{Checked, ERROR_RATE, Objective, REQUEST_RATE, Sli, SloConfig};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use ledger::{Counts, Ledger};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// Version of the checkpoint format written by [`Slo`] (2: each objective's groups in the
/// detector kit's series map envelope; version 1 checkpoints are refused).
pub const STATE_VERSION: u32 = 2;
/// The processor's type name.
pub const TYPE: &str = "slo";
/// The `detector` attribute of the burn-rate levels.
pub const DETECTOR: &str = "slo_burn";

/// Factory of `slo`.
pub struct SloFactory;

inferwatch_core::arrow_processor_factory!(SloFactory, TYPE, &[Signal::Metrics]);

impl ArrowProcessorFactory for SloFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<SloConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only("slo", signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(Slo::new(checked, &ctx)))
    }
}

/// One SLO group: the events of one combination of the objective's `by` values (its key: the
/// (attribute, value) of the `by` keys present on its points).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Group {
    ledger: Ledger,
    /// The latest event's input value (the observed value in the evidence).
    last_value: f64,
}

/// The running state of one objective.
struct Runner {
    obj: Objective,
    /// The groups; a group silent for the objective's whole period is forgotten.
    groups: SeriesMap<Vec<(String, String)>, Group>,
    dirty: BTreeSet<Vec<(String, String)>>,
    /// error_ratio: the latest `llm.request.rate` point per input series: (time, rate, window s).
    rates: HashMap<Vec<(String, String)>, (u64, f64, f64)>,
    forecast: Option<TrendForecast>,
}

/// The running processor.
pub struct Slo {
    cfg: Checked,
    runners: Vec<Runner>,
    name: String,
    evicted_max: Counter,
    evicted_idle: Counter,
}

fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| match &v.value {
        Some(Value::StringValue(s)) => Some(s.as_str()),
        _ => None,
    })
}

/// Whether a point with these attributes counts for `obj` (source and model filters).
fn selects(obj: &Objective, attrs: &[KeyValue]) -> bool {
    obj.source.accepts(str_attr(attrs, "source")) && model_matches(obj, attrs)
}

fn model_matches(obj: &Objective, attrs: &[KeyValue]) -> bool {
    obj.model.is_empty() || str_attr(attrs, "gen_ai.request.model") == Some(obj.model.as_str())
}

/// Every string attribute, sorted (an input series' identity within one batch flow).
fn series_key(attrs: &[KeyValue]) -> Vec<(String, String)> {
    let mut k: Vec<(String, String)> = attrs
        .iter()
        .filter_map(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => Some((kv.key.clone(), s.clone())),
            _ => None,
        })
        .collect();
    k.sort();
    k
}

impl Slo {
    fn new(cfg: Checked, ctx: &CreateContext) -> Self {
        let runners = cfg
            .objectives
            .iter()
            .map(|o| {
                let forecast = o.forecast.clone().map(|f| {
                    let sel = o.clone();
                    let accept: SeriesFilter = Box::new(move |attrs: &[KeyValue]| {
                        sel.forecast_source.accepts(str_attr(attrs, "source")) && model_matches(&sel, attrs)
                    });
                    TrendForecast::embedded(f, ctx, output::identity(o), accept)
                });
                let period_ns = o.period_hours.saturating_mul(3_600_000_000_000);
                Runner {
                    obj: o.clone(),
                    groups: SeriesMap::new(cfg.max_groups, period_ns),
                    dirty: BTreeSet::new(),
                    rates: HashMap::new(),
                    forecast,
                }
            })
            .collect();
        Slo {
            cfg,
            runners,
            name: ctx.id.to_string(),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
        }
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> StateError {
        StateError::Corrupt { key: self.name.clone(), message: message.to_string() }
    }
}

impl Runner {
    /// Hour buckets a group keeps: the period, and at least the 3-day window.
    fn keep_hours(&self) -> u64 {
        self.obj.period_hours.max(72)
    }

    /// The events one point makes, if any: (good, total).
    fn events(
        &mut self,
        name: &str,
        time: u64,
        value: f64,
        start: Option<u64>,
        attrs: &[KeyValue],
        max_groups: usize,
    ) -> Option<Counts> {
        match &self.obj.sli {
            Sli::Latency { metric, threshold } => {
                (name == metric).then_some(Counts { good: if value <= *threshold { 1.0 } else { 0.0 }, total: 1.0 })
            }
            Sli::Availability { threshold } => {
                (name == ERROR_RATE).then_some(Counts { good: if value <= *threshold { 1.0 } else { 0.0 }, total: 1.0 })
            }
            Sli::ErrorRatio => {
                if name == REQUEST_RATE {
                    let window_s = start.filter(|&s| s > 0 && s < time).map(|s| (time - s) as f64 / 1e9).unwrap_or(0.0);
                    // Bounded: series whose error-rate point never came are forgotten together.
                    if self.rates.len() >= 4 * max_groups {
                        self.rates.clear();
                    }
                    self.rates.insert(series_key(attrs), (time, value, window_s));
                    return None;
                }
                if name != ERROR_RATE {
                    return None;
                }
                let (t, rate, window_s) = self.rates.remove(&series_key(attrs))?;
                if t != time || window_s <= 0.0 {
                    return None;
                }
                let total = (rate * window_s).max(0.0);
                (total > 0.0).then(|| Counts { good: total * (1.0 - value.clamp(0.0, 1.0)), total })
            }
        }
    }

    /// Adds events to the group of `attrs`; returns the number of groups evicted.
    fn add(&mut self, attrs: &[KeyValue], time: u64, value: f64, c: Counts) -> usize {
        let key: Vec<(String, String)> =
            self.obj.by.iter().filter_map(|k| str_attr(attrs, k).map(|v| (k.clone(), v.to_string()))).collect();
        let keep = self.keep_hours();
        let dirty = &mut self.dirty;
        let make = || Group { ledger: Ledger::default(), last_value: value };
        let Some(t) = self.groups.touch(&key, time, make, |k, _| {
            dirty.remove(k);
        }) else {
            return 0;
        };
        let (g, evicted) = (t.state, t.evicted);
        if time >= g.ledger.last_ns {
            g.last_value = value;
        }
        g.ledger.add(time, c, keep);
        self.dirty.insert(key);
        evicted
    }
}

#[derive(Serialize, Deserialize)]
struct SnapObjective {
    name: String,
    /// The groups' [`SeriesMap`] snapshot.
    groups: Vec<u8>,
    forecast: Option<Vec<u8>>,
}

impl ArrowProcessor for Slo {
    fn needs(&self) -> Needs {
        let mut columns = rows::COLUMNS.to_vec();
        columns.extend([schema::START_TIME, schema::SERIES_ID, schema::RESOURCE_DROPPED, schema::SCOPE_DROPPED]);
        Needs { signal: Signal::Metrics, columns }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let rows = Rows::new(batch)?;
        let starts = batch
            .column_by_name(schema::START_TIME)
            .and_then(|c| c.as_any().downcast_ref::<TimestampNanosecondArray>());
        let max_groups = self.cfg.max_groups;
        let mut evicted = 0usize;
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else { continue };
            if !p.name.starts_with("llm.") {
                continue;
            }
            let wanted = self.runners.iter().any(|r| match &r.obj.sli {
                Sli::Latency { metric, .. } => p.name == metric,
                Sli::Availability { .. } => p.name == ERROR_RATE,
                Sli::ErrorRatio => p.name == ERROR_RATE || p.name == REQUEST_RATE,
            });
            if !wanted {
                continue;
            }
            let attrs = rows.attributes(row)?;
            let start = starts.filter(|s| !s.is_null(row)).map(|s| s.value(row) as u64);
            for r in &mut self.runners {
                if !selects(&r.obj, &attrs) {
                    continue;
                }
                if let Some(c) = r.events(p.name, p.time, p.value, start, &attrs, max_groups) {
                    evicted += r.add(&attrs, p.time, p.value, c);
                }
            }
        }
        if evicted > 0 {
            self.evicted_max.inc_by(evicted as u64);
        }
        for r in &mut self.runners {
            if let Some(f) = r.forecast.as_mut() {
                f.process(batch, out)?;
            }
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut points = output::Points::default();
        let mut idle = 0usize;
        for r in &mut self.runners {
            if let Some(f) = r.forecast.as_mut() {
                f.advance(watermark_ns, out)?;
            }
            for key in std::mem::take(&mut r.dirty) {
                let Some(g) = r.groups.get(&key) else { continue };
                let t = g.ledger.last_ns;
                let a = g.ledger.assess(t, r.obj.target, r.obj.period_hours);
                points.group(&r.obj, &key, &g.ledger, g.last_value, t, &a);
            }
            // A group silent for its whole period has nothing left to count.
            idle += r.groups.expire_idle(watermark_ns, |_| None, |_, _| {});
        }
        if idle > 0 {
            self.evicted_idle.inc_by(idle as u64);
        }
        points.emit(out)
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        let mut objs = Vec::with_capacity(self.runners.len());
        for r in &self.runners {
            let groups = r
                .groups
                .snapshot(STATE_VERSION, &(), |_, g| g)
                .map_err(|e| self.corrupt(format!("cannot serialize slo state: {e}")))?;
            let forecast = match &r.forecast {
                Some(f) => Some(f.snapshot()?),
                None => None,
            };
            objs.push(SnapObjective { name: r.obj.name.clone(), groups, forecast });
        }
        postcard::to_allocvec(&objs).map_err(|e| self.corrupt(format!("cannot serialize slo state: {e}")))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let objs: Vec<SnapObjective> =
            postcard::from_bytes(bytes).map_err(|e| self.corrupt(format!("slo state: {e}")))?;
        // Every objective's groups decode before any is replaced.
        let mut restored = Vec::with_capacity(objs.len());
        for s in objs {
            // An objective no longer declared is dropped; a new one starts empty.
            let Some(i) = self.runners.iter().position(|r| r.obj.name == s.name) else { continue };
            let ((), groups) = self.runners[i]
                .groups
                .restore(STATE_VERSION, &s.groups, |_, g: Group| Ok(g))
                .map_err(|e| self.corrupt(format!("slo state: {e}")))?;
            restored.push((i, groups, s.forecast));
        }
        // Then the embedded forecasts, each atomic; when one is refused, those restored before it
        // get their previous state back, so that a refused checkpoint changes nothing.
        let mut done: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, _, forecast) in &restored {
            let (Some(f), Some(b)) = (self.runners[*i].forecast.as_mut(), forecast) else { continue };
            let before = f.snapshot()?;
            if let Err(e) = f.restore(b) {
                for (j, old) in done.into_iter().rev() {
                    if let Some(f) = self.runners[j].forecast.as_mut()
                        && let Err(e) = f.restore(&old)
                    {
                        tracing::warn!(error = %e, "slo: a forecast could not get its state back");
                    }
                }
                return Err(e);
            }
            done.push((*i, before));
        }
        for (i, groups, _) in restored {
            self.runners[i].groups = groups;
        }
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.runners.iter().map(|r| r.groups.len() + r.forecast.as_ref().map_or(0, |f| f.series_count())).sum()
    }
}
