//! TLS for the agent's clients (exporters, scrapes) and, later, its servers.

pub mod client;
pub mod server;

pub use client::*;
