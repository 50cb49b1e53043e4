//! The real-time driver: one task owns the [`Engine`], maps the monotonic clock onto engine
//! nanoseconds, advances the engine to "now" whenever something is due (its next event, a
//! submission, an abort, an admin call), and hands each request's tokens to its HTTP handler
//! over a channel. It also keeps the `/metrics` state (and TGI's or SGLang's, in those flavours)
//! and emits the spans of finished requests (TGI's handler spans, SGLang's request spans there).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::prom::{PromState, RequestParams};
use super::sglang::SglangMetrics;
use super::sglang::trace::{Process, request_spans as sglang_spans};
use super::telemetry::{SpanMeta, request_span};
use super::tgi::TgiMetrics;
use super::tgi::trace::{Handler, HandlerSpans, Timings};
use crate::engine::{Engine, EngineEvent, Nanos, RejectReason, RequestId, RequestRecord, RequestSpec};
use crate::faults::{Fault, FaultSet};

/// Maps the monotonic clock to engine time (ns since the server started) and to Unix time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    unix0: u64,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn start() -> Self {
        Clock { origin: Instant::now(), unix0: super::telemetry::unix_nanos_now() }
    }

    /// Engine time now.
    pub fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The monotonic instant of engine time `t`.
    pub fn instant(&self, t: Nanos) -> Instant {
        self.origin + Duration::from_nanos(t)
    }

    /// Unix nanoseconds of engine time 0.
    pub fn unix0(&self) -> u64 {
        self.unix0
    }
}

/// What a handler hears about one of its engine requests.
#[derive(Clone, Debug, PartialEq)]
pub enum ReqEvent {
    /// Output token `index` of choice `choice` was emitted at engine time `t`.
    Token {
        /// The choice (index in the response's `choices`).
        choice: u32,
        /// Output position, 0-based.
        index: u32,
        /// When.
        t: Nanos,
    },
    /// The choice finished.
    Finished {
        /// The choice.
        choice: u32,
        /// Timings, counts and the finish reason.
        record: RequestRecord,
    },
}

/// One engine request of an HTTP request (one per prompt and choice).
#[derive(Clone, Debug)]
pub struct Submission {
    /// The engine request (arrival = frontend arrival).
    pub spec: RequestSpec,
    /// Its choice index in the response.
    pub choice: u32,
    /// What its span needs.
    pub meta: SpanMeta,
    /// `n` and `max_tokens` for the request histograms.
    pub params: RequestParams,
}

/// The faults as `GET /admin/faults` shows them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FaultStatus {
    /// Engine time now, seconds since the server started (fault times are on this clock).
    pub now: f64,
    /// This instance's version label.
    pub version: String,
    /// Every configured fault, times absolute on the engine clock.
    pub faults: Vec<Fault>,
    /// Kinds of the faults that change something now.
    pub active: Vec<&'static str>,
}

/// Requests to the driver task.
#[derive(Debug)]
pub enum Command {
    /// Submits engine requests that report to `events`; all or none are accepted.
    Submit {
        /// The requests.
        subs: Vec<Submission>,
        /// Where their tokens go.
        events: mpsc::UnboundedSender<ReqEvent>,
        /// Accepted, or why not.
        reply: oneshot::Sender<Result<(), RejectReason>>,
    },
    /// Aborts requests (client gone); unknown or finished ids are ignored.
    Abort(Vec<RequestId>),
    /// Replaces the fault set; with `relative`, fault times count from now.
    SetFaults {
        /// The new set.
        faults: FaultSet,
        /// Shift the faults' times by the current engine time.
        relative: bool,
        /// The resulting state, or why the set was refused.
        reply: oneshot::Sender<Result<FaultStatus, String>>,
    },
    /// Reports the fault state.
    GetFaults {
        /// The state.
        reply: oneshot::Sender<FaultStatus>,
    },
}

