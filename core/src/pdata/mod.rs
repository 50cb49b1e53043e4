//! Telemetry payloads as they travel through a pipeline: OTLP export requests per signal,
//! either decoded (prost types) or as validated protobuf bytes passed through undecoded.

mod encoded;
pub mod wire;

pub use encoded::Encoded;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use std::fmt;

/// The three OTLP signal types a pipeline carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Spans.
    Traces,
    /// Metric data points.
    Metrics,
    /// Log records.
    Logs,
}

impl Signal {
    /// All signals, in a fixed order.
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Metrics, Signal::Logs];

    /// The name used in configuration (`traces`, `metrics`, `logs`).
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// Parses a pipeline type name.
    pub fn parse(s: &str) -> Option<Signal> {
        match s {
            "traces" => Some(Signal::Traces),
            "metrics" => Some(Signal::Metrics),
            "logs" => Some(Signal::Logs),
            _ => None,
        }
    }

    /// The item noun used in otelcol self-metric names (`spans`, `metric_points`, `log_records`).
    pub fn item_noun(self) -> &'static str {
        match self {
            Signal::Traces => "spans",
            Signal::Metrics => "metric_points",
            Signal::Logs => "log_records",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One unit of telemetry moving through a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// An OTLP traces export request.
    Traces(ExportTraceServiceRequest),
    /// An OTLP metrics export request.
    Metrics(ExportMetricsServiceRequest),
    /// An OTLP logs export request.
    Logs(ExportLogsServiceRequest),
    /// Validated OTLP protobuf, kept as received: batched by concatenation, sent as is.
    Encoded(Encoded),
}

impl Payload {
    /// The signal this payload carries.
    pub fn signal(&self) -> Signal {
        match self {
            Payload::Traces(_) => Signal::Traces,
            Payload::Metrics(_) => Signal::Metrics,
            Payload::Logs(_) => Signal::Logs,
            Payload::Encoded(e) => e.signal(),
        }
    }

    /// An empty payload of the given signal.
    pub fn empty(signal: Signal) -> Payload {
        match signal {
            Signal::Traces => Payload::Traces(ExportTraceServiceRequest::default()),
            Signal::Metrics => Payload::Metrics(ExportMetricsServiceRequest::default()),
            Signal::Logs => Payload::Logs(ExportLogsServiceRequest::default()),
        }
    }

    /// Number of items: spans, metric data points or log records.
    pub fn item_count(&self) -> usize {
        match self {
            Payload::Traces(r) => {
                r.resource_spans.iter().flat_map(|rs| rs.scope_spans.iter()).map(|ss| ss.spans.len()).sum()
            }
            Payload::Metrics(r) => r
                .resource_metrics
                .iter()
                .flat_map(|rm| rm.scope_metrics.iter())
                .flat_map(|sm| sm.metrics.iter())
                .map(metric_point_count)
                .sum(),
            Payload::Logs(r) => {
                r.resource_logs.iter().flat_map(|rl| rl.scope_logs.iter()).map(|sl| sl.log_records.len()).sum()
            }
            Payload::Encoded(e) => e.item_count(),
        }
    }

    /// Encoded protobuf size in bytes.
    pub fn encoded_len(&self) -> usize {
        use prost::Message;
        match self {
            Payload::Traces(r) => r.encoded_len(),
            Payload::Metrics(r) => r.encoded_len(),
            Payload::Logs(r) => r.encoded_len(),
            Payload::Encoded(e) => e.byte_len(),
        }
    }

