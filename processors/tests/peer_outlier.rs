//! `peer_outlier` through the ArrowProcessor harness on synthetic fleets shaped like
//! `llm_signals`' output (one `llm.ttft.p95` point per replica and minute, the replica and the
//! model as point attributes), with realistic noise: a static per-replica bias, lognormal
//! per-window noise, rare one-window spikes, a slow daily drift and fleet-wide traffic peaks.

use inferwatch_core::pdata::Signal;
use inferwatch_core::state::{StateError, seal, unseal};
use inferwatch_processors::peer_outlier::{PeerOutlierFactory, STATE_VERSION};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{self, GaugePoint, gauge, gauge_points, kv, point, scope};
use inferwatch_testkit::rng::SplitMix64;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

const S: u64 = 1_000_000_000;
const MIN: u64 = 60 * S;
/// A minute boundary in 2023.
const BASE: u64 = 1_700_000_040 * S;
const METRIC: &str = "llm.ttft.p95";
const LEVEL: &str = "llm.anomaly.level";

/// One synthetic fleet of one model.
#[derive(Debug, Clone)]
struct Fleet {
    model: &'static str,
    replicas: usize,
    /// Median TTFT p95 of a healthy replica (s).
    base: f64,
    /// σ of the per-window lognormal noise (0.05 = 5 %).
    noise: f64,
    /// σ of the static per-replica bias (lognormal).
    bias: f64,
    /// Probability of a one-window spike (×1.5) per replica and window.
    spikes: f64,
    /// (replica, onset minute, relative size): from onset, that replica is (1 + size)× slower.
    degrade: Option<(usize, u64, f64)>,
    /// (start minute, minutes, +relative): every replica slower together, 5-minute ramps.
    peak: Option<(u64, u64, f64)>,
    minutes: u64,
    seed: u64,
}

impl Fleet {
    fn new(model: &'static str, replicas: usize, seed: u64) -> Self {
        Fleet {
            model,
            replicas,
            base: 0.25,
            noise: 0.07,
            bias: 0.02,
            spikes: 0.01,
            degrade: None,
            peak: None,
            minutes: 180,
            seed,
        }
    }

    fn replica(i: usize) -> String {
        format!("vllm-{i}")
    }

    /// The fleet-wide factor of minute `m` (traffic peak with 5-minute ramps, daily drift).
    fn fleet_factor(&self, m: u64) -> f64 {
        let drift = 1.0 + 0.1 * (std::f64::consts::TAU * m as f64 / 1440.0).sin();
        let peak = match self.peak {
            Some((start, len, size)) if m >= start && m < start + len => {
                let ramp = 5.0f64;
                let up = ((m - start) as f64 + 1.0) / ramp;
                let down = ((start + len - m) as f64) / ramp;
                size * up.min(down).min(1.0)
            }
            _ => 0.0,
        };
        drift * (1.0 + peak)
    }

    /// Per minute, each replica's (name, time, value).
    fn points(&self) -> Vec<Vec<(String, u64, f64)>> {
        let mut rng = SplitMix64(self.seed);
        let bias: Vec<f64> = (0..self.replicas).map(|_| (self.bias * rng.normal()).exp()).collect();
        // How strongly each replica feels a traffic peak (±5 %).
        let sensitivity: Vec<f64> = (0..self.replicas).map(|_| (0.05 * rng.normal()).exp()).collect();
        (0..self.minutes)
            .map(|m| {
                let f = self.fleet_factor(m);
                (0..self.replicas)
                    .map(|i| {
                        let mut v = self.base * bias[i] * (1.0 + (f - 1.0) * sensitivity[i]);
                        v *= (self.noise * rng.normal()).exp();
                        if rng.unit() < self.spikes {
                            v *= 1.5;
                        }
                        if let Some((r, onset, size)) = self.degrade
                            && r == i
                            && m >= onset
                        {
                            v *= 1.0 + size;
                        }
                        // llm_signals writes its window's points at the window end, a little after it.
                        let jitter = rng.below(2 * S);
                        (Self::replica(i), BASE + m * MIN + jitter, v)
                    })
                    .collect()
            })
            .collect()
    }
}

