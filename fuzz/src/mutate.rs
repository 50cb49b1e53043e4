//! Byte-level and token-level mutations.

use crate::Rng;

/// What a target's inputs are, which decides the mutations tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// Protobuf: field-aware mutations as well as byte ones.
    Protobuf,
    /// Text (JSON, YAML, the Prometheus formats, HTTP): token and line mutations from a dictionary.
    Text,
    /// Other binary formats (Arrow IPC, Parquet): byte mutations and interesting integers.
    Binary,
}

/// Interesting integers, written in 1, 2, 4 or 8 bytes.
const INTS: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
];

/// Interesting numbers as text.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1e308",
    "1e309",
    "-1e309",
    "NaN",
    "+Inf",
    "-Inf",
    "4.9e-324",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775809",
    "2147483648",
    "0x10",
    "1_000",
    "00000000000000000000000001",
    "1.",
    ".5",
];

/// Mutates `data` in place with 1 to 4 stacked mutations; `other` is another corpus entry (for
/// splicing) and `dict` the target's tokens. The result is at most `max_len` bytes.
pub fn mutate(data: &mut Vec<u8>, other: &[u8], kind: InputKind, dict: &[&[u8]], rng: &mut Rng, max_len: usize) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        match kind {
            InputKind::Protobuf if rng.below(3) != 0 => {
                if let Some(m) = crate::proto::mutate(data, other, rng) {
                    *data = m;
                } else {
                    bytes(data, other, rng);
                }
            }
            InputKind::Text if rng.below(2) == 0 => text(data, dict, rng),
            _ => bytes(data, other, rng),
        }
        data.truncate(max_len);
    }
}

fn range(rng: &mut Rng, len: usize) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let a = rng.below(len);
    let cap = if rng.one_in(4) { len } else { 16 };
    let n = 1 + rng.below((len - a).min(cap));
    (a, a + n)
}

/// One byte-level mutation.
pub fn bytes(data: &mut Vec<u8>, other: &[u8], rng: &mut Rng) {
    let len = data.len();
    match rng.below(13) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next_u64() as u8;
        }
        2 if len > 0 => {
            let i = rng.below(len);
            data[i] = data[i].wrapping_add(rng.below(35) as u8).wrapping_sub(17);
        }
        3 => {
            let v = *rng.pick(INTS);
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let b = if rng.one_in(2) { v.to_le_bytes() } else { v.to_be_bytes() };
            let b = if b[0] == 0 && width < 8 { &b[8 - width..] } else { &b[..width] };
            let at = rng.below(len + 1);
            if rng.one_in(2) || at + width > len {
                data.splice(at..at, b.iter().copied());
            } else {
                data[at..at + width].copy_from_slice(b);
            }
        }
        4 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let fill: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, fill);
        }
        5 if len > 0 => {
            let (a, b) = range(rng, len);
            data.drain(a..b);
        }
        6 if len > 0 => {
            let (a, b) = range(rng, len);
            let chunk = data[a..b].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, chunk);
        }
        7 if len > 0 => {
            let (a, b) = range(rng, len);
            let chunk = data[a..b].to_vec();
            let at = rng.below(len - chunk.len() + 1);
            data[at..at + chunk.len()].copy_from_slice(&chunk);
        }
        8 if !other.is_empty() => {
            // Splice: a head of this entry and a tail of the other.
            let cut = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        9 if !other.is_empty() => {
            let (a, b) = range(rng, other.len());
            let at = rng.below(len + 1);
            data.splice(at..at, other[a..b].iter().copied());
        }
        10 if len > 0 => data.truncate(rng.below(len)),
        11 if len > 0 => {
            // Repeat a range many times (nesting, long runs).
            let (a, b) = range(rng, len);
            let chunk = data[a..b].to_vec();
            let times = 2 + rng.below(256);
            let at = b;
            data.splice(at..at, chunk.iter().copied().cycle().take(chunk.len() * times));
        }
        _ => {
            let at = rng.below(len + 1);
            data.insert(at, rng.next_u64() as u8);
        }
    }
}

