//! From Δ, its confidence interval and the sample sizes to a verdict and an anomaly level.

/// What a window's comparison says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The interval lies on the good side of the threshold.
    Steady,
    /// Too few samples, or the interval straddles the threshold.
    Inconclusive,
    /// The interval lies entirely beyond the threshold, in the bad direction.
    Regression,
}

impl Verdict {
    /// The attribute value (`steady`, `inconclusive`, `regression`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Steady => "steady",
            Verdict::Inconclusive => "inconclusive",
            Verdict::Regression => "regression",
        }
    }
}

/// The rule of one comparison: threshold, bad direction, and the warning condition.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Threshold on Δ (ms for latency, relative otherwise).
    pub threshold: f64,
    /// Whether a larger Δ is worse (latency); otherwise a smaller one is (throughput, quality).
    pub higher_is_worse: bool,
    /// A warning (0.6) also needs the interval to exclude "no change" on the bad side.
    pub warning_needs_significance: bool,
}

/// Level of a warning: the point estimate is beyond the threshold, the interval is not.
pub const WARNING_LEVEL: f64 = 0.6;
/// Level of a regression whose interval's near end just passes the threshold.
pub const REGRESSION_LEVEL: f64 = 0.8;

impl Rule {
    /// How far `x` lies beyond the threshold in the bad direction (> 0: beyond).
    fn excess(&self, x: f64) -> f64 {
        if self.higher_is_worse { x - self.threshold } else { self.threshold - x }
    }

    /// How far `x` lies from "no change" (0) in the bad direction (> 0: worse).
    fn worse(&self, x: f64) -> f64 {
        if self.higher_is_worse { x } else { -x }
    }

    /// Verdict and level of Δ = `point` with interval [`low`, `high`], when both sides had
    /// enough samples (`enough`); a comparison on too few samples is inconclusive at level 0.
    ///
    /// Levels: regression (the interval's near end beyond the threshold) → 0.8 + 0.2·min(1,
    /// excess / |threshold|) (1 when the threshold is 0); inconclusive with the point estimate
    /// beyond the threshold → 0.6 (with `warning_needs_significance`, only when the interval also
    /// excludes 0 on the bad side); everything else → 0.
    pub fn assess(&self, enough: bool, point: f64, low: f64, high: f64) -> (Verdict, f64) {
        if !(enough && point.is_finite() && low.is_finite() && high.is_finite()) {
            return (Verdict::Inconclusive, 0.0);
        }
        let (near, far) =
            if self.higher_is_worse { (low.min(high), low.max(high)) } else { (high.max(low), high.min(low)) };
        let near_excess = self.excess(near);
        if near_excess > 0.0 {
            let scale = self.threshold.abs();
            let extra = if scale > 0.0 { (near_excess / scale).min(1.0) } else { 1.0 };
            return (Verdict::Regression, REGRESSION_LEVEL + (1.0 - REGRESSION_LEVEL) * extra);
        }
        if self.excess(far) <= 0.0 {
            return (Verdict::Steady, 0.0);
        }
        let warn = self.excess(point) > 0.0 && (!self.warning_needs_significance || self.worse(near) > 0.0);
        (Verdict::Inconclusive, if warn { WARNING_LEVEL } else { 0.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LATENCY: Rule = Rule { threshold: 5.0, higher_is_worse: true, warning_needs_significance: true };
    const THROUGHPUT: Rule = Rule { threshold: -0.08, higher_is_worse: false, warning_needs_significance: true };

    #[test]
    fn latency_verdicts_and_levels() {
        let (v, l) = LATENCY.assess(true, 5.5, 5.2, 5.8);
        assert_eq!(v, Verdict::Regression);
        assert!((l - (0.8 + 0.2 * 0.2 / 5.0)).abs() < 1e-12, "{l}");
        assert_eq!(LATENCY.assess(true, 30.0, 10.0, 50.0), (Verdict::Regression, 1.0));
        assert_eq!(LATENCY.assess(true, 1.0, -2.0, 4.0), (Verdict::Steady, 0.0));
        assert_eq!(LATENCY.assess(true, -9.0, -12.0, -6.0), (Verdict::Steady, 0.0), "an improvement is steady");
        assert_eq!(LATENCY.assess(true, 6.0, 1.0, 11.0), (Verdict::Inconclusive, 0.6));
        assert_eq!(LATENCY.assess(true, 6.0, -1.0, 11.0), (Verdict::Inconclusive, 0.0), "not significant");
        let loose = Rule { warning_needs_significance: false, ..LATENCY };
        assert_eq!(loose.assess(true, 6.0, -1.0, 11.0), (Verdict::Inconclusive, 0.6));
        assert_eq!(LATENCY.assess(true, 4.0, 1.0, 11.0), (Verdict::Inconclusive, 0.0));
        assert_eq!(LATENCY.assess(false, 50.0, 40.0, 60.0), (Verdict::Inconclusive, 0.0), "too few samples");
        assert_eq!(LATENCY.assess(true, f64::NAN, 1.0, 2.0), (Verdict::Inconclusive, 0.0));
    }

    #[test]
    fn throughput_is_bad_downwards() {
        let (v, l) = THROUGHPUT.assess(true, -0.10, -0.11, -0.09);
        assert_eq!(v, Verdict::Regression);
        assert!((l - (0.8 + 0.2 * 0.01 / 0.08)).abs() < 1e-12);
        assert_eq!(THROUGHPUT.assess(true, 0.2, 0.1, 0.3), (Verdict::Steady, 0.0));
        assert_eq!(THROUGHPUT.assess(true, -0.09, -0.12, -0.01), (Verdict::Inconclusive, 0.6));
        let zero = Rule { threshold: 0.0, ..THROUGHPUT };
        assert_eq!(zero.assess(true, -0.5, -0.6, -0.4), (Verdict::Regression, 1.0));
    }
}
