//! Settings of the `prometheus` receiver: the subset of otelcol's (Prometheus') `scrape_configs`
//! that static targets need, plus the `tgi` extension.

use super::http_client::HttpClientConfig;
use super::parse::Limits;
use super::relabel::{RelabelConfig, Rule};
use super::sd::file::FileSdConfig;
use super::sd::http::HttpSdConfig;
use super::sd::kubernetes::{KubernetesSdConfig, Role};
use inferwatch_core::component::{FieldError, PathSeg, parse_config};
use inferwatch_core::extension::client_auth::Secret;
use inferwatch_core::settings::{GoDuration, TlsClientSettings};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// Prometheus' default scrape interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default `body_size_limit` (Prometheus has none; a bound keeps a hostile or broken target
/// from taking the agent's memory: parsing and converting cost about 45 times the body).
pub const DEFAULT_BODY_SIZE_LIMIT: usize = 32 * 1024 * 1024;
/// Most redirects followed per scrape (`follow_redirects: true`).
pub const MAX_REDIRECTS: usize = 5;
/// Prometheus' default scrape timeout (lowered to the interval when the interval is shorter).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `receivers: { prometheus: { config: {...}, tgi: {...} } }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    /// The Prometheus scrape configuration.
    pub config: ScrapeSection,
    /// Settings for Hugging Face TGI targets.
    #[serde(default)]
    pub tgi: TgiConfig,
}

/// `config:`: what Prometheus' own configuration file would hold.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ScrapeSection {
    /// One entry per job.
    #[serde(default)]
    pub scrape_configs: Vec<ScrapeConfig>,
}

/// One job: how and where to scrape. (Its `Deserialize` is in [`super::http_client`]: the
/// derived one, the inherent `ScrapeConfig::deserialize`, knows only its own keys.)
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ScrapeConfig {
    /// The job name (`service.name` of what it scrapes).
    pub job_name: String,
    /// Time between two scrapes of a target (default 1m).
    #[serde(default)]
    pub scrape_interval: Option<GoDuration>,
    /// Most time one scrape may take (default 10s, at most the interval).
    #[serde(default)]
    pub scrape_timeout: Option<GoDuration>,
    /// HTTP path of the exposition (default `/metrics`).
    #[serde(default = "default_path")]
    pub metrics_path: String,
    /// `http` or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// TLS, credentials and redirects of the scrapes (`tls_config`, `authorization`,
    /// `basic_auth`, `bearer_token`, `bearer_token_file`, `follow_redirects`).
    #[serde(skip)]
    pub http: HttpClientConfig,
    /// Most samples per scrape; more fails the scrape (0: no limit).
    #[serde(default)]
    pub sample_limit: usize,
    /// Most labels per series (0: no limit).
    #[serde(default)]
    pub label_limit: usize,
    /// Longest label name (0: no limit).
    #[serde(default)]
    pub label_name_length_limit: usize,
    /// Longest label value (0: no limit).
    #[serde(default)]
    pub label_value_length_limit: usize,
    /// Largest body read (bytes or `10MiB`-style; default 32MiB; 0: no limit).
    #[serde(default)]
    pub body_size_limit: Option<ByteSize>,
    /// Whether scraped labels win over the target's labels when they clash.
    #[serde(default)]
    pub honor_labels: bool,
    /// URL query parameters sent with each scrape.
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    /// Fixed lists of targets.
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    /// Target groups from files.
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    /// Target groups from HTTP endpoints.
    #[serde(default)]
    pub http_sd_configs: Vec<HttpSdConfig>,
    /// Targets from the Kubernetes API (roles pod and endpoints).
    #[serde(default)]
    pub kubernetes_sd_configs: Vec<KubernetesSdConfig>,
    /// Relabeling of discovered targets, before the scrape.
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    /// Relabeling of scraped samples, before conversion.
    #[serde(default)]
    pub metric_relabel_configs: Vec<RelabelConfig>,
    /// Most targets after relabeling (0: the agent's bound, [`MAX_TARGETS`]); more fail the job's
    /// targets, as Prometheus does.
    #[serde(default)]
    pub target_limit: usize,
}

