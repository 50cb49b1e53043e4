//! The HTTP sending shared by the HTTP exporters (`otlphttp`, `prometheusremotewrite`,
//! `alertmanager`): the client, one POST of an already built body, `Retry-After`, and which
//! answers each protocol retries.

use crate::common;
use crate::tls;
use inferwatch_core::auth::ClientAuth;
use inferwatch_core::component::FieldError;
use inferwatch_core::exporterhelper::SendError;
use inferwatch_core::extension::client_auth;
use inferwatch_core::settings::TlsClientSettings;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Most bytes of a response body read (for partial success or an error message).
pub const MAX_RESPONSE: usize = 64 * 1024;

/// The HTTP client of an exporter posting to `url`: TLS for `https://` (plain text otherwise),
/// the shared `User-Agent`, `timeout` (connection included) and the `redirect` policy.
pub fn client(
    url: &Url,
    settings: &TlsClientSettings,
    timeout: Option<Duration>,
    redirect: reqwest::redirect::Policy,
) -> Result<reqwest::Client, FieldError> {
    let tls_config = if url.scheme() == "https" {
        tls::client_config(settings).map_err(tls::TlsError::into_field_error)?
    } else {
        tls::plaintext_client_config().map_err(tls::TlsError::into_field_error)?
    };
    let mut b = reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config)
        .user_agent(common::USER_AGENT)
        .tcp_nodelay(true)
        .redirect(redirect);
    if let Some(t) = timeout {
        b = b.timeout(t).connect_timeout(t);
    }
    b.build().map_err(|e| FieldError::at("tls", format!("cannot build the HTTP client: {}", chain(&e))))
}

/// Parses an exporter's `http(s)://` URL at `key` (a scheme and a host are required).
pub fn parse_url(key: &str, s: &str) -> Result<Url, FieldError> {
    let url = Url::parse(s).map_err(|e| FieldError::at(key, format!("invalid URL {s:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: the scheme must be http or https")));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::at(key, format!("invalid URL {s:?}: missing host")));
    }
    Ok(url)
}

/// Builds the header map of the `headers` setting (values marked sensitive).
pub fn headers(h: &BTreeMap<String, String>) -> Result<HeaderMap, FieldError> {
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

/// Which HTTP error statuses a protocol retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The OTLP specification: 429, 502, 503 and 504.
    Otlp,
    /// Prometheus remote write and Alertmanager: 429 and every 5xx.
    TooManyOrServerError,
}

/// Maps an HTTP error status: retryable (with the server's `Retry-After`) or permanent.
pub fn classify(retry: Retry, status: u16, message: String, retry_after: Option<Duration>) -> SendError {
    let retryable = match retry {
        Retry::Otlp => matches!(status, 429 | 502 | 503 | 504),
        Retry::TooManyOrServerError => status == 429 || (500..600).contains(&status),
    };
    if retryable { SendError::Retryable { message, retry_after } } else { SendError::Permanent(message) }
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

/// What a POST got back.
#[derive(Debug)]
pub struct Response {
    /// The status.
    pub status: reqwest::StatusCode,
    /// The `Content-Type`, empty when absent.
    pub content_type: String,
    /// The server's `Retry-After` (only read from an error answer).
    pub retry_after: Option<Duration>,
    /// The body, at most [`MAX_RESPONSE`] bytes of it.
    pub body: Vec<u8>,
}

impl Response {
    /// The trimmed body as text, at most 256 characters (for an error message).
    pub fn short_text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().chars().take(256).collect()
    }
}

/// One POST of `body` to `url` with `headers` and the authenticator's headers (asked on each
/// attempt: a token may have changed). A transport failure is retryable; a request that cannot
/// be built or a refused redirect is permanent. Any status comes back as a [`Response`].
pub async fn post(
    client: &reqwest::Client,
    url: &Url,
    headers: &HeaderMap,
    auth: Option<&Arc<dyn ClientAuth>>,
    body: bytes::Bytes,
) -> Result<Response, SendError> {
    let mut headers = headers.clone();
    client_auth::apply_client_auth(auth, &mut headers)?;
    let resp = client.post(url.clone()).headers(headers).body(body).send().await.map_err(|e| {
        let message = format!("POST {url} failed: {}", chain(&e));
        if e.is_builder() || e.is_redirect() {
            SendError::Permanent(message)
        } else {
            SendError::Retryable { message, retry_after: None }
        }
    })?;
    let status = resp.status();
    let header = |name: HeaderName| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let content_type = header(CONTENT_TYPE).unwrap_or_default();
    let retry_after = if status.is_success() {
        None
    } else {
        header(RETRY_AFTER).and_then(|v| parse_retry_after(&v, SystemTime::now()))
    };
    let body = read_limited(resp, MAX_RESPONSE).await;
    Ok(Response { status, content_type, retry_after, body })
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

/// An error with its sources, `a: b: c`.
pub fn chain(e: &dyn std::error::Error) -> String {
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

    #[test]
    fn status_mapping_per_protocol() {
        let retried = |r, s| matches!(classify(r, s, "x".into(), None), SendError::Retryable { .. });
        for s in [429, 502, 503, 504] {
            assert!(retried(Retry::Otlp, s) && retried(Retry::TooManyOrServerError, s), "{s}");
        }
        for s in [500, 501, 599] {
            assert!(!retried(Retry::Otlp, s) && retried(Retry::TooManyOrServerError, s), "{s}");
        }
        for s in [300, 400, 401, 404, 409, 413] {
            assert!(!retried(Retry::Otlp, s) && !retried(Retry::TooManyOrServerError, s), "{s}");
        }
        let d = Some(Duration::from_secs(3));
        assert_eq!(
            classify(Retry::Otlp, 503, "m".into(), d),
            SendError::Retryable { message: "m".into(), retry_after: d }
        );
    }

    #[test]
    fn urls_need_a_scheme_and_a_host() {
        assert_eq!(parse_url("endpoint", "http://p:9/w").unwrap().as_str(), "http://p:9/w");
        for s in ["p:9090", "ftp://p/x", "http://"] {
            assert_eq!(parse_url("endpoint", s).unwrap_err().path, FieldError::at("endpoint", "").path, "{s}");
        }
    }
}
