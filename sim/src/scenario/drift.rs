//! Choosing a slow drift's rate so that the SLO breach comes `breach_after` after onset.
//!
//! A monotonic drift first breaches the SLO in the worst window of some day (usually near
//! the daily peak). The runner therefore pilots the day centred on the nominal breach
//! (onset + breach_after): it simulates that day's segments exactly as the main run does
//! (same arrivals, drained between segments, after one discarded warm-up window;
//! continuous scenarios: the two hours around the busiest window) and bisects `rate_per_day` until the worst window's SLO quantile equals
//! the threshold. Noise between days makes the measured first breach deviate from the
//! nominal one by a day or two; the ground truth records both.

use super::ScenarioError;
use super::runner::{Live, Prepared};
use super::slo::FaultTruth;
use crate::engine::{NANOS_PER_DAY, NANOS_PER_SEC, Nanos};
use crate::faults::{Fault, FaultSet};

/// Solves every slow drift with `breach_after` of instance `i` in place and returns the
/// truth of the instance's scenario faults.
pub(super) fn solve_drifts(p: &mut Prepared, i: usize) -> Result<Vec<FaultTruth>, ScenarioError> {
    let n = p.insts[i].user_faults;
    for k in 0..n {
        let Fault::SlowDrift(d) = &p.insts[i].faults.faults[k] else { continue };
        let Some(after) = d.breach_after else { continue };
        let nominal = d.onset.nanos() + after.nanos();
        let spans = pilot_spans(p, i, nominal);
        let rate = solve(p, i, k, &spans, after.secs() / 86_400.0)?;
        if let Fault::SlowDrift(d) = &mut p.insts[i].faults.faults[k] {
            d.rate_per_day = rate;
        }
    }
    let start = p.start_unix;
    Ok(p.insts[i].faults.faults[..n]
        .iter()
        .map(|f| {
            let nominal = match f {
                Fault::SlowDrift(d) => d.breach_after.map(|b| start + d.onset.nanos() + b.nanos()),
                _ => None,
            };
            FaultTruth {
                kind: f.kind(),
                onset_unix_nano: start + f.onset().nanos(),
                nominal_breach_unix_nano: nominal,
                spec: f.clone(),
            }
        })
        .collect())
}

/// The spans a pilot simulates: the main run's segments within ±12 h of `nominal`, or, when
/// the scenario is simulated continuously, two hours around its busiest SLO window there.
fn pilot_spans(p: &Prepared, i: usize, nominal: Nanos) -> Vec<(Nanos, Nanos)> {
    let lo = nominal.saturating_sub(NANOS_PER_DAY / 2);
    let hi = (nominal + NANOS_PER_DAY / 2).min(p.duration);
    if p.sc.simulate.is_some() {
        let spans: Vec<_> =
            p.segments.iter().filter(|s| s.0 >= lo && s.0 < hi).map(|&(a, b)| (a, b.min(hi.max(a + 1)))).collect();
        if !spans.is_empty() {
            return spans;
        }
    }
    let w = p.slo_window;
    let mut best: Option<(f64, Nanos)> = None;
    let mut t = lo / w * w;
    while t < hi.max(lo + w) {
        let r = p.load.rate(t + w / 2) * p.insts[i].share;
        if best.is_none_or(|(br, _)| r > br) {
            best = Some((r, t));
        }
        t += w;
    }
    let centre = best.map_or(nominal, |b| b.1);
    let hour = 3600 * NANOS_PER_SEC;
    vec![(centre.saturating_sub(hour) / w * w, (centre + hour).min(p.duration.max(w)))]
}

/// The worst SLO quantile over the evaluated windows of a pilot with drift `k` at `rate`.
fn pilot(p: &Prepared, i: usize, k: usize, spans: &[(Nanos, Nanos)], rate: f64) -> Result<f64, ScenarioError> {
    let inst = &p.insts[i];
    let mut faults: FaultSet = inst.faults.clone();
    if let Some(Fault::SlowDrift(d)) = faults.faults.get_mut(k) {
        d.rate_per_day = rate;
    }
    let first = spans.first().map_or(0, |s| s.0);
    // one discarded SLO window first, so that caches are as warm as in the main run
    let warm = first.saturating_sub(p.slo_window);
    let mut live = Live::new(p, inst, faults, warm)?;
    let warmup = (warm < first).then_some((warm, first));
    for &(a, b) in warmup.iter().chain(spans) {
        let mut none = Vec::new();
        live.engine.advance_to(a, &mut none);
        live.run_chunk(p, inst, a, b);
        live.drain(p);
    }
    let min = p.sc.slo.min_requests.max(1) as usize;
    let first_window = first / p.slo_window;
    Ok(live
        .slo
        .evaluate()
        .iter()
        .filter(|r| r.count >= min && r.index >= first_window)
        .map(|r| r.value)
        .fold(0.0, f64::max))
}

fn solve(p: &Prepared, i: usize, k: usize, spans: &[(Nanos, Nanos)], days: f64) -> Result<f64, ScenarioError> {
    let target = p.sc.slo.threshold.secs();
    let above = |rate: f64| -> Result<bool, ScenarioError> { Ok(pilot(p, i, k, spans, rate)? > target) };
    if above(0.0)? {
        return Ok(0.0);
    }
    let mut lo = 0.0;
    let mut hi = 1.0 / days.max(1e-3);
    let mut tries = 0;
    while !above(hi)? {
        lo = hi;
        hi *= 2.0;
        tries += 1;
        if tries > 20 {
            return Ok(hi);
        }
    }
    while hi - lo > hi * 5e-3 {
        let mid = 0.5 * (lo + hi);
        if above(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // rounded so the ground truth is readable
    Ok((hi * 1e6).round() / 1e6)
}
