//! A corpus-driven, structure-aware mutation fuzzer for inferwatch's decoders and parsers that
//! runs on the stable toolchain (no sanitizer instrumentation; see docs/fuzzing.md).
//!
//! - [`targets`]: every decoder that takes outside input, each a function of bytes that must
//!   not panic, hang or allocate without bound, and that checks its own invariants.
//! - [`mutate`] and [`proto`]: byte, token and protobuf-field mutations, deterministic from a seed.
//! - [`engine`]: the loop: mutate a corpus entry, run it under `catch_unwind` with a time and
//!   memory budget, keep inputs that show a new outcome, minimise what it finds.
//! - [`seeds`]: the generator of the checked-in seed corpus (`fuzz/corpus/<target>/`).
//!
//! The crate installs a counting global allocator ([`alloc`]) so that each input's peak heap
//! use can be measured and a runaway allocation stopped with the input saved.

pub mod alloc;
pub mod engine;
pub mod http;
pub mod mutate;
pub mod proto;
pub mod seeds;
pub mod targets;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// A deterministic pseudo-random generator (SplitMix64): the same seed gives the same run on
/// every machine and toolchain.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next_u64() % n as u64) as usize }
    }

    /// True with probability 1/`n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, s: &'a [T]) -> &'a T {
        &s[self.below(s.len())]
    }
}

/// A stable 64-bit hash (FNV-1a) of bytes, for outcome signatures and file names.
pub fn hash64(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The signature of an outcome message: each run of digits folded to one `0`, so that
/// "line 5" and "line 65" are one class, and cut to 80 bytes.
pub fn sig(s: &str) -> u64 {
    let mut folded = Vec::with_capacity(80);
    for b in s.bytes() {
        if folded.len() >= 80 {
            break;
        }
        if b.is_ascii_digit() {
            if folded.last() != Some(&b'0') {
                folded.push(b'0');
            }
        } else {
            folded.push(b);
        }
    }
    hash64(&folded)
}
