//! Sending queue and retry with back-off shared by every exporter (otelcol's exporterhelper).
//!
//! An exporter implements [`Sender`] (one attempt to deliver one payload); [`QueuedExporter`]
//! wraps it with a bounded queue (in memory, or on disk with `sending_queue.storage`; see
//! [`crate::queue`]), `num_consumers` workers, retries and the exporter self-metrics. Each send
//! runs with the [`ClientInfo`] captured when its batch was queued.

use crate::auth::ClientInfo;
use crate::component::{ComponentError, CreateContext, FieldError, Node};
use crate::config::split::SplitKeys;
use crate::consumer::{ConsumeError, Consumer, RefuseReason};
use crate::extension::file_storage::FileStorage;
use crate::pdata::{Payload, Signal};
use crate::queue::{DiskSettings, EnqueueError, Job, Queue, units};
use crate::settings::{GoDuration, QueueBatchSettings, QueueSettings, RetrySettings};
use crate::telemetry::ExporterMetrics;
use async_trait::async_trait;
use rand::Rng;
use serde::de::{DeserializeSeed, Deserializer, MapAccess};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Why one delivery attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Worth retrying (network error, UNAVAILABLE, 503, ...), optionally after a server-given delay.
    #[error("retryable: {message}")]
    Retryable {
        /// What happened.
        message: String,
        /// Delay the server asked for (gRPC RetryInfo, HTTP Retry-After).
        retry_after: Option<Duration>,
    },
    /// Will never succeed (INVALID_ARGUMENT, 400, ...): drop and count.
    #[error("permanent: {0}")]
    Permanent(String),
}

/// One attempt to deliver a payload to a destination.
///
/// The retry loop calls [`Sender::prepare`] once per payload and sends what it built on every
/// attempt. A plain `Sender` (test sinks, benches) builds nothing: each attempt calls
/// [`Sender::send`] again. Network exporters implement [`RequestSender`] instead, which encodes
/// (and compresses) the request once so that a retry resends the same bytes.
#[async_trait]
pub trait Sender: Send + Sync + 'static {
    /// Prepares connections; called once before the first send.
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Tries once to deliver `data` (encoding it first).
    async fn send(&self, data: &Payload) -> Result<(), SendError>;
    /// What every attempt to deliver `data` sends; the default sends `data` afresh each time.
    fn prepare<'a>(&'a self, data: &'a Payload) -> Result<Box<dyn Attempt + 'a>, SendError> {
        Ok(Box::new(Resend { sender: self, data }))
    }
}

/// One built request, sent again on each retry (see [`Sender::prepare`]).
#[async_trait]
pub trait Attempt: Send + Sync {
    /// Tries once to deliver the request.
    async fn send(&self) -> Result<(), SendError>;
    /// Whether the last successful [`Attempt::send`] handed the data on to another exporter
    /// instead of delivering it (a load balancer re-routing a removed backend's data): it is
    /// then not counted as sent here.
    fn handed_on(&self) -> bool {
        false
    }
}

/// The default [`Attempt`]: calls [`Sender::send`] with the payload each time.
struct Resend<'a, S: ?Sized> {
    sender: &'a S,
    data: &'a Payload,
}

#[async_trait]
impl<S: Sender + ?Sized> Attempt for Resend<'_, S> {
    async fn send(&self) -> Result<(), SendError> {
        self.sender.send(self.data).await
    }
}

/// A sender split in two: [`RequestSender::encode`] builds the request of a payload once (the
/// body, compressed, with what is fixed for all its attempts) and [`RequestSender::send`] sends
/// it once; retries resend the built request. Every `RequestSender` is a [`Sender`].
#[async_trait]
pub trait RequestSender: Send + Sync + 'static {
    /// What one payload becomes on the wire.
    type Request: Send + Sync;
    /// Prepares connections; called once before the first send.
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Builds the request of `data` (runs once per payload, in the client scope of its batch).
    fn encode(&self, data: &Payload) -> Result<Self::Request, SendError>;
    /// Tries once to deliver `request` (per attempt: authentication headers, the connection).
    async fn send(&self, request: &Self::Request) -> Result<(), SendError>;
}

/// An encoded request with the sender that delivers it.
struct Encoded<'a, S: RequestSender> {
    sender: &'a S,
    request: S::Request,
}

#[async_trait]
impl<S: RequestSender> Attempt for Encoded<'_, S> {
    async fn send(&self) -> Result<(), SendError> {
        RequestSender::send(self.sender, &self.request).await
    }
}

#[async_trait]
impl<S: RequestSender> Sender for S {
    async fn start(&self) -> Result<(), ComponentError> {
        RequestSender::start(self).await
    }

    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let request = self.encode(data)?;
        RequestSender::send(self, &request).await
    }

    fn prepare<'a>(&'a self, data: &'a Payload) -> Result<Box<dyn Attempt + 'a>, SendError> {
        Ok(Box::new(Encoded { sender: self, request: self.encode(data)? }))
    }
}

/// Back-off schedule for one payload's retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    settings: RetrySettings,
    next: Duration,
    started: Instant,
}

impl Backoff {
    /// Starts a schedule now.
    pub fn new(settings: &RetrySettings) -> Self {
        Backoff { settings: settings.clone(), next: settings.initial_interval.0, started: Instant::now() }
    }

    /// The delay before the next attempt, or `None` when retrying must stop.
    /// A server-given `hint` replaces the computed interval (and does not grow it).
    pub fn next_delay(&mut self, hint: Option<Duration>) -> Option<Duration> {
        if !self.settings.enabled {
            return None;
        }
        let delay = match hint {
            Some(h) => h,
            None => {
                let base = self.next.as_secs_f64();
                let f = self.settings.randomization_factor.clamp(0.0, 1.0);
                let jittered = if f > 0.0 { base * rand::rng().random_range((1.0 - f)..=(1.0 + f)) } else { base };
                let grown = (base * self.settings.multiplier.max(1.0)).min(self.settings.max_interval.0.as_secs_f64());
                self.next = Duration::from_secs_f64(grown.max(0.0));
                Duration::from_secs_f64(jittered.max(0.0))
            }
        };
        let max = self.settings.max_elapsed_time.0;
        if !max.is_zero() && self.started.elapsed() + delay > max {
            return None;
        }
        Some(delay)
    }
}

struct Shared {
    signal: Signal,
    name: String,
    sender: Arc<dyn Sender>,
    metrics: ExporterMetrics,
    retry: RetrySettings,
    /// The queue is on disk: what the hard stop interrupts stays there for the next start.
    persistent: bool,
    /// Fired when the shutdown deadline passes: workers abandon what they hold.
    hard_stop: CancellationToken,
}

