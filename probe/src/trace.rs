//! Trace replay (`inferwatch bench --trace FILE`): a production trace's arrival times and
//! prompt/output lengths, time-scaled, windowed, looped or sampled
//! ([`crate::arrivals::TraceSchedule`]), with prompts of exactly the trace's token count
//! (calibrated with the server's `/tokenize` where it has one) and the output length forced
//! with `max_tokens` + `ignore_eos`. Formats: the Azure LLM inference trace and a generic
//! CSV / JSONL (see probe/README.md, "Trace replay").

mod prompt;
mod read;

pub use prompt::{Built, FILLER, TokenModel, TokenSource, build, filler};
pub use read::{MAX_ROWS, Trace, TraceError, TraceFormat, TraceRow};

use crate::arrivals::{TraceSchedule, TraceTiming};
use crate::client::{Api, ErrorKind};
use crate::otlp::SpanContext;
use crate::runner::{Attempt, Ctx, Step, Stop, lock, wait_until};
use crate::{BenchArgs, BenchError};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// How prompt token counts are established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// The server's `/tokenize` when it answers, else the rule.
    #[default]
    Auto,
    /// The server's `/tokenize`, or fail.
    Server,
    /// The documented rule (Llama 3's chat template, one token per filler word).
    Rule,
}

/// A validated trace replay.
#[derive(Debug)]
pub(crate) struct TracePlan {
    pub(crate) trace: Trace,
    pub(crate) timing: TraceTiming,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) max_tokens_cap: Option<u32>,
    pub(crate) rows_per_lap: usize,
    pub(crate) period_s: f64,
}

impl TracePlan {
    /// Reads the trace named by `--trace` and checks the replay options.
    pub(crate) fn from_args(a: &BenchArgs) -> Result<TracePlan, BenchError> {
        let Some(path) = &a.trace else {
            return Err(BenchError::Usage("--trace is missing".into()));
        };
        let trace = Trace::load(path).map_err(|e| BenchError::Usage(e.to_string()))?;
        let timing = TraceTiming {
            speed: a.trace_speed,
            start_s: a.trace_start.map_or(0.0, |d| d.as_secs_f64()),
            duration_s: a.trace_duration.map(|d| d.as_secs_f64()),
            looped: a.trace_loop,
            sample: a.trace_sample,
            seed: a.seed,
        };
        let sched =
            TraceSchedule::new(&trace.times(), timing).map_err(|e| BenchError::Usage(format!("--trace-{e}")))?;
        if timing.looped && a.duration.is_none() && a.requests.is_none() {
            return Err(BenchError::Usage("--trace-loop replays forever: give --duration or --requests".into()));
        }
        Ok(TracePlan {
            rows_per_lap: sched.rows_per_lap(),
            period_s: sched.period_s(),
            trace,
            timing,
            tokenizer: a.trace_tokenizer,
            max_tokens_cap: a.max_tokens,
        })
    }
}

/// One request whose served token counts differ from the trace's.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Mismatch {
    /// Line of the row in the trace file.
    pub line: usize,
    /// Pass over the trace (looping).
    pub lap: u64,
    /// Prompt tokens in the trace.
    pub input_tokens: u32,
    /// Prompt tokens the server counted.
    pub served_input_tokens: u64,
    /// Output tokens asked for.
    pub output_tokens: u32,
    /// Output tokens the server produced.
    pub served_output_tokens: u64,
}

/// Summary of a token-count distribution.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Quantiles {
    /// Requests counted.
    pub n: u64,
    /// Mean.
    pub mean: f64,
    /// Median (to 3 significant digits, as the 90th and 99th).
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

/// Token counts of the replayed requests: the trace's and what the server served, over the
/// completed requests that reported usage.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct TokenStats {
    /// As the trace says (outputs: after `--max-tokens`).
    pub trace: Quantiles,
    /// As the server's `usage` says.
    pub served: Quantiles,
}

