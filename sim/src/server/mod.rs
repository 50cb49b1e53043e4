//! The real-time OpenAI-compatible server (`inferwatch sim`): vLLM's HTTP API, `/metrics`
//! and OTLP spans around the discrete-event [`Engine`], driven by the wall clock. With
//! `--flavor tgi` it shows Hugging Face TGI's telemetry instead: `/metrics` with TGI's
//! `tgi_*` metrics, `GET /info`, and TGI's router handler spans ([`tgi`]); the OpenAI API is
//! the same in both flavours. With `--flavor sglang` it shows SGLang's (`sglang:*` metrics as
//! an SGLang server with `--enable-metrics` serves them, `/model_info`, `/health_generate`, and
//! SGLang's request spans; [`sglang`]).
//!
//! ```no_run
//! # async fn f() -> Result<(), inferwatch_sim::server::ServerError> {
//! use clap::Parser;
//! use inferwatch_sim::server::{SimArgs, SimServer};
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     sim: SimArgs,
//! }
//! let args = Cli::parse_from(["sim", "--port", "0", "--served-model-name", "m"]).sim;
//! let server = SimServer::start(args).await?;
//! println!("listening on {}", server.base_url());
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! The `--config` file (YAML; unknown keys are errors):
//!
//! ```yaml
//! served_model_name: llama-3-8b            # default: the model's name
//! median_output_tokens: 128                # natural answer length (log-normal median)
//! vllm_version: "0.33"                     # /metrics families of vLLM 0.33 (default), "0.10" or "0.6" (V0)
//! engine:                                  # crate::engine::EngineConfig
//!   gpu: a10g                              # a10g | l4 | mi300x | a full profile map
//!   model: llama-3-8b
//!   max_num_seqs: 256
//!   max_model_len: 8192
//!   version: v1
//!   seed: 7
//! faults:                                  # crate::faults::Fault; times from server start
//!   - { kind: queue_blocking, onset: 20s, strength: 0.5 }
//! ```
//!
//! Command-line flags override the file.

pub mod admin;
pub mod api;
pub mod driver;
pub mod prom;
pub mod prompt;
pub mod sglang;
pub mod telemetry;
pub mod tgi;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use inferwatch_core::pdata::Signal;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, EngineConfig, EngineError, GpuProfile, NamedOr};
use crate::faults::{Fault, FaultSet};
use crate::scenario::ScenarioError;
use api::AppState;
use driver::{Clock, Driver};
use prom::PromState;
pub use prom::VllmVersion;
use sglang::SglangMetrics;
use tgi::TgiMetrics;

/// Errors of starting or running the simulator.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The configuration (file or flags) is invalid.
    #[error("{0}")]
    Config(String),
    /// The engine refused its configuration or faults.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An OTLP exporter could not be built.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Serve(std::io::Error),
    /// The scenario run failed.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A background task panicked or was cancelled.
    #[error("task failed: {0}")]
    Task(String),
}

impl ServerError {
    /// The process exit code: 2 for bad input (configuration, scenario file), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServerError::Config(_) | ServerError::Engine(_) | ServerError::Read { .. } => 2,
            ServerError::Scenario(ScenarioError::Parse { .. } | ScenarioError::Invalid { .. }) => 2,
            _ => 1,
        }
    }
}

/// A built-in GPU profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuName {
    /// NVIDIA A10G.
    A10g,
    /// NVIDIA L4.
    L4,
    /// AMD Instinct MI300X.
    Mi300x,
}

impl GpuName {
    /// The profile.
    pub fn profile(self) -> GpuProfile {
        match self {
            GpuName::A10g => GpuProfile::a10g(),
            GpuName::L4 => GpuProfile::l4(),
            GpuName::Mi300x => GpuProfile::mi300x(),
        }
    }
}

/// Whose telemetry the simulator shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    /// vLLM V1: `vllm:*` metrics, `llm_request` spans.
    #[default]
    Vllm,
    /// Hugging Face TGI: `tgi_*` metrics, `GET /info`, router handler spans.
    Tgi,
    /// SGLang: `sglang:*` metrics, `GET /model_info`, `" Req <rid>"` request spans.
    Sglang,
}

