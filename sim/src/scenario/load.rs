//! The load model: request rate over time and the requests of each window, both pure
//! functions of (seed, stream, window) so that any window can be regenerated on its own.
//! With `load.trace` the arrivals and lengths come from a production trace instead
//! ([`TraceLoadSpec`], read by `inferwatch_probe::trace`, scheduled by
//! `inferwatch_probe::arrivals::TraceSchedule`, the same code `inferwatch bench --trace` uses).

use std::path::Path;
use std::sync::Arc;

use inferwatch_probe::arrivals::{TraceSchedule, TraceTiming};
use inferwatch_probe::trace::Trace;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::calendar::weekday;
use super::spec::{LengthDist, LoadSpec};
use crate::engine::tokens::{mix64, unit};
use crate::engine::{NANOS_PER_DAY, NANOS_PER_SEC, Nanos, PromptPrefix, RequestSpec, SimDuration};

/// `load.trace`: a trace file as the load shape (Azure LLM inference CSV, or the generic CSV /
/// JSONL of probe/README.md). Each instance receives the trace (times its `load_share`); a
/// request's prompt and output lengths are the trace's (the output is forced, as with
/// `ignore_eos`); turns of a session share their earlier turns as a cached prefix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceLoadSpec {
    /// The trace file, relative to the scenario file.
    pub path: String,
    /// Time scale: 10 replays ten times faster (default 1).
    #[serde(default = "one")]
    pub speed: f64,
    /// Start the trace again when it ends (default false: no traffic after its end).
    #[serde(default, rename = "loop")]
    pub looped: bool,
    /// Keep each request with this probability (seeded by the scenario's seed).
    #[serde(default)]
    pub sample: Option<f64>,
    /// Replay from this far into the trace (trace time).
    #[serde(default)]
    pub start: Option<SimDuration>,
    /// Replay only this much of the trace (trace time; also the loop's period).
    #[serde(default)]
    pub duration: Option<SimDuration>,
    /// The trace, read when the scenario is loaded.
    #[serde(skip)]
    pub loaded: Option<Arc<Trace>>,
}

fn one() -> f64 {
    1.0
}

impl TraceLoadSpec {
    /// The replay timing, seeded by `seed`.
    pub fn timing(&self, seed: u64) -> TraceTiming {
        TraceTiming {
            speed: self.speed,
            start_s: self.start.map_or(0.0, |d| d.secs()),
            duration_s: self.duration.map(|d| d.secs()),
            looped: self.looped,
            sample: self.sample,
            seed,
        }
    }

    /// Reads the trace (`path` relative to `base`, the scenario's directory) and checks the
    /// timing; the message names the field.
    pub fn load(&mut self, base: Option<&Path>) -> Result<(), String> {
        let p = Path::new(&self.path);
        let full = match base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p.to_path_buf(),
        };
        let t = Trace::load(&full).map_err(|e| format!("load.trace.path: {e}"))?;
        let schedule = TraceSchedule::new(&t.times(), self.timing(0)).map_err(|e| format!("load.trace: {e}"))?;
        let lap_min = schedule.period_s() / self.speed / 60.0;
        if lap_min > MAX_LAP_MINUTES {
            return Err(format!(
                "load.trace.speed: one lap of the trace lasts {lap_min:.0} minutes at speed {}, more than {MAX_LAP_MINUTES} (raise the speed or set duration)",
                self.speed
            ));
        }
        self.loaded = Some(Arc::new(t));
        Ok(())
    }
}

/// Longest lap of a trace load, in scenario minutes (≈ 1.9 years; its per-minute rates are held).
const MAX_LAP_MINUTES: f64 = 1_000_000.0;

/// A trace load, ready: the trace, its schedule and the rate of each minute of one lap.
#[derive(Clone, Debug)]
struct TraceLoad {
    trace: Arc<Trace>,
    schedule: TraceSchedule,
    /// Arrivals per minute of one lap (scenario time, after the speed).
    per_minute: Vec<f64>,
    /// Length of one lap, scenario nanoseconds.
    lap: Nanos,
}

