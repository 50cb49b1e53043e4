//! The output metrics of `llm_signals`: names, units, and the derived export request.
//!
//! Every output goes under one resource (`service.name = inferwatch`) and one scope
//! (`inferwatch.llm_signals`); the group's model, version, instance, source and identity
//! attributes (`k8s.pod.name`, ... from the input's resource) are point attributes. Metrics appear in [`Out`] order; within a metric, points are ordered by time,
//! then by group key.

use super::hist::{FixedHist, Lat};
use super::input::SplitLat;
use super::model::{GroupKey, string_kv};
use super::quality::{QStat, Qual};
use super::spans::{REQUEST_ID_ATTRIBUTE, Request};
use crate::detect::sketch::DdSketch;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::BTreeMap;

/// `service.name` of the output resource.
pub const OUTPUT_SERVICE_NAME: &str = "inferwatch";
/// Instrumentation scope name of the output.
pub const SCOPE_NAME: &str = "inferwatch.llm_signals";

/// A windowed percentile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pct {
    /// Median.
    P50,
    /// 95th percentile.
    P95,
    /// 99th percentile.
    P99,
}

impl Pct {
    /// Every percentile, in output order.
    pub const ALL: [Pct; 3] = [Pct::P50, Pct::P95, Pct::P99];

    /// The quantile.
    pub fn quantile(self) -> f64 {
        match self {
            Pct::P50 => 0.5,
            Pct::P95 => 0.95,
            Pct::P99 => 0.99,
        }
    }
}

/// An output metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Out {
    /// Cumulative latency histogram.
    Hist(Lat),
    /// Windowed latency percentile.
    Pct(Lat, Pct),
    /// Requests finished in the window (`llm.requests.finished`).
    RequestsFinished,
    /// Requests per second.
    RequestRate,
    /// Failed fraction of requests.
    ErrorRate,
    /// Output tokens per second.
    TokensOutput,
    /// Input tokens per second.
    TokensInput,
    /// KV-cache usage fraction.
    KvUsage,
    /// Requests waiting.
    Waiting,
    /// Requests running.
    Running,
    /// Preemptions per second.
    PreemptionRate,
    /// Prefix-cache hit rate.
    PrefixHitRate,
    /// Prefix-cache hit rate below the threshold.
    PrefixLow,
    /// Queue p99 above the threshold.
    QueueBlocking,
    /// A window statistic of a quality signal (`llm.quality.tle.p50`, ...).
    Quality(Qual, QStat),
    /// The window's quality score Q = 1 − mean RCI (`llm.quality.score`).
    QualityScore,
    /// Windowed latency percentile of one prompt-length bucket (`llm.ttft.by_input.p95`, ...).
    ByInput(SplitLat, Pct),
    /// Requests finished in the window in one prompt-length bucket (`llm.requests.finished.by_input`).
    RequestsByInput,
    /// TTFT p95 of the longest prompt-length bucket over that of the shortest (`llm.ttft.long_short`).
    TtftLongShort,
    /// One request's latency (`per_request`), at the span's event time.
    PerRequest(Lat),
    /// One request's quality value (`per_request`: `llm.request.tle`, `llm.request.rci`).
    PerRequestQuality(Qual),
    /// One request's quality score 1 − RCI (`per_request`: `llm.request.quality`).
    PerRequestScore,
}

impl Out {
    /// Every output metric, in output order.
    pub fn all() -> Vec<Out> {
        let mut v: Vec<Out> = Lat::ALL.iter().map(|l| Out::Hist(*l)).collect();
        v.extend(Lat::WINDOWED.iter().flat_map(|l| Pct::ALL.map(|p| Out::Pct(*l, p))));
        v.extend([
            Out::RequestsFinished,
            Out::RequestRate,
            Out::ErrorRate,
            Out::TokensOutput,
            Out::TokensInput,
            Out::KvUsage,
            Out::Waiting,
            Out::Running,
            Out::PreemptionRate,
            Out::PrefixHitRate,
            Out::PrefixLow,
            Out::QueueBlocking,
        ]);
        v.extend(Qual::ALL.iter().flat_map(|q| QStat::ALL.map(|st| Out::Quality(*q, st))));
        v.push(Out::QualityScore);
        v.extend(SplitLat::ALL.iter().flat_map(|l| Pct::ALL.map(|p| Out::ByInput(*l, p))));
        v.extend([Out::RequestsByInput, Out::TtftLongShort]);
        v.extend(Lat::ALL.map(Out::PerRequest));
        v.extend(Qual::ALL.map(Out::PerRequestQuality));
        v.push(Out::PerRequestScore);
        v
    }

    /// Whether the output is a histogram (else a gauge).
    pub fn is_histogram(self) -> bool {
        matches!(self, Out::Hist(_))
    }

