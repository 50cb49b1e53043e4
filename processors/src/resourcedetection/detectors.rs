//! The detectors of `resourcedetection`: `env` (OTEL_RESOURCE_ATTRIBUTES), `system` (host and
//! OS) and `k8s_downward_api` (the pod identity Kubernetes' Downward API puts in the environment).
//!
//! Each reads the environment through a lookup function, so tests give it their own.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The environment variable the `env` detector reads.
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// A lookup of environment variables.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Why OTEL_RESOURCE_ATTRIBUTES was discarded (the OTel spec discards the whole value on an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A pair without `=`.
    #[error("entry {0:?} is not key=value")]
    NoEquals(String),
    /// A pair with an empty key.
    #[error("entry {0:?} has an empty key")]
    EmptyKey(String),
    /// A `%` not followed by two hex digits.
    #[error("entry {0:?} has an invalid percent-escape")]
    BadEscape(String),
    /// Decoded bytes that are not UTF-8.
    #[error("entry {0:?} does not decode to UTF-8")]
    NotUtf8(String),
}

fn percent_decode(s: &str, whole: &str) -> Result<String, EnvError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let digit = |j: usize| b.get(j).and_then(|c| char::from(*c).to_digit(16));
            match (digit(i + 1), digit(i + 2)) {
                (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                _ => return Err(EnvError::BadEscape(whole.to_string())),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| EnvError::NotUtf8(whole.to_string()))
}

/// Parses OTEL_RESOURCE_ATTRIBUTES as the OTel spec says: `key=value` pairs separated by `,`,
/// keys and values trimmed of spaces and percent-decoded (`+` stays `+`); empty entries are
/// skipped; a later duplicate key wins. Any malformed entry makes the whole value an error.
pub fn parse_resource_attributes(s: &str) -> Result<Vec<(String, String)>, EnvError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in s.split(',') {
        if entry.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = entry.split_once('=') else { return Err(EnvError::NoEquals(entry.to_string())) };
        let key = percent_decode(k.trim(), entry)?;
        if key.is_empty() {
            return Err(EnvError::EmptyKey(entry.to_string()));
        }
        let value = percent_decode(v.trim(), entry)?;
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => out.push((key, value)),
        }
    }
    Ok(out)
}

/// The `env` detector: OTEL_RESOURCE_ATTRIBUTES; a malformed value is discarded with a warning.
pub fn detect_env(env: Env<'_>) -> Vec<(String, String)> {
    let Some(raw) = env(OTEL_RESOURCE_ATTRIBUTES) else { return Vec::new() };
    match parse_resource_attributes(&raw) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "resourcedetection env: {OTEL_RESOURCE_ATTRIBUTES} discarded");
            Vec::new()
        }
    }
}

/// otelcol's per-attribute toggle: `resource_attributes: {host.arch: {enabled: true}}`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toggle {
    /// Whether the attribute is set.
    pub enabled: bool,
}

/// Settings of the `system` detector (otelcol's keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SystemConfig {
    /// Where host.name comes from, in order; only `os` (the kernel's host name) is supported (default [os]).
    pub hostname_sources: Vec<String>,
    /// Per-attribute toggles (host.name and os.type on, host.arch off by default, as otelcol).
    pub resource_attributes: BTreeMap<String, Toggle>,
}

impl Default for SystemConfig {
    fn default() -> Self {
        SystemConfig { hostname_sources: vec!["os".into()], resource_attributes: BTreeMap::new() }
    }
}

/// Attributes of otelcol's system detector inferwatch does not detect (refused when enabled).
const SYSTEM_UNSUPPORTED: &[&str] = &[
    "host.cpu.cache.l2.size",
    "host.cpu.family",
    "host.cpu.model.id",
    "host.cpu.model.name",
    "host.cpu.stepping",
    "host.cpu.vendor.id",
    "host.id",
    "host.interface",
    "host.ip",
    "host.mac",
    "os.build.id",
    "os.description",
    "os.name",
    "os.version",
];

/// The system detector's attributes with their default toggles.
const SYSTEM_SUPPORTED: [(&str, bool); 3] = [("host.name", true), ("os.type", true), ("host.arch", false)];

