//! Running a detector over every NAB file through the eval harness, and turning its
//! `llm.anomaly.level` output into one anomaly score in [0, 1] per row.
//!
//! Each file runs in its own pipeline (NAB files overlap in time, so one shared event-time clock
//! would drop most of them as late): gauge `nab.value`, one point per row at the row's timestamp,
//! resource attribute `service.instance.id` = the file's path, sent in chunks of [`CHUNK`] rows.
//!
//! Windowed detectors (`lstm_ae`, `pca`: [`WINDOWED`]) see each file standardised by its
//! probationary mean and std ([`standardised`]), bucketed at the file's own step, and each level
//! (emitted at its bucket's end) scores the last row at or before it ([`Align::AtOrBefore`]).

use super::data::NabFile;
use crate::error::EvalError;
use crate::harness::{Harness, Point};
use inferwatch_core::config::yaml::{self, NodeKind};
use inferwatch_core::pdata::Payload;
use inferwatch_core::registry::Registry;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

/// Name of the gauge a NAB row becomes.
pub const METRIC: &str = "nab.value";
/// The output read as the per-row anomaly score.
pub const LEVEL: &str = "llm.anomaly.level";
/// Resource attribute naming the file.
pub const INSTANCE_ATTR: &str = "service.instance.id";
/// Rows per payload.
pub const CHUNK: usize = 1000;
/// Detectors with a built-in NAB configuration.
pub const BUILTIN: &[&str] = &["zscore_skew", "trend_forecast", "lstm_ae", "pca", "anomaly_ensemble"];
/// Processor types of the ml crate: window detectors fed z-values, with levels at bucket ends.
pub const WINDOWED: &[&str] = &["lstm_ae", "pca"];
/// The univariate NAB `lstm_ae` model (relative to the repository root; card next to it).
pub const LSTM_AE_MODEL: &str = "models/nab/lstm_ae_nab.onnx";
/// The univariate NAB `pca` card (relative to the repository root).
pub const PCA_MODEL: &str = "models/nab/pca_nab.json";
/// Error at level 0.8 in the NAB rows of the windowed detectors: clip² = 100, the error of a window
/// at the clip everywhere reconstructed as 0, so that levels do not saturate below it.
pub const NAB_CRITICAL_ERROR: f64 = 100.0;
/// Smallest standard deviation used by [`standardised`] (the model card's floor).
pub const STD_FLOOR: f64 = 1e-6;

/// Idle expiry for the built-in configurations: NAB files have gaps of up to 174 h that are not new series.
const IDLE: &str = "10000h";
const HOUR_NS: u64 = 3_600_000_000_000;

/// Processors (id, settings) of the pipeline for `detector` on `file`: the built-in table.
///
/// - `zscore_skew`: `{metrics: [nab.value], window: 50}`.
/// - `anomaly_ensemble`: its defaults, with `level: {zero: 0, one: 10}` (the level is the score / 10,
///   so the threshold sweep sees the whole score range).
/// - `trend_forecast`: `{metric: nab.value, aggregate: max(step, 1h), history: 14d}`, threshold =
///   max + range of the file's probationary rows, direction above (NAB has no SLO; this is a stand-in).
/// - `lstm_ae`, `pca`: the univariate NAB models ([`LSTM_AE_MODEL`], [`PCA_MODEL`], found by
///   [`repo_file`]) with `step` = the file's step, `level.critical_error` = [`NAB_CRITICAL_ERROR`];
///   the runner sends them z-values ([`standardised`]).
pub fn builtin_processors(detector: &str, file: &NabFile) -> Result<Vec<(String, Value)>, EvalError> {
    match detector {
        "zscore_skew" => Ok(vec![(
            detector.into(),
            json!({"metrics": [METRIC], "window": 50, "idle_timeout": IDLE, "level": {"zero": 0.0, "one": 100.0}}),
        )]),
        "anomaly_ensemble" => Ok(vec![(
            detector.into(),
            json!({"metrics": [METRIC], "idle_timeout": IDLE, "level": {"zero": 0.0, "one": 10.0}}),
        )]),
        "trend_forecast" => {
            let agg_s = file.step_ns().max(HOUR_NS) / 1_000_000_000;
            let probation = super::score::probationary_length(file.len()).max(1.0) as usize;
            let head = &file.values[..probation.min(file.len())];
            let (lo, hi) = head.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let threshold = if hi.is_finite() { hi + (hi - lo) } else { 0.0 };
            Ok(vec![(
                detector.into(),
                json!({"metric": METRIC, "threshold": threshold, "direction": "above",
                       "aggregate": format!("{agg_s}s"), "idle_timeout": IDLE}),
            )])
        }
        "lstm_ae" | "pca" => {
            let step_s = file.step_ns() / 1_000_000_000;
            if step_s == 0 {
                return Err(EvalError::Data(format!("{}: no step of a whole second between rows", file.name)));
            }
            let model = repo_file(if detector == "pca" { PCA_MODEL } else { LSTM_AE_MODEL });
            let cfg = json!({"model": model.display().to_string(), "step": format!("{step_s}s"),
                             "idle_timeout": IDLE, "max_batch": 1024,
                             "level": {"critical_error": NAB_CRITICAL_ERROR}});
            Ok(vec![(detector.into(), cfg)])
        }
        other => Err(EvalError::Config(format!(
            "unknown NAB detector {other:?}: built in are {}; others need --config FILE",
            BUILTIN.join(", ")
        ))),
    }
}