/// `inferwatch sim` options (vLLM's flag names where vLLM has them).
#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name(s) the API answers to; the first labels the metrics (default: the model's name).
    #[arg(long = "served-model-name", value_name = "NAME", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Version label of this instance (`service.version`; faults may target one version).
    #[arg(long = "version", value_name = "VERSION")]
    pub model_version: Option<String>,
    /// Seed of the synthetic output text and of the engine's randomness.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Degrade the answers' quality, 0 (off, default) to 1: each output token is drawn from
    /// another answer with this probability, and the top log-probability is scaled by
    /// 1 − 0.6 · P (the first token's entropy, TLE, rises; RCI against the undegraded answers
    /// rises). For quality A/B tests: run version B with it.
    #[arg(long, value_name = "P", value_parser = parse_quality_noise)]
    pub quality_noise: Option<f64>,
    /// Send `llm_request` spans here: grpc://H:P, http://H:P or H:P (OTLP/gRPC), or
    /// http(s)://H:P/v1/traces (OTLP/HTTP protobuf).
    #[arg(long, value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,
    /// Send the per-layer KV usage gauge (sampled every 100 ms) here; same URL forms.
    #[arg(long, value_name = "URL")]
    pub otlp_metrics_endpoint: Option<String>,
    /// YAML configuration: GPU, model, engine limits, faults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Built-in GPU profile (overrides the file).
    #[arg(long, value_enum)]
    pub gpu: Option<GpuName>,
    /// Maximum sequences in the running batch.
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<u32>,
    /// Maximum prompt + output tokens.
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<u32>,
    /// Token budget of one engine step.
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<u32>,
    /// Number of KV-cache blocks (instead of what fits in memory).
    #[arg(long, value_name = "N")]
    pub num_gpu_blocks_override: Option<u32>,
    /// How long finished spans wait to be batched into one export, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub otlp_batch_delay_ms: u64,
    /// Run this scenario on a simulated clock instead of serving (needs --out).
    #[arg(long, value_name = "FILE", requires = "out")]
    pub scenario: Option<PathBuf>,
    /// Output directory of --scenario.
    #[arg(long, value_name = "DIR", requires = "scenario")]
    pub out: Option<PathBuf>,
    /// Whose telemetry to show on /metrics, /info and in spans: vllm, tgi or sglang.
    #[arg(long, value_enum, default_value_t = Flavor::Vllm)]
    pub flavor: Flavor,
    /// Which vLLM release's `/metrics` families to show: 0.33 (default), 0.10 or 0.6 (the V0
    /// engine; overrides the file's `vllm_version`).
    #[arg(long, value_enum, value_name = "VERSION")]
    pub vllm_version: Option<VllmVersion>,
    /// TGI flavour: most native requests (`/generate`, `/generate_stream`, `/`) in flight;
    /// beyond it they get TGI's 429 `overloaded` (TGI's `--max-concurrent-requests`).
    #[arg(long, value_name = "N", default_value_t = tgi::api::MAX_CONCURRENT_REQUESTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_requests: u32,
}

impl Default for SimArgs {
    fn default() -> Self {
        SimArgs {
            host: "127.0.0.1".into(),
            port: 8000,
            served_model_name: Vec::new(),
            model_version: None,
            seed: None,
            quality_noise: None,
            otlp_traces_endpoint: None,
            otlp_metrics_endpoint: None,
            config: None,
            gpu: None,
            max_num_seqs: None,
            max_model_len: None,
            max_num_batched_tokens: None,
            num_gpu_blocks_override: None,
            otlp_batch_delay_ms: 1000,
            scenario: None,
            out: None,
            flavor: Flavor::Vllm,
            vllm_version: None,
            max_concurrent_requests: tgi::api::MAX_CONCURRENT_REQUESTS,
        }
    }
}

fn parse_quality_noise(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("must be a number from 0 to 1, got {s:?}")),
    }
}

fn default_median() -> f64 {
    128.0
}

/// The `--config` file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Model name the API answers to.
    #[serde(default)]
    pub served_model_name: Option<String>,
    /// Median natural output length in tokens (answers stop there unless `max_tokens` is lower).
    #[serde(default = "default_median")]
    pub median_output_tokens: f64,
    /// Engine configuration.
    #[serde(default)]
    pub engine: EngineConfig,
    /// Faults; their times count from the server's start.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Which vLLM release's `/metrics` families to show (`"0.33"`, the default, `"0.10"` or `"0.6"`).
    #[serde(default)]
    pub vllm_version: Option<VllmVersion>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            served_model_name: None,
            median_output_tokens: default_median(),
            engine: EngineConfig::default(),
            faults: Vec::new(),
            vllm_version: None,
        }
    }
}

