//! The Theil-Sen slope (median of pairwise slopes), its intercept, and Sen's confidence interval.

/// A Theil-Sen fit y ≈ intercept + slope·t.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Median of the pairwise slopes.
    pub slope: f64,
    /// Median of y − slope·t (Conover).
    pub intercept: f64,
    /// Lower end of the slope's confidence interval.
    pub lo: f64,
    /// Upper end of the slope's confidence interval.
    pub hi: f64,
}

/// Every slope (y_j − y_i)/(t_j − t_i) over i < j with t_i ≠ t_j (NaN slopes left out).
pub fn pairwise_slopes(t: &[f64], y: &[f64]) -> Vec<f64> {
    let n = t.len().min(y.len());
    let mut out = vec![0.0; n * n.saturating_sub(1) / 2];
    let mut k = 0;
    for i in 0..n {
        let (ti, yi) = (t[i], y[i]);
        for j in i + 1..n {
            let dt = t[j] - ti;
            let s = (y[j] - yi) / dt;
            if dt != 0.0 && !s.is_nan() {
                out[k] = s;
                k += 1;
            }
        }
    }
    out.truncate(k);
    out
}

/// The k-th smallest (0-based) of `v`, reordering it so that everything before k is ≤ and everything
/// after k is ≥ the result (Wirth's selection with a median-of-three pivot; `v` holds no NaN); `None`
/// when out of range.
fn kth(v: &mut [f64], k: usize) -> Option<f64> {
    if k >= v.len() {
        return None;
    }
    let (mut l, mut m) = (0usize, v.len() - 1);
    while l < m {
        // Order v[l], v[k], v[m] so that v[k] is their median.
        if v[k] < v[l] {
            v.swap(k, l);
        }
        if v[m] < v[l] {
            v.swap(m, l);
        }
        if v[m] < v[k] {
            v.swap(m, k);
        }
        let x = v[k];
        let (mut i, mut j) = (l as isize, m as isize);
        loop {
            while v[i as usize] < x {
                i += 1;
            }
            while x < v[j as usize] {
                j -= 1;
            }
            if i <= j {
                v.swap(i as usize, j as usize);
                i += 1;
                j -= 1;
            }
            if i > j {
                break;
            }
        }
        if j < k as isize {
            l = i as usize;
        }
        if (k as isize) < i {
            m = j.max(0) as usize;
        }
    }
    Some(v[k])
}

/// The value at 1-based rank `r` of `v` (clamped to [1, len]), interpolating linearly between ranks.
pub fn at_rank(v: &mut [f64], r: f64) -> Option<f64> {
    let n = v.len();
    if n == 0 || r.is_nan() {
        return None;
    }
    let r = r.clamp(1.0, n as f64);
    let k = r.floor() as usize; // 1 ..= n
    let frac = r - k as f64;
    let a = kth(v, k - 1)?;
    if frac == 0.0 || k == n {
        return Some(a);
    }
    // After the selection everything right of k−1 is ≥ a: the next rank is their minimum.
    let mut b = f64::INFINITY;
    for &x in &v[k..] {
        if x < b {
            b = x;
        }
    }
    Some(a + frac * (b - a))
}

/// The median of `v` (mean of the two middle values for an even length), reordering it.
pub fn median(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    at_rank(v, (n as f64 + 1.0) / 2.0)
}

/// The Theil-Sen slope of (t, y); `None` without two distinct times.
pub fn slope(t: &[f64], y: &[f64]) -> Option<f64> {
    median(&mut pairwise_slopes(t, y))
}

/// The intercept for `slope`: the median of y − slope·t.
pub fn intercept(t: &[f64], y: &[f64], slope: f64) -> Option<f64> {
    let mut resid: Vec<f64> = t.iter().zip(y).map(|(ti, yi)| yi - slope * ti).collect();
    median(&mut resid)
}

/// Sen's interval from the pairwise `slopes`: with C = z·√var_s (var_s the Mann-Kendall variance, z the
/// normal quantile of the interval) and N slopes, the ends are the slopes of rank (N − C)/2 and
/// (N + C)/2 + 1 (Gilbert 1987, interpolated between ranks).
pub fn interval(slopes: &mut [f64], var_s: f64, z: f64) -> Option<(f64, f64)> {
    let c = z * var_s.max(0.0).sqrt();
    let nf = slopes.len() as f64;
    let lo = at_rank(slopes, (nf - c) / 2.0)?;
    let hi = at_rank(slopes, (nf + c) / 2.0 + 1.0)?;
    Some((lo, hi))
}

/// Fits (t, y): slope, intercept and Sen's interval.
pub fn fit(t: &[f64], y: &[f64], var_s: f64, z: f64) -> Option<Fit> {
    let mut s = pairwise_slopes(t, y);
    let slope = median(&mut s)?;
    let (lo, hi) = interval(&mut s, var_s, z)?;
    Some(Fit { slope, intercept: intercept(t, y, slope)?, lo, hi })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_worked_fit() {
        // Slopes of (0,1) (1,3) (2,2) (3,5): 2, 0.5, 4/3, −1, 1, 3 → sorted −1, 0.5, 1, 4/3, 2, 3; median 7/6.
        let (t, y) = ([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 5.0]);
        assert!((slope(&t, &y).unwrap() - 7.0 / 6.0).abs() < 1e-15);
        // var_s = 4·3·13/18 = 26/3; z = 1 → C = 2.944, ranks 1.528 and 5.472.
        let f = fit(&t, &y, 26.0 / 3.0, 1.0).unwrap();
        let c = (26.0f64 / 3.0).sqrt();
        let lo = -1.0 + ((6.0 - c) / 2.0 - 1.0) * 1.5;
        let hi = 2.0 + ((6.0 + c) / 2.0 + 1.0 - 5.0) * 1.0;
        assert!((f.lo - lo).abs() < 1e-12 && (f.hi - hi).abs() < 1e-12, "{f:?}");
        // Intercept: median of 1, 3 − 7/6, 2 − 7/3, 5 − 7/2 = median(1, 11/6, −1/3, 3/2) = (1 + 3/2)/2.
        assert!((f.intercept - 1.25).abs() < 1e-12);
    }

    #[test]
    fn degenerate_inputs() {
        assert_eq!(slope(&[1.0, 1.0], &[0.0, 5.0]), None);
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
