//! Exporters that a configuration switches off by leaving `endpoint` empty, so that a shipped
//! pipeline can name an exporter whose endpoint comes from the environment
//! (`endpoint: ${env:ALERTMANAGER_URL:-}`): with no endpoint the exporter is disabled with one log
//! line and discards what reaches it; with one it is the ordinary exporter.

use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::{Payload, Signal};
use std::sync::Arc;
use std::time::Instant;

/// `factory`, disabled when its settings' `endpoint` is present and empty.
pub struct UnlessNoEndpoint<F>(pub F);

/// Whether the settings name an endpoint that is present and empty (blank or null).
/// otlphttp's per-signal URLs (`traces_endpoint`, …) keep it enabled.
fn no_endpoint(cfg: &serde_json::Value) -> bool {
    // `endpoint: ${env:X:-}` with X unset is YAML's empty value: null.
    let blank = |k: &str| cfg.get(k).is_some_and(|v| v.is_null() || v.as_str().is_some_and(|s| s.trim().is_empty()));
    let set = |k: &str| cfg.get(k).and_then(|v| v.as_str()).is_some_and(|s| !s.trim().is_empty());
    blank("endpoint") && !["traces_endpoint", "metrics_endpoint", "logs_endpoint"].iter().any(|k| set(k))
}

/// What a disabled exporter is: it takes everything and sends nothing.
struct Disabled;

#[async_trait]
impl Consumer for Disabled {
    async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
        Ok(())
    }
}

#[async_trait]
impl Node for Disabled {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}

impl<F: ExporterFactory> ExporterFactory for UnlessNoEndpoint<F> {
    fn type_name(&self) -> &'static str {
        self.0.type_name()
    }
    fn signals(&self) -> &'static [Signal] {
        self.0.signals()
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        if no_endpoint(cfg) {
            let mut rest = cfg.clone();
            if let Some(m) = rest.as_object_mut() {
                m.remove("endpoint");
            }
            // The other keys are still checked (a typo stays an error); an exporter that requires
            // an endpoint says so about the one removed here, which is not an error.
            return match self.0.validate(&rest) {
                Err(e) if e.path == [inferwatch_core::component::PathSeg::Key("endpoint".into())] => Ok(()),
                r => r,
            };
        }
        self.0.validate(cfg)
    }
    fn warnings(&self, cfg: &serde_json::Value) -> Vec<FieldError> {
        if no_endpoint(cfg) { Vec::new() } else { self.0.warnings(cfg) }
    }
    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        if no_endpoint(cfg) {
            tracing::info!(exporter = %ctx.id, data_type = signal.as_str(), "no endpoint set: exporter disabled (what reaches it is discarded)");
            return Ok(Arc::new(Disabled));
        }
        self.0.create(ctx, cfg, signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_or_null_endpoint_disables_and_a_typo_is_still_an_error() {
        assert!(no_endpoint(&json!({"endpoint": ""})) && no_endpoint(&json!({"endpoint": null})));
        assert!(no_endpoint(&json!({"endpoint": "  ", "tls": {"insecure": true}})));
        assert!(!no_endpoint(&json!({})), "no endpoint key: the exporter's own default or error");
        assert!(!no_endpoint(&json!({"endpoint": "http://am:9093"})));
        assert!(!no_endpoint(&json!({"endpoint": "", "logs_endpoint": "http://c:4318/v1/logs"})));
        let f = UnlessNoEndpoint(crate::AlertmanagerExporterFactory);
        assert!(f.validate(&json!({"endpoint": null})).is_ok());
        let e = f.validate(&json!({"endpoint": null, "timeuot": "5s"})).unwrap_err();
        assert_eq!(e.path, vec![inferwatch_core::component::PathSeg::Key("timeuot".into())]);
        let otlp = UnlessNoEndpoint(crate::OtlpExporterFactory);
        assert!(otlp.validate(&json!({"endpoint": null, "tls": {"insecure": true}})).is_ok());
        assert!(otlp.validate(&json!({"endpoint": null, "tls": {"insecure": "yes please"}})).is_err());
    }
}
