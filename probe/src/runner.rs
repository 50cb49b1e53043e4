//! Load drivers: open loop (constant / Poisson, bounded in flight), closed loop
//! (concurrency), rate sweeps, the study's probes and perturbation pairs (flows: `flows.rs`);
//! the validated plan, the shared run state, and the report assembly.

use crate::arrivals::{ArrivalKind, Arrivals};
use crate::client::{Client, ClientConfig, ErrorKind, Outcome, Prompt, RequestSpec};
use crate::config::Flow;
use crate::dataset::{self, PromptSource, References};
use crate::flows::{FlowAgg, flow_loop, state_reports};
use crate::metrics::{LatencyHist, Recorder, Slo};
use crate::otlp::{self, Common, OtlpSink, SpanContext};
use crate::perturb::{Profile, insert_mid};
use crate::probes::{ProbeKind, ProbeReport, drift};
use crate::quality::{RciWeights, Reference, bleu, tle_bits};
use crate::report::{Live, PerturbReport, Report, Results, SweepStep, spawn_progress};
use crate::{BenchArgs, BenchError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How load is offered.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    Rate(f64),
    Sweep(Vec<f64>),
    Concurrency(usize),
    Flow(Arc<Flow>),
}

/// When to stop sending.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stop {
    pub(crate) duration: Option<Duration>,
    pub(crate) requests: Option<u64>,
}

/// Everything a run needs, validated.
pub(crate) struct Plan {
    args: BenchArgs,
    mode: Mode,
    stop: Stop,
    client: ClientConfig,
    prompts: PromptSource,
    refs: Option<References>,
    max_tokens: u32,
    slo: Option<Slo>,
    perturb: Option<Profile>,
    rci_weights: RciWeights,
    probe: Option<ProbeKind>,
}

fn usage(msg: impl Into<String>) -> BenchError {
    BenchError::Usage(msg.into())
}

