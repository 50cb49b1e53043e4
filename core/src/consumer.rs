//! The consumer contract every pipeline stage implements, its errors and the fan-out consumer.

use crate::pdata::Payload;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// Why a stage refused data it could not take now; the sender should retry later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The memory limiter is above its soft limit.
    MemoryLimit,
    /// A bounded queue or buffer is full.
    QueueFull,
    /// The pipeline is shutting down.
    ShuttingDown,
    /// A downstream component failed transiently.
    Downstream,
    /// Some branches of a fan-out took the data and others refused it (and counted it).
    PartiallyAccepted,
}

/// Error returned by [`Consumer::consume`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsumeError {
    /// Data not accepted now; retrying later may succeed. Nothing of it was kept.
    #[error("data refused ({reason:?}): {message}")]
    Refused {
        /// The cause of the refusal.
        reason: RefuseReason,
        /// Suggested delay before retrying.
        retry_after: Option<Duration>,
        /// Human-readable detail.
        message: String,
    },
    /// Data can never be accepted (malformed, rejected by a permanent rule).
    #[error("permanent error: {0}")]
    Permanent(String),
}

impl ConsumeError {
    /// Builds a refusal.
    pub fn refused(reason: RefuseReason, retry_after: Option<Duration>, message: impl Into<String>) -> Self {
        ConsumeError::Refused { reason, retry_after, message: message.into() }
    }

    /// True for errors a sender may retry.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ConsumeError::Refused { .. })
    }
}

/// A stage that takes payloads: a processor, an exporter, a connector or a fan-out.
#[async_trait]
pub trait Consumer: Send + Sync + 'static {
    /// Takes ownership of `data`. `Ok` means the data was accepted and will be delivered or
    /// counted as dropped; `Err` means none of it was kept.
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError>;

    /// Like [`Consumer::consume`], with the Arrow form of `data` when an Arrow stage already
    /// converted it (full schema), so an Arrow consumer downstream need not convert it again.
    /// Consumers that do not work on Arrow ignore it.
    async fn consume_with_batch(
        &self,
        data: Payload,
        batch: Option<arrow_array::RecordBatch>,
    ) -> Result<(), ConsumeError> {
        let _ = batch;
        self.consume(data).await
    }
}

/// Shared handle to a consumer.
pub type ConsumerRef = Arc<dyn Consumer>;

/// Sends each payload to several consumers (otelcol's fan-out).
///
/// Every consumer gets the data even when an earlier one refuses it; the first error is
/// returned so the sender retries (the consumers that accepted may then see the data twice,
/// as in otelcol: at-least-once).
pub struct Fanout {
    consumers: Vec<ConsumerRef>,
}

impl Fanout {
    /// Builds a fan-out; with one consumer, use it directly instead.
    pub fn new(consumers: Vec<ConsumerRef>) -> Self {
        Fanout { consumers }
    }

    /// Returns a single consumer for a list: the consumer itself when there is one.
    pub fn wrap(mut consumers: Vec<ConsumerRef>) -> ConsumerRef {
        if consumers.len() == 1
            && let Some(c) = consumers.pop()
        {
            return c;
        }
        Arc::new(Fanout::new(consumers))
    }
}

#[async_trait]
impl Consumer for Fanout {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.consume_with_batch(data, None).await
    }

    async fn consume_with_batch(
        &self,
        data: Payload,
        batch: Option<arrow_array::RecordBatch>,
    ) -> Result<(), ConsumeError> {
        let n = self.consumers.len();
        let mut first_err = None;
        let mut accepted = 0usize;
        let mut data = Some(data);
        for (i, c) in self.consumers.iter().enumerate() {
            let item = if i + 1 == n { data.take() } else { data.clone() };
            let Some(item) = item else { break };
            let r = c.consume_with_batch(item, batch.clone()).await;
            if r.is_ok() {
                accepted += 1;
            }
            if let Err(e) = r {
                // Permanent errors win over refusals only if no refusal was seen: a retry can help.
                match (&first_err, &e) {
                    (None, _) => first_err = Some(e),
                    (Some(ConsumeError::Permanent(_)), ConsumeError::Refused { .. }) => first_err = Some(e),
                    _ => {}
                }
            }
        }
        match first_err {
            // Some branches took the data: say so, so that a stage holding data (batch) does not
            // send it to those branches again; a receiver still asks its client to retry.
            Some(ConsumeError::Refused { retry_after, message, .. }) if accepted > 0 => Err(ConsumeError::Refused {
                reason: RefuseReason::PartiallyAccepted,
                retry_after,
                message: format!("{accepted} of {n} destinations accepted; {message}"),
            }),
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdata::Signal;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize, Option<ConsumeError>);
    #[async_trait]
    impl Consumer for Count {
        async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            match &self.1 {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }
        }
    }

    #[tokio::test]
    async fn fanout_delivers_to_all_and_reports_refusal() {
        let ok = Arc::new(Count(AtomicUsize::new(0), None));
        let bad =
            Arc::new(Count(AtomicUsize::new(0), Some(ConsumeError::refused(RefuseReason::QueueFull, None, "full"))));
        let f = Fanout::new(vec![bad.clone(), ok.clone()]);
        let r = f.consume(Payload::empty(Signal::Traces)).await;
        assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::PartiallyAccepted, .. })));
        assert_eq!(ok.0.load(Ordering::SeqCst), 1);
        assert_eq!(bad.0.load(Ordering::SeqCst), 1);
    }
}
