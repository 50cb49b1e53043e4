//! What both transports share: the per-signal OTLP types, item checks, and handing data to the pipeline.

use bytes::Bytes;
use inferwatch_core::auth::{AuthError, ClientInfo, ServerAuth};
use inferwatch_core::consumer::{ConsumeError, ConsumerRef, RefuseReason};
use inferwatch_core::pdata::wire::WireError;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::server::PeerInfo;
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
use opentelemetry_proto::tonic::metrics::v1::Exemplar;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use prometheus_client::metrics::counter::Counter;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
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
    /// Removes invalid items and reports them; clears or drops invalid optional ids.
    fn sanitize(req: &mut Self::Request) -> Option<Rejected>;
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
                ss.spans.retain_mut(|s| match span_problem(s) {
                    None => {
                        drop_invalid_links(s);
                        true
                    }
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
    if s.span_id.len() != 8 {
        return Some(format!("span {name:?}: span_id must be 8 bytes, got {}", s.span_id.len()));
    }
    if !s.parent_span_id.is_empty() && s.parent_span_id.len() != 8 {
        return Some(format!("span {name:?}: parent_span_id must be empty or 8 bytes, got {}", s.parent_span_id.len()));
    }
    None
}

/// Whether an optional id is absent or of its exact length.
fn optional_id_ok(id: &[u8], len: usize) -> bool {
    id.is_empty() || id.len() == len
}

/// Drops links whose ids have invalid lengths (they point nowhere), counting them as dropped.
fn drop_invalid_links(s: &mut Span) {
    let before = s.links.len();
    s.links.retain(|l| l.trace_id.len() == 16 && l.span_id.len() == 8);
    let dropped = u32::try_from(before - s.links.len()).unwrap_or(u32::MAX);
    s.dropped_links_count = s.dropped_links_count.saturating_add(dropped);
}

/// Clears exemplar ids of invalid lengths: the exemplar then has no trace context, as OTLP says.
fn clear_invalid_exemplar_ids(exemplars: &mut [Exemplar]) {
    for e in exemplars {
        if !optional_id_ok(&e.trace_id, 16) || !optional_id_ok(&e.span_id, 8) {
            e.trace_id.clear();
            e.span_id.clear();
        }
    }
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

    fn sanitize(req: &mut Self::Request) -> Option<Rejected> {
        let metrics =
            req.resource_metrics.iter_mut().flat_map(|r| r.scope_metrics.iter_mut()).flat_map(|s| s.metrics.iter_mut());
        for m in metrics {
            match &mut m.data {
                Some(Data::Gauge(g)) => {
                    g.data_points.iter_mut().for_each(|p| clear_invalid_exemplar_ids(&mut p.exemplars))
                }
                Some(Data::Sum(g)) => {
                    g.data_points.iter_mut().for_each(|p| clear_invalid_exemplar_ids(&mut p.exemplars))
                }
                Some(Data::Histogram(g)) => {
                    g.data_points.iter_mut().for_each(|p| clear_invalid_exemplar_ids(&mut p.exemplars))
                }
                Some(Data::ExponentialHistogram(g)) => {
                    g.data_points.iter_mut().for_each(|p| clear_invalid_exemplar_ids(&mut p.exemplars))
                }
                Some(Data::Summary(_)) | None => {}
            }
        }
        None
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

    fn sanitize(req: &mut Self::Request) -> Option<Rejected> {
        // Invalid ids mean "not associated with a trace" for a log record (OTLP); clear them.
        let records =
            req.resource_logs.iter_mut().flat_map(|r| r.scope_logs.iter_mut()).flat_map(|s| s.log_records.iter_mut());
        for l in records {
            if !optional_id_ok(&l.trace_id, 16) || !optional_id_ok(&l.span_id, 8) {
                l.trace_id.clear();
                l.span_id.clear();
            }
        }
        None
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
    /// The request could not be decoded.
    #[error("{0}")]
    Malformed(String),
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

/// Who may send, and what of the request reaches the pipeline: the authenticator (if any)
/// and `include_metadata`, shared by both transports.
#[derive(Clone)]
pub(crate) struct Gate {
    auth: Option<Arc<dyn ServerAuth>>,
    include_metadata: bool,
    failures: Counter,
    transport: &'static str,
}

impl Gate {
    /// A gate checking with `auth`, counting refusals into `failures`.
    pub(crate) fn new(
        auth: Option<Arc<dyn ServerAuth>>,
        include_metadata: bool,
        failures: Counter,
        transport: &'static str,
    ) -> Self {
        Gate { auth, include_metadata, failures, transport }
    }

    /// Authenticates a request by its headers (gRPC metadata are HTTP headers) and builds the
    /// `ClientInfo` the pipeline call runs with. The credential itself is never logged.
    pub(crate) fn admit(
        &self,
        headers: &http::HeaderMap,
        peer: Option<PeerInfo>,
    ) -> Result<Arc<ClientInfo>, AuthError> {
        let auth = match &self.auth {
            None => None,
            Some(a) => match a.authenticate(headers) {
                Ok(info) => Some(info),
                Err(e) => {
                    self.failures.inc();
                    match &e {
                        AuthError::Unavailable(_) => {
                            tracing::warn!(transport = self.transport, peer = ?peer.map(|p| p.addr),
                            error = %e, "otlp receiver cannot authenticate requests")
                        }
                        _ => tracing::debug!(transport = self.transport, peer = ?peer.map(|p| p.addr), error = %e,
                            "otlp receiver refused an unauthenticated request"),
                    }
                    return Err(e);
                }
            },
        };
        let metadata = if self.include_metadata { headers.clone() } else { http::HeaderMap::new() };
        Ok(Arc::new(ClientInfo { addr: peer.map(|p| p.addr), auth, metadata }))
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

    /// Takes a protobuf export request: valid bytes travel undecoded ([`Encoded`]); requests
    /// with invalid ids, or that the wire check refuses, are decoded and handled item by item.
    pub(crate) async fn export_protobuf<S: OtlpSignal>(&self, body: Bytes) -> Result<S::Response, ExportError> {
        match Encoded::new(S::SIGNAL, body.clone()) {
            Ok(enc) => {
                if enc.byte_len() > 0 {
                    self.forward(S::SIGNAL, Payload::Encoded(enc)).await?;
                }
                Ok(S::response(None))
            }
            // Over an input limit (attribute count): refused whole, with the reason.
            Err(WireError::Limit(why)) => Err(ExportError::Malformed(format!("request refused: {why}"))),
            // prost decides (and words the error) whenever the wire check is not satisfied.
            Err(_) => {
                let req =
                    S::Request::decode(body).map_err(|e| ExportError::Malformed(format!("invalid protobuf: {e}")))?;
                self.export::<S>(req).await
            }
        }
    }

    /// Checks a decoded request, forwards its valid items and answers as OTLP requires.
    pub(crate) async fn export<S: OtlpSignal>(&self, mut req: S::Request) -> Result<S::Response, ExportError> {
        let rejected = S::sanitize(&mut req);
        if let Some(r) = &rejected {
            self.metrics.refused(S::SIGNAL, r.count);
            tracing::debug!(transport = self.transport, signal = %S::SIGNAL, rejected = r.count, reason = %r.message,
                "otlp receiver rejected invalid items");
        }
        if S::resource_count(&req) > 0 {
            self.forward(S::SIGNAL, S::into_payload(req)).await?;
        }
        Ok(S::response(rejected))
    }

    /// Hands a payload to the pipeline and counts its items as accepted or refused.
    async fn forward(&self, signal: Signal, payload: Payload) -> Result<(), ExportError> {
        let n = payload.item_count();
        match self.consumer.consume(payload).await {
            Ok(()) => {
                self.metrics.accepted(signal, n);
                Ok(())
            }
            Err(e) => {
                self.metrics.refused(signal, n);
                tracing::debug!(transport = self.transport, %signal, items = n, error = %e,
                    "otlp receiver could not push data into the pipeline");
                Err(e.into())
            }
        }
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
    fn exemplar_ids_of_invalid_length_are_cleared() {
        use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics};
        let ex = |t: usize, s: usize| Exemplar { trace_id: vec![1; t], span_id: vec![2; s], ..Default::default() };
        let mut req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                exemplars: vec![ex(16, 8), ex(3, 8), ex(0, 0)],
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        assert_eq!(Metrics::sanitize(&mut req), None);
        let Some(Data::Gauge(g)) = &req.resource_metrics[0].scope_metrics[0].metrics[0].data else { panic!() };
        let lens: Vec<_> = g.data_points[0].exemplars.iter().map(|e| (e.trace_id.len(), e.span_id.len())).collect();
        assert_eq!(lens, vec![(16, 8), (0, 0), (0, 0)]);
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
