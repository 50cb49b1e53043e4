//! The coupled model of one group: `L = α·(1/T) + β·F + γ·(1 − Q) [+ c] + ε` fitted online, its
//! exponentially weighted R², the standardised prediction error and its attribution.

use super::rls::{EwMoments, Rls, RlsError};
use serde::{Deserialize, Serialize};

/// Relative floor of the residual standard deviation (times the weighted mean latency).
pub const STD_FLOOR_REL: f64 = 1e-6;
/// Absolute floor of the residual standard deviation.
pub const STD_FLOOR_ABS: f64 = 1e-12;

/// The regressor terms, in the order of θ (the intercept, when fitted, comes last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// 1/T, coefficient α.
    Throughput,
    /// F, coefficient β.
    Ttft,
    /// 1 − Q, coefficient γ.
    Quality,
}

impl Term {
    /// The name used in `coupled.attribution` and the evidence keys.
    pub fn name(self) -> &'static str {
        match self {
            Term::Throughput => "throughput",
            Term::Ttft => "ttft",
            Term::Quality => "quality",
        }
    }
}

/// The attribution when the prediction error outweighs every regressor's contribution change.
pub const UNEXPLAINED: &str = "unexplained";

/// The shape of the model (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Whether 1 − Q is a regressor (a quality metric is configured).
    pub quality: bool,
    /// Whether an intercept is fitted.
    pub intercept: bool,
}

impl Shape {
    /// The terms fitted, in θ order (without the intercept).
    pub fn terms(&self) -> &'static [Term] {
        if self.quality { &[Term::Throughput, Term::Ttft, Term::Quality] } else { &[Term::Throughput, Term::Ttft] }
    }

    /// Number of coefficients.
    pub fn dim(&self) -> usize {
        self.terms().len() + usize::from(self.intercept)
    }

    /// The regressor vector of one observation (`q` ignored without quality).
    pub fn regressors(&self, t: f64, f: f64, q: f64) -> Vec<f64> {
        let mut x = vec![1.0 / t, f];
        if self.quality {
            x.push(1.0 - q);
        }
        if self.intercept {
            x.push(1.0);
        }
        x
    }
}

/// What one observation gave, before the model learnt from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// θ·x with the coefficients before this observation.
    pub predicted: f64,
    /// y − predicted (the prediction error).
    pub residual: f64,
    /// The running residual standard deviation it was compared with (floored; `None` before any residual).
    pub residual_std: Option<f64>,
    /// |residual| / residual_std.
    pub score: Option<f64>,
    /// Per term: coefᵢ·(xᵢ − x̄ᵢ), x̄ the running mean before this observation (0 on the first).
    pub contributions: Vec<(Term, f64)>,
    /// Name of the largest of the contributions and the residual, by absolute value.
    pub attribution: &'static str,
    /// Updates the model had taken before this observation.
    pub updates_before: u64,
    /// Whether the model's update was dropped (numerically unusable; P reset).
    pub reset: bool,
}

/// The online model of one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    rls: Rls,
    updates: u64,
    /// Latency moments (SST_w = m2).
    y: EwMoments,
    /// Σ λ^{n−i}·eᵢ² of the prediction errors (SSR_w).
    ssr: f64,
    /// Weighted mean of the squared prediction errors (weights as `y`).
    sq_resid: EwMoments,
    /// Weighted means of the regressors.
    xbar: Vec<f64>,
}

impl Model {
    /// A model at `theta0` with `P₀ = delta·I`.
    pub fn new(theta0: Vec<f64>, delta: f64) -> Self {
        let d = theta0.len();
        Model {
            rls: Rls::new(theta0, delta),
            updates: 0,
            y: EwMoments::default(),
            ssr: 0.0,
            sq_resid: EwMoments::default(),
            xbar: vec![0.0; d],
        }
    }

    /// The coefficients (θ order: α, β, [γ], [intercept]).
    pub fn theta(&self) -> &[f64] {
        self.rls.theta()
    }

    /// Number of coefficients.
    pub fn dim(&self) -> usize {
        self.rls.dim()
    }

    /// Updates taken.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// True when the stored state is usable with `dim` coefficients.
    pub fn is_valid(&self, dim: usize) -> bool {
        self.rls.dim() == dim && self.xbar.len() == dim && self.rls.is_valid()
    }

    /// Exponentially weighted R² = 1 − SSR_w / SST_w of the prediction errors; `None` while the
    /// latency has not varied.
    pub fn r2(&self) -> Option<f64> {
        (self.y.m2 > 0.0 && self.y.m2.is_finite()).then(|| 1.0 - self.ssr / self.y.m2)
    }

