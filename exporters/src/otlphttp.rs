//! The `otlphttp` exporter: OTLP over HTTP (protobuf or JSON) with reqwest (otelcol's `otlphttp`).

use crate::common;
use crate::tls;
use async_trait::async_trait;
use inferwatch_core::auth::{AuthSettings, ClientAuth};
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, parse_config};
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::extension::client_auth;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::{
    Compression, CompressionParams, GoDuration, QueueSettings, RetrySettings, TlsClientSettings,
};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use reqwest::Url;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Body encoding of OTLP/HTTP requests.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Binary protobuf (`application/x-protobuf`).
    #[default]
    Proto,
    /// OTLP/JSON (`application/json`).
    Json,
}

impl Encoding {
    /// The request `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Proto => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// Settings of the `otlphttp` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpHttpConfig {
    /// Base URL; `/v1/traces`, `/v1/metrics`, `/v1/logs` are appended to its path.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Full URL for traces, replacing `endpoint` + `/v1/traces`.
    #[serde(default)]
    pub traces_endpoint: Option<String>,
    /// Full URL for metrics.
    #[serde(default)]
    pub metrics_endpoint: Option<String>,
    /// Full URL for logs.
    #[serde(default)]
    pub logs_endpoint: Option<String>,
    /// Client TLS for `https://` URLs.
    #[serde(default)]
    pub tls: TlsClientSettings,
    /// Extra HTTP headers sent with every request.
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
    /// Body encoding (`proto` by default, or `json`).
    #[serde(default)]
    pub encoding: Encoding,
    /// Deadline of one request, connection included (0: none).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
    /// Sending queue.
    #[serde(default)]
    pub sending_queue: QueueSettings,
    /// Retries with back-off.
    #[serde(default)]
    pub retry_on_failure: RetrySettings,
}

fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(30))
}

impl OtlpHttpConfig {
    /// Parses and checks settings (no file is read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: OtlpHttpConfig = parse_config(v)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.compression_params.check().map_err(|e| FieldError::at("compression_params.level", e))?;
        if self.endpoint.is_none()
            && self.traces_endpoint.is_none()
            && self.metrics_endpoint.is_none()
            && self.logs_endpoint.is_none()
        {
            return Err(FieldError::at(
                "endpoint",
                "endpoint is required (or traces_endpoint / metrics_endpoint / logs_endpoint)",
            ));
        }
        for s in Signal::ALL {
            self.signal_url(s)?;
        }
        tls::validate(&self.tls)?;
        headers(&self.headers)?;
        common::validate_queue(&self.sending_queue)?;
        common::validate_retry(&self.retry_on_failure)?;
        Ok(())
    }

    /// The URL `signal` is sent to, if one is configured.
    pub fn signal_url(&self, signal: Signal) -> Result<Option<Url>, FieldError> {
        let (key, over) = match signal {
            Signal::Traces => ("traces_endpoint", &self.traces_endpoint),
            Signal::Metrics => ("metrics_endpoint", &self.metrics_endpoint),
            Signal::Logs => ("logs_endpoint", &self.logs_endpoint),
        };
        if let Some(u) = over {
            return parse_url(key, u, self.tls.insecure).map(Some);
        }
        let Some(base) = &self.endpoint else { return Ok(None) };
        let mut url = parse_url("endpoint", base, self.tls.insecure)?;
        let path = format!("{}/v1/{}", url.path().trim_end_matches('/'), signal.as_str());
        url.set_path(&path);
        Ok(Some(url))
    }
}

/// Parses an `http(s)://` URL; a bare `host:port` gets `https://` (or `http://` with `tls.insecure`).
fn parse_url(key: &str, s: &str, insecure: bool) -> Result<Url, FieldError> {
    let full =
        if s.contains("://") { s.to_string() } else { format!("{}://{s}", if insecure { "http" } else { "https" }) };
    let url = Url::parse(&full).map_err(|e| FieldError::at(key, format!("invalid URL {s:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: the scheme must be http or https")));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: missing host")));
    }
    Ok(url)
}

