//! The client settings the `otlp` and `otlphttp` exporters share: `tls`, `headers`, `auth`,
//! `compression` and `compression_params`, one struct ([`ClientSettings`]) read from the
//! exporter's own settings map beside its [`ExporterSettings`] through core's split map
//! ([`inferwatch_core::config::split`]), so that every key keeps its place and its error path.

use inferwatch_core::auth::AuthSettings;
use inferwatch_core::config::split::SplitKeys;
use inferwatch_core::exporterhelper::ExporterSettings;
use inferwatch_core::settings::{Compression, CompressionParams, TlsClientSettings};
use serde::de::MapAccess;
use std::collections::BTreeMap;

/// TLS, headers, authenticator and compression of an OTLP exporter's client, as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientSettings {
    /// Client TLS.
    pub tls: TlsClientSettings,
    /// Extra headers (gRPC metadata for `otlp`) sent with every request.
    pub headers: BTreeMap<String, String>,
    /// Client authenticator extension (`auth: { authenticator: <id> }`, otelcol `configauth`).
    pub auth: Option<AuthSettings>,
    /// Request compression (`gzip` by default, or `none`).
    pub compression: Compression,
    /// gzip level (`compression_params.level`, 1 fastest to 9 smallest; default 1).
    pub compression_params: CompressionParams,
}

/// [`ClientSettings`] and [`ExporterSettings`], read from one map (see [`with_client_settings!`]).
#[derive(Debug)]
pub struct ClientAndExporter {
    /// The client keys.
    pub client: ClientSettings,
    /// `timeout`, `sending_queue`, `retry_on_failure`.
    pub exporter: ExporterSettings,
}

impl<'de> SplitKeys<'de> for ClientAndExporter {
    /// The client keys, then [`ExporterSettings`]' keys.
    const KEYS: &'static [&'static str] = &[
        "tls",
        "headers",
        "auth",
        "compression",
        "compression_params",
        "timeout",
        "sending_queue",
        "retry_on_failure",
    ];

    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let c = &mut self.client;
        match key {
            "tls" => c.tls = map.next_value()?,
            "headers" => c.headers = map.next_value()?,
            "auth" => c.auth = map.next_value()?,
            "compression" => c.compression = map.next_value()?,
            "compression_params" => c.compression_params = map.next_value()?,
            _ => self.exporter.read(key, map)?,
        }
        Ok(())
    }
}

/// `Deserialize` for an OTLP exporter's settings struct whose own keys are derived with
/// `#[serde(remote = "Self")]` and whose `client: ClientSettings` and `exporter:
/// ExporterSettings` fields are `#[serde(skip)]`: their keys are read from the same map, the
/// exporter settings over `$defaults`.
macro_rules! with_client_settings {
    ($t:ty, $defaults:expr) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let client = $crate::client_config::ClientSettings::default();
                let mut shared = $crate::client_config::ClientAndExporter { client, exporter: $defaults };
                // The inherent (derived) `deserialize`, over the split map.
                let mut v = <$t>::deserialize(inferwatch_core::config::split::Split::new(d, &mut shared))?;
                (v.client, v.exporter) = (shared.client, shared.exporter);
                Ok(v)
            }
        }
    };
}
pub(crate) use with_client_settings;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_client_keys_then_the_exporter_settings() {
        let client = ["tls", "headers", "auth", "compression", "compression_params"];
        let exporter = <ExporterSettings as SplitKeys<'static>>::KEYS;
        let all: Vec<&str> = client.iter().chain(exporter).copied().collect();
        assert_eq!(<ClientAndExporter as SplitKeys<'static>>::KEYS, all.as_slice());
    }
}
