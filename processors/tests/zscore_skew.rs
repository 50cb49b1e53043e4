//! `zscore_skew` against a brute-force reference (the definition of docs/detectors/zscore_skew.md recomputed from the window
//! at every point, two-pass, in f64, with the scale floors of docs/detectors/zscore_skew.md),
//! driven through the ArrowProcessor trait with batches from `metrics::to_batch`.
//!
//! The precision tests run with the floors off (`Harness::with`: the spec's score exactly, where
//! tiny spreads and 1e12 offsets are the hard cases); `floored_equals_the_reference` and the
//! tests after it hold the defaults and other floors to the same reference.

use inferwatch_core::arrow::{RecordBatch, metrics};
use inferwatch_core::component::{PathSeg, ProcessorFactory};
use inferwatch_core::pdata::Signal;
use inferwatch_processors::detect::{LEVEL, SCORE};
use inferwatch_processors::zscore_skew::ZscoreSkewFactory;
use inferwatch_processors::zscore_skew::window::{Path, Window};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{self, gauge, kv, metrics_request, point, scope};
use inferwatch_testkit::rng::SplitMix64 as Rng;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{
    Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;

const BASE: u64 = 1_700_000_000_000_000_000;
const METRIC: &str = "llm.ttft.p95";
const TOL: f64 = 1e-9;

// ---------------------------------------------------------------------------------------------
// The reference: the definition, recomputed from the window for every point.

#[derive(Debug, Clone, Copy)]
struct Ref {
    score: f64,
    mean: f64,
    std: f64,
    scale: f64,
    skew: f64,
}

/// The scale floors of the reference (the processor's `min_std`, `min_relative_std`,
/// `quantised.max_distinct`, `quantised.constant_step`).
#[derive(Debug, Clone, Copy)]
struct RefFloors {
    min_std: f64,
    rel: f64,
    k: usize,
    constant_step: f64,
}

/// No floor: the definition as written.
const SPEC: RefFloors = RefFloors { min_std: 0.0, rel: 0.0, k: 0, constant_step: 0.0 };
/// The processor's defaults.
const DEFAULTS: RefFloors = RefFloors { min_std: 0.0, rel: 0.05, k: 4, constant_step: 0.5 };

impl RefFloors {
    fn config(&self, w: usize, s: usize) -> serde_json::Value {
        json!({"metrics": [METRIC], "window": w, "step": s, "min_std": self.min_std, "min_relative_std": self.rel,
            "quantised": {"max_distinct": self.k, "constant_step": self.constant_step}})
    }
}

/// Two-pass moments of `w` (shifted by its first value, so an offset like 1e12 cancels exactly
/// before anything is squared), then z and G1 as the definition writes them.
fn reference(w: &[f64], x: f64) -> Ref {
    reference_floored(w, x, &SPEC)
}

/// [`reference`] with the scale floored: scale = max(std, min_std, rel·|mean|, q), q = Δ/√12 for
/// a window of 2..=k distinct values (Δ the smallest gap), step·|mean|/√12 for a constant one;
/// z = |x − mean| / (scale + 1e-8), skew term 0.3·|G1|·(std/scale)³.
fn reference_floored(w: &[f64], x: f64, f: &RefFloors) -> Ref {
    let n = w.len() as f64;
    let x0 = w[0];
    let d: Vec<f64> = w.iter().map(|v| v - x0).collect();
    let mean_d = d.iter().sum::<f64>() / n;
    let m2 = d.iter().map(|v| (v - mean_d).powi(2)).sum::<f64>() / n;
    let m3 = d.iter().map(|v| (v - mean_d).powi(3)).sum::<f64>() / n;
    let std = m2.sqrt();
    let skew = if m2 == 0.0 { 0.0 } else { (n * (n - 1.0)).sqrt() / (n - 2.0) * m3 / m2.powf(1.5) };
    let mean = x0 + mean_d;
    let mut distinct = w.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let q = match distinct.len() {
        n if n > f.k => 0.0,
        1 => f.constant_step * mean.abs() / 12f64.sqrt(),
        _ => distinct.windows(2).map(|p| p[1] - p[0]).fold(f64::INFINITY, f64::min) / 12f64.sqrt(),
    };
    let scale = std.max(f.min_std).max(f.rel * mean.abs()).max(q);
    let dev = ((x - x0) - mean_d).abs();
    if scale <= std {
        let z = dev / (std + 1e-8);
        return Ref { score: z + 0.3 * skew.abs(), mean, std, scale: std, skew };
    }
    let z = dev / (scale + 1e-8);
    Ref { score: z + 0.3 * skew.abs() * (std / scale).powi(3), mean, std, scale, skew }
}

/// Expected outputs of one series (values in arrival order, with their times): NaN and ±∞ skipped,
/// points i = w, w+s, … of the finite ones scored against the w finite points before them.
fn expected(points: &[(u64, f64)], w: usize, s: usize) -> Vec<(u64, f64, Ref)> {
    expected_floored(points, w, s, &SPEC)
}

/// [`expected`] with floors.
fn expected_floored(points: &[(u64, f64)], w: usize, s: usize, f: &RefFloors) -> Vec<(u64, f64, Ref)> {
    let finite: Vec<(u64, f64)> = points.iter().copied().filter(|p| p.1.is_finite()).collect();
    (w..finite.len())
        .step_by(s)
        .map(|i| {
            let window: Vec<f64> = finite[i - w..i].iter().map(|p| p.1).collect();
            (finite[i].0, finite[i].1, reference_floored(&window, finite[i].1, f))
        })
        .collect()
}

fn close(got: f64, want: f64, scale: f64) -> bool {
    (got - want).abs() <= TOL * scale || got == want
}

// ---------------------------------------------------------------------------------------------
// Series generators.

/// The kinds of series the reference is held to.
const FAMILIES: usize = 10;

fn family_name(f: usize) -> &'static str {
    [
        "normal",
        "lognormal",
        "1e12 offset, 1e-3 noise",
        "tiny 1e-12",
        "constant runs and steps",
        "repeated values",
        "integers",
        "spikes up to 1e9",
        "levels ±1e9 with 1e-3 noise",
        "random walk",
    ][f % FAMILIES]
}