/// What a trace replay did (the report's `trace` section).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceReport {
    /// The trace file.
    pub file: String,
    /// Its format.
    pub format: TraceFormat,
    /// Rows in the file.
    pub rows: usize,
    /// Sessions (multi-turn conversations) in the file.
    pub sessions: usize,
    /// `--trace-speed`.
    pub speed: f64,
    /// `--trace-loop`.
    pub looped: bool,
    /// `--trace-sample`.
    pub sample: Option<f64>,
    /// `--trace-start`, trace seconds.
    pub start_s: f64,
    /// `--trace-duration`, trace seconds.
    pub duration_s: Option<f64>,
    /// Length of one pass over the window, trace seconds.
    pub period_s: f64,
    /// Rows in the window.
    pub rows_per_lap: usize,
    /// How prompt lengths were established.
    pub tokens: TokenModel,
    /// Arrivals the schedule produced (after sampling).
    pub scheduled: u64,
    /// Arrivals sent (the others overflowed --max-in-flight or came after a stop).
    pub sent: u64,
    /// Arrivals dropped because --max-in-flight requests were in flight.
    pub overflow: u64,
    /// Requests answered.
    pub completed: u64,
    /// Requests failed (after retries).
    pub failed: u64,
    /// Completed requests whose server reported usage (compared with the trace).
    pub compared: u64,
    /// Of those, served prompt tokens equal to the trace's.
    pub input_exact: u64,
    /// Of those, output tokens equal to the trace's.
    pub output_exact: u64,
    /// Completed requests without usage in the answer.
    pub usage_missing: u64,
    /// Prompts that could not have the trace's length (template or history longer).
    pub prompts_clamped: u64,
    /// The first mismatching requests (at most 10).
    pub mismatches: Vec<Mismatch>,
    /// Largest delay of a send after its scheduled time, seconds.
    pub max_send_lag_s: f64,
    /// Arrivals per trace minute of the schedule (from the window's start).
    pub per_minute_scheduled: Vec<u64>,
    /// Arrivals per trace minute as actually sent (send time × speed).
    pub per_minute_sent: Vec<u64>,
    /// Prompt tokens.
    pub input_tokens: TokenStats,
    /// Output tokens.
    pub output_tokens: TokenStats,
}

impl TraceReport {
    /// A few lines for the final table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n  trace {} ({:?}, {} rows, {}× speed{}{}): {} scheduled, {} sent, {} overflow, max lag {:.3} s",
            self.file,
            self.format,
            self.rows,
            self.speed,
            if self.looped { ", looped" } else { "" },
            self.sample.map(|p| format!(", sample {p}")).unwrap_or_default(),
            self.scheduled,
            self.sent,
            self.overflow,
            self.max_send_lag_s
        );
        let _ = writeln!(
            out,
            "  tokens ({:?}): prompt exact {}/{}, output exact {}/{}, clamped {}, no usage {}",
            self.tokens.source,
            self.input_exact,
            self.compared,
            self.output_exact,
            self.compared,
            self.prompts_clamped,
            self.usage_missing
        );
        let q = |s: &Quantiles| format!("p50 {} p90 {} p99 {} mean {:.1}", s.p50, s.p90, s.p99, s.mean);
        let _ = writeln!(
            out,
            "  prompt tokens  trace {}  served {}",
            q(&self.input_tokens.trace),
            q(&self.input_tokens.served)
        );
        let _ = writeln!(
            out,
            "  output tokens  trace {}  served {}",
            q(&self.output_tokens.trace),
            q(&self.output_tokens.served)
        );
        out
    }
}

/// Token-count histogram (bounded memory; quantiles to 3 significant digits, mean and
/// maximum exact).
struct Hist {
    h: Option<hdrhistogram::Histogram<u64>>,
    n: u64,
    sum: u128,
    max: u64,
}