/// Most targets of one job when `target_limit` is 0.
pub const MAX_TARGETS: usize = 10_000;

/// `tls_config:` of a scrape (Prometheus' names).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTlsConfig {
    /// CA bundle to verify the target with (PEM); default: the platform's roots.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// Client certificate (PEM).
    #[serde(default)]
    pub cert_file: Option<String>,
    /// Client key (PEM).
    #[serde(default)]
    pub key_file: Option<String>,
    /// Name the target's certificate is verified against.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Accept any certificate.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// `TLS12` (default) or `TLS13` (`TLS10`/`TLS11` are accepted and mean TLS12: rustls has no older versions).
    #[serde(default)]
    pub min_version: Option<String>,
}

/// `authorization:` of a scrape.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationConfig {
    /// The scheme (default `Bearer`).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The credentials.
    #[serde(default)]
    pub credentials: Option<Secret>,
    /// File holding the credentials (re-read as it changes).
    #[serde(default)]
    pub credentials_file: Option<String>,
}

/// `basic_auth:` of a scrape.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthConfig {
    /// User name.
    pub username: String,
    /// Password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password (re-read as it changes).
    #[serde(default)]
    pub password_file: Option<String>,
}

/// A size in bytes: a number, or a string with a unit (`B`, `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`:
/// powers of 1024, as Prometheus reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_bytes_size(&s).map(ByteSize).map_err(serde::de::Error::custom),
        }
    }
}

fn parse_bytes_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?} (e.g. 10MiB, 512KB, 1048576)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "KiB" | "kB" => 1 << 10,
        "MB" | "MiB" => 1 << 20,
        "GB" | "GiB" => 1 << 30,
        "TB" | "TiB" => 1 << 40,
        _ => return Err(format!("invalid size {s:?}: unknown unit {unit:?} (B, KB, MB, GB, TB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

/// How a scrape authenticates (checked settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScrapeCredentials {
    /// `Authorization: <scheme> <secret>`.
    Token {
        /// The scheme (`Bearer`).
        scheme: String,
        /// The inline credentials.
        secret: Secret,
    },
    /// `Authorization: <scheme> <file contents>`.
    TokenFile {
        /// The scheme.
        scheme: String,
        /// The file.
        path: String,
    },
    /// HTTP Basic with an inline password.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: Secret,
    },
    /// HTTP Basic with the password in a file.
    BasicFile {
        /// User name.
        username: String,
        /// The file.
        path: String,
    },
}

/// The HTTP side of a job (checked settings).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScrapeClient {
    /// TLS settings for `https` (core's client TLS shape).
    pub tls: TlsClientSettings,
    /// TLS 1.3 only (`min_version: TLS13`).
    pub tls13_only: bool,
    /// Credentials sent with each scrape.
    pub credentials: Option<ScrapeCredentials>,
    /// Follow redirects.
    pub follow_redirects: bool,
    /// Direct, through `proxy_url`, or the environment's proxy.
    pub proxy: super::http_client::Proxy,
}

/// `static_configs` entry: targets sharing labels.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// `host:port` of each target.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Labels added to every series scraped from these targets.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `tgi:`: TGI metrics carry no model label; this says where the model name comes from.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TgiConfig {
    /// The model name for every TGI target; empty = ask each target's `/info` (`model_id`).
    pub model: String,
}

fn default_path() -> String {
    "/metrics".into()
}

fn default_scheme() -> String {
    "http".into()
}

