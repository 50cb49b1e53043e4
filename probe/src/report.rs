//! Results: the JSON report (`--json FILE`), the final table, and the live progress line.

use crate::arrivals::ArrivalKind;
use crate::client::Api;
use crate::metrics::{Recorder, Slo, Summary};
use crate::otlp::OtlpStats;
use crate::probes::ProbeReport;
use crate::quality::RciWeights;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Version tag of the JSON layout.
pub const SCHEMA: &str = "inferwatch.bench/v1";

/// Request counts.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Requests {
    /// Attempts sent (retries included).
    pub sent: u64,
    /// Successful answers.
    pub completed: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Arrivals not sent because --max-in-flight requests were in flight.
    pub overflow: u64,
    /// Attempts that were retries.
    pub retries: u64,
}

/// Throughput over the measured duration.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Throughput {
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Prompt tokens per second (successful requests).
    pub input_tokens_per_s: f64,
    /// Output tokens per second (successful requests).
    pub output_tokens_per_s: f64,
    /// Both.
    pub total_tokens_per_s: f64,
}

/// Goodput: requests meeting every SLO.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Goodput {
    /// The objectives, seconds.
    pub slo: Slo,
    /// Requests that met all of them.
    pub requests_met: u64,
    /// Their share of all requests sent (failures never meet an SLO).
    pub share: f64,
    /// Their rate per second.
    pub requests_per_s: f64,
}

/// Token totals.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Tokens {
    /// Prompt tokens of successful requests.
    pub input_total: u64,
    /// Output tokens of successful requests.
    pub output_total: u64,
    /// Mean prompt tokens.
    pub input_mean: Option<f64>,
    /// Mean output tokens.
    pub output_mean: Option<f64>,
    /// Successful requests whose server reported `usage` (the rest are counted or estimated).
    pub usage_reported: u64,
}

/// TLE of the first token.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TleReport {
    /// K of the top-K log-probabilities seen.
    pub k: usize,
    /// Entropy of the renormalised top K in bits: a lower bound of the full-vocabulary TLE.
    pub bits: Summary,
    /// The threshold for K = `k`: half of log2 K bits, at most the study's full-vocabulary
    /// 8.5 bits (`quality::tle_threshold_bits`; the 8.5 bits themselves are out of reach of a
    /// top-K entropy, log2 K bits at most).
    pub threshold_bits: f64,
    /// Share of first tokens above the threshold of their own K (highly uncertain).
    pub share_uncertain: f64,
    /// How to read the numbers.
    pub note: &'static str,
}

/// RCI against reference answers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RciReport {
    /// RCI per answer.
    pub rci: Summary,
    /// BLEU-4 per answer.
    pub bleu: Summary,
    /// Repeated-trigram ratio per answer.
    pub repetition: Summary,
    /// Weights used (β = 0: no semantic model).
    pub weights: RciWeights,
    /// Whether a semantic similarity was used.
    pub semantic: bool,
}

/// Output-quality results.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Quality {
    /// First-token entropy, with `--logprobs`.
    pub tle: Option<TleReport>,
    /// Consistency index, with reference answers.
    pub rci: Option<RciReport>,
}

/// The measurements of one run or sweep step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Results {
    /// Wall time of the run, seconds: from the start to the last answer, and at least
    /// `--duration` (the rates divide by it).
    pub duration_s: f64,
    /// Counts.
    pub requests: Requests,
    /// Throughput.
    pub throughput: Throughput,
    /// Goodput, with `--slo`.
    pub goodput: Option<Goodput>,
    /// Time to first token (streamed, successful requests), seconds.
    pub ttft: Summary,
    /// Inter-token latency (gaps between chunks with output), seconds.
    pub itl: Summary,
    /// Time per output token after the first, per request, seconds.
    pub tpot: Summary,
    /// End-to-end latency of successful requests, seconds.
    pub e2e: Summary,
    /// Token totals.
    pub tokens: Tokens,
    /// Failed attempts by kind.
    pub errors: BTreeMap<String, u64>,
    /// Output-quality probes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<Quality>,
}

