//! inferwatch exporters (nine): `otlp` (gRPC), `otlphttp`, `loadbalancing` (`otlp` to backends
//! chosen by consistent hashing), `debug`, the recording exporters
//! `parquet` and `arrow_ipc`, the Prometheus exporters `prometheus` (pull endpoint) and
//! `prometheusremotewrite`, and `alertmanager` (alerts from the `alerts` connector's logs).
//!
//! Every network exporter has one anatomy, `<name>/{config, factory, encode, send}.rs`: it is a
//! [`RequestSender`](inferwatch_core::exporterhelper::RequestSender) that encodes (and
//! compresses) a payload's request once and sends that request on each attempt, wrapped in a
//! [`QueuedExporter`](inferwatch_core::exporterhelper::QueuedExporter), which provides the
//! bounded sending queue, retries with back-off and the self-metrics; `timeout`,
//! `sending_queue` and `retry_on_failure` are core's
//! [`ExporterSettings`](inferwatch_core::exporterhelper::ExporterSettings), read from each
//! exporter's settings map. The HTTP exporters post through [`http`]. The recording exporters
//! write synchronously into rotated files ([`recording`]).

pub mod alertmanager;
pub mod arrow_ipc;
pub mod client_config;
pub mod debug;
pub mod http;
pub mod loadbalancing;
pub mod otlp;
pub mod otlphttp;
pub mod parquet;
pub mod prometheus;
pub mod prometheusremotewrite;
pub mod recording;
/// Client TLS (moved to core; re-exported for the exporters).
pub use inferwatch_core::tls;

mod common;
pub mod optional;

pub use crate::alertmanager::{AlertmanagerConfig, AlertmanagerExporterFactory};
pub use crate::arrow_ipc::{ArrowIpcConfig, ArrowIpcExporterFactory};
pub use crate::parquet::{ParquetCompression, ParquetConfig, ParquetExporterFactory};
pub use debug::{DebugConfig, DebugExporterFactory, Verbosity};
pub use loadbalancing::{LoadBalancingConfig, LoadBalancingExporterFactory};
pub use otlp::{OtlpConfig, OtlpExporterFactory};
pub use otlphttp::{Encoding, OtlpHttpConfig, OtlpHttpExporterFactory};
pub use prometheus::{PrometheusConfig, PrometheusExporterFactory};
pub use prometheusremotewrite::{RemoteWriteConfig, RemoteWriteExporterFactory};

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// Adds the `otlp`, `otlphttp`, `loadbalancing`, `debug`, `parquet`, `arrow_ipc`, `prometheus`,
/// `prometheusremotewrite` and `alertmanager` exporter factories to `reg`.
pub fn register(reg: &mut Registry) {
    // otlp, otlphttp and alertmanager are disabled by an empty `endpoint` (optional.rs).
    reg.add_exporter(Arc::new(optional::UnlessNoEndpoint(OtlpExporterFactory)));
    reg.add_exporter(Arc::new(optional::UnlessNoEndpoint(OtlpHttpExporterFactory)));
    reg.add_exporter(Arc::new(LoadBalancingExporterFactory));
    reg.add_exporter(Arc::new(DebugExporterFactory));
    reg.add_exporter(Arc::new(ParquetExporterFactory));
    reg.add_exporter(Arc::new(ArrowIpcExporterFactory));
    reg.add_exporter(Arc::new(PrometheusExporterFactory));
    reg.add_exporter(Arc::new(RemoteWriteExporterFactory));
    reg.add_exporter(Arc::new(optional::UnlessNoEndpoint(AlertmanagerExporterFactory)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::ComponentKind;

    #[test]
    fn registers_nine_exporters() {
        let mut reg = Registry::new();
        register(&mut reg);
        assert_eq!(
            reg.type_names(ComponentKind::Exporter),
            vec![
                "alertmanager",
                "arrow_ipc",
                "debug",
                "loadbalancing",
                "otlp",
                "otlphttp",
                "parquet",
                "prometheus",
                "prometheusremotewrite"
            ]
        );
        for t in ["debug", "loadbalancing", "otlp", "otlphttp"] {
            let f = reg.exporter(t).map(|f| f.signals().len());
            assert_eq!(f, Some(3), "{t}");
        }
        // No Arrow schema for logs yet: the recording exporters take traces and metrics only.
        for t in ["parquet", "arrow_ipc"] {
            let f = reg.exporter(t).map(|f| f.signals().to_vec());
            assert_eq!(f, Some(vec![inferwatch_core::Signal::Traces, inferwatch_core::Signal::Metrics]), "{t}");
        }
        for t in ["prometheus", "prometheusremotewrite"] {
            let f = reg.exporter(t).map(|f| f.signals().to_vec());
            assert_eq!(f, Some(vec![inferwatch_core::Signal::Metrics]), "{t}");
        }
    }
}
