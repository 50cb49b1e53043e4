//! The alert life cycle on event time: pending → firing → resolved, escalation, repeats,
//! deduplication, a cap on the number of alerts with least-recently-seen eviction.
//!
//! Pure state: no I/O, no clock. [`Lifecycle::observe`] takes one level point of one alert
//! (identified by its key) and returns what must be emitted.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Severity of a firing alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Severity {
    /// Level at or above the warning threshold, below the critical one.
    Warning,
    /// Level at or above the critical threshold.
    Critical,
}

impl Severity {
    /// The name used in attributes and labels (`warning`, `critical`).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// Thresholds on the level (resolve_below ≤ warning ≤ critical) and the durations of one detector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Level at or above which an alert is pending / firing as `warning`.
    pub warning: f64,
    /// Level at or above which it fires as `critical`.
    pub critical: f64,
    /// Level below which a point of a firing alert counts towards its quiet run (hysteresis).
    pub resolve_below: f64,
    /// `for` of this detector, when it overrides the connector's (event-time ns).
    pub for_ns: Option<u64>,
    /// `stale_after` of this detector, when it overrides the connector's (event-time ns).
    pub stale_ns: Option<u64>,
    /// `resolve_after` of this detector, when it overrides the connector's (event-time ns).
    pub resolve_ns: Option<u64>,
}

impl Thresholds {
    /// The severity of `level`, `None` below the warning threshold.
    pub fn severity(&self, level: f64) -> Option<Severity> {
        if level >= self.critical {
            Some(Severity::Critical)
        } else if level >= self.warning {
            Some(Severity::Warning)
        } else {
            None
        }
    }

    /// The threshold a severity is reached at.
    pub fn of(&self, s: Severity) -> f64 {
        match s {
            Severity::Warning => self.warning,
            Severity::Critical => self.critical,
        }
    }
}

/// Durations of the life cycle, in event-time nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// How long the level must stay at or above warning before the alert fires.
    pub for_ns: u64,
    /// How long the level must stay below `resolve_below` before a firing alert resolves.
    pub resolve_after_ns: u64,
    /// Event time between repeated firing records of an unchanged alert (0: never repeat).
    pub repeat_ns: u64,
    /// Most alerts held (pending or firing).
    pub max_alerts: usize,
    /// A pending alert whose previous point is older than this restarts its `for` at the new point
    /// (0: never), as Prometheus forgets a pending alert whose series went stale.
    pub stale_ns: u64,
}

/// Where an alert is in its life cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// At or above warning since `since`, not yet for `for`.
    Pending {
        /// Event time of the first point at or above warning.
        since: u64,
    },
    /// Firing.
    Firing {
        /// Current severity (escalates, never lowers while firing).
        severity: Severity,
        /// Event time it started firing.
        starts_at: u64,
        /// Event time of the last firing record emitted (fire, escalation or repeat).
        last_emit: u64,
        /// Event time of the first point below `resolve_below` of the current quiet run, if any.
        below_since: Option<u64>,
    },
}

/// One held alert: its phase, identity labels and the last event time seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// Phase of the life cycle.
    pub phase: Phase,
    /// Identity labels (detector, metric, group attributes), kept to describe an evicted alert.
    pub labels: Vec<(String, String)>,
    /// Event time of the latest point.
    pub last_seen: u64,
}

/// What a point changed, when a record must be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Started firing (pending for `for`).
    Fire,
    /// Firing and the severity rose from warning to critical.
    Escalate,
    /// Still firing, unchanged, and `repeat_interval` passed since the last record.
    Repeat,
    /// Below `resolve_below` for `resolve_after`: resolved.
    Resolve,
    /// Dropped from the state by the cap while firing: reported as resolved.
    Evict,
}

impl Kind {
    /// The `alert.transition` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Fire => "fire",
            Kind::Escalate => "escalate",
            Kind::Repeat => "repeat",
            Kind::Resolve => "resolve",
            Kind::Evict => "evict",
        }
    }

    /// True for the kinds that end an alert (`alert.state` = `resolved`).
    pub fn resolves(self) -> bool {
        matches!(self, Kind::Resolve | Kind::Evict)
    }
}

