//! `http_sd_configs`: target groups from an HTTP endpoint answering Prometheus' HTTP SD format
//! (`200`, `Content-Type: application/json`, `[{targets: [...], labels: {...}}]`), fetched every
//! `refresh_interval` (default 1m) with the job's kind of TLS and credentials. Each group gets
//! `__meta_url`. A failed refresh keeps the last groups and is counted (`reason="http_sd_error"`).

use super::{RawGroup, SdContext, Slot, TargetGroup};
use crate::prometheus::ScrapeAuth;
use crate::prometheus::http_client::HttpClientConfig;
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Prometheus' default `refresh_interval` of HTTP discovery.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(60);
/// Largest answer read.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// Most time one refresh may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// One `http_sd_configs` entry. (Its `Deserialize` is in [`crate::prometheus::http_client`].)
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct HttpSdConfig {
    /// The endpoint (`http` or `https`).
    pub url: Option<String>,
    /// Time between refreshes (default 1m).
    #[serde(default)]
    pub refresh_interval: Option<GoDuration>,
    /// TLS, credentials and redirects towards the endpoint.
    #[serde(skip)]
    pub http: HttpClientConfig,
}

impl HttpSdConfig {
    /// The refresh interval.
    pub fn refresh(&self) -> Duration {
        self.refresh_interval.map_or(DEFAULT_REFRESH, |d| d.0)
    }
}

/// One refresh: the groups the endpoint lists now.
pub async fn fetch_groups(
    client: &reqwest::Client,
    url: &reqwest::Url,
    auth: Option<&ScrapeAuth>,
) -> Result<Vec<TargetGroup>, String> {
    let headers = match auth {
        Some(a) => a.headers()?,
        None => http::HeaderMap::new(),
    };
    let work = async {
        let mut resp = client
            .get(url.clone())
            .headers(headers)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if resp.status() != http::StatusCode::OK {
            return Err(format!("{url}: HTTP {}", resp.status().as_u16()));
        }
        let ct = resp.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !ct.trim_start().to_ascii_lowercase().starts_with("application/json") {
            return Err(format!("{url}: unsupported content type {ct:?} (application/json)"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(format!("{url}: answer larger than {MAX_BODY} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let raw: Vec<RawGroup> = serde_json::from_slice(&body).map_err(|e| format!("{url}: {e}"))?;
        let shown = url.to_string();
        Ok(raw
            .into_iter()
            .enumerate()
            .map(|(i, g)| g.into_group(format!("{shown}:{i}"), ("__meta_url", &shown)))
            .collect())
    };
    tokio::time::timeout(TIMEOUT, work).await.unwrap_or_else(|_| Err(format!("{url}: no answer within {TIMEOUT:?}")))
}

/// Refreshes until cancelled.
pub async fn run(
    refresh: Duration,
    url: reqwest::Url,
    client: reqwest::Client,
    auth: Option<Arc<ScrapeAuth>>,
    slot: Slot,
    ctx: SdContext,
    cancel: CancellationToken,
) {
    let mut failing = false;
    loop {
        let got = tokio::select! {
            _ = cancel.cancelled() => return,
            g = fetch_groups(&client, &url, auth.as_deref()) => g,
        };
        match got {
            Ok(groups) => {
                if failing {
                    tracing::info!(job = %ctx.job, %url, "http_sd: the endpoint answers again");
                }
                failing = false;
                if slot.publish(groups) > 0 {
                    ctx.failed("http", "sd_targets_cut");
                }
            }
            Err(e) => {
                ctx.failed("http", "http_sd_error");
                if !failing {
                    tracing::warn!(job = %ctx.job, error = %e, "http_sd: refresh failed; keeping the last targets");
                }
                failing = true;
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(refresh) => {}
        }
    }
}
