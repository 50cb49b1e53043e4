//! The scrape loop of one target: GET the exposition every interval (the first at once), parse
//! and convert it, add the scrape-health series (`up`, `scrape_duration_seconds`,
//! `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`, with
//! the target's labels as every scraped point has them), and feed the metrics pipeline. A failed scrape (unreachable, timeout, HTTP status, too large, parse
//! error) is counted with its reason, gives `up` = 0, is logged once per change of state, and
//! the next interval tries again.

use super::convert::{Converter, ScrapeReport};
use super::parse::{Format, LimitExceeded, Limits, ParseError, ParseFailure, parse_bytes_limited};
use super::tgi;
use inferwatch_core::component::ComponentId;
use inferwatch_core::consumer::ConsumerRef;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::{ReceiverMetrics, Telemetry};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// The `Accept` header Prometheus sends for the text formats.
pub const ACCEPT: &str = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4";
/// Largest exposition read; a longer body fails the scrape as `too_large`.
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// No connection or a broken one.
    #[error("cannot scrape {url}: {message}")]
    Unreachable {
        /// The scraped URL.
        url: String,
        /// The cause, with its sources.
        message: String,
    },
    /// No complete answer within the scrape timeout.
    #[error("no complete answer from {url} within {timeout:?}")]
    Timeout {
        /// The scraped URL.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// An answer that is not 2xx.
    #[error("{url} answered HTTP {status}")]
    HttpStatus {
        /// The scraped URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// A body over the size limit.
    #[error("{url}: body larger than {limit} bytes")]
    TooLarge {
        /// The scraped URL.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// A redirect that is refused (`follow_redirects: false`, a non-http(s) target, too many hops).
    #[error("{url}: redirect refused: {message}")]
    Redirect {
        /// The scraped URL.
        url: String,
        /// Why.
        message: String,
    },
    /// The scrape's credentials are unavailable (unreadable file).
    #[error("{url}: credentials unavailable: {message}")]
    Credentials {
        /// The scraped URL.
        url: String,
        /// Why.
        message: String,
    },
    /// A sample or label limit was exceeded: the whole scrape is refused, as Prometheus does.
    #[error("{url}: line {line}: {limit}")]
    Limit {
        /// The scraped URL.
        url: String,
        /// The line of the first offending sample.
        line: usize,
        /// Which limit.
        limit: LimitExceeded,
    },
    /// A malformed exposition.
    #[error("{url}: malformed exposition: {source}")]
    Parse {
        /// The scraped URL.
        url: String,
        /// The first bad line.
        source: ParseError,
    },
}

impl ScrapeError {
    /// The `reason` label of the failure counter.
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Unreachable { .. } => "unreachable",
            ScrapeError::Timeout { .. } => "timeout",
            ScrapeError::HttpStatus { .. } => "http_status",
            ScrapeError::TooLarge { .. } => "too_large",
            ScrapeError::Parse { .. } => "parse",
            ScrapeError::Redirect { .. } => "redirect",
            ScrapeError::Credentials { .. } => "credentials",
            ScrapeError::Limit { limit, .. } => limit.reason(),
        }
    }
}

/// An error with its chain of sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// GETs an exposition: its body (at most `limit` bytes) and format.
pub async fn fetch(
    client: &reqwest::Client,
    url: &reqwest::Url,
    timeout: Duration,
    limit: usize,
) -> Result<(Vec<u8>, Format), ScrapeError> {
    fetch_with(client, url, timeout, limit, http::HeaderMap::new()).await
}