    /// Encodes the payload as OTLP protobuf.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        use prost::Message;
        match self {
            Payload::Traces(r) => r.encode_to_vec(),
            Payload::Metrics(r) => r.encode_to_vec(),
            Payload::Logs(r) => r.encode_to_vec(),
            Payload::Encoded(e) => e.to_vec(),
        }
    }

    /// The payload as protobuf chunks whose concatenation is one export request
    /// (no copy for encoded payloads).
    pub fn to_chunks(&self) -> Vec<bytes::Bytes> {
        match self {
            Payload::Encoded(e) => e.chunks().to_vec(),
            other => vec![bytes::Bytes::from(other.encode_to_vec())],
        }
    }

    /// The decoded form: encoded payloads are decoded, decoded ones returned as they are.
    pub fn into_decoded(self) -> Result<Payload, prost::DecodeError> {
        match self {
            Payload::Encoded(e) => e.decode(),
            other => Ok(other),
        }
    }

    /// A decoded copy when encoded (for components that read fields), else `self` borrowed.
    pub fn decoded(&self) -> Result<std::borrow::Cow<'_, Payload>, prost::DecodeError> {
        match self {
            Payload::Encoded(e) => e.decode().map(std::borrow::Cow::Owned),
            other => Ok(std::borrow::Cow::Borrowed(other)),
        }
    }

    /// Appends all resource entries of `other` (same signal) to `self`.
    ///
    /// Returns `other` back unchanged when the signals differ.
    pub fn append(&mut self, other: Payload) -> Result<(), Payload> {
        if self.signal() != other.signal() {
            return Err(other);
        }
        if matches!(self, Payload::Encoded(_)) || matches!(other, Payload::Encoded(_)) {
            // Concatenated OTLP requests are one request: no decode needed.
            let signal = self.signal();
            let mut mine = match std::mem::replace(self, Payload::empty(signal)) {
                Payload::Encoded(e) => e,
                typed => Encoded::from_decoded(&typed),
            };
            match other {
                Payload::Encoded(e) => mine.extend(e),
                typed => mine.extend(Encoded::from_decoded(&typed)),
            }
            *self = Payload::Encoded(mine);
            return Ok(());
        }
        match (self, other) {
            (Payload::Traces(a), Payload::Traces(b)) => {
                a.resource_spans.extend(b.resource_spans);
                Ok(())
            }
            (Payload::Metrics(a), Payload::Metrics(b)) => {
                a.resource_metrics.extend(b.resource_metrics);
                Ok(())
            }
            (Payload::Logs(a), Payload::Logs(b)) => {
                a.resource_logs.extend(b.resource_logs);
                Ok(())
            }
            (_, other) => Err(other),
        }
    }

    /// Removes and returns the first `n` items (or all if fewer), keeping resource and scope
    /// structure intact on both sides. A metric with more points than fit is split by points.
    pub fn split_off_front(&mut self, n: usize) -> Payload {
        if let Payload::Encoded(e) = self {
            match e.split_off_front(n) {
                Some(front) => return Payload::Encoded(front),
                None => {
                    // A single resource entry is larger than `n`: split it decoded.
                    let signal = e.signal();
                    match e.decode() {
                        Ok(d) => *self = d,
                        Err(_) => return std::mem::replace(self, Payload::empty(signal)),
                    }
                }
            }
        }
        match self {
            Payload::Traces(r) => Payload::Traces(ExportTraceServiceRequest {
                resource_spans: split::take_front(&mut r.resource_spans, n, split::SPANS),
            }),
            Payload::Metrics(r) => Payload::Metrics(ExportMetricsServiceRequest {
                resource_metrics: split::take_front(&mut r.resource_metrics, n, split::METRICS),
            }),
            Payload::Logs(r) => Payload::Logs(ExportLogsServiceRequest {
                resource_logs: split::take_front(&mut r.resource_logs, n, split::LOGS),
            }),
            Payload::Encoded(_) => Payload::empty(self.signal()),
        }
    }
}

/// Number of data points in one metric.
pub fn metric_point_count(m: &Metric) -> usize {
    match &m.data {
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
        None => 0,
    }
}

mod split {
    //! Generic front-splitting of the resource → scope → item hierarchy.

    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    /// Accessors for one signal's hierarchy.
    pub struct Shape<R, S, I> {
        pub scopes: fn(&mut R) -> &mut Vec<S>,
        pub items: fn(&mut S) -> &mut Vec<I>,
        pub weight: fn(&I) -> usize,
        pub shell_r: fn(&R) -> R,
        pub shell_s: fn(&S) -> S,
        /// Moves the first `n` units of an item into a new item (metrics: data points).
        pub split_item: Option<fn(&mut I, usize) -> I>,
    }

