//! The `nvml` receiver: samples every visible NVIDIA GPU through NVML and emits OTLP metrics,
//! named after OpenTelemetry's `hw.gpu.*` conventions or dcgm-exporter's `DCGM_FI_DEV_*`.
//!
//! ```yaml
//! receivers:
//!   nvml:
//!     collection_interval: 200ms   # default
//!     devices: []                  # all; or indexes / UUIDs: [0, "GPU-5fc2..."]
//!     naming: otel                 # or dcgm
//!     dcgm_hostname_label: Hostname  # or hostname (dcgm-exporter main)
//!     library_path: null           # default: libnvidia-ml.so.1 from the loader's path
//!     process_metrics: true        # GPU memory per compute process
//!     peak_window: 1m              # derived VRAM peak per window; 0 = off
//!     host_name: null              # default: the OS host name
//!     source: nvml                 # or fake: scripted GPUs for tests and demos (docs/nvml.md)
//!     fake_processes: []           # source: fake only: [{gpu: 0, pid: 4242, used_bytes: ...}]
//!     pod_attribution:             # absent: off; {} for the defaults below (Kubernetes nodes)
//!       proc_root: /proc           # the host's procfs: <pid>/cgroup → pod UID, container id
//!       pod_resources_socket: /var/lib/kubelet/pod-resources/kubelet.sock  # GPU → pod names; "" = off
//!       refresh_interval: 30s
//! ```
//!
//! Readings come from a [`GpuSource`]: [`real::NvmlSource`] in the agent, [`fake::FakeSource`]
//! in tests and with `source: fake`; the same loop ([`sampler`]) runs on both. Names and units:
//! [`names`]; conversion and attribute placement: [`convert`]; pods: [`attribution`] (joining
//! [`cgroup`] and [`pod_resources`]).
//!
//! Without a GPU (no library, missing symbol, driver not loaded, no permission, no device) the
//! receiver logs one warning naming the reason, reports `available` = 0 in [`NvmlStats`], stays
//! idle and `start` succeeds, so the rest of the agent runs. Failed device samples are counted in
//! [`NvmlStats`] and in `inferwatch_scrape_failures{job=<receiver id>, target=<GPU UUID>, reason}`.

pub mod attribution;
pub mod cgroup;
pub mod config;
pub mod convert;
pub mod fake;
pub mod names;
pub mod pod_resources;
pub mod real;
mod sampler;
pub mod source;

use async_trait::async_trait;
use config::NvmlConfig;
use convert::{ConvertOptions, Converter};
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Receiver, ReceiverConsumers, ReceiverFactory,
};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use source::{DeviceInfo, GpuSource, Unavailable};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use sampler::{Round, sample_round};

/// How long `shutdown` waits for the loop before abandoning it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Opens a GPU source (blocking; run off the async runtime).
pub type SourceOpener = Arc<dyn Fn(&NvmlConfig) -> Result<Box<dyn GpuSource>, Unavailable> + Send + Sync>;

/// The opener of the agent: NVML, or the scripted fake with `source: fake`.
pub fn nvml_opener() -> SourceOpener {
    Arc::new(|c: &NvmlConfig| match c.source {
        config::SourceKind::Nvml => real::NvmlSource::open(c.library_path.as_deref(), c.process_metrics)
            .map(|s| Box::new(s) as Box<dyn GpuSource>),
        config::SourceKind::Fake => Ok(Box::new(c.fake_source()) as Box<dyn GpuSource>),
    })
}

/// Builds `nvml` receivers.
pub struct NvmlReceiverFactory;

impl ReceiverFactory for NvmlReceiverFactory {
    fn type_name(&self) -> &'static str {
        "nvml"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Metrics]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(NvmlConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
    ) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(NvmlReceiver::new(
            ctx,
            inferwatch_core::component::typed::<NvmlConfig>(parsed)?.clone(),
            nvml_opener(),
        )))
    }
}

/// `inferwatch_nvml_available{receiver}`: 1 while a receiver samples GPUs through NVML, 0 while it idles.
pub const NVML_AVAILABLE: inferwatch_core::telemetry::Gauges<1> = inferwatch_core::telemetry::Gauges::new(
    "inferwatch_nvml_available",
    "1 when an nvml receiver samples GPUs through NVML, 0 when it idles without it",
    ["receiver"],
);

/// The receiver's own counters; `available` is `inferwatch_nvml_available{receiver}` on the self-metrics endpoint.
#[derive(Clone, Default)]
pub struct NvmlStats {
    /// 1 while GPUs are sampled, 0 when there is no GPU telemetry.
    pub available: Gauge,
    /// Device samples taken.
    pub samples: Counter,
    /// Device samples that failed.
    pub sample_errors: Counter,
    reason: Arc<Mutex<Option<Unavailable>>>,
}

impl NvmlStats {
    /// Why there is no GPU telemetry, if there is none.
    pub fn unavailable(&self) -> Option<Unavailable> {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_unavailable(&self, r: Option<Unavailable>) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }
}

