//! inferwatch core: telemetry data, component traits, configuration, the pipeline graph and self-telemetry.

pub mod arrow;
pub mod auth;
pub mod civil;
pub mod component;
pub mod config;
pub mod consumer;
pub mod exporterhelper;
pub mod extension;
pub mod graph;
pub mod host;
pub mod kube;
pub mod pdata;
pub mod queue;
pub mod registry;
pub mod rng;
pub mod server;
pub mod settings;
pub mod state;
pub mod telemetry;
pub mod tls;
pub mod vocab;

pub use consumer::{ConsumeError, Consumer, RefuseReason};
pub use pdata::{Payload, Signal};
pub use vocab::{ComponentId, ComponentKind};
