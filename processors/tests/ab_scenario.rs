//! End to end on the simulator's mirrored A/B scenarios: the scenario runner writes
//! `traces.jsonl`, each line goes through the `llm_signals` connector (`per_request: true`),
//! whose per-request `llm.request.ttft` points feed a `delta_ab` stage; the test reads the
//! comparisons `delta_ab` emits at each window's end.
//!
//! `delta_ab` window: 10 min. At 1.2 requests/s with 10 % of the requests written as spans, a
//! window holds about 72 mirrored pairs (≥ `min_samples` 30 with margin), and 6 h give 36
//! windows. Longer windows do not sharpen the verdict on these scenarios: Δ TTFT p95 of one
//! window varies by about ±10 ms between windows (A and B batch differently once v2 is slower),
//! so a 30 min or 1 h window still straddles the 5 ms threshold. A `lookback` (10 min windows,
//! each judging the pooled pairs of the last hours, canary-style) does: see the last tests.

use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, NodeRef, ProcessorFactory};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::delta_ab::DeltaAbFactory;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_receivers::replay::decode_otlp_json_line;
use inferwatch_testkit::harness::Sink;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One `delta_ab` comparison (one window of the single group).
#[derive(Debug, Clone)]
struct Cmp {
    end: u64,
    level: f64,
    delta: f64,
    verdict: String,
    mode: String,
    n_pairs: i64,
    n_baseline: i64,
    n_candidate: i64,
    ci: (f64, f64),
    /// `delta_ab.lookback_s`: the span judged.
    lookback_s: f64,
}

/// What one scenario run gave.
struct Run {
    windows: Vec<Cmp>,
    /// `llm.request.ttft` points per `service.instance.id`.
    ttft_points: BTreeMap<String, usize>,
    /// Distinct request ids on the `llm.request.ttft` points.
    ids: usize,
    /// Points the `delta_ab` stage dropped as late.
    late: u64,
}

fn any_string(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> Option<String> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().filter_map(|kv| Some((kv.key.clone(), any_string(&kv.value)?))).collect()
}

fn number(p: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsDouble(d)) => d,
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        None => f64::NAN,
    }
}

