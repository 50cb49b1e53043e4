//! One hardened listener and serve loop for every HTTP and gRPC endpoint of the agent (the
//! OTLP receiver's two transports, health_check, the self-metrics and prometheus exporter
//! endpoints): optional TLS, a cap on connections, header-read / idle / handshake timeouts, an
//! HTTP/2 stream limit, and accept errors (EMFILE) that back off instead of spinning.
//!
//! The connection cap keeps good clients served: when a new connection arrives at the cap, the
//! oldest connection with no request in flight (idle keep-alive, slow header, unfinished
//! handshake) is closed to make room; only when every connection is busy is the new one
//! closed at once. Connections that send no complete request within `read_header_timeout`
//! and keep-alive connections idle for `idle_timeout` are closed, so idle or slow clients
//! cannot pin file descriptors.

pub mod inflate;

use crate::settings::HostPort;
use crate::tls::server::{ServerTlsError, TlsServerSettings};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Counters and gauges of one listener (registered as the `inferwatch_listener_*` families by
/// [`crate::telemetry::Telemetry::listener`]).
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub connections: Gauge,
    /// Connections closed at once at the cap (all busy).
    pub refused: Counter,
    /// Idle connections closed to make room.
    pub evicted: Counter,
    /// Connections closed by a timeout.
    pub timed_out: Counter,
    /// Failed or timed-out TLS handshakes.
    pub tls_handshake_failures: Counter,
    /// Accept errors.
    pub accept_errors: Counter,
}