/// Byte ranges of the tokens of a text: runs of letters, digits and `_.:+-`.
fn tokens(data: &[u8]) -> Vec<(usize, usize)> {
    let is_tok = |b: u8| b.is_ascii_alphanumeric() || b"_.:+-".contains(&b);
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        if is_tok(data[i]) {
            let s = i;
            while i < data.len() && is_tok(data[i]) {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

/// Byte ranges of the lines of a text (each with its newline).
fn lines(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut s = 0;
    for (i, b) in data.iter().enumerate() {
        if *b == b'\n' {
            out.push((s, i + 1));
            s = i + 1;
        }
    }
    if s < data.len() {
        out.push((s, data.len()));
    }
    out
}

/// One token- or line-level mutation.
pub fn text(data: &mut Vec<u8>, dict: &[&[u8]], rng: &mut Rng) {
    let toks = tokens(data);
    match rng.below(9) {
        0 | 1 if !dict.is_empty() => {
            // Insert a dictionary token, at a token boundary when there is one.
            let at = if toks.is_empty() || rng.one_in(4) {
                rng.below(data.len() + 1)
            } else {
                let t = rng.pick(&toks);
                if rng.one_in(2) { t.0 } else { t.1 }
            };
            let w = *rng.pick(dict);
            data.splice(at..at, w.iter().copied());
        }
        2 if !dict.is_empty() && !toks.is_empty() => {
            let (a, b) = *rng.pick(&toks);
            let w = *rng.pick(dict);
            data.splice(a..b, w.iter().copied());
        }
        3 if !toks.is_empty() => {
            // Replace a number (or any token) with an interesting number.
            let nums: Vec<_> = toks.iter().filter(|(a, _)| data[*a].is_ascii_digit() || data[*a] == b'-').collect();
            let (a, b) = if nums.is_empty() { *rng.pick(&toks) } else { **rng.pick(&nums) };
            data.splice(a..b, rng.pick(NUMBERS).bytes());
        }
        4 if toks.len() > 1 => {
            // Swap two tokens.
            let (x, y) = (*rng.pick(&toks), *rng.pick(&toks));
            let (first, second) = if x.0 < y.0 { (x, y) } else { (y, x) };
            if first.1 <= second.0 {
                let a = data[first.0..first.1].to_vec();
                let b = data[second.0..second.1].to_vec();
                data.splice(second.0..second.1, a);
                data.splice(first.0..first.1, b);
            }
        }
        5 => {
            let ls = lines(data);
            if !ls.is_empty() {
                let (a, b) = *rng.pick(&ls);
                let line = data[a..b].to_vec();
                let times = if rng.one_in(8) { 2 + rng.below(200) } else { 1 };
                let at = *rng.pick(&[a, b]);
                data.splice(at..at, line.iter().copied().cycle().take(line.len() * times));
            }
        }
        6 => {
            let ls = lines(data);
            if !ls.is_empty() {
                let (a, b) = *rng.pick(&ls);
                data.drain(a..b);
            }
        }
        7 => {
            let ls = lines(data);
            if ls.len() > 1 {
                let (x, y) = (rng.below(ls.len()), rng.below(ls.len()));
                let (x, y) = (x.min(y), x.max(y));
                if x != y {
                    let (l1, l2) = (data[ls[x].0..ls[x].1].to_vec(), data[ls[y].0..ls[y].1].to_vec());
                    data.splice(ls[y].0..ls[y].1, l1);
                    data.splice(ls[x].0..ls[x].1, l2);
                }
            }
        }
        _ => {
            // Invalid UTF-8, a NUL, a lone surrogate escape or a BOM.
            let at = rng.below(data.len() + 1);
            const JUNK: [&[u8]; 6] = [b"\xff", b"\xc3", b"\x00", b"\\ud800", b"\xef\xbb\xbf", b"\xed\xa0\x80"];
            let junk = *rng.pick(&JUNK);
            data.splice(at..at, junk.iter().copied());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_bounded_and_varied() {
        let seed = b"metric_a{le=\"0.5\"} 1 1700000000\nmetric_b 2\n".to_vec();
        let run = |s| {
            let mut rng = Rng::new(s);
            (0..200)
                .map(|_| {
                    let mut d = seed.clone();
                    mutate(&mut d, b"other 3\n", InputKind::Text, &[b"# TYPE ", b"NaN"], &mut rng, 256);
                    d
                })
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert!(a.iter().all(|d| d.len() <= 256));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 150, "{}", distinct.len());
    }
}
