//! Settings of the `otlp` receiver, in the OpenTelemetry Collector's shape.

use inferwatch_core::auth::AuthSettings;
use inferwatch_core::component::{FieldError, parse_config};
use inferwatch_core::server::{Limits, Role};
use inferwatch_core::settings::{GoDuration, HostPort};
use inferwatch_core::tls::server::TlsServerSettings;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// One mebibyte.
const MIB: usize = 1024 * 1024;

/// Top-level settings: `protocols: { grpc: ..., http: ... }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The transports to serve; at least one must be present.
    #[serde(default, deserialize_with = "or_default")]
    pub protocols: Protocols,
}

/// The transports of the receiver; a key that is present (even empty) enables it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Protocols {
    /// OTLP/gRPC settings, when enabled.
    #[serde(default, deserialize_with = "present")]
    pub grpc: Option<GrpcConfig>,
    /// OTLP/HTTP settings, when enabled.
    #[serde(default, deserialize_with = "present")]
    pub http: Option<HttpConfig>,
}

/// Deserializes a present key as enabled: `http:` (null) and `http: {}` both give the defaults.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    or_default(d).map(Some)
}

/// Deserializes `null` as the default value.
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// OTLP/gRPC server settings (otelcol `configgrpc.ServerConfig`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// Listen address.
    pub endpoint: HostPort,
    /// Network transport; only `tcp` is supported.
    pub transport: Transport,
    /// Largest accepted (decompressed) message, in MiB (default 4, as otelcol).
    pub max_recv_msg_size_mib: usize,
    /// Concurrent HTTP/2 streams per connection (default 100; 0 = unlimited).
    pub max_concurrent_streams: u32,
    /// Server TLS; absent = plain text.
    pub tls: Option<TlsServerSettings>,
    /// The authenticator extension that checks every call.
    pub auth: Option<AuthSettings>,
    /// Most connections open at once (inferwatch; default from the descriptor limit).
    pub max_connections: Option<usize>,
    /// Accepted for compatibility with a load-time warning ([`OtlpConfig::warnings`]): no effect.
    pub read_buffer_size: Option<usize>,
    /// Accepted for compatibility with a load-time warning ([`OtlpConfig::warnings`]): no effect.
    pub write_buffer_size: Option<usize>,
    /// HTTP/2 keep-alive settings.
    pub keepalive: Option<KeepaliveConfig>,
    /// Carry the call's metadata (and the authenticated caller) to the pipeline's `ClientInfo`.
    pub include_metadata: bool,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            endpoint: HostPort { host: "127.0.0.1".into(), port: 4317 },
            transport: Transport::Tcp,
            max_recv_msg_size_mib: 4,
            max_concurrent_streams: inferwatch_core::server::DEFAULT_MAX_CONCURRENT_STREAMS,
            tls: None,
            auth: None,
            max_connections: None,
            read_buffer_size: None,
            write_buffer_size: None,
            keepalive: None,
            include_metadata: false,
        }
    }
}

impl GrpcConfig {
    /// The decoding limit in bytes.
    pub fn max_recv_msg_size(&self) -> usize {
        self.max_recv_msg_size_mib.saturating_mul(MIB)
    }

    /// The listener limits these settings ask for (HTTP/2 only).
    pub fn limits(&self) -> Limits {
        let mut l = Limits::new(Role::Ingest);
        l.http2_only = true;
        if let Some(n) = self.max_connections {
            l.max_connections = n;
        }
        // 0 keeps hyper's (and gRPC's) "no limit".
        l.max_concurrent_streams =
            if self.max_concurrent_streams == 0 { u32::MAX } else { self.max_concurrent_streams };
        if let Some(sp) = self.keepalive.as_ref().and_then(|k| k.server_parameters.as_ref()) {
            if let Some(t) = sp.max_connection_idle {
                l.idle_timeout = t.0;
            }
            l.keepalive_interval = sp.time.map(|t| t.0);
            l.keepalive_timeout = sp.timeout.map(|t| t.0);
            l.max_connection_age = sp.max_connection_age.map(|t| t.0);
            if let Some(t) = sp.max_connection_age_grace {
                l.max_connection_age_grace = t.0;
            }
        }
        l
    }
}

/// The listener's network transport.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// TCP (the only one supported).
    #[default]
    Tcp,
}