/// File descriptors left for everything but the listeners (exporter connections, files, state).
pub const FD_RESERVE: u64 = 256;
/// Default of `read_header_timeout`.
pub const DEFAULT_READ_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `idle_timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a TLS handshake may take.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default HTTP/2 streams per connection (RFC 9113 recommends at least 100; nginx's default).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// The largest HTTP/2 header block accepted.
const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;
/// Back-off after an accept error that means the process is out of descriptors or memory.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The least interval between two WARN lines about accept errors.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// How much of the descriptor budget a listener gets by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A data listener (OTLP gRPC or HTTP): 3/8 of what the reserve leaves.
    Ingest,
    /// A control listener (health_check, metrics endpoints): 32 connections.
    Auxiliary,
}

/// The process's soft `RLIMIT_NOFILE` (from /proc/self/limits; 1,024 when unreadable).
pub fn nofile_soft_limit() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/limits") else { return 1024 };
    s.lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .map(|v| if v == "unlimited" { u64::MAX } else { v.parse().unwrap_or(1024) })
        .unwrap_or(1024)
}

/// The default connection cap for a listener of `role` under the current descriptor limit.
///
/// With the 1,024 soft limit: two ingest listeners × 288 + three auxiliary × 32 = 672, plus
/// the 256 reserved = 928 < 1,024, so the listeners alone never exhaust the process's fds.
pub fn default_max_connections(role: Role) -> usize {
    max_connections_for(nofile_soft_limit(), role)
}

/// The connection cap of a listener of `role` under a soft descriptor limit of `soft`.
pub fn max_connections_for(soft: u64, role: Role) -> usize {
    let avail = soft.saturating_sub(FD_RESERVE).max(128);
    match role {
        Role::Ingest => usize::try_from(avail / 8 * 3).unwrap_or(usize::MAX).clamp(16, 16_384),
        Role::Auxiliary => 32,
    }
}

/// The hardening limits of one listener.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most connections open at once (see the module's eviction rule).
    pub max_connections: usize,
    /// A connection must complete a request's headers within this time (slowloris).
    pub read_header_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// A TLS handshake must finish within this time.
    pub tls_handshake_timeout: Duration,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keep-alive ping interval (none = no pings).
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Option<Duration>,
    /// Connections older than this are closed gracefully (gRPC `max_connection_age`).
    pub max_connection_age: Option<Duration>,
    /// Time given to in-flight requests after `max_connection_age` or a shutdown.
    pub max_connection_age_grace: Duration,
    /// Serve HTTP/2 only (gRPC); otherwise HTTP/1.1 and h2c / h2 are auto-detected.
    pub http2_only: bool,
}

impl Limits {
    /// The defaults for a listener of `role`.
    pub fn new(role: Role) -> Self {
        Limits {
            max_connections: default_max_connections(role),
            read_header_timeout: DEFAULT_READ_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            keepalive_interval: None,
            keepalive_timeout: None,
            max_connection_age: None,
            max_connection_age_grace: Duration::from_secs(5),
            http2_only: false,
        }
    }
}

/// Why a listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address could not be bound.
    #[error("{0}")]
    Bind(String),
    /// The TLS settings do not load.
    #[error("{0}")]
    Tls(#[from] ServerTlsError),
}

/// Who is on the other end of a request (inserted into every request's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    /// The client's address.
    pub addr: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// A bound listener, ready to [`serve`].
pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    metrics: ListenerMetrics,
    name: String,
}

/// Binds `endpoint`, naming it in the error the way an operator reads it.
pub async fn bind_tcp(endpoint: &HostPort) -> Result<TcpListener, String> {
    let addr = endpoint.to_bind_string();
    TcpListener::bind(&addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => format!("address {addr} already in use"),
        std::io::ErrorKind::PermissionDenied => format!("permission denied to listen on {addr}"),
        std::io::ErrorKind::AddrNotAvailable => format!("address {addr} is not available on this host"),
        _ => format!("cannot listen on {addr}: {e}"),
    })
}

/// The TLS acceptor of a listener's settings (certificates loaded now, reloaded as configured).
fn acceptor(tls: Option<&TlsServerSettings>) -> Result<Option<TlsAcceptor>, ListenError> {
    Ok(match tls {
        Some(s) => Some(TlsAcceptor::from(Arc::new(crate::tls::server::server_config(s)?))),
        None => None,
    })
}

impl Listener {
    /// Binds `endpoint` and loads the TLS settings; `name` labels logs and metrics.
    pub async fn bind(
        name: &str,
        endpoint: &HostPort,
        tls: Option<&TlsServerSettings>,
        limits: Limits,
        metrics: ListenerMetrics,
    ) -> Result<Listener, ListenError> {
        // TLS first: a bad certificate must not leave a bound port behind.
        let tls = acceptor(tls)?;
        let tcp = bind_tcp(endpoint).await.map_err(ListenError::Bind)?;
        Ok(Listener { tcp, tls, limits, metrics, name: name.to_string() })
    }

    /// Wraps an already bound socket.
    pub fn from_tcp(
        name: &str,
        tcp: TcpListener,
        tls: Option<&TlsServerSettings>,
        limits: Limits,
        metrics: ListenerMetrics,
    ) -> Result<Listener, ListenError> {
        let tls = acceptor(tls)?;
        Ok(Listener { tcp, tls, limits, metrics, name: name.to_string() })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// What the loop knows of one open connection.
struct Slot {
    /// Requests in flight.
    busy: Arc<Activity>,
    /// Cancelled to close the connection at once (eviction).
    kill: CancellationToken,
}

/// Open connections by accept order (the smallest key is the oldest).
#[derive(Default)]
struct Conns {
    map: Mutex<BTreeMap<u64, Slot>>,
}

impl Conns {
    fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Closes the oldest connection with no request in flight; false when all are busy.
    fn evict_idle(&self) -> bool {
        let mut map = self.map.lock();
        let victim = map.iter().find(|(_, s)| s.busy.in_flight.load(Ordering::Acquire) == 0).map(|(k, _)| *k);
        match victim.and_then(|k| map.remove(&k)) {
            Some(slot) => {
                slot.kill.cancel();
                true
            }
            None => false,
        }
    }
}

/// Removes a connection from [`Conns`] when its task ends.
struct Registered {
    conns: Arc<Conns>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns.map.lock().remove(&self.id);
    }
}

/// Requests in flight on one connection and when the last one ended.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    /// Requests completed so far.
    served: AtomicU64,
    /// Milliseconds since the connection began at which the last request ended.
    last_done_ms: AtomicU64,
    /// Woken when a request ends, so that the connection's timers are recomputed.
    changed: tokio::sync::Notify,
}

/// Decrements the in-flight count when a request's future ends (or is dropped).
struct Busy {
    activity: Arc<Activity>,
    started: Instant,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.activity.last_done_ms.store(ms, Ordering::Release);
        self.activity.served.fetch_add(1, Ordering::AcqRel);
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.activity.changed.notify_one();
    }
}

/// Rate-limits the WARN about accept errors.
struct AcceptWarn {
    last: Option<Instant>,
    suppressed: u64,
}

/// Whether an accept error means the process is out of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM).
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// Serves `app` on `listener` until `shutdown`; then stops accepting, lets in-flight requests
/// finish (each connection closes gracefully) and returns when every connection is closed.
pub async fn serve(listener: Listener, app: axum::Router, shutdown: CancellationToken) {
    let Listener { tcp, tls, limits, metrics, name } = listener;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.read_header_timeout).keep_alive(true);
    {
        let mut h2 = builder.http2();
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .max_pending_accept_reset_streams(Some(64))
            .keep_alive_interval(limits.keepalive_interval);
        if let Some(t) = limits.keepalive_timeout {
            h2.keep_alive_timeout(t);
        }
    }
    if limits.http2_only {
        builder = builder.http2_only();
    }
    let builder = Arc::new(builder);
    let limits = Arc::new(limits);
    let conns = Arc::new(Conns::default());
    let mut tasks = JoinSet::new();
    let mut next_id = 0u64;
    let mut warn = AcceptWarn { last: None, suppressed: 0 };
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = tcp.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let exhausted = is_resource_exhaustion(&e);
                metrics.accept_errors.inc();
                if exhausted {
                    let now = Instant::now();
                    if warn.last.is_none_or(|l| now.duration_since(l) >= ACCEPT_WARN_EVERY) {
                        tracing::warn!(listener = %name, error = %e, suppressed = warn.suppressed,
                            open_connections = conns.len(),
                            "cannot accept connections: out of file descriptors or memory; backing off \
                             (raise LimitNOFILE or lower max_connections)");
                        warn.last = Some(now);
                        warn.suppressed = 0;
                    } else {
                        warn.suppressed += 1;
                    }
                    // Free a descriptor if one is held by an idle client, then wait.
                    if conns.evict_idle() {
                        metrics.evicted.inc();
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                } else {
                    tracing::debug!(listener = %name, error = %e, "accept failed");
                }
                continue;
            }
        };
        if conns.len() >= limits.max_connections {
            if conns.evict_idle() {
                metrics.evicted.inc();
            } else {
                metrics.refused.inc();
                tracing::debug!(listener = %name, %peer, max = limits.max_connections,
                    "connection refused: every connection has a request in flight");
                drop(stream);
                continue;
            }
        }
        if let Err(e) = stream.set_nodelay(true) {
            tracing::trace!(error = %e, "could not set TCP_NODELAY");
        }
        next_id += 1;
        let activity = Arc::new(Activity::default());
        let kill = CancellationToken::new();
        conns.map.lock().insert(next_id, Slot { busy: activity.clone(), kill: kill.clone() });
        let reg = Registered { conns: conns.clone(), id: next_id };
        let conn = Conn {
            builder: builder.clone(),
            app: app.clone(),
            limits: limits.clone(),
            activity,
            kill,
            shutdown: shutdown.clone(),
            metrics: metrics.clone(),
        };
        let tls = tls.clone();
        metrics.connections.inc();
        tasks.spawn(async move {
            let _reg = reg;
            let m = conn.metrics.clone();
            conn.run(stream, peer, tls).await;
            m.connections.dec();
        });
    }
    drop(tcp);
    while tasks.join_next().await.is_some() {}
}

/// One connection's task.
struct Conn {
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: axum::Router,
    limits: Arc<Limits>,
    activity: Arc<Activity>,
    kill: CancellationToken,
    shutdown: CancellationToken,
    metrics: ListenerMetrics,
}

impl Conn {
    /// When the connection's timers must next be looked at.
    fn next_check(
        &self,
        started: Instant,
        closing: Option<tokio::time::Instant>,
        age: Option<tokio::time::Instant>,
    ) -> tokio::time::Instant {
        if let Some(c) = closing {
            return c;
        }
        let l = &self.limits;
        let now = tokio::time::Instant::now();
        let due = if self.activity.in_flight.load(Ordering::Acquire) > 0 {
            now + l.idle_timeout.min(l.read_header_timeout)
        } else if self.activity.served.load(Ordering::Acquire) == 0 {
            tokio::time::Instant::from_std(started + l.read_header_timeout)
        } else {
            let last = Duration::from_millis(self.activity.last_done_ms.load(Ordering::Acquire));
            tokio::time::Instant::from_std(started + last + l.idle_timeout)
        };
        age.map_or(due, |a| a.min(due))
    }

    async fn run(self, stream: TcpStream, peer: SocketAddr, tls: Option<TlsAcceptor>) {
        match tls {
            None => self.http(stream, PeerInfo { addr: peer, tls: false }).await,
            Some(acceptor) => {
                let handshake = tokio::time::timeout(self.limits.tls_handshake_timeout, acceptor.accept(stream));
                let r = tokio::select! {
                    _ = self.kill.cancelled() => return,
                    _ = self.shutdown.cancelled() => return,
                    r = handshake => r,
                };
                match r {
                    Ok(Ok(s)) => self.http(s, PeerInfo { addr: peer, tls: true }).await,
                    Ok(Err(e)) => {
                        self.metrics.tls_handshake_failures.inc();
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    }
                    Err(_) => {
                        self.metrics.tls_handshake_failures.inc();
                        tracing::debug!(%peer, "TLS handshake timed out");
                    }
                }
            }
        }
    }

    async fn http<I>(self, io: I, peer: PeerInfo)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let started = Instant::now();
        let app = self.app.clone();
        let activity = self.activity.clone();
        let svc = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            activity.in_flight.fetch_add(1, Ordering::AcqRel);
            let busy = Busy { activity: activity.clone(), started };
            req.extensions_mut().insert(peer);
            let mut app = app.clone();
            async move {
                let r = tower::Service::call(&mut app, req.map(axum::body::Body::new)).await;
                drop(busy);
                r
            }
        });
        let conn = self.builder.serve_connection(TokioIo::new(io), svc);
        tokio::pin!(conn);
        let limits = &self.limits;
        let mut closing: Option<tokio::time::Instant> = None;
        let age_deadline = limits.max_connection_age.map(|a| tokio::time::Instant::from_std(started + a));
        loop {
            let next_check = self.next_check(started, closing, age_deadline);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::trace!(peer = %peer.addr, error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = self.kill.cancelled() => return,
                _ = self.activity.changed.notified() => continue,
                _ = self.shutdown.cancelled(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(tokio::time::Instant::now() + limits.max_connection_age_grace);
                }
                _ = tokio::time::sleep_until(next_check) => {
                    let now = tokio::time::Instant::now();
                    if let Some(c) = closing {
                        if now >= c {
                            return;
                        }
                        continue;
                    }
                    if age_deadline.is_some_and(|d| now >= d) {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(now + limits.max_connection_age_grace);
                        continue;
                    }
                    if self.activity.in_flight.load(Ordering::Acquire) > 0 {
                        continue;
                    }
                    let elapsed = started.elapsed();
                    if self.activity.served.load(Ordering::Acquire) == 0 {
                        // No complete request yet: a slow or silent client.
                        if elapsed >= limits.read_header_timeout {
                            self.metrics.timed_out.inc();
                            return;
                        }
                    } else {
                        let last = Duration::from_millis(self.activity.last_done_ms.load(Ordering::Acquire));
                        if elapsed.saturating_sub(last) >= limits.idle_timeout {
                            self.metrics.timed_out.inc();
                            conn.as_mut().graceful_shutdown();
                            closing = Some(now + Duration::from_secs(1));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