/// A record to emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Why.
    pub kind: Kind,
    /// Severity of the alert (for resolved ones: the severity it had while firing).
    pub severity: Severity,
    /// Event time it started firing.
    pub starts_at: u64,
}

/// An alert evicted while firing, to report as resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Evicted {
    /// Its key.
    pub key: String,
    /// Its identity labels.
    pub labels: Vec<(String, String)>,
    /// Its `Evict` transition.
    pub transition: Transition,
}

/// The state of every alert of one connector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Alerts {
    /// Alerts by key.
    pub map: HashMap<String, Alert>,
}

/// The life cycle engine: parameters and state.
#[derive(Debug)]
pub struct Lifecycle {
    params: Params,
    state: Alerts,
    evicted: u64,
    stale_restart: Option<u64>,
}

impl Lifecycle {
    /// An engine with no alerts.
    pub fn new(params: Params) -> Self {
        Lifecycle { params, state: Alerts::default(), evicted: 0, stale_restart: None }
    }

    /// Number of alerts held (pending and firing).
    pub fn len(&self) -> usize {
        self.state.map.len()
    }

    /// True when no alert is held.
    pub fn is_empty(&self) -> bool {
        self.state.map.is_empty()
    }

    /// The alert of `key`, if held.
    pub fn get(&self, key: &str) -> Option<&Alert> {
        self.state.map.get(key)
    }

    /// Alerts evicted by the cap so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The gap (ns) that made the latest [`Lifecycle::observe`] restart a pending alert whose
    /// `for` is above 0 (its previous point was older than `stale_after`); `None` otherwise.
    pub fn stale_restart(&self) -> Option<u64> {
        self.stale_restart
    }

    /// The state, for a checkpoint.
    pub fn state(&self) -> &Alerts {
        &self.state
    }

    /// Replaces the state (restore from a checkpoint).
    pub fn set_state(&mut self, state: Alerts) {
        self.state = state;
    }

    /// Feeds one level point of the alert `key` at event time `t`. Returns the record to emit
    /// for this alert, if any, and the alerts evicted to make room (firing ones are reported).
    /// A point older than the alert's latest one is ignored; NaN levels are ignored.
    pub fn observe(
        &mut self,
        key: &str,
        labels: &[(String, String)],
        t: u64,
        level: f64,
        th: Thresholds,
    ) -> (Option<Transition>, Vec<Evicted>) {
        self.stale_restart = None;
        if level.is_nan() {
            return (None, Vec::new());
        }
        let sev = th.severity(level);
        let mut evicted = Vec::new();
        if !self.state.map.contains_key(key) {
            // Below warning and not held: nothing to track.
            if sev.is_none() {
                return (None, evicted);
            }
            if self.state.map.len() >= self.params.max_alerts {
                evicted = self.evict();
            }
            let alert = Alert { phase: Phase::Pending { since: t }, labels: labels.to_vec(), last_seen: t };
            self.state.map.insert(key.to_string(), alert);
        }
        let p = self.params;
        let Some(alert) = self.state.map.get_mut(key) else { return (None, evicted) };
        if t < alert.last_seen {
            return (None, evicted);
        }
        let p = Params {
            for_ns: th.for_ns.unwrap_or(p.for_ns),
            stale_ns: th.stale_ns.unwrap_or(p.stale_ns),
            resolve_after_ns: th.resolve_ns.unwrap_or(p.resolve_after_ns),
            ..p
        };
        let gap = t.saturating_sub(alert.last_seen);
        if let Phase::Pending { .. } = alert.phase
            && p.stale_ns > 0
            && gap > p.stale_ns
        {
            alert.phase = Phase::Pending { since: t };
            if p.for_ns > 0 {
                self.stale_restart = Some(gap);
            }
        }
        alert.last_seen = t;
        let quiet = level < th.resolve_below;
        let (next, out) = step(&alert.phase, p, t, sev, quiet);
        match next {
            Some(phase) => alert.phase = phase,
            None => {
                self.state.map.remove(key);
            }
        }
        (out, evicted)
    }