/// Builds the header map for `headers`.
fn headers(h: &BTreeMap<String, String>) -> Result<HeaderMap, FieldError> {
    let mut m = HeaderMap::new();
    for (k, v) in h {
        let at = format!("headers.{k}");
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| FieldError::at(&at, format!("invalid HTTP header name {k:?}")))?;
        let mut value = HeaderValue::from_str(v).map_err(|_| FieldError::at(&at, "invalid HTTP header value"))?;
        value.set_sensitive(true);
        m.insert(name, value);
    }
    Ok(m)
}

/// Factory of the `otlphttp` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtlpHttpExporterFactory;

impl ExporterFactory for OtlpHttpExporterFactory {
    fn type_name(&self) -> &'static str {
        "otlphttp"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        OtlpHttpConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value, signal: Signal) -> Result<NodeRef, ComponentError> {
        let c = OtlpHttpConfig::from_value(cfg)?;
        let mut sender = HttpSender::new(ctx.id.to_string(), &c, signal)?;
        sender.auth = client_auth::resolve_client(&ctx.host, c.auth.as_ref())?;
        common::node(&ctx, signal, Arc::new(sender), c.sending_queue, c.retry_on_failure)
    }
}

/// One OTLP/HTTP POST per attempt.
pub struct HttpSender {
    name: String,
    signal: Signal,
    client: reqwest::Client,
    url: Url,
    headers: HeaderMap,
    auth: Option<Arc<dyn ClientAuth>>,
    encoding: Encoding,
    /// gzip level when compressing.
    gzip: Option<u32>,
}

/// Most bytes of a response body read (for partial success or an error message).
const MAX_RESPONSE: usize = 64 * 1024;

impl HttpSender {
    /// Builds the sender for one signal, loading TLS files when its URL is `https://`.
    pub fn new(name: String, c: &OtlpHttpConfig, signal: Signal) -> Result<Self, FieldError> {
        c.check()?;
        let key = format!("{}_endpoint", signal.as_str());
        let url = c
            .signal_url(signal)?
            .ok_or_else(|| FieldError::at("endpoint", format!("no URL for {signal}: set endpoint or {key}")))?;
        let tls_config = if url.scheme() == "https" {
            tls::client_config(&c.tls).map_err(tls::TlsError::into_field_error)?
        } else {
            tls::plaintext_client_config().map_err(tls::TlsError::into_field_error)?
        };
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
        let mut b = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config)
            .user_agent(common::USER_AGENT)
            .tcp_nodelay(true)
            .redirect(redirects);
        if let Some(t) = common::non_zero(c.timeout.0) {
            b = b.timeout(t).connect_timeout(t);
        }
        let client =
            b.build().map_err(|e| FieldError::at("tls", format!("cannot build the HTTP client: {}", chain(&e))))?;
        Ok(HttpSender {
            name,
            signal,
            client,
            url,
            headers: headers(&c.headers)?,
            auth: None,
            encoding: c.encoding,
            gzip: (c.compression == Compression::Gzip).then_some(c.compression_params.level),
        })
    }

    /// The body as chunks: protobuf is passed through without copying; JSON needs the decoded form.
    fn encode(&self, data: &Payload) -> Result<Vec<bytes::Bytes>, SendError> {
        match self.encoding {
            Encoding::Proto => Ok(data.to_chunks()),
            Encoding::Json => {
                let decoded =
                    data.decoded().map_err(|e| SendError::Permanent(format!("cannot decode the payload: {e}")))?;
                match decoded.as_ref() {
                    Payload::Traces(r) => serde_json::to_vec(r),
                    Payload::Metrics(r) => serde_json::to_vec(r),
                    Payload::Logs(r) => serde_json::to_vec(r),
                    Payload::Encoded(_) => Ok(Vec::new()),
                }
                .map(|v| vec![bytes::Bytes::from(v)])
                .map_err(|e| SendError::Permanent(format!("cannot encode OTLP/JSON: {e}")))
            }
        }
    }

    fn log_partial_success(&self, content_type: &str, body: &[u8]) {
        match parse_partial_success(self.signal, content_type, body) {
            Ok(Some((rejected, message))) => common::log_partial_success(&self.name, self.signal, rejected, &message),
            Ok(None) => {}
            Err(e) => tracing::debug!(exporter = %self.name, error = %e, "could not parse the export response"),
        }
    }
}