impl Hist {
    fn new() -> Hist {
        Hist { h: hdrhistogram::Histogram::new_with_bounds(1, 1 << 26, 3).ok(), n: 0, sum: 0, max: 0 }
    }
    fn record(&mut self, v: u64) {
        if let Some(h) = &mut self.h {
            h.saturating_record(v.max(1));
        }
        self.n += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }
    fn summary(&self) -> Quantiles {
        match &self.h {
            Some(h) if self.n > 0 => Quantiles {
                n: self.n,
                mean: self.sum as f64 / self.n as f64,
                p50: h.value_at_quantile(0.5),
                p90: h.value_at_quantile(0.9),
                p99: h.value_at_quantile(0.99),
                max: self.max,
            },
            _ => Quantiles::default(),
        }
    }
}

/// Most trace minutes the per-minute profile holds.
const MAX_MINUTES: usize = 100_000;

fn bump(v: &mut Vec<u64>, trace_s: f64) {
    let m = (trace_s.max(0.0) / 60.0) as usize;
    if m < MAX_MINUTES {
        if v.len() <= m {
            v.resize(m + 1, 0);
        }
        v[m] += 1;
    }
}

struct Agg {
    scheduled: u64,
    sent: u64,
    overflow: u64,
    completed: u64,
    failed: u64,
    compared: u64,
    input_exact: u64,
    output_exact: u64,
    usage_missing: u64,
    clamped: u64,
    mismatches: Vec<Mismatch>,
    max_lag: f64,
    per_min_sched: Vec<u64>,
    per_min_sent: Vec<u64>,
    in_trace: Hist,
    in_served: Hist,
    out_trace: Hist,
    out_served: Hist,
}

impl Agg {
    fn new() -> Agg {
        Agg {
            scheduled: 0,
            sent: 0,
            overflow: 0,
            completed: 0,
            failed: 0,
            compared: 0,
            input_exact: 0,
            output_exact: 0,
            usage_missing: 0,
            clamped: 0,
            mismatches: Vec::new(),
            max_lag: 0.0,
            per_min_sched: Vec::new(),
            per_min_sent: Vec::new(),
            in_trace: Hist::new(),
            in_served: Hist::new(),
            out_trace: Hist::new(),
            out_served: Hist::new(),
        }
    }
}

/// The root of a server (its `/tokenize` is there): the endpoint without `/v1/...`.
fn server_root(endpoint: &str) -> String {
    let mut e = endpoint.trim_end_matches('/');
    for suffix in ["/chat/completions", "/completions"] {
        e = e.strip_suffix(suffix).unwrap_or(e);
    }
    e.strip_suffix("/v1").unwrap_or(e).to_string()
}

/// Token count from a `/tokenize` answer: vLLM's `{"count": n, "tokens": [...]}` or TGI's
/// list of tokens.
fn tokenize_count(v: &serde_json::Value) -> Option<u32> {
    use serde_json::Value;
    match v {
        Value::Object(o) => match o.get("count").and_then(Value::as_u64) {
            Some(n) => u32::try_from(n).ok(),
            None => o.get("tokens").and_then(Value::as_array).and_then(|a| u32::try_from(a.len()).ok()),
        },
        Value::Array(a) => u32::try_from(a.len()).ok(),
        _ => None,
    }
}