    /// Metric name.
    pub fn name(self) -> &'static str {
        match self {
            Out::Hist(l) => l.histogram_name(),
            Out::Pct(l, p) => match (l, p) {
                (Lat::Ttft, Pct::P50) => "llm.ttft.p50",
                (Lat::Ttft, Pct::P95) => "llm.ttft.p95",
                (Lat::Ttft, Pct::P99) => "llm.ttft.p99",
                (Lat::Tpot, Pct::P50) => "llm.tpot.p50",
                (Lat::Tpot, Pct::P95) => "llm.tpot.p95",
                (Lat::Tpot, Pct::P99) => "llm.tpot.p99",
                (Lat::E2e, Pct::P50) => "llm.e2e.p50",
                (Lat::E2e, Pct::P95) => "llm.e2e.p95",
                (Lat::E2e, Pct::P99) => "llm.e2e.p99",
                (Lat::Queue, Pct::P50) => "llm.queue.p50",
                (Lat::Queue, Pct::P95) => "llm.queue.p95",
                (Lat::Queue, Pct::P99) => "llm.queue.p99",
                (Lat::Itl, Pct::P50) => "llm.itl.p50",
                (Lat::Itl, Pct::P95) => "llm.itl.p95",
                (Lat::Itl, Pct::P99) => "llm.itl.p99",
            },
            Out::RequestsFinished => "llm.requests.finished",
            Out::RequestRate => "llm.request.rate",
            Out::ErrorRate => "llm.request.error_rate",
            Out::TokensOutput => "llm.tokens.output.rate",
            Out::TokensInput => "llm.tokens.input.rate",
            Out::KvUsage => "llm.kv_cache.usage",
            Out::Waiting => "llm.requests.waiting",
            Out::Running => "llm.requests.running",
            Out::PreemptionRate => "llm.preemption.rate",
            Out::PrefixHitRate => "llm.prefix_cache.hit_rate",
            Out::PrefixLow => "llm.prefix_cache.low",
            Out::QueueBlocking => "llm.queue.blocking",
            Out::Quality(q, st) => match (q, st) {
                (Qual::Tle, QStat::P50) => "llm.quality.tle.p50",
                (Qual::Tle, QStat::Mean) => "llm.quality.tle.mean",
                (Qual::Rci, QStat::P50) => "llm.quality.rci.p50",
                (Qual::Rci, QStat::Mean) => "llm.quality.rci.mean",
            },
            Out::QualityScore => "llm.quality.score",
            Out::ByInput(l, p) => match (l, p) {
                (SplitLat::Ttft, Pct::P50) => "llm.ttft.by_input.p50",
                (SplitLat::Ttft, Pct::P95) => "llm.ttft.by_input.p95",
                (SplitLat::Ttft, Pct::P99) => "llm.ttft.by_input.p99",
                (SplitLat::E2e, Pct::P50) => "llm.e2e.by_input.p50",
                (SplitLat::E2e, Pct::P95) => "llm.e2e.by_input.p95",
                (SplitLat::E2e, Pct::P99) => "llm.e2e.by_input.p99",
            },
            Out::RequestsByInput => "llm.requests.finished.by_input",
            Out::TtftLongShort => "llm.ttft.long_short",
            Out::PerRequest(l) => match l {
                Lat::Ttft => "llm.request.ttft",
                Lat::Tpot => "llm.request.tpot",
                Lat::E2e => "llm.request.e2e",
                Lat::Queue => "llm.request.queue",
                Lat::Itl => "llm.request.itl",
            },
            Out::PerRequestQuality(Qual::Tle) => "llm.request.tle",
            Out::PerRequestQuality(Qual::Rci) => "llm.request.rci",
            Out::PerRequestScore => "llm.request.quality",
        }
    }

    /// Metric unit (UCUM, as OTLP carries it). `1` only for true ratios (the Prometheus name gets
    /// `_ratio`); the 0/1 flags have none (a flag is not a fraction of anything).
    pub fn unit(self) -> &'static str {
        match self {
            Out::Hist(_) | Out::Pct(..) | Out::ByInput(..) | Out::PerRequest(_) => "s",
            Out::RequestsFinished | Out::RequestsByInput | Out::Waiting | Out::Running => "{request}",
            Out::RequestRate => "{request}/s",
            Out::TokensOutput | Out::TokensInput => "{token}/s",
            Out::PreemptionRate => "{preemption}/s",
            Out::ErrorRate | Out::KvUsage | Out::PrefixHitRate => "1",
            Out::Quality(Qual::Tle, _) | Out::PerRequestQuality(Qual::Tle) => "bit",
            Out::Quality(Qual::Rci, _)
            | Out::PerRequestQuality(Qual::Rci)
            | Out::QualityScore
            | Out::PerRequestScore => "1",
            // A quotient of two latencies, not a fraction 0–1: no `1` (no `_ratio` in Prometheus).
            Out::PrefixLow | Out::QueueBlocking | Out::TtftLongShort => "",
        }
    }

    /// Metric description.
    pub fn description(self) -> &'static str {
        match self {
            Out::Hist(Lat::Ttft) => "Time to first token of successful requests.",
            Out::Hist(Lat::Tpot) => "Time per output token after the first, of successful requests.",
            Out::Hist(Lat::E2e) => "End-to-end request duration.",
            Out::Hist(Lat::Queue) => "Time requests spent queued before scheduling.",
            Out::Pct(..) => "Windowed latency percentile.",
            Out::ByInput(..) => "Windowed latency percentile of the requests of one prompt-length bucket.",
            Out::RequestsByInput => "Requests finished in the window in one prompt-length bucket.",
            Out::TtftLongShort => {
                "TTFT p95 of the longest prompt-length bucket with enough requests over that of the shortest bucket."
            }
            Out::RequestsFinished => "Requests finished in the window.",
            Out::RequestRate => "Requests finished per second over the window.",
            Out::ErrorRate => "Fraction of the window's requests that failed or were aborted.",
            Out::TokensOutput => "Output tokens per second over the window, all requests together.",
            Out::TokensInput => "Input (prompt) tokens per second over the window, all requests together.",
            Out::KvUsage => "KV-cache usage fraction (0-1), last value in the window.",
            Out::Waiting => "Requests waiting to be scheduled, last value in the window.",
            Out::Running => "Requests in the running batch, last value in the window.",
            Out::PreemptionRate => "Preemptions per second over the window.",
            Out::PrefixHitRate => "Prefix-cache hit rate: rate(hits) / rate(queries) over the window.",
            Out::PrefixLow => "1 when the prefix-cache hit rate is below 0.62, else 0.",
            Out::QueueBlocking => "1 when the window's queue-time p99 exceeds 0.8 s, else 0.",
            Out::PerRequest(Lat::Ttft) => "Time to first token of one successful request.",
            Out::PerRequest(Lat::Tpot) => "Time per output token after the first, of one successful request.",
            Out::PerRequest(Lat::E2e) => "End-to-end duration of one request.",
            Out::PerRequest(Lat::Queue) => "Time one request spent queued before scheduling.",
            Out::Hist(Lat::Itl) | Out::PerRequest(Lat::Itl) => "Interval between consecutive output tokens.",
            Out::Quality(Qual::Tle, _) => "Windowed first-token entropy of the top-K log-probabilities (TLE), bits.",
            Out::Quality(Qual::Rci, _) => {
                "Windowed consistency index against the reference answers (RCI; 0 = identical)."
            }
            Out::QualityScore => "Quality score Q = 1 - mean RCI over the window (1 = every answer as its reference).",
            Out::PerRequestQuality(Qual::Tle) => "First-token entropy of one successful request, bits.",
            Out::PerRequestQuality(Qual::Rci) => "Consistency index of one successful request's answer.",
            Out::PerRequestScore => "Quality score 1 - RCI of one successful request's answer.",
        }
    }
}

