//! [`NvmlSource`]: the [`GpuSource`] on NVML through nvml-wrapper, which loads `libnvidia-ml.so.1`
//! at run time (the agent builds and runs without a driver; `init` then fails with a reason).
//!
//! NVML is initialised once per process and kept for its lifetime (a `static`), so the XID event
//! set, which borrows it, can live in the source. Devices are looked up by UUID at each sample, so
//! a GPU that fell off the bus and came back is sampled again without a restart.

use super::source::{DeviceInfo, ErrorKind, GpuSample, GpuSource, ProcessMemory, SourceError, Unavailable, XidEvent};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use std::ffi::OsStr;
use std::sync::{Mutex, OnceLock};

/// The process's NVML handle, set on the first successful initialisation.
static NVML: OnceLock<Nvml> = OnceLock::new();
/// Serialises initialisation attempts.
static INIT: Mutex<()> = Mutex::new(());

/// Maps an `Nvml::init` failure to the reason the receiver reports.
pub fn classify_init_error(e: &NvmlError) -> Unavailable {
    match e {
        NvmlError::LibloadingError(inner) => Unavailable::NoLibrary(inner.to_string()),
        NvmlError::LibraryNotFound => Unavailable::NoLibrary(e.to_string()),
        NvmlError::FailedToLoadSymbol(s) => Unavailable::SymbolMissing(s.clone()),
        NvmlError::FunctionNotFound => Unavailable::SymbolMissing(e.to_string()),
        NvmlError::DriverNotLoaded => Unavailable::DriverNotLoaded(e.to_string()),
        NvmlError::NoPermission => Unavailable::NoPermission(e.to_string()),
        other => Unavailable::Other(other.to_string()),
    }
}

/// Classifies a per-call failure.
fn source_error(what: &str, e: &NvmlError) -> SourceError {
    let kind = match e {
        NvmlError::GpuLost => ErrorKind::GpuLost,
        NvmlError::NotFound | NvmlError::InvalidArg => ErrorKind::NotFound,
        NvmlError::Timeout => ErrorKind::Timeout,
        _ => ErrorKind::Other,
    };
    SourceError { kind, message: format!("{what}: {e}") }
}

/// Initialises NVML once per process (`library_path` overrides the default `libnvidia-ml.so.1`).
fn nvml(library_path: Option<&str>) -> Result<&'static Nvml, Unavailable> {
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let init = match library_path {
        Some(p) => Nvml::builder().lib_path(OsStr::new(p)).init(),
        None => Nvml::init(),
    };
    let n = init.map_err(|e| classify_init_error(&e))?;
    Ok(NVML.get_or_init(|| n))
}

/// GPU readings from NVML.
pub struct NvmlSource {
    nvml: &'static Nvml,
    process_metrics: bool,
    events: Option<EventSet<'static>>,
}

impl NvmlSource {
    /// Initialises NVML and checks that at least one GPU is visible.
    pub fn open(library_path: Option<&str>, process_metrics: bool) -> Result<Self, Unavailable> {
        let nvml = nvml(library_path)?;
        let count = nvml.device_count().map_err(|e| classify_init_error(&e))?;
        if count == 0 {
            return Err(Unavailable::NoDevice("NVML reports 0 devices".into()));
        }
        let events = xid_events(nvml, count);
        Ok(NvmlSource { nvml, process_metrics, events })
    }

    fn device(&self, d: &DeviceInfo) -> Result<Device<'static>, SourceError> {
        self.nvml.device_by_uuid(d.uuid.as_str()).map_err(|e| source_error("device_by_uuid", &e))
    }
}

/// An event set with every device that supports critical XID events, if any does.
fn xid_events(nvml: &'static Nvml, count: u32) -> Option<EventSet<'static>> {
    let mut set = nvml.create_event_set().ok()?;
    let mut any = false;
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        let supported = d.supported_event_types().map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !matches!(supported, Ok(true)) {
            continue;
        }
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                any = true;
            }
            Err(e) => {
                tracing::debug!(device = i, error = ?e.error, "cannot register for XID events");
                // The set was released by the failed call; start a fresh one.
                set = nvml.create_event_set().ok()?;
            }
        }
    }
    any.then_some(set)
}

/// `Some(v)` on success; `None` (with a debug line) on any failure of an optional field.
fn opt<T>(what: &str, r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(field = what, error = %e, "NVML field unavailable");
            None
        }
    }
}