impl Results {
    /// Summarises a recorder over `duration`, the wall time of the run (rates divide by it).
    pub fn from_recorder(r: &Recorder, slo: Option<&Slo>, weights: RciWeights, duration: Duration) -> Results {
        let dur = duration;
        let secs = dur.as_secs_f64().max(1e-9);
        let per_s = |n: u64| n as f64 / secs;
        let mean = |t: u64| (r.completed > 0).then(|| t as f64 / r.completed as f64);
        let quality = {
            let tle = r.tle_summary().map(|(bits, share)| TleReport {
                k: r.tle_k,
                bits,
                threshold_bits: crate::quality::tle_threshold_bits(r.tle_k),
                share_uncertain: share,
                note: "entropy of the renormalised top-K first-token distribution: a lower bound",
            });
            let rci = r.rci_summary().map(|(rci, bleu, repetition)| RciReport {
                rci,
                bleu,
                repetition,
                weights: weights.without_semantic(),
                semantic: false,
            });
            (tle.is_some() || rci.is_some()).then_some(Quality { tle, rci })
        };
        Results {
            duration_s: dur.as_secs_f64(),
            requests: Requests {
                sent: r.sent,
                completed: r.completed,
                failed: r.failed,
                overflow: r.overflow,
                retries: r.retries,
            },
            throughput: Throughput {
                requests_per_s: per_s(r.completed),
                input_tokens_per_s: per_s(r.input_tokens),
                output_tokens_per_s: per_s(r.output_tokens),
                total_tokens_per_s: per_s(r.input_tokens + r.output_tokens),
            },
            goodput: slo.map(|s| Goodput {
                slo: *s,
                requests_met: r.slo_met,
                share: if r.sent > 0 { r.slo_met as f64 / r.sent as f64 } else { 0.0 },
                requests_per_s: per_s(r.slo_met),
            }),
            ttft: r.ttft.summary(),
            itl: r.itl.summary(),
            tpot: r.tpot.summary(),
            e2e: r.e2e.summary(),
            tokens: Tokens {
                input_total: r.input_tokens,
                output_total: r.output_tokens,
                input_mean: mean(r.input_tokens),
                output_mean: mean(r.output_tokens),
                usage_reported: r.usage_reported,
            },
            errors: r.errors.clone(),
            quality,
        }
    }
}

/// One step of a rate sweep.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SweepStep {
    /// Offered rate, requests per second.
    pub rate: f64,
    /// What was measured at that rate.
    #[serde(flatten)]
    pub results: Results,
}

/// Per-state results of a dialogue flow.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StateReport {
    /// State name.
    pub state: String,
    /// QPS from the schedule.
    pub qps: Option<f64>,
    /// Turns attempted (retries included).
    pub attempts: u64,
    /// Turns answered.
    pub completed: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Retries.
    pub retries: u64,
    /// Dispatch slots that found too many requests in flight.
    pub overflow: u64,
    /// Dispatch slots that found no user waiting.
    pub idle_slots: u64,
    /// Users delayed by the RTT / context backoff rule on entering this state.
    pub backoffs: u64,
    /// Mean context (prompt tokens) of this state's turns.
    pub mean_context_tokens: Option<f64>,
    /// TTFT of this state's turns.
    pub ttft: Summary,
    /// e2e of this state's turns.
    pub e2e: Summary,
}

/// Dialogue-flow results.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FlowReport {
    /// Users (conversations) started.
    pub users_started: u64,
    /// Users that reached the end.
    pub users_completed: u64,
    /// Users abandoned after a turn failed all its attempts.
    pub users_failed: u64,
    /// Users dropped because a state's waiting queue was full.
    pub users_dropped: u64,
    /// Users still mid-conversation when the run stopped.
    pub users_unfinished: u64,
    /// Largest context (prompt tokens) sent.
    pub max_context_tokens: u64,
    /// Per state, in name order.
    pub states: Vec<StateReport>,
}

/// Latency and answer changes caused by a perturbation profile.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PerturbReport {
    /// The profile.
    pub profile: String,
    /// Prompt pairs (unperturbed, perturbed) that both succeeded.
    pub pairs: u64,
    /// Share of pairs whose answers differ.
    pub answer_changed_share: f64,
    /// Mean 1 − BLEU-4 of the perturbed answer against the unperturbed one.
    pub mean_answer_divergence: Option<f64>,
    /// TTFT of the unperturbed prompts.
    pub baseline_ttft: Summary,
    /// TTFT of the perturbed prompts.
    pub perturbed_ttft: Summary,
    /// e2e of the unperturbed prompts.
    pub baseline_e2e: Summary,
    /// e2e of the perturbed prompts.
    pub perturbed_e2e: Summary,
    /// Mean per-pair TTFT difference (perturbed − unperturbed), seconds.
    pub mean_ttft_delta_s: Option<f64>,
    /// Mean per-pair e2e difference, seconds.
    pub mean_e2e_delta_s: Option<f64>,
    /// Mean per-pair RCI difference, with references.
    pub mean_rci_delta: Option<f64>,
    /// The same per perturbation type (text, image_mask, text+image_mask).
    pub by_type: Vec<crate::perturb::PerturbTypeReport>,
}

