//! inferwatch receivers: components that take telemetry in from outside — `otlp` (gRPC and
//! HTTP), `prometheus` (scrapes), `replay` (recorded files) and `nvml` (GPU metrics).

#[doc(hidden)]
pub mod fuzzing;
pub mod nvml;
pub mod otlp;
pub mod prometheus;
pub mod replay;

use std::sync::Arc;

/// Registers every receiver factory of this crate.
pub fn register(reg: &mut inferwatch_core::registry::Registry) {
    reg.add_receiver(Arc::new(otlp::OtlpReceiverFactory));
    reg.add_receiver(Arc::new(prometheus::PrometheusReceiverFactory));
    reg.add_receiver(Arc::new(replay::ReplayReceiverFactory));
    reg.add_receiver(Arc::new(nvml::NvmlReceiverFactory));
}
