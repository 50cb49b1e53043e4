//! The sending queue behind [`crate::exporterhelper::QueuedExporter`]: bounded in requests, items
//! or bytes (`sizer`), refusing or waiting (`block_on_overflow`) when full, kept in memory or on
//! disk in a `file_storage` extension's directory.

mod disk;
mod record;

use crate::auth::ClientInfo;
use crate::pdata::{Payload, Signal};
use crate::settings::QueueSizer;
use crate::telemetry::ExporterMetrics;
use disk::{DiskOptions, DiskQueue};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub use disk::Resumed;

/// Why a payload was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    /// The queue is full (and does not block, or was closed while waiting).
    #[error("the sending queue is full")]
    Full,
    /// The payload alone is larger than the whole queue.
    #[error("the request ({0} {1}) is larger than the queue capacity ({2})")]
    TooLarge(u64, &'static str, u64),
    /// The queue is closed (shutting down).
    #[error("the exporter is shutting down")]
    Closed,
    /// The persistent queue could not be written (full disk, I/O error).
    #[error("the persistent queue cannot be written: {0}")]
    Write(String),
}

/// A payload handed to a worker; give it back with [`Queue::complete`] or [`Queue::abandon`].
pub struct Job {
    /// The data to send.
    pub payload: Payload,
    /// Who sent it (restored around the send).
    pub client: Option<Arc<ClientInfo>>,
    units: u64,
    index: Option<u64>,
}

struct State {
    used: u64,
    closed: bool,
    mem: VecDeque<Job>,
}

/// A bounded sending queue.
pub struct Queue {
    sizer: QueueSizer,
    cap: u64,
    block: bool,
    state: Mutex<State>,
    items: Notify,
    space: Notify,
    disk: Option<Arc<DiskQueue>>,
    metrics: ExporterMetrics,
    last_write_warn: Mutex<Option<Instant>>,
}

fn unit_name(s: QueueSizer) -> &'static str {
    match s {
        QueueSizer::Requests => "requests",
        QueueSizer::Items => "items",
        QueueSizer::Bytes => "bytes",
    }
}

/// Measures `p` in the units of `sizer`.
pub fn units(sizer: QueueSizer, p: &Payload) -> u64 {
    match sizer {
        QueueSizer::Requests => 1,
        QueueSizer::Items => p.item_count() as u64,
        QueueSizer::Bytes => p.encoded_len() as u64,
    }
}

/// Where and how a persistent queue lives.
#[derive(Debug, Clone)]
pub struct DiskSettings<'a> {
    /// The queue's own directory (created 0750 when missing).
    pub dir: &'a Path,
    /// Sync each batch to the device before acknowledging it.
    pub fsync: bool,
    /// How long to wait for the directory lock.
    pub lock_timeout: Duration,
}

impl Queue {
    /// An in-memory queue of `cap` units.
    pub fn memory(sizer: QueueSizer, cap: u64, block: bool, metrics: ExporterMetrics) -> Queue {
        Queue::build(sizer, cap, block, metrics, None, 0)
    }

    /// A persistent queue in `disk.dir`, resuming what it holds (repairing crash damage).
    pub fn persistent(
        sizer: QueueSizer,
        cap: u64,
        block: bool,
        metrics: ExporterMetrics,
        disk: DiskSettings<'_>,
        name: &str,
        signal: Signal,
    ) -> Result<(Queue, Resumed), String> {
        let opts = DiskOptions { fsync: disk.fsync, lock_timeout: disk.lock_timeout, sizer };
        let (d, resumed) = DiskQueue::open(disk.dir, opts, metrics.clone(), name, signal)?;
        metrics.queue_resumed.inc_by(resumed.items);
        metrics.queue_redelivered.inc_by(resumed.redelivered_items);
        if resumed.records > 0 {
            tracing::info!(exporter = name, signal = %signal, dir = %d.dir().display(),
                batches = resumed.records, items = resumed.items,
                redelivered_batches = resumed.redelivered_records, redelivered_items = resumed.redelivered_items,
                "resuming the persistent sending queue; the redelivered ones were being sent at the stop and may arrive twice");
        }
        let used = resumed.units;
        Ok((Queue::build(sizer, cap, block, metrics, Some(Arc::new(d)), used), resumed))
    }

    fn build(
        sizer: QueueSizer,
        cap: u64,
        block: bool,
        metrics: ExporterMetrics,
        disk: Option<Arc<DiskQueue>>,
        used: u64,
    ) -> Queue {
        metrics.queue_capacity.set(i64::try_from(cap).unwrap_or(i64::MAX));
        metrics.queue_size.set(i64::try_from(used).unwrap_or(i64::MAX));
        Queue {
            sizer,
            cap,
            block,
            state: Mutex::new(State { used, closed: false, mem: VecDeque::new() }),
            items: Notify::new(),
            space: Notify::new(),
            disk,
            metrics,
            last_write_warn: Mutex::new(None),
        }
    }

