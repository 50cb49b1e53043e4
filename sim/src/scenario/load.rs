//! The load model: request rate over time and the requests of each window, both pure
//! functions of (seed, stream, window) so that any window can be regenerated on its own.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::calendar::weekday;
use super::spec::{LengthDist, LoadSpec};
use crate::engine::tokens::{mix64, unit};
use crate::engine::{NANOS_PER_DAY, NANOS_PER_SEC, Nanos, PromptPrefix, RequestSpec};

/// The rate function and request-shape sampler of one scenario.
#[derive(Clone, Debug)]
pub struct LoadModel {
    spec: LoadSpec,
    seed: u64,
    start_unix_ns: u64,
    max_model_len: u32,
    zipf_cdf: Vec<f64>,
    burst_starts: Vec<Nanos>,
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
        LoadModel { spec: spec.clone(), seed, start_unix_ns, max_model_len, zipf_cdf, burst_starts }
    }

    /// Starts of the bursts (relative to the scenario's start).
    pub fn burst_starts(&self) -> &[Nanos] {
        &self.burst_starts
    }

    /// The request rate (per second, before the instance's share) at scenario time `t`.
    pub fn rate(&self, t: Nanos) -> f64 {
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
