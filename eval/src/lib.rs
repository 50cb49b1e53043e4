//! `inferwatch eval`: runs the scenario library, the Numenta Anomaly Benchmark and labelled series
//! (a user's, or the held-out families it generates) through detector pipelines on simulated time
//! and scores them.

pub mod error;
pub mod harness;
pub mod nab;

pub use error::EvalError;
pub use harness::{Captured, Harness, Point, Record};
pub mod chart;
pub mod report;
pub mod scenario;
pub mod series;
