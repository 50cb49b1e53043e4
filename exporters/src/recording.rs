//! What the recording exporters (`parquet`, `arrow_ipc`) share: settings, file layout and
//! naming, rotation, crash safety and the exporter node itself.
//!
//! Files live at `DIRECTORY/<signal>/<YYYY-MM-DD>/<signal>-<first event time>-<seq>.<ext>`,
//! where the day and the first event time come from the data (the minimum `time_unix_nano` of
//! the first batch written to the file), never from the wall clock: replaying the same input
//! gives the same files. A file is written as `NAME.inprogress` and renamed to `NAME` once it
//! is complete, so a crash leaves only `.inprogress` files, which the next start removes.
//!
//! Event times come from the request, so they are bounded before they name anything: the
//! recorder keeps an event-time watermark (the latest event time written) and a window of
//! `allowed_lateness` around it. Rows older than the watermark minus `allowed_lateness`
//! (late) or newer than the wall clock plus `allowed_lateness` (early: no real data, live or
//! replayed, is from the future) are still written, into the current file, and counted in
//! `inferwatch_exporter_out_of_window_items_total`; only data that moves the watermark forward
//! rotates a file by event time. Out-of-order or scattered timestamps therefore cannot create
//! a directory and a file per distinct time.

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use inferwatch_core::arrow::{self, RecordBatch};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, Node, NodeRef};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::{Checkpoint, StateError};
use inferwatch_core::telemetry::ExporterMetrics;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Suffix of a file still being written.
pub const IN_PROGRESS_SUFFIX: &str = ".inprogress";

const NANOS_PER_SEC: u64 = 1_000_000_000;
const NANOS_PER_DAY: u64 = 86_400 * NANOS_PER_SEC;

/// When a recording file is closed and the next one started (whichever comes first).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RotationConfig {
    /// Close a file once this many bytes were written to it (compressed size for parquet).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Close a file once a batch's event time reaches the file's first event time plus this.
    #[serde(default = "default_max_age")]
    pub max_age: GoDuration,
}

/// Default `allowed_lateness` of the recording exporters.
pub const DEFAULT_ALLOWED_LATENESS: Duration = Duration::from_secs(3600);

/// Serde default of `allowed_lateness`.
pub(crate) fn default_allowed_lateness() -> GoDuration {
    GoDuration(DEFAULT_ALLOWED_LATENESS)
}

fn default_max_bytes() -> u64 {
    64 * 1024 * 1024
}

fn default_max_age() -> GoDuration {
    GoDuration(Duration::from_secs(3600))
}

impl Default for RotationConfig {
    fn default() -> Self {
        RotationConfig { max_bytes: default_max_bytes(), max_age: default_max_age() }
    }
}

impl RotationConfig {
    /// Checks that both limits are positive.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.max_bytes == 0 {
            return Err(FieldError::at("rotation.max_bytes", "max_bytes must be positive"));
        }
        if self.max_age.0.is_zero() {
            return Err(FieldError::at("rotation.max_age", "max_age must be positive"));
        }
        Ok(())
    }
}

/// Checks the `directory` setting.
pub(crate) fn validate_directory(dir: &Path) -> Result<(), FieldError> {
    if dir.as_os_str().is_empty() {
        return Err(FieldError::at("directory", "directory must not be empty"));
    }
    Ok(())
}

/// Why writing or closing a recording file failed; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// A file-system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file format writer failed (encoding, or I/O reported by the writer).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the writer reported.
        message: String,
    },
}

impl RecordingError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        RecordingError::Io { path: path.to_path_buf(), source }
    }

    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            RecordingError::Io { path, .. } | RecordingError::Format { path, .. } => path,
        }
    }
}

/// A file format the recorder writes batches in.
pub(crate) trait FileFormat: Send + Sync {
    /// File name extension, without the dot.
    fn extension(&self) -> &'static str;
    /// Starts a file of `schema` on `file`; errors are messages (the caller adds the path).
    fn open(&self, file: File, schema: SchemaRef) -> Result<Box<dyn BatchFile>, String>;
}