/// A target's `host:port`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetAddr {
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl TargetAddr {
    /// Parses `host[:port]` (the port defaults to 80 for http, as in Prometheus).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.contains("://") || s.contains('/') {
            return Err(format!("target {s:?}: expected host:port, without a scheme or a path"));
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            match rest.split_once(']') {
                Some((h, "")) => (h, None),
                Some((h, p)) => match p.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None => return Err(format!("target {s:?}: expected [ipv6]:port")),
                },
                None => return Err(format!("target {s:?}: unclosed '['")),
            }
        } else if s.matches(':').count() > 1 {
            return Err(format!("target {s:?}: IPv6 hosts need brackets, e.g. [::1]:8000"));
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || matches!(c, '@' | '?' | '#')) {
            return Err(format!("target {s:?}: invalid host"));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| format!("target {s:?}: the port must be a number 1-65535"))?,
            None => 80,
        };
        if port == 0 {
            return Err(format!("target {s:?}: the port must be a number 1-65535"));
        }
        Ok(TargetAddr { host: host.to_string(), port })
    }

    /// `host:port`, with brackets for IPv6 (Prometheus' `instance` label).
    pub fn instance(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A job with defaults applied and values checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The job name.
    pub name: String,
    /// Time between scrapes.
    pub interval: Duration,
    /// Most time one scrape may take.
    pub timeout: Duration,
    /// HTTP path.
    pub metrics_path: String,
    /// URL scheme (`http`).
    pub scheme: String,
    /// Scraped labels win over target labels.
    pub honor_labels: bool,
    /// Query parameters.
    pub params: Vec<(String, String)>,
    /// Each target with its labels (sorted by name).
    pub targets: Vec<(TargetAddr, Vec<(String, String)>)>,
    /// TLS, credentials and redirects.
    pub client: ScrapeClient,
    /// Sample and label limits (`base_labels` is set per target).
    pub limits: Limits,
    /// Largest body read (`usize::MAX`: none).
    pub body_size_limit: usize,
    /// Query parameters by name (the `__param_<name>` labels).
    pub param_map: BTreeMap<String, Vec<String>>,
    /// `relabel_configs`, compiled.
    pub relabel: Vec<Rule>,
    /// `metric_relabel_configs`, compiled.
    pub metric_relabel: Vec<Rule>,
    /// Discovery mechanisms (static targets are in `targets`).
    pub discovery: Vec<Discovery>,
    /// Most targets after relabeling.
    pub target_limit: usize,
}

/// One checked discovery mechanism of a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Discovery {
    /// `file_sd_configs` entry.
    File(FileSdConfig),
    /// `http_sd_configs` entry: its URL and client.
    Http {
        /// Settings.
        config: HttpSdConfig,
        /// The endpoint.
        url: reqwest::Url,
        /// TLS and credentials.
        client: ScrapeClient,
    },
    /// `kubernetes_sd_configs` entry.
    Kubernetes {
        /// Settings.
        config: KubernetesSdConfig,
        /// pod or endpoints.
        role: Role,
        /// TLS and credentials towards `api_server` (unused in-cluster).
        client: ScrapeClient,
    },
}

