//! The `loadbalancing` node: one queued `otlp` exporter per backend, routed through the ring.
//!
//! - Each backend is an ordinary [`QueuedExporter`] (queue, retries, the exporter self-metrics
//!   under the id `<this exporter>/<host:port>`) of the `otlp` sender built from
//!   `protocol.otlp` with the backend's endpoint, wrapped in a [`BackendSender`].
//! - When the resolver's list changes, new backends are started and the ring replaced; a
//!   removed backend is *retired*: its queue is closed and drained, and while another backend
//!   is live every attempt of its workers hands the payload back through the new ring
//!   ([`Attempt::handed_on`]: not counted as sent by the retired backend) instead of sending
//!   it; with none live it keeps sending to its own endpoint. What its shutdown deadline
//!   ([`RETIRE_DEADLINE`]) interrupts is counted in its `otelcol_exporter_send_failed_*` /
//!   shutdown-dropped self-metrics as any exporter's.
//! - A backend whose sends fail without an answer ([`is_unreachable`]: a refused or broken
//!   connection, a deadline; never a refusal with RetryInfo, which is push-back) for
//!   `backend_down_after` is marked down: its keys go to the next live members of the ring,
//!   its workers hand their payloads back the same way, and a probe (an empty export every
//!   [`PROBE_INTERVAL`]) marks it up again after [`PROBE_SUCCESSES`] successes in a row.
//! - Shutdown: no hand-back, no resolver update; current and retiring backends shut down
//!   together, each sending its own data; what is left at the deadline is counted.
//! - With no backend at all, data is refused (retryable): backpressure, not a drop.
//!
//! Delivery is at least once: a payload split over several backends of which one refuses its
//! part is refused as a whole, and the sender's retry may deliver the accepted parts twice.

use super::config::{LoadBalancingConfig, ResolverConfig};
use super::resolver::Resolver;
use super::ring::Ring;
use super::split::{SplitError, Splitter};
use super::{BACKEND_ITEMS, BACKEND_UP, NUM_BACKENDS, REROUTED_DROPPED, REROUTED_ITEMS, RING_CHANGES};
use crate::otlp::GrpcSender;
use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, ComponentId, CreateContext, Node};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::exporterhelper::{Attempt, QueuedExporter, SendError, Sender, offer_held};
use inferwatch_core::extension::client_auth;
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a removed backend has to hand back what it holds.
pub const RETIRE_DEADLINE: Duration = Duration::from_secs(30);
/// Time between the probes of a backend marked down.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Pause before offering again what a full backend queue refused while re-routing.
const REROUTE_PAUSE: Duration = Duration::from_millis(50);
/// How long `start` waits for the resolver's first list.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(2);

/// Consecutive successful probes that mark a backend up again.
pub const PROBE_SUCCESSES: u32 = 2;
/// A pause between two failures longer than this (or than twice `backend_down_after`) starts
/// a new failing period: one late failure does not mark a backend down at once.
const FAILURE_IDLE_RESET: Duration = Duration::from_secs(60);

/// Whether a retryable send error's message names a status the transport raises when the
/// server never answered (UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN, CANCELLED).
pub fn is_transport(message: &str) -> bool {
    ["code = Unavailable", "code = DeadlineExceeded", "code = Unknown", "code = Cancelled"]
        .iter()
        .any(|c| message.contains(c))
}

/// Whether a failed send says the backend is unreachable (it never answered), rather than
/// pushing back: a refusal carrying a delay (gRPC RetryInfo, HTTP Retry-After) is an answer of
/// a live server (our receiver's full queue or downstream refusal), never "down".
pub fn is_unreachable(e: &SendError) -> bool {
    match e {
        SendError::Retryable { message, retry_after: None } => is_transport(message),
        SendError::Retryable { retry_after: Some(_), .. } | SendError::Permanent(_) => false,
    }
}

/// Up / down of one backend.
pub struct Health {
    endpoint: String,
    exporter: String,
    up: AtomicBool,
    retired: AtomicBool,
    /// The first and the last failure of the current failing period.
    failing_since: Mutex<Option<(Instant, Instant)>>,
    /// Consecutive successful probes while down.
    probe_ok: AtomicU32,
    down_after: Duration,
    gauge: Gauge,
}

