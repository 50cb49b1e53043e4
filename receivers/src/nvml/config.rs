//! Settings of the `nvml` receiver.

use super::fake::{FakeDevice, FakeSource, Script, h100_sample};
use super::names::Naming;
use super::pod_resources::DEFAULT_SOCKET;
use super::source::{DeviceInfo, ProcessMemory};
use inferwatch_core::component::{FieldError, PathSeg, parse_config};
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::time::Duration;

/// Default time between two samples of each GPU.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);
/// Default window of the derived VRAM peak.
pub const DEFAULT_PEAK_WINDOW: Duration = Duration::from_secs(60);

/// Most fake GPUs `fake_gpus` accepts.
pub const MAX_FAKE_GPUS: u32 = 64;
/// Most entries `fake_processes` accepts.
pub const MAX_FAKE_PROCESSES: usize = 1024;
/// Default time between two `List` calls of the kubelet pod-resources API.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// Default bound of one `List` call.
pub const DEFAULT_POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(5);
/// Default number of pids whose pod is cached.
pub const DEFAULT_MAX_PROCESSES: usize = 4096;

/// Where the readings come from (`source:`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// NVML on this host (default).
    #[default]
    Nvml,
    /// Scripted H100 readings ([`FakeSource`]) for tests and demos on hosts without a GPU.
    Fake,
}

/// One entry of `devices:`: an NVML index or a GPU UUID.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum DeviceSelector {
    /// `0`, `1`, ...
    Index(u32),
    /// `GPU-...` (a string holding a number is read as an index).
    Uuid(String),
}

impl DeviceSelector {
    /// Whether `d` is the selected device.
    pub fn matches(&self, d: &DeviceInfo) -> bool {
        match self {
            DeviceSelector::Index(i) => d.index == *i,
            DeviceSelector::Uuid(s) => match s.trim().parse::<u32>() {
                Ok(i) => d.index == i,
                Err(_) => d.uuid.eq_ignore_ascii_case(s.trim()),
            },
        }
    }
}

/// `receivers: { nvml: {...} }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmlConfig {
    /// Time between samples (default 200ms).
    #[serde(default)]
    pub collection_interval: Option<GoDuration>,
    /// GPUs to sample, by index or UUID; empty = all.
    #[serde(default)]
    pub devices: Vec<DeviceSelector>,
    /// `otel` (`hw.gpu.*`, default) or `dcgm` (dcgm-exporter's `DCGM_FI_DEV_*`).
    #[serde(default)]
    pub naming: Naming,
    /// Label key of the host name in `dcgm` naming: `Hostname` (dcgm-exporter ≤ 4.x, default) or `hostname`.
    #[serde(default = "default_hostname_label")]
    pub dcgm_hostname_label: String,
    /// Path of `libnvidia-ml.so.1`; default: the dynamic loader's search.
    #[serde(default)]
    pub library_path: Option<String>,
    /// Report GPU memory per compute process (default true).
    #[serde(default = "default_true")]
    pub process_metrics: bool,
    /// Window of the derived VRAM peak (default 1m; `0` turns it off).
    #[serde(default)]
    pub peak_window: Option<GoDuration>,
    /// `host.name` (default: the OS host name).
    #[serde(default)]
    pub host_name: Option<String>,
    /// `nvml` (default) or `fake`: scripted GPUs, for tests and demos only.
    #[serde(default)]
    pub source: SourceKind,
    /// Number of GPUs of `source: fake` (default 1).
    #[serde(default = "default_fake_gpus")]
    pub fake_gpus: u32,
    /// The compute processes of `source: fake` (test-only; empty: pid 4242 on every GPU).
    #[serde(default)]
    pub fake_processes: Vec<FakeProcess>,
    /// GPUs and processes → pods (Kubernetes nodes; absent: off).
    #[serde(default)]
    pub pod_attribution: Option<PodAttributionConfig>,
}

