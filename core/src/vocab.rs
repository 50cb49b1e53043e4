//! Core's vocabulary, a leaf module: component kinds and ids, configuration paths and field
//! errors, the typed parse of a component's settings, and a component's build/start error.
//! It imports nothing else of this crate, so every other module can use it without a circle.

use serde::de::DeserializeOwned;
use std::fmt;

/// The five kinds of components a configuration defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentKind {
    /// Takes data in from outside.
    Receiver,
    /// Transforms data inside a pipeline.
    Processor,
    /// Sends data out.
    Exporter,
    /// Exporter of one pipeline and receiver of another.
    Connector,
    /// Runs beside the pipelines (health check, storage).
    Extension,
}

impl ComponentKind {
    /// The top-level configuration key for this kind (`receivers`, ...).
    pub fn section(self) -> &'static str {
        match self {
            ComponentKind::Receiver => "receivers",
            ComponentKind::Processor => "processors",
            ComponentKind::Exporter => "exporters",
            ComponentKind::Connector => "connectors",
            ComponentKind::Extension => "extensions",
        }
    }

    /// Singular name (`receiver`, ...), as used in self-metric labels.
    pub fn singular(self) -> &'static str {
        match self {
            ComponentKind::Receiver => "receiver",
            ComponentKind::Processor => "processor",
            ComponentKind::Exporter => "exporter",
            ComponentKind::Connector => "connector",
            ComponentKind::Extension => "extension",
        }
    }
}

/// A component id in otelcol's `type[/name]` form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentId {
    /// The component type (factory name), e.g. `otlp`.
    pub type_name: String,
    /// The optional instance name after the slash.
    pub name: Option<String>,
}

/// Why a `type[/name]` string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid component id {0:?}: expected type[/name] with a non-empty type of letters, digits and '_'")]
pub struct IdError(pub String);

impl ComponentId {
    /// Parses `type[/name]`.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let (t, n) = match s.split_once('/') {
            Some((t, n)) => (t, Some(n)),
            None => (s, None),
        };
        let type_ok = !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let name_ok = n.is_none_or(|n| !n.is_empty() && !n.contains(char::is_whitespace));
        if !type_ok || !name_ok {
            return Err(IdError(s.to_string()));
        }
        Ok(ComponentId { type_name: t.to_string(), name: n.map(str::to_string) })
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{}/{}", self.type_name, n),
            None => f.write_str(&self.type_name),
        }
    }
}

/// One step of a path inside a component's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A map key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A configuration problem inside one component's settings, located by path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    /// Path from the component's settings root to the offending value or key.
    pub path: Vec<PathSeg>,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// An error at `path` (dotted keys, e.g. `protocols.grpc.endpoint`).
    pub fn at(path: &str, message: impl Into<String>) -> Self {
        let path = path.split('.').filter(|s| !s.is_empty()).map(|s| PathSeg::Key(s.to_string())).collect();
        FieldError { path, message: message.into() }
    }

    /// The path written with dots, indexes as numbers (`actions.0.value`).
    pub fn dotted(&self) -> String {
        let segs: Vec<String> = self
            .path
            .iter()
            .map(|p| match p {
                PathSeg::Key(k) => k.clone(),
                PathSeg::Index(i) => i.to_string(),
            })
            .collect();
        segs.join(".")
    }
}

/// Deserializes a component's settings (JSON form of the YAML) into `T`, with the path of any error.
///
/// `null` (a component listed with no settings) deserializes as an empty map, so defaults apply.
pub fn parse_config<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, FieldError> {
    let empty = serde_json::Value::Object(Default::default());
    let v = if value.is_null() { &empty } else { value };
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| {
        let path = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(PathSeg::Key(key.clone())),
                serde_path_to_error::Segment::Seq { index } => Some(PathSeg::Index(*index)),
                serde_path_to_error::Segment::Enum { variant } => Some(PathSeg::Key(variant.clone())),
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        FieldError { path, message: e.into_inner().to_string() }
    })
}

/// A failure to build or start a component.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The settings are invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] FieldError),
    /// The component could not start (port in use, bad certificate, ...).
    #[error("{0}")]
    Start(String),
}

/// A component's settings as its factory parsed and checked them (the factory's own typed
/// config), made once when the configuration is loaded and handed to every `build`.
pub type Parsed = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// The typed config inside `p`; an internal error naming `T` when `p` holds another type
/// (settings parsed by another factory).
pub fn typed<T: 'static>(p: &Parsed) -> Result<&T, ComponentError> {
    p.downcast_ref::<T>().ok_or_else(|| {
        ComponentError::Start(format!("internal error: the parsed settings are not a {}", std::any::type_name::<T>()))
    })
}

/// The `Parsed` of a factory that only implements `validate`: the raw settings, once checked.
pub fn parsed_raw(check: Result<(), FieldError>, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
    check.map(|()| std::sync::Arc::new(cfg.clone()) as Parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse() {
        assert_eq!(ComponentId::parse("otlp").unwrap().to_string(), "otlp");
        let id = ComponentId::parse("otlp/tempo-1").unwrap();
        assert_eq!(id.type_name, "otlp");
        assert_eq!(id.name.as_deref(), Some("tempo-1"));
        assert!(ComponentId::parse("").is_err());
        assert!(ComponentId::parse("otlp/").is_err());
        assert!(ComponentId::parse("ot lp").is_err());
    }

    #[test]
    fn parse_config_reports_path() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Inner {
            port: u16,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Outer {
            inner: Inner,
        }
        let e = parse_config::<Outer>(&serde_json::json!({"inner": {"port": 99999}})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("inner".into()), PathSeg::Key("port".into())]);
        assert!(e.message.contains("99999"), "{}", e.message);
    }
}