/// gRPC keep-alive settings (otelcol `keepalive`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveConfig {
    /// Server-side connection parameters.
    pub server_parameters: Option<KeepaliveServerConfig>,
    /// Accepted for compatibility; tonic does not enforce client ping policies.
    pub enforcement_policy: Option<KeepaliveEnforcement>,
}

/// Server-side keep-alive parameters.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveServerConfig {
    /// Connections with no call in flight for this long are closed (default 60s).
    pub max_connection_idle: Option<GoDuration>,
    /// Connections are closed gracefully after this age.
    pub max_connection_age: Option<GoDuration>,
    /// Extra time allowed to in-flight calls after `max_connection_age`.
    pub max_connection_age_grace: Option<GoDuration>,
    /// Interval of HTTP/2 keep-alive pings.
    pub time: Option<GoDuration>,
    /// Time to wait for a ping acknowledgement.
    pub timeout: Option<GoDuration>,
}

/// Client ping policy (accepted, not enforced).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveEnforcement {
    /// Minimum interval between client pings.
    pub min_time: Option<GoDuration>,
    /// Whether clients may ping without active streams.
    pub permit_without_stream: bool,
}

/// OTLP/HTTP server settings (otelcol `confighttp.ServerConfig` plus the URL paths).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address.
    pub endpoint: HostPort,
    /// Path of the traces endpoint.
    pub traces_url_path: String,
    /// Path of the metrics endpoint.
    pub metrics_url_path: String,
    /// Path of the logs endpoint.
    pub logs_url_path: String,
    /// Largest accepted request body, before and after decompression, in bytes (default 20 MiB).
    pub max_request_body_size: usize,
    /// Carry the request headers (and the authenticated caller) to the pipeline's `ClientInfo`.
    pub include_metadata: bool,
    /// Server TLS; absent = plain text.
    pub tls: Option<TlsServerSettings>,
    /// The authenticator extension that checks every request.
    pub auth: Option<AuthSettings>,
    /// Time allowed to send a request's headers (default 10s).
    pub read_header_timeout: Option<GoDuration>,
    /// Keep-alive connections with no request for this long are closed (default 60s).
    pub idle_timeout: Option<GoDuration>,
    /// Most connections open at once (inferwatch; default from the descriptor limit).
    pub max_connections: Option<usize>,
    /// Cross-origin settings for browser senders.
    pub cors: Option<CorsConfig>,
    /// Extra headers added to every response.
    pub response_headers: BTreeMap<String, String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            endpoint: HostPort { host: "127.0.0.1".into(), port: 4318 },
            traces_url_path: "/v1/traces".into(),
            metrics_url_path: "/v1/metrics".into(),
            logs_url_path: "/v1/logs".into(),
            max_request_body_size: 20 * MIB,
            include_metadata: false,
            tls: None,
            auth: None,
            read_header_timeout: None,
            idle_timeout: None,
            max_connections: None,
            cors: None,
            response_headers: BTreeMap::new(),
        }
    }
}

impl HttpConfig {
    /// The listener limits these settings ask for.
    pub fn limits(&self) -> Limits {
        limits_http(Role::Ingest, self.max_connections, self.read_header_timeout, self.idle_timeout)
    }
}

/// Limits of an HTTP listener from otelcol's confighttp keys (plus `max_connections`).
pub fn limits_http(
    role: Role,
    max_connections: Option<usize>,
    read_header_timeout: Option<GoDuration>,
    idle_timeout: Option<GoDuration>,
) -> Limits {
    let mut l = Limits::new(role);
    if let Some(n) = max_connections {
        l.max_connections = n;
    }
    if let Some(t) = read_header_timeout.filter(|t| !t.0.is_zero()) {
        l.read_header_timeout = t.0;
    }
    if let Some(t) = idle_timeout.filter(|t| !t.0.is_zero()) {
        l.idle_timeout = t.0;
    }
    l
}

/// CORS settings (otelcol `confighttp.CORSConfig`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins allowed to send; `*` matches any, and one `*` inside a pattern matches a part.
    pub allowed_origins: Vec<String>,
    /// Request headers allowed besides the CORS-safelisted ones.
    pub allowed_headers: Vec<String>,
    /// How long browsers may cache a preflight answer, in seconds (0 = not sent).
    pub max_age: u64,
}

/// Prefixes a `/` when missing, as otelcol does.
fn sanitize_path(p: &str) -> String {
    if p.starts_with('/') { p.to_string() } else { format!("/{p}") }
}

