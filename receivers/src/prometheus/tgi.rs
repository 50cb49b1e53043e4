//! The model of a Hugging Face TGI target. TGI's metrics carry no model label, so the receiver
//! adds `model_name`: the configured `tgi.model`, else the `model_id` of the target's
//! `GET /info`, cached until a scrape of the target fails (it may have restarted with another
//! model) and asked again at the next scrape when the lookup itself fails.

use super::parse::Exposition;
use std::time::Duration;

/// Most bytes of an `/info` answer read.
const MAX_INFO: usize = 1024 * 1024;

/// Whether an exposition comes from TGI (its metric names start with `tgi_`).
pub fn is_tgi(expo: &Exposition<'_>) -> bool {
    expo.families.iter().any(|f| f.name.starts_with("tgi_"))
}

/// Why `/info` gave no model.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// The request failed.
    #[error("GET {url}: {source}")]
    Request {
        /// The URL asked.
        url: String,
        /// The cause.
        source: reqwest::Error,
    },
    /// The answer was not 2xx.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL asked.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The answer was too long, not JSON, or had no `model_id` string.
    #[error("GET {url}: {why}")]
    Body {
        /// The URL asked.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// No answer in time.
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL asked.
        url: String,
        /// The limit.
        timeout: Duration,
    },
}

/// The `model_id` of a TGI `/info` document.
pub fn model_id(body: &[u8]) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("model_id").and_then(|m| m.as_str()) {
        Some(m) if !m.trim().is_empty() => Ok(m.to_string()),
        _ => Err("no model_id string in the answer".into()),
    }
}

/// Asks `url` (a target's `/info`) for its `model_id`.
pub async fn fetch_model(client: &reqwest::Client, url: &reqwest::Url, timeout: Duration) -> Result<String, InfoError> {
    let u = || url.to_string();
    let fetch = async {
        let mut resp = client
            .get(url.clone())
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|source| InfoError::Request { url: u(), source })?;
        if !resp.status().is_success() {
            return Err(InfoError::Status { url: u(), status: resp.status().as_u16() });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|source| InfoError::Request { url: u(), source })? {
            if body.len() + chunk.len() > MAX_INFO {
                return Err(InfoError::Body { url: u(), why: format!("answer longer than {MAX_INFO} bytes") });
            }
            body.extend_from_slice(&chunk);
        }
        model_id(&body).map_err(|why| InfoError::Body { url: u(), why })
    };
    tokio::time::timeout(timeout, fetch).await.map_err(|_| InfoError::Timeout { url: u(), timeout })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_id_is_read() {
        let body = br#"{"model_id":"bigscience/bloom-560m","model_sha":"abc","max_total_tokens":2048}"#;
        assert_eq!(model_id(body).unwrap(), "bigscience/bloom-560m");
        assert!(model_id(b"{}").is_err());
        assert!(model_id(br#"{"model_id": 3}"#).is_err());
        assert!(model_id(b"<html>").is_err());
    }
}
