//! Reading the input files into chunks, on a blocking thread.
//!
//! The reader sends [`Event`]s in file order through a small bounded channel; it stops when
//! the channel closes (the receiver stopped). Bad input never stops it: an unreadable file,
//! a corrupt batch or a bad JSON line is logged with its file and row or line and sent as
//! [`Event::Bad`], and reading goes on with the next batch, line or file. Arrow IPC and
//! Parquet footers are checked against the file size before arrow or parquet reads them, a
//! batch claiming more rows than the file's bytes can hold is refused, and a panic inside
//! those readers (they panic on some corrupt files) makes the file a bad one.

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
use parquet::file::reader::ChunkReader;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::panic::AssertUnwindSafe;
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

/// Runs a call into arrow or parquet, turning a panic (their readers panic on some corrupt
/// inputs) into an error.
pub(crate) fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        format!("corrupt input (reader panicked: {msg})")
    })
}

/// The next batch of `batches`, a panic of the reader counting as an error.
pub(crate) fn next_batch(batches: &mut Batches) -> Option<Result<RecordBatch, String>> {
    match caught(|| batches.next()) {
        Ok(b) => b.map(|r| r.map_err(|e| e.to_string())),
        Err(e) => Some(Err(e)),
    }
}

/// Refuses a batch that claims more rows than an input of `size` bytes can hold (every row
/// has at least its time, 8 bytes; a bit per row is the loosest bound for any column).
pub(crate) fn check_rows(rows: usize, size: u64) -> Result<(), String> {
    if rows as u64 > size.saturating_mul(8) {
        return Err(format!("a batch claims {rows} rows, more than {size} bytes can hold"));
    }
    Ok(())
}

/// Checks an Arrow IPC file's footer against its size before arrow reads it: the footer
/// length, and the offset and lengths of every block it lists (arrow-ipc allocates these
/// lengths before reading and unwraps negative ones).
fn check_ipc_footer<R: Read + Seek>(r: &mut R, size: u64) -> Result<(), String> {
    // "ARROW1", 2 bytes of padding, the blocks, the footer, its length (4 bytes), "ARROW1".
    const HEAD: u64 = 8;
    const TAIL: u64 = 10;
    if size < HEAD + TAIL {
        return Err(format!("{size} bytes is too short for an Arrow IPC file"));
    }
    let mut tail = [0u8; TAIL as usize];
    r.seek(SeekFrom::Start(size - TAIL)).map_err(|e| e.to_string())?;
    r.read_exact(&mut tail).map_err(|e| e.to_string())?;
    if &tail[4..] != b"ARROW1" {
        return Err("no ARROW1 magic at the end of the file".into());
    }
    let len = i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let room = size - HEAD - TAIL;
    let len = u64::try_from(len)
        .ok()
        .filter(|l| *l <= room)
        .ok_or_else(|| format!("footer length {len} does not fit in a file of {size} bytes"))?;
    let mut footer = vec![0u8; len as usize];
    r.seek(SeekFrom::Start(size - TAIL - len)).map_err(|e| e.to_string())?;
    r.read_exact(&mut footer).map_err(|e| e.to_string())?;
    let footer = arrow_ipc::root_as_footer(&footer).map_err(|e| format!("invalid footer: {e}"))?;
    let end = size - TAIL - len;
    let blocks = footer.recordBatches().into_iter().flatten().chain(footer.dictionaries().into_iter().flatten());
    for b in blocks {
        let fits = u64::try_from(b.offset()).ok().and_then(|o| {
            let meta = u64::try_from(b.metaDataLength()).ok()?;
            let body = u64::try_from(b.bodyLength()).ok()?;
            o.checked_add(meta)?.checked_add(body).filter(|e| *e <= end)
        });
        if fits.is_none() {
            return Err(format!(
                "a block (offset {}, metadata {}, body {} bytes) lies outside the file",
                b.offset(),
                b.metaDataLength(),
                b.bodyLength()
            ));
        }
    }
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    Ok(())
}

