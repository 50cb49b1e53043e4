//! The HTTP client options of Prometheus' `http_config` (`tls_config`, `authorization`,
//! `basic_auth`, `bearer_token`, `bearer_token_file`, `follow_redirects`, `proxy_url`,
//! `no_proxy`, `proxy_from_environment`), shared by a scrape
//! config and every discovery config that talks HTTP (`http_sd_configs`,
//! `kubernetes_sd_configs`): one struct ([`HttpClientConfig`]), one check
//! ([`HttpClientConfig::check`]) and one client builder (`client` in the receiver).
//!
//! The structs that carry these keys derive their own keys with `#[serde(remote = "Self")]` (an
//! inherent `deserialize`) and hold them in a `#[serde(skip)] http` field; their `Deserialize`
//! (`inferwatch_core::split_deserialize!`) reads the map through core's
//! [`Split`](inferwatch_core::config::split::Split), which hands the HTTP keys to
//! [`HttpClientConfig`] as they are read and refuses any other unknown key with serde's own
//! message (`unknown field `x`, expected one of ...`, both sets of keys listed), raised while
//! the key is read so that its path is the key's path and the config layer's "did you mean"
//! works. (serde's `flatten` cannot be combined with `deny_unknown_fields`.)

use super::config::{
    AuthorizationConfig, BasicAuthConfig, ScrapeClient, ScrapeConfig, ScrapeCredentials, ScrapeTlsConfig,
};
use super::sd::http::HttpSdConfig;
use super::sd::kubernetes::KubernetesSdConfig;
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::config::split::SplitKeys;
use inferwatch_core::extension::client_auth::Secret;
use inferwatch_core::settings::TlsClientSettings;
use serde::de::{self, MapAccess};

/// The keys [`HttpClientConfig`] reads, in Prometheus' order.
pub const KEYS: [&str; 9] = [
    "tls_config",
    "authorization",
    "basic_auth",
    "bearer_token",
    "bearer_token_file",
    "follow_redirects",
    "proxy_url",
    "no_proxy",
    "proxy_from_environment",
];

/// TLS, credentials and redirects of one HTTP client, as written.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpClientConfig {
    /// TLS of `https` requests.
    pub tls_config: Option<ScrapeTlsConfig>,
    /// `Authorization: <type> <credentials>` on each request.
    pub authorization: Option<AuthorizationConfig>,
    /// HTTP Basic credentials on each request.
    pub basic_auth: Option<BasicAuthConfig>,
    /// Bearer token (deprecated in Prometheus for `authorization`).
    pub bearer_token: Option<Secret>,
    /// File holding a bearer token (deprecated in Prometheus for `authorization`).
    pub bearer_token_file: Option<String>,
    /// Follow HTTP redirects (to http/https URLs, at most 5; default true).
    pub follow_redirects: bool,
    /// An HTTP(S) proxy for every request.
    pub proxy_url: Option<String>,
    /// Hosts, domains and IP ranges reached without `proxy_url` (comma-separated).
    pub no_proxy: Option<String>,
    /// Use the proxy of `HTTP_PROXY` / `HTTPS_PROXY` / `NO_PROXY`.
    pub proxy_from_environment: bool,
}

impl Default for HttpClientConfig {
    fn default() -> Self {
        HttpClientConfig {
            tls_config: None,
            authorization: None,
            basic_auth: None,
            bearer_token: None,
            bearer_token_file: None,
            follow_redirects: true,
            proxy_url: None,
            no_proxy: None,
            proxy_from_environment: false,
        }
    }
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

impl HttpClientConfig {
    /// Whether any TLS, credentials or proxy setting is given.
    pub fn is_set(&self) -> bool {
        self.tls_config.is_some()
            || self.authorization.is_some()
            || self.basic_auth.is_some()
            || self.bearer_token.is_some()
            || self.bearer_token_file.is_some()
            || self.proxy_url.is_some()
            || self.no_proxy.is_some()
            || self.proxy_from_environment
    }

