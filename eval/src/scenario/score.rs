//! Scoring a scenario's alerts against its ground truth: detection, delay after the onset,
//! lead before the SLO breach, and false alarms.

use super::truth::{GroundTruth, Kind};
use crate::harness::Record;
use serde::Serialize;

/// The alert log records' event name.
pub const ALERT_EVENT: &str = "llm.degradation.alert";
/// A fast fault must be detected within this many seconds of its onset.
pub const FAST_TARGET_S: f64 = 300.0;
/// A drift whose breach comes this long after onset or later must be warned of ...
pub const DRIFT_LONG_S: f64 = 21.0 * 86_400.0;
/// ... at least this long before the breach.
pub const DRIFT_LEAD_S: f64 = 14.0 * 86_400.0;

/// One alert that started firing (a `fire` transition).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Firing {
    /// Event time it started.
    pub time_ns: u64,
    /// `warning` or `critical` when it fired.
    pub severity: String,
    /// The detector.
    pub detector: String,
    /// The input metric.
    pub metric: String,
    /// Its instance, if the alert names one.
    pub instance: String,
    /// The version it names (`service.version`), if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// delta_ab's verdict in the alert's evidence, if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub verdict: String,
    /// The detector's score in the evidence (delta_ab: Δ in ms), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The forecast breach ETA in the evidence (s), if the alert forecasts a breach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breach_eta: Option<f64>,
}

/// Every `fire` transition among the records, in time order.
pub fn firings(records: &[Record]) -> Vec<Firing> {
    let mut out: Vec<Firing> = records
        .iter()
        .filter(|r| r.event_name == ALERT_EVENT)
        .filter(|r| r.attrs.get("alert.transition").map(String::as_str) == Some("fire"))
        .map(|r| Firing {
            time_ns: r.time_ns,
            severity: r.attrs.get("alert.severity").cloned().unwrap_or_default(),
            detector: r.attrs.get("detector").cloned().unwrap_or_default(),
            metric: r.attrs.get("metric").cloned().unwrap_or_default(),
            instance: r.attrs.get("service.instance.id").cloned().unwrap_or_default(),
            version: r.attrs.get("service.version").cloned().unwrap_or_default(),
            verdict: r.attrs.get("evidence.delta_ab.verdict").cloned().unwrap_or_default(),
            score: r.attrs.get("evidence.score").and_then(|v| v.parse().ok()),
            breach_eta: r.attrs.get("evidence.breach_eta").and_then(|v| v.parse().ok()),
        })
        .collect();
    out.sort_by(|a, b| a.time_ns.cmp(&b.time_ns).then_with(|| a.detector.cmp(&b.detector)));
    out
}

/// The verdict on one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The scenario's name.
    pub scenario: String,
    /// What kind of case it is.
    pub kind: Kind,
    /// Simulated days.
    pub days: f64,
    /// Fault onset, if any.
    pub onset_ns: Option<u64>,
    /// First SLO breach, if any.
    pub breach_ns: Option<u64>,
    /// Whether a fault was detected (an alert at or after the onset); None for healthy scenarios.
    pub detected: Option<bool>,
    /// The first alert at or after the onset (the whole run for healthy ones).
    pub first_alert: Option<Firing>,
    /// First alert minus onset, seconds.
    pub delay_s: Option<f64>,
    /// Breach minus the first alert whose evidence forecasts the breach (`evidence.breach_eta`),
    /// seconds (positive: warned before the breach). A spike detector's alert during a drift
    /// detects it but does not warn of the breach.
    pub lead_s: Option<f64>,
    /// Alerts fired when nothing was wrong (before the onset, or anywhere in a healthy run).
    pub false_alarms: usize,
    /// ... of which warnings.
    pub false_warnings: usize,
    /// ... of which critical.
    pub false_criticals: usize,
    /// Alerts fired at or after the onset.
    pub true_alerts: usize,
    /// Detectors that fired at or after the onset, with their first alert time.
    pub detectors: Vec<(String, u64)>,
    /// False alarms per detector.
    pub false_by_detector: Vec<(String, usize)>,
    /// The target this scenario is held to.
    pub target: String,
    /// Whether it met it.
    pub pass: bool,
    /// Fleet scenarios: the per-replica and rollout scores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<super::fleet::FleetOutcome>,
}

