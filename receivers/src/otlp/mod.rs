//! The `otlp` receiver: OTLP over gRPC (default 4317) and HTTP (default 4318), as otelcol's.
//!
//! ```yaml
//! receivers:
//!   otlp:
//!     protocols:
//!       grpc: { endpoint: 127.0.0.1:4317 }
//!       http: {}
//! ```
//!
//! A protocol is served when its key is present. Each signal is served only when the
//! receiver is in a pipeline of that signal (gRPC answers UNIMPLEMENTED, HTTP 404 otherwise).
//! Refusals from the pipeline become RESOURCE_EXHAUSTED / UNAVAILABLE with `RetryInfo`
//! (gRPC) or 429 / 503 with `Retry-After` (HTTP); malformed requests become
//! INVALID_ARGUMENT / 400 with the reason; spans with invalid ids are dropped and reported
//! in a partial success. Valid protobuf requests (gRPC and HTTP) pass on undecoded as
//! `Payload::Encoded` after a wire check; OTLP/JSON and requests with invalid ids are decoded.

pub mod config;
mod grpc;
mod http;
mod ingest;
pub(crate) mod json;

use async_trait::async_trait;
use config::OtlpConfig;
use inferwatch_core::auth::AuthSettings;
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::Signal;
use inferwatch_core::server::{Limits, ListenError, Listener};
use inferwatch_core::settings::HostPort;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_core::tls::server::TlsServerSettings;
use ingest::{Gate, Sink};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long `shutdown` waits for in-flight requests before abandoning them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Builds `otlp` receivers.
pub struct OtlpReceiverFactory;

impl ReceiverFactory for OtlpReceiverFactory {
    fn type_name(&self) -> &'static str {
        "otlp"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(OtlpConfig::from_value(cfg)?))
    }

    fn warnings(&self, cfg: &serde_json::Value) -> Vec<FieldError> {
        OtlpConfig::warnings(cfg)
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
    ) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(OtlpReceiver::new(ctx, inferwatch_core::component::typed::<OtlpConfig>(parsed)?.clone())))
    }
}

/// The addresses a started receiver listens on (useful with port 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalAddrs {
    /// The OTLP/gRPC listener, when that protocol is enabled.
    pub grpc: Option<SocketAddr>,
    /// The OTLP/HTTP listener, when that protocol is enabled.
    pub http: Option<SocketAddr>,
}

/// Servers started by `start`.
struct Running {
    shutdown: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// A running (or ready to start) OTLP receiver.
pub struct OtlpReceiver {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
    config: OtlpConfig,
    addrs: LocalAddrs,
    running: Option<Running>,
}

/// Binds a hardened listener (TLS when configured), naming the endpoint in the error.
async fn bind(
    telemetry: &Telemetry,
    id: &ComponentId,
    protocol: &str,
    endpoint: &HostPort,
    tls: Option<&TlsServerSettings>,
    limits: Limits,
) -> Result<Listener, ComponentError> {
    let name = format!("{id}/{protocol}");
    Listener::bind(&name, endpoint, tls, limits, telemetry.listener(&name)).await.map_err(|e| match e {
        ListenError::Bind(why) => ComponentError::Start(format!("otlp {protocol} endpoint: {why}")),
        ListenError::Tls(e) => ComponentError::Start(format!("otlp receiver {id}: protocols.{protocol}.{e}")),
    })
}

impl OtlpReceiver {
    /// A receiver with checked settings (see [`OtlpConfig::from_value`]); it binds on `start`.
    pub fn new(ctx: CreateContext, config: OtlpConfig) -> Self {
        OtlpReceiver {
            id: ctx.id,
            telemetry: ctx.telemetry,
            host: ctx.host,
            config,
            addrs: LocalAddrs::default(),
            running: None,
        }
    }

