//! Processor `resourcedetection`: detects the agent's environment once at start (detectors
//! `env`, `system`, `k8s_downward_api`) and adds it to the resource of everything passing.
//!
//! As otelcol: detectors run in the order listed and the first to set an attribute wins;
//! `override: true` (the default) replaces an attribute the data already has, `false` keeps
//! it. Detection happens when the processor is built; the attributes do not change after.
//! Resources are rewritten in place on encoded payloads (see [`crate::resource::map_resources`]).

pub mod detectors;

use crate::resource::map_resources;
use async_trait::async_trait;
use detectors::{DownwardApiConfig, Env, SystemConfig};
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, PathSeg, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::GoDuration;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of `resourcedetection` (otelcol's keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceDetectionConfig {
    /// Detectors in order: `env`, `system`, `k8s_downward_api`.
    pub detectors: Vec<String>,
    /// Whether detected values replace those already on the data (default true).
    #[serde(rename = "override")]
    pub override_existing: bool,
    /// Time allowed for detection (default 5s; the detectors here only read the environment and local files).
    pub timeout: GoDuration,
    /// otelcol's periodic re-detection; only 0 (detect once at start) is supported.
    pub refresh_interval: GoDuration,
    /// otelcol's deprecated allow-list: when set, only these detected attributes are added.
    pub attributes: Option<Vec<String>>,
    /// Settings of the `system` detector.
    pub system: SystemConfig,
    /// Settings of the `k8s_downward_api` detector.
    pub k8s_downward_api: DownwardApiConfig,
}

impl Default for ResourceDetectionConfig {
    fn default() -> Self {
        ResourceDetectionConfig {
            detectors: Vec::new(),
            override_existing: true,
            timeout: GoDuration(Duration::from_secs(5)),
            refresh_interval: GoDuration(Duration::ZERO),
            attributes: None,
            system: SystemConfig::default(),
            k8s_downward_api: DownwardApiConfig::default(),
        }
    }
}

/// The detectors inferwatch has.
pub const DETECTORS: [&str; 3] = ["env", "system", "k8s_downward_api"];

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Checked {
    detectors: Vec<String>,
    override_existing: bool,
    attributes: Option<Vec<String>>,
    system: Vec<String>,
    downward: Vec<(String, String)>,
}

fn under(section: &str, rest: &str, message: String) -> FieldError {
    let mut path = vec![PathSeg::Key(section.into())];
    // Attribute names hold dots: split the first segment only (`resource_attributes.host.id`).
    match rest.split_once('.') {
        Some((a, b)) => {
            path.push(PathSeg::Key(a.into()));
            path.push(match b.parse::<usize>() {
                Ok(i) => PathSeg::Index(i),
                Err(_) => PathSeg::Key(b.into()),
            });
        }
        None => path.push(PathSeg::Key(rest.into())),
    }
    FieldError { path, message }
}

impl ResourceDetectionConfig {
    /// Checks the settings as otelcol does, refusing detectors and options inferwatch lacks.
    pub fn check(&self) -> Result<Checked, FieldError> {
        for (i, d) in self.detectors.iter().enumerate() {
            if !DETECTORS.contains(&d.as_str()) {
                return Err(FieldError {
                    path: vec![PathSeg::Key("detectors".into()), PathSeg::Index(i)],
                    message: format!("detector {d:?} is not available in inferwatch (one of {})", DETECTORS.join(", ")),
                });
            }
            if self.detectors[..i].contains(d) {
                return Err(FieldError {
                    path: vec![PathSeg::Key("detectors".into()), PathSeg::Index(i)],
                    message: format!("detector {d:?} is listed twice"),
                });
            }
        }
        if self.timeout.0.is_zero() {
            return Err(FieldError::at("timeout", "must be greater than zero"));
        }
        if !self.refresh_interval.0.is_zero() {
            return Err(FieldError::at(
                "refresh_interval",
                "periodic re-detection is not supported: inferwatch detects once at start (set 0s or remove it)",
            ));
        }
        let system = self.system.check().map_err(|(p, m)| under("system", &p, m))?;
        let downward = self.k8s_downward_api.check().map_err(|(p, m)| under("k8s_downward_api", &p, m))?;
        Ok(Checked {
            detectors: self.detectors.clone(),
            override_existing: self.override_existing,
            attributes: self.attributes.clone(),
            system,
            downward,
        })
    }
}

impl Checked {
    /// Runs the detectors over `env`: the attributes to add, first detector first.
    pub fn detect(&self, env: Env<'_>) -> Vec<KeyValue> {
        let mut out: Vec<(String, String)> = Vec::new();
        for d in &self.detectors {
            let found = match d.as_str() {
                "env" => detectors::detect_env(env),
                "system" => detectors::detect_system(&self.system),
                "k8s_downward_api" => detectors::detect_downward_api(&self.downward, env),
                _ => Vec::new(),
            };
            for (k, v) in found {
                if self.attributes.as_ref().is_some_and(|a| !a.contains(&k)) {
                    continue;
                }
                if !out.iter().any(|(o, _)| *o == k) {
                    out.push((k, v));
                }
            }
        }
        out.into_iter()
            .map(|(k, v)| KeyValue {
                key: k,
                value: Some(AnyValue { value: Some(Value::StringValue(v)) }),
                key_strindex: 0,
            })
            .collect()
    }
}

/// Factory of `resourcedetection`.
pub struct ResourceDetectionFactory;

impl ProcessorFactory for ResourceDetectionFactory {
    fn type_name(&self) -> &'static str {
        "resourcedetection"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(parse_config::<ResourceDetectionConfig>(cfg)?.check()?))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?;
        let detected = checked.detect(&|k| std::env::var(k).ok());
        let keys: Vec<&str> = detected.iter().map(|kv| kv.key.as_str()).collect();
        tracing::info!(processor = %ctx.id, %signal, attributes = ?keys, "resources detected");
        Ok(Arc::new(ResourceDetection::new(detected, checked.override_existing, next)))
    }
}

/// The running processor: adds the detected attributes to every resource.
pub struct ResourceDetection {
    detected: Vec<KeyValue>,
    override_existing: bool,
    next: ConsumerRef,
}

impl ResourceDetection {
    /// A processor adding `detected` (replacing existing values when `override_existing`).
    pub fn new(detected: Vec<KeyValue>, override_existing: bool, next: ConsumerRef) -> Self {
        ResourceDetection { detected, override_existing, next }
    }

    /// The attributes it adds.
    pub fn detected(&self) -> &[KeyValue] {
        &self.detected
    }

    /// Adds the detected attributes to every resource of `data`.
    pub fn process(&self, data: Payload) -> Payload {
        if self.detected.is_empty() {
            return data;
        }
        map_resources(data, &mut |r| {
            let mut changed = false;
            for kv in &self.detected {
                match r.attributes.iter_mut().find(|a| a.key == kv.key) {
                    Some(a) if self.override_existing && a.value != kv.value => {
                        a.value = kv.value.clone();
                        changed = true;
                    }
                    Some(_) => {}
                    None => {
                        r.attributes.push(kv.clone());
                        changed = true;
                    }
                }
            }
            changed
        })
        .0
    }
}

#[async_trait]
impl Consumer for ResourceDetection {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.next.consume(self.process(data)).await
    }
}

#[async_trait]
impl Node for ResourceDetection {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
