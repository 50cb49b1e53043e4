//! The rolling moments of `zscore_skew`: the last `w` points of one series in a ring buffer, with
//! running shifted power sums so a score costs O(1), and an exact O(w) path behind them.
//!
//! # Scheme
//!
//! * **Shift.** The sums are of `d = x − K`, not of `x`: `S1 = Σd`, `S2 = Σd²`, `S3 = Σd³`. `K` is
//!   the window's mean at the last rebuild (the first value while the window fills), so `|d|` is of
//!   the order of the spread and an offset like 1e12 never enters a square.
//! * **Compensation.** Each sum is a Neumaier (Kahan–Babuška) compensated sum: adding and later
//!   removing a spike leaves an error of order u²·spike, not u·spike (u = 2⁻⁵³). A value leaves
//!   the window with the same rounded terms it entered with (same `x`, same `K`), so the rounding
//!   of the terms themselves cancels exactly once the value has left.
//! * **Moments** from the sums: μ = S1/n, m2 = S2/n − μ², m3 = S3/n − μ(3·S2/n − 2μ²).
//! * **Error bound.** Every fast score comes with an a-priori bound on its absolute error, from
//!   the sums, the compensated-summation bound (`8u·S + 4N·u²·mass`, where `mass` is the sum of
//!   the |terms| added or removed since the last rebuild and `N` their count), and the
//!   cancellation in the moment formulas (`u·(S2/n + μ²)` for m2, relative to m2). A score whose
//!   bound exceeds [`TOLERANCE`]·max(1, score), or whose moments are not finite or out of
//!   the safe range (m2 < 2⁻⁶⁰⁰), is not used: the sums are **rebuilt** exactly from the ring
//!   buffer (new `K` = the window's mean, fresh sums) and the score recomputed; if the bound still
//!   fails (values beyond ~1e100 or a spread below ~1e-90), the score comes from the exact
//!   two-pass path [`exact_score`] over the buffer.
//! * **Periodic rebuild.** The sums are rebuilt every `w` points anyway, so the shift follows a
//!   drifting series and `N` stays ≤ 2w: O(w) work every w points, O(1) amortized.
//! * **Constant windows.** m2 = 0 exactly iff every value of the window is equal. The length of
//!   the trailing run of equal values is kept, so a constant window gives std 0, skew 0 and
//!   mean = the value exactly, as the definition does, in O(1) (the sums would give m2 = 0 or a
//!   rounding residue, which the bound refuses, sending every such point to the O(w) path).
//! * **Distinct values.** With [`Window::with_distinct`]`(k)` the window also keeps a table of
//!   at most `k` distinct values and their counts, plus the count of values outside the table:
//!   O(k) per push. When an entry's count drops to 0 while values outside the table exist, the
//!   table is rebuilt from the buffer, newest value first (O(w·k), about once per w pushes on a
//!   continuous series). So [`Window::quantum`] knows exactly whether the window holds at most
//!   `k` distinct values, and which.
//! * **Scale floor.** [`Score::floored`] rescales a score to a floored standard deviation (see
//!   docs/detectors/zscore_skew.md): O(k log k), k ≤ [`MAX_DISTINCT`].

use serde::{Deserialize, Serialize};

/// u, the unit roundoff of f64 (2⁻⁵³).
const U: f64 = f64::EPSILON / 2.0;
/// Largest accepted error bound of a fast score, relative to max(1, score).
pub const TOLERANCE: f64 = 1e-11;
/// The guard added to the standard deviation in z (docs/detectors/zscore_skew.md).
pub const STD_GUARD: f64 = 1e-8;
/// Weight of |skew| in the score (docs/detectors/zscore_skew.md).
pub const SKEW_WEIGHT: f64 = 0.3;
/// Smallest m2 the fast path accepts (2⁻⁶⁰⁰): below it cubes of deviations near underflow.
const MIN_M2: f64 = 2.409_919_865_102_884_7e-181;
/// Smallest window length (the adjusted skewness divides by n − 2).
pub const MIN_WINDOW: usize = 3;
/// Largest number of distinct values a window tracks (`quantised.max_distinct`).
pub const MAX_DISTINCT: usize = 16;
/// √12: the standard deviation of the rounding error of a quantiser of step Δ is Δ/√12.
pub const SQRT_12: f64 = 3.464_101_615_137_754_6;

