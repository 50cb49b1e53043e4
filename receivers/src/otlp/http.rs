//! OTLP/HTTP: `POST` of protobuf or JSON export requests on one path per signal.

use super::config::{CorsConfig, HttpConfig};
use super::ingest::{ExportError, Gate, Logs, Metrics, OtlpSignal, Sink, Traces};
use super::json;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use inferwatch_core::auth::ClientInfo;
use inferwatch_core::consumer::RefuseReason;
use inferwatch_core::server::inflate::{self, ContentEncoding, InflateBudget, InflateError};
use inferwatch_core::server::{Listener, PeerInfo};
use prost::Message as _;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Content type of OTLP/HTTP protobuf.
const PROTOBUF: &str = "application/x-protobuf";
/// Content type of OTLP/HTTP JSON.
const JSON: &str = "application/json";

/// gRPC code INVALID_ARGUMENT, used in `google.rpc.Status` bodies.
const CODE_INVALID_ARGUMENT: i32 = 3;
/// gRPC code RESOURCE_EXHAUSTED.
const CODE_RESOURCE_EXHAUSTED: i32 = 8;
/// gRPC code UNAVAILABLE.
const CODE_UNAVAILABLE: i32 = 14;
/// gRPC code UNAUTHENTICATED.
const CODE_UNAUTHENTICATED: i32 = 16;

/// The two OTLP/HTTP encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// Binary protobuf.
    Protobuf,
    /// OTLP/JSON.
    Json,
}

impl Encoding {
    /// The encoding named by a `Content-Type` value (parameters and case ignored).
    fn from_content_type(ct: &str) -> Option<Self> {
        let mime = ct.split(';').next().unwrap_or_default().trim();
        if mime.eq_ignore_ascii_case(PROTOBUF) {
            Some(Encoding::Protobuf)
        } else if mime.eq_ignore_ascii_case(JSON) {
            Some(Encoding::Json)
        } else {
            None
        }
    }

    /// The `Content-Type` of responses in this encoding.
    fn content_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => PROTOBUF,
            Encoding::Json => JSON,
        }
    }
}

/// Builds a response with a body in `enc`.
fn respond(status: StatusCode, enc: Encoding, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, enc.content_type())], body).into_response()
}

/// An error answer: a `google.rpc.Status` body in the request's encoding.
fn status_response(status: StatusCode, enc: Encoding, code: i32, message: String) -> Response {
    let body = match enc {
        Encoding::Protobuf => tonic_types::Status { code, message, details: Vec::new() }.encode_to_vec(),
        Encoding::Json => serde_json::json!({ "code": code, "message": message }).to_string().into_bytes(),
    };
    respond(status, enc, body)
}

/// A 400 answer.
fn bad_request(enc: Encoding, message: String) -> Response {
    status_response(StatusCode::BAD_REQUEST, enc, CODE_INVALID_ARGUMENT, message)
}

/// The answer to a refused or rejected export.
fn export_error_response(enc: Encoding, e: ExportError) -> Response {
    match e {
        ExportError::Refused { reason, retry_after, message } => {
            let (status, code) = match reason {
                RefuseReason::MemoryLimit => (StatusCode::TOO_MANY_REQUESTS, CODE_RESOURCE_EXHAUSTED),
                RefuseReason::QueueFull
                | RefuseReason::ShuttingDown
                | RefuseReason::Downstream
                | RefuseReason::PartiallyAccepted => (StatusCode::SERVICE_UNAVAILABLE, CODE_UNAVAILABLE),
            };
            let mut resp = status_response(status, enc, code, message);
            // Whole seconds, rounded up, at least one.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            resp
        }
        ExportError::Malformed(m) | ExportError::Permanent(m) => bad_request(enc, m),
    }
}