    /// Checks the settings and assembles the client's; errors are located by `err_at` (path
    /// relative to the struct holding the keys, message).
    pub fn check(&self, err_at: &dyn Fn(&[PathSeg], String) -> FieldError) -> Result<ScrapeClient, FieldError> {
        let e = |rest: &[PathSeg], m: &str| err_at(rest, m.to_string());
        let mut out = ScrapeClient { follow_redirects: self.follow_redirects, ..Default::default() };
        if let Some(t) = &self.tls_config {
            let at = |k: &str| vec![key("tls_config"), key(k)];
            out.tls = TlsClientSettings {
                insecure: false,
                ca_file: t.ca_file.clone(),
                cert_file: t.cert_file.clone(),
                key_file: t.key_file.clone(),
                insecure_skip_verify: t.insecure_skip_verify,
                server_name_override: t.server_name.clone(),
            };
            if t.cert_file.is_some() != t.key_file.is_some() {
                let k = if t.cert_file.is_some() { "key_file" } else { "cert_file" };
                return Err(e(&at(k), "cert_file and key_file must be set together"));
            }
            inferwatch_core::tls::validate(&out.tls)
                .map_err(|_| e(&at("server_name"), "not a DNS name or IP address"))?;
            match t.min_version.as_deref() {
                None | Some("TLS10" | "TLS11" | "TLS12") => {}
                Some("TLS13") if t.server_name.is_some() => {
                    return Err(e(&at("min_version"), "TLS13 together with server_name is not supported yet"));
                }
                Some("TLS13") => out.tls13_only = true,
                Some(other) => {
                    return Err(err_at(&at("min_version"), format!("unknown TLS version {other:?} (TLS12, TLS13)")));
                }
            }
        }
        let mut set = Vec::new();
        if let Some(a) = &self.authorization {
            set.push("authorization");
            let scheme = a.kind.clone().unwrap_or_else(|| "Bearer".into());
            if scheme.eq_ignore_ascii_case("basic") {
                return Err(e(&[key("authorization"), key("type")], "use basic_auth for Basic credentials"));
            }
            out.credentials = Some(match (&a.credentials, &a.credentials_file) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(e(
                        &[key("authorization"), key("credentials")],
                        "set exactly one of credentials and credentials_file",
                    ));
                }
                (Some(c), None) => ScrapeCredentials::Token { scheme, secret: c.clone() },
                (None, Some(f)) => ScrapeCredentials::TokenFile { scheme, path: f.clone() },
            });
        }
        if let Some(b) = &self.basic_auth {
            set.push("basic_auth");
            if b.username.contains(':') {
                return Err(e(&[key("basic_auth"), key("username")], "must not contain ':'"));
            }
            out.credentials = Some(match (&b.password, &b.password_file) {
                (Some(_), Some(_)) => {
                    return Err(e(
                        &[key("basic_auth"), key("password")],
                        "set at most one of password and password_file",
                    ));
                }
                (Some(p), None) => ScrapeCredentials::Basic { username: b.username.clone(), password: p.clone() },
                (None, Some(f)) => ScrapeCredentials::BasicFile { username: b.username.clone(), path: f.clone() },
                (None, None) => ScrapeCredentials::Basic { username: b.username.clone(), password: Secret::default() },
            });
        }
        match (&self.bearer_token, &self.bearer_token_file) {
            (Some(_), Some(_)) => {
                return Err(e(&[key("bearer_token")], "set at most one of bearer_token and bearer_token_file"));
            }
            (Some(t), None) => {
                set.push("bearer_token");
                out.credentials = Some(ScrapeCredentials::Token { scheme: "Bearer".into(), secret: t.clone() });
            }
            (None, Some(f)) => {
                set.push("bearer_token_file");
                out.credentials = Some(ScrapeCredentials::TokenFile { scheme: "Bearer".into(), path: f.clone() });
            }
            (None, None) => {}
        }
        if set.len() > 1 {
            return Err(err_at(&[key(set[1])], format!("{} and {} are mutually exclusive", set[0], set[1])));
        }
        out.proxy = self.proxy(&e)?;
        Ok(out)
    }

    /// The checked proxy settings (Prometheus' rules: `no_proxy` needs `proxy_url`, which
    /// excludes `proxy_from_environment`).
    fn proxy(&self, e: &dyn Fn(&[PathSeg], &str) -> FieldError) -> Result<Proxy, FieldError> {
        match (&self.proxy_url, self.proxy_from_environment) {
            (Some(_), true) => {
                Err(e(&[key("proxy_from_environment")], "proxy_url and proxy_from_environment are mutually exclusive"))
            }
            (None, env) => {
                if self.no_proxy.is_some() {
                    return Err(e(&[key("no_proxy")], "no_proxy needs proxy_url"));
                }
                Ok(if env { Proxy::Environment } else { Proxy::None })
            }
            (Some(u), false) => {
                let url = match reqwest::Url::parse(u) {
                    Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => url,
                    _ => return Err(e(&[key("proxy_url")], "not an http(s) URL (SOCKS proxies are not supported)")),
                };
                Ok(Proxy::Url { url, no_proxy: self.no_proxy.clone().unwrap_or_default() })
            }
        }
    }
}

