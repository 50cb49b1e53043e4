//! `prom-bench`: scrape parse speed of the `prometheus` receiver. The vLLM V1 fixture of the
//! receiver's tests, repeated under distinct metric names to about `--samples` samples, is
//! parsed and converted to OTLP (the work of one scrape after the body arrived), next to the
//! floor of merely splitting the same text with `str::lines()`. Best of `--reps` runs.

use clap::Parser;
use inferwatch_receivers::prometheus::config::TargetAddr;
use inferwatch_receivers::prometheus::convert::{Converter, Target};
use inferwatch_receivers::prometheus::parse::{Format, parse};
use std::hint::black_box;
use std::time::Instant;

/// The fixture the receiver's golden test checks.
const VLLM: &str = include_str!("../../receivers/tests/fixtures/vllm_v1.prom");

#[derive(Debug, Parser)]
#[command(name = "prom-bench", about = "Prometheus exposition parse + convert speed, against a str::lines() scan")]
struct Cli {
    /// Samples in the exposition (approximately: whole copies of the fixture).
    #[arg(long, default_value_t = 100_000)]
    samples: usize,
    /// Repetitions (the best is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
}

/// The fixture repeated: copy `i` renames `vllm:` to `vllm<i>:` so that families stay distinct.
fn exposition(samples: usize) -> anyhow::Result<(String, usize)> {
    let per_copy = parse(VLLM, Format::Text)?.sample_count();
    anyhow::ensure!(per_copy > 0, "the fixture has no samples");
    let copies = samples.div_ceil(per_copy).max(1);
    let mut text = String::with_capacity(VLLM.len() * copies + copies * 1024);
    for i in 0..copies {
        text.push_str(&VLLM.replace("vllm:", &format!("vllm{i}:")));
    }
    Ok((text, copies))
}

fn best(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (text, copies) = exposition(cli.samples)?;
    let samples = parse(&text, Format::Text)?.sample_count();
    let lines = text.lines().count();

    let floor = best(cli.reps, || {
        let mut n = 0usize;
        for l in text.lines() {
            n += l.len();
        }
        black_box(n);
        Ok(())
    })?;
    let parse_only = best(cli.reps, || {
        black_box(parse(black_box(&text), Format::Text)?.sample_count());
        Ok(())
    })?;
    let target = Target {
        job: "vllm".into(),
        addr: TargetAddr { host: "127.0.0.1".into(), port: 8000 },
        scheme: "http".into(),
        labels: vec![("env".into(), "bench".into())],
        honor_labels: false,
    };
    let mut conv = Converter::new(target);
    // Steady state: the series are known from an earlier scrape, as in a running scrape loop.
    let mut t_ns = 1_800_000_000_000_000_000u64;
    conv.convert(&parse(&text, Format::Text)?, t_ns, &[]);
    let parse_convert = best(cli.reps, || {
        t_ns += 15_000_000_000;
        let expo = parse(black_box(&text), Format::Text)?;
        let metrics = conv.convert(&expo, t_ns, &[]);
        black_box(conv.request(metrics));
        Ok(())
    })?;

    let per_s = |t: f64| (samples as f64 / t).round();
    eprintln!(
        "prom-bench: {samples} samples ({copies} copies, {lines} lines, {} bytes), best of {}: parse + convert \
         {:.0} samples/s = {:.1}x a str::lines() scan ({:.0} samples/s); parse alone {:.1}x",
        text.len(),
        cli.reps,
        per_s(parse_convert),
        parse_convert / floor,
        per_s(floor),
        parse_only / floor,
    );
    let v = serde_json::json!({
        "samples": samples,
        "bytes": text.len(),
        "lines": lines,
        "reps": cli.reps,
        "lines_scan_s": floor,
        "parse_s": parse_only,
        "parse_convert_s": parse_convert,
        "lines_scan_samples_per_s": per_s(floor),
        "parse_samples_per_s": per_s(parse_only),
        "parse_convert_samples_per_s": per_s(parse_convert),
        "parse_over_lines_scan": parse_only / floor,
        "parse_convert_over_lines_scan": parse_convert / floor,
        "tracked_series": conv.tracked_series(),
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
