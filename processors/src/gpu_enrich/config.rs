//! Settings of `gpu_enrich` and their checked form.

use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::time::Duration;

/// NVML `clocks event reasons` bits that mean the GPU is held back: SW power cap (0x4), HW slowdown
/// (0x8), SW thermal (0x20), HW thermal (0x40), HW power brake (0x80). Idle, application clocks,
/// sync boost and display clock are not throttling.
pub const DEFAULT_THROTTLE_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Names of the GPU sample metrics read from the metrics pipeline (the `nvml` receiver's OTel names).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuMetricNames {
    /// Memory used, bytes (default `hw.gpu.memory.usage`).
    pub memory_used: String,
    /// Utilisation, ratio 0..1 (default `hw.gpu.utilization`).
    pub utilization: String,
    /// Power draw, W (default `hw.power`, the name the `nvml` receiver emits).
    pub power: String,
    /// Throttle flag gauge, 0/1, one point per reason (default `hw.gpu.throttle`).
    pub throttle: String,
    /// Clock-event-reasons bitmask gauge (default `nvml.clock_event_reasons`).
    pub throttle_reasons: String,
    /// Bits of `throttle_reasons` that count as throttled (default 0xEC).
    pub throttle_reasons_mask: u64,
    /// Per-process GPU memory, with the process id attribute (default `process.gpu.memory.usage`).
    pub process_memory: String,
}

impl Default for GpuMetricNames {
    fn default() -> Self {
        GpuMetricNames {
            memory_used: "hw.gpu.memory.usage".into(),
            utilization: "hw.gpu.utilization".into(),
            power: "hw.power".into(),
            throttle: "hw.gpu.throttle".into(),
            throttle_reasons: "nvml.clock_event_reasons".into(),
            throttle_reasons_mask: DEFAULT_THROTTLE_MASK,
            process_memory: "process.gpu.memory.usage".into(),
        }
    }
}

/// Attribute keys read from samples and items (point attributes first, then resource attributes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttributeKeys {
    /// Keys naming the host, tried in order; none present = the agent's host (default `[host.name]`).
    pub host: Vec<String>,
    /// GPU UUID (default `gpu.uuid`).
    pub gpu_uuid: String,
    /// GPU index (default `gpu.index`); neither UUID nor index = GPU 0.
    pub gpu_index: String,
    /// Process id on per-process samples (default `process.pid`).
    pub process_pid: String,
    /// Process name on per-process samples (default `process.executable.name`).
    pub process_name: String,
}

impl Default for AttributeKeys {
    fn default() -> Self {
        AttributeKeys {
            host: vec!["host.name".into()],
            gpu_uuid: "gpu.uuid".into(),
            gpu_index: "gpu.index".into(),
            process_pid: "process.pid".into(),
            process_name: "process.executable.name".into(),
        }
    }
}

/// A GPU as configured: an index or a UUID (or UUID prefix, as `CUDA_VISIBLE_DEVICES` allows).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum GpuRefSetting {
    /// `0`, `1`, ...
    Index(u32),
    /// `"0"` or `"GPU-8a3c..."`.
    Text(String),
}

/// A resolved GPU reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    /// The NVML index.
    Index(i64),
    /// A UUID or a unique prefix of one (`GPU-8a3c`).
    Uuid(String),
}

impl GpuRef {
    /// Parses one entry: digits are an index, anything else a UUID (prefix); `None` when empty or negative.
    pub fn parse(s: &str) -> Option<GpuRef> {
        let s = s.trim();
        if s.is_empty() || s.starts_with('-') {
            return None;
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse().ok().map(GpuRef::Index);
        }
        if s.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            return None; // "1x": CUDA stops at an invalid entry
        }
        Some(GpuRef::Uuid(s.to_string()))
    }

    /// True when this reference names the GPU with `uuid` / `index`.
    pub fn matches(&self, uuid: Option<&str>, index: Option<i64>) -> bool {
        match self {
            GpuRef::Index(i) => index == Some(*i),
            GpuRef::Uuid(p) => uuid.is_some_and(|u| u.starts_with(p.as_str())),
        }
    }
}

