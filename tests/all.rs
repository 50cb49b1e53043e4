//! Every integration test of this crate in one test binary (one link instead of one per file).
mod bench_vs_sim;
mod nvml_agent;
mod otel_rust_sdk;
mod replay_cli;