/// Runs `scenario` into a fresh directory and returns the lines of its `traces.jsonl`.
fn simulate(scenario: &Path) -> Vec<String> {
    let name = scenario.file_stem().unwrap().to_string_lossy().to_string();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ab_scenario_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    inferwatch_sim::scenario::run_scenario(scenario, &dir).unwrap();
    let file = std::fs::File::open(dir.join("traces.jsonl")).unwrap();
    let lines = std::io::BufReader::new(file).lines().map(Result::unwrap).filter(|l| !l.trim().is_empty()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

/// Runs `scenario`, then feeds its spans through llm_signals → delta_ab.
async fn run(scenario: &Path, delta_cfg: serde_json::Value) -> Run {
    pipeline(&simulate(scenario), delta_cfg).await
}

/// Feeds the spans `lines` through llm_signals (`per_request: true`) → delta_ab.
async fn pipeline(lines: &[String], delta_cfg: serde_json::Value) -> Run {
    let telemetry = Arc::new(Telemetry::new());
    let capture = Sink::new();
    let ctx = |id: &str| CreateContext::new(ComponentId::parse(id).unwrap(), telemetry.clone());
    let delta: NodeRef = DeltaAbFactory.create(ctx("delta_ab"), &delta_cfg, Signal::Metrics, capture.clone()).unwrap();
    let signals = LlmSignalsFactory
        .create(ctx("llm_signals"), &json!({"per_request": true}), Signal::Traces, Signal::Metrics, delta.clone())
        .unwrap();
    for line in lines {
        signals.consume(decode_otlp_json_line(line.as_bytes()).unwrap()).await.unwrap();
    }
    signals.end_of_input().await;
    delta.end_of_input().await;

    let mut levels: BTreeMap<u64, (f64, BTreeMap<String, String>)> = BTreeMap::new();
    let mut scores: BTreeMap<u64, f64> = BTreeMap::new();
    let mut ttft_points: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = HashSet::new();
    for payload in capture.payloads().iter() {
        let Payload::Metrics(req) = payload else { panic!("the pipeline emits metrics only") };
        for m in req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
            let Some(metric::Data::Gauge(g)) = &m.data else { continue };
            for p in &g.data_points {
                let a = attrs(&p.attributes);
                match m.name.as_str() {
                    "llm.request.ttft" => {
                        assert_eq!(m.unit, "s");
                        assert_eq!(a["source"], "spans");
                        *ttft_points.entry(a["service.instance.id"].clone()).or_default() += 1;
                        ids.insert(a["gen_ai.request.id"].clone());
                    }
                    "llm.anomaly.level" if a.get("detector").map(String::as_str) == Some("delta_ab") => {
                        assert!(levels.insert(p.time_unix_nano, (number(p), a)).is_none(), "one group only");
                    }
                    "llm.anomaly.score" if a.get("detector").map(String::as_str) == Some("delta_ab") => {
                        scores.insert(p.time_unix_nano, number(p));
                    }
                    _ => {}
                }
            }
        }
    }
    let windows = levels
        .into_iter()
        .map(|(end, (level, a))| {
            let f = |k: &str| a.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
            let i = |k: &str| a.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(-1);
            Cmp {
                end,
                level,
                delta: scores[&end],
                verdict: a["delta_ab.verdict"].clone(),
                mode: a["delta_ab.mode"].clone(),
                n_pairs: i("delta_ab.n_pairs"),
                n_baseline: i("delta_ab.n_baseline"),
                n_candidate: i("delta_ab.n_candidate"),
                ci: (f("delta_ab.ci_low"), f("delta_ab.ci_high")),
                lookback_s: f("delta_ab.lookback_s"),
            }
        })
        .collect();
    Run { windows, ttft_points, ids: ids.len(), late: telemetry.late_items("metrics").get() }
}

fn delta_cfg(version_attribute: &str, baseline: &str, candidate: &str) -> serde_json::Value {
    json!({
        "metric": "llm.request.ttft",
        "version_attribute": version_attribute,
        "baseline": baseline,
        "candidate": candidate,
        "statistic": "p95",
        "window": "10m",
        "min_samples": 30,
        // The spans reach llm_signals up to its allowed_lateness (5 s) out of order.
        "allowed_lateness": "5s",
    })
}

fn library(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios").join(format!("{name}.yaml"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.yaml"))
}

/// Prints the per-window table and the summary (the numbers the eval table quotes).
fn report(name: &str, r: &Run) {
    println!("{name}: ttft points per instance {:?}, {} request ids, late {}", r.ttft_points, r.ids, r.late);
    for w in &r.windows {
        println!(
            "  end {} n {}/{} pairs {} {:>6}  Δ {:+7.2} ms  CI [{:+7.2}, {:+7.2}]  {:<12} level {:.2}",
            w.end, w.n_baseline, w.n_candidate, w.n_pairs, w.mode, w.delta, w.ci.0, w.ci.1, w.verdict, w.level
        );
    }
    let full = full(r);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &full {
        *counts.entry(w.verdict.as_str()).or_default() += 1;
    }
    let n = full.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Cmp) -> f64| full.iter().map(|w| f(w)).sum::<f64>() / n;
    println!(
        "{name}: {} full windows of {}, verdicts {counts:?}, level ≥ 0.8 in {}, ≥ 0.6 in {}; \
         mean Δ {:+.2} ms, mean CI [{:+.2}, {:+.2}] ms",
        full.len(),
        r.windows.len(),
        full.iter().filter(|w| w.level >= 0.8).count(),
        full.iter().filter(|w| w.level >= 0.6).count(),
        mean(&|w| w.delta),
        mean(&|w| w.ci.0),
        mean(&|w| w.ci.1),
    );
}

/// The full windows: after the first (warm-up: the engines start empty) and with at least
/// `min_samples` points per side (the last window holds only the requests finishing after the
/// scenario's end).
fn full(r: &Run) -> Vec<&Cmp> {
    r.windows.iter().skip(1).filter(|w| w.n_baseline.min(w.n_candidate) >= 30).collect()
}

