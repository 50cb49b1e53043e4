//! GPU samples → OTLP metrics in either naming mode, with the per-device state the conversion
//! needs: counter start times, PCIe bytes integrated from NVML's rate snapshots, XID counts and
//! the VRAM peak windows.
//!
//! Attributes: `host.name` is a resource attribute. Every point carries the GPU's identity as
//! point attributes: in `otel` naming `hw.id` (= UUID), `hw.type` = `gpu`, `gpu.uuid`,
//! `gpu.index` (int), `gpu.name`, then the metric's own attributes; in `dcgm` naming `gpu`
//! (index, string), `UUID`, `modelName`, `Hostname` (or `hostname`), then the metric's own.
//!
//! With `pod_attribution` ([`super::attribution`]), a GPU's points also carry its pod
//! (`k8s.pod.name`, `k8s.namespace.name`, `k8s.container.name`, `k8s.pod.uid`; dcgm: `pod`,
//! `namespace`, `container`, `pod_uid`), and each per-process point its process's pod instead
//! (plus `container.id` / `container_id`).
//!
//! Peak windows are aligned to the device's first sample: the highest memory use of the samples
//! in `[start, start + window)` is emitted, stamped `start + window`, with the first sample at or
//! after the window's end (so at most one collection interval late).

use super::attribution::{Attribution, PodIdentity};
use super::names::{HOST_NAME, Naming, SCOPE_NAME, dcgm, otel};
use super::source::{DeviceInfo, GpuSample, THROTTLE_REASONS, XidEvent};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A string attribute.
pub fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(AnyV::StringValue(value.into())) }),
        ..Default::default()
    }
}

/// An int attribute.
pub fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(AnyV::IntValue(value)) }), ..Default::default() }
}

/// How the converter names and labels.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// The naming mode.
    pub naming: Naming,
    /// `host.name` (resource) and the dcgm host label's value.
    pub host: String,
    /// `Hostname` or `hostname` (dcgm naming).
    pub hostname_label: String,
    /// The VRAM peak window (zero: no peaks).
    pub peak_window: Duration,
    /// Emit per-process GPU memory (and its peaks).
    pub process_metrics: bool,
}

/// A closed peak window.
struct ClosedWindow {
    end_ns: u64,
    start_ns: u64,
    max: Option<u64>,
    procs: BTreeMap<u32, u64>,
}

/// The highest memory use (device and per process) within the current window.
#[derive(Default)]
struct Peak {
    window_ns: u64,
    start: Option<u64>,
    max: Option<u64>,
    procs: BTreeMap<u32, u64>,
}

impl Peak {
    /// Adds a sample at `t`; returns the window it closed, if any.
    fn observe(&mut self, t: u64, used: Option<u64>, procs: &[(u32, u64)]) -> Option<ClosedWindow> {
        if self.window_ns == 0 {
            return None;
        }
        let start = *self.start.get_or_insert(t);
        let mut closed = None;
        if t >= start.saturating_add(self.window_ns) {
            let max = self.max.take();
            let procs = std::mem::take(&mut self.procs);
            if max.is_some() || !procs.is_empty() {
                closed = Some(ClosedWindow { end_ns: start + self.window_ns, start_ns: start, max, procs });
            }
            self.start = Some(start + (t - start) / self.window_ns * self.window_ns);
        }
        if let Some(u) = used {
            self.max = Some(self.max.map_or(u, |m| m.max(u)));
        }
        for &(pid, b) in procs {
            let e = self.procs.entry(pid).or_insert(b);
            *e = (*e).max(b);
        }
        closed
    }
}

/// The identity attributes of every point of `d`.
fn base_attrs(opts: &ConvertOptions, d: &DeviceInfo) -> Vec<KeyValue> {
    match opts.naming {
        Naming::Otel => vec![
            kv(otel::HW_ID, &d.uuid),
            kv(otel::HW_TYPE, "gpu"),
            kv(otel::GPU_UUID, &d.uuid),
            kv_int(otel::GPU_INDEX, i64::from(d.index)),
            kv(otel::GPU_NAME, &d.name),
        ],
        Naming::Dcgm => vec![
            kv(dcgm::GPU, &d.index.to_string()),
            kv(dcgm::UUID, &d.uuid),
            kv(dcgm::MODEL_NAME, &d.name),
            kv(&opts.hostname_label, &opts.host),
        ],
    }
}

