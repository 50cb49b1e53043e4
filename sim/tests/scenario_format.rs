//! The scenario file format: unknown keys and bad values are errors with positions; the
//! library parses and validates.

use std::path::PathBuf;

use inferwatch_sim::scenario::{ScenarioError, load_scenario, parse_scenario};

const MINIMAL: &str = "name: t\nduration: 1h\nload:\n  qps: 1\nslo: { metric: ttft, quantile: 0.95, threshold: 1s }\n";

fn err(text: &str) -> String {
    match parse_scenario(text, "t.yaml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn minimal_scenario_parses_with_defaults() {
    let sc = parse_scenario(MINIMAL, "t.yaml").expect("valid");
    assert_eq!(sc.duration.secs(), 3600.0);
    assert_eq!(sc.slo.window.secs(), 300.0);
    assert_eq!(sc.engine.gpu().name, "a10g");
    assert_eq!(sc.output.metrics_interval.secs(), 15.0);
}

#[test]
fn unknown_keys_are_errors_with_line_numbers() {
    let top = err(&format!("{MINIMAL}colour: blue\n"));
    println!("{top}");
    assert!(top.contains("colour") && top.contains("line 6"), "{top}");
    let nested = err(
        "name: t\nduration: 1h\nload:\n  qps: 1\n  dayly: { amplitude: 0.3 }\nslo: { metric: ttft, quantile: 0.95, threshold: 1s }\n",
    );
    println!("{nested}");
    assert!(nested.contains("dayly") && nested.contains("line 5"), "{nested}");
    let engine = err(&format!("{MINIMAL}engine: {{ gpu: a10g, max_num_seq: 3 }}\n"));
    assert!(engine.contains("max_num_seq") && engine.contains("line 6"), "{engine}");
    let fault = err(&format!("{MINIMAL}faults:\n  - {{ kind: queue_blocking, onset: 1m, strenght: 0.5 }}\n"));
    println!("{fault}");
    assert!(fault.contains("strenght") && fault.contains("line 7"), "{fault}");
}

#[test]
fn bad_values_are_errors() {
    for (text, needle) in [
        (MINIMAL.replace("1h", "1x"), "unknown unit"),
        (format!("{MINIMAL}engine: {{ gpu: h900 }}\n"), "h900"),
        (MINIMAL.replace("quantile: 0.95", "quantile: 1.5"), "slo.quantile"),
        (MINIMAL.replace("qps: 1", "qps: -1"), "load.qps"),
        (MINIMAL.replace("qps: 1", "qps: 1e9"), "load.qps"),
        (format!("{MINIMAL}faults:\n  - {{ kind: kv_pressure, strength: 2 }}\n"), "kv_pressure"),
        (format!("{MINIMAL}faults:\n  - {{ kind: melted_gpu }}\n"), "melted_gpu"),
        (format!("{MINIMAL}simulate: {{ window: 7m, every: 1h }}\n"), "simulate.window"),
        (format!("{MINIMAL}start: \"2026-13-01T00:00:00Z\"\n"), "start"),
        (format!("{MINIMAL}instances: [{{ name: a }}, {{ name: a }}]\n"), "unique"),
        (format!("{MINIMAL}deploys: [{{ at: 1m, version: v2, instances: [nope] }}]\n"), "nope"),
        (MINIMAL.replace("name: t\n", ""), "name"),
    ] {
        let e = err(&text);
        assert!(e.contains(needle), "{needle:?} not in {e}");
        assert!(e.starts_with("t.yaml"), "{e}");
    }
}

#[test]
fn missing_file_is_an_io_error() {
    let e = load_scenario(&PathBuf::from("/nonexistent/x.yaml"));
    assert!(matches!(e, Err(ScenarioError::Io { .. })));
}

#[test]
fn every_library_scenario_parses_and_validates() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let sc = load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(Some(sc.name.as_str()), path.file_stem().and_then(|s| s.to_str()), "name = file name");
            n += 1;
        }
    }
    assert!(n >= 20, "library has {n} scenarios");
}