/// `rel` under the first of the working directory and its parents, then the executable's
/// directory and its parents, where it exists (so `models/...` is found from the repository root,
/// a crate directory or `target/release/`); else `rel` as given.
pub fn repo_file(rel: &str) -> PathBuf {
    let exe_dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf));
    let starts = std::env::current_dir().ok().into_iter().chain(exe_dir);
    for start in starts {
        for dir in start.ancestors() {
            let p = dir.join(rel);
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from(rel)
}

/// True when a processor of `processors` is a windowed detector ([`WINDOWED`]; the type is the id
/// before any `/`).
pub fn is_windowed(processors: &[(String, Value)]) -> bool {
    processors.iter().any(|(id, _)| WINDOWED.contains(&id.split('/').next().unwrap_or_default()))
}

/// Mean and population standard deviation (floored at [`STD_FLOOR`]) of the file's probationary
/// rows (at least the first row).
pub fn probationary_stats(file: &NabFile) -> (f64, f64) {
    let n = (super::score::probationary_length(file.len()).max(1.0) as usize).min(file.len());
    let head = &file.values[..n];
    if head.is_empty() {
        return (0.0, 1.0);
    }
    let mean = head.iter().sum::<f64>() / head.len() as f64;
    let var = head.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / head.len() as f64;
    let std = var.sqrt();
    (mean, if std.is_finite() { std.max(STD_FLOOR) } else { 1.0 })
}

/// The file with every value replaced by its z-value against [`probationary_stats`].
pub fn standardised(file: &NabFile) -> NabFile {
    let (mean, std) = probationary_stats(file);
    NabFile { values: file.values.iter().map(|v| (v - mean) / std).collect(), ..file.clone() }
}

/// Processors (id, settings) of an override file's `processors:` section, in file order.
pub fn override_processors(path: &Path) -> Result<Vec<(String, Value)>, EvalError> {
    let text = std::fs::read_to_string(path).map_err(|e| EvalError::io(path, e))?;
    let name = path.display().to_string();
    let root = yaml::parse(&name, &text).map_err(EvalError::config)?;
    let Some((_, procs)) = root.entry("processors") else {
        return Err(EvalError::Config(format!("{name}: no `processors:` entry")));
    };
    let NodeKind::Map(entries) = &procs.kind else {
        return Err(EvalError::Config(format!("{name}: `processors:` must be a mapping of processor ids")));
    };
    if entries.is_empty() {
        return Err(EvalError::Config(format!("{name}: `processors:` is empty")));
    }
    Ok(entries.iter().map(|(k, v)| (k.text.clone(), v.to_json())).collect())
}

/// The harness configuration: `eval_feed` → the processors in order → `eval_capture` keeping the level.
pub fn pipeline_yaml(processors: &[(String, Value)]) -> String {
    let mut s = String::from("receivers:\n  eval_feed: {}\nprocessors:\n");
    for (id, cfg) in processors {
        let cfg = if cfg.is_null() { json!({}) } else { cfg.clone() };
        s.push_str(&format!("  {}: {cfg}\n", Value::String(id.clone())));
    }
    let ids: Vec<String> = processors.iter().map(|(id, _)| Value::String(id.clone()).to_string()).collect();
    s.push_str(&format!("exporters:\n  eval_capture: {{ metrics: [{LEVEL}] }}\n"));
    s.push_str(&format!(
        "service:\n  pipelines:\n    metrics: {{ receivers: [eval_feed], processors: [{}], exporters: [eval_capture] }}\n",
        ids.join(", ")
    ));
    s
}

/// The file's rows as metrics payloads of at most [`CHUNK`] points each, in file order.
pub fn payloads(file: &NabFile) -> Vec<Payload> {
    let resource = Resource {
        attributes: vec![KeyValue {
            key: INSTANCE_ATTR.into(),
            value: Some(AnyValue { value: Some(any_value::Value::StringValue(file.name.clone())) }),
            ..Default::default()
        }],
        ..Default::default()
    };
    file.timestamps
        .chunks(CHUNK)
        .zip(file.values.chunks(CHUNK))
        .map(|(ts, vs)| {
            let data_points = ts
                .iter()
                .zip(vs)
                .map(|(&t, &v)| NumberDataPoint {
                    time_unix_nano: t,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..Default::default()
                })
                .collect();
            let metric = Metric {
                name: METRIC.into(),
                data: Some(metric::Data::Gauge(Gauge { data_points })),
                ..Default::default()
            };
            Payload::Metrics(ExportMetricsServiceRequest {
                resource_metrics: vec![ResourceMetrics {
                    resource: Some(resource.clone()),
                    scope_metrics: vec![ScopeMetrics { metrics: vec![metric], ..Default::default() }],
                    ..Default::default()
                }],
            })
        })
        .collect()
}

/// Where a level point at no row's timestamp goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// The first row at or after it (a detector that emits after its input).
    AtOrAfter,
    /// The last row at or before it (a window detector emitting at its bucket's end).
    AtOrBefore,
}