/// The attributes of a pod identity in `naming`.
pub fn pod_attrs(naming: Naming, id: &PodIdentity) -> Vec<KeyValue> {
    let keys = match naming {
        Naming::Otel => [
            otel::K8S_POD_NAME,
            otel::K8S_NAMESPACE_NAME,
            otel::K8S_CONTAINER_NAME,
            otel::K8S_POD_UID,
            otel::CONTAINER_ID,
        ],
        Naming::Dcgm => [dcgm::POD, dcgm::NAMESPACE, dcgm::CONTAINER, dcgm::POD_UID, dcgm::CONTAINER_ID],
    };
    let values = [&id.pod, &id.namespace, &id.container, &id.pod_uid, &id.container_id];
    keys.iter().zip(values).filter_map(|(k, v)| v.as_deref().map(|v| kv(k, v))).collect()
}

/// The attributes of one sample's attribution: the GPU's, and each process's by pid.
struct PodAttrs {
    gpu: Vec<KeyValue>,
    procs: HashMap<u32, Vec<KeyValue>>,
}

impl PodAttrs {
    fn new(naming: Naming, a: Option<&Attribution>) -> Self {
        let Some(a) = a else { return PodAttrs { gpu: Vec::new(), procs: HashMap::new() } };
        PodAttrs {
            gpu: a.gpu.as_ref().map(|g| pod_attrs(naming, g)).unwrap_or_default(),
            procs: a.processes.iter().map(|(pid, id)| (*pid, pod_attrs(naming, id))).collect(),
        }
    }

    fn of(&self, pid: u32) -> &[KeyValue] {
        self.procs.get(&pid).map_or(&[], |v| v.as_slice())
    }
}

/// Conversion state of one GPU.
struct DeviceState {
    attrs: Vec<KeyValue>,
    start_ns: Option<u64>,
    io_last_ns: Option<u64>,
    rx_bytes: f64,
    tx_bytes: f64,
    peak: Peak,
    xid_count: u64,
    last_xid: u64,
}

/// Converts samples of every device of one receiver.
pub struct Converter {
    opts: ConvertOptions,
    devices: HashMap<String, DeviceState>,
    xid_supported: bool,
}

impl Converter {
    /// A converter with no device state yet.
    pub fn new(opts: ConvertOptions) -> Self {
        Converter { opts, devices: HashMap::new(), xid_supported: false }
    }

    /// The options.
    pub fn options(&self) -> &ConvertOptions {
        &self.opts
    }

    fn state(&mut self, d: &DeviceInfo) -> &mut DeviceState {
        let opts = &self.opts;
        self.devices.entry(d.uuid.clone()).or_insert_with(|| DeviceState {
            attrs: base_attrs(opts, d),
            start_ns: None,
            io_last_ns: None,
            rx_bytes: 0.0,
            tx_bytes: 0.0,
            peak: Peak { window_ns: opts.peak_window.as_nanos().min(u128::from(u64::MAX)) as u64, ..Peak::default() },
            xid_count: 0,
            last_xid: 0,
        })
    }

    /// Registers a device before its first sample (so XID events for it are kept).
    pub fn register(&mut self, d: &DeviceInfo) {
        self.state(d);
    }

    /// Records XID events (`xid` support is then reported for every device).
    pub fn record_xid(&mut self, events: &[XidEvent]) {
        self.xid_supported = true;
        for e in events {
            match self.devices.get_mut(&e.uuid) {
                Some(st) => {
                    st.xid_count += 1;
                    st.last_xid = e.xid;
                }
                None => tracing::debug!(uuid = %e.uuid, xid = e.xid, "XID event for a GPU not sampled"),
            }
        }
    }

