//! Builds remote-write requests from translated points and POSTs them (one attempt per call;
//! queue and retries come from core's exporterhelper).

use super::proto::{Label, MetricMetadata, MetricType, STALE_NAN, Sample, TimeSeries, WriteRequest};
use crate::prometheus::translate::{FamilyType, Point, Settings, TARGET_INFO, Value, format_float};
use async_trait::async_trait;
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::pdata::Payload;
use parking_lot::Mutex;
use prost::Message;
use reqwest::Url;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::SystemTime;
use xxhash_rust::xxh3::xxh3_64;

/// The remote-write protocol version header value (1.0).
pub const REMOTE_WRITE_VERSION: &str = "0.1.0";

/// Most `target_info` series whose last timestamp is remembered (then the memory restarts).
const MAX_TARGETS: usize = 100_000;

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
fn sort_samples(samples: &mut Vec<Sample>) {
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

fn metric_type(k: FamilyType) -> MetricType {
    match k {
        FamilyType::Gauge => MetricType::Gauge,
        FamilyType::Counter => MetricType::Counter,
        FamilyType::Histogram => MetricType::Histogram,
        FamilyType::Summary => MetricType::Summary,
    }
}

/// Maps an HTTP error status: 5xx and 429 are retryable (honouring `Retry-After`), any other
/// status is permanent.
pub fn classify(status: u16, message: String, retry_after: Option<std::time::Duration>) -> SendError {
    if status == 429 || (500..600).contains(&status) {
        SendError::Retryable { message, retry_after }
    } else {
        SendError::Permanent(message)
    }
}

/// One remote-write POST per attempt.
pub struct RemoteWriteSender {
    /// The translation settings.
    pub settings: Settings,
    /// The receiver's URL.
    pub url: Url,
    /// Every header of a request (configured ones plus the protocol's).
    pub headers: HeaderMap,
    /// The HTTP client.
    pub client: reqwest::Client,
    /// Name of the `target_info` family (namespaced).
    pub target_info: String,
    /// Last timestamp sent per `target_info` series: its samples never go back in time (the
    /// resource's newest point time can, across requests, and Prometheus refuses that).
    pub target_times: Mutex<HashMap<u64, i64>>,
    /// Client authenticator (`auth.authenticator`), asked for headers on each request.
    pub auth: Option<std::sync::Arc<dyn inferwatch_core::auth::ClientAuth>>,
}

impl RemoteWriteSender {
    /// The name of the `target_info` family under `namespace`.
    pub fn target_info_name(namespace: &str) -> String {
        if namespace.is_empty() { TARGET_INFO.to_string() } else { format!("{namespace}_{TARGET_INFO}") }
    }

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

    fn keep_target_info_monotonic(&self, wr: &mut WriteRequest) {
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

#[async_trait]
impl Sender for RemoteWriteSender {
    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        let wr = self.request(data)?;
        if wr.timeseries.is_empty() {
            return Ok(());
        }
        let body = snap::raw::Encoder::new()
            .compress_vec(&wr.encode_to_vec())
            .map_err(|e| SendError::Permanent(format!("snappy compression failed: {e}")))?;
        let mut headers = self.headers.clone();
        inferwatch_core::extension::client_auth::apply_client_auth(self.auth.as_ref(), &mut headers)?;
        let resp = self.client.post(self.url.clone()).headers(headers).body(body).send().await.map_err(|e| {
            let message = format!("POST {} failed: {}", self.url, chain(&e));
            if e.is_builder() || e.is_redirect() {
                SendError::Permanent(message)
            } else {
                SendError::Retryable { message, retry_after: None }
            }
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| crate::otlphttp::parse_retry_after(v, SystemTime::now()));
        let text = resp.text().await.unwrap_or_default();
        let detail: String = text.trim().chars().take(256).collect();
        let message = if detail.is_empty() {
            format!("HTTP {status} from {}", self.url)
        } else {
            format!("HTTP {status} from {}: {detail}", self.url)
        };
        Err(classify(status.as_u16(), message, retry_after))
    }
}

/// An error with its sources, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping() {
        for s in [429, 500, 502, 503, 504] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
        }
        for s in [300, 400, 401, 403, 404, 409, 413] {
            assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
        }
    }

    #[test]
    fn samples_sorted_and_deduplicated() {
        let mut v = vec![
            Sample { value: 3.0, timestamp: 30 },
            Sample { value: 1.0, timestamp: 10 },
            Sample { value: 2.0, timestamp: 10 },
        ];
        sort_samples(&mut v);
        assert_eq!(v, vec![Sample { value: 2.0, timestamp: 10 }, Sample { value: 3.0, timestamp: 30 }]);
    }
}
