//! Fuzz-style tests of the SSE parser: random valid streams split at random chunk boundaries
//! give the same events as the whole stream (and as a model of the format), and mutated
//! streams never panic and give the same events however they are split.

use inferwatch_probe::client::SseParser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Parses `chunks` in order: the events' data and whether every line was UTF-8.
fn parse(chunks: &[&[u8]]) -> (Vec<String>, bool) {
    let mut p = SseParser::new();
    let mut events = Vec::new();
    let mut ok = true;
    for c in chunks {
        ok &= p.feed(c, &mut |d| events.push(d.to_string()));
    }
    ok &= p.finish(&mut |d| events.push(d.to_string()));
    (events, ok)
}

/// `bytes` cut at random places (sometimes one byte at a time, sometimes with empty chunks).
fn split<'a>(bytes: &'a [u8], rng: &mut StdRng) -> Vec<&'a [u8]> {
    if bytes.is_empty() || rng.random_bool(0.05) {
        return bytes.chunks(1).collect();
    }
    let mut cuts: Vec<usize> = (0..rng.random_range(1..10)).map(|_| rng.random_range(0..=bytes.len())).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts {
        out.push(&bytes[at..c]);
        at = c;
    }
    out.push(&bytes[at..]);
    out
}

/// Random text for a data line: ASCII, JSON-ish, multi-byte UTF-8, colons, leading spaces.
fn random_text(rng: &mut StdRng) -> String {
    const PIECES: &[&str] = &[
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}",
        "[DONE]",
        "x",
        " ",
        ":",
        "data:",
        "é",
        "日本",
        "🦀",
        "\u{feff}",
        "\t",
        "{}",
        "\"",
        "\\n",
    ];
    (0..rng.random_range(0..5)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect()
}

/// A random valid stream and the events it holds, by the SSE rules the parser implements.
fn random_stream(rng: &mut StdRng) -> (Vec<u8>, Vec<String>) {
    let mut s = String::new();
    let mut want = Vec::new();
    let n = rng.random_range(0..12);
    for i in 0..n {
        let eol = if rng.random_bool(0.7) { "\n" } else { "\r\n" };
        if rng.random_bool(0.2) {
            s.push_str(&format!(": keep-alive{eol}"));
        }
        if rng.random_bool(0.2) {
            s.push_str(&format!("event: message{eol}"));
        }
        let lines = rng.random_range(0..4);
        let mut data: Vec<String> = Vec::new();
        for _ in 0..lines {
            let text = random_text(rng);
            let sep = if rng.random_bool(0.5) { "data: " } else { "data:" };
            // With "data:" the value is the whole rest; with "data: " one space is dropped.
            s.push_str(&format!("{sep}{text}{eol}"));
            data.push(if sep == "data:" { text.strip_prefix(' ').unwrap_or(&text).to_string() } else { text });
            if rng.random_bool(0.1) {
                s.push_str(&format!("id: {i}{eol}retry: 10{eol}"));
            }
        }
        let last = i + 1 == n;
        if last && rng.random_bool(0.3) {
            // The final event lacks its blank line; `finish` dispatches it.
        } else {
            s.push_str(eol);
            if rng.random_bool(0.2) {
                s.push_str(eol); // extra blank lines dispatch nothing
            }
        }
        if !data.is_empty() {
            want.push(data.join("\n"));
        }
    }
    (s.into_bytes(), want)
}

/// Random byte edits of a stream.
fn mutate(b: &mut Vec<u8>, rng: &mut StdRng) {
    for _ in 0..rng.random_range(1..6) {
        let i = rng.random_range(0..=b.len());
        match rng.random_range(0..6) {
            0 if i < b.len() => b[i] = rng.random(),
            1 => b.insert(i, [b'\n', b'\r', b':', b' ', 0xff, 0xc3, 0xe6][rng.random_range(0..7)]),
            2 if i < b.len() => {
                b.remove(i);
            }
            3 => b.truncate(i),
            4 => b.splice(i..i, b"data: x\n\n".iter().copied()).for_each(drop),
            _ => b.splice(i..i, b"data:\xff\xfe\r\n".iter().copied()).for_each(drop),
        }
    }
}

#[test]
fn valid_streams_parse_the_same_however_split() {
    let mut rng = StdRng::seed_from_u64(21);
    for case in 0..5000 {
        let (bytes, want) = random_stream(&mut rng);
        let whole = parse(&[&bytes]);
        assert_eq!(whole, (want.clone(), true), "case {case}: {:?}", String::from_utf8_lossy(&bytes));
        for _ in 0..4 {
            let chunks = split(&bytes, &mut rng);
            assert_eq!(parse(&chunks), whole, "case {case}: {chunks:?}");
        }
    }
}

#[test]
fn mutated_streams_never_panic_and_split_the_same() {
    let mut rng = StdRng::seed_from_u64(22);
    let mut not_utf8 = 0;
    for case in 0..5000 {
        let (mut bytes, _) = random_stream(&mut rng);
        mutate(&mut bytes, &mut rng);
        let whole = catch_unwind(AssertUnwindSafe(|| parse(&[&bytes])))
            .unwrap_or_else(|_| panic!("case {case}: parser panicked on {bytes:?}"));
        not_utf8 += usize::from(!whole.1);
        for _ in 0..4 {
            let chunks = split(&bytes, &mut rng);
            let got = catch_unwind(AssertUnwindSafe(|| parse(&chunks)))
                .unwrap_or_else(|_| panic!("case {case}: parser panicked on {chunks:?}"));
            assert_eq!(got, whole, "case {case}: {chunks:?}");
        }
    }
    assert!(not_utf8 > 100, "the mutations should produce invalid UTF-8 lines ({not_utf8})");
}

/// Random bytes, not derived from a stream at all.
#[test]
fn random_bytes_never_panic_and_split_the_same() {
    let mut rng = StdRng::seed_from_u64(23);
    const ALPHABET: &[u8] = b"data: \r\n\n\n:x\xff\xc3\xa9";
    for case in 0..3000 {
        let len = rng.random_range(0..200);
        let bytes: Vec<u8> = (0..len)
            .map(|_| if rng.random_bool(0.9) { ALPHABET[rng.random_range(0..ALPHABET.len())] } else { rng.random() })
            .collect();
        let whole = parse(&[&bytes]);
        let chunks = split(&bytes, &mut rng);
        assert_eq!(parse(&chunks), whole, "case {case}: {chunks:?}");
    }
}
