//! One row of a metrics or spans batch: its resource, scope and attributes.

use crate::arrow::ConvError;
use crate::arrow::anyvalue::{ResourceScopeReader, opt_attrs, read_attrs};
use crate::arrow::schema;
use arrow_array::RecordBatch;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

fn check_row(batch: &RecordBatch, row: usize) -> Result<(), ConvError> {
    if row < batch.num_rows() {
        Ok(())
    } else {
        Err(ConvError::Schema(format!("row {row} out of range (batch has {} rows)", batch.num_rows())))
    }
}

/// The resource of one row (of a metrics or spans batch): its attributes with the promoted
/// `service.*` columns appended.
pub fn row_resource(batch: &RecordBatch, row: usize) -> Result<Resource, ConvError> {
    check_row(batch, row)?;
    ResourceScopeReader::new(batch)?.resource(row)
}

/// The instrumentation scope of one row (of a metrics or spans batch).
pub fn row_scope(batch: &RecordBatch, row: usize) -> Result<InstrumentationScope, ConvError> {
    check_row(batch, row)?;
    ResourceScopeReader::new(batch)?.scope(row)
}

/// The point (or span) attributes of one row; empty when the batch has no attributes column.
pub fn row_attributes(batch: &RecordBatch, row: usize) -> Result<Vec<KeyValue>, ConvError> {
    check_row(batch, row)?;
    read_attrs(opt_attrs(batch, schema::ATTRIBUTES)?.as_ref(), row)
}
