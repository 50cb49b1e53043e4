//! The `prometheus` receiver: scrapes the Prometheus text format and OpenMetrics from static
//! targets, as otelcol's prometheus receiver does, and feeds them to metrics pipelines as OTLP.
//!
//! ```yaml
//! receivers:
//!   prometheus:
//!     config:
//!       scrape_configs:
//!         - job_name: vllm
//!           scrape_interval: 15s        # default 1m
//!           scrape_timeout: 10s         # default 10s, at most the interval
//!           metrics_path: /metrics
//!           scheme: http                # https: not yet
//!           honor_labels: false
//!           params: { key: [value] }
//!           static_configs:
//!             - targets: ["127.0.0.1:8000"]
//!               labels: { env: prod }
//!     tgi:
//!       model: ""                       # model of TGI targets; empty = each target's /info
//! ```
//!
//! Each target has its own loop (`scrape.rs`); the first scrape happens at start. The
//! exposition is parsed by a small hand-written line parser ([`parse`]): of the crates on
//! crates.io, `prometheus-parse` is regex-based and knows neither OpenMetrics (`# EOF`,
//! exemplars, `_created`, seconds timestamps) nor line numbers in its errors, while
//! `openmetrics-parser` (pest) and `nom-openmetrics` (which does not validate) are small
//! single-maintainer crates that bring a parser generator along; a line parser is short,
//! borrows from the body and names the bad line. Conversion follows otelcol ([`convert`]; start
//! times and resets in [`adjust`]). TGI targets get a `model_name` ([`tgi`]).
//! Failed scrapes are counted in `inferwatch_scrape_failures{job,target,reason}`.

pub mod adjust;
pub mod config;
pub mod convert;
pub mod parse;
mod scrape;
pub mod tgi;

use async_trait::async_trait;
use config::{Job, PrometheusConfig};
use convert::{Converter, Target};
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use scrape::{ACCEPT, MAX_BODY, ScrapeError, fetch};

/// How long `shutdown` waits for the loops before abandoning them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Builds `prometheus` receivers.
pub struct PrometheusReceiverFactory;

impl ReceiverFactory for PrometheusReceiverFactory {
    fn type_name(&self) -> &'static str {
        "prometheus"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Metrics]
    }

    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        PrometheusConfig::from_value(cfg).map(|_| ())
    }

    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(PrometheusReceiver::new(ctx, PrometheusConfig::from_value(cfg)?)?))
    }
}

/// A prometheus receiver.
pub struct PrometheusReceiver {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    jobs: Vec<Job>,
    tgi_model: String,
    running: Option<(CancellationToken, Vec<JoinHandle<()>>)>,
}

/// The HTTP client of the scrapes: plain HTTP (the TLS setup only satisfies reqwest).
fn client() -> Result<reqwest::Client, ComponentError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ComponentError::Start(format!("prometheus receiver: TLS setup: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .user_agent(concat!("inferwatch/", env!("CARGO_PKG_VERSION")))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| ComponentError::Start(format!("prometheus receiver: cannot build the HTTP client: {e}")))
}

impl PrometheusReceiver {
    /// A receiver with checked settings; it starts scraping on `start`.
    pub fn new(ctx: CreateContext, config: PrometheusConfig) -> Result<Self, ComponentError> {
        let jobs = config.jobs()?;
        Ok(PrometheusReceiver {
            id: ctx.id,
            telemetry: ctx.telemetry,
            jobs,
            tgi_model: config.tgi.model,
            running: None,
        })
    }

    /// Number of targets (one scrape loop each).
    pub fn target_count(&self) -> usize {
        self.jobs.iter().map(|j| j.targets.len()).sum()
    }
}

#[async_trait]
impl Receiver for PrometheusReceiver {
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError> {
        if self.running.is_some() {
            return Err(ComponentError::Start(format!("receiver {} is already started", self.id)));
        }
        let Some(consumer) = consumers.metrics.clone() else {
            return Err(ComponentError::Start(format!("receiver {} is in no metrics pipeline", self.id)));
        };
        let client = client()?;
        let cancel = CancellationToken::new();
        let metrics = self.telemetry.receiver(&self.id, "http");
        let mut loops = Vec::new();
        for job in &self.jobs {
            for (addr, labels) in &job.targets {
                let url = job.target_url(addr).map_err(ComponentError::Start)?;
                let info_url = job.info_url(addr).map_err(ComponentError::Start)?;
                let target = Target {
                    job: job.name.clone(),
                    addr: addr.clone(),
                    scheme: job.scheme.clone(),
                    labels: labels.clone(),
                    honor_labels: job.honor_labels,
                };
                loops.push(scrape::ScrapeLoop {
                    id: self.id.clone(),
                    url,
                    info_url,
                    interval: job.interval,
                    timeout: job.timeout,
                    converter: Converter::new(target),
                    client: client.clone(),
                    consumer: consumer.clone(),
                    telemetry: self.telemetry.clone(),
                    metrics: metrics.clone(),
                    tgi_model: self.tgi_model.clone(),
                    cancel: cancel.clone(),
                });
            }
        }
        let tasks: Vec<JoinHandle<()>> = loops.into_iter().map(|l| tokio::spawn(l.run())).collect();
        tracing::info!(receiver = %self.id, jobs = self.jobs.len(), targets = tasks.len(), "prometheus receiver scraping");
        self.running = Some((cancel, tasks));
        Ok(())
    }

    async fn shutdown(&mut self) {
        let Some((cancel, tasks)) = self.running.take() else { return };
        cancel.cancel();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for mut task in tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(receiver = %self.id, error = %e, "scrape loop failed"),
                Err(_) => {
                    tracing::warn!(receiver = %self.id, "a scrape loop did not stop in time; abandoning it");
                    task.abort();
                }
            }
        }
        tracing::debug!(receiver = %self.id, "prometheus receiver stopped");
    }
}

impl Drop for PrometheusReceiver {
    fn drop(&mut self) {
        if let Some((cancel, _)) = &self.running {
            cancel.cancel();
        }
    }
}