    /// Scores observation `(x, y)` against the current fit, then learns from it with forgetting `lambda`.
    pub fn step(&mut self, shape: Shape, x: &[f64], y: f64, lambda: f64) -> Step {
        let predicted = self.rls.predict(x);
        let residual = y - predicted;
        let residual_std = self.sq_resid.variance().map(|_| {
            let ms = self.sq_resid.mean.max(0.0);
            ms.sqrt().max(STD_FLOOR_REL * self.y.mean.abs()).max(STD_FLOOR_ABS)
        });
        let score = residual_std.map(|s| residual.abs() / s);
        let theta = self.rls.theta();
        let contributions: Vec<(Term, f64)> = shape
            .terms()
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, if self.updates == 0 { 0.0 } else { theta[i] * (x[i] - self.xbar[i]) }))
            .collect();
        let mut attribution = UNEXPLAINED;
        let mut largest = residual.abs();
        for &(t, c) in &contributions {
            if c.abs() > largest {
                largest = c.abs();
                attribution = t.name();
            }
        }
        let updates_before = self.updates;
        let reset = matches!(self.rls.update(x, y, lambda), Err(RlsError::Reset | RlsError::Dimension));
        if !reset {
            self.ssr = lambda * self.ssr + residual * residual;
            let w = lambda * self.y.weight + 1.0;
            for (m, xi) in self.xbar.iter_mut().zip(x) {
                *m += (xi - *m) / w;
            }
            self.y.push(y, lambda);
            self.sq_resid.push(residual * residual, lambda);
            self.updates += 1;
        }
        Step { predicted, residual, residual_std, score, contributions, attribution, updates_before, reset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape { quality: true, intercept: true };

    #[test]
    fn regressors_follow_the_shape() {
        assert_eq!(SHAPE.regressors(4.0, 0.5, 0.75), vec![0.25, 0.5, 0.25, 1.0]);
        let s = Shape { quality: false, intercept: false };
        assert_eq!((s.regressors(2.0, 0.5, 0.0), s.dim()), (vec![0.5, 0.5], 2));
    }

    #[test]
    fn first_step_has_no_score_and_later_ones_standardise_the_error() {
        let mut m = Model::new(vec![1.0, 1.0, 1.0, 0.0], 1e6);
        let s = m.step(SHAPE, &[1.0, 1.0, 0.0, 1.0], 2.5, 1.0);
        assert_eq!((s.predicted, s.residual, s.score, s.updates_before), (2.0, 0.5, None, 0));
        assert!(s.contributions.iter().all(|c| c.1 == 0.0));
        assert_eq!(s.attribution, UNEXPLAINED);
        // One squared error of 0.25 so far: std 0.5; a new error of e gives |e| / 0.5.
        let before = m.theta().to_vec();
        let x = [0.5, 2.0, 0.0, 1.0];
        let s = m.step(SHAPE, &x, 10.0, 1.0);
        let predicted: f64 = before.iter().zip(x).map(|(a, b)| a * b).sum();
        assert!((s.predicted - predicted).abs() < 1e-12);
        assert!((s.score.unwrap() - (10.0 - predicted).abs() / 0.5).abs() < 1e-9);
        // x̄ after one point is that point: contribution of ttft = β·(2 − 1).
        assert!((s.contributions[1].1 - before[1]).abs() < 1e-12);
        assert_eq!(m.updates(), 2);
    }

    #[test]
    fn r2_is_one_minus_weighted_ssr_over_sst() {
        let mut m = Model::new(vec![0.0, 0.0, 0.0, 0.0], 1e6);
        let lambda = 0.9;
        let obs = [(2.0, 0.1, 0.9, 1.0), (3.0, 0.4, 0.8, 2.0), (1.0, 0.2, 1.0, 1.5), (4.0, 0.9, 0.7, 3.0)];
        let (mut errs, mut ys) = (Vec::new(), Vec::new());
        for &(t, f, q, y) in &obs {
            errs.push(m.step(SHAPE, &SHAPE.regressors(t, f, q), y, lambda).residual);
            ys.push(y);
        }
        let n = ys.len();
        let w: Vec<f64> = (0..n).map(|i| lambda.powi((n - 1 - i) as i32)).collect();
        let mean = w.iter().zip(&ys).map(|(w, y)| w * y).sum::<f64>() / w.iter().sum::<f64>();
        let sst: f64 = w.iter().zip(&ys).map(|(w, y)| w * (y - mean).powi(2)).sum();
        let ssr: f64 = w.iter().zip(&errs).map(|(w, e)| w * e * e).sum();
        assert!((m.r2().unwrap() - (1.0 - ssr / sst)).abs() < 1e-9);
        assert_eq!(Model::new(vec![0.0; 4], 1.0).r2(), None);
    }
}
