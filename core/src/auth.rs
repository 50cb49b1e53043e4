//! Authentication between the agent and its peers (otelcol's `configauth`): authenticator
//! extensions register an [`Authenticator`] under their id; receivers check incoming requests
//! with its server half, exporters and scrapes decorate outgoing requests with its client half.

use std::sync::Arc;

/// Why a request was refused (answered 401 / UNAUTHENTICATED; the text is safe to log and to
/// return: it never contains the credential).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential in the request.
    #[error("missing credentials")]
    Missing,
    /// A credential that does not match.
    #[error("invalid credentials")]
    Invalid,
    /// The authenticator cannot decide (its token or password file is unreadable).
    #[error("authenticator unavailable: {0}")]
    Unavailable(String),
}

/// What an authenticated request carries on (for `include_metadata`): the principal's name,
/// when the scheme has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    /// User name (basic auth) or subject; `None` for anonymous bearer tokens.
    pub subject: Option<String>,
}

/// The server half: checks one request's headers (HTTP headers or gRPC metadata, lower-case names).
pub trait ServerAuth: Send + Sync {
    /// `Ok` lets the request in; `Err` refuses it.
    fn authenticate(&self, headers: &http::HeaderMap) -> Result<AuthInfo, AuthError>;
}

/// The client half: headers to add to each outgoing request.
pub trait ClientAuth: Send + Sync {
    /// The headers for the next request (a token file is re-read as it changes).
    fn headers(&self) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, AuthError>;

    /// Applies this authenticator to an outgoing request's headers; by default sets every
    /// header of [`ClientAuth::headers`] (an authenticator with insert/update/delete actions
    /// overrides it).
    fn apply(&self, headers: &mut http::HeaderMap) -> Result<(), AuthError> {
        for (k, v) in self.headers()? {
            headers.insert(k, v);
        }
        Ok(())
    }
}

/// What an authenticator extension registers in the host's services under its id.
#[derive(Clone, Default)]
pub struct Authenticator {
    /// Checks incoming requests (receivers), if the extension is configured for it.
    pub server: Option<Arc<dyn ServerAuth>>,
    /// Decorates outgoing requests (exporters, scrapes), if the extension is configured for it.
    pub client: Option<Arc<dyn ClientAuth>>,
}

/// `auth:` on a receiver's or exporter's settings (otelcol `configauth.Authentication`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Id of the authenticator extension (`bearertokenauth`, `basicauth/clients`, ...).
    pub authenticator: String,
}

impl AuthSettings {
    /// The server half of the named extension, or why it cannot serve.
    pub fn server(&self, host: &crate::host::Host) -> Result<Arc<dyn ServerAuth>, String> {
        let a: Authenticator = host.services.get(&self.authenticator).ok_or_else(|| {
            format!(
                "auth.authenticator: extension {} is not defined or not enabled in service.extensions",
                self.authenticator
            )
        })?;
        a.server
            .ok_or_else(|| format!("auth.authenticator: extension {} cannot authenticate servers", self.authenticator))
    }

    /// The client half of the named extension, or why it cannot serve.
    pub fn client(&self, host: &crate::host::Host) -> Result<Arc<dyn ClientAuth>, String> {
        let a: Authenticator = host.services.get(&self.authenticator).ok_or_else(|| {
            format!(
                "auth.authenticator: extension {} is not defined or not enabled in service.extensions",
                self.authenticator
            )
        })?;
        a.client
            .ok_or_else(|| format!("auth.authenticator: extension {} cannot authenticate clients", self.authenticator))
    }
}

/// Who sent the request being processed (otelcol's `client.Info`): set by a receiver around its
/// call into the pipeline; the request headers are kept only when the receiver has
/// `include_metadata: true`. Queued exporters capture it at enqueue and restore it around each
/// send, so `headers_setter` can forward tenant headers.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// The peer's address, when known.
    pub addr: Option<std::net::SocketAddr>,
    /// What the receiver's authenticator said about the caller.
    pub auth: Option<AuthInfo>,
    /// Request headers / gRPC metadata (lower-case names), with `include_metadata` only.
    pub metadata: http::HeaderMap,
}

tokio::task_local! {
    static CLIENT_INFO: Arc<ClientInfo>;
}

impl ClientInfo {
    /// Runs `fut` with `info` as the current client.
    pub async fn scope<F: std::future::Future>(info: Arc<ClientInfo>, fut: F) -> F::Output {
        CLIENT_INFO.scope(info, fut).await
    }

    /// The client of the request being processed, if a receiver set one.
    pub fn current() -> Option<Arc<ClientInfo>> {
        CLIENT_INFO.try_with(|c| c.clone()).ok()
    }

    /// The values of metadata key `key` (case-insensitive), as strings; empty when absent.
    pub fn metadata_values(&self, key: &str) -> Vec<String> {
        self.metadata.get_all(key).iter().filter_map(|v| v.to_str().ok().map(str::to_string)).collect()
    }

    /// The batching partition of `client` by `keys` (the values of each key, in order) and the
    /// client a batch of that partition is sent as (those keys' metadata only); no keys: one
    /// partition, sent without a client, as otelcol's batchers do.
    pub fn partition(keys: &[String], client: Option<&ClientInfo>) -> (Vec<Vec<String>>, Option<Arc<ClientInfo>>) {
        let key = ClientInfo::partition_key(keys, client);
        let scope = ClientInfo::partition_scope(keys, &key);
        (key, scope)
    }

    /// The values of each of `keys` in `client`'s metadata, in order (empty without keys).
    pub fn partition_key(keys: &[String], client: Option<&ClientInfo>) -> Vec<Vec<String>> {
        keys.iter().map(|k| client.map(|c| c.metadata_values(&k.to_ascii_lowercase())).unwrap_or_default()).collect()
    }

    /// The client a batch of partition `key` (from [`ClientInfo::partition_key`]) is sent as.
    pub fn partition_scope(keys: &[String], key: &[Vec<String>]) -> Option<Arc<ClientInfo>> {
        if keys.is_empty() {
            return None;
        }
        let mut metadata = http::HeaderMap::new();
        for (k, values) in keys.iter().zip(key) {
            if let Ok(name) = http::HeaderName::try_from(k.to_ascii_lowercase()) {
                for v in values {
                    if let Ok(v) = http::HeaderValue::from_str(v) {
                        metadata.append(name.clone(), v);
                    }
                }
            }
        }
        Some(Arc::new(ClientInfo { metadata, ..Default::default() }))
    }
}
