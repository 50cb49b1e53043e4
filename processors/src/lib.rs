//! inferwatch processors and connectors: `batch`, `memory_limiter`, `window_stats`, the `forward` and
//! `llm_signals` connectors.

pub mod batch;
pub mod detect;
pub mod forward;
pub mod llm_signals;
pub mod memory_limiter;
pub mod window_stats;

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// Registers every processor and connector of this crate.
pub fn register(reg: &mut Registry) {
    reg.add_processor(Arc::new(batch::BatchFactory));
    reg.add_processor(Arc::new(memory_limiter::MemoryLimiterFactory));
    reg.add_processor(Arc::new(window_stats::WindowStatsFactory));
    reg.add_connector(Arc::new(forward::ForwardFactory));
    reg.add_connector(Arc::new(llm_signals::LlmSignalsFactory));
}