    /// The metrics of one sample of `d` taken at `t_ns`.
    pub fn convert(&mut self, d: &DeviceInfo, s: &GpuSample, t_ns: u64) -> Vec<Metric> {
        self.convert_attributed(d, s, t_ns, None)
    }

    /// The metrics of one sample of `d` taken at `t_ns`, with the GPU's and its processes' pods.
    pub fn convert_attributed(
        &mut self,
        d: &DeviceInfo,
        s: &GpuSample,
        t_ns: u64,
        attribution: Option<&Attribution>,
    ) -> Vec<Metric> {
        let naming = self.opts.naming;
        let pods = PodAttrs::new(naming, attribution);
        let xid = self.xid_supported;
        let procs: Vec<(u32, u64)> = match &s.processes {
            Some(ps) if self.opts.process_metrics => {
                ps.iter().filter_map(|p| p.used_bytes.map(|b| (p.pid, b))).collect()
            }
            _ => Vec::new(),
        };
        let st = self.state(d);
        let start = *st.start_ns.get_or_insert(t_ns);
        let closed = st.peak.observe(t_ns, s.memory_used_bytes, &procs);
        // PCIe bytes: the current rate over the time since the previous sample.
        let dt = st.io_last_ns.map_or(0.0, |l| t_ns.saturating_sub(l) as f64 / 1e9);
        st.io_last_ns = Some(t_ns);
        if let Some(r) = s.pcie_rx_kbps {
            st.rx_bytes += f64::from(r) * 1024.0 * dt;
        }
        if let Some(r) = s.pcie_tx_kbps {
            st.tx_bytes += f64::from(r) * 1024.0 * dt;
        }
        let b = Build { attrs: &st.attrs, pod: &pods.gpu, t: t_ns, start };
        let mut out = match naming {
            Naming::Otel => otel_metrics(&b, s, st, xid, &procs, &pods),
            Naming::Dcgm => dcgm_metrics(&b, s, st, xid, &procs, &pods),
        };
        if let Some(w) = closed {
            out.extend(peak_metrics(naming, &st.attrs, &pods, &w));
        }
        out
    }

    /// The export request for `metrics` (resource `host.name`, scope `inferwatch/nvml`).
    pub fn request(&self, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource { attributes: vec![kv(HOST_NAME, &self.opts.host)], ..Default::default() }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: SCOPE_NAME.into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }
}

/// Shared point data of one sample.
#[derive(Clone, Copy)]
struct Build<'a> {
    attrs: &'a [KeyValue],
    /// The GPU's pod, after the identity (empty on per-process points, which carry their own).
    pod: &'a [KeyValue],
    t: u64,
    start: u64,
}

/// A point value.
#[derive(Clone, Copy)]
enum V {
    I(i64),
    F(f64),
}

impl<'a> Build<'a> {
    fn point(&self, extra: &[KeyValue], v: V, start: u64) -> NumberDataPoint {
        let mut attributes = Vec::with_capacity(self.attrs.len() + self.pod.len() + extra.len());
        attributes.extend_from_slice(self.attrs);
        attributes.extend_from_slice(self.pod);
        attributes.extend_from_slice(extra);
        NumberDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: self.t,
            value: Some(match v {
                V::I(i) => NumV::AsInt(i),
                V::F(f) => NumV::AsDouble(f),
            }),
            ..Default::default()
        }
    }

    /// A gauge with one point per `(extra attributes, value)`.
    fn gauge(&self, name: &str, unit: &str, desc: &str, pts: Vec<(Vec<KeyValue>, V)>) -> Metric {
        let data_points = pts.iter().map(|(e, v)| self.point(e, *v, 0)).collect();
        metric(name, unit, desc, Data::Gauge(Gauge { data_points }))
    }

    /// A cumulative sum with one point per `(extra attributes, value)`.
    /// The same without the GPU's pod: per-process points carry their own.
    fn without_pod(&self) -> Build<'a> {
        Build { pod: &[], ..*self }
    }

    fn sum(&self, name: &str, unit: &str, desc: &str, monotonic: bool, pts: Vec<(Vec<KeyValue>, V)>) -> Metric {
        let data_points = pts.iter().map(|(e, v)| self.point(e, *v, self.start)).collect();
        metric(
            name,
            unit,
            desc,
            Data::Sum(Sum {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: monotonic,
            }),
        )
    }
}