struct Live {
    choice: u32,
    tx: mpsc::UnboundedSender<ReqEvent>,
    meta: SpanMeta,
    params: RequestParams,
    arrival: Nanos,
    prompt_tokens: u32,
    last_token: Option<Nanos>,
}

/// The TGI flavour's state in the driver.
struct Tgi {
    metrics: Arc<Mutex<TgiMetrics>>,
    /// Handler spans being assembled (only when spans are exported).
    spans: Option<HandlerSpans>,
}

/// The SGLang flavour's state in the driver.
struct Sglang {
    metrics: Arc<Mutex<SglangMetrics>>,
    /// The served model name (`gen_ai.response.model`).
    model: String,
    process: Process,
}

/// Where a finished request is reported.
struct Sinks<'a> {
    prom: &'a mut PromState,
    tgi: Option<&'a mut TgiMetrics>,
    sglang: Option<(&'a mut SglangMetrics, &'a Sglang)>,
    tgi_spans: Option<&'a mut HandlerSpans>,
    spans: &'a Option<mpsc::Sender<Span>>,
    dropped: &'a mut u64,
    unix0: u64,
}

/// The driver task's state.
pub struct Driver {
    engine: Engine,
    clock: Clock,
    live: HashMap<RequestId, Live>,
    prom: Arc<Mutex<PromState>>,
    spans: Option<mpsc::Sender<Span>>,
    events: Vec<EngineEvent>,
    dropped_spans: u64,
    tgi: Option<Tgi>,
    sglang: Option<Sglang>,
}

impl Driver {
    /// A driver for `engine` (whose time 0 is `clock`'s zero), publishing into `prom` and
    /// sending finished requests' spans to `spans`.
    pub fn new(engine: Engine, clock: Clock, prom: Arc<Mutex<PromState>>, spans: Option<mpsc::Sender<Span>>) -> Self {
        Driver {
            engine,
            clock,
            live: HashMap::new(),
            prom,
            spans,
            events: Vec::new(),
            dropped_spans: 0,
            tgi: None,
            sglang: None,
        }
    }

    /// The SGLang flavour: also records SGLang's metrics into `metrics`, and sends SGLang's
    /// request spans (labelled with the served `model`) instead of `llm_request` spans.
    pub fn with_sglang(mut self, metrics: Arc<Mutex<SglangMetrics>>, model: &str) -> Self {
        self.sglang = Some(Sglang { metrics, model: model.to_string(), process: Process::current() });
        self
    }

    /// The TGI flavour: also records TGI's metrics into `metrics`, and sends TGI's handler
    /// spans instead of `llm_request` spans.
    pub fn with_tgi(mut self, metrics: Arc<Mutex<TgiMetrics>>) -> Self {
        let spans = self.spans.is_some().then(HandlerSpans::default);
        self.tgi = Some(Tgi { metrics, spans });
        self
    }