impl SimConfig {
    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self, ServerError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ServerError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text).map_err(|e| ServerError::Config(format!("{}: {e}", path.display())))
    }

    /// Parses configuration YAML (errors carry line and column).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let c: SimConfig = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if !(c.median_output_tokens.is_finite() && c.median_output_tokens >= 1.0) {
            return Err("median_output_tokens: must be >= 1".into());
        }
        Ok(c)
    }
}

/// The effective configuration: the file with the flags applied.
fn effective_config(args: &SimArgs) -> Result<(SimConfig, Vec<String>), ServerError> {
    let mut cfg = match &args.config {
        Some(p) => SimConfig::load(p)?,
        None => SimConfig::default(),
    };
    let e = &mut cfg.engine;
    if let Some(g) = args.gpu {
        e.gpu = NamedOr(g.profile());
    }
    if let Some(s) = args.seed {
        e.seed = s;
    }
    if let Some(v) = &args.model_version {
        e.version = v.clone();
    }
    if let Some(n) = args.max_num_seqs {
        e.max_num_seqs = n;
    }
    if let Some(n) = args.max_model_len {
        e.max_model_len = n;
    }
    if let Some(n) = args.max_num_batched_tokens {
        e.max_num_batched_tokens = n;
    }
    if let Some(n) = args.num_gpu_blocks_override {
        e.num_gpu_blocks_override = Some(n);
    }
    e.token_events = true;
    e.step_events = true;
    let mut served = args.served_model_name.clone();
    if served.is_empty() {
        served.push(cfg.served_model_name.clone().unwrap_or_else(|| cfg.engine.model().name.clone()));
    }
    if served.iter().any(|s| s.trim().is_empty()) {
        return Err(ServerError::Config("--served-model-name: names must not be empty".into()));
    }
    Ok((cfg, served))
}

/// A running simulator.
pub struct SimServer {
    addr: SocketAddr,
    /// Stops everything if the server is dropped without [`SimServer::shutdown`].
    _stop_on_drop: tokio_util::sync::DropGuard,
    http_stop: CancellationToken,
    engine_stop: CancellationToken,
    kv_stop: CancellationToken,
    http: JoinHandle<Result<(), std::io::Error>>,
    driver: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
}

