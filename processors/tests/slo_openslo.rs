//! `slo`'s `openslo` key: OpenSLO v1 `SLO` documents read as objectives equal to the same
//! objectives written natively, and the documents refused, with the file, document and field.

use inferwatch_core::component::{FieldError, PathSeg, parse_config};
use inferwatch_processors::slo::config::{Checked, Objective, SloConfig};
use serde_json::{Value, json};
use std::path::PathBuf;

const DIR: &str = "tests/fixtures/openslo";

fn check(v: Value) -> Result<Checked, FieldError> {
    parse_config::<SloConfig>(&v)?.check()
}

fn fixture(name: &str) -> String {
    format!("{DIR}/{name}")
}

/// The objectives of OpenSLO files alone.
fn from_files(files: &[&str]) -> Vec<Objective> {
    let paths: Vec<String> = files.iter().map(|f| fixture(f)).collect();
    match check(json!({ "openslo": paths })) {
        Ok(c) => c.objectives,
        Err(e) => panic!("{files:?} refused: {:?}: {}", e.path, e.message),
    }
}

/// The objectives written natively.
fn native(objectives: Value) -> Vec<Objective> {
    match check(json!({ "objectives": objectives })) {
        Ok(c) => c.objectives,
        Err(e) => panic!("native objectives refused: {:?}: {}", e.path, e.message),
    }
}

/// Every checked field (the embedded forecast's settings included) compared.
fn assert_same(got: &[Objective], want: &[Objective]) {
    assert_eq!(got.len(), want.len(), "objectives: {:?}", got.iter().map(|o| &o.name).collect::<Vec<_>>());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(format!("{g:?}"), format!("{w:?}"), "objective {}", w.name);
    }
}

fn openslo_path(i: usize) -> Vec<PathSeg> {
    vec![PathSeg::Key("openslo".into()), PathSeg::Index(i)]
}

#[test]
fn a_timeslices_latency_slo_is_the_window_latency_objective() {
    let got = from_files(&["latency.yaml"]);
    let want = native(json!([{
        "name": "tpot-p95", "signal": "llm.tpot.p95", "threshold": 0.07, "target": "99.5%", "period": "7d",
        "source": "spans"
    }]));
    assert_same(&got, &want);
    // A wrong mapping would show here too: the threshold in seconds, the period in hours.
    assert_eq!(got[0].period_hours, 168);
    assert!((got[0].target - 0.995).abs() < 1e-12);
}

#[test]
fn a_raw_failure_ratio_is_error_ratio_by_occurrences_and_availability_by_timeslices() {
    let got = from_files(&["errors.yaml"]);
    let want = native(json!([
        { "name": "errors", "signal": "error_ratio", "target": 0.995, "period": "28d", "source": "spans",
          "model": "llama-3-8b" },
        { "name": "availability", "signal": "availability", "threshold": 0.05, "target": 0.999, "period": "28d",
          "source": "scrape" }
    ]));
    assert_same(&got, &want);
}

#[test]
fn an_sli_referenced_by_two_slos_and_skipped_kinds() {
    let got = from_files(&["referenced.yaml"]);
    // A Prometheus selector without a source label matches both sources.
    let want = native(json!([
        { "name": "ttft-p99-fast", "signal": "ttft_p99", "threshold": "1.5s", "target": 0.99, "source": "any" },
        { "name": "ttft-p99-slow", "signal": "llm.ttft.p99", "threshold": 4, "target": "99.9%", "period": "28d",
          "source": "any" }
    ]));
    assert_same(&got, &want);
}

#[test]
fn native_objectives_come_first_then_the_files_in_order() {
    let c = check(json!({
        "objectives": [{ "name": "native", "signal": "error_ratio" }],
        "openslo": [fixture("referenced.yaml"), fixture("latency.yaml")]
    }))
    .unwrap();
    let names: Vec<&str> = c.objectives.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["native", "ttft-p99-fast", "ttft-p99-slow", "tpot-p95"]);
    // An SLO named as a native objective is refused at its own document.
    let e = check(json!({
        "objectives": [{ "name": "tpot-p95", "signal": "error_ratio" }],
        "openslo": [fixture("referenced.yaml"), fixture("latency.yaml")]
    }))
    .unwrap_err();
    assert_eq!(e.path, openslo_path(1));
    assert!(
        e.message.contains("latency.yaml:5:3 (document 1, SLO \"tpot-p95\"): metadata.name: duplicate"),
        "{}",
        e.message
    );
}

