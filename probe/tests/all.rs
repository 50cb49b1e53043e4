//! Every integration test of this crate in one test binary (one link instead of one per file).
mod bench;
mod fuzz_sse;
mod support;
