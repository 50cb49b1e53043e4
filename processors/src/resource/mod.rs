//! Processor `resource`: otelcol's attribute actions (`insert`, `update`, `upsert`, `delete`,
//! `hash`, `extract`, `convert`) on the resource attributes of every signal.
//!
//! Encoded payloads keep their items as bytes: only each entry's `Resource` message is decoded
//! and re-encoded ([`wire`]); a payload whose resources are unchanged passes on as it came.
//! A plain OTLP processor (it changes its input, which an Arrow processor never does).

pub mod wire;

use crate::attraction::{ActionConfig, Actions};
use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;

/// Settings of `resource` (otelcol's keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceConfig {
    /// The actions, applied in order to each resource's attributes (at least one).
    pub attributes: Vec<ActionConfig>,
}

impl ResourceConfig {
    /// Checks the actions as otelcol does.
    pub fn check(&self) -> Result<Actions, FieldError> {
        if self.attributes.is_empty() {
            return Err(FieldError::at("attributes", "at least one action is required"));
        }
        Actions::new(&self.attributes, "attributes")
    }
}

/// Applies `f` to the resource of every resource entry of `data`; returns the payload to pass
/// on and whether anything changed. Encoded payloads are rewritten resource by resource (their
/// items stay bytes); an encoded payload in which nothing changed comes back as it was.
pub fn map_resources(data: Payload, f: &mut dyn FnMut(&mut Resource) -> bool) -> (Payload, bool) {
    match data {
        Payload::Encoded(e) => map_encoded(e, f),
        mut typed => {
            let mut changed = false;
            let mut apply = |r: &mut Option<Resource>| {
                let mut res = r.take().unwrap_or_default();
                let c = f(&mut res);
                if c || res != Resource::default() {
                    *r = Some(res);
                }
                changed |= c;
            };
            match &mut typed {
                Payload::Traces(req) => req.resource_spans.iter_mut().for_each(|e| apply(&mut e.resource)),
                Payload::Metrics(req) => req.resource_metrics.iter_mut().for_each(|e| apply(&mut e.resource)),
                Payload::Logs(req) => req.resource_logs.iter_mut().for_each(|e| apply(&mut e.resource)),
                Payload::Encoded(_) => {}
            }
            (typed, changed)
        }
    }
}

fn map_encoded(e: Encoded, f: &mut dyn FnMut(&mut Resource) -> bool) -> (Payload, bool) {
    let signal = e.signal();
    let chunks = e.chunks();
    let mut out: Option<Encoded> = None;
    let mut changed = false;
    for chunk in chunks {
        let next = match wire::rewrite(&chunk, f) {
            Ok(Some(bytes)) => {
                changed = true;
                Encoded::new(signal, bytes::Bytes::from(bytes))
            }
            Ok(None) => Encoded::new(signal, chunk),
            Err(err) => {
                // Validated bytes always walk; decode whole as a fallback all the same.
                tracing::debug!(error = %err, "resource rewrite fell back to a full decode");
                return match e.decode() {
                    Ok(d) => map_resources(d, f),
                    Err(_) => (Payload::Encoded(e), false),
                };
            }
        };
        match (next, &mut out) {
            (Ok(n), Some(o)) => o.extend(n),
            (Ok(n), None) => out = Some(n),
            (Err(_), _) => return (Payload::Encoded(e), false),
        }
    }
    match out {
        Some(o) if changed => (Payload::Encoded(o), true),
        _ => (Payload::Encoded(e), false),
    }
}

/// Factory of `resource`.
pub struct ResourceFactory;

impl ProcessorFactory for ResourceFactory {
    fn type_name(&self) -> &'static str {
        "resource"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(parse_config::<ResourceConfig>(cfg)?.check()?))
    }
    fn build(
        &self,
        _ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        _signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let actions = inferwatch_core::component::typed::<Actions>(parsed)?.clone();
        Ok(Arc::new(ResourceProcessor { actions, next }))
    }
}

/// The running processor.
pub struct ResourceProcessor {
    actions: Actions,
    next: ConsumerRef,
}

impl ResourceProcessor {
    /// A processor applying `actions`, passing on to `next`.
    pub fn new(actions: Actions, next: ConsumerRef) -> Self {
        ResourceProcessor { actions, next }
    }

    /// Applies the actions to every resource of `data`.
    pub fn process(&self, data: Payload) -> Payload {
        map_resources(data, &mut |r| self.actions.apply(&mut r.attributes)).0
    }
}

#[async_trait]
impl Consumer for ResourceProcessor {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.next.consume(self.process(data)).await
    }
}

#[async_trait]
impl Node for ResourceProcessor {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