#[async_trait]
impl Sender for HttpSender {
    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let chunks = self.encode(data)?;
        let mut headers = self.headers.clone();
        client_auth::apply_client_auth(self.auth.as_ref(), &mut headers)?;
        let mut req =
            self.client.post(self.url.clone()).headers(headers).header(CONTENT_TYPE, self.encoding.content_type());
        let body = match self.gzip {
            Some(level) => {
                req = req.header(CONTENT_ENCODING, "gzip");
                common::gzip_chunks(&chunks, level).map_err(|e| SendError::Permanent(format!("gzip failed: {e}")))?
            }
            None if chunks.len() == 1 => chunks[0].to_vec(),
            None => chunks.iter().flat_map(|c| c.iter().copied()).collect(),
        };
        let resp = req.body(body).send().await.map_err(|e| {
            let message = format!("POST {} failed: {}", self.url, chain(&e));
            if e.is_builder() || e.is_redirect() {
                SendError::Permanent(message)
            } else {
                SendError::Retryable { message, retry_after: None }
            }
        })?;
        let status = resp.status();
        let content_type = header_str(resp.headers(), CONTENT_TYPE).unwrap_or_default();
        if status.is_success() {
            let body = read_limited(resp, MAX_RESPONSE).await;
            self.log_partial_success(&content_type, &body);
            return Ok(());
        }
        let retry_after =
            header_str(resp.headers(), RETRY_AFTER).and_then(|v| parse_retry_after(&v, SystemTime::now()));
        let body = read_limited(resp, MAX_RESPONSE).await;
        let message = format!("HTTP {status} from {}{}", self.url, error_detail(&content_type, &body));
        Err(classify(status.as_u16(), message, retry_after))
    }
}

/// Maps an HTTP error status as the OTLP specification and otelcol do: 429, 502, 503 and 504
/// are retryable (honouring `Retry-After`), every other status is permanent.
pub fn classify(status: u16, message: String, retry_after: Option<Duration>) -> SendError {
    match status {
        429 | 502 | 503 | 504 => SendError::Retryable { message, retry_after },
        _ => SendError::Permanent(message),
    }
}

/// Parses `Retry-After`: delay-seconds or an HTTP-date (relative to `now`). Zero means "none".
pub fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    let d = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v).ok()?.duration_since(now).unwrap_or(Duration::ZERO),
    };
    (!d.is_zero()).then_some(d)
}

fn header_str(h: &HeaderMap, name: HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    out
}

