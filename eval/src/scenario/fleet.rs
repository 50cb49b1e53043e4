//! Scoring fleet scenarios: whether an alert names the faulted replica and how soon after its
//! onset, alerts naming healthy replicas (false alarms), and for a partial rollout delta_ab's
//! pooled verdict and Δ against the ground truth's.

use super::score::{Firing, Outcome};
use super::truth::{Fleet, GroundTruth, Kind};
use serde::Serialize;

/// A faulted replica must be named within this many seconds of its onset (issue 16: 10 minutes).
pub const FLEET_TARGET_S: f64 = 600.0;
/// peer_outlier's default `min_peers`: a fleet with fewer peers per replica must stay quiet.
pub const MIN_PEERS: usize = 3;
/// A rollout whose measured pooled Δp95 is at least this (delta_ab's default latency threshold)
/// is a regression to find; below it, an A/A to stay quiet on.
pub const AB_MIN_DELTA_MS: f64 = 5.0;
/// The detector whose alerts judge a rollout.
pub const AB_DETECTOR: &str = "delta_ab";

/// delta_ab on a partial rollout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutOutcome {
    /// Version of the replicas not in the rollout.
    pub baseline_version: String,
    /// The rolled-out version.
    pub candidate_version: String,
    /// Replicas on the candidate version.
    pub candidate_replicas: usize,
    /// The ground truth's pooled Δp95, ms.
    pub truth_delta_ms: f64,
    /// The injected regression, ms.
    pub injected_ms: f64,
    /// `regression` when the truth's Δ reaches [`AB_MIN_DELTA_MS`], else `none`.
    pub expected: &'static str,
    /// `regression` when delta_ab fired after the deploy, else `none`.
    pub verdict: &'static str,
    /// delta_ab's Δ (its score, ms) at its first alert.
    pub delta_ms: Option<f64>,
    /// delta_ab's Δ minus the truth's, ms.
    pub delta_error_ms: Option<f64>,
    /// First delta_ab alert minus the deploy, seconds.
    pub delay_s: Option<f64>,
    /// delta_ab alerts in all.
    pub alerts: usize,
}

/// The fleet part of a scenario's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetOutcome {
    /// Replicas in the fleet.
    pub replicas: usize,
    /// Faulted replicas (ground truth).
    pub faulted: Vec<String>,
    /// Whether the fleet is too small for a peer comparison (fewer than [`MIN_PEERS`] peers).
    pub below_min_peers: bool,
    /// Whether an alert named a faulted replica at or after its onset (None: no faulted replica).
    pub named: Option<bool>,
    /// The first such alert.
    pub first_named: Option<Firing>,
    /// Its delay after that replica's onset, seconds.
    pub delay_s: Option<f64>,
    /// Alerts naming a replica that is not faulted (false alarms).
    pub healthy_named: usize,
    /// ... those replicas.
    pub healthy_replicas_named: Vec<String>,
    /// Alerts naming a faulted replica before its onset.
    pub before_onset: usize,
    /// Alerts (other than delta_ab's) naming no replica.
    pub unnamed: usize,
    /// The rollout, if the scenario has one.
    pub rollout: Option<RolloutOutcome>,
}

