//! `llm_signals`' split of span-derived TTFT and e2e by prompt length (`input_buckets`): each
//! bucket's percentiles against brute force over the per-request values, the counts, the
//! upper-exclusive bounds, `llm.ttft.long_short`, config errors, checkpoints, and that the
//! unsplit series are the same with the split on or off.

use crate::llm_signals::{Pt, flatten};
use inferwatch_core::component::{ConnectorFactory, PathSeg};
use inferwatch_core::pdata::Signal;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{self, f64_kv as dbl, int_kv as int, kv as s, resource, scope};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use serde_json::json;

const S: u64 = 1_000_000_000;
/// A multiple of every window used here.
const BASE: u64 = 1_699_999_980 * S;
const ALPHA: f64 = 0.01;
const LABELS: [&str; 4] = ["lt_1k", "1k_4k", "4k_8k", "ge_8k"];
const SPLIT_NAMES: [&str; 8] = [
    "llm.ttft.by_input.p50",
    "llm.ttft.by_input.p95",
    "llm.ttft.by_input.p99",
    "llm.e2e.by_input.p50",
    "llm.e2e.by_input.p95",
    "llm.e2e.by_input.p99",
    "llm.requests.finished.by_input",
    "llm.ttft.long_short",
];

fn at(secs: f64) -> u64 {
    BASE + (secs * 1e9).round() as u64
}

/// One request: end time (s after BASE), prompt tokens (None: no attribute), TTFT, e2e, failed.
#[derive(Debug, Clone)]
struct Req {
    end: f64,
    prompt: Option<i64>,
    ttft: f64,
    e2e: f64,
    error: bool,
}

fn req(end: f64, prompt: i64, ttft: f64, e2e: f64) -> Req {
    Req { end, prompt: Some(prompt), ttft, e2e, error: false }
}

fn spans(reqs: &[Req]) -> ExportTraceServiceRequest {
    let res = resource(vec![
        s("service.name", "vllm"),
        s("service.version", "v1"),
        s("service.instance.id", "i-1"),
        s("gen_ai.request.model", "llama"),
    ]);
    let spans = reqs
        .iter()
        .map(|r| {
            let end = at(r.end);
            let mut attributes = vec![
                int("gen_ai.usage.completion_tokens", 50),
                dbl("gen_ai.latency.time_to_first_token", r.ttft),
                dbl("gen_ai.latency.e2e", r.e2e),
                dbl("gen_ai.latency.time_in_queue", 0.01),
            ];
            if let Some(p) = r.prompt {
                attributes.push(int("gen_ai.usage.prompt_tokens", p));
            }
            Span {
                trace_id: vec![1; 16],
                span_id: vec![2; 8],
                name: "llm_request".into(),
                kind: 2,
                start_time_unix_nano: end - (r.e2e * 1e9).round() as u64,
                end_time_unix_nano: end,
                attributes,
                status: Some(Status { code: if r.error { 2 } else { 0 }, message: String::new() }),
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![otlp::resource_spans(res.attributes, scope("vllm.llm_engine", ""), spans)],
    }
}

fn run(cfg: serde_json::Value, batches: &[(Vec<Req>, f64)]) -> Vec<Pt> {
    let mut h = Harness::create(&LlmSignalsFactory, "llm_signals/test", &cfg, Signal::Traces);
    let mut out = Vec::new();
    for (reqs, wm) in batches {
        assert!(h.process_spans(&spans(reqs)).is_empty());
        out.extend(h.advance_one(at(*wm)).iter().flat_map(flatten));
    }
    out
}

fn bucket_points<'a>(pts: &'a [Pt], name: &str, bucket: &str, time: u64) -> Vec<&'a Pt> {
    pts.iter()
        .filter(|p| {
            p.name == name && p.time == time && p.attrs.get("llm.input_bucket").map(String::as_str) == Some(bucket)
        })
        .collect()
}

fn bucket_value(pts: &[Pt], name: &str, bucket: &str, time: u64) -> Option<f64> {
    let found = bucket_points(pts, name, bucket, time);
    assert!(found.len() <= 1, "{name} {bucket}: one point per window, got {found:?}");
    found.first().map(|p| p.value.f())
}

/// The value at rank ⌊q·(n−1)⌋ of the sorted values (the definition the sketch approximates within α).
fn brute_quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

fn within_alpha(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= ALPHA * want.abs() * (1.0 + 1e-9) + 1e-12, "{what}: got {got}, want {want} (±α)");
}

/// Independent upper-exclusive bucketing of the default bounds.
fn bucket_of(tokens: i64) -> usize {
    match tokens {
        t if t < 1024 => 0,
        t if t < 4096 => 1,
        t if t < 8192 => 2,
        _ => 3,
    }
}