impl TraceLoad {
    fn new(spec: &TraceLoadSpec, seed: u64) -> Option<TraceLoad> {
        let trace = match &spec.loaded {
            Some(t) => t.clone(),
            None => {
                // Built without load_scenario (which reads it): read it relative to the cwd.
                let mut s = spec.clone();
                if let Err(e) = s.load(None) {
                    tracing::error!(error = %e, "scenario trace unreadable; no traffic");
                    return None;
                }
                s.loaded?
            }
        };
        let schedule = match TraceSchedule::new(&trace.times(), spec.timing(seed)) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "scenario trace window empty; no traffic");
                return None;
            }
        };
        let lap_s = schedule.period_s() / spec.speed;
        let mut per_minute = vec![0.0; (lap_s / 60.0).ceil().clamp(1.0, MAX_LAP_MINUTES) as usize];
        for a in schedule.clone().take_while(|a| a.lap == 0) {
            let m = ((a.at.as_secs_f64() / 60.0) as usize).min(per_minute.len() - 1);
            per_minute[m] += 1.0 / 60.0;
        }
        Some(TraceLoad { trace, schedule, per_minute, lap: (lap_s * 1e9).round().max(1.0) as Nanos })
    }

    fn rate(&self, t: Nanos, looped: bool) -> f64 {
        if !looped && t >= self.lap {
            return 0.0;
        }
        let m = ((t % self.lap) / (60 * NANOS_PER_SEC)) as usize;
        self.per_minute.get(m).copied().unwrap_or(0.0)
    }
}

/// The rate function and request-shape sampler of one scenario.
#[derive(Clone, Debug)]
pub struct LoadModel {
    spec: LoadSpec,
    seed: u64,
    start_unix_ns: u64,
    max_model_len: u32,
    zipf_cdf: Vec<f64>,
    burst_starts: Vec<Nanos>,
    trace: Option<TraceLoad>,
}

