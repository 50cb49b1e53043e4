//! One OTLP/HTTP POST of a built body, and what the answer means.

use super::config::{Encoding, OtlpHttpConfig};
use crate::common;
use crate::http::{self, Retry};
use async_trait::async_trait;
use inferwatch_core::auth::ClientAuth;
use inferwatch_core::component::FieldError;
use inferwatch_core::exporterhelper::{RequestSender, SendError};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::Compression;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use reqwest::Url;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderValue};
use std::sync::Arc;
use std::time::Duration;

/// One OTLP/HTTP POST per attempt.
pub struct HttpSender {
    pub(super) name: String,
    pub(super) signal: Signal,
    pub(super) client: reqwest::Client,
    pub(super) url: Url,
    /// The configured headers plus `Content-Type` and `Content-Encoding`.
    pub(super) headers: HeaderMap,
    pub(super) auth: Option<Arc<dyn ClientAuth>>,
    pub(super) encoding: Encoding,
    /// gzip level when compressing.
    pub(super) gzip: Option<u32>,
}

impl HttpSender {
    /// Builds the sender for one signal, loading TLS files when its URL is `https://`.
    pub fn new(name: String, c: &OtlpHttpConfig, signal: Signal) -> Result<Self, FieldError> {
        c.check()?;
        let key = format!("{}_endpoint", signal.as_str());
        let url = c
            .signal_url(signal)?
            .ok_or_else(|| FieldError::at("endpoint", format!("no URL for {signal}: set endpoint or {key}")))?;
        // Only 307/308 keep the method and body; anything else is reported, not followed.
        let redirects = reqwest::redirect::Policy::custom(|a| {
            if a.previous().len() >= 5 {
                a.error("too many redirects")
            } else if matches!(a.status().as_u16(), 307 | 308) {
                a.follow()
            } else {
                a.stop()
            }
        });
        let client = http::client(&url, &c.client.tls, c.exporter.timeout(), redirects)?;
        let gzip = (c.client.compression == Compression::Gzip).then_some(c.client.compression_params.level);
        let mut headers = http::headers(&c.client.headers)?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(c.encoding.content_type()));
        if gzip.is_some() {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        Ok(HttpSender { name, signal, client, url, headers, auth: None, encoding: c.encoding, gzip })
    }
}

impl HttpSender {
    fn log_partial_success(&self, content_type: &str, body: &[u8]) {
        match parse_partial_success(self.signal, content_type, body) {
            Ok(Some((rejected, message))) => common::log_partial_success(&self.name, self.signal, rejected, &message),
            Ok(None) => {}
            Err(e) => tracing::debug!(exporter = %self.name, error = %e, "could not parse the export response"),
        }
    }
}

#[async_trait]
impl RequestSender for HttpSender {
    /// The body, encoded and compressed once.
    type Request = bytes::Bytes;

    fn encode(&self, data: &Payload) -> Result<bytes::Bytes, SendError> {
        self.body(data)
    }

    async fn send(&self, body: &bytes::Bytes) -> Result<(), SendError> {
        let resp = http::post(&self.client, &self.url, &self.headers, self.auth.as_ref(), body.clone()).await?;
        let status = resp.status;
        if status.is_success() {
            self.log_partial_success(&resp.content_type, &resp.body);
            return Ok(());
        }
        let message = format!("HTTP {status} from {}{}", self.url, error_detail(&resp.content_type, &resp.body));
        Err(classify(status.as_u16(), message, resp.retry_after))
    }
}

/// Maps an HTTP error status as the OTLP specification and otelcol do: 429, 502, 503 and 504
/// are retryable (honouring `Retry-After`), every other status is permanent.
pub fn classify(status: u16, message: String, retry_after: Option<Duration>) -> SendError {
    http::classify(Retry::Otlp, status, message, retry_after)
}

pub(super) fn is_json(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

pub(super) fn is_proto(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/x-protobuf"))
}

/// The rejected count and message of a success response, if it carries a partial success.
pub(super) fn parse_partial_success(
    signal: Signal,
    content_type: &str,
    body: &[u8],
) -> Result<Option<(i64, String)>, String> {
    use prost::Message;
    if body.is_empty() {
        return Ok(None);
    }
    macro_rules! decode {
        ($ty:ty, $field:ident) => {{
            let r: $ty = if is_proto(content_type) {
                <$ty>::decode(body).map_err(|e| e.to_string())?
            } else if is_json(content_type) {
                serde_json::from_slice(body).map_err(|e| e.to_string())?
            } else {
                return Ok(None);
            };
            Ok(r.partial_success.map(|p| (p.$field, p.error_message)))
        }};
    }
    match signal {
        Signal::Traces => decode!(ExportTraceServiceResponse, rejected_spans),
        Signal::Metrics => decode!(ExportMetricsServiceResponse, rejected_data_points),
        Signal::Logs => decode!(ExportLogsServiceResponse, rejected_log_records),
    }
}

/// `: <message>` from an error body (`google.rpc.Status` in protobuf or JSON, or short text).
pub(super) fn error_detail(content_type: &str, body: &[u8]) -> String {
    use prost::Message;
    if body.is_empty() {
        return String::new();
    }
    let msg = if is_proto(content_type) {
        tonic_types::Status::decode(body).ok().map(|s| s.message)
    } else if is_json(content_type) {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
    } else {
        None
    };
    let msg = msg.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    let mut short: String = msg.chars().take(256).collect();
    if short.len() < msg.len() {
        short.push('…');
    }
    if short.is_empty() { String::new() } else { format!(": {short}") }
}
