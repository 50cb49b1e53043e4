//! Processor `batch`: groups items into batches by size or time before they go downstream.
//!
//! Data is accepted into a buffer; when the buffer holds `send_batch_size` items it is sent at
//! once (split at `send_batch_max_size`), otherwise after `timeout`. Unlike otelcol's batch
//! processor it never drops what it accepted: when downstream refuses (a full exporter queue),
//! the batch goes back to the front of the buffer and is retried on the next tick, and new
//! data is refused (retryable) only while the buffer is over its cap.
//!
//! With `metadata_keys` (otelcol's), data is batched separately per distinct combination of
//! those client-metadata values (from receivers with `include_metadata: true`), at most
//! `metadata_cardinality_limit` combinations at once (default 1000; data of a new combination
//! beyond it is refused), and each batch is sent inside a client scope holding those values, so
//! `headers_setter` can still forward a tenant header after batching.

use async_trait::async_trait;
use inferwatch_core::auth::ClientInfo;
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::telemetry::ProcessorMetrics;
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Settings of `batch` (otelcol's keys and defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Items that trigger sending a batch at once (default 8192).
    pub send_batch_size: usize,
    /// Upper bound of one batch; 0 = no bound (default 0).
    pub send_batch_max_size: usize,
    /// Longest time an item waits before its batch is sent (default 200ms; 0 = send at once).
    pub timeout: GoDuration,
    /// Client-metadata keys whose values keep batches apart (case-insensitive; default none).
    pub metadata_keys: Vec<String>,
    /// Most distinct metadata value combinations batched at once (default 1000).
    pub metadata_cardinality_limit: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            send_batch_size: 8192,
            send_batch_max_size: 0,
            timeout: GoDuration(Duration::from_millis(200)),
            metadata_keys: Vec::new(),
            metadata_cardinality_limit: 1000,
        }
    }
}

impl BatchConfig {
    fn check(&self) -> Result<(), FieldError> {
        if self.send_batch_max_size > 0 && self.send_batch_max_size < self.send_batch_size {
            return Err(FieldError::at(
                "send_batch_max_size",
                "must be greater than or equal to send_batch_size (or 0 for no limit)",
            ));
        }
        for (i, k) in self.metadata_keys.iter().enumerate() {
            if http::HeaderName::try_from(k.to_ascii_lowercase()).is_err() {
                return Err(FieldError {
                    path: vec![
                        inferwatch_core::component::PathSeg::Key("metadata_keys".into()),
                        inferwatch_core::component::PathSeg::Index(i),
                    ],
                    message: format!("{k:?} is not a valid metadata (header) name"),
                });
            }
        }
        if !self.metadata_keys.is_empty() && self.metadata_cardinality_limit == 0 {
            return Err(FieldError::at("metadata_cardinality_limit", "must be at least 1 with metadata_keys"));
        }
        Ok(())
    }

    /// Items buffered at most before new data is refused.
    fn hold_cap(&self) -> usize {
        self.send_batch_size.max(self.send_batch_max_size).max(1).saturating_mul(4)
    }
}

/// Factory of `batch`.
pub struct BatchFactory;

impl ProcessorFactory for BatchFactory {
    fn type_name(&self) -> &'static str {
        "batch"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        let config: BatchConfig = parse_config(cfg)?;
        config.check()?;
        Ok(Arc::new(config))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let config = inferwatch_core::component::typed::<BatchConfig>(parsed)?.clone();
        Ok(Arc::new(Batch::new(config, signal, next, ctx.telemetry.processor(&ctx.id, signal), ctx.id.to_string())))
    }
}

struct Buffer {
    pending: Payload,
    items: usize,
    /// When the oldest buffered item arrived.
    since: Option<Instant>,
    /// The client scope its batches are sent in (`metadata_keys` only).
    client: Option<Arc<ClientInfo>>,
}

/// The values of the `metadata_keys`, in order: one partition of the buffer each.
type PartKey = Vec<Vec<String>>;