/// Scores `alerts` (from [`firings`]) against `truth`.
///
/// For A/B scenarios only `delta_ab` alerts count as detections; other detectors' alerts on an
/// A/B run are reported but judged neither way (their signals see two healthy instances).
pub fn score(truth: &GroundTruth, alerts: &[Firing]) -> Outcome {
    let kind = truth.kind();
    if let Some(f) = &truth.fleet {
        return super::fleet::score(truth, f, alerts);
    }
    let onset = match kind {
        Kind::Healthy => None,
        Kind::Ab => truth.ab.as_ref().filter(|ab| ab.delta_ms.abs() >= 5.0).map(|_| truth.start_time_unix_nano),
        _ => truth.fault_onset_unix_nano,
    };
    let relevant: Vec<&Firing> = alerts.iter().filter(|a| kind != Kind::Ab || a.detector == "delta_ab").collect();
    let (before, after): (Vec<&Firing>, Vec<&Firing>) = match onset {
        Some(t) => relevant.iter().partition(|a| a.time_ns < t),
        None => (relevant.clone(), Vec::new()),
    };
    let false_warnings = before.iter().filter(|a| a.severity == "warning").count();
    let false_criticals = before.iter().filter(|a| a.severity == "critical").count();
    let first_alert = match onset {
        Some(_) => after.first().map(|a| (*a).clone()),
        None => before.first().map(|a| (*a).clone()),
    };
    let mut detectors: Vec<(String, u64)> = Vec::new();
    for a in &after {
        if !detectors.iter().any(|(d, _)| d == &a.detector) {
            detectors.push((a.detector.clone(), a.time_ns));
        }
    }
    let mut false_by_detector: Vec<(String, usize)> = Vec::new();
    for a in &before {
        match false_by_detector.iter_mut().find(|(d, _)| d == &a.detector) {
            Some((_, n)) => *n += 1,
            None => false_by_detector.push((a.detector.clone(), 1)),
        }
    }
    let delay_s = onset.zip(after.first()).map(|(o, a)| (a.time_ns as f64 - o as f64) / 1e9);
    let breach = truth.first_breach_unix_nano;
    let forecast = after.iter().find(|a| a.breach_eta.is_some());
    let lead_s = breach.zip(forecast).map(|(b, a)| (b as f64 - a.time_ns as f64) / 1e9);
    let detected = onset.map(|_| !after.is_empty());
    let allowed_warnings = ((truth.days() / 30.0).floor() as usize).max(1);
    let quiet = false_criticals == 0 && false_warnings <= allowed_warnings;
    let (target, pass) = match kind {
        Kind::Healthy => (format!("no critical, ≤ {allowed_warnings} warning"), quiet),
        Kind::Ab if onset.is_none() => ("A/A: delta_ab quiet".to_string(), before.is_empty()),
        Kind::Ab => ("delta_ab flags the regression".to_string(), detected == Some(true)),
        Kind::Fast => (
            format!("detected ≤ {:.0} min after onset", FAST_TARGET_S / 60.0),
            delay_s.is_some_and(|d| d <= FAST_TARGET_S) && false_criticals == 0,
        ),
        Kind::Fleet => (String::new(), false),
        Kind::Drift => {
            let span = onset.zip(breach).map(|(o, b)| (b as f64 - o as f64) / 1e9);
            match span {
                Some(s) if s >= DRIFT_LONG_S => (
                    format!("warned ≥ {:.0} d before the breach", DRIFT_LEAD_S / 86_400.0),
                    lead_s.is_some_and(|l| l >= DRIFT_LEAD_S) && false_criticals == 0,
                ),
                Some(_) => {
                    ("warned before the breach".to_string(), lead_s.is_some_and(|l| l > 0.0) && false_criticals == 0)
                }
                None => ("detected".to_string(), detected == Some(true)),
            }
        }
    };
    Outcome {
        scenario: truth.scenario.clone(),
        kind,
        days: truth.days(),
        onset_ns: onset,
        breach_ns: breach,
        detected,
        first_alert,
        delay_s,
        lead_s,
        false_alarms: before.len(),
        false_warnings,
        false_criticals,
        true_alerts: after.len(),
        detectors,
        false_by_detector,
        target,
        pass,
        fleet: None,
    }
}