impl Shared {
    /// Delivers one payload with retries.
    /// `queued`: the payload came from the queue (a final failure drops it) rather than from a
    /// caller (which gets the error back and may retry). An `Err` with
    /// [`RefuseReason::ShuttingDown`] means the hard stop interrupted it.
    async fn deliver(&self, data: Payload, queued: bool) -> Result<(), ConsumeError> {
        let n = data.item_count() as u64;
        let mut backoff = Backoff::new(&self.retry);
        let stopped = || {
            if !(queued && self.persistent) {
                self.metrics.shutdown_dropped.inc_by(n);
            }
            Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "shutting down"))
        };
        // Built by the first attempt, resent by the retries.
        let mut prepared: Option<Box<dyn Attempt + '_>> = None;
        loop {
            let attempt = tokio::select! {
                r = attempt(self.sender.as_ref(), &data, &mut prepared) => r,
                _ = self.hard_stop.cancelled() => return stopped(),
            };
            match attempt {
                Ok(()) => {
                    if !prepared.as_ref().is_some_and(|a| a.handed_on()) {
                        self.metrics.sent.inc_by(n);
                    }
                    return Ok(());
                }
                Err(SendError::Permanent(msg)) => {
                    self.metrics.send_failed.inc_by(n);
                    tracing::error!(exporter = %self.name, signal = %self.signal, items = n, error = %msg,
                        "exporting failed; dropping data (permanent error)");
                    return Err(ConsumeError::Permanent(msg));
                }
                Err(SendError::Retryable { message, retry_after }) => match backoff.next_delay(retry_after) {
                    Some(d) => {
                        tracing::info!(exporter = %self.name, signal = %self.signal, error = %message,
                            interval = ?d, "exporting failed; will retry");
                        tokio::select! {
                            _ = tokio::time::sleep(d) => {}
                            _ = self.hard_stop.cancelled() => return stopped(),
                        }
                    }
                    None => {
                        // send_failed counts failed attempts, as otelcol's does.
                        self.metrics.send_failed.inc_by(n);
                        if queued {
                            tracing::error!(exporter = %self.name, signal = %self.signal, items = n, error = %message,
                                "exporting failed; no more retries; dropping data");
                        } else {
                            tracing::warn!(exporter = %self.name, signal = %self.signal, items = n, error = %message,
                                "exporting failed; no more retries; returning the error to the sender");
                        }
                        return Err(ConsumeError::refused(RefuseReason::Downstream, None, message));
                    }
                },
            }
        }
    }
}

/// One delivery attempt: builds the request on the first (an encoding error is the attempt's
/// error), then sends what was built.
async fn attempt<'a>(
    sender: &'a dyn Sender,
    data: &'a Payload,
    prepared: &mut Option<Box<dyn Attempt + 'a>>,
) -> Result<(), SendError> {
    let a = match prepared {
        Some(a) => a,
        None => prepared.insert(sender.prepare(data)?),
    };
    a.send().await
}

tokio::task_local! {
    static HELD: ();
}

/// Runs `fut` as the offer of data its caller already acknowledged and keeps holding when it is
/// refused (the batch processor's flush, a stage's retry loop): a full queue refuses it as usual
/// but does not count it in `otelcol_exporter_enqueue_failed_*`, which counts each item once per
/// refusal to a client. Without it, every retry of a held batch counted the batch again.
pub async fn offer_held<F: std::future::Future>(fut: F) -> F::Output {
    HELD.scope((), fut).await
}

/// Whether the current task is inside [`offer_held`].
fn is_held() -> bool {
    HELD.try_with(|_| ()).is_ok()
}

/// An exporter node: a [`Sender`] behind a bounded queue with retries.
pub struct QueuedExporter {
    shared: Arc<Shared>,
    settings: QueueSettings,
    queue: Option<Arc<Queue>>,
    workers: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl QueuedExporter {
    /// Wraps `sender` for one exporter id and signal, with an in-memory queue (a
    /// `sending_queue.storage` needs the host's extensions: use [`QueuedExporter::create`]).
    pub fn new(
        name: String,
        signal: Signal,
        sender: Arc<dyn Sender>,
        metrics: ExporterMetrics,
        queue: QueueSettings,
        retry: RetrySettings,
    ) -> Self {
        if let Some(s) = &queue.storage {
            tracing::warn!(exporter = %name, storage = %s, "sending_queue.storage ignored: the queue stays in memory");
        }
        let q = queue.enabled.then(|| {
            Arc::new(Queue::memory(
                queue.sizer,
                queue.queue_size.max(1) as u64,
                queue.block_on_overflow,
                metrics.clone(),
            ))
        });
        Self::assemble(name, signal, sender, metrics, queue, retry, q)
    }

    /// Wraps `sender` for the exporter `ctx.id`; with `sending_queue.storage` the queue is opened
    /// (and resumed) in that `file_storage` extension's directory.
    pub fn create(
        ctx: &CreateContext,
        signal: Signal,
        sender: Arc<dyn Sender>,
        queue: QueueSettings,
        retry: RetrySettings,
    ) -> Result<Self, ComponentError> {
        let metrics = ctx.telemetry.exporter(&ctx.id, signal);
        let name = ctx.id.to_string();
        let Some(id) = queue.storage.clone() else {
            return Ok(Self::new(name, signal, sender, metrics, queue, retry));
        };
        if !queue.enabled {
            return Err(FieldError::at("sending_queue.storage", "needs sending_queue.enabled: true").into());
        }
        let storage: FileStorage = ctx.host.services.get(&id).ok_or_else(|| {
            let why = if ctx.host.services.contains(&id) {
                format!("sending_queue.storage: extension {id} is not a storage extension (use file_storage)")
            } else {
                format!("sending_queue.storage: extension {id} is not defined or not enabled in service.extensions")
            };
            ComponentError::Start(why)
        })?;
        let q = Self::open_disk(&storage, &name, signal, &queue, metrics.clone())?;
        Ok(Self::assemble(name, signal, sender, metrics, queue, retry, Some(Arc::new(q))))
    }

    /// Opens the persistent queue of `name` / `signal` in `storage`.
    pub fn open_disk(
        storage: &FileStorage,
        name: &str,
        signal: Signal,
        queue: &QueueSettings,
        metrics: ExporterMetrics,
    ) -> Result<Queue, ComponentError> {
        let dir = storage.queue_dir(name, signal);
        let disk = DiskSettings { dir: &dir, fsync: storage.fsync, lock_timeout: storage.timeout };
        let cap = queue.queue_size.max(1) as u64;
        Queue::persistent(queue.sizer, cap, queue.block_on_overflow, metrics, disk, name, signal)
            .map(|(q, _)| q)
            .map_err(ComponentError::Start)
    }

    /// Wraps `sender` around an already opened queue (`None`: sends in the caller's task).
    pub fn with_queue(
        name: String,
        signal: Signal,
        sender: Arc<dyn Sender>,
        metrics: ExporterMetrics,
        settings: QueueSettings,
        retry: RetrySettings,
        queue: Option<Queue>,
    ) -> Self {
        Self::assemble(name, signal, sender, metrics, settings, retry, queue.map(Arc::new))
    }

    fn assemble(
        name: String,
        signal: Signal,
        sender: Arc<dyn Sender>,
        metrics: ExporterMetrics,
        settings: QueueSettings,
        retry: RetrySettings,
        queue: Option<Arc<Queue>>,
    ) -> Self {
        if queue.is_none() {
            metrics.queue_capacity.set(0);
        }
        let persistent = queue.as_ref().is_some_and(|q| q.is_persistent());
        QueuedExporter {
            shared: Arc::new(Shared {
                signal,
                name,
                sender,
                metrics,
                retry,
                persistent,
                hard_stop: CancellationToken::new(),
            }),
            settings,
            queue,
            workers: tokio::sync::Mutex::new(tokio::task::JoinSet::new()),
        }
    }
}

#[async_trait]
impl Consumer for QueuedExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let Some(queue) = &self.queue else {
            return self.shared.deliver(data, false).await;
        };
        let n = data.item_count() as u64;
        let name = &self.shared.name;
        match queue.push(data, ClientInfo::current()).await {
            Ok(()) => Ok(()),
            Err(EnqueueError::Closed) => {
                Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "exporter is shutting down"))
            }
            Err(e) => {
                // Each refused item counts once per refusal to a client (not per retry of held data).
                if !is_held() {
                    self.shared.metrics.enqueue_failed.inc_by(n);
                }
                match e {
                    EnqueueError::TooLarge(..) => {
                        Err(ConsumeError::Permanent(format!("sending queue of exporter {name}: {e}")))
                    }
                    EnqueueError::Write(_) => {
                        self.shared.metrics.queue_write_failed.inc_by(n);
                        Err(ConsumeError::refused(
                            RefuseReason::QueueFull,
                            Some(Duration::from_secs(5)),
                            format!("sending queue of exporter {name}: {e}"),
                        ))
                    }
                    _ => Err(ConsumeError::refused(
                        RefuseReason::QueueFull,
                        Some(Duration::from_secs(1)),
                        format!("sending queue of exporter {name} is full"),
                    )),
                }
            }
        }
    }
}