/// The buffer, one partition per metadata value combination (one partition without
/// `metadata_keys`).
#[derive(Default)]
struct Buffers {
    parts: HashMap<PartKey, Buffer>,
    /// Items over all partitions.
    items: usize,
}

/// Which partitions a flush takes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    /// Those holding at least `send_batch_size` items.
    Full,
    /// Those whose oldest item waited `timeout` (everything in them).
    Due,
    /// Everything.
    All,
}

/// The running processor.
pub struct Batch {
    inner: Arc<Inner>,
    stop: CancellationToken,
    timer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// State shared by the processor and its timer task.
struct Inner {
    config: BatchConfig,
    signal: Signal,
    name: String,
    next: ConsumerRef,
    buf: Mutex<Buffers>,
    metrics: ProcessorMetrics,
    /// Items taken from the buffer and being sent.
    in_flight: std::sync::atomic::AtomicUsize,
}

/// Outcome of one flush attempt.
enum Flush {
    /// Everything taken was delivered (or permanently rejected and counted).
    Done,
    /// Downstream refused; the rest was put back.
    Refused,
}

impl Batch {
    /// Builds a batch processor in front of `next`.
    pub fn new(
        config: BatchConfig,
        signal: Signal,
        next: ConsumerRef,
        metrics: ProcessorMetrics,
        name: String,
    ) -> Self {
        let inner = Inner {
            config,
            signal,
            name,
            next,
            buf: Mutex::new(Buffers::default()),
            metrics,
            in_flight: std::sync::atomic::AtomicUsize::new(0),
        };
        Batch { inner: Arc::new(inner), stop: CancellationToken::new(), timer: Mutex::new(None) }
    }
}

impl Inner {
    fn max_size(&self) -> usize {
        if self.config.send_batch_max_size > 0 { self.config.send_batch_max_size } else { usize::MAX }
    }

    /// Takes up to one batch from a partition that `mode` selects.
    fn take_batch(&self, mode: Take) -> Option<(PartKey, Payload, Option<Arc<ClientInfo>>)> {
        let mut bufs = self.buf.lock();
        let (size, timeout) = (self.config.send_batch_size, self.config.timeout.0);
        let key = bufs
            .parts
            .iter()
            .find(|(_, b)| {
                b.items > 0
                    && match mode {
                        Take::Full => b.items >= size,
                        Take::Due => b.since.is_some_and(|s| s.elapsed() >= timeout),
                        Take::All => true,
                    }
            })
            .map(|(k, _)| k.clone())?;
        let max = self.max_size();
        let b = bufs.parts.get_mut(&key)?;
        let take = b.items.min(max);
        let client = b.client.clone();
        let (batch, emptied) = if take >= b.items {
            (std::mem::replace(&mut b.pending, Payload::empty(self.signal)), true)
        } else {
            let part = b.pending.split_off_front(take);
            b.items = b.pending.item_count();
            (part, false)
        };
        if emptied {
            bufs.parts.remove(&key);
        }
        bufs.items = bufs.items.saturating_sub(batch.item_count());
        Some((key, batch, client))
    }

    /// Puts a refused batch back at the front of its partition.
    fn put_back(&self, key: PartKey, mut batch: Payload, client: Option<Arc<ClientInfo>>) {
        let mut bufs = self.buf.lock();
        let n = batch.item_count();
        let b = bufs.parts.entry(key).or_insert_with(|| Buffer {
            pending: Payload::empty(self.signal),
            items: 0,
            since: None,
            client,
        });
        let rest = std::mem::replace(&mut b.pending, Payload::empty(self.signal));
        // Same signal by construction, so append cannot fail; keep both halves regardless.
        if let Err(rest) = batch.append(rest) {
            tracing::error!(processor = %self.name, "signal mismatch in batch buffer");
            let _ = batch.append(rest);
        }
        b.items = batch.item_count();
        b.pending = batch;
        b.since.get_or_insert_with(Instant::now);
        bufs.items += n;
    }