/// One scripted compute process of `source: fake` (`fake_processes:`), for tests.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FakeProcess {
    /// Index of the fake GPU it runs on.
    pub gpu: u32,
    /// Its host pid (looked up under `pod_attribution.proc_root`).
    pub pid: u32,
    /// GPU memory it uses, bytes (default 38 GiB).
    #[serde(default = "default_fake_process_bytes")]
    pub used_bytes: u64,
}

fn default_fake_process_bytes() -> u64 {
    38 << 30
}

/// `pod_attribution:` — which pod a GPU and each of its processes belong to.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PodAttributionConfig {
    /// The host's procfs, where `<pid>/cgroup` is read (default `/proc`; `/host/proc` in a pod
    /// that mounts the host's).
    #[serde(default = "default_proc_root")]
    pub proc_root: String,
    /// The kubelet pod-resources socket; empty: not used (cgroups only).
    #[serde(default = "default_socket")]
    pub pod_resources_socket: String,
    /// Time between two `List` calls (default 30s).
    #[serde(default)]
    pub refresh_interval: Option<GoDuration>,
    /// Bound of one `List` call (default 5s).
    #[serde(default)]
    pub timeout: Option<GoDuration>,
    /// Device-plugin resources that are whole GPUs (default `[nvidia.com/gpu]`).
    #[serde(default = "default_resource_names")]
    pub resource_names: Vec<String>,
    /// Most pids whose pod is cached (default 4096; the least recently used go beyond).
    #[serde(default = "default_max_processes")]
    pub max_processes: usize,
}

fn default_proc_root() -> String {
    "/proc".into()
}

fn default_socket() -> String {
    DEFAULT_SOCKET.into()
}

fn default_resource_names() -> Vec<String> {
    vec!["nvidia.com/gpu".into()]
}

fn default_max_processes() -> usize {
    DEFAULT_MAX_PROCESSES
}

impl PodAttributionConfig {
    /// Time between two `List` calls.
    pub fn refresh_interval(&self) -> Duration {
        self.refresh_interval.map_or(DEFAULT_REFRESH_INTERVAL, |d| d.0)
    }

    /// Bound of one `List` call.
    pub fn timeout(&self) -> Duration {
        self.timeout.map_or(DEFAULT_POD_RESOURCES_TIMEOUT, |d| d.0)
    }

    fn check(&self) -> Result<(), FieldError> {
        let at = |field: &str, message: String| FieldError {
            path: vec![PathSeg::Key("pod_attribution".into()), PathSeg::Key(field.into())],
            message,
        };
        if self.proc_root.trim().is_empty() {
            return Err(at("proc_root", "must not be empty".into()));
        }
        if self.refresh_interval() < Duration::from_secs(1) {
            return Err(at("refresh_interval", "must be at least 1s".into()));
        }
        if self.timeout().is_zero() || self.timeout() > self.refresh_interval() {
            return Err(at("timeout", "must be greater than 0 and at most refresh_interval".into()));
        }
        if self.resource_names.is_empty() || self.resource_names.iter().any(|r| r.trim().is_empty()) {
            return Err(at("resource_names", "must name at least one resource, none empty".into()));
        }
        if !(1..=1 << 20).contains(&self.max_processes) {
            return Err(at("max_processes", "must be 1..=1048576".into()));
        }
        Ok(())
    }
}

fn default_fake_gpus() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

fn default_hostname_label() -> String {
    "Hostname".into()
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            collection_interval: None,
            devices: Vec::new(),
            naming: Naming::Otel,
            dcgm_hostname_label: default_hostname_label(),
            library_path: None,
            process_metrics: true,
            peak_window: None,
            host_name: None,
            source: SourceKind::Nvml,
            fake_gpus: default_fake_gpus(),
            fake_processes: Vec::new(),
            pod_attribution: None,
        }
    }
}

fn err(field: &str, message: impl Into<String>) -> FieldError {
    FieldError { path: vec![PathSeg::Key(field.into())], message: message.into() }
}