/// Parses a `CUDA_VISIBLE_DEVICES` value as CUDA does: entries up to the first invalid one.
/// `None` when unset, empty or listing nothing valid (then the next source of the GPU set applies).
pub fn parse_cuda_visible_devices(value: Option<&str>) -> Option<Vec<GpuRef>> {
    let v = value?.trim();
    let refs: Vec<GpuRef> = v.split(',').map_while(GpuRef::parse).collect();
    (!refs.is_empty()).then_some(refs)
}

/// The fixed GPU set: `gpus` from the config, else `CUDA_VISIBLE_DEVICES` (passed in, not read here).
pub fn static_gpu_set(gpus: &[GpuRef], cuda_visible_devices: Option<&str>) -> Option<Vec<GpuRef>> {
    if !gpus.is_empty() {
        return Some(gpus.to_vec());
    }
    parse_cuda_visible_devices(cuda_visible_devices)
}

/// Settings of `gpu_enrich`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuEnrichConfig {
    /// Names of the GPU sample metrics.
    pub gpu_metrics: GpuMetricNames,
    /// Attribute keys of hosts, GPUs and processes.
    pub keys: AttributeKeys,
    /// Oldest sample (before the item's event time) that may still be joined (default 2s).
    pub tolerance: GoDuration,
    /// GPUs of the server, by index or UUID (default empty: `CUDA_VISIBLE_DEVICES`, then the process list, then all).
    pub gpus: Vec<GpuRefSetting>,
    /// Process id of the inference server, matched on per-process GPU memory samples.
    pub server_pid: Option<i64>,
    /// Executable name of the inference server, matched on per-process GPU memory samples.
    pub server_process: Option<String>,
    /// This agent's host name, for items and samples naming none (default: the system's).
    pub host_name: Option<String>,
    /// Prefix of the added attributes (default `gpu.`).
    pub attributes_prefix: String,
    /// Samples kept per GPU and measurement (default 4096).
    pub max_samples_per_gpu: usize,
    /// Metric points to enrich: exact names, or prefixes ending in `*` (default `[llm.*]`).
    pub metrics: Vec<String>,
}

impl Default for GpuEnrichConfig {
    fn default() -> Self {
        GpuEnrichConfig {
            gpu_metrics: GpuMetricNames::default(),
            keys: AttributeKeys::default(),
            tolerance: GoDuration(Duration::from_secs(2)),
            gpus: Vec::new(),
            server_pid: None,
            server_process: None,
            host_name: None,
            attributes_prefix: "gpu.".into(),
            max_samples_per_gpu: 4096,
            metrics: vec!["llm.*".into()],
        }
    }
}

/// Most samples per GPU and measurement a configuration may ask for.
pub const MAX_SAMPLES_LIMIT: usize = 1 << 20;

/// Which metric points get enriched.
#[derive(Debug, Clone, Default)]
pub struct MetricMatcher {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl MetricMatcher {
    /// Builds from patterns (`name` or `prefix*`).
    pub fn new(patterns: &[String]) -> Self {
        let mut m = MetricMatcher::default();
        for p in patterns {
            match p.strip_suffix('*') {
                Some(prefix) => m.prefixes.push(prefix.to_string()),
                None => m.exact.push(p.clone()),
            }
        }
        m
    }

