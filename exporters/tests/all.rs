//! Every integration test of this crate in one test binary (one link instead of one per file).
mod alertmanager;
mod auth;
mod common;
mod otlp_grpc;
mod otlp_http;
mod prometheus;
mod recording;
