//! Every integration test of this crate in one test binary (one link instead of one per file).
mod common;
mod fixtures;
mod processor;
