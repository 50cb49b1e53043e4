//! The table of every component built into this binary.

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// All receivers, processors, exporters, connectors and extensions.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    inferwatch_receivers::register(&mut r);
    inferwatch_processors::register(&mut r);
    inferwatch_exporters::register(&mut r);
    inferwatch_ml::register(&mut r);
    r.add_extension(Arc::new(inferwatch_core::extension::health_check::HealthCheckFactory));
    r.add_extension(Arc::new(inferwatch_core::extension::storage::StorageFactory));
    // Persistent sending queues (otelcol-contrib's file_storage).
    r.add_extension(Arc::new(inferwatch_core::extension::file_storage::FileStorageFactory));
    // Authenticators (otelcol-contrib's bearertokenauth, basicauth, headers_setter).
    r.add_extension(Arc::new(inferwatch_core::extension::bearertokenauth::BearerTokenAuthFactory));
    r.add_extension(Arc::new(inferwatch_core::extension::basicauth::BasicAuthFactory));
    r.add_extension(Arc::new(inferwatch_core::extension::headers_setter::HeadersSetterFactory));
    r
}