impl SimServer {
    /// Starts the engine, the exporters and the HTTP server; returns once it is listening.
    pub async fn start(args: SimArgs) -> Result<Self, ServerError> {
        let (cfg, served) = effective_config(&args)?;
        let mut engine = Engine::new(cfg.engine.clone())?;
        engine.set_faults(FaultSet { faults: cfg.faults.clone() })?;
        let ecfg = engine.config().clone();
        let clock = Clock::start();
        let unix0_s = clock.unix0() as f64 / 1e9;
        let vllm_version = args.vllm_version.or(cfg.vllm_version).unwrap_or_default();
        let prom = Arc::new(Mutex::new(PromState::new(&served[0], &ecfg, unix0_s).with_vllm_version(vllm_version)));
        let tgi_metrics =
            (args.flavor == Flavor::Tgi).then(|| Arc::new(Mutex::new(TgiMetrics::new(tgi::limits(&ecfg)))));
        let sglang_metrics = (args.flavor == Flavor::Sglang)
            .then(|| Arc::new(Mutex::new(SglangMetrics::new(&served[0], sglang::limits(&ecfg)))));
        let resource = match args.flavor {
            Flavor::Vllm => telemetry::resource(&ecfg.version),
            Flavor::Tgi => telemetry::resource_named(&ecfg.version, tgi::trace::SERVICE_NAME),
            Flavor::Sglang => telemetry::resource_named(&ecfg.version, sglang::trace::SERVICE_NAME),
        };
        let scope = match args.flavor {
            Flavor::Vllm => telemetry::vllm_scope(),
            Flavor::Tgi => tgi::trace::scope(),
            Flavor::Sglang => sglang::trace::scope(),
        };
        let mut background = Vec::new();

        let spans_tx = match &args.otlp_traces_endpoint {
            Some(url) => {
                let target = telemetry::parse_endpoint(url, Signal::Traces)
                    .map_err(|e| ServerError::Config(format!("--otlp-traces-endpoint: {e}")))?;
                let node = telemetry::exporter(&target, Signal::Traces).await?;
                let (tx, rx) = mpsc::channel(16 * 1024);
                let delay = Duration::from_millis(args.otlp_batch_delay_ms.max(1));
                background.push(tokio::spawn(telemetry::span_export_loop(rx, node, resource.clone(), scope, delay)));
                Some(tx)
            }
            None => None,
        };
        let all = CancellationToken::new();
        let kv_stop = all.child_token();
        if let Some(url) = &args.otlp_metrics_endpoint {
            let target = telemetry::parse_endpoint(url, Signal::Metrics)
                .map_err(|e| ServerError::Config(format!("--otlp-metrics-endpoint: {e}")))?;
            let node = telemetry::exporter(&target, Signal::Metrics).await?;
            let p = prom.clone();
            background.push(tokio::spawn(telemetry::kv_layer_loop(
                move || p.lock().kv_usage,
                ecfg.model().num_layers,
                Duration::from_millis(100),
                10,
                node,
                resource.clone(),
                kv_stop.clone(),
            )));
        }

        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let engine_stop = all.child_token();
        let mut driver = Driver::new(engine, clock, prom.clone(), spans_tx);
        if let Some(m) = &tgi_metrics {
            driver = driver.with_tgi(m.clone());
        }
        if let Some(m) = &sglang_metrics {
            driver = driver.with_sglang(m.clone(), &served[0]);
        }
        let driver = tokio::spawn(driver.run(cmd_rx, engine_stop.clone()));

        let state = Arc::new(AppState {
            cmd: cmd_tx,
            clock,
            prom,
            tgi: tgi_metrics,
            sglang: sglang_metrics,
            served: served.clone(),
            root: ecfg.model().name.clone(),
            max_model_len: ecfg.max_model_len,
            seed: ecfg.seed,
            vocab: ecfg.model().vocab_size,
            quality_noise: args.quality_noise.unwrap_or(0.0),
            median_output_tokens: cfg.median_output_tokens,
            started_unix_s: clock.unix0() / 1_000_000_000,
            next_id: AtomicU64::new(1),
            media: api::MediaState::new(),
        });
        let bind = if args.host.contains(':') && !args.host.starts_with('[') {
            format!("[{}]:{}", args.host, args.port)
        } else {
            format!("{}:{}", args.host, args.port)
        };
        let listener = match tokio::net::TcpListener::bind(&bind).await {
            Ok(l) => l,
            Err(source) => {
                all.cancel();
                return Err(ServerError::Bind { addr: bind, source });
            }
        };
        let addr = listener.local_addr().map_err(|source| ServerError::Bind { addr: bind, source })?;
        let http_stop = all.child_token();
        let stop = http_stop.clone();
        let max_concurrent = args.max_concurrent_requests as usize;
        let http = tokio::spawn(async move {
            axum::serve(listener, router(state, max_concurrent))
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        });
        tracing::info!(
            address = %addr, model = %served[0], gpu = %ecfg.gpu().name, version = %ecfg.version,
            kv_blocks = ecfg.num_gpu_blocks(), flavor = ?args.flavor, "inferwatch sim is serving the OpenAI API"
        );
        Ok(SimServer {
            addr,
            _stop_on_drop: all.drop_guard(),
            http_stop,
            engine_stop,
            kv_stop,
            http,
            driver,
            background,
        })
    }

    /// The bound address (the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting requests, lets those in flight finish (up to 5 s), stops the engine
    /// and flushes the telemetry (up to 5 s per exporter).
    pub async fn shutdown(self) {
        self.http_stop.cancel();
        match tokio::time::timeout(Duration::from_secs(5), self.http).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server error at shutdown"),
            Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed"),
            Err(_) => tracing::warn!("requests still in flight after 5 s; stopping anyway"),
        }
        self.engine_stop.cancel();
        self.kv_stop.cancel();
        let _ = self.driver.await;
        for t in self.background {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

fn router(state: Arc<AppState>, max_concurrent_requests: usize) -> Router {
    let tgi = state.tgi.is_some();
    let r = Router::new()
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/v1/models", get(api::models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route(
            "/version",
            get(|| async { axum::Json(json!({"version": concat!(env!("CARGO_PKG_VERSION"), "+inferwatch-sim")})) }),
        )
        .route("/metrics", get(metrics))
        .route("/admin/faults", get(admin::get_faults).post(admin::post_faults).delete(admin::delete_faults));
    let r = if tgi { r.merge(tgi::api::routes(max_concurrent_requests)) } else { r };
    // SGLang's own endpoints (its `/health` answers as the shared one does) and its HTTP metrics.
    let r = if state.sglang.is_some() {
        r.route("/model_info", get(sglang::model_info))
            .route("/get_model_info", get(sglang::model_info))
            .route("/health_generate", get(sglang::health_generate))
            .route_layer(axum::middleware::from_fn_with_state(state.clone(), sglang::http_metrics))
    } else {
        r
    };
    r.fallback(|| async { (StatusCode::NOT_FOUND, axum::Json(json!({"detail": "Not Found"}))) })
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    if let Some(t) = &st.tgi {
        return tgi::metrics_response(&t.lock());
    }
    if let Some(m) = &st.sglang {
        return sglang::metrics_response(&m.lock());
    }
    let text = st.prom.lock().render();
    let mut r = text.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(prom::CONTENT_TYPE));
    r
}

