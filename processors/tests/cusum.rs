//! `cusum`: Page's recursion against the brute-force maximum of partial sums, the interpolated
//! seasonal baseline against a tent-function sum, the run length of the chart against
//! Siegmund's formula by simulation, the whole model's false-alarm rate on in-control seasonal
//! series, fast faults caught within minutes, and the processor's output and checkpoint.

use inferwatch_core::pdata::Signal;
use inferwatch_processors::cusum::model::{self, DAY_NS, Model, Params, WEEK_NS, decision_interval, page_step};
use inferwatch_processors::cusum::{CusumConfig, CusumFactory};
use inferwatch_processors::detect::point::PointConfig;
use inferwatch_processors::detect::{LEVEL, SCORE};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{gauge, gauge_points, kv, metrics_request, point};
use inferwatch_testkit::rng::SplitMix64;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use proptest::prelude::*;
use serde_json::json;

const MIN: u64 = 60_000_000_000;
/// A Monday 00:00 UTC (2023-11-13).
const MONDAY: u64 = 1_699_833_600_000_000_000;
const METRIC: &str = "llm.ttft.p95";

fn params(extra: serde_json::Value) -> Params {
    let mut cfg = json!({"metrics": [METRIC]});
    if let (Some(o), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let c: CusumConfig = serde_json::from_value(cfg).unwrap();
    c.check().unwrap().0.params().clone()
}

proptest! {
    #[test]
    fn page_recursion_is_the_maximum_of_partial_sums(xs in prop::collection::vec(-4.0f64..4.0, 1..200), k in 0.0f64..2.0) {
        let mut s = 0.0;
        for n in 0..xs.len() {
            s = page_step(s, xs[n], k, f64::INFINITY);
            // S_n = max(0, max_j Σ_{i=j..n} (x_i − k)).
            let brute = (0..=n).map(|j| xs[j..=n].iter().map(|x| x - k).sum::<f64>()).fold(0.0f64, f64::max);
            prop_assert!((s - brute).abs() < 1e-9, "n {}: {} vs {}", n, s, brute);
        }
    }

    #[test]
    fn the_baseline_interpolates_the_profiles_between_slot_centres(
        daily in prop::collection::vec(-1.0f32..1.0, 24),
        weekly in prop::collection::vec(-1.0f32..1.0, 168),
        level in -3.0f64..3.0,
        t in 0u64..(3 * WEEK_NS),
    ) {
        let p = params(json!({}));
        let m = Model { level, daily: daily.clone(), weekly: weekly.clone(), ..Model::new(&p) };
        // Brute force: each slot's value spread by a tent of one slot's width around its centre.
        let slot = 3_600_000_000_000u64;
        let tent = |values: &[f32], period: u64| -> f64 {
            let x = (t % period) as f64;
            values.iter().enumerate().map(|(i, &v)| {
                let centre = (i as f64 + 0.5) * slot as f64;
                let d = (x - centre).abs();
                let d = d.min(period as f64 - d);
                f64::from(v) * (1.0 - d / slot as f64).max(0.0)
            }).sum()
        };
        let brute = level + tent(&daily, DAY_NS) + tent(&weekly, WEEK_NS);
        prop_assert!((m.baseline(&p, t) - brute).abs() < 1e-5, "{} vs {}", m.baseline(&p, t), brute);
    }
}

#[test]
fn the_run_length_of_the_chart_follows_siegmund() {
    // In-control N(0, 1) increments, k = 0.5 and k = 1, the interval solved for ARL 300: the mean
    // run length of 2,000 runs is within 10 % of 300 (the approximation is good to a few %).
    let mut rng = SplitMix64(42);
    for k in [0.5, 1.0] {
        let h = decision_interval(300.0, k);
        let runs = 2000;
        let mut total = 0u64;
        for _ in 0..runs {
            let (mut s, mut n) = (0.0, 0u64);
            while s <= h {
                s = page_step(s, rng.normal(), k, f64::INFINITY);
                n += 1;
            }
            total += n;
        }
        let arl = total as f64 / runs as f64;
        assert!((arl / 300.0 - 1.0).abs() < 0.10, "k {k}, h {h:.3}: ARL {arl:.1}");
    }
}

/// A seasonal latency series: `base` × a daily swing (peak mid-afternoon, ±`amp`) × a weekend dip
/// × log-normal noise of `sd`, one point a minute.
fn seasonal(rng: &mut SplitMix64, i: u64, base: f64, amp: f64, sd: f64) -> f64 {
    let t = MONDAY + i * MIN;
    let hour = ((t % DAY_NS) as f64) / 3.6e12;
    let day = (i / 1440) % 7;
    let daily = 1.0 + amp * ((hour - 9.0) / 24.0 * std::f64::consts::TAU).sin();
    let weekend = if day >= 5 { 0.8 } else { 1.0 };
    base * daily * weekend * (sd * rng.normal()).exp()
}

/// Warning episodes (entries to level ≥ 0.6) and critical entries of `model` over `xs`, after a
/// 1-day learning period.
fn episodes(p: &Params, xs: &[f64]) -> (u32, u32) {
    let mut m = Model::new(p);
    let (mut warn, mut crit, mut in_warn, mut in_crit) = (0, 0, false, false);
    for (i, &x) in xs.iter().enumerate() {
        let Some(s) = m.push(p, MONDAY + i as u64 * MIN, x.ln()) else { continue };
        let l = inferwatch_processors::cusum::level(s.stat, s.h_warning, s.h_critical);
        let (w, c) = (l >= 0.6, l >= 0.8);
        if i >= 1440 {
            warn += u32::from(w && !in_warn);
            crit += u32::from(c && !in_crit);
        }
        (in_warn, in_crit) = (w, c);
    }
    (warn, crit)
}

#[test]
fn in_control_false_alarms_stay_below_the_configured_rate_and_follow_it() {
    // 20 seasonal series of 31 days (30 scored) with Gaussian noise on the log. The configured rate
    // bounds the realised one (the tail factor and the two-point confirmation make the model
    // conservative), and the realised rate rises with the configured one — a model ignoring
    // its setting fails one or the other. Criticals (a 100× lower rate) stay at most 1.
    let run = |rate: f64| {
        let p = params(
            json!({"false_alarms_per_30d": rate, "critical_false_alarms_per_30d": rate / 100.0, "min_ratio": 1.0}),
        );
        let mut rng = SplitMix64(7);
        let (mut warn, mut crit) = (0, 0);
        for _ in 0..20 {
            let xs: Vec<f64> = (0..31 * 1440).map(|i| seasonal(&mut rng, i, 0.4, 0.5, 0.08)).collect();
            let (w, c) = episodes(&p, &xs);
            warn += w;
            crit += c;
        }
        (f64::from(warn) / 20.0, crit)
    };
    let (low, low_crit) = run(3.0);
    let (high, high_crit) = run(60.0);
    assert!(low <= 3.0 && high <= 60.0, "realised {low} at 3 and {high} at 60 warnings per 30 days");
    assert!(high > 2.0 * low.max(0.5), "realised {high} at 60 against {low} at 3");
    assert!(low_crit <= 1 && high_crit <= 20, "criticals {low_crit} and {high_crit}");
}

#[test]
fn steps_ramps_and_bursts_are_caught_within_minutes_and_nothing_before() {
    // 3 weeks of a seasonal series, then a fault on day 21 at a quiet hour and at the peak.
    let p = params(json!({}));
    for (start_min, shape) in
        [(21 * 1440 + 4 * 60, "step"), (21 * 1440 + 15 * 60, "ramp"), (21 * 1440 + 15 * 60, "burst")]
    {
        let mut rng = SplitMix64(start_min + shape.len() as u64);
        let mut m = Model::new(&p);
        let mut first = None;
        for i in 0..start_min + 60 {
            let mut x = seasonal(&mut rng, i, 0.4, 0.5, 0.08);
            let d = i as i64 - start_min as i64;
            x *= match shape {
                "step" if (0..30).contains(&d) => 2.0,
                "ramp" if (0..15).contains(&d) => 1.0 + 2.0 * (d + 1) as f64 / 15.0,
                "burst" if (0..2).contains(&d) => 2.5,
                _ => 1.0,
            };
            let Some(s) = m.push(&p, MONDAY + i * MIN, x.ln()) else { continue };
            let l = inferwatch_processors::cusum::level(s.stat, s.h_warning, s.h_critical);
            if l >= 0.6 && i >= 1440 {
                assert!(d >= 0, "{shape}: alarm {} min before the onset", -d);
                first.get_or_insert(d);
            }
        }
        let d = first.unwrap_or_else(|| panic!("{shape} not detected"));
        assert!(d <= 5, "{shape} detected {d} min after the onset");
    }
}

fn harness() -> Harness {
    Harness::create(&CusumFactory, "cusum", &json!({"metrics": [METRIC]}), Signal::Metrics)
}

fn minute(i: u64, rng: &mut SplitMix64) -> ExportMetricsServiceRequest {
    let x = seasonal(rng, i, 0.4, 0.5, 0.05) * if (600..620).contains(&i) { 3.0 } else { 1.0 };
    let t = MONDAY + i * MIN;
    metrics_request(
        vec![kv("service.name", "vllm")],
        None,
        vec![
            gauge(METRIC, "s", vec![point(vec![kv("instance", "a")], t, x)]),
            gauge("llm.tps", "1/s", vec![point(vec![kv("instance", "a")], t, 1000.0)]),
        ],
    )
}

#[test]
fn the_processor_scores_with_evidence_and_checkpoints_round_trip() {
    let mut h = harness();
    let mut rng = SplitMix64(3);
    let mut levels = Vec::new();
    for i in 0..400 {
        for req in h.process_metrics(&minute(i, &mut rng)) {
            for p in gauge_points(&req) {
                assert_eq!(p.attr("detector"), "cusum");
                assert_eq!(p.attr("metric"), METRIC, "only the configured metric is scored");
                if p.name == SCORE {
                    assert!(p.num("cusum.h_warning") > 0.0 && p.num("cusum.h_critical") >= p.num("cusum.h_warning"));
                    assert!((p.num("cusum.baseline") / 0.4 - 1.0).abs() < 0.6, "{p:?}");
                } else {
                    assert_eq!(p.name, LEVEL);
                    levels.push((i, p.value));
                }
            }
        }
    }
    assert_eq!(levels.len(), 400 - 30, "scored from the 31st point on");
    let bytes = h.proc.snapshot().unwrap();
    let mut other = harness();
    assert!(other.proc.restore(&bytes[..bytes.len() - 5]).is_err(), "truncated checkpoint restored");
    other.proc.restore(&bytes).unwrap();
    let (mut r1, mut r2) = (SplitMix64(9), SplitMix64(9));
    let mut fired = None;
    for i in 400..700 {
        let (a, b) = (h.process_metrics(&minute(i, &mut r1)), other.process_metrics(&minute(i, &mut r2)));
        assert_eq!(a, b, "restored state diverged at minute {i}");
        for p in a.iter().flat_map(gauge_points) {
            if p.name == LEVEL && p.value >= 0.6 {
                fired.get_or_insert(i);
            }
        }
    }
    assert!(fired.is_some_and(|i| (600..605).contains(&i)), "the ×3 step at minute 600 first alarmed at {fired:?}");
}

#[test]
fn the_direction_and_the_transform_are_honoured() {
    // A fall is not an alarm when only rises are scored, and is one when both are.
    let fall = |dir: &str| {
        let p = params(json!({"direction": dir, "season": "none", "transform": "none", "min_std": 0.001}));
        let mut m = Model::new(&p);
        let mut rng = SplitMix64(1);
        let mut max_down = 0.0f64;
        for i in 0..400u64 {
            let x = 10.0 + 0.1 * rng.normal() - if i >= 300 { 2.0 } else { 0.0 };
            if let Some(s) = m.push(&p, MONDAY + i * MIN, x)
                && i >= 300
                && s.side < 0
            {
                max_down = max_down.max(s.stat / s.h_warning);
            }
        }
        max_down
    };
    assert_eq!(fall("above"), 0.0);
    assert!(fall("both") > 1.0 && fall("below") > 1.0);
    let _ = model::Direction::Both;
}

#[test]
fn critical_needs_a_material_change() {
    // A stable series shifted by ×1.3 (below min_ratio 1.5) for 3 hours warns but never goes
    // critical; a ×3 step goes critical within minutes.
    let worst = |factor: f64| {
        let mut h = harness();
        let mut rng = SplitMix64(4);
        let mut max_level = 0.0f64;
        let mut first_critical = None;
        for i in 0..(2 * 1440 + 180) {
            let x = 0.4 * (0.02 * rng.normal()).exp() * if i >= 2 * 1440 { factor } else { 1.0 };
            let t = MONDAY + i * MIN;
            let req = metrics_request(vec![], None, vec![gauge(METRIC, "s", vec![point(vec![], t, x)])]);
            for p in h.process_metrics(&req).iter().flat_map(gauge_points) {
                if p.name == LEVEL && i >= 2 * 1440 {
                    max_level = max_level.max(p.value);
                    if p.value >= 0.8 {
                        first_critical.get_or_insert(i - 2 * 1440);
                    }
                }
            }
        }
        (max_level, first_critical)
    };
    let (small, small_crit) = worst(1.3);
    assert!((0.6..0.8).contains(&small) && small_crit.is_none(), "×1.3: level {small}, critical at {small_crit:?}");
    let (big, big_crit) = worst(3.0);
    assert!(big >= 0.8 && big_crit.is_some_and(|m| m <= 5), "×3: level {big}, critical at {big_crit:?}");
}

#[test]
fn a_quiet_night_does_not_forget_the_baseline() {
    // The default idle_timeout (7 d) keeps a series through hours without traffic; a week without
    // points forgets it.
    let mut h = harness();
    let mut rng = SplitMix64(8);
    for i in 0..60 {
        h.process_metrics(&minute(i, &mut rng));
    }
    assert_eq!(h.proc.series_count(), 1);
    h.advance_metrics(MONDAY + 60 * MIN + 6 * 3_600_000_000_000);
    assert_eq!(h.proc.series_count(), 1, "a 6-hour gap forgot the series");
    h.advance_metrics(MONDAY + 60 * MIN + 8 * 86_400_000_000_000);
    assert_eq!(h.proc.series_count(), 0);
    assert_eq!(h.evicted("idle"), 1);
}
