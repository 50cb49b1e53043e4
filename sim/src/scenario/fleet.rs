//! The `fleet:` shorthand: N replicas of one model, faults and deploys on a subset, and the
//! fleet's ground truth (which replicas are faulted, which versions run where, the pooled A/B).

use super::slo::{FleetTruth, InstanceTruth, ReplicaTruth, RolloutTruth, SloTracker, quantile};
use super::spec::{FleetSpec, InstanceSpec, Scenario};
use crate::engine::tokens::{mix64, unit};
use crate::engine::{NANOS_PER_SEC, Nanos};
use crate::faults::Fault;

/// Most replicas of a fleet.
pub const MAX_REPLICAS: u32 = 1000;

/// Checks the `fleet:` block and the deploys' `replicas:` against it; the message names the field.
pub fn check(sc: &Scenario, f: &FleetSpec) -> Result<(), String> {
    if !sc.instances.is_empty() {
        return Err("fleet: cannot be combined with instances".into());
    }
    if !(1..=MAX_REPLICAS).contains(&f.replicas) {
        return Err(format!("fleet.replicas: must be in 1..={MAX_REPLICAS}"));
    }
    if !f.name.contains("{i}") {
        return Err("fleet.name: must contain {i} (the replica's index)".into());
    }
    if !(f.qps_spread.is_finite() && (0.0..1.0).contains(&f.qps_spread)) {
        return Err("fleet.qps_spread: must be in [0, 1)".into());
    }
    for (i, ff) in f.faults.iter().enumerate() {
        f.select(&ff.replicas).map_err(|e| format!("fleet.faults[{i}].replicas: {e}"))?;
        ff.fault.validate().map_err(|e| format!("fleet.faults[{i}].fault: {e}"))?;
    }
    for (i, d) in sc.deploys.iter().enumerate() {
        if let Some(sel) = &d.replicas {
            if d.instances.is_some() {
                return Err(format!("deploys[{i}]: give replicas or instances, not both"));
            }
            f.select(sel).map_err(|e| format!("deploys[{i}].replicas: {e}"))?;
        }
    }
    Ok(())
}

/// The relative traffic of replica `i` (1 ± `qps_spread`, from the seed).
pub fn load_share(seed: u64, f: &FleetSpec, i: u32) -> f64 {
    let u = unit(mix64(seed ^ 0xF1EE_7000 ^ mix64(u64::from(i))));
    1.0 + f.qps_spread * (2.0 * u - 1.0)
}

/// The scenario with the fleet written out as `instances` and every deploy's `replicas` as
/// `instances` (`fleet` is kept for the ground truth). Call after [`check`].
pub fn expand(sc: &Scenario) -> Result<Scenario, String> {
    let Some(f) = &sc.fleet else { return Ok(sc.clone()) };
    let mut out = sc.clone();
    let mut faults: Vec<Vec<Fault>> = vec![Vec::new(); f.replicas as usize];
    for (k, ff) in f.faults.iter().enumerate() {
        for i in f.select(&ff.replicas).map_err(|e| format!("fleet.faults[{k}].replicas: {e}"))? {
            if let Some(v) = faults.get_mut(i as usize) {
                v.push(ff.fault.clone());
            }
        }
    }
    out.instances = faults
        .into_iter()
        .zip(0u32..)
        .map(|(faults, i)| InstanceSpec {
            name: f.replica_name(i),
            version: f.version.clone(),
            faults,
            load_share: load_share(sc.seed, f, i),
        })
        .collect();
    for (k, d) in out.deploys.iter_mut().enumerate() {
        if let Some(sel) = d.replicas.take() {
            let idx = f.select(&sel).map_err(|e| format!("deploys[{k}].replicas: {e}"))?;
            d.instances = Some(idx.into_iter().map(|i| f.replica_name(i)).collect());
        }
    }
    Ok(out)
}

/// What the ground truth needs of one replica's run.
pub(super) struct ReplicaRun<'a> {
    /// Its initial version.
    pub version: &'a str,
    /// Its deploys: (time from start, version), in time order.
    pub deploys: &'a [(Nanos, String)],
    /// Its load share.
    pub share: f64,
    /// Its SLO tracker.
    pub slo: &'a SloTracker,
    /// Its faults as given (deploy cold starts excluded).
    pub faults: &'a [Fault],
}