    /// Runs until every command sender is gone or `stop` fires; requests still in flight
    /// are aborted (their handlers see their channels close).
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>, stop: CancellationToken) {
        loop {
            self.advance();
            let next = self.engine.next_event_time();
            let deadline = next.map(|t| self.clock.instant(t));
            if deadline.is_some_and(|d| d <= Instant::now()) {
                // due already (a zero-length step or a late timer): let other tasks run first
                tokio::task::yield_now().await;
                while let Ok(cmd) = rx.try_recv() {
                    self.handle(cmd);
                }
                continue;
            }
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => {
                        self.handle(cmd);
                        while let Ok(cmd) = rx.try_recv() {
                            self.handle(cmd);
                        }
                    }
                    None => break,
                },
                _ = sleep_until(deadline) => {}
                _ = stop.cancelled() => break,
            }
        }
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        self.abort(&ids);
        if self.dropped_spans > 0 {
            tracing::warn!(spans = self.dropped_spans, "spans dropped: the span exporter could not keep up");
        }
    }

    /// Advances the engine to now and delivers what happened.
    fn advance(&mut self) {
        let now = self.clock.now();
        self.engine.advance_to(now, &mut self.events);
        let events = std::mem::take(&mut self.events);
        let mut prom = self.prom.lock();
        let tgi_metrics = self.tgi.as_ref().map(|t| Arc::clone(&t.metrics));
        let mut tgi = tgi_metrics.as_ref().map(|m| m.lock());
        let sglang_metrics = self.sglang.as_ref().map(|s| Arc::clone(&s.metrics));
        let mut sglang = sglang_metrics.as_ref().map(|m| m.lock());
        for ev in &events {
            if let Some(t) = tgi.as_deref_mut() {
                t.engine_event(ev);
            }
            if let Some(m) = sglang.as_deref_mut() {
                m.engine_event(ev);
            }
            match ev {
                EngineEvent::Token { id, index, t } => {
                    if let Some(l) = self.live.get_mut(id) {
                        match l.last_token {
                            Some(prev) => prom.observe_itl(t.saturating_sub(prev) as f64 / 1e9),
                            None => prom.observe_ttft(t.saturating_sub(l.arrival) as f64 / 1e9),
                        }
                        l.last_token = Some(*t);
                        let _ = l.tx.send(ReqEvent::Token { choice: l.choice, index: *index, t: *t });
                    }
                }
                EngineEvent::Finished { record } => {
                    if let Some(l) = self.live.remove(&record.id) {
                        let sinks = Sinks {
                            prom: &mut prom,
                            tgi: tgi.as_deref_mut(),
                            sglang: sglang.as_deref_mut().zip(self.sglang.as_ref()),
                            tgi_spans: self.tgi.as_mut().and_then(|t| t.spans.as_mut()),
                            spans: &self.spans,
                            dropped: &mut self.dropped_spans,
                            unix0: self.clock.unix0(),
                        };
                        finish(sinks, &l, record);
                    }
                }
                EngineEvent::Step(s) => prom.observe_step(s.num_tokens, s.end as f64 / 1e9),
                EngineEvent::Scheduled { .. } | EngineEvent::FirstToken { .. } | EngineEvent::Preempted { .. } => {}
            }
        }
        self.publish(&mut prom, tgi.as_deref_mut(), sglang.as_deref_mut());
        drop(sglang);
        drop(tgi);
        drop(prom);
        self.events = events;
        self.events.clear();
    }

    fn publish(&self, prom: &mut PromState, tgi: Option<&mut TgiMetrics>, sglang: Option<&mut SglangMetrics>) {
        prom.running = self.engine.num_running();
        prom.waiting = self.engine.num_waiting();
        prom.kv_usage = self.engine.kv_usage();
        prom.stats.clone_from(self.engine.stats());
        if let Some(t) = tgi {
            t.engine_state(prom.waiting, prom.running);
        }
        if let Some(m) = sglang {
            let kv = self.engine.kv_snapshot();
            m.engine_state(self.engine.now(), prom.running, prom.waiting, &kv, &prom.stats);
        }
    }

    fn abort(&mut self, ids: &[RequestId]) {
        let mut prom = self.prom.lock();
        let tgi_metrics = self.tgi.as_ref().map(|t| Arc::clone(&t.metrics));
        let mut tgi = tgi_metrics.as_ref().map(|m| m.lock());
        let sglang_metrics = self.sglang.as_ref().map(|s| Arc::clone(&s.metrics));
        let mut sglang = sglang_metrics.as_ref().map(|m| m.lock());
        for id in ids {
            let Some(l) = self.live.remove(id) else { continue };
            if let Some(record) = self.engine.abort(*id) {
                let sinks = Sinks {
                    prom: &mut prom,
                    tgi: tgi.as_deref_mut(),
                    sglang: sglang.as_deref_mut().zip(self.sglang.as_ref()),
                    tgi_spans: self.tgi.as_mut().and_then(|t| t.spans.as_mut()),
                    spans: &self.spans,
                    dropped: &mut self.dropped_spans,
                    unix0: self.clock.unix0(),
                };
                finish(sinks, &l, &record);
            }
        }
        self.publish(&mut prom, tgi.as_deref_mut(), sglang.as_deref_mut());
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit { subs, events, reply } => {
                let mut accepted: Vec<RequestId> = Vec::with_capacity(subs.len());
                let mut budgets: Vec<(RequestId, u64)> = Vec::with_capacity(subs.len());
                let mut handlers = Vec::new();
                let mut result = Ok(());
                for s in subs {
                    let id = s.spec.id;
                    let arrival = s.spec.arrival;
                    let prompt_tokens = s.spec.prompt_tokens;
                    budgets.push((id, u64::from(s.spec.prompt_tokens) + u64::from(s.spec.max_tokens)));
                    if handlers.last().is_none_or(|h: &Handler| h.group != s.meta.handler.group) {
                        handlers.push(s.meta.handler.clone());
                    }
                    match self.engine.submit(s.spec) {
                        Ok(()) => {
                            accepted.push(id);
                            self.live.insert(
                                id,
                                Live {
                                    choice: s.choice,
                                    tx: events.clone(),
                                    meta: s.meta,
                                    params: s.params,
                                    arrival,
                                    prompt_tokens,
                                    last_token: None,
                                },
                            );
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                if result.is_err() {
                    for id in accepted {
                        self.live.remove(&id);
                        self.engine.abort(id);
                    }
                } else if let Some(sg) = &self.sglang {
                    let mut m = sg.metrics.lock();
                    for id in &accepted {
                        if let Some(l) = self.live.get(id) {
                            m.queued(*id, l.arrival, l.prompt_tokens, l.params.stream);
                        }
                    }
                } else if let Some(t) = &mut self.tgi {
                    let mut m = t.metrics.lock();
                    for (id, budget) in budgets {
                        m.queued(id, budget);
                    }
                    if let Some(spans) = &mut t.spans {
                        handlers.iter().for_each(|h| spans.open(h));
                    }
                }
                let _ = reply.send(result);
            }
            Command::Abort(ids) => {
                self.advance();
                self.abort(&ids);
            }
            Command::SetFaults { mut faults, relative, reply } => {
                self.advance();
                if relative {
                    let now_s = self.engine.now() as f64 / 1e9;
                    for f in &mut faults.faults {
                        f.shift(now_s);
                    }
                }
                let r = self.engine.set_faults(faults).map(|()| self.fault_status()).map_err(|e| e.to_string());
                let _ = reply.send(r);
            }
            Command::GetFaults { reply } => {
                self.advance();
                let _ = reply.send(self.fault_status());
            }
        }
    }

    fn fault_status(&self) -> FaultStatus {
        let now = self.engine.now();
        let version = self.engine.version().to_string();
        let faults = self.engine.faults().faults.clone();
        let active = faults.iter().filter(|f| f.is_active(now, &version)).map(Fault::kind).collect();
        FaultStatus { now: now as f64 / 1e9, version, faults, active }
    }
}

fn finish(out: Sinks<'_>, l: &Live, record: &RequestRecord) {
    out.prom.observe_finished(record, l.params);
    let spans: Vec<Span> = match (out.tgi, out.sglang) {
        (Some(m), _) => {
            let t = Timings::of(record, l.meta.handler.arrival);
            m.finished(record, &t);
            out.tgi_spans.and_then(|s| s.finish(&l.meta, record, &t, out.unix0)).into_iter().collect()
        }
        (None, Some((m, sg))) => {
            m.finished(record);
            match out.spans {
                Some(_) => sglang_spans(&l.meta, record, record.id, &sg.model, &sg.process, out.unix0),
                None => Vec::new(),
            }
        }
        (None, None) => out.spans.as_ref().map(|_| request_span(&l.meta, record, out.unix0)).into_iter().collect(),
    };
    if let Some(tx) = out.spans {
        for span in spans {
            if tx.try_send(span).is_err() {
                *out.dropped += 1;
            }
        }
    }
    let _ = l.tx.send(ReqEvent::Finished { choice: l.choice, record: record.clone() });
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
