//! What both transports share: the per-signal OTLP types, item checks, and handing data to the pipeline.

use inferwatch_core::consumer::{ConsumeError, ConsumerRef, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::ReceiverMetrics;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Delay suggested to senders when a refusing stage gives none.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Items removed from a request because they can never be accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// How many items were removed.
    pub count: usize,
    /// Why (the first problem found, with the total).
    pub message: String,
}

/// The OTLP types and rules of one signal.
pub(crate) trait OtlpSignal: Send + Sync + 'static {
    /// The export request message.
    type Request: prost::Message + Default + DeserializeOwned + Send + 'static;
    /// The export response message.
    type Response: prost::Message + Default + PartialEq + Serialize + Send + 'static;
    /// The signal carried.
    const SIGNAL: Signal;
    /// Fully qualified gRPC service name.
    const GRPC_SERVICE: &'static str;

    /// Wraps a request as a pipeline payload.
    fn into_payload(req: Self::Request) -> Payload;
    /// Number of resource entries (zero means there is nothing to forward).
    fn resource_count(req: &Self::Request) -> usize;
    /// Removes invalid items and reports them.
    fn sanitize(_req: &mut Self::Request) -> Option<Rejected> {
        None
    }
    /// Builds the response, with a partial success when items were rejected.
    fn response(rejected: Option<Rejected>) -> Self::Response;
    /// Reports values of an OTLP/JSON body that the typed decoding dropped.
    fn check_json(_v: &serde_json::Value, _req: &Self::Request) -> Result<(), String> {
        Ok(())
    }
}

/// Traces: `TraceService`.
pub(crate) enum Traces {}
/// Metrics: `MetricsService`.
pub(crate) enum Metrics {}
/// Logs: `LogsService`.
pub(crate) enum Logs {}

/// Clamps a count into the `int64` of a partial success.
fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl OtlpSignal for Traces {
    type Request = ExportTraceServiceRequest;
    type Response = ExportTraceServiceResponse;
    const SIGNAL: Signal = Signal::Traces;
    const GRPC_SERVICE: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";

    fn into_payload(req: Self::Request) -> Payload {
        Payload::Traces(req)
    }

    fn resource_count(req: &Self::Request) -> usize {
        req.resource_spans.len()
    }

    fn sanitize(req: &mut Self::Request) -> Option<Rejected> {
        let mut count = 0usize;
        let mut first: Option<String> = None;
        // Containers emptied by the check are dropped; ones that came empty are kept as sent.
        req.resource_spans.retain_mut(|rs| {
            let had_scopes = !rs.scope_spans.is_empty();
            rs.scope_spans.retain_mut(|ss| {
                let had_spans = !ss.spans.is_empty();
                ss.spans.retain(|s| match span_problem(s) {
                    None => true,
                    Some(why) => {
                        count += 1;
                        first.get_or_insert(why);
                        false
                    }
                });
                !(had_spans && ss.spans.is_empty())
            });
            !(had_scopes && rs.scope_spans.is_empty())
        });
        let why = first?;
        Some(Rejected { count, message: format!("rejected {count} span(s) with invalid ids; first: {why}") })
    }

    fn response(rejected: Option<Rejected>) -> Self::Response {
        ExportTraceServiceResponse {
            partial_success: rejected
                .map(|r| ExportTracePartialSuccess { rejected_spans: as_i64(r.count), error_message: r.message }),
        }
    }
}

/// Why a span's ids are invalid, if they are.
fn span_problem(s: &Span) -> Option<String> {
    let name = &s.name;
    if s.trace_id.len() != 16 {
        return Some(format!("span {name:?}: trace_id must be 16 bytes, got {}", s.trace_id.len()));
    }
    if s.trace_id.iter().all(|b| *b == 0) {
        return Some(format!("span {name:?}: trace_id must not be all zeros"));
    }
    if s.span_id.len() != 8 {
        return Some(format!("span {name:?}: span_id must be 8 bytes, got {}", s.span_id.len()));
    }
    if s.span_id.iter().all(|b| *b == 0) {
        return Some(format!("span {name:?}: span_id must not be all zeros"));
    }
    if !s.parent_span_id.is_empty() && s.parent_span_id.len() != 8 {
        return Some(format!("span {name:?}: parent_span_id must be empty or 8 bytes, got {}", s.parent_span_id.len()));
    }
    None
}

impl OtlpSignal for Metrics {
    type Request = ExportMetricsServiceRequest;
    type Response = ExportMetricsServiceResponse;
    const SIGNAL: Signal = Signal::Metrics;
    const GRPC_SERVICE: &'static str = "opentelemetry.proto.collector.metrics.v1.MetricsService";

    fn into_payload(req: Self::Request) -> Payload {
        Payload::Metrics(req)
    }

    fn resource_count(req: &Self::Request) -> usize {
        req.resource_metrics.len()
    }

    fn check_json(v: &serde_json::Value, req: &Self::Request) -> Result<(), String> {
        super::json::check_metrics(v, req)
    }

