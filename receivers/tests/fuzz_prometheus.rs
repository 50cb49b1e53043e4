//! Fuzz-style test of the exposition parser and converter: thousands of seeded random
//! mutations of the vLLM, TGI and OpenMetrics fixtures (bytes dropped, duplicated, replaced,
//! lines shuffled, syntax fragments and invalid UTF-8 inserted), read as both formats. Parsing
//! must never panic; every error must name a line that exists in the input; whatever parses
//! must convert, without panicking, into well-formed OTLP (a histogram has one more bucket
//! count than bounds), twice in a row on the same converter (start-time state).

use inferwatch_receivers::prometheus::config::TargetAddr;
use inferwatch_receivers::prometheus::convert::{Converter, Target};
use inferwatch_receivers::prometheus::parse::{Format, parse_bytes};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Mutated inputs per fixture and format.
const CASES: usize = 1000;

const SEEDS: [&str; 3] =
    [include_str!("fixtures/vllm_v1.prom"), include_str!("fixtures/tgi.prom"), include_str!("fixtures/openmetrics.om")];

/// Fragments the parser treats specially.
const FRAGMENTS: &[&[u8]] = &[
    b"{",
    b"}",
    b"\"",
    b"\\",
    b"\\\"",
    b"=",
    b",",
    b" ",
    b"\t",
    b"\n",
    b"\r\n",
    b"#",
    b"# ",
    b"# TYPE ",
    b"# HELP ",
    b"# UNIT ",
    b"# EOF\n",
    b"# TYPE x histogram\n",
    b"# TYPE x summary\n",
    b"# TYPE x counter\n",
    b"# TYPE x_created gauge\n",
    b"x_bucket{le=\"0.5\"} 1\n",
    b"x_created 1.7e9\n",
    b"_bucket",
    b"_total",
    b"_created",
    b"_sum",
    b"_count",
    b"_info",
    b"le=\"",
    b"le=\"+Inf\"",
    b"quantile=\"",
    b"NaN",
    b"+Inf",
    b"-Inf",
    b"1e308",
    b"-0",
    b"99999999999999999999",
    b"1700000000.5",
    b" # {a=\"b\"} 1 2",
    b":",
    b"\xc3\xa9",
    b"\xff",
    b"\xe2\x82",
    b"\0",
    b"{\"a.b\"",
];

fn mutate(rng: &mut StdRng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.random_range(1..=3) {
        let len = b.len();
        let at = rng.random_range(0..=len);
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let end = (at + rng.random_range(1..=16)).min(len);
                b.drain(at.min(len)..end);
            }
            1 => {
                let f = FRAGMENTS[rng.random_range(0..FRAGMENTS.len())];
                b.splice(at..at, f.iter().copied());
            }
            2 if at < len => b[at] = rng.random(),
            3 if len > 0 => {
                let end = (at + rng.random_range(1..=64)).min(len);
                let piece = b[at.min(len)..end].to_vec();
                let to = rng.random_range(0..=b.len());
                b.splice(to..to, piece);
            }
            4 => b.truncate(at),
            5 => {
                // Swap two lines.
                let mut lines: Vec<Vec<u8>> = b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
                if lines.len() > 2 {
                    let i = rng.random_range(0..lines.len());
                    let j = rng.random_range(0..lines.len());
                    lines.swap(i, j);
                }
                b = lines.join(&b'\n');
            }
            6 if at < len && b[at].is_ascii_digit() => b[at] = b"0123456789.-e"[rng.random_range(0..13)],
            _ => {
                let f = FRAGMENTS[rng.random_range(0..FRAGMENTS.len())];
                let end = (at + f.len()).min(len);
                b.splice(at..end, f.iter().copied());
            }
        }
    }
    b
}

fn target() -> Target {
    Target {
        job: "fuzz".into(),
        addr: TargetAddr { host: "127.0.0.1".into(), port: 9 },
        scheme: "http".into(),
        labels: vec![("env".into(), "fuzz".into())],
        honor_labels: false,
    }
}

/// Checks the OTLP that a parsed input converts to; returns the number of data points.
fn check_converted(input: &[u8], format: Format) -> usize {
    let Ok(expo) = parse_bytes(input, format) else { return 0 };
    let mut conv = Converter::new(target());
    let mut points = 0;
    for t in [1_000_000_000u64, 2_000_000_000] {
        let metrics = conv.convert(&expo, t, &[("model_name".into(), "m".into())]);
        for m in &metrics {
            assert!(!m.name.is_empty());
            match &m.data {
                Some(Data::Histogram(h)) => {
                    for p in &h.data_points {
                        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1, "{}", m.name);
                        assert!(p.explicit_bounds.windows(2).all(|w| w[0] < w[1]), "{} bounds sorted", m.name);
                        assert!(p.start_time_unix_nano <= p.time_unix_nano || p.time_unix_nano != t);
                        points += 1;
                    }
                }
                Some(Data::Sum(s)) => {
                    assert!(s.is_monotonic);
                    points += s.data_points.len();
                }
                Some(Data::Gauge(g)) => points += g.data_points.len(),
                Some(Data::Summary(s)) => {
                    for p in &s.data_points {
                        assert!(p.quantile_values.windows(2).all(|w| w[0].quantile <= w[1].quantile));
                    }
                    points += s.data_points.len();
                }
                other => panic!("unexpected data {other:?}"),
            }
        }
    }
    points
}

#[test]
fn mutated_expositions_never_panic_and_errors_carry_a_line() {
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9);
    let (mut ok, mut failed, mut points) = (0usize, 0usize, 0usize);
    for seed in SEEDS {
        for format in [Format::Text, Format::OpenMetrics] {
            for case in 0..CASES {
                let input = mutate(&mut rng, seed.as_bytes());
                let lines = input.iter().filter(|&&c| c == b'\n').count() + 1;
                let shown = || String::from_utf8_lossy(&input).chars().take(2000).collect::<String>();
                let parsed = catch_unwind(AssertUnwindSafe(|| parse_bytes(&input, format).map(|e| e.sample_count())));
                match parsed {
                    Err(_) => panic!("parse panicked on case {case} ({format:?}):\n{}", shown()),
                    Ok(Ok(_)) => ok += 1,
                    Ok(Err(e)) => {
                        failed += 1;
                        assert!(e.line >= 1 && e.line <= lines, "line {} of {lines}: {e}\n{}", e.line, shown());
                        assert!(!e.message.is_empty());
                        assert!(e.to_string().starts_with(&format!("line {}: ", e.line)));
                    }
                }
                let converted = catch_unwind(AssertUnwindSafe(|| check_converted(&input, format)));
                match converted {
                    Ok(n) => points += n,
                    Err(_) => panic!("convert panicked on case {case} ({format:?}):\n{}", shown()),
                }
            }
        }
    }
    eprintln!("parsed {ok}, rejected {failed}, points {points}");
    // Both paths must have been exercised for the test to mean anything.
    assert!(ok > 300, "only {ok} mutated inputs parsed");
    assert!(failed > 1000, "only {failed} mutated inputs were rejected");
    assert!(points > 10_000, "only {points} points converted");
}

#[test]
fn the_unmutated_fixtures_parse() {
    for (seed, format) in [(SEEDS[0], Format::Text), (SEEDS[1], Format::Text), (SEEDS[2], Format::OpenMetrics)] {
        let e = parse_bytes(seed.as_bytes(), format).unwrap();
        assert!(e.sample_count() > 10);
        assert!(check_converted(seed.as_bytes(), format) > 10);
    }
}