impl Plan {
    /// Checks the options and loads the flow, dataset and reference files.
    pub(crate) fn from_args(a: &BenchArgs) -> Result<Plan, BenchError> {
        if a.model.trim().is_empty() {
            return Err(usage("--model must not be empty"));
        }
        let probe = a.probe;
        if let Some(r) = a.rate
            && (!r.is_finite() || r <= 0.0)
        {
            return Err(usage(format!("--rate must be positive, got {r}")));
        }
        if let Some(s) = &a.rate_sweep
            && (s.is_empty() || s.iter().any(|r| !r.is_finite() || *r <= 0.0))
        {
            return Err(usage("--rate-sweep needs positive rates, e.g. 1,2,4,8"));
        }
        if a.concurrency == Some(0) {
            return Err(usage("--concurrency must be at least 1"));
        }
        if a.requests == Some(0) {
            return Err(usage("--requests must be at least 1"));
        }
        if a.duration.is_some_and(|d| d.is_zero()) {
            return Err(usage("--duration must be positive"));
        }
        if a.timeout.is_zero() {
            return Err(usage("--timeout must be positive"));
        }
        if a.prompt_tokens == 0 {
            return Err(usage("--prompt-tokens must be at least 1"));
        }
        if let Some(t) = a.temperature
            && (!t.is_finite() || t < 0.0)
        {
            return Err(usage(format!("--temperature must be ≥ 0, got {t}")));
        }
        let selected = [a.rate.is_some(), a.rate_sweep.is_some(), a.concurrency.is_some(), a.flow.is_some()]
            .iter()
            .filter(|&&b| b)
            .count();
        if selected > 1 {
            return Err(usage("choose one of --rate, --rate-sweep, --concurrency and --flow"));
        }
        let mode = match (probe, a) {
            (Some(p), _) if a.flow.is_some() || a.rate_sweep.is_some() => {
                return Err(usage(format!("--probe {} cannot be combined with --flow or --rate-sweep", p.name())));
            }
            (Some(ProbeKind::Ttft | ProbeKind::Tps), _) => {
                if a.rate.is_some() {
                    return Err(usage("--probe ttft and tps run one request at a time: use --concurrency, not --rate"));
                }
                Mode::Concurrency(a.concurrency.unwrap_or(1))
            }
            (Some(ProbeKind::P99Drift), _) => {
                if a.concurrency.is_some() {
                    return Err(usage("--probe p99-drift offers a fixed rate: use --rate, not --concurrency"));
                }
                Mode::Rate(a.rate.unwrap_or(50.0))
            }
            (None, BenchArgs { rate: Some(r), .. }) => Mode::Rate(*r),
            (None, BenchArgs { rate_sweep: Some(s), .. }) => Mode::Sweep(s.clone()),
            (None, BenchArgs { concurrency: Some(c), .. }) => Mode::Concurrency(*c),
            (None, BenchArgs { flow: Some(path), .. }) => Mode::Flow(Arc::new(Flow::load(path)?)),
            (None, _) => {
                return Err(usage(
                    "choose a load: --rate R, --rate-sweep R1,R2,..., --concurrency C, --flow FILE or --probe",
                ));
            }
        };
        let stop = match (probe, a.duration, a.requests) {
            (_, Some(d), _) => Stop { duration: Some(d), requests: None },
            (_, None, Some(n)) => Stop { duration: None, requests: Some(n) },
            (Some(ProbeKind::Ttft), None, None) => Stop { duration: None, requests: Some(20) },
            (Some(ProbeKind::Tps), None, None) => Stop { duration: None, requests: Some(10) },
            (Some(ProbeKind::P99Drift), None, None) => {
                Stop { duration: Some(Duration::from_secs(300)), requests: None }
            }
            (None, None, None) if matches!(mode, Mode::Flow(_)) && a.max_users.is_some() => {
                Stop { duration: None, requests: None }
            }
            (None, None, None) => Stop { duration: Some(Duration::from_secs(60)), requests: None },
        };
        let max_tokens = match probe {
            Some(ProbeKind::Ttft) => a.max_tokens.unwrap_or(1),
            _ => a.max_tokens.unwrap_or(128),
        };
        let slo = a.slo.as_deref().map(Slo::parse).transpose().map_err(usage)?;
        let perturb = a.perturb.as_deref().map(Profile::parse).transpose().map_err(usage)?;
        let rci_weights = RciWeights::parse(&a.rci_weights).map_err(usage)?;
        let refs = a.reference.as_deref().map(References::load).transpose()?;
        let prompts = match &a.dataset {
            Some(p) => PromptSource::from_items(dataset::load(p)?, refs.as_ref()),
            None => PromptSource::synthetic(a.prompt_tokens, a.seed, refs.as_ref()),
        };
        if matches!(mode, Mode::Flow(_)) && perturb.is_some() {
            return Err(usage("--perturb works with --rate, --concurrency and --probe, not with --flow"));
        }
        if a.max_users == Some(0) {
            return Err(usage("--max-users must be at least 1"));
        }
        let client = ClientConfig {
            endpoint: a.endpoint.clone(),
            api: a.api,
            model: a.model.clone(),
            stream: !a.no_stream,
            stream_usage: !a.no_stream_usage,
            api_key: a.api_key.clone(),
            insecure: a.insecure,
            // Paired perturbation runs compare answers: greedy unless told otherwise.
            temperature: a.temperature.or(perturb.as_ref().map(|_| 0.0)),
            ignore_eos: a.ignore_eos || probe == Some(ProbeKind::Tps),
            logprobs: a.logprobs,
            pool_size: 1024,
        };
        Ok(Plan { args: a.clone(), mode, stop, client, prompts, refs, max_tokens, slo, perturb, rci_weights, probe })
    }
}

/// Paired measurements of a perturbation profile.
#[derive(Debug)]
struct PerturbAgg {
    pairs: u64,
    changed: u64,
    divergence_sum: f64,
    ttft_delta_sum: f64,
    ttft_delta_n: u64,
    e2e_delta_sum: f64,
    rci_delta_sum: f64,
    rci_delta_n: u64,
    base_ttft: LatencyHist,
    pert_ttft: LatencyHist,
    base_e2e: LatencyHist,
    pert_e2e: LatencyHist,
}

impl PerturbAgg {
    fn new() -> PerturbAgg {
        PerturbAgg {
            pairs: 0,
            changed: 0,
            divergence_sum: 0.0,
            ttft_delta_sum: 0.0,
            ttft_delta_n: 0,
            e2e_delta_sum: 0.0,
            rci_delta_sum: 0.0,
            rci_delta_n: 0,
            base_ttft: LatencyHist::default(),
            pert_ttft: LatencyHist::default(),
            base_e2e: LatencyHist::default(),
            pert_e2e: LatencyHist::default(),
        }
    }

