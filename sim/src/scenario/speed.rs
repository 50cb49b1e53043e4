//! The simulator's speed: simulated days per wall-clock second for a steady service.

use std::time::Instant;

use serde::Serialize;

use crate::engine::{Engine, EngineConfig, EngineEvent, NANOS_PER_SEC};
use crate::scenario::load::LoadModel;
use crate::scenario::spec::{LengthDist, LoadSpec, PrefixSpec};

/// The result of [`speed_report`].
#[derive(Clone, Debug, Serialize)]
pub struct SpeedReport {
    /// GPU profile used.
    pub gpu: String,
    /// Request rate, requests/s.
    pub qps: f64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Requests completed.
    pub requests: u64,
    /// Engine steps.
    pub steps: u64,
    /// Simulated days per wall second.
    pub sim_days_per_wall_s: f64,
    /// Requests simulated per wall second.
    pub requests_per_wall_s: f64,
}

/// Runs the engine alone (no output) for `simulated_s` seconds at `qps` Poisson arrivals
/// (prompt median 300 tokens with a 256-token shared prefix, output median 60) on a
/// MI300X profile with `max_num_seqs` 512, and measures its speed.
pub fn speed_report(qps: f64, simulated_s: f64) -> SpeedReport {
    let spec = LoadSpec {
        qps,
        mirror: false,
        daily: None,
        weekly: None,
        noise: None,
        bursts: None,
        prompt: LengthDist { median: 300.0, sigma: 0.6, min: 8, max: 4000 },
        output: LengthDist { median: 60.0, sigma: 0.5, min: 1, max: 512 },
        prefix: Some(PrefixSpec { pool: 16, tokens: 256, share: 0.8, zipf: 1.0 }),
        trace: None,
    };
    let mut cfg = EngineConfig::for_gpu("mi300x").unwrap_or_default();
    cfg.max_num_seqs = 512;
    cfg.token_events = false;
    cfg.step_events = true;
    let end = (simulated_s * 1e9) as u64;
    let load = LoadModel::new(&spec, 1, 0, end, cfg.max_model_len);
    let started = Instant::now();
    let mut requests = 0u64;
    let mut steps = 0u64;
    let result = Engine::new(cfg).map(|mut engine| {
        let mut events: Vec<EngineEvent> = Vec::new();
        let window = 60 * NANOS_PER_SEC;
        let mut w = 0;
        while w * window < end {
            for r in load.window_requests(0, w, w * window, ((w + 1) * window).min(end), 1.0) {
                engine.advance_to(r.arrival, &mut events);
                let _ = engine.submit(r);
                requests += events.iter().filter(|e| matches!(e, EngineEvent::Finished { .. })).count() as u64;
                events.clear();
            }
            w += 1;
        }
        engine.run_until_idle(&mut events);
        requests += events.iter().filter(|e| matches!(e, EngineEvent::Finished { .. })).count() as u64;
        steps = engine.stats().steps;
    });
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let _ = result;
    SpeedReport {
        gpu: "mi300x".into(),
        qps,
        simulated_s,
        wall_s: wall,
        requests,
        steps,
        sim_days_per_wall_s: simulated_s / 86_400.0 / wall,
        requests_per_wall_s: requests as f64 / wall,
    }
}
