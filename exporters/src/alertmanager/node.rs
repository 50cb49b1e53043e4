//! The running exporter: the firing set, escalations and the re-sending of firing alerts.

use super::MAX_ACTIVE;
use super::encode::{attr_string, is_alert};
use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, Node, NodeRef};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::Payload;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Firing alerts by `alert.id`, with an insertion counter for eviction.
#[derive(Default)]
pub(super) struct Active {
    pub(super) map: HashMap<String, (u64, LogRecord)>,
    pub(super) seq: u64,
}

impl Active {
    fn insert(&mut self, id: String, r: LogRecord) {
        if !self.map.contains_key(&id)
            && self.map.len() >= MAX_ACTIVE
            && let Some(oldest) = self.map.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
        self.seq += 1;
        self.map.insert(id, (self.seq, r));
    }

    fn records(&self) -> Vec<LogRecord> {
        let mut v: Vec<&(u64, LogRecord)> = self.map.values().collect();
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, r)| r.clone()).collect()
    }
}

/// `r` turned into its resolution at event time `t` (for a replaced severity).
pub(super) fn resolved_copy(r: &LogRecord, t: u64) -> LogRecord {
    let mut c = r.clone();
    c.time_unix_nano = t;
    for kv in c.attributes.iter_mut() {
        if kv.key == "alert.state" {
            kv.value = Some(AnyValue { value: Some(any_value::Value::StringValue("resolved".into())) });
        }
    }
    c
}

pub(super) fn logs(records: Vec<LogRecord>) -> Payload {
    Payload::Logs(ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    })
}

/// The running exporter: tracks firing alerts and feeds the queued sender.
pub struct AlertmanagerExporter {
    pub(super) name: String,
    pub(super) inner: NodeRef,
    pub(super) send_resolved: bool,
    pub(super) repeat: Option<Duration>,
    pub(super) active: Arc<Mutex<Active>>,
    pub(super) ignored: Counter,
    pub(super) stop: CancellationToken,
    pub(super) task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl AlertmanagerExporter {
    /// The records to send for `req`, updating the firing set.
    fn outgoing(&self, req: &ExportLogsServiceRequest) -> Vec<LogRecord> {
        let mut out = Vec::new();
        let mut ignored = 0u64;
        let mut active = self.active.lock();
        for r in req.resource_logs.iter().flat_map(|rl| &rl.scope_logs).flat_map(|sl| &sl.log_records) {
            if !is_alert(r) {
                ignored += 1;
                continue;
            }
            let id = attr_string(r, "alert.id").unwrap_or_default();
            let severity = attr_string(r, "alert.severity");
            let firing = attr_string(r, "alert.state").as_deref() == Some("firing");
            let prev = if firing {
                active.map.get(&id).map(|(_, p)| p.clone())
            } else {
                active.map.remove(&id).map(|(_, p)| p)
            };
            if let Some(p) = prev
                && attr_string(&p, "alert.severity") != severity
                && (firing || self.send_resolved)
            {
                // Another severity is another Alertmanager alert: resolve the old one.
                out.push(resolved_copy(&p, r.time_unix_nano));
            }
            if firing {
                active.insert(id, r.clone());
                out.push(r.clone());
            } else if self.send_resolved {
                out.push(r.clone());
            }
        }
        if ignored > 0 {
            tracing::debug!(exporter = %self.name, records = ignored, "log records that are not alerts ignored");
            self.ignored.inc_by(ignored);
        }
        out
    }
}

#[async_trait]
impl Consumer for AlertmanagerExporter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let decoded = data.decoded().map_err(|e| ConsumeError::Permanent(format!("cannot decode logs: {e}")))?;
        let Payload::Logs(req) = decoded.as_ref() else { return Ok(()) };
        let out = self.outgoing(req);
        if out.is_empty() {
            return Ok(());
        }
        self.inner.consume(logs(out)).await
    }
}

#[async_trait]
impl Node for AlertmanagerExporter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.inner.start().await?;
        let Some(every) = self.repeat else { return Ok(()) };
        let (inner, active, stop, name) =
            (self.inner.clone(), self.active.clone(), self.stop.clone(), self.name.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let records = active.lock().records();
                if records.is_empty() {
                    continue;
                }
                let n = records.len();
                if let Err(e) = inner.consume(logs(records)).await {
                    tracing::warn!(exporter = %name, alerts = n, error = %e, "re-sending firing alerts failed; next try in one interval");
                }
            }
        });
        *self.task.lock().await = Some(task);
        Ok(())
    }

    async fn shutdown(&self, deadline: Instant) -> u64 {
        self.stop.cancel();
        if let Some(t) = self.task.lock().await.take() {
            let _ = t.await;
        }
        self.inner.shutdown(deadline).await
    }
}