/// The success answer: `{}` or the partial success, in the request's encoding.
fn success_response<S: OtlpSignal>(enc: Encoding, resp: &S::Response) -> Response {
    let body = match enc {
        Encoding::Protobuf => resp.encode_to_vec(),
        // An empty response is `{}`, not `{"partialSuccess":null}`, for strict clients.
        Encoding::Json if *resp == S::Response::default() => b"{}".to_vec(),
        Encoding::Json => match serde_json::to_vec(resp) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "otlp receiver could not encode a JSON response");
                b"{}".to_vec()
            }
        },
    };
    respond(StatusCode::OK, enc, body)
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    /// Larger than the configured limit (after decompression).
    #[error("request body larger than the limit of {0} bytes")]
    TooLarge(usize),
    /// The connection or the decompressor failed.
    #[error("failed to read the request body: {0}")]
    Read(String),
}

/// The error and its sources, joined by `: `.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

/// Reads the whole (decompressed) body, refusing more than `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Read(error_chain(&e)))?;
        if buf.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// A 429 for a request the decompression budget had no room for.
fn budget_response(enc: Encoding, message: String) -> Response {
    let mut resp = status_response(StatusCode::TOO_MANY_REQUESTS, enc, CODE_RESOURCE_EXHAUSTED, message);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// Handles one export request of signal `S`.
async fn handle<S: OtlpSignal>(
    sink: Sink,
    limit: usize,
    budget: Arc<InflateBudget>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(enc) = Encoding::from_content_type(ct) else {
        let msg = format!("415 unsupported media type {ct:?}, supported: [{JSON}, {PROTOBUF}]");
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, [(header::CONTENT_TYPE, "text/plain")], msg).into_response();
    };
    let ce = headers.get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("?"));
    let Some(content_encoding) = ContentEncoding::parse(ce) else {
        let msg = format!(
            "unsupported Content-Encoding {:?}; supported: gzip, deflate, zlib, zstd, snappy, x-snappy-framed",
            ce.unwrap_or_default()
        );
        return bad_request(enc, msg);
    };
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let msg = BodyError::TooLarge(limit).to_string();
        return status_response(StatusCode::PAYLOAD_TOO_LARGE, enc, CODE_RESOURCE_EXHAUSTED, msg);
    }
    let raw = match read_body(body, limit).await {
        Ok(b) => b,
        Err(e @ BodyError::TooLarge(_)) => {
            return status_response(StatusCode::PAYLOAD_TOO_LARGE, enc, CODE_RESOURCE_EXHAUSTED, e.to_string());
        }
        Err(e) => return bad_request(enc, e.to_string()),
    };
    // Inflated bytes count against the process-wide budget until the pipeline has the data.
    let mut reservation = budget.reservation();
    let bytes =
        match inflate::inflate(raw, content_encoding, limit, &mut reservation, inflate::DEFAULT_BUDGET_WAIT).await {
            Ok(b) => b,
            Err(e @ InflateError::TooLarge { .. }) => {
                return status_response(StatusCode::PAYLOAD_TOO_LARGE, enc, CODE_RESOURCE_EXHAUSTED, e.to_string());
            }
            Err(e @ InflateError::Budget(_)) => return budget_response(enc, e.to_string()),
            Err(e @ InflateError::Corrupt { .. }) => return bad_request(enc, e.to_string()),
        };
    let result = match enc {
        Encoding::Protobuf => sink.export_protobuf::<S>(bytes).await,
        Encoding::Json => match json::decode::<S::Request>(&bytes, S::check_json) {
            Ok(req) => match inferwatch_core::pdata::wire::validate(S::SIGNAL, &req.encode_to_vec()) {
                Err(inferwatch_core::pdata::wire::WireError::Limit(why)) => {
                    Err(ExportError::Malformed(format!("request refused: {why}")))
                }
                _ => sink.export::<S>(req).await,
            },
            Err(e) => Err(ExportError::Malformed(e.to_string())),
        },
    };
    drop(reservation);
    match result {
        Ok(resp) => success_response::<S>(enc, &resp),
        Err(e) => {
            if let ExportError::Malformed(m) = &e {
                tracing::debug!(signal = %S::SIGNAL, error = %m, "otlp receiver got a malformed HTTP request");
            }
            export_error_response(enc, e)
        }
    }
}

