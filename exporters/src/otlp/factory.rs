//! The `otlp` exporter factory.

use super::config::OtlpConfig;
use super::send::GrpcSender;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::Signal;
use std::sync::Arc;

/// Factory of the `otlp` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtlpExporterFactory;

impl ExporterFactory for OtlpExporterFactory {
    fn type_name(&self) -> &'static str {
        "otlp"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(OtlpConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<OtlpConfig>(parsed)?;
        let mut sender = GrpcSender::new(ctx.id.to_string(), c)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.client.auth.as_ref())?;
        c.exporter.node(&ctx, signal, Arc::new(sender))
    }
}
