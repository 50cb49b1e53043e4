//! The scenario library keeps its promises: fast faults breach their SLO right after the
//! onset and not before, healthy baselines never breach, the A/B pair differs by about 5 ms
//! at p95, and slow drifts breach about N days after onset. Long scenarios are shortened or
//! sampled more sparsely here to keep debug test times low.

use std::path::PathBuf;

use inferwatch_sim::engine::SimDuration;
use inferwatch_sim::scenario::slo::GroundTruth;
use inferwatch_sim::scenario::spec::{DutyCycle, Scenario};
use inferwatch_sim::scenario::{load_scenario, run};

const MIN: u64 = 60_000_000_000;
const DAY: u64 = 86_400_000_000_000;

fn lib(name: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios").join(format!("{name}.yaml"));
    load_scenario(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn truth(sc: &Scenario) -> GroundTruth {
    let dir = std::env::temp_dir().join(format!("inferwatch-sim-lib-{}-{}", sc.name, std::process::id()));
    let summary = run(sc, &dir).unwrap_or_else(|e| panic!("{}: {e}", sc.name));
    let _ = std::fs::remove_dir_all(&dir);
    summary.ground_truth
}

/// The SLO is not breached before the onset and is breached within `within` after it.
fn fast_fault(name: &str, within: u64) {
    let mut sc = lib(name);
    // the SLO windows after onset + 40 minutes do not matter here
    let onset = sc.faults.iter().map(|f| f.onset().secs()).fold(f64::INFINITY, f64::min);
    sc.duration = SimDuration::from_secs(sc.duration.secs().min(onset + 2400.0));
    let gt = truth(&sc);
    let onset = gt.fault_onset_unix_nano.expect("onset");
    let breach = gt.first_breach_unix_nano.unwrap_or_else(|| panic!("{name}: no breach"));
    let w = (gt.slo.window_s * 1e9) as u64;
    println!("{name}: breach {:.1} min after onset", (breach as f64 - onset as f64) / MIN as f64);
    assert!(breach + w > onset, "{name}: breach before onset");
    assert!(breach <= onset + within, "{name}: breach too late");
}

#[test]
fn queue_blocking_weak_breaches_at_onset() {
    fast_fault("queue_blocking_weak", 10 * MIN);
}

#[test]
fn queue_blocking_strong_breaches_at_onset() {
    fast_fault("queue_blocking_strong", 10 * MIN);
}

#[test]
fn kv_pressure_strong_breaches_after_onset() {
    fast_fault("kv_pressure_strong", 30 * MIN);
}

#[test]
fn context_collapse_strong_breaches_after_onset() {
    fast_fault("context_collapse_strong", 30 * MIN);
}

#[test]
fn cold_start_strong_breaches_at_onset() {
    fast_fault("cold_start_strong", 10 * MIN);
}

#[test]
fn healthy_baseline_never_breaches() {
    let mut sc = lib("healthy_daily_weekly");
    sc.duration = SimDuration::from_secs(3.0 * 86_400.0);
    sc.simulate = Some(DutyCycle { window: SimDuration(300.0), every: SimDuration(3.0 * 3600.0) });
    let gt = truth(&sc);
    assert!(gt.healthy);
    assert_eq!(gt.first_breach_unix_nano, None);
    assert!(gt.instances[0].windows_evaluated >= 20);
}

#[test]
fn ab_pair_differs_by_about_5ms_at_p95() {
    let gt = truth(&lib("ab_regression_5ms"));
    let ab = gt.ab.expect("ab block");
    println!("A/B: p95 {:.4} s vs {:.4} s, delta {:.2} ms", ab.baseline_s, ab.candidate_s, ab.delta_ms);
    assert!((4.0..=7.0).contains(&ab.delta_ms), "delta {} ms", ab.delta_ms);
    let mut control = lib("healthy_ab_control");
    control.duration = SimDuration::from_secs(3600.0);
    let ab = truth(&control).ab.expect("ab block");
    assert!(ab.delta_ms.abs() < 1.0, "A/A delta {} ms", ab.delta_ms);
}

/// The measured first breach of `slow_drift_{days}d` is within max(1 day, 12 %) of nominal.
fn drift(days: u64, every_h: f64) {
    let mut sc = lib(&format!("slow_drift_{days}d"));
    sc.simulate = Some(DutyCycle { window: SimDuration(300.0), every: SimDuration(every_h * 3600.0) });
    let gt = truth(&sc);
    let f = &gt.instances[0].faults[0];
    let nominal = f.nominal_breach_unix_nano.expect("nominal breach");
    let breach = gt.first_breach_unix_nano.expect("breach");
    let err_days = (breach as f64 - nominal as f64) / DAY as f64;
    let onset_days = (breach - f.onset_unix_nano) as f64 / DAY as f64;
    println!("slow_drift_{days}d: breach {onset_days:.2} days after onset (nominal {days}), error {err_days:+.2} days");
    assert!(err_days.abs() <= (0.12 * days as f64).max(1.0), "slow_drift_{days}d off by {err_days:.2} days");
}

#[test]
fn slow_drift_7d_breaches_on_time() {
    drift(7, 2.0);
}

#[test]
fn slow_drift_14d_breaches_on_time() {
    drift(14, 4.0);
}

#[test]
fn slow_drift_21d_breaches_on_time() {
    drift(21, 6.0);
}

#[test]
fn slow_drift_30d_breaches_on_time() {
    drift(30, 6.0);
}
