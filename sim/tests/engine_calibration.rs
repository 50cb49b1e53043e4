//! Calibration: the built-in GPU profiles reproduce the study's Llama-3-8B FP16 table
//! (scenarios/README.md, Engine calibration) within 10 %, measured with the study's method.

use inferwatch_sim::engine::{Engine, EngineConfig, EngineEvent, RequestRecord, RequestSpec};

/// Prompt length of the calibration probes (documented in scenarios/README.md).
const PROBE_PROMPT_TOKENS: u32 = 2048;

fn run_one(gpu: &str, max_tokens: u32) -> RequestRecord {
    let cfg = EngineConfig::for_gpu(gpu).expect("built-in profile");
    let mut engine = Engine::new(cfg).expect("valid config");
    engine.submit(RequestSpec::new(1, 0, PROBE_PROMPT_TOKENS, max_tokens)).expect("accepted");
    let mut events = Vec::new();
    engine.run_until_idle(&mut events);
    events
        .into_iter()
        .find_map(|e| match e {
            EngineEvent::Finished { record } => Some(record),
            _ => None,
        })
        .expect("finished")
}

/// (TTFT in s of a max_tokens=1 request, TPS = completion_tokens / (e2e − ttft) with 128 tokens)
fn measure(gpu: &str) -> (f64, f64) {
    let ttft = run_one(gpu, 1).ttft_s();
    let r = run_one(gpu, 128);
    assert_eq!(r.completion_tokens, 128);
    (ttft, f64::from(r.completion_tokens) / (r.e2e_s() - r.ttft_s()))
}

#[test]
fn builtin_profiles_match_the_study_table() {
    let table = [("a10g", 421.3, 38.2), ("l4", 587.6, 21.5), ("mi300x", 362.8, 45.9)];
    for (gpu, ttft_ms, tps) in table {
        let (t, s) = measure(gpu);
        let t_ms = t * 1e3;
        println!("{gpu}: TTFT {t_ms:.1} ms (study {ttft_ms}), TPS {s:.2} (study {tps})");
        assert!((t_ms / ttft_ms - 1.0).abs() < 0.10, "{gpu} TTFT {t_ms:.1} ms vs {ttft_ms}");
        assert!((s / tps - 1.0).abs() < 0.10, "{gpu} TPS {s:.2} vs {tps}");
    }
}