/// Every full window compares mirrored pairs: the request ids made it from the spans through
/// llm_signals to delta_ab, on both instances.
fn assert_paired(name: &str, r: &Run, min_full: usize) {
    assert_eq!(r.late, 0, "{name}: no per-request point may arrive late at delta_ab");
    let counts: Vec<usize> = r.ttft_points.values().copied().collect();
    assert_eq!(counts.len(), 2, "{name}: two instances: {:?}", r.ttft_points);
    assert!(counts.iter().all(|&c| c == counts[0] && c > 0), "{name}: mirrored spans on both: {counts:?}");
    assert_eq!(r.ids, counts[0], "{name}: one id per mirrored request");
    let full = full(r);
    assert!(full.len() >= min_full, "{name}: {} full windows", full.len());
    for w in full {
        assert_eq!(w.mode, "paired", "{name}: {w:?}");
        assert!(w.n_pairs as f64 >= 0.95 * w.n_baseline.min(w.n_candidate) as f64, "{name}: {w:?}");
    }
}

#[tokio::test]
async fn healthy_ab_control_is_never_a_regression() {
    // Both instances run v1, so the two sides are told apart by instance.
    let r = run(&sampled("healthy_ab_control"), delta_cfg("service.instance.id", "sim-a", "sim-b")).await;
    report("healthy_ab_control", &r);
    assert_paired("healthy_ab_control", &r, 34);
    for w in &r.windows {
        assert!(w.level < 0.6, "A/A: {w:?}");
    }
    for w in full(&r) {
        // Identical engines on identical requests: every pair is equal, so Δ and its CI are 0.
        assert_eq!((w.delta, w.ci), (0.0, (0.0, 0.0)), "{w:?}");
        assert_eq!(w.verdict, "steady", "{w:?}");
    }
}

/// The library's 5 ms scenario: its Δ TTFT p95 over 6 h is +5.43 ms (ground truth), just above
/// the 5 ms threshold, and one 10 min window's Δ varies by about ±10 ms, so `delta_ab` cannot
/// call a window a regression with confidence (it did in 1 of 35 full windows) — nor may it call
/// any window steady: B is slower. What must hold: every window paired, no false "steady", and
/// the windows' Δ averaging near the ground truth.
#[tokio::test]
async fn ab_regression_5ms_is_paired_never_steady_and_centred_on_the_truth() {
    let r = run(&sampled("ab_regression_5ms"), delta_cfg("service.version", "v1", "v2")).await;
    report("ab_regression_5ms", &r);
    assert_paired("ab_regression_5ms", &r, 34);
    let full = full(&r);
    for w in &full {
        assert_ne!(w.verdict, "steady", "B is 5.4 ms slower at p95: {w:?}");
    }
    let mean = full.iter().map(|w| w.delta).sum::<f64>() / full.len() as f64;
    assert!((2.0..9.0).contains(&mean), "mean Δ {mean} ms, ground truth +5.43 ms");
}

/// A shorter copy with a stronger regression (Δ TTFT p95 +38.5 ms) and more spans: flagged in
/// most windows.
#[tokio::test]
async fn strong_ab_regression_is_flagged_in_most_windows() {
    let r = run(&fixture("ab_regression_strong"), delta_cfg("service.version", "v1", "v2")).await;
    report("ab_regression_strong", &r);
    assert_paired("ab_regression_strong", &r, 11);
    let full = full(&r);
    let flagged = full.iter().filter(|w| w.level >= 0.8 && w.verdict == "regression").count();
    assert!(4 * flagged >= 3 * full.len(), "regression in {flagged} of {} windows", full.len());
    assert!(full.iter().all(|w| w.verdict != "steady"), "no window may look steady");
}

/// `delta_cfg` with a look-back.
fn with_lookback(mut cfg: serde_json::Value, lookback: &str) -> serde_json::Value {
    cfg["lookback"] = json!(lookback);
    cfg
}

/// The library scenario `name`, which writes every request as a span (`span_sample: 1.0`).
fn every_request_traced(name: &str) -> PathBuf {
    let path = library(name);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("span_sample: 1.0 }"), "{name}: the library traces every request");
    path
}

/// A copy of library scenario `name` with 10 % of the requests written as spans (`span_sample:
/// 0.1` instead of 1.0), the sampling a busy service would use. The sampling is a hash of the
/// request id, so the traffic and the engines' timings are those of the library scenario.
fn sampled(name: &str) -> PathBuf {
    let text = std::fs::read_to_string(every_request_traced(name)).unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}_10pct_spans.yaml"));
    std::fs::write(&path, text.replace("span_sample: 1.0 }", "span_sample: 0.1 }")).unwrap();
    path
}