/// One open file of a [`FileFormat`].
pub(crate) trait BatchFile: Send {
    /// Appends a batch (buffered).
    fn write(&mut self, batch: &RecordBatch) -> Result<(), String>;
    /// Bytes written so far, including an estimate of what is buffered.
    fn size(&self) -> u64;
    /// Completes the file (footer / end-of-stream marker), flushes it and returns it.
    fn finish(self: Box<Self>) -> Result<File, String>;
}

/// The file being written.
struct OpenFile {
    writer: Box<dyn BatchFile>,
    /// `path` + `.inprogress`.
    tmp: PathBuf,
    /// The name it gets once complete.
    path: PathBuf,
    schema: SchemaRef,
    /// Event time of the first row (minimum of the first batch), as the OTLP u64.
    first_ns: u64,
    /// UTC day of `first_ns` (days since the epoch).
    day: u64,
    /// Rows written.
    rows: u64,
}

/// Writes batches of one signal into rotated files under `DIRECTORY/<signal>`.
pub(crate) struct Recorder {
    name: String,
    signal: Signal,
    root: PathBuf,
    max_bytes: u64,
    max_age_ns: u64,
    format: Box<dyn FileFormat>,
    current: Option<OpenFile>,
    metrics: ExporterMetrics,
    /// Rows outside `[watermark - allowed_lateness, now + allowed_lateness]` are late / early.
    allowed_lateness_ns: u64,
    /// Latest (clamped) event time written, once anything was.
    watermark: Option<u64>,
    /// Wall clock in Unix nanoseconds (a parameter for tests).
    now: fn() -> u64,
    late_rows: Counter,
    early_rows: Counter,
}

