//! Reading GPU samples out of OTLP metrics and writing the joined values into span and data-point
//! attributes, in place.

use super::config::{Checked, OutputKeys};
use super::join::{Enrichment, GpuSelector, join};
use super::shared::JoinCounts;
use super::store::{Field, GpuIdent, GpuStore};
use inferwatch_core::pdata::Signal;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, metric::Data, number_data_point};
use std::borrow::Cow;

/// The value of `key` in `point`, else in `resource`.
fn lookup<'a>(key: &str, point: &'a [KeyValue], resource: &'a [KeyValue]) -> Option<&'a Value> {
    point
        .iter()
        .chain(resource.iter())
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn as_str(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::StringValue(s) if !s.is_empty() => Some(Cow::Borrowed(s)),
        Value::IntValue(i) => Some(Cow::Owned(i.to_string())),
        _ => None,
    }
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::IntValue(i) => Some(*i),
        Value::StringValue(s) => s.trim().parse().ok(),
        Value::DoubleValue(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(*d as i64),
        _ => None,
    }
}

/// The host an item or sample belongs to: the first of the host keys present, else the agent's.
pub fn host_of<'a>(keys: &[String], point: &'a [KeyValue], resource: &'a [KeyValue], agent: &'a str) -> Cow<'a, str> {
    keys.iter().find_map(|k| lookup(k, point, resource).and_then(as_str)).unwrap_or(Cow::Borrowed(agent))
}

fn number(p: &NumberDataPoint) -> Option<f64> {
    match p.value? {
        number_data_point::Value::AsDouble(d) => d.is_finite().then_some(d),
        number_data_point::Value::AsInt(i) => Some(i as f64),
    }
}

/// What a sample metric feeds.
enum Sink {
    Field(Field),
    ThrottleFlag,
    ThrottleMask(u64),
    Process,
}

fn sink(cfg: &Checked, name: &str) -> Option<Sink> {
    let n = &cfg.names;
    if name == n.memory_used {
        Some(Sink::Field(Field::MemoryUsed))
    } else if name == n.utilization {
        Some(Sink::Field(Field::Utilization))
    } else if name == n.power {
        Some(Sink::Field(Field::Power))
    } else if name == n.throttle {
        Some(Sink::ThrottleFlag)
    } else if name == n.throttle_reasons {
        Some(Sink::ThrottleMask(n.throttle_reasons_mask))
    } else if name == n.process_memory {
        Some(Sink::Process)
    } else {
        None
    }
}

/// True when `name` is one of the GPU sample metrics (those pass through unchanged).
pub fn is_sample_metric(cfg: &Checked, name: &str) -> bool {
    sink(cfg, name).is_some()
}

/// Adds every GPU sample of `req` to `store`; returns how many were kept.
pub fn ingest(cfg: &Checked, agent_host: &str, store: &mut GpuStore, req: &ExportMetricsServiceRequest) -> usize {
    let k = &cfg.keys;
    let mut kept = 0;
    for rm in &req.resource_metrics {
        let res: &[KeyValue] = rm.resource.as_ref().map_or(&[], |r| &r.attributes);
        for m in rm.scope_metrics.iter().flat_map(|sm| sm.metrics.iter()) {
            let Some(sink) = sink(cfg, &m.name) else { continue };
            let points: &[NumberDataPoint] = match &m.data {
                Some(Data::Gauge(g)) => &g.data_points,
                Some(Data::Sum(s)) => &s.data_points,
                _ => continue,
            };
            for p in points {
                let (ts, Some(v)) = (p.time_unix_nano, number(p)) else { continue };
                if ts == 0 {
                    continue;
                }
                let host = host_of(&k.host, &p.attributes, res, agent_host);
                let uuid = lookup(&k.gpu_uuid, &p.attributes, res).and_then(as_str).map(Cow::into_owned);
                let index = lookup(&k.gpu_index, &p.attributes, res).and_then(as_int);
                let gpu = GpuIdent::new(uuid, index);
                let ok = match sink {
                    Sink::Field(f) => store.insert(&host, &gpu, f, ts, v),
                    Sink::ThrottleFlag => store.insert(&host, &gpu, Field::Throttled, ts, f64::from(v != 0.0)),
                    Sink::ThrottleMask(mask) => {
                        let bits = if v >= 0.0 { v as u64 } else { 0 };
                        store.insert(&host, &gpu, Field::Throttled, ts, f64::from(bits & mask != 0))
                    }
                    Sink::Process => {
                        let pid = lookup(&k.process_pid, &p.attributes, res).and_then(as_int);
                        let name = lookup(&k.process_name, &p.attributes, res).and_then(as_str);
                        store.note_process(&host, &gpu, pid, name.as_deref(), ts)
                    }
                };
                kept += usize::from(ok);
            }
        }
    }
    kept
}

