//! Recursive least squares with exponential forgetting, and exponentially weighted moments.
//!
//! [`Rls`] minimises `Σᵢ λ^{n−i}·(yᵢ − θ·xᵢ)² + λⁿ·(θ − θ₀)ᵀ·P₀⁻¹·(θ − θ₀)` with `P₀ = δ·I`:
//! with λ = 1 its estimate equals the solution of the (ridge-regularised) normal equations
//! `(XᵀX + I/δ)·θ = Xᵀy + θ₀/δ`, which tends to ordinary least squares as δ grows.
//!
//! Numerical guards: P is symmetrised after every update; its trace is capped at `d·δ` (the
//! initial trace), which bounds the "wind-up" of P along directions the data never excites when
//! λ < 1 (with λ = 1 the trace only decreases, so the cap never acts); an update whose gain
//! denominator is not positive and finite, or that leaves θ or P non-finite or P with a
//! non-positive diagonal, is dropped and P is reset to `δ·I` (θ kept).

use serde::{Deserialize, Serialize};

/// δ of `P₀ = δ·I`: the prior on the starting coefficients weighs like `1/δ` of one squared
/// regressor unit, decayed by λ each update.
pub const DEFAULT_DELTA: f64 = 1e6;

/// The recursive least-squares estimator of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rls {
    theta: Vec<f64>,
    /// P, row-major, d×d.
    p: Vec<f64>,
    delta: f64,
    resets: u64,
}

/// Why an [`Rls`] update was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// The regressor vector does not have the model's dimension.
    #[error("regressors have the wrong dimension")]
    Dimension,
    /// The update was numerically unusable; P was reset to δ·I.
    #[error("numerically unusable update; P reset")]
    Reset,
}

impl Rls {
    /// An estimator starting at `theta0` with `P₀ = delta·I`.
    pub fn new(theta0: Vec<f64>, delta: f64) -> Self {
        let d = theta0.len();
        Rls { p: scaled_identity(d, delta), theta: theta0, delta, resets: 0 }
    }

    /// Number of coefficients.
    pub fn dim(&self) -> usize {
        self.theta.len()
    }

    /// The coefficients θ.
    pub fn theta(&self) -> &[f64] {
        &self.theta
    }

    /// The matrix P (row-major).
    pub fn p(&self) -> &[f64] {
        &self.p
    }

    /// How many times P was reset.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// The prediction θ·x.
    pub fn predict(&self, x: &[f64]) -> f64 {
        dot(&self.theta, x)
    }

    /// Takes one observation `(x, y)` with forgetting factor `lambda`.
    pub fn update(&mut self, x: &[f64], y: f64, lambda: f64) -> Result<(), RlsError> {
        let d = self.dim();
        if x.len() != d {
            return Err(RlsError::Dimension);
        }
        let px: Vec<f64> = (0..d).map(|i| dot(&self.p[i * d..(i + 1) * d], x)).collect();
        let denom = lambda + dot(x, &px);
        if !(denom.is_finite() && denom > 0.0) {
            return Err(self.reset());
        }
        let e = y - self.predict(x);
        let theta: Vec<f64> = self.theta.iter().zip(&px).map(|(t, k)| t + k / denom * e).collect();
        let mut p = self.p.clone();
        for i in 0..d {
            for j in 0..d {
                p[i * d + j] = (p[i * d + j] - px[i] * px[j] / denom) / lambda;
            }
        }
        for i in 0..d {
            for j in (i + 1)..d {
                let m = 0.5 * (p[i * d + j] + p[j * d + i]);
                p[i * d + j] = m;
                p[j * d + i] = m;
            }
        }
        let trace: f64 = (0..d).map(|i| p[i * d + i]).sum();
        let cap = self.delta * d as f64;
        if trace > cap {
            let s = cap / trace;
            p.iter_mut().for_each(|v| *v *= s);
        }
        let healthy = theta.iter().chain(&p).all(|v| v.is_finite()) && (0..d).all(|i| p[i * d + i] > 0.0);
        if !healthy {
            return Err(self.reset());
        }
        self.theta = theta;
        self.p = p;
        Ok(())
    }

    fn reset(&mut self) -> RlsError {
        self.p = scaled_identity(self.dim(), self.delta);
        self.resets += 1;
        RlsError::Reset
    }

