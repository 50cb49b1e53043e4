//! Dialogue flows: virtual users walking the state machine, per-state dispatchers at each
//! state's QPS, waiting queues, retries and timeouts per turn, and the RTT / context backoff.

use crate::arrivals::{ArrivalKind, Arrivals};
use crate::client::{ErrorKind, Message, Prompt, estimate_tokens};
use crate::config::Flow;
use crate::metrics::LatencyHist;
use crate::otlp::{self, SpanContext};
use crate::quality::Reference;
use crate::report::{FlowReport, StateReport};
use crate::runner::{Attempt, Ctx, Step, Stop, lock, wait_until};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Per-state accumulators of a flow run.
#[derive(Debug, Default)]
pub(crate) struct StateAgg {
    pub(crate) attempts: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) retries: u64,
    pub(crate) overflow: u64,
    pub(crate) idle_slots: u64,
    pub(crate) backoffs: u64,
    pub(crate) context_sum: u64,
    pub(crate) ttft: LatencyHist,
    pub(crate) e2e: LatencyHist,
}

/// Flow-wide accumulators of a run.
#[derive(Debug, Default)]
pub(crate) struct FlowAgg {
    pub(crate) states: Vec<StateAgg>,
    pub(crate) users_started: u64,
    pub(crate) users_completed: u64,
    pub(crate) users_failed: u64,
    pub(crate) users_dropped: u64,
    pub(crate) users_unfinished: u64,
    pub(crate) max_context_tokens: u64,
}

/// One virtual user of a dialogue flow.
struct User {
    conversation: String,
    trace_id: [u8; 16],
    root_span: [u8; 8],
    started: SystemTime,
    messages: Vec<Message>,
    context_tokens: u64,
    last_rtt: Duration,
    turns: u32,
}

/// A state's waiting users: the sending side for walks, the receiving side for its dispatcher.
type Queue = (mpsc::Sender<User>, tokio::sync::Mutex<mpsc::Receiver<User>>);

/// The flow runner's shared state.
struct FlowRun {
    flow: Arc<Flow>,
    queues: Vec<Option<Queue>>,
    sem: Arc<Semaphore>,
    /// No new turns (duration over, request budget spent, all users done).
    soft: CancellationToken,
    turns_issued: AtomicU64,
    users_started: AtomicU64,
    users_active: AtomicU64,
    all_started: AtomicBool,
    stop: Stop,
}

impl FlowRun {
    fn new_user(&self, n: u64, seed: u64) -> User {
        let (trace_id, root_span) = otlp::new_ids();
        let mut messages = Vec::new();
        if let Some(s) = &self.flow.system {
            messages.push(Message::new("system", s.clone()));
        }
        User {
            conversation: format!("bench-{seed:x}-{n}"),
            trace_id,
            root_span,
            started: SystemTime::now(),
            messages,
            context_tokens: 0,
            last_rtt: Duration::ZERO,
            turns: 0,
        }
    }

    /// Takes a turn budget unit; false (and stops the run) when the budget is spent.
    fn take_turn(&self) -> bool {
        match self.stop.requests {
            Some(n) if self.turns_issued.fetch_add(1, Ordering::Relaxed) >= n => {
                self.soft.cancel();
                false
            }
            _ => true,
        }
    }

    /// A user left the run (for any reason).
    fn user_done(&self) {
        let left = self.users_active.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && self.all_started.load(Ordering::Acquire) {
            self.soft.cancel();
        }
    }
}