fn set(attrs: &mut Vec<KeyValue>, key: &str, value: Value) {
    let value = Some(AnyValue { value: Some(value) });
    match attrs.iter_mut().find(|kv| kv.key == key) {
        Some(kv) => kv.value = value,
        None => attrs.push(KeyValue { key: key.to_string(), value, ..Default::default() }),
    }
}

/// Writes the joined values as attributes (replacing any of the same key).
pub fn apply(out: &OutputKeys, e: &Enrichment, attrs: &mut Vec<KeyValue>) {
    if let Some(m) = e.memory_used {
        set(attrs, &out.memory_used, Value::IntValue(m));
    }
    if let Some(u) = e.utilization {
        set(attrs, &out.utilization, Value::DoubleValue(u));
    }
    if let Some(p) = e.power {
        set(attrs, &out.power, Value::DoubleValue(p));
    }
    if let Some(t) = e.throttled {
        set(attrs, &out.throttled, Value::BoolValue(t));
    }
    set(attrs, &out.count, Value::IntValue(i64::try_from(e.count).unwrap_or(i64::MAX)));
}

/// What one enrichment pass needs.
pub struct Join<'a> {
    /// The checked settings.
    pub cfg: &'a Checked,
    /// How the server's GPUs are chosen.
    pub selector: &'a GpuSelector,
    /// The agent's host name.
    pub agent_host: &'a str,
    /// The samples.
    pub store: &'a GpuStore,
    /// Where outcomes are counted.
    pub counts: &'a JoinCounts,
}

impl Join<'_> {
    /// Joins one item; true when it was enriched.
    fn item(&self, signal: Signal, t: u64, attrs: &mut Vec<KeyValue>, resource: &[KeyValue]) -> bool {
        let e = if t == 0 {
            None
        } else {
            let host = host_of(&self.cfg.keys.host, attrs, resource, self.agent_host);
            join(self.store, self.selector, &host, t, self.cfg.tolerance_ns)
        };
        self.counts.count(signal, e.is_some());
        match e {
            Some(e) => {
                apply(&self.cfg.out, &e, attrs);
                true
            }
            None => false,
        }
    }

    /// Enriches every span at its end time; returns how many were enriched.
    pub fn spans(&self, req: &mut ExportTraceServiceRequest) -> usize {
        let mut n = 0;
        for rs in &mut req.resource_spans {
            let res: &[KeyValue] = rs.resource.as_ref().map_or(&[], |r| &r.attributes);
            for span in rs.scope_spans.iter_mut().flat_map(|ss| ss.spans.iter_mut()) {
                n += usize::from(self.item(Signal::Traces, span.end_time_unix_nano, &mut span.attributes, res));
            }
        }
        n
    }

    /// Enriches every data point of the configured metrics at its timestamp; returns how many.
    pub fn points(&self, req: &mut ExportMetricsServiceRequest) -> usize {
        let mut n = 0;
        for rm in &mut req.resource_metrics {
            let res: &[KeyValue] = rm.resource.as_ref().map_or(&[], |r| &r.attributes);
            for m in rm.scope_metrics.iter_mut().flat_map(|sm| sm.metrics.iter_mut()) {
                if !self.cfg.metrics.matches(&m.name) || is_sample_metric(self.cfg, &m.name) {
                    continue;
                }
                let mut f = |attrs: &mut Vec<KeyValue>, t: u64| {
                    n += usize::from(self.item(Signal::Metrics, t, attrs, res));
                };
                match &mut m.data {
                    Some(Data::Gauge(g)) => {
                        g.data_points.iter_mut().for_each(|p| f(&mut p.attributes, p.time_unix_nano))
                    }
                    Some(Data::Sum(s)) => s.data_points.iter_mut().for_each(|p| f(&mut p.attributes, p.time_unix_nano)),
                    Some(Data::Histogram(h)) => {
                        h.data_points.iter_mut().for_each(|p| f(&mut p.attributes, p.time_unix_nano))
                    }
                    Some(Data::ExponentialHistogram(h)) => {
                        h.data_points.iter_mut().for_each(|p| f(&mut p.attributes, p.time_unix_nano))
                    }
                    Some(Data::Summary(s)) => {
                        s.data_points.iter_mut().for_each(|p| f(&mut p.attributes, p.time_unix_nano))
                    }
                    None => {}
                }
            }
        }
        n
    }
}
