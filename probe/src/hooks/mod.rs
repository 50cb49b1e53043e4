//! Plug-in hooks of the bench's request life cycle (probe/README.md, "Plug-in hooks").
//!
//! Three points: `pre_inference` (may rewrite the request — messages or prompt, `max_tokens`,
//! extra body parameters — and add metadata carried to the report and the span),
//! `post_decode` (sees each streamed token with its time since the request was sent, batched
//! per request once the answer has ended) and `metric_finalize` (may add per-request metrics
//! to the report and to the OTLP output). A hook is a [`Hook`]: built-in ones in Rust
//! ([`builtin`]: TLE, RCI, perturbation) and external processes speaking JSON lines over
//! stdin/stdout ([`external`]). A [`Chain`] runs them in order and counts what failed: a
//! failing hook is reported, never fatal.

pub mod builtin;
pub mod external;

pub use external::{ExternalHook, ExternalSpec, split_command};

use crate::client::{Api, Outcome, Prompt, TokenEvent};
use crate::quality::Reference;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A point of the request life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// Before the request is sent.
    PreInference,
    /// After the answer has ended, with its tokens.
    PostDecode,
    /// After the answer has ended, to add metrics.
    MetricFinalize,
}

impl Point {
    /// The protocol name (`pre_inference`, `post_decode`, `metric_finalize`).
    pub fn name(self) -> &'static str {
        match self {
            Point::PreInference => "pre_inference",
            Point::PostDecode => "post_decode",
            Point::MetricFinalize => "metric_finalize",
        }
    }
}

/// The points a hook takes part in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Points {
    /// `pre_inference`.
    pub pre_inference: bool,
    /// `post_decode`.
    pub post_decode: bool,
    /// `metric_finalize`.
    pub metric_finalize: bool,
}

impl Points {
    /// All three points.
    pub const ALL: Points = Points { pre_inference: true, post_decode: true, metric_finalize: true };

    /// Whether `p` is among them.
    pub fn has(self, p: Point) -> bool {
        match p {
            Point::PreInference => self.pre_inference,
            Point::PostDecode => self.post_decode,
            Point::MetricFinalize => self.metric_finalize,
        }
    }
}

/// One request as the hooks see it (one attempt: a retry is a new request).
#[derive(Debug, Clone)]
pub struct HookRequest<'p> {
    /// Unique id of the attempt within the run.
    pub id: u64,
    /// Attempt number (1 for the first).
    pub attempt: u32,
    /// Index of the prompt in the dataset (or the synthetic prompt), when there is one.
    pub index: Option<u64>,
    /// Perturbation variant: `baseline` or the profile's name (paired `--perturb` runs).
    pub variant: Option<String>,
    /// Dialogue-flow state of the turn.
    pub state: Option<String>,
    /// The API called.
    pub api: Api,
    /// The prompt or conversation to send (hooks may rewrite it: `Cow::Owned` or `to_mut`).
    pub prompt: Cow<'p, Prompt>,
    /// `max_tokens` to send (hooks may rewrite it).
    pub max_tokens: u32,
    /// Extra body fields merged over the bench's own (`temperature`, `top_p`, `ignore_eos`, ...).
    pub params: Map<String, Value>,
    /// Metadata added by hooks: scalars, carried to the report, the span and later hooks.
    pub metadata: Map<String, Value>,
    /// Reference answer for RCI.
    pub reference: Option<Arc<Reference>>,
}

/// One per-request metric a hook added.
#[derive(Debug, Clone, PartialEq)]
pub struct HookMetric {
    /// The hook's name.
    pub hook: Arc<str>,
    /// The metric's name.
    pub name: String,
    /// Its value.
    pub value: f64,
}

/// What `metric_finalize` produced for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Finalized {
    /// Metrics added by hooks, in chain order.
    pub metrics: Vec<HookMetric>,
    /// TLE of the first token (the built-in TLE hook), bits.
    pub tle_bits: Option<f64>,
}

/// Why one hook call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HookError {
    /// No answer within the hook's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The hook answered with an error or with something unusable.
    #[error("{0}")]
    Failed(String),
    /// The hook process is not running (or was given up on).
    #[error("the hook is not running: {0}")]
    Dead(String),
}

/// How a hook stands, for the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// `ok`, `failed` (could not start or died), `unresponsive` (given up after timeouts).
    pub state: &'static str,
    /// Why, when not ok (exit status, stderr tail, ...).
    pub detail: Option<String>,
    /// Lines from the hook that were not valid protocol messages.
    pub protocol_errors: u64,
}