    fn add(&mut self, base: &Outcome, pert: &Outcome) {
        if !base.ok() || !pert.ok() {
            return;
        }
        self.pairs += 1;
        if base.text != pert.text {
            self.changed += 1;
        }
        self.divergence_sum += 1.0 - bleu(&pert.text, &base.text);
        if let (Some(a), Some(b)) = (base.ttft, pert.ttft) {
            self.base_ttft.record(a);
            self.pert_ttft.record(b);
            self.ttft_delta_sum += b.as_secs_f64() - a.as_secs_f64();
            self.ttft_delta_n += 1;
        }
        self.base_e2e.record(base.e2e);
        self.pert_e2e.record(pert.e2e);
        self.e2e_delta_sum += pert.e2e.as_secs_f64() - base.e2e.as_secs_f64();
        if let (Some(a), Some(b)) = (&base.rci, &pert.rci) {
            self.rci_delta_sum += b.rci - a.rci;
            self.rci_delta_n += 1;
        }
    }

    fn report(&self, profile: &str) -> PerturbReport {
        let mean = |s: f64, n: u64| (n > 0).then(|| s / n as f64);
        PerturbReport {
            profile: profile.to_string(),
            pairs: self.pairs,
            answer_changed_share: if self.pairs > 0 { self.changed as f64 / self.pairs as f64 } else { 0.0 },
            mean_answer_divergence: mean(self.divergence_sum, self.pairs),
            baseline_ttft: self.base_ttft.summary(),
            perturbed_ttft: self.pert_ttft.summary(),
            baseline_e2e: self.base_e2e.summary(),
            perturbed_e2e: self.pert_e2e.summary(),
            mean_ttft_delta_s: mean(self.ttft_delta_sum, self.ttft_delta_n),
            mean_e2e_delta_s: mean(self.e2e_delta_sum, self.pairs),
            mean_rci_delta: mean(self.rci_delta_sum, self.rci_delta_n),
        }
    }
}

/// Shared state of one run step.
pub(crate) struct Step {
    pub(crate) rec: Arc<Mutex<Recorder>>,
    perturb: Mutex<PerturbAgg>,
    pub(crate) flow: Mutex<FlowAgg>,
}

/// Shared state of the whole run.
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) prompts: PromptSource,
    pub(crate) refs: Option<References>,
    pub(crate) max_tokens: u32,
    pub(crate) timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) slo: Option<Slo>,
    pub(crate) perturb: Option<Profile>,
    pub(crate) seed: u64,
    pub(crate) rci_weights: RciWeights,
    pub(crate) max_in_flight: usize,
    pub(crate) max_users: Option<u64>,
    pub(crate) otlp: Option<OtlpSink>,
    pub(crate) live: Arc<Live>,
    /// Aborts in-flight requests (Ctrl-C).
    pub(crate) hard: CancellationToken,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data inconsistent in a way
    // that matters for counting; keep going with what is there.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What to send in one attempt.
pub(crate) struct Attempt<'a> {
    pub(crate) prompt: &'a Prompt,
    pub(crate) reference: Option<Arc<Reference>>,
    pub(crate) max_tokens: u32,
    pub(crate) timeout: Duration,
    pub(crate) keep_text: bool,
    pub(crate) span: SpanContext,
}

