//! The Mann-Kendall trend test: S, its variance with ties, the Hamed-Rao (1998) effective-sample-size
//! correction for autocorrelation, and the two-sided p-value.

use super::normal;

/// Half-width, in units of 1/√n, of the band inside which a rank autocorrelation counts as zero in the
/// Hamed-Rao correction: the 5 % two-sided normal quantile, as in Hamed & Rao (1998).
pub const LAG_BAND_Z: f64 = 1.959_963_984_540_054;

/// The result of one test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MkTest {
    /// Number of values.
    pub n: usize,
    /// S = Σ_{i<j} sign(y_j − y_i).
    pub s: i64,
    /// Var(S) under no trend with independent values, corrected for ties.
    pub var_s: f64,
    /// The Hamed-Rao factor n/n* (≥ 1) that multiplies `var_s`.
    pub correction: f64,
    /// Continuity-corrected z = (S − sign S) / √(var_s · correction).
    pub z: f64,
    /// Two-sided p-value of z.
    pub p: f64,
}

/// S and the sizes of the groups of tied values (groups of one left out), in O(n log n): S = N − T − 2Q
/// with N the pairs, T the tied pairs and Q the strict inversions, counted by a merge sort.
pub fn s_and_ties(y: &[f64]) -> (i64, Vec<u64>) {
    let n = y.len() as i64;
    let mut v = y.to_vec();
    let mut buf = vec![0.0; v.len()];
    let inversions = merge_count(&mut v, &mut buf);
    let ties = tie_groups(&v);
    let tied_pairs: i64 = ties.iter().map(|&t| (t * (t - 1) / 2) as i64).sum();
    (n * (n - 1) / 2 - tied_pairs - 2 * inversions as i64, ties)
}

/// Sorts `v` ascending and returns the number of pairs i < j with v[i] > v[j] (equal values not counted).
fn merge_count(v: &mut [f64], buf: &mut [f64]) -> u64 {
    let n = v.len();
    if n < 2 {
        return 0;
    }
    let mid = n / 2;
    let mut count = {
        let (a, b) = v.split_at_mut(mid);
        let (ba, bb) = buf.split_at_mut(mid);
        merge_count(a, ba) + merge_count(b, bb)
    };
    let (mut i, mut j, mut k) = (0, mid, 0);
    while i < mid && j < n {
        if v[i].total_cmp(&v[j]).is_le() {
            buf[k] = v[i];
            i += 1;
        } else {
            buf[k] = v[j];
            count += (mid - i) as u64;
            j += 1;
        }
        k += 1;
    }
    buf[k..k + mid - i].copy_from_slice(&v[i..mid]);
    k += mid - i;
    buf[k..k + n - j].copy_from_slice(&v[j..n]);
    v.copy_from_slice(&buf[..n]);
    count
}

/// Sizes (> 1) of the runs of equal values of a sorted slice.
fn tie_groups(sorted: &[f64]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut run = 1u64;
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            run += 1;
        } else {
            if run > 1 {
                out.push(run);
            }
            run = 1;
        }
    }
    if run > 1 {
        out.push(run);
    }
    out
}

/// Var(S) = [n(n−1)(2n+5) − Σ t(t−1)(2t+5)] / 18 over the tie groups t.
pub fn variance(n: usize, ties: &[u64]) -> f64 {
    let f = |t: f64| t * (t - 1.0) * (2.0 * t + 5.0);
    (f(n as f64) - ties.iter().map(|&t| f(t as f64)).sum::<f64>()) / 18.0
}

/// Ranks 1..=n of `v`, ties given their average rank.
pub fn ranks(v: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i + 1;
        while j < order.len() && v[order[j]] == v[order[i]] {
            j += 1;
        }
        let avg = (i + j + 1) as f64 / 2.0; // mean of the 1-based ranks i+1 ..= j
        for &o in &order[i..j] {
            r[o] = avg;
        }
        i = j;
    }
    r
}

