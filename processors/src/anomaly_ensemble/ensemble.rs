//! The mathematics of `anomaly_ensemble`, std only: per series a bounded state that takes one value
//! at a time and returns its anomaly score (docs/detectors/anomaly_ensemble.md).
//!
//! Raw evidence per point, each in [0, 1], mixed by weight:
//! - **context novelty** (after CAD OSE): the value is quantised on a grid fixed at the end of the
//!   warm-up; the n-grams of the last quantised values (fine orders 1–3, one coarse of 8 values) are
//!   hashed into a bit set of contexts seen; the novelty is the share of unseen ones;
//! - **new extreme** (after HTM's spatial anomaly): the value leaves the range seen so far by more
//!   than `extreme` of that range;
//! - **distribution shift** (after Wang et al.'s relative entropy): the histogram of the last
//!   `short` values against the exponentially weighted histogram of the values before them.
//!
//! The raw score goes through an anomaly likelihood (after Numenta HTM): its short moving average
//! against the long-run distribution of that average gives a Gaussian tail probability, reported on a
//! log scale; a new extreme scores the top of that scale directly (as HTM's spatial anomaly does).
//! After a report at or above `report_score`, reports are suppressed for `suppress` points.

use std::collections::VecDeque;

/// Fixed parameters of the detector (the same for every series).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Points that learn the quantisation grid before any score (≥ 2).
    pub warmup: u32,
    /// Grid cells across the warm-up range.
    pub bins: u32,
    /// Time constant of the reference mean, variance and histogram, in points.
    pub window: usize,
    /// Values of the recent histogram (distribution shift).
    pub short: usize,
    /// Points of the raw score's moving average (likelihood).
    pub average: usize,
    /// Time constant of the long-run mean and variance of the averaged raw score, in points.
    pub memory: f64,
    /// Reports are suppressed for this many points after one at or above `report_score`.
    pub suppress: u32,
    /// The score (decades of tail probability) that starts a suppression.
    pub report_score: f64,
    /// Weight of the new-extreme test next to the context novelty.
    pub extreme_weight: f64,
    /// Weight of the distribution shift.
    pub shift_weight: f64,
    /// Grid cells merged into one in the long coarse n-gram.
    pub coarse: i64,
    /// Highest order of the fine n-grams (1–3).
    pub orders: usize,
    /// A value beyond the range seen so far by this share of it is a new extreme.
    pub extreme: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            warmup: 150,
            bins: 6,
            window: 4096,
            short: 16,
            average: 8,
            memory: 8000.0,
            suppress: 30,
            report_score: 3.0,
            extreme_weight: 6.0,
            shift_weight: 0.5,
            coarse: 4,
            orders: 3,
            extreme: 0.05,
        }
    }
}

/// Words of the context bit set (2¹⁴ bits, 2 KiB).
pub const CONTEXT_WORDS: usize = 256;
/// Quantised values remembered for the n-grams.
pub const HISTORY: usize = 8;
/// Cells a quantised value is clamped to on either side of the warm-up range, in ranges.
const SPAN: i64 = 4;

/// A fixed quantisation grid.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Grid {
    /// Lower end of the warm-up range.
    pub lo: f64,
    /// Cell width (> 0).
    pub width: f64,
}

impl Grid {
    /// The cell of `x`, clamped to `SPAN` ranges either side.
    pub fn cell(&self, x: f64, bins: u32) -> i64 {
        let c = ((x - self.lo) / self.width).floor();
        let lim = SPAN * bins as i64;
        if c.is_nan() { 0 } else { (c.max(-(lim as f64)).min((lim + bins as i64) as f64)) as i64 }
    }
}

/// The last `cap` values with their running sums (about a reference point, for precision).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Window {
    /// Capacity.
    pub cap: usize,
    /// The values, oldest first.
    pub values: VecDeque<f64>,
    /// Reference subtracted before summing.
    pub origin: f64,
    /// Σ (v − origin).
    pub sum: f64,
    /// Σ (v − origin)².
    pub sum2: f64,
}

