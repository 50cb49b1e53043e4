//! The `otlp` exporter: OTLP over gRPC with tonic (otelcol's `otlp` exporter).
//!
//! One anatomy with the other network exporters: [`config`] (settings and their checks),
//! [`factory`], [`encode`] (a payload → its gRPC frame, once per payload) and [`send`] (one
//! export call of a built frame, and the status mapping).

pub mod config;
pub mod encode;
pub mod factory;
pub mod send;
#[cfg(test)]
mod tests;

pub use config::{KeepaliveSettings, OtlpConfig};
pub use encode::GrpcRequest;
pub use factory::OtlpExporterFactory;
pub use send::{GrpcSender, classify};