impl Health {
    /// Whether the backend takes data.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire) && !self.retired.load(Ordering::Acquire)
    }

    fn success(&self) {
        *self.failing_since.lock() = None;
        self.probe_ok.store(0, Ordering::Release);
        if !self.retired.load(Ordering::Acquire) && !self.up.swap(true, Ordering::AcqRel) {
            self.gauge.set(1);
            tracing::info!(exporter = %self.exporter, backend = %self.endpoint, "loadbalancing: backend answers again; marked up");
        }
    }

    fn failure(&self) {
        if self.down_after.is_zero() {
            return;
        }
        let now = Instant::now();
        let idle = (self.down_after * 2).max(FAILURE_IDLE_RESET);
        let since = {
            let mut f = self.failing_since.lock();
            let since = match *f {
                Some((first, last)) if now.duration_since(last) < idle => first,
                _ => now,
            };
            *f = Some((since, now));
            since
        };
        if now.duration_since(since) >= self.down_after && self.up.swap(false, Ordering::AcqRel) {
            self.gauge.set(0);
            tracing::warn!(exporter = %self.exporter, backend = %self.endpoint, after = ?self.down_after,
                "loadbalancing: backend unreachable; marked down, its keys go to the next backends of the ring");
        }
    }

    /// The backend answered, pushing back (overloaded but alive): the failing period ends.
    fn answered(&self) {
        *self.failing_since.lock() = None;
    }

    /// A probe of a down backend answered: marked up after [`PROBE_SUCCESSES`] in a row.
    fn probe_succeeded(&self) {
        if self.probe_ok.fetch_add(1, Ordering::AcqRel) + 1 >= PROBE_SUCCESSES {
            self.success();
        }
    }

    /// A probe of a down backend failed: the run of successes starts over.
    fn probe_failed(&self) {
        self.probe_ok.store(0, Ordering::Release);
    }
}

/// One backend: its queued exporter and health.
pub struct Backend {
    /// `host:port`.
    pub endpoint: String,
    node: Arc<QueuedExporter>,
    /// Up / down.
    pub health: Arc<Health>,
    items: Counter,
    stop: CancellationToken,
}

/// The ring and its backends (same order).
#[derive(Default)]
pub(crate) struct Table {
    ring: Ring,
    backends: Vec<Arc<Backend>>,
}

impl Table {
    fn find(&self, endpoint: &str) -> Option<&Arc<Backend>> {
        self.backends.iter().find(|b| b.endpoint == endpoint)
    }

    /// Whether a backend other than `exclude` is live (checked once per dispatch, so that
    /// with every backend down [`Table::pick`] does not scan the ring per item).
    fn any_live(&self, exclude: Option<&str>) -> bool {
        self.backends.iter().any(|b| b.health.is_up() && exclude != Some(b.endpoint.as_str()))
    }

    /// The backend of `hash`: the first live member of the ring; with `exclude`, never that
    /// one (`None` when no other is live); without, the plain owner when none is live.
    /// `any_live` is [`Table::any_live`] of the same `exclude`.
    fn pick(&self, hash: u64, exclude: Option<&str>, any_live: bool) -> Option<usize> {
        if !any_live {
            return if exclude.is_some() { None } else { self.ring.owner(hash) };
        }
        let live = self.ring.owner_where(hash, |i| {
            let b = &self.backends[i];
            b.health.is_up() && exclude != Some(b.endpoint.as_str())
        });
        match (live, exclude) {
            (Some(i), _) => Some(i),
            (None, None) => self.ring.owner(hash),
            (None, Some(_)) => None,
        }
    }
}

struct Inner {
    id: ComponentId,
    name: String,
    signal: Signal,
    cfg: Arc<LoadBalancingConfig>,
    splitter: Splitter,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
    table: RwLock<Arc<Table>>,
    update: tokio::sync::Mutex<()>,
    resolver: Mutex<Option<Box<dyn Resolver>>>,
    cancel: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Removed backends still draining: the exporter and its shutdown task.
    retiring: Mutex<Vec<(Arc<QueuedExporter>, tokio::task::JoinHandle<u64>)>>,
    /// Set when shutdown starts: no hand-back, no resolver update.
    closing: AtomicBool,
    num_backends: Gauge,
    ring_changes: Counter,
    rerouted: Counter,
    rerouted_dropped: Counter,
}

