//! `peer-outlier-bench`: throughput of the `peer_outlier` detector on a fleet of many replicas
//! (one `llm.ttft.p95` point per replica and minute, as `llm_signals` writes them), next to
//! `zscore_skew` on the same batches in the same run. Prints one JSON document.

use anyhow::Context;
use clap::Parser;
use inferwatch_core::arrow::{ArrowProcessor, RecordBatch, metrics};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::peer_outlier::PeerOutlier;
use inferwatch_processors::zscore_skew::ZscoreSkew;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn kv(k: &str, v: String) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v)) }), key_strindex: 0 }
}

/// SplitMix64 lognormal noise around 0.25 s.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn value(&mut self) -> f64 {
        let n = (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos();
        0.25 * (0.07 * n).exp()
    }
}

/// One batch per minute: every replica's point (llm_signals' resource and scope; model and
/// replica as point attributes), with the watermark after it.
fn batches(cli: &Cli) -> anyhow::Result<Vec<(RecordBatch, u64)>> {
    let mut g = Gen(7);
    let mut out = Vec::with_capacity(cli.minutes);
    for m in 0..cli.minutes as u64 {
        let t = BASE + m * MIN + 500_000_000;
        let points = (0..cli.replicas)
            .map(|i| {
                let mut v = g.value();
                if i == 3 && m >= cli.minutes as u64 / 2 {
                    v *= 1.3;
                }
                NumberDataPoint {
                    attributes: vec![
                        kv("gen_ai.request.model", format!("model-{}", i % cli.models.max(1))),
                        kv("service.instance.id", format!("vllm-{i}")),
                        kv("source", "spans".into()),
                    ],
                    time_unix_nano: t,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..Default::default()
                }
            })
            .collect();
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "inferwatch".into())],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope { name: "inferwatch.llm_signals".into(), ..Default::default() }),
                    metrics: vec![Metric {
                        name: METRIC.into(),
                        unit: "s".into(),
                        data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                        ..Default::default()
                    }],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        out.push((metrics::to_batch(&req)?, t));
    }
    Ok(out)
}

/// Time of process + advance over every batch (input building excluded), and the output points.
fn drive(p: &mut dyn ArrowProcessor, input: &[(RecordBatch, u64)]) -> anyhow::Result<(Duration, usize, usize)> {
    let mut busy = Duration::ZERO;
    let (mut rows, mut flagged) = (0usize, 0usize);
    for (b, wm) in input {
        let mut out = Vec::new();
        let t = Instant::now();
        p.process(b, &mut out)?;
        p.advance(*wm, &mut out)?;
        busy += t.elapsed();
        for o in &out {
            rows += o.num_rows();
            let req = metrics::from_batch(o)?;
            for rm in &req.resource_metrics {
                for sm in &rm.scope_metrics {
                    for m in sm.metrics.iter().filter(|m| m.name == "llm.anomaly.level") {
                        if let Some(metric::Data::Gauge(g)) = &m.data {
                            flagged += g
                                .data_points
                                .iter()
                                .filter(|d| matches!(d.value, Some(number_data_point::Value::AsDouble(v)) if v >= 0.6))
                                .count();
                        }
                    }
                }
            }
        }
    }
    Ok((busy, rows, flagged))
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
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
        let (d, rows, flagged) = drive(&mut po, &input)?;
        best_po = best_po.min(d);
        (po_rows, po_flagged) = (rows, flagged);
        state = po.approx_state_bytes() / po.series_count().max(1);
        let zcfg = json!({"metrics": [METRIC], "window": 30, "max_series": cli.replicas * 2});
        let mut z = ZscoreSkew::new(&ctx("zscore_skew/bench")?, &zcfg).context("zscore_skew config")?;
        let (d, rows, _) = drive(&mut z, &input)?;
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
