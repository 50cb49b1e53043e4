//! `delta_ab` driven through the ArrowProcessor trait with batches from `metrics::to_batch`.

use inferwatch_core::arrow::{ArrowProcessorFactory, metrics};
use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, PathSeg, ProcessorFactory};
use inferwatch_core::pdata::Payload;
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use inferwatch_core::state::{seal, unseal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::alerts::AlertsFactory;
use inferwatch_processors::delta_ab::stats::{XorShift, quantile_sorted};
use inferwatch_processors::delta_ab::{DeltaAbFactory, STATE_VERSION};
use inferwatch_testkit::attrs::strings;
use inferwatch_testkit::harness::{Harness, Sink};
use inferwatch_testkit::otlp::{self, GaugePoint, gauge, gauge_points, kv, point, scope};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric;
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
/// A 10-minute window boundary in 2023.
const BASE: u64 = 1_700_000_400 * S;
const WINDOW: u64 = 600 * S;
const METRIC: &str = "llm.request.ttft";

/// One input point.
#[derive(Clone, Debug)]
struct P {
    version: &'static str,
    model: &'static str,
    /// Request id (none: unpaired).
    id: Option<String>,
    time: u64,
    value: f64,
}

/// A request: one resource per point (service.version = the point's version), metric METRIC
/// (another metric name for `other`), gauges.
fn request(points: &[P], metric_name: &str) -> ExportMetricsServiceRequest {
    let resource_metrics = points
        .iter()
        .map(|p| {
            let mut attributes = vec![kv("gen_ai.request.model", p.model)];
            if let Some(id) = &p.id {
                attributes.push(kv("gen_ai.request.id", id));
            }
            let instance = if p.version == "B" { "sim-b" } else { "sim-a" };
            otlp::resource_metrics(
                vec![kv("service.name", "vllm"), kv("service.version", p.version), kv("service.instance.id", instance)],
                scope("bench", ""),
                vec![gauge(metric_name, "s", vec![point(attributes, p.time, p.value)])],
            )
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

/// One output point: name, time, value, point attributes as strings, resource attributes.
type Out = GaugePoint;

/// The kit's harness on this file's points.
trait DeltaAb {
    fn new(cfg: serde_json::Value) -> Self;
    fn process(&mut self, points: &[P]);
    fn process_metric(&mut self, points: &[P], name: &str);
    fn advance(&mut self, watermark: u64) -> Vec<Out>;
}

impl DeltaAb for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::create(&DeltaAbFactory, "delta_ab/test", &cfg, Signal::Metrics)
    }

    fn process(&mut self, points: &[P]) {
        self.process_metric(points, METRIC);
    }

    fn process_metric(&mut self, points: &[P], name: &str) {
        assert!(self.process_metrics(&request(points, name)).is_empty(), "delta_ab emits only on advance");
    }

    fn advance(&mut self, watermark: u64) -> Vec<Out> {
        self.advance_one(watermark).iter().flat_map(gauge_points).collect()
    }
}

fn cfg() -> serde_json::Value {
    json!({"metric": METRIC, "baseline": "A", "candidate": "B"})
}

/// A standard normal variate (Box-Muller).
fn normal(rng: &mut XorShift) -> f64 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `n` lognormal latencies (median 120 ms, σ 0.5), in seconds.
fn lognormal(seed: u64, n: usize) -> Vec<f64> {
    let mut rng = XorShift::new(seed);
    (0..n).map(|_| 0.120 * (0.5 * normal(&mut rng)).exp()).collect()
}

/// Points of `version` for window `w` (0-based from BASE), spread over the window.
fn points(version: &'static str, w: u64, values: &[f64], ids: bool) -> Vec<P> {
    let n = values.len() as u64;
    values
        .iter()
        .enumerate()
        .map(|(i, &value)| P {
            version,
            model: "llama",
            id: ids.then(|| format!("req-{w}-{i}")),
            time: BASE + w * WINDOW + (i as u64) * (WINDOW / n.max(1)),
            value,
        })
        .collect()
}

fn level_and_score(out: &[Out]) -> (f64, f64) {
    assert_eq!(out.len(), 2, "one score and one level: {out:#?}");
    assert_eq!(out[0].name, "llm.anomaly.score");
    assert_eq!(out[1].name, "llm.anomaly.level");
    (out[1].value, out[0].value)
}

#[test]
fn delta_ab_flags_a_5ms_p95_regression_on_mirrored_traffic() {
    let a = lognormal(1, 500);
    let b: Vec<f64> = a.iter().map(|x| x + 0.0055).collect();
    let mut h = Harness::new(cfg());
    h.process(&points("A", 0, &a, true));
    h.process(&points("B", 0, &b, true));
    assert!(h.advance(BASE + WINDOW - 1).is_empty(), "the window is still open");
    let out = h.advance(BASE + WINDOW);
    let (level, score) = level_and_score(&out);
    let o = &out[0];
    assert_eq!(o.time, BASE + WINDOW, "output at the window end");
    assert_eq!(o.attr("detector"), "delta_ab");
    assert_eq!(o.attr("metric"), METRIC);
    assert_eq!(o.attr("gen_ai.request.model"), "llama");
    assert_eq!(o.resource.get("service.version").map(String::as_str), Some("B"), "the candidate's resource");
    assert_eq!(o.attr("delta_ab.verdict"), "regression");
    assert_eq!(o.attr("delta_ab.mode"), "paired");
    assert_eq!(
        (o.num("delta_ab.n_baseline"), o.num("delta_ab.n_candidate"), o.num("delta_ab.n_pairs")),
        (500.0, 500.0, 500.0)
    );
    assert_eq!((o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate")), ("A", "B"));
    assert_eq!(o.num("delta_ab.threshold"), 5.0);
    assert!(!o.attrs.contains_key("delta_ab.live_versions"), "explicit pairing: the attributes as before");
    assert!((score - 5.5).abs() < 1e-6, "Δp95 = 5.5 ms, got {score}");
    assert!(o.num("delta_ab.ci_low") > 5.0 && o.num("delta_ab.ci_high") < 6.0, "{o:?}");
    let mut sorted = a.clone();
    sorted.sort_by(f64::total_cmp);
    let p95 = quantile_sorted(&sorted, 0.95).unwrap();
    assert!((o.num("delta_ab.value_baseline") - p95).abs() < 1e-12);
    assert!((o.num("delta_ab.delta_rel") - 0.0055 / p95).abs() < 1e-9);
    assert!((0.8..=1.0).contains(&level) && (level - (0.8 + 0.2 * 0.5 / 5.0)).abs() < 1e-6, "level {level}");

    // The same values without request ids: independent samples of that spread cannot show a
    // 5 ms difference, and the detector says so instead of calling it a regression.
    let mut unpaired = Harness::new(cfg());
    unpaired.process(&points("A", 0, &a, false));
    unpaired.process(&points("B", 0, &b, false));
    let out = unpaired.advance(BASE + WINDOW);
    assert_eq!(out[0].attr("delta_ab.mode"), "window");
    assert_eq!(out[0].attr("delta_ab.verdict"), "inconclusive");
    assert!(out[0].num("delta_ab.ci_high") - out[0].num("delta_ab.ci_low") > 10.0);
}

#[test]
fn delta_ab_a_a_pair_is_never_a_regression() {
    let mut h = Harness::new(cfg());
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    let mut warnings = 0;
    for w in 0..50u64 {
        h.process(&points("A", w, &lognormal(1000 + w, 500), false));
        h.process(&points("B", w, &lognormal(5000 + w, 500), false));
        let out = h.advance(BASE + (w + 1) * WINDOW);
        let (level, _) = level_and_score(&out);
        assert!(level < 0.8, "window {w}: {out:?}");
        warnings += usize::from(level >= 0.6);
        *verdicts.entry(out[0].attr("delta_ab.verdict").to_string()).or_default() += 1;
    }
    assert!(!verdicts.contains_key("regression"), "{verdicts:?}");
    assert_eq!(verdicts.values().sum::<usize>(), 50, "one comparison per window");
    assert!(warnings <= 3, "at most a few warnings in 50 A/A windows: {warnings}, {verdicts:?}");
}

#[test]
fn delta_ab_twenty_samples_are_inconclusive_however_large_the_delta() {
    let a = lognormal(7, 20);
    let b: Vec<f64> = a.iter().map(|x| x + 0.5).collect();
    let mut h = Harness::new(cfg());
    h.process(&points("A", 0, &a, true));
    h.process(&points("B", 0, &b, true));
    let out = h.advance(BASE + WINDOW);
    let (level, score) = level_and_score(&out);
    assert!((score - 500.0).abs() < 1e-6, "Δ is still reported: {score}");
    assert_eq!(level, 0.0);
    assert_eq!(out[0].attr("delta_ab.verdict"), "inconclusive");
    assert_eq!(out[0].num("delta_ab.n_baseline"), 20.0);
    assert_eq!(out[0].attr("delta_ab.mode"), "window", "20 pairs are fewer than min_samples");
}

#[test]
fn delta_ab_throughput_loss_of_ten_percent_is_a_regression() {
    let mut rng = XorShift::new(3);
    let a: Vec<f64> = (0..200).map(|_| 1000.0 * (1.0 + 0.03 * normal(&mut rng))).collect();
    let b: Vec<f64> = (0..200).map(|_| 900.0 * (1.0 + 0.03 * normal(&mut rng))).collect();
    let mut h = Harness::new(json!({
        "metric": METRIC, "baseline": "A", "candidate": "B", "kind": "throughput", "statistic": "mean"
    }));
    h.process(&points("A", 0, &a, false));
    h.process(&points("B", 0, &b, false));
    let out = h.advance(BASE + WINDOW);
    let (level, score) = level_and_score(&out);
    let want = (b.iter().sum::<f64>() / 200.0 - a.iter().sum::<f64>() / 200.0) / (a.iter().sum::<f64>() / 200.0);
    assert!((score - want).abs() < 1e-9 && (score + 0.1).abs() < 0.01, "{score} vs {want}");
    assert_eq!(out[0].attr("delta_ab.verdict"), "regression");
    assert!(out[0].num("delta_ab.ci_high") < -0.08);
    assert!((0.8..=1.0).contains(&level));
    assert_eq!(out[0].num("delta_ab.threshold"), -0.08);

    // A 5 % loss stays above the −8 % threshold: steady.
    let c: Vec<f64> = a.iter().map(|x| x * 0.95).collect();
    let mut h = Harness::new(json!({
        "metric": METRIC, "baseline": "A", "candidate": "B", "kind": "throughput", "statistic": "mean"
    }));
    h.process(&points("A", 0, &a, false));
    h.process(&points("B", 0, &c, false));
    let out = h.advance(BASE + WINDOW);
    assert_eq!(out[0].attr("delta_ab.verdict"), "steady");
    assert_eq!(out[1].value, 0.0);
}

/// Replays `steps` (points, watermark after them) and returns every output.
fn run(h: &mut Harness, steps: &[(Vec<P>, u64)]) -> Vec<Out> {
    let mut out = Vec::new();
    for (pts, wm) in steps {
        h.process(pts);
        out.extend(h.advance(*wm));
    }
    out
}

/// Three models over five windows (m0 paired, m2 only in windows 0 and 1), one batch per model and
/// version, the watermark at the window's end after its last batch.
fn script() -> Vec<(Vec<P>, u64)> {
    let models = ["m0", "m1", "m2"];
    let mut steps = Vec::new();
    for w in 0..5u64 {
        for (k, m) in models.iter().enumerate() {
            if k == 2 && w > 1 {
                continue;
            }
            let a = lognormal(w * 10 + k as u64, 60);
            let b: Vec<f64> = a.iter().map(|x| x + 0.002 * k as f64).collect();
            let mut pa = points("A", w, &a, k == 0);
            let mut pb = points("B", w, &b, k == 0);
            for p in pa.iter_mut().chain(pb.iter_mut()) {
                p.model = m;
            }
            steps.push((pa, BASE + w * WINDOW));
            steps.push((pb, BASE + w * WINDOW));
        }
        // The window closes after its last batch.
        if let Some(last) = steps.last_mut() {
            last.1 = BASE + (w + 1) * WINDOW;
        }
    }
    // Long after the last point: every group is idle.
    steps.push((Vec::new(), BASE + 8 * WINDOW));
    steps
}

#[test]
fn delta_ab_same_input_gives_identical_output_and_order_does_not_matter() {
    let steps = script();
    let first = run(&mut Harness::new(cfg()), &steps);
    let second = run(&mut Harness::new(cfg()), &steps);
    assert!(first.len() >= 20, "{}", first.len());
    assert_eq!(first, second, "fixed seeds: the same output twice");
    // The same points of one window in reverse order and another batching: the same comparison.
    let a = lognormal(11, 300);
    let b = lognormal(12, 300);
    let mut h1 = Harness::new(cfg());
    h1.process(&points("A", 0, &a, false));
    h1.process(&points("B", 0, &b, false));
    let mut h2 = Harness::new(cfg());
    let mut all: Vec<P> = points("B", 0, &b, false).into_iter().chain(points("A", 0, &a, false)).collect();
    all.reverse();
    for chunk in all.chunks(77) {
        h2.process(chunk);
    }
    assert_eq!(h1.advance(BASE + WINDOW), h2.advance(BASE + WINDOW));
}

#[test]
fn delta_ab_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"metric": METRIC, "baseline": "A", "candidate": "B", "idle_timeout": "15m", "max_series": 2});
    let steps = script();
    let mut whole = Harness::new(cfg.clone());
    let want = run(&mut whole, &steps);
    assert!(whole.evicted("idle") > 0 && whole.evicted("max_series") > 0, "the script must evict");
    for cut in [1, 4, 9] {
        let mut first = Harness::new(cfg.clone());
        let mut got = run(&mut first, &steps[..cut]);
        assert_eq!(first.proc.state_version(), 5, "version 5: replicas and warm-up per window and version");
        let mut second = first.restore_into(Harness::new(cfg.clone()));
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
    }
    let mut other_window = Harness::new(json!({"metric": METRIC, "baseline": "A", "candidate": "B", "window": "5m"}));
    let bytes = whole.proc.snapshot().unwrap();
    assert!(matches!(other_window.proc.restore(&bytes), Err(StateError::Corrupt { .. })));
    assert!(matches!(other_window.proc.restore(b"garbage"), Err(StateError::Corrupt { .. })));
}

#[test]
fn delta_ab_reads_versions_from_point_attributes_and_groups_by_model() {
    // Version as a point attribute on an unrelated resource; two models; another metric and a third
    // version are ignored.
    let mut h = Harness::new(json!({
        "metric": METRIC, "baseline": "v1", "candidate": "v2", "version_attribute": "deploy.version",
        "min_samples": 2, "resamples": 50
    }));
    let mut req = ExportMetricsServiceRequest::default();
    for (model, version, value) in
        [("x", "v1", 0.1), ("x", "v1", 0.1), ("x", "v2", 0.2), ("x", "v2", 0.2), ("y", "v2", 0.3), ("x", "v3", 9.0)]
    {
        let mut r = request(&[P { version: "ignored", model, id: None, time: BASE + S, value }], METRIC);
        let point = match &mut r.resource_metrics[0].scope_metrics[0].metrics[0].data {
            Some(metric::Data::Gauge(g)) => &mut g.data_points[0],
            _ => unreachable!(),
        };
        point.attributes.push(kv("deploy.version", version));
        req.resource_metrics.extend(r.resource_metrics);
    }
    let mut out = Vec::new();
    h.proc.process(&metrics::to_batch(&req).unwrap(), &mut out).unwrap();
    h.process_metric(&points("v2", 0, &[5.0; 40], false), "other.metric");
    let out = h.advance(BASE + WINDOW);
    let by_model: BTreeMap<String, &Out> = out
        .iter()
        .filter(|o| o.name == "llm.anomaly.score")
        .map(|o| (o.attr("gen_ai.request.model").to_string(), o))
        .collect();
    assert_eq!(by_model.len(), 2, "{out:#?}");
    let x = by_model["x"];
    assert!((x.value - 100.0).abs() < 1e-9, "0.2 s − 0.1 s = 100 ms: {x:?}");
    assert_eq!((x.num("delta_ab.n_baseline"), x.num("delta_ab.n_candidate")), (2.0, 2.0));
    assert_eq!(x.attr("delta_ab.verdict"), "regression");
    let y = by_model["y"];
    assert_eq!((y.value, y.attr("delta_ab.verdict")), (0.0, "inconclusive"), "no baseline: {y:?}");
    assert!(!y.attrs.contains_key("delta_ab.ci_low"));
}

#[test]
fn delta_ab_config_errors_name_the_key() {
    let f = DeltaAbFactory;
    assert_eq!(f.type_name(), "delta_ab");
    assert_eq!(f.signals(), &[Signal::Metrics]);
    assert!(f.arrow().is_some());
    assert!(f.validate(&cfg()).is_ok());
    assert!(f.validate(&json!({"metric": METRIC, "baseline": "A", "candidate": "B", "lookback": "168h"})).is_ok());
    let key = |k: &str| PathSeg::Key(k.into());
    let with = |extra: serde_json::Value| {
        let mut c = cfg();
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    for (c, path) in [
        (json!({}), vec![key("metric")]),
        (json!({"metric": METRIC, "candidate": "B"}), vec![key("baseline")]),
        (json!({"metric": METRIC, "baseline": "A"}), vec![key("candidate")]),
        (with(json!({"live_within": "1h"})), vec![key("live_within")]),
        (with(json!({"max_versions": 4})), vec![key("max_versions")]),
        (json!({"metric": METRIC, "live_within": "5m"}), vec![key("live_within")]),
        (json!({"metric": METRIC, "max_versions": 1}), vec![key("max_versions")]),
        (with(json!({"candidate": "A"})), vec![key("candidate")]),
        (with(json!({"statistic": "p42"})), vec![key("statistic")]),
        (with(json!({"kind": "speed"})), vec![key("kind")]),
        (with(json!({"window": "0s"})), vec![key("window")]),
        (with(json!({"min_samples": 1})), vec![key("min_samples")]),
        (with(json!({"confidence": 1.0})), vec![key("confidence")]),
        (with(json!({"resamples": 5})), vec![key("resamples")]),
        (with(json!({"thresholds": {"latency_ms": -1.0}})), vec![key("thresholds"), key("latency_ms")]),
        (with(json!({"thresholds": {"throughput_rel": 0.1}})), vec![key("thresholds"), key("throughput_rel")]),
        (with(json!({"thresholds": {"speed": 1}})), vec![key("thresholds"), key("speed")]),
        (with(json!({"group_by": ["a", ""]})), vec![key("group_by"), PathSeg::Index(1)]),
        (with(json!({"max_samples": 10})), vec![key("max_samples")]),
        (with(json!({"max_series": 0})), vec![key("max_series")]),
        (with(json!({"lookback": "15m"})), vec![key("lookback")]),
        (with(json!({"lookback": "0s"})), vec![key("lookback")]),
        (with(json!({"lookback": "169h"})), vec![key("lookback")]),
        (with(json!({"max_points": 9999})), vec![key("max_points")]),
    ] {
        let e = f.validate(&c).unwrap_err();
        assert_eq!(e.path, path, "{c}: {}", e.message);
    }
    let ctx = CreateContext::new(ComponentId::parse("delta_ab").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create_arrow(ctx, &cfg(), Signal::Traces).is_err());
}

/// The brute-force statistic: sort, then interpolate between closest ranks (or the plain mean).
fn brute(stat: &str, values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let q = match stat {
        "p50" => 0.5,
        "p95" => 0.95,
        "p99" => 0.99,
        _ => return v.iter().sum::<f64>() / v.len() as f64,
    };
    let h = q * (v.len() - 1) as f64;
    let lo = h.floor() as usize;
    match v.get(lo + 1) {
        Some(hi) => v[lo] + (h - lo as f64) * (hi - v[lo]),
        None => v[lo],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn delta_ab_delta_is_the_brute_force_statistic_difference(
        a in prop::collection::vec(0.0f64..10.0, 1..80),
        b in prop::collection::vec(0.0f64..10.0, 1..80),
        stat in prop::sample::select(vec!["p50", "p95", "p99", "mean"]),
        kind in prop::sample::select(vec!["latency", "throughput", "quality"]),
    ) {
        let mut h = Harness::new(json!({
            "metric": METRIC, "baseline": "A", "candidate": "B", "statistic": stat, "kind": kind,
            "resamples": 20, "min_samples": 2, "max_samples": 100
        }));
        h.process(&points("A", 0, &a, false));
        h.process(&points("B", 0, &b, false));
        let out = h.advance(BASE + WINDOW);
        let (sa, sb) = (brute(stat, &a), brute(stat, &b));
        let want = if kind == "latency" { (sb - sa) * 1000.0 } else { (sb - sa) / sa.abs().max(1e-6) };
        let got = out[0].value;
        prop_assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{got} vs {want}");
        prop_assert!(out[0].num("delta_ab.ci_low") <= out[0].num("delta_ab.ci_high"));
    }
}

fn lookback_cfg(lookback: &str) -> serde_json::Value {
    json!({"metric": METRIC, "baseline": "A", "candidate": "B", "lookback": lookback})
}

/// The comparison part of an output: without `delta_ab.lookback_s` (the one attribute a look-back
/// changes by itself) and the resource (the group's, from its first candidate point ever, which
/// may lie before the look-back).
fn comparison(out: &[Out]) -> Vec<Out> {
    out.iter()
        .cloned()
        .map(|mut o| {
            o.attrs.remove("delta_ab.lookback_s");
            o.resource.clear();
            o
        })
        .collect()
}

#[test]
fn delta_ab_lookback_pairs_a_request_across_a_window_boundary() {
    // 60 mirrored requests: the A copy at the end of window 0, the B copy (6 ms slower) just after
    // the boundary, in window 1.
    let a = lognormal(21, 60);
    let pa: Vec<P> = (0..60)
        .map(|i| P {
            version: "A",
            model: "llama",
            id: Some(format!("r{i}")),
            time: BASE + WINDOW - 60 * S + i * S,
            value: a[i as usize],
        })
        .collect();
    let pb: Vec<P> = (0..60)
        .map(|i| P {
            version: "B",
            model: "llama",
            id: Some(format!("r{i}")),
            time: BASE + WINDOW + i * S,
            value: a[i as usize] + 0.006,
        })
        .collect();
    let outputs = |cfg: serde_json::Value| {
        let mut h = Harness::new(cfg);
        h.process(&pa);
        h.process(&pb);
        let w0 = h.advance(BASE + WINDOW);
        let w1 = h.advance(BASE + 2 * WINDOW);
        (w0, w1)
    };
    // Each window on its own: window 1 has no baseline point, nothing pairs.
    let (_, alone) = outputs(cfg());
    assert_eq!(alone[0].attr("delta_ab.mode"), "window");
    assert_eq!(alone[0].attr("delta_ab.verdict"), "inconclusive");
    assert_eq!(alone[0].num("delta_ab.n_baseline"), 0.0);
    assert_eq!(alone[0].num("delta_ab.lookback_s"), 600.0);
    // A 20-minute look-back: window 1 pairs the copies of window 0 and window 1.
    let (w0, w1) = outputs(lookback_cfg("20m"));
    assert_eq!(w0[0].num("delta_ab.n_candidate"), 0.0, "window 0 has only the A copies");
    let (level, score) = level_and_score(&w1);
    assert_eq!(w1[0].time, BASE + 2 * WINDOW);
    assert_eq!(w1[0].attr("delta_ab.mode"), "paired");
    assert_eq!((w1[0].num("delta_ab.n_pairs"), w1[0].num("delta_ab.n_baseline")), (60.0, 60.0));
    assert!((score - 6.0).abs() < 1e-6, "every pair is 6 ms apart: {score}");
    assert_eq!(w1[0].attr("delta_ab.verdict"), "regression");
    assert!(level >= 0.8, "{level}");
    assert_eq!(w1[0].num("delta_ab.lookback_s"), 1200.0);
    assert_eq!(w1[0].num("delta_ab.window_s"), 600.0);
}

#[test]
fn delta_ab_lookback_is_capped_by_max_points() {
    let mut h = Harness::new(json!({
        "metric": METRIC, "baseline": "A", "candidate": "B", "lookback": "1h",
        "max_samples": 50, "max_points": 120
    }));
    let mut last = Vec::new();
    for w in 0..4u64 {
        h.process(&points("A", w, &lognormal(100 + w, 50), false));
        h.process(&points("B", w, &lognormal(200 + w, 50), false));
        last = h.advance(BASE + (w + 1) * WINDOW);
    }
    // 50 values per version and window, at most 120 over the look-back: two windows, not four.
    let o = &last[0];
    assert_eq!((o.num("delta_ab.n_baseline"), o.num("delta_ab.n_candidate")), (100.0, 100.0));
    assert_eq!(o.num("delta_ab.lookback_s"), 1200.0, "the span actually used");
    // The same as a 20-minute look-back, which uses the same two windows.
    let mut h20 = Harness::new(lookback_cfg("20m"));
    let mut last20 = Vec::new();
    for w in 0..4u64 {
        h20.process(&points("A", w, &lognormal(100 + w, 50), false));
        h20.process(&points("B", w, &lognormal(200 + w, 50), false));
        last20 = h20.advance(BASE + (w + 1) * WINDOW);
    }
    assert_eq!(last, last20);
}

#[test]
fn delta_ab_lookback_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({
        "metric": METRIC, "baseline": "A", "candidate": "B", "lookback": "30m", "idle_timeout": "15m"
    });
    let steps = script();
    let mut whole = Harness::new(cfg.clone());
    let want = run(&mut whole, &steps);
    assert!(
        want.iter().any(|o| o.name == "llm.anomaly.level" && o.num("delta_ab.lookback_s") == 1800.0),
        "some evaluation spans the whole look-back"
    );
    for cut in [3, 6, 9, 12] {
        let mut first = Harness::new(cfg.clone());
        let mut got = run(&mut first, &steps[..cut]);
        let mut second = first.restore_into(Harness::new(cfg.clone()));
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
    }
    // A checkpoint of an earlier state version is refused by the stage's envelope check.
    assert_eq!(STATE_VERSION, 5);
    for v in [1, 2, 3, 4] {
        let old = seal("delta_ab", v, &whole.proc.snapshot().unwrap());
        let msg = unseal("stage/delta_ab", "delta_ab", STATE_VERSION, &old).unwrap_err().to_string();
        assert!(msg.contains(&format!("state version {v}, this build reads 5")), "{msg}");
    }
}

/// One generated window: the (request id, value) points of each version; id None = no id.
type GenWindow = (Vec<(Option<u8>, f64)>, Vec<(Option<u8>, f64)>);

fn gen_points(version: &'static str, pts: &[(Option<u8>, f64)], time: impl Fn(usize) -> u64) -> Vec<P> {
    pts.iter()
        .enumerate()
        .map(|(i, (id, value))| P {
            version,
            model: "llama",
            id: id.map(|x| format!("r{x}")),
            time: time(i),
            value: *value,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// At each window's end, the look-back output equals the single-window computation run on
    /// the concatenation of the last N windows' points (placed in the current window).
    #[test]
    fn delta_ab_lookback_equals_one_window_over_the_concatenated_points(
        n in 1u64..5,
        windows in prop::collection::vec(
            (
                prop::collection::vec((prop::option::weighted(0.8, 0u8..40), 0.0f64..1.0), 0..25),
                prop::collection::vec((prop::option::weighted(0.8, 0u8..40), 0.0f64..1.0), 0..25),
            ),
            1..8,
        ),
        stat in prop::sample::select(vec!["p50", "p95", "mean"]),
    ) {
        let windows: Vec<GenWindow> = windows;
        let common = json!({
            "metric": METRIC, "baseline": "A", "candidate": "B", "statistic": stat, "resamples": 20,
            "min_samples": 4, "max_samples": 1000
        });
        let mut lcfg = common.clone();
        lcfg["lookback"] = json!(format!("{}m", 10 * n));
        let mut h = Harness::new(lcfg);
        let mut evaluations = 0;
        for (w, (a, b)) in windows.iter().enumerate() {
            let w = w as u64;
            let at = |i: usize| BASE + w * WINDOW + i as u64 * S;
            h.process(&gen_points("A", a, at));
            h.process(&gen_points("B", b, at));
            let got = h.advance(BASE + (w + 1) * WINDOW);
            if a.is_empty() && b.is_empty() {
                prop_assert!(got.is_empty(), "no point in window {}: no output", w);
                continue;
            }
            evaluations += 1;
            // Brute force: one window holding the last n windows' points, oldest first.
            let first = (w + 1).saturating_sub(n);
            let mut brute = Harness::new(common.clone());
            let at_now = |i: usize| BASE + w * WINDOW + i as u64;
            let (mut pa, mut pb) = (Vec::new(), Vec::new());
            for (ea, eb) in &windows[first as usize..=w as usize] {
                pa.extend_from_slice(ea);
                pb.extend_from_slice(eb);
            }
            brute.process(&gen_points("A", &pa, at_now));
            brute.process(&gen_points("B", &pb, at_now));
            let want = brute.advance(BASE + (w + 1) * WINDOW);
            prop_assert_eq!(comparison(&got), comparison(&want));
            let oldest = (first..=w).find(|&k| {
                let (ea, eb) = &windows[k as usize];
                !(ea.is_empty() && eb.is_empty())
            }).unwrap();
            prop_assert_eq!(got[0].num("delta_ab.lookback_s"), ((w + 1 - oldest) * 600) as f64);
        }
        prop_assert!(evaluations > 0 || windows.iter().all(|(a, b)| a.is_empty() && b.is_empty()));
    }
}

// ---------------------------------------------------------------------------------------------
// Automatic pairing: `baseline` and `candidate` left empty.

/// The default pipeline's `delta_ab` (fed by `llm_signals` with `per_request: true`).
fn auto_cfg() -> serde_json::Value {
    json!({"metric": METRIC, "statistic": "p95", "window": "10m", "lookback": "3h"})
}

/// Per-request points of `version` in window `w`: distinct request ids per version (independent
/// traffic, nothing pairs) unless `mirrored` (the ids of `points`, shared across versions).
fn requests(version: &'static str, w: u64, values: &[f64], mirrored: bool) -> Vec<P> {
    let mut pts = points(version, w, values, true);
    if !mirrored {
        for p in &mut pts {
            p.id = p.id.take().map(|id| format!("{version}-{id}"));
        }
    }
    pts
}

/// The level points of `out`.
fn levels(out: &[Out]) -> Vec<&Out> {
    out.iter().filter(|o| o.name == "llm.anomaly.level").collect()
}

#[test]
fn delta_ab_default_pipeline_config_validates_in_auto_mode() {
    assert!(DeltaAbFactory.validate(&auto_cfg()).is_ok());
    assert!(DeltaAbFactory.validate(&json!({"metric": METRIC})).is_ok(), "every other key has a default");
    let mut c = auto_cfg();
    c["live_within"] = json!("6h");
    c["max_versions"] = json!(3);
    assert!(DeltaAbFactory.validate(&c).is_ok());
}

#[test]
fn delta_ab_auto_flags_a_40ms_p95_regression_of_the_newer_version() {
    let mut h = Harness::new(auto_cfg());
    let mut evaluations = Vec::new();
    for w in 0..9u64 {
        h.process(&requests("v1", w, &lognormal(100 + w, 300), false));
        if w >= 2 {
            let slower: Vec<f64> = lognormal(500 + w, 300).iter().map(|x| x + 0.040).collect();
            h.process(&requests("v2", w, &slower, false));
        }
        let out = h.advance(BASE + (w + 1) * WINDOW);
        if w < 2 {
            assert!(out.is_empty(), "window {w}: one version, nothing compared: {out:#?}");
        } else {
            evaluations.push(out);
        }
    }
    for out in &evaluations {
        let (_, _) = level_and_score(out);
        let o = &out[1];
        assert_eq!((o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate")), ("v1", "v2"), "the older is A");
        assert_eq!(o.resource.get("service.version").map(String::as_str), Some("v2"), "the candidate's resource");
        assert_eq!(o.attr("delta_ab.live_versions"), "2");
        assert_eq!(o.attr("delta_ab.mode"), "window", "independent requests do not pair");
        assert_eq!(o.attr("gen_ai.request.model"), "llama");
    }
    // The look-back pools v1's history from the start and v2's since it appeared.
    let last = &evaluations[evaluations.len() - 1];
    let (level, score) = level_and_score(last);
    assert_eq!((last[1].num("delta_ab.n_baseline"), last[1].num("delta_ab.n_candidate")), (2700.0, 2100.0));
    assert_eq!(last[1].attr("delta_ab.verdict"), "regression", "{last:#?}");
    assert!(level >= 0.8, "{level}");
    assert!((25.0..60.0).contains(&score), "Δp95 ≈ +40 ms: {score}");
    assert!(last[1].num("delta_ab.ci_low") > 5.0);
    let regressions = evaluations.iter().filter(|o| o[1].attr("delta_ab.verdict") == "regression").count();
    assert!(regressions >= 4, "{regressions} of {} evaluations", evaluations.len());

    // Mirrored traffic (the same request ids on both versions): paired, a regression at once.
    let mut h = Harness::new(auto_cfg());
    let a = lognormal(9, 300);
    let b: Vec<f64> = a.iter().map(|x| x + 0.040).collect();
    h.process(&requests("v1", 0, &a, true));
    h.process(&requests("v2", 0, &b, true));
    let out = h.advance(BASE + WINDOW);
    let (level, score) = level_and_score(&out);
    assert_eq!(out[1].attr("delta_ab.mode"), "paired");
    assert_eq!(out[1].attr("delta_ab.verdict"), "regression");
    assert!((score - 40.0).abs() < 1e-6 && level == 1.0, "{score} {level}");
}

#[test]
fn delta_ab_auto_a_a_versions_stay_quiet() {
    let mut h = Harness::new(auto_cfg());
    let mut compared = 0;
    let mut warnings = 0;
    for w in 0..12u64 {
        h.process(&requests("v1", w, &lognormal(2000 + w, 300), false));
        h.process(&requests("v2", w, &lognormal(3000 + w, 300), false));
        for o in levels(&h.advance(BASE + (w + 1) * WINDOW)) {
            compared += 1;
            assert_eq!((o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate")), ("v1", "v2"));
            assert_ne!(o.attr("delta_ab.verdict"), "regression", "window {w}: {o:?}");
            assert!(o.value < 0.8);
            warnings += usize::from(o.value >= 0.6);
        }
    }
    assert_eq!(compared, 12, "one comparison per window");
    assert_eq!(warnings, 0, "same latency: no warning");
}

#[test]
fn delta_ab_auto_one_version_compares_nothing() {
    let mut h = Harness::new(auto_cfg());
    for w in 0..6u64 {
        h.process(&requests("v1", w, &lognormal(w, 100), false));
        assert!(h.advance(BASE + (w + 1) * WINDOW).is_empty(), "window {w}");
    }
    assert_eq!(h.proc.series_count(), 1, "the group is held, waiting for a second version");
}

/// A rollout: v1 in windows 0..=3, v2 (40 ms slower, mirrored while both run) from window 1 to
/// 12; one step per window, the watermark at its end.
fn rollout() -> Vec<(Vec<P>, u64)> {
    (0..13u64)
        .map(|w| {
            let a = lognormal(700 + w, 200);
            let mut pts = Vec::new();
            if w <= 3 {
                pts.extend(requests("v1", w, &a, true));
            }
            if w >= 1 {
                let b: Vec<f64> = a.iter().map(|x| x + 0.040).collect();
                pts.extend(requests("v2", w, &b, true));
            }
            (pts, BASE + (w + 1) * WINDOW)
        })
        .collect()
}

fn rollout_cfg() -> serde_json::Value {
    json!({"metric": METRIC, "window": "10m", "lookback": "30m"})
}

#[test]
fn delta_ab_auto_rollout_ends_the_comparison_once_the_old_version_is_not_live() {
    let mut h = Harness::new(rollout_cfg());
    let out = run(&mut h, &rollout());
    // (window end in windows, verdict, level) of every level point.
    let got: Vec<(u64, String, f64)> = levels(&out)
        .iter()
        .map(|o| {
            assert_eq!((o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate")), ("v1", "v2"));
            assert_eq!(o.resource.get("service.version").map(String::as_str), Some("v2"), "one alert identity");
            ((o.time - BASE) / WINDOW, o.attr("delta_ab.verdict").to_string(), o.value)
        })
        .collect();
    let verdicts: Vec<(u64, &str)> = got.iter().map(|(t, v, _)| (*t, v.as_str())).collect();
    // live_within defaults to the look-back (30 min): v1's last point is in window 3, so it is
    // live up to the end of window 5 (its look-back still holds v1's points) and not at the end
    // of window 6. The ended pair is named at level 0 for 30 min, then nothing.
    assert_eq!(
        verdicts,
        vec![
            (2, "regression"),
            (3, "regression"),
            (4, "regression"),
            (5, "regression"),
            (6, "regression"),
            (7, "ended"),
            (8, "ended"),
            (9, "ended"),
        ]
    );
    for (t, v, level) in &got {
        assert_eq!(*level == 0.0, v == "ended", "window end {t}: {v} at {level}");
    }
    let ended = levels(&out).into_iter().find(|o| o.attr("delta_ab.verdict") == "ended").unwrap();
    assert_eq!(ended.attr("delta_ab.live_versions"), "1");
    let score = out.iter().find(|o| o.name == "llm.anomaly.score" && o.time == ended.time).unwrap();
    assert_eq!(score.value, 0.0);
    assert_eq!(h.proc.series_count(), 1);
}

#[test]
fn delta_ab_auto_snapshot_restore_keeps_the_version_table() {
    let steps = rollout();
    let mut whole = Harness::new(rollout_cfg());
    let want = run(&mut whole, &steps);
    assert!(levels(&want).iter().any(|o| o.attr("delta_ab.verdict") == "ended"));
    // Before v2, while both are compared, after v1 stopped, while the ended pair is named.
    for cut in [1, 3, 5, 7, 8] {
        let mut first = Harness::new(rollout_cfg());
        let mut got = run(&mut first, &steps[..cut]);
        let mut second = first.restore_into(Harness::new(rollout_cfg()));
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
    }
    // A fresh processor that never saw v1 would not compare: the table is what carries it.
    let mut blind = Harness::new(rollout_cfg());
    let tail = run(&mut blind, &steps[5..]);
    assert!(tail.is_empty(), "{tail:#?}");
}

#[test]
fn delta_ab_auto_three_versions_compare_the_newest_against_the_most_seen() {
    let mut h = Harness::new(json!({"metric": METRIC, "window": "10m", "lookback": "30m", "max_versions": 3}));
    // v1 draining (30 points a window), v2 the main version (300), v3 a new canary from window 2.
    let mut last = Vec::new();
    for w in 0..4u64 {
        h.process(&requests("v1", w, &lognormal(10 + w, 30), false));
        h.process(&requests("v2", w, &lognormal(20 + w, 300), false));
        if w >= 2 {
            h.process(&requests("v3", w, &lognormal(30 + w, 100), false));
        }
        last = h.advance(BASE + (w + 1) * WINDOW);
    }
    let got: Vec<(&str, &str, &str)> = levels(&last)
        .iter()
        .map(|o| (o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate"), o.attr("delta_ab.verdict")))
        .collect();
    // The (v1, v2) pair of windows 0 and 1 ended when v3 arrived; its candidate v2 is named at 0.
    assert_eq!(got.len(), 2, "{last:#?}");
    assert_eq!((got[0].0, got[0].1), ("v2", "v3"));
    assert_eq!(got[1], ("v1", "v2", "ended"));
    assert_eq!(levels(&last)[0].attr("delta_ab.live_versions"), "3");
    // A fourth version evicts the least recently seen outside the pair (v1), counted.
    h.process(&requests("v1", 4, &lognormal(1, 30), false));
    h.process(&requests("v2", 4, &lognormal(2, 30), false));
    h.process(&requests("v3", 4, &lognormal(3, 30), false));
    h.process(&requests("v4", 4, &lognormal(4, 30), false));
    assert_eq!(h.evicted("max_versions"), 1);
    let out = h.advance(BASE + 5 * WINDOW);
    let pair: Vec<(&str, &str)> =
        levels(&out).iter().map(|o| (o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate"))).collect();
    assert_eq!(pair[0], ("v2", "v4"), "{out:#?}");
}

#[tokio::test]
async fn delta_ab_auto_rollout_alert_fires_then_resolves_when_the_pair_ends() {
    let logs = Sink::new();
    let ctx = CreateContext::new(ComponentId::parse("alerts").unwrap(), Arc::new(Telemetry::new()));
    let alerts = AlertsFactory.create(ctx, &json!({}), Signal::Metrics, Signal::Logs, logs.clone()).unwrap();
    let mut h = Harness::new(rollout_cfg());
    for (pts, wm) in rollout() {
        h.process(&pts);
        for req in h.advance_metrics(wm) {
            alerts.consume(Payload::Metrics(req)).await.unwrap();
        }
    }
    let mut records = Vec::new();
    for p in &logs.payloads() {
        let Payload::Logs(req) = p else { panic!("not logs") };
        for r in req.resource_logs.iter().flat_map(|r| &r.scope_logs).flat_map(|s| &s.log_records) {
            let a = strings(&r.attributes);
            records.push(((r.time_unix_nano - BASE) / WINDOW, a["alert.state"].clone(), a["alert.transition"].clone()));
        }
    }
    // Firing at the first comparison (end of window 1), resolved 10 min after the first level-0
    // point of the ended pair (end of window 6): one alert identity throughout.
    let states: Vec<(u64, &str)> = records.iter().filter(|r| r.2 != "repeat").map(|r| (r.0, r.1.as_str())).collect();
    assert_eq!(states, vec![(2, "firing"), (8, "resolved")], "{records:?}");
}

// ---- Fleet A/B: version A on some replicas, B on others, pooled per model (issue 16) ----

/// Per-request points of a fleet for window `w`: `n` requests on each of `replicas` replicas
/// (own resource: `service.instance.id` vllm-i, `service.version` v2 for the first `on_b`, else
/// v1), each replica with its own latency scale (±5 %), independent traffic (no shared ids). B's
/// values are `regress(A's)`. Returns the request and the exact pooled p95 of each version.
fn fleet_window(
    w: u64,
    replicas: usize,
    on_b: usize,
    n: usize,
    regress: impl Fn(f64) -> f64,
) -> (ExportMetricsServiceRequest, f64, f64) {
    let (mut all_a, mut all_b) = (Vec::new(), Vec::new());
    let mut resource_metrics = Vec::new();
    for r in 0..replicas {
        let scale = 1.0 + 0.05 * ((r as f64 * 0.37).sin());
        let b = r < on_b;
        let version = if b { "v2" } else { "v1" };
        let values: Vec<f64> = lognormal(1000 * w + r as u64, n)
            .iter()
            .map(|x| x * scale)
            .map(|x| if b { regress(x) } else { x })
            .collect();
        let pts: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let attrs =
                    vec![kv("gen_ai.request.model", "llama"), kv("gen_ai.request.id", &format!("r{r}-w{w}-{i}"))];
                point(attrs, BASE + w * WINDOW + (i as u64) * (WINDOW / n as u64), v)
            })
            .collect();
        if b {
            all_b.extend(values)
        } else {
            all_a.extend(values)
        }
        resource_metrics.push(otlp::resource_metrics(
            vec![
                kv("service.name", "vllm"),
                kv("service.version", version),
                kv("service.instance.id", &format!("vllm-{r}")),
            ],
            scope("bench", ""),
            vec![gauge(METRIC, "s", pts)],
        ));
    }
    let p95 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        quantile_sorted(v, 0.95).expect("values")
    };
    let (qa, qb) = (p95(&mut all_a), p95(&mut all_b));
    (ExportMetricsServiceRequest { resource_metrics }, qa, qb)
}

fn fleet_cfg() -> serde_json::Value {
    json!({"metric": METRIC, "version_attribute": "service.version", "statistic": "p95", "window": "10m"})
}

#[test]
fn delta_ab_pools_a_fleet_regression_on_3_of_8_replicas() {
    // B (3 replicas) is 10 % slower and 5 ms on top; A runs on the other 5. Unpaired traffic.
    let mut h = Harness::new(fleet_cfg());
    let (req, qa, qb) = fleet_window(0, 8, 3, 300, |x| x * 1.10 + 0.005);
    assert!(h.process_metrics(&req).is_empty());
    let out = h.advance(BASE + WINDOW);
    let o = out.iter().find(|o| o.name == "llm.anomaly.score").expect("a comparison");
    assert_eq!((o.attr("delta_ab.baseline"), o.attr("delta_ab.candidate")), ("v1", "v2"));
    assert_eq!(o.attr("gen_ai.request.model"), "llama");
    // pooled over the replicas of each version
    assert_eq!((o.num("delta_ab.n_baseline"), o.num("delta_ab.n_candidate")), (1500.0, 900.0));
    assert_eq!(o.attr("delta_ab.mode"), "window", "independent traffic: unpaired bootstrap");
    assert_eq!(o.attr("delta_ab.verdict"), "regression");
    // the alert's baseline and deviation: the pooled p95s and their difference
    assert!((o.num("delta_ab.value_baseline") - qa).abs() < 1e-9, "{o:?} vs {qa}");
    assert!((o.num("delta_ab.value_candidate") - qb).abs() < 1e-9, "{o:?} vs {qb}");
    assert!((o.value - (qb - qa) * 1e3).abs() < 1e-6, "Δ in ms: {} vs {}", o.value, (qb - qa) * 1e3);
    assert!(o.num("delta_ab.ci_low") > 5.0, "{o:?}");
    let level = out.iter().find(|o| o.name == "llm.anomaly.level").expect("level");
    assert!(level.value >= 0.8, "{level:?}");
}

#[test]
fn delta_ab_fleet_aa_split_of_8_replicas_gives_no_regression() {
    let mut h = Harness::new(fleet_cfg());
    let mut seen = 0;
    for w in 0..8u64 {
        let (req, _, _) = fleet_window(w, 8, 3, 300, |x| x);
        assert!(h.process_metrics(&req).is_empty());
        for o in h.advance(BASE + (w + 1) * WINDOW).iter().filter(|o| o.name == "llm.anomaly.score") {
            assert_eq!(o.attr("delta_ab.candidate"), "v2");
            assert_ne!(o.attr("delta_ab.verdict"), "regression", "window {w}: {o:?}");
            seen += 1;
        }
    }
    assert_eq!(seen, 8, "one comparison per window");
}

/// A rollout of v2 to the first 3 of 8 replicas at window 3 (0-based), per-request points of
/// window `w`, `n` per replica: from window 3 on every replica is `level`× slower (a fleet-wide
/// load change at the time of the deploy), and a v2 replica's first 2 minutes after the deploy
/// are 3× slower (its cold start). v2 is otherwise identical to v1 (A/A).
fn rollout_window(w: u64, n: usize, level: f64) -> ExportMetricsServiceRequest {
    let mut resource_metrics = Vec::new();
    for r in 0..8usize {
        let b = w >= 3 && r < 3;
        let version = if b { "v2" } else { "v1" };
        let factor = if w >= 3 { level } else { 1.0 };
        let pts: Vec<_> = lognormal(7000 * w + r as u64, n)
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let t = BASE + w * WINDOW + (i as u64) * (WINDOW / n as u64);
                let cold = if b && w == 3 && t < BASE + 3 * WINDOW + 120 * S { 3.0 } else { 1.0 };
                point(vec![kv("gen_ai.request.model", "llama")], t, v * factor * cold)
            })
            .collect();
        resource_metrics.push(otlp::resource_metrics(
            vec![
                kv("service.name", "vllm"),
                kv("service.version", version),
                kv("service.instance.id", &format!("vllm-{r}")),
            ],
            scope("bench", ""),
            vec![gauge(METRIC, "s", pts)],
        ));
    }
    ExportMetricsServiceRequest { resource_metrics }
}

/// The comparisons of windows 3..6 of the A/A rollout, the default settings and `extra` (1-h look-back).
fn rollout_comparisons(extra: serde_json::Value) -> Vec<Out> {
    let mut cfg = json!({"metric": METRIC, "window": "10m", "lookback": "1h"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        cfg[k] = v.clone();
    }
    let mut h = Harness::new(cfg);
    let mut out = Vec::new();
    for w in 0..6u64 {
        assert!(h.process_metrics(&rollout_window(w, 600, 1.25)).is_empty());
        let o = h.advance(BASE + (w + 1) * WINDOW);
        out.extend(o.into_iter().filter(|o| o.name == "llm.anomaly.score" && o.attr("delta_ab.candidate") == "v2"));
    }
    out
}

#[test]
fn delta_ab_fleet_rollout_compares_the_same_time_and_leaves_out_the_warm_up() {
    // The previous behaviour: the baseline pools the hour before the deploy too, when the fleet
    // was 25 % faster, and the cold start counts: an identical v2 looks like a regression.
    let old = rollout_comparisons(json!({}));
    assert_eq!(old.len(), 3, "{old:?}");
    assert!(old.iter().any(|o| o.attr("delta_ab.verdict") == "regression"), "{old:?}");
    assert!(old.iter().all(|o| o.attr("delta_ab.concurrent") == "false"));
    // Concurrent windows only, the cold start still in: the first window's Δ is inflated.
    let conc = rollout_comparisons(json!({"concurrent": true}));
    assert!(conc[0].value > 20.0, "cold start in the p95: {:?}", conc[0]);
    // Both: Δ is that of identical versions, and no regression.
    let fixed = rollout_comparisons(json!({"concurrent": true, "warmup": "5m"}));
    assert_eq!(fixed.len(), 3);
    for o in &fixed {
        assert_ne!(o.attr("delta_ab.verdict"), "regression", "{o:?}");
        // the interval of an A/A covers the true Δ of 0
        assert!(o.num("delta_ab.ci_low") <= 0.0 && o.num("delta_ab.ci_high") >= 0.0, "Δ of an A/A: {o:?}");
        assert_eq!(o.attr("delta_ab.concurrent"), "true");
        // requests and replicas per version: 5 v1 replicas, 3 v2 replicas over the same windows
        assert_eq!((o.num("delta_ab.replicas_baseline"), o.num("delta_ab.replicas_candidate")), (5.0, 3.0), "{o:?}");
    }
    // The first comparison (window 3 alone): v1 600 × 5 (v1's own warm-up was at window 0, before
    // the look-back's concurrent part), v2 the 3 replicas' points after their first 5 minutes.
    let first = &fixed[0];
    assert_eq!(first.num("delta_ab.n_baseline"), 3000.0, "{first:?}");
    assert_eq!(first.num("delta_ab.warmup_candidate"), 900.0, "{first:?}");
    assert_eq!(first.num("delta_ab.n_candidate"), 900.0, "{first:?}");
    assert_eq!(fixed[2].num("delta_ab.n_candidate"), 3.0 * 600.0 * 3.0 - 900.0, "{:?}", fixed[2]);
}
