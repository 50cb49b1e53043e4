//! One OTLP/gRPC export call of a built request, and the status mapping.

use super::config::{OtlpConfig, metadata};
use super::encode::GrpcRequest;
use crate::common;
use crate::tls;
use async_trait::async_trait;
use inferwatch_core::auth::ClientAuth;
use inferwatch_core::component::{ComponentError, FieldError};
use inferwatch_core::exporterhelper::{RequestSender, SendError};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{Compression, TlsClientSettings};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// One export attempt over a lazily connected tonic channel.
pub struct GrpcSender {
    pub(super) name: String,
    pub(super) endpoint: tonic::transport::Endpoint,
    pub(super) channel: OnceLock<Channel>,
    pub(super) metadata: MetadataMap,
    pub(super) auth: Option<Arc<dyn ClientAuth>>,
    /// gzip level when compressing.
    pub(super) gzip: Option<u32>,
    pub(super) timeout: Option<Duration>,
}

impl GrpcSender {
    /// Builds the sender, loading TLS files; connects only when first used.
    pub fn new(name: String, c: &OtlpConfig) -> Result<Self, FieldError> {
        c.check()?;
        let ep = c.endpoint()?;
        let use_tls = c.use_tls();
        if use_tls && c.client.tls.insecure {
            tracing::warn!(exporter = %name, "the endpoint is https://, so TLS is used although tls.insecure is true");
        }
        if c.balancer_name.as_deref() == Some("round_robin") {
            tracing::warn!(exporter = %name, "balancer_name round_robin is not supported; one connection is used");
        }
        let scheme = if use_tls { "https" } else { "http" };
        let uri = format!("{scheme}://{}", ep.authority);
        let timeout = c.exporter.timeout();
        let mut endpoint = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| FieldError::at("endpoint", format!("invalid endpoint: {e}")))?
            .tcp_nodelay(true)
            .user_agent(common::USER_AGENT)
            .map_err(|e| FieldError::at("endpoint", format!("invalid user agent: {e}")))?
            .keep_alive_while_idle(c.keepalive.permit_without_stream);
        if let Some(t) = timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        if let Some(t) = common::non_zero(c.keepalive.time.0) {
            endpoint = endpoint.http2_keep_alive_interval(t);
            if let Some(to) = common::non_zero(c.keepalive.timeout.0) {
                endpoint = endpoint.keep_alive_timeout(to);
            }
        }
        if use_tls {
            endpoint = grpc_tls(endpoint, &c.client.tls)?;
        }
        Ok(GrpcSender {
            name,
            endpoint,
            channel: OnceLock::new(),
            metadata: metadata(&c.client.headers)?,
            auth: None,
            gzip: (c.client.compression == Compression::Gzip).then_some(c.client.compression_params.level),
            timeout,
        })
    }

    /// Sets the client authenticator (resolved from the host's extensions; the `loadbalancing`
    /// exporter builds one sender per backend).
    pub fn set_auth(&mut self, auth: Option<Arc<dyn ClientAuth>>) {
        self.auth = auth;
    }

    fn channel(&self) -> Channel {
        self.channel.get_or_init(|| self.endpoint.connect_lazy()).clone()
    }

    /// One unary OTLP export call of a framed request.
    async fn export(&self, request: &GrpcRequest) -> Result<(), Status> {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let signal = request.signal;
        let mut req = http::Request::builder()
            .method(http::Method::POST)
            .uri(grpc_path(signal))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        if self.gzip.is_some() {
            req = req.header("grpc-encoding", "gzip");
        }
        if let Some(t) = self.timeout {
            req = req.header("grpc-timeout", grpc_timeout(t));
        }
        let mut req = req
            .body(tonic::body::Body::new(http_body_util::Full::new(request.frame.clone())))
            .map_err(|e| Status::internal(format!("cannot build the request: {e}")))?;
        req.headers_mut().extend(self.metadata.clone().into_headers());
        // Per call: a token file may have changed; an authenticator failure is UNAVAILABLE (retried).
        client_auth::apply_client_auth(self.auth.as_ref(), req.headers_mut())
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let call = async {
            let ch = self.channel().ready_oneshot().await.map_err(|e| transport_status(&e))?;
            let resp = ch.oneshot(req).await.map_err(|e| transport_status(&e))?;
            let (parts, body) = resp.into_parts();
            if parts.status != http::StatusCode::OK {
                return Err(http_status(parts.status));
            }
            // A trailers-only response carries the status in the headers.
            if let Some(st) = grpc_status(&parts.headers) {
                return if st.code() == Code::Ok { Ok(bytes::Bytes::new()) } else { Err(st) };
            }
            // Export responses are tiny; a larger body is not an OTLP server's.
            let collected = http_body_util::Limited::new(body, MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| Status::unavailable(format!("reading the response: {e}")))?;
            let trailers = collected.trailers().cloned().unwrap_or_default();
            match grpc_status(&trailers) {
                Some(st) if st.code() != Code::Ok => Err(st),
                Some(_) => Ok(collected.to_bytes()),
                None => Err(Status::internal("the gRPC response has no grpc-status")),
            }
        };
        let body = match self.timeout {
            Some(t) => tokio::time::timeout(t, call)
                .await
                .map_err(|_| Status::deadline_exceeded(format!("no answer within {t:?}")))??,
            None => call.await?,
        };
        let (rejected, message) = partial_success(signal, &body);
        common::log_partial_success(&self.name, signal, rejected, &message);
        Ok(())
    }
}