/// What a window with few distinct values says about the resolution of its series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quantum {
    /// Every value of the window is this one.
    Constant(f64),
    /// The window holds 2..=k distinct values; the smallest gap between two adjacent ones.
    Step(f64),
}

/// Floors on the scale that divides the deviation of a point (docs/detectors/zscore_skew.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floors {
    /// Absolute floor, in the metric's unit.
    pub min_std: f64,
    /// Floor relative to |mean|.
    pub min_relative_std: f64,
    /// Assumed quantisation step of a constant window, relative to |mean| (floor: step/√12).
    pub constant_step: f64,
}

impl Floors {
    /// No floor: the score as docs/detectors/zscore_skew.md defines it.
    pub const NONE: Floors = Floors { min_std: 0.0, min_relative_std: 0.0, constant_step: 0.0 };

    /// The floored scale of a window of mean `mean` and standard deviation `std`.
    pub fn scale(&self, mean: f64, std: f64, quantum: Option<Quantum>) -> f64 {
        let am = mean.abs();
        let q = match quantum {
            Some(Quantum::Constant(_)) => self.constant_step * am / SQRT_12,
            Some(Quantum::Step(d)) if d.is_finite() => d / SQRT_12,
            _ => 0.0,
        };
        std.max(self.min_std).max(self.min_relative_std * am).max(q)
    }
}

/// How a score was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// From the running sums (or the constant-window rule) as they were.
    Fast,
    /// From the running sums after rebuilding them from the ring buffer.
    Rebuilt,
    /// From the exact two-pass computation over the ring buffer.
    Exact,
}

/// The score of one point against the window before it, and its evidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// z + 0.3·|skew|·(std/scale)³.
    pub score: f64,
    /// |x − mean| / (scale + 1e-8).
    pub z: f64,
    /// Mean of the window.
    pub mean: f64,
    /// Population standard deviation of the window.
    pub std: f64,
    /// The scale z divides by: `std`, or a floor above it (see [`Score::floored`]).
    pub scale: f64,
    /// Adjusted Fisher-Pearson skewness G1 of the window (0 where m2 = 0).
    pub skew: f64,
    /// How it was computed.
    pub path: Path,
}

impl Score {
    /// This score with its scale floored: scale = max(std, [`Floors::scale`]); where that is
    /// above std, z = |x − mean| / (scale + 1e-8) and the skew term is 0.3·|G1|·(std/scale)³
    /// (the third moment standardised by the scale). Unchanged where no floor exceeds std.
    pub fn floored(self, floors: &Floors, quantum: Option<Quantum>) -> Score {
        let scale = floors.scale(self.mean, self.std, quantum);
        if scale.is_nan() || scale <= self.std {
            return self;
        }
        // |x − mean| = z·(std + 1e-8), exactly as the score computed it.
        let z = self.z * ((self.std + STD_GUARD) / (scale + STD_GUARD));
        let r = self.std / scale;
        let score = z + SKEW_WEIGHT * self.skew.abs() * (r * r * r);
        Score { score, z, scale, ..self }
    }
}

/// The distinct values of a window, up to `k` of them (`k` = 0: not tracked).
#[derive(Debug, Clone, PartialEq)]
struct Distinct {
    k: usize,
    len: usize,
    /// Values of the window not in the table.
    others: usize,
    vals: [f64; MAX_DISTINCT],
    counts: [u32; MAX_DISTINCT],
}

impl Distinct {
    fn new(k: usize) -> Self {
        Distinct { k: k.min(MAX_DISTINCT), len: 0, others: 0, vals: [0.0; MAX_DISTINCT], counts: [0; MAX_DISTINCT] }
    }

    #[inline]
    fn add(&mut self, x: f64) {
        if self.k == 0 {
            return;
        }
        for i in 0..self.len {
            if self.vals[i] == x {
                self.counts[i] += 1;
                return;
            }
        }
        if self.len < self.k {
            self.vals[self.len] = x;
            self.counts[self.len] = 1;
            self.len += 1;
        } else {
            self.others += 1;
        }
    }

