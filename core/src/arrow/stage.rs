//! The Arrow stage: runs a pipeline's adjacent Arrow processors over one conversion per batch.
//!
//! For each payload the stage converts once to Arrow (counted in
//! `inferwatch_arrow_conversions_total`; not at all when the sender hands the batch on with the
//! payload, [`Consumer::consume_with_batch`]), passes the payload on unchanged, removes late rows
//! (event time below the pipeline's watermark, counted in `inferwatch_arrow_late_items_total`),
//! hands the on-time rows to each processor in order (a processor also sees the derived
//! batches of the processors before it), advances the watermark to
//! `max event time seen − allowed_lateness` and lets every processor close what ends at or
//! before it, then sends the derived batches downstream as OTLP, converting each once there
//! (and handing a single derived batch on beside its OTLP form, which a downstream Arrow stage
//! or recording exporter uses instead of converting again). The watermark and the
//! processors' state are checkpointed through the host's state registry.

use super::{ArrowProcessor, ArrowProcessorFactory, RecordBatch};
use crate::component::{Node, NodeRef, Parsed};
use crate::consumer::{ConsumeError, Consumer, ConsumerRef};
use crate::host::CreateContext;
use crate::host::Host;
use crate::pdata::{Payload, Signal};
use crate::state::{Checkpoint, StateError};
use crate::telemetry::Telemetry;
use crate::vocab::{ComponentError, ComponentId};
use arrow_array::{Array, BooleanArray};
use async_trait::async_trait;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Version of the stage's checkpoint payload.
const STAGE_STATE_VERSION: u32 = 1;

/// Where a stage runs: its pipeline and the agent's shared services.
#[derive(Clone)]
pub struct StageContext {
    /// Pipeline id (`metrics`, `metrics/detect`).
    pub pipeline: String,
    /// Self-telemetry.
    pub telemetry: Arc<Telemetry>,
    /// Shared services (state registry).
    pub host: Arc<Host>,
}

struct Member {
    id: ComponentId,
    proc: Box<dyn ArrowProcessor>,
    derived: Counter,
    series: Gauge,
}

struct Inner {
    members: Vec<Member>,
    /// Largest event time seen (ns); 0 before any data.
    max_seen: u64,
    /// Current watermark (ns); 0 before any data.
    watermark: u64,
}

/// A running Arrow stage (one per run of adjacent Arrow processors in a pipeline).
pub struct ArrowStage {
    name: String,
    signal: Signal,
    /// Signal of the derived output (the input's signal, or a connector's output signal).
    out_signal: Signal,
    /// Processors pass their input on; connectors do not (their input stays in its pipeline).
    forward_input: bool,
    lateness_ns: u64,
    inner: Arc<Mutex<Inner>>,
    order: tokio::sync::Mutex<()>,
    next: ConsumerRef,
    /// The full schema of `signal`: a batch given with the input is used only when it has it.
    schema: arrow_schema::SchemaRef,
    conversions: Counter,
    late: Counter,
    dropped: Counter,
    host: Arc<Host>,
    stopping: AtomicBool,
}

/// Builds a stage holding one Arrow processor (what a processor factory's `create` returns;
/// the graph fuses adjacent Arrow processors of a pipeline into one stage instead).
pub fn build_single(
    ctx: CreateContext,
    factory: &dyn ArrowProcessorFactory,
    cfg: &serde_json::Value,
    signal: Signal,
    next: ConsumerRef,
) -> Result<NodeRef, ComponentError> {
    build_single_parsed(ctx, factory, &factory.parse_arrow(cfg)?, signal, next)
}

/// [`build_single`] from settings the factory's `parse_arrow` already returned.
pub fn build_single_parsed(
    ctx: CreateContext,
    factory: &dyn ArrowProcessorFactory,
    parsed: &Parsed,
    signal: Signal,
    next: ConsumerRef,
) -> Result<NodeRef, ComponentError> {
    let sctx = StageContext {
        pipeline: signal.as_str().to_string(),
        telemetry: ctx.telemetry.clone(),
        host: ctx.host.clone(),
    };
    let id = ctx.id.clone();
    let p = factory.build_arrow(ctx, parsed, signal)?;
    Ok(ArrowStage::build(sctx, vec![(id, p)], signal, next)?)
}