#[test]
fn the_three_fixture_refusals_name_file_document_and_field() {
    let e = check(json!({ "openslo": [fixture("bad_budgeting.yaml")] })).unwrap_err();
    assert_eq!(e.path, openslo_path(0));
    assert_eq!(
        e.message,
        "tests/fixtures/openslo/bad_budgeting.yaml:10:3 (document 1, SLO \"tpot\"): spec.budgetingMethod: unknown \
         budgeting method \"Hourly\": expected Occurrences or Timeslices"
    );

    let e = check(json!({ "openslo": [fixture("latency.yaml"), fixture("bad_op.yaml")] })).unwrap_err();
    assert_eq!(e.path, openslo_path(1));
    assert_eq!(
        e.message,
        "tests/fixtures/openslo/bad_op.yaml:18:7 (document 2, SLO \"e2e-p99\"): spec.objectives[0].op: gt: a latency \
         or error rate is good when low: write op: lte (good when the metric ≤ value)"
    );

    let e = check(json!({ "openslo": [fixture("missing_target.yaml")] })).unwrap_err();
    assert_eq!(e.path, openslo_path(0));
    assert_eq!(
        e.message,
        "tests/fixtures/openslo/missing_target.yaml:12:7 (document 1, SLO \"queue\"): spec.objectives[0]: target or \
         targetPercent is required (e.g. target: 0.99 or targetPercent: 99)"
    );
}

/// A scratch directory for generated documents.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iw-openslo-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An SLO document with `indicator_spec` (YAML under `indicator.spec`, 6 spaces deep) and the
/// rest of the spec (`rest`, 2 spaces deep).
fn slo_doc(indicator_spec: &str, rest: &str) -> String {
    format!(
        "apiVersion: openslo/v1\nkind: SLO\nmetadata:\n  name: s\nspec:\n  indicator:\n    spec:\n{indicator_spec}\n{rest}\n"
    )
}

const TPOT: &str = "      thresholdMetric:\n        metricSource: { type: inferwatch, spec: { signal: llm.tpot.p95 } }";
const RAW: &str = "      ratioMetric:\n        rawType: failure\n        raw:\n          metricSource: { type: inferwatch, spec: { signal: llm.request.error_rate } }";

