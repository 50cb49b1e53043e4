//! The `alertmanager` exporter (logs): sends the `llm.degradation.alert` log records of the
//! `alerts` connector to Prometheus Alertmanager, API v2 (`POST /api/v2/alerts`).
//!
//! - Each alert record becomes one Alertmanager alert: labels `alertname` (the record's, e.g.
//!   `LLMSloBurnRate`; `LLMDegradation` when absent), `severity`, `detector`, `metric`, `slo`,
//!   `model` / `version` / `instance` (from `gen_ai.request.model`, `service.version`,
//!   `service.instance.id`) and any other group attribute (name sanitised); annotations
//!   `summary` (`alert.summary`, else the body), `description`, `alert_id`, `value`,
//!   `baseline`, `threshold`, `eta`, `eta_low`, `eta_high`, the links (`alert.X_url` → `X_url`),
//!   Kubernetes context (`k8s.pod.name` → `pod`, ...) and the `evidence_*` values; `startsAt`
//!   from `alert.starts_at`; `endsAt` the resolution time for resolved alerts, `now + 3 ×
//!   repeat` for firing ones; `generatorURL`.
//! - Firing alerts are re-sent every `repeat` (wall clock) so Alertmanager does not time them
//!   out; an escalation (warning → critical changes the `severity` label, hence the
//!   Alertmanager alert) resolves the warning alert.
//! - Other log records are ignored and counted in
//!   `otelcol_processor_dropped_log_records{processor="<exporter id>"}`.
//! - Delivery through the shared sending queue (one consumer, so a resolution never overtakes
//!   its firing) with retries: 429 and 5xx and network errors are retried, other 4xx dropped.
//!
//! One anatomy with the other network exporters: [`config`], [`factory`], [`encode`] (alert
//! records → Alertmanager API v2 alerts), [`send`] (one POST through the shared [`crate::http`]
//! module) and [`node`] (the firing set and the re-sending of firing alerts).

pub mod config;
pub mod encode;
pub mod factory;
pub mod node;
pub mod send;
#[cfg(test)]
mod tests;

pub use config::AlertmanagerConfig;
pub use encode::{Render, is_alert, label_name, rfc3339, to_alert, to_alerts};
pub use factory::AlertmanagerExporterFactory;
pub use node::AlertmanagerExporter;
pub use send::{AlertmanagerSender, classify};

/// Event name of the alert records this exporter reads.
pub const EVENT_NAME: &str = "llm.degradation.alert";
/// The `alertname` label of a record without an `alertname` attribute.
pub const ALERT_NAME: &str = "LLMDegradation";
/// Firing alerts remembered for re-sending at most.
pub const MAX_ACTIVE: usize = 10_000;