/// The `loadbalancing` exporter of one signal.
pub struct LoadBalancer {
    inner: Arc<Inner>,
}

impl LoadBalancer {
    /// Builds the exporter `ctx.id` for `signal` (the resolver is built here, started by `start`).
    pub fn new(ctx: &CreateContext, cfg: Arc<LoadBalancingConfig>, signal: Signal) -> Result<Self, ComponentError> {
        let key = cfg.key_for(signal)?;
        let name = ctx.id.to_string();
        let resolver: Box<dyn Resolver> = match &cfg.resolver {
            ResolverConfig::Static(s) => s.resolver(),
            ResolverConfig::Dns(d) => d.resolver(&name, Some(&ctx.telemetry)).map_err(ComponentError::Start)?,
            ResolverConfig::K8s(k) => k.resolver_with(&name, &ctx.telemetry).map_err(ComponentError::Start)?,
        };
        Ok(Self::with_resolver(ctx, cfg, signal, key, resolver))
    }

    /// Builds the exporter over a given resolver (tests, other resolvers).
    pub fn with_resolver(
        ctx: &CreateContext,
        cfg: Arc<LoadBalancingConfig>,
        signal: Signal,
        key: super::RoutingKey,
        resolver: Box<dyn Resolver>,
    ) -> Self {
        let name = ctx.id.to_string();
        let splitter = Splitter { key, attributes: cfg.routing_attributes.clone() };
        let inner = Inner {
            id: ctx.id.clone(),
            signal,
            cfg,
            splitter,
            telemetry: ctx.telemetry.clone(),
            host: ctx.host.clone(),
            table: RwLock::new(Arc::new(Table::default())),
            update: tokio::sync::Mutex::new(()),
            resolver: Mutex::new(Some(resolver)),
            cancel: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
            retiring: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            num_backends: NUM_BACKENDS.get(&ctx.telemetry, [&name]),
            ring_changes: RING_CHANGES.get(&ctx.telemetry, [&name]),
            rerouted: REROUTED_ITEMS.get(&ctx.telemetry, [&name, signal.as_str()]),
            rerouted_dropped: REROUTED_DROPPED.get(&ctx.telemetry, [&name, signal.as_str()]),
            name,
        };
        LoadBalancer { inner: Arc::new(inner) }
    }

    /// The backends in the ring now, sorted.
    pub fn backends(&self) -> Vec<String> {
        self.inner.table().ring.members().to_vec()
    }

    /// Whether `endpoint` is in the ring and up.
    pub fn is_up(&self, endpoint: &str) -> Option<bool> {
        self.inner.table().find(endpoint).map(|b| b.health.is_up())
    }

    /// Replaces the backends now (what a resolver update does).
    pub async fn set_backends(&self, list: Vec<String>) {
        self.inner.update(list).await;
    }

    /// The table now (tests: a snapshot that goes stale).
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Arc<Table> {
        self.inner.table()
    }

    /// Consumes `data` routing it first by `table` (tests: a table taken before a retirement).
    #[cfg(test)]
    pub(crate) async fn consume_on(&self, data: Payload, table: Arc<Table>) -> Result<(), ConsumeError> {
        self.inner.dispatch_on(data, table).await
    }

    /// Clears the retired mark of `endpoint` in `table` (tests: the moment between a split that
    /// saw it live and the offer to its closed queue).
    #[cfg(test)]
    pub(crate) fn unmark_retired(table: &Table, endpoint: &str) {
        if let Some(b) = table.find(endpoint) {
            b.health.retired.store(false, Ordering::Release);
        }
    }

    /// Whether every retired backend has finished shutting down (tests).
    #[cfg(test)]
    pub(crate) fn retired_done(&self) -> bool {
        self.inner.retiring.lock().iter().all(|(_, h)| h.is_finished())
    }
}