    /// Sends batches while a partition is selected by `mode`.
    async fn flush(&self, mode: Take) -> Flush {
        while let Some((key, batch, client)) = self.take_batch(mode) {
            let n = batch.item_count();
            self.in_flight.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            // Without metadata_keys a batch mixes clients: it goes out as nobody's (as in otelcol),
            // not in the scope of whichever caller happened to fill it.
            let scope = client.clone().unwrap_or_default();
            // The batch was acknowledged to its senders already: a full queue downstream refuses
            // it without counting it in enqueue_failed again at every tick it is offered.
            let offer = ClientInfo::scope(scope, self.next.consume(batch.clone()));
            let result = inferwatch_core::exporterhelper::offer_held(offer).await;
            self.in_flight.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
            match result {
                Ok(()) => {}
                Err(ConsumeError::Permanent(msg)) => {
                    self.metrics.dropped.inc_by(n as u64);
                    tracing::error!(processor = %self.name, items = n, error = %msg, "downstream rejected a batch permanently; dropped");
                }
                Err(ConsumeError::Refused { reason: RefuseReason::PartiallyAccepted, message, .. }) => {
                    // Some exporters took it; the ones that refused counted it as enqueue_failed.
                    // Sending it again would duplicate it at the ones that took it.
                    tracing::warn!(processor = %self.name, items = n, error = %message,
                        "some exporters refused a batch that others accepted; not re-sending it");
                }
                Err(ConsumeError::Refused { .. }) => {
                    self.put_back(key, batch, client);
                    return Flush::Refused;
                }
            }
        }
        Flush::Done
    }

    async fn tick(&self) {
        let _ = self.flush(Take::Due).await;
    }

    /// The partition of the current client's data and the scope its batches go out in.
    fn partition(&self) -> (PartKey, Option<Arc<ClientInfo>>) {
        ClientInfo::partition(&self.config.metadata_keys, ClientInfo::current().as_deref())
    }
}

#[async_trait]
impl Consumer for Batch {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let me = &self.inner;
        let n = data.item_count();
        if n == 0 {
            return Ok(());
        }
        let (key, client) = me.partition();
        {
            let mut bufs = me.buf.lock();
            if bufs.items > 0 && bufs.items + n > me.config.hold_cap() {
                drop(bufs);
                me.metrics.refused.inc_by(n as u64);
                return Err(ConsumeError::refused(
                    RefuseReason::QueueFull,
                    Some(Duration::from_secs(1)),
                    format!("batch processor {} buffer is full (downstream is not keeping up)", me.name),
                ));
            }
            if !me.config.metadata_keys.is_empty()
                && !bufs.parts.contains_key(&key)
                && bufs.parts.len() >= me.config.metadata_cardinality_limit
            {
                drop(bufs);
                me.metrics.refused.inc_by(n as u64);
                return Err(ConsumeError::Permanent(format!(
                    "batch processor {}: too many batcher metadata-value combinations (metadata_cardinality_limit {})",
                    me.name, me.config.metadata_cardinality_limit
                )));
            }
            let signal = me.signal;
            let b = bufs.parts.entry(key).or_insert_with(|| Buffer {
                pending: Payload::empty(signal),
                items: 0,
                since: None,
                client,
            });
            if let Err(other) = b.pending.append(data) {
                let empty = b.items == 0;
                if empty {
                    bufs.parts.retain(|_, b| b.items > 0);
                }
                return Err(ConsumeError::Permanent(format!("expected {} data, got {}", me.signal, other.signal())));
            }
            b.items += n;
            b.since.get_or_insert_with(Instant::now);
            bufs.items += n;
        }
        // Accepted. Send now if the buffer is full enough (or batching by time is off);
        // a refusal keeps the data buffered for the timer to retry.
        let _ = me.flush(if me.config.timeout.0.is_zero() { Take::All } else { Take::Full }).await;
        Ok(())
    }
}

