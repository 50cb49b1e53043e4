//! The `otlphttp` exporter factory.

use super::config::OtlpHttpConfig;
use super::send::HttpSender;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::Signal;
use std::sync::Arc;

/// Factory of the `otlphttp` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtlpHttpExporterFactory;

impl ExporterFactory for OtlpHttpExporterFactory {
    fn type_name(&self) -> &'static str {
        "otlphttp"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(OtlpHttpConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<OtlpHttpConfig>(parsed)?;
        let mut sender = HttpSender::new(ctx.id.to_string(), c, signal)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.client.auth.as_ref())?;
        c.exporter.node(&ctx, signal, Arc::new(sender))
    }
}
