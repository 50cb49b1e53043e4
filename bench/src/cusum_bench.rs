//! `cusum-bench`: throughput of the `cusum` detector on many interleaved series (one
//! `llm.ttft.p95` point per series and minute, as `llm_signals` writes them), next to
//! `zscore_skew` and `anomaly_ensemble` on the same batches in the same run and to cusum's own
//! model without the processor around it; state bytes per series. Prints one JSON document.

#[path = "detector_bench.rs"]
mod detector_bench;

use anyhow::Context;
use clap::Parser;
use detector_bench::{Gen, drive, gauge_batch, kv_str, point, rate};
use inferwatch_core::arrow::{ArrowProcessorFactory, RecordBatch};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::anomaly_ensemble::AnomalyEnsembleFactory;
use inferwatch_processors::cusum::CusumFactory;
use inferwatch_processors::cusum::model::Model;
use inferwatch_processors::detect::point::PointConfig;
use inferwatch_processors::zscore_skew::ZscoreSkew;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "cusum-bench", about = "cusum on many interleaved series, next to zscore_skew")]
struct Cli {
    /// Series, interleaved (one point each per minute).
    #[arg(long, default_value_t = 100_000)]
    series: usize,
    /// Minutes of data.
    #[arg(long, default_value_t = 60)]
    minutes: usize,
    /// Repetitions (the best time is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

const METRIC: &str = "llm.ttft.p95";
const MIN: u64 = 60_000_000_000;
const BASE: u64 = 1_700_000_040_000_000_000;

fn values(cli: &Cli) -> Vec<Vec<f64>> {
    let mut g = Gen(11);
    (0..cli.minutes).map(|_| (0..cli.series).map(|_| 0.25 * (0.07 * g.normal()).exp()).collect()).collect()
}

fn batches(cli: &Cli, vals: &[Vec<f64>]) -> anyhow::Result<Vec<(RecordBatch, Option<u64>)>> {
    let mut out = Vec::with_capacity(cli.minutes);
    for (m, row) in vals.iter().enumerate() {
        let t = BASE + m as u64 * MIN;
        let points = row
            .iter()
            .enumerate()
            .map(|(i, &v)| point(vec![kv_str("service.instance.id", format!("vllm-{i}"))], t, v))
            .collect();
        let resource = vec![kv_str("service.name", "inferwatch".into())];
        out.push((gauge_batch(resource, "inferwatch.llm_signals", METRIC, points)?, Some(t)));
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let vals = values(&cli);
    let input = batches(&cli, &vals)?;
    let points = cli.series * cli.minutes;
    let ctx = |id: &str| -> anyhow::Result<CreateContext> {
        Ok(CreateContext::new(ComponentId::parse(id)?, Arc::new(Telemetry::new())))
    };
    let cfg = json!({"metrics": [METRIC], "max_series": cli.series * 2, "warmup": 2});
    let params = serde_json::from_value::<inferwatch_processors::cusum::CusumConfig>(cfg.clone())?
        .check()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .0
        .params()
        .clone();
    let (mut best_c, mut best_z, mut best_m, mut best_e) = (Duration::MAX, Duration::MAX, Duration::MAX, Duration::MAX);
    let (mut c_rows, mut z_rows, mut e_rows, mut snapshot_bytes, mut e_snapshot) = (0, 0, 0, 0, 0);
    for _ in 0..cli.reps.max(1) {
        let parsed = CusumFactory.parse_arrow(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut c = CusumFactory.build_arrow(ctx("cusum/bench")?, &parsed, Signal::Metrics).context("cusum")?;
        let (d, rows) = drive(c.as_mut(), &input, |_| Ok(()))?;
        best_c = best_c.min(d);
        c_rows = rows;
        snapshot_bytes = c.snapshot().map_err(|e| anyhow::anyhow!("{e}"))?.len();
        let zcfg = json!({"metrics": [METRIC], "window": 30, "max_series": cli.series * 2});
        let mut z = ZscoreSkew::new(&ctx("zscore_skew/bench")?, &zcfg).context("zscore_skew config")?;
        let (d, rows) = drive(&mut z, &input, |_| Ok(()))?;
        best_z = best_z.min(d);
        z_rows = rows;
        let ecfg = json!({"metrics": [METRIC], "max_series": cli.series * 2});
        let parsed = AnomalyEnsembleFactory.parse_arrow(&ecfg).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut e = AnomalyEnsembleFactory
            .build_arrow(ctx("anomaly_ensemble/bench")?, &parsed, Signal::Metrics)
            .context("ae")?;
        let (d, rows) = drive(e.as_mut(), &input, |_| Ok(()))?;
        best_e = best_e.min(d);
        e_rows = rows;
        e_snapshot = e.snapshot().map_err(|e| anyhow::anyhow!("{e}"))?.len();
        // The model alone: the same points, one Model per series, no batches, no output.
        let mut models: Vec<Model> = (0..cli.series).map(|_| Model::new(&params)).collect();
        let t = Instant::now();
        let mut alarms = 0usize;
        for (m, row) in vals.iter().enumerate() {
            let ts = BASE + m as u64 * MIN;
            for (model, &v) in models.iter_mut().zip(row) {
                if model.push(&params, ts, v.ln()).is_some_and(|s| s.stat >= s.h_warning) {
                    alarms += 1;
                }
            }
        }
        best_m = best_m.min(t.elapsed());
        std::hint::black_box(alarms);
    }
    let model = Model::new(&params);
    let heap = 4
        * (model.daily.len()
            + model.weekly.len()
            + model.daily_n.len()
            + model.weekly_n.len()
            + model.slot_dev.len()
            + model.slot_n.len());
    let report = json!({
        "benchmark": "cusum",
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "series": cli.series,
        "minutes": cli.minutes,
        "points": points,
        "cusum": {"points_per_s": rate(points, best_c), "output_rows": c_rows,
                  "state_bytes_per_series": std::mem::size_of::<Model>() + heap,
                  "checkpoint_bytes_per_series": snapshot_bytes / cli.series.max(1)},
        "cusum_model_only": {"points_per_s": rate(points, best_m)},
        "zscore_skew": {"points_per_s": rate(points, best_z), "output_rows": z_rows, "window": 30},
        "anomaly_ensemble": {"points_per_s": rate(points, best_e), "output_rows": e_rows,
                             "checkpoint_bytes_per_series": e_snapshot / cli.series.max(1)},
        "ratio_cusum_to_zscore_skew": best_z.as_secs_f64() / best_c.as_secs_f64().max(1e-12),
        "ratio_processor_to_model": best_m.as_secs_f64() / best_c.as_secs_f64().max(1e-12),
        "notes": ["process + advance on metrics batches (one per minute, one point per series), output included, input building excluded; best of reps"],
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
