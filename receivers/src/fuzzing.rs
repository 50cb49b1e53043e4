//! Entry points for the fuzz harness (the `inferwatch-fuzz` crate): thin public wrappers around
//! decoders that are private to this crate. Not a stable API; hidden from the docs.

use crate::otlp::json;
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{batch_to_payload, schema};
use inferwatch_core::pdata::{Payload, Signal};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

/// Most batches read from one fuzzed Arrow or Parquet input.
const MAX_BATCHES: usize = 64;

/// Decodes an OTLP/JSON export request of `signal` as the OTLP/HTTP receiver does (metrics
/// are also checked for data the typed decoding dropped).
pub fn otlp_json(signal: Signal, body: &[u8]) -> Result<Payload, String> {
    let r = match signal {
        Signal::Traces => json::decode::<ExportTraceServiceRequest>(body, |_, _| Ok(())).map(Payload::Traces),
        Signal::Metrics => json::decode::<ExportMetricsServiceRequest>(body, json::check_metrics).map(Payload::Metrics),
        Signal::Logs => json::decode::<ExportLogsServiceRequest>(body, |_, _| Ok(())).map(Payload::Logs),
    };
    r.map_err(|e| e.0)
}

/// What the replay receiver makes of one Arrow or Parquet input: the payloads of the batches
/// it could convert and the reasons of those it could not.
#[derive(Debug, Default)]
pub struct ReplayOutcome {
    /// Converted chunks, each with its earliest event time.
    pub chunks: Vec<(Payload, Option<u64>)>,
    /// Why batches (or the whole input) were refused.
    pub bad: Vec<String>,
    /// The most rows one batch claimed.
    pub max_rows: usize,
}

/// Most slices of one batch converted here (the replay reader has no such bound: see
/// `max_rows`).
const MAX_SLICES: usize = 4096;

impl ReplayOutcome {
    /// Converts one batch as the replay reader does, in slices of at most `batch_size` rows.
    fn batch(&mut self, b: &RecordBatch, batch_size: usize) {
        let n = b.num_rows();
        self.max_rows = self.max_rows.max(n);
        if n.div_ceil(batch_size.max(1)) > MAX_SLICES {
            self.bad.push(format!("a batch of {n} rows"));
            return;
        }
        let mut start = 0;
        while start < n {
            let len = (n - start).min(batch_size.max(1));
            let slice = b.slice(start, len);
            match crate::replay::caught(|| batch_to_payload(&slice).map(|p| (p, crate::replay::batch_min(&slice)))) {
                Ok(Ok(chunk)) => self.chunks.push(chunk),
                Ok(Err(e)) => self.bad.push(e.to_string()),
                Err(e) => self.bad.push(e),
            }
            start += len;
        }
    }
}

/// Reads an Arrow IPC input (file or stream, told apart by the `ARROW1` magic as the replay
/// receiver does) from memory with the replay reader's checks and converts its batches to
/// payloads.
pub fn replay_arrow_ipc(bytes: &[u8], batch_size: usize) -> Result<ReplayOutcome, String> {
    use crate::replay::{caught, check_rows, ipc_reader, next_batch};
    let size = bytes.len() as u64;
    let (schema_ref, mut batches) = ipc_reader(std::io::Cursor::new(bytes.to_vec()), size)?;
    if schema::signal_of(&schema_ref).is_none() {
        return Err("no kind metadata".into());
    }
    let mut out = ReplayOutcome::default();
    for _ in 0..MAX_BATCHES {
        match next_batch(&mut batches).map(|r| r.and_then(|b| check_rows(b.num_rows(), size).map(|()| b))) {
            None => break,
            Some(Ok(b)) => {
                let _ = caught(|| crate::replay::batch_first(&b));
                out.batch(&b, batch_size);
            }
            Some(Err(e)) => {
                out.bad.push(e);
                break;
            }
        }
    }
    Ok(out)
}

/// Reads a Parquet input from memory as the replay receiver does (its checks, putting the
/// file schema's metadata back on batches that lost it) and converts its batches to payloads.
pub fn replay_parquet(bytes: &[u8], batch_size: usize) -> Result<ReplayOutcome, String> {
    use crate::replay::{caught, parquet_builder};
    let builder = parquet_builder(bytes::Bytes::copy_from_slice(bytes))
        .map_err(|e| format!("not a readable parquet file: {e}"))?;
    if schema::signal_of(builder.schema()).is_none() {
        return Err("no kind metadata".into());
    }
    let file_schema = builder.schema().clone();
    let mut reader = caught(|| builder.with_batch_size(batch_size.max(1)).build())?.map_err(|e| e.to_string())?;
    let mut out = ReplayOutcome::default();
    for _ in 0..MAX_BATCHES {
        let b = match caught(|| reader.next()) {
            Ok(None) => break,
            Ok(Some(b)) => b.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match b {
            Ok(b) => {
                let b = if b.schema_ref().metadata().is_empty() {
                    b.clone().with_schema(file_schema.clone()).unwrap_or(b)
                } else {
                    b
                };
                out.batch(&b, batch_size);
            }
            Err(e) => {
                out.bad.push(e);
                break;
            }
        }
    }
    Ok(out)
}