fn metric(name: &str, unit: &str, desc: &str, data: Data) -> Metric {
    Metric { name: name.into(), description: desc.into(), unit: unit.into(), data: Some(data), ..Default::default() }
}

fn int(v: u64) -> V {
    V::I(i64::try_from(v).unwrap_or(i64::MAX))
}

fn one(v: V) -> Vec<(Vec<KeyValue>, V)> {
    vec![(Vec::new(), v)]
}

/// `first` then the process's pod attributes.
fn with_pod(first: KeyValue, pods: &PodAttrs, pid: u32) -> Vec<KeyValue> {
    let mut v = vec![first];
    v.extend_from_slice(pods.of(pid));
    v
}

fn otel_metrics(
    b: &Build<'_>,
    s: &GpuSample,
    st: &DeviceState,
    xid: bool,
    procs: &[(u32, u64)],
    pods: &PodAttrs,
) -> Vec<Metric> {
    let mut m = Vec::with_capacity(16);
    if let Some(u) = s.memory_used_bytes {
        m.push(b.sum(otel::MEMORY_USAGE, "By", "GPU memory used", false, one(int(u))));
    }
    if let Some(t) = s.memory_total_bytes {
        m.push(b.sum(otel::MEMORY_LIMIT, "By", "GPU memory size", false, one(int(t))));
    }
    if let (Some(u), Some(t)) = (s.memory_used_bytes, s.memory_total_bytes)
        && t > 0
    {
        let r = u as f64 / t as f64;
        m.push(b.gauge(otel::MEMORY_UTILIZATION, "1", "Fraction of GPU memory used", one(V::F(r))));
    }
    if let Some(f) = s.memory_free_bytes {
        m.push(b.sum(otel::MEMORY_FREE, "By", "GPU memory free", false, one(int(f))));
    }
    if let Some(u) = s.gpu_utilization_pct {
        let pts = vec![(vec![kv("hw.gpu.task", "general")], V::F(f64::from(u) / 100.0))];
        m.push(b.gauge(otel::UTILIZATION, "1", "Fraction of time the GPU was busy", pts));
    }
    if let Some(u) = s.memory_utilization_pct {
        let desc = "Fraction of time the memory controller was busy (bandwidth, not capacity)";
        m.push(b.gauge(otel::MEMORY_BANDWIDTH_UTILIZATION, "1", desc, one(V::F(f64::from(u) / 100.0))));
    }
    let clocks: Vec<_> = [("sm", s.sm_clock_mhz), ("memory", s.memory_clock_mhz)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (vec![kv(otel::CLOCK_TYPE, k)], V::I(i64::from(v)))))
        .collect();
    if !clocks.is_empty() {
        m.push(b.gauge(otel::CLOCK, "MHz", "GPU clock frequency", clocks));
    }
    if let Some(p) = s.power_mw {
        m.push(b.gauge(otel::POWER, "W", "GPU power draw", one(V::F(f64::from(p) / 1000.0))));
    }
    if let Some(p) = s.power_limit_mw {
        m.push(b.gauge(otel::POWER_LIMIT, "W", "Enforced GPU power limit", one(V::F(f64::from(p) / 1000.0))));
    }
    if let Some(e) = s.energy_mj {
        let desc = "GPU energy consumed since the driver loaded";
        m.push(b.sum(otel::ENERGY, "J", desc, true, one(V::F(e as f64 / 1000.0))));
    }
    if let Some(t) = s.temperature_c {
        m.push(b.gauge(otel::TEMPERATURE, "Cel", "GPU temperature", one(V::I(i64::from(t)))));
    }
    if let Some(bits) = s.throttle_reasons {
        let pts = THROTTLE_REASONS
            .iter()
            .map(|(bit, name)| (vec![kv(otel::THROTTLE_REASON, name)], V::I(i64::from(bits & bit != 0))))
            .collect();
        m.push(b.gauge(otel::THROTTLE, "1", "1 while the clocks-event (throttle) reason is active", pts));
    }
    let io: Vec<_> = [("receive", s.pcie_rx_kbps, st.rx_bytes), ("transmit", s.pcie_tx_kbps, st.tx_bytes)]
        .into_iter()
        .filter(|(_, r, _)| r.is_some())
        .map(|(dir, _, bytes)| (vec![kv("network.io.direction", dir)], V::I(bytes.round() as i64)))
        .collect();
    if !io.is_empty() {
        m.push(b.sum(otel::IO, "By", "PCIe bytes, integrated from NVML's throughput readings", true, io));
    }
    let mut errors: Vec<_> = [("corrected", s.ecc_corrected), ("uncorrected", s.ecc_uncorrected)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (vec![kv("error.type", k)], int(v))))
        .collect();
    if xid {
        errors.push((vec![kv("error.type", "xid")], int(st.xid_count)));
    }
    if !errors.is_empty() {
        m.push(b.sum(otel::ERRORS, "{error}", "GPU errors: volatile ECC counts and XID events", true, errors));
    }
    if !procs.is_empty() {
        let pts = procs
            .iter()
            .map(|&(pid, by)| (with_pod(kv_int(otel::PROCESS_PID, i64::from(pid)), pods, pid), int(by)))
            .collect();
        let desc = "GPU memory used by a compute process";
        m.push(b.without_pod().sum(otel::PROCESS_MEMORY_USAGE, "By", desc, false, pts));
    }
    m
}