impl Inner {
    fn table(&self) -> Arc<Table> {
        self.table.read().clone()
    }

    fn backend_id(&self, endpoint: &str) -> ComponentId {
        let name = match &self.id.name {
            Some(n) => format!("{n}/{endpoint}"),
            None => endpoint.to_string(),
        };
        ComponentId { type_name: self.id.type_name.clone(), name: Some(name) }
    }

    fn build_backend(self: &Arc<Self>, endpoint: &str) -> Result<Arc<Backend>, ComponentError> {
        let c = self.cfg.otlp_for(endpoint)?;
        let id = self.backend_id(endpoint);
        let mut grpc = GrpcSender::new(id.to_string(), &c)?;
        grpc.set_auth(client_auth::resolve_client(&self.host, c.client.auth.as_ref())?);
        let gauge = BACKEND_UP.get(&self.telemetry, [&self.name, endpoint]);
        gauge.set(1);
        let health = Arc::new(Health {
            endpoint: endpoint.to_string(),
            exporter: self.name.clone(),
            up: AtomicBool::new(true),
            retired: AtomicBool::new(false),
            failing_since: Mutex::new(None),
            probe_ok: AtomicU32::new(0),
            down_after: self.cfg.backend_down_after,
            gauge,
        });
        let grpc = Arc::new(grpc);
        let sender = BackendSender { grpc: grpc.clone(), health: health.clone(), lb: Arc::downgrade(self) };
        let ctx = CreateContext { id, telemetry: self.telemetry.clone(), host: self.host.clone() };
        let q = &c.exporter;
        let node = QueuedExporter::create(
            &ctx,
            self.signal,
            Arc::new(sender),
            q.sending_queue.clone(),
            q.retry_on_failure.clone(),
        )?;
        let stop = self.cancel.child_token();
        // The probe of a backend marked down.
        let (h, s, signal) = (health.clone(), stop.clone(), self.signal);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                    _ = s.cancelled() => return,
                }
                if h.up.load(Ordering::Acquire) {
                    continue;
                }
                match Sender::send(grpc.as_ref(), &Payload::empty(signal)).await {
                    Ok(()) => h.probe_succeeded(),
                    Err(_) => h.probe_failed(),
                }
            }
        });
        Ok(Arc::new(Backend {
            endpoint: endpoint.to_string(),
            node: Arc::new(node),
            health,
            items: BACKEND_ITEMS.get(&self.telemetry, [&self.name, endpoint, self.signal.as_str()]),
            stop,
        }))
    }

    /// Makes `list` the backends: starts the new ones, replaces the ring, retires the removed.
    async fn update(self: &Arc<Self>, list: Vec<String>) {
        let _one = self.update.lock().await;
        if self.closing() {
            return;
        }
        let old = self.table();
        let wanted = Ring::new(list);
        if wanted.members() == old.ring.members() {
            return;
        }
        let mut kept: Vec<Arc<Backend>> = Vec::new();
        for m in wanted.members() {
            if let Some(b) = old.find(m) {
                kept.push(b.clone());
                continue;
            }
            match self.build_backend(m) {
                Ok(b) => match b.node.start().await {
                    Ok(()) => kept.push(b),
                    Err(e) => tracing::error!(exporter = %self.name, backend = %m, error = %e,
                        "loadbalancing: cannot start the backend's exporter; left out of the ring"),
                },
                Err(e) => tracing::error!(exporter = %self.name, backend = %m, error = %e,
                    "loadbalancing: cannot build the backend's exporter; left out of the ring"),
            }
        }
        let ring = Ring::new(kept.iter().map(|b| b.endpoint.clone()).collect());
        let backends: Vec<Arc<Backend>> =
            ring.members().iter().filter_map(|m| kept.iter().find(|b| &b.endpoint == m).cloned()).collect();
        let removed: Vec<Arc<Backend>> =
            old.backends.iter().filter(|b| !ring.members().contains(&b.endpoint)).cloned().collect();
        tracing::info!(exporter = %self.name, backends = ?ring.members(), removed = removed.len(),
            "loadbalancing: the ring changed");
        self.num_backends.set(ring.members().len() as i64);
        *self.table.write() = Arc::new(Table { ring, backends });
        self.ring_changes.inc();
        for b in removed {
            b.health.retired.store(true, Ordering::Release);
            b.health.gauge.set(0);
            b.stop.cancel();
            let node = b.node.clone();
            let n = node.clone();
            let h = tokio::spawn(async move { n.shutdown(Instant::now() + RETIRE_DEADLINE).await });
            let mut r = self.retiring.lock();
            r.retain(|(_, h)| !h.is_finished());
            r.push((node, h));
        }
    }

    /// Routes `data` (a consumer's): one part per backend, each into its queue.
    ///
    /// A part refused because its backend was retired between the table's snapshot and the
    /// offer (`ShuttingDown`) is split again over a fresh table once, so that an error after
    /// other parts were accepted stays rare (a consumer's `Err` means none of it was kept).
    async fn dispatch(&self, data: Payload) -> Result<(), ConsumeError> {
        self.dispatch_on(data, self.table()).await
    }

    /// [`Inner::dispatch`] starting from the snapshot `first` of the table.
    async fn dispatch_on(&self, data: Payload, first: Arc<Table>) -> Result<(), ConsumeError> {
        let mut pending = data;
        let mut again = true;
        let mut snapshot = Some(first);
        loop {
            let table = snapshot.take().unwrap_or_else(|| self.table());
            if table.ring.is_empty() {
                return Err(ConsumeError::refused(
                    RefuseReason::Downstream,
                    Some(Duration::from_secs(1)),
                    format!("exporter {}: no backend resolved", self.name),
                ));
            }
            let live = table.any_live(None);
            let parts = self.splitter.split(pending, &|h| table.pick(h, None, live)).map_err(|e| match e {
                SplitError::NoBackend => {
                    ConsumeError::refused(RefuseReason::Downstream, Some(Duration::from_secs(1)), e.to_string())
                }
                SplitError::Decode(m) => ConsumeError::Permanent(m),
            })?;
            // One part: an error keeps none of it, nothing to split again.
            let keep = again && parts.len() > 1;
            let mut first: Option<ConsumeError> = None;
            let mut retry: Option<Payload> = None;
            for (i, part) in parts {
                let b = &table.backends[i];
                let n = part.item_count() as u64;
                let copy = keep.then(|| part.clone());
                match b.node.consume(part).await {
                    Ok(()) => {
                        b.items.inc_by(n);
                    }
                    Err(ConsumeError::Refused { reason: RefuseReason::ShuttingDown, .. }) if copy.is_some() => {
                        if let Some(p) = copy {
                            match &mut retry {
                                Some(r) => {
                                    let _ = r.append(p);
                                }
                                None => retry = Some(p),
                            }
                        }
                    }
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            match retry {
                Some(r) if first.is_none() => {
                    again = false;
                    pending = r;
                }
                Some(_) => {
                    return Err(first.unwrap_or_else(|| {
                        ConsumeError::refused(RefuseReason::ShuttingDown, None, "backend shutting down")
                    }));
                }
                None => return first.map_or(Ok(()), Err),
            }
        }
    }

    /// Routes again what backend `from` (removed or down) held, to the other backends, waiting
    /// while their queues are full. An error leaves it with `from` (retried there).
    async fn reroute(&self, data: &Payload, from: &str) -> Result<(), SendError> {
        let n = data.item_count() as u64;
        let mut pending = data.clone();
        loop {
            let table = self.table();
            let live = table.any_live(Some(from));
            if !live {
                return Err(SendError::Retryable {
                    message: format!("re-routing from {from}: no other live backend"),
                    retry_after: None,
                });
            }
            let parts = self.splitter.split(pending, &|h| table.pick(h, Some(from), live)).map_err(|e| {
                SendError::Retryable { message: format!("re-routing from {from}: {e}"), retry_after: None }
            })?;
            let mut left: Option<Payload> = None;
            for (i, part) in parts {
                let b = &table.backends[i];
                let k = part.item_count() as u64;
                match offer_held(b.node.consume(part.clone())).await {
                    Ok(()) => {
                        b.items.inc_by(k);
                    }
                    Err(ConsumeError::Permanent(m)) => {
                        // Not counted by that backend's queue (offer_held skips enqueue_failed):
                        // counted here.
                        self.rerouted_dropped.inc_by(k);
                        tracing::error!(exporter = %self.name, backend = %b.endpoint, items = k, error = %m,
                            "loadbalancing: a re-routed part was refused permanently; dropped");
                    }
                    Err(_) => match &mut left {
                        Some(l) => {
                            let _ = l.append(part);
                        }
                        None => left = Some(part),
                    },
                }
            }
            match left {
                None => {
                    self.rerouted.inc_by(n);
                    return Ok(());
                }
                Some(l) => {
                    if self.cancel.is_cancelled() || self.closing() {
                        return Err(SendError::Retryable {
                            message: "shutting down while re-routing".into(),
                            retry_after: None,
                        });
                    }
                    pending = l;
                    tokio::select! {
                        _ = tokio::time::sleep(REROUTE_PAUSE) => {}
                        _ = self.cancel.cancelled() => {}
                    }
                }
            }
        }
    }

    /// Whether another backend than `endpoint` is live.
    fn other_live(&self, endpoint: &str) -> bool {
        self.table().any_live(Some(endpoint))
    }

    /// Whether shutdown has started.
    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

#[async_trait]
impl Consumer for LoadBalancer {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.inner.dispatch(data).await
    }
}

#[async_trait]
impl Node for LoadBalancer {
    async fn start(&self) -> Result<(), ComponentError> {
        let Some(resolver) = self.inner.resolver.lock().take() else { return Ok(()) };
        let (tx, mut rx) = watch::channel(Vec::new());
        let cancel = self.inner.cancel.child_token();
        let run = tokio::spawn(resolver.run(tx, cancel));
        // The first list, if it comes soon, before the pipeline sends (a static one does).
        if let Ok(Ok(())) = tokio::time::timeout(FIRST_LIST_WAIT, rx.changed()).await {
            let list = rx.borrow_and_update().clone();
            self.inner.update(list).await;
        }
        let inner = self.inner.clone();
        let watch = tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return },
                    _ = inner.cancel.cancelled() => return,
                }
                let list = rx.borrow_and_update().clone();
                inner.update(list).await;
            }
        });
        self.inner.tasks.lock().extend([run, watch]);
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        // No hand-back from here on (each backend sends its own data), no resolver update.
        self.inner.closing.store(true, Ordering::Release);
        self.inner.cancel.cancel();
        for t in std::mem::take(&mut *self.inner.tasks.lock()) {
            t.abort();
        }
        // An update under way finishes before the table is read (later ones do nothing).
        let _no_update = self.inner.update.lock().await;
        let table = self.inner.table();
        let mut set = tokio::task::JoinSet::new();
        for b in &table.backends {
            let node = b.node.clone();
            set.spawn(async move { node.shutdown(deadline).await });
        }
        // The retiring ones together: what their own deadline has not reached by ours is
        // stopped now and counted.
        let retiring: Vec<_> = std::mem::take(&mut *self.inner.retiring.lock());
        for (node, mut h) in retiring {
            set.spawn(async move {
                match tokio::time::timeout_at(deadline.into(), &mut h).await {
                    Ok(Ok(n)) => n,
                    _ => {
                        h.abort();
                        let _ = h.await;
                        node.shutdown(Instant::now()).await
                    }
                }
            });
        }
        let mut dropped = 0;
        while let Some(r) = set.join_next().await {
            dropped += r.unwrap_or(0);
        }
        dropped
    }
}

