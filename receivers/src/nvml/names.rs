//! The two naming modes of the `nvml` receiver and every metric and attribute name it emits.
//!
//! `otel`: OpenTelemetry hardware semantic conventions (`hw.gpu.*`, `hw.power`, `hw.energy`,
//! `hw.temperature`, `hw.errors`) where one exists, `gpu.*` names of our own where none does.
//! `dcgm`: dcgm-exporter's `DCGM_FI_*` names, units (MiB, W, mJ, %) and labels, so existing
//! Grafana dashboards work; all are gauges without a unit, so the `prometheus` exporter keeps the
//! names as they are (no unit or `_total` suffix).

use serde::Deserialize;

/// Which names the receiver emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Naming {
    /// OpenTelemetry `hw.gpu.*` names and units (default).
    #[default]
    Otel,
    /// dcgm-exporter `DCGM_FI_DEV_*` names, units and labels.
    Dcgm,
}

/// Names of the `otel` mode.
pub mod otel {
    /// Framebuffer used (UpDownCounter, By).
    pub const MEMORY_USAGE: &str = "hw.gpu.memory.usage";
    /// Framebuffer total (UpDownCounter, By).
    pub const MEMORY_LIMIT: &str = "hw.gpu.memory.limit";
    /// Used / total (Gauge, 1).
    pub const MEMORY_UTILIZATION: &str = "hw.gpu.memory.utilization";
    /// Framebuffer free (UpDownCounter, By); not in semconv.
    pub const MEMORY_FREE: &str = "gpu.memory.free";
    /// GPU busy ratio (Gauge, 1) with `hw.gpu.task` = `general`.
    pub const UTILIZATION: &str = "hw.gpu.utilization";
    /// Memory-controller busy ratio (Gauge, 1); not capacity, not in semconv.
    pub const MEMORY_BANDWIDTH_UTILIZATION: &str = "gpu.memory.bandwidth.utilization";
    /// Clock frequency (Gauge, MHz) with [`CLOCK_TYPE`] = `sm` / `memory`.
    pub const CLOCK: &str = "gpu.clock.frequency";
    /// Power draw (Gauge, W).
    pub const POWER: &str = "hw.power";
    /// Enforced power limit (Gauge, W).
    pub const POWER_LIMIT: &str = "gpu.power.limit";
    /// Energy since the driver loaded (Counter, J).
    pub const ENERGY: &str = "hw.energy";
    /// GPU temperature (Gauge, Cel).
    pub const TEMPERATURE: &str = "hw.temperature";
    /// One point per throttle (clocks-event) reason, 1 while active (Gauge, 1) with [`THROTTLE_REASON`].
    pub const THROTTLE: &str = "hw.gpu.throttle";
    /// PCIe bytes, integrated from NVML's KB/s snapshots (Counter, By) with `network.io.direction`.
    pub const IO: &str = "hw.gpu.io";
    /// ECC errors (volatile) and XID events (Counter, {error}) with `error.type`.
    pub const ERRORS: &str = "hw.errors";
    /// GPU memory of one compute process (UpDownCounter, By) with `process.pid`.
    pub const PROCESS_MEMORY_USAGE: &str = "process.gpu.memory.usage";
    /// Highest framebuffer use over the peak window (Gauge, By), at the window's end.
    pub const MEMORY_PEAK: &str = "gpu.memory.peak";
    /// Highest GPU memory of one process over the peak window (Gauge, By) with `process.pid`.
    pub const PROCESS_MEMORY_PEAK: &str = "process.gpu.memory.peak";

    /// Point attribute: the GPU UUID (also in `hw.id`).
    pub const GPU_UUID: &str = "gpu.uuid";
    /// Point attribute: the NVML index (int).
    pub const GPU_INDEX: &str = "gpu.index";
    /// Point attribute: the product name.
    pub const GPU_NAME: &str = "gpu.name";
    /// Point attribute: semconv's hardware id (the UUID).
    pub const HW_ID: &str = "hw.id";
    /// Point attribute: semconv's hardware type (`gpu`).
    pub const HW_TYPE: &str = "hw.type";
    /// Point attribute of [`CLOCK`].
    pub const CLOCK_TYPE: &str = "gpu.clock.type";
    /// Point attribute of [`THROTTLE`].
    pub const THROTTLE_REASON: &str = "hw.gpu.throttle.reason";
    /// Point attribute of per-process metrics (int).
    pub const PROCESS_PID: &str = "process.pid";

