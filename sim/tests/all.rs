//! Every integration test of this crate in one test binary (one link instead of one per file).
mod engine_calibration;
mod engine_faults;
mod engine_invariants;
mod scenario_fleet;
mod scenario_format;
mod scenario_library;
mod scenario_runs;
mod scenario_speed;
mod server_api;
mod server_config;
mod server_metrics;
mod server_otlp;
mod server_realtime;
#[path = "server_support.rs"]
mod support;
mod tgi_flavor;