#[async_trait]
impl Node for QueuedExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.shared.sender.start().await?;
        let Some(queue) = &self.queue else { return Ok(()) };
        let mut workers = self.workers.lock().await;
        if !workers.is_empty() {
            return Ok(());
        }
        for _ in 0..self.settings.num_consumers.max(1) {
            let queue = queue.clone();
            let shared = self.shared.clone();
            let batch = self.settings.batch.clone();
            workers.spawn(async move {
                match &batch {
                    None => {
                        while let Some(job) = queue.pop().await {
                            let scope = job.client.clone();
                            send_jobs(&shared, &queue, vec![job], 0, scope).await;
                        }
                    }
                    Some(b) => batch_loop(&shared, &queue, b).await,
                }
            });
        }
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        let before = self.shared.metrics.shutdown_dropped.get();
        let Some(queue) = &self.queue else {
            self.shared.hard_stop.cancel();
            return 0;
        };
        // Closing the queue lets the workers drain what is queued, then stop.
        queue.close();
        let mut workers = self.workers.lock().await;
        loop {
            match tokio::time::timeout_at(deadline.into(), workers.join_next()).await {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => {
                    if queue.is_persistent() {
                        tracing::info!(exporter = %self.shared.name, signal = %self.shared.signal,
                            queued = queue.used(), "shutdown timeout reached; what is queued stays in the persistent queue for the next start");
                    } else {
                        tracing::warn!(exporter = %self.shared.name, signal = %self.shared.signal,
                            queued = queue.used(), "shutdown timeout reached with data still queued; dropping it");
                    }
                    // Workers abandon what they hold.
                    self.shared.hard_stop.cancel();
                    while workers.join_next().await.is_some() {}
                    break;
                }
            }
        }
        self.shared.hard_stop.cancel();
        if !queue.is_persistent() {
            // What was never taken by a worker (not started, or stopped at the deadline).
            let left = queue.drain_memory();
            self.shared.metrics.shutdown_dropped.inc_by(left);
        }
        self.shared.metrics.shutdown_dropped.get() - before
    }
}

/// Requests of one partition gathered by a worker, waiting for `min_size` or their deadline.
struct Pending {
    key: Vec<Vec<String>>,
    scope: Option<Arc<ClientInfo>>,
    jobs: Vec<Job>,
    size: u64,
    deadline: tokio::time::Instant,
}

/// What a batching worker got from the queue.
enum Next {
    Job(Job),
    Due,
    Closed,
}

/// A worker with `sending_queue.batch`: merges queued requests per partition until a batch
/// reaches `min_size` or `flush_timeout` passes since its first request, then sends it. What a
/// worker gathers stays counted in the queue (and on disk) until it is delivered.
async fn batch_loop(shared: &Shared, queue: &Queue, b: &QueueBatchSettings) {
    let mut pending: Vec<Pending> = Vec::new();
    let max = usize::try_from(b.max_size).unwrap_or(usize::MAX);
    loop {
        let next_deadline = pending.iter().map(|p| p.deadline).min();
        let next = match next_deadline {
            None => queue.pop().await.map_or(Next::Closed, Next::Job),
            Some(at) => match tokio::time::timeout_at(at, queue.pop()).await {
                Ok(j) => j.map_or(Next::Closed, Next::Job),
                Err(_) => Next::Due,
            },
        };
        match next {
            // Closed and empty: send what was gathered, then stop.
            Next::Closed => {
                for p in pending.drain(..) {
                    send_jobs(shared, queue, p.jobs, max, p.scope).await;
                }
                return;
            }
            Next::Job(job) => {
                let keys = &b.partition.metadata_keys;
                let key = ClientInfo::partition_key(keys, job.client.as_deref());
                let i = match pending.iter().position(|p| p.key == key) {
                    Some(i) => i,
                    None => {
                        // The client a batch goes out as is built once per batch, not per request.
                        let scope = ClientInfo::partition_scope(keys, &key);
                        let deadline = tokio::time::Instant::now() + b.flush_timeout.0;
                        pending.push(Pending { key, scope, jobs: Vec::new(), size: 0, deadline });
                        pending.len() - 1
                    }
                };
                let p = &mut pending[i];
                p.size += units(b.sizer, &job.payload);
                p.jobs.push(job);
                if p.size >= b.min_size {
                    let p = pending.swap_remove(i);
                    send_jobs(shared, queue, p.jobs, max, p.scope).await;
                }
            }
            // A flush timeout passed: send every batch that is due.
            Next::Due => {
                let now = tokio::time::Instant::now();
                while let Some(i) = pending.iter().position(|p| p.deadline <= now) {
                    let p = pending.swap_remove(i);
                    send_jobs(shared, queue, p.jobs, max, p.scope).await;
                }
            }
        }
    }
}

/// Sends the payloads of `jobs` as one request (split into requests of at most `max_items`
/// items when non-zero) in the client scope `scope`, then completes the jobs; the hard stop
/// abandons them instead (a persistent queue sends them again at the next start).
async fn send_jobs(
    shared: &Shared,
    queue: &Queue,
    mut jobs: Vec<Job>,
    max_items: usize,
    scope: Option<Arc<ClientInfo>>,
) {
    let signal = shared.signal;
    let mut payloads = jobs.iter_mut().map(|j| std::mem::replace(&mut j.payload, Payload::empty(signal)));
    let mut data = payloads.next().unwrap_or_else(|| Payload::empty(signal));
    for p in payloads {
        if let Err(p) = data.append(p) {
            // One queue holds one signal, so this cannot happen; say so if it ever does.
            shared.metrics.send_failed.inc_by(p.item_count() as u64);
            tracing::error!(exporter = %shared.name, signal = %signal, items = p.item_count(),
                "a queued request of another signal was dropped");
        }
    }
    let n = data.item_count() as u64;
    let run = std::panic::AssertUnwindSafe(async {
        let mut rest = data;
        loop {
            let chunk = if max_items > 0 && rest.item_count() > max_items {
                rest.split_off_front(max_items)
            } else {
                std::mem::replace(&mut rest, Payload::empty(signal))
            };
            // A bug in a sender must not kill the worker (and strand the queue).
            let send = shared.deliver(chunk, true);
            let r = match scope.clone() {
                Some(c) => ClientInfo::scope(c, send).await,
                None => send.await,
            };
            // Errors are counted and logged inside deliver; a final failure drops only its chunk.
            if matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::ShuttingDown, .. })) {
                return r;
            }
            if rest.item_count() == 0 {
                return r;
            }
        }
    });
    match futures::FutureExt::catch_unwind(run).await {
        Err(_) => {
            shared.metrics.send_failed.inc_by(n);
            tracing::error!(exporter = %shared.name, signal = %shared.signal, items = n,
                "the sender panicked; data dropped");
            jobs.into_iter().for_each(|j| queue.complete(j));
        }
        Ok(Err(ConsumeError::Refused { reason: RefuseReason::ShuttingDown, .. })) => {
            jobs.into_iter().for_each(|j| queue.abandon(j))
        }
        Ok(_) => jobs.into_iter().for_each(|j| queue.complete(j)),
    }
}

// ---- the settings every queued exporter has ------------------------------------------------

