//! Helpers shared by the exporters: the exporter settings of a config, gzip, partial success.

use inferwatch_core::pdata::Signal;
use std::io::Write;

/// The `User-Agent` every network exporter sends.
pub(crate) const USER_AGENT: &str = concat!("inferwatch/", env!("CARGO_PKG_VERSION"));

/// `Deserialize` for an exporter's settings struct whose own keys are derived with
/// `#[serde(remote = "Self")]` and whose `exporter: ExporterSettings` field is `#[serde(skip)]`:
/// `timeout`, `sending_queue` and `retry_on_failure` are read from the same map, over
/// `$defaults` (see [`inferwatch_core::config::split`]).
macro_rules! with_exporter_settings {
    ($t:ty, $defaults:expr) => {
        inferwatch_core::split_deserialize!($t, exporter, $defaults);
    };
}
pub(crate) use with_exporter_settings;

/// Gzip-compresses the concatenation of `chunks` at `level` (1 fastest .. 9 smallest).
pub(crate) fn gzip_chunks(chunks: &[bytes::Bytes], level: u32) -> std::io::Result<Vec<u8>> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(total / 6 + 64), flate2::Compression::new(level));
    for c in chunks {
        enc.write_all(c)?;
    }
    enc.finish()
}

/// Logs a partial-success response (otelcol logs a warning and counts the request as sent).
pub(crate) fn log_partial_success(exporter: &str, signal: Signal, rejected: i64, message: &str) {
    if rejected != 0 || !message.is_empty() {
        tracing::warn!(exporter, signal = %signal, rejected, message,
            "partial success response: the destination rejected some items");
    }
}

/// A duration of zero means "no timeout" in otelcol settings.
pub(crate) fn non_zero(d: std::time::Duration) -> Option<std::time::Duration> {
    (!d.is_zero()).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn gzip_round_trips() {
        let data = b"hello hello hello hello".repeat(10);
        let z = gzip_chunks(&[bytes::Bytes::from(data[..10].to_vec()), bytes::Bytes::from(data[10..].to_vec())], 1)
            .unwrap();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&z[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
    }
}