/// A deterministic mix of prompt lengths (the bounds and their neighbours included), TTFTs
/// growing with the prompt, a few failures, and requests without a prompt length; all in [0, 60 s).
fn mixed_requests(seed: u64, offset_s: f64) -> Vec<Req> {
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let edges = [0, 1, 1023, 1024, 1025, 4095, 4096, 4097, 8191, 8192, 8193, 30000];
    (0..240)
        .map(|i| {
            let prompt = if i < edges.len() { edges[i] } else { (next() * 12000.0) as i64 };
            let ttft = 0.02 + prompt as f64 * 0.0002 * (0.5 + next());
            let e2e = ttft + 0.5 + 2.0 * next();
            Req {
                end: offset_s + 0.2 * i as f64 + 0.05,
                prompt: (i % 37 != 5).then_some(prompt),
                ttft,
                e2e,
                error: i % 29 == 3,
            }
        })
        .collect()
}

#[test]
fn each_bucket_equals_brute_force_over_its_requests() {
    let reqs = mixed_requests(17, 0.0);
    let pts = run(json!({"window": "1m"}), &[(reqs.clone(), 60.0)]);
    let end = at(60.0);
    let mut ttft: [Vec<f64>; 4] = Default::default();
    let mut e2e: [Vec<f64>; 4] = Default::default();
    for r in &reqs {
        let Some(p) = r.prompt else { continue };
        let b = bucket_of(p);
        e2e[b].push(r.e2e);
        if !r.error {
            ttft[b].push(r.ttft);
        }
    }
    for (b, label) in LABELS.iter().enumerate() {
        assert!(ttft[b].len() >= 5, "the script must fill {label}");
        let count = bucket_value(&pts, "llm.requests.finished.by_input", label, end);
        assert_eq!(count, Some(e2e[b].len() as f64), "{label}: requests");
        for (q, suffix) in [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")] {
            let got = bucket_value(&pts, &format!("llm.ttft.by_input.{suffix}"), label, end).unwrap();
            within_alpha(got, brute_quantile(&ttft[b], q), &format!("ttft {label} {suffix}"));
            let got = bucket_value(&pts, &format!("llm.e2e.by_input.{suffix}"), label, end).unwrap();
            within_alpha(got, brute_quantile(&e2e[b], q), &format!("e2e {label} {suffix}"));
        }
    }
    // Requests without a prompt length are in no bucket, but in the unsplit series.
    let no_prompt = reqs.iter().filter(|r| r.prompt.is_none()).count();
    assert!(no_prompt > 0);
    let total: f64 = LABELS.iter().map(|l| bucket_value(&pts, "llm.requests.finished.by_input", l, end).unwrap()).sum();
    let finished = pts.iter().find(|p| p.name == "llm.requests.finished").unwrap().value.f();
    assert_eq!((total, finished), ((reqs.len() - no_prompt) as f64, reqs.len() as f64));
    // The split points carry the group's attributes plus the bucket; window start and end as the rest.
    let p = bucket_points(&pts, "llm.ttft.by_input.p95", "4k_8k", end)[0];
    assert_eq!(p.attrs["gen_ai.request.model"], "llama");
    assert_eq!(p.attrs["source"], "spans");
    assert_eq!((p.start, p.time), (at(0.0), end));
    // Bounded: per window, buckets × (1 count + 6 percentiles) + 1 ratio.
    let split = pts.iter().filter(|p| SPLIT_NAMES.contains(&p.name.as_str())).count();
    assert_eq!(split, 4 * 7 + 1);
}

#[test]
fn a_prompt_at_a_bound_belongs_to_the_bucket_above() {
    // Upper-exclusive: 1023 → lt_1k, 1024 → 1k_4k, 4095 → 1k_4k, 4096 → 4k_8k, 8192 → ge_8k.
    let reqs = vec![
        req(1.0, 1023, 0.1, 1.0),
        req(2.0, 1024, 0.2, 2.0),
        req(3.0, 4095, 0.3, 3.0),
        req(4.0, 4096, 0.4, 4.0),
        req(5.0, 8192, 0.5, 5.0),
    ];
    let pts = run(json!({}), &[(reqs, 60.0)]);
    let end = at(60.0);
    let count = |l: &str| bucket_value(&pts, "llm.requests.finished.by_input", l, end);
    assert_eq!(
        [count("lt_1k"), count("1k_4k"), count("4k_8k"), count("ge_8k")],
        [Some(1.0), Some(2.0), Some(1.0), Some(1.0)]
    );
    let p50 = |l: &str| bucket_value(&pts, "llm.ttft.by_input.p50", l, end).unwrap();
    // One value: exact (rank 0 is the exact min); two: rank ⌊0.5·1⌋ = 0, the smaller.
    assert_eq!((p50("lt_1k"), p50("1k_4k"), p50("4k_8k"), p50("ge_8k")), (0.1, 0.2, 0.4, 0.5));
    assert_eq!(bucket_value(&pts, "llm.e2e.by_input.p50", "4k_8k", end), Some(4.0));
    // An empty bucket still counts 0 in a window that had prompts.
    let pts = run(json!({}), &[(vec![req(1.0, 10, 0.1, 1.0)], 60.0)]);
    assert_eq!(bucket_value(&pts, "llm.requests.finished.by_input", "ge_8k", end), Some(0.0));
    assert_eq!(bucket_value(&pts, "llm.ttft.by_input.p50", "ge_8k", end), None, "no percentile of nothing");
}