/// Serves until Ctrl-C / SIGTERM, then shuts down gracefully.
pub async fn serve(args: SimArgs) -> Result<(), ServerError> {
    let server = SimServer::start(args).await?;
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `inferwatch sim`: runs `--scenario FILE --out DIR` on the simulated clock, or serves.
pub async fn run(args: SimArgs) -> Result<(), ServerError> {
    match (&args.scenario, &args.out) {
        (Some(scenario), Some(out)) => {
            let (scenario, out, seed) = (scenario.clone(), out.clone(), args.seed);
            // `--seed` overrides the scenario file's seed.
            let summary = tokio::task::spawn_blocking(move || {
                let mut sc = crate::scenario::load_scenario(&scenario)?;
                if let Some(seed) = seed {
                    sc.seed = seed;
                }
                crate::scenario::run(&sc, &out)
            })
            .await
            .map_err(|e| ServerError::Task(e.to_string()))??;
            match serde_json::to_string(&summary) {
                Ok(s) => println!("{s}"),
                Err(_) => println!("{summary:?}"),
            }
            Ok(())
        }
        (Some(_), None) | (None, Some(_)) => Err(ServerError::Config("--scenario and --out go together".into())),
        (None, None) => serve(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(name = "inferwatch", version)]
    struct Top {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(clap::Subcommand)]
    enum Cmd {
        Sim(SimArgs),
    }

    #[test]
    fn version_flag_works_on_the_subcommand() {
        let Top { cmd: Cmd::Sim(a) } = Top::try_parse_from([
            "inferwatch",
            "sim",
            "--version",
            "B",
            "--port",
            "0",
            "--served-model-name",
            "a",
            "b",
            "--gpu",
            "l4",
        ])
        .unwrap();
        assert_eq!(a.model_version.as_deref(), Some("B"));
        assert_eq!(a.served_model_name, vec!["a", "b"]);
        assert_eq!(a.gpu, Some(GpuName::L4));
        assert_eq!(a.port, 0);
        // the top-level --version still prints the binary's version
        let e = Top::try_parse_from(["inferwatch", "--version"]).err().unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
        assert!(Top::try_parse_from(["inferwatch", "sim", "--scenario", "x.yaml"]).is_err());
        let Top { cmd: Cmd::Sim(d) } = Top::try_parse_from(["inferwatch", "sim"]).unwrap();
        assert_eq!((d.host.as_str(), d.port), ("127.0.0.1", 8000));
    }

    #[test]
    fn config_file_and_flags() {
        let c = SimConfig::parse(
            "served_model_name: m\nengine:\n  gpu: l4\n  max_num_seqs: 8\nfaults:\n  - { kind: queue_blocking, onset: 20s }\n",
        )
        .unwrap();
        assert_eq!(c.engine.gpu().name, "l4");
        assert_eq!(c.engine.max_num_seqs, 8);
        assert_eq!(c.faults.len(), 1);
        let e = SimConfig::parse("engine:\n  max_num_seqz: 8\n").unwrap_err();
        assert!(e.contains("max_num_seqz"), "{e}");
        let args = SimArgs { gpu: Some(GpuName::Mi300x), seed: Some(9), ..SimArgs::default() };
        let (cfg, served) = effective_config(&args).unwrap();
        assert_eq!(cfg.engine.gpu().name, "mi300x");
        assert_eq!(cfg.engine.seed, 9);
        assert_eq!(served, vec![cfg.engine.model().name.clone()]);
    }
}
