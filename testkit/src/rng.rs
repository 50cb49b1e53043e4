//! The deterministic RNG of the synthetic test data (SplitMix64, kept in the core crate so that
//! the held-out series generator of `inferwatch eval` draws the same sequences).

pub use inferwatch_core::rng::SplitMix64;
