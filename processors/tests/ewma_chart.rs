//! `ewma_chart` through the ArrowProcessor trait: a shift in one of two series is scored there
//! and only there, with the input's identity and the chart's evidence; checkpoints round-trip
//! and corrupt ones are refused; idle series expire.

use inferwatch_core::pdata::Signal;
use inferwatch_processors::detect::{LEVEL, SCORE};
use inferwatch_processors::ewma_chart::EwmaChartFactory;
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{gauge, gauge_points, kv, metrics_request, point};
use inferwatch_testkit::rng::SplitMix64;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use serde_json::json;

const BASE: u64 = 1_700_000_000_000_000_000;
const MIN: u64 = 60_000_000_000;
const METRIC: &str = "llm.ttft.p95";

fn harness() -> Harness {
    Harness::create(&EwmaChartFactory, "ewma_chart", &json!({"metrics": [METRIC], "warmup": 30}), Signal::Metrics)
}

/// Minute `i` of two replicas' TTFT p95: 0.25 s ± 5 %; replica b moves up 1.5σ from minute 60.
fn minute(i: u64, rng: &mut SplitMix64) -> ExportMetricsServiceRequest {
    let mut noise = || 0.0125 * rng.normal();
    let a = 0.25 + noise();
    let b = 0.25 + noise() + if i >= 60 { 1.5 * 0.0125 } else { 0.0 };
    let t = BASE + i * MIN;
    metrics_request(
        vec![kv("service.name", "vllm")],
        None,
        vec![
            gauge(METRIC, "s", vec![point(vec![kv("instance", "a")], t, a)]),
            gauge(METRIC, "s", vec![point(vec![kv("instance", "b")], t, b)]),
            gauge("llm.tps", "1/s", vec![point(vec![kv("instance", "a")], t, 1000.0 + i as f64)]),
        ],
    )
}

#[test]
fn a_shift_in_one_replica_is_scored_there_with_evidence() {
    let mut h = harness();
    let mut rng = SplitMix64(11);
    let mut over = std::collections::BTreeMap::<String, Vec<u64>>::new();
    let mut scored = 0;
    for i in 0..120 {
        for req in h.process_metrics(&minute(i, &mut rng)) {
            for p in gauge_points(&req) {
                assert_eq!(p.attr("detector"), "ewma_chart");
                assert_eq!(p.attr("metric"), METRIC, "only the configured metric is charted");
                assert!(i >= 30, "scored during the 30-point warm-up at minute {i}");
                if p.name == SCORE {
                    scored += 1;
                    assert_eq!(p.resource.get("service.name").map(String::as_str), Some("vllm"));
                    assert!((p.num("ewma.baseline") - 0.25).abs() < 0.01, "{p:?}");
                    assert_eq!(p.num("ewma.lambda"), 0.2);
                    if p.value > 3.0 {
                        over.entry(p.attr("instance").to_string()).or_default().push(i);
                    }
                } else {
                    assert_eq!(p.name, LEVEL);
                    assert!((0.0..=1.0).contains(&p.value));
                }
            }
        }
    }
    assert_eq!(scored, 2 * 90, "both replicas scored from minute 30 on");
    let b = over.get("b").expect("the shifted replica crosses the 3σ limit");
    assert!(b[0] >= 60 && b[0] < 80, "first signal of b at minute {}", b[0]);
    assert!(over.get("a").is_none_or(|a| a.len() <= 2), "in-control replica a signalled at {:?}", over.get("a"));
    assert_eq!(h.proc.series_count(), 2);
}

#[test]
fn checkpoints_round_trip_and_corrupt_ones_are_refused() {
    let mut h = harness();
    let mut rng = SplitMix64(5);
    for i in 0..40 {
        h.process_metrics(&minute(i, &mut rng));
    }
    let bytes = h.proc.snapshot().unwrap();
    let mut other = harness();
    assert!(other.proc.restore(&bytes[..bytes.len() - 7]).is_err(), "truncated checkpoint restored");
    assert_eq!(other.proc.series_count(), 0, "a refused checkpoint left state behind");
    other.proc.restore(&bytes).unwrap();
    assert_eq!(other.proc.snapshot().unwrap(), bytes);
    // Both continue identically.
    let mut r1 = SplitMix64(9);
    let mut r2 = SplitMix64(9);
    for i in 40..50 {
        assert_eq!(h.process_metrics(&minute(i, &mut r1)), other.process_metrics(&minute(i, &mut r2)));
    }
}

#[test]
fn idle_series_expire_on_the_watermark() {
    let mut h = harness();
    let mut rng = SplitMix64(2);
    h.process_metrics(&minute(0, &mut rng));
    assert_eq!(h.proc.series_count(), 2);
    h.advance_metrics(BASE + 59 * MIN);
    assert_eq!(h.proc.series_count(), 2, "expired before the 1h idle timeout");
    h.advance_metrics(BASE + 61 * MIN);
    assert_eq!(h.proc.series_count(), 0);
    assert_eq!(h.evicted("idle"), 2);
}