/// Whether a fault hits a replica, and from when (time from start): a version regression only
/// from the time the replica runs that version at or after its onset.
fn hit(f: &Fault, r: &ReplicaRun<'_>) -> Option<Nanos> {
    let onset = f.onset().nanos();
    match f {
        Fault::VersionRegression(v) => {
            let Some(target) = &v.version else { return Some(onset) };
            let until = v.until.map_or(Nanos::MAX, |u| u.nanos());
            // Spans of each version: (from, to).
            let mut spans: Vec<(Nanos, Nanos, &str)> = Vec::new();
            let mut from = 0;
            let mut cur = r.version;
            for (at, ver) in r.deploys {
                spans.push((from, *at, cur));
                from = *at;
                cur = ver;
            }
            spans.push((from, Nanos::MAX, cur));
            spans
                .into_iter()
                .filter(|(a, b, ver)| *ver == target && *b > onset && *a < until && a < b)
                .map(|(a, _, _)| a.max(onset))
                .min()
        }
        _ => Some(onset),
    }
}

/// The fleet section of the ground truth. `start_unix`: the scenario's start, Unix ns.
pub(super) fn truth(
    sc: &Scenario,
    start_unix: u64,
    model: &str,
    instances: &[InstanceTruth],
    runs: &[ReplicaRun<'_>],
) -> FleetTruth {
    let mut replicas = Vec::new();
    for (inst, r) in instances.iter().zip(runs) {
        let onset = r.faults.iter().filter_map(|f| hit(f, r)).min();
        let mut kinds: Vec<&'static str> = r.faults.iter().filter(|f| hit(f, r).is_some()).map(Fault::kind).collect();
        kinds.dedup();
        let mut versions = vec![(start_unix, r.version.to_string())];
        versions.extend(r.deploys.iter().map(|(at, v)| (start_unix + at, v.clone())));
        replicas.push(ReplicaTruth {
            name: inst.name.clone(),
            load_share: r.share,
            versions,
            faulted: onset.is_some(),
            fault_kinds: kinds,
            fault_onset_unix_nano: onset.map(|o| start_unix + o),
        });
    }
    let faulted = replicas.iter().filter(|r| r.faulted).map(|r| r.name.clone()).collect();
    FleetTruth {
        model: model.to_string(),
        replicas: replicas.clone(),
        faulted,
        rollout: rollout(sc, start_unix, &replicas, runs),
    }
}

/// The pooled comparison of the fleet's last partial rollout: the replicas that received the
/// deploy's version against the others, over the requests arriving after the deploy (and its
/// cold start: 10 warm-up times, rounded up to SLO windows) and after any regression onset.
fn rollout(sc: &Scenario, start_unix: u64, replicas: &[ReplicaTruth], runs: &[ReplicaRun<'_>]) -> Option<RolloutTruth> {
    let d = sc.deploys.iter().rev().find(|d| d.instances.as_ref().is_some_and(|l| l.len() < replicas.len()))?;
    let names = d.instances.as_ref()?;
    let w = sc.slo.window.nanos().max(NANOS_PER_SEC);
    let mut from = d.at.nanos();
    if let Some(c) = &d.cold_start {
        from += (10.0 * c.warmup.secs() * 1e9) as Nanos;
    }
    let regression = runs
        .iter()
        .flat_map(|r| r.faults.iter())
        .filter_map(|f| match f {
            Fault::VersionRegression(v) if v.version.as_deref().is_none_or(|x| x == d.version) => {
                Some((v.onset.nanos(), v.strength))
            }
            _ => None,
        })
        .max_by_key(|x| x.0);
    if let Some((on, _)) = regression {
        from = from.max(on);
    }
    let from = from.div_ceil(w) * w;
    let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    let mut baseline_version = None;
    for (rep, r) in replicas.iter().zip(runs) {
        if names.contains(&rep.name) {
            b.extend(r.slo.values_from(from));
            rb.push(rep.name.clone());
        } else {
            a.extend(r.slo.values_from(from));
            ra.push(rep.name.clone());
            if baseline_version.is_none() {
                baseline_version = rep.versions.iter().rev().find(|v| v.0 <= start_unix + from).map(|v| v.1.clone());
            }
        }
    }
    let (na, nb) = (a.len() as u64, b.len() as u64);
    let qa = quantile(&mut a, 0.95)?;
    let qb = quantile(&mut b, 0.95)?;
    Some(RolloutTruth {
        baseline_version: baseline_version.unwrap_or_default(),
        candidate_version: d.version.clone(),
        at_unix_nano: start_unix + d.at.nanos(),
        baseline_replicas: ra,
        candidate_replicas: rb,
        metric: sc.slo.metric.as_str(),
        quantile: 0.95,
        from_unix_nano: start_unix + from,
        n_baseline: na,
        n_candidate: nb,
        baseline_s: qa,
        candidate_s: qb,
        delta_ms: (qb - qa) * 1e3,
        injected_ms: regression.map_or(0.0, |r| r.1),
    })
}
