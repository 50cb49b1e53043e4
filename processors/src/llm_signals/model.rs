//! Which (model, version, instance) group a span or a scraped point belongs to.
//!
//! Model: the data's own model (span attributes in `model_attributes` order, or the scrape label
//! `model_name`) → resource attribute `gen_ai.request.model` → `tgi_model` (TGI data only) →
//! `default_model` → resource `service.name` (unless the SDK default `unknown_service…`) →
//! `"unknown"`. Service: resource `service.name`. Version: for scraped data its own label
//! `service.version` / `service_version` (a target label set by `static_configs` or
//! `relabel_configs`), then, for both sources, resource `service.version`. Instance, one rule
//! for both sources: resource `service.instance.id`, else `server.address[:server.port]` (the
//! prometheus receiver sets both to the target's `host:port`), else empty.
//! Identity: the resource attributes of `identity_attributes` present (`k8s.pod.name`, ...),
//! copied onto the outputs so that a dashboard or an alert can say which pod.

use arrow_array::{Array, MapArray, RecordBatch, StringArray, UInt32Array};
use inferwatch_core::arrow::ConvError;
use inferwatch_core::arrow::anyvalue::AttributesReader;
use inferwatch_core::arrow::schema;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// The model used when nothing names one.
pub const UNKNOWN_MODEL: &str = "unknown";
/// Resource / span attribute naming the model.
pub const MODEL_ATTRIBUTE: &str = "gen_ai.request.model";
/// Scrape labels naming the version of the scraped server, tried in order (a target label: the
/// Prometheus form cannot hold a dot).
pub const VERSION_LABELS: [&str; 2] = ["service.version", "service_version"];

/// Where a group's signals come from (the `source` attribute of its output points).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Source {
    /// Derived from request spans.
    Spans,
    /// Derived from scraped Prometheus metrics.
    Scrape,
}

impl Source {
    /// The attribute value (`spans`, `scrape`).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Spans => "spans",
            Source::Scrape => "scrape",
        }
    }
}

/// The key of a group of signals.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey {
    /// Spans or scrape.
    pub source: Source,
    /// Model (attribute `gen_ai.request.model`).
    pub model: String,
    /// Version (attribute `service.version`).
    pub version: String,
    /// Instance (attribute `service.instance.id`).
    pub instance: String,
    /// Service (attribute `service.name`: the source resource's, empty when unset).
    pub service: String,
    /// Identity resource attributes present (`k8s.pod.name`, ...), in `identity_attributes` order.
    pub identity: Vec<(String, String)>,
}

impl GroupKey {
    /// The point attributes of every output of this group: the same keys for both sources
    /// (`gen_ai.request.model`, `service.name`, `service.version`, `service.instance.id`,
    /// `source`, then the identity attributes present).
    pub fn attributes(&self) -> Vec<KeyValue> {
        vec![
            string_kv(MODEL_ATTRIBUTE, &self.model),
            string_kv(schema::SERVICE_NAME, &self.service),
            string_kv(schema::SERVICE_VERSION, &self.version),
            string_kv(schema::SERVICE_INSTANCE_ID, &self.instance),
            string_kv("source", self.source.as_str()),
        ]
        .into_iter()
        .chain(self.identity.iter().map(|(k, v)| string_kv(k, v)))
        .collect()
    }
}

/// A string attribute.
pub fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(Value::StringValue(value.to_string())) }),
        key_strindex: 0,
    }
}

/// A scalar attribute value rendered as a string (strings as is, numbers and bools printed).
pub fn scalar_string(v: Option<&AnyValue>) -> Option<String> {
    match v.and_then(|v| v.value.as_ref())? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// What a row's resource says about the group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceInfo {
    /// `service.name`, when set and not the SDK's `unknown_service…` default.
    pub service_name: Option<String>,
    /// `service.name` as set (empty when unset).
    pub service: String,
    /// Resource attribute `gen_ai.request.model`, when set and not empty.
    pub model: Option<String>,
    /// `service.version` (empty when unset).
    pub version: String,
    /// `service.instance.id`, else `server.address[:server.port]`, else empty.
    pub instance: String,
    /// The identity attributes present and not empty, in configuration order.
    pub identity: Vec<(String, String)>,
}

/// The rules that name a group's model (from the configuration).
#[derive(Debug, Clone, Default)]
pub struct ModelRules {
    /// Span attributes tried in order.
    pub attributes: Vec<String>,
    /// Model when nothing else names one (empty: none).
    pub default_model: String,
    /// Model of TGI data that carries none (empty: none).
    pub tgi_model: String,
    /// Resource attributes copied onto the outputs and part of the group (`k8s.pod.name`, ...).
    pub identity: Vec<String>,
}

fn nonempty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

impl ModelRules {
    /// The model of data naming `own` (its span attribute or scrape label), from TGI or not.
    pub fn resolve(&self, own: Option<&str>, tgi: bool, res: &ResourceInfo) -> String {
        own.and_then(nonempty)
            .or(res.model.as_deref())
            .or(if tgi { nonempty(&self.tgi_model) } else { None })
            .or(nonempty(&self.default_model))
            .or(res.service_name.as_deref())
            .unwrap_or(UNKNOWN_MODEL)
            .to_string()
    }

