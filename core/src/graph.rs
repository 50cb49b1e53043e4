//! Builds the pipeline graph from a validated configuration, starts it and shuts it down in order.
//!
//! Build order follows otelcol: exporters (one per id and signal), then each pipeline's
//! processors from last to first, connectors feeding the pipelines that list them as
//! receivers, and finally receivers (one per id, fanning out to every pipeline that lists it).
//! Start runs the other way round, so receivers accept data only once everything behind them
//! is ready; shutdown stops receivers first, then flushes nodes from upstream to downstream.

use crate::arrow::stage::{ArrowStage, StageContext};
use crate::component::{Extension, NodeRef, Parsed, Receiver, ReceiverConsumers};
use crate::config::{ComponentConfig, Config, ParsedSettings, PipelineConfig, PipelineId};
use crate::consumer::{ConsumerRef, Fanout};
use crate::host::CreateContext;
use crate::host::Host;
pub use crate::host::StatusHandle;
use crate::pdata::Signal;
use crate::registry::Registry;
use crate::telemetry::Telemetry;
use crate::vocab::{ComponentError, ComponentId, FieldError};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A failure to build or start the graph, naming the component.
#[derive(Debug, thiserror::Error)]
#[error("{kind} \"{id}\": {source}")]
pub struct GraphError {
    /// `receiver`, `processor`, ...
    pub kind: &'static str,
    /// The component id.
    pub id: String,
    /// What went wrong.
    #[source]
    pub source: ComponentError,
}

fn gerr(kind: &'static str, id: &ComponentId, source: ComponentError) -> GraphError {
    GraphError { kind, id: id.to_string(), source }
}

/// `comp`'s settings as the factory `f` parses them (with `parse`): those kept when the
/// configuration was validated, else parsed now and kept for the other pipelines using it.
fn parsed_of<F: ?Sized>(
    comp: &ComponentConfig,
    f: &Arc<F>,
    parse: impl FnOnce(&serde_json::Value) -> Result<Parsed, FieldError>,
) -> Result<Parsed, ComponentError> {
    let key = ParsedSettings::factory_key(f);
    if let Some(p) = comp.parsed.get(key, &comp.settings) {
        return Ok(p);
    }
    let p = parse(&comp.settings)?;
    comp.parsed.set(key, &comp.settings, p.clone());
    Ok(p)
}

/// What shutdown achieved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Items accepted but not delivered before the deadline.
    pub undelivered: u64,
    /// True when shutdown finished before the deadline.
    pub in_time: bool,
}

/// A built pipeline graph.
pub struct Service {
    receivers: Vec<(ComponentId, Box<dyn Receiver>, ReceiverConsumers)>,
    /// Nodes in build order: downstream first.
    nodes: Vec<(String, NodeRef)>,
    extensions: Vec<(ComponentId, Box<dyn Extension>)>,
    status: StatusHandle,
    host: Arc<Host>,
}

struct Builder<'a> {
    config: &'a Config,
    registry: &'a Registry,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
    exporters: HashMap<(ComponentId, Signal), NodeRef>,
    connectors: HashMap<(ComponentId, Signal, Signal), NodeRef>,
    entries: HashMap<PipelineId, ConsumerRef>,
    building: Vec<PipelineId>,
    nodes: Vec<(String, NodeRef)>,
}

impl<'a> Builder<'a> {
    fn ctx(&self, id: &ComponentId) -> CreateContext {
        CreateContext { id: id.clone(), telemetry: self.telemetry.clone(), host: self.host.clone() }
    }

