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
//!           proxy_url: http://proxy:3128 # or proxy_from_environment: true; no_proxy: "10.0.0.0/8"
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
//!           file_sd_configs: [{ files: [targets/*.json], refresh_interval: 5m }]
//!           http_sd_configs: [{ url: "http://sd/targets", refresh_interval: 1m }]
//!           kubernetes_sd_configs: [{ role: pod, namespaces: { names: [ml] } }]
//!           relabel_configs: [...]      # Prometheus' relabel_config, every action
//!           metric_relabel_configs: [...]
//!           target_limit: 0             # 0: at most 10000
//!     tgi:
//!       model: ""                       # model of TGI targets; empty = each target's /info
//! ```
//!
//! Each target has its own loop (`scrape.rs`); the first scrape happens at start. Targets come
//! from `static_configs` and discovery ([`sd`]), go through [`relabel`] in a per-job
//! [`targets::Manager`], which starts and stops loops as the set changes. The
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
pub mod http_client;
pub mod parse;
pub mod relabel;
mod scrape;
pub mod sd;
pub mod targets;
pub mod tgi;

use async_trait::async_trait;
use config::{Discovery, Job, PrometheusConfig, ScrapeClient, ScrapeCredentials};
use convert::{Converter, Target};
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::extension::client_auth::{FileSecret, SecretSource};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use scrape::{ACCEPT, MAX_BODY, ScrapeError, fetch, fetch_with};

/// `inferwatch_scrape_failures{job, target, reason}`: failed scrapes, target discoveries and
/// target lists of this receiver (and failed GPU samples of the nvml receiver, job = its id).
pub const SCRAPE_FAILURES: inferwatch_core::telemetry::Counters<3> = inferwatch_core::telemetry::Counters::new(
    "inferwatch_scrape_failures",
    "Failed scrapes of the prometheus receiver, by job, target and reason",
    ["job", "target", "reason"],
);

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

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(PrometheusConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
    ) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(PrometheusReceiver::new(
            ctx,
            inferwatch_core::component::typed::<PrometheusConfig>(parsed)?.clone(),
        )?))
    }
}

/// A prometheus receiver.
pub struct PrometheusReceiver {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    jobs: Vec<Job>,
    tgi_model: String,
    running: Option<(CancellationToken, Vec<JoinHandle<()>>)>,
    active_loops: Arc<AtomicUsize>,
    targets: Vec<Arc<AtomicUsize>>,
}

/// The TLS configuration of a client.
fn tls_config(c: &ScrapeClient, https: bool) -> Result<rustls::ClientConfig, String> {
    use inferwatch_core::tls;
    if !https {
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

/// An HTTP client with `c`'s TLS and redirect settings (`https`: TLS is configured).
fn client(c: &ScrapeClient, https: bool, job: &str) -> Result<reqwest::Client, ComponentError> {
    let tls =
        tls_config(c, https).map_err(|e| ComponentError::Start(format!("prometheus receiver, job {job}: {e}")))?;
    let builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(redirect_policy(c.follow_redirects))
        .user_agent(concat!("inferwatch/", env!("CARGO_PKG_VERSION")))
        .tcp_nodelay(true);
    c.proxy
        .apply(builder)
        .map_err(|e| ComponentError::Start(format!("prometheus receiver, job {job}: {e}")))?
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
            active_loops: Arc::new(AtomicUsize::new(0)),
            targets: Vec::new(),
        })
    }

    /// Number of static targets.
    pub fn target_count(&self) -> usize {
        self.jobs.iter().map(|j| j.targets.len()).sum()
    }

    /// Number of scrape loops running now (static and discovered targets; stopped loops leave it).
    pub fn active_loops(&self) -> usize {
        self.active_loops.load(Ordering::SeqCst)
    }

    /// Number of targets the job managers scrape now (after relabeling and `target_limit`).
    pub fn active_targets(&self) -> usize {
        self.targets.iter().map(|t| t.load(Ordering::SeqCst)).sum()
    }
}

/// The auth of a client, from its checked credentials.
fn auth_of(c: &ScrapeClient, job: &str) -> Result<Option<Arc<ScrapeAuth>>, ComponentError> {
    match &c.credentials {
        Some(cr) => Ok(Some(Arc::new(
            ScrapeAuth::new(cr).map_err(|e| ComponentError::Start(format!("prometheus receiver, job {job}: {e}")))?,
        ))),
        None => Ok(None),
    }
}

