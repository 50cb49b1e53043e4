//! The eval harness: runs payloads through an inferwatch pipeline configuration in-process,
//! on the data's own time, and captures what comes out.
//!
//! The configuration's pipelines take data from the receiver `eval_feed` and send what the
//! evaluation scores to the exporter `eval_capture`; both are added by the harness on top of
//! the registry it is given. Nothing here reads the wall clock except to back off when a
//! pipeline refuses data.

use crate::error::EvalError;
use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, Receiver, ReceiverConsumers,
    ReceiverFactory, parse_config,
};
use inferwatch_core::config::load_str;
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::graph::Service;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::registry::Registry;
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Type name of the harness's receiver.
pub const FEED: &str = "eval_feed";
/// Type name of the harness's exporter.
pub const CAPTURE: &str = "eval_capture";
/// How long a refused payload is retried before the evaluation fails.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// Shutdown budget once the input ended.
const SHUTDOWN: Duration = Duration::from_secs(30);

/// A running pipeline fed by the evaluation.
pub struct Harness {
    service: Service,
    feed: ReceiverConsumers,
    captured: Arc<Mutex<Captured>>,
}

impl Harness {
    /// Builds and starts the pipelines of `config_yaml` with `registry` plus `eval_feed` / `eval_capture`.
    pub async fn start(config_yaml: &str, mut registry: Registry) -> Result<Harness, EvalError> {
        let slot: Arc<Mutex<Option<ReceiverConsumers>>> = Arc::default();
        let captured: Arc<Mutex<Captured>> = Arc::default();
        registry.add_receiver(Arc::new(FeedFactory { slot: slot.clone() }));
        registry.add_exporter(Arc::new(CaptureFactory { captured: captured.clone() }));
        let cfg = load_str("eval pipeline", config_yaml, &|_| None).map_err(EvalError::config)?;
        let errors = inferwatch_core::config::validate(&cfg, &registry);
        if !errors.is_empty() {
            return Err(EvalError::config(errors));
        }
        let telemetry = Arc::new(Telemetry::new());
        let mut service = Service::build(&cfg, &registry, telemetry).map_err(|e| EvalError::Pipeline(e.to_string()))?;
        service.start().await.map_err(|e| EvalError::Pipeline(e.to_string()))?;
        let feed = slot.lock().take().unwrap_or_default();
        Ok(Harness { service, feed, captured })
    }

    /// Sends one payload into every pipeline that takes its signal; refusals are retried. A
    /// payload of a signal no pipeline takes from `eval_feed` is skipped (as `replay` does).
    pub async fn send(&self, payload: Payload) -> Result<(), EvalError> {
        let Some(consumer) = self.feed.get(payload.signal()) else {
            return Ok(());
        };
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            match consumer.consume(payload.clone()).await {
                Ok(()) => return Ok(()),
                Err(ConsumeError::Refused { retry_after, message, .. }) if Instant::now() < deadline => {
                    tracing::debug!(%message, "eval pipeline refused data; retrying");
                    tokio::time::sleep(retry_after.unwrap_or(Duration::from_millis(5))).await;
                }
                Err(e) => return Err(EvalError::Pipeline(e.to_string())),
            }
        }
    }

    /// Ends the input (event time moves to the end), drains every pipeline and returns the capture.
    pub async fn finish(self) -> Result<Captured, EvalError> {
        self.service.end_of_input().await;
        let report = self.service.shutdown(SHUTDOWN).await;
        if report.undelivered > 0 {
            return Err(EvalError::Pipeline(format!("{} items not delivered at shutdown", report.undelivered)));
        }
        Ok(std::mem::take(&mut *self.captured.lock()))
    }
}

/// One number point taken from the capture.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Event time.
    pub time_ns: u64,
    /// Resource attributes overlaid with the point's attributes, as strings.
    pub attrs: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// One log record taken from the capture.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Event time.
    pub time_ns: u64,
    /// The record's event name.
    pub event_name: String,
    /// Severity number.
    pub severity: i32,
    /// Resource attributes overlaid with the record's attributes, as strings.
    pub attrs: BTreeMap<String, String>,
}

/// What reached `eval_capture`: number points of the kept metrics and every log record.
#[derive(Debug, Default)]
pub struct Captured {
    points: BTreeMap<String, Vec<Point>>,
    records: Vec<Record>,
}

impl Captured {
    /// Every number point of the metric `name` (gauges and sums), in arrival order.
    pub fn points(&self, name: &str) -> Vec<Point> {
        self.points.get(name).cloned().unwrap_or_default()
    }

