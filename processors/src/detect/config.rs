//! What the detectors' configurations share: durations in nanoseconds and the one signal they
//! read.

use inferwatch_core::component::{ComponentError, FieldError};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;

/// The duration `d` of setting `key` in ns; an error when it does not fit in a `u64`.
pub fn nanos(key: &str, d: &GoDuration) -> Result<u64, FieldError> {
    u64::try_from(d.0.as_nanos()).map_err(|_| FieldError::at(key, format!("{d} is too long (at most ~584 years)")))
}

/// Refuses a pipeline of another signal than metrics for processor `name` (the configuration
/// check refuses it first; this guards a direct `create_arrow`).
pub fn metrics_only(name: &str, signal: Signal) -> Result<(), ComponentError> {
    if signal == Signal::Metrics {
        return Ok(());
    }
    Err(ComponentError::Start(format!("{name} reads metrics, not {}", signal.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nanos_converts_and_refuses_what_does_not_fit() {
        assert_eq!(nanos("w", &GoDuration(Duration::from_millis(1500))).ok(), Some(1_500_000_000));
        let e = nanos("a.w", &GoDuration(Duration::from_secs(u64::MAX))).unwrap_err();
        assert_eq!(e.dotted(), "a.w");
        assert!(e.message.contains("too long"), "{e}");
    }

    #[test]
    fn only_metrics_pass() {
        assert!(metrics_only("d", Signal::Metrics).is_ok());
        let e = metrics_only("d", Signal::Logs).unwrap_err();
        assert_eq!(e.to_string(), "d reads metrics, not logs");
    }
}
