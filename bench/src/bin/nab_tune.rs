//! `nab-tune`: the pure mathematics of `anomaly_ensemble` over the NAB corpus, scored with the
//! eval crate's NAB scorer, without the pipeline (about 1 s per run; the pipeline takes
//! ≈ 10 s). `nab-tune DIR [key=value ...]` prints the three normalised scores; `--search` runs
//! the coordinate search that chose the defaults (docs/detectors/anomaly_ensemble.md); `-v`
//! prints the standard profile per file. This uses the corpus' labels: it is the tuning step.

use anyhow::{Context, bail};
use inferwatch_eval::nab::{data, score_runs};
use inferwatch_processors::anomaly_ensemble::ensemble::{MAX_SCORE, Params, State};
use std::path::Path;

/// Sets parameter `key` of `p` to `v`.
fn set(p: &mut Params, key: &str, v: f64) -> anyhow::Result<()> {
    match key {
        "warmup" => p.warmup = v as u32,
        "bins" => p.bins = v as u32,
        "reference" => p.window = v as usize,
        "recent" => p.short = v as usize,
        "average" => p.average = v as usize,
        "memory" => p.memory = v,
        "suppress" => p.suppress = v as u32,
        "report_score" => p.report_score = v,
        "extreme" => p.extreme = v,
        "extreme_weight" => p.extreme_weight = v,
        "shift_weight" => p.shift_weight = v,
        other => bail!("unknown parameter {other:?}"),
    }
    Ok(())
}

/// Normalised standard, reward-low-FP and reward-low-FN scores of `p` on `corpus`.
fn eval(corpus: &data::NabCorpus, p: &Params) -> anyhow::Result<Vec<inferwatch_eval::nab::score::ProfileScore>> {
    let scores: Vec<Vec<f64>> = corpus
        .files
        .iter()
        .map(|f| {
            let mut s = State::new(p);
            f.values.iter().map(|&x| s.push(p, x).map_or(0.0, |st| st.score / MAX_SCORE)).collect()
        })
        .collect();
    Ok(score_runs("anomaly_ensemble", corpus, &scores)?)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().context("usage: nab-tune DIR [key=value ...] [--search] [-v]")?;
    let corpus = data::load_corpus(Path::new(dir))?;
    let mut p = Params::default();
    for a in &args[1..] {
        if let Some((k, v)) = a.split_once('=') {
            set(&mut p, k, v.parse().with_context(|| format!("{a}: not a number"))?)?;
        }
    }
    let norm =
        |r: &[inferwatch_eval::nab::score::ProfileScore]| -> Vec<f64> { r.iter().map(|s| s.normalized).collect() };
    if args.iter().any(|a| a == "--search") {
        let grid: &[(&str, &[f64])] = &[
            ("warmup", &[100., 150., 200., 250., 300.]),
            ("report_score", &[2.0, 2.5, 3.0, 3.5, 4.0]),
            ("suppress", &[20., 30., 40., 50., 100.]),
            ("extreme_weight", &[2.0, 4.0, 6.0, 8.0]),
            ("extreme", &[0.02, 0.035, 0.05, 0.07, 0.1]),
            ("shift_weight", &[0.0, 0.25, 0.5, 1.0]),
            ("bins", &[4., 5., 6., 8., 10.]),
            ("reference", &[1024., 2048., 4096., 8192.]),
            ("recent", &[8., 16., 24., 32.]),
            ("average", &[1., 4., 8., 12.]),
            ("memory", &[2000., 4000., 8000.]),
        ];
        let mut best = norm(&eval(&corpus, &p)?).iter().sum::<f64>();
        for round in 0..3 {
            let mut changed = false;
            for (k, vals) in grid {
                for &v in *vals {
                    let mut q = p;
                    set(&mut q, k, v)?;
                    let r = norm(&eval(&corpus, &q)?);
                    if r.iter().sum::<f64>() > best + 1e-9 {
                        (best, p, changed) = (r.iter().sum(), q, true);
                        println!("round {round}: {k}={v} -> {:.1} / {:.1} / {:.1}", r[0], r[1], r[2]);
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }
    let started = std::time::Instant::now();
    let r = eval(&corpus, &p)?;
    let n = norm(&r);
    println!("{p:?}");
    println!(
        "standard {:.1}  reward_low_FP {:.1}  reward_low_FN {:.1}  (threshold {:.3}; {:.2} s)",
        n[0],
        n[1],
        n[2],
        r[0].threshold,
        started.elapsed().as_secs_f64()
    );
    if args.iter().any(|a| a == "-v") {
        for f in &r[0].files {
            println!(
                "{:60} {:7.2}  TP {:4}  FP {:4}  windows {}/{}",
                f.file, f.score, f.tp, f.fp, f.windows_detected, f.windows
            );
        }
    }
    Ok(())
}
