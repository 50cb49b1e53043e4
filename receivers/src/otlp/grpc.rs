//! OTLP/gRPC: one tonic service per signal that has a consumer.
//!
//! The services are written here rather than taken from opentelemetry-proto's generated
//! servers because those decode with `tonic_prost::ProstCodec`, which answers malformed
//! protobuf with INTERNAL (OTLP senders must see INVALID_ARGUMENT, not retryable), and
//! because valid requests travel on as bytes, undecoded.

use super::config::GrpcConfig;
use super::ingest::{ExportError, Gate, Logs, Metrics, OtlpSignal, Sink, Traces};
use bytes::{Buf, Bytes};
use inferwatch_core::auth::ClientInfo;
use inferwatch_core::consumer::RefuseReason;
use inferwatch_core::server::inflate::{self, InflateBudget, Reservation};
use inferwatch_core::server::{Listener, PeerInfo};
use parking_lot::Mutex;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Converts a pipeline refusal or rejection into the gRPC status OTLP prescribes.
pub(crate) fn export_status(e: ExportError) -> Status {
    match e {
        ExportError::Refused { reason, retry_after, message } => {
            let code = match reason {
                RefuseReason::MemoryLimit => Code::ResourceExhausted,
                RefuseReason::QueueFull
                | RefuseReason::ShuttingDown
                | RefuseReason::Downstream
                | RefuseReason::PartiallyAccepted => Code::Unavailable,
            };
            // RetryInfo makes RESOURCE_EXHAUSTED retryable for OTLP senders and sets the delay.
            Status::with_error_details(code, message, ErrorDetails::with_retry_info(Some(retry_after)))
        }
        ExportError::Malformed(m) | ExportError::Permanent(m) => Status::invalid_argument(m),
    }
}

/// Codec that hands the request message over as bytes (decoded, or passed through, by the
/// sink, so that malformed protobuf is INVALID_ARGUMENT) and encodes the typed response.
struct OtlpCodec<S>(PhantomData<fn() -> S>);

impl<S: OtlpSignal> Codec for OtlpCodec<S> {
    type Encode = S::Response;
    type Decode = Bytes;
    type Encoder = ProtoEncoder<S::Response>;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProtoEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

/// Encodes a response message.
struct ProtoEncoder<T>(PhantomData<fn(T)>);

impl<T: prost::Message> Encoder for ProtoEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(format!("encoding the response failed: {e}")))
    }
}

/// Takes the (decompressed) request message as it is.
struct BytesDecoder;

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The OTLP `Export` service of one signal.
pub(crate) struct ExportService<S> {
    sink: Sink,
    max_decoding_message_size: usize,
    gate: Gate,
    budget: Arc<InflateBudget>,
    _signal: PhantomData<fn() -> S>,
}

impl<S> Clone for ExportService<S> {
    fn clone(&self) -> Self {
        ExportService {
            sink: self.sink.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
            gate: self.gate.clone(),
            budget: self.budget.clone(),
            _signal: PhantomData,
        }
    }
}

impl<S: OtlpSignal> ExportService<S> {
    /// A service feeding `sink`, accepting messages up to `max_decoding_message_size` bytes,
    /// admitting calls through `gate`.
    pub(crate) fn new(sink: Sink, max_decoding_message_size: usize, gate: Gate) -> Self {
        ExportService { sink, max_decoding_message_size, gate, budget: inflate::global(), _signal: PhantomData }
    }
}

impl<S: OtlpSignal> NamedService for ExportService<S> {
    const NAME: &'static str = S::GRPC_SERVICE;
}

/// Rewrites INTERNAL answers that tonic gives for malformed request framing (bad gzip,
/// truncated message) into INVALID_ARGUMENT: the request is at fault and must not be retried.
fn client_fault_as_invalid_argument(resp: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    let Some(status) = Status::from_header_map(resp.headers()) else { return resp };
    let m = status.message();
    let client_fault = status.code() == Code::Internal
        && (m.starts_with("Error decompressing")
            || m.starts_with("Unexpected EOF")
            || m.starts_with("Missing request message")
            || m.starts_with("protocol error"));
    if client_fault {
        return Status::invalid_argument(format!("malformed request: {m}")).into_http();
    }
    // tonic reports a message over max_recv_msg_size_mib as OUT_OF_RANGE; gRPC's status table
    // (and otelcol) say RESOURCE_EXHAUSTED.
    if status.code() == Code::OutOfRange && m.contains("message length too large") {
        return Status::resource_exhausted(format!("request too large: {m}")).into_http();
    }
    resp
}

