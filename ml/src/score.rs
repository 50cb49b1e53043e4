//! Reconstruction-error scoring of feature windows, shared by `lstm_ae` and `pca`.

use crate::features::Window;
use crate::runtime::RuntimeError;

/// A model that reconstructs a batch of windows: input and output row-major [n, T, k].
pub trait Reconstructor: Send {
    /// The reconstruction of `n` windows laid out in `x` (length n·T·k).
    fn reconstruct(&mut self, x: &[f32], n: usize) -> Result<Vec<f32>, RuntimeError>;
}

/// The score of one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// sum(mask·(x − x̂)²) / max(1, sum(mask)).
    pub error: f64,
    /// Index of the signal with the largest masked mean squared error.
    pub top_signal: usize,
    /// Missing cells.
    pub missing: usize,
}

/// The score of `w` given its reconstruction `recon` (T·k values), with k signals.
pub fn score(w: &Window, recon: &[f32], k: usize) -> Scored {
    let k = k.max(1);
    let mut per = vec![(0f64, 0f64); k];
    let (mut sum, mut n) = (0f64, 0f64);
    for (i, ((x, m), r)) in w.x.iter().zip(&w.mask).zip(recon).enumerate() {
        let m = f64::from(*m);
        let d = f64::from(*x) - f64::from(*r);
        let e = m * d * d;
        sum += e;
        n += m;
        let s = &mut per[i % k];
        s.0 += e;
        s.1 += m;
    }
    let mut top = 0;
    let mut best = f64::NEG_INFINITY;
    for (j, (e, c)) in per.iter().enumerate() {
        let mse = e / c.max(1.0);
        if mse > best {
            best = mse;
            top = j;
        }
    }
    Scored { error: sum / n.max(1.0), top_signal: top, missing: w.missing() }
}

/// Scores `windows` through `model` in runs of at most `max_batch` windows.
pub fn score_windows(
    model: &mut dyn Reconstructor,
    windows: &[Window],
    t: usize,
    k: usize,
    max_batch: usize,
) -> Result<Vec<Scored>, RuntimeError> {
    let cell = t * k;
    let mut out = Vec::with_capacity(windows.len());
    for chunk in windows.chunks(max_batch.max(1)) {
        let mut x = Vec::with_capacity(chunk.len() * cell);
        for w in chunk {
            x.extend_from_slice(&w.x);
        }
        let recon = model.reconstruct(&x, chunk.len())?;
        if recon.len() != x.len() {
            return Err(RuntimeError::Ort(format!(
                "the model returned {} values for {} windows of [{t}, {k}]",
                recon.len(),
                chunk.len()
            )));
        }
        for (w, r) in chunk.iter().zip(recon.chunks(cell)) {
            out.push(score(w, r, k));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::GroupKey;

    #[test]
    fn masked_error_and_top_signal() {
        let w = Window {
            group: GroupKey::new("i", "v", "m"),
            end_bucket: 0,
            end_ns: 0,
            x: vec![1.0, 2.0, 3.0, 4.0],
            mask: vec![1.0, 1.0, 1.0, 0.0],
        };
        // Errors: 1, 0, 4, (masked 100): sum 5 over 3 present cells.
        let s = score(&w, &[0.0, 2.0, 1.0, 14.0], 2);
        assert!((s.error - 5.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.top_signal, 0);
        assert_eq!(s.missing, 1);
        let all_missing = Window { mask: vec![0.0; 4], ..w };
        assert_eq!(score(&all_missing, &[9.0; 4], 2).error, 0.0);
    }
}
