//! Extension `headers_setter` (otelcol-contrib's): a client authenticator that sets request
//! headers from fixed values or from the metadata of the request being forwarded
//! (`from_context`: [`ClientInfo::current`], kept by receivers with `include_metadata: true`
//! and carried through `batch` with `metadata_keys`), e.g. a tenant's `X-Scope-OrgID`.
//!
//! ```yaml
//! extensions:
//!   headers_setter:
//!     headers:
//!       - { key: X-Scope-OrgID, from_context: x-tenant, default_value: anonymous, action: upsert }
//!       - { key: X-Source, value: inferwatch }
//! ```
//!
//! The authenticator interface only adds headers, so `insert`, `update` and `upsert` all set
//! the header on the outgoing request (replacing an exporter `headers:` entry of the same
//! name) and `delete` sets nothing.

use super::bearertokenauth::Passive;
use crate::auth::{AuthError, Authenticator, ClientAuth, ClientInfo};
use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::vocab::{ComponentError, FieldError, parse_config};
use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use std::sync::Arc;

/// What to do with a header (otelcol's `action`, default `upsert`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Set the header when the request has none.
    Insert,
    /// Replace the header when the request has one.
    Update,
    /// Set the header.
    #[default]
    Upsert,
    /// Remove the header.
    Delete,
}

/// One `headers:` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEntry {
    /// Header name.
    pub key: String,
    /// A fixed value.
    #[serde(default)]
    pub value: Option<String>,
    /// The client-metadata key whose value is used.
    #[serde(default)]
    pub from_context: Option<String>,
    /// Used when `from_context` finds nothing.
    #[serde(default)]
    pub default_value: Option<String>,
    /// What to do (default `upsert`).
    #[serde(default)]
    pub action: Action,
}

/// Settings of `headers_setter`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadersSetterConfig {
    /// The headers to set.
    pub headers: Vec<HeaderEntry>,
}

impl HeadersSetterConfig {
    /// Parses and checks the settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: HeadersSetterConfig = parse_config(v)?;
        if c.headers.is_empty() {
            return Err(FieldError::at("headers", "at least one header is needed"));
        }
        for (i, h) in c.headers.iter().enumerate() {
            let at = |k: &str| format!("headers.{i}.{k}");
            HeaderName::try_from(h.key.as_str())
                .map_err(|_| FieldError::at(&at("key"), format!("invalid header name {:?}", h.key)))?;
            if h.action == Action::Delete {
                continue;
            }
            match (&h.value, &h.from_context) {
                (Some(_), Some(_)) => {
                    return Err(FieldError::at(&at("value"), "value and from_context are mutually exclusive"));
                }
                (None, None) => return Err(FieldError::at(&at("value"), "set value or from_context")),
                _ => {}
            }
            for (k, v) in [("value", &h.value), ("default_value", &h.default_value)] {
                if let Some(v) = v
                    && HeaderValue::from_str(v).is_err()
                {
                    return Err(FieldError::at(&at(k), "not usable in an HTTP header (control characters)"));
                }
            }
        }
        Ok(c)
    }
}

struct Rule {
    key: HeaderName,
    action: Action,
    value: Option<HeaderValue>,
    from_context: Option<String>,
    default_value: Option<HeaderValue>,
}

/// The running client authenticator.
pub struct HeadersSetter {
    rules: Vec<Rule>,
}

impl HeadersSetter {
    /// Builds it from checked settings.
    pub fn new(c: &HeadersSetterConfig) -> Result<Self, String> {
        let mut rules = Vec::new();
        for h in &c.headers {
            let hv =
                |v: &Option<String>| v.as_deref().map(HeaderValue::from_str).transpose().map_err(|e| e.to_string());
            rules.push(Rule {
                key: HeaderName::try_from(h.key.as_str()).map_err(|e| e.to_string())?,
                action: h.action,
                value: hv(&h.value)?,
                from_context: h.from_context.clone(),
                default_value: hv(&h.default_value)?,
            });
        }
        Ok(HeadersSetter { rules })
    }
}

impl HeadersSetter {
    /// Each rule with the value it sets now (`None`: nothing to set, or a delete).
    fn resolved(&self) -> Vec<(&Rule, Option<HeaderValue>)> {
        let client = ClientInfo::current();
        let mut out = Vec::with_capacity(self.rules.len());
        for r in &self.rules {
            if r.action == Action::Delete {
                out.push((r, None));
                continue;
            }
            let v = match (&r.value, &r.from_context) {
                (Some(v), _) => Some(v.clone()),
                (None, Some(k)) => {
                    let found: Vec<HeaderValue> = client
                        .as_ref()
                        .map(|c| c.metadata.get_all(k.as_str()).iter().cloned().collect())
                        .unwrap_or_default();
                    match found.len() {
                        0 => r.default_value.clone(),
                        1 => found.into_iter().next(),
                        n => {
                            tracing::debug!(key = %k, values = n, header = %r.key,
                                "several values for a from_context key; the header is not set");
                            None
                        }
                    }
                }
                (None, None) => None,
            };
            out.push((r, v.filter(|v| !v.is_empty())));
        }
        out
    }
}