impl LoadModel {
    /// A load model for a scenario lasting `duration` (bursts are drawn for that span).
    pub fn new(spec: &LoadSpec, seed: u64, start_unix_ns: u64, duration: Nanos, max_model_len: u32) -> Self {
        let zipf_cdf = match &spec.prefix {
            Some(p) if p.pool > 0 => {
                let w: Vec<f64> = (1..=p.pool).map(|k| 1.0 / f64::from(k).powf(p.zipf)).collect();
                let total: f64 = w.iter().sum();
                let mut acc = 0.0;
                w.iter()
                    .map(|x| {
                        acc += x / total;
                        acc
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let mut burst_starts: Vec<Nanos> = Vec::new();
        if let Some(b) = &spec.bursts {
            burst_starts.extend(b.at.iter().map(|d| d.nanos()));
            if b.per_day > 0.0 {
                let days = duration.div_ceil(NANOS_PER_DAY);
                for d in 0..days {
                    let mut rng = ChaCha8Rng::seed_from_u64(mix64(seed ^ 0xB0B5 ^ mix64(d)));
                    // Poisson count by inversion
                    let l = (-b.per_day).exp();
                    let mut k = 0u32;
                    let mut p = rng.random::<f64>();
                    while p > l && k < 1000 {
                        k += 1;
                        p *= rng.random::<f64>();
                    }
                    for _ in 0..k {
                        burst_starts.push(d * NANOS_PER_DAY + (rng.random::<f64>() * NANOS_PER_DAY as f64) as Nanos);
                    }
                }
            }
            burst_starts.sort_unstable();
        }
        let trace = spec.trace.as_ref().and_then(|t| TraceLoad::new(t, seed));
        LoadModel { spec: spec.clone(), seed, start_unix_ns, max_model_len, zipf_cdf, burst_starts, trace }
    }

    /// Starts of the bursts (relative to the scenario's start).
    pub fn burst_starts(&self) -> &[Nanos] {
        &self.burst_starts
    }

    /// The request rate (per second, before the instance's share) at scenario time `t`.
    pub fn rate(&self, t: Nanos) -> f64 {
        if let Some(tl) = &self.trace {
            return tl.rate(t, self.spec.trace.as_ref().is_some_and(|s| s.looped));
        }
        if self.spec.trace.is_some() {
            return 0.0;
        }
        let mut r = self.spec.qps;
        let unix = self.start_unix_ns + t;
        if let Some(d) = &self.spec.daily {
            let tod = (unix % NANOS_PER_DAY) as f64 / 1e9;
            r *= 1.0 + d.amplitude * (std::f64::consts::TAU * (tod - d.peak.secs()) / 86_400.0).cos();
        }
        if let Some(w) = &self.spec.weekly
            && weekday(unix) >= 5
        {
            r *= w.weekend;
        }
        if let Some(n) = &self.spec.noise
            && n.sigma > 0.0
        {
            let every = n.every.nanos().max(NANOS_PER_SEC);
            let i = t / every;
            let u1 = unit(mix64(self.seed ^ 0x4E01 ^ mix64(i))).max(1e-12);
            let u2 = unit(mix64(self.seed ^ 0x4E02 ^ mix64(i)));
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            r *= (n.sigma * z - n.sigma * n.sigma / 2.0).exp();
        }
        if let Some(b) = &self.spec.bursts {
            let len = b.duration.nanos();
            let i = self.burst_starts.partition_point(|&s| s <= t);
            if i > 0 && t < self.burst_starts[i - 1] + len {
                r *= b.factor;
            }
        }
        r.max(0.0)
    }

    /// The requests arriving in `[from, to)` for stream `stream` and window index `window`
    /// at `share` times the rate. Ids are `window << 24 | index`.
    pub fn window_requests(&self, stream: u64, window: u64, from: Nanos, to: Nanos, share: f64) -> Vec<RequestSpec> {
        if let Some(tl) = &self.trace {
            return self.trace_requests(tl, stream, window, from, to, share);
        }
        if self.spec.trace.is_some() {
            return Vec::new();
        }
        let mut rng = ChaCha8Rng::seed_from_u64(mix64(self.seed ^ mix64(stream.wrapping_add(1)) ^ mix64(window)));
        let mut out = Vec::new();
        let mut t = from as f64;
        loop {
            let rate = self.rate(t as Nanos) * share;
            if rate <= 1e-9 {
                // idle: skip ahead a second and look again
                t += 1e9;
                if t >= to as f64 {
                    break;
                }
                continue;
            }
            let u: f64 = rng.random::<f64>();
            t += -(1.0 - u).ln() / rate * 1e9;
            if t >= to as f64 {
                break;
            }
            let index = out.len() as u64;
            let id = (window << 24) | (index & 0xFF_FFFF);
            out.push(self.sample_request(&mut rng, id, t as Nanos));
        }
        out
    }

    /// The trace's arrivals in `[from, to)`: each `share` times (whole copies, plus one more
    /// with the fractional part's probability, drawn per stream).
    fn trace_requests(
        &self,
        tl: &TraceLoad,
        stream: u64,
        window: u64,
        from: Nanos,
        to: Nanos,
        share: f64,
    ) -> Vec<RequestSpec> {
        let mut sched = tl.schedule.clone();
        sched.seek(from as f64 / 1e9);
        let whole = share.max(0.0).floor();
        let frac = share.max(0.0) - whole;
        let mut out = Vec::new();
        let limit = self.max_model_len.saturating_sub(1).max(1);
        for a in sched {
            let arrival = (a.at.as_secs_f64() * 1e9).round() as Nanos;
            if arrival >= to {
                break;
            }
            if arrival < from {
                continue;
            }
            let Some(row) = tl.trace.rows.get(a.row) else { break };
            let key = mix64(self.seed ^ mix64(stream.wrapping_add(0x7ACE)) ^ mix64(a.row as u64 ^ mix64(a.lap)));
            let copies = whole as u64 + u64::from(frac > 0.0 && unit(key) < frac);
            let prompt = row.input_tokens.clamp(1, limit);
            let max_tokens = row.output_tokens.min(self.max_model_len.saturating_sub(prompt)).max(1);
            let prefix = row.session.map(|sess| {
                // The earlier turns are the cached prefix; a first turn leaves its prompt there.
                let carried = match row.prev.and_then(|p| tl.trace.rows.get(p as usize)) {
                    Some(p) => p.input_tokens.saturating_add(p.output_tokens),
                    None => prompt,
                };
                PromptPrefix {
                    hash: mix64(self.seed ^ 0x5E55 ^ mix64(u64::from(sess) ^ mix64(a.lap))),
                    tokens: carried.min(prompt),
                }
            });
            for c in 0..copies {
                let index = out.len() as u64;
                out.push(RequestSpec {
                    id: (window << 24) | (index & 0xFF_FFFF),
                    // copies 1 µs apart, so that arrivals stay distinct
                    arrival: arrival + c * 1000,
                    prompt_tokens: prompt,
                    max_tokens,
                    stop_after: Some(max_tokens),
                    prefix,
                });
            }
        }
        out
    }

    fn sample_request(&self, rng: &mut ChaCha8Rng, id: u64, arrival: Nanos) -> RequestSpec {
        let user = sample_len(rng, &self.spec.prompt);
        let natural = sample_len(rng, &self.spec.output);
        let mut prefix = None;
        if let Some(p) = &self.spec.prefix
            && !self.zipf_cdf.is_empty()
            && rng.random::<f64>() < p.share
        {
            let u: f64 = rng.random();
            let k = self.zipf_cdf.partition_point(|&c| c < u) as u64;
            prefix = Some(PromptPrefix { hash: mix64(self.seed ^ 0x9F1E ^ k), tokens: p.tokens });
        }
        let limit = self.max_model_len.saturating_sub(1).max(1);
        let prompt = (user + prefix.map_or(0, |p| p.tokens)).clamp(1, limit);
        let max_tokens = self.spec.output.max.max(1).min(self.max_model_len - prompt).max(1);
        RequestSpec {
            id,
            arrival,
            prompt_tokens: prompt,
            max_tokens,
            stop_after: Some(natural.min(max_tokens)),
            prefix,
        }
    }
}

fn sample_len(rng: &mut ChaCha8Rng, d: &LengthDist) -> u32 {
    let u1: f64 = rng.random::<f64>().max(1e-12);
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let v = (d.median.max(1.0) * (d.sigma * z).exp()).round();
    (v.max(1.0) as u32).clamp(d.min.max(1), d.max.max(d.min.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::prompt::{ChatTurn, prepare_chat, prepare_text};
    use inferwatch_probe::client::{Api, Prompt};
    use inferwatch_probe::trace::{TokenModel, build};

    fn fixture_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/traces")
    }

    fn fixture() -> Trace {
        Trace::load(&fixture_dir().join("azure_conv_10min.csv")).unwrap()
    }

    /// What the simulator counts for a prompt the bench built.
    fn sim_tokens(p: &Prompt) -> u32 {
        match p {
            Prompt::Messages(m) => {
                let turns: Vec<ChatTurn> =
                    m.iter().map(|x| ChatTurn { role: x.role.clone(), content: x.content.clone() }).collect();
                prepare_chat(&turns).tokens
            }
            Prompt::Text(t) => prepare_text(t).tokens,
        }
    }

    #[test]
    fn bench_prompts_have_the_trace_token_count_in_the_simulator() {
        let t = fixture();
        for api in [Api::Chat, Api::Completions] {
            let m = TokenModel::rule(api);
            let mut exact = 0;
            for (i, row) in t.rows.iter().enumerate().take(400) {
                let b = build(&t, i, 0, 9, api, &m);
                let n = sim_tokens(&b.prompt);
                assert_eq!(n, b.tokens, "row {i}: the rule's count is the simulator's");
                if b.exact {
                    assert_eq!(n, row.input_tokens, "row {i}");
                    exact += 1;
                } else {
                    // Only prompts shorter than the chat template itself cannot be exact.
                    assert!(row.input_tokens < m.overhead(1) + 1, "row {i}: {}", row.input_tokens);
                }
            }
            assert!(exact >= 395, "{api:?}: {exact} exact of 400");
        }
        // Multi-turn: every turn of a session, with its history, exact.
        let s = Trace::parse(
            "timestamp,input_tokens,output_tokens,session_id\n0,120,30,a\n1,64,5,b\n2,400,50,a\n3,90,12,b\n\
             4,1000,7,a\n",
            Path::new("s.csv"),
        )
        .unwrap();
        for api in [Api::Chat, Api::Completions] {
            for i in 0..s.rows.len() {
                let b = build(&s, i, 2, 1, api, &TokenModel::rule(api));
                assert!(b.exact, "{api:?} row {i}");
                assert_eq!(sim_tokens(&b.prompt), s.rows[i].input_tokens, "{api:?} row {i}");
            }
        }
    }

    fn trace_spec(yaml: &str) -> LoadSpec {
        let mut l: LoadSpec = serde_saphyr::from_str(yaml).unwrap();
        if let Some(t) = &mut l.trace {
            t.load(Some(&fixture_dir())).unwrap();
        }
        l
    }

    /// All requests of `[0, end)` in windows of `w`, as the scenario runner asks for them.
    fn all(m: &LoadModel, end: Nanos, w: Nanos, share: f64) -> Vec<RequestSpec> {
        let mut out = Vec::new();
        for win in 0..end.div_ceil(w) {
            out.extend(m.window_requests(0, win, win * w, ((win + 1) * w).min(end), share));
        }
        out
    }

    #[test]
    fn a_trace_slowed_past_the_longest_lap_is_refused_at_load() {
        let mut l: LoadSpec = serde_saphyr::from_str("trace: {path: azure_conv_10min.csv, speed: 0.000001}\n").unwrap();
        let e = l.trace.as_mut().unwrap().load(Some(&fixture_dir())).unwrap_err();
        assert!(e.starts_with("load.trace.speed: one lap of the trace lasts"), "{e}");
        let mut l: LoadSpec = serde_saphyr::from_str("trace: {path: azure_conv_10min.csv, speed: 0.01}\n").unwrap();
        l.trace.as_mut().unwrap().load(Some(&fixture_dir())).unwrap();
    }

    #[test]
    fn trace_load_replays_arrivals_and_lengths() {
        let t = fixture();
        let l = trace_spec("trace: {path: azure_conv_10min.csv, speed: 10}\n");
        let m = LoadModel::new(&l, 1, 0, 120 * NANOS_PER_SEC, 32_768);
        let reqs = all(&m, 120 * NANOS_PER_SEC, 7 * NANOS_PER_SEC, 1.0);
        assert_eq!(reqs.len(), t.rows.len());
        for (r, row) in reqs.iter().zip(&t.rows) {
            assert_eq!(
                (r.prompt_tokens, r.max_tokens, r.stop_after),
                (row.input_tokens, row.output_tokens, Some(row.output_tokens))
            );
            assert!((r.arrival as f64 / 1e9 - row.at / 10.0).abs() < 1e-6);
        }
        // No traffic after the trace's end without `loop`; the rate follows the trace.
        assert_eq!(m.rate(61 * NANOS_PER_SEC), 0.0);
        let first_min = t.rows.iter().filter(|r| r.at < 600.0).count() as f64;
        assert!((m.rate(NANOS_PER_SEC) * 60.0 - first_min).abs() < 1e-6);
        // Looping: two laps in two periods; sampling keeps about the share; instance shares.
        let l = trace_spec("trace: {path: azure_conv_10min.csv, speed: 10, loop: true}\n");
        let m = LoadModel::new(&l, 1, 0, 0, 32_768);
        let period = m.trace.as_ref().unwrap().lap * 2 - 1_000_000;
        assert_eq!(all(&m, period, 5 * NANOS_PER_SEC, 1.0).len(), 2 * t.rows.len());
        assert_eq!(all(&m, period, 5 * NANOS_PER_SEC, 2.0).len(), 4 * t.rows.len());
        let half = all(&m, period, 5 * NANOS_PER_SEC, 0.5).len() as f64 / (2 * t.rows.len()) as f64;
        assert!((half - 0.5).abs() < 0.05, "{half}");
        let l = trace_spec("trace: {path: azure_conv_10min.csv, speed: 10, sample: 0.25}\n");
        let m = LoadModel::new(&l, 1, 0, 0, 32_768);
        let kept = all(&m, 120 * NANOS_PER_SEC, 5 * NANOS_PER_SEC, 1.0).len() as f64 / t.rows.len() as f64;
        assert!((kept - 0.25).abs() < 0.03, "{kept}");
        // Long prompts are cut to the context.
        let m = LoadModel::new(&trace_spec("trace: {path: azure_conv_10min.csv}\n"), 1, 0, 0, 512);
        let r = m.window_requests(0, 0, 0, 700 * NANOS_PER_SEC, 1.0);
        assert!(r.iter().all(|r| r.prompt_tokens < 512 && r.prompt_tokens + r.max_tokens <= 512));
    }

    #[test]
    fn scenario_trace_errors_name_the_field() {
        let dir = std::env::temp_dir().join(format!("iw-sim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body = |path: &str| {
            format!(
                "name: t\nduration: 1m\nload: {{trace: {{path: {path}, speed: 10}}}}\n\
                 slo: {{metric: ttft, quantile: 0.9, threshold: 1s}}\n"
            )
        };
        let good = dir.join("good.yaml");
        let abs = fixture_dir().join("azure_conv_10min.csv");
        std::fs::write(&good, body(&abs.display().to_string())).unwrap();
        let sc = crate::scenario::load_scenario(&good).unwrap();
        assert_eq!(sc.load.trace.as_ref().and_then(|t| t.loaded.as_ref()).map(|t| t.rows.len()), Some(2867));
        std::fs::write(dir.join("bad.csv"), "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,x\n")
            .unwrap();
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, body("bad.csv")).unwrap();
        let e = crate::scenario::load_scenario(&bad).unwrap_err().to_string();
        assert!(e.contains("load.trace.path:") && e.contains("bad.csv:2:"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