    /// Removes one `x`; true when the table no longer tells the distinct values (an entry went
    /// while values outside the table remain), so it must be rebuilt.
    #[inline]
    fn remove(&mut self, x: f64) -> bool {
        if self.k == 0 {
            return false;
        }
        for i in 0..self.len {
            if self.vals[i] == x {
                self.counts[i] -= 1;
                if self.counts[i] == 0 {
                    self.len -= 1;
                    self.vals[i] = self.vals[self.len];
                    self.counts[i] = self.counts[self.len];
                    return self.others > 0;
                }
                return false;
            }
        }
        self.others = self.others.saturating_sub(1);
        false
    }

    /// The table of `values`, given newest first.
    fn rebuild(&mut self, values: impl Iterator<Item = f64>) {
        self.len = 0;
        self.others = 0;
        for v in values {
            self.add(v);
        }
    }

    fn quantum(&self) -> Option<Quantum> {
        if self.k == 0 || self.others > 0 || self.len == 0 {
            return None;
        }
        if self.len == 1 {
            return Some(Quantum::Constant(self.vals[0]));
        }
        let mut v = self.vals;
        let v = &mut v[..self.len];
        v.sort_unstable_by(f64::total_cmp);
        let gap = v.windows(2).map(|p| p[1] - p[0]).fold(f64::INFINITY, f64::min);
        Some(Quantum::Step(gap))
    }
}

/// A compensated running sum (Kahan–Babuška / Neumaier): `s + c` is the sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Sum {
    s: f64,
    c: f64,
}

impl Sum {
    /// Adds `v`; the rounding error of `s + v` (exact, by Knuth's branch-free TwoSum) goes to `c`.
    #[inline]
    fn add(&mut self, v: f64) {
        let t = self.s + v;
        let bv = t - self.s;
        self.c += (self.s - (t - bv)) + (v - bv);
        self.s = t;
    }

    #[inline]
    fn value(&self) -> f64 {
        self.s + self.c
    }
}

/// Adds (`sign` 1) or removes (`sign` −1) the terms d, d², d³ of `x`, d = x − `shift`.
#[inline]
fn add_term(sums: &mut [Sum; 3], mass: &mut [f64; 3], shift: f64, x: f64, sign: f64) {
    let d = x - shift;
    let d2 = d * d;
    let d3 = d2 * d;
    sums[0].add(sign * d);
    sums[1].add(sign * d2);
    sums[2].add(sign * d3);
    mass[0] += d.abs();
    mass[1] += d2;
    mass[2] += d3.abs();
}

/// sqrt(n(n−1))/(n−2), the adjustment of G1.
#[inline]
fn skew_factor(n: f64) -> f64 {
    (n * (n - 1.0)).sqrt() / (n - 2.0)
}

/// The last `cap` finite values of a series and their running moments.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    cap: usize,
    /// Ring buffer; while not full, values in arrival order; when full, the oldest at `head`.
    buf: Vec<f64>,
    head: usize,
    shift: f64,
    sums: [Sum; 3],
    mass: [f64; 3],
    /// Terms added or removed since the last rebuild (pushes count 1 or 2).
    updates: u32,
    /// Length of the trailing run of equal values (≤ cap).
    run: u32,
    /// sqrt(n(n−1))/(n−2) for n = cap (not serialized: follows from cap).
    cn: f64,
    /// The distinct values (not serialized: rebuilt from the buffer).
    distinct: Distinct,
}

/// The serialized form of a [`Window`] (values oldest first; the sums exactly as they are).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowRepr {
    values: Vec<f64>,
    shift: f64,
    sums: [Sum; 3],
    mass: [f64; 3],
    updates: u32,
    run: u32,
}

/// Why a serialized window is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WindowError {
    /// A value of the buffer is NaN or infinite.
    #[error("non-finite value in a window")]
    NonFinite,
    /// The run length is longer than the buffer.
    #[error("run length {run} longer than the {len} values")]
    Run {
        /// Run length read.
        run: u32,
        /// Values read.
        len: usize,
    },
}