/// A hook of the request life cycle. Methods return boxed futures so that external hooks can
/// wait on their process; the defaults do nothing.
pub trait Hook: Send + Sync {
    /// The hook's name (report, span attributes, OTLP metric attributes).
    fn name(&self) -> &str;

    /// `builtin` or `external`.
    fn kind(&self) -> &'static str {
        "builtin"
    }

    /// The command line of an external hook.
    fn command(&self) -> Option<&str> {
        None
    }

    /// The points the hook takes part in.
    fn points(&self) -> Points;

    /// Whether the hook takes part in the life cycle of `req` at all (default: yes).
    fn applies(&self, _req: &HookRequest<'_>) -> bool {
        true
    }

    /// Whether the hook needs the streamed tokens of `req` (besides `post_decode`).
    fn needs_tokens(&self, _req: &HookRequest<'_>) -> bool {
        false
    }

    /// Before sending: may rewrite `req` and add metadata.
    fn pre_inference<'a>(&'a self, _req: &'a mut HookRequest<'_>) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async { Ok(()) })
    }

    /// After the answer: its tokens with their timing.
    fn post_decode<'a>(
        &'a self,
        _req: &'a HookRequest<'_>,
        _tokens: &'a [TokenEvent],
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async { Ok(()) })
    }

    /// After the answer: may add metrics to `out` (and built-ins may complete the outcome).
    fn metric_finalize<'a>(
        &'a self,
        _req: &'a HookRequest<'_>,
        _tokens: &'a [TokenEvent],
        _outcome: &'a mut Outcome,
        _out: &'a mut Finalized,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async { Ok(()) })
    }

    /// At the end of the run.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// How the hook stands.
    fn health(&self) -> Health {
        Health { state: "ok", ..Health::default() }
    }
}

/// Calls, failures and timeouts of one hook at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PointStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that failed (timeouts included).
    pub failures: u64,
    /// Calls that timed out.
    pub timeouts: u64,
}

/// count / sum / mean / min / max of one hook metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MetricSummary {
    /// Values recorded.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// Their mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl MetricSummary {
    fn new(v: f64) -> MetricSummary {
        MetricSummary { count: 1, sum: v, mean: v, min: v, max: v }
    }

    fn add(&mut self, v: f64) {
        self.count += 1;
        self.sum += v;
        self.mean = self.sum / self.count as f64;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// One hook in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookReport {
    /// Its name.
    pub name: String,
    /// `builtin` or `external`.
    pub kind: &'static str,
    /// The command line (external hooks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `ok`, `failed` or `unresponsive`.
    pub state: &'static str,
    /// Why, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `pre_inference` calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_inference: Option<PointStats>,
    /// `post_decode` calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub post_decode: Option<PointStats>,
    /// `metric_finalize` calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_finalize: Option<PointStats>,
    /// Lines that were not valid protocol messages.
    pub protocol_errors: u64,
    /// The last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Per-request metrics the hook added, by name.
    pub metrics: BTreeMap<String, MetricSummary>,
}

/// The `hooks` section of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HooksReport {
    /// The chain, in order.
    pub chain: Vec<HookReport>,
    /// Failed hook calls over the run (all hooks, all points).
    pub failures: u64,
    /// Metadata the hooks added: key → value → requests (at most 64 keys × 64 values; the
    /// rest under `(other)`).
    pub metadata: BTreeMap<String, BTreeMap<String, u64>>,
}

impl HooksReport {
    /// Lines of the final table.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "\n  hooks ({} failed calls):", self.failures);
        for h in &self.chain {
            let calls =
                [h.pre_inference, h.post_decode, h.metric_finalize].iter().flatten().map(|s| s.calls).sum::<u64>();
            if h.kind == "builtin" && calls == 0 {
                continue;
            }
            let mut line = format!("  {:<20} {:<8} {:<12}", h.name, h.kind, h.state);
            for (p, s) in [("pre", h.pre_inference), ("decode", h.post_decode), ("finalize", h.metric_finalize)] {
                if let Some(s) = s {
                    let _ = write!(line, " {p} {}/{} failed", s.failures, s.calls);
                    if s.timeouts > 0 {
                        let _ = write!(line, " ({} timeouts)", s.timeouts);
                    }
                }
            }
            let _ = writeln!(out, "{line}");
            for (name, m) in &h.metrics {
                let _ = writeln!(
                    out,
                    "    {name}: mean {:.4}  min {:.4}  max {:.4}  (n = {})",
                    m.mean, m.min, m.max, m.count
                );
            }
            if let Some(d) = h.detail.as_ref().or(h.last_error.as_ref()) {
                let _ = writeln!(out, "    {}", d.lines().next().unwrap_or_default());
            }
        }
    }
}