/// `timeout`, `sending_queue` and `retry_on_failure` (otelcol's `exporterhelper` settings),
/// read as keys of an exporter's own settings map (see [`crate::config::split`]) and checked
/// here once.
#[derive(Debug, Clone, PartialEq)]
pub struct ExporterSettings {
    /// Deadline of one attempt (0: none).
    pub timeout: GoDuration,
    /// Sending queue.
    pub sending_queue: QueueSettings,
    /// Retries with back-off.
    pub retry_on_failure: RetrySettings,
}

impl Default for ExporterSettings {
    fn default() -> Self {
        ExporterSettings::with_timeout(Duration::from_secs(5))
    }
}

impl ExporterSettings {
    /// The defaults with this `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        ExporterSettings {
            timeout: GoDuration(timeout),
            sending_queue: QueueSettings::default(),
            retry_on_failure: RetrySettings::default(),
        }
    }

    /// The defaults with one sending consumer (for exporters whose requests must stay in order;
    /// the keys not written keep it).
    pub fn one_consumer(mut self) -> Self {
        self.sending_queue.num_consumers = 1;
        self
    }

    /// The timeout of one attempt; zero means none.
    pub fn timeout(&self) -> Option<Duration> {
        (!self.timeout.0.is_zero()).then_some(self.timeout.0)
    }

    /// Checks `sending_queue` ([`QueueSettings::check`]) and `retry_on_failure` as otelcol does.
    pub fn check(&self) -> Result<(), FieldError> {
        self.sending_queue.check()?;
        check_retry(&self.retry_on_failure)
    }

    /// [`ExporterSettings::check`] for an exporter that must send with one consumer: an enabled
    /// queue with more is refused with `num_consumers must be 1 for <why>`.
    pub fn check_one_consumer(&self, why: &str) -> Result<(), FieldError> {
        self.sending_queue.check()?;
        if self.sending_queue.enabled && self.sending_queue.num_consumers != 1 {
            return Err(FieldError::at("sending_queue.num_consumers", format!("num_consumers must be 1 for {why}")));
        }
        check_retry(&self.retry_on_failure)
    }

    /// The exporter node of `sender` with these settings (see [`QueuedExporter::create`]).
    pub fn node(
        &self,
        ctx: &CreateContext,
        signal: Signal,
        sender: Arc<dyn Sender>,
    ) -> Result<crate::component::NodeRef, ComponentError> {
        let e = QueuedExporter::create(ctx, signal, sender, self.sending_queue.clone(), self.retry_on_failure.clone())?;
        Ok(Arc::new(e))
    }
}

impl<'de> SplitKeys<'de> for ExporterSettings {
    /// The keys these settings read, in otelcol's order.
    const KEYS: &'static [&'static str] = &["timeout", "sending_queue", "retry_on_failure"];

    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "timeout" => self.timeout = map.next_value()?,
            "sending_queue" => self.sending_queue = map.next_value_seed(QueueOver(self.sending_queue.clone()))?,
            _ => self.retry_on_failure = map.next_value()?,
        }
        Ok(())
    }
}

/// Checks `retry_on_failure` as otelcol does.
fn check_retry(r: &RetrySettings) -> Result<(), FieldError> {
    if !(0.0..=1.0).contains(&r.randomization_factor) {
        return Err(FieldError::at(
            "retry_on_failure.randomization_factor",
            "randomization_factor must be within [0, 1]",
        ));
    }
    if !(r.multiplier.is_finite() && r.multiplier > 0.0) {
        return Err(FieldError::at("retry_on_failure.multiplier", "multiplier must be positive"));
    }
    Ok(())
}

/// `sending_queue` over the exporter's defaults.
struct QueueOver(QueueSettings);

