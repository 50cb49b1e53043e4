//! The block-allocator measures (docs/detectors/kv_pressure.md) as pure functions: the fragmentation index KVF and the
//! study's allocation check.

/// Default KV block size in tokens (vLLM's default, the study's 16).
pub const BLOCK_SIZE: u32 = 16;

/// KVF = 1 − (largest contiguous free run / total free), in [0, 1); 0 when all free space is one
/// run or nothing is free. `free_runs` are the lengths (blocks) of the runs of free blocks.
pub fn kvf(free_runs: &[u64]) -> f64 {
    let total: u128 = free_runs.iter().map(|&r| u128::from(r)).sum();
    let largest = free_runs.iter().copied().max().unwrap_or(0);
    if total == 0 { 0.0 } else { 1.0 - largest as f64 / total as f64 }
}

/// The study's allocation check (the simulator's allocator model): requests sorted by length,
/// descending, each needs ⌈len / block_size⌉ blocks; if one does not fit in the free blocks left,
/// the whole step fails (recompute) and the result is 0.0; otherwise blocks allocated / free
/// blocks. Nothing to allocate, or no free blocks, gives 0.0; a block size of 0 counts as 1.
pub fn allocation_check(requests: &[u32], free_blocks: u64, block_size: u32) -> f64 {
    let mut sorted = requests.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let bs = block_size.max(1);
    let mut left = free_blocks;
    let mut allocated = 0u64;
    for len in sorted {
        let need = u64::from(len.div_ceil(bs));
        if need > left {
            return 0.0;
        }
        left -= need;
        allocated += need;
    }
    if free_blocks == 0 { 0.0 } else { allocated as f64 / free_blocks as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvf_is_zero_for_one_run_and_grows_with_holes() {
        assert_eq!(kvf(&[]), 0.0);
        assert_eq!(kvf(&[0, 0]), 0.0);
        assert_eq!(kvf(&[40]), 0.0, "one run: no fragmentation");
        assert_eq!(kvf(&[10, 30]), 0.25);
        assert_eq!(kvf(&[1, 1, 1, 1]), 0.75, "four holes of one block");
        // free ids 10..20 and 30..64 (the simulator's pool test): 1 − 34/44
        assert!((kvf(&[10, 34]) - (1.0 - 34.0 / 44.0)).abs() < 1e-15);
        let many = vec![1u64; 1000];
        assert!((kvf(&many) - 0.999).abs() < 1e-12 && kvf(&many) < 1.0);
        assert_eq!(kvf(&[u64::MAX, u64::MAX]), 0.5, "no overflow");
    }

    #[test]
    fn allocation_check_follows_the_study_code() {
        // 40 tokens → 3 blocks, 16 → 1, 1 → 1: 5 of 10 free blocks
        assert_eq!(allocation_check(&[16, 40, 1], 10, BLOCK_SIZE), 0.5);
        assert_eq!(allocation_check(&[32, 32], 4, BLOCK_SIZE), 1.0, "exact fit");
        assert_eq!(allocation_check(&[17, 1000], 10, BLOCK_SIZE), 0.0, "the longest does not fit");
        // Descending order: 64 + 64 take all 8 blocks, then 16 fails, so the whole step fails.
        assert_eq!(allocation_check(&[16, 64, 64], 8, BLOCK_SIZE), 0.0);
        // The study's example, signs restored: 120 → 8 blocks, 40 → 3, 20 → 2 need 13 of 128.
        assert!((allocation_check(&[120, 40, 20], 128, BLOCK_SIZE) - 13.0 / 128.0).abs() < 1e-15);
        // ... and with only 10 free blocks the first fits (8), the second (3) does not.
        assert_eq!(allocation_check(&[120, 40, 20], 10, BLOCK_SIZE), 0.0);
        assert_eq!(allocation_check(&[], 8, BLOCK_SIZE), 0.0);
        assert_eq!(allocation_check(&[], 0, BLOCK_SIZE), 0.0);
        assert_eq!(allocation_check(&[1], 0, BLOCK_SIZE), 0.0);
        assert_eq!(allocation_check(&[0, 0], 4, BLOCK_SIZE), 0.0, "empty requests need no block");
        assert_eq!(allocation_check(&[3, 2], 10, 0), 0.5, "block size 0 counts as 1");
        assert_eq!(allocation_check(&[32], 4, 32), 0.25, "another block size");
    }
}
