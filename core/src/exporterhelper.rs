//! Sending queue and retry with back-off shared by every exporter (otelcol's exporterhelper).
//!
//! An exporter implements [`Sender`] (one attempt to deliver one payload); [`QueuedExporter`]
//! wraps it with a bounded queue, `num_consumers` workers, retries and the exporter self-metrics.

use crate::component::{ComponentError, Node};
use crate::consumer::{ConsumeError, Consumer, RefuseReason};
use crate::pdata::{Payload, Signal};
use crate::settings::{QueueSettings, RetrySettings};
use crate::telemetry::ExporterMetrics;
use async_trait::async_trait;
use parking_lot::Mutex;
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
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
#[async_trait]
pub trait Sender: Send + Sync + 'static {
    /// Prepares connections; called once before the first send.
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Tries once to deliver `data`.
    async fn send(&self, data: &Payload) -> Result<(), SendError>;
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
    /// Fired when the shutdown deadline passes: workers abandon what they hold.
    hard_stop: CancellationToken,
}

impl Shared {
    /// Delivers one payload with retries. Returns false when it was abandoned by the hard stop.
    /// `queued`: the payload came from the queue (a final failure drops it) rather than from a
    /// caller (which gets the error back and may retry).
    async fn deliver(&self, data: Payload, queued: bool) -> Result<(), ConsumeError> {
        let n = data.item_count() as u64;
        let mut backoff = Backoff::new(&self.retry);
        loop {
            let attempt = tokio::select! {
                r = self.sender.send(&data) => r,
                _ = self.hard_stop.cancelled() => {
                    self.metrics.shutdown_dropped.inc_by(n);
                    return Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "shutting down"));
                }
            };
            match attempt {
                Ok(()) => {
                    self.metrics.sent.inc_by(n);
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
                            _ = self.hard_stop.cancelled() => {
                                self.metrics.shutdown_dropped.inc_by(n);
                                return Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "shutting down"));
                            }
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

/// An exporter node: a [`Sender`] behind a bounded queue with retries.
pub struct QueuedExporter {
    shared: Arc<Shared>,
    queue: QueueSettings,
    tx: Mutex<Option<mpsc::Sender<Payload>>>,
    rx: Mutex<Option<mpsc::Receiver<Payload>>>,
    workers: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl QueuedExporter {
    /// Wraps `sender` for one exporter id and signal.
    pub fn new(
        name: String,
        signal: Signal,
        sender: Arc<dyn Sender>,
        metrics: ExporterMetrics,
        queue: QueueSettings,
        retry: RetrySettings,
    ) -> Self {
        let cap = queue.queue_size.max(1);
        let (tx, rx) = if queue.enabled {
            let (tx, rx) = mpsc::channel(cap);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        metrics.queue_capacity.set(if queue.enabled { cap as i64 } else { 0 });
        QueuedExporter {
            shared: Arc::new(Shared { signal, name, sender, metrics, retry, hard_stop: CancellationToken::new() }),
            queue,
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            workers: tokio::sync::Mutex::new(tokio::task::JoinSet::new()),
        }
    }
}

#[async_trait]
impl Consumer for QueuedExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        if !self.queue.enabled {
            return self.shared.deliver(data, false).await;
        }
        let tx = self.tx.lock().clone();
        let Some(tx) = tx else {
            return Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "exporter is shutting down"));
        };
        let n = data.item_count() as u64;
        match tx.try_send(data) {
            Ok(()) => {
                self.shared.metrics.queue_size.inc();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared.metrics.enqueue_failed.inc_by(n);
                Err(ConsumeError::refused(
                    RefuseReason::QueueFull,
                    Some(Duration::from_secs(1)),
                    format!("sending queue of exporter {} is full", self.shared.name),
                ))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "exporter is shutting down"))
            }
        }
    }
}

#[async_trait]
impl Node for QueuedExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.shared.sender.start().await?;
        let Some(rx) = self.rx.lock().take() else { return Ok(()) };
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let mut workers = self.workers.lock().await;
        for _ in 0..self.queue.num_consumers.max(1) {
            let rx = rx.clone();
            let shared = self.shared.clone();
            workers.spawn(async move {
                loop {
                    let next = { rx.lock().await.recv().await };
                    let Some(data) = next else { break };
                    shared.metrics.queue_size.dec();
                    // Errors are counted and logged inside deliver.
                    let n = data.item_count() as u64;
                    // A bug in a sender must not kill the worker (and strand the queue).
                    let run = std::panic::AssertUnwindSafe(shared.deliver(data, true));
                    if futures::FutureExt::catch_unwind(run).await.is_err() {
                        shared.metrics.send_failed.inc_by(n);
                        tracing::error!(exporter = %shared.name, signal = %shared.signal, items = n,
                            "the sender panicked; data dropped");
                    }
                }
            });
        }
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        // Closing the channel lets the workers drain what is queued, then stop.
        self.tx.lock().take();
        let before = self.shared.metrics.shutdown_dropped.get();
        let mut workers = self.workers.lock().await;
        loop {
            match tokio::time::timeout_at(deadline.into(), workers.join_next()).await {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(exporter = %self.shared.name, signal = %self.shared.signal,
                        queued_batches = self.shared.metrics.queue_size.get(),
                        "shutdown timeout reached with data still queued; dropping it");
                    // Workers abandon what they hold and count the rest of the queue as dropped.
                    self.shared.hard_stop.cancel();
                    while workers.join_next().await.is_some() {}
                    break;
                }
            }
        }
        self.shared.hard_stop.cancel();
        self.shared.metrics.shutdown_dropped.get() - before
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
        let q = QueueSettings { enabled: true, num_consumers: 1, queue_size: 2 };
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
        let q = QueueSettings { enabled: true, num_consumers: 1, queue_size: 10 };
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
}
