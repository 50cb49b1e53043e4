//! Extension `bearertokenauth` (otelcol-contrib's): a static bearer token, inline (`token`,
//! `tokens`) or in a file (`filename`, re-read as it changes). As a client authenticator it
//! adds `<header>: <scheme> <token>` to each request; as a server authenticator it admits
//! requests whose `<header>` carries one of the tokens (compared in constant time).
//!
//! ```yaml
//! extensions:
//!   bearertokenauth:
//!     scheme: Bearer          # default; "" sends the bare token
//!     header: Authorization   # default
//!     token: "..."            # or tokens: [...], or filename: /run/secrets/token
//! ```

use super::client_auth::{FileSecret, Secret, SecretSource, ct_eq};
use crate::auth::{AuthError, AuthInfo, Authenticator, ClientAuth, ServerAuth};
use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::host::StatusHandle;
use crate::vocab::{ComponentError, FieldError, parse_config};
use async_trait::async_trait;
use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use std::sync::Arc;

/// Settings of `bearertokenauth` (its `Debug` never shows a token).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BearerTokenAuthConfig {
    /// Header that carries the token (default `Authorization`).
    #[serde(default = "default_header")]
    pub header: String,
    /// Scheme before the token (default `Bearer`; empty: the bare token).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// The token.
    #[serde(default)]
    pub token: Secret,
    /// Several accepted tokens (server); a client sends the first.
    #[serde(default)]
    pub tokens: Vec<Secret>,
    /// File holding the token, re-read as it changes.
    #[serde(default)]
    pub filename: Option<String>,
}

fn default_header() -> String {
    "Authorization".into()
}

fn default_scheme() -> String {
    "Bearer".into()
}

impl BearerTokenAuthConfig {
    /// Parses and checks the settings (the file is not read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: BearerTokenAuthConfig = parse_config(v)?;
        let set =
            usize::from(!c.token.is_empty()) + usize::from(!c.tokens.is_empty()) + usize::from(c.filename.is_some());
        if set != 1 {
            return Err(FieldError::at("token", "set exactly one of token, tokens and filename"));
        }
        HeaderName::try_from(c.header.as_str())
            .map_err(|_| FieldError::at("header", format!("invalid header name {:?}", c.header)))?;
        if c.scheme.contains(|ch: char| ch.is_whitespace() || ch.is_control()) {
            return Err(FieldError::at("scheme", "must be one word"));
        }
        for (i, t) in c.tokens.iter().chain(std::iter::once(&c.token)).enumerate() {
            if t.is_empty() && i < c.tokens.len() {
                return Err(FieldError::at(&format!("tokens.{i}"), "must not be empty"));
            }
            if HeaderValue::from_str(t.expose()).is_err() {
                let at = if i < c.tokens.len() { format!("tokens.{i}") } else { "token".into() };
                return Err(FieldError::at(&at, "not usable in an HTTP header (control characters)"));
            }
        }
        if c.filename.as_deref() == Some("") {
            return Err(FieldError::at("filename", "must not be empty"));
        }
        Ok(c)
    }
}