/// Scores a fleet scenario (`truth.fleet` is `f`).
pub fn score(truth: &GroundTruth, f: &Fleet, alerts: &[Firing]) -> Outcome {
    let onset_of = |name: &str| f.replicas.iter().find(|r| r.name == name).and_then(|r| r.fault_onset_unix_nano);
    let faulted: Vec<String> = f.replicas.iter().filter(|r| r.faulted).map(|r| r.name.clone()).collect();
    let below = f.replicas.len().saturating_sub(1) < MIN_PEERS;
    let replica_alerts: Vec<&Firing> =
        alerts.iter().filter(|a| a.detector != AB_DETECTOR && !a.instance.is_empty()).collect();
    let mut named: Vec<(&Firing, f64)> = Vec::new();
    let (mut healthy_named, mut before_onset) = (0, 0);
    let mut healthy_replicas: Vec<String> = Vec::new();
    for a in &replica_alerts {
        match onset_of(&a.instance) {
            Some(on) if a.time_ns >= on => named.push((a, (a.time_ns as f64 - on as f64) / 1e9)),
            Some(_) => before_onset += 1,
            None => {
                healthy_named += 1;
                if !healthy_replicas.contains(&a.instance) {
                    healthy_replicas.push(a.instance.clone());
                }
            }
        }
    }
    healthy_replicas.sort();
    let unnamed = alerts.iter().filter(|a| a.detector != AB_DETECTOR && a.instance.is_empty()).count();
    let first_named = named.first().map(|(a, d)| ((*a).clone(), *d));
    // delta_ab's alerts after the deploy: the rollout's verdict, its delay and the outcome's first
    // alert all describe the first of these.
    let ab_after =
        |at: u64| -> Vec<&Firing> { alerts.iter().filter(|a| a.detector == AB_DETECTOR && a.time_ns >= at).collect() };
    let first_ab: Option<Firing> =
        f.rollout.as_ref().and_then(|r| ab_after(r.at_unix_nano).first().map(|a| (*a).clone()));
    let rollout = f.rollout.as_ref().map(|r| {
        let ab = ab_after(r.at_unix_nano);
        let first = first_ab.as_ref();
        let delta_ms = first.and_then(|a| a.score);
        RolloutOutcome {
            baseline_version: r.baseline_version.clone(),
            candidate_version: r.candidate_version.clone(),
            candidate_replicas: r.candidate_replicas.len(),
            truth_delta_ms: r.delta_ms,
            injected_ms: r.injected_ms,
            expected: if r.delta_ms >= AB_MIN_DELTA_MS { "regression" } else { "none" },
            verdict: if ab.is_empty() { "none" } else { "regression" },
            delta_ms,
            delta_error_ms: delta_ms.map(|d| d - r.delta_ms),
            delay_s: first.map(|a| (a.time_ns as f64 - r.at_unix_nano as f64) / 1e9),
            alerts: ab.len(),
        }
    });
    let rollout_ok = rollout.as_ref().is_none_or(|r| r.expected == r.verdict);
    let outlier_case = rollout.is_none() && !faulted.is_empty();
    // A case that must stay quiet (below min_peers, or no faulted replica): any alert other than
    // delta_ab's fails it, naming a replica or not.
    let quiet = rollout.is_none() && (!outlier_case || below);
    let quiet_unnamed: Vec<&Firing> = if quiet {
        alerts.iter().filter(|a| a.detector != AB_DETECTOR && a.instance.is_empty()).collect()
    } else {
        Vec::new()
    };
    let (target, pass) = if let Some(r) = &rollout {
        let t = if r.expected == "regression" {
            "delta_ab flags the rollout; no healthy replica named"
        } else {
            "A/A: delta_ab quiet; no healthy replica named"
        };
        (t.to_string(), rollout_ok && healthy_named == 0)
    } else if outlier_case && below {
        (format!("quiet: fewer than {MIN_PEERS} peers"), replica_alerts.is_empty() && quiet_unnamed.is_empty())
    } else if outlier_case {
        (
            format!("names the faulted replica ≤ {:.0} min; no healthy replica named", FLEET_TARGET_S / 60.0),
            first_named.as_ref().is_some_and(|(_, d)| *d <= FLEET_TARGET_S) && healthy_named == 0 && before_onset == 0,
        )
    } else {
        ("quiet: no alert".to_string(), replica_alerts.is_empty() && quiet_unnamed.is_empty())
    };
    let ab_false = rollout.as_ref().filter(|r| r.expected == "none").map_or(0, |r| r.alerts);
    let false_alarms = healthy_named + before_onset + ab_false + quiet_unnamed.len();
    let onset = faulted.iter().filter_map(|n| onset_of(n)).min();
    let detected = match &rollout {
        Some(r) if r.expected == "regression" => Some(r.verdict == "regression"),
        Some(_) => None,
        None if outlier_case && !below => Some(first_named.is_some()),
        None => None,
    };
    let true_alerts = named.len() + rollout.as_ref().filter(|r| r.expected == "regression").map_or(0, |r| r.alerts);
    let (first_alert, delay_s) = match (&rollout, &first_named) {
        (Some(r), _) if r.expected == "regression" => (first_ab.clone(), r.delay_s),
        (_, Some((a, d))) => (Some(a.clone()), Some(*d)),
        _ => (replica_alerts.first().map(|a| (*a).clone()), None),
    };
    let mut detectors: Vec<(String, u64)> = Vec::new();
    for (a, _) in &named {
        if !detectors.iter().any(|(d, _)| d == &a.detector) {
            detectors.push((a.detector.clone(), a.time_ns));
        }
    }
    // Per-replica false alarms (a healthy replica, or a faulted one before its onset) and, in a
    // quiet case, the alerts naming no replica.
    let false_fired: Vec<&Firing> = replica_alerts
        .iter()
        .copied()
        .filter(|a| onset_of(&a.instance).is_none_or(|on| a.time_ns < on))
        .chain(quiet_unnamed.iter().copied())
        .collect();
    let mut false_by_detector: Vec<(String, usize)> = Vec::new();
    for a in &false_fired {
        match false_by_detector.iter_mut().find(|(d, _)| d == &a.detector) {
            Some((_, n)) => *n += 1,
            None => false_by_detector.push((a.detector.clone(), 1)),
        }
    }
    if ab_false > 0 {
        false_by_detector.push((AB_DETECTOR.to_string(), ab_false));
    }
    let false_criticals = false_fired.iter().filter(|a| a.severity == "critical").count();
    Outcome {
        scenario: truth.scenario.clone(),
        kind: Kind::Fleet,
        days: truth.days(),
        onset_ns: onset.or(f.rollout.as_ref().map(|r| r.at_unix_nano)),
        breach_ns: truth.first_breach_unix_nano,
        detected,
        first_alert,
        delay_s,
        lead_s: None,
        false_alarms,
        false_warnings: false_alarms.saturating_sub(false_criticals),
        false_criticals,
        true_alerts,
        detectors,
        false_by_detector,
        target,
        pass,
        fleet: Some(FleetOutcome {
            replicas: f.replicas.len(),
            faulted,
            below_min_peers: below,
            named: if outlier_case || rollout.is_some() { Some(first_named.is_some()) } else { None },
            first_named: first_named.as_ref().map(|(a, _)| a.clone()),
            delay_s: first_named.map(|(_, d)| d),
            healthy_named,
            healthy_replicas_named: healthy_replicas,
            before_onset,
            unnamed,
            rollout,
        }),
    }
}

