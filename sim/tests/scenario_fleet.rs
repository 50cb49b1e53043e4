//! The `fleet:` shorthand: it is exactly its written-out instances, targets faults and deploys
//! at a subset, and its ground truth names the faulted replicas, the versions per replica and
//! the rollout's pooled A/B.

use std::path::PathBuf;

use inferwatch_sim::scenario::fleet::load_share;
use inferwatch_sim::scenario::{parse_scenario, run};

const FLEET: &str = r#"
name: fleet_small
seed: 77
duration: 40m
engine: { gpu: a10g, version: v1 }
fleet:
  replicas: 4
  name: "gpu-{i}"
  qps_spread: 0.2
  faults:
    - { replicas: [gpu-2], fault: { kind: slowdown, onset: 20m, factor: 1.5 } }
load: { qps: 1.5, prefix: { pool: 8, tokens: 512 } }
deploys:
  - { at: 10m, version: v2, replicas: 1 }
faults:
  - { kind: version_regression, version: v2, strength: 20 }
slo: { metric: ttft, quantile: 0.95, threshold: 2s, window: 5m }
output: { metrics_interval: 30s, span_sample: 0.1 }
"#;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("inferwatch-sim-fleet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn fleet_is_its_instances_written_out() {
    let sc = parse_scenario(FLEET, "fleet.yaml").unwrap();
    let f = sc.fleet.clone().unwrap();
    let shares: Vec<f64> = (0..4).map(|i| load_share(sc.seed, &f, i)).collect();
    assert!(shares.iter().all(|s| (0.8..=1.2).contains(s)), "{shares:?}");
    assert!(shares.windows(2).any(|w| (w[0] - w[1]).abs() > 0.01), "spread gives different shares: {shares:?}");
    let inst: Vec<String> = (0..4)
        .map(|i| {
            let faults = if i == 2 { "[ { kind: slowdown, onset: 20m, factor: 1.5 } ]" } else { "[]" };
            format!("  - {{ name: gpu-{i}, load_share: {:?}, faults: {faults} }}\n", shares[i as usize])
        })
        .collect();
    let fleet_block = FLEET.split("fleet:").nth(1).unwrap().split("load:").next().unwrap();
    let plain = FLEET
        .replace(&format!("fleet:{fleet_block}"), &format!("instances:\n{}", inst.concat()))
        .replace("replicas: 1 }", "instances: [gpu-0] }");
    let sc2 = parse_scenario(&plain, "plain.yaml").unwrap();
    let (a, b) = (tmp("a"), tmp("b"));
    let ta = run(&sc, &a).unwrap().ground_truth;
    let tb = run(&sc2, &b).unwrap().ground_truth;
    for file in ["traces.jsonl", "metrics.jsonl"] {
        let (x, y) = (std::fs::read(a.join(file)).unwrap(), std::fs::read(b.join(file)).unwrap());
        assert!(!x.is_empty());
        assert!(x == y, "{file} differs between the fleet and its instances");
    }
    assert_eq!(ta.instances, tb.instances);
    assert!(ta.fleet.is_some() && tb.fleet.is_none());
    let text = std::fs::read_to_string(b.join("ground_truth.json")).unwrap();
    assert!(!text.contains("\"fleet\""), "no fleet key outside fleets");
    let _ = (std::fs::remove_dir_all(&a), std::fs::remove_dir_all(&b));
}

#[test]
fn fleet_truth_names_faulted_replicas_versions_and_rollout() {
    let sc = parse_scenario(FLEET, "fleet.yaml").unwrap();
    let dir = tmp("truth");
    let gt = run(&sc, &dir).unwrap().ground_truth;
    let _ = std::fs::remove_dir_all(&dir);
    let f = gt.fleet.expect("fleet truth");
    assert!(gt.ab.is_none());
    assert_eq!(f.model, "meta-llama/Meta-Llama-3-8B-Instruct");
    let names: Vec<&str> = f.replicas.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    // gpu-2: the slowdown; gpu-0: v2 from 10m carries the regression
    assert_eq!(f.faulted, ["gpu-0", "gpu-2"]);
    let r0 = &f.replicas[0];
    assert_eq!(r0.versions.len(), 2);
    assert_eq!(r0.versions[1].1, "v2");
    assert_eq!(r0.fault_onset_unix_nano, Some(gt.start_time_unix_nano + 600_000_000_000));
    assert_eq!(r0.fault_kinds, ["version_regression"]);
    assert_eq!(f.replicas[2].fault_kinds, ["slowdown"]);
    assert_eq!(f.replicas[2].fault_onset_unix_nano, Some(gt.start_time_unix_nano + 1_200_000_000_000));
    assert!(!f.replicas[1].faulted && f.replicas[1].versions.len() == 1);
    let ro = f.rollout.expect("rollout");
    assert_eq!((ro.baseline_version.as_str(), ro.candidate_version.as_str()), ("v1", "v2"));
    assert_eq!(ro.candidate_replicas, ["gpu-0"]);
    assert_eq!(ro.baseline_replicas, ["gpu-1", "gpu-2", "gpu-3"]);
    assert_eq!(ro.injected_ms, 20.0);
    assert!(ro.n_baseline > 2 * ro.n_candidate && ro.n_candidate > 100, "{ro:?}");
    assert!((ro.delta_ms - (ro.candidate_s - ro.baseline_s) * 1e3).abs() < 1e-6, "{ro:?}");
    // the slowed replica's TTFT p95 after its onset is above every peer's
    let after = |i: usize| {
        let w = &gt.instances[i].slo_windows;
        let v: Vec<f64> = w.iter().filter(|x| x.0 >= 1500.0).map(|x| x.2).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    assert!(after(2) > 1.2 * after(1) && after(2) > 1.2 * after(3), "{} {} {}", after(1), after(2), after(3));
}

#[test]
fn fleet_errors_name_the_field() {
    let cases = [
        (FLEET.replace("[gpu-2]", "[gpu-9]"), "fleet.faults[0].replicas: unknown replica \"gpu-9\""),
        (FLEET.replace("replicas: 1 }", "replicas: 5 }"), "deploys[0].replicas: 5 is more than"),
        (FLEET.replace("name: \"gpu-{i}\"", "name: gpu"), "fleet.name: must contain {i}"),
        (FLEET.replace("qps_spread: 0.2", "qps_spread: 1.5"), "fleet.qps_spread"),
        (FLEET.replace("factor: 1.5", "factor: 0.5"), "fleet.faults[0].fault: slowdown: factor must be >= 1"),
        (FLEET.replace("replicas: 4", "replicas: 0"), "fleet.replicas: must be in 1..=1000"),
        (FLEET.replace("replicas: 1 }", "replicas: 1, instances: [gpu-0] }"), "deploys[0]: give replicas or instances"),
        (FLEET.replace("load:", "instances: [ { name: x } ]\nload:"), "fleet: cannot be combined with instances"),
    ];
    for (text, needle) in cases {
        let e = parse_scenario(&text, "f.yaml").unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
    let no_fleet = "name: x\nduration: 1h\nload: { qps: 1 }\ndeploys: [ { at: 1m, version: v2, replicas: 1 } ]\n\
                    slo: { metric: ttft, quantile: 0.95, threshold: 1s }\n";
    let e = parse_scenario(no_fleet, "x.yaml").unwrap_err().to_string();
    assert!(e.contains("deploys[0].replicas: needs fleet"), "{e}");
}