impl Window {
    /// An empty window of `cap` points (`cap` ≥ 3).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(MIN_WINDOW);
        Window {
            cap,
            buf: Vec::with_capacity(cap),
            head: 0,
            shift: 0.0,
            sums: [Sum::default(); 3],
            mass: [0.0; 3],
            updates: 0,
            run: 0,
            cn: skew_factor(cap as f64),
            distinct: Distinct::new(0),
        }
    }

    /// This window tracking up to `k` distinct values (at most [`MAX_DISTINCT`]; 0 = none), so
    /// that [`Window::quantum`] can tell a window of few values; the table is built from the buffer.
    pub fn with_distinct(mut self, k: usize) -> Self {
        self.distinct = Distinct::new(k);
        self.rebuild_distinct();
        self
    }

    /// The window's values when it holds at most `k` distinct ones (see [`Window::with_distinct`]):
    /// the value of a constant window, or the smallest gap between adjacent distinct values.
    pub fn quantum(&self) -> Option<Quantum> {
        self.distinct.quantum()
    }

    fn rebuild_distinct(&mut self) {
        let (a, b) = self.slices();
        let newest_first = b.iter().rev().chain(a.iter().rev()).copied();
        let mut d = Distinct::new(self.distinct.k);
        d.rebuild(newest_first);
        self.distinct = d;
    }

    /// The window length it was made with.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Number of values held (≤ cap).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when no value is held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// True when it holds `cap` values (a point can be scored).
    pub fn is_full(&self) -> bool {
        self.buf.len() == self.cap
    }

    /// Heap bytes of the ring buffer.
    pub fn heap_bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<f64>()
    }

    /// The values oldest first, as two slices.
    fn slices(&self) -> (&[f64], &[f64]) {
        let (a, b) = self.buf.split_at(self.head);
        (b, a)
    }

    /// The values, oldest first.
    pub fn values(&self) -> impl Iterator<Item = f64> + Clone + '_ {
        let (a, b) = self.slices();
        a.iter().chain(b).copied()
    }

    fn last(&self) -> Option<f64> {
        if self.buf.len() < self.cap {
            self.buf.last().copied()
        } else {
            self.buf.get((self.head + self.cap - 1) % self.cap).copied()
        }
    }

    #[inline]
    fn term(&mut self, x: f64, sign: f64) {
        add_term(&mut self.sums, &mut self.mass, self.shift, x, sign);
        self.updates = self.updates.saturating_add(1);
    }

    /// Appends a value (finite: the caller skips NaN and ±∞), dropping the oldest when full.
    pub fn push(&mut self, x: f64) {
        self.run = if self.last() == Some(x) { (self.run + 1).min(self.cap as u32) } else { 1 };
        if self.buf.is_empty() {
            self.shift = x;
        }
        if self.buf.len() < self.cap {
            self.buf.push(x);
            self.term(x, 1.0);
            self.distinct.add(x);
        } else {
            let h = self.head;
            let old = std::mem::replace(&mut self.buf[h], x);
            self.head = (h + 1) % self.cap;
            self.term(old, -1.0);
            self.term(x, 1.0);
            let stale = self.distinct.remove(old);
            self.distinct.add(x);
            if stale {
                self.rebuild_distinct();
            }
        }
        if self.updates as usize >= 2 * self.cap {
            self.rebuild();
        }
    }

    /// Recomputes the shift (the window's mean) and the sums exactly from the buffer.
    fn rebuild(&mut self) {
        let n = self.buf.len();
        self.sums = [Sum::default(); 3];
        self.mass = [0.0; 3];
        self.updates = 0;
        let Some(x0) = self.values().next() else {
            self.shift = 0.0;
            return;
        };
        let mut s = Sum::default();
        for v in self.values() {
            s.add(v - x0);
        }
        let k = x0 + s.value() / n as f64;
        self.shift = if k.is_finite() { k } else { x0 };
        let Window { buf, head, sums, mass, shift, .. } = self;
        let (a, b) = buf.split_at(*head);
        for &v in b.iter().chain(a) {
            add_term(sums, mass, *shift, v, 1.0);
        }
    }

    /// Scores `x` against the values held (none until the window is full). May rebuild the sums.
    pub fn score(&mut self, x: f64) -> Option<Score> {
        if !self.is_full() {
            return None;
        }
        if let Some(s) = self.fast(x) {
            return Some(s);
        }
        if self.updates > 0 {
            self.rebuild();
            if let Some(s) = self.fast(x) {
                return Some(Score { path: Path::Rebuilt, ..s });
            }
        }
        let (a, b) = self.slices();
        Some(exact(a.iter().chain(b).copied(), self.cap, x))
    }

    /// The score from the running sums, if its error bound is within [`TOLERANCE`].
    fn fast(&self, x: f64) -> Option<Score> {
        let n = self.buf.len() as f64;
        if self.run as usize >= self.buf.len() {
            // Every value equal: m2 = 0 exactly, mean = the value, skew 0 by definition.
            let c = self.last()?;
            let z = (x - c).abs() / STD_GUARD;
            return Some(Score { score: z, z, mean: c, std: 0.0, scale: 0.0, skew: 0.0, path: Path::Fast });
        }
        let (s1, s2, s3) = (self.sums[0].value(), self.sums[1].value(), self.sums[2].value());
        let mu = s1 / n;
        let q = s2 / n;
        let m2 = q - mu * mu;
        if !m2.is_finite() || m2 < MIN_M2 {
            return None;
        }
        let m3 = s3 / n - mu * (3.0 * q - 2.0 * mu * mu);
        let a = x - self.shift;
        let dev = (a - mu).abs();
        let sd = m2.sqrt();
        let den = sd + STD_GUARD;
        let z = dev / den;
        let inv_m2sd = 1.0 / (m2 * sd);
        let skew = self.cn * m3 * inv_m2sd;
        let score = z + SKEW_WEIGHT * skew.abs();

        // A-priori bound of the absolute error of `score` (multiplications by reciprocals: the
        // bound needs no last-bit accuracy).
        let inv_n = 1.0 / n;
        let terms = self.updates as f64 + n;
        let uu = U * U;
        let e1 = 8.0 * U * (n * s2).sqrt() + 4.0 * terms * uu * self.mass[0];
        let e2 = 8.0 * U * s2 + 4.0 * terms * uu * self.mass[1];
        let e3 = 8.0 * U * s2 * s2.sqrt() + 4.0 * terms * uu * self.mass[2];
        let amu = mu.abs();
        let emu = e1 * inv_n + U * amu;
        let e2n = e2 * inv_n;
        let em2 = e2n + 2.0 * amu * emu + 4.0 * U * (q + mu * mu);
        let em3 = e3 * inv_n
            + 3.0 * amu * e2n
            + (3.0 * q + 6.0 * mu * mu) * emu
            + 8.0 * U * (s3.abs() * inv_n + 3.0 * amu * q + 2.0 * amu * amu * amu);
        if em2.is_nan() || em2 >= 0.25 * m2 {
            return None;
        }
        let rel_m2 = em2 / m2;
        let ez = (emu + U * a.abs() + 2.0 * U * dev) / den + z * (rel_m2 + 4.0 * U);
        let eskew = 2.0 * self.cn * (em3 + 1.5 * m3.abs() * rel_m2) * inv_m2sd + 8.0 * U * skew.abs();
        let err = ez + SKEW_WEIGHT * eskew;
        let mean = self.shift + mu;
        if err.is_nan() || err > TOLERANCE * score.max(1.0) || !score.is_finite() || !mean.is_finite() {
            return None;
        }
        Some(Score { score, z, mean, std: sd, scale: sd, skew, path: Path::Fast })
    }

    /// The serialized form.
    pub fn to_repr(&self) -> WindowRepr {
        WindowRepr {
            values: self.values().collect(),
            shift: self.shift,
            sums: self.sums,
            mass: self.mass,
            updates: self.updates,
            run: self.run,
        }
    }

    /// A window of `cap` points from its serialized form. With the same `cap` the state is taken
    /// as it is (a restored window continues exactly as the saved one would); with another `cap`
    /// the newest values are kept and the sums rebuilt.
    pub fn from_repr(cap: usize, r: WindowRepr) -> Result<Self, WindowError> {
        if r.values.iter().any(|v| !v.is_finite()) {
            return Err(WindowError::NonFinite);
        }
        let cap = cap.max(MIN_WINDOW);
        if r.values.len() > cap {
            // A shorter window than the saved one: keep the newest values.
            let mut w = Window::new(cap);
            let skip = r.values.len().saturating_sub(cap);
            for &v in &r.values[skip..] {
                w.push(v);
            }
            w.rebuild();
            return Ok(w);
        }
        if r.run as usize > r.values.len() || (r.run == 0 && !r.values.is_empty()) {
            return Err(WindowError::Run { run: r.run, len: r.values.len() });
        }
        let mut buf = Vec::with_capacity(cap);
        buf.extend_from_slice(&r.values);
        Ok(Window {
            cap,
            buf,
            head: 0,
            shift: r.shift,
            sums: r.sums,
            mass: r.mass,
            updates: r.updates,
            run: r.run,
            cn: skew_factor(cap as f64),
            distinct: Distinct::new(0),
        })
    }
}

