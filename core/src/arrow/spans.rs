//! Spans ⇄ Arrow: one row per span (schema in [`super::schema::spans_schema`]).

use super::ConvError;
use arrow_array::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

/// Converts a traces export request to a batch of the spans schema.
pub fn to_batch(_req: &ExportTraceServiceRequest) -> Result<RecordBatch, ConvError> {
    Err(ConvError::Schema("spans conversion not built yet".into()))
}

/// Converts a batch of the spans schema back to an export request.
pub fn from_batch(_batch: &RecordBatch) -> Result<ExportTraceServiceRequest, ConvError> {
    Err(ConvError::Schema("spans conversion not built yet".into()))
}