/// Starts a job's discovery providers, each publishing into its slot.
fn start_discovery(
    job: &Job,
    slots: &sd::Slots,
    ctx: &sd::SdContext,
    cancel: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, ComponentError> {
    let start_err = |m: String| ComponentError::Start(format!("prometheus receiver, job {}: {m}", job.name));
    let mut tasks = Vec::new();
    for (i, d) in job.discovery.iter().enumerate() {
        let slot = slots.slot(i);
        let (ctx, cancel) = (ctx.clone(), cancel.clone());
        match d {
            Discovery::File(f) => tasks.push(tokio::spawn(sd::file::run(f.clone(), slot, ctx, cancel))),
            Discovery::Http { config, url, client: c } => {
                let http = client(c, url.scheme() == "https", &job.name)?;
                let auth = auth_of(c, &job.name)?;
                tasks.push(tokio::spawn(sd::http::run(config.refresh(), url.clone(), http, auth, slot, ctx, cancel)));
            }
            Discovery::Kubernetes { config, role, client: c } => {
                let (base, c) = match &config.api_server {
                    Some(a) => (a.clone(), c.clone()),
                    None => {
                        let base = sd::kubernetes::in_cluster_url(
                            std::env::var("KUBERNETES_SERVICE_HOST").ok(),
                            std::env::var("KUBERNETES_SERVICE_PORT").ok(),
                        )
                        .map_err(start_err)?;
                        let dir = sd::kubernetes::SERVICE_ACCOUNT_DIR;
                        let c = ScrapeClient {
                            tls: inferwatch_core::settings::TlsClientSettings {
                                ca_file: Some(format!("{dir}/ca.crt")),
                                ..Default::default()
                            },
                            credentials: Some(ScrapeCredentials::TokenFile {
                                scheme: "Bearer".into(),
                                path: format!("{dir}/token"),
                            }),
                            follow_redirects: true,
                            tls13_only: false,
                            proxy: http_client::Proxy::None,
                        };
                        (base, c)
                    }
                };
                let base = if base.ends_with('/') { base } else { format!("{base}/") };
                let base = reqwest::Url::parse(&base).map_err(|e| start_err(format!("api_server: {e}")))?;
                let conn = sd::kubernetes::ApiConn {
                    client: client(&c, base.scheme() == "https", &job.name)?,
                    auth: auth_of(&c, &job.name)?,
                    base,
                };
                let namespaces = config.namespace_list().map_err(start_err)?;
                tasks.push(tokio::spawn(sd::kubernetes::run(
                    config.clone(),
                    *role,
                    conn,
                    namespaces,
                    slot,
                    ctx,
                    cancel,
                )));
            }
        }
    }
    Ok(tasks)
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
        // Stops what was already started if a later job fails to start.
        let started = cancel.clone().drop_guard();
        let metrics = self.telemetry.receiver(&self.id, "http");
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        let mut counters = Vec::new();
        for job in &self.jobs {
            let auth = auth_of(&job.client, &job.name)?;
            let https = client(&job.client, true, &job.name);
            let plain = client(&job.client, false, &job.name)?;
            let https = match (job.scheme.as_str(), https) {
                ("https", Err(e)) => return Err(e),
                (_, Ok(c)) => Some(c),
                (_, Err(_)) => None,
            };
            if job.body_size_limit == usize::MAX {
                tracing::warn!(receiver = %self.id, job = %job.name,
                    "body_size_limit is 0: a target's page is read whole, however large");
            }
            let slots = sd::Slots::new(job.discovery.len());
            let ctx = sd::SdContext { job: job.name.clone(), telemetry: self.telemetry.clone() };
            tasks.extend(start_discovery(job, &slots, &ctx, &cancel)?);
            let static_groups = job
                .targets
                .iter()
                .map(|(addr, labels)| sd::TargetGroup {
                    source: "static".into(),
                    targets: vec![std::collections::BTreeMap::from([("__address__".to_string(), addr.instance())])],
                    labels: labels.iter().cloned().collect(),
                })
                .collect();
            let job_arc = Arc::new(job.clone());
            let metric_relabel = Arc::new(job.metric_relabel.clone());
            let (id, consumer, telemetry, metrics, tgi_model, active) = (
                self.id.clone(),
                consumer.clone(),
                self.telemetry.clone(),
                metrics.clone(),
                self.tgi_model.clone(),
                self.active_loops.clone(),
            );
            let j = job_arc.clone();
            let spawn: targets::Spawn = Box::new(move |t: &targets::ScrapeTarget, cancel: CancellationToken| {
                let http = if t.scheme == "https" {
                    match &https {
                        Some(c) => c.clone(),
                        None => {
                            tracing::warn!(job = %j.name, target = %t.url, "no TLS client for an https target; not scraped");
                            return None;
                        }
                    }
                } else {
                    plain.clone()
                };
                let target = Target {
                    job: if t.job.is_empty() { j.name.clone() } else { t.job.clone() },
                    addr: t.addr.clone(),
                    scheme: t.scheme.clone(),
                    labels: t.labels.clone(),
                    honor_labels: j.honor_labels,
                };
                let lp = scrape::ScrapeLoop {
                    id: id.clone(),
                    url: t.url.clone(),
                    info_url: t.info_url.clone(),
                    interval: t.interval,
                    timeout: t.timeout,
                    converter: Converter::with_instance(target, t.instance.clone()),
                    client: http,
                    auth: auth.clone(),
                    // job and instance and the target's other labels are not counted as scraped
                    // labels: Prometheus counts the target's labels, which are these.
                    limits: parse::Limits { base_labels: 2 + t.labels.len(), ..j.limits },
                    body_size_limit: j.body_size_limit,
                    consumer: consumer.clone(),
                    telemetry: telemetry.clone(),
                    metrics: metrics.clone(),
                    tgi_model: tgi_model.clone(),
                    cancel,
                    metric_relabel: metric_relabel.clone(),
                };
                let guard = targets::LoopGuard::new(active.clone());
                Some(tokio::spawn(async move {
                    let _guard = guard;
                    lp.run().await
                }))
            });
            let count = Arc::new(AtomicUsize::new(0));
            counters.push(count.clone());
            let manager = targets::Manager {
                job: job_arc,
                static_groups,
                slots,
                spawn,
                telemetry: self.telemetry.clone(),
                targets: count,
                cancel: cancel.clone(),
            };
            tasks.push(tokio::spawn(manager.run()));
        }
        self.targets = counters;
        tracing::info!(receiver = %self.id, jobs = self.jobs.len(), static_targets = self.target_count(),
            "prometheus receiver started");
        started.disarm();
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