/// A hand-made fleet ground truth for tests: `n` replicas `vllm-0` … of model `m` over 3 hours
/// from time 0, those in `faulted` (index, onset ns) faulted, and the rollout section `rollout`
/// (JSON of the ground truth's `fleet.rollout`).
pub fn fixture(
    n: usize,
    faulted: &[(usize, u64)],
    rollout: Option<serde_json::Value>,
) -> Result<GroundTruth, serde_json::Error> {
    const MIN: u64 = 60_000_000_000;
    let replicas: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let on = faulted.iter().find(|f| f.0 == i).map(|f| f.1);
            serde_json::json!({"name": format!("vllm-{i}"), "faulted": on.is_some(), "fault_onset_unix_nano": on})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "format": 1, "scenario": "f", "start_time_unix_nano": 0u64, "end_time_unix_nano": 180 * MIN,
        "slo": {"metric": "ttft", "quantile": 0.95, "threshold_s": 1.0, "window_s": 300.0},
        "healthy": faulted.is_empty(), "instances": [],
        "fleet": {"model": "m", "replicas": replicas, "rollout": rollout}
    }))
}

/// The fleet table: per fleet scenario, the replica named, its delay, false alarms and the rollout verdict.
pub fn table(outcomes: &[&Outcome]) -> String {
    let rows: Vec<(&Outcome, &FleetOutcome)> =
        outcomes.iter().filter_map(|o| o.fleet.as_ref().map(|f| (*o, f))).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "| fleet scenario | replicas | faulted | named (delay) | healthy replicas named | rollout: expected / verdict | Δ ms detector / truth | pass |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (o, f) in rows {
        let faulted = if f.faulted.is_empty() { "–".to_string() } else { f.faulted.join(", ") };
        let named = match (&f.first_named, f.delay_s) {
            (Some(a), Some(d)) => format!("{} by {} (+{:.1} min)", a.instance, a.detector, d / 60.0),
            _ if f.below_min_peers && !f.faulted.is_empty() => "no (below min_peers)".into(),
            _ => "no".into(),
        };
        let healthy = if f.healthy_named == 0 {
            "0".to_string()
        } else {
            format!("{} ({})", f.healthy_named, f.healthy_replicas_named.join(", "))
        };
        let (ro, delta) = match &f.rollout {
            Some(r) => (
                format!(
                    "{} / {} ({} of {} on {})",
                    r.expected, r.verdict, r.candidate_replicas, f.replicas, r.candidate_version
                ),
                format!("{} / {:.2}", r.delta_ms.map_or_else(|| "–".into(), |d| format!("{d:.2}")), r.truth_delta_ms),
            ),
            None => ("–".into(), "–".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {faulted} | {named} | {healthy} | {ro} | {delta} | {} |\n",
            o.scenario,
            f.replicas,
            if o.pass { "yes" } else { "**no**" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;

    fn truth(n: usize, faulted: &[(usize, u64)], rollout: Option<serde_json::Value>) -> GroundTruth {
        fixture(n, faulted, rollout).unwrap()
    }

    fn fired(t: u64, detector: &str, instance: &str) -> Firing {
        Firing {
            time_ns: t,
            severity: "warning".into(),
            detector: detector.into(),
            metric: "llm.ttft.p95".into(),
            instance: instance.into(),
            version: String::new(),
            verdict: String::new(),
            score: None,
            breach_eta: None,
        }
    }

    fn run(t: &GroundTruth, alerts: &[Firing]) -> Outcome {
        let f = t.fleet.clone().unwrap();
        score(t, &f, alerts)
    }

    #[test]
    fn quiet_cases_fail_on_an_alert_naming_no_replica() {
        let below = truth(2, &[(1, 90 * MIN)], None);
        assert!(run(&below, &[]).pass);
        let o = run(&below, &[fired(95 * MIN, "zscore_skew", "")]);
        assert!(!o.pass && o.false_alarms == 1 && o.false_by_detector == [("zscore_skew".to_string(), 1)], "{o:?}");
        let peak = truth(8, &[], None);
        assert!(run(&peak, &[]).pass);
        let o = run(&peak, &[fired(95 * MIN, "ewma", "")]);
        assert!(!o.pass && o.false_alarms == 1 && o.fleet.as_ref().unwrap().unnamed == 1, "{o:?}");
        // delta_ab's alerts are judged by the rollout, not here.
        assert!(run(&peak, &[fired(95 * MIN, AB_DETECTOR, "")]).pass);
    }

    #[test]
    fn an_outlier_case_fails_on_a_false_alarm_before_onset_even_when_named_later() {
        let t = truth(8, &[(5, 90 * MIN)], None);
        assert!(run(&t, &[fired(96 * MIN, "peer_outlier", "vllm-5")]).pass);
        let o = run(&t, &[fired(60 * MIN, "peer_outlier", "vllm-5"), fired(96 * MIN, "peer_outlier", "vllm-5")]);
        let f = o.fleet.clone().unwrap();
        assert_eq!((f.named, f.delay_s, f.before_onset), (Some(true), Some(360.0), 1));
        assert!(!o.pass && o.false_alarms == 1, "{o:?}");
        // An alert naming no replica is not a false alarm of an outlier case.
        let o = run(&t, &[fired(50 * MIN, "zscore_skew", ""), fired(96 * MIN, "peer_outlier", "vllm-5")]);
        assert!(o.pass && o.false_alarms == 0, "{o:?}");
    }

    #[test]
    fn a_rollouts_first_alert_is_the_one_its_delay_measures() {
        let reg = serde_json::json!({"baseline_version": "v1", "candidate_version": "v2", "at_unix_nano": 30 * MIN,
            "candidate_replicas": ["vllm-0", "vllm-1", "vllm-2"], "delta_ms": 7.2, "injected_ms": 5.0});
        let t = truth(8, &[(0, 30 * MIN), (1, 30 * MIN), (2, 30 * MIN)], Some(reg));
        // One delta_ab alert after the scenario's start but before the deploy, one after it.
        let mut late = fired(70 * MIN, AB_DETECTOR, "vllm-1");
        late.score = Some(6.5);
        let o = run(&t, &[fired(10 * MIN, AB_DETECTOR, "vllm-1"), late]);
        let first = o.first_alert.clone().unwrap();
        assert_eq!(first.time_ns, 70 * MIN, "{o:?}");
        assert_eq!(o.delay_s, Some(2400.0));
        assert_eq!(o.delay_s, Some((first.time_ns - 30 * MIN) as f64 / 1e9));
        let r = o.fleet.unwrap().rollout.unwrap();
        assert_eq!((r.delay_s, r.delta_ms, r.alerts), (Some(2400.0), Some(6.5), 1));
    }
}