fn is_json(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

fn is_proto(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/x-protobuf"))
}

/// The rejected count and message of a success response, if it carries a partial success.
fn parse_partial_success(signal: Signal, content_type: &str, body: &[u8]) -> Result<Option<(i64, String)>, String> {
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
fn error_detail(content_type: &str, body: &[u8]) -> String {
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

/// An error with its sources, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::PathSeg;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;
    use serde_json::json;

    fn url(v: serde_json::Value, s: Signal) -> Option<String> {
        OtlpHttpConfig::from_value(&v).unwrap().signal_url(s).unwrap().map(|u| u.to_string())
    }

    #[test]
    fn signal_paths_are_appended_to_the_base() {
        let v = json!({"endpoint": "https://otlp.example.com:4318"});
        assert_eq!(url(v.clone(), Signal::Traces).as_deref(), Some("https://otlp.example.com:4318/v1/traces"));
        assert_eq!(url(v, Signal::Logs).as_deref(), Some("https://otlp.example.com:4318/v1/logs"));
        let v = json!({"endpoint": "http://gw/otlp/", "metrics_endpoint": "http://m:9/custom"});
        assert_eq!(url(v.clone(), Signal::Traces).as_deref(), Some("http://gw/otlp/v1/traces"));
        assert_eq!(url(v, Signal::Metrics).as_deref(), Some("http://m:9/custom"));
        let v = json!({"traces_endpoint": "http://t:1/x"});
        assert_eq!(url(v.clone(), Signal::Logs), None);
        let e =
            HttpSender::new("otlphttp".into(), &OtlpHttpConfig::from_value(&v).unwrap(), Signal::Logs).err().unwrap();
        assert!(e.message.contains("logs_endpoint"), "{}", e.message);
        assert_eq!(
            url(json!({"endpoint": "collector:4318"}), Signal::Traces).as_deref(),
            Some("https://collector:4318/v1/traces")
        );
        let v = json!({"endpoint": "collector:4318", "tls": {"insecure": true}});
        assert_eq!(url(v, Signal::Traces).as_deref(), Some("http://collector:4318/v1/traces"));
    }

    #[test]
    fn defaults_follow_otelcol() {
        let c = OtlpHttpConfig::from_value(&json!({"endpoint": "http://c:4318"})).unwrap();
        assert_eq!(c.timeout.0, Duration::from_secs(30));
        assert_eq!(c.encoding, Encoding::Proto);
        assert_eq!(c.compression, Compression::Gzip);
    }

    #[test]
    fn bad_settings_point_at_the_field() {
        let key = |p: &[PathSeg]| -> Vec<String> {
            p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
        };
        let cases = [
            (json!({}), vec!["endpoint"]),
            (json!({"endpoint": "ftp://x"}), vec!["endpoint"]),
            (json!({"endpoint": "http://"}), vec!["endpoint"]),
            (json!({"endpoint": "http://c", "logs_endpoint": "nope://"}), vec!["logs_endpoint"]),
            (json!({"endpoint": "http://c", "encoding": "xml"}), vec!["encoding"]),
            (json!({"endpoint": "http://c", "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
            (json!({"endpoint": "http://c", "unknown": 1}), vec!["unknown"]),
            (json!({"endpoint": "http://c", "tls": {"key_file": "k"}}), vec!["tls", "cert_file"]),
        ];
        for (v, path) in cases {
            let e = OtlpHttpExporterFactory.validate(&v).expect_err(&v.to_string());
            assert_eq!(key(&e.path), path, "{v}: {}", e.message);
        }
    }

    #[test]
    fn status_mapping() {
        for s in [429, 502, 503, 504] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
        }
        for s in [300, 400, 401, 403, 404, 413, 500, 501] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), None);
        assert_eq!(parse_retry_after("0", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn partial_success_and_error_bodies() {
        use prost::Message;
        let r = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess { rejected_spans: 3, error_message: "too old".into() }),
        };
        let got = parse_partial_success(Signal::Traces, "application/x-protobuf", &r.encode_to_vec()).unwrap();
        assert_eq!(got, Some((3, "too old".to_string())));
        let j = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse_partial_success(Signal::Traces, "application/json; charset=utf-8", &j).unwrap(), got);
        assert_eq!(
            parse_partial_success(Signal::Traces, "application/json", b"{\"partialSuccess\":null}").unwrap(),
            None
        );
        assert_eq!(parse_partial_success(Signal::Traces, "text/plain", b"ok").unwrap(), None);
        assert!(parse_partial_success(Signal::Logs, "application/x-protobuf", b"\xff\xff").is_err());

        let st = tonic_types::Status { code: 3, message: "bad span".into(), details: vec![] };
        assert_eq!(error_detail("application/x-protobuf", &st.encode_to_vec()), ": bad span");
        assert_eq!(error_detail("application/json", br#"{"code":3,"message":"nope"}"#), ": nope");
        assert_eq!(error_detail("text/plain", b"  overloaded \n"), ": overloaded");
        assert_eq!(error_detail("", b""), "");
        assert!(error_detail("text/plain", &[b'x'; 1000]).chars().count() < 300);
    }
}
