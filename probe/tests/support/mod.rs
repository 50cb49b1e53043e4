//! Test servers: the OpenAI-compatible stub (the OTLP capture server is `inferwatch_testkit::capture`).

pub mod stub;