/// The sender of one backend: the `otlp` sender, with the hand-back of a removed or down
/// backend's payloads to the load balancer.
pub struct BackendSender {
    grpc: Arc<GrpcSender>,
    health: Arc<Health>,
    lb: Weak<Inner>,
}

impl BackendSender {
    /// A removed or down backend hands its data back only while another backend is live
    /// (else it keeps sending to its own endpoint), and never once shutdown started.
    fn should_hand_back(&self, lb: &Inner) -> bool {
        let gone = self.health.retired.load(Ordering::Acquire) || !self.health.up.load(Ordering::Acquire);
        gone && !lb.closing() && lb.other_live(&self.health.endpoint)
    }
}

#[async_trait]
impl Sender for BackendSender {
    async fn start(&self) -> Result<(), ComponentError> {
        Sender::start(self.grpc.as_ref()).await
    }

    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let a = self.prepare(data)?;
        a.send().await
    }

    fn prepare<'a>(&'a self, data: &'a Payload) -> Result<Box<dyn Attempt + 'a>, SendError> {
        let inner = Sender::prepare(self.grpc.as_ref(), data)?;
        Ok(Box::new(BackendAttempt { sender: self, data, inner, handed: AtomicBool::new(false) }))
    }
}

/// One built request of a backend, or its hand-back.
struct BackendAttempt<'a> {
    sender: &'a BackendSender,
    data: &'a Payload,
    inner: Box<dyn Attempt + 'a>,
    handed: AtomicBool,
}