/// Most distinct metric names per hook in the report (later ones are still sent over OTLP
/// when under its own bound, and counted as failures here).
const MAX_METRICS: usize = 64;
/// Most metadata keys, and values per key, tallied in the report.
const MAX_META: usize = 64;

#[derive(Debug, Default)]
struct EntryStats {
    pre: PointStats,
    decode: PointStats,
    finalize: PointStats,
    last_error: Option<String>,
    metrics: BTreeMap<String, MetricSummary>,
}

struct Entry {
    hook: Arc<dyn Hook>,
    points: Points,
    name: Arc<str>,
    stats: Mutex<EntryStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The hooks of one bench run, in order; counts every call and failure.
pub struct Chain {
    entries: Vec<Entry>,
    metadata: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    external: bool,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries.iter().map(|e| &*e.name)).finish()
    }
}

impl Chain {
    /// A chain of `hooks`, run in this order at every point.
    pub fn new(hooks: Vec<Arc<dyn Hook>>) -> Chain {
        let external = hooks.iter().any(|h| h.kind() != "builtin");
        let entries = hooks
            .into_iter()
            .map(|hook| Entry {
                points: hook.points(),
                name: Arc::from(hook.name()),
                hook,
                stats: Mutex::new(EntryStats::default()),
            })
            .collect();
        Chain { entries, metadata: Mutex::new(BTreeMap::new()), external }
    }

    /// Whether the chain has no hooks.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any hook is not built in (the report then has a `hooks` section).
    pub fn has_external(&self) -> bool {
        self.external
    }

    /// Whether the tokens of `req` must be recorded.
    pub fn wants_tokens(&self, req: &HookRequest<'_>) -> bool {
        self.entries.iter().any(|e| {
            e.hook.applies(req)
                && (e.points.post_decode
                    || e.points.metric_finalize && e.hook.kind() != "builtin"
                    || e.hook.needs_tokens(req))
        })
    }

    fn failed(e: &Entry, p: Point, err: &HookError) {
        let mut s = lock(&e.stats);
        let ps = match p {
            Point::PreInference => &mut s.pre,
            Point::PostDecode => &mut s.decode,
            Point::MetricFinalize => &mut s.finalize,
        };
        ps.failures += 1;
        if matches!(err, HookError::Timeout(_)) {
            ps.timeouts += 1;
        }
        s.last_error = Some(format!("{}: {err}", p.name()));
        tracing::debug!(hook = %e.name, point = p.name(), error = %err, "bench: hook call failed");
    }

    fn called(e: &Entry, p: Point) {
        let mut s = lock(&e.stats);
        match p {
            Point::PreInference => s.pre.calls += 1,
            Point::PostDecode => s.decode.calls += 1,
            Point::MetricFinalize => s.finalize.calls += 1,
        }
    }

    /// Runs every `pre_inference` hook in order; each sees the rewrites of the ones before.
    pub async fn pre_inference(&self, req: &mut HookRequest<'_>) {
        for e in &self.entries {
            if !e.points.pre_inference || !e.hook.applies(req) {
                continue;
            }
            Self::called(e, Point::PreInference);
            if let Err(err) = e.hook.pre_inference(req).await {
                Self::failed(e, Point::PreInference, &err);
            }
        }
        if req.metadata.is_empty() {
            return;
        }
        let mut m = lock(&self.metadata);
        for (k, v) in &req.metadata {
            let value = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let key = if m.contains_key(k) || m.len() < MAX_META { k.clone() } else { "(other)".to_string() };
            let values = m.entry(key).or_default();
            let value = if values.contains_key(&value) || values.len() < MAX_META { value } else { "(other)".into() };
            *values.entry(value).or_insert(0) += 1;
        }
    }