impl OtlpConfig {
    /// Parses and checks the settings, normalising URL paths.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let mut cfg: OtlpConfig = parse_config(v)?;
        cfg.check()?;
        if let Some(h) = &mut cfg.protocols.http {
            h.traces_url_path = sanitize_path(&h.traces_url_path);
            h.metrics_url_path = sanitize_path(&h.metrics_url_path);
            h.logs_url_path = sanitize_path(&h.logs_url_path);
        }
        Ok(cfg)
    }

    /// Valid otelcol keys that change nothing here, each located: grpc-go's per-connection
    /// `read_buffer_size` / `write_buffer_size` (hyper sizes its HTTP/2 buffers itself and the
    /// flow-control windows are a different knob) and the client ping `enforcement_policy`.
    pub fn warnings(v: &serde_json::Value) -> Vec<FieldError> {
        let Ok(cfg) = parse_config::<OtlpConfig>(v) else { return Vec::new() };
        let Some(g) = &cfg.protocols.grpc else { return Vec::new() };
        let mut out = Vec::new();
        for (key, set) in [("read_buffer_size", g.read_buffer_size), ("write_buffer_size", g.write_buffer_size)] {
            if set.is_some() {
                out.push(FieldError::at(
                    &format!("protocols.grpc.{key}"),
                    "has no effect: the gRPC server (tonic/hyper) sizes its connection buffers itself",
                ));
            }
        }
        if g.keepalive.as_ref().is_some_and(|k| k.enforcement_policy.is_some()) {
            out.push(FieldError::at(
                "protocols.grpc.keepalive.enforcement_policy",
                "has no effect: client keep-alive pings are not policed",
            ));
        }
        out
    }

    /// Semantic checks that serde cannot express.
    fn check(&self) -> Result<(), FieldError> {
        let p = &self.protocols;
        if p.grpc.is_none() && p.http.is_none() {
            return Err(FieldError::at(
                "protocols",
                "at least one protocol (grpc or http) must be configured, e.g. `protocols: { grpc: {}, http: {} }`",
            ));
        }
        if let Some(g) = &p.grpc
            && g.max_recv_msg_size_mib == 0
        {
            return Err(FieldError::at("protocols.grpc.max_recv_msg_size_mib", "must be greater than 0"));
        }
        for (proto, n) in [
            ("grpc", p.grpc.as_ref().and_then(|g| g.max_connections)),
            ("http", p.http.as_ref().and_then(|h| h.max_connections)),
        ] {
            if n == Some(0) {
                return Err(FieldError::at(&format!("protocols.{proto}.max_connections"), "must be greater than 0"));
            }
        }
        if let Some(h) = &p.http {
            if h.max_request_body_size == 0 {
                return Err(FieldError::at("protocols.http.max_request_body_size", "must be greater than 0"));
            }
            let paths = [
                ("traces_url_path", &h.traces_url_path),
                ("metrics_url_path", &h.metrics_url_path),
                ("logs_url_path", &h.logs_url_path),
            ];
            for (i, (key, path)) in paths.iter().enumerate() {
                let at = format!("protocols.http.{key}");
                let clean = sanitize_path(path);
                if clean.len() < 2 || clean.contains(char::is_whitespace) || clean.contains(['?', '#', '{', '}']) {
                    return Err(FieldError::at(&at, format!("invalid URL path {path:?}")));
                }
                if paths[..i].iter().any(|(_, other)| sanitize_path(other) == clean) {
                    return Err(FieldError::at(&at, format!("URL path {clean:?} is used by another signal")));
                }
            }
            for name in h.response_headers.keys() {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(FieldError::at(
                        "protocols.http.response_headers",
                        format!("invalid header name {name:?}"),
                    ));
                }
            }
            for (name, value) in &h.response_headers {
                if http::HeaderValue::from_str(value).is_err() {
                    return Err(FieldError::at(
                        "protocols.http.response_headers",
                        format!("invalid value for header {name:?}"),
                    ));
                }
            }
        }
        if let (Some(g), Some(h)) = (&p.grpc, &p.http)
            && g.endpoint.port != 0
            && g.endpoint == h.endpoint
        {
            return Err(FieldError::at(
                "protocols.http.endpoint",
                format!("endpoint {} is also the grpc endpoint; use different ports", h.endpoint),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::PathSeg;
    use serde_json::json;

    #[test]
    fn present_but_empty_keys_enable_protocols() {
        let c = OtlpConfig::from_value(&json!({"protocols": {"grpc": null, "http": {}}})).unwrap();
        assert_eq!(c.protocols.grpc, Some(GrpcConfig::default()));
        assert_eq!(c.protocols.http, Some(HttpConfig::default()));
        let c = OtlpConfig::from_value(&json!({"protocols": {"http": null}})).unwrap();
        assert!(c.protocols.grpc.is_none());
        assert_eq!(c.protocols.http.unwrap().endpoint.to_string(), "127.0.0.1:4318");
    }

    #[test]
    fn no_protocol_is_an_error() {
        for v in [json!(null), json!({}), json!({"protocols": {}}), json!({"protocols": null})] {
            let e = OtlpConfig::from_value(&v).unwrap_err();
            assert_eq!(e.path, vec![PathSeg::Key("protocols".into())], "{v}");
            assert!(e.message.contains("at least one protocol"), "{}", e.message);
        }
    }

    #[test]
    fn otelcol_keys_are_accepted() {
        let c = OtlpConfig::from_value(&json!({"protocols": {
            "grpc": {"endpoint": "0.0.0.0:14317", "max_recv_msg_size_mib": 16, "include_metadata": true,
                     "transport": "tcp", "keepalive": {"server_parameters": {"time": "30s", "timeout": "5s"}}},
            "http": {"endpoint": "0.0.0.0:14318", "traces_url_path": "traces", "include_metadata": true,
                     "cors": {"allowed_origins": ["https://*.example.com"], "max_age": 7200},
                     "max_request_body_size": 1024}
        }}))
        .unwrap();
        let g = c.protocols.grpc.unwrap();
        assert_eq!(g.max_recv_msg_size(), 16 * MIB);
        let h = c.protocols.http.unwrap();
        assert_eq!(h.traces_url_path, "/traces");
        assert_eq!(h.metrics_url_path, "/v1/metrics");
        assert_eq!(h.cors.unwrap().allowed_origins, vec!["https://*.example.com".to_string()]);
    }

    #[test]
    fn buffer_sizes_are_accepted_with_a_located_warning() {
        let v = json!({"protocols": {"grpc": {"read_buffer_size": 524288, "write_buffer_size": 0,
                       "keepalive": {"enforcement_policy": {"min_time": "5s"}}}, "http": {}}});
        assert!(OtlpConfig::from_value(&v).is_ok());
        let w = OtlpConfig::warnings(&v);
        let paths: Vec<String> = w.iter().map(FieldError::dotted).collect();
        assert_eq!(
            paths,
            [
                "protocols.grpc.read_buffer_size",
                "protocols.grpc.write_buffer_size",
                "protocols.grpc.keepalive.enforcement_policy"
            ]
        );
        assert!(w.iter().all(|e| e.message.starts_with("has no effect")), "{w:?}");
        assert!(OtlpConfig::warnings(&json!({"protocols": {"grpc": {"max_recv_msg_size_mib": 8}}})).is_empty());
        // An invalid configuration is validate's to report, not warnings'.
        assert!(OtlpConfig::warnings(&json!({"protocols": {"grpc": {"read_buffer_size": "big"}}})).is_empty());
    }

    #[test]
    fn unknown_and_bad_fields_are_located() {
        let e = OtlpConfig::from_value(&json!({"protocols": {"grpc": {"tls": {}}}})).unwrap_err();
        assert_eq!(
            e.path,
            vec![PathSeg::Key("protocols".into()), PathSeg::Key("grpc".into()), PathSeg::Key("tls".into())]
        );
        let e = OtlpConfig::from_value(&json!({"protocols": {"http": {"endpoint": "http://x:1"}}})).unwrap_err();
        assert_eq!(e.path.last(), Some(&PathSeg::Key("endpoint".into())));
        let e = OtlpConfig::from_value(
            &json!({"protocols": {"grpc": {"endpoint": "0.0.0.0:9"}, "http": {"endpoint": "0.0.0.0:9"}}}),
        )
        .unwrap_err();
        assert!(e.message.contains("also the grpc endpoint"), "{}", e.message);
        let e = OtlpConfig::from_value(&json!({"protocols": {"http": {"logs_url_path": "/v1/traces"}}})).unwrap_err();
        assert!(e.message.contains("used by another signal"), "{}", e.message);
    }
}
