//! The `prometheusremotewrite` exporter factory.

use super::config::RemoteWriteConfig;
use super::node::RemoteWriteExporter;
use super::{DELTA_IDLE, DELTA_MAX_SERIES};
use crate::prometheus::cumulative::DeltaToCumulative;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::Signal;
use parking_lot::Mutex;
use std::sync::Arc;

/// Factory of the `prometheusremotewrite` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct RemoteWriteExporterFactory;

impl ExporterFactory for RemoteWriteExporterFactory {
    fn type_name(&self) -> &'static str {
        "prometheusremotewrite"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Metrics]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(RemoteWriteConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        if signal != Signal::Metrics {
            return Err(ComponentError::Start(format!("exporter \"{}\" exports metrics only, not {signal}", ctx.id)));
        }
        let c = inferwatch_core::component::typed::<RemoteWriteConfig>(parsed)?;
        let mut sender = c.sender()?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        let inner = c.exporter.node(&ctx, signal, Arc::new(sender))?;
        Ok(Arc::new(RemoteWriteExporter {
            name: ctx.id.to_string(),
            delta: Mutex::new(DeltaToCumulative::new(DELTA_MAX_SERIES, DELTA_IDLE)),
            order: tokio::sync::Mutex::new(()),
            inner,
            dropped: ctx.telemetry.processor(&ctx.id, Signal::Metrics).dropped,
        }))
    }
}
