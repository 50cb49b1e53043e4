//! The [`ArrowProcessor`] harness: one processor created the way the pipeline creates it, fed
//! OTLP (converted to Arrow as the pipeline converts it) and read back as OTLP; and [`Sink`], a
//! consumer that keeps what a node emits.
//!
//! The method names leave `new`, `process` and `advance` free, so a test file can add its own
//! (on its own input and output types) with an extension trait on [`Harness`].

use crate::capture::wait_notified;
use async_trait::async_trait;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, RecordBatch, metrics, spans};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// One Arrow processor with its own telemetry, under id `id`.
pub struct Harness<P: ?Sized + ArrowProcessor = dyn ArrowProcessor> {
    /// The processor (for `snapshot`, `restore` and the processor's own methods).
    pub proc: Box<P>,
    /// Its telemetry.
    pub telemetry: Arc<Telemetry>,
    /// Its component id.
    pub id: ComponentId,
}

impl Harness {
    /// Creates the processor from `factory` as id `id` (e.g. `"delta_ab/test"`) for `signal`;
    /// panics when the configuration is refused.
    pub fn create(factory: &dyn ArrowProcessorFactory, id: &str, cfg: &serde_json::Value, signal: Signal) -> Self {
        Harness::build(id, |ctx| {
            factory.create_arrow(ctx.clone(), cfg, signal).unwrap_or_else(|e| panic!("{id} refuses {cfg}: {e}"))
        })
    }
}

impl<P: ?Sized + ArrowProcessor> Harness<P> {
    /// A harness around the processor `make` builds from the create context of id `id`.
    pub fn build(id: &str, make: impl FnOnce(&CreateContext) -> Box<P>) -> Self {
        let telemetry = Arc::new(Telemetry::new());
        let id = ComponentId::parse(id).unwrap_or_else(|e| panic!("component id {id}: {e}"));
        let ctx = CreateContext::new(id.clone(), telemetry.clone());
        Harness { proc: make(&ctx), telemetry, id }
    }

    /// Processes one Arrow batch; returns the batches it emitted.
    pub fn process_batch(&mut self, batch: &RecordBatch) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        self.proc.process(batch, &mut out).expect("process");
        out
    }

    /// Processes a metrics request; returns what came out, as OTLP.
    pub fn process_metrics(&mut self, req: &ExportMetricsServiceRequest) -> Vec<ExportMetricsServiceRequest> {
        let out = self.process_batch(&metrics::to_batch(req).expect("metrics to Arrow"));
        from_batches(&out)
    }

    /// Processes a traces request; returns what came out (metrics), as OTLP.
    pub fn process_spans(&mut self, req: &ExportTraceServiceRequest) -> Vec<ExportMetricsServiceRequest> {
        let out = self.process_batch(&spans::to_batch(req).expect("spans to Arrow"));
        from_batches(&out)
    }

    /// Advances the watermark to `watermark_ns`; returns the batches emitted.
    pub fn advance_batches(&mut self, watermark_ns: u64) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        self.proc.advance(watermark_ns, &mut out).expect("advance");
        out
    }

    /// Advances the watermark to `watermark_ns`; returns what came out, as OTLP.
    pub fn advance_metrics(&mut self, watermark_ns: u64) -> Vec<ExportMetricsServiceRequest> {
        from_batches(&self.advance_batches(watermark_ns))
    }

    /// Advances the watermark, asserting that at most one derived batch came out.
    pub fn advance_one(&mut self, watermark_ns: u64) -> Vec<ExportMetricsServiceRequest> {
        let out = self.advance_metrics(watermark_ns);
        assert!(out.len() <= 1, "one derived batch per advance");
        out
    }

    /// Restores this processor's snapshot into `fresh` and returns it, asserting that the restored
    /// processor holds as many series and snapshots to the same bytes.
    pub fn restore_into(&self, mut fresh: Self) -> Self {
        let bytes = self.proc.snapshot().expect("snapshot");
        fresh.proc.restore(&bytes).expect("restore");
        assert_eq!(fresh.proc.series_count(), self.proc.series_count(), "the restored processor's series");
        assert_eq!(fresh.proc.snapshot().expect("snapshot"), bytes, "restore then snapshot gives the same bytes");
        fresh
    }

    /// The series this processor evicted for `reason`.
    pub fn evicted(&self, reason: &str) -> u64 {
        self.telemetry.series_evicted(&self.id, reason).get()
    }
}

/// Metrics batches back to OTLP.
pub fn from_batches(batches: &[RecordBatch]) -> Vec<ExportMetricsServiceRequest> {
    batches.iter().map(|b| metrics::from_batch(b).expect("metrics from Arrow")).collect()
}

/// A consumer that keeps every payload it accepts; it can refuse the next few first, and tests
/// can wait for what it has (woken by each payload, no polling sleeps).
#[derive(Default)]
pub struct Sink {
    got: Mutex<Vec<Payload>>,
    refuse: AtomicUsize,
    arrived: Notify,
}

impl Sink {
    /// A new, empty sink.
    pub fn new() -> Arc<Self> {
        Arc::new(Sink::default())
    }