/// What a bench run measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// JSON layout version.
    pub schema: &'static str,
    /// `--endpoint` as given.
    pub endpoint: String,
    /// The URL requests went to.
    pub url: String,
    /// `--model`.
    pub model: String,
    /// chat or completions.
    pub api: Api,
    /// Whether answers were streamed.
    pub stream: bool,
    /// rate, rate-sweep, concurrency, flow, or probe-<kind>.
    pub mode: String,
    /// Offered rate (open loop).
    pub rate: Option<f64>,
    /// Arrival process (open loop).
    pub arrivals: Option<ArrivalKind>,
    /// Requests in flight (closed loop).
    pub concurrency: Option<usize>,
    /// `--seed`.
    pub seed: u64,
    /// Whether the run was interrupted.
    pub interrupted: bool,
    /// Measurements over the whole run (all sweep steps merged).
    #[serde(flatten)]
    pub results: Results,
    /// Per-rate results of a sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Vec<SweepStep>>,
    /// Dialogue-flow results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowReport>,
    /// Probe results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// Perturbation results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perturb: Option<PerturbReport>,
    /// OTLP delivery, with `--otlp-endpoint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpStats>,
    /// Plug-in hooks, with `--hook` or a config file's `hooks:`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::hooks::HooksReport>,
    /// Trace replay, with `--trace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::TraceReport>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(
        || "-".to_string(),
        |x| if x < 0.01 { format!("{:.3}", x * 1000.0) } else { format!("{:.2}", x * 1000.0) },
    )
}

fn latency_rows(out: &mut String, r: &Results) {
    let _ = writeln!(
        out,
        "  {:<10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "(ms)", "count", "mean", "p50", "p90", "p95", "p99", "p99.9", "max"
    );
    for (name, s) in [("ttft", &r.ttft), ("itl", &r.itl), ("tpot", &r.tpot), ("e2e", &r.e2e)] {
        let _ = writeln!(
            out,
            "  {:<10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            name,
            s.count,
            ms(s.mean),
            ms(s.p50),
            ms(s.p90),
            ms(s.p95),
            ms(s.p99),
            ms(s.p999),
            ms(s.max)
        );
    }
}

fn results_block(out: &mut String, r: &Results) {
    let q = &r.requests;
    let _ = writeln!(
        out,
        "  requests: sent {}  completed {}  failed {}  overflow {}  retries {}   over {:.2}s",
        q.sent, q.completed, q.failed, q.overflow, q.retries, r.duration_s
    );
    let t = &r.throughput;
    let _ = writeln!(
        out,
        "  throughput: {:.2} req/s   output {:.1} tok/s   input {:.1} tok/s",
        t.requests_per_s, t.output_tokens_per_s, t.input_tokens_per_s
    );
    if let Some(g) = &r.goodput {
        let mut slo = Vec::new();
        for (k, v) in [("ttft", g.slo.ttft), ("tpot", g.slo.tpot), ("e2e", g.slo.e2e)] {
            if let Some(v) = v {
                slo.push(format!("{k}<={:.0}ms", v * 1000.0));
            }
        }
        let _ = writeln!(
            out,
            "  goodput ({}): {:.1} % of requests, {:.2} req/s",
            slo.join(", "),
            g.share * 100.0,
            g.requests_per_s
        );
    }
    latency_rows(out, r);
    let tk = &r.tokens;
    let _ = writeln!(
        out,
        "  tokens: input {} (mean {:.1})  output {} (mean {:.1})  usage reported by {} of {}",
        tk.input_total,
        tk.input_mean.unwrap_or(0.0),
        tk.output_total,
        tk.output_mean.unwrap_or(0.0),
        tk.usage_reported,
        q.completed
    );
    if !r.errors.is_empty() {
        let e: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  errors: {}", e.join(", "));
    }
    if let Some(qu) = &r.quality {
        if let Some(t) = &qu.tle {
            let _ = writeln!(
                out,
                "  TLE (top-{} lower bound): mean {:.3} bits  p50 {:.3}  p90 {:.3}  max {:.3}  > {:.2} bits {:.1} %",
                t.k,
                t.bits.mean.unwrap_or(0.0),
                t.bits.p50.unwrap_or(0.0),
                t.bits.p90.unwrap_or(0.0),
                t.bits.max.unwrap_or(0.0),
                t.threshold_bits,
                t.share_uncertain * 100.0
            );
        }
        if let Some(c) = &qu.rci {
            let _ = writeln!(
                out,
                "  RCI: mean {:.4}  p90 {:.4}   BLEU-4 mean {:.4}   repetition mean {:.4}",
                c.rci.mean.unwrap_or(0.0),
                c.rci.p90.unwrap_or(0.0),
                c.bleu.mean.unwrap_or(0.0),
                c.repetition.mean.unwrap_or(0.0)
            );
        }
    }
}