/// Dispatches turns into state `s` at its QPS. `alive` is cloned into every task it starts,
/// so that the run can wait for all of them.
#[allow(clippy::too_many_arguments)]
async fn dispatcher(
    ctx: &Arc<Ctx>,
    step: &Arc<Step>,
    run: &Arc<FlowRun>,
    s: usize,
    qps: f64,
    kind: ArrivalKind,
    seed: u64,
    alive: &mpsc::Sender<()>,
) {
    let is_start = s == run.flow.start;
    let start = tokio::time::Instant::now();
    let Some((_, rx)) = &run.queues[s] else { return };
    for offset in Arrivals::new(kind, qps, seed) {
        if !wait_until(start + offset, &run.soft).await || ctx.hard.is_cancelled() {
            break;
        }
        let Ok(permit) = run.sem.clone().try_acquire_owned() else {
            if let Some(st) = lock(&step.flow).states.get_mut(s) {
                st.overflow += 1;
            }
            lock(&step.rec).overflow += 1;
            ctx.live.overflow.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let queued = rx.lock().await.try_recv().ok();
        let user = match queued {
            Some(u) => u,
            // Only this task starts users, so the count cannot race.
            None if is_start && !run.all_started.load(Ordering::Acquire) => {
                let n = run.users_started.fetch_add(1, Ordering::AcqRel);
                // Active before "all started", so that a user leaving meanwhile cannot see
                // zero active users and end the run early.
                run.users_active.fetch_add(1, Ordering::AcqRel);
                if ctx.max_users.is_some_and(|m| n + 1 >= m) {
                    run.all_started.store(true, Ordering::Release);
                }
                lock(&step.flow).users_started += 1;
                run.new_user(n, seed)
            }
            None => {
                if let Some(st) = lock(&step.flow).states.get_mut(s) {
                    st.idle_slots += 1;
                }
                continue;
            }
        };
        if !run.take_turn() {
            lock(&step.flow).users_unfinished += 1;
            run.user_done();
            break;
        }
        let (c, st, r, a) = (ctx.clone(), step.clone(), run.clone(), alive.clone());
        tokio::spawn(async move {
            walk(&c, &st, &r, user, s, permit).await;
            // Release the shared state before signalling that this task is done.
            drop((c, st, r));
            drop(a);
        });
    }
}

/// A user takes its turn in state `s` and moves on: directly into states without a QPS,
/// otherwise into the next state's waiting queue (after a backoff delay when the rule applies).
async fn walk(ctx: &Ctx, step: &Step, run: &FlowRun, mut user: User, mut s: usize, permit: OwnedSemaphorePermit) {
    let flow = &run.flow;
    // Held while this user has a request in flight (or goes on at once into an unpaced state).
    let mut permit = Some(permit);
    loop {
        let state = &flow.states[s];
        let text = match &state.prompt {
            Some(p) => p.clone(),
            None => {
                let (_, item) = ctx.prompts.next();
                match &item.prompt {
                    Prompt::Text(t) => t.clone(),
                    Prompt::Messages(m) => {
                        m.iter().rev().find(|x| x.role == "user").map(|x| x.content.clone()).unwrap_or_default()
                    }
                }
            }
        };
        user.messages.push(Message::new("user", text));
        let prompt = Prompt::Messages(user.messages.clone());
        let reference = state
            .reference
            .as_deref()
            .map(Reference::new)
            .or_else(|| ctx.refs.as_ref().and_then(|r| r.for_state(&state.name)));
        let mut a = Attempt {
            prompt: &prompt,
            reference,
            max_tokens: state.max_tokens.unwrap_or(ctx.max_tokens),
            timeout: state.timeout.unwrap_or(ctx.timeout),
            keep_text: true,
            images: &[],
            span: SpanContext {
                trace_id: user.trace_id,
                parent: ctx.otlp.as_ref().map(|_| user.root_span),
                conversation: Some(user.conversation.clone()),
                state: Some(state.name.clone()),
                ..SpanContext::default()
            },
        };
        let o = ctx.with_retries(step, &mut a, state.max_retries.unwrap_or(ctx.max_retries), Some(s)).await;
        if !o.ok() {
            let cancelled = o.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Cancelled);
            let mut f = lock(&step.flow);
            if cancelled {
                f.users_unfinished += 1
            } else {
                f.users_failed += 1
            }
            drop(f);
            finish_user(ctx, run, &user, if cancelled { "cancelled" } else { "failed" });
            return;
        }
        user.turns += 1;
        user.last_rtt = o.e2e;
        user.context_tokens = if o.usage_reported {
            o.input_tokens + o.output_tokens
        } else {
            o.input_tokens + o.output_tokens.max(estimate_tokens(o.text.len()))
        };
        user.messages.push(Message::new("assistant", o.text));
        let Some(next) = state.next.filter(|_| user.turns < flow.max_turns) else {
            lock(&step.flow).users_completed += 1;
            finish_user(ctx, run, &user, "completed");
            return;
        };
        if run.soft.is_cancelled() || ctx.hard.is_cancelled() {
            lock(&step.flow).users_unfinished += 1;
            finish_user(ctx, run, &user, "unfinished");
            return;
        }
        s = next;
        let Some(qps) = flow.states[s].qps else {
            // No pacing for this state: the user goes on at once.
            if !run.take_turn() {
                lock(&step.flow).users_unfinished += 1;
                finish_user(ctx, run, &user, "unfinished");
                return;
            }
            continue;
        };
        // Waiting for the next state's slot is not being in flight.
        drop(permit.take());
        // The backoff rule, per user: this user's pace in the next state is qps × ratio.
        if flow.rtt_backoff_ratio < 1.0
            && user.last_rtt > flow.rtt_backoff_threshold
            && user.context_tokens as f64 > flow.max_context_tokens
        {
            if let Some(st) = lock(&step.flow).states.get_mut(s) {
                st.backoffs += 1;
            }
            let extra = (1.0 / flow.rtt_backoff_ratio - 1.0) / qps;
            if !wait_until(tokio::time::Instant::now() + Duration::from_secs_f64(extra), &run.soft).await {
                lock(&step.flow).users_unfinished += 1;
                finish_user(ctx, run, &user, "unfinished");
                return;
            }
        }
        let Some((tx, _)) = &run.queues[s] else { return };
        if let Err(e) = tx.try_send(user) {
            let u = match e {
                mpsc::error::TrySendError::Full(u) | mpsc::error::TrySendError::Closed(u) => u,
            };
            lock(&step.flow).users_dropped += 1;
            finish_user(ctx, run, &u, "dropped");
        }
        return;
    }
}

