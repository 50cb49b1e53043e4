//! Server TLS (otelcol `configtls.ServerConfig`) for every listener, built on rustls (ring).
//!
//! `cert_file` + `key_file` are the server's identity; with `reload_interval` set they are
//! re-read at most once per interval (on a handshake) and a changed pair is used for new
//! handshakes (a pair that does not load keeps the old certificate and logs a WARN).
//! `client_ca_file` turns on mutual TLS: every client must present a certificate signed by
//! one of those CAs.

use crate::settings::GoDuration;
use crate::vocab::FieldError;
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A TLS protocol version as otelcol spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    V1_2,
    /// TLS 1.3.
    V1_3,
}

impl<'de> Deserialize<'de> for TlsVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "1.2" => Ok(TlsVersion::V1_2),
            "1.3" => Ok(TlsVersion::V1_3),
            "1.0" | "1.1" => Err(serde::de::Error::custom(format!(
                "TLS {s} is not supported (insecure and absent from rustls); use \"1.2\" or \"1.3\""
            ))),
            _ => Err(serde::de::Error::custom(format!("unknown TLS version {s:?}; use \"1.2\" or \"1.3\""))),
        }
    }
}

/// Server TLS settings (otelcol `configtls.ServerConfig`; the keys otelcol has that are not
/// supported are refused with the reason).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawServerTls")]
pub struct TlsServerSettings {
    /// The server certificate chain (PEM), leaf first.
    pub cert_file: String,
    /// The server's private key (PEM).
    pub key_file: String,
    /// CAs that client certificates must chain to; set = mutual TLS required.
    pub client_ca_file: Option<String>,
    /// Lowest version accepted (default 1.2).
    pub min_version: TlsVersion,
    /// Highest version accepted (default 1.3).
    pub max_version: TlsVersion,
    /// Re-read `cert_file` / `key_file` this often (none = never).
    pub reload_interval: Option<Duration>,
}

/// What serde reads; unsupported otelcol keys are kept to be refused with a reason.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
    reload_interval: Option<GoDuration>,
    #[serde(default)]
    client_ca_file_reload: bool,
    ca_file: Option<serde_json::Value>,
    ca_pem: Option<serde_json::Value>,
    cert_pem: Option<serde_json::Value>,
    key_pem: Option<serde_json::Value>,
    client_ca_pem: Option<serde_json::Value>,
    cipher_suites: Option<serde_json::Value>,
    curve_preferences: Option<serde_json::Value>,
    include_system_ca_certs_pool: Option<serde_json::Value>,
    insecure: Option<serde_json::Value>,
}

impl TryFrom<RawServerTls> for TlsServerSettings {
    type Error = String;

    fn try_from(r: RawServerTls) -> Result<Self, String> {
        if r.ca_file.is_some() {
            return Err("ca_file is for clients; a server verifies its clients with client_ca_file (mTLS)".into());
        }
        if r.ca_pem.is_some() || r.cert_pem.is_some() || r.key_pem.is_some() || r.client_ca_pem.is_some() {
            return Err(
                "inline PEM (ca_pem, cert_pem, key_pem, client_ca_pem) is not supported; use the *_file keys".into()
            );
        }
        if r.cipher_suites.is_some() || r.curve_preferences.is_some() {
            return Err("cipher_suites / curve_preferences are not supported: rustls's safe defaults are used".into());
        }
        if r.include_system_ca_certs_pool.is_some() {
            return Err(
                "include_system_ca_certs_pool is not supported on a server; list the CAs in client_ca_file".into()
            );
        }
        if r.insecure.is_some() {
            return Err("insecure is a client key; omit tls on a listener to serve plain text".into());
        }
        if r.client_ca_file_reload {
            return Err("client_ca_file_reload is not supported; restart to change client_ca_file".into());
        }
        let (Some(cert_file), Some(key_file)) = (r.cert_file, r.key_file) else {
            return Err("cert_file and key_file are both required for a TLS listener".into());
        };
        let min_version = r.min_version.unwrap_or(TlsVersion::V1_2);
        let max_version = r.max_version.unwrap_or(TlsVersion::V1_3);
        if max_version < min_version {
            return Err("max_version is lower than min_version".into());
        }
        let reload_interval = r.reload_interval.map(|d| d.0).filter(|d| !d.is_zero());
        Ok(TlsServerSettings {
            cert_file,
            key_file,
            client_ca_file: r.client_ca_file,
            min_version,
            max_version,
            reload_interval,
        })
    }
}

/// Why server TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    /// A file could not be read.
    #[error("tls.{field}: cannot read {path:?}: {source}")]
    Read {
        /// The settings key.
        field: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM item.
    #[error("tls.{field}: {path:?}: {message}")]
    Pem {
        /// The settings key.
        field: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the material (e.g. a key that does not match the certificate).
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA bundle cannot verify clients.
    #[error("tls.client_ca_file: {0}")]
    Verifier(String),
}

impl ServerTlsError {
    /// A [`FieldError`] at `tls.<field>`.
    pub fn into_field_error(self) -> FieldError {
        let field = match &self {
            ServerTlsError::Read { field, .. } | ServerTlsError::Pem { field, .. } => field,
            ServerTlsError::Rustls(_) => "cert_file",
            ServerTlsError::Verifier(_) => "client_ca_file",
        };
        FieldError::at(&format!("tls.{field}"), self.to_string())
    }
}

fn read(field: &'static str, path: &str) -> Result<Vec<u8>, ServerTlsError> {
    std::fs::read(path).map_err(|source| ServerTlsError::Read { field, path: path.to_string(), source })
}

fn certs(field: &'static str, path: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ServerTlsError> {
    let err = |message: String| ServerTlsError::Pem { field, path: path.to_string(), message };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate found".into()));
    }
    Ok(certs)
}