    /// Whether the queue is kept on disk.
    pub fn is_persistent(&self) -> bool {
        self.disk.is_some()
    }

    fn set_gauge(&self, used: u64) {
        self.metrics.queue_size.set(i64::try_from(used).unwrap_or(i64::MAX));
    }

    /// Reserves room for `u` units, waiting for it when the queue blocks.
    async fn reserve(&self, u: u64) -> Result<(), EnqueueError> {
        if u > self.cap {
            return Err(EnqueueError::TooLarge(u, unit_name(self.sizer), self.cap));
        }
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock();
                if s.closed {
                    return Err(EnqueueError::Closed);
                }
                if s.used + u <= self.cap {
                    s.used += u;
                    let used = s.used;
                    drop(s);
                    self.set_gauge(used);
                    return Ok(());
                }
                if !self.block {
                    return Err(EnqueueError::Full);
                }
            }
            notified.await;
        }
    }

    fn release(&self, u: u64) {
        let used = {
            let mut s = self.state.lock();
            s.used = s.used.saturating_sub(u);
            s.used
        };
        self.set_gauge(used);
        self.space.notify_waiters();
    }

    /// Queues `payload` (on disk: written, and synced with `fsync`, before this returns Ok).
    pub async fn push(&self, payload: Payload, client: Option<Arc<ClientInfo>>) -> Result<(), EnqueueError> {
        let u = units(self.sizer, &payload);
        self.reserve(u).await?;
        let Some(d) = &self.disk else {
            self.state.lock().mem.push_back(Job { payload, client, units: u, index: None });
            self.items.notify_one();
            return Ok(());
        };
        let result = match d.append(payload, client, u) {
            Ok(seq) => {
                // The record is queued now (workers may send it); syncing it makes it durable.
                self.items.notify_one();
                if d.fsync() { sync_blocking(d.clone(), seq).await } else { Ok(()) }
            }
            Err(e) => {
                self.release(u);
                Err(e.to_string())
            }
        };
        result.map_err(|e| {
            self.warn_write(&e);
            EnqueueError::Write(e)
        })
    }

    /// Logs a write failure at most every 10 s.
    fn warn_write(&self, e: &str) {
        let mut last = self.last_write_warn.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(error = %e, dir = %self.disk.as_ref().map(|d| d.dir().display().to_string()).unwrap_or_default(),
                "persistent sending queue cannot be written; refusing data until it can (next such line in 10s at the earliest)");
        }
    }

    fn try_pop(&self) -> Option<Job> {
        match &self.disk {
            None => self.state.lock().mem.pop_front(),
            Some(d) => {
                d.pop().map(|j| Job { payload: j.payload, client: j.client, units: j.units, index: Some(j.index) })
            }
        }
    }

    fn is_empty(&self) -> bool {
        match &self.disk {
            None => self.state.lock().mem.is_empty(),
            Some(d) => !d.has_pending(),
        }
    }

    /// The next job; `None` once the queue is closed and empty.
    pub async fn pop(&self) -> Option<Job> {
        loop {
            let notified = self.items.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(j) = self.try_pop() {
                // Others may be waiting for what is left.
                if !self.is_empty() {
                    self.items.notify_one();
                }
                return Some(j);
            }
            if self.state.lock().closed {
                return None;
            }
            notified.await;
        }
    }

    /// The job is done (delivered, or dropped for good): frees its room.
    pub fn complete(&self, job: Job) {
        if let (Some(d), Some(i)) = (&self.disk, job.index) {
            d.complete(i);
        }
        self.release(job.units);
    }

    /// The job was interrupted by the shutdown: a persistent queue keeps it for the next start.
    pub fn abandon(&self, job: Job) {
        self.release(job.units);
    }

    /// Refuses new payloads and wakes everyone waiting.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.items.notify_waiters();
        self.space.notify_waiters();
    }

    /// Removes what an in-memory queue still holds (at the hard stop); returns its items.
    pub fn drain_memory(&self) -> u64 {
        let jobs: Vec<Job> = self.state.lock().mem.drain(..).collect();
        let items = jobs.iter().map(|j| j.payload.item_count() as u64).sum();
        for j in jobs {
            self.release(j.units);
        }
        items
    }

    /// Units now held (queued plus being sent).
    pub fn used(&self) -> u64 {
        self.state.lock().used
    }

    #[cfg(test)]
    pub(crate) fn fail_writes(&self, on: bool) {
        if let Some(d) = &self.disk {
            d.fail_writes.store(on, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Syncs on a blocking thread (an fsync takes milliseconds).
async fn sync_blocking(d: Arc<DiskQueue>, seq: u64) -> Result<(), String> {
    match tokio::task::spawn_blocking(move || d.sync(seq)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("sync task failed: {e}")),
    }
}
