//! Sets of sequence numbers: a concurrent bitmap for the sink, and inclusive range lists for
//! files and comparisons.
//!
//! Range files hold one range per line, `A-B` (inclusive) or `A`; blank lines and lines
//! starting with `#` are ignored.

use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Inclusive range `(first, last)`.
pub type Range = (u64, u64);

const PAGE_BITS: u64 = 1 << 20;
const PAGE_WORDS: usize = (PAGE_BITS / 64) as usize;
const PAGES: usize = 4096;

/// A set of sequence numbers that many threads insert into at once. Seqs below 2^32 live in
/// lazily allocated 128 KiB bitmap pages; larger ones in a locked map.
pub struct SeqBitmap {
    pages: Box<[OnceLock<Box<[AtomicU64]>>]>,
    overflow: Mutex<HashMap<u64, u32>>,
}

impl Default for SeqBitmap {
    fn default() -> Self {
        SeqBitmap { pages: (0..PAGES).map(|_| OnceLock::new()).collect(), overflow: Mutex::new(HashMap::new()) }
    }
}

impl SeqBitmap {
    /// Adds `seq`; returns false when it was already present (a duplicate).
    pub fn insert(&self, seq: u64) -> bool {
        let page = (seq / PAGE_BITS) as usize;
        if page >= PAGES {
            let mut m = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
            let c = m.entry(seq).or_insert(0);
            *c += 1;
            return *c == 1;
        }
        let words = self.pages[page].get_or_init(|| (0..PAGE_WORDS).map(|_| AtomicU64::new(0)).collect());
        let bit = seq % PAGE_BITS;
        let mask = 1u64 << (bit % 64);
        words[(bit / 64) as usize].fetch_or(mask, Ordering::Relaxed) & mask == 0
    }

    /// The members as sorted, merged ranges.
    pub fn ranges(&self) -> Vec<Range> {
        let mut out: Vec<Range> = Vec::new();
        let mut push = |seq: u64| match out.last_mut() {
            Some((_, last)) if *last + 1 == seq => *last = seq,
            _ => out.push((seq, seq)),
        };
        for (p, page) in self.pages.iter().enumerate() {
            let Some(words) = page.get() else { continue };
            for (w, word) in words.iter().enumerate() {
                let mut bits = word.load(Ordering::Relaxed);
                let base = p as u64 * PAGE_BITS + w as u64 * 64;
                while bits != 0 {
                    let tz = bits.trailing_zeros() as u64;
                    push(base + tz);
                    bits &= bits - 1;
                }
            }
        }
        let m = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
        let mut big: Vec<u64> = m.keys().copied().collect();
        big.sort_unstable();
        for s in big {
            push(s);
        }
        out
    }
}

/// Sorts and merges overlapping or adjacent ranges.
pub fn merge(mut r: Vec<Range>) -> Vec<Range> {
    r.sort_unstable();
    let mut out: Vec<Range> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some((_, last)) if a <= last.saturating_add(1) => *last = (*last).max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Number of seqs in merged ranges.
pub fn count(r: &[Range]) -> u64 {
    r.iter().map(|(a, b)| b - a + 1).sum()
}

/// The part of `a` not in `b`; both merged.
pub fn subtract(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut lo, hi) in a {
        while j < b.len() && b[j].1 < lo {
            j += 1;
        }
        let mut k = j;
        while lo <= hi {
            match b.get(k) {
                Some(&(blo, bhi)) if blo <= hi => {
                    if blo > lo {
                        out.push((lo, blo - 1));
                    }
                    if bhi >= hi {
                        lo = hi.saturating_add(1);
                        if hi == u64::MAX {
                            break;
                        }
                    } else {
                        lo = bhi + 1;
                        k += 1;
                    }
                }
                _ => {
                    out.push((lo, hi));
                    break;
                }
            }
        }
    }
    out
}

/// Writes ranges, one per line.
pub fn write_ranges(path: &Path, r: &[Range]) -> std::io::Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(path)?);
    for &(a, b) in r {
        if a == b {
            writeln!(w, "{a}")?;
        } else {
            writeln!(w, "{a}-{b}")?;
        }
    }
    w.flush()
}

/// Reads a range file and merges it.
pub fn read_ranges(path: &Path) -> anyhow::Result<Vec<Range>> {
    let f = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parse = |s: &str| s.trim().parse::<u64>().map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1));
        let r = match line.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let v = parse(line)?;
                (v, v)
            }
        };
        if r.0 > r.1 {
            anyhow::bail!("{}:{}: range {}-{} is backwards", path.display(), n + 1, r.0, r.1);
        }
        out.push(r);
    }
    Ok(merge(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_counts_duplicates_and_lists_ranges() {
        let b = SeqBitmap::default();
        for s in (0..100).chain(200..205).chain([PAGE_BITS - 1, PAGE_BITS, 1 << 40, (1 << 40) + 1]) {
            assert!(b.insert(s));
        }
        assert!(!b.insert(5));
        assert!(!b.insert(1 << 40));
        assert_eq!(b.ranges(), vec![(0, 99), (200, 204), (PAGE_BITS - 1, PAGE_BITS), (1 << 40, (1 << 40) + 1)]);
    }

    #[test]
    fn range_arithmetic() {
        assert_eq!(merge(vec![(5, 9), (0, 3), (4, 4), (20, 30), (25, 26)]), vec![(0, 9), (20, 30)]);
        let a = vec![(0, 9), (20, 30), (40, 40)];
        let b = vec![(2, 3), (9, 21), (25, 25), (29, 45)];
        assert_eq!(subtract(&a, &b), vec![(0, 1), (4, 8), (22, 24), (26, 28)]);
        assert_eq!(subtract(&a, &[]), a);
        assert_eq!(subtract(&a, &a), vec![]);
        assert_eq!(count(&a), 10 + 11 + 1);
        assert_eq!(subtract(&[(0, u64::MAX)], &[(5, u64::MAX)]), vec![(0, 4)]);
    }

    #[test]
    fn files_round_trip() {
        let p = std::env::temp_dir().join(format!("otlp-load-test-{}.ranges", std::process::id()));
        write_ranges(&p, &[(0, 9), (11, 11)]).unwrap();
        assert_eq!(read_ranges(&p).unwrap(), vec![(0, 9), (11, 11)]);
        std::fs::write(&p, "# c\n3-1\n").unwrap();
        assert!(read_ranges(&p).is_err());
        let _ = std::fs::remove_file(&p);
    }
}
