//! The `otlp` exporter: OTLP over gRPC with tonic (otelcol's `otlp` exporter).

use crate::common;
use crate::tls;
use async_trait::async_trait;
use inferwatch_core::auth::{AuthSettings, ClientAuth};
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, parse_config};
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{
    Compression, CompressionParams, Endpoint, GoDuration, QueueSettings, RetrySettings, TlsClientSettings,
};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tonic::metadata::{AsciiMetadataValue, BinaryMetadataKey, BinaryMetadataValue, MetadataKey, MetadataMap};
use tonic::transport::{Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// `keepalive` settings (otelcol configgrpc `KeepaliveClientConfig`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveSettings {
    /// Interval of HTTP/2 PINGs (0 disables them).
    pub time: GoDuration,
    /// How long to wait for a PING acknowledgement before closing the connection.
    pub timeout: GoDuration,
    /// Also ping while no request is in flight.
    pub permit_without_stream: bool,
}

impl Default for KeepaliveSettings {
    fn default() -> Self {
        KeepaliveSettings {
            time: GoDuration(Duration::from_secs(10)),
            timeout: GoDuration(Duration::from_secs(10)),
            permit_without_stream: false,
        }
    }
}

/// Settings of the `otlp` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// `host:port`, or `http(s)://host:port` (the scheme chooses plain text or TLS). Required.
    #[serde(default)]
    pub endpoint: Option<Endpoint>,
    /// Client TLS; on by default unless `insecure: true` or an `http://` endpoint.
    #[serde(default)]
    pub tls: TlsClientSettings,
    /// Extra gRPC metadata sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Client authenticator extension (`auth: { authenticator: <id> }`, otelcol `configauth`).
    #[serde(default)]
    pub auth: Option<AuthSettings>,
    /// Request compression (`gzip` by default, or `none`).
    #[serde(default)]
    pub compression: Compression,
    /// gzip level (`compression_params.level`, 1 fastest to 9 smallest; default 1).
    #[serde(default)]
    pub compression_params: CompressionParams,
    /// Deadline of one export call (0: none).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
    /// Sending queue.
    #[serde(default)]
    pub sending_queue: QueueSettings,
    /// Retries with back-off.
    #[serde(default)]
    pub retry_on_failure: RetrySettings,
    /// gRPC load-balancing policy: `pick_first` or `round_robin` (one connection is used either way).
    #[serde(default)]
    pub balancer_name: Option<String>,
    /// HTTP/2 keepalive pings.
    #[serde(default)]
    pub keepalive: KeepaliveSettings,
}

fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(5))
}

impl OtlpConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: OtlpConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.compression_params.check().map_err(|e| FieldError::at("compression_params.level", e))?;
        let ep = self.endpoint()?;
        if !ep.path.is_empty() {
            return Err(FieldError::at("endpoint", format!("a gRPC endpoint has no path (got {:?})", ep.path)));
        }
        tls::validate(&self.tls)?;
        let t = &self.tls;
        let wants_tls = t.ca_file.is_some() || t.cert_file.is_some() || t.insecure_skip_verify;
        if wants_tls && !self.use_tls() {
            let why =
                if ep.scheme.as_deref() == Some("http") { "the endpoint is http://" } else { "tls.insecure is true" };
            return Err(FieldError::at(
                "tls",
                format!("{why} (plain text) but TLS files or insecure_skip_verify are set; use one or the other"),
            ));
        }
        metadata(&self.headers)?;
        match self.balancer_name.as_deref() {
            None | Some("") | Some("pick_first") | Some("round_robin") => {}
            Some(b) => {
                return Err(FieldError::at(
                    "balancer_name",
                    format!("unknown balancer {b:?}: use pick_first or round_robin"),
                ));
            }
        }
        common::validate_queue(&self.sending_queue)?;
        common::validate_retry(&self.retry_on_failure)?;
        Ok(())
    }

    /// The endpoint, or the error that it is missing.
    pub fn endpoint(&self) -> Result<&Endpoint, FieldError> {
        self.endpoint
            .as_ref()
            .ok_or_else(|| FieldError::at("endpoint", "endpoint is required (host:port or http(s)://host:port)"))
    }

    /// Whether the connection uses TLS: `https://` always, `http://` never, else unless `tls.insecure`.
    pub fn use_tls(&self) -> bool {
        match self.endpoint.as_ref().and_then(|e| e.scheme.as_deref()) {
            Some("https") => true,
            Some("http") => false,
            _ => !self.tls.insecure,
        }
    }
}