    /// Refuses the next `n` payloads (queue full) before accepting again.
    pub fn refuse_next(&self, n: usize) {
        self.refuse.store(n, Ordering::SeqCst);
    }

    /// Takes every payload accepted so far.
    pub fn take(&self) -> Vec<Payload> {
        std::mem::take(&mut *self.got.lock())
    }

    /// A copy of every payload accepted so far.
    pub fn payloads(&self) -> Vec<Payload> {
        self.got.lock().clone()
    }

    /// How many payloads it has.
    pub fn len(&self) -> usize {
        self.got.lock().len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.got.lock().is_empty()
    }

    /// Every payload so far decoded as metrics; panics on another signal.
    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        let got = self.got.lock().clone();
        got.into_iter()
            .map(|p| match p.into_decoded().expect("a decodable payload") {
                Payload::Metrics(r) => r,
                other => panic!("not metrics: {:?}", other.signal()),
            })
            .collect()
    }

    /// Waits until `check` gives `Some` (checked now and after each payload that arrives) and
    /// returns it; fails the test after [`DEADLINE`](crate::capture::DEADLINE) naming `what`.
    pub async fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Sink) -> Option<T>) -> T {
        wait_notified(&self.arrived, what, || check(self)).await
    }

    /// Waits until `pred` holds over the metrics received so far (see [`Sink::wait_for`]).
    pub async fn wait_metrics(&self, what: &str, pred: impl Fn(&[ExportMetricsServiceRequest]) -> bool) {
        self.wait_for(what, |s| pred(&s.metrics()).then_some(())).await
    }
}

#[async_trait]
impl Consumer for Sink {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let refused = self.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if refused {
            return Err(ConsumeError::refused(RefuseReason::QueueFull, None, "full"));
        }
        self.got.lock().push(data);
        self.arrived.notify_waiters();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{gauge, metrics_request, point};
    use inferwatch_core::arrow::ConvError;
    use inferwatch_core::state::StateError;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;

    /// Echoes what it processes; emits the last batch again at watermark 10; its state is the
    /// number of batches seen.
    struct Echo {
        seen: usize,
        last: Option<RecordBatch>,
    }

    impl ArrowProcessor for Echo {
        fn needs(&self) -> inferwatch_core::arrow::Needs {
            inferwatch_core::arrow::Needs { signal: Signal::Metrics, columns: vec![] }
        }
        fn allowed_lateness_ns(&self) -> u64 {
            0
        }
        fn process(&mut self, b: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
            self.seen += 1;
            self.last = Some(b.clone());
            out.push(b.clone());
            Ok(())
        }
        fn advance(&mut self, wm: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
            if wm >= 10 {
                out.extend(self.last.take());
            }
            Ok(())
        }
        fn state_version(&self) -> u32 {
            1
        }
        fn snapshot(&self) -> Result<Vec<u8>, StateError> {
            Ok(vec![self.seen as u8])
        }
        fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
            self.seen = usize::from(bytes[0]);
            Ok(())
        }
        fn series_count(&self) -> usize {
            self.seen
        }
    }

    fn echo() -> Harness {
        Harness::build("echo/test", |_| Box::new(Echo { seen: 0, last: None }) as Box<dyn ArrowProcessor>)
    }

    #[test]
    fn harness_round_trips_otlp_through_arrow_and_restores() {
        let mut h = echo();
        assert_eq!(h.id.to_string(), "echo/test");
        let out = h.process_metrics(&req(2.5));
        assert_eq!(out.len(), 1);
        let pts = crate::otlp::gauge_points(&out[0]);
        assert_eq!((pts.len(), pts[0].value, pts[0].time), (1, 2.5, 1));
        assert!(h.advance_one(5).is_empty(), "nothing before watermark 10");
        assert_eq!(h.advance_metrics(10).len(), 1);
        h.process_metrics(&req(1.0));
        let restored = h.restore_into(echo());
        assert_eq!(restored.proc.series_count(), 2);
        assert_eq!(h.evicted("idle"), 0);
    }

    fn req(v: f64) -> ExportMetricsServiceRequest {
        metrics_request(vec![], None, vec![gauge("g", "1", vec![point(vec![], 1, v)])])
    }

    #[tokio::test]
    async fn sink_refuses_then_keeps_and_wakes_a_waiter() {
        let sink = Sink::new();
        sink.refuse_next(1);
        assert!(sink.consume(Payload::Metrics(req(1.0))).await.is_err(), "the first is refused");
        let waiter = {
            let sink = sink.clone();
            tokio::spawn(async move { sink.wait_metrics("two requests", |r| r.len() == 2).await })
        };
        sink.consume(Payload::Metrics(req(2.0))).await.unwrap();
        sink.consume(Payload::Metrics(req(3.0))).await.unwrap();
        waiter.await.unwrap();
        assert_eq!(sink.metrics(), vec![req(2.0), req(3.0)]);
        assert_eq!(sink.take().len(), 2);
        assert!(sink.is_empty());
    }

    #[tokio::test]
    #[should_panic(expected = "not metrics")]
    async fn sink_metrics_refuses_other_signals() {
        let sink = Sink::new();
        sink.consume(Payload::Logs(ExportLogsServiceRequest::default())).await.unwrap();
        sink.metrics();
    }
}