/// [`row_scores_aligned`] with [`Align::AtOrAfter`].
pub fn row_scores(file: &NabFile, points: &[Point]) -> (Vec<f64>, usize) {
    row_scores_aligned(file, points, Align::AtOrAfter)
}

/// Per-row anomaly scores from the level points of `file`: a point goes to a row with its exact
/// timestamp (rows sharing a timestamp take that timestamp's points in arrival order); a point at
/// no row's timestamp goes to the row `align` names (the highest level wins). Rows without
/// a point score 0; levels are clamped to [0, 1] and NaN is 0. Returns the scores and how many
/// points matched no row exactly.
pub fn row_scores_aligned(file: &NabFile, points: &[Point], align: Align) -> (Vec<f64>, usize) {
    let mut by_time: HashMap<u64, VecDeque<f64>> = HashMap::new();
    for p in points.iter().filter(|p| p.attrs.get(INSTANCE_ATTR).is_none_or(|n| *n == file.name)) {
        let v = if p.value.is_nan() { 0.0 } else { p.value.clamp(0.0, 1.0) };
        by_time.entry(p.time_ns).or_default().push_back(v);
    }
    let mut scores = vec![0.0; file.len()];
    for (i, t) in file.timestamps.iter().enumerate() {
        if let Some(q) = by_time.get_mut(t)
            && let Some(v) = q.pop_front()
        {
            scores[i] = v;
        }
    }
    let mut sorted: Vec<(u64, usize)> = file.timestamps.iter().enumerate().map(|(i, &t)| (t, i)).collect();
    sorted.sort_unstable();
    let mut unmatched = 0;
    for (t, q) in by_time {
        for v in q {
            unmatched += 1;
            let row = match align {
                Align::AtOrAfter => sorted.get(sorted.partition_point(|&(rt, _)| rt < t)),
                Align::AtOrBefore => {
                    sorted.partition_point(|&(rt, _)| rt <= t).checked_sub(1).and_then(|at| sorted.get(at))
                }
            };
            if let Some(&(_, i)) = row {
                scores[i] = scores[i].max(v);
            }
        }
    }
    (scores, unmatched)
}

/// What one file's run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRun {
    /// Anomaly score per row.
    pub scores: Vec<f64>,
    /// Level points received.
    pub points: usize,
    /// Level points at no row's timestamp.
    pub unmatched: usize,
}

/// Runs the pipeline of `processors` over one file and returns its `llm.anomaly.level` points
/// (with a windowed detector, [`is_windowed`], the file is sent [`standardised`]).
pub async fn level_points(
    file: &NabFile,
    processors: &[(String, Value)],
    registry: Registry,
) -> Result<Vec<Point>, EvalError> {
    let harness = Harness::start(&pipeline_yaml(processors), registry).await?;
    let sent = if is_windowed(processors) { payloads(&standardised(file)) } else { payloads(file) };
    for p in sent {
        harness.send(p).await?;
    }
    Ok(harness.finish().await?.points(LEVEL))
}

/// Runs the pipeline of `processors` over one file ([`level_points`]) and returns its per-row
/// scores; a windowed detector's points align [`Align::AtOrBefore`].
pub async fn run_file(
    file: &NabFile,
    processors: &[(String, Value)],
    registry: Registry,
) -> Result<FileRun, EvalError> {
    let windowed = is_windowed(processors);
    let points = level_points(file, processors, registry).await?;
    let align = if windowed { Align::AtOrBefore } else { Align::AtOrAfter };
    let (scores, unmatched) = row_scores_aligned(file, &points, align);
    Ok(FileRun { scores, points: points.len(), unmatched })
}