    /// Pod attribution (`pod_attribution`): the pod's name.
    pub const K8S_POD_NAME: &str = "k8s.pod.name";
    /// Pod attribution: the pod's namespace.
    pub const K8S_NAMESPACE_NAME: &str = "k8s.namespace.name";
    /// Pod attribution: the container's name.
    pub const K8S_CONTAINER_NAME: &str = "k8s.container.name";
    /// Pod attribution: the pod's UID.
    pub const K8S_POD_UID: &str = "k8s.pod.uid";
    /// Pod attribution: the container's runtime id (processes only).
    pub const CONTAINER_ID: &str = "container.id";
}

/// Names of the `dcgm` mode (dcgm-exporter's default counters and labels).
pub mod dcgm {
    /// Framebuffer used, MiB.
    pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
    /// Framebuffer free, MiB.
    pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
    /// Framebuffer reserved, MiB.
    pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
    /// Framebuffer total, MiB (a DCGM field, not in dcgm-exporter's default set).
    pub const FB_TOTAL: &str = "DCGM_FI_DEV_FB_TOTAL";
    /// GPU utilisation, %.
    pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
    /// Memory copy (bandwidth) utilisation, %.
    pub const MEM_COPY_UTIL: &str = "DCGM_FI_DEV_MEM_COPY_UTIL";
    /// SM clock, MHz.
    pub const SM_CLOCK: &str = "DCGM_FI_DEV_SM_CLOCK";
    /// Memory clock, MHz.
    pub const MEM_CLOCK: &str = "DCGM_FI_DEV_MEM_CLOCK";
    /// GPU temperature, °C.
    pub const GPU_TEMP: &str = "DCGM_FI_DEV_GPU_TEMP";
    /// Power draw, W.
    pub const POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";
    /// Power management limit, W.
    pub const POWER_MGMT_LIMIT: &str = "DCGM_FI_DEV_POWER_MGMT_LIMIT";
    /// Energy since boot, mJ.
    pub const TOTAL_ENERGY: &str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";
    /// Clocks-event (throttle) reasons bitmask.
    pub const CLOCKS_EVENT_REASONS: &str = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS";
    /// PCIe transmit, bytes/s.
    pub const PCIE_TX_BYTES: &str = "DCGM_FI_PROF_PCIE_TX_BYTES";
    /// PCIe receive, bytes/s.
    pub const PCIE_RX_BYTES: &str = "DCGM_FI_PROF_PCIE_RX_BYTES";
    /// Volatile single-bit (corrected) ECC errors.
    pub const ECC_SBE_VOL: &str = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL";
    /// Volatile double-bit (uncorrected) ECC errors.
    pub const ECC_DBE_VOL: &str = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL";
    /// Value of the last XID error.
    pub const XID_ERRORS: &str = "DCGM_FI_DEV_XID_ERRORS";
    /// GPU memory of one compute process, MiB (no DCGM equivalent; label `pid`).
    pub const PROCESS_FB_USED: &str = "inferwatch_gpu_process_fb_used";
    /// Highest framebuffer use over the peak window, MiB.
    pub const FB_USED_PEAK: &str = "inferwatch_gpu_fb_used_peak";
    /// Highest GPU memory of one process over the peak window, MiB (label `pid`).
    pub const PROCESS_FB_USED_PEAK: &str = "inferwatch_gpu_process_fb_used_peak";

    /// Label: the NVML index.
    pub const GPU: &str = "gpu";
    /// Label: the GPU UUID.
    pub const UUID: &str = "UUID";
    /// Label: the product name.
    pub const MODEL_NAME: &str = "modelName";
    /// Label of per-process metrics.
    pub const PID: &str = "pid";

    /// Pod attribution: the pod's name (dcgm-exporter's label).
    pub const POD: &str = "pod";
    /// Pod attribution: the pod's namespace (dcgm-exporter's label).
    pub const NAMESPACE: &str = "namespace";
    /// Pod attribution: the container's name (dcgm-exporter's label).
    pub const CONTAINER: &str = "container";
    /// Pod attribution: the pod's UID (not a dcgm-exporter label).
    pub const POD_UID: &str = "pod_uid";
    /// Pod attribution: the container's runtime id, processes only (not a dcgm-exporter label).
    pub const CONTAINER_ID: &str = "container_id";
}

/// Resource attribute: the host name.
pub const HOST_NAME: &str = "host.name";
/// Instrumentation scope of the receiver's metrics.
pub const SCOPE_NAME: &str = "inferwatch/nvml";