/// Builds a connector around one Arrow processor: it reads `from` data of the pipelines that
/// export to it and feeds only its derived `to` data to the pipelines that receive from it.
pub fn build_connector(
    ctx: CreateContext,
    factory: &dyn ArrowProcessorFactory,
    cfg: &serde_json::Value,
    from: Signal,
    to: Signal,
    next: ConsumerRef,
) -> Result<NodeRef, ComponentError> {
    build_connector_parsed(ctx, factory, &factory.parse_arrow(cfg)?, from, to, next)
}

/// [`build_connector`] from settings the factory's `parse_arrow` already returned.
pub fn build_connector_parsed(
    ctx: CreateContext,
    factory: &dyn ArrowProcessorFactory,
    parsed: &Parsed,
    from: Signal,
    to: Signal,
    next: ConsumerRef,
) -> Result<NodeRef, ComponentError> {
    let sctx = StageContext {
        pipeline: format!("{}->{}/{}", from.as_str(), to.as_str(), ctx.id),
        telemetry: ctx.telemetry.clone(),
        host: ctx.host.clone(),
    };
    let id = ctx.id.clone();
    let p = factory.build_arrow(ctx, parsed, from)?;
    Ok(ArrowStage::build_with(sctx, vec![(id, p)], from, to, false, next)?)
}