/// Adds a `POST` route for signal `S` when it has a sink.
fn add_route<S: OtlpSignal>(router: Router, path: &str, sink: Option<Sink>, limit: usize) -> Router {
    let Some(sink) = sink else { return router };
    let budget = inflate::global();
    router.route(
        path,
        post(move |headers: HeaderMap, body: Body| {
            let sink = sink.clone();
            let budget = budget.clone();
            async move { handle::<S>(sink, limit, budget, headers, body).await }
        }),
    )
}

/// Authentication middleware: 401 with a `google.rpc.Status` (code 16) for a refused request;
/// otherwise the handler runs inside the request's `ClientInfo` scope.
async fn admit(gate: Gate, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<PeerInfo>().copied();
    match gate.admit(req.headers(), peer) {
        Ok(info) => ClientInfo::scope(info, next.run(req)).await,
        Err(e) => {
            let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let enc = Encoding::from_content_type(ct).unwrap_or(Encoding::Json);
            let mut resp = status_response(StatusCode::UNAUTHORIZED, enc, CODE_UNAUTHENTICATED, e.to_string());
            let h = resp.headers_mut();
            h.append(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"otlp\""));
            h.append(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"otlp\""));
            resp
        }
    }
}

/// Origins and headers allowed for cross-origin requests.
struct Cors {
    origins: Vec<String>,
    headers: Vec<String>,
    max_age: u64,
}

/// Headers browsers may always send, plus those OTLP senders use.
const DEFAULT_ALLOWED_HEADERS: &[&str] = &[
    "accept",
    "accept-language",
    "content-language",
    "content-type",
    "content-encoding",
    "origin",
    "x-requested-with",
];

impl Cors {
    /// Builds the matcher from settings; `None` when no origin is allowed (CORS off).
    fn new(c: &CorsConfig) -> Option<Self> {
        if c.allowed_origins.is_empty() {
            return None;
        }
        Some(Cors {
            origins: c.allowed_origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            headers: c.allowed_headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
            max_age: c.max_age,
        })
    }

    /// Whether `origin` matches an allowed pattern (`*`, exact, or one `*` wildcard).
    fn allows_origin(&self, origin: &str) -> bool {
        let o = origin.to_ascii_lowercase();
        self.origins.iter().any(|p| match p.split_once('*') {
            None => *p == o,
            Some((pre, suf)) => o.len() >= pre.len() + suf.len() && o.starts_with(pre) && o.ends_with(suf),
        })
    }

    /// Whether every header of a preflight's `Access-Control-Request-Headers` is allowed.
    fn allows_headers(&self, requested: &str) -> bool {
        if self.headers.iter().any(|h| h == "*") {
            return true;
        }
        requested
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .all(|h| DEFAULT_ALLOWED_HEADERS.contains(&h.as_str()) || self.headers.contains(&h))
    }
}

/// CORS middleware: answers preflights and marks allowed cross-origin responses.
async fn cors(cors: Arc<Cors>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allowed = origin.as_ref().and_then(|o| o.to_str().ok()).is_some_and(|o| cors.allows_origin(o));
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        let method_ok = req.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD).is_some_and(|m| m == "POST");
        let requested = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let headers_ok = requested.as_ref().is_none_or(|r| r.to_str().is_ok_and(|r| cors.allows_headers(r)));
        if let (true, true, true, Some(o)) = (allowed, method_ok, headers_ok, origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("POST"));
            if let Some(r) = requested {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, r);
            }
            if cors.max_age > 0 {
                h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(cors.max_age));
            }
        }
        return resp;
    }
    let mut resp = next.run(req).await;
    if let (true, Some(o)) = (allowed, origin) {
        resp.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        resp.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}

