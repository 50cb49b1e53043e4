//! What a detector's processor shares around its state: its component name, the
//! `series_evicted` counters (`max_series`, `idle`), and the checkpoint wrappers that turn the
//! kit's errors into [`StateError`]s (a snapshot written with other parameters is
//! `Incompatible`, anything else `Corrupt`; a refused restore leaves the state as it was).

use super::series::RestoreError;
use inferwatch_core::component::CreateContext;
use inferwatch_core::state::StateError;
use prometheus_client::metrics::counter::Counter;
use std::fmt::Display;

/// The component side of one running detector.
pub struct Adapter {
    name: String,
    detector: &'static str,
    evicted_idle: Counter,
    evicted_max: Counter,
}

impl Adapter {
    /// The adapter of component `ctx.id`, a detector of type `detector` (`zscore_skew`, ...).
    pub fn new(ctx: &CreateContext, detector: &'static str) -> Self {
        Adapter {
            name: ctx.id.to_string(),
            detector,
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
        }
    }

    /// The component's name (its id), for logs and state errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A corrupt-state error of this component.
    pub fn corrupt(&self, message: impl Display) -> StateError {
        StateError::Corrupt { key: self.name.clone(), message: message.to_string() }
    }

    /// Counts `n` series evicted at `max_series`.
    pub fn evicted_max(&self, n: usize) {
        if n > 0 {
            self.evicted_max.inc_by(n as u64);
            tracing::debug!(processor = %self.name, evicted = n, "series evicted at max_series");
        }
    }

    /// Counts `n` series forgotten after `idle_timeout`.
    pub fn evicted_idle(&self, n: usize) {
        if n > 0 {
            self.evicted_idle.inc_by(n as u64);
            tracing::debug!(processor = %self.name, idle = n, "idle series forgotten");
        }
    }

    /// A state's snapshot, its serialization error a corrupt-state error.
    pub fn snapshot(&self, bytes: Result<Vec<u8>, postcard::Error>) -> Result<Vec<u8>, StateError> {
        bytes.map_err(|e| self.corrupt(format!("cannot serialize {} state: {e}", self.detector)))
    }

    /// Restores `fresh` (a new, empty state) from `bytes` with `restore` and returns it, for the
    /// caller to replace its state with; on error the caller's state is untouched.
    pub fn restore<S>(
        &self,
        mut fresh: S,
        bytes: &[u8],
        restore: impl FnOnce(&mut S, &[u8]) -> Result<(), RestoreError>,
    ) -> Result<S, StateError> {
        match restore(&mut fresh, bytes) {
            Ok(()) => Ok(fresh),
            Err(RestoreError::Params { what, found, expected }) => Err(StateError::Incompatible {
                key: self.name.clone(),
                what,
                found: format!("{found} ns"),
                expected: format!("{expected} ns"),
            }),
            Err(e) => Err(self.corrupt(format!("{} state: {e}", self.detector))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::ComponentId;
    use inferwatch_core::telemetry::Telemetry;
    use std::sync::Arc;

    fn adapter() -> (Adapter, Arc<Telemetry>, ComponentId) {
        let telemetry = Arc::new(Telemetry::new());
        let id = ComponentId::parse("zscore_skew/a").unwrap();
        (Adapter::new(&CreateContext::new(id.clone(), telemetry.clone()), "zscore_skew"), telemetry, id)
    }

    #[test]
    fn counts_evictions_by_reason() {
        let (a, t, id) = adapter();
        a.evicted_max(3);
        a.evicted_idle(0);
        a.evicted_idle(2);
        assert_eq!(t.series_evicted(&id, "max_series").get(), 3);
        assert_eq!(t.series_evicted(&id, "idle").get(), 2);
        assert_eq!(a.name(), "zscore_skew/a");
    }

    #[test]
    fn restore_errors_become_incompatible_or_corrupt() {
        let (a, _, _) = adapter();
        let ok = a.restore(0u8, b"x", |s, b| {
            *s = b[0];
            Ok(())
        });
        assert_eq!(ok.unwrap(), b'x');
        let params = a.restore(0u8, b"", |_, _| Err(RestoreError::Params { what: "window", found: 1, expected: 2 }));
        match params {
            Err(StateError::Incompatible { key, what, found, expected }) => {
                assert_eq!(
                    (key.as_str(), what, found.as_str(), expected.as_str()),
                    ("zscore_skew/a", "window", "1 ns", "2 ns")
                );
            }
            other => panic!("want Incompatible, got {other:?}"),
        }
        let corrupt = a.restore(0u8, b"", |_, _| Err(RestoreError::Invalid("duplicate series")));
        match corrupt {
            Err(StateError::Corrupt { message, .. }) => {
                assert_eq!(message, "zscore_skew state: invalid state: duplicate series");
            }
            other => panic!("want Corrupt, got {other:?}"),
        }
        let e = a.snapshot(Err(postcard::Error::SerializeBufferFull)).unwrap_err();
        assert!(matches!(e, StateError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("cannot serialize zscore_skew state"), "{e}");
    }
}
