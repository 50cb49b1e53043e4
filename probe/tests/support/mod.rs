//! Test servers: the OpenAI-compatible stub and the OTLP capture server.

pub mod capture;
pub mod stub;