fn mib(v: u64) -> V {
    int(v / MIB)
}

fn dcgm_metrics(
    b: &Build<'_>,
    s: &GpuSample,
    st: &DeviceState,
    xid: bool,
    procs: &[(u32, u64)],
    pods: &PodAttrs,
) -> Vec<Metric> {
    let mut m = Vec::with_capacity(20);
    let mut g = |name: &str, desc: &str, v: Option<V>| {
        if let Some(v) = v {
            m.push(b.gauge(name, "", desc, one(v)));
        }
    };
    g(dcgm::FB_USED, "Framebuffer memory used (in MiB).", s.memory_used_bytes.map(mib));
    g(dcgm::FB_FREE, "Framebuffer memory free (in MiB).", s.memory_free_bytes.map(mib));
    g(dcgm::FB_RESERVED, "Framebuffer memory reserved (in MiB).", s.memory_reserved_bytes.map(mib));
    g(dcgm::FB_TOTAL, "Framebuffer memory total (in MiB).", s.memory_total_bytes.map(mib));
    let pct = |v: Option<u32>| v.map(|v| V::I(i64::from(v)));
    g(dcgm::GPU_UTIL, "GPU utilization (in %).", pct(s.gpu_utilization_pct));
    g(dcgm::MEM_COPY_UTIL, "Memory utilization (in %).", pct(s.memory_utilization_pct));
    g(dcgm::SM_CLOCK, "SM clock frequency (in MHz).", pct(s.sm_clock_mhz));
    g(dcgm::MEM_CLOCK, "Memory clock frequency (in MHz).", pct(s.memory_clock_mhz));
    g(dcgm::GPU_TEMP, "GPU temperature (in C).", pct(s.temperature_c));
    let watts = |v: Option<u32>| v.map(|v| V::F(f64::from(v) / 1000.0));
    g(dcgm::POWER_USAGE, "Power draw (in W).", watts(s.power_mw));
    g(dcgm::POWER_MGMT_LIMIT, "Power management limit (in W).", watts(s.power_limit_mw));
    g(dcgm::TOTAL_ENERGY, "Total energy consumption since boot (in mJ).", s.energy_mj.map(int));
    g(dcgm::CLOCKS_EVENT_REASONS, "Current clock event reasons (bitmask).", s.throttle_reasons.map(int));
    let bps = |v: Option<u32>| v.map(|v| int(u64::from(v) * 1024));
    g(dcgm::PCIE_TX_BYTES, "PCIe transmit rate (in B/s).", bps(s.pcie_tx_kbps));
    g(dcgm::PCIE_RX_BYTES, "PCIe receive rate (in B/s).", bps(s.pcie_rx_kbps));
    g(dcgm::ECC_SBE_VOL, "Total number of single-bit volatile ECC errors.", s.ecc_corrected.map(int));
    g(dcgm::ECC_DBE_VOL, "Total number of double-bit volatile ECC errors.", s.ecc_uncorrected.map(int));
    g(dcgm::XID_ERRORS, "Value of the last XID error encountered.", xid.then_some(int(st.last_xid)));
    if !procs.is_empty() {
        let pts =
            procs.iter().map(|&(pid, by)| (with_pod(kv(dcgm::PID, &pid.to_string()), pods, pid), mib(by))).collect();
        let desc = "GPU memory used by a compute process (in MiB).";
        m.push(b.without_pod().gauge(dcgm::PROCESS_FB_USED, "", desc, pts));
    }
    m
}

