//! The table of component factories, keyed by kind and type name.

use crate::component::{ConnectorFactory, ExporterFactory, ExtensionFactory, ProcessorFactory, ReceiverFactory};
use crate::vocab::ComponentKind;
use std::collections::BTreeMap;
use std::sync::Arc;

/// All factories the binary knows, by type name, and the other names a type answers to.
#[derive(Clone)]
pub struct Registry {
    receivers: BTreeMap<&'static str, Arc<dyn ReceiverFactory>>,
    processors: BTreeMap<&'static str, Arc<dyn ProcessorFactory>>,
    exporters: BTreeMap<&'static str, Arc<dyn ExporterFactory>>,
    connectors: BTreeMap<&'static str, Arc<dyn ConnectorFactory>>,
    extensions: BTreeMap<&'static str, Arc<dyn ExtensionFactory>>,
    aliases: BTreeMap<(ComponentKind, &'static str), Alias>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut r = Registry {
            receivers: BTreeMap::new(),
            processors: BTreeMap::new(),
            exporters: BTreeMap::new(),
            connectors: BTreeMap::new(),
            extensions: BTreeMap::new(),
            aliases: BTreeMap::new(),
        };
        for a in OTELCOL_ALIASES {
            r.add_alias(a.clone());
        }
        r
    }
}

/// Another name of a component type: otelcol's current name of a type inferwatch registers
/// under its older name, or a removed name still accepted with a deprecation warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// Kind of component.
    pub kind: ComponentKind,
    /// The name a configuration may use.
    pub name: &'static str,
    /// The registered type it stands for.
    pub target: &'static str,
    /// Why the name is deprecated, when it is (logged as a warning where it is used).
    pub deprecated: Option<&'static str>,
}

/// The names otelcol (core and contrib) gives types that inferwatch registers under another name.
/// An alias whose target is not registered resolves to nothing: the type is reported unknown,
/// with a hint naming the target.
pub const OTELCOL_ALIASES: &[Alias] = &[
    // otelcol v0.144.0 renamed `otlp` to `otlp_grpc` and `otlphttp` to `otlp_http` (the old names
    // are deprecated aliases there; both names stay accepted here without a warning).
    Alias { kind: ComponentKind::Exporter, name: "otlp_grpc", target: "otlp", deprecated: None },
    Alias { kind: ComponentKind::Exporter, name: "otlp_http", target: "otlphttp", deprecated: None },
    Alias {
        kind: ComponentKind::Exporter,
        name: "logging",
        target: "debug",
        deprecated: Some(
            "the `logging` exporter was removed from otelcol (v0.111.0) in favour of `debug`; \
             inferwatch still accepts it as `debug`: rename it",
        ),
    },
    // otelcol-contrib's lower_snake_case renames.
    Alias { kind: ComponentKind::Processor, name: "resource_detection", target: "resourcedetection", deprecated: None },
    Alias { kind: ComponentKind::Processor, name: "k8s_attributes", target: "k8sattributes", deprecated: None },
];

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
    /// Registers another name for a type (replacing an alias of the same kind and name).
    pub fn add_alias(&mut self, a: Alias) {
        self.aliases.insert((a.kind, a.name), a);
    }
    /// The alias `t` of a kind, if it is one.
    pub fn alias(&self, kind: ComponentKind, t: &str) -> Option<&Alias> {
        self.aliases.iter().find(|((k, n), _)| *k == kind && *n == t).map(|(_, a)| a)
    }
    /// Every alias, by kind and name.
    pub fn aliases(&self) -> impl Iterator<Item = &Alias> {
        self.aliases.values()
    }
    /// The registered name `t` stands for: the alias target, or `t` itself.
    pub fn resolve<'a>(&'a self, kind: ComponentKind, t: &'a str) -> &'a str {
        self.alias(kind, t).map_or(t, |a| a.target)
    }
    /// The receiver factory for a type (or an alias of one).
    pub fn receiver(&self, t: &str) -> Option<&Arc<dyn ReceiverFactory>> {
        self.receivers.get(t).or_else(|| self.receivers.get(self.resolve(ComponentKind::Receiver, t)))
    }
    /// The processor factory for a type (or an alias of one).
    pub fn processor(&self, t: &str) -> Option<&Arc<dyn ProcessorFactory>> {
        self.processors.get(t).or_else(|| self.processors.get(self.resolve(ComponentKind::Processor, t)))
    }
    /// The exporter factory for a type (or an alias of one).
    pub fn exporter(&self, t: &str) -> Option<&Arc<dyn ExporterFactory>> {
        self.exporters.get(t).or_else(|| self.exporters.get(self.resolve(ComponentKind::Exporter, t)))
    }
    /// The connector factory for a type (or an alias of one).
    pub fn connector(&self, t: &str) -> Option<&Arc<dyn ConnectorFactory>> {
        self.connectors.get(t).or_else(|| self.connectors.get(self.resolve(ComponentKind::Connector, t)))
    }
    /// The extension factory for a type (or an alias of one).
    pub fn extension(&self, t: &str) -> Option<&Arc<dyn ExtensionFactory>> {
        self.extensions.get(t).or_else(|| self.extensions.get(self.resolve(ComponentKind::Extension, t)))
    }
    /// Whether a type (or an alias of one) of a kind is registered.
    pub fn has(&self, kind: ComponentKind, t: &str) -> bool {
        match kind {
            ComponentKind::Receiver => self.receiver(t).is_some(),
            ComponentKind::Processor => self.processor(t).is_some(),
            ComponentKind::Exporter => self.exporter(t).is_some(),
            ComponentKind::Connector => self.connector(t).is_some(),
            ComponentKind::Extension => self.extension(t).is_some(),
        }
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
