//! The `replay` receiver: feeds recorded telemetry (Parquet, Arrow IPC, OTLP/JSON lines)
//! into the pipelines, in event-time order, as fast as possible or paced.
//!
//! ```yaml
//! receivers:
//!   replay:
//!     include: [recordings/]   # used by `inferwatch run`; `inferwatch replay --input` replaces it
//!     speed: 0                 # 0 = as fast as possible; N = N× real time by the data's timestamps
//!     batch_size: 8192         # rows per chunk fed to the pipeline (Arrow inputs)
//! ```
//!
//! Inputs are files or directories (read recursively); the format comes from the extension
//! (`.parquet`; `.arrows` / `.arrow`; `.jsonl` / `.json` in the otelcol file exporter format),
//! other files and `*.inprogress` are skipped, as is a `.json` file whose first line is not an
//! export request (a JSON document such as the simulator's `ground_truth.json`). Files are read one after the other, ordered by
//! their first event time (ties by path). Each chunk (a batch of rows, or one JSON line) goes
//! to the pipeline of its signal; a refusal is retried after its `retry_after` (or a backoff
//! from 10 ms to 1 s) and nothing is dropped; a permanent rejection and unreadable input are
//! counted as failed and reading goes on.
//!
//! The read position (key `receiver/<id>/position`) is checkpointed with the other state: a
//! restart on the same inputs resumes just after the last chunk fed before the checkpoint.
//! Chunks fed after it are fed again after a crash (at-least-once); the downstream state is
//! checkpointed at the same point, so a crash-free restart neither loses nor repeats data.
//!
//! Under `inferwatch run` the receiver reads its `include` once and then idles until shutdown;
//! under `inferwatch replay` it reads the command's inputs, reports progress and says when
//! it is done.

pub mod config;
mod control;
mod feed;
mod input;
mod position;
mod read;
mod time;
pub use control::{REPLAY_ITEMS, ReplayControl, ReplayProgress};
pub(crate) use read::{caught, check_rows, ipc_reader, next_batch, parquet_builder};
pub(crate) use time::{batch_first, batch_min};

/// Decodes one line of the otelcol file exporter format (OTLP/JSON, one export request per line).
pub fn decode_otlp_json_line(line: &[u8]) -> Result<inferwatch_core::pdata::Payload, String> {
    read::decode_line(line)
}

/// The earliest event time in a payload (span start, point or record time), if any.
pub fn payload_first_time(p: &inferwatch_core::pdata::Payload) -> Option<u64> {
    time::payload_min(p)
}

use async_trait::async_trait;
use config::ReplayConfig;
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use position::ReplayPosition;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long `shutdown` waits for the feeding task before abandoning it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Chunks read ahead of the pipeline.
const READ_AHEAD: usize = 4;

/// Builds `replay` receivers.
pub struct ReplayReceiverFactory;

impl ReceiverFactory for ReplayReceiverFactory {
    fn type_name(&self) -> &'static str {
        "replay"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(ReplayConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
    ) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(ReplayReceiver::new(ctx, inferwatch_core::component::typed::<ReplayConfig>(parsed)?.clone())))
    }
}

/// A replay receiver.
pub struct ReplayReceiver {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
    config: ReplayConfig,
    position: Arc<ReplayPosition>,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl ReplayReceiver {
    /// A receiver with checked settings; registers its read position with the host's state.
    pub fn new(ctx: CreateContext, config: ReplayConfig) -> Self {
        let position = Arc::new(ReplayPosition::new(&ctx.id));
        ctx.host.state.register(position.clone());
        ReplayReceiver { id: ctx.id, telemetry: ctx.telemetry, host: ctx.host, config, position, running: None }
    }

    /// The inputs and pace: the `inferwatch replay` request when there is one, else the settings.
    fn plan(&self) -> (Vec<PathBuf>, f64) {
        match self.host.run.get::<ReplayControl>() {
            Some(c) => (c.inputs.clone(), c.speed.unwrap_or(0.0)),
            None => (self.config.include.clone(), self.config.speed),
        }
    }
}

#[async_trait]
impl Receiver for ReplayReceiver {
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError> {
        if self.running.is_some() {
            return Err(ComponentError::Start(format!("receiver {} is already started", self.id)));
        }
        let (inputs, speed) = self.plan();
        if !speed.is_finite() || speed < 0.0 {
            return Err(ComponentError::Start(format!("replay speed {speed} must be 0 or positive")));
        }
        for p in &inputs {
            if let Err(e) = std::fs::metadata(p) {
                return Err(ComponentError::Start(format!("replay input {}: {e}", p.display())));
            }
        }
        if inputs.is_empty() {
            tracing::warn!(receiver = %self.id, "replay receiver has no inputs (set `include`)");
        }
        let cancel = CancellationToken::new();
        let job = Job {
            id: self.id.clone(),
            telemetry: self.telemetry.clone(),
            host: self.host.clone(),
            position: self.position.clone(),
            consumers,
            inputs,
            speed,
            batch_size: self.config.batch_size,
            cancel: cancel.clone(),
        };
        let task = tokio::spawn(job.run());
        tracing::info!(receiver = %self.id, "replay receiver started");
        self.running = Some((cancel, task));
        Ok(())
    }

