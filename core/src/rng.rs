//! A small deterministic RNG (SplitMix64) for synthetic data (tests, the held-out series generator): the same seed gives the same
//! series on every platform and toolchain.

/// SplitMix64; the field is the state (the seed to start with).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1), never 0 or 1 (53 bits, centred in their interval).
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller, one of the pair).
    pub fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in 0..n (modulo; n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_gives_the_reference_sequence() {
        // The first outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
        let mut r = SplitMix64(0);
        assert_eq!(r.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next(), 0x6e78_9e6a_a1b9_65f4);
        let mut r = SplitMix64(7);
        let u: Vec<f64> = (0..1000).map(|_| r.unit()).collect();
        assert!(u.iter().all(|x| *x > 0.0 && *x < 1.0));
        assert!((u.iter().sum::<f64>() / 1000.0 - 0.5).abs() < 0.05);
        assert!((0..100).all(|_| r.below(3) < 3));
        let x = r.range(2.0, 3.0);
        assert!((2.0..3.0).contains(&x));
    }
}
