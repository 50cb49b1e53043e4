//! Extension `health_check`: an HTTP endpoint answering 200 while every pipeline runs, 503 otherwise.

use crate::auth::{AuthSettings, ServerAuth};
use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::host::StatusHandle;
use crate::server::{Limits, ListenError, Listener, Role};
use crate::settings::{GoDuration, HostPort};
use crate::telemetry::Telemetry;
use crate::tls::server::TlsServerSettings;
use crate::vocab::{ComponentError, FieldError, parse_config};
use async_trait::async_trait;
use axum::http::StatusCode;
use serde::Deserialize;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Settings of `health_check` (otelcol's keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// Listen address (default 127.0.0.1:13133).
    pub endpoint: HostPort,
    /// Path answered (default `/`).
    pub path: String,
    /// Server TLS (otelcol confighttp `tls`); absent = plain text.
    pub tls: Option<TlsServerSettings>,
    /// The authenticator extension that checks every request (401 otherwise).
    pub auth: Option<AuthSettings>,
    /// Time allowed to send a request's headers (default 10s).
    pub read_header_timeout: Option<GoDuration>,
    /// Keep-alive connections with no request for this long are closed (default 60s).
    pub idle_timeout: Option<GoDuration>,
    /// Most connections open at once (default 32).
    pub max_connections: Option<usize>,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            endpoint: HostPort { host: "127.0.0.1".into(), port: 13133 },
            path: "/".into(),
            tls: None,
            auth: None,
            read_header_timeout: None,
            idle_timeout: None,
            max_connections: None,
        }
    }
}

impl HealthCheckConfig {
    /// The listener limits (auxiliary defaults, overridden by the settings).
    pub fn limits(&self) -> Limits {
        let mut l = Limits::new(Role::Auxiliary);
        if let Some(n) = self.max_connections {
            l.max_connections = n.max(1);
        }
        if let Some(t) = self.read_header_timeout.filter(|t| !t.0.is_zero()) {
            l.read_header_timeout = t.0;
        }
        if let Some(t) = self.idle_timeout.filter(|t| !t.0.is_zero()) {
            l.idle_timeout = t.0;
        }
        l
    }
}

/// Refuses requests the authenticator does not accept with 401 (the credential is never logged).
async fn check_auth(
    auth: Option<Arc<dyn ServerAuth>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(a) = &auth
        && let Err(e) = a.authenticate(req.headers())
    {
        tracing::debug!(error = %e, "health_check refused an unauthenticated request");
        return (
            StatusCode::UNAUTHORIZED,
            [
                (axum::http::header::WWW_AUTHENTICATE, "Bearer realm=\"health_check\""),
                (axum::http::header::WWW_AUTHENTICATE, "Basic realm=\"health_check\""),
            ],
            e.to_string(),
        )
            .into_response();
    }
    next.run(req).await
}

/// Factory of `health_check`.
pub struct HealthCheckFactory;

impl ExtensionFactory for HealthCheckFactory {
    fn type_name(&self) -> &'static str {
        "health_check"
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        let c: HealthCheckConfig = parse_config(cfg)?;
        if !c.path.starts_with('/') || c.path.contains(['{', '}', '*', ':']) {
            return Err(FieldError::at("path", "must start with / and hold no {, }, * or :"));
        }
        Ok(std::sync::Arc::new(c))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let config = crate::component::typed::<HealthCheckConfig>(parsed)?.clone();
        Ok(Box::new(HealthCheck {
            config,
            stop: CancellationToken::new(),
            local: None,
            host: ctx.host,
            telemetry: ctx.telemetry,
        }))
    }
}

/// The running extension.
pub struct HealthCheck {
    config: HealthCheckConfig,
    stop: CancellationToken,
    local: Option<std::net::SocketAddr>,
    host: Arc<crate::host::Host>,
    telemetry: Arc<Telemetry>,
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
        let auth = match &self.config.auth {
            Some(a) => Some(a.server(&self.host).map_err(|e| ComponentError::Start(format!("health_check: {e}")))?),
            None => None,
        };
        let c = &self.config;
        let metrics = self.telemetry.listener("health_check");
        let listener = Listener::bind("health_check", &c.endpoint, c.tls.as_ref(), c.limits(), metrics).await.map_err(
            |e| match e {
                ListenError::Bind(why) => ComponentError::Start(why),
                ListenError::Tls(e) => ComponentError::Start(format!("health_check: {e}")),
            },
        )?;
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
        let app = app.layer(axum::middleware::from_fn(move |req, next| check_auth(auth.clone(), req, next)));
        let stop = self.stop.clone();
        tracing::info!(endpoint = %addr, tls = self.config.tls.is_some(), "health_check listening");
        tokio::spawn(crate::server::serve(listener, app, stop));
        Ok(())
    }

    async fn shutdown(&mut self) {
        self.stop.cancel();
    }
}
