//! Settings of the `nvml` receiver.

use super::fake::{FakeDevice, FakeSource, Script, h100_sample};
use super::names::Naming;
use super::source::DeviceInfo;
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
    /// throttled (`sw_power_cap`, SM clock 1410 MHz) from their 50th to their 99th sample.
    pub fn fake_source(&self) -> FakeSource {
        let script = Script::Throttling { base: h100_sample(), during: 50..100, reasons: 0x4, sm_clock_mhz: 1410 };
        FakeSource::new(
            (0..self.fake_gpus)
                .map(|i| {
                    let uuid = format!("GPU-00000000-0000-0000-0000-fa4e{i:08x}");
                    FakeDevice::new(i, &uuid, "NVIDIA H100 80GB HBM3 (fake)", script.clone())
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
}
