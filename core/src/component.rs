//! The factory and lifecycle traits every component implements (the ids, kinds and config
//! errors they use are [`crate::vocab`]'s, re-exported here).

use crate::arrow::processor::ArrowProcessorFactory;
use crate::consumer::{Consumer, ConsumerRef};
use crate::pdata::Signal;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Instant;

pub use crate::host::{CreateContext, StatusHandle};
pub use crate::vocab::{
    ComponentError, ComponentId, ComponentKind, FieldError, IdError, Parsed, PathSeg, parse_config, parsed_raw, typed,
};

/// The consumers a receiver feeds, one per signal it is used for.
#[derive(Clone, Default)]
pub struct ReceiverConsumers {
    /// Where spans go, if the receiver is in a traces pipeline.
    pub traces: Option<ConsumerRef>,
    /// Where metrics go.
    pub metrics: Option<ConsumerRef>,
    /// Where logs go.
    pub logs: Option<ConsumerRef>,
}

impl ReceiverConsumers {
    /// The consumer for `signal`, if any.
    pub fn get(&self, signal: Signal) -> Option<&ConsumerRef> {
        match signal {
            Signal::Traces => self.traces.as_ref(),
            Signal::Metrics => self.metrics.as_ref(),
            Signal::Logs => self.logs.as_ref(),
        }
    }

    /// Sets the consumer for `signal`.
    pub fn set(&mut self, signal: Signal, c: ConsumerRef) {
        match signal {
            Signal::Traces => self.traces = Some(c),
            Signal::Metrics => self.metrics = Some(c),
            Signal::Logs => self.logs = Some(c),
        }
    }
}

/// A running receiver.
#[async_trait]
pub trait Receiver: Send + Sync {
    /// Binds and starts serving; data goes to `consumers`.
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError>;
    /// Stops taking new data and waits for in-flight requests to finish.
    async fn shutdown(&mut self);
}

/// A processor, connector or exporter node: a consumer with a lifecycle.
#[async_trait]
pub trait Node: Consumer {
    /// Starts background work (timers, workers, connections).
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// The input ended (a replay finished): emit what event time still holds (open windows).
    async fn end_of_input(&self) {}
    /// Flushes and stops; must finish by `deadline`. Returns items that could not be delivered.
    async fn shutdown(&self, deadline: Instant) -> u64;
}

/// Shared handle to a node.
pub type NodeRef = Arc<dyn Node>;

/// An extension (runs beside the pipelines).
#[async_trait]
pub trait Extension: Send + Sync {
    /// Starts it; `status` tells whether every pipeline is running.
    async fn start(&mut self, status: StatusHandle) -> Result<(), ComponentError>;
    /// Stops it.
    async fn shutdown(&mut self);
}

/// Builds receivers of one type.
pub trait ReceiverFactory: Send + Sync {
    /// The type name used in configuration.
    fn type_name(&self) -> &'static str;
    /// Signals this receiver can produce.
    fn signals(&self) -> &'static [Signal];
    /// Parses and checks the settings into the factory's typed config, building nothing.
    /// A factory implements `parse` and `build` (or, the older way, `validate` and `create`).
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate(cfg), cfg)
    }
    /// Checks the settings without building anything (`parse`, result dropped).
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse(cfg).map(|_| ())
    }
    /// Valid settings that cannot do what they seem to, located by path: `validate` and start-up
    /// print them without failing (default: none).
    fn warnings(&self, _cfg: &serde_json::Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Builds a receiver from settings `parse` returned.
    fn build(&self, ctx: CreateContext, parsed: &Parsed) -> Result<Box<dyn Receiver>, ComponentError> {
        self.create(ctx, typed::<serde_json::Value>(parsed)?)
    }
    /// Builds a receiver from raw settings (`parse`, then `build`).
    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value) -> Result<Box<dyn Receiver>, ComponentError> {
        self.build(ctx, &self.parse(cfg)?)
    }
}

