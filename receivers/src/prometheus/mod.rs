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
//!           scheme: http                # or https (tls_config)
//!           tls_config: { ca_file: ca.pem, cert_file: c.pem, key_file: k.pem, server_name: x,
//!                         insecure_skip_verify: false, min_version: TLS12 }
//!           authorization: { type: Bearer, credentials: "...", credentials_file: /path }
//!           basic_auth: { username: u, password: "...", password_file: /path }
//!           bearer_token: "..."         # or bearer_token_file (deprecated in Prometheus)
//!           follow_redirects: true      # to http(s) only, at most 5 hops
//!           sample_limit: 0             # 0 = none; more samples fail the whole scrape
//!           label_limit: 0
//!           label_name_length_limit: 0
//!           label_value_length_limit: 0
//!           body_size_limit: 32MiB      # default 32MiB (Prometheus: none); 0 = none
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
use config::{Job, PrometheusConfig, ScrapeCredentials};
use convert::{Converter, Target};
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::extension::client_auth::{FileSecret, SecretSource};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use scrape::{ACCEPT, MAX_BODY, ScrapeError, fetch, fetch_with};

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

/// The TLS configuration of a job's scrapes.
fn tls_config(job: &Job) -> Result<rustls::ClientConfig, String> {
    use inferwatch_core::tls;
    let c = &job.client;
    if job.scheme != "https" {
        return tls::plaintext_client_config().map_err(|e| e.to_string());
    }
    if !c.tls13_only {
        return tls::client_config(&c.tls).map_err(|e| format!("tls_config.{}: {e}", e.field()));
    }
    let verifier = tls::server_verifier(&c.tls).map_err(|e| format!("tls_config.{}: {e}", e.field()))?;
    let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("tls_config.min_version: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cfg = match tls::load_identity(&c.tls).map_err(|e| format!("tls_config.{}: {e}", e.field()))? {
        Some(id) => {
            builder.with_client_auth_cert(id.chain, id.key).map_err(|e| format!("tls_config.cert_file: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The redirect policy: none, or http(s) targets only and at most [`config::MAX_REDIRECTS`] hops.
fn redirect_policy(follow: bool) -> reqwest::redirect::Policy {
    if !follow {
        return reqwest::redirect::Policy::none();
    }
    reqwest::redirect::Policy::custom(|a| {
        if a.previous().len() >= config::MAX_REDIRECTS {
            a.error(format!("more than {} redirects", config::MAX_REDIRECTS))
        } else if !matches!(a.url().scheme(), "http" | "https") {
            let scheme = a.url().scheme().to_string();
            a.error(format!("redirect to a {scheme}: URL"))
        } else {
            a.follow()
        }
    })
}

/// The HTTP client of one job's scrapes (its TLS and redirect settings).
fn client(job: &Job) -> Result<reqwest::Client, ComponentError> {
    let tls =
        tls_config(job).map_err(|e| ComponentError::Start(format!("prometheus receiver, job {}: {e}", job.name)))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(redirect_policy(job.client.follow_redirects))
        .no_proxy()
        .user_agent(concat!("inferwatch/", env!("CARGO_PKG_VERSION")))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| ComponentError::Start(format!("prometheus receiver: cannot build the HTTP client: {e}")))
}

/// A job's scrape credentials, files re-read as they change.
pub struct ScrapeAuth {
    kind: AuthKind,
}

enum AuthKind {
    Token(String, SecretSource),
    Basic(String, SecretSource),
}

impl ScrapeAuth {
    /// Reads the credential files now.
    pub fn new(c: &ScrapeCredentials) -> Result<Self, String> {
        let file = |p: &str, at: &str| FileSecret::open(p).map(SecretSource::File).map_err(|e| format!("{at}: {e}"));
        let kind = match c {
            ScrapeCredentials::Token { scheme, secret } => {
                AuthKind::Token(scheme.clone(), SecretSource::Inline(secret.clone()))
            }
            ScrapeCredentials::TokenFile { scheme, path } => {
                AuthKind::Token(scheme.clone(), file(path, "credentials_file")?)
            }
            ScrapeCredentials::Basic { username, password } => {
                AuthKind::Basic(username.clone(), SecretSource::Inline(password.clone()))
            }
            ScrapeCredentials::BasicFile { username, path } => {
                AuthKind::Basic(username.clone(), file(path, "password_file")?)
            }
        };
        Ok(ScrapeAuth { kind })
    }

    /// The `Authorization` header of the next scrape.
    pub fn headers(&self) -> Result<http::HeaderMap, String> {
        use base64::Engine;
        let text = match &self.kind {
            AuthKind::Token(scheme, s) => format!("{scheme} {}", s.current().expose()),
            AuthKind::Basic(user, s) => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{}", s.current().expose()))
            ),
        };
        let mut v =
            http::HeaderValue::from_str(&text).map_err(|_| "credentials not usable in an HTTP header".to_string())?;
        v.set_sensitive(true);
        let mut h = http::HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, v);
        Ok(h)
    }
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
        let cancel = CancellationToken::new();
        let metrics = self.telemetry.receiver(&self.id, "http");
        let mut loops = Vec::new();
        for job in &self.jobs {
            let client = client(job)?;
            let auth = match &job.client.credentials {
                Some(c) => Some(Arc::new(
                    ScrapeAuth::new(c)
                        .map_err(|e| ComponentError::Start(format!("prometheus receiver, job {}: {e}", job.name)))?,
                )),
                None => None,
            };
            if job.body_size_limit == usize::MAX {
                tracing::warn!(receiver = %self.id, job = %job.name,
                    "body_size_limit is 0: a target's page is read whole, however large");
            }
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
                    auth: auth.clone(),
                    // job and instance, the static labels, and the resource's service labels are not
                    // counted: Prometheus counts the target's labels, which are `job`, `instance` and these.
                    limits: parse::Limits { base_labels: 2 + labels.len(), ..job.limits },
                    body_size_limit: job.body_size_limit,
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