/// The per-signal sinks of the HTTP transport; `None` where the signal has no consumer.
pub(crate) struct HttpSinks {
    /// Traces sink.
    pub traces: Option<Sink>,
    /// Metrics sink.
    pub metrics: Option<Sink>,
    /// Logs sink.
    pub logs: Option<Sink>,
}

/// Builds the router: only signals with a consumer get a path (others answer 404, as in otelcol).
fn router(cfg: &HttpConfig, sinks: HttpSinks, gate: Gate) -> Router {
    let limit = cfg.max_request_body_size;
    let mut app = Router::new();
    app = add_route::<Traces>(app, &cfg.traces_url_path, sinks.traces, limit);
    app = add_route::<Metrics>(app, &cfg.metrics_url_path, sinks.metrics, limit);
    app = add_route::<Logs>(app, &cfg.logs_url_path, sinks.logs, limit);
    // route_layer: unknown paths stay 404; CORS preflights (outer layer) need no credentials.
    app = app.route_layer(axum::middleware::from_fn(move |req: Request, next: Next| admit(gate.clone(), req, next)));
    if let Some(c) = cfg.cors.as_ref().and_then(Cors::new) {
        let c = Arc::new(c);
        app = app.layer(axum::middleware::from_fn(move |req: Request, next: Next| cors(c.clone(), req, next)));
    }
    let extra: Vec<(HeaderName, HeaderValue)> = cfg
        .response_headers
        .iter()
        .filter_map(|(k, v)| Some((HeaderName::from_bytes(k.as_bytes()).ok()?, HeaderValue::from_str(v).ok()?)))
        .collect();
    if !extra.is_empty() {
        let extra = Arc::new(extra);
        app = app.layer(axum::middleware::map_response(move |mut resp: Response| {
            let extra = extra.clone();
            async move {
                for (k, v) in extra.iter() {
                    resp.headers_mut().insert(k.clone(), v.clone());
                }
                resp
            }
        }));
    }
    app
}

/// Serves OTLP/HTTP (HTTP/1.1, h2c and, with TLS, h2) on `listener` until `shutdown`, then
/// drains in-flight requests.
pub(crate) async fn serve(
    listener: Listener,
    cfg: HttpConfig,
    sinks: HttpSinks,
    gate: Gate,
    shutdown: CancellationToken,
) {
    let app = router(&cfg, sinks, gate);
    inferwatch_core::server::serve(listener, app, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn content_types() {
        assert_eq!(Encoding::from_content_type("application/x-protobuf"), Some(Encoding::Protobuf));
        assert_eq!(Encoding::from_content_type("Application/JSON; charset=utf-8"), Some(Encoding::Json));
        assert_eq!(Encoding::from_content_type("text/plain"), None);
        assert_eq!(Encoding::from_content_type(""), None);
    }

    #[test]
    fn retry_after_rounds_up() {
        let r = export_error_response(
            Encoding::Json,
            ExportError::Refused {
                reason: RefuseReason::Downstream,
                retry_after: Duration::from_millis(1500),
                message: "x".into(),
            },
        );
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn cors_origin_patterns() {
        let c = Cors::new(&CorsConfig {
            allowed_origins: vec!["https://*.example.com".into(), "http://localhost:3000".into()],
            allowed_headers: vec!["X-Custom".into()],
            max_age: 0,
        })
        .unwrap();
        assert!(c.allows_origin("https://app.example.com"));
        assert!(c.allows_origin("HTTP://localhost:3000"));
        assert!(!c.allows_origin("https://example.org"));
        assert!(!c.allows_origin("http://localhost:3001"));
        assert!(c.allows_headers("content-type, x-custom"));
        assert!(!c.allows_headers("x-other"));
        assert!(Cors::new(&CorsConfig::default()).is_none());
    }
}
