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

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        OtlpHttpConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        let c = OtlpHttpConfig::from_value(cfg)?;
        let mut sender = HttpSender::new(ctx.id.to_string(), &c, signal)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        c.exporter.node(&ctx, signal, Arc::new(sender))
    }
}
