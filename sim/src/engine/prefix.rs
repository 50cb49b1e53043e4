//! Automatic prefix caching: repeated prompt prefixes hit, counted in tokens like vLLM's
//! `prefix_cache_queries` / `prefix_cache_hits`.
//!
//! Simplification (documented): cached content is tracked per prefix hash, block-aligned,
//! with LRU eviction when the cached blocks exceed the capacity the engine grants (its free
//! blocks plus those held by running requests' prefixes); hit blocks are still allocated per
//! request (no block sharing), so the cache saves compute, not memory.

use std::collections::{BTreeMap, HashMap};

/// LRU cache of prefix hash → cached tokens.
#[derive(Clone, Debug, Default)]
pub struct PrefixCache {
    entries: HashMap<u64, (u32, u64)>,
    lru: BTreeMap<u64, u64>,
    cached_blocks: u64,
    clock: u64,
}

impl PrefixCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens of this prefix that are cached (block-aligned), touching it as recently used.
    pub fn lookup(&mut self, hash: u64) -> u32 {
        let Some(&(tokens, last)) = self.entries.get(&hash) else { return 0 };
        self.clock += 1;
        self.lru.remove(&last);
        self.lru.insert(self.clock, hash);
        self.entries.insert(hash, (tokens, self.clock));
        tokens
    }

    /// Drops one entry (invalidation).
    pub fn invalidate(&mut self, hash: u64, block_size: u32) {
        if let Some((tokens, last)) = self.entries.remove(&hash) {
            self.lru.remove(&last);
            self.cached_blocks -= u64::from(tokens / block_size.max(1));
        }
    }

    /// Records that `tokens` tokens of this prefix are now computed (block-aligned down).
    pub fn insert(&mut self, hash: u64, tokens: u32, block_size: u32) {
        let bs = block_size.max(1);
        let aligned = tokens / bs * bs;
        if aligned == 0 {
            return;
        }
        self.clock += 1;
        match self.entries.get(&hash).copied() {
            Some((old, last)) => {
                self.lru.remove(&last);
                let keep = old.max(aligned);
                self.cached_blocks += u64::from(keep / bs) - u64::from(old / bs);
                self.entries.insert(hash, (keep, self.clock));
            }
            None => {
                self.cached_blocks += u64::from(aligned / bs);
                self.entries.insert(hash, (aligned, self.clock));
            }
        }
        self.lru.insert(self.clock, hash);
    }

    /// Evicts least recently used entries until at most `capacity_blocks` are cached.
    pub fn evict_to(&mut self, capacity_blocks: u64, block_size: u32) {
        while self.cached_blocks > capacity_blocks {
            let Some((&clock, &hash)) = self.lru.iter().next() else { break };
            self.lru.remove(&clock);
            if let Some((tokens, _)) = self.entries.remove(&hash) {
                self.cached_blocks -= u64::from(tokens / block_size.max(1));
            }
        }
    }

    /// Drops everything (restart).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.lru.clear();
        self.cached_blocks = 0;
    }

    /// Blocks' worth of cached content.
    pub fn cached_blocks(&self) -> u64 {
        self.cached_blocks
    }

    /// Number of cached prefixes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_insert_evict() {
        let mut c = PrefixCache::new();
        assert_eq!(c.lookup(1), 0);
        c.insert(1, 100, 16);
        assert_eq!(c.lookup(1), 96);
        c.insert(2, 64, 16);
        c.insert(3, 32, 16);
        assert_eq!(c.cached_blocks(), 6 + 4 + 2);
        c.lookup(1);
        c.evict_to(8, 16); // evicts 2 (LRU), keeps 1 and 3
        assert_eq!(c.lookup(2), 0);
        assert_eq!(c.lookup(3), 32);
        c.invalidate(1, 16);
        assert_eq!(c.cached_blocks(), 2);
        c.clear();
        assert!(c.is_empty());
    }
}
