//! `resolver.dns`: the A/AAAA records of `hostname`, each `ip:port`, looked up every `interval`
//! (otelcol's DNS resolver), with Hickory DNS.
//!
//! - `hostname` (required), `port` (default 4317), `interval` (default 5s), `timeout` (of one
//!   lookup; default 1s).
//! - `nameservers` (inferwatch's addition): the DNS servers asked, `ip:port` (or `ip`, port 53);
//!   default: the system's (`/etc/resolv.conf`).
//!
//! The list is published when it changes (and after the first successful lookup); a failed
//! lookup keeps the last list, and so does an answer with no record (counted as a failed
//! resolution, as otelcol does): a name briefly without records does not retire every backend. Each lookup counts in
//! `otelcol_loadbalancer_num_resolutions_total{exporter,resolver="dns",success}`. Answers are
//! not cached beyond one lookup.

use super::Resolver;
use super::k8s::NUM_RESOLUTIONS;
use async_trait::async_trait;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::telemetry::Telemetry;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// `port` when not set.
pub const DEFAULT_PORT: u16 = 4317;
/// `interval` when not set.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// `timeout` when not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings of `resolver.dns`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DnsResolverConfig {
    /// The name to resolve.
    #[serde(default)]
    pub hostname: String,
    /// Port of every backend (default 4317).
    #[serde(default)]
    pub port: Option<u16>,
    /// Time between lookups (default 5s).
    #[serde(default)]
    pub interval: Option<GoDuration>,
    /// Most time one lookup may take (default 1s).
    #[serde(default)]
    pub timeout: Option<GoDuration>,
    /// DNS servers to ask (`ip:port`); default the system's.
    #[serde(default)]
    pub nameservers: Vec<String>,
}

/// A nameserver `ip:port` or `ip` (port 53).
fn nameserver(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not ip:port (a nameserver is an IP address, e.g. 10.0.0.10:53)"))
}

impl DnsResolverConfig {
    /// Checks the settings (paths relative to `resolver.dns`).
    pub fn check(&self) -> Result<(), FieldError> {
        let h = self.hostname.trim_end_matches('.');
        if h.is_empty() {
            return Err(FieldError::at("hostname", "the name to resolve is required"));
        }
        if h.contains(':') || h.contains('/') || h.chars().any(char::is_whitespace) {
            return Err(FieldError::at("hostname", format!("{:?} is a name, without port or scheme", self.hostname)));
        }
        if self.port == Some(0) {
            return Err(FieldError::at("port", "port 0 is not a port a backend listens on"));
        }
        if self.interval.is_some_and(|d| d.0.is_zero()) {
            return Err(FieldError::at("interval", "must be more than 0"));
        }
        if self.timeout.is_some_and(|d| d.0.is_zero()) {
            return Err(FieldError::at("timeout", "must be more than 0"));
        }
        for (i, n) in self.nameservers.iter().enumerate() {
            nameserver(n).map_err(|m| FieldError {
                path: vec![PathSeg::Key("nameservers".into()), PathSeg::Index(i)],
                message: m,
            })?;
        }
        Ok(())
    }

    /// `interval` or its default.
    pub fn effective_interval(&self) -> Duration {
        self.interval.map(|d| d.0).unwrap_or(DEFAULT_INTERVAL)
    }

    /// `timeout` or its default.
    pub fn effective_timeout(&self) -> Duration {
        self.timeout.map(|d| d.0).unwrap_or(DEFAULT_TIMEOUT)
    }

