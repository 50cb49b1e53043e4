//! The `alertmanager` exporter factory.

use super::config::AlertmanagerConfig;
use super::node::{Active, AlertmanagerExporter};
use super::send::AlertmanagerSender;
use crate::common;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::Signal;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Factory of the `alertmanager` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct AlertmanagerExporterFactory;

impl ExporterFactory for AlertmanagerExporterFactory {
    fn type_name(&self) -> &'static str {
        "alertmanager"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Logs]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(AlertmanagerConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        if signal != Signal::Logs {
            return Err(ComponentError::Start(format!("alertmanager exports logs (alert records), not {signal}")));
        }
        let c = inferwatch_core::component::typed::<AlertmanagerConfig>(parsed)?;
        let mut sender = AlertmanagerSender::new(c)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        let sender = Arc::new(sender);
        let inner = c.exporter.node(&ctx, signal, sender)?;
        Ok(Arc::new(AlertmanagerExporter {
            name: ctx.id.to_string(),
            inner,
            send_resolved: c.send_resolved,
            repeat: common::non_zero(c.repeat.0),
            active: Arc::new(Mutex::new(Active::default())),
            ignored: ctx.telemetry.processor(&ctx.id, Signal::Logs).dropped,
            stop: CancellationToken::new(),
            task: tokio::sync::Mutex::new(None),
        }))
    }
}