    async fn shutdown(&mut self) {
        let Some((cancel, mut task)) = self.running.take() else { return };
        cancel.cancel();
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(receiver = %self.id, error = %e, "replay task failed"),
            Err(_) => {
                tracing::warn!(receiver = %self.id, grace = ?SHUTDOWN_GRACE,
                    "replay receiver: the pipeline did not take the current chunk in time; stopping");
                task.abort();
            }
        }
        tracing::debug!(receiver = %self.id, "replay receiver stopped");
    }
}

impl Drop for ReplayReceiver {
    fn drop(&mut self) {
        if let Some((cancel, _)) = &self.running {
            cancel.cancel();
        }
    }
}

/// One replay of a list of inputs.
struct Job {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
    position: Arc<ReplayPosition>,
    consumers: ReceiverConsumers,
    inputs: Vec<PathBuf>,
    speed: f64,
    batch_size: usize,
    cancel: CancellationToken,
}

impl Job {
    async fn run(self) {
        let control = self.host.run.get_arc::<ReplayControl>();
        let inputs = self.inputs.clone();
        let cancel = self.cancel.clone();
        let listed = tokio::task::spawn_blocking(move || {
            let mut files = input::expand(&inputs)?;
            files.retain(|f| {
                let plain_json = f.path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
                let keep = !plain_json || read::is_otlp_lines(&f.path);
                if !keep {
                    tracing::info!(file = %f.path.display(), "replay skips a .json file that is not OTLP/JSON lines");
                }
                keep
            });
            let files = input::sort_by_time(files, |f| if cancel.is_cancelled() { None } else { read::first_time(f) });
            Ok::<_, input::ListError>(files)
        })
        .await;
        let files = match listed {
            Ok(Ok(files)) => Arc::new(files),
            Ok(Err(e)) => {
                tracing::error!(receiver = %self.id, error = %e, "replay cannot list its inputs");
                if let Some(c) = &control {
                    c.progress.failed_items.fetch_add(1, Ordering::Relaxed);
                    c.progress.finish();
                }
                return;
            }
            Err(e) => {
                tracing::error!(receiver = %self.id, error = %e, "replay listing task failed");
                if let Some(c) = &control {
                    c.progress.finish();
                }
                return;
            }
        };
        if self.cancel.is_cancelled() {
            return;
        }
        let sizes: Vec<u64> = files.iter().map(|f| f.size).collect();
        let (file, offset) = self.position.resume(files.iter().map(input::InputFile::key).collect());
        let base_bytes: u64 = sizes[..file].iter().sum();
        if let Some(c) = &control {
            c.progress.total_bytes.store(sizes.iter().sum(), Ordering::Relaxed);
            c.progress.files_total.store(files.len() as u64, Ordering::Relaxed);
            c.progress.files_done.store(file as u64, Ordering::Relaxed);
            c.progress.done_bytes.store(base_bytes, Ordering::Relaxed);
        }
        tracing::info!(receiver = %self.id, files = files.len(), bytes = sizes.iter().sum::<u64>(), from_file = file,
            from_offset = offset, speed = self.speed, "replay reading its inputs");
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let reader =
            read::Reader { files: files.clone(), batch_size: self.batch_size, tx, cancel: self.cancel.clone() };
        let reading = tokio::task::spawn_blocking(move || reader.run(file, offset));
        let mut feeder = feed::Feeder {
            id: self.id.clone(),
            metrics: self.telemetry.receiver(&self.id, "replay"),
            consumers: self.consumers,
            telemetry: self.telemetry.clone(),
            host: self.host.clone(),
            position: self.position.clone(),
            cancel: self.cancel.clone(),
            speed: self.speed,
            sizes,
            base_bytes,
            pace_origin: None,
            skipped: [0; 3],
        };
        let done = feeder.run(rx).await;
        feeder.report_skipped();
        if done.is_err() {
            tracing::debug!(receiver = %self.id, "replay stopped before the end of its inputs");
            return;
        }
        if let Err(e) = reading.await {
            tracing::error!(receiver = %self.id, error = %e, "replay reader failed");
        }
        tracing::info!(receiver = %self.id, files = files.len(), "replay read all its inputs");
        if let Some(c) = &control {
            c.progress.finish();
        }
    }
}
