//! Running scenarios: byte-identical output for the same seed, valid OTLP JSON lines with
//! consistent span values, sane ground truth.

use std::path::{Path, PathBuf};

use inferwatch_sim::scenario::{parse_scenario, run};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;

const SCENARIO: &str = r#"
name: everything
seed: 5
start: "2026-01-10T20:00:00Z"   # a Saturday evening
duration: 3h
engine: { gpu: a10g }
instances:
  - { name: a, version: v1 }
  - { name: b, version: v1, load_share: 0.8, faults: [ { kind: queue_blocking, onset: 100m, strength: 0.5 } ] }
load:
  qps: 1.0
  daily: { amplitude: 0.4 }
  weekly: { weekend: 0.7 }
  noise: { sigma: 0.1, every: 2m }
  bursts: { at: [30m], per_day: 3, duration: 5m, factor: 1.5 }
  prefix: { pool: 8, tokens: 512 }
deploys:
  - { at: 65m, version: v2, instances: [a], cold_start: { strength: 2, warmup: 20s } }
slo: { metric: queue, quantile: 0.99, threshold: 800ms, window: 5m }
simulate: { window: 10m, every: 30m }
output: { metrics_interval: 30s, span_sample: 0.2 }
"#;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("inferwatch-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn read(dir: &Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

fn attr<'a>(attrs: &'a [opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

fn f64_attr(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> f64 {
    match attr(attrs, key) {
        Some(Value::DoubleValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

#[test]
fn same_seed_same_bytes_and_valid_otlp() {
    let sc = parse_scenario(SCENARIO, "everything.yaml").expect("valid");
    let (d1, d2) = (tmp("det1"), tmp("det2"));
    let s1 = run(&sc, &d1).expect("run 1");
    let s2 = run(&sc, &d2).expect("run 2");
    for f in ["traces.jsonl", "metrics.jsonl", "ground_truth.json"] {
        assert!(read(&d1, f) == read(&d2, f), "{f} differs between runs");
    }
    assert!(s1.requests > 1000 && s1.spans_written > 100 && s1.requests == s2.requests);
    // a different seed gives different traffic
    let mut other = sc.clone();
    other.seed = 6;
    let d3 = tmp("det3");
    run(&other, &d3).expect("run 3");
    assert!(read(&d1, "traces.jsonl") != read(&d3, "traces.jsonl"));

    // traces: llm_request SERVER spans with consistent vLLM V1 attributes
    let mut spans = 0;
    for line in String::from_utf8(read(&d1, "traces.jsonl")).expect("utf8").lines() {
        let req: ExportTraceServiceRequest = serde_json::from_str(line).expect("ExportTraceServiceRequest");
        for rs in &req.resource_spans {
            let res = rs.resource.as_ref().expect("resource");
            assert!(matches!(attr(&res.attributes, "service.name"), Some(Value::StringValue(s)) if s == "vllm"));
            for ss in &rs.scope_spans {
                assert_eq!(ss.scope.as_ref().map(|s| s.name.as_str()), Some("vllm.llm_engine"));
                for sp in &ss.spans {
                    spans += 1;
                    assert_eq!(sp.name, "llm_request");
                    assert_eq!(sp.kind, 2);
                    assert_eq!(sp.trace_id.len(), 16);
                    assert_eq!(sp.span_id.len(), 8);
                    let a = &sp.attributes;
                    let (ttft, e2e) =
                        (f64_attr(a, "gen_ai.latency.time_to_first_token"), f64_attr(a, "gen_ai.latency.e2e"));
                    let (q, p, d) = (
                        f64_attr(a, "gen_ai.latency.time_in_queue"),
                        f64_attr(a, "gen_ai.latency.time_in_model_prefill"),
                        f64_attr(a, "gen_ai.latency.time_in_model_decode"),
                    );
                    assert!(ttft <= e2e + 1e-9);
                    assert!((q + p + d - e2e).abs() < 1e-6, "queue + prefill + decode = e2e");
                    assert!((sp.end_time_unix_nano - sp.start_time_unix_nano) as f64 / 1e9 - e2e < 1e-6);
                    assert!(matches!(attr(a, "gen_ai.usage.completion_tokens"), Some(Value::IntValue(n)) if *n >= 1));
                    assert!(
                        matches!(attr(a, "gen_ai.response.finish_reasons"), Some(Value::StringValue(s)) if s.starts_with("[\""))
                    );
                }
            }
        }
    }
    assert_eq!(spans as u64, s1.spans_written);

    // metrics: vllm:* names, cumulative counters monotonic per instance except after a deploy
    let mut names = std::collections::BTreeSet::new();
    let mut last: std::collections::HashMap<String, (u64, f64)> = std::collections::HashMap::new();
    let mut resets = 0;
    for line in String::from_utf8(read(&d1, "metrics.jsonl")).expect("utf8").lines() {
        let req: ExportMetricsServiceRequest = serde_json::from_str(line).expect("ExportMetricsServiceRequest");
        assert_eq!(req.resource_metrics.len(), 2);
        for rm in &req.resource_metrics {
            let res = rm.resource.as_ref().expect("resource");
            let inst = match attr(&res.attributes, "service.instance.id") {
                Some(Value::StringValue(s)) => s.clone(),
                _ => panic!("instance"),
            };
            for m in &rm.scope_metrics[0].metrics {
                names.insert(m.name.clone());
                if m.name == "vllm:generation_tokens_total"
                    && let Some(Data::Sum(s)) = &m.data
                {
                    assert!(s.is_monotonic);
                    let dp = &s.data_points[0];
                    let v = match dp.value {
                        Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v)) => v,
                        _ => panic!("double"),
                    };
                    if let Some((start, prev)) = last.get(&inst) {
                        if *start == dp.start_time_unix_nano {
                            assert!(v >= *prev, "counter went down without a restart");
                        } else {
                            resets += 1;
                        }
                    }
                    last.insert(inst.clone(), (dp.start_time_unix_nano, v));
                }
            }
        }
    }
    assert_eq!(resets, 1, "one deploy restarts instance a");
    for n in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:iteration_tokens_total",
        "vllm:cache_config_info",
    ] {
        assert!(names.contains(n), "missing {n}");
    }

    // ground truth: instance b breaches its queue SLO after the onset, a never does
    let gt = &s1.ground_truth;
    let onset = gt.start_time_unix_nano + 100 * 60 * 1_000_000_000;
    assert_eq!(gt.fault_onset_unix_nano, Some(onset));
    assert!(gt.instances[0].first_breach_unix_nano.is_none(), "{:?}", gt.instances[0].slo_windows);
    let b = gt.instances[1].first_breach_unix_nano.expect("b breaches");
    assert!(b + 300_000_000_000 > onset && b < onset + 20 * 60 * 1_000_000_000, "breach right after onset");
    assert!(gt.segments.len() >= 4, "duty-cycle segments: {:?}", gt.segments);
    for d in [d1, d2, d3] {
        let _ = std::fs::remove_dir_all(d);
    }
}
