//! Engine invariants under realistic and adversarial load: timings add up, token counts
//! agree, KV blocks are conserved, every request finishes exactly once.

use std::collections::HashMap;

use inferwatch_sim::engine::{
    Engine, EngineConfig, EngineEvent, FinishReason, NANOS_PER_SEC, PromptPrefix, RequestRecord, RequestSpec,
};
use inferwatch_sim::scenario::load::LoadModel;
use inferwatch_sim::scenario::spec::{LengthDist, LoadSpec, PrefixSpec};

fn load(qps: f64, prompt_median: f64) -> LoadSpec {
    LoadSpec {
        qps,
        mirror: false,
        daily: None,
        weekly: None,
        noise: None,
        bursts: None,
        prompt: LengthDist { median: prompt_median, sigma: 0.9, min: 1, max: 6000 },
        output: LengthDist { median: 120.0, sigma: 0.7, min: 1, max: 600 },
        prefix: Some(PrefixSpec { pool: 8, tokens: 512, share: 0.7, zipf: 1.0 }),
        trace: None,
    }
}

/// Runs `seconds` of Poisson load; checks invariants after every arrival; returns events.
fn run(cfg: EngineConfig, spec: &LoadSpec, seconds: u64) -> (Engine, Vec<EngineEvent>, usize) {
    let mut engine = Engine::new(cfg).expect("config");
    let model = LoadModel::new(spec, 7, 0, seconds * NANOS_PER_SEC, engine.config().max_model_len);
    let mut events = Vec::new();
    let mut submitted = 0;
    let window = 60 * NANOS_PER_SEC;
    for w in 0..seconds.div_ceil(60) {
        for r in model.window_requests(0, w, w * window, ((w + 1) * window).min(seconds * NANOS_PER_SEC), 1.0) {
            engine.advance_to(r.arrival, &mut events);
            engine.check_invariants().expect("invariants");
            engine.submit(r).expect("accepted");
            submitted += 1;
        }
    }
    engine.run_until_idle(&mut events);
    engine.check_invariants().expect("invariants at the end");
    (engine, events, submitted)
}

fn check_records(engine: &Engine, events: &[EngineEvent], submitted: usize) -> Vec<RequestRecord> {
    let mut records = Vec::new();
    let mut tokens: HashMap<u64, u32> = HashMap::new();
    let mut last_t = 0;
    for e in events {
        assert!(e.time() >= last_t, "events out of order: {e:?}");
        last_t = e.time();
        match e {
            EngineEvent::Token { id, index, .. } => {
                let n = tokens.entry(*id).or_default();
                assert_eq!(*index, *n, "token indices are consecutive");
                *n += 1;
            }
            EngineEvent::Finished { record } => records.push(record.clone()),
            _ => {}
        }
    }
    assert_eq!(records.len(), submitted, "every request finishes exactly once");
    let mut generated = 0u64;
    let mut prompt = 0u64;
    for r in &records {
        let first = r.first_token.expect("first token");
        let last = r.last_token.expect("last token");
        let sched = r.scheduled.expect("scheduled");
        assert!(r.arrival <= sched && sched <= first && first <= last && last <= r.finished, "{r:?}");
        assert!(r.ttft_s() <= r.e2e_s());
        // queue + prefill + decode = e2e (exactly, in ns)
        assert_eq!((sched - r.arrival) + (first - sched) + (last - first), r.finished - r.arrival);
        assert!((r.queue_s() + r.prefill_s() + r.decode_s() - r.e2e_s()).abs() < 1e-6);
        assert!((r.inference_s() - (r.prefill_s() + r.decode_s())).abs() < 1e-6);
        assert!(r.completion_tokens >= 1 && r.completion_tokens <= r.max_tokens);
        assert!(matches!(r.finish_reason, FinishReason::Stop | FinishReason::Length));
        if r.finish_reason == FinishReason::Length {
            assert_eq!(r.completion_tokens, r.max_tokens);
        }
        assert!(r.cached_tokens < r.prompt_tokens);
        if engine.config().token_events {
            assert_eq!(tokens.get(&r.id).copied(), Some(r.completion_tokens), "token events = completion tokens");
        }
        generated += u64::from(r.completion_tokens);
        prompt += u64::from(r.prompt_tokens);
    }
    let s = engine.stats();
    assert_eq!(s.generation_tokens, generated);
    assert_eq!(s.prompt_tokens, prompt);
    assert_eq!(s.finished.iter().sum::<u64>(), submitted as u64);
    assert!(s.prefix_hits <= s.prefix_queries);
    let kv = engine.kv_snapshot();
    assert_eq!(kv.used_blocks, 0, "all blocks returned");
    assert_eq!(kv.free_blocks + kv.pinned_blocks, kv.total_blocks);
    assert_eq!(engine.num_running() + engine.num_waiting(), 0);
    records
}

