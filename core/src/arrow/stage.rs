//! The Arrow stage: runs a pipeline's adjacent Arrow processors over one conversion per batch.

use super::ArrowProcessorFactory;
use crate::component::{ComponentError, CreateContext, NodeRef};
use crate::consumer::ConsumerRef;
use crate::pdata::Signal;

/// Builds a stage holding one Arrow processor (what a processor factory's `create` returns;
/// the graph fuses adjacent Arrow processors of a pipeline into one stage instead).
pub fn build_single(
    ctx: CreateContext,
    factory: &dyn ArrowProcessorFactory,
    cfg: &serde_json::Value,
    signal: Signal,
    next: ConsumerRef,
) -> Result<NodeRef, ComponentError> {
    let _ = (ctx, factory, cfg, signal, next);
    Err(ComponentError::Start("arrow stage not built yet".into()))
}
