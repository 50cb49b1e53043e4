//! Connector `forward`: passes data from the pipelines that export to it to the pipelines that receive from it.

use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, ConnectorFactory, CreateContext, FieldError, Node, NodeRef};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;

/// `forward` takes no settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {}

/// Factory of `forward`.
pub struct ForwardFactory;

impl ConnectorFactory for ForwardFactory {
    fn type_name(&self) -> &'static str {
        "forward"
    }
    fn signal_pairs(&self) -> &'static [(Signal, Signal)] {
        &[(Signal::Traces, Signal::Traces), (Signal::Metrics, Signal::Metrics), (Signal::Logs, Signal::Logs)]
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(inferwatch_core::component::parse_config::<ForwardConfig>(cfg)?))
    }
    fn build(
        &self,
        _ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        inferwatch_core::component::typed::<ForwardConfig>(parsed)?;
        if from != to {
            return Err(ComponentError::Start(format!("forward cannot connect {from} to {to}")));
        }
        Ok(Arc::new(Forward { next }))
    }
}

/// The running connector.
pub struct Forward {
    next: ConsumerRef,
}

#[async_trait]
impl Consumer for Forward {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.next.consume(data).await
    }
}

#[async_trait]
impl Node for Forward {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
