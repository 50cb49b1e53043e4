//! The `loadbalancing` exporter factory.

use super::config::LoadBalancingConfig;
use super::exporter::LoadBalancer;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, Parsed, typed};
use inferwatch_core::pdata::Signal;
use std::sync::Arc;

/// Factory of the `loadbalancing` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadBalancingExporterFactory;

impl ExporterFactory for LoadBalancingExporterFactory {
    fn type_name(&self) -> &'static str {
        "loadbalancing"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        Ok(Arc::new(Arc::new(LoadBalancingConfig::from_value(cfg)?)))
    }

    fn warnings(&self, cfg: &serde_json::Value) -> Vec<FieldError> {
        match cfg.pointer("/protocol/otlp/endpoint") {
            Some(_) => vec![FieldError::at(
                "protocol.otlp.endpoint",
                "ignored: each backend's endpoint (from the resolver) is used, as otelcol does",
            )],
            None => Vec::new(),
        }
    }

    fn build(&self, ctx: CreateContext, parsed: &Parsed, signal: Signal) -> Result<NodeRef, ComponentError> {
        let c = typed::<Arc<LoadBalancingConfig>>(parsed)?;
        Ok(Arc::new(LoadBalancer::new(&ctx, c.clone(), signal)?))
    }
}