/// The wall clock in Unix nanoseconds.
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Recorder {
    /// The directory of this recorder's signal.
    fn signal_dir(&self) -> PathBuf {
        self.root.join(self.signal.as_str())
    }

    /// Creates the signal directory and removes `.inprogress` files a crash left behind.
    fn prepare(&self) -> Result<Vec<PathBuf>, RecordingError> {
        let dir = self.signal_dir();
        std::fs::create_dir_all(&dir).map_err(|e| RecordingError::io(&dir, e))?;
        let mut leftovers = Vec::new();
        find_in_progress(&dir, 0, &mut leftovers)?;
        leftovers.sort();
        for p in &leftovers {
            std::fs::remove_file(p).map_err(|e| RecordingError::io(p, e))?;
        }
        Ok(leftovers)
    }

    /// Writes one batch, rotating first when the batch would break a limit.
    fn write(&mut self, batch: &RecordBatch) -> Result<(), RecordingError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        // The window event times must fall in to name files; rows outside are counted and
        // written with their times clamped into it for naming (their own columns are kept).
        let hi = (self.now)().saturating_add(self.allowed_lateness_ns);
        let lo = self.watermark.map_or(0, |w| w.saturating_sub(self.allowed_lateness_ns)).min(hi);
        let (min_ns, max_ns, late, early) = event_range(batch, lo, hi);
        self.late_rows.inc_by(late);
        self.early_rows.inc_by(early);
        let (min_ns, max_ns) = (min_ns.clamp(lo, hi), max_ns.clamp(lo, hi));
        // Only data that moves the watermark forward rotates by event time.
        let forward = self.watermark.is_none_or(|w| max_ns > w);
        let rotate = self.current.as_ref().is_some_and(|f| {
            f.size_reached(self.max_bytes)
                || (forward
                    && (max_ns >= f.first_ns.saturating_add(self.max_age_ns) || max_ns / NANOS_PER_DAY != f.day))
                || f.schema != batch.schema()
        });
        self.watermark = Some(self.watermark.map_or(max_ns, |w| w.max(max_ns)));
        if rotate {
            // A failure is logged and counted there; this batch goes to a new file regardless.
            let _ = self.close();
        }
        if self.current.is_none() {
            self.current = Some(self.open(min_ns, batch.schema())?);
        }
        let Some(f) = self.current.as_mut() else { return Ok(()) };
        if let Err(message) = f.writer.write(batch) {
            let err = RecordingError::Format { path: f.tmp.clone(), message };
            self.discard(&err);
            return Err(err);
        }
        f.rows += batch.num_rows() as u64;
        if f.size_reached(self.max_bytes) {
            let _ = self.close();
        }
        Ok(())
    }

    /// Starts a file whose first event time is `first_ns`.
    fn open(&self, first_ns: u64, schema: SchemaRef) -> Result<OpenFile, RecordingError> {
        let day = first_ns / NANOS_PER_DAY;
        let dir = self.signal_dir().join(day_name(first_ns));
        std::fs::create_dir_all(&dir).map_err(|e| RecordingError::io(&dir, e))?;
        let stem = format!("{}-{}", self.signal.as_str(), time_name(first_ns));
        let ext = self.format.extension();
        let mut seq = 0u32;
        let (path, tmp, file) = loop {
            let path = dir.join(format!("{stem}-{seq:06}.{ext}"));
            let tmp = in_progress_path(&path);
            if !path.exists() {
                match File::create_new(&tmp) {
                    Ok(file) => break (path, tmp, file),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(RecordingError::io(&tmp, e)),
                }
            }
            seq = seq
                .checked_add(1)
                .ok_or_else(|| RecordingError::Format { path: path.clone(), message: "no free file name".into() })?;
        };
        match self.format.open(file, schema.clone()) {
            Ok(writer) => Ok(OpenFile { writer, tmp, path, schema, first_ns, day, rows: 0 }),
            Err(message) => {
                let _ = std::fs::remove_file(&tmp);
                Err(RecordingError::Format { path: tmp, message })
            }
        }
    }

    /// Completes the current file and gives it its final name. On failure the rows it held are
    /// logged and counted as failed, and the incomplete file is removed.
    fn close(&mut self) -> Result<Option<PathBuf>, RecordingError> {
        let Some(f) = self.current.take() else { return Ok(None) };
        let OpenFile { writer, tmp, path, rows, .. } = f;
        let done = writer
            .finish()
            .map_err(|message| RecordingError::Format { path: tmp.clone(), message })
            .and_then(|file| file.sync_all().map_err(|e| RecordingError::io(&tmp, e)))
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| RecordingError::io(&path, e)));
        match done {
            Ok(()) => {
                sync_dir(path.parent());
                tracing::debug!(exporter = %self.name, file = %path.display(), rows, "recording file closed");
                Ok(Some(path))
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                self.metrics.send_failed.inc_by(rows);
                tracing::error!(exporter = %self.name, signal = %self.signal, items = rows, error = %e,
                    "closing a recording file failed; its data is lost");
                Err(e)
            }
        }
    }

    /// Drops the current file after a write error (what it held is counted as failed).
    fn discard(&mut self, err: &RecordingError) {
        if let Some(f) = self.current.take() {
            let _ = std::fs::remove_file(&f.tmp);
            if f.rows > 0 {
                self.metrics.send_failed.inc_by(f.rows);
                tracing::error!(exporter = %self.name, signal = %self.signal, items = f.rows, error = %err,
                    "writing a recording file failed; the file and the data already in it are dropped");
            }
        }
    }
}

impl OpenFile {
    fn size_reached(&self, max_bytes: u64) -> bool {
        self.rows > 0 && self.writer.size() >= max_bytes
    }
}

/// Collects `*.inprogress` files under `dir` (two levels deep at most: day folders).
fn find_in_progress(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), RecordingError> {
    let entries = std::fs::read_dir(dir).map_err(|e| RecordingError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RecordingError::io(dir, e))?;
        let path = entry.path();
        let ty = entry.file_type().map_err(|e| RecordingError::io(&path, e))?;
        if ty.is_dir() && depth < 2 {
            find_in_progress(&path, depth + 1, out)?;
        } else if ty.is_file() && path.to_string_lossy().ends_with(IN_PROGRESS_SUFFIX) {
            out.push(path);
        }
    }
    Ok(())
}

