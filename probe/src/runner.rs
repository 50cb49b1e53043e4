//! Load drivers: open loop (constant / Poisson, bounded in flight), closed loop
//! (concurrency), rate sweeps, the study's probes and perturbation pairs (flows: `flows.rs`);
//! the validated plan, the shared run state, and the report assembly.

use crate::arrivals::{ArrivalKind, Arrivals};
use crate::client::{Client, ClientConfig, ErrorKind, Outcome, Prompt, RequestSpec};
use crate::config::Flow;
use crate::dataset::{self, PromptSource, References};
use crate::flows::{FlowAgg, flow_loop, state_reports};
use crate::hooks::{self, Chain, Finalized, Hook, HookRequest, builtin};
use crate::images::{ImageOptions, ImageSource};
use crate::metrics::{Recorder, Slo};
use crate::otlp::{self, Common, OtlpSink, SpanContext};
use crate::perturb::{PerturbAgg, PerturbType, Perturbation, Profile, perturb_prompt};
use crate::probes::{ProbeKind, ProbeReport, drift};
use crate::quality::{RciWeights, Reference};
use crate::report::{Live, Report, Results, SweepStep, spawn_progress};
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
    Trace(Arc<crate::trace::TracePlan>),
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
    hooks: Vec<hooks::ExternalSpec>,
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
        if a.hook_timeout.is_zero() {
            return Err(usage("--hook-timeout must be positive"));
        }
        let hooks = hooks::external_specs(a.config.as_deref(), &a.hooks, a.hook_timeout).map_err(usage)?;
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
            (None, BenchArgs { trace: Some(_), .. }) => Mode::Trace(Arc::new(crate::trace::TracePlan::from_args(a)?)),
            (None, BenchArgs { rate: Some(r), .. }) => Mode::Rate(*r),
            (None, BenchArgs { rate_sweep: Some(s), .. }) => Mode::Sweep(s.clone()),
            (None, BenchArgs { concurrency: Some(c), .. }) => Mode::Concurrency(*c),
            (None, BenchArgs { flow: Some(path), .. }) => Mode::Flow(Arc::new(Flow::load(path)?)),
            (None, _) => {
                return Err(usage(
                    "choose a load: --rate R, --rate-sweep R1,R2,..., --concurrency C, --flow FILE, --trace FILE or --probe",
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
            (None, None, None) if matches!(mode, Mode::Trace(_)) => Stop { duration: None, requests: None },
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
        let images = ImageOptions::from_args(a).map_err(usage)?;
        if images.is_some() && matches!(mode, Mode::Flow(_) | Mode::Trace(_)) {
            return Err(usage("--images-per-request works with --rate, --concurrency and --probe"));
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
            temperature: a.temperature.or((perturb.is_some() || a.image_mask_ratio.is_some()).then_some(0.0)),
            ignore_eos: a.ignore_eos || probe == Some(ProbeKind::Tps) || a.trace.is_some(),
            logprobs: a.logprobs,
            pool_size: 1024,
        };
        Ok(Plan {
            args: a.clone(),
            mode,
            stop,
            client,
            prompts,
            refs,
            max_tokens,
            slo,
            perturb,
            rci_weights,
            probe,
            hooks,
        })
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
    /// The images requests carry (`--images-per-request`).
    pub(crate) images: Option<ImageSource>,
    /// `--image-mask-ratio`.
    pub(crate) image_mask_ratio: Option<f64>,
    pub(crate) seed: u64,
    pub(crate) rci_weights: RciWeights,
    pub(crate) max_in_flight: usize,
    pub(crate) max_users: Option<u64>,
    pub(crate) otlp: Option<OtlpSink>,
    pub(crate) live: Arc<Live>,
    /// The plug-in hooks (built-in and external), in order.
    pub(crate) hooks: Chain,
    /// Ids of the attempts, for the hooks.
    pub(crate) next_id: AtomicU64,
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
    /// Image URLs sent with the last user message.
    pub(crate) images: &'a [String],
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
        // The hooks see (and may rewrite) the request; RCI is the built-in RCI hook's.
        let mut req = HookRequest {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            attempt: a.span.attempt.max(1),
            index: a.span.index,
            variant: a.span.perturbation.clone(),
            state: a.span.state.clone(),
            api: self.client.config().api,
            prompt: std::borrow::Cow::Borrowed(a.prompt),
            max_tokens: a.max_tokens,
            params: serde_json::Map::new(),
            metadata: serde_json::Map::new(),
            reference: a.reference.clone(),
        };
        self.hooks.pre_inference(&mut req).await;
        let spec = RequestSpec {
            prompt: &req.prompt,
            max_tokens: req.max_tokens,
            keep_text: a.keep_text,
            reference: None,
            rci_weights: self.rci_weights,
            traceparent,
            timeout: a.timeout,
            params: Some(&req.params),
            record_tokens: self.hooks.wants_tokens(&req),
            images: a.images,
        };
        let live = &self.live;
        live.sent.fetch_add(1, Ordering::Relaxed);
        live.inflight.fetch_add(1, Ordering::Relaxed);
        let mut o = self.client.execute(&spec, &self.hard).await;
        live.inflight.fetch_sub(1, Ordering::Relaxed);
        if o.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Cancelled) {
            return o;
        }
        let tokens = std::mem::take(&mut o.tokens);
        let fin = self.hooks.finish(&req, &tokens, &mut o).await;
        drop(tokens);
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
            a.span.tle = fin.tle_bits;
            a.span.max_tokens = req.max_tokens;
            a.span.hook_attributes = hook_attributes(&req, &fin);
            sink.request(&o, &a.span);
            for m in &fin.metrics {
                sink.hook_metric(&m.hook, &m.name, m.value);
            }
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

    /// The paired run's perturbations (text distractors, image masking).
    pub(crate) fn perturbation(&self) -> Perturbation {
        Perturbation {
            text: self.perturb.clone(),
            image_mask_ratio: self.image_mask_ratio.filter(|_| self.images.is_some()),
        }
    }

    /// The image URLs of prompt `item` (masked by `mask_ratio`); none without `--images-per-request`.
    fn image_urls(&self, item: u64, mask_ratio: f64) -> Vec<String> {
        let Some(src) = &self.images else { return Vec::new() };
        src.urls(item, mask_ratio).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot make the images of a request; sending it without");
            Vec::new()
        })
    }

    /// One arrival of the open or closed loop: a prompt (and its perturbed twins, one per
    /// perturbation type).
    async fn job(&self, step: &Step) {
        let (idx, item) = self.prompts.next();
        let max_tokens = item.max_tokens.unwrap_or(self.max_tokens);
        // A prompt's images follow it (its place in the dataset or synthetic pool).
        let pool_index = idx % self.prompts.len().max(1) as u64;
        let images = self.image_urls(pool_index, 0.0);
        let perturbation = self.perturbation();
        let types = perturbation.types();
        let mut a = Attempt {
            prompt: &item.prompt,
            reference: item.reference.clone(),
            max_tokens,
            timeout: self.timeout,
            keep_text: !types.is_empty(),
            images: &images,
            span: SpanContext { index: Some(idx), ..SpanContext::default() },
        };
        if types.is_empty() {
            self.with_retries(step, &mut a, self.max_retries, None).await;
            return;
        }
        a.span.perturbation = Some("baseline".into());
        let base = self.with_retries(step, &mut a, self.max_retries, None).await;
        for t in types {
            if self.hard.is_cancelled() {
                return;
            }
            // Text alone: the built-in perturbation hook inserts the distractor (its variant is
            // the profile's name, hooks::builtin); text with masking is perturbed here.
            let prompt = match (&self.perturb, t) {
                (Some(p), PerturbType::TextImageMask) => perturb_prompt(&item.prompt, &p.distractor(self.seed, idx)),
                _ => item.prompt.clone(),
            };
            let masked;
            let twin_images = if t.masks_images() {
                masked = self.image_urls(pool_index, perturbation.image_mask_ratio.unwrap_or(0.0));
                &masked
            } else {
                &images
            };
            let variant = perturbation.variant(t);
            let mut b = Attempt {
                prompt: &prompt,
                reference: item.reference.clone(),
                max_tokens,
                timeout: self.timeout,
                keep_text: true,
                images: twin_images,
                span: SpanContext { perturbation: Some(variant.clone()), index: Some(idx), ..SpanContext::default() },
            };
            let pert = self.with_retries(step, &mut b, self.max_retries, None).await;
            lock(&step.perturb).add(t, &variant, &base, &pert);
        }
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

/// Span attributes of what the hooks added: `inferwatch.bench.hook.<metric>` (double) and
/// `inferwatch.bench.hook.meta.<key>` (the metadata's scalars).
fn hook_attributes(req: &HookRequest<'_>, fin: &Finalized) -> Vec<opentelemetry_proto::tonic::common::v1::KeyValue> {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value as V};
    let kv = |key: String, v: V| KeyValue { key, value: Some(AnyValue { value: Some(v) }), ..Default::default() };
    let mut out: Vec<KeyValue> =
        fin.metrics.iter().map(|m| kv(format!("inferwatch.bench.hook.{}", m.name), V::DoubleValue(m.value))).collect();
    for (k, v) in &req.metadata {
        let v = match v {
            serde_json::Value::Bool(b) => V::BoolValue(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => V::IntValue(i),
                None => V::DoubleValue(n.as_f64().unwrap_or(0.0)),
            },
            serde_json::Value::String(s) => V::StringValue(s.clone()),
            other => V::StringValue(other.to_string()),
        };
        out.push(kv(format!("inferwatch.bench.hook.meta.{k}"), v));
    }
    out
}

/// The run's hook chain: the built-in perturbation, TLE and RCI hooks, then the external
/// hooks in the order given (config file, then `--hook`), each started and greeted.
async fn start_hooks(
    specs: &[hooks::ExternalSpec],
    perturb: Option<&Profile>,
    seed: u64,
    tle: bool,
    rci_weights: RciWeights,
    info: &hooks::external::BenchInfo,
) -> Result<Chain, BenchError> {
    let mut chain: Vec<Arc<dyn Hook>> = Vec::new();
    if let Some(p) = perturb {
        chain.push(Arc::new(builtin::PerturbHook::new(p.clone(), seed)));
    }
    if tle {
        chain.push(Arc::new(builtin::TleHook));
    }
    chain.push(Arc::new(builtin::RciHook::new(rci_weights)));
    for spec in specs {
        let mut spec = spec.clone();
        // Distinct names: the report and the OTLP attributes key on them.
        let taken = |n: &str| chain.iter().any(|h| h.name() == n);
        if let Some(n) = &spec.name
            && taken(n)
        {
            return Err(BenchError::Usage(format!("two hooks are named {n:?}")));
        }
        let mut h = hooks::ExternalHook::start(&spec, info).await.map_err(BenchError::Usage)?;
        if taken(h.name()) {
            let base = h.name().to_string();
            let name = (2..).map(|i| format!("{base}#{i}")).find(|n| !taken(n)).unwrap_or(base);
            h.shutdown().await;
            spec.name = Some(name);
            h = hooks::ExternalHook::start(&spec, info).await.map_err(BenchError::Usage)?;
        }
        let health = h.health();
        if health.state != "ok" {
            tracing::warn!(hook = h.name(), detail = ?health.detail, "bench: hook did not start; the run goes on without it");
        }
        chain.push(Arc::new(h));
    }
    Ok(Chain::new(chain))
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
    let Plan { args, mode, stop, client, prompts, refs, max_tokens, slo, perturb, rci_weights, probe, hooks } = plan;
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
    let info = hooks::external::BenchInfo { model: args.model.clone(), url: url.clone(), api: args.api, stream };
    let hooks = start_hooks(&hooks, perturb.as_ref(), args.seed, args.logprobs.is_some(), rci_weights, &info).await?;
    let ctx = Arc::new(Ctx {
        client,
        prompts,
        refs,
        max_tokens,
        timeout: args.timeout,
        max_retries: args.max_retries,
        slo,
        perturb,
        images: match ImageOptions::from_args(&args).map_err(BenchError::Usage)? {
            Some(o) => Some(o.start(args.seed).await.map_err(BenchError::Runtime)?),
            None => None,
        },
        image_mask_ratio: args.image_mask_ratio,
        seed: args.seed,
        rci_weights,
        max_in_flight: usize::try_from(args.max_in_flight).unwrap_or(usize::MAX).max(1),
        max_users: args.max_users,
        otlp,
        live: Arc::new(Live::default()),
        hooks,
        next_id: AtomicU64::new(1),
        hard,
    });
    let window = (probe == Some(ProbeKind::P99Drift)).then_some(args.window);
    let started = Instant::now();
    let mut sweep_steps = Vec::new();
    let mut total = Recorder::new(started);
    let mut flow_report = None;
    let mut perturb_report = None;
    let mut windows_rec = None;
    let mut trace_report = None;
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
        (Mode::Trace(_), _) => "trace".to_string(),
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
                let p = ctx.perturbation();
                if !p.types().is_empty() {
                    perturb_report = Some(lock(&step.perturb).report(&p.label()));
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
            let p = ctx.perturbation();
            if !p.types().is_empty() {
                perturb_report = Some(lock(&step.perturb).report(&p.label()));
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
        Mode::Trace(plan) => {
            let (step, progress) = run_step(label.clone());
            let t = Instant::now();
            let r = crate::trace::replay(&ctx, &step, plan.clone(), stop).await;
            wall += t.elapsed();
            end_progress(progress).await;
            trace_report = Some(r?);
            total.merge(&finish_step(&step));
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
    ctx.hooks.shutdown().await;
    let hooks_report = ctx.hooks.has_external().then(|| ctx.hooks.report());
    if let Some(i) = &ctx.images {
        i.shutdown().await;
    }
    let otlp_stats = match &ctx.otlp {
        Some(sink) => Some(sink.shutdown(Duration::from_secs(15)).await),
        None => None,
    };
    let (rate, arrivals, concurrency) = match &mode {
        Mode::Rate(r) => (Some(*r), Some(args.arrivals), None),
        Mode::Sweep(_) => (None, Some(args.arrivals), None),
        Mode::Concurrency(c) => (None, None, Some(*c)),
        Mode::Flow(_) => (None, Some(args.arrivals), None),
        Mode::Trace(_) => (None, None, None),
    };
    let mode_name = match (probe, &mode) {
        (Some(ProbeKind::Ttft), _) => "probe-ttft",
        (Some(ProbeKind::Tps), _) => "probe-tps",
        (Some(ProbeKind::P99Drift), _) => "probe-p99-drift",
        (None, Mode::Rate(_)) => "rate",
        (None, Mode::Sweep(_)) => "rate-sweep",
        (None, Mode::Concurrency(_)) => "concurrency",
        (None, Mode::Flow(_)) => "flow",
        (None, Mode::Trace(_)) => "trace",
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
        hooks: hooks_report,
        trace: trace_report,
    })
}
