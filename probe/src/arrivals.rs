//! Open-loop arrival processes (constant and Poisson) and rate-sweep parsing.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How requests arrive in open-loop mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalKind {
    /// Exponential gaps with mean 1/rate (a Poisson process).
    #[default]
    Poisson,
    /// Equal gaps of 1/rate.
    Constant,
}

/// An endless schedule of arrival offsets from the start, the first at 0.
#[derive(Debug)]
pub struct Arrivals {
    kind: ArrivalKind,
    rate: f64,
    rng: StdRng,
    /// Arrivals produced so far.
    n: u64,
    /// Offset of the next arrival, seconds.
    next: f64,
}

impl Arrivals {
    /// A schedule at `rate` per second (must be positive and finite).
    pub fn new(kind: ArrivalKind, rate: f64, seed: u64) -> Arrivals {
        Arrivals { kind, rate, rng: StdRng::seed_from_u64(seed), n: 0, next: 0.0 }
    }

    /// The rate per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Changes the rate from the next gap on.
    pub fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
    }

    /// One gap drawn from the process, seconds.
    pub fn gap(&mut self) -> f64 {
        match self.kind {
            ArrivalKind::Constant => 1.0 / self.rate,
            ArrivalKind::Poisson => {
                // 1 - U is in (0, 1], so the logarithm is finite.
                let u: f64 = 1.0 - self.rng.random::<f64>();
                -u.ln() / self.rate
            }
        }
    }
}

impl Iterator for Arrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let at = match self.kind {
            // Computed from the index, so no rounding error accumulates.
            ArrivalKind::Constant => self.n as f64 / self.rate,
            ArrivalKind::Poisson => {
                let at = self.next;
                self.next += self.gap();
                at
            }
        };
        self.n += 1;
        Some(Duration::from_secs_f64(at.min(1e12)))
    }
}

/// Parses a rate sweep such as `1,2,4,8` (positive rates per second).
pub fn parse_sweep(s: &str) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let r: f64 = part.parse().map_err(|_| format!("invalid rate {part:?} in the sweep"))?;
        if !r.is_finite() || r <= 0.0 {
            return Err(format!("rates must be positive, got {part:?}"));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err("the sweep names no rate".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_within(kind: ArrivalKind, rate: f64, secs: f64, seed: u64) -> usize {
        Arrivals::new(kind, rate, seed).take_while(|d| d.as_secs_f64() < secs).count()
    }

    #[test]
    fn constant_is_exact() {
        assert_eq!(count_within(ArrivalKind::Constant, 50.0, 2.0, 1), 100);
        assert_eq!(count_within(ArrivalKind::Constant, 3.0, 10.0, 1), 30);
        let v: Vec<f64> = Arrivals::new(ArrivalKind::Constant, 4.0, 0).take(3).map(|d| d.as_secs_f64()).collect();
        assert_eq!(v, vec![0.0, 0.25, 0.5]);
    }

    #[test]
    fn poisson_counts_have_poisson_mean_and_variance() {
        // 400 windows of 1 s at 20/s: mean ≈ 20, variance ≈ 20 (index of dispersion ≈ 1).
        let mut a = Arrivals::new(ArrivalKind::Poisson, 20.0, 7);
        let mut counts = vec![0u32; 400];
        for d in a.by_ref() {
            let w = d.as_secs_f64() as usize;
            if w >= counts.len() {
                break;
            }
            counts[w] += 1;
        }
        let n = counts.len() as f64;
        let mean = counts.iter().map(|&c| c as f64).sum::<f64>() / n;
        let var = counts.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((mean - 20.0).abs() < 0.6, "mean {mean}");
        assert!((var / mean - 1.0).abs() < 0.25, "dispersion {}", var / mean);
        // The constant process has no variance at all.
        let c = count_within(ArrivalKind::Constant, 20.0, 400.0, 7);
        assert_eq!(c, 8000);
    }

    #[test]
    fn same_seed_same_schedule() {
        let a: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 3).take(50).collect();
        let b: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 3).take(50).collect();
        let c: Vec<_> = Arrivals::new(ArrivalKind::Poisson, 5.0, 4).take(50).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn sweep_parsing() {
        assert_eq!(parse_sweep("1,2, 4,8").unwrap(), vec![1.0, 2.0, 4.0, 8.0]);
        assert!(parse_sweep("1,-2").is_err());
        assert!(parse_sweep("x").is_err());
        assert!(parse_sweep("").is_err());
    }
}