/// `path` with `.inprogress` appended.
fn in_progress_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(IN_PROGRESS_SUFFIX);
    PathBuf::from(s)
}

/// Persists a rename (best effort: not every platform can sync a directory).
fn sync_dir(dir: Option<&Path>) {
    if let Some(d) = dir
        && let Ok(f) = File::open(d)
    {
        let _ = f.sync_all();
    }
}

/// (min, max) event time of a non-empty batch as OTLP u64 nanoseconds (0 when it has none),
/// and how many rows lie before `lo` and after `hi`.
fn event_range(batch: &RecordBatch, lo: u64, hi: u64) -> (u64, u64, u64, u64) {
    let Ok(col) = arrow::time_column(batch) else { return (0, 0, 0, 0) };
    // The column holds the OTLP fixed64 bit pattern; compare as unsigned.
    let mut it = col.iter().flatten().map(|t| t as u64);
    let Some(first) = it.next() else { return (0, 0, 0, 0) };
    let out = |t: u64| (u64::from(t < lo), u64::from(t > hi));
    let (l, e) = out(first);
    it.fold((first, first, l, e), |(min, max, late, early), t| {
        let (l, e) = out(t);
        (min.min(t), max.max(t), late + l, early + e)
    })
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as u32, d as u32)
}

/// `YYYY-MM-DD` (UTC) of an event time.
pub fn day_name(ns: u64) -> String {
    let (y, m, d) = civil_from_days((ns / NANOS_PER_DAY) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYYMMDDTHHMMSS.nnnnnnnnnZ` (UTC) of an event time.
pub fn time_name(ns: u64) -> String {
    let (y, m, d) = civil_from_days((ns / NANOS_PER_DAY) as i64);
    let secs = (ns % NANOS_PER_DAY) / NANOS_PER_SEC;
    let nanos = ns % NANOS_PER_SEC;
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{nanos:09}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The exporter node: converts each payload to Arrow once and writes it, synchronously.
pub(crate) struct RecordingExporter {
    name: String,
    signal: Signal,
    recorder: Arc<Mutex<Recorder>>,
    metrics: ExporterMetrics,
    conversions: Counter,
    /// The schema of this signal: a batch handed over by an Arrow stage is reused when it has it.
    schema: SchemaRef,
    stopped: std::sync::atomic::AtomicBool,
}

/// Makes a recorder's output durable at checkpoints (its state is the files themselves).
struct RecordingCheckpoint {
    key: String,
    recorder: Arc<Mutex<Recorder>>,
}

impl Checkpoint for RecordingCheckpoint {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn kind(&self) -> &'static str {
        "recording"
    }

    fn version(&self) -> u32 {
        1
    }

    fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
        Ok(None)
    }

    fn restore(&self, _bytes: &[u8]) -> Result<(), StateError> {
        Ok(())
    }

    fn make_durable(&self) -> Result<(), StateError> {
        self.recorder
            .lock()
            .close()
            .map(|_| ())
            .map_err(|e| StateError::Store { path: e.path().display().to_string(), message: e.to_string() })
    }
}

/// Builds a recording exporter node and registers its checkpoint member; logs are refused.
pub(crate) fn create(
    ctx: &CreateContext,
    signal: Signal,
    directory: PathBuf,
    rotation: RotationConfig,
    allowed_lateness: Duration,
    format: Box<dyn FileFormat>,
) -> Result<NodeRef, ComponentError> {
    if signal == Signal::Logs {
        return Err(ComponentError::Start(format!(
            "exporter \"{}\" cannot record logs: there is no Arrow schema for logs yet \
             (use it in traces and metrics pipelines)",
            ctx.id
        )));
    }
    let metrics = ctx.telemetry.exporter(&ctx.id, signal);
    let recorder = Arc::new(Mutex::new(Recorder {
        name: ctx.id.to_string(),
        signal,
        root: directory,
        max_bytes: rotation.max_bytes,
        max_age_ns: u64::try_from(rotation.max_age.0.as_nanos()).unwrap_or(u64::MAX),
        format,
        current: None,
        metrics: metrics.clone(),
        allowed_lateness_ns: u64::try_from(allowed_lateness.as_nanos()).unwrap_or(u64::MAX),
        watermark: None,
        now: wall_clock_ns,
        late_rows: ctx.telemetry.recording_out_of_window(&ctx.id, signal, "late"),
        early_rows: ctx.telemetry.recording_out_of_window(&ctx.id, signal, "early"),
    }));
    ctx.host.state.register(Arc::new(RecordingCheckpoint {
        key: format!("exporter/{}/{}", ctx.id, signal.as_str()),
        recorder: recorder.clone(),
    }));
    Ok(Arc::new(RecordingExporter {
        name: ctx.id.to_string(),
        signal,
        recorder,
        metrics,
        conversions: ctx.telemetry.arrow_conversions(&format!("exporter {}", ctx.id), signal),
        schema: match signal {
            Signal::Traces => arrow::schema::spans_schema(),
            _ => arrow::schema::metrics_schema(),
        },
        stopped: std::sync::atomic::AtomicBool::new(false),
    }))
}

#[async_trait]
impl Consumer for RecordingExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.consume_with_batch(data, None).await
    }

    async fn consume_with_batch(&self, data: Payload, given: Option<RecordBatch>) -> Result<(), ConsumeError> {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConsumeError::refused(RefuseReason::ShuttingDown, None, "recording exporter is shut down"));
        }
        let items = data.item_count() as u64;
        // An Arrow stage upstream already converted this payload: reuse it (one conversion per batch).
        let reuse = given.filter(|b| b.schema_ref().as_ref() == self.schema.as_ref());
        let converted = match reuse {
            Some(b) => Ok(b),
            None => arrow::payload_to_batch(&data).inspect(|_| {
                self.conversions.inc();
            }),
        };
        let batch = match converted {
            Ok(b) => b,
            Err(e) => {
                self.metrics.send_failed.inc_by(items);
                tracing::error!(exporter = %self.name, signal = %self.signal, items, error = %e,
                    "converting to Arrow failed; dropping data");
                return Err(ConsumeError::Permanent(format!("exporter {}: converting to Arrow: {e}", self.name)));
            }
        };
        let written = self.recorder.lock().write(&batch);
        match written {
            Ok(()) => {
                self.metrics.sent.inc_by(items);
                Ok(())
            }
            Err(e) => {
                self.metrics.send_failed.inc_by(items);
                tracing::error!(exporter = %self.name, signal = %self.signal, items, error = %e,
                    "writing a recording file failed; dropping data");
                Err(ConsumeError::Permanent(format!("exporter {}: writing {e}", self.name)))
            }
        }
    }
}

#[async_trait]
impl Node for RecordingExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        let removed = self.recorder.lock().prepare().map_err(|e| {
            ComponentError::Start(format!("exporter {}: preparing the recording directory: {e}", self.name))
        })?;
        if !removed.is_empty() {
            let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
            tracing::warn!(exporter = %self.name, signal = %self.signal,
                "removed {} incomplete recording file(s) left by an earlier run: {}", names.len(), names.join(", "));
        }
        Ok(())
    }

    async fn shutdown(&self, _deadline: Instant) -> u64 {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut r = self.recorder.lock();
        let rows = r.current.as_ref().map_or(0, |f| f.rows);
        match r.close() {
            Ok(_) => 0,
            Err(_) => rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_event_time() {
        assert_eq!(day_name(0), "1970-01-01");
        assert_eq!(time_name(0), "19700101T000000.000000000Z");
        // 2023-11-14T22:13:20.000000007Z
        let t = 1_700_000_000_000_000_007;
        assert_eq!(day_name(t), "2023-11-14");
        assert_eq!(time_name(t), "20231114T221320.000000007Z");
        // Leap day and the last nanosecond of a year.
        assert_eq!(time_name(951_782_400_000_000_000), "20000229T000000.000000000Z");
        assert_eq!(time_name(1_704_067_199_999_999_999), "20231231T235959.999999999Z");
        assert_eq!(day_name(u64::MAX), "2554-07-21");
    }

    #[test]
    fn rotation_limits_must_be_positive() {
        assert!(RotationConfig::default().validate().is_ok());
        let e = RotationConfig { max_bytes: 0, ..Default::default() }.validate().unwrap_err();
        assert_eq!(e, FieldError::at("rotation.max_bytes", "max_bytes must be positive"));
        let e = RotationConfig { max_age: GoDuration(Duration::ZERO), ..Default::default() }.validate().unwrap_err();
        assert_eq!(e, FieldError::at("rotation.max_age", "max_age must be positive"));
    }

    fn one_span(end_ns: u64, i: u64) -> Payload {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        name: "decode".into(),
                        trace_id: vec![0x5a; 16],
                        span_id: i.to_be_bytes().to_vec(),
                        start_time_unix_nano: end_ns.saturating_sub(1),
                        end_time_unix_nano: end_ns,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    fn count_files(dir: &Path) -> (usize, usize) {
        let (mut files, mut dirs) = (0, 0);
        for day in std::fs::read_dir(dir.join("traces")).unwrap() {
            dirs += 1;
            files += std::fs::read_dir(day.unwrap().path()).unwrap().count();
        }
        (files, dirs)
    }

    fn metric(t: &inferwatch_core::telemetry::Telemetry, reason: &str) -> u64 {
        let text = t.render();
        text.lines()
            .find(|l| l.starts_with("inferwatch_exporter_out_of_window_items_total") && l.contains(reason))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn scattered_event_times_create_a_bounded_number_of_files() {
        use inferwatch_core::component::{ComponentId, ExporterFactory};
        let dir = std::env::temp_dir().join(format!("iw-recording-scatter-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let telemetry = Arc::new(inferwatch_core::telemetry::Telemetry::new());
        let ctx = CreateContext::new(ComponentId::parse("parquet").unwrap(), telemetry.clone());
        let node = crate::parquet::ParquetExporterFactory
            .create(ctx, &serde_json::json!({"directory": dir}), Signal::Traces)
            .unwrap();
        node.start().await.unwrap();
        // 1,000 one-span requests with event times scattered over the last 10 years, plus 50
        // from the far future.
        let now = wall_clock_ns();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            // xorshift64: a fixed, dependency-free scatter.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let span = 10 * 365 * NANOS_PER_DAY;
        for i in 0..1000u64 {
            node.consume(one_span(now - next(span), i)).await.unwrap();
        }
        for i in 0..50u64 {
            node.consume(one_span(now + (2 + next(1000)) * NANOS_PER_DAY, 1000 + i)).await.unwrap();
        }
        assert_eq!(node.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
        let (files, dirs) = count_files(&dir);
        // Without the window: one file and one day directory per request. With it, only a
        // forward move of the watermark rotates: about ln(1000) times for random order.
        assert!(files <= 20, "{files} files in {dirs} directories");
        assert!(dirs <= files);
        let (late, early) = (metric(&telemetry, "late"), metric(&telemetry, "early"));
        println!("1,050 scattered one-span requests: {files} files in {dirs} directories; late {late}, early {early}");
        assert_eq!(early, 50);
        assert!(late > 900, "late {late}");
        // Nothing is lost: every row is in the files.
        let mut rows = 0;
        for day in std::fs::read_dir(dir.join("traces")).unwrap() {
            for f in std::fs::read_dir(day.unwrap().path()).unwrap() {
                let f = std::fs::File::open(f.unwrap().path()).unwrap();
                let r = ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                    .unwrap()
                    .build()
                    .unwrap();
                rows += r.map(|b| b.unwrap().num_rows()).sum::<usize>();
            }
        }
        assert_eq!(rows, 1050);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn in_progress_name() {
        assert_eq!(in_progress_path(Path::new("/a/b.parquet")), PathBuf::from("/a/b.parquet.inprogress"));
    }
}