/// The running authenticator: both halves.
pub struct BearerToken {
    header: HeaderName,
    scheme: String,
    tokens: Vec<SecretSource>,
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerToken")
            .field("header", &self.header)
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl BearerToken {
    /// Builds it from checked settings, reading `filename` now.
    pub fn new(c: &BearerTokenAuthConfig) -> Result<Self, String> {
        let header = HeaderName::try_from(c.header.as_str()).map_err(|e| format!("header: {e}"))?;
        let tokens = if let Some(f) = &c.filename {
            vec![SecretSource::File(FileSecret::open(f).map_err(|e| format!("filename: {e}"))?)]
        } else if !c.tokens.is_empty() {
            c.tokens.iter().cloned().map(SecretSource::Inline).collect()
        } else {
            vec![SecretSource::Inline(c.token.clone())]
        };
        Ok(BearerToken { header, scheme: c.scheme.clone(), tokens })
    }

    /// As [`BearerToken::new`] with a file checked every `every` (tests).
    pub fn with_file(header: &str, scheme: &str, file: FileSecret) -> Result<Self, String> {
        let header = HeaderName::try_from(header).map_err(|e| format!("header: {e}"))?;
        Ok(BearerToken { header, scheme: scheme.to_string(), tokens: vec![SecretSource::File(file)] })
    }

    fn credential(&self, token: &Secret) -> String {
        if self.scheme.is_empty() { token.expose().to_string() } else { format!("{} {}", self.scheme, token.expose()) }
    }
}

impl ServerAuth for BearerToken {
    fn authenticate(&self, headers: &http::HeaderMap) -> Result<AuthInfo, AuthError> {
        let got = headers.get(&self.header).ok_or(AuthError::Missing)?;
        let got = got.as_bytes();
        if got.is_empty() {
            return Err(AuthError::Missing);
        }
        let mut ok = false;
        for t in &self.tokens {
            // Every token is compared, so the time does not tell which one nearly matched.
            ok |= ct_eq(got, self.credential(&t.current()).as_bytes());
        }
        if ok { Ok(AuthInfo::default()) } else { Err(AuthError::Invalid) }
    }
}

impl ClientAuth for BearerToken {
    fn headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, AuthError> {
        let token = self.tokens.first().map(SecretSource::current).unwrap_or_default();
        if token.is_empty() {
            return Err(AuthError::Unavailable("no token".into()));
        }
        let mut v = HeaderValue::from_str(&self.credential(&token))
            .map_err(|_| AuthError::Unavailable("the token is not usable in an HTTP header".into()))?;
        v.set_sensitive(true);
        Ok(vec![(self.header.clone(), v)])
    }
}

/// Factory of `bearertokenauth`.
pub struct BearerTokenAuthFactory;

impl ExtensionFactory for BearerTokenAuthFactory {
    fn type_name(&self) -> &'static str {
        "bearertokenauth"
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(BearerTokenAuthConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let c = crate::component::typed::<BearerTokenAuthConfig>(parsed)?;
        let a = Arc::new(BearerToken::new(c).map_err(|e| ComponentError::Start(format!("{}: {e}", ctx.id)))?);
        let server: Arc<dyn ServerAuth> = a.clone();
        let client: Arc<dyn ClientAuth> = a;
        ctx.host.services.provide(&ctx.id.to_string(), Authenticator { server: Some(server), client: Some(client) });
        Ok(Box::new(Passive))
    }
}

/// An extension whose work is done by the service it registered.
pub(crate) struct Passive;

#[async_trait]
impl Extension for Passive {
    async fn start(&mut self, _status: StatusHandle) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn shutdown(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn auth(v: serde_json::Value) -> BearerToken {
        BearerToken::new(&BearerTokenAuthConfig::from_value(&v).unwrap()).unwrap()
    }

    fn req(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::try_from(*k).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn server_accepts_the_token_and_refuses_the_rest() {
        let a = auth(json!({"token": "s3cret"}));
        assert_eq!(a.authenticate(&req(&[("authorization", "Bearer s3cret")])), Ok(AuthInfo::default()));
        assert_eq!(a.authenticate(&req(&[])), Err(AuthError::Missing));
        assert_eq!(a.authenticate(&req(&[("authorization", "")])), Err(AuthError::Missing));
        assert_eq!(a.authenticate(&req(&[("authorization", "Basic s3cret")])), Err(AuthError::Invalid));
        assert_eq!(a.authenticate(&req(&[("authorization", "Bearer s3cre")])), Err(AuthError::Invalid));
        assert_eq!(a.authenticate(&req(&[("authorization", "Bearer s3cret2")])), Err(AuthError::Invalid));
        assert_eq!(a.authenticate(&req(&[("authorization", "s3cret")])), Err(AuthError::Invalid));
        assert_eq!(a.authenticate(&req(&[("x-token", "Bearer s3cret")])), Err(AuthError::Missing));
    }

    #[test]
    fn custom_header_scheme_and_several_tokens() {
        let a = auth(json!({"header": "X-Api-Key", "scheme": "", "tokens": ["a1", "b2"]}));
        assert!(a.authenticate(&req(&[("x-api-key", "b2")])).is_ok());
        assert!(a.authenticate(&req(&[("x-api-key", "a1")])).is_ok());
        assert_eq!(a.authenticate(&req(&[("x-api-key", "Bearer a1")])), Err(AuthError::Invalid));
        let h = a.headers().unwrap();
        assert_eq!(h[0].0.as_str(), "x-api-key");
        assert_eq!(h[0].1, "a1");
    }

    #[test]
    fn client_adds_scheme_and_token() {
        let h = auth(json!({"token": "tok", "scheme": "Token"})).headers().unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].0, http::header::AUTHORIZATION);
        assert_eq!(h[0].1, "Token tok");
        assert!(h[0].1.is_sensitive());
    }

