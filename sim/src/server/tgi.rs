//! The TGI flavour (`inferwatch sim --flavor tgi`): what Hugging Face text-generation-inference
//! exposes besides the OpenAI API (tests/fixtures/servers/tgi-*): `GET /metrics` with
//! TGI's `tgi_*` metrics as metrics-exporter-prometheus 0.15.3 renders them
//! ([`exposition`], recorded by [`recorder`]), `GET /info` (TGI's `Info` JSON) and its router
//! handler spans ([`trace`]), and TGI's own API: `/generate`, `/generate_stream`, `/`,
//! `/tokenize` ([`api`]).

pub mod api;
pub mod exposition;
pub mod recorder;
pub mod trace;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::api::{AppState, json_ok};
use crate::engine::EngineConfig;
use crate::engine::tokens::{mix64, prompt_key};
pub use recorder::{TgiLimits, TgiMetrics};

/// The TGI release whose surface is imitated (`version` in `/info`).
pub const TGI_VERSION: &str = "3.3.7";
/// Content type of TGI's `/metrics` (axum's for a `String` body).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// TGI's validation time (tokenisation in its validation workers) for a prompt, as modelled
/// here: 40 µs plus 150 ns per prompt token. In the TGI flavour a generation enters the engine
/// this long after its HTTP request arrived.
pub fn validation_ns(prompt_tokens: u32) -> u64 {
    40_000 + 150 * u64::from(prompt_tokens)
}

/// TGI's limits for an engine configuration: max total tokens = `max_model_len`, max input
/// tokens = one less (TGI's default), max batch total tokens = the KV cache's token capacity.
pub fn limits(cfg: &EngineConfig) -> TgiLimits {
    TgiLimits {
        max_input_tokens: cfg.max_model_len.saturating_sub(1).max(1),
        max_total_tokens: cfg.max_model_len,
        max_batch_total_tokens: u64::from(cfg.num_gpu_blocks()) * u64::from(cfg.block_size),
    }
}

/// `GET /info`: the fields of TGI's `Info` struct (router/src/lib.rs), in its order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Info {
    /// The served model name.
    pub model_id: String,
    /// Hub revision of the model (a stable stand-in derived from the model and seed).
    pub model_sha: Option<String>,
    /// Hub pipeline tag.
    pub model_pipeline_tag: Option<String>,
    /// `--max-concurrent-requests` (launcher default).
    pub max_concurrent_requests: usize,
    /// `--max-best-of`.
    pub max_best_of: usize,
    /// `--max-stop-sequences`.
    pub max_stop_sequences: usize,
    /// `--max-input-tokens`.
    pub max_input_tokens: usize,
    /// `--max-total-tokens`.
    pub max_total_tokens: usize,
    /// `--validation-workers`.
    pub validation_workers: usize,
    /// `--max-client-batch-size`.
    pub max_client_batch_size: usize,
    /// The router crate's name.
    pub router: &'static str,
    /// TGI's version.
    pub version: &'static str,
    /// Git sha of the build.
    pub sha: Option<&'static str>,
    /// Docker image label.
    pub docker_label: Option<&'static str>,
}

impl Info {
    /// The `/info` of a router serving `model_id` (backed by `root`) with `max_model_len`.
    pub fn new(model_id: &str, root: &str, max_model_len: u32, seed: u64) -> Self {
        let a = mix64(prompt_key(root) ^ seed);
        let b = mix64(a ^ 0x9e37_79b9_7f4a_7c15);
        let c = mix64(b);
        let sha = format!("{a:016x}{b:016x}{:08x}", c >> 32);
        Info {
            model_id: model_id.to_string(),
            model_sha: Some(sha),
            model_pipeline_tag: Some("text-generation".into()),
            max_concurrent_requests: 128,
            max_best_of: 2,
            max_stop_sequences: 4,
            max_input_tokens: max_model_len.saturating_sub(1).max(1) as usize,
            max_total_tokens: max_model_len as usize,
            validation_workers: 2,
            max_client_batch_size: 4,
            router: "text-generation-router",
            version: TGI_VERSION,
            sha: None,
            docker_label: None,
        }
    }
}

/// `GET /info`.
pub async fn info(State(st): State<Arc<AppState>>) -> Response {
    let model = st.served.first().map(String::as_str).unwrap_or_default();
    json_ok(&Info::new(model, &st.root, st.max_model_len, st.seed))
}

/// `GET /metrics` in the TGI flavour.
pub fn metrics_response(m: &TgiMetrics) -> Response {
    let mut r = m.render().into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_has_tgis_fields_in_order() {
        let v = serde_json::to_string(&Info::new("m", "llama-3-8b", 8192, 7)).unwrap();
        let keys = [
            "model_id",
            "model_sha",
            "model_pipeline_tag",
            "max_concurrent_requests",
            "max_best_of",
            "max_stop_sequences",
            "max_input_tokens",
            "max_total_tokens",
            "validation_workers",
            "max_client_batch_size",
            "router",
            "version",
            "sha",
            "docker_label",
        ];
        let pos: Vec<usize> = keys.iter().map(|k| v.find(&format!("\"{k}\":")).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{v}");
        let info = Info::new("m", "llama-3-8b", 8192, 7);
        assert_eq!(info.model_sha.as_ref().map(String::len), Some(40));
        assert_eq!((info.max_input_tokens, info.max_total_tokens), (8191, 8192));
        assert_eq!(info, Info::new("m", "llama-3-8b", 8192, 7), "stable");
    }

    #[test]
    fn limits_follow_the_engine() {
        let cfg = EngineConfig::default();
        let l = limits(&cfg);
        assert_eq!(l.max_total_tokens, cfg.max_model_len);
        assert_eq!(l.max_input_tokens + 1, cfg.max_model_len);
        assert_eq!(l.max_batch_total_tokens, u64::from(cfg.num_gpu_blocks()) * u64::from(cfg.block_size));
    }
}