/// Largest export response body read.
pub(super) const MAX_RESPONSE: usize = 64 * 1024;

/// The `grpc-timeout` header value: at most 8 digits, as the gRPC spec requires.
pub(super) fn grpc_timeout(t: Duration) -> String {
    let ms = t.as_millis().max(1);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else if t.as_secs() < 100_000_000 {
        format!("{}S", t.as_secs())
    } else {
        format!("{}H", (t.as_secs() / 3600).min(99_999_999))
    }
}

/// The status of a response from its headers or trailers, never panicking on a malformed
/// `grpc-status-details-bin` (tonic's parser would).
pub(super) fn grpc_status(map: &http::HeaderMap) -> Option<Status> {
    use base64::Engine;
    map.get("grpc-status")?;
    let details_ok = match map.get("grpc-status-details-bin") {
        None => true,
        Some(v) => {
            let s = v.as_bytes();
            let trimmed = s.strip_suffix(b"==").or_else(|| s.strip_suffix(b"=")).unwrap_or(s);
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed).is_ok()
        }
    };
    if details_ok {
        return Status::from_header_map(map);
    }
    let mut clean = map.clone();
    clean.remove("grpc-status-details-bin");
    Status::from_header_map(&clean)
}

/// A non-200 HTTP answer to a gRPC call, mapped as the gRPC spec's HTTP-to-gRPC table says.
pub(super) fn http_status(code: http::StatusCode) -> Status {
    let msg = format!("HTTP status {code} from the gRPC server");
    match code.as_u16() {
        400 => Status::internal(msg),
        401 => Status::unauthenticated(msg),
        403 => Status::permission_denied(msg),
        404 => Status::unimplemented(msg),
        429 | 502 | 503 | 504 => Status::unavailable(msg),
        _ => Status::unknown(msg),
    }
}

/// The gRPC method path of a signal's Export call.
pub(super) fn grpc_path(signal: Signal) -> &'static str {
    match signal {
        Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    }
}

/// A connection-level failure: retryable, as grpc-go reports it.
pub(super) fn transport_status(e: &dyn std::error::Error) -> Status {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    Status::unavailable(s)
}