#[test]
fn refusals_of_what_does_not_map() {
    let occ = "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 0.07, target: 0.99 }]";
    let cases: Vec<(&str, String, &str, &str)> = vec![
        ("ratio_timeslices", slo_doc(RAW, "  budgetingMethod: RatioTimeslices\n  objectives: [{ target: 0.99 }]"),
         "spec.budgetingMethod", "RatioTimeslices (the mean of the slices' ratios) has no inferwatch equivalent"),
        ("no_budgeting", slo_doc(TPOT, "  objectives: [{ op: lte, value: 0.07, target: 0.99 }]"),
         "spec.budgetingMethod", "required"),
        ("lt", slo_doc(TPOT, "  budgetingMethod: Occurrences\n  objectives: [{ op: lt, value: 0.07, target: 0.99 }]"),
         "spec.objectives[0].op", "write op: lte"),
        ("no_value", slo_doc(TPOT, "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, target: 0.99 }]"),
         "spec.objectives[0].value", "required with a thresholdMetric"),
        ("both_targets", slo_doc(TPOT, "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 1, target: 0.99, targetPercent: 99 }]"),
         "spec.objectives[0].targetPercent", "not both"),
        ("target_range", slo_doc(TPOT, "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 1, targetPercent: 100 }]"),
         "spec.objectives[0].targetPercent", "strictly between 0 and 100"),
        ("two_objectives", slo_doc(RAW, "  budgetingMethod: Occurrences\n  objectives: [{ target: 0.99 }, { target: 0.9 }]"),
         "spec.objectives", "write one SLO document per objective"),
        ("slice_5m", slo_doc(TPOT, "  budgetingMethod: Timeslices\n  objectives: [{ op: lte, value: 0.07, target: 0.99, timeSliceWindow: 5m }]"),
         "spec.objectives[0].timeSliceWindow", "must be 1m"),
        ("slice_missing", slo_doc(TPOT, "  budgetingMethod: Timeslices\n  objectives: [{ op: lte, value: 0.07, target: 0.99 }]"),
         "spec.objectives[0].timeSliceWindow", "required with Timeslices"),
        ("slice_target_missing", slo_doc(RAW, "  budgetingMethod: Timeslices\n  objectives: [{ target: 0.99, timeSliceWindow: 1 }]"),
         "spec.objectives[0].timeSliceTarget", "required with Timeslices and a ratioMetric"),
        ("ratio_with_op", slo_doc(RAW, "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 0.05, target: 0.99 }]"),
         "spec.objectives[0].op", "apply to a thresholdMetric"),
        ("calendar", slo_doc(TPOT, &format!("  timeWindow: [{{ duration: 1M, calendar: {{ startTime: 2024-01-01 00:00:00, timeZone: UTC }} }}]\n{occ}")),
         "spec.timeWindow[0].isRolling", "calendar-aligned windows are not supported"),
        ("month", slo_doc(TPOT, &format!("  timeWindow: [{{ duration: 1M, isRolling: true }}]\n{occ}")),
         "spec.timeWindow[0].duration", "write days, e.g. 30d"),
        ("minutes", slo_doc(TPOT, &format!("  timeWindow: [{{ duration: 90m, isRolling: true }}]\n{occ}")),
         "spec.timeWindow[0].duration", "must be whole hours"),
        ("good_total", slo_doc("      ratioMetric:\n        good: { metricSource: { type: inferwatch, spec: { signal: llm.request.rate } } }\n        total: { metricSource: { type: inferwatch, spec: { signal: llm.request.rate } } }", occ),
         "spec.indicator.spec.ratioMetric.good", "write ratioMetric.raw"),
        ("raw_success", slo_doc("      ratioMetric:\n        rawType: success\n        raw: { metricSource: { type: inferwatch, spec: { signal: llm.request.error_rate } } }", "  budgetingMethod: Occurrences\n  objectives: [{ target: 0.99 }]"),
         "spec.indicator.spec.ratioMetric.rawType", "write rawType: failure"),
        ("raw_latency", slo_doc("      ratioMetric:\n        rawType: failure\n        raw: { metricSource: { type: inferwatch, spec: { signal: llm.tpot.p95 } } }", "  budgetingMethod: Occurrences\n  objectives: [{ target: 0.99 }]"),
         "spec.indicator.spec.ratioMetric.raw.metricSource", "llm.tpot.p95 is not a ratio"),
        ("datadog", slo_doc("      thresholdMetric:\n        metricSource: { type: Datadog, spec: { query: 'avg:x{*}' } }", occ),
         "spec.indicator.spec.thresholdMetric.metricSource.type", "\"Datadog\" is not read"),
        ("promql_function", slo_doc("      thresholdMetric:\n        metricSource: { type: Prometheus, spec: { query: 'histogram_quantile(0.95, rate(x[5m]))' } }", occ),
         "spec.indicator.spec.thresholdMetric.metricSource.spec.query", "is not an llm_signals gauge"),
        ("promql_label", slo_doc("      thresholdMetric:\n        metricSource: { type: Prometheus, spec: { query: 'llm_tpot_p95_seconds{instance=\"a\"}' } }", occ),
         "spec.indicator.spec.thresholdMetric.metricSource.spec.query", "label instance: only source and gen_ai_request_model select"),
        ("unknown_signal", slo_doc("      thresholdMetric:\n        metricSource: { type: inferwatch, spec: { signal: llm.tpot.p90 } }", occ),
         "spec.indicator.spec.thresholdMetric.metricSource.spec.signal", "unknown signal \"llm.tpot.p90\""),
        ("objective_as_signal", slo_doc("      thresholdMetric:\n        metricSource: { type: inferwatch, spec: { signal: error_ratio } }", occ),
         "spec.indicator.spec.thresholdMetric.metricSource.spec.signal", "error_ratio is an objective, not a metric"),
        ("typo", slo_doc(TPOT, "  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 0.07, traget: 0.99 }]"),
         "spec.objectives[0].traget", "unknown field"),
        ("ref_missing", "apiVersion: openslo/v1\nkind: SLO\nmetadata: { name: s }\nspec:\n  indicatorRef: nope\n  budgetingMethod: Occurrences\n  objectives: [{ op: lte, value: 1, target: 0.9 }]\n".to_string(),
         "spec.indicatorRef", "no SLI document named \"nope\""),
        ("v1alpha", "apiVersion: openslo/v1alpha\nkind: SLO\nmetadata: { name: s }\nspec: {}\n".to_string(),
         "apiVersion", "only openslo/v1 documents are"),
        ("bad_name", slo_doc(TPOT, occ).replace("name: s", "name: 'a b'"),
         "metadata.name", "use letters, digits and - _ . : only"),
    ];
    let dir = scratch("refusals");
    for (name, text, field, message) in cases {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, &text).unwrap();
        let p = path.display().to_string();
        let e = match check(json!({ "openslo": [p] })) {
            Ok(_) => panic!("{name}: accepted:\n{text}"),
            Err(e) => e,
        };
        assert_eq!(e.path, openslo_path(0), "{name}");
        assert!(e.message.starts_with(&format!("{p}:")), "{name}: {}", e.message);
        assert!(e.message.contains("(document 1, SLO \""), "{name}: {}", e.message);
        assert!(e.message.contains(&format!("): {field}: ")), "{name}: want field {field}: {}", e.message);
        assert!(e.message.contains(message), "{name}: want {message:?}: {}", e.message);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn file_level_refusals() {
    let e = check(json!({ "openslo": ["tests/fixtures/openslo/absent.yaml"] })).unwrap_err();
    assert_eq!(e.path, openslo_path(0));
    assert!(
        e.message.contains("cannot read \"tests/fixtures/openslo/absent.yaml\" (relative to the working directory"),
        "{}",
        e.message
    );

    let dir = scratch("files");
    // Only an SLI: no objective comes of it.
    let sli = dir.join("sli.yaml");
    std::fs::write(&sli, "apiVersion: openslo/v1\nkind: SLI\nmetadata: { name: x }\nspec: {}\n").unwrap();
    let e = check(json!({ "openslo": [sli.display().to_string()] })).unwrap_err();
    assert_eq!(e.path, vec![PathSeg::Key("openslo".into())]);
    assert!(e.message.starts_with("no document of kind SLO"), "{}", e.message);
    // A YAML error is placed on the file's own line, past the earlier documents.
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, "apiVersion: openslo/v1\nkind: Service\nmetadata: { name: a }\n---\nkind: [\n").unwrap();
    let e = check(json!({ "openslo": [sli.display().to_string(), broken.display().to_string()] })).unwrap_err();
    assert_eq!(e.path, openslo_path(1));
    assert!(e.message.starts_with(&format!("{}:", broken.display())), "{}", e.message);
    assert!(e.message.contains(":5:") || e.message.contains(":6:"), "{}", e.message);
    // An unknown kind.
    let odd = dir.join("odd.yaml");
    std::fs::write(&odd, "apiVersion: openslo/v1\nkind: Budget\nmetadata: { name: a }\n").unwrap();
    let e = check(json!({ "openslo": [odd.display().to_string()] })).unwrap_err();
    assert!(e.message.contains(":2:1 (document 1, Budget \"a\"): kind: expected one of"), "{}", e.message);
    // Two SLIs of one name.
    let twice = dir.join("twice.yaml");
    std::fs::write(
        &twice,
        "apiVersion: openslo/v1\nkind: SLI\nmetadata: { name: a }\n---\napiVersion: openslo/v1\nkind: SLI\nmetadata: { name: a }\n",
    )
    .unwrap();
    let e = check(json!({ "openslo": [twice.display().to_string()] })).unwrap_err();
    assert!(
        e.message.contains(":7:") && e.message.contains("(document 2, SLI \"a\"): metadata.name: a SLI of this name"),
        "{}",
        e.message
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_config_still_asks_for_objectives() {
    let e = check(json!({})).unwrap_err();
    assert_eq!(e.path, vec![PathSeg::Key("objectives".into())]);
    assert!(e.message.contains("openslo"), "{}", e.message);
}

#[test]
fn the_agent_places_the_error_on_the_openslo_entry_of_its_config() {
    let text = format!(
        "processors:\n  slo:\n    openslo:\n      - {}\n      - {}\nservice:\n  pipelines:\n    metrics: {{ receivers: [otlp], processors: [slo], exporters: [debug] }}\n",
        fixture("latency.yaml"),
        fixture("bad_op.yaml")
    );
    let c = inferwatch_core::config::load_str("pipeline.yaml", &text, &|_| None).unwrap();
    let mut reg = inferwatch_core::registry::Registry::new();
    inferwatch_processors::register(&mut reg);
    let errs = inferwatch_core::config::validate(&c, &reg);
    let Some(e) = errs.iter().find(|e| e.key.starts_with("processors.slo")) else {
        panic!("no slo error in {:?}", errs.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    assert_eq!(
        e.to_string(),
        "pipeline.yaml:5:9: processors.slo.openslo[1]: tests/fixtures/openslo/bad_op.yaml:18:7 (document 2, SLO \
         \"e2e-p99\"): spec.objectives[0].op: gt: a latency or error rate is good when low: write op: lte (good when \
         the metric ≤ value)"
    );
}
