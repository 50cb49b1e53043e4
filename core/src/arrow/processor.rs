//! The Arrow processor contract: what a processor reads, and how it turns batches into derived batches.
//!
//! An Arrow processor declares the signal and the columns it reads ([`Needs`]), receives the
//! pipeline's data as RecordBatches of that signal's schema (late rows already removed), and
//! emits derived RecordBatches of the metrics schema (derived metrics, scores). It never
//! changes its input: the stage that runs it passes the input on unchanged and sends the
//! derived batches after it. Time only moves through [`ArrowProcessor::advance`], driven by the
//! pipeline's event-time watermark: nothing in a processor reads the wall clock.

use super::RecordBatch;
use crate::host::CreateContext;
use crate::pdata::Signal;
use crate::state::StateError;
use crate::vocab::{ComponentError, FieldError, Parsed, parsed_raw, typed};

/// What a processor reads: its input signal and the columns of that signal's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// The signal (schema) of its input.
    pub signal: Signal,
    /// Names of the input columns it reads (checked against the schema when the pipeline is built).
    pub columns: Vec<&'static str>,
}

/// A running Arrow processor (one per pipeline it appears in).
pub trait ArrowProcessor: Send {
    /// The signal and columns it reads.
    fn needs(&self) -> Needs;
    /// How far behind the newest event time a point may arrive and still count, in ns.
    fn allowed_lateness_ns(&self) -> u64;
    /// Takes one batch of on-time input rows; derived batches (metrics schema) go to `out`.
    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), super::ConvError>;
    /// The pipeline's watermark reached `watermark_ns`: close what ends at or before it, emitting into `out`.
    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), super::ConvError>;
    /// Version of the format [`ArrowProcessor::snapshot`] writes; a checkpoint of another version is refused.
    fn state_version(&self) -> u32;
    /// Serializes the processor's state for a checkpoint.
    fn snapshot(&self) -> Result<Vec<u8>, StateError>;
    /// Restores state written by [`ArrowProcessor::snapshot`] of the same version.
    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError>;
    /// Number of series currently held (exported as a self-metric).
    fn series_count(&self) -> usize;
}

/// Builds Arrow processors of one type; returned by [`crate::component::ProcessorFactory::arrow`].
///
/// A factory implements `parse_arrow` and `build_arrow` (or, the older way, `validate_arrow`
/// and `create_arrow`); the settings are parsed once and every pipeline's processor is built
/// from the same typed config.
pub trait ArrowProcessorFactory: Send + Sync {
    /// Parses and checks the settings into the factory's typed config (the processor
    /// factory's `parse`).
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate_arrow(cfg), cfg)
    }
    /// Checks the settings (same as the processor factory's `validate`).
    fn validate_arrow(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse_arrow(cfg).map(|_| ())
    }
    /// Builds one processor for one pipeline of `signal` from settings `parse_arrow` returned.
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        self.create_arrow(ctx, typed::<serde_json::Value>(parsed)?, signal)
    }
    /// Builds one processor for one pipeline of `signal` from raw settings (`parse_arrow`,
    /// then `build_arrow`).
    fn create_arrow(
        &self,
        ctx: CreateContext,
        cfg: &serde_json::Value,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        self.build_arrow(ctx, &self.parse_arrow(cfg)?, signal)
    }
}

/// Implements `ProcessorFactory` for a type implementing [`ArrowProcessorFactory`]: the
/// processor runs in an Arrow stage (alone through `build_single`, or fused with its adjacent
/// Arrow processors by the pipeline builder). Usage:
/// `inferwatch_core::arrow_processor_factory!(MyFactory, "my_type", &[Signal::Metrics]);`
#[macro_export]
macro_rules! arrow_processor_factory {
    ($ty:ty, $name:expr, $signals:expr) => {
        impl $crate::component::ProcessorFactory for $ty {
            fn type_name(&self) -> &'static str {
                $name
            }
            fn signals(&self) -> &'static [$crate::pdata::Signal] {
                $signals
            }
            fn parse(
                &self,
                cfg: &::serde_json::Value,
            ) -> Result<$crate::component::Parsed, $crate::component::FieldError> {
                $crate::arrow::ArrowProcessorFactory::parse_arrow(self, cfg)
            }
            fn build(
                &self,
                ctx: $crate::component::CreateContext,
                parsed: &$crate::component::Parsed,
                signal: $crate::pdata::Signal,
                next: $crate::consumer::ConsumerRef,
            ) -> Result<$crate::component::NodeRef, $crate::component::ComponentError> {
                $crate::arrow::stage::build_single_parsed(ctx, self, parsed, signal, next)
            }
            fn arrow(&self) -> Option<&dyn $crate::arrow::ArrowProcessorFactory> {
                Some(self)
            }
        }
    };
}
