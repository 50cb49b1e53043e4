//! The `prometheusremotewrite` exporter: Prometheus remote write 1.0 (otelcol's
//! `prometheusremotewriteexporter`) to any receiver (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, Thanos receive, VictoriaMetrics, ...).
//!
//! - Protobuf `WriteRequest` ([`proto`]), snappy block-compressed, with `Content-Encoding:
//!   snappy`, `Content-Type: application/x-protobuf`, `X-Prometheus-Remote-Write-Version: 0.1.0`.
//! - The same translation as the `prometheus` exporter (shared `translate`), the same
//!   preparation (DELTA sums and histograms accumulated into cumulative ones, exponential
//!   histograms converted to classic buckets; what cannot be sent is dropped and counted in
//!   `otelcol_processor_dropped_metric_points{processor="<exporter id>"}`).
//! - Ordered per series: payloads are prepared one at a time and queued in arrival order, and
//!   ONE sending consumer delivers them (`sending_queue.num_consumers` must be 1), retrying a
//!   request before the next is sent, so one series never has two requests in flight. Samples
//!   of a series within a request are sorted by time.
//! - HTTP 5xx and 429 are retried (honouring `Retry-After`); other 4xx are permanent: the
//!   request is dropped and counted in `otelcol_exporter_send_failed_metric_points`.
//!
//! One anatomy with the other network exporters: [`config`], [`factory`], [`encode`] (a
//! payload → its translated, snappy-compressed `WriteRequest`, once per payload: a retry does
//! not translate again), [`send`] (one POST through the shared [`crate::http`] module), and
//! [`node`] (the delta → cumulative preparation in arrival order). [`proto`] mirrors the
//! vendored `proto/prometheus/prompb/*.proto`.

pub mod config;
pub mod encode;
pub mod factory;
pub mod node;
pub mod proto;
pub mod send;
#[cfg(test)]
mod tests;

/// The former name of [`send`].
pub use send as sender;

pub use config::RemoteWriteConfig;
pub use encode::build_request;
pub use factory::RemoteWriteExporterFactory;
pub use node::RemoteWriteExporter;
pub use send::{REMOTE_WRITE_VERSION, RemoteWriteSender, classify};

use std::time::Duration;

/// Delta series whose running totals are kept at most.
pub const DELTA_MAX_SERIES: usize = 100_000;
/// A delta series not updated for this long is forgotten (its next point starts it afresh).
pub const DELTA_IDLE: Duration = Duration::from_secs(300);