    fn response(rejected: Option<Rejected>) -> Self::Response {
        ExportMetricsServiceResponse {
            partial_success: rejected.map(|r| ExportMetricsPartialSuccess {
                rejected_data_points: as_i64(r.count),
                error_message: r.message,
            }),
        }
    }
}

impl OtlpSignal for Logs {
    type Request = ExportLogsServiceRequest;
    type Response = ExportLogsServiceResponse;
    const SIGNAL: Signal = Signal::Logs;
    const GRPC_SERVICE: &'static str = "opentelemetry.proto.collector.logs.v1.LogsService";

    fn into_payload(req: Self::Request) -> Payload {
        Payload::Logs(req)
    }

    fn resource_count(req: &Self::Request) -> usize {
        req.resource_logs.len()
    }

    fn response(rejected: Option<Rejected>) -> Self::Response {
        ExportLogsServiceResponse {
            partial_success: rejected
                .map(|r| ExportLogsPartialSuccess { rejected_log_records: as_i64(r.count), error_message: r.message }),
        }
    }
}

/// Why an export was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ExportError {
    /// The pipeline cannot take the data now; the sender should retry after `retry_after`.
    #[error("{message}")]
    Refused {
        /// The cause.
        reason: RefuseReason,
        /// Suggested delay before retrying.
        retry_after: Duration,
        /// Detail for the sender.
        message: String,
    },
    /// The data can never be accepted.
    #[error("{0}")]
    Permanent(String),
}

impl From<ConsumeError> for ExportError {
    fn from(e: ConsumeError) -> Self {
        match e {
            ConsumeError::Refused { reason, retry_after, message } => ExportError::Refused {
                reason,
                retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
                message: format!("data refused ({reason:?}): {message}"),
            },
            ConsumeError::Permanent(m) => ExportError::Permanent(m),
        }
    }
}

/// Where one signal's data goes from one transport, with that transport's counters.
#[derive(Clone)]
pub(crate) struct Sink {
    consumer: ConsumerRef,
    metrics: ReceiverMetrics,
    transport: &'static str,
}

impl Sink {
    /// A sink feeding `consumer` and counting into `metrics`.
    pub(crate) fn new(consumer: ConsumerRef, metrics: ReceiverMetrics, transport: &'static str) -> Self {
        Sink { consumer, metrics, transport }
    }

    /// Checks `req`, forwards its valid items and answers as OTLP requires.
    pub(crate) async fn export<S: OtlpSignal>(&self, mut req: S::Request) -> Result<S::Response, ExportError> {
        let rejected = S::sanitize(&mut req);
        if let Some(r) = &rejected {
            self.metrics.refused(S::SIGNAL, r.count);
            tracing::debug!(transport = self.transport, signal = %S::SIGNAL, rejected = r.count, reason = %r.message,
                "otlp receiver rejected invalid items");
        }
        if S::resource_count(&req) > 0 {
            let payload = S::into_payload(req);
            let n = payload.item_count();
            match self.consumer.consume(payload).await {
                Ok(()) => self.metrics.accepted(S::SIGNAL, n),
                Err(e) => {
                    self.metrics.refused(S::SIGNAL, n);
                    tracing::debug!(transport = self.transport, signal = %S::SIGNAL, items = n, error = %e,
                        "otlp receiver could not push data into the pipeline");
                    return Err(e.into());
                }
            }
        }
        Ok(S::response(rejected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn span(name: &str, trace_len: usize, span_len: usize) -> Span {
        Span { name: name.into(), trace_id: vec![1; trace_len], span_id: vec![2; span_len], ..Default::default() }
    }

    #[test]
    fn invalid_spans_are_removed_and_empty_containers_pruned() {
        let mut req = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![
                        ScopeSpans { spans: vec![span("ok", 16, 8), span("short", 5, 8)], ..Default::default() },
                        ScopeSpans { spans: vec![span("bad-span-id", 16, 3)], ..Default::default() },
                        ScopeSpans::default(),
                    ],
                    ..Default::default()
                },
                ResourceSpans {
                    scope_spans: vec![ScopeSpans { spans: vec![span("zero", 0, 8)], ..Default::default() }],
                    ..Default::default()
                },
            ],
        };
        let r = Traces::sanitize(&mut req).unwrap();
        assert_eq!(r.count, 3);
        assert!(r.message.contains("\"short\": trace_id must be 16 bytes, got 5"), "{}", r.message);
        assert_eq!(req.resource_spans.len(), 1);
        // The originally empty scope stays; the emptied one is gone.
        assert_eq!(req.resource_spans[0].scope_spans.len(), 2);
        assert_eq!(Payload::Traces(req).item_count(), 1);
    }

    #[test]
    fn valid_spans_give_no_partial_success() {
        let mut req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans { spans: vec![span("ok", 16, 8)], ..Default::default() }],
                ..Default::default()
            }],
        };
        assert_eq!(Traces::sanitize(&mut req), None);
        assert_eq!(Traces::response(None).partial_success, None);
    }
}
