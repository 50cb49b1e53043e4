//! inferwatch's test kit (dev-only; never a normal dependency): OTLP builders and readers
//! ([`otlp`]), attribute lookups ([`attrs`]), an OTLP capture server ([`capture`]) and the
//! [`ArrowProcessor`](inferwatch_core::arrow::ArrowProcessor) harness with a collecting consumer
//! ([`harness`]), and a deterministic RNG for synthetic data ([`rng`]).
//!
//! Tests may `unwrap()`: every function here panics with a message on input a test did not mean.

pub mod attrs;
pub mod capture;
pub mod harness;
pub mod otlp;
pub mod rng;
