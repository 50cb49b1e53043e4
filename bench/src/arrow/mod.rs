//! Helpers of `arrow-bench`.

pub mod data;
