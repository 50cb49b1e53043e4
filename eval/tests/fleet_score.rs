//! Fleet scoring: hand-made cases with known answers (named replica, delay, healthy replicas
//! named, below min_peers, rollout verdicts), and one short real fleet scenario run through the
//! fleet pipeline (peer_outlier and delta_ab).

use inferwatch_eval::harness::Record;
use inferwatch_eval::scenario::score::{firings, score};
use inferwatch_eval::scenario::truth::{GroundTruth, Kind};
use std::collections::BTreeMap;

const MIN: u64 = 60_000_000_000;

fn fleet(n: usize, faulted: &[(usize, u64)], rollout: Option<serde_json::Value>) -> GroundTruth {
    inferwatch_eval::scenario::fleet::fixture(n, faulted, rollout).unwrap()
}

fn alert(t: u64, detector: &str, instance: &str, extra: &[(&str, &str)]) -> Record {
    let mut attrs = BTreeMap::new();
    for (k, v) in [
        ("alert.transition", "fire"),
        ("alert.severity", "warning"),
        ("detector", detector),
        ("metric", "llm.ttft.p95"),
    ]
    .iter()
    .chain(extra)
    {
        attrs.insert(k.to_string(), v.to_string());
    }
    if !instance.is_empty() {
        attrs.insert("service.instance.id".to_string(), instance.to_string());
    }
    Record { time_ns: t, event_name: "llm.degradation.alert".into(), severity: 13, attrs }
}

#[test]
fn outlier_named_within_ten_minutes_and_healthy_replicas_are_false_alarms() {
    let t = fleet(8, &[(5, 90 * MIN)], None);
    assert_eq!(t.kind(), Kind::Fleet);
    let ok = score(&t, &firings(&[alert(96 * MIN, "peer_outlier", "vllm-5", &[])]));
    let f = ok.fleet.clone().unwrap();
    assert_eq!(f.named, Some(true));
    assert_eq!(f.delay_s, Some(360.0));
    assert!(ok.pass && ok.detected == Some(true) && ok.false_alarms == 0, "{ok:?}");
    // late
    assert!(!score(&t, &firings(&[alert(101 * MIN, "peer_outlier", "vllm-5", &[])])).pass);
    // the wrong replica: a false alarm, and the faulted one is not named
    let wrong = score(&t, &firings(&[alert(95 * MIN, "peer_outlier", "vllm-3", &[])]));
    let wf = wrong.fleet.unwrap();
    assert!(!wrong.pass && wf.named == Some(false) && wf.healthy_named == 1 && wf.healthy_replicas_named == ["vllm-3"]);
    // named before its onset: not a detection
    let early = score(&t, &firings(&[alert(60 * MIN, "peer_outlier", "vllm-5", &[])]));
    assert!(!early.pass && early.fleet.unwrap().before_onset == 1 && early.false_alarms == 1);
    // a fleet-level alert (no replica) neither detects nor names
    let unnamed = score(&t, &firings(&[alert(95 * MIN, "zscore_skew", "", &[])]));
    assert!(!unnamed.pass && unnamed.fleet.unwrap().unnamed == 1);
}

#[test]
fn below_min_peers_and_healthy_fleets_must_be_quiet() {
    let two = fleet(2, &[(1, 90 * MIN)], None);
    let quiet = score(&two, &[]);
    assert!(quiet.pass && quiet.fleet.as_ref().unwrap().below_min_peers, "{quiet:?}");
    assert!(quiet.target.contains("fewer than 3 peers"));
    assert!(!score(&two, &firings(&[alert(95 * MIN, "peer_outlier", "vllm-1", &[])])).pass);
    let peak = fleet(8, &[], None);
    assert!(score(&peak, &[]).pass);
    let noisy = score(&peak, &firings(&[alert(95 * MIN, "peer_outlier", "vllm-2", &[])]));
    assert!(!noisy.pass && noisy.false_alarms == 1);
}