impl ArrowStage {
    /// Builds a stage over `processors` (in pipeline order) feeding `next`; registers its checkpoint.
    pub fn build(
        ctx: StageContext,
        processors: Vec<(ComponentId, Box<dyn ArrowProcessor>)>,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<Arc<ArrowStage>, ComponentError> {
        Self::build_with(ctx, processors, signal, signal, true, next)
    }

    /// Builds a stage reading `signal` and emitting `out_signal`; `forward_input` passes the input on.
    pub fn build_with(
        ctx: StageContext,
        processors: Vec<(ComponentId, Box<dyn ArrowProcessor>)>,
        signal: Signal,
        out_signal: Signal,
        forward_input: bool,
        next: ConsumerRef,
    ) -> Result<Arc<ArrowStage>, ComponentError> {
        let schema = match signal {
            Signal::Metrics => super::schema::metrics_schema(),
            Signal::Traces => super::schema::spans_schema(),
            Signal::Logs => {
                return Err(ComponentError::Start(
                    "Arrow processors cannot run in a logs pipeline (no Arrow schema)".into(),
                ));
            }
        };
        let mut lateness_ns = 0;
        let mut members = Vec::with_capacity(processors.len());
        for (id, proc) in processors {
            let needs = proc.needs();
            if needs.signal != signal {
                return Err(ComponentError::Start(format!(
                    "processor {id} reads {} but pipeline {} carries {signal}",
                    needs.signal, ctx.pipeline
                )));
            }
            if let Some(c) = needs.columns.iter().find(|c| schema.field_with_name(c).is_err()) {
                return Err(ComponentError::Start(format!(
                    "processor {id} needs column {c:?}, not in the {signal} schema"
                )));
            }
            lateness_ns = lateness_ns.max(proc.allowed_lateness_ns());
            members.push(Member {
                derived: ctx.telemetry.derived_points(&id),
                series: ctx.telemetry.series(&id, &ctx.pipeline),
                id,
                proc,
            });
        }
        let ids: Vec<String> = members.iter().map(|m| m.id.to_string()).collect();
        let name = format!("{}/{}", ctx.pipeline, ids.join("+"));
        let inner = Arc::new(Mutex::new(Inner { members, max_seen: 0, watermark: 0 }));
        ctx.host.state.register(Arc::new(StageCheckpoint { key: format!("stage/{name}"), inner: inner.clone() }));
        Ok(Arc::new(ArrowStage {
            schema,
            conversions: ctx.telemetry.arrow_conversions(&format!("stage {name}"), signal),
            late: ctx.telemetry.late_items(&ctx.pipeline),
            dropped: ctx
                .telemetry
                .processor(&ComponentId { type_name: "arrow_stage".into(), name: None }, signal)
                .dropped,
            name,
            signal,
            out_signal,
            forward_input,
            lateness_ns,
            inner,
            order: tokio::sync::Mutex::new(()),
            next,
            host: ctx.host,
            stopping: AtomicBool::new(false),
        }))
    }

    /// The pipeline watermark now (ns since the epoch; 0 before any data).
    pub fn watermark(&self) -> u64 {
        self.inner.lock().watermark
    }

    /// Runs the processors over one converted batch; returns the derived batches.
    fn run(&self, batch: &RecordBatch) -> Result<Vec<RecordBatch>, super::ConvError> {
        let times = super::time_column(batch)?;
        let mut inner = self.inner.lock();
        let wm = inner.watermark;
        let mut max_t = inner.max_seen;
        let mut late = 0usize;
        let mask: Vec<bool> = (0..times.len())
            .map(|i| {
                let t = if times.is_null(i) { 0 } else { times.value(i) as u64 };
                max_t = max_t.max(t);
                let on_time = t >= wm;
                if !on_time {
                    late += 1;
                }
                on_time
            })
            .collect();
        let on_time = if late == 0 {
            batch.clone()
        } else {
            self.late.inc_by(late as u64);
            arrow_select::filter::filter_record_batch(batch, &BooleanArray::from(mask))?
        };
        inner.max_seen = max_t;
        let new_wm = max_t.saturating_sub(self.lateness_ns);
        let advance = new_wm > inner.watermark;
        if advance {
            inner.watermark = new_wm;
        }
        let mut derived: Vec<RecordBatch> = Vec::new();
        for m in inner.members.iter_mut() {
            let mut out = Vec::new();
            if on_time.num_rows() > 0 {
                m.proc.process(&on_time, &mut out)?;
            }
            for d in &derived {
                if super::schema::signal_of(d.schema_ref()) == Some(self.signal) {
                    m.proc.process(d, &mut out)?;
                }
            }
            if advance {
                m.proc.advance(new_wm, &mut out)?;
            }
            m.derived.inc_by(out.iter().map(|b| b.num_rows() as u64).sum());
            m.series.set(m.proc.series_count() as i64);
            derived.extend(out);
        }
        Ok(derived)
    }

    /// Advances every processor to the end of time and returns what they emit.
    fn run_to_end(&self) -> Result<Vec<RecordBatch>, super::ConvError> {
        let mut inner = self.inner.lock();
        inner.watermark = u64::MAX;
        let mut derived: Vec<RecordBatch> = Vec::new();
        for m in inner.members.iter_mut() {
            let mut out = Vec::new();
            for d in &derived {
                if super::schema::signal_of(d.schema_ref()) == Some(self.signal) {
                    m.proc.process(d, &mut out)?;
                }
            }
            m.proc.advance(u64::MAX, &mut out)?;
            m.derived.inc_by(out.iter().map(|b| b.num_rows() as u64).sum());
            m.series.set(m.proc.series_count() as i64);
            derived.extend(out);
        }
        Ok(derived)
    }

    /// Sends derived batches downstream as one OTLP payload, retrying refusals.
    async fn send_derived(&self, derived: Vec<RecordBatch>) {
        let nonempty: Vec<&RecordBatch> = derived.iter().filter(|b| b.num_rows() > 0).collect();
        let single = match nonempty.as_slice() {
            [one] => Some((*one).clone()),
            _ => None,
        };
        let mut payload: Option<Payload> = None;
        for b in derived.iter().filter(|b| b.num_rows() > 0) {
            match super::batch_to_payload(b) {
                Ok(p) if p.signal() == self.out_signal => match payload.as_mut() {
                    None => payload = Some(p),
                    Some(acc) => {
                        if let Err(p) = acc.append(p) {
                            self.dropped.inc_by(p.item_count() as u64);
                        }
                    }
                },
                Ok(p) => {
                    tracing::warn!(stage = %self.name, signal = %p.signal(), "derived data of another signal dropped");
                    self.dropped.inc_by(p.item_count() as u64);
                }
                Err(e) => {
                    tracing::warn!(stage = %self.name, error = %e, "derived batch could not be converted; dropped");
                    self.dropped.inc_by(b.num_rows() as u64);
                }
            }
        }
        let Some(payload) = payload else { return };
        let mut backoff = Duration::from_millis(10);
        let mut first = true;
        loop {
            // Retries offer data this stage already holds: a full queue counts it once, not per retry.
            let offer = self.next.consume_with_batch(payload.clone(), single.clone());
            let result = if first { offer.await } else { crate::exporterhelper::offer_held(offer).await };
            first = false;
            match result {
                Ok(()) => return,
                Err(e) if e.is_retryable() && !self.stopping.load(Ordering::SeqCst) => {
                    let wait = match &e {
                        ConsumeError::Refused { retry_after: Some(d), .. } => *d,
                        _ => backoff,
                    };
                    tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(stage = %self.name, error = %e, items = payload.item_count(), "derived data dropped");
                    self.dropped.inc_by(payload.item_count() as u64);
                    return;
                }
            }
        }
    }

    async fn flush_to_end(&self) {
        let _order = self.order.lock().await;
        match self.run_to_end() {
            Ok(derived) => self.send_derived(derived).await,
            Err(e) => tracing::warn!(stage = %self.name, error = %e, "flushing Arrow processors failed"),
        }
    }
}

#[async_trait]
impl Consumer for ArrowStage {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.consume_with_batch(data, None).await
    }