    /// True when points of metric `name` are enriched.
    pub fn matches(&self, name: &str) -> bool {
        self.exact.iter().any(|e| e == name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Keys of the added attributes.
#[derive(Debug, Clone)]
pub struct OutputKeys {
    /// Memory used, bytes (sum over the GPUs).
    pub memory_used: String,
    /// Utilisation (mean over the GPUs).
    pub utilization: String,
    /// Power, W (sum over the GPUs).
    pub power: String,
    /// Any GPU throttled.
    pub throttled: String,
    /// GPUs joined.
    pub count: String,
}

impl OutputKeys {
    /// The keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        OutputKeys {
            memory_used: format!("{prefix}memory.used"),
            utilization: format!("{prefix}utilization"),
            power: format!("{prefix}power"),
            throttled: format!("{prefix}throttled"),
            count: format!("{prefix}count"),
        }
    }
}

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Sample metric names.
    pub names: GpuMetricNames,
    /// Attribute keys read.
    pub keys: AttributeKeys,
    /// Tolerance in nanoseconds.
    pub tolerance_ns: u64,
    /// GPUs from the config (resolved with `CUDA_VISIBLE_DEVICES` at build time).
    pub gpus: Vec<GpuRef>,
    /// Server process id.
    pub server_pid: Option<i64>,
    /// Server executable name.
    pub server_process: Option<String>,
    /// The agent's host name, if configured.
    pub host_name: Option<String>,
    /// Keys of the added attributes.
    pub out: OutputKeys,
    /// Ring capacity.
    pub max_samples: usize,
    /// Metric points enriched.
    pub metrics: MetricMatcher,
}

fn empty_name(path: Vec<PathSeg>) -> FieldError {
    FieldError { path, message: "must not be empty".into() }
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

impl GpuEnrichConfig {
    /// Checks the settings.
    pub fn check(&self) -> Result<Checked, FieldError> {
        let tolerance_ns = u64::try_from(self.tolerance.0.as_nanos())
            .map_err(|_| FieldError::at("tolerance", format!("{} is too long", self.tolerance)))?;
        if self.max_samples_per_gpu == 0 || self.max_samples_per_gpu > MAX_SAMPLES_LIMIT {
            return Err(FieldError::at("max_samples_per_gpu", format!("must be between 1 and {MAX_SAMPLES_LIMIT}")));
        }
        let n = &self.gpu_metrics;
        for (k, v) in [
            ("memory_used", &n.memory_used),
            ("utilization", &n.utilization),
            ("power", &n.power),
            ("throttle", &n.throttle),
            ("throttle_reasons", &n.throttle_reasons),
            ("process_memory", &n.process_memory),
        ] {
            if v.is_empty() {
                return Err(empty_name(vec![key("gpu_metrics"), key(k)]));
            }
        }
        let k = &self.keys;
        for (name, v) in [
            ("gpu_uuid", &k.gpu_uuid),
            ("gpu_index", &k.gpu_index),
            ("process_pid", &k.process_pid),
            ("process_name", &k.process_name),
        ] {
            if v.is_empty() {
                return Err(empty_name(vec![key("keys"), key(name)]));
            }
        }
        if let Some(i) = k.host.iter().position(String::is_empty) {
            return Err(empty_name(vec![key("keys"), key("host"), PathSeg::Index(i)]));
        }
        if self.attributes_prefix.is_empty() {
            return Err(FieldError::at("attributes_prefix", "must not be empty"));
        }
        if let Some(i) = self.metrics.iter().position(|m| m.is_empty() || m == "*") {
            return Err(FieldError {
                path: vec![key("metrics"), PathSeg::Index(i)],
                message: "must be a metric name or a non-empty prefix ending in '*'".into(),
            });
        }
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for (i, g) in self.gpus.iter().enumerate() {
            let r = match g {
                GpuRefSetting::Index(n) => Some(GpuRef::Index(i64::from(*n))),
                GpuRefSetting::Text(s) => GpuRef::parse(s),
            };
            let Some(r) = r else {
                return Err(FieldError {
                    path: vec![key("gpus"), PathSeg::Index(i)],
                    message: "expected a GPU index or UUID".into(),
                });
            };
            gpus.push(r);
        }
        if self.server_process.as_deref() == Some("") {
            return Err(FieldError::at("server_process", "must not be empty"));
        }
        Ok(Checked {
            names: self.gpu_metrics.clone(),
            keys: self.keys.clone(),
            tolerance_ns,
            gpus,
            server_pid: self.server_pid,
            server_process: self.server_process.clone(),
            host_name: self.host_name.clone().filter(|h| !h.is_empty()),
            out: OutputKeys::new(&self.attributes_prefix),
            max_samples: self.max_samples_per_gpu,
            metrics: MetricMatcher::new(&self.metrics),
        })
    }
}

/// The system's host name: /proc/sys/kernel/hostname, /etc/hostname, `$HOSTNAME`, else `localhost`.
pub fn system_host_name() -> String {
    for path in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(s) = std::fs::read_to_string(path) {
            let s = s.trim();
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    std::env::var("HOSTNAME").ok().filter(|h| !h.trim().is_empty()).unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::parse_config;
    use serde_json::json;

    #[test]
    fn cuda_visible_devices_parse_like_cuda() {
        assert_eq!(parse_cuda_visible_devices(Some("2,3")), Some(vec![GpuRef::Index(2), GpuRef::Index(3)]));
        assert_eq!(
            parse_cuda_visible_devices(Some("GPU-8a3c,1")),
            Some(vec![GpuRef::Uuid("GPU-8a3c".into()), GpuRef::Index(1)])
        );
        // CUDA ignores everything from the first invalid entry on.
        assert_eq!(parse_cuda_visible_devices(Some("1,-1,0")), Some(vec![GpuRef::Index(1)]));
        assert_eq!(parse_cuda_visible_devices(Some("")), None);
        assert_eq!(parse_cuda_visible_devices(Some("-1")), None);
        assert_eq!(parse_cuda_visible_devices(None), None);
    }

    #[test]
    fn config_gpus_win_over_the_environment() {
        let gpus = vec![GpuRef::Index(5)];
        assert_eq!(static_gpu_set(&gpus, Some("0,1")), Some(gpus.clone()));
        assert_eq!(static_gpu_set(&[], Some("0,1")), Some(vec![GpuRef::Index(0), GpuRef::Index(1)]));
        assert_eq!(static_gpu_set(&[], None), None);
    }

    #[test]
    fn uuid_prefixes_match() {
        let r = GpuRef::Uuid("GPU-8a".into());
        assert!(r.matches(Some("GPU-8a3c-11"), Some(4)));
        assert!(!r.matches(Some("GPU-9a3c"), Some(4)));
        assert!(!r.matches(None, Some(4)));
        assert!(GpuRef::Index(4).matches(None, Some(4)));
        assert!(!GpuRef::Index(4).matches(Some("GPU-8a"), None));
    }

    #[test]
    fn defaults_and_errors() {
        let c = parse_config::<GpuEnrichConfig>(&json!(null)).unwrap().check().unwrap();
        assert_eq!(c.tolerance_ns, 2_000_000_000);
        assert_eq!(c.out.memory_used, "gpu.memory.used");
        assert!(c.metrics.matches("llm.ttft.p95"));
        assert!(!c.metrics.matches("hw.gpu.memory.usage"));
        let c = parse_config::<GpuEnrichConfig>(&json!({"gpus": [1, "GPU-ab", "2"], "metrics": ["llm.ttft.p95"]}))
            .unwrap()
            .check()
            .unwrap();
        assert_eq!(c.gpus, vec![GpuRef::Index(1), GpuRef::Uuid("GPU-ab".into()), GpuRef::Index(2)]);
        assert!(c.metrics.matches("llm.ttft.p95") && !c.metrics.matches("llm.ttft.p99"));
        let e = parse_config::<GpuEnrichConfig>(&json!({"gpus": [0, "-3"]})).unwrap().check().unwrap_err();
        assert_eq!(e.path, vec![key("gpus"), PathSeg::Index(1)]);
        let e = parse_config::<GpuEnrichConfig>(&json!({"max_samples_per_gpu": 0})).unwrap().check().unwrap_err();
        assert_eq!(e.path, vec![key("max_samples_per_gpu")]);
        let e = parse_config::<GpuEnrichConfig>(&json!({"gpu_metrics": {"power": ""}})).unwrap().check().unwrap_err();
        assert_eq!(e.path, vec![key("gpu_metrics"), key("power")]);
        assert!(parse_config::<GpuEnrichConfig>(&json!({"tolerance": "2x"})).is_err());
        assert!(parse_config::<GpuEnrichConfig>(&json!({"unknown": 1})).is_err());
    }
}
