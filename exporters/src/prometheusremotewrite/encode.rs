//! A metrics payload → its remote-write `WriteRequest` (translated, `target_info` kept
//! monotonic, snappy-compressed by the sender), built once per payload.

use super::proto::{Label, MetricMetadata, MetricType, STALE_NAN, Sample, TimeSeries, WriteRequest};
use super::send::RemoteWriteSender;
use crate::prometheus::translate::{FamilyType, Point, Value, format_float};
use inferwatch_core::exporterhelper::SendError;
use inferwatch_core::pdata::Payload;
use prost::Message;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use xxhash_rust::xxh3::xxh3_64;

/// Most `target_info` series whose last timestamp is remembered (then the memory restarts).
pub(super) const MAX_TARGETS: usize = 100_000;

/// The `WriteRequest` for `points`: histograms as `_bucket{le}` (cumulative, with `+Inf`),
/// `_sum`, `_count`; summaries as `{quantile}`, `_sum`, `_count`. The points of one series
/// become one time series whose samples are sorted by time (one per timestamp: the last wins);
/// labels are sorted by name with `__name__` among them. Ended series get the staleness marker.
pub fn build_request(points: &[Point]) -> WriteRequest {
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut index: HashMap<Vec<Label>, usize> = HashMap::new();
    let mut metadata: Vec<MetricMetadata> = Vec::new();
    let mut families: HashMap<&str, ()> = HashMap::new();
    for p in points {
        let ts = (p.time_ns / 1_000_000) as i64;
        if families.insert(p.family.name.as_str(), ()).is_none() {
            metadata.push(MetricMetadata {
                r#type: metric_type(p.family.kind) as i32,
                metric_family_name: p.family.name.clone(),
                help: p.family.help.clone(),
                unit: String::new(),
            });
        }
        let mut add = |name: &str, extra: Option<(&str, String)>, value: f64| {
            let mut labels: Vec<Label> = Vec::with_capacity(p.labels.len() + 2);
            labels.push(Label { name: "__name__".into(), value: name.to_string() });
            labels.extend(p.labels.iter().map(|(k, v)| Label { name: k.clone(), value: v.clone() }));
            if let Some((k, v)) = extra {
                labels.retain(|l| l.name != k);
                labels.push(Label { name: k.to_string(), value: v });
            }
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            let value = if p.stale { STALE_NAN } else { value };
            let i = match index.entry(labels) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    series.push(TimeSeries { labels: e.key().clone(), samples: Vec::new() });
                    *e.insert(series.len() - 1)
                }
            };
            series[i].samples.push(Sample { value, timestamp: ts });
        };
        let name = p.family.name.as_str();
        match &p.value {
            Value::Number(v) => add(name, None, *v),
            Value::Histogram { count, sum, bounds, counts } => {
                let bucket = format!("{name}_bucket");
                let mut cum = 0u64;
                for (b, c) in bounds.iter().zip(counts) {
                    cum = cum.saturating_add(*c);
                    add(&bucket, Some(("le", format_float(*b))), cum as f64);
                }
                add(&bucket, Some(("le", "+Inf".into())), *count as f64);
                if let Some(s) = sum {
                    add(&format!("{name}_sum"), None, *s);
                }
                add(&format!("{name}_count"), None, *count as f64);
            }
            Value::Summary { count, sum, quantiles } => {
                for (q, v) in quantiles {
                    add(name, Some(("quantile", format_float(*q))), *v);
                }
                add(&format!("{name}_sum"), None, *sum);
                add(&format!("{name}_count"), None, *count as f64);
            }
        }
    }
    for s in &mut series {
        sort_samples(&mut s.samples);
    }
    WriteRequest { timeseries: series, metadata }
}

/// Sorts by timestamp and keeps the last sample of each timestamp.
pub(super) fn sort_samples(samples: &mut Vec<Sample>) {
    if samples.len() < 2 {
        return;
    }
    samples.sort_by_key(|s| s.timestamp);
    let mut out: Vec<Sample> = Vec::with_capacity(samples.len());
    for s in samples.drain(..) {
        match out.last_mut() {
            Some(last) if last.timestamp == s.timestamp => *last = s,
            _ => out.push(s),
        }
    }
    *samples = out;
}

pub(super) fn metric_type(k: FamilyType) -> MetricType {
    match k {
        FamilyType::Gauge => MetricType::Gauge,
        FamilyType::Counter => MetricType::Counter,
        FamilyType::Histogram => MetricType::Histogram,
        FamilyType::Summary => MetricType::Summary,
    }
}

impl RemoteWriteSender {
    /// The request for one payload (empty when it has nothing to send).
    pub fn request(&self, data: &Payload) -> Result<WriteRequest, SendError> {
        let decoded = data.decoded().map_err(|e| SendError::Permanent(format!("cannot decode the payload: {e}")))?;
        let Payload::Metrics(req) = decoded.as_ref() else {
            return Err(SendError::Permanent(format!("prometheusremotewrite takes metrics, got {}", data.signal())));
        };
        let points = self.settings.translate(req);
        let mut wr = build_request(&points);
        self.keep_target_info_monotonic(&mut wr);
        Ok(wr)
    }

    pub(super) fn keep_target_info_monotonic(&self, wr: &mut WriteRequest) {
        let mut times = self.target_times.lock();
        for ts in &mut wr.timeseries {
            let is_target = ts.labels.iter().any(|l| l.name == "__name__" && l.value == self.target_info);
            if !is_target {
                continue;
            }
            let key = xxh3_64(&Message::encode_to_vec(&TimeSeries { labels: ts.labels.clone(), samples: Vec::new() }));
            let mut last = times.get(&key).copied().unwrap_or(i64::MIN);
            for s in &mut ts.samples {
                s.timestamp = s.timestamp.max(last);
                last = s.timestamp;
            }
            sort_samples(&mut ts.samples);
            if times.len() >= MAX_TARGETS && !times.contains_key(&key) {
                times.clear();
            }
            times.insert(key, last);
        }
    }
}