    pub const SPANS: Shape<ResourceSpans, ScopeSpans, Span> = Shape {
        scopes: |r| &mut r.scope_spans,
        items: |s| &mut s.spans,
        weight: |_| 1,
        shell_r: |r| ResourceSpans {
            resource: r.resource.clone(),
            scope_spans: Vec::new(),
            schema_url: r.schema_url.clone(),
        },
        shell_s: |s| ScopeSpans { scope: s.scope.clone(), spans: Vec::new(), schema_url: s.schema_url.clone() },
        split_item: None,
    };

    pub const METRICS: Shape<ResourceMetrics, ScopeMetrics, Metric> = Shape {
        scopes: |r| &mut r.scope_metrics,
        items: |s| &mut s.metrics,
        weight: |m| super::metric_point_count(m).max(1),
        shell_r: |r| ResourceMetrics {
            resource: r.resource.clone(),
            scope_metrics: Vec::new(),
            schema_url: r.schema_url.clone(),
        },
        shell_s: |s| ScopeMetrics { scope: s.scope.clone(), metrics: Vec::new(), schema_url: s.schema_url.clone() },
        split_item: Some(split_metric),
    };

    /// Moves the first `n` data points of `m` into a new metric with the same identity.
    fn split_metric(m: &mut Metric, n: usize) -> Metric {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        use opentelemetry_proto::tonic::metrics::v1::{ExponentialHistogram, Gauge, Histogram, Sum, Summary};
        fn front<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
            let rest = v.split_off(n.min(v.len()));
            std::mem::replace(v, rest)
        }
        let data = match &mut m.data {
            Some(Data::Gauge(g)) => Some(Data::Gauge(Gauge { data_points: front(&mut g.data_points, n) })),
            Some(Data::Sum(s)) => Some(Data::Sum(Sum {
                data_points: front(&mut s.data_points, n),
                aggregation_temporality: s.aggregation_temporality,
                is_monotonic: s.is_monotonic,
            })),
            Some(Data::Histogram(h)) => Some(Data::Histogram(Histogram {
                data_points: front(&mut h.data_points, n),
                aggregation_temporality: h.aggregation_temporality,
            })),
            Some(Data::ExponentialHistogram(h)) => Some(Data::ExponentialHistogram(ExponentialHistogram {
                data_points: front(&mut h.data_points, n),
                aggregation_temporality: h.aggregation_temporality,
            })),
            Some(Data::Summary(s)) => Some(Data::Summary(Summary { data_points: front(&mut s.data_points, n) })),
            None => None,
        };
        Metric {
            name: m.name.clone(),
            description: m.description.clone(),
            unit: m.unit.clone(),
            metadata: m.metadata.clone(),
            data,
        }
    }

    pub const LOGS: Shape<ResourceLogs, ScopeLogs, LogRecord> = Shape {
        scopes: |r| &mut r.scope_logs,
        items: |s| &mut s.log_records,
        weight: |_| 1,
        shell_r: |r| ResourceLogs {
            resource: r.resource.clone(),
            scope_logs: Vec::new(),
            schema_url: r.schema_url.clone(),
        },
        shell_s: |s| ScopeLogs { scope: s.scope.clone(), log_records: Vec::new(), schema_url: s.schema_url.clone() },
        split_item: None,
    };

    /// Moves up to `n` items (by weight) from the front of `src` into a new vector.
    pub fn take_front<R, S, I>(src: &mut Vec<R>, n: usize, shape: Shape<R, S, I>) -> Vec<R> {
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 && !src.is_empty() {
            let r = &mut src[0];
            let total: usize =
                (shape.scopes)(r).iter_mut().map(|s| (shape.items)(s).iter().map(shape.weight).sum::<usize>()).sum();
            if total <= left {
                left -= total;
                out.push(src.remove(0));
                continue;
            }
            // Split this resource entry.
            let mut new_r = (shape.shell_r)(r);
            let scopes = (shape.scopes)(r);
            while left > 0 && !scopes.is_empty() {
                let s = &mut scopes[0];
                let st: usize = (shape.items)(s).iter().map(shape.weight).sum();
                if st <= left {
                    left -= st;
                    (shape.scopes)(&mut new_r).push(scopes.remove(0));
                    continue;
                }
                let mut new_s = (shape.shell_s)(s);
                let items = (shape.items)(s);
                let mut k = 0;
                let mut part = None;
                while k < items.len() && left > 0 {
                    let w = (shape.weight)(&items[k]);
                    if w > left
                        && let Some(split) = shape.split_item
                    {
                        // One item larger than what is left: take part of it.
                        part = Some(split(&mut items[k], left));
                        left = 0;
                        break;
                    }
                    k += 1;
                    left = left.saturating_sub(w);
                }
                let rest = items.split_off(k);
                let mut taken = std::mem::replace(items, rest);
                taken.extend(part);
                *(shape.items)(&mut new_s) = taken;
                (shape.scopes)(&mut new_r).push(new_s);
            }
            out.push(new_r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn traces(shape: &[&[usize]]) -> Payload {
        let mut n = 0u8;
        let rs = shape
            .iter()
            .map(|scopes| ResourceSpans {
                scope_spans: scopes
                    .iter()
                    .map(|&k| ScopeSpans {
                        spans: (0..k)
                            .map(|_| {
                                n += 1;
                                Span { name: format!("s{n}"), ..Default::default() }
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        Payload::Traces(ExportTraceServiceRequest { resource_spans: rs })
    }

    fn names(p: &Payload) -> Vec<String> {
        match p {
            Payload::Traces(r) => r
                .resource_spans
                .iter()
                .flat_map(|r| r.scope_spans.iter())
                .flat_map(|s| s.spans.iter())
                .map(|s| s.name.clone())
                .collect(),
            _ => vec![],
        }
    }

    #[test]
    fn split_preserves_order_and_counts() {
        let mut p = traces(&[&[3, 2], &[4]]);
        assert_eq!(p.item_count(), 9);
        let all = names(&p);
        let a = p.split_off_front(4);
        assert_eq!(a.item_count(), 4);
        assert_eq!(p.item_count(), 5);
        let b = p.split_off_front(100);
        assert_eq!(p.item_count(), 0);
        let mut joined = names(&a);
        joined.extend(names(&b));
        assert_eq!(joined, all);
        // the split resource keeps two resource entries in the first part
        if let Payload::Traces(r) = &a {
            assert_eq!(r.resource_spans.len(), 1);
            assert_eq!(r.resource_spans[0].scope_spans.len(), 2);
        }
    }

    #[test]
    fn split_divides_one_big_metric_by_points() {
        use opentelemetry_proto::tonic::metrics::v1::{
            Gauge, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data,
        };
        let points = (0..25).map(|i| NumberDataPoint { time_unix_nano: i, ..Default::default() }).collect();
        let mut p = Payload::Metrics(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "g".into(),
                        unit: "1".into(),
                        data: Some(Data::Gauge(Gauge { data_points: points })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        let mut sizes = Vec::new();
        let mut times = Vec::new();
        while p.item_count() > 0 {
            let part = p.split_off_front(10);
            sizes.push(part.item_count());
            if let Payload::Metrics(r) = part {
                let m = &r.resource_metrics[0].scope_metrics[0].metrics[0];
                assert_eq!((m.name.as_str(), m.unit.as_str()), ("g", "1"));
                if let Some(Data::Gauge(g)) = &m.data {
                    times.extend(g.data_points.iter().map(|d| d.time_unix_nano));
                }
            }
        }
        assert_eq!(sizes, vec![10, 10, 5]);
        assert_eq!(times, (0..25).collect::<Vec<_>>());
    }

    #[test]
    fn append_rejects_other_signal() {
        let mut p = Payload::empty(Signal::Traces);
        assert!(p.append(Payload::empty(Signal::Logs)).is_err());
        assert!(p.append(traces(&[&[1]])).is_ok());
        assert_eq!(p.item_count(), 1);
    }
}