/// As [`fetch`], with extra request headers (credentials).
pub async fn fetch_with(
    client: &reqwest::Client,
    url: &reqwest::Url,
    timeout: Duration,
    limit: usize,
    headers: http::HeaderMap,
) -> Result<(Vec<u8>, Format), ScrapeError> {
    let u = || url.to_string();
    let classify = |e: reqwest::Error| {
        if e.is_redirect() {
            ScrapeError::Redirect { url: u(), message: chain(&e) }
        } else if e.is_timeout() {
            ScrapeError::Timeout { url: u(), timeout }
        } else {
            ScrapeError::Unreachable { url: u(), message: chain(&e) }
        }
    };
    let work = async {
        let mut resp = client
            .get(url.clone())
            .headers(headers)
            .header(http::header::ACCEPT, ACCEPT)
            .header("X-Prometheus-Scrape-Timeout-Seconds", format!("{}", timeout.as_secs_f64()))
            .send()
            .await
            .map_err(classify)?;
        let status = resp.status();
        if status.is_redirection() {
            let to = resp.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("");
            return Err(ScrapeError::Redirect {
                url: u(),
                message: format!("HTTP {} to {to:?} (follow_redirects is false)", status.as_u16()),
            });
        }
        if !status.is_success() {
            return Err(ScrapeError::HttpStatus { url: u(), status: status.as_u16() });
        }
        let format = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map_or(Format::Text, Format::from_content_type);
        let announced = resp.content_length().unwrap_or(0);
        if announced > limit as u64 {
            return Err(ScrapeError::TooLarge { url: u(), limit });
        }
        let mut body = Vec::with_capacity(announced as usize);
        while let Some(chunk) = resp.chunk().await.map_err(classify)? {
            if body.len() + chunk.len() > limit {
                return Err(ScrapeError::TooLarge { url: u(), limit });
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, format))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout { url: u(), timeout }),
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// What was last logged about the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Unknown,
    Up,
    Down(&'static str),
}

/// Everything one target's loop needs.
pub(crate) struct ScrapeLoop {
    /// The receiver.
    pub id: ComponentId,
    /// The exposition URL.
    pub url: reqwest::Url,
    /// The target's `/info` (TGI).
    pub info_url: reqwest::Url,
    /// Time between scrapes.
    pub interval: Duration,
    /// Most time one scrape may take.
    pub timeout: Duration,
    /// The target's converter (start-time state).
    pub converter: Converter,
    /// The job's HTTP client (TLS, redirect policy).
    pub client: reqwest::Client,
    /// Credentials added to each scrape.
    pub auth: Option<Arc<super::ScrapeAuth>>,
    /// Sample and label limits.
    pub limits: Limits,
    /// Largest body read.
    pub body_size_limit: usize,
    /// The metrics pipeline.
    pub consumer: ConsumerRef,
    /// Self-telemetry (failure counter).
    pub telemetry: Arc<Telemetry>,
    /// otelcol receiver accepted / refused counters.
    pub metrics: ReceiverMetrics,
    /// The configured TGI model (empty: ask `/info`).
    pub tgi_model: String,
    /// Set when the receiver stops.
    pub cancel: CancellationToken,
    /// `metric_relabel_configs`, applied to the parsed samples before conversion.
    pub metric_relabel: Arc<Vec<super::relabel::Rule>>,
}

/// Per-loop state that is not configuration.
struct State {
    health: Health,
    model: Option<String>,
    info_warned: bool,
}

impl ScrapeLoop {
    /// Scrapes until cancelled.
    pub(crate) async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut st = State { health: Health::Unknown, model: None, info_warned: false };
        let cancel = self.cancel.clone();
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let payload = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                p = self.scrape_once(&mut st) => p,
            };
            let items = payload.item_count();
            let sent = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                r = self.consumer.consume(payload) => r,
            };
            match sent {
                Ok(()) => self.metrics.accepted(Signal::Metrics, items),
                Err(e) => {
                    self.metrics.refused(Signal::Metrics, items);
                    tracing::debug!(receiver = %self.id, target = %self.url, error = %e,
                        "the pipeline refused a scrape; its points are dropped");
                }
            }
        }
    }

    /// One scrape, successful or not, as a payload.
    async fn scrape_once(&mut self, st: &mut State) -> Payload {
        let scrape_ns = now_ns();
        let started = Instant::now();
        let headers = match &self.auth {
            Some(a) => a.headers(),
            None => Ok(http::HeaderMap::new()),
        };
        let fetched = match headers {
            Ok(h) => fetch_with(&self.client, &self.url, self.timeout, self.body_size_limit, h).await,
            Err(message) => Err(ScrapeError::Credentials { url: self.url.to_string(), message }),
        };
        let duration = started.elapsed();
        let result = match fetched {
            Ok((body, format)) => match self.parse(&body, format) {
                Ok((expo, scraped)) => {
                    let extra = if tgi::is_tgi(&expo) {
                        self.tgi_model(st).await.map(|m| vec![("model_name".to_string(), m)]).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    let post_relabel = expo.sample_count();
                    let series_added = self.converter.series_added(&expo);
                    let report = ScrapeReport { up: true, duration, scraped, post_relabel, series_added };
                    Ok((self.converter.convert(&expo, scrape_ns, &extra), report))
                }
                Err(ParseFailure::Malformed(source)) => Err(ScrapeError::Parse { url: self.url.to_string(), source }),
                Err(ParseFailure::Limit { line, limit }) => {
                    Err(ScrapeError::Limit { url: self.url.to_string(), line, limit })
                }
            },
            Err(e) => Err(e),
        };
        let metrics = match result {
            Ok((metrics, report)) => {
                if matches!(st.health, Health::Down(_)) {
                    tracing::info!(receiver = %self.id, target = %self.url, "scrape target is up again");
                }
                st.health = Health::Up;
                let mut m = metrics;
                m.extend(self.converter.scrape_metrics(&report, scrape_ns));
                m
            }
            Err(e) => {
                let reason = e.reason();
                let job = &self.converter.target().job;
                super::SCRAPE_FAILURES.get(&self.telemetry, [job, &self.converter.instance(), reason]).inc();
                if st.health != Health::Down(reason) {
                    tracing::warn!(receiver = %self.id, job = %job, reason, error = %e,
                        "scrape failed; up = 0, retrying every {:?}", self.interval);
                } else {
                    tracing::debug!(receiver = %self.id, reason, error = %e, "scrape failed again");
                }
                st.health = Health::Down(reason);
                st.model = None;
                self.converter.scrape_metrics(&ScrapeReport::failed(duration), scrape_ns)
            }
        };
        Payload::Metrics(self.converter.request(metrics))
    }

    /// Parses under the limits, then applies `metric_relabel_configs`; also returns the number
    /// of samples before relabeling. With relabel rules, `sample_limit` counts the samples that
    /// are kept, as in Prometheus (the body size bounds the parse); the label limits are
    /// checked on the scraped labels.
    fn parse<'b>(
        &self,
        body: &'b [u8],
        format: super::parse::Format,
    ) -> Result<(super::parse::Exposition<'b>, usize), ParseFailure> {
        if self.metric_relabel.is_empty() {
            let expo = parse_bytes_limited(body, format, &self.limits)?;
            let n = expo.sample_count();
            return Ok((expo, n));
        }
        let limits = Limits { sample_limit: 0, ..self.limits };
        let mut expo = parse_bytes_limited(body, format, &limits)?;
        let scraped = expo.sample_count();
        super::relabel::relabel_exposition(&mut expo, &self.metric_relabel);
        let n = expo.sample_count();
        if self.limits.sample_limit > 0 && n > self.limits.sample_limit {
            let line =
                expo.families.iter().flat_map(|f| f.samples.iter()).nth(self.limits.sample_limit).map_or(0, |s| s.line);
            return Err(ParseFailure::Limit {
                line,
                limit: LimitExceeded::Samples { limit: self.limits.sample_limit },
            });
        }
        Ok((expo, scraped))
    }

    /// The model of this TGI target: configured, cached, or asked from `/info`.
    async fn tgi_model(&self, st: &mut State) -> Option<String> {
        if !self.tgi_model.is_empty() {
            return Some(self.tgi_model.clone());
        }
        if let Some(m) = &st.model {
            return Some(m.clone());
        }
        match tgi::fetch_model(&self.client, &self.info_url, self.timeout).await {
            Ok(m) => {
                tracing::info!(receiver = %self.id, target = %self.info_url, model = %m, "TGI target serves this model");
                st.model = Some(m.clone());
                st.info_warned = false;
                Some(m)
            }
            Err(e) => {
                if !st.info_warned {
                    tracing::warn!(receiver = %self.id, error = %chain(&e),
                        "cannot learn the model of a TGI target; its metrics go without model_name until \
                         /info answers (or set tgi.model)");
                }
                st.info_warned = true;
                None
            }
        }
    }
}
