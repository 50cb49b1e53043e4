//! The `otlphttp` exporter: OTLP over HTTP (protobuf or JSON) with reqwest (otelcol's `otlphttp`).
//!
//! One anatomy with the other network exporters: [`config`] (settings and their checks),
//! [`factory`], [`encode`] (a payload → its body, encoded and compressed once per payload) and
//! [`send`] (one POST of a built body through the shared [`crate::http`] module, and what the
//! answer means).

pub mod config;
pub mod encode;
pub mod factory;
pub mod send;
#[cfg(test)]
mod tests;

pub use config::{Encoding, OtlpHttpConfig};
pub use factory::OtlpHttpExporterFactory;
pub use send::{HttpSender, classify};

/// `Retry-After` parsing (moved to the shared HTTP module; re-exported where it was).
pub use crate::http::parse_retry_after;