/// The value of one output point.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A double gauge.
    Double(f64),
    /// An int gauge.
    Int(i64),
    /// A cumulative histogram over `bounds`.
    Hist(&'static [f64], FixedHist),
}

#[derive(Debug)]
struct Point {
    start: u64,
    time: u64,
    attrs: Vec<KeyValue>,
    value: Value,
}

/// Collects output points and builds the derived export request.
#[derive(Debug, Default)]
pub struct Emitter {
    points: BTreeMap<Out, Vec<Point>>,
}

impl Emitter {
    /// Adds one point of `out` for [start, time).
    pub fn push(&mut self, out: Out, start: u64, time: u64, attrs: &[KeyValue], value: Value) {
        self.points.entry(out).or_default().push(Point { start, time, attrs: attrs.to_vec(), value });
    }

    /// Adds the windowed percentiles ([`Pct::ALL`]) of `sk` as metrics `out(pct)` (none when empty).
    pub fn push_percentiles(
        &mut self,
        sk: &DdSketch,
        start: u64,
        time: u64,
        attrs: &[KeyValue],
        out: impl Fn(Pct) -> Out,
    ) {
        if sk.count() == 0 {
            return;
        }
        for pct in Pct::ALL {
            if let Some(v) = sk.quantile(pct.quantile()) {
                self.push(out(pct), start, time, attrs, Value::Double(v));
            }
        }
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The export request holding every point added (`None` when none was).
    pub fn finish(self) -> Option<ExportMetricsServiceRequest> {
        if self.points.is_empty() {
            return None;
        }
        let metrics = self.points.into_iter().map(|(out, mut points)| {
            // Stable: points added in group-key order keep it within one time.
            points.sort_by_key(|p| p.time);
            metric_of(out, points)
        });
        Some(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![string_kv("service.name", OUTPUT_SERVICE_NAME)],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: SCOPE_NAME.into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics: metrics.collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        })
    }
}