impl Job {
    /// The exposition URL of a target, with the job's path and parameters.
    pub fn target_url(&self, addr: &TargetAddr) -> Result<reqwest::Url, String> {
        let mut url = reqwest::Url::parse(&format!("{}://{}{}", self.scheme, addr.instance(), self.metrics_path))
            .map_err(|e| format!("target {}: not usable in a URL: {e}", addr.instance()))?;
        if !self.params.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in &self.params {
                q.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// The target's TGI `/info` URL.
    pub fn info_url(&self, addr: &TargetAddr) -> Result<reqwest::Url, String> {
        reqwest::Url::parse(&format!("{}://{}/info", self.scheme, addr.instance()))
            .map_err(|e| format!("target {}: not usable in a URL: {e}", addr.instance()))
    }
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

fn job_err(i: usize, rest: &[PathSeg], message: impl Into<String>) -> FieldError {
    let mut path = vec![key("config"), key("scrape_configs"), PathSeg::Index(i)];
    path.extend_from_slice(rest);
    FieldError { path, message: message.into() }
}

/// Whether `s` is a valid Prometheus label name that a user may set.
fn valid_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !s.starts_with("__")
}

/// Compiles a job's relabel rules; errors name `<field>[k].<key>`.
fn rules(i: usize, field: &str, raw: &[RelabelConfig]) -> Result<Vec<Rule>, FieldError> {
    raw.iter()
        .enumerate()
        .map(|(k, r)| r.compile().map_err(|e| job_err(i, &[key(field), PathSeg::Index(k), key(e.field)], e.message)))
        .collect()
}

/// Checks a job's discovery configs.
fn discovery(i: usize, sc: &ScrapeConfig) -> Result<Vec<Discovery>, FieldError> {
    let mut out = Vec::new();
    for (k, f) in sc.file_sd_configs.iter().enumerate() {
        f.check().map_err(|(idx, m)| {
            let mut p = vec![key("file_sd_configs"), PathSeg::Index(k)];
            match idx {
                Some(x) => p.extend([key("files"), PathSeg::Index(x)]),
                None if m.starts_with("refresh") => p.push(key("refresh_interval")),
                None => p.push(key("files")),
            }
            job_err(i, &p, m)
        })?;
        out.push(Discovery::File(f.clone()));
    }
    for (k, h) in sc.http_sd_configs.iter().enumerate() {
        let at = |rest: &[PathSeg]| {
            let mut p = vec![key("http_sd_configs"), PathSeg::Index(k)];
            p.extend_from_slice(rest);
            p
        };
        let Some(u) = &h.url else {
            return Err(job_err(i, &at(&[key("url")]), "url is required"));
        };
        let url = match reqwest::Url::parse(u) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => url,
            _ => return Err(job_err(i, &at(&[key("url")]), format!("{u:?} is not an http(s) URL"))),
        };
        if matches!(h.refresh_interval, Some(d) if d.0.is_zero()) {
            return Err(job_err(i, &at(&[key("refresh_interval")]), "must be greater than 0"));
        }
        let client = h.http.check(&|rest: &[PathSeg], m: String| job_err(i, &at(rest), m))?;
        out.push(Discovery::Http { config: h.clone(), url, client });
    }
    for (k, c) in sc.kubernetes_sd_configs.iter().enumerate() {
        let at = |rest: &[PathSeg]| {
            let mut p = vec![key("kubernetes_sd_configs"), PathSeg::Index(k)];
            p.extend_from_slice(rest);
            p
        };
        let role = c.check().map_err(|(path, m)| {
            let rest: Vec<PathSeg> =
                path.iter().map(|s| s.parse::<usize>().map_or_else(|_| key(s), PathSeg::Index)).collect();
            job_err(i, &at(&rest), m)
        })?;
        let client = c.http.check(&|rest: &[PathSeg], m: String| job_err(i, &at(rest), m))?;
        out.push(Discovery::Kubernetes { config: c.clone(), role, client });
    }
    Ok(out)
}

impl PrometheusConfig {
    /// Parses and checks the settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let cfg: PrometheusConfig = parse_config(v)?;
        cfg.jobs()?;
        Ok(cfg)
    }

