//! eval's scoring on tiny hand-made cases with known answers.

use inferwatch_eval::harness::Record;
use inferwatch_eval::scenario::score::{firings, score};
use inferwatch_eval::scenario::truth::{GroundTruth, Kind};
use std::collections::BTreeMap;

const DAY: u64 = 86_400_000_000_000;
const MIN: u64 = 60_000_000_000;

fn truth(json: serde_json::Value) -> GroundTruth {
    serde_json::from_value(json).unwrap()
}

fn base(extra: serde_json::Value) -> GroundTruth {
    let mut v = serde_json::json!({
        "format": 1, "scenario": "t", "start_time_unix_nano": 0u64, "end_time_unix_nano": 28 * DAY,
        "slo": {"metric": "tpot", "quantile": 0.95, "threshold_s": 0.07, "window_s": 300.0},
        "healthy": false, "instances": []
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    truth(v)
}

fn alert(t: u64, transition: &str, severity: &str, detector: &str) -> Record {
    let mut attrs = BTreeMap::new();
    attrs.insert("alert.transition".to_string(), transition.to_string());
    attrs.insert("alert.severity".to_string(), severity.to_string());
    attrs.insert("detector".to_string(), detector.to_string());
    attrs.insert("metric".to_string(), "llm.tpot.p95".to_string());
    Record { time_ns: t, event_name: "llm.degradation.alert".into(), severity: 13, attrs }
}

fn drift(onset_d: u64, breach_d: u64) -> GroundTruth {
    base(serde_json::json!({
        "fault_onset_unix_nano": onset_d * DAY, "first_breach_unix_nano": breach_d * DAY,
        "instances": [{"name": "sim-0", "faults": [{"kind": "slow_drift", "onset_unix_nano": onset_d * DAY}]}]
    }))
}

#[test]
fn only_fire_transitions_count_and_are_sorted() {
    let recs = vec![
        alert(5 * MIN, "fire", "warning", "b"),
        alert(3 * MIN, "repeat", "warning", "a"),
        alert(2 * MIN, "fire", "critical", "a"),
        alert(6 * MIN, "resolve", "warning", "b"),
        Record { time_ns: 1, event_name: "other".into(), severity: 9, attrs: BTreeMap::new() },
    ];
    let f = firings(&recs);
    assert_eq!(
        f.iter().map(|a| (a.time_ns, a.detector.as_str())).collect::<Vec<_>>(),
        vec![(2 * MIN, "a"), (5 * MIN, "b")]
    );
}

/// A trend_forecast alert whose evidence forecasts the breach.
fn forecast(t: u64) -> Record {
    let mut r = alert(t, "fire", "warning", "trend_forecast");
    r.attrs.insert("evidence.breach_eta".to_string(), "864000".to_string());
    r
}

#[test]
fn drift_lead_is_breach_minus_first_forecasting_alert_after_onset() {
    let t = drift(3, 25);
    assert_eq!(t.kind(), Kind::Drift);
    // A warning on day 1 is a false alarm; a spike alert on day 4 detects the drift but forecasts
    // nothing; the first forecasting alert after onset is on day 9: lead 16 d.
    let recs = vec![
        alert(DAY, "fire", "warning", "zscore_skew"),
        alert(4 * DAY, "fire", "warning", "zscore_skew"),
        forecast(9 * DAY),
    ];
    let o = score(&t, &firings(&recs));
    assert_eq!(o.false_alarms, 1);
    assert_eq!(o.false_warnings, 1);
    assert_eq!(o.lead_s, Some(16.0 * 86_400.0));
    assert_eq!(o.delay_s, Some(86_400.0));
    assert!(o.pass, "{o:?}");
    // Without the forecast the spike alone warns of nothing.
    let o = score(&t, &firings(&recs[..2]));
    assert_eq!((o.detected, o.lead_s), (Some(true), None));
    assert!(!o.pass);
    // Day 12 instead: 13 days of lead, short of 14.
    let o = score(&t, &firings(&[forecast(12 * DAY)]));
    assert_eq!(o.lead_s, Some(13.0 * 86_400.0));
    assert!(!o.pass);
    // A breach 10 days after onset only needs a warning before it.
    let o = score(&drift(3, 13), &firings(&[forecast(12 * DAY)]));
    assert!(o.pass && o.target.contains("before the breach"), "{o:?}");
}

#[test]
fn fast_fault_must_be_seen_within_five_minutes() {
    let t = base(serde_json::json!({
        "end_time_unix_nano": DAY / 6, "fault_onset_unix_nano": 120 * MIN,
        "instances": [{"name": "sim-0", "faults": [{"kind": "queue_blocking", "onset_unix_nano": 120 * MIN}]}]
    }));
    assert_eq!(t.kind(), Kind::Fast);
    let ok = score(&t, &firings(&[alert(124 * MIN, "fire", "critical", "kv_pressure")]));
    assert_eq!(ok.delay_s, Some(240.0));
    assert!(ok.pass && ok.detected == Some(true));
    let late = score(&t, &firings(&[alert(126 * MIN, "fire", "critical", "kv_pressure")]));
    assert!(!late.pass && late.detected == Some(true));
    let none = score(&t, &[]);
    assert_eq!(none.detected, Some(false));
    assert!(!none.pass);
    // A critical false alarm before the onset fails it even when the fault is then seen in time.
    let noisy = score(
        &t,
        &firings(&[
            alert(30 * MIN, "fire", "critical", "zscore_skew"),
            alert(121 * MIN, "fire", "warning", "zscore_skew"),
        ]),
    );
    assert!(!noisy.pass && noisy.false_criticals == 1);
}

#[test]
fn healthy_allows_one_warning_per_thirty_days_and_no_critical() {
    let t = base(serde_json::json!({"healthy": true, "end_time_unix_nano": 90 * DAY}));
    assert_eq!(t.kind(), Kind::Healthy);
    let three = [10, 40, 70].map(|d| alert(d * DAY, "fire", "warning", "trend_forecast"));
    assert!(score(&t, &firings(&three)).pass);
    let four = [10, 40, 70, 80].map(|d| alert(d * DAY, "fire", "warning", "trend_forecast"));
    assert!(!score(&t, &firings(&four)).pass);
    let crit = score(&t, &firings(&[alert(DAY, "fire", "critical", "trend_forecast")]));
    assert!(!crit.pass && crit.false_criticals == 1 && crit.detected.is_none());
    // Two weeks: one warning allowed.
    let short = base(serde_json::json!({"healthy": true, "end_time_unix_nano": 14 * DAY}));
    assert!(score(&short, &firings(&[alert(DAY, "fire", "warning", "x")])).pass);
    assert!(
        !score(&short, &firings(&[alert(DAY, "fire", "warning", "x"), alert(2 * DAY, "fire", "warning", "x")])).pass
    );
}

#[test]
fn ab_counts_only_delta_ab() {
    let reg = base(serde_json::json!({
        "ab": {"baseline": "sim-a", "candidate": "sim-b", "delta_ms": 5.43},
        "instances": [{"name": "sim-a"}, {"name": "sim-b", "faults": [{"kind": "version_regression", "onset_unix_nano": 0}]}]
    }));
    assert_eq!(reg.kind(), Kind::Ab);
    assert!(!score(&reg, &firings(&[alert(MIN, "fire", "critical", "zscore_skew")])).pass);
    assert!(score(&reg, &firings(&[alert(MIN, "fire", "critical", "delta_ab")])).pass);
    let aa = base(serde_json::json!({"ab": {"baseline": "sim-a", "candidate": "sim-b", "delta_ms": 0.1}}));
    assert!(score(&aa, &firings(&[alert(MIN, "fire", "warning", "zscore_skew")])).pass);
    assert!(!score(&aa, &firings(&[alert(MIN, "fire", "warning", "delta_ab")])).pass);
}