    /// Uses `given` (the Arrow form of `data`, e.g. a connector stage's derived batch) when it
    /// has this stage's full schema; converts `data` otherwise (counted).
    async fn consume_with_batch(&self, data: Payload, given: Option<RecordBatch>) -> Result<(), ConsumeError> {
        let _order = self.order.lock().await;
        let given = given.filter(|b| b.schema_ref() == &self.schema || *b.schema() == *self.schema);
        let batch = match given {
            Some(b) => Some(b),
            None => match super::payload_to_batch(&data) {
                Ok(b) => {
                    self.conversions.inc();
                    Some(b)
                }
                Err(e) => {
                    tracing::warn!(stage = %self.name, error = %e, "payload not convertible to Arrow; passed on unprocessed");
                    None
                }
            },
        };
        // The input goes on first and unchanged; state changes only once it was accepted, so a
        // refusal (and the sender's retry) never counts the same data twice.
        if self.forward_input {
            self.next.consume_with_batch(data, batch.clone()).await?;
        }
        let Some(batch) = batch else { return Ok(()) };
        match self.run(&batch) {
            Ok(derived) => self.send_derived(derived).await,
            Err(e) => tracing::warn!(stage = %self.name, error = %e, "Arrow processors failed on a batch"),
        }
        Ok(())
    }
}

#[async_trait]
impl Node for ArrowStage {
    async fn end_of_input(&self) {
        self.flush_to_end().await;
    }

    async fn shutdown(&self, _deadline: Instant) -> u64 {
        // With a store the open windows live on in the checkpoint; without one they are emitted now.
        if !self.host.state.is_persistent() {
            self.flush_to_end().await;
        }
        self.stopping.store(true, Ordering::SeqCst);
        0
    }
}

#[derive(Serialize, Deserialize)]
struct StageSnapshot {
    max_seen: u64,
    watermark: u64,
    processors: Vec<(String, u32, Vec<u8>)>,
}

struct StageCheckpoint {
    key: String,
    inner: Arc<Mutex<Inner>>,
}