impl ClientAuth for HeadersSetter {
    fn headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, AuthError> {
        Ok(self
            .resolved()
            .into_iter()
            .filter(|(r, _)| r.action != Action::Delete)
            .filter_map(|(r, v)| v.map(|v| (r.key.clone(), v)))
            .collect())
    }

    fn apply(&self, headers: &mut http::HeaderMap) -> Result<(), AuthError> {
        for (r, v) in self.resolved() {
            match (r.action, v) {
                (Action::Delete, _) => {
                    headers.remove(&r.key);
                }
                (Action::Insert, Some(v)) => {
                    if !headers.contains_key(&r.key) {
                        headers.insert(r.key.clone(), v);
                    }
                }
                (Action::Update, Some(v)) => {
                    if headers.contains_key(&r.key) {
                        headers.insert(r.key.clone(), v);
                    }
                }
                (Action::Upsert, Some(v)) => {
                    headers.insert(r.key.clone(), v);
                }
                (_, None) => {}
            }
        }
        Ok(())
    }
}

/// Factory of `headers_setter`.
pub struct HeadersSetterFactory;

impl ExtensionFactory for HeadersSetterFactory {
    fn type_name(&self) -> &'static str {
        "headers_setter"
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(HeadersSetterConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let c = crate::component::typed::<HeadersSetterConfig>(parsed)?;
        let h = HeadersSetter::new(c).map_err(|e| ComponentError::Start(format!("{}: {e}", ctx.id)))?;
        let client: Arc<dyn ClientAuth> = Arc::new(h);
        ctx.host.services.provide(&ctx.id.to_string(), Authenticator { server: None, client: Some(client) });
        Ok(Box::new(Passive))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn setter(v: serde_json::Value) -> HeadersSetter {
        HeadersSetter::new(&HeadersSetterConfig::from_value(&v).unwrap()).unwrap()
    }

    fn info(pairs: &[(&'static str, &'static str)]) -> Arc<ClientInfo> {
        let mut md = http::HeaderMap::new();
        for (k, v) in pairs {
            md.append(*k, HeaderValue::from_static(v));
        }
        Arc::new(ClientInfo { metadata: md, ..Default::default() })
    }

    #[tokio::test]
    async fn from_context_reads_the_current_client() {
        let s = setter(json!({"headers": [
            {"key": "X-Scope-OrgID", "from_context": "x-tenant", "default_value": "anon"},
            {"key": "X-Source", "value": "inferwatch", "action": "insert"},
            {"key": "X-Gone", "action": "delete"},
        ]}));
        let got = ClientInfo::scope(info(&[("x-tenant", "team-a")]), async { s.headers().unwrap() }).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.as_str(), "x-scope-orgid");
        assert_eq!(got[0].1, "team-a");
        assert_eq!(got[1].1, "inferwatch");
        let other = ClientInfo::scope(info(&[("x-tenant", "team-b")]), async { s.headers().unwrap() }).await;
        assert_eq!(other[0].1, "team-b");
        let none = ClientInfo::scope(info(&[]), async { s.headers().unwrap() }).await;
        assert_eq!(none[0].1, "anon", "default_value when the metadata lacks the key");
        assert_eq!(s.headers().unwrap()[0].1, "anon", "outside any client scope");
        let two =
            ClientInfo::scope(info(&[("x-tenant", "a"), ("x-tenant", "b")]), async { s.headers().unwrap() }).await;
        assert_eq!(two.len(), 1, "ambiguous metadata sets no header");
    }

    #[tokio::test]
    async fn actions_insert_update_upsert_delete() {
        let s = setter(json!({"headers": [
            {"key": "X-Insert", "value": "new", "action": "insert"},
            {"key": "X-Update", "value": "new", "action": "update"},
            {"key": "X-Upsert", "value": "new", "action": "upsert"},
            {"key": "X-Gone", "action": "delete"},
        ]}));
        let mut present = http::HeaderMap::new();
        for k in ["x-insert", "x-update", "x-upsert", "x-gone"] {
            present.insert(k, HeaderValue::from_static("old"));
        }
        s.apply(&mut present).unwrap();
        assert_eq!(present["x-insert"], "old", "insert keeps an existing header");
        assert_eq!(present["x-update"], "new");
        assert_eq!(present["x-upsert"], "new");
        assert!(!present.contains_key("x-gone"));
        let mut absent = http::HeaderMap::new();
        s.apply(&mut absent).unwrap();
        assert_eq!(absent["x-insert"], "new");
        assert!(!absent.contains_key("x-update"), "update sets nothing when the header is absent");
        assert_eq!(absent["x-upsert"], "new");
    }

    #[test]
    fn settings_are_checked() {
        for (v, at) in [
            (json!({"headers": []}), "headers"),
            (json!({"headers": [{"key": "a b", "value": "x"}]}), "headers.0.key"),
            (json!({"headers": [{"key": "a", "value": "x", "from_context": "y"}]}), "headers.0.value"),
            (json!({"headers": [{"key": "a"}]}), "headers.0.value"),
            (json!({"headers": [{"key": "a", "value": "x", "action": "merge"}]}), "headers.0.action"),
        ] {
            let e = HeadersSetterConfig::from_value(&v).unwrap_err();
            let path = e.dotted();
            assert!(path.starts_with(at), "{v}: {path:?} {e}");
        }
    }
}