/// One look-back's result on one scenario.
struct Point {
    lookback: &'static str,
    /// Fraction of the full evaluations at level ≥ 0.6.
    warned: f64,
    /// The last full evaluation (the end of the run).
    last: Cmp,
    run: Run,
}

/// Runs each of `lookbacks` on the same spans (10 min windows); prints and returns the curve.
async fn curve(name: &str, lines: &[String], cfg: &serde_json::Value, lookbacks: &[&'static str]) -> Vec<Point> {
    let mut out = Vec::new();
    for &lookback in lookbacks {
        let run = pipeline(lines, with_lookback(cfg.clone(), lookback)).await;
        let full = full(&run);
        let warned = full.iter().filter(|w| w.level >= 0.6).count();
        let last = (*full.last().unwrap()).clone();
        println!(
            "{name} lookback {lookback}: level ≥ 0.6 in {warned} of {} evaluations ({:.2}); at the end \
             Δ {:+.2} ms CI [{:+.2}, {:+.2}] over {} pairs, {} s, {} level {:.2}",
            full.len(),
            warned as f64 / full.len() as f64,
            last.delta,
            last.ci.0,
            last.ci.1,
            last.n_pairs,
            last.lookback_s,
            last.verdict,
            last.level,
        );
        out.push(Point { lookback, warned: warned as f64 / full.len() as f64, last, run });
    }
    out
}

/// The library scenario with 10 % of the requests as spans (~2 400 pairs in 6 h) under
/// look-backs of 1 h to 6 h. Pooling narrows the interval (single windows: about [−18, +23] ms)
/// and centres Δ on the ground truth, but Δ p95 over 2 400 pairs still has a standard error of
/// about 4 ms (the per-request A−B difference has a spread of 18 ms), so even 6 h ends
/// inconclusive without significance: the regression needs more traced requests (next test).
#[tokio::test]
#[ignore = "slow in a debug build (simulates 6 h of mirrored traffic several times); the release e2e test tests/e2e/test_eval.py checks the same verdicts through `inferwatch eval`; run with --ignored"]
async fn ab_regression_5ms_sampled_lookback_narrows_the_interval_around_the_truth() {
    let lines = simulate(&sampled("ab_regression_5ms"));
    let cfg = delta_cfg("service.version", "v1", "v2");
    let single = full(&pipeline(&lines, cfg.clone()).await).iter().map(|w| w.ci.1 - w.ci.0).sum::<f64>() / 35.0;
    let curve = curve("ab_regression_5ms (10 % traced)", &lines, &cfg, &["1h", "2h", "3h", "6h"]).await;
    for p in &curve {
        assert_paired("ab_regression_5ms lookback", &p.run, 34);
        assert!(full(&p.run).iter().all(|w| w.verdict != "steady"), "{}: B is slower, never steady", p.lookback);
    }
    let six = &curve[3].last;
    assert_eq!(six.lookback_s, 6.0 * 3600.0);
    assert!((six.delta - 5.43).abs() < 1.5, "Δ over 6 h near the ground truth +5.43 ms: {six:?}");
    assert!(2.0 * (six.ci.1 - six.ci.0) < single, "6 h: {six:?}, mean single-window CI width {single:.1} ms");
}

/// Canary-style accumulation on the same traffic with every request traced (~25 000 pairs in 6 h):
/// 10 min windows, each judging the pooled mirrored pairs of the last 6 h. By the end of the run the
/// estimate is beyond 5 ms and its interval excludes 0: a warning (level ≥ 0.6) that no single
/// window gives.
#[tokio::test]
#[ignore = "slow in a debug build (simulates 6 h of mirrored traffic several times); the release e2e test tests/e2e/test_eval.py checks the same verdicts through `inferwatch eval`; run with --ignored"]
async fn ab_regression_5ms_every_request_traced_is_flagged_with_a_6h_lookback() {
    let lines = simulate(&every_request_traced("ab_regression_5ms"));
    let cfg = delta_cfg("service.version", "v1", "v2");
    let curve = curve("ab_regression_5ms (all traced)", &lines, &cfg, &["6h"]).await;
    let six = &curve[0];
    report("ab_regression_5ms (all traced, lookback 6h)", &six.run);
    assert_paired("ab_regression_5ms all traced", &six.run, 34);
    let last = &six.last;
    assert!(last.level >= 0.6, "flagged by the end: {last:?}");
    assert!(last.delta > 5.0 && last.ci.0 > 0.0, "{last:?}");
    assert_eq!(last.lookback_s, 6.0 * 3600.0);
    assert!(full(&six.run).iter().all(|w| w.verdict != "steady"), "B is slower: never steady");
}

/// The A/A control with 10 % of its requests traced, under every look-back of the curve: never a
/// warning (with every request traced: the on-demand test below).
#[tokio::test]
#[ignore = "slow in a debug build (simulates 6 h of mirrored traffic several times); the release e2e test tests/e2e/test_eval.py checks the same verdicts through `inferwatch eval`; run with --ignored"]
async fn healthy_ab_control_never_warns_under_any_lookback() {
    let cfg = delta_cfg("service.instance.id", "sim-a", "sim-b");
    let lines = simulate(&sampled("healthy_ab_control"));
    assert_never_warns("healthy_ab_control (10 % traced)", &lines, &cfg, &["1h", "2h", "3h", "6h"]).await;
}

async fn assert_never_warns(name: &str, lines: &[String], cfg: &serde_json::Value, lookbacks: &[&'static str]) {
    for p in curve(name, lines, cfg, lookbacks).await {
        assert_paired(name, &p.run, 34);
        assert_eq!(p.warned, 0.0, "{name} lookback {}", p.lookback);
        assert!(p.run.windows.iter().all(|w| w.level < 0.6), "{name} lookback {}", p.lookback);
        assert_eq!((p.last.delta, p.last.verdict.as_str()), (0.0, "steady"), "{name}: {:?}", p.last);
    }
}

/// The look-back curve with every request traced, and the A/A control traced alike (about 4 min in a
/// debug build, so run on demand:
/// `cargo test -p inferwatch-processors --test ab_scenario -- --ignored --nocapture`). Measured: the
/// fraction of evaluations at level ≥ 0.6 is 0.44 / 0.56 / 0.56 / 0.50 for 1 / 2 / 3 / 6 h, and the
/// run ends flagged from 2 h on (2 h: CI low +0.26 ms, barely; 3 h: +2.15 ms; 6 h: +3.64 ms).
#[tokio::test]
#[ignore = "measurement: ~4 min in a debug build"]
async fn ab_regression_5ms_every_request_traced_lookback_curve() {
    let lines = simulate(&every_request_traced("ab_regression_5ms"));
    let cfg = delta_cfg("service.version", "v1", "v2");
    let curve = curve("ab_regression_5ms (all traced)", &lines, &cfg, &["1h", "2h", "3h", "6h"]).await;
    assert!(curve[0].last.level < 0.6, "1 h ends unflagged: {:?}", curve[0].last);
    for p in &curve[1..] {
        assert!(p.last.level >= 0.6, "{} ends flagged: {:?}", p.lookback, p.last);
    }
    let control = simulate(&every_request_traced("healthy_ab_control"));
    let cfg = delta_cfg("service.instance.id", "sim-a", "sim-b");
    assert_never_warns("healthy_ab_control (all traced)", &control, &cfg, &["1h", "2h", "3h", "6h"]).await;
}

/// `delta_ab` with `baseline` and `candidate` left empty (automatic pairing, as in the default
/// pipeline): on the mirrored strong-regression fixture it finds the pair v1 → v2 by itself and
/// gives exactly the comparisons of the explicit configuration.
#[tokio::test]
async fn automatic_pairing_gives_the_explicit_comparisons() {
    let lines = simulate(&fixture("ab_regression_strong"));
    let explicit = pipeline(&lines, delta_cfg("service.version", "v1", "v2")).await;
    let mut auto = delta_cfg("service.version", "", "");
    auto.as_object_mut().unwrap().retain(|k, _| k != "baseline" && k != "candidate");
    let auto = pipeline(&lines, auto).await;
    assert!(!explicit.windows.is_empty());
    // The explicit run compares from the first window; the automatic one once both versions were
    // seen (here: the first window too).
    assert_eq!(format!("{:?}", auto.windows), format!("{:?}", explicit.windows));
}
