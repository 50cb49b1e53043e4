//! Helpers shared by the exporters: queue / retry checks, node assembly, gzip.

use inferwatch_core::component::{ComponentError, CreateContext, FieldError, NodeRef};
use inferwatch_core::exporterhelper::{QueuedExporter, Sender};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::{QueueSettings, RetrySettings};
use std::io::Write;
use std::sync::Arc;

/// The `User-Agent` every network exporter sends.
pub(crate) const USER_AGENT: &str = concat!("inferwatch/", env!("CARGO_PKG_VERSION"));

/// Checks `sending_queue` as otelcol does (see [`QueueSettings::check`]).
pub(crate) fn validate_queue(q: &QueueSettings) -> Result<(), FieldError> {
    q.check()
}

/// Checks `retry_on_failure` as otelcol does.
pub(crate) fn validate_retry(r: &RetrySettings) -> Result<(), FieldError> {
    if !(0.0..=1.0).contains(&r.randomization_factor) {
        return Err(FieldError::at(
            "retry_on_failure.randomization_factor",
            "randomization_factor must be within [0, 1]",
        ));
    }
    if !(r.multiplier.is_finite() && r.multiplier > 0.0) {
        return Err(FieldError::at("retry_on_failure.multiplier", "multiplier must be positive"));
    }
    Ok(())
}

/// Wraps `sender` in the shared queue / retry machinery with this exporter's self-metrics;
/// `sending_queue.storage` opens (and resumes) the persistent queue in that extension.
pub(crate) fn node(
    ctx: &CreateContext,
    signal: Signal,
    sender: Arc<dyn Sender>,
    queue: QueueSettings,
    retry: RetrySettings,
) -> Result<NodeRef, ComponentError> {
    Ok(Arc::new(QueuedExporter::create(ctx, signal, sender, queue, retry)?))
}

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

    #[test]
    fn queue_and_retry_checks() {
        assert!(validate_queue(&QueueSettings::default()).is_ok());
        let e = validate_queue(&QueueSettings { queue_size: 0, ..Default::default() }).unwrap_err();
        assert_eq!(e, FieldError::at("sending_queue.queue_size", "queue_size must be positive"));
        assert!(
            validate_queue(&QueueSettings { enabled: false, queue_size: 0, num_consumers: 0, ..Default::default() })
                .is_ok()
        );
        assert!(validate_retry(&RetrySettings::default()).is_ok());
        assert!(validate_retry(&RetrySettings { randomization_factor: 1.5, ..Default::default() }).is_err());
        assert!(validate_retry(&RetrySettings { multiplier: 0.0, ..Default::default() }).is_err());
    }
}
