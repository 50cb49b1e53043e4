//! Every integration test of this crate in one test binary (one link instead of one per file).
mod alertmanager;
mod auth;
mod common;
mod lb_k8s_resolver;
mod otlp_grpc;
mod otlp_http;
mod prometheus;
mod recording;
