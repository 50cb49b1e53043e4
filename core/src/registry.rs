//! The table of component factories, keyed by kind and type name.

use crate::component::{
    ComponentKind, ConnectorFactory, ExporterFactory, ExtensionFactory, ProcessorFactory, ReceiverFactory,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// All factories the binary knows, by type name.
#[derive(Default, Clone)]
pub struct Registry {
    receivers: BTreeMap<&'static str, Arc<dyn ReceiverFactory>>,
    processors: BTreeMap<&'static str, Arc<dyn ProcessorFactory>>,
    exporters: BTreeMap<&'static str, Arc<dyn ExporterFactory>>,
    connectors: BTreeMap<&'static str, Arc<dyn ConnectorFactory>>,
    extensions: BTreeMap<&'static str, Arc<dyn ExtensionFactory>>,
}

/// One line of `inferwatch components`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInfo {
    /// Kind of component.
    pub kind: ComponentKind,
    /// Its type name.
    pub type_name: &'static str,
    /// Signals it takes (for connectors, `from->to` pairs).
    pub signals: Vec<String>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }
    /// Registers a receiver factory.
    pub fn add_receiver(&mut self, f: Arc<dyn ReceiverFactory>) {
        self.receivers.insert(f.type_name(), f);
    }
    /// Registers a processor factory.
    pub fn add_processor(&mut self, f: Arc<dyn ProcessorFactory>) {
        self.processors.insert(f.type_name(), f);
    }
    /// Registers an exporter factory.
    pub fn add_exporter(&mut self, f: Arc<dyn ExporterFactory>) {
        self.exporters.insert(f.type_name(), f);
    }
    /// Registers a connector factory.
    pub fn add_connector(&mut self, f: Arc<dyn ConnectorFactory>) {
        self.connectors.insert(f.type_name(), f);
    }
    /// Registers an extension factory.
    pub fn add_extension(&mut self, f: Arc<dyn ExtensionFactory>) {
        self.extensions.insert(f.type_name(), f);
    }
    /// The receiver factory for a type.
    pub fn receiver(&self, t: &str) -> Option<&Arc<dyn ReceiverFactory>> {
        self.receivers.get(t)
    }
    /// The processor factory for a type.
    pub fn processor(&self, t: &str) -> Option<&Arc<dyn ProcessorFactory>> {
        self.processors.get(t)
    }
    /// The exporter factory for a type.
    pub fn exporter(&self, t: &str) -> Option<&Arc<dyn ExporterFactory>> {
        self.exporters.get(t)
    }
    /// The connector factory for a type.
    pub fn connector(&self, t: &str) -> Option<&Arc<dyn ConnectorFactory>> {
        self.connectors.get(t)
    }
    /// The extension factory for a type.
    pub fn extension(&self, t: &str) -> Option<&Arc<dyn ExtensionFactory>> {
        self.extensions.get(t)
    }

    /// Known type names of a kind, sorted.
    pub fn type_names(&self, kind: ComponentKind) -> Vec<&'static str> {
        match kind {
            ComponentKind::Receiver => self.receivers.keys().copied().collect(),
            ComponentKind::Processor => self.processors.keys().copied().collect(),
            ComponentKind::Exporter => self.exporters.keys().copied().collect(),
            ComponentKind::Connector => self.connectors.keys().copied().collect(),
            ComponentKind::Extension => self.extensions.keys().copied().collect(),
        }
    }

    /// Every component with the signals it takes.
    pub fn describe(&self) -> Vec<ComponentInfo> {
        let sig = |s: &[crate::pdata::Signal]| s.iter().map(|s| s.as_str().to_string()).collect::<Vec<_>>();
        let mut out = Vec::new();
        for (t, f) in &self.receivers {
            out.push(ComponentInfo { kind: ComponentKind::Receiver, type_name: t, signals: sig(f.signals()) });
        }
        for (t, f) in &self.processors {
            out.push(ComponentInfo { kind: ComponentKind::Processor, type_name: t, signals: sig(f.signals()) });
        }
        for (t, f) in &self.exporters {
            out.push(ComponentInfo { kind: ComponentKind::Exporter, type_name: t, signals: sig(f.signals()) });
        }
        for (t, f) in &self.connectors {
            let pairs = f.signal_pairs().iter().map(|(a, b)| format!("{a}->{b}")).collect();
            out.push(ComponentInfo { kind: ComponentKind::Connector, type_name: t, signals: pairs });
        }
        for t in self.extensions.keys() {
            out.push(ComponentInfo { kind: ComponentKind::Extension, type_name: t, signals: vec![] });
        }
        out
    }
}
