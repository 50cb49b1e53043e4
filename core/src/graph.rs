//! Builds the pipeline graph from a validated configuration, starts it and shuts it down in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Tells whether every pipeline is running (read by the health check).
#[derive(Clone, Default)]
pub struct StatusHandle(Arc<AtomicBool>);

impl StatusHandle {
    /// True while every pipeline is running.
    pub fn is_running(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    /// Sets the running state.
    pub fn set_running(&self, v: bool) {
        self.0.store(v, Ordering::SeqCst)
    }
}