    fn pipeline(&self, id: &PipelineId) -> Option<&'a PipelineConfig> {
        self.config.service.pipelines.iter().find(|p| &p.id == id)
    }

    fn processor_factory(
        &self,
        id: &ComponentId,
    ) -> Result<(&'a Arc<dyn crate::component::ProcessorFactory>, &'a ComponentConfig), GraphError> {
        let cfg = self
            .config
            .processors
            .get(id)
            .ok_or_else(|| gerr("processor", id, ComponentError::Start("not defined".into())))?;
        let f = self
            .registry
            .processor(&id.type_name)
            .ok_or_else(|| gerr("processor", id, ComponentError::Start("unknown type".into())))?;
        Ok((f, cfg))
    }

    /// The first consumer of a pipeline, building it (and everything downstream) on first use.
    fn entry(&mut self, pid: &PipelineId) -> Result<ConsumerRef, GraphError> {
        if let Some(c) = self.entries.get(pid) {
            return Ok(c.clone());
        }
        let Some(p) = self.pipeline(pid) else {
            return Err(GraphError {
                kind: "pipeline",
                id: pid.to_string(),
                source: ComponentError::Start("not defined".into()),
            });
        };
        if self.building.contains(pid) {
            return Err(GraphError {
                kind: "pipeline",
                id: pid.to_string(),
                source: ComponentError::Start("cycle through connectors".into()),
            });
        }
        self.building.push(pid.clone());
        let signal = pid.signal;
        let mut outs: Vec<ConsumerRef> = Vec::new();
        for (eid, _) in &p.exporters {
            if let Some(cfg) = self.config.exporters.get(eid) {
                let key = (eid.clone(), signal);
                let node = match self.exporters.get(&key) {
                    Some(n) => n.clone(),
                    None => {
                        let f = self
                            .registry
                            .exporter(&eid.type_name)
                            .ok_or_else(|| gerr("exporter", eid, ComponentError::Start("unknown type".into())))?;
                        let n = parsed_of(cfg, f, |v| f.parse(v))
                            .and_then(|p| f.build(self.ctx(eid), &p, signal))
                            .map_err(|e| gerr("exporter", eid, e))?;
                        self.exporters.insert(key, n.clone());
                        self.nodes.push((format!("exporter {eid} ({signal})"), n.clone()));
                        n
                    }
                };
                outs.push(node);
            } else if let Some(cfg) = self.config.connectors.get(eid) {
                // Connector: feeds every pipeline that lists it as a receiver, per output signal.
                let targets: Vec<PipelineId> = self
                    .config
                    .service
                    .pipelines
                    .iter()
                    .filter(|q| q.receivers.iter().any(|(r, _)| r == eid))
                    .map(|q| q.id.clone())
                    .collect();
                let mut by_signal: BTreeMap<Signal, Vec<ConsumerRef>> = BTreeMap::new();
                for t in &targets {
                    let c = self.entry(t)?;
                    by_signal.entry(t.signal).or_default().push(c);
                }
                for (to, consumers) in by_signal {
                    let key = (eid.clone(), signal, to);
                    let node = match self.connectors.get(&key) {
                        Some(n) => n.clone(),
                        None => {
                            let f = self
                                .registry
                                .connector(&eid.type_name)
                                .ok_or_else(|| gerr("connector", eid, ComponentError::Start("unknown type".into())))?;
                            let n = parsed_of(cfg, f, |v| f.parse(v))
                                .and_then(|p| f.build(self.ctx(eid), &p, signal, to, Fanout::wrap(consumers)))
                                .map_err(|e| gerr("connector", eid, e))?;
                            self.connectors.insert(key, n.clone());
                            self.nodes.push((format!("connector {eid} ({signal}->{to})"), n.clone()));
                            n
                        }
                    };
                    outs.push(node);
                }
            }
        }
        let mut next = Fanout::wrap(outs);
        let procs: Vec<&ComponentId> = p.processors.iter().map(|(id, _)| id).collect();
        let is_arrow = |id: &ComponentId| self.registry.processor(&id.type_name).is_some_and(|f| f.arrow().is_some());
        let mut end = procs.len();
        while end > 0 {
            let prid = procs[end - 1];
            if is_arrow(prid) {
                // Adjacent Arrow processors share one stage: one conversion per batch.
                let mut start = end - 1;
                while start > 0 && is_arrow(procs[start - 1]) {
                    start -= 1;
                }
                let mut list = Vec::new();
                for id in &procs[start..end] {
                    let (f, cfg) = self.processor_factory(id)?;
                    let Some(af) = f.arrow() else { continue };
                    let p = parsed_of(cfg, f, |v| f.parse(v))
                        .and_then(|p| af.build_arrow(self.ctx(id), &p, signal))
                        .map_err(|e| gerr("processor", id, e))?;
                    list.push(((*id).clone(), p));
                }
                let sctx = StageContext {
                    pipeline: pid.to_string(),
                    telemetry: self.telemetry.clone(),
                    host: self.host.clone(),
                };
                let names: Vec<String> = procs[start..end].iter().map(|id| id.to_string()).collect();
                let n: NodeRef = ArrowStage::build(sctx, list, signal, next).map_err(|e| gerr("processor", prid, e))?;
                self.nodes.push((format!("arrow stage [{}] in {pid}", names.join(", ")), n.clone()));
                next = n;
                end = start;
            } else {
                let (f, cfg) = self.processor_factory(prid)?;
                let n = parsed_of(cfg, f, |v| f.parse(v))
                    .and_then(|p| f.build(self.ctx(prid), &p, signal, next))
                    .map_err(|e| gerr("processor", prid, e))?;
                self.nodes.push((format!("processor {prid} in {pid}"), n.clone()));
                next = n;
                end -= 1;
            }
        }
        self.building.retain(|b| b != pid);
        self.entries.insert(pid.clone(), next.clone());
        Ok(next)
    }
}

