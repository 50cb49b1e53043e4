//! inferwatch exporters: `otlp` (gRPC), `otlphttp` and `debug`.
//!
//! Every exporter is a [`Sender`](inferwatch_core::exporterhelper::Sender) (one delivery
//! attempt) wrapped in a [`QueuedExporter`](inferwatch_core::exporterhelper::QueuedExporter),
//! which provides the bounded sending queue, retries with back-off and the self-metrics.

pub mod debug;
pub mod otlp;
pub mod otlphttp;
pub mod tls;

mod common;

pub use debug::{DebugConfig, DebugExporterFactory, Verbosity};
pub use otlp::{OtlpConfig, OtlpExporterFactory};
pub use otlphttp::{Encoding, OtlpHttpConfig, OtlpHttpExporterFactory};

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// Adds the `otlp`, `otlphttp` and `debug` exporter factories to `reg`.
pub fn register(reg: &mut Registry) {
    reg.add_exporter(Arc::new(OtlpExporterFactory));
    reg.add_exporter(Arc::new(OtlpHttpExporterFactory));
    reg.add_exporter(Arc::new(DebugExporterFactory));
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::ComponentKind;

    #[test]
    fn registers_three_exporters() {
        let mut reg = Registry::new();
        register(&mut reg);
        assert_eq!(reg.type_names(ComponentKind::Exporter), vec!["debug", "otlp", "otlphttp"]);
        for t in ["debug", "otlp", "otlphttp"] {
            let f = reg.exporter(t).map(|f| f.signals().len());
            assert_eq!(f, Some(3), "{t}");
        }
    }
}
