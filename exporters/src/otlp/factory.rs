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

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        OtlpConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        let c = OtlpConfig::from_value(cfg)?;
        let mut sender = GrpcSender::new(ctx.id.to_string(), &c)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        c.exporter.node(&ctx, signal, Arc::new(sender))
    }
}
