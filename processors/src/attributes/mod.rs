//! Processor `attributes`: otelcol's attribute actions on span, data point and log record
//! attributes, limited by `include` / `exclude` ([`matcher`]).
//!
//! `include` is checked before `exclude`: an item is changed when it matches `include` (or
//! none is set) and does not match `exclude`. Encoded payloads are decoded once; one in which
//! nothing changed passes on as it came. A plain OTLP processor (it changes its input).

pub mod matcher;

use crate::attraction::{ActionConfig, Actions};
use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use matcher::{MatchConfig, Matcher};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;

/// Settings of `attributes` (otelcol's keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttributesConfig {
    /// The actions, applied in order (at least one).
    pub actions: Vec<ActionConfig>,
    /// Only items matching this are changed.
    pub include: Option<MatchConfig>,
    /// Items matching this are not changed.
    pub exclude: Option<MatchConfig>,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Checked {
    actions: Actions,
    include: Option<Matcher>,
    exclude: Option<Matcher>,
}

impl AttributesConfig {
    /// Checks the settings (the signal-specific properties are checked by [`Checked::for_signal`]).
    pub fn check(&self) -> Result<Checked, FieldError> {
        if self.actions.is_empty() {
            return Err(FieldError::at("actions", "at least one action is required"));
        }
        Ok(Checked {
            actions: Actions::new(&self.actions, "actions")?,
            include: self.include.as_ref().map(|m| Matcher::new(m, "include")).transpose()?,
            exclude: self.exclude.as_ref().map(|m| Matcher::new(m, "exclude")).transpose()?,
        })
    }
}

impl Checked {
    /// Refuses `include` / `exclude` properties that otelcol does not allow for `signal`.
    pub fn for_signal(self, signal: Signal) -> Result<Checked, FieldError> {
        if let Some(m) = &self.include {
            m.check_signal(signal, "include")?;
        }
        if let Some(m) = &self.exclude {
            m.check_signal(signal, "exclude")?;
        }
        Ok(self)
    }

    fn selected(&self, matches: impl Fn(&Matcher) -> bool) -> bool {
        self.include.as_ref().is_none_or(&matches) && !self.exclude.as_ref().is_some_and(&matches)
    }

    /// Applies the actions to the selected items of a decoded payload; returns how many changed.
    pub fn apply(&self, data: &mut Payload) -> usize {
        let mut changed = 0;
        let empty: Vec<KeyValue> = Vec::new();
        match data {
            Payload::Traces(req) => {
                for rs in &mut req.resource_spans {
                    let res = rs.resource.as_ref().map_or(&empty, |r| &r.attributes);
                    for ss in &mut rs.scope_spans {
                        for span in &mut ss.spans {
                            if self.selected(|m| m.span(res, ss.scope.as_ref(), span))
                                && self.actions.apply(&mut span.attributes)
                            {
                                changed += 1;
                            }
                        }
                    }
                }
            }
            Payload::Metrics(req) => {
                for rm in &mut req.resource_metrics {
                    let res = rm.resource.as_ref().map_or(&empty, |r| &r.attributes);
                    for sm in &mut rm.scope_metrics {
                        for metric in &mut sm.metrics {
                            if !self.selected(|m| m.metric(res, &metric.name)) {
                                continue;
                            }
                            changed += self.points(metric.data.as_mut());
                        }
                    }
                }
            }
            Payload::Logs(req) => {
                for rl in &mut req.resource_logs {
                    let res = rl.resource.as_ref().map_or(&empty, |r| &r.attributes);
                    for sl in &mut rl.scope_logs {
                        for rec in &mut sl.log_records {
                            if self.selected(|m| m.log(res, sl.scope.as_ref(), rec))
                                && self.actions.apply(&mut rec.attributes)
                            {
                                changed += 1;
                            }
                        }
                    }
                }
            }
            Payload::Encoded(_) => {}
        }
        changed
    }

    fn points(&self, data: Option<&mut Data>) -> usize {
        let a = &self.actions;
        let count =
            |it: &mut dyn Iterator<Item = &mut Vec<KeyValue>>| it.map(|attrs| usize::from(a.apply(attrs))).sum();
        match data {
            Some(Data::Gauge(g)) => count(&mut g.data_points.iter_mut().map(|p| &mut p.attributes)),
            Some(Data::Sum(s)) => count(&mut s.data_points.iter_mut().map(|p| &mut p.attributes)),
            Some(Data::Histogram(h)) => count(&mut h.data_points.iter_mut().map(|p| &mut p.attributes)),
            Some(Data::ExponentialHistogram(h)) => count(&mut h.data_points.iter_mut().map(|p| &mut p.attributes)),
            Some(Data::Summary(s)) => count(&mut s.data_points.iter_mut().map(|p| &mut p.attributes)),
            None => 0,
        }
    }
}

/// Factory of `attributes`.
pub struct AttributesFactory;

impl ProcessorFactory for AttributesFactory {
    fn type_name(&self) -> &'static str {
        "attributes"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(parse_config::<AttributesConfig>(cfg)?.check()?))
    }
    fn build(
        &self,
        _ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let cfg = inferwatch_core::component::typed::<Checked>(parsed)?.clone().for_signal(signal)?;
        Ok(Arc::new(AttributesProcessor { cfg, next }))
    }
}

/// The running processor.
pub struct AttributesProcessor {
    cfg: Checked,
    next: ConsumerRef,
}

impl AttributesProcessor {
    /// Applies the actions to the selected items of `data`.
    pub fn process(&self, data: Payload) -> Payload {
        match data {
            Payload::Encoded(e) => match e.decode() {
                Ok(mut d) => {
                    if self.cfg.apply(&mut d) > 0 {
                        d
                    } else {
                        Payload::Encoded(e)
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "attributes: cannot decode payload; passed on unchanged");
                    Payload::Encoded(e)
                }
            },
            mut d => {
                self.cfg.apply(&mut d);
                d
            }
        }
    }
}

#[async_trait]
impl Consumer for AttributesProcessor {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.next.consume(self.process(data)).await
    }
}

#[async_trait]
impl Node for AttributesProcessor {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
