//! Feeding chunks to the pipeline: pacing, retries on backpressure, the read position and
//! progress.

use super::ReplayControl;
use super::position::ReplayPosition;
use super::read::{Chunk, Event};
use inferwatch_core::component::{ComponentId, ReceiverConsumers};
use inferwatch_core::consumer::ConsumeError;
use inferwatch_core::host::Host;
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::{ReceiverMetrics, Telemetry};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// First wait after a refusal that names no delay.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait after a refusal that names no delay.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The receiver stopped while feeding.
pub(crate) struct Cancelled;

/// Waits for the state barrier (a checkpoint in progress), unless the receiver stops.
async fn barrier<'a>(host: &'a Host, cancel: &CancellationToken) -> Result<tokio::sync::MutexGuard<'a, ()>, Cancelled> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Cancelled),
        g = host.state.barrier().lock() => Ok(g),
    }
}

/// Feeds the events of one replay to the pipeline.
pub(crate) struct Feeder {
    /// The receiver's id.
    pub id: ComponentId,
    /// Where each signal goes.
    pub consumers: ReceiverConsumers,
    /// otelcol receiver accepted / refused counters (transport `replay`).
    pub metrics: ReceiverMetrics,
    /// Self-telemetry (replay item counters).
    pub telemetry: Arc<Telemetry>,
    /// Shared state (the barrier) and the replay request.
    pub host: Arc<Host>,
    /// The read position.
    pub position: Arc<ReplayPosition>,
    /// Set when the receiver stops.
    pub cancel: CancellationToken,
    /// Pace: N times real time; 0 = as fast as possible.
    pub speed: f64,
    /// Size of each input file.
    pub sizes: Vec<u64>,
    /// Bytes of the files before the current one.
    pub base_bytes: u64,
    /// Wall time and event time of the first paced chunk.
    pub pace_origin: Option<(Instant, u64)>,
    /// Items skipped per signal because no pipeline takes them.
    pub skipped: [u64; 3],
}

impl Feeder {
    fn control(&self) -> Option<&ReplayControl> {
        self.host.run.get::<ReplayControl>()
    }

    /// Feeds every event until the reader is done; `Err` when the receiver stopped.
    pub(crate) async fn run(&mut self, mut rx: mpsc::Receiver<Event>) -> Result<(), Cancelled> {
        loop {
            let ev = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Cancelled),
                ev = rx.recv() => ev,
            };
            match ev {
                None => return Ok(()),
                Some(Event::Chunk(c)) => self.chunk(c).await?,
                Some(Event::Bad { file, end, items }) => {
                    let host = self.host.clone();
                    let _guard = barrier(&host, &self.cancel).await?;
                    if let Some(end) = end {
                        self.position.advance(file, end);
                    }
                    if let Some(c) = self.control() {
                        c.progress.failed_items.fetch_add(items, Ordering::Relaxed);
                    }
                }
                Some(Event::FileDone { file }) => {
                    let host = self.host.clone();
                    let _guard = barrier(&host, &self.cancel).await?;
                    self.position.advance(file + 1, 0);
                    self.base_bytes += self.sizes.get(file).copied().unwrap_or(0);
                    if let Some(c) = self.control() {
                        c.progress.files_done.fetch_add(1, Ordering::Relaxed);
                        c.progress.done_bytes.store(self.base_bytes, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Waits until the chunk is due at the configured speed.
    async fn pace(&mut self, t: Option<u64>) -> Result<(), Cancelled> {
        let (Some(t), true) = (t, self.speed > 0.0) else { return Ok(()) };
        let Some((wall, t0)) = self.pace_origin else {
            self.pace_origin = Some((Instant::now(), t));
            return Ok(());
        };
        let due = Duration::try_from_secs_f64(t.saturating_sub(t0) as f64 / 1e9 / self.speed)
            .ok()
            .and_then(|d| wall.checked_add(d));
        let Some(due) = due else { return Ok(()) };
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Cancelled),
            _ = tokio::time::sleep_until(due) => Ok(()),
        }
    }

    /// Feeds one chunk, retrying refusals; the position moves past it once it is taken.
    async fn chunk(&mut self, c: Chunk) -> Result<(), Cancelled> {
        let signal = c.payload.signal();
        let items = c.payload.item_count();
        let consumer = self.consumers.get(signal).cloned();
        let Some(consumer) = consumer.filter(|_| items > 0) else {
            // Nothing to feed (no pipeline of this signal, or an empty request): move past it.
            self.skipped[signal as usize] += items as u64;
            let host = self.host.clone();
            let _guard = barrier(&host, &self.cancel).await?;
            self.position.advance(c.file, c.end);
            self.progress_bytes(c.file, c.bytes_done);
            return Ok(());
        };
        self.pace(c.min_time).await?;
        let host = self.host.clone();
        let guard = barrier(&host, &self.cancel).await?;
        let mut payload = c.payload;
        let mut backoff = BACKOFF_MIN;
        let failed = loop {
            match consumer.consume(payload).await {
                Ok(()) => break false,
                Err(ConsumeError::Refused { retry_after, message, .. }) => {
                    let wait = retry_after.unwrap_or(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    tracing::debug!(receiver = %self.id, %signal, items, ?wait, reason = %message,
                        "replay: the pipeline refused a chunk; retrying it");
                    tokio::select! {
                        biased;
                        _ = self.cancel.cancelled() => return Err(Cancelled),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    match c.source.to_payload() {
                        Ok(p) => payload = p,
                        Err(e) => {
                            tracing::warn!(receiver = %self.id, error = %e, "replay: cannot rebuild a refused chunk");
                            break true;
                        }
                    }
                }
                Err(ConsumeError::Permanent(e)) => {
                    tracing::warn!(receiver = %self.id, %signal, items, error = %e,
                        "replay: the pipeline rejected a chunk for good; counting it as failed");
                    break true;
                }
            }
        };
        if failed {
            self.metrics.refused(signal, items);
        } else {
            self.metrics.accepted(signal, items);
            super::REPLAY_ITEMS.get(&self.telemetry, [&self.id.to_string(), signal.as_str()]).inc_by(items as u64);
        }
        self.position.advance(c.file, c.end);
        if let Some(ctl) = self.control() {
            let counter = if failed { &ctl.progress.failed_items } else { &ctl.progress.items };
            counter.fetch_add(items as u64, Ordering::Relaxed);
        }
        self.progress_bytes(c.file, c.bytes_done);
        drop(guard);
        Ok(())
    }

    fn progress_bytes(&self, file: usize, bytes_done: u64) {
        if let Some(ctl) = self.control() {
            let size = self.sizes.get(file).copied().unwrap_or(0);
            ctl.progress.done_bytes.store(self.base_bytes + bytes_done.min(size), Ordering::Relaxed);
        }
    }

    /// Warns once per signal whose items were skipped for want of a pipeline.
    pub(crate) fn report_skipped(&self) {
        for s in Signal::ALL {
            let n = self.skipped[s as usize];
            if n > 0 {
                tracing::warn!(receiver = %self.id, signal = %s, items = n,
                    "replay skipped {n} {} read from the inputs: no {s} pipeline uses this receiver", s.item_noun());
            }
        }
    }
}