    /// The resolver (`component` names it in logs; resolutions counted in `telemetry`).
    pub fn resolver(&self, component: &str, telemetry: Option<&Telemetry>) -> Result<Box<dyn Resolver>, String> {
        self.check().map_err(|e| format!("resolver.dns.{}: {e}", e.dotted()))?;
        let mut opts = ResolverOpts::default();
        opts.timeout = self.effective_timeout();
        opts.attempts = 1;
        opts.cache_size = 0;
        opts.positive_max_ttl = Some(Duration::ZERO);
        opts.negative_max_ttl = Some(Duration::ZERO);
        let provider = TokioConnectionProvider::default();
        let builder = if self.nameservers.is_empty() {
            hickory_resolver::TokioResolver::builder_tokio()
                .map_err(|e| format!("resolver.dns: cannot read the system's DNS configuration: {e}"))?
        } else {
            let mut cfg = ResolverConfig::new();
            for n in &self.nameservers {
                let addr = nameserver(n)?;
                cfg.add_name_server(NameServerConfig::new(addr, Protocol::Udp));
                cfg.add_name_server(NameServerConfig::new(addr, Protocol::Tcp));
            }
            hickory_resolver::TokioResolver::builder_with_config(cfg, provider)
        };
        let counter = |ok: &str| match telemetry {
            Some(t) => NUM_RESOLUTIONS.get(t, [component, "dns", ok]),
            None => Counter::default(),
        };
        Ok(Box::new(DnsResolver {
            component: component.to_string(),
            hostname: self.hostname.clone(),
            port: self.port.unwrap_or(DEFAULT_PORT),
            interval: self.effective_interval(),
            timeout: self.effective_timeout(),
            resolver: builder.with_options(opts).build(),
            resolved: counter("true"),
            failed: counter("false"),
        }))
    }
}

/// The DNS resolver of one exporter.
pub struct DnsResolver {
    component: String,
    hostname: String,
    port: u16,
    interval: Duration,
    timeout: Duration,
    resolver: hickory_resolver::TokioResolver,
    /// Successful lookups.
    pub resolved: Counter,
    /// Failed lookups.
    pub failed: Counter,
}

impl DnsResolver {
    /// One lookup: the backends, sorted and deduplicated.
    pub async fn lookup(&self) -> Result<Vec<String>, String> {
        let r =
            tokio::time::timeout(self.timeout + Duration::from_millis(100), self.resolver.lookup_ip(&self.hostname))
                .await
                .map_err(|_| format!("no answer within {:?}", self.timeout))?;
        // A name with no A/AAAA record is a failed lookup: the last list is kept (otelcol).
        let ips: Vec<IpAddr> = match r {
            Ok(l) => l.iter().collect(),
            Err(e) if e.is_no_records_found() => Vec::new(),
            Err(e) => return Err(e.to_string()),
        };
        if ips.is_empty() {
            return Err(format!("no A/AAAA record for {}", self.hostname));
        }
        let mut out: Vec<String> = ips
            .into_iter()
            .map(|ip| match ip {
                IpAddr::V4(a) => format!("{a}:{}", self.port),
                IpAddr::V6(a) => format!("[{a}]:{}", self.port),
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

#[async_trait]
impl Resolver for DnsResolver {
    async fn run(self: Box<Self>, tx: watch::Sender<Vec<String>>, cancel: CancellationToken) {
        let mut published: Option<Vec<String>> = None;
        let mut failing = false;
        loop {
            let r = tokio::select! {
                r = self.lookup() => r,
                _ = cancel.cancelled() => return,
            };
            match r {
                Ok(list) => {
                    self.resolved.inc();
                    if failing {
                        failing = false;
                        tracing::info!(exporter = %self.component, hostname = %self.hostname, "resolver.dns: resolving again");
                    }
                    if published.as_ref() != Some(&list) {
                        tracing::info!(exporter = %self.component, hostname = %self.hostname, backends = ?list,
                            "resolver.dns: the backends changed");
                        published = Some(list.clone());
                        tx.send_replace(list);
                    }
                }
                Err(e) => {
                    self.failed.inc();
                    if !failing {
                        failing = true;
                        tracing::warn!(exporter = %self.component, hostname = %self.hostname, error = %e,
                            kept = ?published.as_ref().map(Vec::len), "resolver.dns: lookup failed; keeping the last backends");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }
}