    /// The admission gate of one transport: its authenticator (looked up in the host's
    /// extension services) and `include_metadata`.
    fn gate(
        &self,
        protocol: &'static str,
        auth: Option<&AuthSettings>,
        include_metadata: bool,
    ) -> Result<Gate, ComponentError> {
        let auth = auth
            .map(|a| a.server(&self.host))
            .transpose()
            .map_err(|e| ComponentError::Start(format!("otlp receiver {}: protocols.{protocol}.{e}", self.id)))?;
        Ok(Gate::new(auth, include_metadata, self.telemetry.auth_failures(&self.id, protocol), protocol))
    }

    /// The bound addresses; empty before `start` and after `shutdown`.
    pub fn local_addrs(&self) -> LocalAddrs {
        self.addrs
    }

    /// The sinks of one transport, one per signal that has a consumer.
    fn sinks(&self, consumers: &ReceiverConsumers, transport: &'static str) -> [Option<Sink>; 3] {
        let metrics = self.telemetry.receiver(&self.id, transport);
        Signal::ALL.map(|s| consumers.get(s).map(|c| Sink::new(c.clone(), metrics.clone(), transport)))
    }
}

#[async_trait]
impl Receiver for OtlpReceiver {
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError> {
        if self.running.is_some() {
            return Err(ComponentError::Start(format!("receiver {} is already started", self.id)));
        }
        // Bind everything first so that a bind error leaves nothing running.
        let (t, id) = (&self.telemetry, &self.id);
        let grpc = match &self.config.protocols.grpc {
            Some(g) => {
                let gate = self.gate("grpc", g.auth.as_ref(), g.include_metadata)?;
                Some((bind(t, id, "grpc", &g.endpoint, g.tls.as_ref(), g.limits()).await?, g.clone(), gate))
            }
            None => None,
        };
        let http = match &self.config.protocols.http {
            Some(h) => {
                let gate = self.gate("http", h.auth.as_ref(), h.include_metadata)?;
                Some((bind(t, id, "http", &h.endpoint, h.tls.as_ref(), h.limits()).await?, h.clone(), gate))
            }
            None => None,
        };
        let local = |l: &Listener| {
            l.local_addr()
                .map_err(|e| ComponentError::Start(format!("otlp receiver: cannot read the bound address: {e}")))
        };
        let mut addrs = LocalAddrs::default();
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut listening = Vec::new();
        if let Some((listener, cfg, gate)) = grpc {
            let addr = local(&listener)?;
            let [traces, metrics, logs] = self.sinks(&consumers, "grpc");
            let sinks = grpc::GrpcSinks { traces, metrics, logs };
            tasks.push(("grpc", tokio::spawn(grpc::serve(listener, cfg, sinks, gate, shutdown.clone()))));
            addrs.grpc = Some(addr);
            listening.push(format!("grpc={addr}"));
        }
        if let Some((listener, cfg, gate)) = http {
            let addr = local(&listener)?;
            let [traces, metrics, logs] = self.sinks(&consumers, "http");
            let sinks = http::HttpSinks { traces, metrics, logs };
            tasks.push(("http", tokio::spawn(http::serve(listener, cfg, sinks, gate, shutdown.clone()))));
            addrs.http = Some(addr);
            listening.push(format!("http={addr}"));
        }
        tracing::info!(receiver = %self.id, "otlp receiver listening on {}", listening.join(" "));
        self.addrs = addrs;
        self.running = Some(Running { shutdown, tasks });
        Ok(())
    }

    async fn shutdown(&mut self) {
        let Some(running) = self.running.take() else { return };
        running.shutdown.cancel();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for (protocol, mut task) in running.tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(receiver = %self.id, protocol, error = %e, "otlp server task failed"),
                Err(_) => {
                    tracing::warn!(receiver = %self.id, protocol, grace = ?SHUTDOWN_GRACE,
                        "otlp receiver: in-flight requests did not finish in time; closing");
                    task.abort();
                }
            }
        }
        self.addrs = LocalAddrs::default();
        tracing::debug!(receiver = %self.id, "otlp receiver stopped");
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.shutdown.cancel();
        }
    }
}
