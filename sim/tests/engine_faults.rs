//! Each fault moves its signal the way its documentation says (engine level, no output).

use inferwatch_sim::engine::{Engine, EngineConfig, EngineEvent, NANOS_PER_DAY, NANOS_PER_SEC, Nanos, RequestRecord};
use inferwatch_sim::faults::FaultSet;
use inferwatch_sim::scenario::load::LoadModel;
use inferwatch_sim::scenario::spec::{LengthDist, LoadSpec, PrefixSpec};

fn chat(qps: f64) -> LoadSpec {
    LoadSpec {
        qps,
        mirror: false,
        daily: None,
        weekly: None,
        noise: None,
        bursts: None,
        prompt: LengthDist { median: 250.0, sigma: 0.8, min: 8, max: 4000 },
        output: LengthDist { median: 150.0, sigma: 0.6, min: 1, max: 1024 },
        prefix: Some(PrefixSpec { pool: 16, tokens: 1024, share: 0.9, zipf: 1.0 }),
        trace: None,
    }
}

struct Run {
    engine: Engine,
    records: Vec<RequestRecord>,
    /// (sample time, KV fragmentation, KV usage) every 10 s
    kv: Vec<(Nanos, f64, f64)>,
}

/// Runs `spec` over `[from, from + secs)` with `faults` (JSON) on `cfg`.
fn run(cfg: EngineConfig, spec: &LoadSpec, faults: &str, from: Nanos, secs: u64) -> Run {
    let mut engine = Engine::new(cfg).expect("config");
    engine.set_faults(FaultSet::from_json(faults).expect("faults")).expect("valid");
    let end = from + secs * NANOS_PER_SEC;
    let model = LoadModel::new(spec, 11, 0, end, engine.config().max_model_len);
    let mut events = Vec::new();
    let mut kv = Vec::new();
    let mut none = Vec::new();
    engine.advance_to(from, &mut none);
    let step = 10 * NANOS_PER_SEC;
    let mut t = from;
    while t < end {
        for r in model.window_requests(0, t / step, t, t + step, 1.0) {
            engine.advance_to(r.arrival, &mut events);
            engine.submit(r).expect("accepted");
        }
        t += step;
        engine.advance_to(t, &mut events);
        let snap = engine.kv_snapshot();
        kv.push((t, snap.fragmentation, snap.usage));
    }
    engine.run_until_idle(&mut events);
    let records = events
        .into_iter()
        .filter_map(|e| match e {
            EngineEvent::Finished { record } => Some(record),
            _ => None,
        })
        .collect();
    Run { engine, records, kv }
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    assert!(!v.is_empty(), "no values");
    v.sort_by(f64::total_cmp);
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn pick(rs: &[RequestRecord], keep: impl Fn(&RequestRecord) -> bool, f: impl Fn(&RequestRecord) -> f64) -> Vec<f64> {
    rs.iter().filter(|r| keep(r)).map(f).collect()
}

const NONE: &str = r#"{"faults":[]}"#;
const S: Nanos = NANOS_PER_SEC;

#[test]
fn queue_blocking_pushes_queue_p99_over_800ms() {
    let base = run(EngineConfig::default(), &chat(1.2), NONE, 0, 600);
    let bad = run(
        EngineConfig::default(),
        &chat(1.2),
        r#"{"faults":[{"kind":"queue_blocking","strength":0.3,"period":"4s"}]}"#,
        0,
        600,
    );
    let p99 = |r: &Run| quantile(pick(&r.records, |_| true, |r| r.queue_s()), 0.99);
    println!("queue p99: healthy {:.3} s, blocked {:.3} s", p99(&base), p99(&bad));
    assert!(p99(&base) < 0.3);
    assert!(p99(&bad) > 0.8);
}

#[test]
fn context_collapse_hits_long_prompts() {
    let long = LoadSpec {
        prompt: LengthDist { median: 700.0, sigma: 1.1, min: 8, max: 7000 },
        output: LengthDist { median: 60.0, sigma: 0.5, min: 1, max: 256 },
        prefix: None,
        ..chat(0.2)
    };
    let fault = r#"{"faults":[{"kind":"context_collapse","strength":3.0,"threshold_tokens":4096}]}"#;
    let ratio = |r: &Run| {
        let l = quantile(pick(&r.records, |r| r.prompt_tokens > 4096, |r| r.ttft_s()), 0.95);
        let s = quantile(pick(&r.records, |r| r.prompt_tokens < 1024, |r| r.ttft_s()), 0.95);
        (l, s)
    };
    let (bl, bs) = ratio(&run(EngineConfig::default(), &long, NONE, 0, 3600));
    let (fl, fs) = ratio(&run(EngineConfig::default(), &long, fault, 0, 3600));
    println!("TTFT p95 >4k / <1k: healthy {bl:.2}/{bs:.2} s, collapsed {fl:.2}/{fs:.2} s");
    assert!(fl > 3.0 * bl, "long prompts much slower than before");
    assert!(fl > 3.0 * fs, "and far above the short ones");
}

#[test]
fn batch_saturation_lowers_throughput_and_utilisation() {
    let cfg = EngineConfig::for_gpu("mi300x").expect("profile");
    let spec = LoadSpec {
        prompt: LengthDist { median: 100.0, sigma: 0.5, min: 8, max: 2000 },
        output: LengthDist { median: 400.0, sigma: 0.4, min: 1, max: 1024 },
        prefix: Some(PrefixSpec { pool: 8, tokens: 512, share: 1.0, zipf: 1.0 }),
        ..chat(7.5)
    };
    let fault = r#"{"faults":[{"kind":"batch_saturation","strength":1.5,"knee":128}]}"#;
    let measure = |r: &Run| {
        let s = r.engine.stats();
        let util = s.util_ns / s.busy_ns as f64;
        let tps = s.generation_tokens as f64 / (s.busy_ns as f64 / 1e9);
        let tpot = quantile(pick(&r.records, |r| r.completion_tokens > 1, |r| r.tpot_s()), 0.95);
        (util, tps, tpot)
    };
    let (bu, bt, bp) = measure(&run(cfg.clone(), &spec, NONE, 0, 600));
    let (fu, ft, fp) = measure(&run(cfg, &spec, fault, 0, 600));
    println!("util {bu:.2} -> {fu:.2}, tokens/s busy {bt:.0} -> {ft:.0}, TPOT p95 {bp:.3} -> {fp:.3}");
    assert!(fu < 0.9 * bu, "GPU utilisation drops");
    assert!(ft < 0.9 * bt, "throughput falls");
    assert!(fp > 1.3 * bp);
}

#[test]
fn kv_pressure_preempts_fragments_and_misses_the_prefix_cache() {
    let fault = r#"{"faults":[{"kind":"kv_pressure","strength":0.5}]}"#;
    let base = run(EngineConfig::default(), &chat(1.6), NONE, 0, 600);
    let bad = run(EngineConfig::default(), &chat(1.6), fault, 0, 600);
    let hit = |r: &Run| r.engine.stats().prefix_hits as f64 / r.engine.stats().prefix_queries as f64;
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let kvf = |r: &Run| mean(r.kv.iter().map(|k| k.1).collect());
    let usage = |r: &Run| mean(r.kv.iter().map(|k| k.2).collect());
    println!(
        "preemptions {} -> {}, prefix hit {:.2} -> {:.2}, KVF {:.2} -> {:.2}, usage {:.2} -> {:.2}",
        base.engine.stats().preemptions,
        bad.engine.stats().preemptions,
        hit(&base),
        hit(&bad),
        kvf(&base),
        kvf(&bad),
        usage(&base),
        usage(&bad)
    );
    assert_eq!(base.engine.stats().preemptions, 0);
    assert!(bad.engine.stats().preemptions > 0);
    assert!(hit(&base) > 0.62 && hit(&bad) < 0.62);
    assert!(kvf(&bad) > kvf(&base) + 0.3);
    assert!(usage(&bad) > usage(&base) + 0.3);
}

#[test]
fn cold_start_slows_the_first_requests_three_to_four_times() {
    let fault = r#"{"faults":[{"kind":"cold_start","onset":300,"strength":3.5,"warmup":"30s"}]}"#;
    let r = run(EngineConfig::default(), &chat(0.5), fault, 0, 600);
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let during = |a: u64, b: u64| mean(pick(&r.records, |x| x.arrival >= a * S && x.arrival < b * S, |x| x.tpot_s()));
    let (before, first, later) = (during(200, 300), during(300, 310), during(450, 600));
    println!("TPOT before {before:.4}, first 10 s {first:.4}, later {later:.4}");
    assert!(first > 2.0 * before, "first requests much slower");
    assert!(later < 1.3 * before, "warm again");
}

#[test]
fn slow_drift_grows_latency_day_by_day() {
    let fault = r#"{"faults":[{"kind":"slow_drift","rate_per_day":0.1,"leak_per_day":0.02}]}"#;
    let tpot = |day: u64| {
        let r = run(EngineConfig::default(), &chat(0.6), fault, day * NANOS_PER_DAY, 300);
        let kvu = r.kv.last().map_or(0.0, |k| k.2);
        (quantile(pick(&r.records, |x| x.completion_tokens > 1, |x| x.tpot_s()), 0.5), kvu)
    };
    let ((d1, u1), (d11, u11)) = (tpot(1), tpot(11));
    println!("TPOT p50 day 1 {d1:.4}, day 11 {d11:.4}; idle KV usage {u1:.2} -> {u11:.2}");
    assert!(d11 / d1 > 1.6 && d11 / d1 < 2.4, "multiplier 1.1 -> 2.1");
    assert!(u11 > u1 + 0.15, "the leak holds blocks");
}

#[test]
fn version_regression_adds_ms_to_version_b_only() {
    let fault = r#"{"faults":[{"kind":"version_regression","version":"B","strength":5.0,"throughput_loss":0.1}]}"#;
    let a = run(EngineConfig { version: "A".into(), ..EngineConfig::default() }, &chat(0.3), fault, 0, 900);
    let b = run(EngineConfig { version: "B".into(), ..EngineConfig::default() }, &chat(0.3), fault, 0, 900);
    let p50 = |r: &Run, f: fn(&RequestRecord) -> f64| quantile(pick(&r.records, |x| x.completion_tokens > 1, f), 0.5);
    let dttft = (p50(&b, RequestRecord::ttft_s) - p50(&a, RequestRecord::ttft_s)) * 1e3;
    let tpot = p50(&b, RequestRecord::tpot_s) / p50(&a, RequestRecord::tpot_s);
    println!("TTFT p50 delta {dttft:.2} ms, TPOT ratio {tpot:.3}");
    assert!((4.0..9.0).contains(&dttft), "a few ms of TTFT");
    assert!((1.03..1.15).contains(&tpot), "about 10 % slower decode");
}
