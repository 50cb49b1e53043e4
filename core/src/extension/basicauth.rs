//! Extension `basicauth` (otelcol-contrib's): HTTP Basic authentication. `htpasswd` (a file
//! and/or inline lines, `user:hash`) makes it a server authenticator; `client_auth` makes it a
//! client authenticator that sends `Authorization: Basic base64(username:password)`.
//!
//! ```yaml
//! extensions:
//!   basicauth/server:
//!     htpasswd:
//!       file: /etc/inferwatch/htpasswd   # bcrypt ($2y$, $2a$, $2b$) or {SHA} entries
//!       inline: |
//!         alice:$2y$10$...
//!   basicauth/client:
//!     client_auth: { username: agent, password: "..." }
//! ```
//!
//! Verified passwords are remembered per user as a SHA-256 digest, so a client that
//! authenticates every request costs one bcrypt verification, not one per request.

use super::bearertokenauth::Passive;
use super::client_auth::{Secret, ct_eq};
use crate::auth::{AuthError, AuthInfo, Authenticator, ClientAuth, ServerAuth};
use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::vocab::{ComponentError, FieldError, parse_config};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::{HeaderName, HeaderValue};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

/// Settings of `basicauth` (its `Debug` never shows a password).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthConfig {
    /// Users the server side admits.
    #[serde(default)]
    pub htpasswd: Option<HtpasswdSettings>,
    /// Credentials the client side sends.
    #[serde(default)]
    pub client_auth: Option<ClientAuthSettings>,
}

/// `htpasswd:`: where the users are.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct HtpasswdSettings {
    /// An htpasswd file.
    #[serde(default)]
    pub file: Option<String>,
    /// htpasswd lines (they win over the file's for the same user).
    #[serde(default)]
    pub inline: Secret,
}

/// `client_auth:`: what the client sends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthSettings {
    /// User name (no `:`).
    pub username: String,
    /// Password.
    #[serde(default)]
    pub password: Secret,
}

/// One stored password hash.
#[derive(Clone)]
enum Hash {
    /// `$2a$` / `$2b$` / `$2y$` bcrypt.
    Bcrypt(String),
    /// `{SHA}` base64 of the SHA-1 digest.
    Sha1(Vec<u8>),
}

/// Parses htpasswd text; `source` names it in errors (`htpasswd.inline`, the file path).
fn parse_htpasswd(text: &str, source: &str, users: &mut HashMap<String, Hash>) -> Result<(), String> {
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{source} line {}", i + 1);
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!("{}: expected user:hash", at()));
        };
        if user.is_empty() {
            return Err(format!("{}: empty user name", at()));
        }
        let h = if hash.starts_with("$2a$") || hash.starts_with("$2b$") || hash.starts_with("$2y$") {
            hash.parse::<bcrypt::HashParts>().map_err(|e| format!("{}: invalid bcrypt hash: {e}", at()))?;
            Hash::Bcrypt(hash.to_string())
        } else if let Some(b) = hash.strip_prefix("{SHA}") {
            let d = B64.decode(b).map_err(|_| format!("{}: invalid {{SHA}} hash (not base64)", at()))?;
            if d.len() != 20 {
                return Err(format!("{}: invalid {{SHA}} hash (not 20 bytes)", at()));
            }
            Hash::Sha1(d)
        } else {
            let kind = if hash.starts_with("$apr1$") {
                "APR1-MD5"
            } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
                "SHA-crypt"
            } else if hash.starts_with('$') {
                "this crypt"
            } else {
                "plain-text or crypt(3)"
            };
            return Err(format!(
                "{}: {kind} password hashes are not supported; use bcrypt (htpasswd -B) or {{SHA}} (htpasswd -s)",
                at()
            ));
        };
        users.insert(user.to_string(), h);
    }
    Ok(())
}

impl BasicAuthConfig {
    /// Parses and checks the settings, inline htpasswd lines included (the file is not read).
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: BasicAuthConfig = parse_config(v)?;
        if c.htpasswd.is_none() && c.client_auth.is_none() {
            return Err(FieldError::at("htpasswd", "set htpasswd (server) and/or client_auth (client)"));
        }
        if let Some(h) = &c.htpasswd {
            if h.file.is_none() && h.inline.is_empty() {
                return Err(FieldError::at("htpasswd", "set file and/or inline"));
            }
            parse_htpasswd(h.inline.expose(), "htpasswd.inline", &mut HashMap::new())
                .map_err(|e| FieldError::at("htpasswd.inline", e))?;
        }
        if let Some(ca) = &c.client_auth
            && (ca.username.is_empty() || ca.username.contains(':'))
        {
            return Err(FieldError::at("client_auth.username", "must be non-empty and contain no ':'"));
        }
        Ok(c)
    }
}

