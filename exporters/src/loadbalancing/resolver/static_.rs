//! `resolver.static`: a fixed list of backends (`hostnames`, each `host` or `host:port`; the
//! port defaults to 4317).

use super::Resolver;
use async_trait::async_trait;
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::settings::HostPort;
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Port of a hostname written without one.
pub const DEFAULT_PORT: u16 = 4317;

/// Settings of `resolver.static`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticResolverConfig {
    /// The backends.
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// `host` or `host:port` as `host:port` (IPv6 in brackets).
pub fn with_port(s: &str) -> Result<String, String> {
    let hp = match (s.starts_with('['), s.matches(':').count()) {
        (true, _) | (false, 1) => HostPort::parse(s).map_err(|e| e.to_string())?,
        (false, 0) => HostPort::parse(&format!("{s}:{DEFAULT_PORT}")).map_err(|e| e.to_string())?,
        _ => return Err(format!("{s:?}: IPv6 hosts need brackets: [::1]:4317")),
    };
    if hp.host.is_empty() {
        return Err(format!("{s:?}: the host is empty"));
    }
    if hp.port == 0 {
        return Err(format!("{s:?}: port 0 is not a port a backend listens on"));
    }
    Ok(if hp.host.contains(':') { format!("[{}]:{}", hp.host, hp.port) } else { format!("{}:{}", hp.host, hp.port) })
}

impl StaticResolverConfig {
    /// Checks the settings (paths relative to `resolver.static`).
    pub fn check(&self) -> Result<(), FieldError> {
        if self.hostnames.is_empty() {
            return Err(FieldError::at("hostnames", "at least one backend is required"));
        }
        for (i, h) in self.hostnames.iter().enumerate() {
            with_port(h).map_err(|m| FieldError {
                path: vec![PathSeg::Key("hostnames".into()), PathSeg::Index(i)],
                message: m,
            })?;
        }
        Ok(())
    }

    /// The backends, `host:port`, sorted and deduplicated.
    pub fn backends(&self) -> Vec<String> {
        let mut v: Vec<String> = self.hostnames.iter().filter_map(|h| with_port(h).ok()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The resolver.
    pub fn resolver(&self) -> Box<dyn Resolver> {
        Box::new(StaticResolver(self.backends()))
    }
}

/// Publishes its list once.
pub struct StaticResolver(pub Vec<String>);

#[async_trait]
impl Resolver for StaticResolver {
    async fn run(self: Box<Self>, tx: watch::Sender<Vec<String>>, cancel: CancellationToken) {
        tx.send_replace(self.0);
        cancel.cancelled().await;
    }
}
