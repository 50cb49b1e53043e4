//! The HTTP endpoint of the `prometheus` exporter: `GET /metrics` (axum).

use super::accumulator::Accumulator;
use super::exposition::{Format, render};
use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use inferwatch_core::telemetry::exposition::negotiate;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the endpoint serves from.
pub struct Served {
    /// The series.
    pub state: Arc<Mutex<Accumulator>>,
    /// Whether OpenMetrics may be negotiated.
    pub open_metrics: bool,
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The TLS settings do not load.
    #[error("{0}")]
    Tls(#[from] inferwatch_core::server::ListenError),
}

/// How the endpoint listens: TLS, authentication and the listener's metrics.
#[derive(Default)]
pub struct Listen {
    /// Server TLS; `None` = plain text.
    pub tls: Option<inferwatch_core::tls::server::TlsServerSettings>,
    /// Checks every scrape (401 otherwise).
    pub auth: Option<Arc<dyn inferwatch_core::auth::ServerAuth>>,
    /// The listener's self-metrics.
    pub metrics: inferwatch_core::telemetry::ListenerMetrics,
}

/// Refuses scrapes the authenticator does not accept with 401 (the credential is never logged).
async fn check_auth(
    auth: Option<Arc<dyn inferwatch_core::auth::ServerAuth>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(a) = &auth
        && let Err(e) = a.authenticate(req.headers())
    {
        tracing::debug!(error = %e, "prometheus exporter refused an unauthenticated scrape");
        let challenge = [
            (axum::http::header::WWW_AUTHENTICATE, "Bearer realm=\"metrics\""),
            (axum::http::header::WWW_AUTHENTICATE, "Basic realm=\"metrics\""),
        ];
        return (axum::http::StatusCode::UNAUTHORIZED, challenge, e.to_string()).into_response();
    }
    next.run(req).await
}

/// A running endpoint.
pub struct Server {
    /// The bound address (the real port when 0 was asked for).
    pub local_addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `addr` and serves `/metrics` until [`Server::stop`] (plain text, no auth).
    pub async fn start(addr: &str, served: Served) -> Result<Server, BindError> {
        Self::start_with(addr, Listen::default(), served).await
    }

    /// Binds `addr` and serves `/metrics` on the hardened listener with `listen`'s TLS and auth.
    pub async fn start_with(addr: &str, listen: Listen, served: Served) -> Result<Server, BindError> {
        use inferwatch_core::server::{Limits, Listener, Role};
        let err = |source| BindError::Bind { addr: addr.to_string(), source };
        let listener = TcpListener::bind(addr).await.map_err(err)?;
        let local_addr = listener.local_addr().map_err(err)?;
        let listener = Listener::from_tcp(
            "prometheus_exporter",
            listener,
            listen.tls.as_ref(),
            Limits::new(Role::Auxiliary),
            listen.metrics,
        )?;
        let stop = CancellationToken::new();
        let auth = listen.auth;
        let app = axum::Router::new()
            .route("/metrics", get(metrics))
            .with_state(Arc::new(served))
            .layer(axum::middleware::from_fn(move |req, next| check_auth(auth.clone(), req, next)));
        let task = tokio::spawn(inferwatch_core::server::serve(listener, app, stop.clone()));
        Ok(Server { local_addr, stop, task })
    }

    /// Stops accepting scrapes and waits (until `deadline`) for the ones in progress.
    pub async fn stop(self, deadline: Instant) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout_at(deadline.into(), &mut task).await.is_err() {
            task.abort();
        }
    }
}

async fn metrics(State(s): State<Arc<Served>>, headers: HeaderMap) -> Response {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    let format = if s.open_metrics { negotiate(accept) } else { Format::Text };
    let body = {
        let mut acc = s.state.lock();
        acc.expire(Instant::now());
        render(&acc, format)
    };
    ([(CONTENT_TYPE, HeaderValue::from_static(format.content_type()))], body).into_response()
}
