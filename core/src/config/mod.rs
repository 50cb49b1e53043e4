//! Configuration in the OpenTelemetry Collector's shape: loading YAML files with positions,
//! `${env:VAR}` substitution, merging several files, and validation against the registry.

mod envsubst;
mod load;
mod validate;
pub mod yaml;

use crate::component::{ComponentId, PathSeg};
use crate::pdata::Signal;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use load::{load, load_str, load_with_env};
pub use validate::{validate, warnings};

/// A place in a configuration file (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file as given on the command line.
    pub file: Arc<str>,
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One configuration problem, located at a file position and a dotted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where it is, when known.
    pub location: Option<Location>,
    /// The dotted key path, e.g. `exporters.otlp/tempo.endpoint`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(l) = &self.location {
            write!(f, "{l}: ")?;
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A defined component: its id, its settings and where they are.
#[derive(Debug, Clone)]
pub struct ComponentConfig {
    /// The `type[/name]` id.
    pub id: ComponentId,
    /// Its settings as JSON (null when empty), after substitution and merging.
    pub settings: serde_json::Value,
    /// Where the id key is.
    pub location: Location,
    /// The settings subtree with positions, to locate errors inside it.
    pub node: yaml::Node,
}

impl ComponentConfig {
    /// The location of `path` inside the settings (falling back to the nearest ancestor).
    pub fn locate(&self, path: &[PathSeg]) -> Location {
        self.node.locate(path).unwrap_or_else(|| self.location.clone())
    }
}

/// A pipeline id: `traces`, `metrics/fast`, ...
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PipelineId {
    /// The signal it carries.
    pub signal: Signal,
    /// The optional name after the slash.
    pub name: Option<String>,
}

impl fmt::Display for PipelineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{}/{}", self.signal, n),
            None => write!(f, "{}", self.signal),
        }
    }
}

/// One `service.pipelines` entry.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Its id.
    pub id: PipelineId,
    /// Receiver (or connector) ids, with where each is listed.
    pub receivers: Vec<(ComponentId, Location)>,
    /// Processor ids in order.
    pub processors: Vec<(ComponentId, Location)>,
    /// Exporter (or connector) ids.
    pub exporters: Vec<(ComponentId, Location)>,
    /// Where the pipeline key is.
    pub location: Location,
}

/// `service.telemetry`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Address of the self-metrics endpoint; `None` when `level: none`.
    pub metrics_address: Option<String>,
    /// TLS of the self-metrics endpoint (`readers[].pull.exporter.prometheus.tls`, an inferwatch
    /// addition: otelcol's pull reader has no TLS).
    pub metrics_tls: Option<crate::tls::server::TlsServerSettings>,
    /// Log level from `service.telemetry.logs.level`, if set.
    pub logs_level: Option<String>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig { metrics_address: Some("127.0.0.1:8888".into()), metrics_tls: None, logs_level: None }
    }
}

/// The `service` section.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Extensions to start.
    pub extensions: Vec<(ComponentId, Location)>,
    /// Pipelines in file order.
    pub pipelines: Vec<PipelineConfig>,
    /// The agent's own telemetry.
    pub telemetry: TelemetryConfig,
    /// How long shutdown may take to drain (default 10 s).
    pub shutdown_timeout: Duration,
}

/// A whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `receivers:`
    pub receivers: BTreeMap<ComponentId, ComponentConfig>,
    /// `processors:`
    pub processors: BTreeMap<ComponentId, ComponentConfig>,
    /// `exporters:`
    pub exporters: BTreeMap<ComponentId, ComponentConfig>,
    /// `connectors:`
    pub connectors: BTreeMap<ComponentId, ComponentConfig>,
    /// `extensions:`
    pub extensions: BTreeMap<ComponentId, ComponentConfig>,
    /// `service:`
    pub service: ServiceConfig,
}
