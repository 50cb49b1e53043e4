//! The SGLang flavour (`inferwatch sim --flavor sglang`): what an SGLang 0.5.23 server started
//! with `--enable-metrics` (and `--enable-trace`) shows besides its OpenAI API
//! (tests/fixtures/servers/sglang-*): `GET /metrics` with the `sglang:*` families as
//! prometheus_client's multiprocess collector renders them ([`exposition`], recorded from the
//! engine by [`recorder`]), SGLang's own `GET /model_info` (and the deprecated
//! `/get_model_info`), `GET /health` and `GET /health_generate`, and its OTLP spans: a root
//! span `" Req <rid[:8]>"` per request with a thread span per process ([`trace`]).

pub mod exposition;
pub mod recorder;
pub mod trace;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::oneshot;

use super::api::{AppState, json_ok};
use super::driver::Command;
use crate::engine::EngineConfig;
pub use recorder::{SglangLimits, SglangMetrics};

/// The SGLang release whose surface is imitated.
pub const SGLANG_VERSION: &str = "0.5.23";

/// SGLang's limits and constants for an engine configuration: the KV pool holds the engine's
/// blocks as tokens (SGLang's default page size is 1 token), the context length is the model
/// length, weights and KV cache take what the engine's GPU profile gives them.
pub fn limits(cfg: &EngineConfig) -> SglangLimits {
    let tokens = u64::from(cfg.num_gpu_blocks()) * u64::from(cfg.block_size);
    let model = cfg.model();
    let gib = 1024.0 * 1024.0 * 1024.0;
    SglangLimits {
        max_total_num_tokens: tokens,
        context_len: cfg.max_model_len,
        weight_memory_usage_gb: round2(model.weight_bytes() / gib),
        kv_cache_memory_usage_gb: round2(tokens as f64 * model.kv_bytes_per_token() / gib),
        startup_available_gpu_memory_gb: round2(cfg.gpu().memory_gib * 0.98),
        // Loading the weights from disk at about 1.3 GiB/s.
        weight_load_duration_seconds: round2(model.weight_bytes() / gib / 1.3),
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `GET /model_info` (and `/get_model_info`): the fields of SGLang's `model_info()`
/// (entrypoints/http_server.py), in its order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelInfo {
    /// `--model-path`.
    pub model_path: String,
    /// `--served-model-name` (the first).
    pub served_model_name: String,
    /// `--tokenizer-path` (the model path by default).
    pub tokenizer_path: String,
    /// A generation (not embedding) model.
    pub is_generation: bool,
    /// `--preferred-sampling-params`.
    pub preferred_sampling_params: Option<String>,
    /// The weight version label (`--weight-version`, default `default`).
    pub weight_version: &'static str,
    /// `--load-format`.
    pub load_format: &'static str,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<String>,
    /// `--tool-call-parser`.
    pub tool_call_parser: Option<String>,
    /// `--disaggregation-mode`.
    pub disaggregation_mode: &'static str,
    /// Vision input support.
    pub has_image_understanding: bool,
    /// Audio input support.
    pub has_audio_understanding: bool,
    /// The Hugging Face `model_type`.
    pub model_type: Option<&'static str>,
    /// The Hugging Face `architectures`.
    pub architectures: Option<Vec<&'static str>>,
}

impl ModelInfo {
    /// The model info of a server serving `served` from model `root`.
    pub fn new(served: &str, root: &str) -> Self {
        let lower = root.to_ascii_lowercase();
        let (model_type, arch) = if lower.contains("llama") {
            (Some("llama"), Some(vec!["LlamaForCausalLM"]))
        } else if lower.contains("mistral") {
            (Some("mistral"), Some(vec!["MistralForCausalLM"]))
        } else if lower.contains("qwen") {
            (Some("qwen2"), Some(vec!["Qwen2ForCausalLM"]))
        } else {
            (None, None)
        };
        ModelInfo {
            model_path: root.to_string(),
            served_model_name: served.to_string(),
            tokenizer_path: root.to_string(),
            is_generation: true,
            preferred_sampling_params: None,
            weight_version: "default",
            load_format: "auto",
            reasoning_parser: None,
            tool_call_parser: None,
            disaggregation_mode: "null",
            has_image_understanding: false,
            has_audio_understanding: false,
            model_type,
            architectures: arch,
        }
    }
}

/// `GET /model_info`, `GET /get_model_info`.
pub async fn model_info(State(st): State<Arc<AppState>>) -> Response {
    let served = st.served.first().map(String::as_str).unwrap_or_default();
    json_ok(&ModelInfo::new(served, &st.root))
}

/// `GET /health_generate`: SGLang sends a one-token generation and answers 200 once the
/// scheduler answers anything; here the engine loop is asked for its state (it answers only
/// while it runs), so 200 means the engine is alive, 503 that it is gone.
pub async fn health_generate(State(st): State<Arc<AppState>>) -> Response {
    let (reply, rx) = oneshot::channel();
    if st.cmd.send(Command::GetFaults { reply }).is_err() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    match tokio::time::timeout(std::time::Duration::from_secs(20), rx).await {
        Ok(Ok(_)) => StatusCode::OK.into_response(),
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// `GET /metrics` in the SGLang flavour.
pub fn metrics_response(m: &SglangMetrics) -> Response {
    let mut r = m.render().into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(super::prom::CONTENT_TYPE));
    r
}

/// SGLang's HTTP middleware (`observability/http_request_metrics.py`): every request counts
/// in `sglang:http_requests_total{endpoint,method}` and `sglang:http_requests_active` until
/// the handler returns its response (for a stream: once its headers are out), then in
/// `sglang:http_responses_total{endpoint,method,status_code}`; `endpoint` is the matched
/// route. (SGLang also counts unmatched paths under their raw path; here they are not, so
/// that a client cannot grow the label set.)
pub async fn http_metrics(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(m) = st.sglang.clone() else { return next.run(req).await };
    let Some(endpoint) = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()) else {
        return next.run(req).await;
    };
    let method = req.method().as_str().to_string();
    m.lock().http_started(&endpoint, &method);
    let mut guard = Active { m, endpoint, method, open: true };
    let r = next.run(req).await;
    guard.open = false;
    guard.m.lock().http_finished(&guard.endpoint, &guard.method, r.status().as_u16());
    r
}

/// One request in `sglang:http_requests_active`: a client that goes away before the response
/// drops the handler, and the drop takes it out of the gauge (no response is counted, as
/// SGLang's `finally` after a cancelled `call_next` counts none).
struct Active {
    m: Arc<parking_lot::Mutex<SglangMetrics>>,
    endpoint: String,
    method: String,
    open: bool,
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.open {
            self.m.lock().http_abandoned(&self.endpoint, &self.method);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_info_has_sglangs_fields_in_order() {
        let v = serde_json::to_string(&ModelInfo::new("m", "llama-3-8b")).unwrap();
        let keys = [
            "model_path",
            "served_model_name",
            "tokenizer_path",
            "is_generation",
            "preferred_sampling_params",
            "weight_version",
            "load_format",
            "reasoning_parser",
            "tool_call_parser",
            "disaggregation_mode",
            "has_image_understanding",
            "has_audio_understanding",
            "model_type",
            "architectures",
        ];
        let pos: Vec<usize> = keys.iter().map(|k| v.find(&format!("\"{k}\":")).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{v}");
        assert!(v.contains("\"architectures\":[\"LlamaForCausalLM\"]"), "{v}");
    }

    #[test]
    fn limits_follow_the_engine() {
        let cfg = EngineConfig::default();
        let l = limits(&cfg);
        assert_eq!(l.max_total_num_tokens, u64::from(cfg.num_gpu_blocks()) * u64::from(cfg.block_size));
        assert_eq!(l.context_len, cfg.max_model_len);
        assert!(l.weight_memory_usage_gb > 1.0 && l.kv_cache_memory_usage_gb > 0.0);
        assert!(l.weight_memory_usage_gb + l.kv_cache_memory_usage_gb < l.startup_available_gpu_memory_gb);
    }
}
