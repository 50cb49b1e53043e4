//! Reading the input files into chunks, on a blocking thread.
//!
//! The reader sends [`Event`]s in file order through a small bounded channel; it stops when
//! the channel closes (the receiver stopped). Bad input never stops it: an unreadable file,
//! a corrupt batch or a bad JSON line is logged with its file and row or line and sent as
//! [`Event::Bad`], and reading goes on with the next batch, line or file.

use super::input::{Format, InputFile};
use super::time;
use crate::otlp::json;
use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
use inferwatch_core::arrow::{batch_to_payload, schema};
use inferwatch_core::pdata::{Payload, Signal};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Read buffer size.
const BUF: usize = 1 << 20;
/// Lines or batches looked at for a file's first event time.
const FIRST_TIME_PROBES: usize = 16;

/// What the reader sends to the feeder.
pub(crate) enum Event {
    /// Data to feed.
    Chunk(Chunk),
    /// Input that could not be read: counted as failed, never fed.
    Bad {
        /// Index of the file.
        file: usize,
        /// Offset after the bad part, when known (rows or lines).
        end: Option<u64>,
        /// Items lost (rows; 1 for a line or when unknown).
        items: u64,
    },
    /// Every chunk of a file was sent.
    FileDone {
        /// Index of the file.
        file: usize,
    },
}

/// One chunk: a batch of at most `batch_size` rows, or one JSON line.
pub(crate) struct Chunk {
    /// Index of the file.
    pub file: usize,
    /// Offset in the file after this chunk (rows or lines).
    pub end: u64,
    /// Bytes of the file read when this chunk was made.
    pub bytes_done: u64,
    /// The earliest event time in the chunk.
    pub min_time: Option<u64>,
    /// The data.
    pub payload: Payload,
    /// What the data was made from, to make it again when the pipeline refused it.
    pub source: Source,
}

/// The source form of a chunk.
pub(crate) enum Source {
    /// Rows of an Arrow input.
    Batch(RecordBatch),
    /// One OTLP/JSON line.
    Line(Vec<u8>),
}

impl Source {
    /// Makes the payload again.
    pub(crate) fn to_payload(&self) -> Result<Payload, String> {
        match self {
            Source::Batch(b) => batch_to_payload(b).map_err(|e| e.to_string()),
            Source::Line(l) => decode_line(l),
        }
    }
}

/// The top-level keys that tell the signal of an OTLP/JSON line.
#[derive(Deserialize)]
struct TopKeys {
    #[serde(rename = "resourceSpans", alias = "resource_spans")]
    spans: Option<IgnoredAny>,
    #[serde(rename = "resourceMetrics", alias = "resource_metrics")]
    metrics: Option<IgnoredAny>,
    #[serde(rename = "resourceLogs", alias = "resource_logs")]
    logs: Option<IgnoredAny>,
}

/// Decodes one line of the otelcol file exporter format.
pub(crate) fn decode_line(line: &[u8]) -> Result<Payload, String> {
    let top: TopKeys = serde_json::from_slice(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let signal = match (top.spans.is_some(), top.metrics.is_some(), top.logs.is_some()) {
        (true, false, false) => Signal::Traces,
        (false, true, false) => Signal::Metrics,
        (false, false, true) => Signal::Logs,
        (false, false, false) => return Err("no resourceSpans, resourceMetrics or resourceLogs key".into()),
        _ => return Err("more than one of resourceSpans, resourceMetrics, resourceLogs".into()),
    };
    let p = match signal {
        Signal::Traces => {
            Payload::Traces(json::decode::<ExportTraceServiceRequest>(line, |_, _| Ok(())).map_err(|e| e.0)?)
        }
        Signal::Metrics => {
            Payload::Metrics(json::decode::<ExportMetricsServiceRequest>(line, json::check_metrics).map_err(|e| e.0)?)
        }
        Signal::Logs => Payload::Logs(json::decode::<ExportLogsServiceRequest>(line, |_, _| Ok(())).map_err(|e| e.0)?),
    };
    Ok(p)
}

/// Strips the line end and surrounding whitespace.
fn trim(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

/// A reader that counts the bytes it read (and follows seeks).
struct Counting<R> {
    inner: R,
    pos: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let p = self.inner.seek(to)?;
        self.pos.store(p, Ordering::Relaxed);
        Ok(p)
    }
}

/// The batches of an Arrow IPC input, stream or file.
type Batches = Box<dyn Iterator<Item = Result<RecordBatch, arrow_schema::ArrowError>>>;

/// Opens an Arrow IPC input: its schema, its batches and a counter of bytes read.
fn open_ipc(path: &std::path::Path) -> Result<(arrow_schema::SchemaRef, Batches, Arc<AtomicU64>), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let mut magic = [0u8; 6];
    let is_file = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let pos = Arc::new(AtomicU64::new(0));
    let counting = Counting { inner: BufReader::with_capacity(BUF, file), pos: pos.clone() };
    if is_file {
        let r = FileReader::try_new(counting, None).map_err(|e| e.to_string())?;
        Ok((r.schema(), Box::new(r), pos))
    } else {
        let r = StreamReader::try_new(counting, None).map_err(|e| e.to_string())?;
        Ok((r.schema(), Box::new(r), pos))
    }
}