/// A checked toggle map: `Err((attribute, message))` names the offending attribute.
fn toggles(
    given: &BTreeMap<String, Toggle>,
    supported: &[(&str, bool)],
    unsupported: &[&str],
) -> Result<Vec<String>, (String, String)> {
    for (k, t) in given {
        if supported.iter().any(|(s, _)| s == k) {
            continue;
        }
        if unsupported.contains(&k.as_str()) {
            if t.enabled {
                return Err((k.clone(), "is not detected by inferwatch; remove it or set enabled: false".into()));
            }
            continue;
        }
        let names: Vec<&str> = supported.iter().map(|(s, _)| *s).collect();
        return Err((k.clone(), format!("is not an attribute of this detector (one of {})", names.join(", "))));
    }
    Ok(supported
        .iter()
        .filter(|(k, dflt)| given.get(*k).map_or(*dflt, |t| t.enabled))
        .map(|(k, _)| k.to_string())
        .collect())
}

impl SystemConfig {
    /// The enabled attributes, or (field path under `system`, message).
    pub fn check(&self) -> Result<Vec<String>, (String, String)> {
        for (i, s) in self.hostname_sources.iter().enumerate() {
            match s.as_str() {
                "os" => {}
                "dns" | "cname" | "lookup" => {
                    return Err((
                        format!("hostname_sources.{i}"),
                        format!("{s:?} is not supported by inferwatch (no DNS lookups); use [os]"),
                    ));
                }
                _ => {
                    return Err((
                        format!("hostname_sources.{i}"),
                        format!("{s:?} is not one of dns, os, cname, lookup"),
                    ));
                }
            }
        }
        toggles(&self.resource_attributes, &SYSTEM_SUPPORTED, SYSTEM_UNSUPPORTED)
            .map_err(|(k, m)| (format!("resource_attributes.{k}"), m))
    }
}

/// The kernel's host name (`os`), as Go's os.Hostname reads it on Linux.
pub fn os_host_name() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
}

/// `os.type` in semantic-convention values (`linux`, `darwin`, `windows`, ...).
pub fn os_type() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    }
}

/// `host.arch` in semantic-convention values (`amd64`, `arm64`, `x86`, `arm32`, `ppc64`, `s390x`).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "x86",
        "arm" => "arm32",
        "powerpc64" => "ppc64",
        "powerpc" => "ppc32",
        other => other,
    }
}

/// The `system` detector, with the enabled attributes from [`SystemConfig::check`].
pub fn detect_system(enabled: &[String]) -> Vec<(String, String)> {
    enabled
        .iter()
        .filter_map(|k| {
            let v = match k.as_str() {
                "host.name" => os_host_name().or_else(|| {
                    tracing::warn!("resourcedetection system: no host name from the os source");
                    None
                })?,
                "os.type" => os_type().to_string(),
                "host.arch" => host_arch().to_string(),
                _ => return None,
            };
            Some((k.clone(), v))
        })
        .collect()
}

/// The Downward API attributes and the environment variables they come from by default.
pub const DOWNWARD_DEFAULTS: [(&str, &str); 5] = [
    ("k8s.pod.name", "K8S_POD_NAME"),
    ("k8s.namespace.name", "K8S_NAMESPACE_NAME"),
    ("k8s.node.name", "K8S_NODE_NAME"),
    ("k8s.pod.uid", "K8S_POD_UID"),
    ("k8s.container.name", "K8S_CONTAINER_NAME"),
];

/// Settings of the `k8s_downward_api` detector.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DownwardApiConfig {
    /// Environment variable per attribute, over the defaults (`k8s.pod.name: MY_POD_NAME`).
    pub env_vars: BTreeMap<String, String>,
    /// Per-attribute toggles (all on by default).
    pub resource_attributes: BTreeMap<String, Toggle>,
}

impl DownwardApiConfig {
    /// (attribute, variable) pairs enabled, or (field path under `k8s_downward_api`, message).
    pub fn check(&self) -> Result<Vec<(String, String)>, (String, String)> {
        let known: Vec<&str> = DOWNWARD_DEFAULTS.iter().map(|(k, _)| *k).collect();
        for (k, v) in &self.env_vars {
            if !known.contains(&k.as_str()) {
                return Err((format!("env_vars.{k}"), format!("is not one of {}", known.join(", "))));
            }
            if v.is_empty() {
                return Err((format!("env_vars.{k}"), "must name an environment variable".into()));
            }
        }
        let supported: Vec<(&str, bool)> = known.iter().map(|k| (*k, true)).collect();
        let enabled = toggles(&self.resource_attributes, &supported, &[])
            .map_err(|(k, m)| (format!("resource_attributes.{k}"), m))?;
        Ok(DOWNWARD_DEFAULTS
            .iter()
            .filter(|(k, _)| enabled.iter().any(|e| e == k))
            .map(|(k, var)| (k.to_string(), self.env_vars.get(*k).cloned().unwrap_or_else(|| var.to_string())))
            .collect())
    }
}

