//! Configuration in the OpenTelemetry Collector's shape: loading YAML files with positions,
//! `${env:VAR}` substitution, merging several files, and validation against the registry.

mod envsubst;
mod load;
pub mod split;
mod validate;
pub mod yaml;

use crate::pdata::Signal;
use crate::vocab::{ComponentId, PathSeg};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use load::{Loaded, load, load_all, load_str, load_with_env, parse_set};
pub use validate::{validate, warnings};
pub use yaml::{REDACTED, redact, to_yaml};

/// Loads `paths` with the `--set` overrides `sets` (see [`load_all`]) and validates the result
/// against `r`: every problem of the files, structural and per component, in one list.
pub fn check(
    paths: &[std::path::PathBuf],
    sets: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    r: &crate::registry::Registry,
) -> Result<Config, Vec<ConfigError>> {
    let Loaded { config, mut errors, .. } = load_all(paths, sets, env);
    match config {
        Some(c) => {
            // A value the loader already refused (an unset variable) is not checked again.
            let refused: Vec<String> = errors.iter().map(|e| e.key.clone()).filter(|k| !k.is_empty()).collect();
            let covered = |k: &str| {
                refused.iter().any(|r| k == r || k.strip_prefix(r.as_str()).is_some_and(|t| t.starts_with(['.', '['])))
            };
            errors.extend(validate(&c, r).into_iter().filter(|e| !covered(&e.key)));
            if errors.is_empty() { Ok(c) } else { Err(errors) }
        }
        None => Err(errors),
    }
}

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
    /// The settings as the factory parsed them when the configuration was validated (or the
    /// graph first built it), so that they are parsed once however many pipelines use it.
    pub parsed: ParsedSettings,
}

/// A component's [`Parsed`](crate::component::Parsed) settings, kept with the factory and the
/// settings they were parsed by and from: reused only for that same factory and those same settings.
#[derive(Default)]
pub struct ParsedSettings(parking_lot::Mutex<Option<(usize, serde_json::Value, crate::component::Parsed)>>);

impl Clone for ParsedSettings {
    fn clone(&self) -> Self {
        ParsedSettings(parking_lot::Mutex::new(self.0.lock().clone()))
    }
}

impl fmt::Debug for ParsedSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.lock().is_some() { "ParsedSettings(parsed)" } else { "ParsedSettings(none)" })
    }
}

impl ParsedSettings {
    /// The address identifying a factory (its `Arc`'s data pointer).
    pub fn factory_key<F: ?Sized>(f: &Arc<F>) -> usize {
        Arc::as_ptr(f) as *const () as usize
    }

    /// What `factory` parsed from `settings`, if kept.
    pub fn get(&self, factory: usize, settings: &serde_json::Value) -> Option<crate::component::Parsed> {
        self.0.lock().as_ref().filter(|(k, v, _)| *k == factory && v == settings).map(|(_, _, p)| p.clone())
    }

    /// Keeps what `factory` parsed from `settings` (replacing what was kept).
    pub fn set(&self, factory: usize, settings: &serde_json::Value, parsed: crate::component::Parsed) {
        *self.0.lock() = Some((factory, settings.clone(), parsed));
    }
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
    /// `service.telemetry.logs.encoding`.
    pub logs_encoding: LogEncoding,
    /// `service.telemetry.logs.output_paths`: where log lines go (default `[stderr]`).
    pub logs_outputs: Vec<LogOutput>,
    /// `service.telemetry.logs.initial_fields`: fields added to every log line, in file order.
    pub logs_initial_fields: Vec<(String, serde_json::Value)>,
    /// `service.telemetry.metrics.readers[].periodic`: OTLP push of the agent's own metrics.
    pub periodic_readers: Vec<PeriodicReaderConfig>,
    /// `service.telemetry.metrics.level` (default `normal`; `none` turns the endpoint off).
    pub metrics_level: MetricsLevel,
    /// `service.telemetry.resource`: attributes of the agent's own telemetry, in file order; a
    /// `null` value removes a default attribute.
    pub resource: Vec<(String, Option<String>)>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            metrics_address: Some("127.0.0.1:8888".into()),
            metrics_tls: None,
            logs_level: None,
            logs_encoding: LogEncoding::Console,
            logs_outputs: vec![LogOutput::Stderr],
            logs_initial_fields: Vec::new(),
            periodic_readers: Vec::new(),
            metrics_level: MetricsLevel::Normal,
            resource: Vec::new(),
        }
    }
}

/// otelcol's `service.telemetry.logs.encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogEncoding {
    /// Human-readable lines (the default).
    #[default]
    Console,
    /// One JSON object per line.
    Json,
}

/// One of `service.telemetry.logs.output_paths`, as zap reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOutput {
    /// `stderr`.
    Stderr,
    /// `stdout`.
    Stdout,
    /// A file path (or `file://` URL), opened for appending and created when missing.
    File(std::path::PathBuf),
}

/// One `readers[].periodic` entry: collect every `interval`, push with `exporter`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodicReaderConfig {
    /// Time between the start of two exports (`interval`, milliseconds in otelcol; default 60 s).
    pub interval: Duration,
    /// Deadline of one collection and export (`timeout`, default 30 s).
    pub timeout: Duration,
    /// `exporter.otlp`.
    pub exporter: OtlpPushConfig,
}

/// The OTLP wire protocol of a push exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `grpc`.
    Grpc,
    /// `http/protobuf` (otelcol's default).
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
}

/// Aggregation temporality asked of a push exporter (`temporality_preference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Temporality {
    /// Sums from the start of the process (the default).
    Cumulative,
    /// Sums since the previous export.
    Delta,
    /// Delta for synchronous counters, cumulative otherwise (the agent's are all observed).
    LowMemory,
}

/// `readers[].periodic.exporter.otlp`, as otelcol's configuration schema has it.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpPushConfig {
    /// `protocol`.
    pub protocol: OtlpProtocol,
    /// `endpoint`: `http(s)://host:port[/path]` (an HTTP endpoint without a path gets `/v1/metrics`).
    pub endpoint: String,
    /// `headers` (list of `{name, value}` or a map) and `headers_list` (`k=v,k2=v2`).
    pub headers: Vec<(String, String)>,
    /// `compression: gzip` (default none).
    pub gzip: bool,
    /// Deadline of one export request (`timeout`, default 10 s).
    pub timeout: Duration,
    /// `insecure`: plain text for an endpoint without `https://`.
    pub insecure: bool,
    /// `certificate`: CA file to verify the server with.
    pub certificate: Option<String>,
    /// `client_certificate` and `client_key`: client identity for mutual TLS.
    pub client_certificate: Option<String>,
    /// See `client_certificate`.
    pub client_key: Option<String>,
    /// `temporality_preference`.
    pub temporality: Temporality,
}

impl OtlpPushConfig {
    /// Whether the connection uses TLS: `https://` always, `http://` never, else unless `insecure`.
    pub fn use_tls(&self) -> bool {
        if self.endpoint.starts_with("https://") {
            true
        } else if self.endpoint.starts_with("http://") {
            false
        } else {
            !self.insecure
        }
    }
}

/// otelcol's `service.telemetry.metrics.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsLevel {
    /// No self-metrics endpoint.
    None,
    /// otelcol: the essential metrics only.
    Basic,
    /// otelcol's default.
    #[default]
    Normal,
    /// otelcol: everything, with more attributes.
    Detailed,
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
    /// Settings accepted that do not do all they would in otelcol, each located (reported by
    /// [`warnings`]).
    pub load_warnings: Vec<ConfigError>,
}