impl<S: OtlpSignal> tower::Service<http::Request<tonic::body::Body>> for ExportService<S> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let is_export =
            req.uri().path().strip_prefix('/').and_then(|p| p.strip_prefix(S::GRPC_SERVICE)) == Some("/Export");
        if !is_export {
            let method = req.uri().path().to_string();
            return Box::pin(async move { Ok(Status::unimplemented(format!("unknown method {method}")).into_http()) });
        }
        let peer = req.extensions().get::<PeerInfo>().copied();
        let info = match self.gate.admit(req.headers(), peer) {
            Ok(info) => info,
            Err(e) => return Box::pin(async move { Ok(Status::unauthenticated(e.to_string()).into_http()) }),
        };
        let mut accept = EnabledCompressionEncodings::default();
        accept.enable(CompressionEncoding::Gzip);
        let max = self.max_decoding_message_size;
        let mut grpc = tonic::server::Grpc::new(OtlpCodec::<S>(PhantomData))
            .apply_compression_config(accept, accept)
            .apply_max_message_size_config(Some(max), None);
        // A compressed message may inflate to `max`: hold that much of the process-wide budget
        // while tonic inflates it (tonic stops at `max`), then only what it decoded to.
        let compressed = req.headers().get("grpc-encoding").is_some_and(|v| v.as_bytes() != b"identity");
        let budget = self.budget.clone();
        let sink = self.sink.clone();
        Box::pin(async move {
            let mut reservation = budget.reservation();
            if compressed && let Err(e) = reservation.grow(max, inflate::DEFAULT_BUDGET_WAIT).await {
                let details = ErrorDetails::with_retry_info(Some(std::time::Duration::from_secs(1)));
                return Ok(Status::with_error_details(Code::ResourceExhausted, e.to_string(), details).into_http());
            }
            let reservation = Arc::new(Mutex::new(Some(reservation)));
            let method = ExportCall::<S> { sink, reservation: reservation.clone(), _signal: PhantomData };
            let resp = ClientInfo::scope(info, grpc.unary(method, req)).await;
            drop(reservation);
            Ok(client_fault_as_invalid_argument(resp))
        })
    }
}

/// One decoded `Export` call.
struct ExportCall<S> {
    sink: Sink,
    /// The budget held for this call's decompression.
    reservation: Arc<Mutex<Option<Reservation>>>,
    _signal: PhantomData<fn() -> S>,
}

impl<S: OtlpSignal> tonic::server::UnaryService<Bytes> for ExportCall<S> {
    type Response = S::Response;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<S::Response>, Status>> + Send>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        let sink = self.sink.clone();
        let body = req.into_inner();
        if let Some(r) = self.reservation.lock().as_mut() {
            r.shrink_to(body.len());
        }
        Box::pin(async move { sink.export_protobuf::<S>(body).await.map(tonic::Response::new).map_err(export_status) })
    }
}

/// The per-signal sinks of the gRPC transport; `None` where the signal has no consumer.
pub(crate) struct GrpcSinks {
    /// Traces sink.
    pub traces: Option<Sink>,
    /// Metrics sink.
    pub metrics: Option<Sink>,
    /// Logs sink.
    pub logs: Option<Sink>,
}

/// Serves OTLP/gRPC on `listener` until `shutdown`, then drains in-flight calls.
///
/// The calls go through the same hardened serve loop as every HTTP listener (HTTP/2 only):
/// connection cap, idle and first-request timeouts, `max_concurrent_streams` (default 100,
/// advertised in the SETTINGS frame), keep-alive pings and `max_connection_age`.
pub(crate) async fn serve(
    listener: Listener,
    cfg: GrpcConfig,
    sinks: GrpcSinks,
    gate: Gate,
    shutdown: CancellationToken,
) {
    let max = cfg.max_recv_msg_size();
    // Only signals with a consumer get a service; the others answer UNIMPLEMENTED, as in otelcol.
    let mut routes = Routes::builder();
    if let Some(s) = sinks.traces {
        routes.add_service(ExportService::<Traces>::new(s, max, gate.clone()));
    }
    if let Some(s) = sinks.metrics {
        routes.add_service(ExportService::<Metrics>::new(s, max, gate.clone()));
    }
    if let Some(s) = sinks.logs {
        routes.add_service(ExportService::<Logs>::new(s, max, gate));
    }
    inferwatch_core::server::serve(listener, routes.routes().into_axum_router(), shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn refusals_carry_retry_info() {
        let s = export_status(ExportError::Refused {
            reason: RefuseReason::MemoryLimit,
            retry_after: Duration::from_secs(3),
            message: "full".into(),
        });
        assert_eq!(s.code(), Code::ResourceExhausted);
        let ri = s.get_details_retry_info().unwrap();
        assert_eq!(ri.retry_delay, Some(Duration::from_secs(3)));
        let s = export_status(ExportError::Refused {
            reason: RefuseReason::QueueFull,
            retry_after: Duration::from_secs(1),
            message: "q".into(),
        });
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.get_details_retry_info().is_some());
        assert_eq!(export_status(ExportError::Permanent("bad".into())).code(), Code::InvalidArgument);
    }
}