/// Builds the gRPC metadata for `headers` (keys ending in `-bin` are binary metadata).
fn metadata(headers: &BTreeMap<String, String>) -> Result<MetadataMap, FieldError> {
    let mut m = MetadataMap::new();
    for (k, v) in headers {
        let at = || format!("headers.{k}");
        if k.ends_with("-bin") {
            let key = BinaryMetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| FieldError::at(&at(), format!("invalid gRPC metadata key {k:?}")))?;
            m.insert_bin(key, BinaryMetadataValue::from_bytes(v.as_bytes()));
        } else {
            let key = MetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| FieldError::at(&at(), format!("invalid gRPC metadata key {k:?}")))?;
            let val = AsciiMetadataValue::try_from(v.as_str())
                .map_err(|_| FieldError::at(&at(), "invalid gRPC metadata value (visible ASCII only)"))?;
            m.insert(key, val);
        }
    }
    Ok(m)
}

/// Factory of the `otlp` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtlpExporterFactory;

impl ExporterFactory for OtlpExporterFactory {
    fn type_name(&self) -> &'static str {
        "otlp"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        OtlpConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        let c = OtlpConfig::from_value(cfg)?;
        let mut sender = GrpcSender::new(ctx.id.to_string(), &c)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        common::node(&ctx, signal, Arc::new(sender), c.sending_queue, c.retry_on_failure)
    }
}

/// One export attempt over a lazily connected tonic channel.
pub struct GrpcSender {
    name: String,
    endpoint: tonic::transport::Endpoint,
    channel: OnceLock<Channel>,
    metadata: MetadataMap,
    auth: Option<Arc<dyn ClientAuth>>,
    /// gzip level when compressing.
    gzip: Option<u32>,
    timeout: Option<Duration>,
}

impl GrpcSender {
    /// Builds the sender, loading TLS files; connects only when first used.
    pub fn new(name: String, c: &OtlpConfig) -> Result<Self, FieldError> {
        c.check()?;
        let ep = c.endpoint()?;
        let use_tls = c.use_tls();
        if use_tls && c.tls.insecure {
            tracing::warn!(exporter = %name, "the endpoint is https://, so TLS is used although tls.insecure is true");
        }
        if c.balancer_name.as_deref() == Some("round_robin") {
            tracing::warn!(exporter = %name, "balancer_name round_robin is not supported; one connection is used");
        }
        let scheme = if use_tls { "https" } else { "http" };
        let uri = format!("{scheme}://{}", ep.authority);
        let timeout = common::non_zero(c.timeout.0);
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
            endpoint = grpc_tls(endpoint, &c.tls)?;
        }
        Ok(GrpcSender {
            name,
            endpoint,
            channel: OnceLock::new(),
            metadata: metadata(&c.headers)?,
            auth: None,
            gzip: (c.compression == Compression::Gzip).then_some(c.compression_params.level),
            timeout,
        })
    }

    fn channel(&self) -> Channel {
        self.channel.get_or_init(|| self.endpoint.connect_lazy()).clone()
    }

    /// One unary OTLP export call, framed by hand so that encoded payloads go out without a
    /// decode / re-encode and gzip runs at the configured level (tonic's codec fixes level 6).
    async fn export(&self, data: &Payload) -> Result<(), Status> {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let signal = data.signal();
        let chunks = data.to_chunks();
        let (flag, msg) = match self.gzip {
            Some(level) => (1u8, common::gzip_chunks(&chunks, level).map_err(|e| Status::internal(e.to_string()))?),
            None => (0u8, chunks.iter().flat_map(|c| c.iter().copied()).collect()),
        };
        let len = u32::try_from(msg.len()).map_err(|_| Status::resource_exhausted("request larger than 4 GiB"))?;
        let mut frame = bytes::BytesMut::with_capacity(5 + msg.len());
        frame.extend_from_slice(&[flag]);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&msg);
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
            .body(tonic::body::Body::new(http_body_util::Full::new(frame.freeze())))
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
const MAX_RESPONSE: usize = 64 * 1024;