impl Service {
    /// Builds every component of a validated configuration (nothing is started yet).
    pub fn build(config: &Config, registry: &Registry, telemetry: Arc<Telemetry>) -> Result<Service, GraphError> {
        Self::build_with_host(config, registry, telemetry, Host::new())
    }

    /// Builds with a given host (shared state registry, replay control).
    pub fn build_with_host(
        config: &Config,
        registry: &Registry,
        telemetry: Arc<Telemetry>,
        host: Arc<Host>,
    ) -> Result<Service, GraphError> {
        let mut b = Builder {
            config,
            registry,
            telemetry: telemetry.clone(),
            host: host.clone(),
            exporters: HashMap::new(),
            connectors: HashMap::new(),
            entries: HashMap::new(),
            building: Vec::new(),
            nodes: Vec::new(),
        };
        // Extensions first: they register the services (authenticators, queue storage) that
        // receivers and exporters look up by id when they are created.
        let mut extensions = Vec::new();
        for (eid, _) in &config.service.extensions {
            let Some(ecfg) = config.extensions.get(eid) else { continue };
            let f = registry
                .extension(&eid.type_name)
                .ok_or_else(|| gerr("extension", eid, ComponentError::Start("unknown type".into())))?;
            let e = parsed_of(ecfg, f, |v| f.parse(v))
                .and_then(|p| f.build(b.ctx(eid), &p))
                .map_err(|e| gerr("extension", eid, e))?;
            extensions.push((eid.clone(), e));
        }
        let mut receivers = Vec::new();
        for (rid, rcfg) in &config.receivers {
            let mut consumers: BTreeMap<Signal, Vec<ConsumerRef>> = BTreeMap::new();
            for p in &config.service.pipelines {
                if p.receivers.iter().any(|(r, _)| r == rid) {
                    let c = b.entry(&p.id)?;
                    consumers.entry(p.id.signal).or_default().push(c);
                }
            }
            if consumers.is_empty() {
                continue; // defined but unused, as otelcol allows
            }
            let mut rc = ReceiverConsumers::default();
            for (s, cs) in consumers {
                rc.set(s, Fanout::wrap(cs));
            }
            let f = registry
                .receiver(&rid.type_name)
                .ok_or_else(|| gerr("receiver", rid, ComponentError::Start("unknown type".into())))?;
            let r = parsed_of(rcfg, f, |v| f.parse(v))
                .and_then(|p| f.build(b.ctx(rid), &p))
                .map_err(|e| gerr("receiver", rid, e))?;
            receivers.push((rid.clone(), r, rc));
        }
        // Pipelines fed only by connectors are built through their upstream pipelines above.
        Ok(Service { receivers, nodes: b.nodes, extensions, status: StatusHandle::default(), host })
    }

    /// The pipelines' running state.
    pub fn status(&self) -> StatusHandle {
        self.status.clone()
    }

    /// Starts extensions, then nodes downstream-first, then receivers.
    pub async fn start(&mut self) -> Result<(), GraphError> {
        for (id, e) in &mut self.extensions {
            e.start(self.status.clone()).await.map_err(|e| gerr("extension", id, e))?;
        }
        for (name, n) in &self.nodes {
            n.start().await.map_err(|e| GraphError { kind: "component", id: name.clone(), source: e })?;
        }
        for (id, r, rc) in &mut self.receivers {
            r.start(rc.clone()).await.map_err(|e| gerr("receiver", id, e))?;
        }
        self.status.set_running(true);
        tracing::info!(
            receivers = self.receivers.len(),
            nodes = self.nodes.len(),
            "everything is ready; pipelines running"
        );
        Ok(())
    }

    /// Tells every node, upstream first, that the input ended (a replay finished), so Arrow
    /// stages emit the windows event time still holds open.
    pub async fn end_of_input(&self) {
        for (_, n) in self.nodes.iter().rev() {
            n.end_of_input().await;
        }
    }

    /// The shared host (state registry, replay control).
    pub fn host(&self) -> Arc<Host> {
        self.host.clone()
    }

    /// Stops receivers, then flushes and stops nodes upstream-first, within `timeout`.
    pub async fn shutdown(mut self, timeout: Duration) -> ShutdownReport {
        let deadline = Instant::now() + timeout;
        self.status.set_running(false);
        for (id, r, _) in &mut self.receivers {
            tracing::debug!(receiver = %id, "stopping receiver");
            r.shutdown().await;
        }
        let mut undelivered = 0;
        for (name, n) in self.nodes.iter().rev() {
            let lost = n.shutdown(deadline).await;
            if lost > 0 {
                tracing::warn!(component = %name, items = lost, "items not delivered before the shutdown timeout");
            }
            undelivered += lost;
        }
        for (_, e) in &mut self.extensions {
            e.shutdown().await;
        }
        ShutdownReport { undelivered, in_time: Instant::now() <= deadline }
    }
}