fn ttfts(end0: f64, prompt: i64, values: &[f64]) -> Vec<Req> {
    values.iter().enumerate().map(|(i, t)| req(end0 + i as f64 * 0.1, prompt, *t, t + 1.0)).collect()
}

fn ratio(pts: &[Pt], time: u64) -> Option<f64> {
    let found: Vec<&Pt> = pts.iter().filter(|p| p.name == "llm.ttft.long_short" && p.time == time).collect();
    assert!(found.len() <= 1, "one ratio per group and window: {found:?}");
    if let Some(p) = found.first() {
        assert!(!p.attrs.contains_key("llm.input_bucket"), "the ratio is one series per group");
    }
    found.first().map(|p| p.value.f())
}

#[test]
fn long_short_ratio_takes_the_longest_bucket_with_enough_requests() {
    let short: Vec<f64> = (0..10).map(|i| 0.1 + 0.01 * i as f64).collect();
    let mid: Vec<f64> = (0..10).map(|i| 0.5 + 0.02 * i as f64).collect();
    let long: Vec<f64> = (0..6).map(|i| 2.0 + 0.3 * i as f64).collect();
    let few: Vec<f64> = vec![9.0; 4];
    // Window 1: lt_1k 10, 1k_4k 10, 4k_8k 6, ge_8k 4 (< 5): 4k_8k over lt_1k.
    let mut w1 = ttfts(0.0, 500, &short);
    w1.extend(ttfts(10.0, 2000, &mid));
    w1.extend(ttfts(20.0, 5000, &long));
    w1.extend(ttfts(30.0, 9000, &few));
    // Window 2: 4k_8k holds 4: 1k_4k over lt_1k.
    let mut w2 = ttfts(60.0, 500, &short);
    w2.extend(ttfts(70.0, 2000, &mid));
    w2.extend(ttfts(80.0, 5000, &long[..4]));
    // Window 3: lt_1k holds 4: no ratio.
    let mut w3 = ttfts(120.0, 500, &short[..4]);
    w3.extend(ttfts(130.0, 5000, &long));
    let pts = run(json!({}), &[(w1, 60.0), (w2, 120.0), (w3, 180.0)]);
    let p95 = |v: &[f64]| brute_quantile(v, 0.95);
    let r1 = ratio(&pts, at(60.0)).expect("window 1 has a ratio");
    within_alpha(r1, p95(&long) / p95(&short), "4k_8k / lt_1k");
    assert!((r1 - p95(&few) / p95(&short)).abs() > 1.0, "ge_8k (4 requests) is not the numerator");
    let r2 = ratio(&pts, at(120.0)).expect("window 2 has a ratio");
    // Both sides within α: the quotient within about 2α.
    let want = p95(&mid) / p95(&short);
    assert!((r2 - want).abs() <= 2.1 * ALPHA * want, "1k_4k / lt_1k: {r2} vs {want}");
    // The ratio is the quotient of the emitted bucket p95s exactly.
    let b = |l: &str, t: f64| bucket_value(&pts, "llm.ttft.by_input.p95", l, at(t)).unwrap();
    assert_eq!(r1, b("4k_8k", 60.0) / b("lt_1k", 60.0));
    assert_eq!(r2, b("1k_4k", 120.0) / b("lt_1k", 120.0));
    assert_eq!(ratio(&pts, at(180.0)), None, "lt_1k has fewer than 5 TTFTs");
    // The minimum is configurable: at 4, ge_8k's 4 and lt_1k's 4 TTFTs are enough.
    let mut w = ttfts(0.0, 500, &short[..4]);
    w.extend(ttfts(10.0, 9000, &few));
    w.extend(ttfts(20.0, 5000, &long));
    let pts = run(json!({"input_ratio_min_requests": 4}), &[(w, 60.0)]);
    within_alpha(ratio(&pts, at(60.0)).unwrap(), 9.0 / p95(&short[..4]), "ge_8k / lt_1k");
    // Failed requests have no TTFT: they do not count towards the minimum.
    let mut w = ttfts(0.0, 500, &short);
    w.extend(ttfts(10.0, 5000, &long).into_iter().enumerate().map(|(i, r)| Req { error: i < 2, ..r }));
    w.extend(ttfts(20.0, 2000, &mid));
    let pts = run(json!({}), &[(w, 60.0)]);
    assert_eq!(ratio(&pts, at(60.0)), Some(r2), "4 TTFTs in 4k_8k: 1k_4k over lt_1k, as in window 2");
}

