//! [`FakeSource`]: a scripted, deterministic [`GpuSource`] for machines without GPUs. Each device
//! follows a [`Script`] (recorded samples, a constant reading, memory creep, a throttling episode)
//! and may be lost for a range of its samples; XID events can be queued.

use super::source::{DeviceInfo, ErrorKind, GpuSample, GpuSource, ProcessMemory, SourceError, XidEvent};
use std::collections::VecDeque;
use std::ops::Range;

/// What a fake device reports at its `n`-th sample (counting from 0, failed samples included).
#[derive(Debug, Clone, PartialEq)]
pub enum Script {
    /// Recorded samples in order; the last one repeats once they run out.
    Samples(Vec<GpuSample>),
    /// The same reading every time.
    Constant(GpuSample),
    /// `base` with `step_bytes` more memory used (and less free) at every sample; the first
    /// compute process (if any) grows by the same amount.
    MemoryCreep {
        /// The reading at sample 0.
        base: GpuSample,
        /// Growth per sample, bytes.
        step_bytes: u64,
    },
    /// `base`, except during `during`: the `reasons` bits are set and the SM clock drops to `sm_clock_mhz`.
    Throttling {
        /// The unthrottled reading.
        base: GpuSample,
        /// The samples of the episode.
        during: Range<usize>,
        /// Throttle reason bits during the episode (e.g. 0x4 = sw_power_cap).
        reasons: u64,
        /// SM clock during the episode, MHz.
        sm_clock_mhz: u32,
    },
}

impl Script {
    /// The reading at sample `n`.
    pub fn at(&self, n: usize) -> GpuSample {
        match self {
            Script::Samples(v) => v.get(n).or_else(|| v.last()).cloned().unwrap_or_default(),
            Script::Constant(s) => s.clone(),
            Script::MemoryCreep { base, step_bytes } => {
                let mut s = base.clone();
                let grow = step_bytes.saturating_mul(n as u64);
                s.memory_used_bytes = s.memory_used_bytes.map(|u| u.saturating_add(grow));
                s.memory_free_bytes = s.memory_free_bytes.map(|f| f.saturating_sub(grow));
                if let Some(p) = s.processes.as_mut().and_then(|ps| ps.first_mut()) {
                    p.used_bytes = p.used_bytes.map(|b| b.saturating_add(grow));
                }
                s
            }
            Script::Throttling { base, during, reasons, sm_clock_mhz } => {
                let mut s = base.clone();
                if during.contains(&n) {
                    s.throttle_reasons = Some(s.throttle_reasons.unwrap_or(0) | reasons);
                    s.sm_clock_mhz = Some(*sm_clock_mhz);
                }
                s
            }
        }
    }
}

/// One scripted device.
#[derive(Debug, Clone)]
pub struct FakeDevice {
    /// Its identity.
    pub info: DeviceInfo,
    /// Its readings.
    pub script: Script,
    /// Samples (by number) at which it is lost: sampling fails with `gpu_lost`.
    pub lost: Option<Range<usize>>,
    taken: usize,
}

impl FakeDevice {
    /// A device following `script`, never lost.
    pub fn new(index: u32, uuid: &str, name: &str, script: Script) -> Self {
        FakeDevice {
            info: DeviceInfo { index, uuid: uuid.to_string(), name: name.to_string() },
            script,
            lost: None,
            taken: 0,
        }
    }

    /// The same device, lost for the samples in `samples` (e.g. `3..usize::MAX`: lost at sample 3 for good).
    pub fn lost_during(mut self, samples: Range<usize>) -> Self {
        self.lost = Some(samples);
        self
    }
}

/// A scripted GPU source.
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    devices: Vec<FakeDevice>,
    xid: Option<VecDeque<XidEvent>>,
}

impl FakeSource {
    /// A source with these devices and no XID support.
    pub fn new(devices: Vec<FakeDevice>) -> Self {
        FakeSource { devices, xid: None }
    }

    /// The same source, reporting XID events: `events` are delivered at the first poll.
    pub fn with_xid(mut self, events: Vec<XidEvent>) -> Self {
        self.xid = Some(events.into());
        self
    }
}

impl GpuSource for FakeSource {
    fn devices(&mut self) -> Result<Vec<DeviceInfo>, SourceError> {
        Ok(self.devices.iter().map(|d| d.info.clone()).collect())
    }

    fn sample(&mut self, device: &DeviceInfo) -> Result<GpuSample, SourceError> {
        let Some(d) = self.devices.iter_mut().find(|d| d.info.uuid == device.uuid) else {
            return Err(SourceError { kind: ErrorKind::NotFound, message: format!("no device {}", device.uuid) });
        };
        let n = d.taken;
        d.taken += 1;
        if d.lost.as_ref().is_some_and(|r| r.contains(&n)) {
            return Err(SourceError {
                kind: ErrorKind::GpuLost,
                message: format!("{}: GPU is lost (scripted at sample {n})", d.info.uuid),
            });
        }
        Ok(d.script.at(n))
    }

    fn poll_xid(&mut self) -> Option<Vec<XidEvent>> {
        self.xid.as_mut().map(|q| q.drain(..).collect())
    }
}

/// A plausible idle H100 80GB reading with every field set and one compute process.
pub fn h100_sample() -> GpuSample {
    const GIB: u64 = 1 << 30;
    GpuSample {
        memory_used_bytes: Some(40 * GIB),
        memory_free_bytes: Some(39 * GIB),
        memory_total_bytes: Some(80 * GIB),
        memory_reserved_bytes: Some(GIB),
        gpu_utilization_pct: Some(75),
        memory_utilization_pct: Some(30),
        sm_clock_mhz: Some(1980),
        memory_clock_mhz: Some(2619),
        power_mw: Some(350_500),
        power_limit_mw: Some(700_000),
        energy_mj: Some(123_456_789),
        temperature_c: Some(54),
        throttle_reasons: Some(0),
        pcie_rx_kbps: Some(1000),
        pcie_tx_kbps: Some(500),
        ecc_corrected: Some(2),
        ecc_uncorrected: Some(0),
        processes: Some(vec![ProcessMemory { pid: 4242, used_bytes: Some(38 * GIB) }]),
    }
}
