//! The `loadbalancing` exporter: routes each item by a routing key to one backend of a
//! consistent-hash ring (otelcol-contrib's `loadbalancing` exporter).
//!
//! - [`config`]: `routing_key` / `routing_attributes`, `protocol.otlp` (the `otlp` exporter's
//!   settings without `endpoint`), `resolver` (exactly one of `static`, `dns`, `k8s`) and
//!   `backend_down_after` (inferwatch's addition).
//! - [`ring`]: the consistent-hash ring (virtual nodes, xxh3).
//! - [`split`]: a payload split by routing key into one payload per backend (on the wire for
//!   encoded payloads, every key).
//! - [`exporter`]: the node: one queued `otlp` exporter per backend, the resolver's updates,
//!   the hand-back of a removed or down backend's data through the new ring.
//! - [`resolver`]: where the backends come from.

pub mod config;
pub mod exporter;
pub mod factory;
pub mod resolver;
pub mod ring;
pub mod split;
#[cfg(test)]
mod tests;

pub use config::{LoadBalancingConfig, RoutingKey};
pub use exporter::LoadBalancer;
pub use factory::LoadBalancingExporterFactory;

use inferwatch_core::telemetry::{Counters, Gauges};

/// `otelcol_loadbalancer_num_backends{exporter}`: backends in the ring now.
pub const NUM_BACKENDS: Gauges<1> = Gauges::new(
    "otelcol_loadbalancer_num_backends",
    "Number of backends in the ring of a loadbalancing exporter",
    ["exporter"],
);

/// `otelcol_loadbalancer_ring_changes_total{exporter}`: times the ring was rebuilt.
pub const RING_CHANGES: Counters<1> = Counters::new(
    "otelcol_loadbalancer_ring_changes",
    "Number of times the ring of a loadbalancing exporter changed (backends added or removed)",
    ["exporter"],
);

/// `otelcol_loadbalancer_backend_items_total{exporter,backend,signal}`: items routed to a backend.
pub const BACKEND_ITEMS: Counters<3> = Counters::new(
    "otelcol_loadbalancer_backend_items",
    "Items a loadbalancing exporter routed to each backend (accepted into its queue)",
    ["exporter", "backend", "signal"],
);

/// `otelcol_loadbalancer_backend_up{exporter,backend}`: 1 while a backend takes data, 0 when
/// it is marked down (or was removed).
pub const BACKEND_UP: Gauges<2> = Gauges::new(
    "otelcol_loadbalancer_backend_up",
    "1 while a backend of a loadbalancing exporter is up, 0 when it is marked down or removed",
    ["exporter", "backend"],
);

/// `otelcol_loadbalancer_rerouted_items_total{exporter,signal}`: items of a removed or down
/// backend handed back and routed again.
pub const REROUTED_ITEMS: Counters<2> = Counters::new(
    "otelcol_loadbalancer_rerouted_items",
    "Items a loadbalancing exporter took back from a removed or down backend and routed again",
    ["exporter", "signal"],
);

/// `otelcol_loadbalancer_rerouted_dropped_items_total{exporter,signal}`: items of a removed or
/// down backend refused permanently by the backend they were re-routed to (dropped).
pub const REROUTED_DROPPED: Counters<2> = Counters::new(
    "otelcol_loadbalancer_rerouted_dropped_items",
    "Items a loadbalancing exporter re-routed from a removed or down backend that the new backend refused permanently (dropped)",
    ["exporter", "signal"],
);