fn series(family: usize, seed: u64, len: usize) -> Vec<f64> {
    let mut r = Rng(seed);
    let mu = (r.unit() - 0.5) * 200.0;
    let sigma = 10f64.powf(r.unit() * 3.0 - 2.0);
    let set: Vec<f64> = (0..2 + r.below(3)).map(|_| (r.below(7) as f64 - 3.0) * 0.5).collect();
    let mut level = 0.0;
    let mut left = 0;
    let mut walk = 0.0;
    (0..len)
        .map(|_| match family % FAMILIES {
            0 => mu + sigma * r.normal(),
            1 => (r.normal() * (0.2 + 1.8 * r.unit())).exp(),
            2 => 1e12 + 1e-3 * r.normal(),
            3 => {
                if seed.is_multiple_of(2) {
                    1e-12 * r.normal()
                } else {
                    1e-12 * (1.0 + 0.1 * r.normal())
                }
            }
            4 => {
                if left == 0 {
                    left = 1 + r.below(120);
                    let deltas = [0.0, 1e-6, 1.0, 1e6];
                    level = 1e6 + deltas[r.below(4) as usize];
                }
                left -= 1;
                level
            }
            5 => set[r.below(set.len() as u64) as usize],
            6 => {
                if seed.is_multiple_of(2) {
                    r.below(20) as f64
                } else {
                    1e9 + r.below(5) as f64
                }
            }
            7 => {
                if r.below(50) == 0 {
                    r.normal() * 10f64.powf(6.0 + 3.0 * r.unit())
                } else {
                    r.normal()
                }
            }
            8 => {
                if left == 0 {
                    left = 1 + r.below(150);
                    level = (r.unit() - 0.5) * 2e9;
                }
                left -= 1;
                level + 1e-3 * r.normal()
            }
            _ => {
                walk += r.normal() * 1e3;
                walk
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Batches in and points out.

/// One input point: series `k` (point attribute `model = m<k>`), event time, value.
#[derive(Debug, Clone, Copy)]
struct In {
    k: usize,
    time: u64,
    value: f64,
}

fn request(metric: &str, points: &[In], sum: bool) -> ExportMetricsServiceRequest {
    let dps = points.iter().map(|p| point(vec![kv("model", &format!("m{}", p.k))], p.time, p.value)).collect();
    let m = if sum { otlp::sum(metric, "s", dps, false) } else { gauge(metric, "s", dps) };
    metrics_request(vec![kv("service.name", "vllm")], scope("sim", "1"), vec![m])
}

fn batch(points: &[In]) -> RecordBatch {
    metrics::to_batch(&request(METRIC, points, false)).unwrap()
}

/// One emitted score with its level and attributes.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    model: String,
    time: u64,
    score: f64,
    level: f64,
    window: i64,
    mean: f64,
    std: f64,
    scale: f64,
    skew: f64,
    value: f64,
}

fn attr<'a>(p: &'a NumberDataPoint, key: &str) -> &'a any_value::Value {
    p.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .unwrap_or_else(|| panic!("no attribute {key}"))
}

fn dbl(v: &any_value::Value) -> f64 {
    match v {
        any_value::Value::DoubleValue(d) => *d,
        other => panic!("not a double: {other:?}"),
    }
}

fn value(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsDouble(d)) => d,
        ref other => panic!("not a double point: {other:?}"),
    }
}

