//! `anomaly_ensemble`: its incremental window statistics against a recomputation from the raw
//! window (proptest), a level shift and a spike reported through the ArrowProcessor trait, a
//! stationary noise series kept quiet, and checkpoints that round-trip (corrupt ones refused).

use inferwatch_core::pdata::Signal;
use inferwatch_processors::anomaly_ensemble::AnomalyEnsembleFactory;
use inferwatch_processors::anomaly_ensemble::ensemble::{Histogram, Params, State, Window};
use inferwatch_processors::detect::{LEVEL, SCORE};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{gauge, gauge_points, kv, metrics_request, point};
use inferwatch_testkit::rng::SplitMix64;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use proptest::prelude::*;
use serde_json::json;

const BASE: u64 = 1_700_000_000_000_000_000;
const MIN: u64 = 60_000_000_000;
const METRIC: &str = "gpu.power";

fn harness() -> Harness {
    Harness::create(&AnomalyEnsembleFactory, "anomaly_ensemble", &json!({"metrics": [METRIC]}), Signal::Metrics)
}

/// Minute `i` of two GPUs' power draw, `a` and `b` (b's value given).
fn minute(i: u64, a: f64, b: f64) -> ExportMetricsServiceRequest {
    let t = BASE + i * MIN;
    metrics_request(
        vec![kv("service.name", "vllm")],
        None,
        vec![
            gauge(METRIC, "W", vec![point(vec![kv("gpu", "a")], t, a), point(vec![kv("gpu", "b")], t, b)]),
            gauge("llm.tps", "1/s", vec![point(vec![kv("gpu", "a")], t, 1000.0)]),
        ],
    )
}

/// First minute at or after `from` where GPU `gpu`'s level reaches `level`, and how many minutes
/// before `from` (after the warm-up) reached it.
fn run(series_b: impl Fn(u64, &mut SplitMix64) -> f64, n: u64, seed: u64, from: u64) -> (Option<u64>, u32, u32) {
    let mut h = harness();
    let mut rng = SplitMix64(seed);
    let (mut first, mut before, mut quiet_a) = (None, 0, 0);
    for i in 0..n {
        let a = 300.0 + 5.0 * rng.normal();
        let b = series_b(i, &mut rng);
        for req in h.process_metrics(&minute(i, a, b)) {
            for p in gauge_points(&req) {
                assert_eq!(p.attr("detector"), "anomaly_ensemble");
                assert_eq!(p.attr("metric"), METRIC, "only the configured metric is scored");
                assert!(i >= 150, "scored during the 150-point warm-up at minute {i}");
                if p.name == SCORE {
                    assert!((0.0..=10.0).contains(&p.value), "{p:?}");
                    continue;
                }
                assert_eq!(p.name, LEVEL);
                if p.value < 0.6 {
                    continue;
                }
                match p.attr("gpu") {
                    "b" if i >= from => first = first.or(Some(i)),
                    "b" => before += 1,
                    _ => quiet_a += 1,
                }
            }
        }
    }
    assert_eq!(h.proc.series_count(), 2);
    (first, before, quiet_a)
}

#[test]
fn a_level_shift_is_reported_within_a_few_points() {
    let mut delays = Vec::new();
    for seed in 0..8 {
        let b = |i: u64, r: &mut SplitMix64| 300.0 + 5.0 * r.normal() + if i >= 600 { 30.0 } else { 0.0 };
        let (first, before, _) = run(b, 700, 100 + seed, 600);
        assert!(before <= 3, "seed {seed}: {before} warnings before the shift");
        delays.push(first.map_or(u64::MAX, |f| f - 600));
    }
    let fast = delays.iter().filter(|&&d| d <= 5).count();
    assert!(fast >= 7, "a 6σ shift reported within 5 minutes in {fast} of 8 runs: {delays:?}");
}

#[test]
fn a_spike_is_reported_at_once() {
    let mut delays = Vec::new();
    for seed in 0..8 {
        let b = |i: u64, r: &mut SplitMix64| 300.0 + 5.0 * r.normal() + if i == 500 { 60.0 } else { 0.0 };
        let (first, _, _) = run(b, 520, 200 + seed, 500);
        delays.push(first.map_or(u64::MAX, |f| f - 500));
    }
    // A report in the 100 points before the spike suppresses it; that may happen once in 8 runs.
    let fast = delays.iter().filter(|&&d| d <= 8).count();
    assert!(fast >= 7, "a 12σ spike reported within 8 minutes in {fast} of 8 runs: {delays:?}");
}