impl BackendAttempt<'_> {
    async fn hand_back(&self, lb: &Inner) -> Result<(), SendError> {
        lb.reroute(self.data, &self.sender.health.endpoint).await?;
        self.handed.store(true, Ordering::Release);
        Ok(())
    }
}

#[async_trait]
impl Attempt for BackendAttempt<'_> {
    async fn send(&self) -> Result<(), SendError> {
        self.handed.store(false, Ordering::Release);
        let lb = self.sender.lb.upgrade();
        if let Some(lb) = &lb
            && self.sender.should_hand_back(lb)
        {
            match self.hand_back(lb).await {
                // Shutdown began while re-routing: send it to our own endpoint.
                Err(_) if lb.closing() => {}
                r => return r,
            }
        }
        let r = self.inner.send().await;
        match &r {
            Ok(()) => self.sender.health.success(),
            Err(e) if is_unreachable(e) => {
                self.sender.health.failure();
                if let Some(lb) = &lb
                    && self.sender.should_hand_back(lb)
                {
                    return self.hand_back(lb).await;
                }
            }
            Err(_) => self.sender.health.answered(),
        }
        r
    }

    fn handed_on(&self) -> bool {
        self.handed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    fn health(down_after: Duration) -> Health {
        Health {
            endpoint: "b:1".into(),
            exporter: "lb".into(),
            up: AtomicBool::new(true),
            retired: AtomicBool::new(false),
            failing_since: Mutex::new(None),
            probe_ok: AtomicU32::new(0),
            down_after,
            gauge: Gauge::default(),
        }
    }

    /// 1a: a failure after a long quiet spell starts a new failing period (not down at once);
    /// one within a continuing period marks down; two probe successes in a row mark up.
    #[test]
    fn a_late_failure_does_not_mark_down_and_two_probes_mark_up() {
        let h = health(Duration::from_millis(200));
        let now = Instant::now();
        let (Some(long_ago), Some(lately), Some(just)) = (
            now.checked_sub(Duration::from_secs(300)),
            now.checked_sub(Duration::from_secs(100)),
            now.checked_sub(Duration::from_millis(50)),
        ) else {
            return;
        };
        *h.failing_since.lock() = Some((long_ago, lately));
        h.failure();
        assert!(h.is_up(), "one late failure marked down");
        *h.failing_since.lock() = Some((lately, just));
        h.failure();
        assert!(!h.is_up(), "a continuing failing period marks down");
        h.probe_succeeded();
        assert!(!h.is_up(), "one probe is not enough");
        h.probe_failed();
        h.probe_succeeded();
        assert!(!h.is_up(), "the run starts over after a failed probe");
        h.probe_succeeded();
        assert!(h.is_up());
        // A push-back answer ends the failing period.
        *h.failing_since.lock() = Some((lately, just));
        h.answered();
        h.failure();
        assert!(h.is_up());
        assert!(!is_unreachable(&SendError::Retryable {
            message: "rpc error: code = Unavailable desc = sending queue is full".into(),
            retry_after: Some(Duration::from_secs(1)),
        }));
        assert!(is_unreachable(&SendError::Retryable {
            message: "rpc error: code = Unavailable desc = tcp connect error: Connection refused".into(),
            retry_after: None,
        }));
    }
}