/// Reads the partial success of a framed export response (plain or gzip-compressed).
pub(super) fn partial_success(signal: Signal, body: &[u8]) -> (i64, String) {
    use prost::Message;
    use std::io::Read;
    let (Some(&flag), Some(len)) = (body.first(), body.get(1..5)) else { return (0, String::new()) };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let Some(raw) = body.get(5..5 + len) else { return (0, String::new()) };
    let mut unzipped = Vec::new();
    let msg: &[u8] = if flag == 1 {
        if flate2::read::GzDecoder::new(raw).take(MAX_RESPONSE as u64).read_to_end(&mut unzipped).is_err() {
            return (0, String::new());
        }
        &unzipped
    } else {
        raw
    };
    match signal {
        Signal::Traces => ExportTraceServiceResponse::decode(msg)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or((0, String::new()), |p| (p.rejected_spans, p.error_message)),
        Signal::Metrics => ExportMetricsServiceResponse::decode(msg)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or((0, String::new()), |p| (p.rejected_data_points, p.error_message)),
        Signal::Logs => ExportLogsServiceResponse::decode(msg)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or((0, String::new()), |p| (p.rejected_log_records, p.error_message)),
    }
}

/// Adds TLS to a tonic endpoint: the shared verifier, the client identity and the name override.
pub(super) fn grpc_tls(
    endpoint: tonic::transport::Endpoint,
    s: &TlsClientSettings,
) -> Result<tonic::transport::Endpoint, FieldError> {
    let verifier = tls::server_verifier(s).map_err(tls::TlsError::into_field_error)?;
    let mut cfg = ClientTlsConfig::new();
    if let Some(id) = tls::load_identity(s).map_err(tls::TlsError::into_field_error)? {
        cfg = cfg.identity(Identity::from_pem(id.cert_pem, id.key_pem));
    }
    if let Some(name) = &s.server_name_override {
        cfg = cfg.domain_name(name.clone());
    }
    endpoint.tls_config_with_verifier(cfg, verifier).map_err(|e| {
        let detail = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
        FieldError::at("tls", format!("invalid TLS configuration: {e}{detail}"))
    })
}

#[async_trait]
impl RequestSender for GrpcSender {
    type Request = GrpcRequest;

    async fn start(&self) -> Result<(), ComponentError> {
        // Lazy: a destination that is down at start is retried on the first export.
        let _ = self.channel();
        Ok(())
    }

    fn encode(&self, data: &Payload) -> Result<GrpcRequest, SendError> {
        self.frame(data).map_err(|s| classify(&s))
    }

    async fn send(&self, request: &GrpcRequest) -> Result<(), SendError> {
        let r = match self.timeout {
            Some(t) => match tokio::time::timeout(t, self.export(request)).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded(format!("export timed out after {t:?}"))),
            },
            None => self.export(request).await,
        };
        r.map_err(|s| classify(&s))
    }
}

/// Maps a gRPC status to retryable / permanent as the OTLP specification and otelcol do.
///
/// Retryable: CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS, and
/// RESOURCE_EXHAUSTED only when the status carries `google.rpc.RetryInfo`, whose delay becomes
/// the retry interval. Everything else is permanent, except UNKNOWN raised locally by the
/// transport (a status that carries a source error, e.g. a connection that broke or a TLS alert):
/// the server never answered, so it is treated like UNAVAILABLE, as grpc-go reports it.
pub fn classify(status: &Status) -> SendError {
    let retry_info = status.get_details_retry_info();
    let retryable = match status.code() {
        Code::Unknown => std::error::Error::source(status).is_some(),
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => true,
        Code::ResourceExhausted => retry_info.is_some(),
        _ => false,
    };
    let message = describe(status);
    if retryable {
        let retry_after = retry_info.and_then(|r| r.retry_delay).filter(|d| !d.is_zero());
        SendError::Retryable { message, retry_after }
    } else {
        SendError::Permanent(message)
    }
}

/// `rpc error: code = Unavailable desc = ...: <source chain>`.
pub(super) fn describe(status: &Status) -> String {
    let mut s = format!("rpc error: code = {:?} desc = {}", status.code(), status.message());
    let mut src = std::error::Error::source(status);
    while let Some(e) = src {
        let t = e.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = e.source();
    }
    s
}
