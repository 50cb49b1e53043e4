//! Metrics ⇄ Arrow: one row per data point (schema in [`super::schema::metrics_schema`]).
//!
//! - [`write`]: OTLP → Arrow ([`to_batch`]) and the row builder derived data is written with
//!   ([`MetricsBatchBuilder`]). Rows follow the request order (resource → scope → metric →
//!   point); resource, scope and metric columns are built once per resource / scope / metric
//!   and expanded to rows with `take`; point columns are appended row by row.
//! - [`read`]: Arrow → OTLP ([`from_batch`]), regrouping rows into resources, scopes and metrics.
//! - [`rows`]: one row's resource, scope or attributes ([`row_resource`], [`row_scope`],
//!   [`row_attributes`]).

pub mod read;
pub mod rows;
pub mod write;

pub use read::from_batch;
pub use rows::{row_attributes, row_resource, row_scope};
pub use write::{MetricsBatchBuilder, to_batch};

#[cfg(test)]
mod tests;