#[test]
fn rollout_verdict_and_delta_against_truth() {
    let reg = serde_json::json!({"baseline_version": "v1", "candidate_version": "v2", "at_unix_nano": 30 * MIN,
        "candidate_replicas": ["vllm-0", "vllm-1", "vllm-2"], "delta_ms": 7.2, "injected_ms": 5.0});
    let t = fleet(8, &[(0, 30 * MIN), (1, 30 * MIN), (2, 30 * MIN)], Some(reg));
    let ab = [("evidence.delta_ab.verdict", "regression"), ("evidence.score", "6.5"), ("service.version", "v2")];
    let found = score(&t, &firings(&[alert(70 * MIN, "delta_ab", "vllm-1", &ab)]));
    let r = found.fleet.as_ref().unwrap().rollout.clone().unwrap();
    assert_eq!((r.expected, r.verdict), ("regression", "regression"));
    assert_eq!(r.delta_ms, Some(6.5));
    assert!((r.delta_error_ms.unwrap() + 0.7).abs() < 1e-9);
    assert_eq!(r.delay_s, Some(2400.0));
    // delta_ab's alert names a candidate replica; that is not a per-replica false alarm
    assert!(found.pass && found.false_alarms == 0, "{found:?}");
    let missed = score(&t, &[]);
    assert!(!missed.pass && missed.detected == Some(false));
    let aa = serde_json::json!({"baseline_version": "v1", "candidate_version": "v2", "at_unix_nano": 30 * MIN,
        "candidate_replicas": ["vllm-0"], "delta_ms": 0.4, "injected_ms": 0.0});
    let t = fleet(8, &[], Some(aa));
    assert!(score(&t, &[]).pass);
    let fa = score(&t, &firings(&[alert(70 * MIN, "delta_ab", "vllm-0", &ab)]));
    assert!(!fa.pass && fa.false_alarms == 1, "{fa:?}");
}

fn registry() -> inferwatch_core::registry::Registry {
    let mut r = inferwatch_core::registry::Registry::new();
    inferwatch_processors::register(&mut r);
    r
}

/// A short real fleet: 6 replicas for 50 minutes, gpu-4 1.5x slower from 20m, through the
/// fleet pipeline. peer_outlier must name gpu-4 within 10 minutes and no other replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_fleet_scenario_names_the_slow_replica() {
    let yaml = r#"
name: fleet_short
seed: 9
duration: 50m
engine: { gpu: a10g }
fleet:
  replicas: 6
  name: "gpu-{i}"
  qps_spread: 0.1
  faults: [ { replicas: [gpu-4], fault: { kind: slowdown, onset: 20m, factor: 1.5 } } ]
load: { qps: 1.0, prompt: { median: 250, sigma: 0.8, max: 4000 }, prefix: { pool: 16, tokens: 1024, share: 0.9 } }
slo: { metric: ttft, quantile: 0.95, threshold: 1s, window: 5m }
output: { metrics_interval: 15s, span_sample: 0.02 }
"#;
    let base = std::env::temp_dir().join(format!("eval-fleet-short-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("fleet_short.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (dir, _) = inferwatch_eval::scenario::simulate(&file, &base.join("cache")).await.unwrap();
    let run = inferwatch_eval::scenario::evaluate(&dir, None, registry()).await.unwrap();
    let _ = std::fs::remove_dir_all(&base);
    let o = &run.outcome;
    let f = o.fleet.as_ref().expect("fleet outcome");
    println!("{}", inferwatch_eval::scenario::fleet::table(&[o]));
    assert_eq!(f.faulted, ["gpu-4"]);
    assert_eq!(f.first_named.as_ref().map(|a| a.instance.as_str()), Some("gpu-4"), "{:?}", run.firings);
    assert!(f.delay_s.is_some_and(|d| d <= 600.0), "{o:?}");
    // No healthy replica is named: peer_outlier's defaults (a scale from the peers' upper tail,
    // 4 consecutive 1-minute windows) ride out a 1-QPS replica's heavy-tailed per-minute TTFT p95.
    let healthy: Vec<_> = run.firings.iter().filter(|a| !a.instance.is_empty() && a.instance != "gpu-4").collect();
    assert!(healthy.is_empty(), "healthy replicas named: {healthy:?}");
    assert_eq!(f.healthy_named, 0, "{:?}", run.firings);
    assert!(o.pass, "{o:?}");
}