impl NvmlConfig {
    /// Parses and checks the settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: NvmlConfig = parse_config(v)?;
        if c.interval().is_zero() {
            return Err(err("collection_interval", "must be greater than 0"));
        }
        if c.interval() < Duration::from_millis(10) {
            return Err(err("collection_interval", "must be at least 10ms (NVML calls take milliseconds)"));
        }
        if !c.peak_window().is_zero() && c.peak_window() < c.interval() {
            return Err(err("peak_window", "must be 0 (off) or at least the collection interval"));
        }
        if !matches!(c.dcgm_hostname_label.as_str(), "Hostname" | "hostname") {
            return Err(err("dcgm_hostname_label", "must be Hostname or hostname"));
        }
        if c.library_path.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(err("library_path", "must not be empty (omit it for the default)"));
        }
        if c.host_name.as_deref().is_some_and(|h| h.trim().is_empty()) {
            return Err(err("host_name", "must not be empty (omit it for the OS host name)"));
        }
        if !(1..=MAX_FAKE_GPUS).contains(&c.fake_gpus) {
            return Err(err("fake_gpus", format!("must be 1..={MAX_FAKE_GPUS}")));
        }
        if !c.fake_processes.is_empty() && c.source != SourceKind::Fake {
            return Err(err("fake_processes", "is only for source: fake"));
        }
        if c.fake_processes.len() > MAX_FAKE_PROCESSES {
            return Err(err("fake_processes", format!("at most {MAX_FAKE_PROCESSES} entries")));
        }
        for (i, p) in c.fake_processes.iter().enumerate() {
            let at = |field: &str, message: String| FieldError {
                path: vec![PathSeg::Key("fake_processes".into()), PathSeg::Index(i), PathSeg::Key(field.into())],
                message,
            };
            if p.gpu >= c.fake_gpus {
                return Err(at("gpu", format!("must be a fake GPU's index, below fake_gpus ({})", c.fake_gpus)));
            }
            if p.pid == 0 {
                return Err(at("pid", "must be greater than 0".into()));
            }
        }
        if let Some(p) = &c.pod_attribution {
            p.check()?;
        }
        for (i, d) in c.devices.iter().enumerate() {
            if let DeviceSelector::Uuid(s) = d
                && s.trim().is_empty()
            {
                return Err(FieldError {
                    path: vec![PathSeg::Key("devices".into()), PathSeg::Index(i)],
                    message: "must be an index or a GPU UUID".into(),
                });
            }
        }
        Ok(c)
    }

    /// Time between samples.
    pub fn interval(&self) -> Duration {
        self.collection_interval.map_or(DEFAULT_INTERVAL, |d| d.0)
    }

    /// The peak window (zero: off).
    pub fn peak_window(&self) -> Duration {
        self.peak_window.map_or(DEFAULT_PEAK_WINDOW, |d| d.0)
    }

    /// `host.name`: configured, else the OS host name.
    pub fn host(&self) -> String {
        match &self.host_name {
            Some(h) => h.clone(),
            None => os_host_name(),
        }
    }

    /// The GPUs of `source: fake`: `fake_gpus` idle H100s ([`h100_sample`]) whose clocks are
    /// throttled (`sw_power_cap`, SM clock 1410 MHz) from their 50th to their 99th sample; their
    /// compute processes are `fake_processes` (pid 4242 on each when that is empty).
    pub fn fake_source(&self) -> FakeSource {
        FakeSource::new(
            (0..self.fake_gpus)
                .map(|i| {
                    let mut base = h100_sample();
                    if !self.fake_processes.is_empty() {
                        base.processes = Some(
                            self.fake_processes
                                .iter()
                                .filter(|p| p.gpu == i)
                                .map(|p| ProcessMemory { pid: p.pid, used_bytes: Some(p.used_bytes) })
                                .collect(),
                        );
                    }
                    let script = Script::Throttling { base, during: 50..100, reasons: 0x4, sm_clock_mhz: 1410 };
                    let uuid = format!("GPU-00000000-0000-0000-0000-fa4e{i:08x}");
                    FakeDevice::new(i, &uuid, "NVIDIA H100 80GB HBM3 (fake)", script)
                })
                .collect(),
        )
    }

    /// Whether `d` is sampled.
    pub fn selects(&self, d: &DeviceInfo) -> bool {
        self.devices.is_empty() || self.devices.iter().any(|s| s.matches(d))
    }
}

