//! `lstm-bench`: throughput of the `lstm_ae` model on ONNX Runtime (windows per second, batched,
//! one intra-op thread) and the latency of one batch, next to the `pca` baseline; model sizes from
//! the files. With `--check-provider cuda` it instead compares CUDA scores with CPU scores (the
//! device check, deploy/gpu-check-ort.sh). Prints one JSON document.

use anyhow::Context;
use clap::Parser;
use inferwatch_ml::windows::{ExecutionProvider, GroupKey, Scorer, Search, Window};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Parser)]
#[command(name = "lstm-bench", about = "lstm_ae on ONNX Runtime: windows/s and batch latency, CPU")]
struct Cli {
    /// The lstm_ae model (its card is the same path with .json).
    #[arg(long, default_value = "models/lstm_ae_default.onnx")]
    model: PathBuf,
    /// The pca card to compare with.
    #[arg(long, default_value = "models/pca_default.json")]
    pca: PathBuf,
    /// Skip the pca baseline.
    #[arg(long)]
    no_pca: bool,
    /// Batch sizes (windows per run).
    #[arg(long, value_delimiter = ',', default_value = "1,32,256")]
    batches: Vec<usize>,
    /// Windows scored per batch size and repetition.
    #[arg(long, default_value_t = 4096)]
    windows: usize,
    /// Repetitions (the best is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Device check: score on this provider and on the CPU and compare (exit 1 above 1e-4).
    #[arg(long)]
    check_provider: Option<String>,
}

/// Deterministic standardised windows: a smooth pattern per signal plus noise, a few missing cells.
fn windows(n: usize, t: usize, k: usize) -> Vec<Window> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut unit = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|i| {
            let mut x = Vec::with_capacity(t * k);
            let mut mask = Vec::with_capacity(t * k);
            for step in 0..t {
                for j in 0..k {
                    let present = unit() > 0.02;
                    let v = ((step + i) as f64 * 0.1 + j as f64).sin() + 0.3 * (unit() - 0.5);
                    x.push(if present { v as f32 } else { 0.0 });
                    mask.push(if present { 1.0 } else { 0.0 });
                }
            }
            Window { group: GroupKey::new(format!("i{}", i % 16), "v1", "m"), end_bucket: i as u64, end_ns: 0, x, mask }
        })
        .collect()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Best windows/s over `reps` and the batch latencies (ms) of the best repetition.
fn measure(scorer: &mut Scorer, ws: &[Window], batch: usize, reps: usize) -> anyhow::Result<Value> {
    let mut best: Option<(f64, Vec<f64>)> = None;
    scorer.score(&ws[..batch.min(ws.len())])?; // warm-up
    for _ in 0..reps.max(1) {
        let mut lat = Vec::new();
        let start = Instant::now();
        for chunk in ws.chunks(batch) {
            let t0 = Instant::now();
            scorer.score(chunk)?;
            lat.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let rate = ws.len() as f64 / start.elapsed().as_secs_f64();
        if best.as_ref().is_none_or(|(r, _)| rate > *r) {
            best = Some((rate, lat));
        }
    }
    let (rate, mut lat) = best.context("no repetition")?;
    lat.sort_by(f64::total_cmp);
    Ok(json!({
        "batch": batch,
        "windows_per_s": rate.round(),
        "batch_latency_ms": { "p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99), "max": percentile(&lat, 1.0) },
    }))
}

fn file_bytes(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

fn check_provider(cli: &Cli, provider: &str) -> anyhow::Result<bool> {
    let ep = match provider {
        "cuda" => ExecutionProvider::Cuda,
        "cpu" => ExecutionProvider::Cpu,
        other => anyhow::bail!("--check-provider: cpu or cuda, not {other}"),
    };
    let search = Search::from_process(None);
    let mut cpu = Scorer::lstm_ae(&cli.model, &search, ExecutionProvider::Cpu)?;
    let mut dev = Scorer::lstm_ae(&cli.model, &search, ep)?;
    let used = dev.provider().map(ExecutionProvider::as_str).unwrap_or("none");
    let ws = windows(cli.windows.min(1024), cpu.card.t, cpu.card.k());
    let a = cpu.score(&ws)?;
    let t0 = Instant::now();
    let b = dev.score(&ws)?;
    let dev_ms = t0.elapsed().as_secs_f64() * 1e3;
    let worst = a.iter().zip(&b).map(|((x, _), (y, _))| (x.error - y.error).abs()).fold(0f64, f64::max);
    let ok = worst <= 1e-4;
    let library = inferwatch_ml::runtime::Runtime::load(&search)?.library().display().to_string();
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "requested_provider": provider,
            "used_provider": used,
            "fell_back_to_cpu": ep == ExecutionProvider::Cuda && used != "cuda",
            "runtime_library": library,
            "windows": ws.len(),
            "max_abs_score_diff_vs_cpu": worst,
            "scores_equal_within_1e-4": ok,
            "device_run_ms": dev_ms,
        }))?
    );
    Ok(ok)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(p) = cli.check_provider.clone() {
        let ok = check_provider(&cli, &p)?;
        std::process::exit(if ok { 0 } else { 1 });
    }
    let search = Search::from_process(None);
    let mut lstm = Scorer::lstm_ae(&cli.model, &search, ExecutionProvider::Cpu)
        .with_context(|| format!("opening {}", cli.model.display()))?;
    let (t, k) = (lstm.card.t, lstm.card.k());
    let ws = windows(cli.windows, t, k);
    let mut lstm_runs = Vec::new();
    for &b in &cli.batches {
        lstm_runs.push(measure(&mut lstm, &ws, b.max(1), cli.reps)?);
    }
    let metrics = lstm.card.metrics.clone().unwrap_or(Value::Null);
    let pruned = lstm.card.pruned.clone();
    let mut doc = json!({
        "model": cli.model.display().to_string(),
        "window": { "T": t, "k": k },
        "intra_threads": 1,
        "model_bytes": file_bytes(&cli.model),
        "pruned": pruned.map(|p| json!({ "kept_units": p.kept_units, "of": p.of })),
        "model_bytes_unpruned": metrics.get("model_bytes_unpruned"),
        "holdout_mse": metrics.get("holdout_mse"),
        "holdout_mse_unpruned": metrics.get("holdout_mse_unpruned"),
        "lstm_ae": lstm_runs,
    });
    if !cli.no_pca {
        let mut pca = Scorer::pca(&cli.pca).with_context(|| format!("opening {}", cli.pca.display()))?;
        let ws = windows(cli.windows, pca.card.t, pca.card.k());
        let mut runs = Vec::new();
        for &b in &cli.batches {
            runs.push(measure(&mut pca, &ws, b.max(1), cli.reps)?);
        }
        doc["pca"] = json!({ "card": cli.pca.display().to_string(), "card_bytes": file_bytes(&cli.pca), "runs": runs });
    }
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