/// The event time of a file's first row or line, for ordering; `None` when it has none or
/// cannot be read.
pub(crate) fn first_time(f: &InputFile) -> Option<u64> {
    match f.format {
        Format::Parquet => {
            let file = File::open(&f.path).ok()?;
            let b = ParquetRecordBatchReaderBuilder::try_new(file).ok()?;
            let mask = ProjectionMask::columns(b.parquet_schema(), [schema::TIME]);
            let mut r = b.with_projection(mask).with_batch_size(1).with_limit(1).build().ok()?;
            r.next()?.ok().as_ref().and_then(time::batch_first)
        }
        Format::ArrowIpc => {
            let (_, batches, _) = open_ipc(&f.path).ok()?;
            batches
                .take(FIRST_TIME_PROBES)
                .filter_map(Result::ok)
                .find(|b| b.num_rows() > 0)
                .as_ref()
                .and_then(time::batch_first)
        }
        Format::JsonLines => {
            let mut r = BufReader::with_capacity(BUF, File::open(&f.path).ok()?);
            let mut buf = Vec::new();
            for _ in 0..FIRST_TIME_PROBES {
                buf.clear();
                if r.read_until(b'\n', &mut buf).ok()? == 0 {
                    return None;
                }
                let line = trim(&buf);
                if line.is_empty() {
                    continue;
                }
                if let Some(t) = decode_line(line).ok().as_ref().and_then(time::payload_min) {
                    return Some(t);
                }
            }
            None
        }
    }
}

/// Whether a `.json` file holds OTLP/JSON lines: its first non-empty line must be an export
/// request. Other JSON documents (a pretty-printed `ground_truth.json` beside a recording)
/// are not inputs.
pub(crate) fn is_otlp_lines(path: &std::path::Path) -> bool {
    let Ok(file) = File::open(path) else { return true };
    let mut r = BufReader::with_capacity(BUF, file);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
        let line = trim(&buf);
        if line.is_empty() {
            continue;
        }
        return serde_json::from_slice::<TopKeys>(line).is_ok_and(|t| {
            [t.spans.is_some(), t.metrics.is_some(), t.logs.is_some()].iter().filter(|x| **x).count() == 1
        });
    }
}

/// The channel closed: the receiver stopped.
struct Stopped;

/// Reads files into chunks and sends them.
pub(crate) struct Reader {
    /// The files, in reading order.
    pub files: Arc<Vec<InputFile>>,
    /// Rows per chunk of Arrow inputs.
    pub batch_size: usize,
    /// Where events go.
    pub tx: mpsc::Sender<Event>,
    /// Set when the receiver stops.
    pub cancel: CancellationToken,
}

impl Reader {
    /// Reads from file `file`, offset `offset` to the end of the last file.
    pub(crate) fn run(self, file: usize, offset: u64) {
        for i in file..self.files.len() {
            let from = if i == file { offset } else { 0 };
            let f = &self.files[i];
            let r = match f.format {
                Format::Parquet => self.parquet(i, f, from),
                Format::ArrowIpc => self.ipc(i, f, from),
                Format::JsonLines => self.jsonl(i, f, from),
            };
            if r.is_err() || self.send(Event::FileDone { file: i }).is_err() {
                return;
            }
        }
    }

    fn send(&self, ev: Event) -> Result<(), Stopped> {
        if self.cancel.is_cancelled() {
            return Err(Stopped);
        }
        self.tx.blocking_send(ev).map_err(|_| Stopped)
    }

    /// Logs and reports input that cannot be fed.
    fn bad(&self, file: usize, end: Option<u64>, items: u64, what: String) -> Result<(), Stopped> {
        let path = self.files[file].path.display();
        tracing::warn!(file = %path, items, "replay: cannot read {path}: {what}; skipping it");
        self.send(Event::Bad { file, end, items })
    }