/// The OS host name (`/proc/sys/kernel/hostname`, then `$HOSTNAME`, then `localhost`).
pub fn os_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dev(index: u32, uuid: &str) -> DeviceInfo {
        DeviceInfo { index, uuid: uuid.into(), name: "x".into() }
    }

    #[test]
    fn defaults() {
        let c = NvmlConfig::from_value(&json!(null)).unwrap();
        assert_eq!(c.interval(), Duration::from_millis(200));
        assert_eq!(c.peak_window(), Duration::from_secs(60));
        assert_eq!(c.naming, Naming::Otel);
        assert!(c.process_metrics);
        assert_eq!(c.dcgm_hostname_label, "Hostname");
        assert!(c.selects(&dev(3, "GPU-a")));
        assert!(!c.host().is_empty());
    }

    #[test]
    fn selectors_by_index_and_uuid() {
        let c = NvmlConfig::from_value(&json!({"devices": [1, "GPU-B", "2"], "naming": "dcgm",
            "collection_interval": "1s", "peak_window": "0", "host_name": "h1"}))
        .unwrap();
        assert!(c.selects(&dev(1, "GPU-a")));
        assert!(c.selects(&dev(7, "gpu-b")));
        assert!(c.selects(&dev(2, "GPU-c")));
        assert!(!c.selects(&dev(0, "GPU-a")));
        assert_eq!(c.naming, Naming::Dcgm);
        assert!(c.peak_window().is_zero());
        assert_eq!(c.host(), "h1");
    }

    #[test]
    fn fake_source_from_config() {
        use crate::nvml::source::GpuSource;
        assert_eq!(NvmlConfig::from_value(&json!({})).unwrap().source, SourceKind::Nvml);
        let c = NvmlConfig::from_value(&json!({"source": "fake", "fake_gpus": 2})).unwrap();
        assert_eq!(c.source, SourceKind::Fake);
        let mut opened = (crate::nvml::nvml_opener())(&c).unwrap();
        let devs = opened.devices().unwrap();
        assert_eq!(devs.iter().map(|d| d.index).collect::<Vec<_>>(), vec![0, 1]);
        assert_ne!(devs[0].uuid, devs[1].uuid);
        let mut src = c.fake_source();
        let d = src.devices().unwrap().remove(1);
        let samples: Vec<_> = (0..101).map(|_| src.sample(&d).unwrap()).collect();
        assert_eq!(samples[49].throttle_reasons, Some(0));
        assert_eq!(samples[50].throttle_reasons, Some(0x4));
        assert_eq!(samples[50].sm_clock_mhz, Some(1410));
        assert_eq!(samples[99].throttle_reasons, Some(0x4));
        assert_eq!(samples[100].throttle_reasons, Some(0));
        assert_eq!(samples[0].memory_used_bytes, Some(40 << 30));
    }

    #[test]
    fn errors_are_located() {
        let cases = [
            (json!({"collection_interval": "0s"}), "collection_interval"),
            (json!({"collection_interval": "1ms"}), "collection_interval"),
            (json!({"collection_interval": "1s", "peak_window": "500ms"}), "peak_window"),
            (json!({"naming": "prom"}), "naming"),
            (json!({"dcgm_hostname_label": "host"}), "dcgm_hostname_label"),
            (json!({"library_path": ""}), "library_path"),
            (json!({"host_name": " "}), "host_name"),
            (json!({"colection_interval": "1s"}), "colection_interval"),
        ];
        for (v, field) in cases {
            let e = NvmlConfig::from_value(&v).unwrap_err();
            assert_eq!(e.path.first(), Some(&PathSeg::Key(field.into())), "{v}: {e}");
        }
        for n in [0, MAX_FAKE_GPUS + 1] {
            let e = NvmlConfig::from_value(&json!({"source": "fake", "fake_gpus": n})).unwrap_err();
            assert_eq!(e.path, vec![PathSeg::Key("fake_gpus".into())], "{n}");
        }
        let e = NvmlConfig::from_value(&json!({"source": "gpu"})).unwrap_err();
        assert_eq!(e.path.first(), Some(&PathSeg::Key("source".into())), "{e}");
        let e = NvmlConfig::from_value(&json!({"devices": [0, ""]})).unwrap_err();
        assert_eq!(e.path, vec![PathSeg::Key("devices".into()), PathSeg::Index(1)]);
    }

    #[test]
    fn fake_processes_are_scripted_per_gpu() {
        use crate::nvml::source::GpuSource;
        let c = NvmlConfig::from_value(&json!({"source": "fake", "fake_gpus": 3, "fake_processes": [
            {"gpu": 0, "pid": 4242, "used_bytes": 1000}, {"gpu": 0, "pid": 77}, {"gpu": 2, "pid": 9}]}))
        .unwrap();
        let mut src = c.fake_source();
        let devs = src.devices().unwrap();
        let procs = |src: &mut FakeSource, i: usize| src.sample(&devs[i]).unwrap().processes.unwrap();
        assert_eq!(
            procs(&mut src, 0),
            vec![
                ProcessMemory { pid: 4242, used_bytes: Some(1000) },
                ProcessMemory { pid: 77, used_bytes: Some(38 << 30) },
            ]
        );
        assert!(procs(&mut src, 1).is_empty());
        assert_eq!(procs(&mut src, 2), vec![ProcessMemory { pid: 9, used_bytes: Some(38 << 30) }]);
        // Without fake_processes: the stock pid 4242 on every GPU.
        let mut stock = NvmlConfig::from_value(&json!({"source": "fake"})).unwrap().fake_source();
        let d = stock.devices().unwrap().remove(0);
        assert_eq!(stock.sample(&d).unwrap().processes.unwrap()[0].pid, 4242);
    }

    #[test]
    fn pod_attribution_defaults_and_errors() {
        assert!(NvmlConfig::from_value(&json!({})).unwrap().pod_attribution.is_none(), "off by default");
        let p = NvmlConfig::from_value(&json!({"pod_attribution": {}})).unwrap().pod_attribution.unwrap();
        assert_eq!(p.proc_root, "/proc");
        assert_eq!(p.pod_resources_socket, "/var/lib/kubelet/pod-resources/kubelet.sock");
        assert_eq!((p.refresh_interval(), p.timeout()), (Duration::from_secs(30), Duration::from_secs(5)));
        assert_eq!(p.resource_names, vec!["nvidia.com/gpu".to_string()]);
        assert_eq!(p.max_processes, 4096);
        let pa = |k: &str| vec![PathSeg::Key("pod_attribution".into()), PathSeg::Key(k.into())];
        let cases = [
            (json!({"pod_attribution": {"proc_root": ""}}), pa("proc_root")),
            (json!({"pod_attribution": {"refresh_interval": "100ms"}}), pa("refresh_interval")),
            (json!({"pod_attribution": {"timeout": "1m"}}), pa("timeout")),
            (json!({"pod_attribution": {"resource_names": []}}), pa("resource_names")),
            (json!({"pod_attribution": {"max_processes": 0}}), pa("max_processes")),
            (json!({"pod_attribution": {"socket": "/x"}}), pa("socket")),
            (json!({"fake_processes": [{"gpu": 0, "pid": 1}]}), vec![PathSeg::Key("fake_processes".into())]),
            (
                json!({"source": "fake", "fake_processes": [{"gpu": 1, "pid": 1}]}),
                vec![PathSeg::Key("fake_processes".into()), PathSeg::Index(0), PathSeg::Key("gpu".into())],
            ),
            (
                json!({"source": "fake", "fake_processes": [{"gpu": 0, "pid": 0}]}),
                vec![PathSeg::Key("fake_processes".into()), PathSeg::Index(0), PathSeg::Key("pid".into())],
            ),
        ];
        for (v, path) in cases {
            let e = NvmlConfig::from_value(&v).unwrap_err();
            assert_eq!(e.path, path, "{v}: {e}");
        }
    }
}
