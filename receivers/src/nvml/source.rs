//! The [`GpuSource`] trait the receiver samples through, the sample types, and the errors: why a
//! source cannot start at all ([`Unavailable`]) and why one device could not be sampled
//! ([`SourceError`]). NVML ([`super::real`]) and the scripted fake ([`super::fake`]) implement it.

use std::fmt;

/// One GPU as enumerated: its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// NVML index (the `gpu` label of dcgm-exporter).
    pub index: u32,
    /// The GPU UUID, e.g. `GPU-5fc2...`.
    pub uuid: String,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
}

/// GPU memory of one compute process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Host-namespace process id.
    pub pid: u32,
    /// Bytes of GPU memory the process uses (`None`: the driver does not say).
    pub used_bytes: Option<u64>,
}

/// One reading of one GPU, in NVML's units. A field is `None` where the device or driver does not
/// support it (or the call failed for that field alone).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    /// Framebuffer used, bytes (NVML v2: reserved memory is not in it).
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer free, bytes.
    pub memory_free_bytes: Option<u64>,
    /// Framebuffer total, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Framebuffer reserved by the driver, bytes.
    pub memory_reserved_bytes: Option<u64>,
    /// GPU busy, percent over the driver's sample period.
    pub gpu_utilization_pct: Option<u32>,
    /// Memory-controller (bandwidth) busy, percent; not capacity.
    pub memory_utilization_pct: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// Power draw, milliwatts.
    pub power_mw: Option<u32>,
    /// Enforced power limit, milliwatts.
    pub power_limit_mw: Option<u32>,
    /// Energy since the driver loaded, millijoules.
    pub energy_mj: Option<u64>,
    /// GPU temperature, °C.
    pub temperature_c: Option<u32>,
    /// Throttle / clocks-event reasons, NVML's bitmask (see [`THROTTLE_REASONS`]).
    pub throttle_reasons: Option<u64>,
    /// PCIe receive throughput, KB/s (a 20 ms snapshot).
    pub pcie_rx_kbps: Option<u32>,
    /// PCIe transmit throughput, KB/s (a 20 ms snapshot).
    pub pcie_tx_kbps: Option<u32>,
    /// Volatile corrected (single-bit) ECC errors.
    pub ecc_corrected: Option<u64>,
    /// Volatile uncorrected (double-bit) ECC errors.
    pub ecc_uncorrected: Option<u64>,
    /// GPU memory per running compute process (`None`: not supported or not asked for).
    pub processes: Option<Vec<ProcessMemory>>,
}

/// NVML's throttle (clocks-event) reason bits and the names the receiver gives them.
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// A critical XID error reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the device it happened on.
    pub uuid: String,
    /// The XID code (0 when the driver did not say).
    pub xid: u64,
}

/// Why one device could not be sampled this time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct SourceError {
    /// A short class, used as the `reason` of the error counter.
    pub kind: ErrorKind,
    /// The driver's words.
    pub message: String,
}

/// Classes of per-device failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The GPU fell off the bus or is lost (XID 79 and friends).
    GpuLost,
    /// The device is not (or no longer) visible.
    NotFound,
    /// The driver did not answer in time.
    Timeout,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::GpuLost => "gpu_lost",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why there is no GPU telemetry at all on this host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// `libnvidia-ml` could not be loaded (no driver installed, or not on the library path).
    #[error("no NVML library: {0} (install the NVIDIA driver, or set library_path)")]
    NoLibrary(String),
    /// The library was found but lacks a function NVML needs (too old, or not NVML).
    #[error("the NVML library lacks a required symbol: {0}")]
    SymbolMissing(String),
    /// The library loaded but the kernel driver is not loaded.
    #[error("the NVIDIA driver is not loaded (NVML: {0})")]
    DriverNotLoaded(String),
    /// The process may not talk to the driver (device nodes not accessible).
    #[error("no permission to use NVML (NVML: {0}); run with access to /dev/nvidia*")]
    NoPermission(String),
    /// NVML works but shows no GPU (or none of the configured ones).
    #[error("no GPU: {0}")]
    NoDevice(String),
    /// Any other initialisation failure.
    #[error("NVML failed to initialise: {0}")]
    Other(String),
}

impl Unavailable {
    /// A short code for the reason (`no_library`, `symbol_missing`, `driver_not_loaded`,
    /// `no_permission`, `no_device`, `other`).
    pub fn code(&self) -> &'static str {
        match self {
            Unavailable::NoLibrary(_) => "no_library",
            Unavailable::SymbolMissing(_) => "symbol_missing",
            Unavailable::DriverNotLoaded(_) => "driver_not_loaded",
            Unavailable::NoPermission(_) => "no_permission",
            Unavailable::NoDevice(_) => "no_device",
            Unavailable::Other(_) => "other",
        }
    }
}

/// Where GPU readings come from. Calls block (NVML talks to the driver), so the receiver calls
/// them off the async runtime. Object safe; one owner at a time.
pub trait GpuSource: Send {
    /// The GPUs visible now.
    fn devices(&mut self) -> Result<Vec<DeviceInfo>, SourceError>;
    /// One reading of `device`.
    fn sample(&mut self, device: &DeviceInfo) -> Result<GpuSample, SourceError>;
    /// XID events since the last call; `None` where the source cannot report them.
    fn poll_xid(&mut self) -> Option<Vec<XidEvent>> {
        None
    }
}
