//! Client TLS (exporters and scrapes), built on rustls with the ring provider.
//!
//! One server-certificate verifier serves both transports: `ca_file` (only those roots, as
//! otelcol), else the platform roots; `insecure_skip_verify` swaps in a verifier that accepts
//! any certificate (the handshake signatures are still checked). The `otlphttp` exporter gets a
//! full [`rustls::ClientConfig`]; the `otlp` exporter hands the same verifier and the client
//! identity to tonic.

use crate::settings::TlsClientSettings;
use crate::vocab::FieldError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// Why TLS material could not be loaded or assembled.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file named in the settings could not be read.
    #[error("cannot read {path:?}: {source}")]
    Read {
        /// The settings key (`ca_file`, `cert_file`, `key_file`).
        field: &'static str,
        /// The file path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds malformed PEM or no item of the expected kind.
    #[error("{path:?}: {message}")]
    Pem {
        /// The settings key.
        field: &'static str,
        /// The file path.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// Only one of `cert_file` and `key_file` is set.
    #[error("cert_file and key_file must be set together for a client certificate")]
    IncompleteIdentity,
    /// `server_name_override` is not a DNS name or IP address.
    #[error("invalid server_name_override {0:?}")]
    ServerName(String),
    /// No `ca_file` and the platform has no CA certificates.
    #[error("no platform CA certificates found; set tls.ca_file, or tls.insecure: true for plain text")]
    NoPlatformRoots,
    /// rustls refused the assembled configuration (e.g. a key that does not match the certificate).
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The verifier could not be built from the roots.
    #[error("invalid CA certificates: {0}")]
    Verifier(String),
}

impl TlsError {
    /// The settings key (under `tls`) the error is about.
    pub fn field(&self) -> &'static str {
        match self {
            TlsError::Read { field, .. } | TlsError::Pem { field, .. } => field,
            TlsError::IncompleteIdentity => "cert_file",
            TlsError::ServerName(_) => "server_name_override",
            TlsError::NoPlatformRoots | TlsError::Verifier(_) => "ca_file",
            TlsError::Rustls(_) => "cert_file",
        }
    }

    /// A [`FieldError`] located at `tls.<field>`.
    pub fn into_field_error(self) -> FieldError {
        FieldError::at(&format!("tls.{}", self.field()), self.to_string())
    }
}

/// The crypto provider every exporter uses (ring; no process-wide default is installed).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Checks the settings without touching files: the client certificate needs both halves.
pub fn validate(s: &TlsClientSettings) -> Result<(), FieldError> {
    if s.cert_file.is_some() != s.key_file.is_some() {
        let at = if s.cert_file.is_some() { "tls.key_file" } else { "tls.cert_file" };
        return Err(FieldError::at(at, TlsError::IncompleteIdentity.to_string()));
    }
    if let Some(n) = &s.server_name_override
        && ServerName::try_from(n.as_str()).is_err()
    {
        return Err(TlsError::ServerName(n.clone()).into_field_error());
    }
    Ok(())
}

/// A client certificate chain and its key, in DER (for rustls) and PEM (for tonic).
pub struct ClientIdentity {
    /// The certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
    /// `cert_file` as read.
    pub cert_pem: Vec<u8>,
    /// `key_file` as read.
    pub key_pem: Vec<u8>,
}

fn read(field: &'static str, path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { field, path: path.to_string(), source })
}

fn certs_from_pem(field: &'static str, path: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let perr = |message: String| TlsError::Pem { field, path: path.to_string(), message };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| perr(format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(perr("no PEM certificate found".into()));
    }
    Ok(certs)
}

/// Loads `cert_file` + `key_file`, if set.
pub fn load_identity(s: &TlsClientSettings) -> Result<Option<ClientIdentity>, TlsError> {
    let (cert_path, key_path) = match (&s.cert_file, &s.key_file) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        _ => return Err(TlsError::IncompleteIdentity),
    };
    let cert_pem = read("cert_file", cert_path)?;
    let chain = certs_from_pem("cert_file", cert_path, &cert_pem)?;
    let key_pem = read("key_file", key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Pem {
        field: "key_file",
        path: key_path.clone(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key found".into(),
            e => format!("invalid PEM: {e}"),
        },
    })?;
    Ok(Some(ClientIdentity { chain, key, cert_pem, key_pem }))
}

