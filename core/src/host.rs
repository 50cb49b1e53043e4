//! What every component of one running service shares: the state registry and, under
//! `inferwatch replay`, the replay request and its progress.

use crate::state::StateRegistry;
use parking_lot::RwLock;
use std::any::Any;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Shared services of one running pipeline graph.
#[derive(Default)]
pub struct Host {
    /// Stateful components and the checkpoint store.
    pub state: Arc<StateRegistry>,
    /// Set by `inferwatch replay`: the inputs replay receivers read and where they report progress.
    pub replay: Option<Arc<ReplayControl>>,
    /// What extensions offer to the other components (authenticators, queue storage), by id.
    pub services: ExtensionServices,
}

/// Services extensions register at creation for the components built after them, keyed by
/// the extension's id (`bearertokenauth/tenant-a`, `file_storage/queue`).
#[derive(Default)]
pub struct ExtensionServices {
    map: RwLock<HashMap<String, Arc<dyn Any + Send + Sync>>>,
}

impl ExtensionServices {
    /// Registers `service` under the extension id `id` (a second call replaces the first).
    pub fn provide<T: Any + Send + Sync>(&self, id: &str, service: T) {
        self.map.write().insert(id.to_string(), Arc::new(service));
    }

    /// The service of type `T` that extension `id` registered, if any.
    pub fn get<T: Any + Send + Sync + Clone>(&self, id: &str) -> Option<T> {
        self.map.read().get(id).and_then(|s| s.downcast_ref::<T>().cloned())
    }

    /// Whether extension `id` registered any service at all.
    pub fn contains(&self, id: &str) -> bool {
        self.map.read().contains_key(id)
    }
}

impl Host {
    /// A host with an empty state registry and no replay request.
    pub fn new() -> Arc<Host> {
        Arc::new(Host::default())
    }
}

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