/// One minute of several fleets as one request (llm_signals' resource and scope, the model and
/// the replica as point attributes).
fn request(
    minute: &[(&'static str, String, u64, f64)],
) -> opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest {
    let dps = minute
        .iter()
        .map(|(model, replica, t, v)| {
            point(
                vec![
                    kv("gen_ai.request.model", model),
                    kv("service.name", "vllm"),
                    kv("service.instance.id", replica),
                    kv("source", "spans"),
                ],
                *t,
                *v,
            )
        })
        .collect();
    otlp::metrics_request(
        vec![kv("service.name", "inferwatch")],
        scope("inferwatch.llm_signals", "0.1"),
        vec![gauge(METRIC, "s", dps)],
    )
}

fn harness(cfg: serde_json::Value) -> Harness {
    Harness::create(&PeerOutlierFactory, "peer_outlier/test", &cfg, Signal::Metrics)
}

/// Feeds `fleets` minute by minute (the watermark following the newest point, as the stage
/// advances it with `allowed_lateness: 0`) from minute `from` to `to`; returns the level points.
fn run_range(h: &mut Harness, fleets: &[Fleet], from: u64, to: u64) -> Vec<GaugePoint> {
    let per: Vec<Vec<Vec<(String, u64, f64)>>> = fleets.iter().map(Fleet::points).collect();
    let mut out = Vec::new();
    for m in from..to {
        let mut minute = Vec::new();
        for (f, pts) in fleets.iter().zip(&per) {
            for (r, t, v) in &pts[m as usize] {
                minute.push((f.model, r.clone(), *t, *v));
            }
        }
        let wm = minute.iter().map(|p| p.2).max().unwrap_or(0);
        h.process_metrics(&request(&minute));
        for req in h.advance_metrics(wm) {
            out.extend(gauge_points(&req).into_iter().filter(|p| p.name == LEVEL));
        }
    }
    out
}

fn run(h: &mut Harness, fleets: &[Fleet]) -> Vec<GaugePoint> {
    let minutes = fleets.iter().map(|f| f.minutes).min().unwrap_or(0);
    run_range(h, fleets, 0, minutes)
}

fn flagged(levels: &[GaugePoint]) -> Vec<&GaugePoint> {
    levels.iter().filter(|p| p.value >= 0.6).collect()
}

fn minute_of(p: &GaugePoint) -> f64 {
    (p.time - BASE) as f64 / MIN as f64
}

#[test]
fn one_degrading_replica_of_eight_is_flagged_within_ten_minutes_and_named() {
    let mut fleet = Fleet::new("llama-3-8b", 8, 11);
    let onset = 120;
    fleet.degrade = Some((5, onset, 0.3));
    let mut h = harness(json!({}));
    let levels = run(&mut h, &[fleet]);
    // Every replica is judged in every window (7 peers each).
    assert_eq!(levels.len(), 8 * 179, "one level per replica and closed window");
    let hits = flagged(&levels);
    assert!(!hits.is_empty(), "the degrading replica is flagged");
    let names: BTreeSet<&str> = hits.iter().map(|p| p.attr("service.instance.id")).collect();
    assert_eq!(names, BTreeSet::from(["vllm-5"]), "only the degrading replica");
    // Window [m, m+1) closes at m+1: the first window after onset ends at onset + 1.
    let first = hits.iter().map(|p| minute_of(p)).fold(f64::INFINITY, f64::min);
    assert!(first > onset as f64, "nothing before onset: first at minute {first}");
    let delay = first - onset as f64;
    assert!(delay <= 10.0, "flagged {delay} min after onset");
    println!("peer_outlier: 8 replicas, +30 % at minute {onset}: flagged after {delay} min");
    let p = hits[0];
    assert_eq!(p.attr("detector"), "peer_outlier");
    assert_eq!(p.attr("metric"), METRIC);
    assert_eq!(p.attr("gen_ai.request.model"), "llama-3-8b");
    assert_eq!(p.num("peer_outlier.peers"), 7.0);
    assert!(p.num("peer_outlier.streak") >= 3.0);
    let rel = p.num("peer_outlier.relative_deviation");
    assert!((0.1..0.7).contains(&rel), "relative deviation {rel}");
    let med = p.num("peer_outlier.peer_median");
    assert!((0.2..0.32).contains(&med), "peer median {med}");
    let dev = p.num("peer_outlier.deviation");
    assert!((p.num("peer_outlier.value") - med - dev).abs() < 1e-12);
    assert!(p.num("peer_outlier.peer_mad") > 0.0);
    assert_eq!(p.resource.get("service.name").map(String::as_str), Some("inferwatch"));
    // The level stays up while the replica stays slow (most windows after the first flag).
    let after: Vec<&GaugePoint> =
        levels.iter().filter(|p| p.attr("service.instance.id") == "vllm-5" && minute_of(p) > first).collect();
    let up = after.iter().filter(|p| p.value >= 0.6).count();
    assert!(up * 10 >= after.len() * 9, "flagged in {up} of {} windows after the first", after.len());
}

#[test]
fn cusum_integrates_a_steady_deviation_that_never_reaches_the_threshold() {
    // +7.5 % on one replica of 8 with 2 % noise and no static bias: against the floor of 10 %
    // / threshold 4 (2.5 % of the median) z ≈ 3 in the windows after onset, below the threshold,
    // so `consecutive` never flags it; the CUSUM (slack 1, limit 6) accumulates about 2 per
    // window and flags it within 5 windows, naming only that replica.
    let mut fleet = Fleet::new("llama-3-8b", 8, 23);
    (fleet.noise, fleet.bias, fleet.spikes, fleet.minutes) = (0.02, 0.0, 0.0, 150);
    let onset = 100;
    fleet.degrade = Some((2, onset, 0.075));
    let base = json!({"threshold": 4.0, "min_relative_deviation": 0.1});
    let consecutive = run(&mut harness(base.clone()), std::slice::from_ref(&fleet));
    assert!(flagged(&consecutive).is_empty(), "z stays under the threshold: {:?}", flagged(&consecutive).first());
    let mut cfg = base;
    cfg["persistence"] = json!("cusum");
    let levels = run(&mut harness(cfg), &[fleet]);
    let hits = flagged(&levels);
    let names: BTreeSet<&str> = hits.iter().map(|p| p.attr("service.instance.id")).collect();
    assert_eq!(names, BTreeSet::from(["vllm-2"]), "only the degraded replica");
    let first = hits.iter().map(|p| minute_of(p)).fold(f64::INFINITY, f64::min);
    assert!(first > onset as f64 && first - onset as f64 <= 5.0, "flagged at minute {first}");
    assert_eq!(hits[0].attr("peer_outlier.persistence"), "cusum");
    assert!(hits[0].num("peer_outlier.evidence") >= 6.0, "{:?}", hits[0]);
    assert!(hits[0].num("peer_outlier.streak") < 4.0, "not 4 windows at the threshold: {:?}", hits[0]);
}

#[test]
fn a_fleet_wide_traffic_peak_raises_nothing() {
    let mut fleet = Fleet::new("llama-3-8b", 8, 12);
    fleet.peak = Some((60, 30, 0.8));
    fleet.minutes = 150;
    let mut h = harness(json!({}));
    let levels = run(&mut h, &[fleet]);
    assert_eq!(levels.len(), 8 * 149);
    let hits = flagged(&levels);
    assert!(hits.is_empty(), "flagged during a fleet-wide peak: {:?}", hits.first());
    // The peak was there: the peer median rose by ~80 % and came back.
    let med = |m: f64| {
        levels.iter().filter(|p| minute_of(p) == m).map(|p| p.num("peer_outlier.peer_median")).sum::<f64>() / 8.0
    };
    assert!(med(80.0) > 1.6 * med(40.0), "median {} at the peak, {} before", med(80.0), med(40.0));
    assert!(med(120.0) < 1.2 * med(40.0));
    // The same peak on one replica alone is flagged (the test can fail).
    let mut alone = Fleet::new("llama-3-8b", 8, 12);
    alone.degrade = Some((2, 60, 0.8));
    alone.minutes = 90;
    let hits_alone = run(&mut harness(json!({})), &[alone]);
    assert!(flagged(&hits_alone).iter().any(|p| p.attr("service.instance.id") == "vllm-2"));
}

#[test]
fn below_min_peers_nothing_is_raised() {
    let mut fleet = Fleet::new("llama-3-8b", 2, 13);
    fleet.degrade = Some((1, 30, 0.5));
    fleet.minutes = 90;
    let levels = run(&mut harness(json!({})), std::slice::from_ref(&fleet));
    assert_eq!(levels.len(), 2 * 89, "both replicas are scored (1 peer each)");
    assert!(levels.iter().all(|p| p.value == 0.0), "level 0 below min_peers");
    assert!(levels.iter().all(|p| p.num("peer_outlier.peers") == 1.0));
    // With min_peers 1 the same data flags the replica: the gate is what kept it quiet.
    let levels = run(&mut harness(json!({"min_peers": 1})), &[fleet]);
    let names: BTreeSet<&str> = flagged(&levels).iter().map(|p| p.attr("service.instance.id")).collect();
    assert!(names.contains("vllm-1"), "{names:?}");
}

#[test]
fn two_models_in_one_stream_are_kept_apart() {
    // Same replica names in both fleets; the 70B model is 4× slower than the 8B one.
    let small = Fleet::new("llama-3-8b", 8, 21);
    let mut big = Fleet::new("llama-3-70b", 8, 22);
    big.base = 1.0;
    big.degrade = Some((3, 60, 0.4));
    big.minutes = 120;
    let mut small = small;
    small.minutes = 120;
    let mut h = harness(json!({}));
    let levels = run(&mut h, &[small, big]);
    assert_eq!(h.proc.series_count(), 16, "8 replicas × 2 models");
    assert_eq!(levels.len(), 16 * 119);
    assert!(levels.iter().all(|p| p.num("peer_outlier.peers") == 7.0), "peers are the same model's");
    let hits = flagged(&levels);
    let who: BTreeSet<(&str, &str)> =
        hits.iter().map(|p| (p.attr("gen_ai.request.model"), p.attr("service.instance.id"))).collect();
    assert_eq!(who, BTreeSet::from([("llama-3-70b", "vllm-3")]));
    let med_small = levels
        .iter()
        .filter(|p| p.attr("gen_ai.request.model") == "llama-3-8b")
        .map(|p| p.num("peer_outlier.peer_median"))
        .fold(0.0, f64::max);
    assert!(med_small < 0.4, "the 8B fleet's median never sees the 70B values: {med_small}");
}

#[test]
fn a_checkpoint_continues_the_streak() {
    let mut fleet = Fleet::new("llama-3-8b", 8, 31);
    fleet.noise = 0.03;
    fleet.spikes = 0.0;
    fleet.degrade = Some((4, 20, 0.6));
    fleet.minutes = 40;
    let cfg = json!({"for_windows": 3});
    let level_of = |levels: &[GaugePoint], m: f64| {
        levels.iter().find(|p| p.attr("service.instance.id") == "vllm-4" && minute_of(p) == m).map(|p| p.value)
    };
    // Uninterrupted: windows 20, 21 are pending, 22 (closing at 23) is flagged.
    let mut whole = harness(cfg.clone());
    let all = run(&mut whole, std::slice::from_ref(&fleet));
    let flags: Vec<f64> = (21..=23).map(|m| level_of(&all, m as f64).unwrap_or(-1.0)).collect();
    assert!(flags[0] > 0.0 && flags[0] < 0.6 && flags[1] < 0.6 && flags[2] >= 0.6, "{flags:?}");
    // Cut after two pending windows, restored into a fresh processor: the third flags.
    let mut first = harness(cfg.clone());
    let before = run_range(&mut first, std::slice::from_ref(&fleet), 0, 23);
    assert!(level_of(&before, 22.0).is_some_and(|l| l > 0.0 && l < 0.6));
    let mut second = first.restore_into(harness(cfg.clone()));
    let after = run_range(&mut second, std::slice::from_ref(&fleet), 23, 40);
    assert!(level_of(&after, 23.0).is_some_and(|l| l >= 0.6), "the streak went on across the checkpoint");
    let mut rest = before.clone();
    rest.extend(after);
    assert_eq!(rest, all, "a restored run emits what the uninterrupted one did");
    // Without the checkpoint the streak starts again (the comparison can fail).
    let mut fresh = harness(cfg.clone());
    let cold = run_range(&mut fresh, std::slice::from_ref(&fleet), 23, 40);
    assert!(level_of(&cold, 23.0).is_none(), "a fresh processor has no window [22, 23)");
    assert!(level_of(&cold, 24.0).is_some_and(|l| l < 0.6));
    assert!(level_of(&all, 24.0).is_some_and(|l| l >= 0.6));
}

#[test]
fn checkpoints_of_another_version_or_window_are_refused() {
    let mut fleet = Fleet::new("llama-3-8b", 5, 41);
    fleet.minutes = 10;
    let mut h = harness(json!({}));
    run(&mut h, &[fleet]);
    let bytes = h.proc.snapshot().unwrap();
    // The stage's envelope refuses another state version.
    assert_eq!(STATE_VERSION, 3);
    let sealed = seal("peer_outlier", STATE_VERSION + 1, &bytes);
    let msg = unseal("stage/peer_outlier", "peer_outlier", STATE_VERSION, &sealed).unwrap_err().to_string();
    assert!(msg.contains("state version 4, this build reads 3"), "{msg}");
    // The kit's own envelope (format, version) too, and the live state is untouched.
    let mut fresh = harness(json!({}));
    let mut fleet2 = Fleet::new("llama-3-8b", 3, 42);
    fleet2.minutes = 3;
    run(&mut fresh, &[fleet2]);
    let held = fresh.proc.series_count();
    let mut other = bytes.clone();
    assert_eq!(other[1], 3, "postcard varint of the state version");
    other[1] = 4;
    match fresh.proc.restore(&other) {
        Err(StateError::Corrupt { message, .. }) => assert!(message.contains("state version 4"), "{message}"),
        e => panic!("want a refusal, got {e:?}"),
    }
    assert!(matches!(fresh.proc.restore(b"garbage"), Err(StateError::Corrupt { .. })));
    assert_eq!(fresh.proc.series_count(), held, "a refused restore leaves the state as it was");
    // Another window is incompatible.
    let mut two = harness(json!({"window": "2m"}));
    assert!(matches!(two.proc.restore(&bytes), Err(StateError::Incompatible { what: "window", .. })));
    fresh.proc.restore(&bytes).unwrap();
    assert_eq!(fresh.proc.series_count(), 5);
}

#[test]
fn max_series_evicts_and_counts_and_idle_replicas_expire() {
    let mut fleet = Fleet::new("llama-3-8b", 12, 51);
    fleet.minutes = 5;
    let mut h = harness(json!({"max_series": 10, "idle_timeout": "3m"}));
    run(&mut h, std::slice::from_ref(&fleet));
    assert!(h.proc.series_count() <= 10, "held {}", h.proc.series_count());
    assert!(h.evicted("max_series") >= 2, "evicted {}", h.evicted("max_series"));
    assert_eq!(h.evicted("idle"), 0);
    // The fleet stops; another model keeps the watermark moving: the replicas are forgotten.
    let mut other = Fleet::new("other", 4, 52);
    other.minutes = 20;
    let mut h = harness(json!({"idle_timeout": "3m"}));
    run_range(&mut h, &[fleet, other.clone()], 0, 5);
    assert_eq!(h.proc.series_count(), 16);
    run_range(&mut h, &[other], 5, 12);
    assert_eq!(h.evicted("idle"), 12);
    assert_eq!(h.proc.series_count(), 4);
}

// ---- tuning and held-out evaluation -------------------------------------------------------------

/// What one fleet run gives.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    /// Minutes from onset to the first flag of the degrading replica (None: missed).
    delay: Option<f64>,
    /// Flag episodes (rising edges of level ≥ 0.6) on healthy replicas, or before onset.
    false_alarms: usize,
    /// Replica-hours observed.
    replica_hours: f64,
}

fn outcome(fleet: &Fleet, cfg: &serde_json::Value) -> Outcome {
    let levels = run(&mut harness(cfg.clone()), std::slice::from_ref(fleet));
    let mut by_replica: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for p in &levels {
        by_replica.entry(p.attr("service.instance.id")).or_default().push((minute_of(p), p.value));
    }
    let (bad, onset) = fleet.degrade.map_or((None, f64::INFINITY), |(r, m, _)| (Some(Fleet::replica(r)), m as f64));
    let mut o = Outcome { replica_hours: fleet.replicas as f64 * fleet.minutes as f64 / 60.0, ..Outcome::default() };
    for (name, series) in by_replica {
        let degraded = bad.as_deref() == Some(name);
        let mut up = false;
        for (m, l) in series {
            let now = l >= 0.6;
            if now && !up {
                if degraded && m > onset {
                    if o.delay.is_none() {
                        o.delay = Some(m - onset);
                    }
                } else {
                    o.false_alarms += 1;
                }
            }
            up = now;
        }
    }
    o
}

/// A family of fleets: sizes, noise levels, degradation sizes, seeds.
fn family(seeds: std::ops::Range<u64>, sizes: &[usize], noises: &[f64], sizes_deg: &[f64]) -> Vec<Fleet> {
    let mut out = Vec::new();
    for seed in seeds {
        let mut rng = SplitMix64(seed * 7919);
        let n = sizes[rng.below(sizes.len() as u64) as usize];
        let mut f = Fleet::new("m", n, seed);
        f.noise = noises[rng.below(noises.len() as u64) as usize];
        f.minutes = 240;
        let size = sizes_deg[rng.below(sizes_deg.len() as u64) as usize];
        f.degrade = Some((rng.below(n as u64) as usize, 150, size));
        // Every other fleet also has a fleet-wide peak before the onset.
        if seed % 2 == 0 {
            f.peak = Some((40, 30, 0.8));
        }
        out.push(f);
    }
    out
}

struct Summary {
    detected: usize,
    fleets: usize,
    median_delay: f64,
    max_delay: f64,
    within_10: usize,
    false_alarms: usize,
    replica_hours: f64,
}

fn summarize(fleets: &[Fleet], cfg: &serde_json::Value) -> Summary {
    let outs: Vec<Outcome> = fleets.iter().map(|f| outcome(f, cfg)).collect();
    let mut delays: Vec<f64> = outs.iter().filter_map(|o| o.delay).collect();
    delays.sort_by(f64::total_cmp);
    Summary {
        detected: delays.len(),
        fleets: fleets.len(),
        median_delay: if delays.is_empty() { f64::NAN } else { delays[delays.len() / 2] },
        max_delay: delays.last().copied().unwrap_or(f64::NAN),
        within_10: delays.iter().filter(|d| **d <= 10.0).count(),
        false_alarms: outs.iter().map(|o| o.false_alarms).sum(),
        replica_hours: outs.iter().map(|o| o.replica_hours).sum(),
    }
}

/// Tuning on seed set A (8 and 12 replicas, 7 % noise, +30 %), then the held-out family B (other
/// seeds, 5–20 replicas, 5–10 % noise, +20–50 %) with the chosen (default) parameters. Prints
/// the figures (`cargo test -p inferwatch-processors --test processors_tests peer_outlier_tuning -- --nocapture`).
#[test]
fn peer_outlier_tuning_and_held_out_figures() {
    let set_a = family(100..112, &[8, 12], &[0.07], &[0.3]);
    println!("tuning on set A ({} fleets, 4 h each, onset at 2.5 h):", set_a.len());
    println!(
        "spread threshold for_windows scale_smoothing | detected ≤10min median_delay max_delay | false alarms (per 1000 replica-h)"
    );
    for (spread, threshold, for_windows, smoothing) in [
        ("mad", 2.5, 3, 0.1),
        ("mad", 2.5, 4, 0.1),
        ("mad", 2.5, 6, 0.1),
        ("mad", 3.0, 3, 0.1),
        ("mad", 2.5, 3, 1.0),
        ("tail", 2.0, 3, 0.1),
        ("tail", 2.0, 4, 0.1),
        ("tail", 2.5, 2, 0.1),
        ("tail", 2.5, 3, 0.1),
        ("tail", 2.5, 4, 0.1),
        ("tail", 2.5, 5, 0.1),
        ("tail", 2.5, 6, 0.1),
        ("tail", 3.0, 3, 0.1),
        ("tail", 2.5, 4, 1.0),
    ] {
        {
            let cfg = json!({"scale_spread": spread, "threshold": threshold, "for_windows": for_windows, "scale_smoothing": smoothing});
            let s = summarize(&set_a, &cfg);
            println!(
                "{spread:>6} {threshold:9} {for_windows:11} {smoothing:15} | {:>2}/{} {:>2} {:>6.1} {:>6.1} | {} ({:.1})",
                s.detected,
                s.fleets,
                s.within_10,
                s.median_delay,
                s.max_delay,
                s.false_alarms,
                1000.0 * s.false_alarms as f64 / s.replica_hours
            );
        }
    }
    let held_out = family(500..530, &[5, 6, 10, 15, 20], &[0.05, 0.08, 0.1], &[0.2, 0.3, 0.4, 0.5]);
    let off = summarize(&held_out, &json!({"scale_smoothing": 1.0}));
    println!(
        "held-out, the window's own spread only (scale_smoothing 1): detected {}/{}, median delay {:.1} min, false alarms {} \
         ({:.2} per 1000 replica-h)",
        off.detected,
        off.fleets,
        off.median_delay,
        off.false_alarms,
        1000.0 * off.false_alarms as f64 / off.replica_hours
    );
    let old = summarize(&held_out, &json!({"scale_spread": "mad", "for_windows": 6}));
    println!(
        "held-out, the previous default (scale_spread mad, for_windows 6): detected {}/{}, within 10 min {}, \
         median delay {:.1} min, max {:.1} min, false alarms {}",
        old.detected, old.fleets, old.within_10, old.median_delay, old.max_delay, old.false_alarms
    );
    let s = summarize(&held_out, &json!({}));
    println!(
        "held-out family B ({} fleets, defaults threshold 2.5, for_windows 4, scale_spread tail): detected {}/{}, within 10 min {}, \
         median delay {:.1} min, max {:.1} min, false alarms {} in {:.0} replica-hours ({:.2} per 1000 replica-h)",
        s.fleets,
        s.detected,
        s.fleets,
        s.within_10,
        s.median_delay,
        s.max_delay,
        s.false_alarms,
        s.replica_hours,
        1000.0 * s.false_alarms as f64 / s.replica_hours
    );
    // Per degradation size on the held-out family.
    for size in [0.2, 0.3, 0.4, 0.5] {
        let sub: Vec<Fleet> = held_out.iter().filter(|f| f.degrade.is_some_and(|d| d.2 == size)).cloned().collect();
        if sub.is_empty() {
            continue;
        }
        let s = summarize(&sub, &json!({}));
        println!(
            "  +{:.0} %: detected {}/{}, median delay {:.1} min, max {:.1} min, false alarms {}",
            size * 100.0,
            s.detected,
            s.fleets,
            s.median_delay,
            s.max_delay,
            s.false_alarms
        );
    }
    // 75 %: the tail scale detects 23 of 30 (the MAD scale with for_windows 6 24 of 30, but
    // later: 16 within 10 min against 18); the +20 % fleets at 8–10 % noise are mostly missed.
    assert!(s.detected * 4 >= s.fleets * 3, "held-out: detected {} of {}", s.detected, s.fleets);
    assert!(
        (s.false_alarms as f64) / s.replica_hours <= 0.01,
        "held-out: {} false alarms in {} replica-hours",
        s.false_alarms,
        s.replica_hours
    );
}