impl Ctx {
    /// Sends one attempt, records it everywhere, and returns its outcome.
    async fn attempt(&self, step: &Step, a: &mut Attempt<'_>, state: Option<usize>) -> Outcome {
        let traceparent = self.otlp.as_ref().map(|_| {
            let (t, s) =
                if a.span.trace_id == [0; 16] { otlp::new_ids() } else { (a.span.trace_id, otlp::new_span_id()) };
            a.span.trace_id = t;
            a.span.span_id = s;
            otlp::traceparent(&t, &s)
        });
        let spec = RequestSpec {
            prompt: a.prompt,
            max_tokens: a.max_tokens,
            keep_text: a.keep_text,
            reference: a.reference.clone(),
            rci_weights: self.rci_weights,
            traceparent,
            timeout: a.timeout,
        };
        let live = &self.live;
        live.sent.fetch_add(1, Ordering::Relaxed);
        live.inflight.fetch_add(1, Ordering::Relaxed);
        let o = self.client.execute(&spec, &self.hard).await;
        live.inflight.fetch_sub(1, Ordering::Relaxed);
        if o.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Cancelled) {
            return o;
        }
        if o.ok() {
            live.ok.fetch_add(1, Ordering::Relaxed);
            live.out_tokens.fetch_add(o.output_tokens, Ordering::Relaxed);
        } else {
            live.failed.fetch_add(1, Ordering::Relaxed);
        }
        lock(&step.rec).record(&o, self.slo.as_ref());
        if let Some(s) = state {
            let mut f = lock(&step.flow);
            if let Some(st) = f.states.get_mut(s) {
                st.attempts += 1;
                if o.ok() {
                    st.completed += 1;
                    st.context_sum += o.input_tokens;
                    if let Some(t) = o.ttft {
                        st.ttft.record(t);
                    }
                    st.e2e.record(o.e2e);
                } else {
                    st.failed += 1;
                }
            }
            f.max_context_tokens = f.max_context_tokens.max(o.input_tokens);
        }
        if let Some(sink) = &self.otlp {
            a.span.tle = o.first_top_logprobs.as_deref().and_then(tle_bits);
            a.span.max_tokens = a.max_tokens;
            sink.request(&o, &a.span);
        }
        o
    }

    /// Sends with up to `retries` retries on error or timeout.
    pub(crate) async fn with_retries(
        &self,
        step: &Step,
        a: &mut Attempt<'_>,
        retries: u32,
        state: Option<usize>,
    ) -> Outcome {
        let mut n = 0;
        loop {
            n += 1;
            a.span.attempt = n;
            let o = self.attempt(step, a, state).await;
            let cancelled = o.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Cancelled);
            if o.ok() || cancelled || n > retries || self.hard.is_cancelled() {
                return o;
            }
            lock(&step.rec).retries += 1;
            if let Some(s) = state
                && let Some(st) = lock(&step.flow).states.get_mut(s)
            {
                st.retries += 1;
            }
        }
    }

    /// One arrival of the open or closed loop: a prompt (and its perturbed twin).
    async fn job(&self, step: &Step) {
        let (idx, item) = self.prompts.next();
        let max_tokens = item.max_tokens.unwrap_or(self.max_tokens);
        let mut a = Attempt {
            prompt: &item.prompt,
            reference: item.reference.clone(),
            max_tokens,
            timeout: self.timeout,
            keep_text: self.perturb.is_some(),
            span: SpanContext::default(),
        };
        let Some(profile) = &self.perturb else {
            self.with_retries(step, &mut a, self.max_retries, None).await;
            return;
        };
        a.span.perturbation = Some("baseline".into());
        let base = self.with_retries(step, &mut a, self.max_retries, None).await;
        if self.hard.is_cancelled() {
            return;
        }
        let distractor = profile.distractor(self.seed, idx);
        let perturbed = match &item.prompt {
            Prompt::Text(t) => Prompt::Text(insert_mid(t, &distractor)),
            Prompt::Messages(m) => {
                let mut m = m.clone();
                if let Some(last) = m.iter_mut().rev().find(|x| x.role == "user") {
                    last.content = insert_mid(&last.content, &distractor);
                }
                Prompt::Messages(m)
            }
        };
        let mut b = Attempt {
            prompt: &perturbed,
            reference: item.reference.clone(),
            max_tokens,
            timeout: self.timeout,
            keep_text: true,
            span: SpanContext { perturbation: Some(profile.name.clone()), ..SpanContext::default() },
        };
        let pert = self.with_retries(step, &mut b, self.max_retries, None).await;
        lock(&step.perturb).add(&base, &pert);
    }
}

/// Sleeps until `at`, or returns false when `stop` fires first.
pub(crate) async fn wait_until(at: tokio::time::Instant, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(at) => true,
        _ = stop.cancelled() => false,
    }
}

