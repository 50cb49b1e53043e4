//! Extension `health_check`: an HTTP endpoint answering 200 while every pipeline runs, 503 otherwise.

use crate::component::{ComponentError, CreateContext, Extension, ExtensionFactory, FieldError, parse_config};
use crate::graph::StatusHandle;
use crate::settings::HostPort;
use async_trait::async_trait;
use axum::http::StatusCode;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Settings of `health_check` (otelcol's keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// Listen address (default 127.0.0.1:13133).
    pub endpoint: HostPort,
    /// Path answered (default `/`).
    pub path: String,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig { endpoint: HostPort { host: "127.0.0.1".into(), port: 13133 }, path: "/".into() }
    }
}

/// Factory of `health_check`.
pub struct HealthCheckFactory;

impl ExtensionFactory for HealthCheckFactory {
    fn type_name(&self) -> &'static str {
        "health_check"
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        let c: HealthCheckConfig = parse_config(cfg)?;
        if !c.path.starts_with('/') || c.path.contains(['{', '}', '*', ':']) {
            return Err(FieldError::at("path", "must start with / and hold no {, }, * or :"));
        }
        Ok(())
    }
    fn create(&self, _ctx: CreateContext, cfg: &serde_json::Value) -> Result<Box<dyn Extension>, ComponentError> {
        let config: HealthCheckConfig = parse_config(cfg)?;
        Ok(Box::new(HealthCheck { config, stop: CancellationToken::new(), local: None }))
    }
}

/// The running extension.
pub struct HealthCheck {
    config: HealthCheckConfig,
    stop: CancellationToken,
    local: Option<std::net::SocketAddr>,
}

impl HealthCheck {
    /// The bound address, once started.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.local
    }
}

#[async_trait]
impl Extension for HealthCheck {
    async fn start(&mut self, status: StatusHandle) -> Result<(), ComponentError> {
        let addr = self.config.endpoint.to_bind_string();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| ComponentError::Start(format!("cannot listen on {addr}: {e}")))?;
        self.local = listener.local_addr().ok();
        let app = axum::Router::new().route(
            &self.config.path,
            axum::routing::get(move || {
                let running = status.is_running();
                async move {
                    if running {
                        (StatusCode::OK, r#"{"status":"Server available"}"#)
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"Server not available"}"#)
                    }
                }
            }),
        );
        let stop = self.stop.clone();
        tracing::info!(endpoint = %addr, "health_check listening");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
                tracing::warn!(error = %e, "health_check server stopped");
            }
        });
        Ok(())
    }

    async fn shutdown(&mut self) {
        self.stop.cancel();
    }
}