    /// The jobs with defaults applied; errors are located in the settings.
    pub fn jobs(&self) -> Result<Vec<Job>, FieldError> {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        if self.config.scrape_configs.is_empty() {
            return Err(FieldError {
                path: vec![key("config"), key("scrape_configs")],
                message: "at least one scrape config (job) is needed".into(),
            });
        }
        for (i, sc) in self.config.scrape_configs.iter().enumerate() {
            if sc.job_name.trim().is_empty() {
                return Err(job_err(i, &[key("job_name")], "must not be empty"));
            }
            if !names.insert(sc.job_name.as_str()) {
                return Err(job_err(i, &[key("job_name")], format!("duplicate job name {:?}", sc.job_name)));
            }
            let interval = sc.scrape_interval.map_or(DEFAULT_INTERVAL, |d| d.0);
            if interval.is_zero() {
                return Err(job_err(i, &[key("scrape_interval")], "must be greater than 0"));
            }
            let timeout = match sc.scrape_timeout {
                Some(t) if t.0.is_zero() => {
                    return Err(job_err(i, &[key("scrape_timeout")], "must be greater than 0"));
                }
                Some(t) if t.0 > interval => {
                    return Err(job_err(
                        i,
                        &[key("scrape_timeout")],
                        format!("{t} is greater than the scrape interval {:?}", interval),
                    ));
                }
                Some(t) => t.0,
                None => DEFAULT_TIMEOUT.min(interval),
            };
            match sc.scheme.as_str() {
                "http" | "https" => {}
                other => {
                    return Err(job_err(i, &[key("scheme")], format!("unknown scheme {other:?}; use http or https")));
                }
            }
            let client = sc.http.check(&|rest: &[PathSeg], m: String| job_err(i, rest, m))?;
            if !sc.metrics_path.starts_with('/') || sc.metrics_path.contains(['?', '#', ' ']) {
                return Err(job_err(i, &[key("metrics_path")], "must be a path starting with '/'"));
            }
            let mut targets = Vec::new();
            for (j, st) in sc.static_configs.iter().enumerate() {
                let at = |rest: &[PathSeg]| {
                    let mut p = vec![key("static_configs"), PathSeg::Index(j)];
                    p.extend_from_slice(rest);
                    p
                };
                for name in st.labels.keys() {
                    if !valid_label_name(name) || name == "job" || name == "instance" {
                        return Err(job_err(
                            i,
                            &at(&[key("labels"), key(name)]),
                            "invalid label name (letters, digits and '_', not starting with '__'; \
                             job and instance are set by the receiver)",
                        ));
                    }
                }
                let labels: Vec<(String, String)> =
                    st.labels.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect();
                for (k, t) in st.targets.iter().enumerate() {
                    let addr =
                        TargetAddr::parse(t).map_err(|m| job_err(i, &at(&[key("targets"), PathSeg::Index(k)]), m))?;
                    targets.push((addr, labels.clone()));
                }
            }
            let discovery = discovery(i, sc)?;
            if targets.is_empty() && discovery.is_empty() {
                return Err(job_err(
                    i,
                    &[key("static_configs")],
                    "the job has no targets (static_configs, file_sd_configs, http_sd_configs or kubernetes_sd_configs)",
                ));
            }
            let relabel = rules(i, "relabel_configs", &sc.relabel_configs)?;
            let metric_relabel = rules(i, "metric_relabel_configs", &sc.metric_relabel_configs)?;
            let params = sc.params.iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.clone()))).collect();
            let job = Job {
                name: sc.job_name.clone(),
                interval,
                timeout,
                metrics_path: sc.metrics_path.clone(),
                scheme: sc.scheme.clone(),
                honor_labels: sc.honor_labels,
                params,
                targets,
                client,
                limits: Limits {
                    sample_limit: sc.sample_limit,
                    label_limit: sc.label_limit,
                    label_name_length_limit: sc.label_name_length_limit,
                    label_value_length_limit: sc.label_value_length_limit,
                    base_labels: 0,
                },
                body_size_limit: match sc.body_size_limit {
                    None => DEFAULT_BODY_SIZE_LIMIT,
                    Some(ByteSize(0)) => usize::MAX,
                    Some(ByteSize(n)) => usize::try_from(n).unwrap_or(usize::MAX),
                },
                param_map: sc.params.clone(),
                relabel,
                metric_relabel,
                discovery,
                target_limit: if sc.target_limit == 0 { MAX_TARGETS } else { sc.target_limit },
            };
            for (addr, _) in &job.targets {
                job.target_url(addr).map_err(|m| job_err(i, &[key("static_configs")], m))?;
            }
            out.push(job);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(job: serde_json::Value) -> serde_json::Value {
        json!({"config": {"scrape_configs": [job]}})
    }

    #[test]
    fn defaults_apply() {
        let c = PrometheusConfig::from_value(&cfg(json!({"job_name": "vllm",
            "static_configs": [{"targets": ["127.0.0.1:8000"], "labels": {"env": "prod"}}]})))
        .unwrap();
        let jobs = c.jobs().unwrap();
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert_eq!(j.interval, Duration::from_secs(60));
        assert_eq!(j.timeout, Duration::from_secs(10));
        assert_eq!(j.metrics_path, "/metrics");
        assert_eq!(j.scheme, "http");
        assert!(!j.honor_labels);
        assert_eq!(j.targets[0].0, TargetAddr { host: "127.0.0.1".into(), port: 8000 });
        assert_eq!(j.targets[0].1, vec![("env".to_string(), "prod".to_string())]);
        assert_eq!(c.tgi.model, "");
    }

    #[test]
    fn values_and_params() {
        let c = PrometheusConfig::from_value(&json!({"config": {"scrape_configs": [{"job_name": "tgi",
            "scrape_interval": "5s", "metrics_path": "/m", "honor_labels": true,
            "params": {"format": ["a", "b"]}, "static_configs": [{"targets": ["[::1]:3000", "tgi-host"]}]}]},
            "tgi": {"model": "bloom"}}))
        .unwrap();
        let j = &c.jobs().unwrap()[0];
        assert_eq!(j.interval, Duration::from_secs(5));
        assert_eq!(j.timeout, Duration::from_secs(5), "the default timeout is capped at the interval");
        assert_eq!(j.params, vec![("format".into(), "a".into()), ("format".into(), "b".into())]);
        assert_eq!(j.target_url(&j.targets[0].0).unwrap().as_str(), "http://[::1]:3000/m?format=a&format=b");
        assert_eq!(j.info_url(&j.targets[1].0).unwrap().as_str(), "http://tgi-host/info");
        assert_eq!(j.targets[0].0.instance(), "[::1]:3000");
        assert_eq!(j.targets[1].0.instance(), "tgi-host:80");
        assert_eq!(c.tgi.model, "bloom");
    }

    #[test]
    fn errors_are_located() {
        let t = json!([{"targets": ["h:1"]}]);
        let cases = [
            (json!({"job_name": "a", "scheme": "http2", "static_configs": t}), "scheme", "https"),
            (json!({"job_name": "a", "scheme": "ftp", "static_configs": t}), "scheme", "unknown scheme"),
            (
                json!({"job_name": "a", "scrape_interval": "5s", "scrape_timeout": "10s", "static_configs": t}),
                "scrape_timeout",
                "greater than",
            ),
            (json!({"job_name": "a", "scrape_interval": "0s", "static_configs": t}), "scrape_interval", "greater"),
            (json!({"job_name": "", "static_configs": t}), "job_name", "empty"),
            (json!({"job_name": "a"}), "static_configs", "no targets"),
            (json!({"job_name": "a", "metrics_path": "metrics", "static_configs": t}), "metrics_path", "'/'"),
        ];
        for (job, field, msg) in cases {
            let e = PrometheusConfig::from_value(&cfg(job.clone())).unwrap_err();
            assert_eq!(e.path, vec![key("config"), key("scrape_configs"), PathSeg::Index(0), key(field)], "{job}: {e}");
            assert!(e.message.contains(msg), "{job}: {}", e.message);
        }
        let e = PrometheusConfig::from_value(&cfg(json!({"job_name": "a",
            "static_configs": [{"targets": ["ok:1", "http://x:1"]}]})))
        .unwrap_err();
        assert_eq!(e.path.last(), Some(&PathSeg::Index(1)));
        let e = PrometheusConfig::from_value(&cfg(json!({"job_name": "a",
            "static_configs": [{"targets": ["ok:1"], "labels": {"job": "x"}}]})))
        .unwrap_err();
        assert_eq!(e.path.last(), Some(&key("job")));
        let e = PrometheusConfig::from_value(&cfg(json!({"job_name": "a", "scrape_intervall": "1s"}))).unwrap_err();
        assert_eq!(e.path.last(), Some(&key("scrape_intervall")));
        let e = PrometheusConfig::from_value(&json!({"config": {"scrape_configs": [
            {"job_name": "a", "static_configs": t}, {"job_name": "a", "static_configs": t}]}}))
        .unwrap_err();
        assert_eq!(e.path, vec![key("config"), key("scrape_configs"), PathSeg::Index(1), key("job_name")]);
        assert!(PrometheusConfig::from_value(&json!(null)).is_err(), "config is required");
    }

    #[test]
    fn targets_parse() {
        assert_eq!(TargetAddr::parse("h:9").unwrap().instance(), "h:9");
        for bad in ["", ":9", "h:0", "h:x", "::1:9", "[::1", "[::1]x", "h:9/p", "a b:1"] {
            assert!(TargetAddr::parse(bad).is_err(), "{bad:?}");
        }
    }
}