/// The server half: the users and the verified-password memo.
pub struct BasicServer {
    users: HashMap<String, Hash>,
    verified: Mutex<HashMap<String, [u8; 32]>>,
}

impl BasicServer {
    /// Loads the users (the file first, then inline lines).
    pub fn new(h: &HtpasswdSettings) -> Result<Self, String> {
        let mut users = HashMap::new();
        if let Some(f) = &h.file {
            let text = std::fs::read_to_string(f).map_err(|e| format!("htpasswd.file: cannot read {f}: {e}"))?;
            parse_htpasswd(&text, f, &mut users).map_err(|e| format!("htpasswd.file: {e}"))?;
        }
        parse_htpasswd(h.inline.expose(), "htpasswd.inline", &mut users)?;
        Ok(BasicServer { users, verified: Mutex::new(HashMap::new()) })
    }

    fn check(&self, user: &str, password: &str) -> bool {
        let Some(hash) = self.users.get(user) else { return false };
        let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes());
        if let Some(d) = self.verified.lock().get(user)
            && ct_eq(d, digest.as_ref())
        {
            return true;
        }
        let ok = match hash {
            Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Hash::Sha1(want) => {
                let got = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, password.as_bytes());
                ct_eq(got.as_ref(), want)
            }
        };
        if ok {
            let mut d = [0u8; 32];
            d.copy_from_slice(digest.as_ref());
            self.verified.lock().insert(user.to_string(), d);
        }
        ok
    }
}

impl ServerAuth for BasicServer {
    fn authenticate(&self, headers: &http::HeaderMap) -> Result<AuthInfo, AuthError> {
        let v = headers.get(http::header::AUTHORIZATION).ok_or(AuthError::Missing)?;
        let v = v.to_str().map_err(|_| AuthError::Invalid)?;
        let (scheme, b64) = v.trim().split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(AuthError::Invalid);
        }
        let raw = B64.decode(b64.trim()).map_err(|_| AuthError::Invalid)?;
        let text = String::from_utf8(raw).map_err(|_| AuthError::Invalid)?;
        let (user, password) = text.split_once(':').ok_or(AuthError::Invalid)?;
        if self.check(user, password) {
            Ok(AuthInfo { subject: Some(user.to_string()) })
        } else {
            Err(AuthError::Invalid)
        }
    }
}

/// The client half: a fixed `Authorization: Basic ...` header.
pub struct BasicClient {
    value: HeaderValue,
}

impl BasicClient {
    /// Encodes the credentials.
    pub fn new(c: &ClientAuthSettings) -> Result<Self, String> {
        let enc = B64.encode(format!("{}:{}", c.username, c.password.expose()));
        let mut value = HeaderValue::from_str(&format!("Basic {enc}")).map_err(|e| e.to_string())?;
        value.set_sensitive(true);
        Ok(BasicClient { value })
    }
}

impl ClientAuth for BasicClient {
    fn headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, AuthError> {
        Ok(vec![(http::header::AUTHORIZATION, self.value.clone())])
    }
}

/// Factory of `basicauth`.
pub struct BasicAuthFactory;