impl Report {
    /// The JSON text of the report.
    pub fn to_json(&self) -> String {
        // Plain data with finite floats: serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Writes the JSON report.
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        let mut s = self.to_json();
        s.push('\n');
        std::fs::write(path, s)
    }

    /// The final human-readable table.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let mode = match (self.rate, self.concurrency) {
            (Some(r), _) => format!("{} at {r} req/s ({:?})", self.mode, self.arrivals.unwrap_or_default()),
            (_, Some(c)) => format!("{} with {c} in flight", self.mode),
            _ => self.mode.clone(),
        };
        let _ = writeln!(out, "inferwatch bench  {}  model {}  {}", self.url, self.model, mode);
        if self.interrupted {
            let _ = writeln!(out, "  (interrupted)");
        }
        results_block(&mut out, &self.results);
        if let Some(h) = &self.hooks {
            h.render(&mut out);
        }
        if let Some(t) = &self.trace {
            out.push_str(&t.render());
        }
        if let Some(steps) = &self.sweep {
            let _ = writeln!(out, "\n  rate sweep:");
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9}",
                "rate", "req/s", "tok/s", "ttft p50", "ttft p99", "e2e p99", "failed", "goodput"
            );
            for s in steps {
                let r = &s.results;
                let _ = writeln!(
                    out,
                    "  {:>8} {:>10.2} {:>10.1} {:>10} {:>10} {:>10} {:>8} {:>9}",
                    s.rate,
                    r.throughput.requests_per_s,
                    r.throughput.output_tokens_per_s,
                    ms(r.ttft.p50),
                    ms(r.ttft.p99),
                    ms(r.e2e.p99),
                    r.requests.failed,
                    r.goodput.map_or("-".to_string(), |g| format!("{:.1}%", g.share * 100.0))
                );
            }
        }
        if let Some(f) = &self.flow {
            let _ = writeln!(
                out,
                "\n  flow: users started {}  completed {}  failed {}  dropped {}  unfinished {}  max context {} tokens",
                f.users_started,
                f.users_completed,
                f.users_failed,
                f.users_dropped,
                f.users_unfinished,
                f.max_context_tokens
            );
            let _ = writeln!(
                out,
                "  {:<24} {:>6} {:>8} {:>8} {:>7} {:>8} {:>8} {:>9} {:>10} {:>10}",
                "state", "qps", "turns", "failed", "retry", "overflow", "backoff", "ctx mean", "ttft p50", "e2e p99"
            );
            for s in &f.states {
                let _ = writeln!(
                    out,
                    "  {:<24} {:>6} {:>8} {:>8} {:>7} {:>8} {:>8} {:>9} {:>10} {:>10}",
                    s.state,
                    s.qps.map_or("-".into(), |q| format!("{q}")),
                    s.completed,
                    s.failed,
                    s.retries,
                    s.overflow,
                    s.backoffs,
                    s.mean_context_tokens.map_or("-".into(), |c| format!("{c:.0}")),
                    ms(s.ttft.p50),
                    ms(s.e2e.p99)
                );
            }
        }
        if let Some(p) = &self.probe {
            let _ = writeln!(out);
            if let Some(t) = &p.ttft {
                let _ = writeln!(
                    out,
                    "  probe ttft: mean {} ms  p50 {}  p90 {}  p99 {}  (n = {})",
                    ms(t.mean),
                    ms(t.p50),
                    ms(t.p90),
                    ms(t.p99),
                    t.count
                );
            }
            if let Some(t) = &p.tps {
                let _ = writeln!(
                    out,
                    "  probe tps: mean {:.1} tok/s  p50 {:.1}  (decode only: mean {:.1})  mean output {:.1} tokens",
                    t.mean.unwrap_or(0.0),
                    t.p50.unwrap_or(0.0),
                    p.decode_tps.and_then(|d| d.mean).unwrap_or(0.0),
                    p.mean_output_tokens.unwrap_or(0.0)
                );
            }
            if let Some(d) = &p.drift {
                let _ = writeln!(out, "  probe p99-drift: {} windows of {:.0}s", d.windows.len(), d.window_s);
                for (name, t) in [("e2e", &d.e2e), ("ttft", &d.ttft)] {
                    match t {
                        Some(t) => {
                            let _ = writeln!(
                                out,
                                "    {name} p99 slope {:+.3} ms/min (OLS {:+.3}, R² {:.2})  Mann-Kendall p {:.3}  change {:+.1} %  {}",
                                t.slope_s_per_min * 1000.0,
                                t.ols_slope_s_per_min * 1000.0,
                                t.r2,
                                t.p_value,
                                t.relative_change * 100.0,
                                if t.worsening { "WORSENING" } else { "steady" }
                            );
                        }
                        None => {
                            let _ = writeln!(out, "    {name}: too few full windows for a trend");
                        }
                    }
                }
            }
        }
        if let Some(p) = &self.perturb {
            let _ = writeln!(
                out,
                "\n  perturbation {}: {} pairs, answers changed {:.1} %, divergence {:.3}, Δttft {} ms, Δe2e {} ms{}",
                p.profile,
                p.pairs,
                p.answer_changed_share * 100.0,
                p.mean_answer_divergence.unwrap_or(0.0),
                ms(p.mean_ttft_delta_s),
                ms(p.mean_e2e_delta_s),
                p.mean_rci_delta.map_or(String::new(), |d| format!(", ΔRCI {d:+.4}"))
            );
            // One row per type once there is more than the text profile's (already above).
            let rows = if p.by_type.iter().any(|t| t.kind != "text") { &p.by_type[..] } else { &[] };
            for t in rows {
                let _ = writeln!(
                    out,
                    "    {:<16} {:>6} pairs, answers changed {:5.1} %, Δttft {} ms, Δe2e {} ms, ΔRCI {}",
                    t.kind,
                    t.pairs,
                    t.answer_changed_share * 100.0,
                    ms(t.mean_ttft_delta_s),
                    ms(t.mean_e2e_delta_s),
                    t.mean_rci_delta.map_or("-".to_string(), |d| format!("{d:+.4}"))
                );
            }
        }
        if let Some(o) = &self.otlp {
            let _ = writeln!(
                out,
                "\n  otlp: {} spans sent, {} failed; {} metric exports, {} failed",
                o.spans_sent, o.spans_failed, o.metric_exports, o.metric_exports_failed
            );
        }
        out
    }
}