/// The Hamed-Rao factor n/n* = 1 + 2/(n(n−1)(n−2)) · Σ_{k=1}^{n−1} (n−k)(n−k−1)(n−k−2) ρ_k, where ρ_k is
/// the lag-k autocorrelation of the ranks of the detrended series y − slope·t.
///
/// The formula is evaluated twice and the larger factor kept: with the empirical ρ_k counted only where
/// |ρ_k| > 1.96/√n (Hamed & Rao 1998), and with the AR(1) model ρ_k = ρ_1^k (when ρ_1 > 0), whose
/// smooth tail the lag screening would otherwise cut off under strong persistence. Lags are in
/// positions (a gap in the series is not a lag). Floored at 1: the correction only removes significance.
pub fn hamed_rao_factor(t: &[f64], y: &[f64], slope: f64) -> f64 {
    let n = y.len().min(t.len());
    if n < 3 {
        return 1.0;
    }
    let detrended: Vec<f64> = (0..n).map(|i| y[i] - slope * t[i]).collect();
    let r = ranks(&detrended);
    let mean = (n as f64 + 1.0) / 2.0;
    let c: Vec<f64> = r.iter().map(|x| x - mean).collect();
    let denom: f64 = c.iter().map(|x| x * x).sum();
    if denom <= 0.0 {
        return 1.0;
    }
    let band = LAG_BAND_Z / (n as f64).sqrt();
    let nf = n as f64;
    let mut sum = 0.0;
    let mut rho1 = 0.0;
    for k in 1..n - 2 {
        let (a, b) = (&c[..n - k], &c[k..]);
        let mut acc = 0.0;
        for i in 0..n - k {
            acc += a[i] * b[i];
        }
        let rho = acc / denom;
        if k == 1 {
            rho1 = rho;
        }
        if rho.abs() > band {
            let m = nf - k as f64;
            sum += m * (m - 1.0) * (m - 2.0) * rho;
        }
    }
    let hr = 1.0 + 2.0 * sum / (nf * (nf - 1.0) * (nf - 2.0));
    let ar = if rho1 > 0.0 {
        let mut s = 0.0;
        let mut r = 1.0;
        for k in 1..n - 2 {
            r *= rho1;
            if r < 1e-6 {
                break;
            }
            let m = nf - k as f64;
            s += m * (m - 1.0) * (m - 2.0) * r;
        }
        1.0 + 2.0 * s / (nf * (nf - 1.0) * (nf - 2.0))
    } else {
        1.0
    };
    hr.max(ar).max(1.0)
}

/// Tests `y` (in time order) with the variance multiplied by `correction` (1 = the classic test).
pub fn test(y: &[f64], correction: f64) -> MkTest {
    let (s, ties) = s_and_ties(y);
    let var_s = variance(y.len(), &ties);
    let correction = if correction.is_finite() { correction.max(1.0) } else { 1.0 };
    let sd = (var_s * correction).sqrt();
    let z = if sd > 0.0 && s != 0 { (s - s.signum()) as f64 / sd } else { 0.0 };
    MkTest { n: y.len(), s, var_s, correction, z, p: normal::two_sided_p(z) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_worked_cases() {
        // 1..5: every pair concordant, S = 10, Var = 5·4·15/18 = 16.667, z = 9/√16.667, p = 0.02749.
        let t = test(&[1.0, 2.0, 3.0, 4.0, 5.0], 1.0);
        assert_eq!(t.s, 10);
        assert!((t.var_s - 50.0 / 3.0).abs() < 1e-12);
        assert!((t.p - 0.027_486_336_111_510_353).abs() < 1e-12);
        // 1, 2, 2, 3: five concordant pairs, one tie; Var = (4·3·13 − 2·1·9)/18 = 138/18.
        let t = test(&[1.0, 2.0, 2.0, 3.0], 1.0);
        assert_eq!(t.s, 5);
        assert!((t.var_s - 138.0 / 18.0).abs() < 1e-12);
        // 3, 1, 2: pairs (3,1) −, (3,2) −, (1,2) + → S = −1, z = 0, p = 1.
        let t = test(&[3.0, 1.0, 2.0], 1.0);
        assert_eq!((t.s, t.z, t.p), (-1, 0.0, 1.0));
        // Constant: S = 0, Var = 0, p = 1.
        let t = test(&[2.0; 6], 1.0);
        assert_eq!((t.s, t.var_s, t.p), (0, 0.0, 1.0));
    }

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[10.0, 30.0, 20.0, 20.0]), vec![1.0, 4.0, 2.5, 2.5]);
    }

    #[test]
    fn correction_is_one_for_a_short_or_flat_series() {
        assert_eq!(hamed_rao_factor(&[0.0, 1.0], &[1.0, 2.0], 0.0), 1.0);
        assert_eq!(hamed_rao_factor(&[0.0, 1.0, 2.0, 3.0], &[1.0; 4], 0.0), 1.0);
    }
}
