//! The HTTP endpoint of the `prometheus` exporter: `GET /metrics` (axum).

use super::accumulator::Accumulator;
use super::exposition::{Format, render};
use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
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
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: String,
    /// What the system said.
    pub source: std::io::Error,
}

/// A running endpoint.
pub struct Server {
    /// The bound address (the real port when 0 was asked for).
    pub local_addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `addr` and serves `/metrics` until [`Server::stop`].
    pub async fn start(addr: &str, served: Served) -> Result<Server, BindError> {
        let err = |source| BindError { addr: addr.to_string(), source };
        let listener = TcpListener::bind(addr).await.map_err(err)?;
        let local_addr = listener.local_addr().map_err(err)?;
        let stop = CancellationToken::new();
        let app = axum::Router::new().route("/metrics", get(metrics)).with_state(Arc::new(served));
        let token = stop.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(token.cancelled_owned()).await {
                tracing::warn!(error = %e, "prometheus exporter endpoint stopped");
            }
        });
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
    let format = Format::negotiate(accept, s.open_metrics);
    let body = {
        let mut acc = s.state.lock();
        acc.expire(Instant::now());
        render(&acc, format)
    };
    ([(CONTENT_TYPE, HeaderValue::from_static(format.content_type()))], body).into_response()
}
