//! The Arrow data plane: OTLP ⇄ Arrow conversion, the Arrow processor contract, event time.
//!
//! Data stays OTLP on a pass-through path; it becomes a [`RecordBatch`] at most once per batch
//! per pipeline, in the [`stage::ArrowStage`] that runs the pipeline's Arrow processors (or in
//! an exporter that writes Arrow). Every conversion is counted in
//! `inferwatch_arrow_conversions_total`, so a test can prove a pass-through pipeline makes none.

pub mod anyvalue;
pub mod metrics;
pub mod processor;
pub mod schema;
pub mod series;
pub mod spans;
pub mod stage;

pub use arrow_array::RecordBatch;
pub use processor::{ArrowProcessor, ArrowProcessorFactory, Needs};

use crate::pdata::{Payload, Signal};

/// Why a conversion between OTLP and Arrow failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    /// An Arrow error (building or reading arrays).
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A protobuf payload could not be decoded.
    #[error("protobuf: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The batch does not have the expected schema (missing column, wrong type, unknown kind).
    #[error("schema: {0}")]
    Schema(String),
    /// The signal has no Arrow schema (logs).
    #[error("signal {0} has no Arrow schema")]
    Unsupported(Signal),
}

/// Converts a traces or metrics payload to a RecordBatch of the matching schema (decoding
/// `Encoded` payloads first). Logs have no schema yet and give [`ConvError::Unsupported`].
pub fn payload_to_batch(p: &Payload) -> Result<RecordBatch, ConvError> {
    let decoded = p.decoded()?;
    match decoded.as_ref() {
        Payload::Traces(r) => spans::to_batch(r),
        Payload::Metrics(r) => metrics::to_batch(r),
        Payload::Logs(_) => Err(ConvError::Unsupported(Signal::Logs)),
        Payload::Encoded(e) => Err(ConvError::Schema(format!("undecodable {} payload", e.signal()))),
    }
}

/// Converts a RecordBatch of the metrics or spans schema back to an OTLP payload.
pub fn batch_to_payload(batch: &RecordBatch) -> Result<Payload, ConvError> {
    match schema::signal_of(batch.schema_ref()) {
        Some(Signal::Metrics) => Ok(Payload::Metrics(metrics::from_batch(batch)?)),
        Some(Signal::Traces) => Ok(Payload::Traces(spans::from_batch(batch)?)),
        _ => Err(ConvError::Schema(format!(
            "batch metadata has no {}=metrics|spans; not an inferwatch batch",
            schema::META_KIND
        ))),
    }
}

/// Whether two batches hold the same bytes: equal schemas and, column by column, the same
/// type, length, offset, null bitmap, buffers and children (stricter than `==`, which compares
/// values). For tests that two ways of building a batch agree exactly.
pub fn same_bytes(a: &RecordBatch, b: &RecordBatch) -> bool {
    fn same(a: &arrow_data::ArrayData, b: &arrow_data::ArrayData) -> bool {
        let nulls =
            |d: &arrow_data::ArrayData| d.nulls().map(|n| (n.offset(), n.len(), n.buffer().as_slice().to_vec()));
        a.data_type() == b.data_type()
            && a.len() == b.len()
            && a.offset() == b.offset()
            && nulls(a) == nulls(b)
            && a.buffers().len() == b.buffers().len()
            && a.buffers().iter().zip(b.buffers()).all(|(x, y)| x.as_slice() == y.as_slice())
            && a.child_data().len() == b.child_data().len()
            && a.child_data().iter().zip(b.child_data()).all(|(x, y)| same(x, y))
    }
    a.schema() == b.schema()
        && a.num_columns() == b.num_columns()
        && a.columns().iter().zip(b.columns()).all(|(x, y)| same(&x.to_data(), &y.to_data()))
}

/// Index of the event-time column (`time_unix_nano`) of a batch.
pub fn time_column(batch: &RecordBatch) -> Result<&arrow_array::TimestampNanosecondArray, ConvError> {
    batch
        .column_by_name(schema::TIME)
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::TimestampNanosecondArray>())
        .ok_or_else(|| ConvError::Schema(format!("no {} timestamp column", schema::TIME)))
}