/// The `grpc-timeout` header value: at most 8 digits, as the gRPC spec requires.
fn grpc_timeout(t: Duration) -> String {
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
fn grpc_status(map: &http::HeaderMap) -> Option<Status> {
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
fn http_status(code: http::StatusCode) -> Status {
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
fn grpc_path(signal: Signal) -> &'static str {
    match signal {
        Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    }
}

/// A connection-level failure: retryable, as grpc-go reports it.
fn transport_status(e: &dyn std::error::Error) -> Status {
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
fn partial_success(signal: Signal, body: &[u8]) -> (i64, String) {
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
fn grpc_tls(
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
impl Sender for GrpcSender {
    async fn start(&self) -> Result<(), ComponentError> {
        // Lazy: a destination that is down at start is retried on the first export.
        let _ = self.channel();
        Ok(())
    }

    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let r = match self.timeout {
            Some(t) => match tokio::time::timeout(t, self.export(data)).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded(format!("export timed out after {t:?}"))),
            },
            None => self.export(data).await,
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
fn describe(status: &Status) -> String {
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

#[cfg(test)]
mod tests {

    #[test]
    fn malformed_status_details_do_not_panic() {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        h.insert("grpc-message", http::HeaderValue::from_static("down"));
        h.insert("grpc-status-details-bin", http::HeaderValue::from_static("!!!not base64!!!"));
        let st = grpc_status(&h).unwrap();
        assert_eq!(st.code(), Code::Unavailable);
        assert_eq!(st.message(), "down");
        assert!(grpc_status(&http::HeaderMap::new()).is_none());
    }

    #[test]
    fn http_errors_and_timeouts_follow_the_grpc_spec() {
        assert_eq!(http_status(http::StatusCode::UNAUTHORIZED).code(), Code::Unauthenticated);
        assert_eq!(http_status(http::StatusCode::NOT_FOUND).code(), Code::Unimplemented);
        assert_eq!(http_status(http::StatusCode::SERVICE_UNAVAILABLE).code(), Code::Unavailable);
        assert!(matches!(classify(&http_status(http::StatusCode::FORBIDDEN)), SendError::Permanent(_)));
        assert_eq!(grpc_timeout(Duration::from_secs(5)), "5000m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
        assert!(grpc_timeout(Duration::from_secs(u64::MAX / 2)).len() <= 9);
    }

    #[test]
    fn partial_success_is_read_from_compressed_responses() {
        use prost::Message;
        use std::io::Write;
        let resp = ExportTraceServiceResponse {
            partial_success: Some(opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess {
                rejected_spans: 3,
                error_message: "bad".into(),
            }),
        };
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&resp.encode_to_vec()).unwrap();
        let z = z.finish().unwrap();
        let mut frame = vec![1u8];
        frame.extend_from_slice(&(z.len() as u32).to_be_bytes());
        frame.extend_from_slice(&z);
        assert_eq!(partial_success(Signal::Traces, &frame), (3, "bad".to_string()));
        assert_eq!(partial_success(Signal::Traces, &frame[..4]), (0, String::new()));
    }

    use super::*;
    use inferwatch_core::component::PathSeg;
    use serde_json::json;
    use tonic_types::ErrorDetails;

    fn key(path: &[PathSeg]) -> Vec<String> {
        path.iter()
            .map(|p| match p {
                PathSeg::Key(k) => k.clone(),
                PathSeg::Index(i) => i.to_string(),
            })
            .collect()
    }

    #[test]
    fn defaults_follow_otelcol() {
        let c = OtlpConfig::from_value(&json!({"endpoint": "tempo:4317"})).unwrap();
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(c.timeout.0, Duration::from_secs(5));
        assert!(c.use_tls());
        assert!(c.sending_queue.enabled);
        assert!(c.retry_on_failure.enabled);
        let c = OtlpConfig::from_value(&json!({"endpoint": "tempo:4317", "tls": {"insecure": true}})).unwrap();
        assert!(!c.use_tls());
        let c = OtlpConfig::from_value(&json!({"endpoint": "http://tempo:4317"})).unwrap();
        assert!(!c.use_tls());
        let c = OtlpConfig::from_value(&json!({"endpoint": "https://tempo", "tls": {"insecure": true}})).unwrap();
        assert!(c.use_tls());
        assert_eq!(c.endpoint().unwrap().authority, "tempo:443");
    }

    #[test]
    fn otelcol_keys_are_accepted() {
        let v = json!({
            "endpoint": "tempo:4317",
            "balancer_name": "round_robin",
            "keepalive": {"time": "20s", "timeout": "5s", "permit_without_stream": true},
            "headers": {"X-Scope-OrgID": "team-a", "trace-bin": "raw"},
            "compression": "none",
            "timeout": "2s",
            "sending_queue": {"enabled": true, "num_consumers": 2, "queue_size": 10},
            "retry_on_failure": {"enabled": true, "initial_interval": "1s", "max_interval": "5s", "max_elapsed_time": "1m"},
        });
        let c = OtlpConfig::from_value(&v).unwrap();
        assert_eq!(c.keepalive.time.0, Duration::from_secs(20));
        let m = metadata(&c.headers).unwrap();
        assert_eq!(m.get("x-scope-orgid").and_then(|v| v.to_str().ok()), Some("team-a"));
        assert!(m.get_bin("trace-bin").is_some());
    }

    #[test]
    fn bad_settings_point_at_the_field() {
        let cases = [
            (json!({}), vec!["endpoint"]),
            (json!(null), vec!["endpoint"]),
            (json!({"endpoint": "tempo"}), vec!["endpoint"]),
            (json!({"endpoint": "tempo:4317/x"}), vec!["endpoint"]),
            (json!({"endpoint": "tempo:4317", "bogus": 1}), vec!["bogus"]),
            (json!({"endpoint": "tempo:4317", "tls": {"bogus": 1}}), vec!["tls", "bogus"]),
            (json!({"endpoint": "tempo:4317", "compression": "zstd"}), vec!["compression"]),
            (json!({"endpoint": "tempo:4317", "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
            (json!({"endpoint": "tempo:4317", "headers": {"k": "line\nbreak"}}), vec!["headers", "k"]),
            (json!({"endpoint": "tempo:4317", "balancer_name": "random"}), vec!["balancer_name"]),
            (json!({"endpoint": "http://tempo:4317", "tls": {"ca_file": "ca.pem"}}), vec!["tls"]),
            (json!({"endpoint": "tempo:4317", "tls": {"cert_file": "c.pem"}}), vec!["tls", "key_file"]),
            (
                json!({"endpoint": "tempo:4317", "sending_queue": {"queue_size": 0}}),
                vec!["sending_queue", "queue_size"],
            ),
            (json!({"endpoint": "tempo:4317", "timeout": "5 parsecs"}), vec!["timeout"]),
        ];
        for (v, path) in cases {
            let e = OtlpExporterFactory.validate(&v).expect_err(&v.to_string());
            assert_eq!(key(&e.path), path, "{v}: {}", e.message);
        }
    }

    #[test]
    fn missing_ca_file_fails_at_create_not_validate() {
        let v = json!({"endpoint": "tempo:4317", "tls": {"ca_file": "/nonexistent/ca.pem"}});
        assert!(OtlpExporterFactory.validate(&v).is_ok());
        let c = OtlpConfig::from_value(&v).unwrap();
        let e = GrpcSender::new("otlp".into(), &c).err().unwrap();
        assert_eq!(key(&e.path), vec!["tls", "ca_file"]);
    }

    #[test]
    fn status_mapping_follows_the_spec() {
        for code in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unavailable,
            Code::DataLoss,
        ] {
            assert!(
                matches!(classify(&Status::new(code, "x")), SendError::Retryable { retry_after: None, .. }),
                "{code:?}"
            );
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::Unimplemented,
            Code::Internal,
            Code::Unknown,
            Code::ResourceExhausted,
        ] {
            assert!(matches!(classify(&Status::new(code, "x")), SendError::Permanent(_)), "{code:?}");
        }
        let d = Duration::from_millis(1500);
        let s =
            Status::with_error_details(Code::ResourceExhausted, "slow down", ErrorDetails::with_retry_info(Some(d)));
        assert_eq!(classify(&s), SendError::Retryable { message: describe(&s), retry_after: Some(d) });
        let s = Status::with_error_details(Code::Unavailable, "later", ErrorDetails::with_retry_info(Some(d)));
        assert!(matches!(classify(&s), SendError::Retryable { retry_after: Some(x), .. } if x == d));
        assert!(describe(&Status::invalid_argument("bad span")).contains("InvalidArgument desc = bad span"));
        // UNKNOWN from the server is permanent; UNKNOWN raised by the local transport is not.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        assert!(matches!(classify(&Status::from_error(Box::new(io))), SendError::Retryable { .. }));
    }
}
