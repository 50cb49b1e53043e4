//! The paged KV-cache block pool: a free list with holes, pinned blocks, and the
//! fragmentation index KVF (docs/detectors/kv_pressure.md).

use serde::{Deserialize, Serialize};

/// A point-in-time view of the KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvSnapshot {
    /// Blocks in the pool.
    pub total_blocks: u32,
    /// Blocks held by requests.
    pub used_blocks: u32,
    /// Blocks pinned by faults (lost capacity).
    pub pinned_blocks: u32,
    /// Free blocks.
    pub free_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// `vllm:kv_cache_usage_perc`: 1 − free / total, a fraction.
    pub usage: f64,
    /// KVF = 1 − largest contiguous free run / total free, in [0, 1); 0 when nothing is free.
    pub fragmentation: f64,
    /// Largest run of consecutive free block ids.
    pub largest_free_run: u32,
}

/// Block pool: a bitmap of free blocks with first-fit allocation of the lowest free ids.
/// Used blocks stay packed at low ids while requests finish in arbitrary order, so the free
/// space is one large run above the used region plus holes inside it; pinned blocks (faults)
/// are scattered over the free space and cut it into many holes (what KVF measures).
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: u32,
    total: u32,
    /// Bit set = free.
    free_bits: Vec<u64>,
    /// Lowest word that may hold a free bit.
    hint: usize,
    free: u32,
    used: u32,
    pinned: Vec<u32>,
    pin_cursor: u64,
}

impl BlockPool {
    /// A pool of `total` blocks of `block_size` tokens, all free.
    pub fn new(total: u32, block_size: u32) -> Self {
        let words = (total as usize).div_ceil(64);
        let mut free_bits = vec![u64::MAX; words];
        if !total.is_multiple_of(64)
            && let Some(last) = free_bits.last_mut()
        {
            *last = (1u64 << (total % 64)) - 1;
        }
        BlockPool { block_size, total, free_bits, hint: 0, free: total, used: 0, pinned: Vec::new(), pin_cursor: 0 }
    }

    /// Blocks in the pool.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Free blocks.
    pub fn num_free(&self) -> u32 {
        self.free
    }

    /// Blocks held by requests.
    pub fn num_used(&self) -> u32 {
        self.used
    }

    /// Pinned blocks.
    pub fn num_pinned(&self) -> u32 {
        self.pinned.len() as u32
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    fn is_free(&self, b: u32) -> bool {
        self.free_bits[(b / 64) as usize] & (1u64 << (b % 64)) != 0
    }

    fn take(&mut self, b: u32) {
        self.free_bits[(b / 64) as usize] &= !(1u64 << (b % 64));
        self.free -= 1;
    }

    fn give(&mut self, b: u32) {
        let w = (b / 64) as usize;
        self.free_bits[w] |= 1u64 << (b % 64);
        self.free += 1;
        self.hint = self.hint.min(w);
    }

    /// The lowest free block, if any.
    fn lowest_free(&mut self) -> Option<u32> {
        while self.hint < self.free_bits.len() {
            let word = self.free_bits[self.hint];
            if word != 0 {
                return Some(self.hint as u32 * 64 + word.trailing_zeros());
            }
            self.hint += 1;
        }
        None
    }

    /// Allocates the `n` lowest free blocks into `out`, all or nothing; false when fewer
    /// than `n` are free.
    pub fn alloc(&mut self, n: u32, out: &mut Vec<u32>) -> bool {
        if n > self.free {
            return false;
        }
        for _ in 0..n {
            match self.lowest_free() {
                Some(b) => {
                    self.take(b);
                    out.push(b);
                }
                None => break,
            }
        }
        self.used += n;
        true
    }

    /// Returns the blocks in `blocks` and clears it.
    pub fn release(&mut self, blocks: &mut Vec<u32>) {
        for &b in blocks.iter() {
            if b < self.total && !self.is_free(b) {
                self.give(b);
                self.used -= 1;
            }
        }
        blocks.clear();
    }

    /// Moves the pinned count toward `target`: pins free blocks at pseudo-random places
    /// (the next free block after a scattered position), or unpins the most recent pins.
    pub fn pin_to(&mut self, target: u32) {
        while self.num_pinned() < target && self.free > 0 {
            self.pin_cursor = self.pin_cursor.wrapping_add(1);
            let start = (super::tokens::mix64(self.pin_cursor) % u64::from(self.total)) as u32;
            let mut b = start;
            loop {
                if self.is_free(b) {
                    break;
                }
                b = (b + 1) % self.total;
                if b == start {
                    return;
                }
            }
            self.take(b);
            self.pinned.push(b);
        }
        while self.num_pinned() > target {
            let Some(b) = self.pinned.pop() else { break };
            self.give(b);
        }
    }

    /// Largest run of consecutive free block ids.
    pub fn largest_free_run(&self) -> u32 {
        let mut best = 0u32;
        let mut run = 0u32;
        for (w, &word) in self.free_bits.iter().enumerate() {
            if word == u64::MAX && (w + 1) * 64 <= self.total as usize {
                run += 64;
                continue;
            }
            if word == 0 {
                best = best.max(run);
                run = 0;
                continue;
            }
            let bits = (self.total as usize - w * 64).min(64);
            for i in 0..bits {
                if word & (1u64 << i) != 0 {
                    run += 1;
                } else {
                    best = best.max(run);
                    run = 0;
                }
            }
        }
        best.max(run)
    }

    /// KVF = 1 − largest contiguous free run / total free; 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        kvf(self.largest_free_run(), self.free)
    }