/// An `nvml` receiver.
pub struct NvmlReceiver {
    id: ComponentId,
    telemetry: Arc<Telemetry>,
    config: NvmlConfig,
    opener: SourceOpener,
    stats: NvmlStats,
    devices: Vec<DeviceInfo>,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

/// Opens the source and picks the configured devices.
fn open(config: &NvmlConfig, opener: &SourceOpener) -> Result<(Box<dyn GpuSource>, Vec<DeviceInfo>), Unavailable> {
    let mut source = opener(config)?;
    let all = source.devices().map_err(|e| Unavailable::Other(format!("cannot list the GPUs: {e}")))?;
    let picked: Vec<DeviceInfo> = all.iter().filter(|d| config.selects(d)).cloned().collect();
    if picked.is_empty() {
        let visible: Vec<String> = all.iter().map(|d| format!("{} ({})", d.index, d.uuid)).collect();
        return Err(Unavailable::NoDevice(if all.is_empty() {
            "NVML lists no GPU".into()
        } else {
            format!("none of the visible GPUs [{}] matches `devices`", visible.join(", "))
        }));
    }
    Ok((source, picked))
}

impl NvmlReceiver {
    /// A receiver that opens its source with `opener` on `start`.
    pub fn new(ctx: CreateContext, config: NvmlConfig, opener: SourceOpener) -> Self {
        let stats =
            NvmlStats { available: NVML_AVAILABLE.get(&ctx.telemetry, [&ctx.id.to_string()]), ..NvmlStats::default() };
        NvmlReceiver { id: ctx.id, telemetry: ctx.telemetry, config, opener, stats, devices: Vec::new(), running: None }
    }

    /// The receiver's counters (shared; they keep counting after this call).
    pub fn stats(&self) -> NvmlStats {
        self.stats.clone()
    }

    /// The devices being sampled (empty before `start` or without GPUs).
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }
}

#[async_trait]
impl Receiver for NvmlReceiver {
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError> {
        if self.running.is_some() {
            return Err(ComponentError::Start(format!("receiver {} is already started", self.id)));
        }
        let Some(consumer) = consumers.metrics.clone() else {
            return Err(ComponentError::Start(format!("receiver {} is in no metrics pipeline", self.id)));
        };
        let (config, opener) = (self.config.clone(), self.opener.clone());
        let opened = tokio::task::spawn_blocking(move || open(&config, &opener))
            .await
            .unwrap_or_else(|e| Err(Unavailable::Other(format!("the NVML initialisation thread failed: {e}"))));
        let (source, devices) = match opened {
            Ok(o) => o,
            Err(reason) => {
                tracing::warn!(receiver = %self.id, reason = reason.code(),
                    "no GPU telemetry: {reason}; the nvml receiver stays idle and the rest of the agent runs");
                self.stats.available.set(0);
                self.stats.set_unavailable(Some(reason));
                return Ok(());
            }
        };
        self.stats.available.set(1);
        self.stats.set_unavailable(None);
        let names: Vec<String> = devices.iter().map(|d| format!("{} {} ({})", d.index, d.name, d.uuid)).collect();
        tracing::info!(receiver = %self.id, gpus = %names.join(", "), interval = ?self.config.interval(),
            naming = ?self.config.naming, "nvml receiver sampling");
        self.devices = devices.clone();
        let converter = Converter::new(ConvertOptions {
            naming: self.config.naming,
            host: self.config.host(),
            hostname_label: self.config.dcgm_hostname_label.clone(),
            peak_window: self.config.peak_window(),
            process_metrics: self.config.process_metrics,
        });
        let (attributor, watcher) = match &self.config.pod_attribution {
            None => (None, None),
            Some(p) => {
                let receiver = self.id.to_string();
                let watcher = (!p.pod_resources_socket.trim().is_empty()).then(|| {
                    Arc::new(pod_resources::PodResourcesWatcher::new(
                        &receiver,
                        p.pod_resources_socket.clone().into(),
                        p.refresh_interval(),
                        p.timeout(),
                        p.resource_names.clone(),
                        self.telemetry.clone(),
                    ))
                });
                let cache = cgroup::PidCache::new(&p.proc_root, p.max_processes, p.refresh_interval());
                tracing::info!(receiver = %self.id, proc_root = %p.proc_root, socket = %p.pod_resources_socket,
                    "nvml pod attribution on");
                let a = attribution::Attributor::new(Some(cache), watcher.clone(), Some((&self.telemetry, &receiver)));
                (Some(a), watcher)
            }
        };
        let cancel = CancellationToken::new();
        let sampler = sampler::Sampler {
            id: self.id.clone(),
            interval: self.config.interval(),
            source,
            devices: Arc::new(devices),
            converter,
            consumer,
            stats: self.stats.clone(),
            telemetry: self.telemetry.clone(),
            metrics: self.telemetry.receiver(&self.id, "nvml"),
            attributor,
            watcher,
            cancel: cancel.clone(),
        };
        self.running = Some((cancel, tokio::spawn(sampler.run())));
        Ok(())
    }

    async fn shutdown(&mut self) {
        let Some((cancel, mut task)) = self.running.take() else { return };
        cancel.cancel();
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(receiver = %self.id, error = %e, "nvml sampling loop failed"),
            Err(_) => {
                tracing::warn!(receiver = %self.id, "the nvml sampling loop did not stop in time; abandoning it");
                task.abort();
            }
        }
        tracing::debug!(receiver = %self.id, "nvml receiver stopped");
    }
}

impl Drop for NvmlReceiver {
    fn drop(&mut self) {
        if let Some((cancel, _)) = &self.running {
            cancel.cancel();
        }
    }
}
