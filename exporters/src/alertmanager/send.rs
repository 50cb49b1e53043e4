//! One `POST /api/v2/alerts` of the alerts of a request, and what the answer means.

use super::config::AlertmanagerConfig;
use super::encode::{Render, to_alerts};
use crate::http::{self, Retry};
use async_trait::async_trait;
use inferwatch_core::auth::ClientAuth;
use inferwatch_core::component::FieldError;
use inferwatch_core::exporterhelper::{RequestSender, SendError};
use inferwatch_core::pdata::Payload;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// One `POST /api/v2/alerts` per attempt.
pub struct AlertmanagerSender {
    pub(super) client: reqwest::Client,
    pub(super) url: Url,
    /// `Content-Type: application/json`.
    pub(super) headers: HeaderMap,
    pub(super) render: Render,
    pub(super) auth: Option<Arc<dyn ClientAuth>>,
}

impl AlertmanagerSender {
    /// Builds the HTTP client for these settings.
    pub fn new(c: &AlertmanagerConfig) -> Result<Self, FieldError> {
        c.check()?;
        let url = c.url()?;
        let client = http::client(&url, &c.tls, c.exporter.timeout(), reqwest::redirect::Policy::none())?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(AlertmanagerSender {
            client,
            url,
            headers,
            render: Render { generator_url: c.generator_url.clone(), ends_in: c.ends_in() },
            auth: None,
        })
    }
}

/// Maps an Alertmanager response status: 429 and 5xx are retryable, other statuses permanent.
pub fn classify(status: u16, message: String, retry_after: Option<Duration>) -> SendError {
    http::classify(Retry::TooManyOrServerError, status, message, retry_after)
}

#[async_trait]
impl RequestSender for AlertmanagerSender {
    /// The decoded log records. The body is rendered on each attempt: a firing alert's `endsAt`
    /// is `now + 3 × repeat` at the time it is sent, so a late retry must not send an old one.
    type Request = ExportLogsServiceRequest;

    fn encode(&self, data: &Payload) -> Result<ExportLogsServiceRequest, SendError> {
        let decoded = data.decoded().map_err(|e| SendError::Permanent(format!("cannot decode the payload: {e}")))?;
        match decoded.into_owned() {
            Payload::Logs(req) => Ok(req),
            _ => Err(SendError::Permanent(format!("alertmanager exports logs, got {}", data.signal()))),
        }
    }

    async fn send(&self, req: &ExportLogsServiceRequest) -> Result<(), SendError> {
        let (alerts, _) = to_alerts(req, SystemTime::now(), &self.render);
        if alerts.is_empty() {
            return Ok(());
        }
        let body = serde_json::to_vec(&alerts).map_err(|e| SendError::Permanent(format!("cannot encode: {e}")))?;
        let resp = http::post(&self.client, &self.url, &self.headers, self.auth.as_ref(), body.into()).await?;
        let status = resp.status;
        if status.is_success() {
            return Ok(());
        }
        let message = format!("HTTP {status} from {}: {}", self.url, resp.short_text());
        Err(classify(status.as_u16(), message, resp.retry_after))
    }
}
