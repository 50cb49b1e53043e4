//! The sampling loop: every interval, the source is moved onto a blocking thread (NVML calls
//! block), polled for XID events and sampled device by device, and moved back; the samples are
//! converted and sent down the metrics pipeline. A device that fails is counted, logged once per
//! change of state, skipped for this interval and tried again at the next; the others go on.

use super::NvmlStats;
use super::attribution::{Attribution, Attributor};
use super::convert::Converter;
use super::pod_resources::PodResourcesWatcher;
use super::source::{DeviceInfo, ErrorKind, GpuSample, GpuSource, SourceError, XidEvent};
use inferwatch_core::component::ComponentId;
use inferwatch_core::consumer::ConsumerRef;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::{ReceiverMetrics, Telemetry};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Wall-clock time in nanoseconds since the Unix epoch.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// What one blocking round returns: the source back, XID events, each device's result with its time.
pub type Round = (Box<dyn GpuSource>, Option<Vec<XidEvent>>, Vec<(u64, Result<GpuSample, SourceError>)>);

/// Polls XID events, then samples every device once.
pub fn sample_round(mut source: Box<dyn GpuSource>, devices: &[DeviceInfo]) -> Round {
    let xid = source.poll_xid();
    let results = devices.iter().map(|d| (now_ns(), source.sample(d))).collect();
    (source, xid, results)
}

/// Everything the loop needs.
pub(crate) struct Sampler {
    /// The receiver.
    pub id: ComponentId,
    /// Time between rounds.
    pub interval: Duration,
    /// The source (moved to the blocking thread during a round).
    pub source: Box<dyn GpuSource>,
    /// The sampled devices.
    pub devices: Arc<Vec<DeviceInfo>>,
    /// Sample → OTLP.
    pub converter: Converter,
    /// The metrics pipeline.
    pub consumer: ConsumerRef,
    /// The receiver's own counters.
    pub stats: NvmlStats,
    /// The agent's self-telemetry (error counter by device and reason).
    pub telemetry: Arc<Telemetry>,
    /// otelcol accepted / refused counters.
    pub metrics: ReceiverMetrics,
    /// GPUs and processes → pods (with `pod_attribution`; moved to the blocking thread with the source).
    pub attributor: Option<Attributor>,
    /// The kubelet pod-resources lister (listed once before the first round, then periodically).
    pub watcher: Option<Arc<PodResourcesWatcher>>,
    /// Set on shutdown.
    pub cancel: CancellationToken,
}

impl Sampler {
    /// Samples until cancelled.
    pub(crate) async fn run(self) {
        let Sampler {
            id,
            interval,
            source,
            devices,
            mut converter,
            consumer,
            stats,
            telemetry,
            metrics,
            attributor,
            watcher,
            cancel,
        } = self;
        if let Some(w) = watcher {
            // The first series already carry their pods: list before the first round (bounded by the timeout).
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = w.refresh() => {}
            }
            tokio::spawn(w.run(cancel.clone()));
        }
        let mut attributor = attributor;
        for d in devices.iter() {
            converter.register(d);
        }
        let job = id.to_string();
        let mut failing: HashMap<String, ErrorKind> = HashMap::new();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut source = Some(source);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let Some(src) = source.take() else { return };
            let devs = devices.clone();
            let mut attr = attributor.take();
            let round = tokio::task::spawn_blocking(move || {
                let (src, xid, results) = sample_round(src, &devs);
                let attributions = attr.as_mut().map(|a| {
                    let pairs: Vec<_> = devs.iter().zip(&results).map(|(d, (_, r))| (d, r.as_ref().ok())).collect();
                    a.attribute(&pairs)
                });
                ((src, xid, results), attr, attributions)
            });
            let joined = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                r = round => r,
            };
            let ((src, xid, results), attr, attributions) = match joined {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(receiver = %id, error = %e, "the NVML sampling thread failed; GPU sampling stops");
                    stats.available.set(0);
                    return;
                }
            };
            source = Some(src);
            attributor = attr;
            let attributions: Vec<Option<Attribution>> = match attributions {
                Some(v) => v.into_iter().map(Some).collect(),
                None => vec![None; devices.len()],
            };
            if let Some(events) = xid {
                for e in &events {
                    tracing::warn!(receiver = %id, gpu.uuid = %e.uuid, xid = e.xid, "GPU reported an XID error");
                }
                converter.record_xid(&events);
            }
            let mut out = Vec::new();
            for ((d, (t, r)), a) in devices.iter().zip(results).zip(attributions) {
                match r {
                    Ok(s) => {
                        if failing.remove(&d.uuid).is_some() {
                            tracing::info!(receiver = %id, gpu.uuid = %d.uuid, gpu.index = d.index, "GPU answers again");
                        }
                        stats.samples.inc();
                        out.extend(converter.convert_attributed(d, &s, t, a.as_ref()));
                    }
                    Err(e) => {
                        stats.sample_errors.inc();
                        crate::prometheus::SCRAPE_FAILURES.get(&telemetry, [&job, &d.uuid, e.kind.as_str()]).inc();
                        if failing.insert(d.uuid.clone(), e.kind) != Some(e.kind) {
                            tracing::warn!(receiver = %id, gpu.uuid = %d.uuid, gpu.index = d.index,
                                reason = %e.kind, error = %e.message,
                                "GPU sampling failed; counted, retrying every {interval:?}");
                        } else {
                            tracing::debug!(receiver = %id, gpu.uuid = %d.uuid, error = %e, "GPU sampling failed again");
                        }
                    }
                }
            }
            if out.is_empty() {
                continue;
            }
            let payload = Payload::Metrics(converter.request(out));
            let items = payload.item_count();
            let sent = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                r = consumer.consume(payload) => r,
            };
            match sent {
                Ok(()) => metrics.accepted(Signal::Metrics, items),
                Err(e) => {
                    metrics.refused(Signal::Metrics, items);
                    tracing::debug!(receiver = %id, error = %e, "the pipeline refused GPU metrics; dropped");
                }
            }
        }
    }
}