#[test]
fn invariants_under_normal_load() {
    let cfg = EngineConfig::default();
    let (engine, events, n) = run(cfg, &load(1.5, 300.0), 300);
    let records = check_records(&engine, &events, n);
    assert!(n > 300);
    assert!(engine.stats().prefix_hits > 0, "repeated prefixes hit the cache");
    assert!(records.iter().any(|r| r.cached_tokens > 0));
}

#[test]
fn invariants_with_preemption_and_recompute() {
    // a tiny KV pool forces preemptions
    let cfg = EngineConfig { num_gpu_blocks_override: Some(700), max_model_len: 8192, ..EngineConfig::default() };
    let (engine, events, n) = run(cfg, &load(2.0, 800.0), 240);
    let records = check_records(&engine, &events, n);
    assert!(engine.stats().preemptions > 0, "the small pool preempts");
    assert!(records.iter().any(|r| r.preemptions > 0));
    assert!(events.iter().any(|e| matches!(e, EngineEvent::Scheduled { resumed: true, .. })));
}

#[test]
fn rejects_bad_requests_and_aborts() {
    let mut engine = Engine::new(EngineConfig::default()).expect("config");
    assert!(engine.submit(RequestSpec::new(1, 0, 0, 10)).is_err());
    assert!(engine.submit(RequestSpec::new(2, 0, 8000, 500)).is_err());
    engine.submit(RequestSpec::new(3, 0, 100, 50)).expect("ok");
    assert!(engine.submit(RequestSpec::new(3, 0, 100, 50)).is_err(), "duplicate id");
    let mut spec = RequestSpec::new(4, 0, 2000, 400);
    spec.prefix = Some(PromptPrefix { hash: 9, tokens: 1024 });
    engine.submit(spec).expect("ok");
    let mut events = Vec::new();
    engine.advance_to(NANOS_PER_SEC, &mut events);
    let rec = engine.abort(4).expect("aborted");
    assert_eq!(rec.finish_reason, FinishReason::Abort);
    assert!(engine.abort(4).is_none());
    engine.run_until_idle(&mut events);
    engine.check_invariants().expect("invariants");
    assert_eq!(engine.stats().finished[FinishReason::Abort.index()], 1);
    assert_eq!(engine.stats().rejected, 3);
    assert_eq!(engine.kv_snapshot().used_blocks, 0);
}

#[test]
fn same_inputs_same_events() {
    let a = run(EngineConfig::default(), &load(1.0, 300.0), 120).1;
    let b = run(EngineConfig::default(), &load(1.0, 300.0), 120).1;
    assert_eq!(a, b);
}

#[test]
fn stop_after_gives_stop_reason_and_token_text_is_deterministic() {
    use inferwatch_sim::engine::tokens::{prompt_key, token};
    let mut engine = Engine::new(EngineConfig::default()).expect("config");
    let mut spec = RequestSpec::new(1, 0, 64, 100);
    spec.stop_after = Some(10);
    engine.submit(spec).expect("ok");
    let mut events = Vec::new();
    engine.run_until_idle(&mut events);
    let rec = events.iter().find_map(|e| match e {
        EngineEvent::Finished { record } => Some(record.clone()),
        _ => None,
    });
    let rec = rec.expect("finished");
    assert_eq!(rec.finish_reason, FinishReason::Stop);
    assert_eq!(rec.completion_tokens, 10);
    let text: String = (0..10).map(|i| token(1, prompt_key("hello"), i, 128_256).text).collect();
    let again: String = (0..10).map(|i| token(1, prompt_key("hello"), i, 128_256).text).collect();
    assert_eq!(text, again);
    assert!(!text.is_empty());
}
