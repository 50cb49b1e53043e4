//! Every integration test of this crate in one test binary (one link instead of one per file).
mod fuzz_http;
mod fuzz_prometheus;
mod nvml;
mod nvml_pods;
mod otlp;
mod otlp_security;
mod prometheus;
mod prometheus_relabel;
mod prometheus_sd;
mod prometheus_security;
mod replay;