#[test]
fn the_unsplit_series_are_the_same_with_the_split_on_or_off() {
    // Several windows, a zero window, failures, requests without a prompt length.
    let batches = vec![
        (mixed_requests(3, 0.0), 30.0),
        (vec![], 60.0),
        (mixed_requests(5, 120.0), 150.0),
        (vec![], 240.0),
        (mixed_requests(7, 300.0)[..40].to_vec(), 400.0),
    ];
    let on = run(json!({"window": "1m", "flush_interval": "15s"}), &batches);
    let off = run(json!({"window": "1m", "flush_interval": "15s", "input_buckets": []}), &batches);
    let other = run(json!({"window": "1m", "flush_interval": "15s", "input_buckets": [100, 200]}), &batches);
    assert!(off.iter().all(|p| !SPLIT_NAMES.contains(&p.name.as_str())), "an empty list disables the split");
    assert!(on.iter().filter(|p| SPLIT_NAMES.contains(&p.name.as_str())).count() > 2 * 29);
    let unsplit =
        |pts: &[Pt]| -> Vec<Pt> { pts.iter().filter(|p| !SPLIT_NAMES.contains(&p.name.as_str())).cloned().collect() };
    assert!(off.len() > 100);
    assert_eq!(unsplit(&on), off, "the same points, in the same order");
    assert_eq!(unsplit(&other), off);
    assert!(on.iter().all(|p| !p.attrs.contains_key("llm.input_bucket") || SPLIT_NAMES.contains(&p.name.as_str())));
    // Custom bounds name their buckets from the bounds.
    let labels: std::collections::BTreeSet<&str> =
        other.iter().filter_map(|p| p.attrs.get("llm.input_bucket").map(String::as_str)).collect();
    assert_eq!(labels, ["lt_100", "100_200", "ge_200"].into());
}

#[test]
fn input_buckets_config_errors_name_the_key() {
    let f = LlmSignalsFactory;
    let key = |k: &str| PathSeg::Key(k.into());
    assert!(f.validate(&json!({"input_buckets": []})).is_ok(), "empty: no split");
    assert!(f.validate(&json!({"input_buckets": [1]})).is_ok());
    assert!(f.validate(&json!({"input_buckets": [512, 1024, 32768]})).is_ok());
    for (cfg, path) in [
        (json!({"input_buckets": [0, 1024]}), vec![key("input_buckets"), PathSeg::Index(0)]),
        (json!({"input_buckets": [1024, 1024]}), vec![key("input_buckets"), PathSeg::Index(1)]),
        (json!({"input_buckets": [1024, 8192, 4096]}), vec![key("input_buckets"), PathSeg::Index(2)]),
        (json!({"input_ratio_min_requests": 0}), vec![key("input_ratio_min_requests")]),
    ] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path, path, "{cfg}: {}", e.message);
    }
    for cfg in [json!({"input_buckets": [-1]}), json!({"input_buckets": [1.5]}), json!({"input_buckets": "1k"})] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path.first(), Some(&key("input_buckets")), "{cfg}: {}", e.message);
    }
    let e = f.validate(&json!({"input_buckets": [4096, 1024]})).unwrap_err();
    assert!(e.message.contains("increasing"), "{}", e.message);
}

#[test]
fn checkpoints_keep_the_buckets_and_refuse_other_bounds() {
    let create = |cfg: serde_json::Value| Harness::create(&LlmSignalsFactory, "llm_signals/test", &cfg, Signal::Traces);
    let reqs = mixed_requests(11, 0.0);
    let mut whole = create(json!({}));
    assert!(whole.process_spans(&spans(&reqs[..120])).is_empty());
    let mut cut = create(json!({}));
    assert!(cut.process_spans(&spans(&reqs[..120])).is_empty());
    let mut restored = cut.restore_into(create(json!({})));
    for h in [&mut whole, &mut restored] {
        assert!(h.process_spans(&spans(&reqs[120..])).is_empty());
    }
    let want: Vec<Pt> = whole.advance_one(at(60.0)).iter().flat_map(flatten).collect();
    let got: Vec<Pt> = restored.advance_one(at(60.0)).iter().flat_map(flatten).collect();
    assert!(want.iter().any(|p| p.name == "llm.ttft.by_input.p95"));
    assert_eq!(got, want, "a restored window splits as one that never stopped");
    let bytes = cut.proc.snapshot().unwrap();
    let mut other = create(json!({"input_buckets": [2048]}));
    let e = other.proc.restore(&bytes).unwrap_err().to_string();
    assert!(e.contains("input_buckets"), "{e}");
}