fn finish_user(ctx: &Ctx, run: &FlowRun, user: &User, outcome: &str) {
    if let Some(sink) = &ctx.otlp {
        sink.span(otlp::conversation_span(
            sink.common(),
            &otlp::Conversation {
                trace_id: user.trace_id,
                span_id: user.root_span,
                id: &user.conversation,
                start: user.started,
                end: SystemTime::now(),
                turns: user.turns,
                outcome,
            },
        ));
    }
    run.user_done();
}

/// Runs a dialogue flow until the duration, the turn budget, or --max-users are spent.
pub(crate) async fn flow_loop(
    ctx: &Arc<Ctx>,
    step: &Arc<Step>,
    flow: Arc<Flow>,
    kind: ArrivalKind,
    stop: Stop,
    seed: u64,
) {
    let cap = ctx.max_in_flight.max(1);
    let queues = flow
        .states
        .iter()
        .map(|st| {
            st.qps.map(|_| {
                let (tx, rx) = mpsc::channel(cap);
                (tx, tokio::sync::Mutex::new(rx))
            })
        })
        .collect();
    lock(&step.flow).states = flow.states.iter().map(|_| StateAgg::default()).collect();
    let (alive, mut all_done) = mpsc::channel::<()>(1);
    let run = Arc::new(FlowRun {
        flow: flow.clone(),
        queues,
        sem: Arc::new(Semaphore::new(ctx.max_in_flight)),
        soft: ctx.hard.child_token(),
        turns_issued: AtomicU64::new(0),
        users_started: AtomicU64::new(0),
        users_active: AtomicU64::new(0),
        all_started: AtomicBool::new(false),
        stop,
    });
    for (i, st) in flow.states.iter().enumerate() {
        if let Some(qps) = st.qps {
            let (c, s, r, a) = (ctx.clone(), step.clone(), run.clone(), alive.clone());
            let seed = seed.wrapping_add(1 + i as u64);
            tokio::spawn(async move {
                dispatcher(&c, &s, &r, i, qps, kind, seed, &a).await;
                drop((c, s, r));
                drop(a);
            });
        }
    }
    drop(alive);
    if let Some(d) = stop.duration {
        let soft = run.soft.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => soft.cancel(),
                _ = soft.cancelled() => {}
            }
        });
    }
    run.soft.cancelled().await;
    // Dispatchers stop at once; turns in flight finish (within their timeouts) and enqueue
    // no one. Then the users still waiting in a queue are the unfinished ones.
    while all_done.recv().await.is_some() {}
    let mut waiting = 0;
    for q in run.queues.iter().flatten() {
        let mut rx = q.1.lock().await;
        while rx.try_recv().is_ok() {
            waiting += 1;
        }
    }
    lock(&step.flow).users_unfinished += waiting;
}

pub(crate) fn state_reports(flow: &Flow, agg: &FlowAgg) -> FlowReport {
    FlowReport {
        users_started: agg.users_started,
        users_completed: agg.users_completed,
        users_failed: agg.users_failed,
        users_dropped: agg.users_dropped,
        users_unfinished: agg.users_unfinished,
        max_context_tokens: agg.max_context_tokens,
        states: flow
            .states
            .iter()
            .zip(agg.states.iter())
            .map(|(st, a)| StateReport {
                state: st.name.clone(),
                qps: st.qps,
                attempts: a.attempts,
                completed: a.completed,
                failed: a.failed,
                retries: a.retries,
                overflow: a.overflow,
                idle_slots: a.idle_slots,
                backoffs: a.backoffs,
                mean_context_tokens: (a.completed > 0).then(|| a.context_sum as f64 / a.completed as f64),
                ttft: a.ttft.summary(),
                e2e: a.e2e.summary(),
            })
            .collect(),
    }
}