/// Counters the progress line reads while a run goes on.
#[derive(Debug, Default)]
pub struct Live {
    /// Attempts sent.
    pub sent: AtomicU64,
    /// Successes.
    pub ok: AtomicU64,
    /// Failures.
    pub failed: AtomicU64,
    /// Overflowed arrivals.
    pub overflow: AtomicU64,
    /// Requests in flight.
    pub inflight: AtomicU64,
    /// Output tokens so far.
    pub out_tokens: AtomicU64,
}

/// Prints a progress line on stderr every second until `stop` (in place on a terminal,
/// every 10 s as plain lines otherwise).
pub fn spawn_progress(
    live: Arc<Live>,
    rec: Arc<Mutex<Recorder>>,
    label: String,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let tty = std::io::stderr().is_terminal();
        let every = if tty { Duration::from_secs(1) } else { Duration::from_secs(10) };
        let start = Instant::now();
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let (mut last_ok, mut last_tok, mut last_t) = (0u64, 0u64, start);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let now = Instant::now();
            let ok = live.ok.load(Ordering::Relaxed);
            let tok = live.out_tokens.load(Ordering::Relaxed);
            let dt = (now - last_t).as_secs_f64().max(1e-9);
            let (p50, p99) = match rec.lock() {
                Ok(r) => (r.ttft.quantile_s(0.5), r.ttft.quantile_s(0.99)),
                Err(_) => (None, None),
            };
            let line = format!(
                "[{label} {:>6.1}s] sent {} ok {} err {} overflow {} inflight {} | {:.1} req/s {:.0} tok/s | ttft p50 {} p99 {} ms",
                (now - start).as_secs_f64(),
                live.sent.load(Ordering::Relaxed),
                ok,
                live.failed.load(Ordering::Relaxed),
                live.overflow.load(Ordering::Relaxed),
                live.inflight.load(Ordering::Relaxed),
                (ok - last_ok.min(ok)) as f64 / dt,
                (tok - last_tok.min(tok)) as f64 / dt,
                ms(p50),
                ms(p99),
            );
            (last_ok, last_tok, last_t) = (ok, tok, now);
            if tty {
                eprint!("\r\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
        }
        if tty {
            eprint!("\r\x1b[2K");
        }
    })
}
