//! Settings of the `prometheus` receiver: the subset of otelcol's (Prometheus') `scrape_configs`
//! that static targets need, plus the `tgi` extension.

use inferwatch_core::component::{FieldError, PathSeg, parse_config};
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// Prometheus' default scrape interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
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

/// One job: how and where to scrape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
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
    /// `http` (`https` is not supported yet).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Whether scraped labels win over the target's labels when they clash.
    #[serde(default)]
    pub honor_labels: bool,
    /// URL query parameters sent with each scrape.
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    /// Fixed lists of targets.
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
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
                "http" => {}
                "https" => {
                    return Err(job_err(
                        i,
                        &[key("scheme")],
                        "https is not supported yet (TLS scraping is coming); use http",
                    ));
                }
                other => return Err(job_err(i, &[key("scheme")], format!("unknown scheme {other:?}; use http"))),
            }
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
            if targets.is_empty() {
                return Err(job_err(i, &[key("static_configs")], "the job has no targets"));
            }
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
            (json!({"job_name": "a", "scheme": "https", "static_configs": t}), "scheme", "TLS"),
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