    /// Current usage, counts and fragmentation (O(blocks / 64): sample it, not per step).
    pub fn snapshot(&self) -> KvSnapshot {
        let total = self.total;
        let free = self.free;
        let largest = self.largest_free_run();
        KvSnapshot {
            total_blocks: total,
            used_blocks: self.used,
            pinned_blocks: self.num_pinned(),
            free_blocks: free,
            block_size: self.block_size,
            usage: if total == 0 { 0.0 } else { 1.0 - f64::from(free) / f64::from(total) },
            fragmentation: kvf(largest, free),
            largest_free_run: largest,
        }
    }

    /// True when the counts add up (test helper).
    pub fn is_consistent(&self) -> bool {
        let free: u32 = self.free_bits.iter().map(|w| w.count_ones()).sum();
        let pinned_ok = self.pinned.iter().all(|&b| !self.is_free(b));
        free == self.free && pinned_ok && free + self.used + self.num_pinned() == self.total
    }
}

/// KVF from the largest free run and the total free blocks.
pub fn kvf(largest_free_run: u32, free: u32) -> f64 {
    if free == 0 { 0.0 } else { 1.0 - f64::from(largest_free_run) / f64::from(free) }
}

/// The study's allocation check (docs/detectors/kv_pressure.md): requests sorted by length, descending, each needs
/// `ceil(len / block_size)` blocks; if one does not fit in the free blocks left, the whole
/// step fails (recompute) and the result is 0.0; otherwise blocks allocated / free blocks.
/// With no free blocks and nothing to allocate the result is 0.0.
pub fn allocation_check(lengths: &[u32], free_blocks: u32, block_size: u32) -> f64 {
    let mut sorted: Vec<u32> = lengths.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let bs = block_size.max(1);
    let mut left = u64::from(free_blocks);
    let mut allocated = 0u64;
    for len in sorted {
        let need = u64::from(len.div_ceil(bs));
        if need > left {
            return 0.0;
        }
        left -= need;
        allocated += need;
    }
    if free_blocks == 0 { 0.0 } else { allocated as f64 / f64::from(free_blocks) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_conserves_and_fragments() {
        let mut p = BlockPool::new(64, 16);
        assert_eq!(p.fragmentation(), 0.0);
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut c = Vec::new();
        assert!(p.alloc(10, &mut a));
        assert!(p.alloc(10, &mut b));
        assert!(p.alloc(10, &mut c));
        p.release(&mut b);
        assert!(p.is_consistent());
        // free: ids 10..20 and 30..64 -> largest 34 of 44
        assert_eq!(p.largest_free_run(), 34);
        assert!((p.fragmentation() - (1.0 - 34.0 / 44.0)).abs() < 1e-12);
        assert!(!p.alloc(45, &mut b));
        assert!(b.is_empty());
        p.pin_to(5);
        assert_eq!(p.num_pinned(), 5);
        assert!(p.is_consistent());
        p.pin_to(0);
        p.release(&mut a);
        p.release(&mut c);
        assert_eq!(p.num_free(), 64);
        assert!(p.is_consistent());
        assert_eq!(p.snapshot().usage, 0.0);
    }

    #[test]
    fn allocation_check_cases() {
        // 40 tokens -> 3 blocks, 16 -> 1, 1 -> 1: 5 of 10 free
        assert!((allocation_check(&[16, 40, 1], 10, 16) - 0.5).abs() < 1e-12);
        // exact fit
        assert_eq!(allocation_check(&[32, 32], 4, 16), 1.0);
        // the longest does not fit: whole step fails
        assert_eq!(allocation_check(&[17, 1000], 10, 16), 0.0);
        // sorted descending: a later one fails after earlier ones consumed the space
        assert_eq!(allocation_check(&[64, 64, 16], 8, 16), 0.0);
        assert_eq!(allocation_check(&[], 8, 16), 0.0);
        assert_eq!(allocation_check(&[], 0, 16), 0.0);
        assert_eq!(allocation_check(&[1], 0, 16), 0.0);
    }
}