/// Reads the outputs back: every score gauge point must be followed by its level point, with the
/// same attributes and time; resource and scope are the input's.
fn read(out: &[RecordBatch]) -> Vec<Got> {
    let mut got = Vec::new();
    for b in out {
        let req = metrics::from_batch(b).unwrap();
        let mut pts: Vec<(String, NumberDataPoint)> = Vec::new();
        for rm in &req.resource_metrics {
            assert_eq!(rm.resource.as_ref().unwrap().attributes, vec![kv("service.name", "vllm")]);
            for sm in &rm.scope_metrics {
                assert_eq!(sm.scope.as_ref().map(|s| s.name.as_str()), Some("sim"));
                for m in &sm.metrics {
                    assert_eq!(m.unit, "", "a score or a level is no ratio: no unit");
                    let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{} is not a gauge", m.name) };
                    pts.extend(g.data_points.iter().map(|p| (m.name.clone(), p.clone())));
                }
            }
        }
        // Scores and levels come as two Metrics per scope, each in input order: pair them up.
        let (scores, levels): (Vec<_>, Vec<_>) = pts.into_iter().partition(|(n, _)| n == SCORE);
        assert_eq!(scores.len(), levels.len());
        let pts: Vec<(String, NumberDataPoint)> = scores.into_iter().zip(levels).flat_map(|(s, l)| [s, l]).collect();
        for pair in pts.chunks(2) {
            let ((n0, s), (n1, l)) = (&pair[0], &pair[1]);
            assert_eq!((n0.as_str(), n1.as_str()), (SCORE, LEVEL));
            assert_eq!((s.time_unix_nano, &s.attributes), (l.time_unix_nano, &l.attributes));
            let keys: Vec<&str> = s.attributes.iter().map(|kv| kv.key.as_str()).collect();
            assert_eq!(
                keys,
                [
                    "detector",
                    "metric",
                    "model",
                    "window",
                    "zscore.mean",
                    "zscore.std",
                    "zscore.scale",
                    "zscore.skew",
                    "value"
                ]
            );
            assert_eq!(attr(s, "detector"), &any_value::Value::StringValue("zscore_skew".into()));
            assert_eq!(attr(s, "metric"), &any_value::Value::StringValue(METRIC.into()));
            let any_value::Value::StringValue(model) = attr(s, "model") else { panic!("model") };
            let any_value::Value::IntValue(window) = attr(s, "window") else { panic!("window") };
            got.push(Got {
                model: model.clone(),
                time: s.time_unix_nano,
                score: value(s),
                level: value(l),
                window: *window,
                mean: dbl(attr(s, "zscore.mean")),
                std: dbl(attr(s, "zscore.std")),
                scale: dbl(attr(s, "zscore.scale")),
                skew: dbl(attr(s, "zscore.skew")),
                value: dbl(attr(s, "value")),
            });
        }
    }
    got
}

/// The kit's harness on this file's points.
trait Zscore {
    fn new(cfg: serde_json::Value) -> Self;
    fn with(w: usize, s: usize) -> Self;
    fn feed(&mut self, b: &RecordBatch) -> Vec<Got>;
    fn run(&mut self, points: &[In]) -> Vec<Got>;
}

impl Zscore for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::create(&ZscoreSkewFactory, "zscore_skew/test", &cfg, Signal::Metrics)
    }

    /// Window `w`, step `s`, no scale floor (the definition exactly).
    fn with(w: usize, s: usize) -> Self {
        Harness::new(SPEC.config(w, s))
    }

    fn feed(&mut self, b: &RecordBatch) -> Vec<Got> {
        let out = self.process_batch(b);
        assert!(out.len() <= 1, "one derived batch per input batch");
        read(&out)
    }

    fn run(&mut self, points: &[In]) -> Vec<Got> {
        self.feed(&batch(points))
    }
}

/// Checks `got` against the reference of every series in `points`; returns the largest error
/// relative to max(1, score).
fn check(got: &[Got], points: &[In], series: usize, w: usize, s: usize) -> Result<f64, TestCaseError> {
    check_floored(got, points, series, w, s, &SPEC)
}

/// [`check`] against the reference with floors `f`.
fn check_floored(
    got: &[Got],
    points: &[In],
    series: usize,
    w: usize,
    s: usize,
    f: &RefFloors,
) -> Result<f64, TestCaseError> {
    let mut want: BTreeMap<(String, u64), (f64, Ref)> = BTreeMap::new();
    for k in 0..series {
        let pts: Vec<(u64, f64)> = points.iter().filter(|p| p.k == k).map(|p| (p.time, p.value)).collect();
        for (t, x, r) in expected_floored(&pts, w, s, f) {
            want.insert((format!("m{k}"), t), (x, r));
        }
    }
    prop_assert_eq!(got.len(), want.len(), "number of scores");
    let times: Vec<u64> = got.iter().map(|g| g.time).collect();
    prop_assert!(times.windows(2).all(|p| p[0] < p[1]), "scores in input order");
    let mut worst: f64 = 0.0;
    for g in got {
        let Some((x, r)) = want.get(&(g.model.clone(), g.time)) else {
            return Err(TestCaseError::fail(format!("unexpected score {g:?}")));
        };
        let scale = r.score.abs().max(1.0);
        worst = worst.max((g.score - r.score).abs() / scale);
        prop_assert!(close(g.score, r.score, scale), "score {} vs reference {r:?} ({g:?})", g.score);
        let level = ((r.score - 3.0) / 3.0).clamp(0.0, 1.0);
        prop_assert!(close(g.level, level, 1.0), "level {} vs {level}", g.level);
        prop_assert!(close(g.std, r.std, r.std), "std {} vs {}", g.std, r.std);
        prop_assert!(close(g.scale, r.scale, r.scale), "scale {} vs {}", g.scale, r.scale);
        prop_assert!(
            (g.mean - r.mean).abs() <= TOL * (r.std + 1e-8) + 4.0 * f64::EPSILON * r.mean.abs(),
            "mean {} vs {}",
            g.mean,
            r.mean
        );
        prop_assert!(close(g.skew, r.skew, r.skew.abs().max(1.0)), "skew {} vs {}", g.skew, r.skew);
        prop_assert_eq!(g.value.to_bits(), x.to_bits());
        prop_assert_eq!(g.window, w as i64);
    }
    Ok(worst)
}