/// How a client reaches its targets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Proxy {
    /// Directly (the environment's proxy variables are ignored).
    #[default]
    None,
    /// Through this proxy, except for the `no_proxy` list.
    Url {
        /// The proxy.
        url: reqwest::Url,
        /// Comma-separated hosts, domains and CIDRs reached directly.
        no_proxy: String,
    },
    /// Through the proxy of `HTTP_PROXY` / `HTTPS_PROXY` / `NO_PROXY`.
    Environment,
}

impl Proxy {
    /// Applies the choice to a client builder.
    pub fn apply(&self, b: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder, String> {
        match self {
            Proxy::None => Ok(b.no_proxy()),
            Proxy::Environment => Ok(b),
            Proxy::Url { url, no_proxy } => {
                let p = reqwest::Proxy::all(url.clone()).map_err(|e| format!("proxy_url: {e}"))?;
                Ok(b.proxy(p.no_proxy(reqwest::NoProxy::from_string(no_proxy))))
            }
        }
    }
}

impl<'de> SplitKeys<'de> for HttpClientConfig {
    const KEYS: &'static [&'static str] = &KEYS;

    fn read<A: MapAccess<'de>>(&mut self, k: &str, map: &mut A) -> Result<(), A::Error> {
        match k {
            "tls_config" => self.tls_config = map.next_value()?,
            "authorization" => self.authorization = map.next_value()?,
            "basic_auth" => self.basic_auth = map.next_value()?,
            "bearer_token" => self.bearer_token = map.next_value()?,
            "bearer_token_file" => self.bearer_token_file = map.next_value()?,
            "follow_redirects" => self.follow_redirects = map.next_value()?,
            "proxy_url" => self.proxy_url = map.next_value()?,
            "no_proxy" => self.no_proxy = map.next_value()?,
            "proxy_from_environment" => self.proxy_from_environment = map.next_value()?,
            other => return Err(de::Error::custom(format!("internal: {other:?} is not an HTTP client key"))),
        }
        Ok(())
    }
}

