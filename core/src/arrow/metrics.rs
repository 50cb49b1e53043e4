//! Metrics ⇄ Arrow: one row per data point (schema in [`super::schema::metrics_schema`]).

use super::ConvError;
use arrow_array::RecordBatch;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;

/// Converts a metrics export request to a batch of the metrics schema.
pub fn to_batch(_req: &ExportMetricsServiceRequest) -> Result<RecordBatch, ConvError> {
    Err(ConvError::Schema("metrics conversion not built yet".into()))
}

/// Converts a batch of the metrics schema back to an export request.
pub fn from_batch(_batch: &RecordBatch) -> Result<ExportMetricsServiceRequest, ConvError> {
    Err(ConvError::Schema("metrics conversion not built yet".into()))
}