/// The roots to verify servers with: `ca_file` alone when set, else the platform's.
pub fn load_roots(s: &TlsClientSettings) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if let Some(path) = &s.ca_file {
        let pem = read("ca_file", path)?;
        for cert in certs_from_pem("ca_file", path, &pem)? {
            roots.add(cert).map_err(|e| TlsError::Pem {
                field: "ca_file",
                path: path.clone(),
                message: format!("unusable CA certificate: {e}"),
            })?;
        }
        return Ok(roots);
    }
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "while loading platform CA certificates");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    if ignored > 0 {
        tracing::debug!(added, ignored, "some platform CA certificates could not be parsed");
    }
    if roots.is_empty() {
        return Err(TlsError::NoPlatformRoots);
    }
    Ok(roots)
}

/// The server-certificate verifier the settings ask for.
pub fn server_verifier(s: &TlsClientSettings) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let provider = provider();
    if s.insecure_skip_verify {
        tracing::warn!("tls.insecure_skip_verify is set: server certificates are not verified");
        return Ok(Arc::new(NoVerifier(provider.signature_verification_algorithms)));
    }
    let roots = load_roots(s)?;
    let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
    Ok(v)
}

/// A complete rustls client configuration (ALPN `h2`, `http/1.1`) for HTTP exporters.
///
/// `server_name_override` changes the name the certificate is verified against (SNI keeps the
/// URL's host).
pub fn client_config(s: &TlsClientSettings) -> Result<ClientConfig, TlsError> {
    let mut verifier = server_verifier(s)?;
    if let Some(name) = &s.server_name_override {
        let name = ServerName::try_from(name.clone()).map_err(|_| TlsError::ServerName(name.clone()))?;
        verifier = Arc::new(OverrideName { inner: verifier, name });
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cfg = match load_identity(s)? {
        Some(id) => builder.with_client_auth_cert(id.chain, id.key)?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A client configuration that trusts nothing, for clients that only ever speak plain HTTP
/// (reqwest with `rustls-no-provider` needs a configuration even then).
pub fn plaintext_client_config() -> Result<ClientConfig, TlsError> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth())
}

/// Accepts any server certificate (`insecure_skip_verify`); handshake signatures are still checked.
#[derive(Debug)]
struct NoVerifier(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Verifies the server certificate against a fixed name instead of the connection's host.
#[derive(Debug)]
struct OverrideName {
    inner: Arc<dyn ServerCertVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for OverrideName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner.verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(f: impl FnOnce(&mut TlsClientSettings)) -> TlsClientSettings {
        let mut s = TlsClientSettings::default();
        f(&mut s);
        s
    }

    #[test]
    fn identity_needs_both_halves() {
        let s = settings(|s| s.cert_file = Some("c.pem".into()));
        let e = validate(&s).unwrap_err();
        assert_eq!(e.path, FieldError::at("tls.key_file", "").path);
        let s = settings(|s| s.key_file = Some("k.pem".into()));
        assert_eq!(validate(&s).unwrap_err().path, FieldError::at("tls.cert_file", "").path);
        assert!(matches!(load_identity(&s), Err(TlsError::IncompleteIdentity)));
    }

    #[test]
    fn missing_and_bad_files_name_the_field() {
        let s = settings(|s| s.ca_file = Some("/nonexistent/ca.pem".into()));
        let e = load_roots(&s).unwrap_err().into_field_error();
        assert_eq!(e.path, FieldError::at("tls.ca_file", "").path);
        assert!(e.message.contains("/nonexistent/ca.pem"), "{}", e.message);

        let dir = std::env::temp_dir().join(format!("iw-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let s = settings(|s| s.ca_file = Some(junk.display().to_string()));
        let e = load_roots(&s).unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let s = settings(|s| {
            s.cert_file = Some(junk.display().to_string());
            s.key_file = Some(junk.display().to_string());
        });
        assert_eq!(load_identity(&s).err().map(|e| e.field()), Some("cert_file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_server_name_override_is_refused() {
        let s = settings(|s| s.server_name_override = Some("not a name".into()));
        assert_eq!(validate(&s).unwrap_err().path, FieldError::at("tls.server_name_override", "").path);
    }

    #[test]
    fn skip_verify_and_plaintext_configs_build() {
        let s = settings(|s| s.insecure_skip_verify = true);
        let cfg = client_config(&s).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(plaintext_client_config().is_ok());
    }
}