impl ExtensionFactory for BasicAuthFactory {
    fn type_name(&self) -> &'static str {
        "basicauth"
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(BasicAuthConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let c = crate::component::typed::<BasicAuthConfig>(parsed)?;
        let fail = |e: String| ComponentError::Start(format!("{}: {e}", ctx.id));
        let server: Option<Arc<dyn ServerAuth>> = match &c.htpasswd {
            Some(h) => Some(Arc::new(BasicServer::new(h).map_err(fail)?)),
            None => None,
        };
        let client: Option<Arc<dyn ClientAuth>> = match &c.client_auth {
            Some(ca) => Some(Arc::new(BasicClient::new(ca).map_err(fail)?)),
            None => None,
        };
        ctx.host.services.provide(&ctx.id.to_string(), Authenticator { server, client });
        Ok(Box::new(Passive))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn basic(user: &str, pass: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        let v = format!("Basic {}", B64.encode(format!("{user}:{pass}")));
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&v).unwrap());
        h
    }

    fn server(inline: String) -> BasicServer {
        let c = BasicAuthConfig::from_value(&json!({"htpasswd": {"inline": inline}})).unwrap();
        BasicServer::new(c.htpasswd.as_ref().unwrap()).unwrap()
    }

    #[test]
    fn bcrypt_users_are_admitted_and_others_refused() {
        let hash = bcrypt::hash_with_result("pa:ss", 4).unwrap().format_for_version(bcrypt::Version::TwoY);
        let s = server(format!(
            "# users\nalice:{hash}\n\nbob:{{SHA}}{}\n",
            B64.encode(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, b"bobpw").as_ref())
        ));
        assert_eq!(s.authenticate(&basic("alice", "pa:ss")), Ok(AuthInfo { subject: Some("alice".into()) }));
        assert_eq!(s.authenticate(&basic("alice", "pa:ss")), Ok(AuthInfo { subject: Some("alice".into()) }), "memo");
        assert_eq!(s.authenticate(&basic("alice", "wrong")), Err(AuthError::Invalid));
        assert_eq!(s.authenticate(&basic("bob", "bobpw")), Ok(AuthInfo { subject: Some("bob".into()) }));
        assert_eq!(s.authenticate(&basic("bob", "pa:ss")), Err(AuthError::Invalid));
        assert_eq!(s.authenticate(&basic("carol", "pa:ss")), Err(AuthError::Invalid));
        assert_eq!(s.authenticate(&http::HeaderMap::new()), Err(AuthError::Missing));
        let mut h = http::HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(s.authenticate(&h), Err(AuthError::Invalid));
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(s.authenticate(&h), Err(AuthError::Invalid));
    }

    #[test]
    fn all_bcrypt_prefixes_and_the_file() {
        let dir = std::env::temp_dir().join(format!("iw-htpasswd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let parts = bcrypt::hash_with_result("pw", 4).unwrap();
        let lines: Vec<String> = [bcrypt::Version::TwoA, bcrypt::Version::TwoB, bcrypt::Version::TwoY]
            .iter()
            .enumerate()
            .map(|(i, v)| format!("u{i}:{}", parts.format_for_version(v.clone())))
            .collect();
        let f = dir.join("htpasswd");
        std::fs::write(&f, lines.join("\n")).unwrap();
        let s = BasicServer::new(&HtpasswdSettings { file: Some(f.display().to_string()), inline: Secret::default() })
            .unwrap();
        for i in 0..3 {
            assert!(s.authenticate(&basic(&format!("u{i}"), "pw")).is_ok(), "u{i}");
        }
        std::fs::write(&f, "ok:{SHA}AAAAAAAAAAAAAAAAAAAAAAAAAAA=\nx:$apr1$abc$def\n").unwrap();
        let e = BasicServer::new(&HtpasswdSettings { file: Some(f.display().to_string()), inline: Secret::default() })
            .err()
            .unwrap();
        assert!(e.contains("line 2") && e.contains("APR1"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unsupported_hashes_are_refused_at_validate_naming_the_line() {
        for (line, want) in [("u:plain", "plain-text"), ("u:$6$salt$x", "SHA-crypt"), ("nocolon", "user:hash")] {
            let e = BasicAuthConfig::from_value(
                &json!({"htpasswd": {"inline": format!("ok:{{SHA}}AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n{line}")}}),
            )
            .unwrap_err();
            assert!(e.to_string().contains("line 2") && e.to_string().contains(want), "{e}");
        }
        assert!(BasicAuthConfig::from_value(&json!({})).is_err());
        assert!(BasicAuthConfig::from_value(&json!({"client_auth": {"username": "a:b", "password": "p"}})).is_err());
    }

    #[test]
    fn client_sends_basic_credentials_and_hides_them() {
        let c =
            BasicAuthConfig::from_value(&json!({"client_auth": {"username": "agent", "password": "hunter2"}})).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let h = BasicClient::new(c.client_auth.as_ref().unwrap()).unwrap().headers().unwrap();
        assert_eq!(h[0].0, http::header::AUTHORIZATION);
        assert_eq!(h[0].1, format!("Basic {}", B64.encode("agent:hunter2")).as_str());
    }
}