impl<'de> DeserializeSeed<'de> for QueueOver {
    type Value = QueueSettings;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<QueueSettings, D::Error> {
        QueueSettings::deserialize_over(d, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentId;
    use crate::settings::GoDuration;
    use crate::telemetry::Telemetry;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn spans(n: usize) -> Payload {
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans { spans: vec![Span::default(); n], ..Default::default() }],
                ..Default::default()
            }],
        })
    }

    struct Flaky {
        calls: AtomicUsize,
        fail_first: usize,
        permanent: bool,
    }
    #[async_trait]
    impl Sender for Flaky {
        async fn send(&self, _d: &Payload) -> Result<(), SendError> {
            let c = self.calls.fetch_add(1, Ordering::SeqCst);
            if c < self.fail_first {
                if self.permanent {
                    return Err(SendError::Permanent("bad".into()));
                }
                return Err(SendError::Retryable { message: "down".into(), retry_after: None });
            }
            Ok(())
        }
    }

    fn fast_retry() -> RetrySettings {
        RetrySettings {
            initial_interval: GoDuration(Duration::from_millis(1)),
            max_interval: GoDuration(Duration::from_millis(5)),
            ..Default::default()
        }
    }

    /// Encodes a payload to its span count plus a sequence number (a re-encode shows as a new
    /// number), fails the first `fail_first` attempts, and records what each attempt sent.
    #[derive(Default)]
    struct Encoding {
        encodes: AtomicUsize,
        fail_first: usize,
        sent: parking_lot::Mutex<Vec<(usize, usize)>>,
    }
    #[async_trait]
    impl RequestSender for Encoding {
        type Request = (usize, usize);
        fn encode(&self, d: &Payload) -> Result<(usize, usize), SendError> {
            let n = self.encodes.fetch_add(1, Ordering::SeqCst);
            if d.item_count() == 0 {
                return Err(SendError::Permanent("nothing to encode".into()));
            }
            Ok((d.item_count(), n))
        }
        async fn send(&self, r: &(usize, usize)) -> Result<(), SendError> {
            let mut sent = self.sent.lock();
            sent.push(*r);
            if sent.len() <= self.fail_first {
                return Err(SendError::Retryable { message: "down".into(), retry_after: None });
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn retries_resend_the_request_encoded_once() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let s = Arc::new(Encoding { fail_first: 3, ..Default::default() });
        let e = QueuedExporter::new("x".into(), Signal::Traces, s.clone(), m.clone(), q(1, 10), fast_retry());
        e.start().await.unwrap();
        e.consume(spans(5)).await.unwrap();
        e.consume(spans(2)).await.unwrap();
        e.shutdown(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(m.sent.get(), 7);
        assert_eq!(s.encodes.load(Ordering::SeqCst), 2, "one encode per payload, none per retry");
        assert_eq!(*s.sent.lock(), vec![(5, 0), (5, 0), (5, 0), (5, 0), (2, 1)], "retries send the first request");
        // An encoding error is the attempt's: permanent, dropped and counted.
        let m2 = t.exporter(&ComponentId::parse("y").unwrap(), Signal::Traces);
        let e2 = QueuedExporter::new("y".into(), Signal::Traces, s.clone(), m2.clone(), q(1, 10), fast_retry());
        e2.start().await.unwrap();
        e2.consume(spans(0)).await.unwrap();
        e2.shutdown(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(s.encodes.load(Ordering::SeqCst), 3);
        assert_eq!(s.sent.lock().len(), 5, "nothing sent");
        // A plain call through `Sender` encodes and sends once.
        assert!(Sender::send(s.as_ref(), &spans(1)).await.is_ok());
        assert_eq!((s.encodes.load(Ordering::SeqCst), s.sent.lock().last().copied()), (4, Some((1, 3))));
    }

    /// An exporter's settings with the exporter settings read from the same map.
    #[derive(Debug, serde::Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields)]
    struct Exp {
        #[serde(default)]
        endpoint: String,
        #[serde(skip)]
        exporter: ExporterSettings,
    }
    crate::split_deserialize!(Exp, exporter, ExporterSettings::with_timeout(Duration::from_secs(30)).one_consumer());

    #[test]
    fn exporter_settings_are_read_from_the_exporters_map_and_checked() {
        let parse = |v: serde_json::Value| crate::component::parse_config::<Exp>(&v);
        let e = parse(serde_json::json!({"endpoint": "x"})).unwrap();
        assert_eq!(
            (e.endpoint.as_str(), e.exporter.timeout(), e.exporter.sending_queue.num_consumers),
            ("x", Some(Duration::from_secs(30)), 1)
        );
        let e = parse(serde_json::json!({
            "timeout": "0s", "endpoint": "y", "sending_queue": {"queue_size": 7},
            "retry_on_failure": {"initial_interval": "1s"},
        }))
        .unwrap();
        assert_eq!(e.exporter.timeout(), None);
        assert_eq!((e.exporter.sending_queue.queue_size, e.exporter.sending_queue.num_consumers), (7, 1));
        assert_eq!(e.exporter.retry_on_failure.initial_interval.0, Duration::from_secs(1));
        assert_eq!(e.exporter.retry_on_failure.max_interval.0, Duration::from_secs(30));
        // Errors keep their paths, inside the exporter settings too.
        let at = |p: &str| FieldError::at(p, "").path;
        let err = |v: serde_json::Value| parse(v).unwrap_err();
        assert_eq!(err(serde_json::json!({"timeout": "5 parsecs"})).path, at("timeout"));
        assert_eq!(err(serde_json::json!({"sending_queue": {"bogus": 1}})).path, at("sending_queue.bogus"));
        assert_eq!(
            err(serde_json::json!({"retry_on_failure": {"multiplier": "x"}})).path,
            at("retry_on_failure.multiplier")
        );
        let unknown = err(serde_json::json!({"endpoint": "x", "timout": "1s"}));
        assert_eq!(unknown.path, at("timout"));
        assert_eq!(
            unknown.message,
            "unknown field `timout`, expected one of `endpoint`, `timeout`, `sending_queue`, `retry_on_failure`"
        );
        // The checks.
        let ok = ExporterSettings::default();
        assert!(ok.check().is_ok());
        assert!(ok.check_one_consumer("x").is_err(), "ten consumers by default");
        let one = ExporterSettings::default().one_consumer();
        assert!(one.check_one_consumer("x: why").is_ok());
        let e = ok.check_one_consumer("x: why").unwrap_err();
        assert_eq!(e, FieldError::at("sending_queue.num_consumers", "num_consumers must be 1 for x: why"));
        let mut off = ok.clone();
        off.sending_queue.enabled = false;
        assert!(off.check_one_consumer("x").is_ok(), "a disabled queue has no consumers");
        let mut off = ExporterSettings::default();
        (off.sending_queue.enabled, off.sending_queue.queue_size, off.sending_queue.num_consumers) = (false, 0, 0);
        assert!(off.check().is_ok(), "a disabled queue needs no room and no workers");
        let mut bad = ok.clone();
        bad.sending_queue.queue_size = 0;
        assert_eq!(bad.check().unwrap_err(), FieldError::at("sending_queue.queue_size", "queue_size must be positive"));
        let mut bad = ok.clone();
        bad.retry_on_failure.randomization_factor = 1.5;
        assert_eq!(bad.check().unwrap_err().path, at("retry_on_failure.randomization_factor"));
        bad.retry_on_failure.randomization_factor = 0.5;
        bad.retry_on_failure.multiplier = 0.0;
        assert_eq!(
            bad.check().unwrap_err(),
            FieldError::at("retry_on_failure.multiplier", "multiplier must be positive")
        );
    }

    #[tokio::test]
    async fn retries_then_delivers_and_counts() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let s = Arc::new(Flaky { calls: AtomicUsize::new(0), fail_first: 3, permanent: false });
        let e = QueuedExporter::new(
            "x".into(),
            Signal::Traces,
            s.clone(),
            m.clone(),
            QueueSettings::default(),
            fast_retry(),
        );
        e.start().await.unwrap();
        e.consume(spans(5)).await.unwrap();
        let dropped = e.shutdown(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(dropped, 0);
        assert_eq!(m.sent.get(), 5);
        assert_eq!(m.send_failed.get(), 0);
        assert_eq!(s.calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn permanent_errors_are_not_retried() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let s = Arc::new(Flaky { calls: AtomicUsize::new(0), fail_first: 100, permanent: true });
        let e = QueuedExporter::new(
            "x".into(),
            Signal::Traces,
            s.clone(),
            m.clone(),
            QueueSettings::default(),
            fast_retry(),
        );
        e.start().await.unwrap();
        e.consume(spans(3)).await.unwrap();
        e.shutdown(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(m.send_failed.get(), 3);
        assert_eq!(s.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn full_queue_refuses_and_counts() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let s = Arc::new(Flaky { calls: AtomicUsize::new(0), fail_first: 0, permanent: false });
        let q = QueueSettings { enabled: true, num_consumers: 1, queue_size: 2, ..Default::default() };
        // Not started: nothing drains the queue.
        let e = QueuedExporter::new("x".into(), Signal::Traces, s, m.clone(), q, fast_retry());
        e.consume(spans(1)).await.unwrap();
        e.consume(spans(1)).await.unwrap();
        let r = e.consume(spans(4)).await;
        assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::QueueFull, .. })));
        assert_eq!(m.enqueue_failed.get(), 4);
        assert_eq!(m.queue_size.get(), 2);
    }

    #[tokio::test]
    async fn shutdown_deadline_counts_undelivered() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let s = Arc::new(Flaky { calls: AtomicUsize::new(0), fail_first: usize::MAX, permanent: false });
        let retry = RetrySettings { max_elapsed_time: GoDuration(Duration::ZERO), ..fast_retry() };
        let q = QueueSettings { enabled: true, num_consumers: 1, queue_size: 10, ..Default::default() };
        let e = QueuedExporter::new("x".into(), Signal::Traces, s, m.clone(), q, retry);
        e.start().await.unwrap();
        e.consume(spans(2)).await.unwrap();
        let dropped = e.shutdown(Instant::now() + Duration::from_millis(50)).await;
        assert_eq!(dropped, 2);
        assert_eq!(m.sent.get(), 0);
    }

    #[test]
    fn backoff_grows_and_stops() {
        let s = RetrySettings {
            initial_interval: GoDuration(Duration::from_secs(1)),
            max_interval: GoDuration(Duration::from_secs(3)),
            randomization_factor: 0.0,
            ..Default::default()
        };
        let mut b = Backoff::new(&s);
        let d: Vec<_> = (0..5).map(|_| b.next_delay(None).unwrap().as_secs_f64()).collect();
        assert_eq!(d, vec![1.0, 1.5, 2.25, 3.0, 3.0]);
        assert_eq!(b.next_delay(Some(Duration::from_secs(7))), Some(Duration::from_secs(7)));
        let mut off = Backoff::new(&RetrySettings { enabled: false, ..s });
        assert_eq!(off.next_delay(None), None);
    }
    // ---- persistent queue, sizers, blocking, enqueue_failed ----

    use crate::extension::file_storage::FileStorage;
    use crate::settings::QueueSizer;
    use std::path::{Path, PathBuf};

    fn tmpdir(tag: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "iw-queue-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn named(i: usize) -> Payload {
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span { name: i.to_string(), ..Default::default() }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    fn names(p: &Payload) -> Vec<usize> {
        let d = p.decoded().unwrap();
        let Payload::Traces(r) = d.as_ref() else { return vec![] };
        r.resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .filter_map(|s| s.name.parse().ok())
            .collect()
    }

    /// Records what it is sent (and the tenant header in scope); holds sends while `hold` is set.
    #[derive(Default)]
    struct Sink {
        got: parking_lot::Mutex<Vec<usize>>,
        tenants: parking_lot::Mutex<Vec<String>>,
        hold: std::sync::atomic::AtomicBool,
        /// Record before holding (the send "reached" the destination but was not confirmed).
        record_then_hold: bool,
    }
    #[async_trait]
    impl Sender for Sink {
        async fn send(&self, d: &Payload) -> Result<(), SendError> {
            if self.record_then_hold {
                self.got.lock().extend(names(d));
            }
            while self.hold.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if let Some(c) = ClientInfo::current() {
                self.tenants.lock().extend(c.metadata_values("x-tenant"));
            }
            if !self.record_then_hold {
                self.got.lock().extend(names(d));
            }
            Ok(())
        }
    }

    async fn wait_for(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    struct Disk {
        telemetry: Telemetry,
    }

    impl Disk {
        fn new() -> Self {
            Disk { telemetry: Telemetry::new() }
        }
        fn metrics(&self) -> ExporterMetrics {
            self.telemetry.exporter(&ComponentId::parse("otlp/q").unwrap(), Signal::Traces)
        }
        fn open(
            &self,
            dir: &Path,
            sink: Arc<Sink>,
            q: QueueSettings,
            fsync: bool,
        ) -> Result<QueuedExporter, ComponentError> {
            let storage = FileStorage { directory: dir.to_path_buf(), fsync, timeout: Duration::from_secs(1) };
            let queue = QueuedExporter::open_disk(&storage, "otlp/q", Signal::Traces, &q, self.metrics())?;
            Ok(QueuedExporter::with_queue(
                "otlp/q".into(),
                Signal::Traces,
                sink,
                self.metrics(),
                q,
                fast_retry(),
                Some(queue),
            ))
        }
    }

    /// Stops the workers abruptly and drops everything without a shutdown (as kill -9 would).
    async fn crash(e: QueuedExporter) {
        e.workers.lock().await.shutdown().await;
        drop(e);
    }

    fn q(consumers: usize, size: usize) -> QueueSettings {
        QueueSettings { num_consumers: consumers, queue_size: size, ..Default::default() }
    }

    fn seg_files(dir: &Path) -> Vec<PathBuf> {
        let qd = dir.join("exporter_otlp~q_traces");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&qd).unwrap().map(|e| e.unwrap().path()).collect();
        v.sort();
        v.into_iter().filter(|p| p.to_string_lossy().ends_with(".log")).collect()
    }

    #[tokio::test]
    async fn restart_resumes_in_order_and_delivers_everything_not_acknowledged() {
        let dir = tmpdir("resume");
        let d = Disk::new();
        let sink = Arc::new(Sink::default());
        // First run: 3 delivered, then the downstream stalls and 7 more are queued.
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        e.start().await.unwrap();
        for i in 0..3 {
            e.consume(named(i)).await.unwrap();
        }
        wait_for("3 delivered", || sink.got.lock().len() == 3).await;
        sink.hold.store(true, Ordering::SeqCst);
        for i in 3..10 {
            e.consume(named(i)).await.unwrap();
        }
        crash(e).await;
        // Second run: everything not acknowledged, in order, nothing acknowledged again.
        let sink2 = Arc::new(Sink::default());
        let e = d.open(&dir, sink2.clone(), q(1, 100), false).unwrap();
        assert_eq!(d.metrics().queue_resumed.get(), 7);
        e.start().await.unwrap();
        wait_for("7 delivered", || sink2.got.lock().len() >= 7).await;
        assert_eq!(*sink2.got.lock(), (3..10).collect::<Vec<_>>());
        assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(2)).await, 0);
        drop(e);
        // Third run: nothing left.
        let e = d.open(&dir, Arc::new(Sink::default()), q(1, 100), false).unwrap();
        assert_eq!(d.metrics().queue_resumed.get(), 7);
        assert_eq!(e.queue.as_ref().unwrap().used(), 0);
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn duplicates_after_a_crash_are_bounded_by_in_flight_and_counted() {
        let dir = tmpdir("dups");
        let d = Disk::new();
        let sink = Arc::new(Sink { record_then_hold: true, ..Default::default() });
        sink.hold.store(true, Ordering::SeqCst);
        let e = d.open(&dir, sink.clone(), q(2, 100), false).unwrap();
        for i in 0..6 {
            e.consume(named(i)).await.unwrap();
        }
        e.start().await.unwrap();
        // Two workers reached the destination with 0 and 1 but have no answer yet.
        wait_for("2 in flight", || sink.got.lock().len() == 2).await;
        crash(e).await;
        let sink2 = Arc::new(Sink::default());
        let e = d.open(&dir, sink2.clone(), q(2, 100), false).unwrap();
        assert_eq!(d.metrics().queue_redelivered.get(), 2, "the in-flight ones are counted");
        assert_eq!(d.metrics().queue_resumed.get(), 6);
        e.start().await.unwrap();
        wait_for("6 delivered", || sink2.got.lock().len() >= 6).await;
        let mut all: Vec<usize> = sink.got.lock().iter().chain(sink2.got.lock().iter()).copied().collect();
        all.sort_unstable();
        let dups = all.len() - 6;
        assert_eq!(dups, 2, "duplicates are exactly what was in flight: {all:?}");
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn torn_tail_is_truncated_and_counted() {
        let dir = tmpdir("torn");
        let d = Disk::new();
        let e = d.open(&dir, Arc::new(Sink::default()), q(1, 100), false).unwrap();
        for i in 0..3 {
            e.consume(named(i)).await.unwrap();
        }
        crash(e).await;
        let seg = seg_files(&dir).pop().unwrap();
        let len = std::fs::metadata(&seg).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
        let sink = Arc::new(Sink::default());
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        assert_eq!(d.metrics().queue_torn.get(), 1);
        assert_eq!(d.metrics().queue_quarantined.get(), 0);
        e.start().await.unwrap();
        e.consume(named(3)).await.unwrap();
        wait_for("3 delivered", || sink.got.lock().len() >= 3).await;
        assert_eq!(*sink.got.lock(), vec![0, 1, 3]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn corrupt_middle_record_is_quarantined_and_the_exporter_keeps_working() {
        let dir = tmpdir("corrupt");
        let d = Disk::new();
        let e = d.open(&dir, Arc::new(Sink::default()), q(1, 100), false).unwrap();
        for i in 0..3 {
            e.consume(named(i)).await.unwrap();
        }
        crash(e).await;
        let seg = seg_files(&dir).pop().unwrap();
        let mut bytes = std::fs::read(&seg).unwrap();
        let third = bytes.len() / 3;
        bytes[third + third / 2] ^= 0x5A; // inside the second record
        std::fs::write(&seg, &bytes).unwrap();
        let sink = Arc::new(Sink::default());
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        assert_eq!(d.metrics().queue_quarantined.get(), 1);
        let qd = dir.join("exporter_otlp~q_traces");
        let aside: Vec<_> = std::fs::read_dir(&qd)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "the damaged segment is kept aside");
        e.start().await.unwrap();
        e.consume(named(3)).await.unwrap();
        wait_for("3 delivered", || sink.got.lock().len() >= 3).await;
        assert_eq!(*sink.got.lock(), vec![0, 2, 3]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        drop(e);
        // A corrupt state file is moved aside too; the queue then resends what it holds.
        std::fs::write(qd.join("state"), b"garbage").unwrap();
        let _e = d.open(&dir, Arc::new(Sink::default()), q(1, 100), false).unwrap();
        assert_eq!(d.metrics().queue_quarantined.get(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn unwritable_directory_is_refused_with_an_error() {
        let dir = tmpdir("unwritable");
        std::fs::create_dir_all(&dir).unwrap();
        // A file where the queue directory's parent should be: creation fails even as root.
        let blocker = dir.join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let d = Disk::new();
        let err = d.open(&blocker, Arc::new(Sink::default()), q(1, 10), false).err().expect("refused");
        assert!(err.to_string().contains("cannot create the directory"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn full_disk_refuses_retryably_and_recovers() {
        let dir = tmpdir("full");
        let d = Disk::new();
        let sink = Arc::new(Sink::default());
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        e.consume(named(0)).await.unwrap();
        e.queue.as_ref().unwrap().fail_writes(true);
        let r = e.consume(spans(4)).await;
        assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::QueueFull, .. })), "{r:?}");
        assert!(r.unwrap_err().is_retryable());
        assert_eq!(d.metrics().queue_write_failed.get(), 4);
        assert_eq!(d.metrics().enqueue_failed.get(), 4);
        assert_eq!(e.queue.as_ref().unwrap().used(), 1, "the refused batch holds no room");
        e.queue.as_ref().unwrap().fail_writes(false);
        e.consume(named(1)).await.unwrap();
        crash(e).await;
        // The half-written frame was rolled back: the log reads clean.
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        assert_eq!((d.metrics().queue_torn.get(), d.metrics().queue_quarantined.get()), (0, 0));
        e.start().await.unwrap();
        wait_for("2 delivered", || sink.got.lock().len() >= 2).await;
        assert_eq!(*sink.got.lock(), vec![0, 1]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn fsync_queue_delivers_and_client_metadata_survives() {
        let dir = tmpdir("fsync");
        let d = Disk::new();
        let sink = Arc::new(Sink::default());
        let e = d.open(&dir, sink.clone(), q(2, 100), true).unwrap();
        let mut info = ClientInfo::default();
        info.metadata.insert("x-tenant", "acme".parse().unwrap());
        info.metadata.insert("authorization", "Bearer s3cret".parse().unwrap());
        ClientInfo::scope(Arc::new(info), e.consume(named(0))).await.unwrap();
        crash(e).await;
        let raw: Vec<u8> = seg_files(&dir).iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
        assert!(!raw.windows(6).any(|w| w == b"s3cret"), "credentials are not written to disk");
        let e = d.open(&dir, sink.clone(), q(2, 100), true).unwrap();
        e.start().await.unwrap();
        wait_for("delivered", || !sink.got.lock().is_empty()).await;
        assert_eq!(*sink.tenants.lock(), vec!["acme"], "the tenant header is in scope during the send");
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn memory_queue_sends_in_the_client_scope() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Sink::default());
        let e = QueuedExporter::new("x".into(), Signal::Traces, sink.clone(), m, q(1, 10), fast_retry());
        let mut info = ClientInfo::default();
        info.metadata.insert("x-tenant", "t1".parse().unwrap());
        ClientInfo::scope(Arc::new(info), e.consume(named(0))).await.unwrap();
        e.start().await.unwrap();
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        assert_eq!(*sink.tenants.lock(), vec!["t1"]);
    }

    #[tokio::test]
    async fn shutdown_keeps_the_persistent_queue_for_the_next_start() {
        let dir = tmpdir("keep");
        let d = Disk::new();
        let sink = Arc::new(Sink::default());
        sink.hold.store(true, Ordering::SeqCst);
        let e = d.open(&dir, sink.clone(), q(1, 100), false).unwrap();
        e.start().await.unwrap();
        for i in 0..4 {
            e.consume(named(i)).await.unwrap();
        }
        assert_eq!(e.shutdown(Instant::now() + Duration::from_millis(50)).await, 0, "nothing is lost");
        assert_eq!(d.metrics().shutdown_dropped.get(), 0);
        drop(e);
        let sink2 = Arc::new(Sink::default());
        let e = d.open(&dir, sink2.clone(), q(1, 100), false).unwrap();
        e.start().await.unwrap();
        wait_for("4 delivered", || sink2.got.lock().len() >= 4).await;
        assert_eq!(*sink2.got.lock(), vec![0, 1, 2, 3]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn sizers_cap_items_and_bytes() {
        let t = Telemetry::new();
        let sink = Arc::new(Sink::default());
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let items = QueueSettings { queue_size: 10, sizer: QueueSizer::Items, ..q(1, 10) };
        let e = QueuedExporter::new("x".into(), Signal::Traces, sink.clone(), m.clone(), items, fast_retry());
        e.consume(spans(6)).await.unwrap();
        e.consume(spans(4)).await.unwrap();
        assert_eq!(m.queue_size.get(), 10);
        assert!(matches!(
            e.consume(spans(1)).await,
            Err(ConsumeError::Refused { reason: RefuseReason::QueueFull, .. })
        ));
        // Larger than the whole queue: can never fit.
        assert!(matches!(e.consume(spans(11)).await, Err(ConsumeError::Permanent(_))));
        assert_eq!(m.enqueue_failed.get(), 12);

        let one = spans(3).encoded_len();
        let m2 = t.exporter(&ComponentId::parse("y").unwrap(), Signal::Traces);
        let bytes = QueueSettings { queue_size: 2 * one + 1, sizer: QueueSizer::Bytes, ..q(1, 10) };
        let e2 = QueuedExporter::new("y".into(), Signal::Traces, sink, m2.clone(), bytes, fast_retry());
        e2.consume(spans(3)).await.unwrap();
        e2.consume(spans(3)).await.unwrap();
        assert!(e2.consume(spans(3)).await.is_err());
        assert_eq!(m2.queue_size.get(), 2 * one as i64);
        // The disk queue measures the same way and resumes its size after a restart.
        let dir = tmpdir("sizer");
        let d = Disk::new();
        let items = QueueSettings { queue_size: 5, sizer: QueueSizer::Items, ..q(1, 10) };
        let e3 = d.open(&dir, Arc::new(Sink::default()), items.clone(), false).unwrap();
        e3.consume(spans(5)).await.unwrap();
        assert!(e3.consume(spans(1)).await.is_err());
        crash(e3).await;
        let e3 = d.open(&dir, Arc::new(Sink::default()), items, false).unwrap();
        assert_eq!(e3.queue.as_ref().unwrap().used(), 5);
        assert!(e3.consume(spans(1)).await.is_err());
        drop(e3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn block_on_overflow_waits_then_succeeds_when_a_consumer_frees_room() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Sink::default());
        sink.hold.store(true, Ordering::SeqCst);
        let qs = QueueSettings { block_on_overflow: true, ..q(1, 2) };
        let e = Arc::new(QueuedExporter::new("x".into(), Signal::Traces, sink.clone(), m.clone(), qs, fast_retry()));
        e.start().await.unwrap();
        e.consume(named(0)).await.unwrap();
        e.consume(named(1)).await.unwrap();
        let waiting = tokio::spawn({
            let e = e.clone();
            async move { e.consume(named(2)).await }
        });
        // The caller's cancellation bounds the wait.
        let cancelled = tokio::time::timeout(Duration::from_millis(20), e.consume(named(9))).await;
        assert!(cancelled.is_err(), "a full blocking queue waits");
        assert!(!waiting.is_finished());
        sink.hold.store(false, Ordering::SeqCst);
        waiting.await.unwrap().unwrap();
        wait_for("3 delivered", || sink.got.lock().len() >= 3).await;
        assert_eq!(*sink.got.lock(), vec![0, 1, 2]);
        assert_eq!(m.enqueue_failed.get(), 0);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
    }

    /// The attack finding: a stage holding accepted data (the batch processor) re-offered its
    /// whole buffer to the full queue on every tick and each refusal counted the buffer again,
    /// so `enqueue_failed` read 12× the spans ever sent. Only refusals to a client count.
    #[tokio::test]
    async fn enqueue_failed_counts_each_refusal_to_a_client_once() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Sink::default());
        let e = QueuedExporter::new("x".into(), Signal::Traces, sink, m.clone(), q(1, 1), fast_retry());
        e.consume(spans(1)).await.unwrap(); // not started: the queue stays full
        // The over-count, reproduced: 20 retries of one held 100-span batch counted 2,000 spans.
        let held = spans(100);
        for _ in 0..20 {
            assert!(e.consume(held.clone()).await.is_err());
        }
        assert_eq!(m.enqueue_failed.get(), 2000, "each plain retry counts again");
        // Retries of held data (offer_held) are refused the same way but not counted again...
        for _ in 0..20 {
            let r = offer_held(e.consume(held.clone())).await;
            assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::QueueFull, .. })));
        }
        assert_eq!(m.enqueue_failed.get(), 2000);
        // ...while a refusal to a client still counts its items once.
        assert!(e.consume(spans(7)).await.is_err());
        assert_eq!(m.enqueue_failed.get(), 2007);
    }

    /// Records each request it is sent: the span names and the tenant header in scope.
    #[derive(Default)]
    struct Requests {
        got: parking_lot::Mutex<Vec<(Vec<usize>, Vec<String>)>>,
    }
    #[async_trait]
    impl Sender for Requests {
        async fn send(&self, d: &Payload) -> Result<(), SendError> {
            let tenant = ClientInfo::current().map(|c| c.metadata_values("x-tenant")).unwrap_or_default();
            self.got.lock().push((names(d), tenant));
            Ok(())
        }
    }

    fn batching(min: u64, max: u64, flush_ms: u64, keys: &[&str]) -> QueueSettings {
        QueueSettings {
            batch: Some(crate::settings::QueueBatchSettings {
                flush_timeout: GoDuration(Duration::from_millis(flush_ms)),
                min_size: min,
                max_size: max,
                sizer: crate::settings::QueueSizer::Items,
                partition: crate::settings::BatchPartition {
                    metadata_keys: keys.iter().map(|k| k.to_string()).collect(),
                },
            }),
            ..q(1, 1000)
        }
    }

    fn run_of(from: usize, to: usize) -> Payload {
        let mut p = named(from);
        for i in from + 1..to {
            p.append(named(i)).unwrap();
        }
        p
    }

    #[tokio::test]
    async fn queue_batch_merges_until_min_size_then_flushes_the_rest_on_timeout() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Requests::default());
        let e = QueuedExporter::new(
            "x".into(),
            Signal::Traces,
            sink.clone(),
            m.clone(),
            batching(5, 0, 30, &[]),
            fast_retry(),
        );
        for i in 0..12 {
            e.consume(named(i)).await.unwrap();
        }
        e.start().await.unwrap();
        wait_for("12 sent", || m.sent.get() == 12).await;
        let got: Vec<Vec<usize>> = sink.got.lock().iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(got, vec![(0..5).collect::<Vec<_>>(), (5..10).collect(), vec![10, 11]]);
        assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(2)).await, 0);
    }

    #[tokio::test]
    async fn queue_batch_splits_at_max_size_in_order() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Requests::default());
        let e = QueuedExporter::new(
            "x".into(),
            Signal::Traces,
            sink.clone(),
            m.clone(),
            batching(4, 4, 1000, &[]),
            fast_retry(),
        );
        e.consume(run_of(0, 10)).await.unwrap();
        e.start().await.unwrap();
        wait_for("10 sent", || m.sent.get() == 10).await;
        let got: Vec<Vec<usize>> = sink.got.lock().iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(got, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn queue_batch_partitions_keep_interleaved_tenants_apart() {
        let t = Telemetry::new();
        let m = t.exporter(&ComponentId::parse("x").unwrap(), Signal::Traces);
        let sink = Arc::new(Requests::default());
        let e = QueuedExporter::new(
            "x".into(),
            Signal::Traces,
            sink.clone(),
            m.clone(),
            batching(3, 0, 5000, &["X-Tenant"]),
            fast_retry(),
        );
        for i in 0..6 {
            let mut info = ClientInfo::default();
            info.metadata.insert("x-tenant", if i % 2 == 0 { "a" } else { "b" }.parse().unwrap());
            ClientInfo::scope(Arc::new(info), e.consume(named(i))).await.unwrap();
        }
        e.start().await.unwrap();
        // Both batches reach min_size (3) long before the 5 s flush timeout.
        wait_for("6 sent", || m.sent.get() == 6).await;
        let mut got = sink.got.lock().clone();
        got.sort();
        assert_eq!(got, vec![(vec![0, 2, 4], vec!["a".to_string()]), (vec![1, 3, 5], vec!["b".to_string()])]);
        e.shutdown(Instant::now() + Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn queue_batch_survives_a_crash_of_what_it_gathered() {
        // A worker holding a partial batch is killed: the persistent queue still has it.
        let dir = tmpdir("batch-crash");
        let d = Disk::new();
        let sink = Arc::new(Sink::default());
        let e = d.open(&dir, sink.clone(), batching(100, 0, 60_000, &[]), false).unwrap();
        e.start().await.unwrap();
        for i in 0..7 {
            e.consume(named(i)).await.unwrap();
        }
        crash(e).await;
        assert!(sink.got.lock().is_empty(), "nothing reached min_size or the flush timeout");
        let sink2 = Arc::new(Sink::default());
        let e = d.open(&dir, sink2.clone(), batching(100, 0, 20, &[]), false).unwrap();
        assert_eq!(d.metrics().queue_resumed.get(), 7);
        e.start().await.unwrap();
        wait_for("7 delivered", || sink2.got.lock().len() == 7).await;
        assert_eq!(*sink2.got.lock(), (0..7).collect::<Vec<_>>());
        assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(2)).await, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn queue_batch_settings_parse_and_check_as_otelcol() {
        let parse = |v: serde_json::Value| -> QueueSettings { serde_json::from_value(v).unwrap() };
        let b = parse(serde_json::json!({"batch": {}})).batch.unwrap();
        assert_eq!((b.flush_timeout.0, b.min_size, b.max_size), (Duration::from_millis(200), 8192, 0));
        assert_eq!(b.sizer, crate::settings::QueueSizer::Items, "no sizer anywhere: items");
        let b = parse(serde_json::json!({"sizer": "bytes", "queue_size": 1000000, "batch": {"min_size": 1000}}))
            .batch
            .unwrap();
        assert_eq!(b.sizer, crate::settings::QueueSizer::Bytes, "from the queue's sizer");
        assert!(parse(serde_json::json!({})).batch.is_none());
        let bad = |v: serde_json::Value| parse(v).check().unwrap_err().path;
        let at = |p: &str| FieldError::at(p, "").path;
        assert_eq!(bad(serde_json::json!({"batch": {"flush_timeout": "0s"}})), at("sending_queue.batch.flush_timeout"));
        assert_eq!(
            bad(serde_json::json!({"batch": {"min_size": 10, "max_size": 5}})),
            at("sending_queue.batch.max_size")
        );
        assert_eq!(
            bad(serde_json::json!({"batch": {"partition": {"metadata_keys": ["a", "A"]}}})),
            at("sending_queue.batch.partition.metadata_keys")
        );
        assert_eq!(bad(serde_json::json!({"enabled": false, "batch": {}})), at("sending_queue.batch"));
        assert!(serde_json::from_value::<QueueSettings>(serde_json::json!({"batch": {"nope": 1}})).is_err());
    }
}