impl Window {
    /// An empty window of `cap` values about `origin`.
    pub fn new(cap: usize, origin: f64) -> Self {
        Window { cap, values: VecDeque::with_capacity(cap), origin, sum: 0.0, sum2: 0.0 }
    }

    /// Appends `x`; returns the value that fell out.
    pub fn push(&mut self, x: f64) -> Option<f64> {
        let out = if self.values.len() == self.cap { self.values.pop_front() } else { None };
        if let Some(o) = out {
            let d = o - self.origin;
            self.sum -= d;
            self.sum2 -= d * d;
        }
        if self.cap > 0 {
            let d = x - self.origin;
            self.sum += d;
            self.sum2 += d * d;
            self.values.push_back(x);
        }
        out
    }

    /// Mean and population standard deviation of the values (0, 0 when empty).
    pub fn mean_std(&self) -> (f64, f64) {
        let n = self.values.len() as f64;
        if n == 0.0 {
            return (0.0, 0.0);
        }
        let m = self.sum / n;
        ((m + self.origin), (self.sum2 / n - m * m).max(0.0).sqrt())
    }
}

/// Counts of grid cells (clamped to the histogram's cells) of a set of values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    /// Count per cell; cell 0 and the last take everything below / above the range.
    pub counts: Vec<u32>,
    /// Values counted.
    pub total: u32,
}

impl Histogram {
    /// Cells of a histogram on a grid of `bins` cells: the range plus one overflow cell each side.
    pub fn new(bins: u32) -> Self {
        Histogram { counts: vec![0; bins as usize + 2], total: 0 }
    }

    /// The histogram cell of grid cell `c`.
    pub fn slot(&self, c: i64) -> usize {
        (c + 1).clamp(0, self.counts.len() as i64 - 1) as usize
    }

    /// Counts grid cell `c` once more (`add`) or once less.
    pub fn count(&mut self, c: i64, add: bool) {
        let s = self.slot(c);
        if add {
            self.counts[s] += 1;
            self.total += 1;
        } else if self.counts[s] > 0 {
            self.counts[s] -= 1;
            self.total -= 1;
        }
    }
}

/// One series' state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {
    /// Points taken.
    pub n: u64,
    /// The grid, once the warm-up is over.
    pub grid: Option<Grid>,
    /// The warm-up values (emptied when the grid is fixed).
    pub warm: Vec<f64>,
    /// Exponentially weighted mean of the reference (values older than the recent window).
    pub ref_mean: f64,
    /// Exponentially weighted variance of the reference.
    pub ref_var: f64,
    /// Values the reference has taken.
    pub ref_n: u64,
    /// Exponentially weighted share of the reference's values per histogram cell.
    pub ref_hist: Vec<f64>,
    /// The recent values, oldest first, with their running sums.
    pub recent: Window,
    /// Histogram of the recent values' cells.
    pub recent_hist: Histogram,
    /// The last quantised values, newest last.
    pub cells: VecDeque<i64>,
    /// Contexts seen (bit set of hashed n-grams).
    pub contexts: Vec<u64>,
    /// Bits set in `contexts`.
    pub contexts_set: u32,
    /// The last raw scores (moving average).
    pub raws: VecDeque<f64>,
    /// Long-run mean of the averaged raw score.
    pub avg_mean: f64,
    /// Long-run variance of the averaged raw score.
    pub avg_var: f64,
    /// Averaged raw scores seen by the long-run moments.
    pub avg_n: u64,
    /// Points left in the current suppression.
    pub quiet: u32,
    /// Smallest value seen.
    pub min_seen: f64,
    /// Largest value seen.
    pub max_seen: f64,
}

/// What one scored point rests on.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Step {
    /// The reported score in [0, [`MAX_SCORE`]] (0 while suppressed).
    pub score: f64,
    /// The score before suppression.
    pub unsuppressed: f64,
    /// The raw evidence in [0, 1].
    pub raw: f64,
    /// Share of unseen contexts.
    pub novelty: f64,
    /// |x − mean| / std against the reference (evidence only).
    pub surprise: f64,
    /// The value is a new extreme.
    pub extreme: bool,
    /// Distribution shift of the recent histogram against the reference one, in [0, 1].
    pub shift: f64,
    /// The tail probability of the averaged raw score.
    pub tail: f64,
}

fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Complementary error function (Numerical Recipes' Chebyshev fit, relative error < 1.2e-7).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// The upper Gaussian tail probability Q(z).
pub fn gaussian_tail(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The highest score: −log₁₀ of the smallest tail probability told apart (1e-10).
pub const MAX_SCORE: f64 = 10.0;

/// The score of a tail probability: −log₁₀(tail + 10⁻¹⁰), in [0, [`MAX_SCORE`]] (HTM's log-likelihood
/// scale, in decades: 3 is a tail of 10⁻³).
pub fn log_score(tail: f64) -> f64 {
    (-(tail.max(0.0) + 1e-10).log10()).clamp(0.0, MAX_SCORE)
}

impl State {
    /// A new series' state.
    pub fn new(p: &Params) -> Self {
        State {
            ref_hist: vec![0.0; p.bins as usize + 2],
            recent: Window::new(p.short, 0.0),
            recent_hist: Histogram::new(p.bins),
            contexts: vec![0; CONTEXT_WORDS],
            ..State::default()
        }
    }

    /// Bytes held by one series at most (the fixed fields plus the buffers at capacity).
    pub fn bytes(p: &Params) -> usize {
        std::mem::size_of::<State>()
            + 8 * (p.warmup as usize + p.short + HISTORY + p.average + CONTEXT_WORDS)
            + (8 + 4) * (p.bins as usize + 2)
    }

    fn seen(&mut self, key: u64) -> bool {
        let bit = (mix(key) % (CONTEXT_WORDS as u64 * 64)) as usize;
        let (w, b) = (bit / 64, 1u64 << (bit % 64));
        let was = self.contexts[w] & b != 0;
        if !was {
            self.contexts[w] |= b;
            self.contexts_set += 1;
        }
        was
    }

    /// Context novelty of the newest cell (and records its contexts).
    fn novelty(&mut self, p: &Params) -> f64 {
        let k = self.cells.len();
        let c = |i: usize| self.cells[k - 1 - i];
        let mut keys = [0u64; 4];
        let mut used = 0;
        // fine n-grams of orders 1..=3
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        for order in 0..p.orders.min(3).min(k) {
            h = mix(h ^ (c(order) as u64).wrapping_add(order as u64 * 0x1000_0000_01b3));
            keys[used] = h ^ (order as u64 + 1);
            used += 1;
        }
        // a coarse n-gram over the whole history (cells / 4)
        if k >= HISTORY {
            let mut g = 0x2545_f491_4f6c_dd1du64;
            for i in 0..HISTORY {
                g = mix(g ^ (c(i).div_euclid(p.coarse.max(1)) as u64));
            }
            keys[used] = g ^ 0xff;
            used += 1;
        }
        let mut unseen = 0;
        for &key in &keys[..used] {
            unseen += u32::from(!self.seen(key));
        }
        if self.contexts_set as usize > CONTEXT_WORDS * 64 / 2 {
            self.contexts.iter_mut().for_each(|w| *w = 0);
            self.contexts_set = 0;
        }
        if used > 0 { f64::from(unseen) / used as f64 } else { 0.0 }
    }

    /// Adds `x` (in grid cell `c`) to the reference moments and histogram.
    fn add_reference(&mut self, p: &Params, x: f64, c: i64) {
        self.ref_n += 1;
        let a = 1.0 / (self.ref_n as f64).min(p.window as f64);
        let d = x - self.ref_mean;
        self.ref_mean += a * d;
        self.ref_var = (1.0 - a) * (self.ref_var + a * d * d);
        let slot = self.recent_hist.slot(c);
        for (i, h) in self.ref_hist.iter_mut().enumerate() {
            *h = (1.0 - a) * *h + if i == slot { a } else { 0.0 };
        }
    }

    /// Takes `x`; its score once the warm-up is over.
    pub fn push(&mut self, p: &Params, x: f64) -> Option<Step> {
        self.n += 1;
        let Some(grid) = self.grid else {
            self.warm.push(x);
            if self.warm.len() < p.warmup as usize {
                return None;
            }
            let (lo, hi) = self.warm.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let floor = 1e-9 * hi.abs().max(lo.abs()).max(1e-300);
            let grid = Grid { lo, width: ((hi - lo) / p.bins as f64).max(floor) };
            self.grid = Some(grid);
            self.min_seen = lo;
            self.max_seen = hi;
            let warm = std::mem::take(&mut self.warm);
            self.recent = Window::new(p.short, warm[0]);
            for &v in &warm {
                let c = grid.cell(v, p.bins);
                self.add_reference(p, v, c);
                self.cells.push_back(c);
                if self.cells.len() > HISTORY {
                    self.cells.pop_front();
                }
                self.novelty(p);
            }
            return None;
        };
        let cell = grid.cell(x, p.bins);
        // z against the reference (evidence)
        let std = self.ref_var.sqrt().max(grid.width * 0.5);
        let surprise = (x - self.ref_mean).abs() / std;
        // contexts
        self.cells.push_back(cell);
        if self.cells.len() > HISTORY {
            self.cells.pop_front();
        }
        let novelty = self.novelty(p);
        // the recent window; what leaves it joins the reference
        self.recent_hist.count(cell, true);
        if let Some(old) = self.recent.push(x) {
            let oc = grid.cell(old, p.bins);
            self.recent_hist.count(oc, false);
            self.add_reference(p, old, oc);
        }
        let shift = if self.recent.values.len() == p.short { self.shift() } else { 0.0 };
        // a new extreme: beyond the range seen so far by `extreme` of it
        let span = (self.max_seen - self.min_seen).max(grid.width);
        let extreme = x > self.max_seen + p.extreme * span || x < self.min_seen - p.extreme * span;
        self.max_seen = self.max_seen.max(x);
        self.min_seen = self.min_seen.min(x);
        let ext = if extreme { 1.0 } else { 0.0 };
        let raw =
            (novelty + p.extreme_weight * ext + p.shift_weight * shift) / (1.0 + p.extreme_weight + p.shift_weight);
        // likelihood
        self.raws.push_back(raw);
        if self.raws.len() > p.average {
            self.raws.pop_front();
        }
        let avg = self.raws.iter().sum::<f64>() / self.raws.len() as f64;
        let std_avg = self.avg_var.sqrt().max(0.01);
        let tail = if self.avg_n < 10 { 0.5 } else { gaussian_tail((avg - self.avg_mean) / std_avg) };
        self.avg_n += 1;
        let a = 1.0 / (self.avg_n as f64).min(p.memory);
        let d = avg - self.avg_mean;
        self.avg_mean += a * d;
        self.avg_var = (1.0 - a) * (self.avg_var + a * d * d);
        // A new extreme is reported at the top score, whatever the likelihood (as HTM's spatial anomaly).
        let unsuppressed = if extreme { MAX_SCORE } else { log_score(tail) };
        let score = if self.quiet > 0 {
            self.quiet -= 1;
            0.0
        } else {
            if unsuppressed >= p.report_score {
                self.quiet = p.suppress;
            }
            unsuppressed
        };
        Some(Step { score, unsuppressed, raw, novelty, surprise, extreme, shift, tail })
    }

    /// Distribution shift in [0, 1]: total variation distance of the recent histogram from the
    /// reference one, less what `short` draws from the reference would give by chance.
    fn shift(&self) -> f64 {
        let r = &self.recent_hist;
        if r.total == 0 {
            return 0.0;
        }
        let tv: f64 =
            r.counts.iter().zip(&self.ref_hist).map(|(&a, &b)| (a as f64 / r.total as f64 - b).abs()).sum::<f64>()
                * 0.5;
        // Expected TV of a sample of `short` from q is about sqrt(cells / (2π·short)); take the excess.
        let base = ((r.counts.len() as f64) / (2.0 * std::f64::consts::PI * r.total as f64)).sqrt().min(0.9);
        ((tv - base) / (1.0 - base)).clamp(0.0, 1.0)
    }
}