#[test]
fn stationary_noise_stays_quiet() {
    // Two GPUs of white noise for 6,000 minutes each: the warning level (a tail of 10⁻³ of the
    // averaged evidence) is reached about once per 700 points, the critical level rarely.
    let mut h = harness();
    let mut rng = SplitMix64(77);
    let (mut warnings, mut critical, mut scored) = (0, 0, 0);
    for i in 0..6000 {
        let (a, b) = (300.0 + 5.0 * rng.normal(), 120.0 + 40.0 * rng.normal());
        for req in h.process_metrics(&minute(i, a, b)) {
            for p in gauge_points(&req).into_iter().filter(|p| p.name == LEVEL) {
                scored += 1;
                warnings += u32::from(p.value >= 0.6);
                critical += u32::from(p.value >= 0.8);
            }
        }
    }
    assert_eq!(scored, 2 * (6000 - 150), "every point after the warm-up has a level");
    assert!(warnings <= 40, "{warnings} warnings in 12,000 points of noise");
    assert!(critical <= 10, "{critical} critical levels in 12,000 points of noise");
}

#[test]
fn checkpoints_round_trip_and_corrupt_ones_are_refused() {
    let mut h = harness();
    let mut rng = SplitMix64(5);
    let next = |i: u64, rng: &mut SplitMix64| minute(i, 300.0 + 5.0 * rng.normal(), 200.0 + rng.normal());
    for i in 0..400 {
        h.process_metrics(&next(i, &mut rng));
    }
    let bytes = h.proc.snapshot().unwrap();
    let mut other = harness();
    assert!(other.proc.restore(&bytes[..bytes.len() - 7]).is_err(), "truncated checkpoint restored");
    assert_eq!(other.proc.series_count(), 0, "a refused checkpoint left state behind");
    let mut narrow = Harness::create(
        &AnomalyEnsembleFactory,
        "anomaly_ensemble",
        &json!({"metrics": [METRIC], "bins": 8}),
        Signal::Metrics,
    );
    assert!(narrow.proc.restore(&bytes).is_err(), "a checkpoint of 6 bins restored into 8");
    other.proc.restore(&bytes).unwrap();
    assert_eq!(other.proc.series_count(), 2);
    assert_eq!(other.proc.snapshot().unwrap(), bytes);
    // Both continue identically, through a shift.
    let (mut r1, mut r2) = (SplitMix64(9), SplitMix64(9));
    for i in 400..500 {
        let shift = |r: &mut SplitMix64| if i >= 450 { minute(i, 400.0, 200.0) } else { next(i, r) };
        assert_eq!(h.process_metrics(&shift(&mut r1)), other.process_metrics(&shift(&mut r2)));
    }
}

/// Histogram counts of `values` on the state's grid, recomputed.
fn recount(s: &State, p: &Params) -> Vec<u32> {
    let mut h = Histogram::new(p.bins);
    let grid = s.grid.expect("grid fixed after the warm-up");
    for &v in &s.recent.values {
        h.count(grid.cell(v, p.bins), true);
    }
    h.counts
}

proptest! {
    #[test]
    fn incremental_window_statistics_equal_a_recomputation(
        xs in prop::collection::vec(-1e3f64..1e3, 1..400), cap in 1usize..40,
    ) {
        let mut w = Window::new(cap, xs[0]);
        for (i, &x) in xs.iter().enumerate() {
            w.push(x);
            let raw: Vec<f64> = xs[(i + 1).saturating_sub(cap)..=i].to_vec();
            prop_assert_eq!(w.values.iter().copied().collect::<Vec<_>>(), raw.clone());
            let n = raw.len() as f64;
            let mean = raw.iter().sum::<f64>() / n;
            let std = (raw.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
            let (m, s) = w.mean_std();
            prop_assert!((m - mean).abs() < 1e-9 * (1.0 + mean.abs()), "mean {} vs {}", m, mean);
            prop_assert!((s - std).abs() < 1e-6 * (1.0 + std), "std {} vs {}", s, std);
        }
    }

    #[test]
    fn the_recent_histogram_equals_a_recount_and_scores_stay_in_range(
        xs in prop::collection::vec(prop_oneof![-50f64..50.0, Just(0.0), -1e6f64..1e6], 160..600),
        short in 2usize..40,
    ) {
        let p = Params { warmup: 150, short, ..Params::default() };
        let mut s = State::new(&p);
        for &x in &xs {
            if let Some(st) = s.push(&p, x) {
                prop_assert!((0.0..=10.0).contains(&st.score) && st.score <= st.unsuppressed + 1e-12);
                prop_assert!((0.0..=1.0).contains(&st.raw) && (0.0..=1.0).contains(&st.tail));
            }
            if s.grid.is_some() {
                prop_assert!(s.recent.values.len() <= short);
                prop_assert_eq!(&s.recent_hist.counts, &recount(&s, &p));
                prop_assert_eq!(s.recent_hist.total as usize, s.recent.values.len());
                prop_assert_eq!(s.contexts_set, s.contexts.iter().map(|w| w.count_ones()).sum::<u32>());
                let shares: f64 = s.ref_hist.iter().sum();
                prop_assert!((shares - 1.0).abs() < 1e-9, "reference shares sum to {}", shares);
            }
        }
    }
}