/// Adds the per-request points of one request of group `key` ended at `time` (one per measured
/// latency; with `gen_ai.request.id` when the span had one).
pub fn push_request(em: &mut Emitter, key: &GroupKey, time: u64, req: &Request) {
    let mut attrs = key.attributes();
    if let Some(id) = &req.request_id {
        attrs.push(string_kv(REQUEST_ID_ATTRIBUTE, id));
    }
    for lat in Lat::ALL {
        if let Some(v) = req.latency(lat) {
            em.push(Out::PerRequest(lat), 0, time, &attrs, Value::Double(v));
        }
    }
    if let Some(t) = req.tle {
        em.push(Out::PerRequestQuality(Qual::Tle), 0, time, &attrs, Value::Double(t));
    }
    if let Some(r) = req.rci {
        em.push(Out::PerRequestQuality(Qual::Rci), 0, time, &attrs, Value::Double(r));
        em.push(Out::PerRequestScore, 0, time, &attrs, Value::Double(super::quality::score(r)));
    }
}

fn metric_of(out: Out, points: Vec<Point>) -> Metric {
    let data = if let Out::Hist(_) = out {
        metric::Data::Histogram(Histogram {
            data_points: points
                .into_iter()
                .filter_map(|p| match p.value {
                    Value::Hist(bounds, h) => Some(HistogramDataPoint {
                        attributes: p.attrs,
                        start_time_unix_nano: p.start,
                        time_unix_nano: p.time,
                        count: h.count,
                        sum: Some(h.sum),
                        bucket_counts: h.counts,
                        explicit_bounds: bounds.to_vec(),
                        exemplars: Vec::new(),
                        flags: 0,
                        min: (h.count > 0).then_some(h.min),
                        max: (h.count > 0).then_some(h.max),
                    }),
                    _ => None,
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        })
    } else {
        metric::Data::Gauge(Gauge {
            data_points: points
                .into_iter()
                .filter_map(|p| {
                    let value = match p.value {
                        Value::Double(d) => number_data_point::Value::AsDouble(d),
                        Value::Int(i) => number_data_point::Value::AsInt(i),
                        Value::Hist(..) => return None,
                    };
                    Some(NumberDataPoint {
                        attributes: p.attrs,
                        start_time_unix_nano: p.start,
                        time_unix_nano: p.time,
                        exemplars: Vec::new(),
                        flags: 0,
                        value: Some(value),
                    })
                })
                .collect(),
        })
    };
    Metric {
        name: out.name().into(),
        description: out.description().into(),
        unit: out.unit().into(),
        metadata: Vec::new(),
        data: Some(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What otelcol's OTLP → Prometheus translation makes of the names: every `.`/`_` token is
    /// kept, `_ratio` comes from unit `1` on a gauge, histograms get `_bucket`/`_sum`/`_count`.
    #[test]
    fn names_and_units_translate_to_valid_prometheus_names() {
        let all = Out::all();
        assert_eq!(all.len(), 4 + 15 + 12 + 5 + 6 + 2 + 4 + 3, "every output once");
        let names: std::collections::BTreeSet<&str> = all.iter().map(|o| o.name()).collect();
        assert_eq!(names.len(), all.len(), "names are unique");
        for out in all {
            let last = out.name().rsplit(['.', '_']).next().unwrap_or_default();
            assert!(
                !["count", "sum", "bucket", "total", "ratio"].contains(&last),
                "{}: a gauge may not end in a histogram's, counter's or ratio's suffix",
                out.name()
            );
            let ratio = matches!(
                out,
                Out::ErrorRate
                    | Out::KvUsage
                    | Out::PrefixHitRate
                    | Out::Quality(Qual::Rci, _)
                    | Out::QualityScore
                    | Out::PerRequestQuality(Qual::Rci)
                    | Out::PerRequestScore
            );
            assert_eq!(out.unit() == "1", ratio && !out.is_histogram(), "{}: unit 1 only for ratios", out.name());
        }
        assert_eq!((Out::PrefixLow.unit(), Out::QueueBlocking.unit()), ("", ""), "0/1 flags have no unit");
        assert_eq!(Out::TtftLongShort.unit(), "", "a quotient of latencies is no fraction 0-1");
        assert_eq!(Out::ByInput(SplitLat::Ttft, Pct::P95).name(), "llm.ttft.by_input.p95");
        assert_eq!(Out::RequestsFinished.name(), "llm.requests.finished");
    }
}