/// The `k8s_downward_api` detector: each enabled attribute from its variable, when set and not empty.
pub fn detect_downward_api(pairs: &[(String, String)], env: Env<'_>) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter_map(|(attr, var)| {
            let v = env(var)?.trim().to_string();
            (!v.is_empty()).then(|| (attr.clone(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn otel_resource_attributes_parsing() {
        assert_eq!(
            parse_resource_attributes("service.name=vllm, k8s.pod.name = p-1 ,,deployment.environment=prod").unwrap(),
            pairs(&[("service.name", "vllm"), ("k8s.pod.name", "p-1"), ("deployment.environment", "prod")])
        );
        // Percent-decoding: comma, equals, space, UTF-8; '+' stays; the value may contain '='.
        assert_eq!(
            parse_resource_attributes("a=x%2Cy%3Dz,b=hello%20w%C3%B6rld,c=1+1,d=k=v,e=").unwrap(),
            pairs(&[("a", "x,y=z"), ("b", "hello wörld"), ("c", "1+1"), ("d", "k=v"), ("e", "")])
        );
        assert_eq!(parse_resource_attributes("a=1,a=2").unwrap(), pairs(&[("a", "2")]));
        assert_eq!(parse_resource_attributes("").unwrap(), vec![]);
        assert_eq!(parse_resource_attributes("a=1,novalue"), Err(EnvError::NoEquals("novalue".into())));
        assert_eq!(parse_resource_attributes("=v"), Err(EnvError::EmptyKey("=v".into())));
        assert_eq!(parse_resource_attributes("a=%zz"), Err(EnvError::BadEscape("a=%zz".into())));
        assert_eq!(parse_resource_attributes("a=%4"), Err(EnvError::BadEscape("a=%4".into())));
        assert_eq!(parse_resource_attributes("a=%+1"), Err(EnvError::BadEscape("a=%+1".into())));
        assert_eq!(parse_resource_attributes("a=%FF"), Err(EnvError::NotUtf8("a=%FF".into())));
        // A bad pair discards the whole value.
        let env = |k: &str| (k == OTEL_RESOURCE_ATTRIBUTES).then(|| "good=1,bad".to_string());
        assert!(detect_env(&env).is_empty());
    }

    #[test]
    fn system_toggles_and_sources() {
        let c = SystemConfig::default();
        assert_eq!(c.check().unwrap(), vec!["host.name".to_string(), "os.type".to_string()]);
        let mut c = SystemConfig::default();
        c.resource_attributes.insert("host.arch".into(), Toggle { enabled: true });
        c.resource_attributes.insert("os.type".into(), Toggle { enabled: false });
        c.resource_attributes.insert("host.id".into(), Toggle { enabled: false });
        assert_eq!(c.check().unwrap(), vec!["host.name".to_string(), "host.arch".to_string()]);
        let got = detect_system(&c.check().unwrap());
        assert_eq!(got.iter().find(|(k, _)| k == "host.arch").map(|(_, v)| v.as_str()), Some(host_arch()));
        assert!(got.iter().all(|(k, _)| k != "os.type"));
        c.resource_attributes.insert("host.id".into(), Toggle { enabled: true });
        assert_eq!(c.check().unwrap_err().0, "resource_attributes.host.id");
        let c = SystemConfig { hostname_sources: vec!["os".into(), "dns".into()], ..Default::default() };
        assert_eq!(c.check().unwrap_err().0, "hostname_sources.1");
    }

    #[test]
    fn downward_api_reads_overridable_variables() {
        let mut c = DownwardApiConfig::default();
        c.env_vars.insert("k8s.pod.name".into(), "MY_POD".into());
        c.resource_attributes.insert("k8s.pod.uid".into(), Toggle { enabled: false });
        let p = c.check().unwrap();
        let env = |k: &str| match k {
            "MY_POD" => Some("vllm-0".to_string()),
            "K8S_POD_NAME" => Some("wrong".to_string()),
            "K8S_NAMESPACE_NAME" => Some("llm".to_string()),
            "K8S_NODE_NAME" => Some(" gpu-node-3 ".to_string()),
            "K8S_POD_UID" => Some("uid".to_string()),
            "K8S_CONTAINER_NAME" => Some(String::new()),
            _ => None,
        };
        assert_eq!(
            detect_downward_api(&p, &env),
            pairs(&[("k8s.pod.name", "vllm-0"), ("k8s.namespace.name", "llm"), ("k8s.node.name", "gpu-node-3")])
        );
        let mut bad = DownwardApiConfig::default();
        bad.env_vars.insert("k8s.pod.ip".into(), "X".into());
        assert_eq!(bad.check().unwrap_err().0, "env_vars.k8s.pod.ip");
    }
}
