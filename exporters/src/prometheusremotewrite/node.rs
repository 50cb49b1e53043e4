//! The exporter node: delta → cumulative preparation in arrival order, then the queued sender.

use crate::prometheus::cumulative::DeltaToCumulative;
use crate::prometheus::unix_now_ns;
use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, Node, NodeRef};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::Payload;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use std::time::Instant;

/// The exporter node: prepares each payload (delta → cumulative) in arrival order, then hands
/// it to the queued sender.
pub struct RemoteWriteExporter {
    pub(super) name: String,
    pub(super) delta: Mutex<DeltaToCumulative>,
    /// Held while a payload is prepared and queued, so queue order is preparation order.
    pub(super) order: tokio::sync::Mutex<()>,
    pub(super) inner: NodeRef,
    pub(super) dropped: Counter,
}

#[async_trait]
impl Consumer for RemoteWriteExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let mut req = match data.into_decoded() {
            Ok(Payload::Metrics(r)) => r,
            Ok(other) => {
                return Err(ConsumeError::Permanent(format!(
                    "exporter {} takes metrics, got {}",
                    self.name,
                    other.signal()
                )));
            }
            Err(e) => {
                return Err(ConsumeError::Permanent(format!("exporter {}: cannot decode the payload: {e}", self.name)));
            }
        };
        let _order = self.order.lock().await;
        let (removed, undo) = self.delta.lock().normalize(&mut req, Instant::now(), unix_now_ns());
        let result = self.inner.consume(Payload::Metrics(req)).await;
        match &result {
            // Nothing of it was kept and the sender will offer it again: forget its deltas.
            Err(e) if e.is_retryable() => self.delta.lock().undo(undo),
            _ => {
                if removed.total() > 0 {
                    self.dropped.inc_by(removed.total());
                    tracing::debug!(exporter = %self.name, invalid = removed.invalid, out_of_order = removed.stale,
                        over_limit = removed.over_limit, "prometheusremotewrite dropped points it cannot send");
                }
            }
        }
        result
    }
}

#[async_trait]
impl Node for RemoteWriteExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.inner.start().await
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        self.inner.shutdown(deadline).await
    }
}