    /// Runs every `post_decode` hook, then every `metric_finalize` hook, in order.
    pub async fn finish(&self, req: &HookRequest<'_>, tokens: &[TokenEvent], outcome: &mut Outcome) -> Finalized {
        for e in self.entries.iter().filter(|e| e.points.post_decode && e.hook.applies(req)) {
            Self::called(e, Point::PostDecode);
            if let Err(err) = e.hook.post_decode(req, tokens).await {
                Self::failed(e, Point::PostDecode, &err);
            }
        }
        let mut out = Finalized::default();
        for e in self.entries.iter().filter(|e| e.points.metric_finalize && e.hook.applies(req)) {
            Self::called(e, Point::MetricFinalize);
            let before = out.metrics.len();
            if let Err(err) = e.hook.metric_finalize(req, tokens, outcome, &mut out).await {
                Self::failed(e, Point::MetricFinalize, &err);
            }
            let mut s = lock(&e.stats);
            let mut dropped = false;
            for m in out.metrics.get_mut(before..).unwrap_or_default() {
                m.hook = e.name.clone();
                let room = s.metrics.len() < MAX_METRICS;
                match s.metrics.get_mut(&m.name) {
                    Some(x) => x.add(m.value),
                    None if room => {
                        s.metrics.insert(m.name.clone(), MetricSummary::new(m.value));
                    }
                    None => dropped = true,
                }
            }
            if dropped {
                s.last_error = Some(format!("metric_finalize: more than {MAX_METRICS} metric names"));
            }
        }
        out
    }

    /// Ends every hook (external processes are told to stop and waited for).
    pub async fn shutdown(&self) {
        for e in &self.entries {
            e.hook.shutdown().await;
        }
    }

    /// The report section.
    pub fn report(&self) -> HooksReport {
        let mut failures = 0;
        let chain = self
            .entries
            .iter()
            .map(|e| {
                let s = lock(&e.stats);
                failures += s.pre.failures + s.decode.failures + s.finalize.failures;
                let h = e.hook.health();
                HookReport {
                    name: e.name.to_string(),
                    kind: e.hook.kind(),
                    command: e.hook.command().map(str::to_string),
                    state: h.state,
                    detail: h.detail,
                    pre_inference: e.points.pre_inference.then_some(s.pre),
                    post_decode: e.points.post_decode.then_some(s.decode),
                    metric_finalize: e.points.metric_finalize.then_some(s.finalize),
                    protocol_errors: h.protocol_errors,
                    last_error: s.last_error.clone(),
                    metrics: s.metrics.clone(),
                }
            })
            .collect();
        HooksReport { chain, failures, metadata: lock(&self.metadata).clone() }
    }
}

/// One hook of the bench config file's `hooks:` list.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookEntry {
    /// The command: one string (split like a shell's words, without expansion) or a list.
    command: CommandLine,
    /// Its name (default: the hello's, else the script's file name).
    #[serde(default)]
    name: Option<String>,
    /// Timeout of one call (default `--hook-timeout`).
    #[serde(default)]
    timeout: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum CommandLine {
    Line(String),
    Argv(Vec<String>),
}

/// The bench config file (`--config FILE`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BenchFile {
    #[serde(default)]
    hooks: Vec<HookEntry>,
}

/// The external hooks of a run: the config file's `hooks:` first, then each `--hook CMD`.
pub fn external_specs(config: Option<&Path>, flags: &[String], timeout: Duration) -> Result<Vec<ExternalSpec>, String> {
    let mut specs = Vec::new();
    if let Some(path) = config {
        specs.extend(load_config(path, timeout)?);
    }
    for f in flags {
        let argv = split_command(f).map_err(|e| format!("--hook {f:?}: {e}"))?;
        specs.push(ExternalSpec { name: None, argv, timeout });
    }
    Ok(specs)
}

fn load_config(path: &Path, timeout: Duration) -> Result<Vec<ExternalSpec>, String> {
    let shown = PathBuf::from(path).display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let file: BenchFile = serde_saphyr::from_str(&text).map_err(|e| {
        let first = e.to_string().lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid YAML").trim().to_string();
        format!("{shown}: {first}")
    })?;
    file.hooks
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let at = format!("{shown}: hooks[{i}]");
            let argv = match h.command {
                CommandLine::Line(s) => split_command(&s).map_err(|e| format!("{at}: command: {e}"))?,
                CommandLine::Argv(v) if v.is_empty() || v[0].is_empty() => {
                    return Err(format!("{at}: command must not be empty"));
                }
                CommandLine::Argv(v) => v,
            };
            let timeout = match h.timeout.as_deref() {
                None => timeout,
                Some(t) => match crate::parse_duration(t) {
                    Ok(d) if !d.is_zero() => d,
                    Ok(_) => return Err(format!("{at}: timeout must be positive")),
                    Err(e) => return Err(format!("{at}: timeout: {e}")),
                },
            };
            if let Some(n) = &h.name
                && n.trim().is_empty()
            {
                return Err(format!("{at}: name must not be empty"));
            }
            Ok(ExternalSpec { name: h.name, argv, timeout })
        })
        .collect()
}

#[cfg(test)]
mod tests;
