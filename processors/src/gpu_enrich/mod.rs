//! Processor `gpu_enrich`: joins the latest GPU sample (memory used, utilisation, power, throttle)
//! of the serving process's GPUs to each span and each `llm_signals` point, as attributes.
//!
//! A backward as-of join on event time (a span's end time, a point's timestamp) within a
//! tolerance, by host and GPU set. GPU samples arrive through a metrics pipeline; the instances of
//! one component id in every pipeline of a graph share one sample store ([`shared`]), so spans in
//! a traces pipeline are enriched from samples seen in a metrics pipeline. It modifies OTLP in
//! place and is therefore a plain processor, not an Arrow one. Reference: docs/gpu-enrich.md.

pub mod config;
pub mod join;
pub mod otlp;
pub mod ring;
pub mod shared;
pub mod store;

use async_trait::async_trait;
use config::{Checked, GpuEnrichConfig, static_gpu_set, system_host_name};
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use join::GpuSelector;
use shared::{Shared, shared_for};
use std::sync::Arc;
use std::time::Instant;

/// Environment variable naming the GPUs the server sees.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// Factory of `gpu_enrich`.
pub struct GpuEnrichFactory;

impl ProcessorFactory for GpuEnrichFactory {
    fn type_name(&self) -> &'static str {
        "gpu_enrich"
    }
    fn signals(&self) -> &'static [Signal] {
        &[Signal::Traces, Signal::Metrics]
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(parse_config::<GpuEnrichConfig>(cfg)?.check()?))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let cvd = std::env::var(CUDA_VISIBLE_DEVICES).ok();
        let cfg = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(GpuEnrich::build_checked(&ctx, cfg, signal, next, cvd.as_deref())?)
    }
}

/// The running processor (one per pipeline; the sample store is shared per component id).
pub struct GpuEnrich {
    cfg: Checked,
    selector: GpuSelector,
    agent_host: String,
    shared: Arc<Shared>,
    signal: Signal,
    next: ConsumerRef,
}

impl GpuEnrich {
    /// Builds an instance from settings, with `cuda_visible_devices` as the environment's value.
    pub fn build(
        ctx: &CreateContext,
        cfg: &serde_json::Value,
        signal: Signal,
        next: ConsumerRef,
        cuda_visible_devices: Option<&str>,
    ) -> Result<Arc<GpuEnrich>, ComponentError> {
        Self::build_checked(ctx, parse_config::<GpuEnrichConfig>(cfg)?.check()?, signal, next, cuda_visible_devices)
    }

    /// [`GpuEnrich::build`] from settings already parsed and checked.
    fn build_checked(
        ctx: &CreateContext,
        cfg: Checked,
        signal: Signal,
        next: ConsumerRef,
        cuda_visible_devices: Option<&str>,
    ) -> Result<Arc<GpuEnrich>, ComponentError> {
        if signal == Signal::Logs {
            return Err(ComponentError::Start("gpu_enrich enriches traces and metrics, not logs".into()));
        }
        let selector = GpuSelector {
            fixed: static_gpu_set(&cfg.gpus, cuda_visible_devices),
            server_pid: cfg.server_pid,
            server_process: cfg.server_process.clone(),
        };
        let agent_host = cfg.host_name.clone().unwrap_or_else(system_host_name);
        tracing::debug!(processor = %ctx.id, %signal, host = %agent_host, gpus = ?selector.fixed, "gpu_enrich built");
        let shared = shared_for(&ctx.host, &ctx.id, cfg.max_samples);
        shared.counts.attach(&ctx.telemetry, &ctx.id);
        Ok(Arc::new(GpuEnrich { cfg, selector, agent_host, shared, signal, next }))
    }

    /// The store and counters shared with the other instances of this component.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The GPU set selection in effect.
    pub fn selector(&self) -> &GpuSelector {
        &self.selector
    }

    /// Takes in the GPU samples of `data` and enriches its items; returns the payload to pass on.
    /// An encoded payload in which nothing was enriched is passed on as it came.
    pub fn process(&self, data: Payload) -> Payload {
        let (decoded, original) = match data {
            Payload::Encoded(e) => match e.decode() {
                Ok(d) => (d, Some(e)),
                Err(err) => {
                    tracing::warn!(error = %err, "gpu_enrich: cannot decode payload; passed on unchanged");
                    return Payload::Encoded(e);
                }
            },
            other => (other, None),
        };
        let (out, changed) = self.process_decoded(decoded);
        match original {
            Some(e) if changed == 0 => Payload::Encoded(e),
            _ => out,
        }
    }

    fn process_decoded(&self, mut data: Payload) -> (Payload, usize) {
        if let Payload::Metrics(req) = &data {
            let mut store = self.shared.store.write();
            otlp::ingest(&self.cfg, &self.agent_host, &mut store, req);
        }
        let store = self.shared.store.read();
        let j = otlp::Join {
            cfg: &self.cfg,
            selector: &self.selector,
            agent_host: &self.agent_host,
            store: &store,
            counts: &self.shared.counts,
        };
        let n = match &mut data {
            Payload::Traces(req) => j.spans(req),
            Payload::Metrics(req) => j.points(req),
            _ => 0,
        };
        drop(store);
        (data, n)
    }
}

#[async_trait]
impl Consumer for GpuEnrich {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let out = if data.signal() == self.signal { self.process(data) } else { data };
        self.next.consume(out).await
    }
}

#[async_trait]
impl Node for GpuEnrich {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