/// `series` series of the given families interleaved by `order`, with NaN / ±∞ points injected
/// where `holes` says, times strictly increasing in arrival order.
fn interleave(families: &[(usize, u64)], len: usize, order_seed: u64, holes: bool) -> Vec<In> {
    let mut active: Vec<(usize, std::vec::IntoIter<f64>)> =
        families.iter().enumerate().map(|(k, &(f, seed))| (k, series(f, seed, len).into_iter())).collect();
    let mut r = Rng(order_seed);
    let mut out = Vec::new();
    let mut t = BASE;
    while !active.is_empty() {
        let i = r.below(active.len() as u64) as usize;
        let k = active[i].0;
        let Some(v) = active[i].1.next() else {
            active.swap_remove(i);
            continue;
        };
        t += 1_000_000;
        out.push(In { k, time: t, value: v });
        if holes && r.below(17) == 0 {
            t += 1_000_000;
            let bad = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][r.below(3) as usize];
            out.push(In { k, time: t, value: bad });
        }
    }
    out
}

/// Splits `points` into batches at the cut points chosen by `seed`.
fn batches(points: &[In], seed: u64, max_batches: u64) -> Vec<Vec<In>> {
    let mut r = Rng(seed);
    let mut out: Vec<Vec<In>> = Vec::new();
    let mut cur = Vec::new();
    for p in points {
        cur.push(*p);
        if r.below(points.len() as u64 / max_batches.max(1) + 1) == 0 {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The tests, in a module so that `cargo test -p inferwatch-processors zscore` selects them.
#[allow(clippy::module_inception)]
mod zscore_skew {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

        /// Every emitted score of several interleaved series (random families, window, step, batch
        /// cuts, NaN and ±∞ holes) equals the reference within 1e-9, at the right times.
        #[test]
        fn equals_the_brute_force_reference(
            families in prop::collection::vec((0..FAMILIES, any::<u64>()), 1..=4),
            len in 0usize..320,
            w in 3usize..=60,
            s in 1usize..=5,
            order_seed in any::<u64>(),
            cut_seed in any::<u64>(),
            holes in any::<bool>(),
        ) {
            let points = interleave(&families, len, order_seed, holes);
            let mut h = Harness::with(w, s);
            let mut got = Vec::new();
            for b in batches(&points, cut_seed, 5) {
                got.extend(h.run(&b));
            }
            let names: Vec<&str> = families.iter().map(|f| family_name(f.0)).collect();
            check(&got, &points, families.len(), w, s).map_err(|e| TestCaseError::fail(format!("{names:?}: {e}")))?;
            prop_assert_eq!(h.proc.series_count(), if len == 0 { 0 } else { families.len() });
        }

        /// Snapshot, restore into a fresh processor, continue: the same outputs, bit for bit, as a
        /// processor that never stopped.
        #[test]
        fn snapshot_restore_continues_exactly(
            families in prop::collection::vec((0..FAMILIES, any::<u64>()), 1..=3),
            len in 1usize..200,
            w in 3usize..=40,
            s in 1usize..=3,
            cut in 0.0f64..1.0,
        ) {
            let points = interleave(&families, len, 99, true);
            let at = (points.len() as f64 * cut) as usize;
            let mut whole = Harness::with(w, s);
            let mut want = whole.run(&points[..at]);
            want.extend(whole.run(&points[at..]));
            let mut first = Harness::with(w, s);
            let mut got = first.run(&points[..at]);
            let bytes = first.proc.snapshot().unwrap();
            let mut second = Harness::with(w, s);
            second.proc.restore(&bytes).unwrap();
            prop_assert_eq!(second.proc.snapshot().unwrap(), bytes);
            got.extend(second.run(&points[at..]));
            prop_assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                prop_assert_eq!((g.score.to_bits(), g.time, &g.model), (e.score.to_bits(), e.time, &e.model));
            }
            prop_assert_eq!(whole.proc.snapshot().unwrap(), second.proc.snapshot().unwrap());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// With the defaults or other floors (absolute, relative, quantised with k = 0..6, assumed
        /// constant step), every score, level and scale equals the floored reference within 1e-9.
        #[test]
        fn floored_equals_the_reference(
            families in prop::collection::vec((0..FAMILIES, any::<u64>()), 1..=3),
            len in 0usize..260,
            w in 3usize..=40,
            s in 1usize..=3,
            floors in (0usize..4, 0usize..3, 0usize..=6, 0usize..3),
            order_seed in any::<u64>(),
            cut_seed in any::<u64>(),
        ) {
            let f = if floors == (0, 0, 0, 0) {
                DEFAULTS
            } else {
                RefFloors {
                    min_std: [0.0, 1e-3, 1.0, 1e6][floors.0],
                    rel: [0.0, 0.05, 0.3][floors.1],
                    k: floors.2,
                    constant_step: [0.0, 0.5, 2.0][floors.3],
                }
            };
            let points = interleave(&families, len, order_seed, true);
            let mut h = Harness::new(f.config(w, s));
            let mut got = Vec::new();
            for b in batches(&points, cut_seed, 5) {
                got.extend(h.run(&b));
            }
            let names: Vec<&str> = families.iter().map(|f| family_name(f.0)).collect();
            check_floored(&got, &points, families.len(), w, s, &f)
                .map_err(|e| TestCaseError::fail(format!("{names:?} {f:?}: {e}")))?;
        }
    }

    /// A series of `values` (one point each, series 0) through a processor with the defaults.
    fn defaults(w: usize, values: &[f64]) -> Vec<Got> {
        let pts: Vec<In> =
            values.iter().enumerate().map(|(i, &v)| In { k: 0, time: BASE + i as u64, value: v }).collect();
        Harness::new(json!({"metrics": [METRIC], "window": w})).run(&pts)
    }

    /// A constant window, then +1 %: level 0 (without the floors the score was 1e4 / 1e-8 ≈ 1e6).
    #[test]
    fn constant_window_then_one_percent_is_level_0() {
        let mut values = vec![0.2; 50];
        values.push(0.202);
        let got = defaults(50, &values);
        assert_eq!(got.len(), 1);
        let g = &got[0];
        // Constant window: scale = 0.5·0.2/√12 (the assumed step), z = 0.002 / scale ≈ 0.069.
        assert_eq!((g.std, g.skew, g.mean), (0.0, 0.0, 0.2));
        assert!((g.scale - 0.1 / 12f64.sqrt()).abs() < 1e-15, "{g:?}");
        assert!((g.score - 0.002 / (0.1 / 12f64.sqrt() + 1e-8)).abs() < 1e-9 && g.level == 0.0, "{g:?}");
        // The same point with the floors off: the spec's guard alone, instantly critical.
        let pts: Vec<In> =
            values.iter().enumerate().map(|(i, &v)| In { k: 0, time: BASE + i as u64, value: v }).collect();
        let spec = Harness::with(50, 1).run(&pts);
        assert!(spec[0].score > 1e5 && spec[0].level == 1.0, "{:?}", spec[0]);
    }

    /// A scraped p95 between two bucket interpolations (0.0488 and 0.0732): one bucket step is below
    /// warning (0.6), from a constant window and from a window that has seen the other value once;
    /// a real 3× (and 2×) step on the same signal is critical (≥ 0.8).
    #[test]
    fn one_bucket_step_is_below_warning_and_a_real_step_is_critical() {
        let (a, b) = (0.0488, 0.0732);
        let mut once = vec![a; 50];
        once[20] = b;
        for (name, window) in [("constant", vec![a; 50]), ("one earlier step", once.clone())] {
            for (x, below_warning) in [(b, true), (2.0 * a, false), (3.0 * a, false)] {
                let mut values = window.clone();
                values.push(x);
                let got = defaults(50, &values);
                assert_eq!(got.len(), 1);
                let g = &got[0];
                if below_warning {
                    assert!(g.level < 0.6, "{name}, one step to {x}: {g:?}");
                } else {
                    assert!(g.level >= 0.8, "{name}, step to {x}: {g:?}");
                }
                let r = reference_floored(&window, x, &DEFAULTS);
                assert!(close(g.score, r.score, r.score.max(1.0)), "{g:?} vs {r:?}");
            }
        }
        // The numbers the docs quote: from the constant window z = 0.0244 / (0.0244/√12) = √12;
        // after one earlier b the scale is the gap 0.0244/√12 (std 0.0034 is below it).
        let mut values = vec![a; 50];
        values.push(b);
        let g = &defaults(50, &values)[0];
        assert!((g.score - 12f64.sqrt()).abs() < 1e-5 && (g.level - 0.155).abs() < 1e-3, "{g:?}");
        let mut values = once.clone();
        values.push(b);
        let g = &defaults(50, &values)[0];
        assert!((g.scale - (b - a) / 12f64.sqrt()).abs() < 1e-15 && g.std < g.scale, "{g:?}");
        assert!((g.score - 3.637).abs() < 1e-3, "{g:?}");
        // A quantised signal flipping between the two values all along: never a warning.
        let flips: Vec<f64> = (0..400).map(|i| if i % 37 == 0 || i % 53 == 0 { b } else { a }).collect();
        let got = defaults(50, &flips);
        assert!(got.iter().all(|g| g.level < 0.6), "{:?}", got.iter().map(|g| g.level).fold(0.0, f64::max));
        // The same flips with the floors off: the old behaviour, critical.
        let pts: Vec<In> =
            flips.iter().enumerate().map(|(i, &v)| In { k: 0, time: BASE + i as u64, value: v }).collect();
        assert!(Harness::with(50, 1).run(&pts).iter().any(|g| g.level >= 0.8));
    }

    /// The relative floor (5 % of |mean|) on a continuous but nearly flat series; the absolute floor.
    #[test]
    fn relative_and_absolute_floors() {
        // 100 ± 0.01 (std ≈ 0.0058, far below 5): 110 is 10 % away, z = 10 / 5 = 2, level 0.
        let values: Vec<f64> = (0..50).map(|i| 100.0 + 0.01 * ((i * 7 % 3) as f64 - 1.0)).chain([110.0]).collect();
        let g = &defaults(50, &values)[0];
        assert!((g.scale - 0.05 * g.mean).abs() < 1e-12 && g.level == 0.0, "{g:?}");
        // 130 is 30 % away: z = 6, critical.
        let mut hi = values.clone();
        hi[50] = 130.0;
        assert!(defaults(50, &hi)[0].level >= 0.8);
        // A series at 0 has no relative floor; `min_std` gives one in the metric's unit.
        let zeros: Vec<In> =
            (0..11).map(|i| In { k: 0, time: BASE + i, value: if i == 10 { 0.5 } else { 0.0 } }).collect();
        let got = Harness::new(json!({"metrics": [METRIC], "window": 10})).run(&zeros);
        assert_eq!(got[0].level, 1.0, "0 → 0.5 without min_std: scale 0");
        let got = Harness::new(json!({"metrics": [METRIC], "window": 10, "min_std": 0.25})).run(&zeros);
        assert!((got[0].score - 0.5 / (0.25 + 1e-8)).abs() < 1e-9 && got[0].level == 0.0, "{:?}", got[0]);
    }

    /// Long adversarial series of every family through the processor at the default window: within
    /// 1e-9 of the reference everywhere, and the O(1) path carries almost every score.
    #[test]
    fn long_adversarial_series_stay_within_1e_9() {
        for f in 0..FAMILIES {
            let values = series(f, 1234 + f as u64, 6000);
            let points: Vec<In> =
                values.iter().enumerate().map(|(i, &v)| In { k: 0, time: BASE + i as u64, value: v }).collect();
            let mut h = Harness::with(50, 1);
            let got: Vec<Got> = points.chunks(1000).flat_map(|c| h.run(c)).collect();
            let worst = check(&got, &points, 1, 50, 1).unwrap_or_else(|e| panic!("{}: {e}", family_name(f)));
            assert!(worst <= TOL, "{}: {worst}", family_name(f));
        }
    }

    /// The window itself on a million-point normal series and on 1e12-offset data: every score is
    /// within 1e-9 of the reference and none needed the exact O(w) path, so the cost per point is O(1).
    #[test]
    fn window_is_exact_and_fast_on_long_series() {
        for (f, n) in [(0, 200_000), (2, 100_000), (4, 100_000), (5, 50_000), (7, 100_000), (8, 100_000)] {
            let values = series(f, 77, n);
            let mut w = Window::new(50);
            let (mut fast, mut slow, mut exact) = (0u64, 0u64, 0u64);
            for (i, &x) in values.iter().enumerate() {
                if let Some(s) = w.score(x) {
                    let r = reference(&values[i - 50..i], x);
                    assert!(close(s.score, r.score, r.score.max(1.0)), "{} at {i}: {s:?} vs {r:?}", family_name(f));
                    match s.path {
                        Path::Fast => fast += 1,
                        Path::Rebuilt => slow += 1,
                        Path::Exact => exact += 1,
                    }
                }
                w.push(x);
            }
            eprintln!("{}: fast {fast}, rebuilt {slow}, exact {exact}", family_name(f));
            assert_eq!(exact, 0, "{}", family_name(f));
            assert!(slow * 100 <= fast, "{}: {slow} rebuilds for {fast} fast scores", family_name(f));
        }
    }

    /// Values beyond the range of squares and cubes (1e200, ±1e300) still score as the definition says.
    #[test]
    fn extreme_magnitudes_use_the_exact_path() {
        let mut w = Window::new(4);
        for v in [1e300, -1e300, 3e299, 1e300] {
            w.push(v);
        }
        let s = w.score(2e299).unwrap();
        assert_eq!(s.path, Path::Exact);
        // Scaled by 1e-300 the guard 1e-8 would matter; at this scale it does not: z = |x − mean| / std.
        let r = reference(&[1.0, -1.0, 0.3, 1.0], 0.2);
        let z = (0.2 - r.mean).abs() / r.std;
        assert!(close(s.skew, r.skew, 1.0) && close(s.z, z, z), "{s:?} vs {r:?}");
        assert!(close(s.mean, r.mean * 1e300, 1e300) && close(s.std, r.std * 1e300, r.std * 1e300), "{s:?}");
        let mut w = Window::new(3);
        for v in [1e-200, 3e-200, 2e-200] {
            w.push(v);
        }
        let s = w.score(2e-200).unwrap();
        assert!(s.score.is_finite() && s.std > 0.0, "{s:?}");
    }

    #[test]
    fn step_scores_every_sth_point_after_the_window() {
        let pts: Vec<In> = (0..12).map(|i| In { k: 0, time: BASE + i, value: (i * i % 7) as f64 }).collect();
        let mut h = Harness::with(3, 2);
        let got = h.run(&pts);
        let times: Vec<u64> = got.iter().map(|g| g.time - BASE).collect();
        assert_eq!(times, vec![3, 5, 7, 9, 11]);
        check(&got, &pts, 1, 3, 2).unwrap();
    }

    #[test]
    fn nan_and_infinities_are_skipped_and_not_counted() {
        let clean = [1.0, 2.0, 4.0, 3.0, 10.0, 2.5, 3.5];
        let holes = [1.0, f64::NAN, 2.0, 4.0, f64::INFINITY, 3.0, f64::NEG_INFINITY, 10.0, f64::NAN, 2.5, 3.5];
        let to_in = |v: &[f64]| -> Vec<In> {
            v.iter().enumerate().map(|(i, &x)| In { k: 0, time: BASE + i as u64, value: x }).collect()
        };
        let a = Harness::with(3, 1).run(&to_in(&clean));
        let b = Harness::with(3, 1).run(&to_in(&holes));
        assert_eq!(a.len(), 4);
        let strip = |g: &[Got]| g.iter().map(|g| (g.score.to_bits(), g.value.to_bits())).collect::<Vec<_>>();
        assert_eq!(strip(&a), strip(&b), "the holes change nothing");
        let hole_times: Vec<u64> = b.iter().map(|g| g.time - BASE).collect();
        assert_eq!(hole_times, vec![5, 7, 9, 10], "scores at the finite points' own timestamps");
    }

    #[test]
    fn level_maps_three_to_six_linearly() {
        // Window [-1, 1, -1, 1]: mean 0, std 1, skew 0, so score = |x| / (1 + 1e-8).
        let mut h = Harness::with(4, 1);
        let mut pts: Vec<In> = [-1.0, 1.0, -1.0, 1.0]
            .iter()
            .enumerate()
            .map(|(i, &v)| In { k: 0, time: BASE + i as u64, value: v })
            .collect();
        pts.push(In { k: 0, time: BASE + 10, value: 4.8 * (1.0 + 1e-8) });
        let got = h.run(&pts);
        assert_eq!(got.len(), 1);
        assert!((got[0].score - 4.8).abs() < 1e-12 && (got[0].level - 0.6).abs() < 1e-12, "{:?}", got[0]);
        assert_eq!((got[0].mean, got[0].std, got[0].skew), (0.0, 1.0, 0.0));
        let mut h = Harness::new(json!({"metrics": [METRIC], "window": 4, "level": {"zero": 1.0, "one": 2.0}}));
        pts[4].value = 1.5 * (1.0 + 1e-8);
        assert!((h.run(&pts)[0].level - 0.5).abs() < 1e-12);
    }

    #[test]
    fn only_listed_number_metrics_are_read() {
        let pts: Vec<In> = (0..6).map(|i| In { k: 0, time: BASE + i, value: (i % 3) as f64 }).collect();
        let mut h = Harness::with(3, 1);
        let other = metrics::to_batch(&request("llm.other", &pts, false)).unwrap();
        assert!(h.feed(&other).is_empty());
        assert_eq!(h.proc.series_count(), 0);
        let sums = metrics::to_batch(&request(METRIC, &pts, true)).unwrap();
        assert_eq!(h.feed(&sums).len(), 3, "sums are read like gauges");
        let hist = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: METRIC.into(),
                        data: Some(metric::Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                time_unix_nano: BASE,
                                count: 1,
                                sum: Some(1.0),
                                ..Default::default()
                            }],
                            aggregation_temporality: 2,
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        assert!(h.feed(&metrics::to_batch(&hist).unwrap()).is_empty());
        assert_eq!(h.proc.series_count(), 1);
    }

    #[test]
    fn max_series_evicts_the_least_recently_seen_and_counts_it() {
        let mut h = Harness::new(json!({"metrics": [METRIC], "window": 3, "max_series": 10}));
        let mut t = BASE;
        let mut pt = |k: usize, v: f64| {
            t += 1;
            In { k, time: t, value: v }
        };
        let first: Vec<In> = vec![pt(0, 1.0), pt(0, 2.0), pt(0, 4.0)];
        assert!(h.run(&first).is_empty());
        let others: Vec<In> = (1..=9).map(|k| pt(k, 1.0)).collect();
        h.run(&others);
        assert_eq!((h.proc.series_count(), h.evicted("max_series")), (10, 0));
        h.run(&[pt(10, 1.0)]);
        assert_eq!((h.proc.series_count(), h.evicted("max_series")), (10, 1));
        // Series 0 was the least recently seen: it starts again with an empty window.
        assert!(h.run(&[pt(0, 3.0), pt(0, 5.0), pt(0, 1.0)]).is_empty());
        assert_eq!(h.evicted("max_series"), 2);
        assert_eq!(h.run(&[pt(0, 9.0)]).len(), 1);
    }

    #[test]
    fn idle_series_are_forgotten_on_event_time() {
        let mut h = Harness::new(json!({"metrics": [METRIC], "window": 3, "idle_timeout": "10s"}));
        let s = 1_000_000_000;
        h.run(&[In { k: 0, time: BASE, value: 1.0 }, In { k: 1, time: BASE + 5 * s, value: 1.0 }]);
        let mut out = Vec::new();
        h.proc.advance(BASE + 10 * s - 1, &mut out).unwrap();
        assert_eq!((h.proc.series_count(), h.evicted("idle")), (2, 0));
        h.proc.advance(BASE + 10 * s, &mut out).unwrap();
        assert_eq!((h.proc.series_count(), h.evicted("idle")), (1, 1));
        h.proc.advance(u64::MAX, &mut out).unwrap();
        assert_eq!(h.proc.series_count(), 1, "the end of input forgets nothing");
        h.proc.advance(BASE + 15 * s, &mut out).unwrap();
        assert_eq!((h.proc.series_count(), h.evicted("idle")), (0, 2));
        assert!(out.is_empty());
    }

    #[test]
    fn restore_refuses_garbage_and_keeps_state() {
        let pts: Vec<In> = (0..5).map(|i| In { k: 0, time: BASE + i, value: (i * i) as f64 }).collect();
        let mut h = Harness::with(5, 1);
        h.run(&pts);
        let bytes = h.proc.snapshot().unwrap();
        assert!(h.proc.restore(&bytes[..bytes.len() - 3]).is_err());
        assert_eq!(h.proc.snapshot().unwrap(), bytes, "a refused restore leaves the state as it was");
        let next = [In { k: 0, time: BASE + 9, value: 7.0 }, In { k: 0, time: BASE + 10, value: 8.0 }];
        // Restarted with a shorter window: the newest 3 values are kept and the next point scores.
        let mut short = Harness::with(3, 1);
        short.proc.restore(&bytes).unwrap();
        let got = short.run(&next);
        let all: Vec<(u64, f64)> = pts.iter().chain(&next).map(|p| (p.time, p.value)).collect();
        let want = expected(&all, 3, 1);
        assert_eq!(got.len(), 2);
        for (g, (t, _, r)) in got.iter().zip(&want[want.len() - 2..]) {
            assert!(g.time == *t && close(g.score, r.score, r.score.max(1.0)), "{g:?} vs {r:?}");
        }
        // With a longer one the window fills first: the first point after the restart is not scored.
        let mut long = Harness::with(6, 1);
        long.proc.restore(&bytes).unwrap();
        let got = long.run(&next);
        assert_eq!(got.iter().map(|g| g.time).collect::<Vec<_>>(), vec![BASE + 10]);
    }

    #[test]
    fn config_is_checked_with_paths() {
        let f = ZscoreSkewFactory;
        let ok = json!({"metrics": [METRIC], "window": 50, "step": 1, "max_series": 10000, "idle_timeout": "1h",
        "level": {"zero": 3.0, "one": 6.0}});
        f.validate(&ok).unwrap();
        f.validate(&json!({"metrics": [METRIC], "window": 10000})).unwrap();
        let path = |v: serde_json::Value| f.validate(&v).unwrap_err().path;
        let key = |k: &str| PathSeg::Key(k.into());
        assert_eq!(path(json!({})), vec![key("metrics")]);
        assert_eq!(path(json!({"metrics": [METRIC, ""]})), vec![key("metrics"), PathSeg::Index(1)]);
        assert_eq!(path(json!({"metrics": [METRIC], "window": 2})), vec![key("window")]);
        assert_eq!(path(json!({"metrics": [METRIC], "window": 10001})), vec![key("window")]);
        assert_eq!(path(json!({"metrics": [METRIC], "step": 0})), vec![key("step")]);
        assert_eq!(path(json!({"metrics": [METRIC], "max_series": 0})), vec![key("max_series")]);
        assert_eq!(path(json!({"metrics": [METRIC], "level": {"zero": 3, "one": 3}})), vec![key("level"), key("one")]);
        assert_eq!(path(json!({"metrics": [METRIC], "level": {"zero": 3, "ten": 3}})), vec![key("level"), key("ten")]);
        assert_eq!(path(json!({"metrics": [METRIC], "windw": 5})), vec![key("windw")]);
        for (cfg, want) in [
            (json!({"min_std": -1.0}), vec![key("min_std")]),
            (json!({"min_relative_std": -0.1}), vec![key("min_relative_std")]),
            (json!({"quantised": {"max_distinct": 17}}), vec![key("quantised"), key("max_distinct")]),
            (json!({"quantised": {"constant_step": -1.0}}), vec![key("quantised"), key("constant_step")]),
            (json!({"quantised": {"steps": 1}}), vec![key("quantised"), key("steps")]),
        ] {
            let mut c = json!({"metrics": [METRIC]});
            for (k, v) in cfg.as_object().unwrap() {
                c[k] = v.clone();
            }
            assert_eq!(path(c), want);
        }
        f.validate(&json!({"metrics": [METRIC], "min_std": 0.001, "min_relative_std": 0.0,
            "quantised": {"max_distinct": 0, "constant_step": 0.0}}))
            .unwrap();
        assert!(ProcessorFactory::arrow(&f).is_some());
    }
}