#[async_trait]
impl Node for Batch {
    async fn start(&self) -> Result<(), ComponentError> {
        let t = self.inner.config.timeout.0;
        let period = if t.is_zero() { Duration::from_millis(100) } else { (t / 4).max(Duration::from_millis(1)) };
        let (inner, stop) = (self.inner.clone(), self.stop.clone());
        let h = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => inner.tick().await,
                    _ = stop.cancelled() => break,
                }
            }
        });
        *self.timer.lock() = Some(h);
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        self.stop.cancel();
        let timer = self.timer.lock().take();
        if let Some(mut h) = timer {
            // The timer may be in a flush to a slow downstream: let it finish by the deadline, else
            // abandon it (its batch stays counted in `in_flight`).
            if tokio::time::timeout_at(deadline.into(), &mut h).await.is_err() {
                h.abort();
            }
        }
        let me = &self.inner;
        let drain = async {
            loop {
                match me.flush(Take::All).await {
                    Flush::Done => return,
                    Flush::Refused => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        };
        if tokio::time::timeout_at(deadline.into(), drain).await.is_ok() {
            return 0;
        }
        // What is still buffered plus what an abandoned send held.
        let left = (me.buf.lock().items + me.in_flight.load(std::sync::atomic::Ordering::SeqCst)) as u64;
        me.metrics.dropped.inc_by(left);
        tracing::warn!(processor = %me.name, items = left, "shutdown timeout: batch buffer not delivered");
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::ComponentId;
    use inferwatch_core::telemetry::Telemetry;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use std::sync::atomic::{AtomicBool, Ordering};

    fn spans(from: usize, n: usize) -> Payload {
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: (from..from + n).map(|i| Span { name: i.to_string(), ..Default::default() }).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    fn names(p: &Payload) -> Vec<usize> {
        let Payload::Traces(r) = p else { return vec![] };
        r.resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .filter_map(|s| s.name.parse().ok())
            .collect()
    }

    /// Collects batches; refuses while `refuse` is set.
    #[derive(Default)]
    struct Sink {
        got: Mutex<Vec<Payload>>,
        refuse: AtomicBool,
        notify: tokio::sync::Notify,
    }
    #[async_trait]
    impl Consumer for Sink {
        async fn consume(&self, d: Payload) -> Result<(), ConsumeError> {
            if self.refuse.load(Ordering::SeqCst) {
                return Err(ConsumeError::refused(RefuseReason::QueueFull, None, "full"));
            }
            self.got.lock().push(d);
            self.notify.notify_waiters();
            Ok(())
        }
    }

    fn batch(cfg: BatchConfig, sink: Arc<Sink>) -> Batch {
        let t = Telemetry::new();
        let id = ComponentId::parse("batch").unwrap();
        Batch::new(cfg, Signal::Traces, sink, t.processor(&id, Signal::Traces), "batch".into())
    }

    #[tokio::test]
    async fn sends_full_batches_split_at_max() {
        let sink = Arc::new(Sink::default());
        let cfg = BatchConfig {
            send_batch_size: 10,
            send_batch_max_size: 15,
            timeout: GoDuration(Duration::from_secs(3600)),
            ..Default::default()
        };
        let b = batch(cfg, sink.clone());
        b.consume(spans(0, 6)).await.unwrap();
        assert!(sink.got.lock().is_empty());
        b.consume(spans(6, 30)).await.unwrap();
        let got = sink.got.lock().clone();
        let sizes: Vec<usize> = got.iter().map(Payload::item_count).collect();
        assert_eq!(sizes, vec![15, 15]);
        assert_eq!(b.shutdown(Instant::now() + Duration::from_secs(1)).await, 0);
        let all: Vec<usize> = sink.got.lock().iter().flat_map(names).collect();
        assert_eq!(all, (0..36).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn timeout_flushes_partial_batch() {
        let sink = Arc::new(Sink::default());
        let cfg = BatchConfig {
            send_batch_size: 1000,
            send_batch_max_size: 0,
            timeout: GoDuration(Duration::from_millis(20)),
            ..Default::default()
        };
        let b = batch(cfg, sink.clone());
        b.start().await.unwrap();
        let waiter = sink.notify.notified();
        b.consume(spans(0, 3)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap();
        assert_eq!(sink.got.lock()[0].item_count(), 3);
        b.shutdown(Instant::now() + Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn refusal_keeps_data_then_refuses_new_data_when_full() {
        let sink = Arc::new(Sink::default());
        sink.refuse.store(true, Ordering::SeqCst);
        let cfg = BatchConfig {
            send_batch_size: 10,
            send_batch_max_size: 0,
            timeout: GoDuration(Duration::from_secs(3600)),
            ..Default::default()
        };
        let b = batch(cfg, sink.clone());
        // hold cap is 40 items: accepted while buffered, then refused.
        for i in 0..4 {
            b.consume(spans(i * 10, 10)).await.unwrap();
        }
        let e = b.consume(spans(40, 10)).await.unwrap_err();
        assert!(e.is_retryable());
        sink.refuse.store(false, Ordering::SeqCst);
        assert_eq!(b.shutdown(Instant::now() + Duration::from_secs(1)).await, 0);
        let all: Vec<usize> = sink.got.lock().iter().flat_map(names).collect();
        assert_eq!(all, (0..40).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn shutdown_counts_what_cannot_be_delivered() {
        let sink = Arc::new(Sink::default());
        sink.refuse.store(true, Ordering::SeqCst);
        let b = batch(BatchConfig::default(), sink);
        b.consume(spans(0, 5)).await.unwrap();
        assert_eq!(b.shutdown(Instant::now() + Duration::from_millis(100)).await, 5);
    }

    /// Accepts at one branch and refuses at another (a fan-out with one full exporter queue).
    #[derive(Default)]
    struct Partial {
        calls: std::sync::atomic::AtomicUsize,
    }
    #[async_trait]
    impl Consumer for Partial {
        async fn consume(&self, _d: Payload) -> Result<(), ConsumeError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Err(ConsumeError::refused(RefuseReason::PartiallyAccepted, None, "1 of 2 accepted"))
        }
    }

    #[tokio::test]
    async fn partially_accepted_batches_are_not_sent_again() {
        let sink = Arc::new(Partial::default());
        let t = Telemetry::new();
        let id = ComponentId::parse("batch").unwrap();
        let cfg = BatchConfig {
            send_batch_size: 10,
            send_batch_max_size: 0,
            timeout: GoDuration(Duration::from_secs(3600)),
            ..Default::default()
        };
        let b = Batch::new(cfg, Signal::Traces, sink.clone(), t.processor(&id, Signal::Traces), "batch".into());
        b.consume(spans(0, 10)).await.unwrap();
        b.consume(spans(10, 10)).await.unwrap();
        assert_eq!(b.shutdown(Instant::now() + Duration::from_secs(1)).await, 0);
        assert_eq!(sink.calls.load(Ordering::SeqCst), 2, "one send per batch, no re-sends");
    }

    /// Never answers (a downstream that hangs with no queue in between).
    struct Hang;
    #[async_trait]
    impl Consumer for Hang {
        async fn consume(&self, _d: Payload) -> Result<(), ConsumeError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn shutdown_keeps_its_deadline_when_downstream_hangs() {
        let t = Telemetry::new();
        let id = ComponentId::parse("batch").unwrap();
        let b = Batch::new(
            BatchConfig::default(),
            Signal::Traces,
            Arc::new(Hang),
            t.processor(&id, Signal::Traces),
            "b".into(),
        );
        b.consume(spans(0, 7)).await.unwrap();
        let started = Instant::now();
        let lost = b.shutdown(Instant::now() + Duration::from_millis(200)).await;
        assert_eq!(lost, 7);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// Records each batch with the `x-tenant` of the client scope it arrived in.
    #[derive(Default)]
    struct TenantSink {
        got: Mutex<Vec<(Vec<String>, Vec<usize>)>>,
    }
    #[async_trait]
    impl Consumer for TenantSink {
        async fn consume(&self, d: Payload) -> Result<(), ConsumeError> {
            let tenant = ClientInfo::current().map(|c| c.metadata_values("x-tenant")).unwrap_or_default();
            self.got.lock().push((tenant, names(&d)));
            Ok(())
        }
    }

    fn tenant(t: &'static str) -> Arc<ClientInfo> {
        let mut md = http::HeaderMap::new();
        md.insert("x-tenant", http::HeaderValue::from_static(t));
        md.insert("x-other", http::HeaderValue::from_static("dropped"));
        Arc::new(ClientInfo { metadata: md, ..Default::default() })
    }

    #[tokio::test]
    async fn metadata_keys_keep_tenants_apart_and_restore_their_scope() {
        let sink = Arc::new(TenantSink::default());
        let t = Telemetry::new();
        let id = ComponentId::parse("batch").unwrap();
        let cfg = BatchConfig {
            send_batch_size: 4,
            timeout: GoDuration(Duration::from_secs(3600)),
            metadata_keys: vec!["X-Tenant".into()],
            metadata_cardinality_limit: 2,
            ..Default::default()
        };
        let b = Batch::new(cfg, Signal::Traces, sink.clone(), t.processor(&id, Signal::Traces), "batch".into());
        ClientInfo::scope(tenant("a"), b.consume(spans(0, 2))).await.unwrap();
        ClientInfo::scope(tenant("b"), b.consume(spans(100, 2))).await.unwrap();
        ClientInfo::scope(tenant("a"), b.consume(spans(2, 2))).await.unwrap();
        // Tenant a reached 4 items and went out alone, in its own scope.
        assert_eq!(sink.got.lock().clone(), vec![(vec!["a".to_string()], vec![0, 1, 2, 3])]);
        // A third combination is over metadata_cardinality_limit: refused, counted.
        let e = ClientInfo::scope(tenant("c"), b.consume(spans(200, 1))).await;
        assert!(e.is_ok(), "a's partition was emptied, so c fits: {e:?}");
        let e = ClientInfo::scope(tenant("d"), b.consume(spans(300, 1))).await.unwrap_err();
        assert!(e.to_string().contains("metadata_cardinality_limit"), "{e}");
        assert_eq!(t.processor(&id, Signal::Traces).refused.get(), 1);
        assert_eq!(b.shutdown(Instant::now() + Duration::from_secs(1)).await, 0);
        let mut got = sink.got.lock().clone();
        got.sort();
        assert_eq!(
            got,
            vec![
                (vec!["a".to_string()], vec![0, 1, 2, 3]),
                (vec!["b".to_string()], vec![100, 101]),
                (vec!["c".to_string()], vec![200]),
            ]
        );
    }

    #[tokio::test]
    async fn without_metadata_keys_batches_go_out_without_a_client() {
        let sink = Arc::new(TenantSink::default());
        let cfg =
            BatchConfig { send_batch_size: 4, timeout: GoDuration(Duration::from_secs(3600)), ..Default::default() };
        let t = Telemetry::new();
        let id = ComponentId::parse("batch").unwrap();
        let b = Batch::new(cfg, Signal::Traces, sink.clone(), t.processor(&id, Signal::Traces), "batch".into());
        ClientInfo::scope(tenant("a"), b.consume(spans(0, 2))).await.unwrap();
        ClientInfo::scope(tenant("b"), b.consume(spans(2, 2))).await.unwrap();
        assert_eq!(sink.got.lock().clone(), vec![(Vec::<String>::new(), vec![0, 1, 2, 3])]);
    }

    #[test]
    fn bad_metadata_keys_are_rejected() {
        let e = BatchFactory.validate(&serde_json::json!({"metadata_keys": ["ok", "bad key"]})).unwrap_err();
        assert_eq!(e.path.last(), Some(&inferwatch_core::component::PathSeg::Index(1)));
        assert!(
            BatchFactory
                .validate(&serde_json::json!({"metadata_keys": ["a"], "metadata_cardinality_limit": 0}))
                .is_err()
        );
    }

    #[test]
    fn max_below_size_is_rejected() {
        let e =
            BatchFactory.validate(&serde_json::json!({"send_batch_size": 100, "send_batch_max_size": 10})).unwrap_err();
        assert_eq!(e.path, vec![inferwatch_core::component::PathSeg::Key("send_batch_max_size".into())]);
    }
}