/// The exact score of `x` against `values` (two-pass, O(w)): the reference the fast path is held
/// to, and its fallback. `values` must hold at least 3 finite values.
pub fn exact_score(values: &[f64], x: f64) -> Score {
    exact(values.iter().copied(), values.len(), x)
}

/// An exact power of two, 2^e, for e in [-1022, 1023].
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e.clamp(-1022, 1023)) as u64) << 52)
}

/// Two-pass moments with a correction pass, on values scaled by a power of two (exact) so that
/// the largest magnitude is about 1: no overflow, no underflow that matters, for any finite input.
fn exact(values: impl Iterator<Item = f64> + Clone, n: usize, x: f64) -> Score {
    let nf = n as f64;
    let big = values.clone().fold(x.abs(), |m, v| m.max(v.abs()));
    let e = if big > 0.0 && big.is_finite() { -(big.log2().floor() as i32) } else { 0 };
    let p = pow2(e);
    let mut it = values.clone();
    let y0 = it.next().unwrap_or(0.0) * p;
    let mut s = Sum::default();
    for v in values.clone() {
        s.add(v * p - y0);
    }
    let mut mean_d = s.value() / nf;
    let (mut e1, mut e2, mut e3) = (Sum::default(), Sum::default(), Sum::default());
    for v in values {
        let d = (v * p - y0) - mean_d;
        let d2 = d * d;
        e1.add(d);
        e2.add(d2);
        e3.add(d2 * d);
    }
    let corr = e1.value() / nf;
    let (q, c3) = (e2.value() / nf, e3.value() / nf);
    mean_d += corr;
    let m2 = (q - corr * corr).max(0.0);
    let m3 = c3 - corr * (3.0 * q - 2.0 * corr * corr);
    let sd = m2.sqrt();
    let skew = if m2 > 0.0 { skew_factor(nf) * m3 / (m2 * sd) } else { 0.0 };
    let z = ((x * p - y0) - mean_d).abs() / (sd + STD_GUARD * p);
    let std = sd / p;
    Score { score: z + SKEW_WEIGHT * skew.abs(), z, mean: (y0 + mean_d) / p, std, scale: std, skew, path: Path::Exact }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 11) as f64) / (1u64 << 53) as f64
    }

    #[test]
    fn constant_window_is_exact() {
        let mut w = Window::new(5);
        for _ in 0..5 {
            w.push(0.1);
        }
        let s = w.score(0.1 + 1e-9).unwrap();
        assert_eq!((s.mean, s.std, s.skew), (0.1, 0.0, 0.0));
        assert_eq!(s.score, ((0.1 + 1e-9) - 0.1_f64).abs() / STD_GUARD);
        assert_eq!(s.path, Path::Fast);
    }

    #[test]
    fn fast_matches_exact_and_stays_fast() {
        let mut seed = 7;
        let mut w = Window::new(50);
        let mut slow = 0;
        for i in 0..20_000 {
            let x = 1e6 + lcg(&mut seed) * 10.0;
            if let Some(s) = w.score(x) {
                let e = exact(w.values(), 50, x);
                assert!((s.score - e.score).abs() <= 1e-10 * e.score.max(1.0), "{i}: {s:?} {e:?}");
                if s.path != Path::Fast {
                    slow += 1;
                }
            }
            w.push(x);
        }
        assert_eq!(slow, 0, "well-conditioned data never leaves the fast path");
    }

    /// The distinct-value table against a brute force, on sequences of few and many values, with
    /// the rebuild from the buffer (newest first) exercised, and after a restore.
    #[test]
    fn quantum_matches_a_brute_force() {
        let mut seed = 11;
        for (k, cap, values) in [(4usize, 20usize, 3u64), (4, 20, 6), (1, 5, 2), (2, 8, 3), (16, 30, 12), (3, 3, 5)] {
            let mut w = Window::new(cap).with_distinct(k);
            let mut rebuilt = 0;
            for i in 0..5000 {
                // Runs of one value, and stretches of few or many values.
                let phase = (i / 97) % 3;
                let x = match phase {
                    0 => 0.5 * (lcg(&mut seed) * values as f64).floor(),
                    1 => 2.0,
                    _ => lcg(&mut seed),
                };
                w.push(x);
                let mut d: Vec<f64> = w.values().collect();
                d.sort_by(f64::total_cmp);
                d.dedup();
                let want = match d.len() {
                    n if n > k => None,
                    1 => Some(Quantum::Constant(d[0])),
                    _ => Some(Quantum::Step(d.windows(2).map(|p| p[1] - p[0]).fold(f64::INFINITY, f64::min))),
                };
                assert_eq!(w.quantum(), want, "k {k}, cap {cap}, point {i}");
                if i % 301 == 0 {
                    w = Window::from_repr(cap, w.to_repr()).unwrap().with_distinct(k);
                    rebuilt += 1;
                    assert_eq!(w.quantum(), want, "after a restore");
                }
            }
            assert!(rebuilt > 0);
        }
        assert_eq!(Window::new(3).quantum(), None, "not tracked, empty");
    }

    #[test]
    fn floors_rescale_z_and_damp_the_skew() {
        let s = Score { score: 10.3, z: 10.0, mean: 2.0, std: 0.1, scale: 0.1, skew: 1.0, path: Path::Fast };
        assert_eq!(s.floored(&Floors::NONE, None), s);
        let f = Floors { min_std: 0.0, min_relative_std: 0.1, constant_step: 0.5 };
        let g = s.floored(&f, None);
        assert_eq!(g.scale, 0.2);
        assert!((g.z - 10.0 * (0.1 + STD_GUARD) / (0.2 + STD_GUARD)).abs() < 1e-12);
        assert!((g.score - (g.z + 0.3 * 0.125)).abs() < 1e-12, "skew term · (0.1/0.2)³");
        assert_eq!((g.std, g.skew, g.mean), (0.1, 1.0, 2.0), "the window's own moments are kept");
        assert_eq!(s.floored(&f, Some(Quantum::Step(6.0))).scale, 6.0 / SQRT_12);
        assert_eq!(s.floored(&f, Some(Quantum::Constant(2.0))).scale, 0.5 * 2.0 / SQRT_12);
        assert_eq!(s.floored(&Floors { min_std: 0.05, ..Floors::NONE }, None), s, "a floor below std");
        assert_eq!(s.floored(&Floors { min_std: 1.0, ..Floors::NONE }, Some(Quantum::Step(f64::INFINITY))).scale, 1.0);
    }

    #[test]
    fn huge_values_fall_back_to_exact() {
        let mut w = Window::new(4);
        for v in [1e300, -1e300, 1e300, 5e299] {
            w.push(v);
        }
        let s = w.score(0.0).unwrap();
        assert_eq!(s.path, Path::Exact);
        assert!(s.score.is_finite() && s.skew.is_finite());
        let e = exact_score(&[1.0, -1.0, 1.0, 0.5], 0.0);
        assert!((s.skew - e.skew).abs() < 1e-12, "{s:?} {e:?}");
    }

    #[test]
    fn repr_round_trip_and_resize() {
        let mut w = Window::new(5);
        for v in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] {
            w.push(v);
        }
        let back = Window::from_repr(5, w.to_repr()).unwrap();
        assert_eq!(back.values().collect::<Vec<_>>(), w.values().collect::<Vec<_>>());
        assert_eq!(back.to_repr(), w.to_repr());
        let small = Window::from_repr(3, w.to_repr()).unwrap();
        assert_eq!(small.values().collect::<Vec<_>>(), vec![16.0, 32.0, 64.0]);
        let mut bad = w.to_repr();
        bad.values[0] = f64::NAN;
        assert_eq!(Window::from_repr(5, bad), Err(WindowError::NonFinite));
    }
}