// `Deserialize` for the structs whose own keys are derived with `#[serde(remote = "Self")]` and
// whose `http: HttpClientConfig` field is `#[serde(skip)]`.
inferwatch_core::split_deserialize!(ScrapeConfig, http, HttpClientConfig::default());
inferwatch_core::split_deserialize!(HttpSdConfig, http, HttpClientConfig::default());
inferwatch_core::split_deserialize!(KubernetesSdConfig, http, HttpClientConfig::default());

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::parse_config;
    use serde_json::json;

    fn checked(v: serde_json::Value) -> Result<ScrapeClient, FieldError> {
        let c: HttpSdConfig = parse_config(&v).unwrap();
        c.http.check(&|rest: &[PathSeg], m: String| FieldError { path: rest.to_vec(), message: m })
    }

    #[test]
    fn proxy_settings_are_checked() {
        let c = checked(json!({"url": "u", "proxy_url": "http://proxy:3128", "no_proxy": "10.0.0.0/8,.svc"})).unwrap();
        assert_eq!(
            c.proxy,
            Proxy::Url { url: reqwest::Url::parse("http://proxy:3128").unwrap(), no_proxy: "10.0.0.0/8,.svc".into() }
        );
        assert_eq!(checked(json!({"url": "u", "proxy_from_environment": true})).unwrap().proxy, Proxy::Environment);
        assert_eq!(checked(json!({"url": "u"})).unwrap().proxy, Proxy::None);
        for (v, at) in [
            (json!({"url": "u", "proxy_url": "socks5://p:1080"}), "proxy_url"),
            (json!({"url": "u", "proxy_url": "http://p:1", "proxy_from_environment": true}), "proxy_from_environment"),
            (json!({"url": "u", "no_proxy": "x"}), "no_proxy"),
        ] {
            assert_eq!(checked(v.clone()).unwrap_err().path, vec![key(at)], "{v}");
        }
    }

    #[test]
    fn http_keys_and_own_keys_are_split() {
        let c: HttpSdConfig = parse_config(&json!({"url": "http://sd/t", "follow_redirects": false,
            "bearer_token_file": "/t", "tls_config": {"insecure_skip_verify": true}}))
        .unwrap();
        assert_eq!(c.url.as_deref(), Some("http://sd/t"));
        assert!(!c.http.follow_redirects);
        assert_eq!(c.http.bearer_token_file.as_deref(), Some("/t"));
        assert!(c.http.tls_config.unwrap().insecure_skip_verify);
        let c: HttpSdConfig = parse_config(&json!({"url": "http://sd/t"})).unwrap();
        assert_eq!(c.http, HttpClientConfig::default());
        assert!(c.http.follow_redirects, "follow_redirects defaults to true");
    }

    #[test]
    fn unknown_keys_are_refused_at_their_path_with_every_key_listed() {
        let e = parse_config::<HttpSdConfig>(&json!({"url": "u", "tls_confg": {}})).unwrap_err();
        assert_eq!(e.path, vec![key("tls_confg")]);
        assert!(e.message.starts_with("unknown field `tls_confg`, expected one of `url`, `refresh_interval`, "));
        assert!(e.message.contains("`tls_config`") && e.message.contains("`follow_redirects`"), "{}", e.message);
        // Inside an HTTP client key: the nested path.
        let e = parse_config::<HttpSdConfig>(&json!({"url": "u", "tls_config": {"ca_fil": "x"}})).unwrap_err();
        assert_eq!(e.path, vec![key("tls_config"), key("ca_fil")]);
        let e = parse_config::<HttpSdConfig>(&json!({"url": "u", "follow_redirects": "yes"})).unwrap_err();
        assert_eq!(e.path, vec![key("follow_redirects")]);
        assert!(e.message.contains("expected a boolean"), "{}", e.message);
        // Not a map: serde's message names the struct.
        let e = parse_config::<HttpSdConfig>(&json!([1])).unwrap_err();
        assert!(e.message.contains("struct HttpSdConfig"), "{}", e.message);
    }

    #[test]
    fn unknown_field_message_is_serdes() {
        assert_eq!(
            inferwatch_core::config::split::unknown_field("x", &[], &KEYS),
            "unknown field `x`, expected one of `tls_config`, `authorization`, `basic_auth`, `bearer_token`, \
             `bearer_token_file`, `follow_redirects`, `proxy_url`, `no_proxy`, `proxy_from_environment`"
        );
    }
}