    /// True when the state is usable: dimensions agree, everything finite, δ positive.
    pub fn is_valid(&self) -> bool {
        let d = self.dim();
        self.p.len() == d * d
            && self.delta.is_finite()
            && self.delta > 0.0
            && self.theta.iter().chain(&self.p).all(|v| v.is_finite())
    }
}

fn scaled_identity(d: usize, s: f64) -> Vec<f64> {
    let mut p = vec![0.0; d * d];
    for i in 0..d {
        p[i * d + i] = s;
    }
    p
}

/// The dot product of two equally long slices.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Exponentially weighted mean and sum of squared deviations: weight 1 for the newest value,
/// λ for the one before, and so on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EwMoments {
    /// Total weight Σ λ^{n−i}.
    pub weight: f64,
    /// Weighted mean.
    pub mean: f64,
    /// Weighted sum of squared deviations from the mean.
    pub m2: f64,
}

impl EwMoments {
    /// Adds `y` after discounting the past by `lambda`.
    pub fn push(&mut self, y: f64, lambda: f64) {
        let weight = lambda * self.weight + 1.0;
        let d = y - self.mean;
        self.mean += d / weight;
        self.m2 = lambda * self.m2 + d * (y - self.mean);
        self.weight = weight;
    }

    /// The weighted (population) variance; `None` before any value.
    pub fn variance(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| (self.m2 / self.weight).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Solves `a·x = b` (n×n, row-major) by Gaussian elimination with partial pivoting.
    fn solve(mut a: Vec<f64>, mut b: Vec<f64>) -> Vec<f64> {
        let n = b.len();
        for c in 0..n {
            let piv = (c..n).max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs())).unwrap();
            for k in 0..n {
                a.swap(c * n + k, piv * n + k);
            }
            b.swap(c, piv);
            for r in (c + 1)..n {
                let f = a[r * n + c] / a[c * n + c];
                for k in c..n {
                    a[r * n + k] -= f * a[c * n + k];
                }
                b[r] -= f * b[c];
            }
        }
        let mut x = vec![0.0; n];
        for r in (0..n).rev() {
            let s: f64 = ((r + 1)..n).map(|k| a[r * n + k] * x[k]).sum();
            x[r] = (b[r] - s) / a[r * n + r];
        }
        x
    }

    /// The brute-force reference: the weighted, regularised normal equations built from all rows.
    fn batch(xs: &[Vec<f64>], ys: &[f64], theta0: &[f64], delta: f64, lambda: f64) -> Vec<f64> {
        let d = theta0.len();
        let n = xs.len();
        let prior = lambda.powi(n as i32) / delta;
        let mut a = vec![0.0; d * d];
        let mut b: Vec<f64> = theta0.iter().map(|t| t * prior).collect();
        for i in 0..d {
            a[i * d + i] = prior;
        }
        for (k, (x, y)) in xs.iter().zip(ys).enumerate() {
            let w = lambda.powi((n - 1 - k) as i32);
            for i in 0..d {
                for j in 0..d {
                    a[i * d + j] += w * x[i] * x[j];
                }
                b[i] += w * x[i] * y;
            }
        }
        solve(a, b)
    }

    fn rows(d: usize) -> impl Strategy<Value = Vec<(Vec<f64>, f64)>> {
        prop::collection::vec((prop::collection::vec(-3.0f64..3.0, d), -10.0f64..10.0), 1..60)
    }

    proptest! {
        #[test]
        fn rls_equals_normal_equations_without_forgetting(d in 1usize..=4, seed in rows(4), delta in 1e2f64..1e6) {
            let theta0: Vec<f64> = (0..d).map(|i| 0.1 * i as f64 - 0.2).collect();
            let xs: Vec<Vec<f64>> = seed.iter().map(|(x, _)| x[..d].to_vec()).collect();
            let ys: Vec<f64> = seed.iter().map(|(_, y)| *y).collect();
            let mut rls = Rls::new(theta0.clone(), delta);
            for (x, y) in xs.iter().zip(&ys) {
                rls.update(x, *y, 1.0).unwrap();
            }
            let want = batch(&xs, &ys, &theta0, delta, 1.0);
            for (g, w) in rls.theta().iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "rls {:?} batch {:?}", rls.theta(), want);
            }
        }

        #[test]
        fn rls_equals_weighted_normal_equations_with_forgetting(seed in rows(3), lambda in 0.9f64..1.0) {
            let theta0 = vec![0.38, 0.52, 0.0];
            let xs: Vec<Vec<f64>> = seed.iter().map(|(x, _)| x.clone()).collect();
            let ys: Vec<f64> = seed.iter().map(|(_, y)| *y).collect();
            let mut rls = Rls::new(theta0.clone(), 1e3);
            for (x, y) in xs.iter().zip(&ys) {
                rls.update(x, *y, lambda).unwrap();
            }
            // Few rows: P's trace stays below the cap, so the exact weighted solution holds.
            prop_assume!((0..3).map(|i| rls.p()[i * 3 + i]).sum::<f64>() < 3e3 * 0.999);
            let want = batch(&xs, &ys, &theta0, 1e3, lambda);
            for (g, w) in rls.theta().iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "rls {:?} batch {:?}", rls.theta(), want);
            }
        }
    }

    #[test]
    fn rls_recovers_exact_coefficients_and_matches_plain_least_squares() {
        // y = 2·x0 − 3·x1 + 0.5 exactly; with a large δ the prior is negligible.
        let mut rls = Rls::new(vec![0.0, 0.0, 0.0], 1e8);
        for i in 0..50 {
            let (a, b) = ((i as f64 * 0.37).sin(), (i as f64 * 0.91).cos());
            rls.update(&[a, b, 1.0], 2.0 * a - 3.0 * b + 0.5, 1.0).unwrap();
        }
        for (g, w) in rls.theta().iter().zip([2.0, -3.0, 0.5]) {
            assert!((g - w).abs() < 1e-6, "{:?}", rls.theta());
        }
    }

    #[test]
    fn non_finite_input_resets_p_and_keeps_theta() {
        let mut rls = Rls::new(vec![1.0, 2.0], 10.0);
        rls.update(&[1.0, 0.5], 3.0, 0.99).unwrap();
        let theta = rls.theta().to_vec();
        assert_eq!(rls.update(&[f64::NAN, 1.0], 1.0, 0.99), Err(RlsError::Reset));
        assert_eq!(rls.update(&[1.0, 1.0], f64::INFINITY, 0.99), Err(RlsError::Reset));
        assert_eq!(rls.theta(), theta.as_slice());
        assert_eq!(rls.p(), &[10.0, 0.0, 0.0, 10.0]);
        assert_eq!(rls.resets(), 2);
        assert_eq!(rls.update(&[1.0], 1.0, 0.99), Err(RlsError::Dimension));
    }

    #[test]
    fn p_does_not_wind_up_without_excitation() {
        // x1 is always 0: without the cap, P[1][1] would grow as λ^-n and overflow.
        let mut rls = Rls::new(vec![0.0, 0.0], 100.0);
        for i in 0..200_000 {
            rls.update(&[1.0 + (i % 3) as f64, 0.0], 1.0, 0.9).unwrap();
        }
        let p = rls.p();
        assert!(p.iter().all(|v| v.is_finite()) && p[0] + p[3] <= 200.0 * (1.0 + 1e-12), "{p:?}");
        assert_eq!(rls.resets(), 0);
    }

    #[test]
    fn ew_moments_match_their_definition() {
        let (lambda, ys) = (0.9, [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0]);
        let mut m = EwMoments::default();
        ys.iter().for_each(|&y| m.push(y, lambda));
        let n = ys.len();
        let w: Vec<f64> = (0..n).map(|i| lambda.powi((n - 1 - i) as i32)).collect();
        let sw: f64 = w.iter().sum();
        let mean = w.iter().zip(&ys).map(|(w, y)| w * y).sum::<f64>() / sw;
        let m2 = w.iter().zip(&ys).map(|(w, y)| w * (y - mean).powi(2)).sum::<f64>();
        assert!((m.weight - sw).abs() < 1e-12 && (m.mean - mean).abs() < 1e-12 && (m.m2 - m2).abs() < 1e-10);
        assert_eq!(EwMoments::default().variance(), None);
    }
}