    /// The group key of data from `source` naming `own` model and `own_version` (a scrape label).
    pub fn key(
        &self,
        source: Source,
        own: Option<&str>,
        own_version: Option<&str>,
        tgi: bool,
        res: &ResourceInfo,
    ) -> GroupKey {
        GroupKey {
            source,
            model: self.resolve(own, tgi, res),
            version: own_version.and_then(nonempty).unwrap_or(&res.version).to_string(),
            instance: res.instance.clone(),
            service: res.service.clone(),
            identity: res.identity.clone(),
        }
    }
}

/// A column of `batch` of type `T`: `None` when absent, an error when of another type.
pub fn opt_column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<Option<&'a T>, ConvError> {
    match batch.column_by_name(name) {
        None => Ok(None),
        Some(c) => c
            .as_any()
            .downcast_ref::<T>()
            .map(Some)
            .ok_or_else(|| ConvError::Schema(format!("llm_signals: column {name} has an unexpected type"))),
    }
}

/// A required column of `batch` of type `T`.
pub fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ConvError> {
    opt_column(batch, name)?.ok_or_else(|| ConvError::Schema(format!("llm_signals: no column {name}")))
}

/// The string at `row` of an optional string column (null and absent read as `None`).
pub fn str_at(c: Option<&StringArray>, row: usize) -> Option<&str> {
    c.filter(|c| row < c.len() && c.is_valid(row)).map(|c| c.value(row))
}

/// Reads [`ResourceInfo`] of rows, once per resource index.
pub struct ResourceReader<'a> {
    index: Option<&'a UInt32Array>,
    name: Option<&'a StringArray>,
    version: Option<&'a StringArray>,
    instance: Option<&'a StringArray>,
    attrs: Option<AttributesReader<'a>>,
    identity: &'a [String],
    cache: Option<(u32, Rc<ResourceInfo>)>,
}

impl<'a> ResourceReader<'a> {
    /// A reader over the resource columns of `batch` (metrics or spans schema), reading the
    /// `identity` resource attributes too.
    pub fn new(batch: &'a RecordBatch, identity: &'a [String]) -> Result<Self, ConvError> {
        Ok(ResourceReader {
            index: opt_column(batch, schema::RESOURCE_INDEX)?,
            name: opt_column(batch, schema::SERVICE_NAME)?,
            version: opt_column(batch, schema::SERVICE_VERSION)?,
            instance: opt_column(batch, schema::SERVICE_INSTANCE_ID)?,
            attrs: opt_column::<MapArray>(batch, schema::RESOURCE_ATTRIBUTES)?
                .map(AttributesReader::new)
                .transpose()?,
            identity,
            cache: None,
        })
    }

    /// The resource info of `row`.
    pub fn info(&mut self, row: usize) -> Result<Rc<ResourceInfo>, ConvError> {
        let idx = self.index.filter(|c| row < c.len()).map(|c| c.value(row));
        if let (Some(i), Some((ci, info))) = (idx, &self.cache)
            && *ci == i
        {
            return Ok(info.clone());
        }
        let info = Rc::new(self.read(row)?);
        if let Some(i) = idx {
            self.cache = Some((i, info.clone()));
        }
        Ok(info)
    }

    fn read(&self, row: usize) -> Result<ResourceInfo, ConvError> {
        let attrs = match &self.attrs {
            Some(r) => r.read(row)?,
            None => Vec::new(),
        };
        let attr = |key: &str| attrs.iter().find(|kv| kv.key == key).and_then(|kv| scalar_string(kv.value.as_ref()));
        // Promoted columns hold string values; a non-string value stays in the map.
        let typed = |c: Option<&StringArray>, key: &str| str_at(c, row).map(str::to_string).or_else(|| attr(key));
        let service = typed(self.name, schema::SERVICE_NAME).unwrap_or_default();
        let service_name = Some(service.clone()).filter(|n| !n.is_empty() && !n.starts_with("unknown_service"));
        let instance = typed(self.instance, schema::SERVICE_INSTANCE_ID)
            .filter(|s| !s.is_empty())
            .or_else(|| {
                let address = attr("server.address").filter(|a| !a.is_empty())?;
                Some(match attr("server.port").filter(|p| !p.is_empty()) {
                    Some(port) => format!("{address}:{port}"),
                    None => address,
                })
            })
            .unwrap_or_default();
        let identity =
            self.identity.iter().filter_map(|k| attr(k).filter(|v| !v.is_empty()).map(|v| (k.clone(), v))).collect();
        Ok(ResourceInfo {
            service_name,
            service,
            identity,
            model: attr(MODEL_ATTRIBUTE).filter(|m| !m.is_empty()),
            version: typed(self.version, schema::SERVICE_VERSION).unwrap_or_default(),
            instance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(model: Option<&str>, service: Option<&str>) -> ResourceInfo {
        ResourceInfo {
            service_name: service.map(str::to_string),
            model: model.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn model_resolution_order() {
        let rules = ModelRules {
            attributes: vec![],
            default_model: "dflt".into(),
            tgi_model: "tgi-m".into(),
            identity: vec![],
        };
        let r = res(Some("res-m"), Some("svc"));
        assert_eq!(rules.resolve(Some("own"), true, &r), "own");
        assert_eq!(rules.resolve(Some(""), true, &r), "res-m");
        assert_eq!(rules.resolve(None, true, &res(None, Some("svc"))), "tgi-m");
        assert_eq!(rules.resolve(None, false, &res(None, Some("svc"))), "dflt");
        let bare = ModelRules::default();
        assert_eq!(bare.resolve(None, true, &res(None, Some("svc"))), "svc");
        assert_eq!(bare.resolve(None, false, &res(None, None)), UNKNOWN_MODEL);
    }
}