/// Builds processors of one type.
pub trait ProcessorFactory: Send + Sync {
    /// The type name used in configuration.
    fn type_name(&self) -> &'static str;
    /// Signals this processor handles.
    fn signals(&self) -> &'static [Signal];
    /// Parses and checks the settings into the factory's typed config, building nothing.
    /// A factory implements `parse` and `build` (or, the older way, `validate` and `create`);
    /// an Arrow processor's `parse` is its [`ArrowProcessorFactory::parse_arrow`].
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate(cfg), cfg)
    }
    /// Checks the settings without building anything (`parse`, result dropped).
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse(cfg).map(|_| ())
    }
    /// Valid settings that cannot do what they seem to, located by path: `validate` and start-up
    /// print them without failing (default: none).
    fn warnings(&self, _cfg: &serde_json::Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Builds one processor instance for one pipeline, feeding `next`, from settings `parse` returned.
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        self.create(ctx, typed::<serde_json::Value>(parsed)?, signal, next)
    }
    /// Builds one processor instance from raw settings (`parse`, then `build`).
    fn create(
        &self,
        ctx: CreateContext,
        cfg: &serde_json::Value,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        self.build(ctx, &self.parse(cfg)?, signal, next)
    }
    /// The Arrow side of an Arrow processor: adjacent Arrow processors of a pipeline run in one
    /// stage that converts each batch once. `None` for processors that work on OTLP.
    fn arrow(&self) -> Option<&dyn ArrowProcessorFactory> {
        None
    }
}

/// Builds exporters of one type.
pub trait ExporterFactory: Send + Sync {
    /// The type name used in configuration.
    fn type_name(&self) -> &'static str;
    /// Signals this exporter sends.
    fn signals(&self) -> &'static [Signal];
    /// Parses and checks the settings into the factory's typed config, building nothing.
    /// A factory implements `parse` and `build` (or, the older way, `validate` and `create`).
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate(cfg), cfg)
    }
    /// Checks the settings without building anything (`parse`, result dropped).
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse(cfg).map(|_| ())
    }
    /// Valid settings that cannot do what they seem to, located by path: `validate` and start-up
    /// print them without failing (default: none).
    fn warnings(&self, _cfg: &serde_json::Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Builds one exporter instance for one signal (shared by all pipelines of that signal),
    /// from settings `parse` returned.
    fn build(&self, ctx: CreateContext, parsed: &Parsed, signal: Signal) -> Result<NodeRef, ComponentError> {
        self.create(ctx, typed::<serde_json::Value>(parsed)?, signal)
    }
    /// Builds one exporter instance from raw settings (`parse`, then `build`).
    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        self.build(ctx, &self.parse(cfg)?, signal)
    }
}

/// Builds connectors of one type.
pub trait ConnectorFactory: Send + Sync {
    /// The type name used in configuration.
    fn type_name(&self) -> &'static str;
    /// (input signal, output signal) pairs this connector supports.
    fn signal_pairs(&self) -> &'static [(Signal, Signal)];
    /// Parses and checks the settings into the factory's typed config, building nothing.
    /// A factory implements `parse` and `build` (or, the older way, `validate` and `create`).
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate(cfg), cfg)
    }
    /// Checks the settings without building anything (`parse`, result dropped).
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse(cfg).map(|_| ())
    }
    /// Valid settings that cannot do what they seem to, located by path: `validate` and start-up
    /// print them without failing (default: none).
    fn warnings(&self, _cfg: &serde_json::Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Builds one instance that takes `from` data and feeds `next` with `to` data, from
    /// settings `parse` returned.
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &Parsed,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        self.create(ctx, typed::<serde_json::Value>(parsed)?, from, to, next)
    }
    /// Builds one instance from raw settings (`parse`, then `build`).
    fn create(
        &self,
        ctx: CreateContext,
        cfg: &serde_json::Value,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        self.build(ctx, &self.parse(cfg)?, from, to, next)
    }
}

/// Builds extensions of one type.
pub trait ExtensionFactory: Send + Sync {
    /// The type name used in configuration.
    fn type_name(&self) -> &'static str;
    /// Parses and checks the settings into the factory's typed config, building nothing.
    /// A factory implements `parse` and `build` (or, the older way, `validate` and `create`).
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        parsed_raw(self.validate(cfg), cfg)
    }
    /// Checks the settings without building anything (`parse`, result dropped).
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        self.parse(cfg).map(|_| ())
    }
    /// Builds an extension from settings `parse` returned.
    fn build(&self, ctx: CreateContext, parsed: &Parsed) -> Result<Box<dyn Extension>, ComponentError> {
        self.create(ctx, typed::<serde_json::Value>(parsed)?)
    }
    /// Builds an extension from raw settings (`parse`, then `build`).
    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value) -> Result<Box<dyn Extension>, ComponentError> {
        self.build(ctx, &self.parse(cfg)?)
    }
}
