//! What every component of one running service shares: the host (state registry, extension
//! services, values of the command that runs the graph), the context a factory builds a
//! component with, and the handle that tells extensions whether the pipelines run.

use crate::state::StateRegistry;
use crate::telemetry::Telemetry;
use crate::vocab::ComponentId;
use parking_lot::RwLock;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Shared services of one running pipeline graph.
#[derive(Default)]
pub struct Host {
    /// Stateful components and the checkpoint store.
    pub state: Arc<StateRegistry>,
    /// Values the command running the graph hands its components, by type (`inferwatch
    /// replay` puts its request here for the replay receivers).
    pub run: RunValues,
    /// What extensions offer to the other components (authenticators, queue storage), by id.
    pub services: ExtensionServices,
}

/// Values set when a host is made, one per type: the command that runs a graph passes
/// component-specific requests through them without the host knowing their types.
#[derive(Default)]
pub struct RunValues {
    map: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl RunValues {
    /// These values with `value` added (it replaces an earlier value of the same type).
    pub fn with<T: Any + Send + Sync>(mut self, value: Arc<T>) -> Self {
        self.map.insert(TypeId::of::<T>(), value);
        self
    }

    /// The value of type `T`, if one was set.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.map.get(&TypeId::of::<T>()).and_then(|v| v.downcast_ref::<T>())
    }

    /// A shared handle to the value of type `T`, if one was set.
    pub fn get_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.map.get(&TypeId::of::<T>()).cloned().and_then(|v| v.downcast::<T>().ok())
    }
}

/// Services extensions register at creation for the components built after them, keyed by
/// the extension's id (`bearertokenauth/tenant-a`, `file_storage/queue`).
#[derive(Default)]
pub struct ExtensionServices {
    map: RwLock<HashMap<String, Arc<dyn Any + Send + Sync>>>,
}

impl ExtensionServices {
    /// Registers `service` under the extension id `id` (a second call replaces the first).
    pub fn provide<T: Any + Send + Sync>(&self, id: &str, service: T) {
        self.map.write().insert(id.to_string(), Arc::new(service));
    }

    /// The service of type `T` that extension `id` registered, if any.
    pub fn get<T: Any + Send + Sync + Clone>(&self, id: &str) -> Option<T> {
        self.map.read().get(id).and_then(|s| s.downcast_ref::<T>().cloned())
    }

    /// Whether extension `id` registered any service at all.
    pub fn contains(&self, id: &str) -> bool {
        self.map.read().contains_key(id)
    }
}

impl Host {
    /// A host with an empty state registry and no run values.
    pub fn new() -> Arc<Host> {
        Arc::new(Host::default())
    }
}

/// What a factory gets to build a component.
#[derive(Clone)]
pub struct CreateContext {
    /// The component's id.
    pub id: ComponentId,
    /// The agent's self-telemetry.
    pub telemetry: Arc<Telemetry>,
    /// Services shared by the components of one running graph (state, run values).
    pub host: Arc<Host>,
}

impl CreateContext {
    /// A context with a fresh host (for tests and stand-alone components).
    pub fn new(id: ComponentId, telemetry: Arc<Telemetry>) -> Self {
        CreateContext { id, telemetry, host: Host::new() }
    }
}

/// Tells whether every pipeline is running (read by the health check).
#[derive(Clone, Default)]
pub struct StatusHandle(Arc<AtomicBool>);

impl StatusHandle {
    /// True while every pipeline is running.
    pub fn is_running(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    /// Sets the running state.
    pub fn set_running(&self, v: bool) {
        self.0.store(v, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_values_are_found_by_type() {
        struct Request(u32);
        struct Other;
        let host = Host { run: RunValues::default().with(Arc::new(Request(7))), ..Default::default() };
        assert_eq!(host.run.get::<Request>().map(|r| r.0), Some(7));
        assert_eq!(host.run.get_arc::<Request>().map(|r| r.0), Some(7));
        assert!(host.run.get::<Other>().is_none());
        assert!(Host::default().run.get::<Request>().is_none());
    }
}