    /// Sends rows `start..end` of file `file`, converted to a payload.
    fn batch(&self, file: usize, start: u64, bytes_done: u64, batch: RecordBatch) -> Result<(), Stopped> {
        let n = batch.num_rows() as u64;
        let end = start + n;
        match batch_to_payload(&batch) {
            Ok(payload) => {
                let min_time = time::batch_min(&batch);
                let chunk = Chunk { file, end, bytes_done, min_time, payload, source: Source::Batch(batch) };
                self.send(Event::Chunk(chunk))
            }
            Err(e) => self.bad(file, Some(end), n, format!("rows {start}..{end}: {e}")),
        }
    }

    fn parquet(&self, i: usize, f: &InputFile, offset: u64) -> Result<(), Stopped> {
        let file = match File::open(&f.path) {
            Ok(file) => file,
            Err(e) => return self.bad(i, None, 1, e.to_string()),
        };
        let builder = match ParquetRecordBatchReaderBuilder::try_new(file) {
            Ok(b) => b,
            Err(e) => return self.bad(i, None, 1, format!("not a readable parquet file: {e}")),
        };
        let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
        if schema::signal_of(builder.schema()).is_none() {
            let msg = format!("no {}=metrics|spans schema metadata; not an inferwatch file", schema::META_KIND);
            return self.bad(i, Some(total), total.saturating_sub(offset).max(1), msg);
        }
        // Batches come without the schema metadata that tells their signal: put it back.
        let file_schema = builder.schema().clone();
        let offset_rows = usize::try_from(offset).unwrap_or(usize::MAX);
        let reader = match builder.with_batch_size(self.batch_size).with_offset(offset_rows).build() {
            Ok(r) => r,
            Err(e) => return self.bad(i, None, total.saturating_sub(offset).max(1), e.to_string()),
        };
        let mut row = offset;
        for batch in reader {
            match batch {
                Ok(b) => {
                    let b = if b.schema_ref().metadata().is_empty() {
                        b.clone().with_schema(file_schema.clone()).unwrap_or(b)
                    } else {
                        b
                    };
                    let end = row + b.num_rows() as u64;
                    let bytes = if total == 0 { f.size } else { (f.size as u128 * end as u128 / total as u128) as u64 };
                    self.batch(i, row, bytes, b)?;
                    row = end;
                }
                Err(e) => {
                    let lost = total.saturating_sub(row).max(1);
                    return self.bad(i, Some(total), lost, format!("row {row}: {e}"));
                }
            }
        }
        Ok(())
    }

    fn ipc(&self, i: usize, f: &InputFile, offset: u64) -> Result<(), Stopped> {
        let (schema_ref, batches, pos) = match open_ipc(&f.path) {
            Ok(x) => x,
            Err(e) => return self.bad(i, None, 1, format!("not a readable Arrow IPC file: {e}")),
        };
        if schema::signal_of(&schema_ref).is_none() {
            let msg = format!("no {}=metrics|spans schema metadata; not an inferwatch file", schema::META_KIND);
            return self.bad(i, None, 1, msg);
        }
        let mut row = 0u64;
        for batch in batches {
            let b = match batch {
                Ok(b) => b,
                Err(e) => return self.bad(i, None, 1, format!("after row {row}: {e}")),
            };
            let n = b.num_rows() as u64;
            if row + n <= offset {
                row += n;
                continue;
            }
            let mut start = offset.saturating_sub(row);
            while start < n {
                let len = (n - start).min(self.batch_size as u64);
                let bytes = pos.load(Ordering::Relaxed).min(f.size);
                self.batch(i, row + start, bytes, b.slice(start as usize, len as usize))?;
                start += len;
            }
            row += n;
        }
        Ok(())
    }

    fn jsonl(&self, i: usize, f: &InputFile, offset: u64) -> Result<(), Stopped> {
        let mut r = match File::open(&f.path) {
            Ok(file) => BufReader::with_capacity(BUF, file),
            Err(e) => return self.bad(i, None, 1, e.to_string()),
        };
        let mut buf = Vec::new();
        let (mut line_no, mut bytes) = (0u64, 0u64);
        loop {
            buf.clear();
            let n = match r.read_until(b'\n', &mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) => return self.bad(i, None, 1, format!("after line {line_no}: {e}")),
            };
            line_no += 1;
            bytes += n as u64;
            if line_no <= offset {
                continue;
            }
            let line = trim(&buf);
            if line.is_empty() {
                continue;
            }
            match decode_line(line) {
                Ok(payload) => {
                    let min_time = time::payload_min(&payload);
                    let source = Source::Line(line.to_vec());
                    let chunk = Chunk { file: i, end: line_no, bytes_done: bytes, min_time, payload, source };
                    self.send(Event::Chunk(chunk))?;
                }
                Err(e) => self.bad(i, Some(line_no), 1, format!("line {line_no}: {e}"))?,
            }
        }
    }
}
