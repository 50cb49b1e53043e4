//! One remote-write POST of a built request, and what the answer means.

use crate::http::{self, Retry};
use crate::prometheus::translate::{Settings, TARGET_INFO};
use async_trait::async_trait;
use inferwatch_core::exporterhelper::{RequestSender, SendError};
use inferwatch_core::pdata::Payload;
use parking_lot::Mutex;
use prost::Message;
use reqwest::Url;
use reqwest::header::HeaderMap;
use std::collections::HashMap;

/// The remote-write protocol version header value (1.0).
pub const REMOTE_WRITE_VERSION: &str = "0.1.0";

/// Maps an HTTP error status: 5xx and 429 are retryable (honouring `Retry-After`), any other
/// status is permanent.
pub fn classify(status: u16, message: String, retry_after: Option<std::time::Duration>) -> SendError {
    http::classify(Retry::TooManyOrServerError, status, message, retry_after)
}

/// One remote-write POST per attempt.
pub struct RemoteWriteSender {
    /// The translation settings.
    pub settings: Settings,
    /// The receiver's URL.
    pub url: Url,
    /// Every header of a request (configured ones plus the protocol's).
    pub headers: HeaderMap,
    /// The HTTP client.
    pub client: reqwest::Client,
    /// Name of the `target_info` family (namespaced).
    pub target_info: String,
    /// Last timestamp sent per `target_info` series: its samples never go back in time (the
    /// resource's newest point time can, across requests, and Prometheus refuses that).
    pub target_times: Mutex<HashMap<u64, i64>>,
    /// Client authenticator (`auth.authenticator`), asked for headers on each request.
    pub auth: Option<std::sync::Arc<dyn inferwatch_core::auth::ClientAuth>>,
}

impl RemoteWriteSender {
    /// The name of the `target_info` family under `namespace`.
    pub fn target_info_name(namespace: &str) -> String {
        if namespace.is_empty() { TARGET_INFO.to_string() } else { format!("{namespace}_{TARGET_INFO}") }
    }
}

#[async_trait]
impl RequestSender for RemoteWriteSender {
    /// The snappy-compressed `WriteRequest`, translated once (`None`: nothing to send).
    type Request = Option<bytes::Bytes>;

    fn encode(&self, data: &Payload) -> Result<Option<bytes::Bytes>, SendError> {
        let wr = self.request(data)?;
        if wr.timeseries.is_empty() {
            return Ok(None);
        }
        let body = snap::raw::Encoder::new()
            .compress_vec(&wr.encode_to_vec())
            .map_err(|e| SendError::Permanent(format!("snappy compression failed: {e}")))?;
        Ok(Some(body.into()))
    }

    async fn send(&self, body: &Option<bytes::Bytes>) -> Result<(), SendError> {
        let Some(body) = body else { return Ok(()) };
        let resp = http::post(&self.client, &self.url, &self.headers, self.auth.as_ref(), body.clone()).await?;
        let status = resp.status;
        if status.is_success() {
            return Ok(());
        }
        let detail = resp.short_text();
        let message = if detail.is_empty() {
            format!("HTTP {status} from {}", self.url)
        } else {
            format!("HTTP {status} from {}: {detail}", self.url)
        };
        Err(classify(status.as_u16(), message, resp.retry_after))
    }
}
