//! The request of `inferwatch replay` (its inputs and pace), the progress the replay receivers
//! report back, and their self-metric. The command puts the request in the host's run values
//! ([`inferwatch_core::host::RunValues`]); receivers find it there by type.

use inferwatch_core::telemetry::Counters;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `inferwatch_replay_items{receiver, data_type}`: items read from recordings.
pub const REPLAY_ITEMS: Counters<2> = Counters::new(
    "inferwatch_replay_items",
    "Items read from recordings by replay receivers",
    ["receiver", "data_type"],
);

/// The inputs of `inferwatch replay` and the progress the replay receivers report.
#[derive(Debug, Default)]
pub struct ReplayControl {
    /// Files or directories to read (directories recursively).
    pub inputs: Vec<PathBuf>,
    /// Pace at this many times real time (by the data's timestamps); `None` = as fast as possible.
    pub speed: Option<f64>,
    /// Progress counters.
    pub progress: ReplayProgress,
}

/// Counters a replay receiver updates as it reads.
#[derive(Debug, Default)]
pub struct ReplayProgress {
    /// Total input bytes of all files (known after listing).
    pub total_bytes: AtomicU64,
    /// Input bytes read so far.
    pub done_bytes: AtomicU64,
    /// Items (points, spans, records) fed to the pipeline so far.
    pub items: AtomicU64,
    /// Files listed.
    pub files_total: AtomicU64,
    /// Files fully read.
    pub files_done: AtomicU64,
    /// Items the pipeline refused for good (counted, not retried).
    pub failed_items: AtomicU64,
    /// Set when every receiver has read all its inputs.
    pub finished: AtomicBool,
    /// Wakes the waiting command when `finished` is set.
    pub notify: tokio::sync::Notify,
}

impl ReplayProgress {
    /// Marks the replay finished and wakes the waiting command.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Waits until [`ReplayProgress::finish`] was called.
    pub async fn wait_finished(&self) {
        while !self.finished.load(Ordering::SeqCst) {
            let n = self.notify.notified();
            if self.finished.load(Ordering::SeqCst) {
                break;
            }
            n.await;
        }
    }
}