/// Opens an Arrow IPC input of `size` bytes, file or stream (told apart by the `ARROW1`
/// magic): its schema and its batches. A file's footer is checked first and a panic of the
/// reader is an error.
pub(crate) fn ipc_reader<R: Read + Seek + 'static>(
    mut r: R,
    size: u64,
) -> Result<(arrow_schema::SchemaRef, Batches), String> {
    let mut magic = [0u8; 6];
    let is_file = r.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    if is_file {
        check_ipc_footer(&mut r, size)?;
        let f = caught(|| FileReader::try_new(r, None))?.map_err(|e| e.to_string())?;
        Ok((f.schema(), Box::new(f)))
    } else {
        let s = caught(|| StreamReader::try_new(r, None))?.map_err(|e| e.to_string())?;
        Ok((s.schema(), Box::new(s)))
    }
}

/// Opens an Arrow IPC input: its schema, its batches and a counter of bytes read.
fn open_ipc(path: &std::path::Path) -> Result<(arrow_schema::SchemaRef, Batches, Arc<AtomicU64>), String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let pos = Arc::new(AtomicU64::new(0));
    let counting = Counting { inner: BufReader::with_capacity(BUF, file), pos: pos.clone() };
    let (schema, batches) = ipc_reader(counting, size)?;
    Ok((schema, batches, pos))
}

/// A Parquet reader builder for `input`, its footer checked against its size first (the
/// metadata length must fit) and a panic of the reader an error.
pub(crate) fn parquet_builder<T: ChunkReader + 'static>(
    input: T,
) -> Result<ParquetRecordBatchReaderBuilder<T>, String> {
    let size = input.len();
    if size < 12 {
        return Err(format!("{size} bytes is too short for a Parquet file"));
    }
    let tail = input.get_bytes(size - 8, 8).map_err(|e| e.to_string())?;
    if &tail[4..] != b"PAR1" {
        return Err("no PAR1 magic at the end of the file".into());
    }
    let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if len > size - 12 {
        return Err(format!("metadata length {len} does not fit in a file of {size} bytes"));
    }
    caught(|| ParquetRecordBatchReaderBuilder::try_new(input))?.map_err(|e| e.to_string())
}

/// The event time of a file's first row or line, for ordering; `None` when it has none or
/// cannot be read.
pub(crate) fn first_time(f: &InputFile) -> Option<u64> {
    match f.format {
        Format::Parquet => {
            let file = File::open(&f.path).ok()?;
            let b = parquet_builder(file).ok()?;
            caught(move || {
                let mask = ProjectionMask::columns(b.parquet_schema(), [schema::TIME]);
                let mut r = b.with_projection(mask).with_batch_size(1).with_limit(1).build().ok()?;
                r.next()?.ok().as_ref().and_then(time::batch_first)
            })
            .ok()
            .flatten()
        }
        Format::ArrowIpc => {
            let (_, mut batches, _) = open_ipc(&f.path).ok()?;
            for _ in 0..FIRST_TIME_PROBES {
                let Ok(b) = next_batch(&mut batches)? else { return None };
                if check_rows(b.num_rows(), f.size).is_err() {
                    return None;
                }
                if b.num_rows() > 0 {
                    return caught(|| time::batch_first(&b)).ok().flatten();
                }
            }
            None
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
        let made = caught(|| batch_to_payload(&batch).map(|p| (p, time::batch_min(&batch))))
            .and_then(|r| r.map_err(|e| e.to_string()));
        match made {
            Ok((payload, min_time)) => {
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
        let builder = match parquet_builder(file) {
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
        let built = caught(|| builder.with_batch_size(self.batch_size).with_offset(offset_rows).build());
        let mut reader = match built.and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(r) => r,
            Err(e) => return self.bad(i, None, total.saturating_sub(offset).max(1), e),
        };
        let mut row = offset;
        loop {
            let batch = match caught(|| reader.next()) {
                Ok(None) => break,
                Ok(Some(b)) => b.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
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
        let (schema_ref, mut batches, pos) = match open_ipc(&f.path) {
            Ok(x) => x,
            Err(e) => return self.bad(i, None, 1, format!("not a readable Arrow IPC file: {e}")),
        };
        if schema::signal_of(&schema_ref).is_none() {
            let msg = format!("no {}=metrics|spans schema metadata; not an inferwatch file", schema::META_KIND);
            return self.bad(i, None, 1, msg);
        }
        let mut row = 0u64;
        while let Some(batch) = next_batch(&mut batches) {
            let b = match batch.and_then(|b| check_rows(b.num_rows(), f.size).map(|()| b)) {
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