/// Open loop at `rate`: arrivals never wait for answers; beyond --max-in-flight they overflow.
async fn open_loop(ctx: &Arc<Ctx>, step: &Arc<Step>, rate: f64, kind: ArrivalKind, stop: Stop, seed: u64) {
    let sem = Arc::new(Semaphore::new(ctx.max_in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    let deadline = stop.duration.map(|d| start + d);
    for (n, offset) in Arrivals::new(kind, rate, seed).enumerate() {
        if stop.requests.is_some_and(|r| n as u64 >= r) {
            break;
        }
        let at = start + offset;
        if deadline.is_some_and(|d| at >= d) {
            break;
        }
        if !wait_until(at, &ctx.hard).await {
            break;
        }
        match sem.clone().try_acquire_owned() {
            Ok(permit) => {
                let (c, s) = (ctx.clone(), step.clone());
                tasks.spawn(async move {
                    c.job(&s).await;
                    drop(permit);
                });
            }
            Err(_) => {
                lock(&step.rec).overflow += 1;
                ctx.live.overflow.fetch_add(1, Ordering::Relaxed);
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    // The run lasts its whole duration even when the last arrival came earlier.
    if let Some(d) = deadline {
        wait_until(d, &ctx.hard).await;
    }
}

/// Closed loop: `c` workers, each sending its next request when the previous one ends.
async fn closed_loop(ctx: &Arc<Ctx>, step: &Arc<Step>, c: usize, stop: Stop) {
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = stop.duration.map(|d| Instant::now() + d);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..c {
        let (ctx, step, issued) = (ctx.clone(), step.clone(), issued.clone());
        tasks.spawn(async move {
            loop {
                if ctx.hard.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                if let Some(n) = stop.requests
                    && issued.fetch_add(1, Ordering::Relaxed) >= n
                {
                    break;
                }
                ctx.job(&step).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

fn new_step(window: Option<Duration>) -> Arc<Step> {
    let mut rec = Recorder::new(Instant::now());
    if let Some(w) = window {
        rec = rec.with_windows(w);
    }
    Arc::new(Step {
        rec: Arc::new(Mutex::new(rec)),
        perturb: Mutex::new(PerturbAgg::new()),
        flow: Mutex::new(FlowAgg::default()),
    })
}

/// Runs a plan to the end (or until `hard` is cancelled) and builds the report.
pub(crate) async fn execute(plan: Plan, hard: CancellationToken) -> Result<Report, BenchError> {
    let Plan { args, mode, stop, client, prompts, refs, max_tokens, slo, perturb, rci_weights, probe } = plan;
    let stream = client.stream;
    let client = Client::new(client).map_err(BenchError::Usage)?;
    let url = client.url().to_string();
    let run_start_wall = SystemTime::now();
    let otlp = match &args.otlp_endpoint {
        None => None,
        Some(ep) => {
            let parsed = reqwest::Url::parse(&url).ok();
            let common = Common {
                api: args.api,
                model: args.model.clone(),
                provider: args.provider_name.clone(),
                server_address: parsed.as_ref().and_then(|u| u.host_str().map(str::to_string)).unwrap_or_default(),
                server_port: parsed.as_ref().and_then(|u| u.port_or_known_default()).unwrap_or(0),
                stream,
                temperature: client.config().temperature,
                service_name: args.otlp_service_name.clone(),
            };
            Some(
                OtlpSink::start(ep, args.otlp_protocol, common, args.otlp_interval, run_start_wall)
                    .map_err(BenchError::Otlp)?,
            )
        }
    };
    let ctx = Arc::new(Ctx {
        client,
        prompts,
        refs,
        max_tokens,
        timeout: args.timeout,
        max_retries: args.max_retries,
        slo,
        perturb,
        seed: args.seed,
        rci_weights,
        max_in_flight: usize::try_from(args.max_in_flight).unwrap_or(usize::MAX).max(1),
        max_users: args.max_users,
        otlp,
        live: Arc::new(Live::default()),
        hard,
    });
    let window = (probe == Some(ProbeKind::P99Drift)).then_some(args.window);
    let started = Instant::now();
    let mut sweep_steps = Vec::new();
    let mut total = Recorder::new(started);
    let mut flow_report = None;
    let mut perturb_report = None;
    let mut windows_rec = None;
    let rates: Vec<f64> = match &mode {
        Mode::Sweep(r) => r.clone(),
        Mode::Rate(r) => vec![*r],
        _ => vec![],
    };
    let label = match (&mode, probe) {
        (_, Some(ProbeKind::Ttft)) => "probe ttft".to_string(),
        (_, Some(ProbeKind::Tps)) => "probe tps".to_string(),
        (_, Some(ProbeKind::P99Drift)) => "probe p99-drift".to_string(),
        (Mode::Flow(_), _) => "flow".to_string(),
        (Mode::Concurrency(c), _) => format!("c={c}"),
        _ => "rate".to_string(),
    };
    let run_step = |label: String| {
        let step = new_step(window);
        let progress = (!args.quiet).then(|| {
            let stop = CancellationToken::new();
            (spawn_progress(ctx.live.clone(), step.rec.clone(), label, stop.clone()), stop)
        });
        (step, progress)
    };
    async fn end_progress(p: Option<(tokio::task::JoinHandle<()>, CancellationToken)>) {
        if let Some((h, stop)) = p {
            stop.cancel();
            let _ = h.await;
        }
    }
    let finish_step = |step: &Arc<Step>| -> Recorder { lock(&step.rec).clone() };
    let mut wall = Duration::ZERO;
    match &mode {
        Mode::Rate(_) | Mode::Sweep(_) => {
            for (i, &rate) in rates.iter().enumerate() {
                if ctx.hard.is_cancelled() {
                    break;
                }
                let (step, progress) = run_step(format!("{label} {rate}/s"));
                let t = Instant::now();
                open_loop(&ctx, &step, rate, args.arrivals, stop, args.seed.wrapping_add(i as u64)).await;
                let d = t.elapsed();
                wall += d;
                end_progress(progress).await;
                let r = finish_step(&step);
                if matches!(mode, Mode::Sweep(_)) {
                    sweep_steps.push(SweepStep {
                        rate,
                        results: Results::from_recorder(&r, ctx.slo.as_ref(), rci_weights, d),
                    });
                }
                if window.is_some() {
                    windows_rec = Some(r.clone());
                }
                total.merge(&r);
                if let Some(p) = &ctx.perturb {
                    perturb_report = Some(lock(&step.perturb).report(&p.name));
                }
            }
        }
        Mode::Concurrency(c) => {
            let (step, progress) = run_step(label.clone());
            let t = Instant::now();
            closed_loop(&ctx, &step, *c, stop).await;
            wall += t.elapsed();
            end_progress(progress).await;
            let r = finish_step(&step);
            total.merge(&r);
            if let Some(p) = &ctx.perturb {
                perturb_report = Some(lock(&step.perturb).report(&p.name));
            }
        }
        Mode::Flow(flow) => {
            let (step, progress) = run_step(label.clone());
            let t = Instant::now();
            flow_loop(&ctx, &step, flow.clone(), args.arrivals, stop, args.seed).await;
            wall += t.elapsed();
            end_progress(progress).await;
            let r = finish_step(&step);
            total.merge(&r);
            flow_report = Some(state_reports(flow, &lock(&step.flow)));
        }
    }
    let results = Results::from_recorder(&total, ctx.slo.as_ref(), rci_weights, wall);
    let probe_report = probe.map(|kind| {
        let (tps, decode_tps) = total.tps_summary();
        match kind {
            ProbeKind::Ttft => ProbeReport {
                kind,
                ttft: Some(if stream { results.ttft } else { results.e2e }),
                tps: None,
                decode_tps: None,
                mean_output_tokens: None,
                drift: None,
            },
            ProbeKind::Tps => ProbeReport {
                kind,
                ttft: None,
                tps,
                decode_tps,
                mean_output_tokens: results.tokens.output_mean,
                drift: None,
            },
            ProbeKind::P99Drift => ProbeReport {
                kind,
                ttft: None,
                tps: None,
                decode_tps: None,
                mean_output_tokens: None,
                drift: windows_rec.as_ref().map(|r| drift(&r.windows, args.window)),
            },
        }
    });
    let interrupted = ctx.hard.is_cancelled();
    let otlp_stats = match &ctx.otlp {
        Some(sink) => Some(sink.shutdown(Duration::from_secs(15)).await),
        None => None,
    };
    let (rate, arrivals, concurrency) = match &mode {
        Mode::Rate(r) => (Some(*r), Some(args.arrivals), None),
        Mode::Sweep(_) => (None, Some(args.arrivals), None),
        Mode::Concurrency(c) => (None, None, Some(*c)),
        Mode::Flow(_) => (None, Some(args.arrivals), None),
    };
    let mode_name = match (probe, &mode) {
        (Some(ProbeKind::Ttft), _) => "probe-ttft",
        (Some(ProbeKind::Tps), _) => "probe-tps",
        (Some(ProbeKind::P99Drift), _) => "probe-p99-drift",
        (None, Mode::Rate(_)) => "rate",
        (None, Mode::Sweep(_)) => "rate-sweep",
        (None, Mode::Concurrency(_)) => "concurrency",
        (None, Mode::Flow(_)) => "flow",
    };
    Ok(Report {
        schema: crate::report::SCHEMA,
        endpoint: args.endpoint.clone(),
        url,
        model: args.model.clone(),
        api: args.api,
        stream,
        mode: mode_name.to_string(),
        rate,
        arrivals,
        concurrency,
        seed: args.seed,
        interrupted,
        results,
        sweep: matches!(mode, Mode::Sweep(_)).then_some(sweep_steps),
        flow: flow_report,
        probe: probe_report,
        perturb: perturb_report,
        otlp: otlp_stats,
    })
}