    /// Names of every captured metric.
    pub fn metric_names(&self) -> Vec<String> {
        self.points.keys().cloned().collect()
    }

    /// Every captured log record, in arrival order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    fn add_metrics(
        &mut self,
        req: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
        keep: &Keep,
    ) {
        for rm in &req.resource_metrics {
            let resource = rm.resource.as_ref().map(|r| attrs(&r.attributes)).unwrap_or_default();
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if !keep.wants(&m.name) {
                        continue;
                    }
                    let dps = match &m.data {
                        Some(metric::Data::Gauge(g)) => &g.data_points,
                        Some(metric::Data::Sum(s)) => &s.data_points,
                        _ => continue,
                    };
                    let out = self.points.entry(m.name.clone()).or_default();
                    for dp in dps {
                        let value = match dp.value {
                            Some(number_data_point::Value::AsDouble(v)) => v,
                            Some(number_data_point::Value::AsInt(v)) => v as f64,
                            None => continue,
                        };
                        let mut a = resource.clone();
                        a.extend(attrs(&dp.attributes));
                        out.push(Point { time_ns: dp.time_unix_nano, attrs: a, value });
                    }
                }
            }
        }
    }

    fn add_logs(&mut self, req: &ExportLogsServiceRequest) {
        for rl in &req.resource_logs {
            let resource = rl.resource.as_ref().map(|r| attrs(&r.attributes)).unwrap_or_default();
            for sl in &rl.scope_logs {
                for lr in &sl.log_records {
                    self.records.push(record(&resource, lr));
                }
            }
        }
    }
}

fn record(resource: &BTreeMap<String, String>, lr: &LogRecord) -> Record {
    let mut a = resource.clone();
    a.extend(attrs(&lr.attributes));
    let time_ns = if lr.time_unix_nano != 0 { lr.time_unix_nano } else { lr.observed_time_unix_nano };
    Record { time_ns, event_name: lr.event_name.clone(), severity: lr.severity_number, attrs: a }
}

/// Attributes as strings (numbers in Rust's shortest form, booleans as true/false).
pub fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(value_string).unwrap_or_default())).collect()
}

fn value_string(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

struct FeedFactory {
    slot: Arc<Mutex<Option<ReceiverConsumers>>>,
}

impl ReceiverFactory for FeedFactory {
    fn type_name(&self) -> &'static str {
        FEED
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn validate(&self, _cfg: &serde_json::Value) -> Result<(), FieldError> {
        Ok(())
    }
    fn create(&self, _ctx: CreateContext, _cfg: &serde_json::Value) -> Result<Box<dyn Receiver>, ComponentError> {
        Ok(Box::new(Feed { slot: self.slot.clone() }))
    }
}

struct Feed {
    slot: Arc<Mutex<Option<ReceiverConsumers>>>,
}

#[async_trait]
impl Receiver for Feed {
    async fn start(&mut self, consumers: ReceiverConsumers) -> Result<(), ComponentError> {
        *self.slot.lock() = Some(consumers);
        Ok(())
    }
    async fn shutdown(&mut self) {}
}

/// Settings of `eval_capture`: which metrics to keep (all when empty).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CaptureConfig {
    metrics: Vec<String>,
}

struct Keep(HashSet<String>);

impl Keep {
    fn wants(&self, name: &str) -> bool {
        self.0.is_empty() || self.0.contains(name)
    }
}

struct CaptureFactory {
    captured: Arc<Mutex<Captured>>,
}

impl ExporterFactory for CaptureFactory {
    fn type_name(&self) -> &'static str {
        CAPTURE
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<CaptureConfig>(cfg).map(|_| ())
    }
    fn create(&self, _ctx: CreateContext, cfg: &serde_json::Value, _signal: Signal) -> Result<NodeRef, ComponentError> {
        let c: CaptureConfig = parse_config(cfg)?;
        Ok(Arc::new(Capture { captured: self.captured.clone(), keep: Keep(c.metrics.into_iter().collect()) }))
    }
}

struct Capture {
    captured: Arc<Mutex<Captured>>,
    keep: Keep,
}

#[async_trait]
impl Consumer for Capture {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let data = data.into_decoded().map_err(|e| ConsumeError::Permanent(e.to_string()))?;
        let mut c = self.captured.lock();
        match &data {
            Payload::Metrics(m) => c.add_metrics(m, &self.keep),
            Payload::Logs(l) => c.add_logs(l),
            Payload::Traces(_) | Payload::Encoded(_) => {}
        }
        Ok(())
    }
}

#[async_trait]
impl Node for Capture {
    async fn shutdown(&self, _deadline: Instant) -> u64 {
        0
    }
}