/// One `/tokenize` call: the token count of `body`.
async fn tokenize(
    http: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    body: serde_json::Value,
) -> Result<u32, String> {
    let mut req = http.post(url).json(&body);
    if let Some(k) = api_key.filter(|k| !k.is_empty()) {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = r.status();
    if !status.is_success() {
        return Err(format!("{url}: HTTP {}", status.as_u16()));
    }
    let v: serde_json::Value = r.json().await.map_err(|e| format!("{url}: not JSON: {e}"))?;
    tokenize_count(&v).ok_or_else(|| format!("{url}: no token count in the answer"))
}

/// Asks a server's `/tokenize` for the token counts of filler prompts and derives the
/// template's overhead; errors when the server has no usable `/tokenize` or the filler words
/// are not one token each in its vocabulary.
pub async fn calibrate(
    endpoint: &str,
    api: Api,
    model: &str,
    api_key: Option<&str>,
    insecure: bool,
) -> Result<TokenModel, String> {
    crate::client::install_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .tls_danger_accept_invalid_certs(insecure)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let url = format!("{}/tokenize", server_root(endpoint));
    let (http, url) = (&http, url.as_str());
    let post = |body: serde_json::Value| tokenize(http, url, api_key, body);
    let w = |n: u32, k: u64| filler(n, k);
    let msgs =
        |m: &[(&str, String)]| m.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c})).collect::<Vec<_>>();
    let vllm = |m: Vec<serde_json::Value>, text: String| match api {
        Api::Chat => serde_json::json!({"model": model, "messages": m, "add_generation_prompt": true}),
        _ => serde_json::json!({"model": model, "prompt": text}),
    };
    let (a16, a48) = (w(16, 1), w(48, 2));
    // vLLM shape first.
    let first = post(vllm(msgs(&[("user", a16.clone())]), a16.clone())).await;
    if let Ok(c1) = first {
        let c2 = post(vllm(msgs(&[("user", a48.clone())]), a48.clone())).await?;
        if c1.checked_add(32) != Some(c2) {
            return Err(format!(
                "{url}: 32 more filler words gave {} more tokens, not 32",
                i64::from(c2) - i64::from(c1)
            ));
        }
        let model_ = match api {
            Api::Chat => {
                let c3 =
                    post(vllm(msgs(&[("user", w(16, 3)), ("assistant", w(16, 4)), ("user", w(16, 5))]), String::new()))
                        .await?;
                let extra = i64::from(c3) - i64::from(c1) - 32;
                if extra < 0 || extra % 2 != 0 || i64::from(c1) - 16 < extra / 2 {
                    return Err(format!("{url}: inconsistent template overhead ({c1}, {c3})"));
                }
                let per = (extra / 2) as u32;
                TokenModel { base: c1 - 16 - per, per_message: per, source: TokenSource::Server }
            }
            _ => {
                if c1 < 16 {
                    return Err(format!("{url}: 16 filler words gave {c1} tokens"));
                }
                TokenModel { base: c1 - 16, per_message: 0, source: TokenSource::Server }
            }
        };
        return Ok(model_);
    }
    // TGI shape: text only.
    let c1 = post(serde_json::json!({"inputs": a16})).await.map_err(|e| match &first {
        Err(f) => format!("{f}; {e}"),
        Ok(_) => e,
    })?;
    let c2 = post(serde_json::json!({"inputs": a48})).await?;
    if c1.checked_add(32) != Some(c2) || c1 < 16 {
        return Err(format!("{url}: filler words are not one token each ({c1}, {c2})"));
    }
    Ok(match api {
        Api::Chat => TokenModel { source: TokenSource::ServerText, ..TokenModel::rule(Api::Chat) },
        _ => TokenModel { base: c1 - 16, per_message: 0, source: TokenSource::ServerText },
    })
}

/// The prompt and forced output length of one scheduled arrival.
fn request_of(plan: &TracePlan, row: usize, lap: u64, seed: u64, api: Api, model: &TokenModel) -> (Built, u32) {
    let b = build(&plan.trace, row, lap, seed, api, model);
    let out = plan.trace.rows.get(row).map_or(1, |r| r.output_tokens);
    (b, plan.max_tokens_cap.map_or(out, |c| out.min(c)).max(1))
}

