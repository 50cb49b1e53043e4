//! `peer-outlier-bench`: throughput of the `peer_outlier` detector on a fleet of many replicas
//! (one `llm.ttft.p95` point per replica and minute, as `llm_signals` writes them), next to
//! `zscore_skew` on the same batches in the same run. Prints one JSON document.

#[path = "detector_bench.rs"]
mod detector_bench;

use anyhow::Context;
use clap::Parser;
use detector_bench::{Gen, drive, gauge_batch, kv_str, point, rate};
use inferwatch_core::arrow::{ArrowProcessor, RecordBatch, metrics};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::peer_outlier::PeerOutlier;
use inferwatch_processors::zscore_skew::ZscoreSkew;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "peer-outlier-bench", about = "peer_outlier on a large fleet, next to zscore_skew")]
struct Cli {
    /// Replicas of the fleet.
    #[arg(long, default_value_t = 1000)]
    replicas: usize,
    /// Models (groups) the replicas are split into.
    #[arg(long, default_value_t = 1)]
    models: usize,
    /// Minutes of data (one point per replica and minute).
    #[arg(long, default_value_t = 600)]
    minutes: usize,
    /// Repetitions (the best time is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

const METRIC: &str = "llm.ttft.p95";
const MIN: u64 = 60_000_000_000;
const BASE: u64 = 1_700_000_040_000_000_000;

/// Lognormal noise (σ 7 %) around 0.25 s.
fn value(g: &mut Gen) -> f64 {
    0.25 * (0.07 * g.normal()).exp()
}

/// One batch per minute: every replica's point (llm_signals' resource and scope; model and
/// replica as point attributes), with the watermark after it.
fn batches(cli: &Cli) -> anyhow::Result<Vec<(RecordBatch, Option<u64>)>> {
    let mut g = Gen(7);
    let mut out = Vec::with_capacity(cli.minutes);
    for m in 0..cli.minutes as u64 {
        let t = BASE + m * MIN + 500_000_000;
        let points = (0..cli.replicas)
            .map(|i| {
                let mut v = value(&mut g);
                if i == 3 && m >= cli.minutes as u64 / 2 {
                    v *= 1.3;
                }
                let attrs = vec![
                    kv_str("gen_ai.request.model", format!("model-{}", i % cli.models.max(1))),
                    kv_str("service.instance.id", format!("vllm-{i}")),
                    kv_str("source", "spans".into()),
                ];
                point(attrs, t, v)
            })
            .collect();
        let resource = vec![kv_str("service.name", "inferwatch".into())];
        out.push((gauge_batch(resource, "inferwatch.llm_signals", METRIC, points)?, Some(t)));
    }
    Ok(out)
}

/// Output points at level ≥ 0.6 in `b`.
fn flagged(b: &RecordBatch) -> anyhow::Result<usize> {
    let req = metrics::from_batch(b)?;
    let mut n = 0;
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in sm.metrics.iter().filter(|m| m.name == "llm.anomaly.level") {
                if let Some(metric::Data::Gauge(g)) = &m.data {
                    n += g
                        .data_points
                        .iter()
                        .filter(|d| matches!(d.value, Some(number_data_point::Value::AsDouble(v)) if v >= 0.6))
                        .count();
                }
            }
        }
    }
    Ok(n)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let input = batches(&cli)?;
    let points = cli.replicas * cli.minutes;
    let ctx = |id: &str| -> anyhow::Result<CreateContext> {
        Ok(CreateContext::new(ComponentId::parse(id)?, Arc::new(Telemetry::new())))
    };
    let (mut best_po, mut best_z) = (Duration::MAX, Duration::MAX);
    let (mut po_rows, mut po_flagged, mut z_rows, mut state) = (0, 0, 0, 0);
    for _ in 0..cli.reps.max(1) {
        let cfg = json!({"metrics": [METRIC], "max_series": cli.replicas * 2});
        let mut po = PeerOutlier::new(&ctx("peer_outlier/bench")?, &cfg).context("peer_outlier config")?;
        let mut n_flagged = 0;
        let (d, rows) = drive(&mut po, &input, |b| {
            n_flagged += flagged(b)?;
            Ok(())
        })?;
        best_po = best_po.min(d);
        (po_rows, po_flagged) = (rows, n_flagged);
        state = po.approx_state_bytes() / po.series_count().max(1);
        let zcfg = json!({"metrics": [METRIC], "window": 30, "max_series": cli.replicas * 2});
        let mut z = ZscoreSkew::new(&ctx("zscore_skew/bench")?, &zcfg).context("zscore_skew config")?;
        let (d, rows) = drive(&mut z, &input, |_| Ok(()))?;
        best_z = best_z.min(d);
        z_rows = rows;
    }
    let report: Value = json!({
        "benchmark": "peer_outlier",
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "replicas": cli.replicas,
        "models": cli.models,
        "minutes": cli.minutes,
        "points": points,
        "peer_outlier": {
            "points_per_s": rate(points, best_po),
            "output_points": po_rows,
            "flagged_points": po_flagged,
            "state_bytes_per_series": state,
        },
        "zscore_skew": {"points_per_s": rate(points, best_z), "output_points": z_rows, "window": 30},
        "ratio_peer_outlier_to_zscore_skew": best_z.as_secs_f64() / best_po.as_secs_f64().max(1e-12),
        "notes": [
            "process + advance on metrics batches (one batch per minute, one point per replica), output included, input building excluded; best of reps",
            "zscore_skew scores every point against its own series' last 30 (per-point output); peer_outlier judges each replica against its peers once per 1m window",
        ],
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