impl GpuSource for NvmlSource {
    fn devices(&mut self) -> Result<Vec<DeviceInfo>, SourceError> {
        let count = self.nvml.device_count().map_err(|e| source_error("device_count", &e))?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            let d = self.nvml.device_by_index(i).map_err(|e| source_error("device_by_index", &e))?;
            let uuid = d.uuid().map_err(|e| source_error("uuid", &e))?;
            let name = d.name().unwrap_or_else(|_| "unknown".into());
            out.push(DeviceInfo { index: i, uuid, name });
        }
        Ok(out)
    }

    fn sample(&mut self, info: &DeviceInfo) -> Result<GpuSample, SourceError> {
        let d = self.device(info)?;
        // Memory is the one reading the receiver exists for: its failure fails the sample.
        let mem = d.memory_info().map_err(|e| source_error("memory_info", &e))?;
        let util = opt("utilization_rates", d.utilization_rates());
        let processes = if self.process_metrics {
            opt("running_compute_processes", d.running_compute_processes()).map(|ps| {
                ps.into_iter()
                    .map(|p| ProcessMemory {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect()
            })
        } else {
            None
        };
        Ok(GpuSample {
            memory_used_bytes: Some(mem.used),
            memory_free_bytes: Some(mem.free),
            memory_total_bytes: Some(mem.total),
            memory_reserved_bytes: Some(mem.reserved),
            gpu_utilization_pct: util.as_ref().map(|u| u.gpu),
            memory_utilization_pct: util.as_ref().map(|u| u.memory),
            sm_clock_mhz: opt("clock_info(SM)", d.clock_info(Clock::SM)),
            memory_clock_mhz: opt("clock_info(Memory)", d.clock_info(Clock::Memory)),
            power_mw: opt("power_usage", d.power_usage()),
            power_limit_mw: opt("enforced_power_limit", d.enforced_power_limit()),
            energy_mj: opt("total_energy_consumption", d.total_energy_consumption()),
            temperature_c: opt("temperature", d.temperature(TemperatureSensor::Gpu)),
            throttle_reasons: opt("current_throttle_reasons", d.current_throttle_reasons()).map(|r| r.bits()),
            pcie_rx_kbps: opt("pcie_throughput(Receive)", d.pcie_throughput(PcieUtilCounter::Receive)),
            pcie_tx_kbps: opt("pcie_throughput(Send)", d.pcie_throughput(PcieUtilCounter::Send)),
            ecc_corrected: opt("total_ecc_errors", d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)),
            ecc_uncorrected: opt(
                "total_ecc_errors",
                d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
            ),
            processes,
        })
    }

    fn poll_xid(&mut self) -> Option<Vec<XidEvent>> {
        let set = self.events.as_ref()?;
        let mut out = Vec::new();
        // Bounded: a storm of events cannot hold the sampling thread.
        for _ in 0..64 {
            match set.wait(0) {
                Ok(ev) => {
                    let uuid = ev.device.uuid().unwrap_or_default();
                    let xid = match ev.event_data {
                        Some(XidError::Value(v)) => v,
                        _ => 0,
                    };
                    out.push(XidEvent { uuid, xid });
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "XID event wait failed");
                    break;
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_errors_map_to_reasons() {
        let cases = [
            (
                NvmlError::FailedToLoadSymbol("libnvidia-ml.so.1: undefined symbol: nvmlInit_v2".into()),
                "symbol_missing",
                "lacks a required symbol: libnvidia-ml.so.1: undefined symbol: nvmlInit_v2",
            ),
            (NvmlError::DriverNotLoaded, "driver_not_loaded", "driver is not loaded"),
            (NvmlError::NoPermission, "no_permission", "no permission to use NVML"),
            (NvmlError::LibraryNotFound, "no_library", "no NVML library"),
            (NvmlError::Unknown, "other", "NVML failed to initialise"),
        ];
        for (e, code, text) in cases {
            let r = classify_init_error(&e);
            assert_eq!(r.code(), code, "{e}");
            assert!(r.to_string().contains(text), "{r}");
        }
        assert_eq!(source_error("x", &NvmlError::GpuLost).kind, ErrorKind::GpuLost);
        assert_eq!(source_error("x", &NvmlError::NotFound).kind, ErrorKind::NotFound);
    }

    #[test]
    fn a_missing_library_is_no_library() {
        let r = NvmlSource::open(Some("/nonexistent/libnvidia-ml.so.1"), true).err();
        // On a GPU host NVML may already be initialised by another test; then the path is not used.
        if NVML.get().is_none() {
            let r = r.expect("no NVML at a nonexistent path");
            assert_eq!(r.code(), "no_library");
            assert!(r.to_string().contains("/nonexistent/libnvidia-ml.so.1"), "{r}");
        }
    }
}