/// Replays the trace until it ends, `stop` says so, or the run is cancelled.
pub(crate) async fn replay(
    ctx: &Arc<Ctx>,
    step: &Arc<Step>,
    plan: Arc<TracePlan>,
    stop: Stop,
) -> Result<TraceReport, BenchError> {
    let cfg = ctx.client.config();
    let api = cfg.api;
    let model = match plan.tokenizer {
        Tokenizer::Rule => TokenModel::rule(api),
        Tokenizer::Server | Tokenizer::Auto => {
            match calibrate(&cfg.endpoint, api, &cfg.model, cfg.api_key.as_deref(), cfg.insecure).await {
                Ok(m) => m,
                Err(e) if plan.tokenizer == Tokenizer::Server => {
                    return Err(BenchError::Usage(format!("--trace-tokenizer server: {e}")));
                }
                Err(e) => {
                    tracing::info!(reason = %e, "no usable /tokenize; prompt lengths follow the documented rule");
                    TokenModel::rule(api)
                }
            }
        }
    };
    let agg = Arc::new(Mutex::new(Agg::new()));
    let sem = Arc::new(Semaphore::new(ctx.max_in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let schedule = TraceSchedule::new(&plan.trace.times(), plan.timing).map_err(BenchError::Usage)?;
    let start = tokio::time::Instant::now();
    let deadline = stop.duration.map(|d| start + d);
    let speed = plan.timing.speed;
    for (n, s) in schedule.enumerate() {
        if stop.requests.is_some_and(|r| n as u64 >= r) {
            break;
        }
        let at = start + s.at;
        if deadline.is_some_and(|d| at >= d) {
            break;
        }
        if !wait_until(at, &ctx.hard).await {
            break;
        }
        let lag = start.elapsed().saturating_sub(s.at).as_secs_f64();
        {
            let mut a = lock(&agg);
            a.scheduled += 1;
            bump(&mut a.per_min_sched, s.trace_s);
        }
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            lock(&agg).overflow += 1;
            lock(&step.rec).overflow += 1;
            ctx.live.overflow.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            continue;
        };
        {
            let mut a = lock(&agg);
            a.sent += 1;
            a.max_lag = a.max_lag.max(lag);
            bump(&mut a.per_min_sent, (s.at.as_secs_f64() + lag) * speed);
        }
        let (c, st, p, ag) = (ctx.clone(), step.clone(), plan.clone(), agg.clone());
        tasks.spawn(async move {
            let (built, max_tokens) = request_of(&p, s.row, s.lap, c.seed, api, &model);
            let mut a = Attempt {
                prompt: &built.prompt,
                reference: None,
                max_tokens,
                timeout: c.timeout,
                keep_text: false,
                images: &[],
                span: SpanContext::default(),
            };
            let o = c.with_retries(&st, &mut a, c.max_retries, None).await;
            drop(permit);
            if o.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Cancelled) {
                return;
            }
            let want_in = p.trace.rows.get(s.row).map_or(0, |r| r.input_tokens);
            let line = p.trace.rows.get(s.row).map_or(0, |r| r.line);
            let mut g = lock(&ag);
            if !built.exact {
                g.clamped += 1;
            }
            if !o.ok() {
                g.failed += 1;
                return;
            }
            g.completed += 1;
            if !o.usage_reported {
                g.usage_missing += 1;
                return;
            }
            g.compared += 1;
            g.in_trace.record(u64::from(want_in));
            g.in_served.record(o.input_tokens);
            g.out_trace.record(u64::from(max_tokens));
            g.out_served.record(o.output_tokens);
            let in_ok = o.input_tokens == u64::from(want_in);
            let out_ok = o.output_tokens == u64::from(max_tokens);
            g.input_exact += u64::from(in_ok);
            g.output_exact += u64::from(out_ok);
            if !(in_ok && out_ok) && g.mismatches.len() < 10 {
                g.mismatches.push(Mismatch {
                    line,
                    lap: s.lap,
                    input_tokens: want_in,
                    served_input_tokens: o.input_tokens,
                    output_tokens: max_tokens,
                    served_output_tokens: o.output_tokens,
                });
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let a = lock(&agg);
    let t = &plan.timing;
    Ok(TraceReport {
        file: plan.trace.path.display().to_string(),
        format: plan.trace.format,
        rows: plan.trace.rows.len(),
        sessions: plan.trace.sessions,
        speed: t.speed,
        looped: t.looped,
        sample: t.sample,
        start_s: t.start_s,
        duration_s: t.duration_s,
        period_s: plan.period_s,
        rows_per_lap: plan.rows_per_lap,
        tokens: model,
        scheduled: a.scheduled,
        sent: a.sent,
        overflow: a.overflow,
        completed: a.completed,
        failed: a.failed,
        compared: a.compared,
        input_exact: a.input_exact,
        output_exact: a.output_exact,
        usage_missing: a.usage_missing,
        prompts_clamped: a.clamped,
        mismatches: a.mismatches.clone(),
        max_send_lag_s: a.max_lag,
        per_minute_scheduled: a.per_min_sched.clone(),
        per_minute_sent: a.per_min_sent.clone(),
        input_tokens: TokenStats { trace: a.in_trace.summary(), served: a.in_served.summary() },
        output_tokens: TokenStats { trace: a.out_trace.summary(), served: a.out_served.summary() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_counts() {
        assert_eq!(server_root("http://h:8000/v1/chat/completions"), "http://h:8000");
        assert_eq!(server_root("http://h:8000/v1/"), "http://h:8000");
        assert_eq!(server_root("http://h:8000"), "http://h:8000");
        assert_eq!(tokenize_count(&serde_json::json!({"count": 7, "tokens": [1]})), Some(7));
        assert_eq!(tokenize_count(&serde_json::json!({"tokens": [1, 2]})), Some(2));
        assert_eq!(tokenize_count(&serde_json::json!([{"id": 1}, {"id": 2}, {"id": 3}])), Some(3));
        assert_eq!(tokenize_count(&serde_json::json!("x")), None);
    }

    /// A `/tokenize` server counting one token per word plus a template of `base` + `per` per
    /// message (vLLM's shape), or a TGI-style token list.
    async fn tokenizer_server(base: u32, per: u32, tgi: bool) -> String {
        use axum::Json;
        use serde_json::{Value, json};
        let words = |s: &str| s.split_whitespace().count() as u32;
        let handler = move |Json(b): Json<Value>| async move {
            if tgi {
                let Some(t) = b.get("inputs").and_then(Value::as_str) else {
                    return (axum::http::StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": "inputs"})));
                };
                let n = words(t) + base;
                return (axum::http::StatusCode::OK, Json(json!((0..n).map(|i| json!({"id": i})).collect::<Vec<_>>())));
            }
            let n = match (b.get("messages").and_then(Value::as_array), b.get("prompt").and_then(Value::as_str)) {
                (Some(m), _) => base + m.iter().map(|x| per + words(x["content"].as_str().unwrap_or(""))).sum::<u32>(),
                (None, Some(p)) => 1 + words(p),
                _ => return (axum::http::StatusCode::BAD_REQUEST, Json(json!({"error": "shape"}))),
            };
            (axum::http::StatusCode::OK, Json(json!({"count": n, "max_model_len": 8192, "tokens": []})))
        };
        let app = axum::Router::new().route("/tokenize", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}/v1")
    }

    #[tokio::test]
    async fn calibration_measures_the_template() {
        let url = tokenizer_server(7, 4, false).await;
        let m = calibrate(&url, Api::Chat, "m", None, false).await.unwrap();
        assert_eq!(m, TokenModel { base: 7, per_message: 4, source: TokenSource::Server });
        let m = calibrate(&url, Api::Completions, "m", None, false).await.unwrap();
        assert_eq!(m, TokenModel { base: 1, per_message: 0, source: TokenSource::Server });
        let tgi = tokenizer_server(0, 0, true).await;
        let m = calibrate(&tgi, Api::Completions, "m", None, false).await.unwrap();
        assert_eq!(m, TokenModel { base: 0, per_message: 0, source: TokenSource::ServerText });
        let m = calibrate(&tgi, Api::Chat, "m", None, false).await.unwrap();
        assert_eq!((m.base, m.per_message, m.source), (5, 5, TokenSource::ServerText));
        // No /tokenize at all: an error naming the URL (the run then falls back to the rule).
        let none = format!("{}/nothing", tgi.trim_end_matches("/v1"));
        let e = calibrate(&none, Api::Chat, "m", None, false).await.unwrap_err();
        assert!(e.contains("/nothing/tokenize: HTTP 404"), "{e}");
    }

    #[test]
    fn minute_profile() {
        let mut v = Vec::new();
        for t in [0.0, 59.9, 60.0, 185.0] {
            bump(&mut v, t);
        }
        assert_eq!(v, vec![2, 1, 0, 1]);
    }
}
