//! Every integration test of this crate in one test binary (one link instead of one per file).
mod arrow_roundtrip;
mod arrow_stage;
mod config_otelcol;
mod fuzz_config;
mod parse_once;