    /// Evicts the least recently seen 10 % (at least one) of the alerts.
    fn evict(&mut self) -> Vec<Evicted> {
        let n = (self.state.map.len() / 10).max(1);
        let mut by_age: Vec<(u64, String)> = self.state.map.iter().map(|(k, a)| (a.last_seen, k.clone())).collect();
        by_age.sort_unstable();
        let mut out = Vec::new();
        for (_, key) in by_age.into_iter().take(n) {
            let Some(a) = self.state.map.remove(&key) else { continue };
            self.evicted += 1;
            if let Phase::Firing { severity, starts_at, .. } = a.phase {
                out.push(Evicted {
                    key,
                    labels: a.labels,
                    transition: Transition { kind: Kind::Evict, severity, starts_at },
                });
            }
        }
        out
    }
}

/// One step of the state machine: the next phase (`None`: forget the alert) and what to emit.
/// `sev` is the severity of the level (`None` below warning); `quiet` is true below `resolve_below`.
fn step(phase: &Phase, p: Params, t: u64, sev: Option<Severity>, quiet: bool) -> (Option<Phase>, Option<Transition>) {
    // A firing alert between resolve_below and warning stays firing at its severity (hysteresis):
    // the quiet run restarts and repeats go on.
    let sev = match (phase, sev) {
        (Phase::Firing { severity, .. }, None) if !quiet => Some(*severity),
        _ => sev,
    };
    match (phase, sev) {
        (Phase::Pending { .. }, None) => (None, None),
        (Phase::Pending { since }, Some(s)) => {
            if t.saturating_sub(*since) >= p.for_ns {
                let fired = Phase::Firing { severity: s, starts_at: t, last_emit: t, below_since: None };
                (Some(fired), Some(Transition { kind: Kind::Fire, severity: s, starts_at: t }))
            } else {
                (Some(phase.clone()), None)
            }
        }
        (Phase::Firing { severity, starts_at, last_emit, below_since }, None) => {
            let since = below_since.unwrap_or(t);
            if t.saturating_sub(since) >= p.resolve_after_ns {
                (None, Some(Transition { kind: Kind::Resolve, severity: *severity, starts_at: *starts_at }))
            } else {
                let quiet = Phase::Firing {
                    severity: *severity,
                    starts_at: *starts_at,
                    last_emit: *last_emit,
                    below_since: Some(since),
                };
                (Some(quiet), None)
            }
        }
        (Phase::Firing { severity, starts_at, last_emit, .. }, Some(s)) => {
            let kind = if s > *severity {
                Some(Kind::Escalate)
            } else if p.repeat_ns > 0 && t.saturating_sub(*last_emit) >= p.repeat_ns {
                Some(Kind::Repeat)
            } else {
                None
            };
            let severity = s.max(*severity);
            let last_emit = if kind.is_some() { t } else { *last_emit };
            let next = Phase::Firing { severity, starts_at: *starts_at, last_emit, below_since: None };
            (Some(next), kind.map(|kind| Transition { kind, severity, starts_at: *starts_at }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const TH: Thresholds =
        Thresholds { warning: 0.6, critical: 0.8, resolve_below: 0.6, for_ns: None, stale_ns: None, resolve_ns: None };

    fn engine(for_s: u64, resolve_s: u64, repeat_s: u64, max: usize) -> Lifecycle {
        Lifecycle::new(Params {
            for_ns: for_s * S,
            resolve_after_ns: resolve_s * S,
            repeat_ns: repeat_s * S,
            max_alerts: max,
            stale_ns: 0,
        })
    }

    fn kinds(e: &mut Lifecycle, key: &str, series: &[(u64, f64)]) -> Vec<(u64, Kind, Severity)> {
        series
            .iter()
            .filter_map(|&(t, l)| e.observe(key, &[], t * S, l, TH).0.map(|x| (t, x.kind, x.severity)))
            .collect()
    }

    #[test]
    fn pending_fires_after_for_and_resolves_after_resolve_after() {
        let mut e = engine(30, 20, 0, 10);
        let got = kinds(&mut e, "a", &[(0, 0.7), (10, 0.7), (29, 0.65), (30, 0.7), (40, 0.1), (59, 0.1), (60, 0.1)]);
        assert_eq!(got, vec![(30, Kind::Fire, Severity::Warning), (60, Kind::Resolve, Severity::Warning)]);
        assert!(e.is_empty());
    }

    #[test]
    fn a_gap_longer_than_stale_restarts_pending() {
        let mut e = engine(120, 0, 0, 10);
        e.params.stale_ns = 300 * S;
        // Points an hour apart (duty-cycled input): each gap restarts the pending `for`, so a
        // level that is high once per segment never fires ...
        assert!(kinds(&mut e, "a", &[(0, 0.9), (3600, 0.9), (7200, 0.9)]).is_empty());
        // ... while three points a minute apart, high for 120 s, do.
        assert_eq!(kinds(&mut e, "a", &[(7260, 0.9), (7320, 0.9)]), vec![(7320, Kind::Fire, Severity::Critical)]);
        // Without staleness the hourly points fire at the second one.
        let mut e = engine(120, 0, 0, 10);
        assert_eq!(kinds(&mut e, "b", &[(0, 0.9), (3600, 0.9)]), vec![(3600, Kind::Fire, Severity::Critical)]);
    }

    #[test]
    fn per_detector_for_and_stale_override_the_connectors() {
        let mut e = engine(120, 0, 0, 10);
        e.params.stale_ns = 300 * S;
        // An hourly detector (trend_forecast) with `for: 0s`: fires on its first high point.
        let hourly = Thresholds { for_ns: Some(0), ..TH };
        let got: Vec<_> = [(0u64, 0.7), (3600, 0.7)]
            .iter()
            .filter_map(|&(t, l)| e.observe("h", &[], t * S, l, hourly).0.map(|x| (t, x.kind)))
            .collect();
        assert_eq!(got, vec![(0, Kind::Fire)]);
        // A detector with stale_after 0 (never stale) builds `for` across an hour's gap.
        let never = Thresholds { stale_ns: Some(0), ..TH };
        let got: Vec<_> = [(0u64, 0.7), (3600, 0.7)]
            .iter()
            .filter_map(|&(t, l)| e.observe("n", &[], t * S, l, never).0.map(|x| (t, x.kind)))
            .collect();
        assert_eq!(got, vec![(3600, Kind::Fire)]);
    }

    #[test]
    fn a_dip_cancels_pending_and_a_spike_resets_the_quiet_run() {
        let mut e = engine(10, 10, 0, 10);
        let got = kinds(&mut e, "a", &[(0, 0.7), (5, 0.5), (9, 0.7), (18, 0.7), (19, 0.9), (25, 0.1), (30, 0.7)]);
        // Pending restarts at 9 (the dip at 5 cancelled it), fires at 19 (critical by the level then).
        assert_eq!(got, vec![(19, Kind::Fire, Severity::Critical)]);
        let got = kinds(&mut e, "a", &[(39, 0.1), (48, 0.1), (49, 0.2), (50, 0.2)]);
        // The spike at 30 reset the quiet run that began at 25 (else it would resolve at 35 or
        // at 39): the next run starts at 39 and resolves 10 s later.
        assert_eq!(got, vec![(49, Kind::Resolve, Severity::Critical)]);
    }

    #[test]
    fn escalation_repeats_and_no_downgrade() {
        let mut e = engine(0, 0, 60, 10);
        let got = kinds(&mut e, "a", &[(0, 0.6), (30, 0.7), (59, 0.7), (60, 0.7), (70, 0.85), (100, 0.7), (130, 0.7)]);
        assert_eq!(
            got,
            vec![
                (0, Kind::Fire, Severity::Warning),
                (60, Kind::Repeat, Severity::Warning),
                (70, Kind::Escalate, Severity::Critical),
                (130, Kind::Repeat, Severity::Critical),
            ]
        );
    }

    #[test]
    fn out_of_order_points_are_ignored() {
        let mut e = engine(0, 0, 0, 10);
        assert_eq!(kinds(&mut e, "a", &[(10, 0.9), (5, 0.1)]), vec![(10, Kind::Fire, Severity::Critical)]);
        assert!(e.get("a").is_some());
    }

    #[test]
    fn cap_evicts_least_recently_seen_and_reports_firing_ones() {
        let mut e = engine(100, 0, 0, 3);
        e.observe("fires", &[("detector".into(), "d".into())], 0, 0.9, TH);
        // for = 100 s: "fires" is pending; make it fire by waiting.
        e.observe("fires", &[], 100 * S, 0.9, TH);
        e.observe("p1", &[], 101 * S, 0.7, TH);
        e.observe("p2", &[], 102 * S, 0.7, TH);
        let (_, ev) = e.observe("new", &[], 103 * S, 0.7, TH);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].key, "fires");
        assert_eq!(
            ev[0].transition,
            Transition { kind: Kind::Evict, severity: Severity::Critical, starts_at: 100 * S }
        );
        assert_eq!(ev[0].labels, vec![("detector".to_string(), "d".to_string())]);
        assert_eq!(e.len(), 3);
        assert_eq!(e.evicted(), 1);
        // A pending one evicted says nothing.
        let (_, ev) = e.observe("newer", &[], 104 * S, 0.7, TH);
        assert!(ev.is_empty());
        assert!(e.get("p1").is_none());
        assert_eq!(e.evicted(), 2);
    }

    #[test]
    fn a_level_between_resolve_below_and_warning_keeps_a_firing_alert() {
        let mut e = engine(0, 60, 0, 10);
        let band = Thresholds { resolve_below: 0.4, ..TH };
        let got: Vec<_> = [(0u64, 0.7), (60, 0.5), (120, 0.5), (180, 0.3), (200, 0.5), (260, 0.3), (320, 0.3)]
            .iter()
            .filter_map(|&(t, l)| e.observe("a", &[], t * S, l, band).0.map(|x| (t, x.kind)))
            .collect();
        // 0.5 is below warning but not below resolve_below: no quiet run; 200 restarts it.
        assert_eq!(got, vec![(0, Kind::Fire), (320, Kind::Resolve)]);
        // Pending still needs the warning level: 0.5 forgets a pending alert.
        let mut e = engine(60, 60, 0, 10);
        let got: Vec<_> = [(0u64, 0.7), (30, 0.5), (60, 0.7)]
            .iter()
            .filter_map(|&(t, l)| e.observe("b", &[], t * S, l, band).0.map(|x| (t, x.kind)))
            .collect();
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn stale_restarts_are_reported_only_when_for_is_above_zero() {
        let mut e = engine(120, 0, 0, 10);
        e.params.stale_ns = 300 * S;
        e.observe("a", &[], 0, 0.9, TH);
        assert_eq!(e.stale_restart(), None);
        e.observe("a", &[], 3600 * S, 0.9, TH);
        assert_eq!(e.stale_restart(), Some(3600 * S));
        e.observe("a", &[], 3660 * S, 0.9, TH);
        assert_eq!(e.stale_restart(), None);
        let zero = Thresholds { for_ns: Some(0), ..TH };
        e.observe("b", &[], 0, 0.5, zero);
        e.observe("b", &[], 7200 * S, 0.5, zero);
        assert_eq!(e.stale_restart(), None);
    }

    #[test]
    fn per_detector_resolve_after_overrides_the_connectors() {
        let mut e = engine(0, 600, 0, 10);
        let quick = Thresholds { resolve_ns: Some(0), ..TH };
        let got: Vec<_> = [(0u64, 0.7), (60, 0.1)]
            .iter()
            .filter_map(|&(t, l)| e.observe("a", &[], t * S, l, quick).0.map(|x| (t, x.kind)))
            .collect();
        assert_eq!(got, vec![(0, Kind::Fire), (60, Kind::Resolve)]);
    }
}