impl Checkpoint for StageCheckpoint {
    fn key(&self) -> String {
        self.key.clone()
    }
    fn kind(&self) -> &'static str {
        "arrow_stage"
    }
    fn version(&self) -> u32 {
        STAGE_STATE_VERSION
    }
    fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
        let inner = self.inner.lock();
        let mut processors = Vec::with_capacity(inner.members.len());
        for m in &inner.members {
            processors.push((m.id.to_string(), m.proc.state_version(), m.proc.snapshot()?));
        }
        let s = StageSnapshot { max_seen: inner.max_seen, watermark: inner.watermark, processors };
        postcard::to_stdvec(&s)
            .map(Some)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })
    }
    fn restore(&self, bytes: &[u8]) -> Result<(), StateError> {
        let s: StageSnapshot = postcard::from_bytes(bytes)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })?;
        let mut inner = self.inner.lock();
        let found: Vec<&str> = s.processors.iter().map(|(id, _, _)| id.as_str()).collect();
        let want: Vec<String> = inner.members.iter().map(|m| m.id.to_string()).collect();
        if found != want.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(StateError::Incompatible {
                key: self.key.clone(),
                what: "processor list",
                found: found.join("+"),
                expected: want.join("+"),
            });
        }
        for (m, (_, version, _)) in inner.members.iter().zip(&s.processors) {
            if *version != m.proc.state_version() {
                return Err(StateError::Incompatible {
                    key: format!("{}/{}", self.key, m.id),
                    what: "state version",
                    found: version.to_string(),
                    expected: m.proc.state_version().to_string(),
                });
            }
        }
        for (m, (_, _, bytes)) in inner.members.iter_mut().zip(&s.processors) {
            m.proc.restore(bytes)?;
        }
        inner.max_seen = s.max_seen;
        inner.watermark = s.watermark;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrow::{ConvError, Needs};
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data,
    };

    /// Counts the rows it is given; derives nothing.
    struct Rows(Arc<Mutex<usize>>);

    impl ArrowProcessor for Rows {
        fn needs(&self) -> Needs {
            Needs { signal: Signal::Metrics, columns: vec![crate::arrow::schema::TIME] }
        }
        fn allowed_lateness_ns(&self) -> u64 {
            u64::MAX
        }
        fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
            *self.0.lock() += batch.num_rows();
            Ok(())
        }
        fn advance(&mut self, _watermark_ns: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
            Ok(())
        }
        fn state_version(&self) -> u32 {
            1
        }
        fn snapshot(&self) -> Result<Vec<u8>, StateError> {
            Ok(Vec::new())
        }
        fn restore(&mut self, _bytes: &[u8]) -> Result<(), StateError> {
            Ok(())
        }
        fn series_count(&self) -> usize {
            0
        }
    }

    struct Drain;

    #[async_trait]
    impl Consumer for Drain {
        async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
            Ok(())
        }
    }

    fn gauge(points: usize) -> ExportMetricsServiceRequest {
        let data_points = (0..points as u64).map(|t| NumberDataPoint { time_unix_nano: t + 1, ..Default::default() });
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "g".into(),
                        data: Some(Data::Gauge(Gauge { data_points: data_points.collect() })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn a_batch_handed_on_with_the_payload_is_not_converted_again() {
        let telemetry = Arc::new(Telemetry::new());
        let rows = Arc::new(Mutex::new(0));
        let id = ComponentId::parse("rows").unwrap();
        let ctx = StageContext { pipeline: "metrics".into(), telemetry: telemetry.clone(), host: Host::new() };
        let st =
            ArrowStage::build(ctx, vec![(id, Box::new(Rows(rows.clone())))], Signal::Metrics, Arc::new(Drain)).unwrap();
        let conversions = telemetry.arrow_conversions("stage metrics/rows", Signal::Metrics);
        let req = gauge(3);
        let batch = crate::arrow::metrics::to_batch(&req).unwrap();
        st.consume_with_batch(Payload::Metrics(req.clone()), Some(batch.clone())).await.unwrap();
        assert_eq!((conversions.get(), *rows.lock()), (0, 3), "the given batch is used");
        st.consume(Payload::Metrics(gauge(2))).await.unwrap();
        assert_eq!((conversions.get(), *rows.lock()), (1, 5), "without one the payload is converted");
        // A projected batch is not the stage's full schema: the payload is converted instead.
        let projected = batch.project(&[batch.schema().index_of(crate::arrow::schema::TIME).unwrap()]).unwrap();
        st.consume_with_batch(Payload::Metrics(req), Some(projected)).await.unwrap();
        assert_eq!((conversions.get(), *rows.lock()), (2, 8));
    }
}
