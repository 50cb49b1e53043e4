//! `inferwatch eval`: runs the scenario library and the Numenta Anomaly Benchmark through
//! detector pipelines on simulated time and scores them.

pub mod error;
pub mod harness;
pub mod nab;

pub use error::EvalError;
pub use harness::{Captured, Harness, Point, Record};
pub mod chart;
pub mod report;
pub mod scenario;