/// Builds the certified key from the two files' contents.
fn certified_key(
    provider: &CryptoProvider,
    s: &TlsServerSettings,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, ServerTlsError> {
    let chain = certs("cert_file", &s.cert_file, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ServerTlsError::Pem {
        field: "key_file",
        path: s.key_file.clone(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key found".into(),
            e => format!("invalid PEM: {e}"),
        },
    })?;
    let signer = provider.key_provider.load_private_key(key)?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match()?;
    Ok(Arc::new(ck))
}

/// The certificate in use and when the files were last looked at.
struct Current {
    key: Arc<CertifiedKey>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    checked: Instant,
}

/// Serves the loaded certificate, re-reading the files every `reload_interval`.
pub struct ReloadingResolver {
    settings: TlsServerSettings,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

impl std::fmt::Debug for ReloadingResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingResolver").field("cert_file", &self.settings.cert_file).finish()
    }
}

impl ReloadingResolver {
    /// Loads the pair once (an error here refuses to start).
    pub fn new(settings: TlsServerSettings, provider: Arc<CryptoProvider>) -> Result<Self, ServerTlsError> {
        let cert_pem = read("cert_file", &settings.cert_file)?;
        let key_pem = read("key_file", &settings.key_file)?;
        let key = certified_key(&provider, &settings, &cert_pem, &key_pem)?;
        Ok(ReloadingResolver {
            settings,
            provider,
            current: Mutex::new(Current { key, cert_pem, key_pem, checked: Instant::now() }),
        })
    }

    /// Re-reads the files when the interval has passed; keeps the old pair on any error.
    fn maybe_reload(&self, cur: &mut Current) {
        let Some(every) = self.settings.reload_interval else { return };
        if cur.checked.elapsed() < every {
            return;
        }
        cur.checked = Instant::now();
        let s = &self.settings;
        let loaded = read("cert_file", &s.cert_file).and_then(|c| Ok((c, read("key_file", &s.key_file)?)));
        let (cert_pem, key_pem) = match loaded {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate reload failed; keeping the current certificate");
                return;
            }
        };
        if cert_pem == cur.cert_pem && key_pem == cur.key_pem {
            return;
        }
        match certified_key(&self.provider, s, &cert_pem, &key_pem) {
            Ok(k) => {
                tracing::info!(cert_file = %s.cert_file, "TLS certificate reloaded");
                *cur = Current { key: k, cert_pem, key_pem, checked: cur.checked };
            }
            // Remember the bad contents so that the WARN is logged once per change.
            Err(e) => {
                tracing::warn!(error = %e, "the new TLS certificate or key does not load; keeping the current one");
                cur.cert_pem = cert_pem;
                cur.key_pem = key_pem;
            }
        }
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut cur = self.current.lock();
        self.maybe_reload(&mut cur);
        Some(cur.key.clone())
    }
}

fn versions(s: &TlsServerSettings) -> Vec<&'static SupportedProtocolVersion> {
    let mut v = Vec::new();
    if s.max_version >= TlsVersion::V1_3 {
        v.push(&rustls::version::TLS13);
    }
    if s.min_version <= TlsVersion::V1_2 {
        v.push(&rustls::version::TLS12);
    }
    v
}

/// The rustls server configuration (ALPN `h2`, `http/1.1`) the settings describe.
pub fn server_config(s: &TlsServerSettings) -> Result<ServerConfig, ServerTlsError> {
    let provider = super::client::provider();
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&versions(s))?;
    let builder = match &s.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let pem = read("client_ca_file", path)?;
            let mut roots = RootCertStore::empty();
            for c in certs("client_ca_file", path, &pem)? {
                roots.add(c).map_err(|e| ServerTlsError::Pem {
                    field: "client_ca_file",
                    path: path.clone(),
                    message: format!("unusable CA certificate: {e}"),
                })?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| ServerTlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(v)
        }
    };
    let resolver = ReloadingResolver::new(s.clone(), provider)?;
    let mut cfg = builder.with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<TlsServerSettings, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn settings_defaults_and_refusals() {
        let s = parse(serde_json::json!({"cert_file": "c", "key_file": "k"})).unwrap();
        assert_eq!((s.min_version, s.max_version, s.reload_interval), (TlsVersion::V1_2, TlsVersion::V1_3, None));
        let s = parse(
            serde_json::json!({"cert_file": "c", "key_file": "k", "min_version": "1.3", "reload_interval": "5s"}),
        )
        .unwrap();
        assert_eq!(versions(&s).len(), 1);
        assert_eq!(s.reload_interval, Some(Duration::from_secs(5)));
        let e = parse(serde_json::json!({"cert_file": "c", "key_file": "k", "ca_file": "x"})).unwrap_err();
        assert!(e.contains("client_ca_file"), "{e}");
        let e = parse(serde_json::json!({"cert_file": "c", "key_file": "k", "min_version": "1.1"})).unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        assert!(parse(serde_json::json!({"cert_file": "c"})).unwrap_err().contains("both required"));
        assert!(parse(serde_json::json!({"cert_file": "c", "key_file": "k", "bogus": 1})).is_err());
        let e =
            parse(serde_json::json!({"cert_file": "c", "key_file": "k", "min_version": "1.3", "max_version": "1.2"}))
                .unwrap_err();
        assert!(e.contains("lower"), "{e}");
    }

    #[test]
    fn missing_files_name_the_key() {
        let s =
            parse(serde_json::json!({"cert_file": "/nonexistent/c.pem", "key_file": "/nonexistent/k.pem"})).unwrap();
        let e = server_config(&s).unwrap_err().into_field_error();
        assert!(e.to_string().contains("cert_file"), "{e}");
    }
}