    #[test]
    fn token_file_rotation_is_picked_up() {
        let dir = std::env::temp_dir().join(format!("iw-bearer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        std::fs::write(&p, "old\n").unwrap();
        let a =
            BearerToken::with_file("authorization", "Bearer", FileSecret::with_interval(&p, Duration::ZERO).unwrap())
                .unwrap();
        assert!(a.authenticate(&req(&[("authorization", "Bearer old")])).is_ok());
        std::fs::write(&p, "rotated-token\n").unwrap();
        assert_eq!(a.headers().unwrap()[0].1, "Bearer rotated-token");
        assert_eq!(a.authenticate(&req(&[("authorization", "Bearer old")])), Err(AuthError::Invalid));
        assert!(a.authenticate(&req(&[("authorization", "Bearer rotated-token")])).is_ok());
        std::fs::remove_file(&p).unwrap();
        assert_eq!(a.headers().unwrap()[0].1, "Bearer rotated-token", "the last good token is kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn settings_are_checked_and_never_print_the_token() {
        for (v, at) in [
            (json!({}), "token"),
            (json!({"token": "a", "filename": "/f"}), "token"),
            (json!({"token": "a", "header": "bad header"}), "header"),
            (json!({"token": "a\nb"}), "token"),
            (json!({"tokens": ["ok", ""]}), "tokens"),
        ] {
            let e = BearerTokenAuthConfig::from_value(&v).unwrap_err();
            let path = e.dotted();
            assert!(path.starts_with(at), "{v}: {path:?} {e}");
        }
        let c = BearerTokenAuthConfig::from_value(&json!({"token": "hunter2", "tokens": []})).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let a = BearerToken::new(&c).unwrap();
        assert!(!format!("{a:?}").contains("hunter2"));
        let e = BearerToken::new(
            &BearerTokenAuthConfig::from_value(&json!({"filename": "/nonexistent/iw-token"})).unwrap(),
        )
        .unwrap_err();
        assert!(e.contains("/nonexistent/iw-token"), "{e}");
    }

    #[test]
    fn factory_registers_both_halves() {
        let ctx = CreateContext::new(
            crate::vocab::ComponentId::parse("bearertokenauth/a").unwrap(),
            Arc::new(crate::telemetry::Telemetry::new()),
        );
        let host = ctx.host.clone();
        BearerTokenAuthFactory.create(ctx, &json!({"token": "t"})).unwrap();
        let s = crate::auth::AuthSettings { authenticator: "bearertokenauth/a".into() };
        assert!(s.client(&host).is_ok());
        assert!(s.server(&host).is_ok());
        let missing = crate::auth::AuthSettings { authenticator: "bearertokenauth/b".into() };
        assert!(missing.client(&host).err().unwrap().contains("not defined"));
    }
}