fn peak_metrics(naming: Naming, attrs: &[KeyValue], pods: &PodAttrs, w: &ClosedWindow) -> Vec<Metric> {
    let b = Build { attrs, pod: &pods.gpu, t: w.end_ns, start: w.start_ns };
    let pb = b.without_pod();
    let mut out = Vec::new();
    let gauge = |b: &Build<'_>, name: &str, unit: &str, desc: &str, pts: Vec<(Vec<KeyValue>, V)>| {
        let data_points = pts.iter().map(|(e, v)| b.point(e, *v, w.start_ns)).collect();
        metric(name, unit, desc, Data::Gauge(Gauge { data_points }))
    };
    let (dev_name, proc_name, unit) = match naming {
        Naming::Otel => (otel::MEMORY_PEAK, otel::PROCESS_MEMORY_PEAK, "By"),
        Naming::Dcgm => (dcgm::FB_USED_PEAK, dcgm::PROCESS_FB_USED_PEAK, ""),
    };
    let value = |by: u64| match naming {
        Naming::Otel => int(by),
        Naming::Dcgm => mib(by),
    };
    if let Some(max) = w.max {
        out.push(gauge(&b, dev_name, unit, "Highest GPU memory use over the peak window", one(value(max))));
    }
    if !w.procs.is_empty() {
        let pts = w
            .procs
            .iter()
            .map(|(&pid, &by)| {
                let a = match naming {
                    Naming::Otel => kv_int(otel::PROCESS_PID, i64::from(pid)),
                    Naming::Dcgm => kv(dcgm::PID, &pid.to_string()),
                };
                (with_pod(a, pods, pid), value(by))
            })
            .collect();
        let desc = "Highest GPU memory use of a compute process over the peak window";
        out.push(gauge(&pb, proc_name, unit, desc, pts));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_windows_close_and_skip_gaps() {
        let mut p = Peak { window_ns: 10, ..Peak::default() };
        assert!(p.observe(100, Some(5), &[(1, 7)]).is_none());
        assert!(p.observe(105, Some(9), &[(1, 3)]).is_none());
        let w = p.observe(110, Some(2), &[]).unwrap();
        assert_eq!((w.start_ns, w.end_ns, w.max), (100, 110, Some(9)));
        assert_eq!(w.procs.get(&1), Some(&7));
        // A gap over two windows: the one holding the sample at 110 closes, the empty one does not appear.
        let w = p.observe(135, Some(4), &[]).unwrap();
        assert_eq!((w.start_ns, w.end_ns, w.max), (110, 120, Some(2)));
        let w = p.observe(140, None, &[]).unwrap();
        assert_eq!((w.start_ns, w.end_ns, w.max), (130, 140, Some(4)));
        let mut off = Peak::default();
        assert!(off.observe(1, Some(1), &[]).is_none() && off.observe(1_000_000, Some(1), &[]).is_none());
    }
}
