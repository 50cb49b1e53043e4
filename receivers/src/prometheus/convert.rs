//! Parsed expositions → OTLP metrics, the way otelcol's prometheus receiver converts them.
//!
//! - counter → cumulative monotonic `Sum`. The name drops a trailing `_total` (otelcol keeps the
//!   `# TYPE` name by default, which is `x_total` in the text format but `x` in OpenMetrics; its
//!   name normalisation, the `pkg.translator.prometheus.NormalizeName` gate, trims `_total`, and
//!   we always do so that both formats give the same name; the Prometheus exporters add it back).
//!   Colons stay. TGI's counters, which have no `_total`, keep their names.
//! - gauge, untyped/unknown, stateset → `Gauge`; info → `Gauge` named `x_info` with all labels
//!   (as are info-style gauges such as `vllm:cache_config_info`); gaugehistogram → `Gauge`s
//!   `x_bucket` (with `le`), `x_gsum`, `x_gcount` (OTLP has no gauge histogram).
//! - histogram → cumulative `Histogram`: bucket counts de-cumulated from the `le` buckets,
//!   explicit bounds without `+Inf`, count from `_count` (else the `+Inf` bucket), sum from `_sum`.
//! - summary → `Summary` with its quantiles, `_count` and `_sum`.
//! - Start times: see [`super::adjust`]; gauges have none.
//! - Points: labels become attributes; with `honor_labels: false` a scraped label that clashes
//!   with a target label (`job`, `instance`, static labels) is renamed `exported_<name>` and the
//!   target's value is used; `job` and `instance` go to the resource, not the points; empty
//!   label values are absent labels, as in Prometheus. The time is the sample's own timestamp,
//!   else the scrape's.
//! - Resource: `service.name` = job, `service.instance.id` = `host:port`, `server.address`,
//!   `server.port`, `url.scheme`; scope `inferwatch/receiver/prometheus`.

use super::adjust::{Last, StartTimes};
use super::config::TargetAddr;
use super::parse::{Exposition, Family, Kind, Label, Sample, Suffix};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum, Summary, SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

/// Instrumentation scope name of the scraped metrics.
pub const SCOPE_NAME: &str = "inferwatch/receiver/prometheus";

/// One scrape target: what it adds to the resource and to every point.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The job name (`service.name`).
    pub job: String,
    /// The target's address.
    pub addr: TargetAddr,
    /// `http`.
    pub scheme: String,
    /// Static labels, sorted by name.
    pub labels: Vec<(String, String)>,
    /// Scraped labels win over target labels.
    pub honor_labels: bool,
}

impl Target {
    /// The target's `instance` (`host:port`).
    pub fn instance(&self) -> String {
        self.addr.instance()
    }

    /// The resource of everything scraped from this target (otelcol's attributes).
    pub fn resource(&self) -> Resource {
        Resource {
            attributes: vec![
                kv("service.name", &self.job),
                kv("service.instance.id", &self.instance()),
                kv("server.address", &self.addr.host),
                kv("server.port", &self.addr.port.to_string()),
                kv("url.scheme", &self.scheme),
            ],
            ..Default::default()
        }
    }

    fn is_target_label(&self, name: &str) -> bool {
        name == "job" || name == "instance" || self.labels.iter().any(|(k, _)| k == name)
    }
}

/// A string attribute.
pub fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(AnyV::StringValue(value.to_string())) }),
        ..Default::default()
    }
}

/// Converts the scrapes of one target, keeping the start times of its cumulative series.
pub struct Converter {
    target: Target,
    starts: StartTimes,
    instance: Option<String>,
    /// Hashes of the series (name and labels of each sample) of the last successful scrape.
    seen: HashSet<u64>,
}

/// Samples of one family that share their labels (one series).
struct Group<'s, 'a> {
    labels: &'s [Label<'a>],
    samples: Vec<&'s Sample<'a>>,
}

/// Splits samples into series by their labels (in order of first appearance).
fn group<'s, 'a>(samples: &'s [Sample<'a>]) -> Vec<Group<'s, 'a>> {
    let mut groups: Vec<Group<'s, 'a>> = Vec::new();
    let mut index: HashMap<Vec<(&'s str, &'s str)>, usize> = HashMap::new();
    for s in samples {
        if let Some(g) = groups.last_mut()
            && g.labels == s.labels.as_slice()
        {
            g.samples.push(s);
            continue;
        }
        let mut key: Vec<(&str, &str)> = s.labels.iter().map(|l| (l.name.as_ref(), l.value.as_ref())).collect();
        key.sort_unstable();
        match index.get(&key) {
            Some(&i) => groups[i].samples.push(s),
            None => {
                index.insert(key, groups.len());
                groups.push(Group { labels: &s.labels, samples: vec![s] });
            }
        }
    }
    groups
}

/// Seconds since the epoch → nanoseconds, exact for values with few decimals (whole seconds and
/// the fraction are converted apart, so 1700000000.25 gives ...250000000 and not a neighbour).
pub fn seconds_to_ns(v: f64) -> Option<u64> {
    if !v.is_finite() || v <= 0.0 || v >= 1.8e10 {
        return None;
    }
    let whole = v.trunc();
    let frac_ns = ((v - whole) * 1e9).round() as u64;
    Some((whole as u64).saturating_mul(1_000_000_000).saturating_add(frac_ns)).filter(|&ns| ns > 0)
}

fn to_count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 { v.round() as u64 } else { 0 }
}

fn metric(f: &Family<'_>, name: String, data: Data) -> Metric {
    Metric {
        name,
        description: f.help.as_deref().unwrap_or_default().to_string(),
        unit: f.unit.as_deref().unwrap_or_default().to_string(),
        data: Some(data),
        ..Default::default()
    }
}

fn gauge_point(attributes: Vec<KeyValue>, time_ns: u64, v: f64) -> NumberDataPoint {
    NumberDataPoint { attributes, time_unix_nano: time_ns, value: Some(NumV::AsDouble(v)), ..Default::default() }
}

const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

impl Converter {
    /// A converter with no history.
    pub fn new(target: Target) -> Self {
        Converter { target, starts: StartTimes::new(), instance: None, seen: HashSet::new() }
    }

    /// A converter whose `service.instance.id` is `instance` (a relabeled `instance` label)
    /// rather than the target's `host:port`.
    pub fn with_instance(target: Target, instance: String) -> Self {
        Converter { target, starts: StartTimes::new(), instance: Some(instance), seen: HashSet::new() }
    }

    /// The target's `instance` label.
    pub fn instance(&self) -> String {
        self.instance.clone().unwrap_or_else(|| self.target.instance())
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The health series of one scrape, with the target's labels on their points.
    pub fn scrape_metrics(&self, report: &ScrapeReport, scrape_ns: u64) -> Vec<Metric> {
        scrape_metrics(report, &self.target.labels, scrape_ns)
    }

    /// Counts the series of `expo` that the last successful scrape did not have (Prometheus'
    /// `scrape_series_added`: each sample line is a series), and remembers them for the next.
    pub fn series_added(&mut self, expo: &Exposition<'_>) -> usize {
        let mut now = HashSet::with_capacity(self.seen.len().max(16));
        for f in &expo.families {
            for s in &f.samples {
                let mut h = DefaultHasher::new();
                f.name.hash(&mut h);
                s.suffix.as_str().hash(&mut h);
                s.bound.map(f64::to_bits).hash(&mut h);
                let mut labels: Vec<(&str, &str)> =
                    s.labels.iter().map(|l| (l.name.as_ref(), l.value.as_ref())).collect();
                labels.sort_unstable();
                labels.hash(&mut h);
                now.insert(h.finish());
            }
        }
        let added = now.iter().filter(|k| !self.seen.contains(k)).count();
        self.seen = now;
        added
    }

    /// Number of cumulative series whose start time is tracked.
    pub fn tracked_series(&self) -> usize {
        self.starts.len()
    }

    /// Converts one successful scrape taken at `scrape_ns`; `extra` labels (e.g. a TGI
    /// target's `model_name`) are added to every point that lacks them.
    pub fn convert(&mut self, expo: &Exposition<'_>, scrape_ns: u64, extra: &[(String, String)]) -> Vec<Metric> {
        let mut out = Vec::with_capacity(expo.families.len());
        for f in &expo.families {
            if f.samples.is_empty() {
                continue;
            }
            match f.kind {
                Kind::Counter => self.counter(f, scrape_ns, extra, &mut out),
                Kind::Histogram => self.histogram(f, scrape_ns, extra, &mut out),
                Kind::Summary => self.summary(f, scrape_ns, extra, &mut out),
                Kind::GaugeHistogram => {
                    for sfx in [Suffix::Bucket, Suffix::Gsum, Suffix::Gcount] {
                        let name = format!("{}{}", f.name, sfx.as_str());
                        self.gauge(f, name, Some(sfx), scrape_ns, extra, &mut out);
                    }
                }
                Kind::Info => {
                    let name = if f.name.ends_with("_info") { f.name.to_string() } else { format!("{}_info", f.name) };
                    self.gauge(f, name, None, scrape_ns, extra, &mut out);
                }
                Kind::Gauge | Kind::Unknown | Kind::StateSet => {
                    self.gauge(f, f.name.to_string(), None, scrape_ns, extra, &mut out)
                }
            }
        }
        self.starts.end_scrape();
        out
    }

    /// The export request of one scrape's metrics.
    pub fn request(&self, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource()),
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

    /// The resource, with a relabeled instance where there is one.
    fn resource(&self) -> Resource {
        let mut r = self.target.resource();
        if let Some(i) = &self.instance {
            for a in &mut r.attributes {
                if a.key == "service.instance.id" {
                    *a = kv("service.instance.id", i);
                }
            }
        }
        r
    }

    /// Point attributes (sorted by key) for scraped `labels`.
    fn attributes(&self, labels: &[Label<'_>], extra: &[(String, String)]) -> Vec<(String, String)> {
        let t = &self.target;
        let mut out: Vec<(String, String)> = Vec::with_capacity(labels.len() + t.labels.len() + extra.len());
        for l in labels {
            if l.value.is_empty() {
                continue;
            }
            let name = l.name.as_ref();
            if !t.honor_labels && t.is_target_label(name) {
                let mut n = format!("exported_{name}");
                while labels.iter().any(|x| x.name == n) || t.is_target_label(&n) {
                    n = format!("exported_{n}");
                }
                out.push((n, l.value.to_string()));
            } else {
                out.push((name.to_string(), l.value.to_string()));
            }
        }
        for (k, v) in t.labels.iter().chain(extra) {
            if !out.iter().any(|(ok, _)| ok == k) {
                out.push((k.clone(), v.clone()));
            }
        }
        out.sort_unstable();
        out
    }

    fn series(&self, name: &str, labels: &[Label<'_>], extra: &[(String, String)]) -> (Vec<KeyValue>, u64) {
        let attrs = self.attributes(labels, extra);
        let mut h = DefaultHasher::new();
        name.hash(&mut h);
        attrs.hash(&mut h);
        let kvs = attrs.iter().map(|(k, v)| kv(k, v)).collect();
        (kvs, h.finish())
    }

    fn time(s: &Sample<'_>, scrape_ns: u64) -> u64 {
        s.timestamp_ns.filter(|&t| t > 0).map_or(scrape_ns, |t| t as u64)
    }

    fn gauge(
        &self,
        f: &Family<'_>,
        name: String,
        only: Option<Suffix>,
        scrape_ns: u64,
        extra: &[(String, String)],
        out: &mut Vec<Metric>,
    ) {
        let points: Vec<NumberDataPoint> = f
            .samples
            .iter()
            .filter(|s| only.is_none_or(|o| s.suffix == o))
            .map(|s| {
                let attrs = self.attributes(&s.labels, extra).iter().map(|(k, v)| kv(k, v)).collect();
                gauge_point(attrs, Self::time(s, scrape_ns), s.value)
            })
            .collect();
        if !points.is_empty() {
            out.push(metric(f, name, Data::Gauge(Gauge { data_points: points })));
        }
    }

    fn counter(&mut self, f: &Family<'_>, scrape_ns: u64, extra: &[(String, String)], out: &mut Vec<Metric>) {
        let name = f.name.strip_suffix("_total").unwrap_or(&f.name).to_string();
        let mut points = Vec::new();
        for g in group(&f.samples) {
            let value = g.samples.iter().rev().find(|s| matches!(s.suffix, Suffix::None | Suffix::Total));
            let Some(value) = value else { continue };
            let created = g.samples.iter().find(|s| s.suffix == Suffix::Created).and_then(|s| seconds_to_ns(s.value));
            let time = Self::time(value, scrape_ns);
            let (attributes, key) = self.series(&name, g.labels, extra);
            let start = self.starts.start(key, time, created, Last::Value(value.value));
            points.push(NumberDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: time,
                value: Some(NumV::AsDouble(value.value)),
                ..Default::default()
            });
        }
        if !points.is_empty() {
            let sum = Sum { data_points: points, aggregation_temporality: CUMULATIVE, is_monotonic: true };
            out.push(metric(f, name, Data::Sum(sum)));
        }
    }

    fn histogram(&mut self, f: &Family<'_>, scrape_ns: u64, extra: &[(String, String)], out: &mut Vec<Metric>) {
        let name = f.name.to_string();
        let mut points = Vec::new();
        for g in group(&f.samples) {
            let mut buckets: Vec<(f64, f64)> = Vec::new();
            let (mut sum, mut count, mut created, mut time) = (None, None, None, None);
            for s in &g.samples {
                match s.suffix {
                    Suffix::Bucket => buckets.extend(s.bound.map(|b| (b, s.value))),
                    Suffix::Sum => sum = Some(s.value),
                    Suffix::Count => count = Some(s.value),
                    Suffix::Created => created = seconds_to_ns(s.value),
                    _ => {}
                }
                if s.suffix != Suffix::Created && time.is_none() {
                    time = s.timestamp_ns.filter(|&t| t > 0).map(|t| t as u64);
                }
            }
            if buckets.is_empty() && count.is_none() {
                continue;
            }
            let time = time.unwrap_or(scrape_ns);
            buckets.retain(|(b, _)| !b.is_nan());
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            buckets.dedup_by(|a, b| a.0 == b.0);
            let inf = buckets.iter().find(|(b, _)| *b == f64::INFINITY).map(|(_, v)| *v);
            buckets.retain(|(b, _)| *b != f64::INFINITY);
            let last_cum = buckets.last().map(|(_, v)| *v);
            let count = to_count(count.or(inf).or(last_cum).unwrap_or(0.0));
            let mut cumulative = Vec::with_capacity(buckets.len());
            let mut bucket_counts = Vec::with_capacity(buckets.len() + 1);
            let mut prev = 0u64;
            for (_, v) in &buckets {
                let c = to_count(*v);
                cumulative.push(c);
                bucket_counts.push(c.saturating_sub(prev));
                prev = prev.max(c);
            }
            bucket_counts.push(count.saturating_sub(prev));
            let (attributes, key) = self.series(&name, g.labels, extra);
            let last = Last::Histogram { count, sum: sum.unwrap_or(0.0), buckets: cumulative };
            let start = self.starts.start(key, time, created, last);
            points.push(HistogramDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: time,
                count,
                sum,
                bucket_counts,
                explicit_bounds: buckets.iter().map(|(b, _)| *b).collect(),
                ..Default::default()
            });
        }
        if !points.is_empty() {
            let h = Histogram { data_points: points, aggregation_temporality: CUMULATIVE };
            out.push(metric(f, name, Data::Histogram(h)));
        }
    }

    fn summary(&mut self, f: &Family<'_>, scrape_ns: u64, extra: &[(String, String)], out: &mut Vec<Metric>) {
        let name = f.name.to_string();
        let mut points = Vec::new();
        for g in group(&f.samples) {
            let mut quantiles: Vec<ValueAtQuantile> = Vec::new();
            let (mut sum, mut count, mut created, mut time) = (None, None, None, None);
            for s in &g.samples {
                match s.suffix {
                    Suffix::None => quantiles.extend(s.bound.map(|q| ValueAtQuantile { quantile: q, value: s.value })),
                    Suffix::Sum => sum = Some(s.value),
                    Suffix::Count => count = Some(s.value),
                    Suffix::Created => created = seconds_to_ns(s.value),
                    _ => {}
                }
                if s.suffix != Suffix::Created && time.is_none() {
                    time = s.timestamp_ns.filter(|&t| t > 0).map(|t| t as u64);
                }
            }
            if quantiles.is_empty() && count.is_none() && sum.is_none() {
                continue;
            }
            let time = time.unwrap_or(scrape_ns);
            quantiles.sort_by(|a, b| a.quantile.total_cmp(&b.quantile));
            let (count, sum) = (to_count(count.unwrap_or(0.0)), sum.unwrap_or(0.0));
            let (attributes, key) = self.series(&name, g.labels, extra);
            let start = self.starts.start(key, time, created, Last::Summary { count, sum });
            points.push(SummaryDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: time,
                count,
                sum,
                quantile_values: quantiles,
                ..Default::default()
            });
        }
        if !points.is_empty() {
            out.push(metric(f, name, Data::Summary(Summary { data_points: points })));
        }
    }
}

/// What one scrape yields besides its samples: the scrape-health series' values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScrapeReport {
    /// The scrape succeeded.
    pub up: bool,
    /// How long it took.
    pub duration: Duration,
    /// Samples the target exposed (before `metric_relabel_configs`).
    pub scraped: usize,
    /// Samples left after `metric_relabel_configs`.
    pub post_relabel: usize,
    /// Series not seen in the previous successful scrape (every series on the first one).
    pub series_added: usize,
}

impl ScrapeReport {
    /// A failed scrape: `up` = 0 and no samples.
    pub fn failed(duration: Duration) -> Self {
        ScrapeReport { up: false, duration, scraped: 0, post_relabel: 0, series_added: 0 }
    }
}

/// Prometheus' (and otelcol's) per-scrape gauges: `up`, `scrape_duration_seconds`,
/// `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`,
/// each with one point carrying `target_labels` (the target's labels other than `job` and
/// `instance`, which are the resource's `service.name` and `service.instance.id`, as for
/// scraped samples).
pub fn scrape_metrics(r: &ScrapeReport, target_labels: &[(String, String)], scrape_ns: u64) -> Vec<Metric> {
    let attrs: Vec<KeyValue> = target_labels.iter().map(|(k, v)| kv(k, v)).collect();
    let g = |name: &str, description: &str, unit: &str, v: f64| Metric {
        name: name.into(),
        description: description.into(),
        unit: unit.into(),
        data: Some(Data::Gauge(Gauge { data_points: vec![gauge_point(attrs.clone(), scrape_ns, v)] })),
        ..Default::default()
    };
    vec![
        g("up", "The scraping was successful", "", if r.up { 1.0 } else { 0.0 }),
        g("scrape_duration_seconds", "Duration of the scrape", "s", r.duration.as_secs_f64()),
        g("scrape_samples_scraped", "The number of samples the target exposed", "", r.scraped as f64),
        g(
            "scrape_samples_post_metric_relabeling",
            "The number of samples remaining after metric relabeling was applied",
            "",
            r.post_relabel as f64,
        ),
        g("scrape_series_added", "The approximate number of new series in this scrape", "", r.series_added as f64),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::parse::{Format, parse};
    use super::*;

    fn target(honor: bool) -> Target {
        Target {
            job: "j".into(),
            addr: TargetAddr { host: "h".into(), port: 9 },
            scheme: "http".into(),
            labels: vec![("env".into(), "prod".into())],
            honor_labels: honor,
        }
    }

    fn attrs(p: &[KeyValue]) -> Vec<(String, String)> {
        p.iter()
            .map(|k| {
                let v = match k.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(AnyV::StringValue(s)) => s.clone(),
                    other => panic!("{other:?}"),
                };
                (k.key.clone(), v)
            })
            .collect()
    }

    fn s(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    #[test]
    fn clashing_labels_are_exported_unless_honored() {
        let text = "g{job=\"other\",env=\"dev\",exported_env=\"x\",instance=\"i\",empty=\"\",k=\"v\"} 1\n";
        let e = parse(text, Format::Text).unwrap();
        let m = Converter::new(target(false)).convert(&e, 5, &[]);
        let Some(Data::Gauge(g)) = &m[0].data else { panic!() };
        assert_eq!(
            attrs(&g.data_points[0].attributes),
            vec![
                s("env", "prod"),
                s("exported_env", "x"),
                s("exported_exported_env", "dev"),
                s("exported_instance", "i"),
                s("exported_job", "other"),
                s("k", "v"),
            ]
        );
        let m = Converter::new(target(true)).convert(&e, 5, &[s("model_name", "m")]);
        let Some(Data::Gauge(g)) = &m[0].data else { panic!() };
        assert_eq!(
            attrs(&g.data_points[0].attributes),
            vec![
                s("env", "dev"),
                s("exported_env", "x"),
                s("instance", "i"),
                s("job", "other"),
                s("k", "v"),
                s("model_name", "m")
            ]
        );
    }

    #[test]
    fn histogram_buckets_are_decumulated() {
        let text = "# TYPE h histogram\nh_bucket{le=\"0.5\"} 2\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 5\n\
                    h_sum 3.5\nh_count 5\n";
        let e = parse(text, Format::Text).unwrap();
        let m = Converter::new(target(false)).convert(&e, 7, &[]);
        let Some(Data::Histogram(h)) = &m[0].data else { panic!() };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.1, 0.5]);
        assert_eq!(p.bucket_counts, vec![1, 1, 3]);
        assert_eq!((p.count, p.sum, p.start_time_unix_nano, p.time_unix_nano), (5, Some(3.5), 7, 7));
    }

    #[test]
    fn scrape_gauges_carry_the_target_labels() {
        let r = ScrapeReport {
            up: false,
            duration: Duration::from_millis(250),
            scraped: 12,
            post_relabel: 10,
            series_added: 3,
        };
        let m = Converter::new(target(false)).scrape_metrics(&r, 99);
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "up",
                "scrape_duration_seconds",
                "scrape_samples_scraped",
                "scrape_samples_post_metric_relabeling",
                "scrape_series_added"
            ]
        );
        let v = |i: usize| match &m[i].data {
            Some(Data::Gauge(g)) => {
                assert_eq!(attrs(&g.data_points[0].attributes), vec![s("env", "prod")], "{}", m[i].name);
                (g.data_points[0].value, g.data_points[0].time_unix_nano)
            }
            _ => panic!(),
        };
        assert_eq!(v(0), (Some(NumV::AsDouble(0.0)), 99));
        assert_eq!(v(1), (Some(NumV::AsDouble(0.25)), 99));
        assert_eq!(v(2), (Some(NumV::AsDouble(12.0)), 99));
        assert_eq!(v(3), (Some(NumV::AsDouble(10.0)), 99));
        assert_eq!(v(4), (Some(NumV::AsDouble(3.0)), 99));
    }

    #[test]
    fn series_added_counts_series_new_since_the_last_scrape() {
        let mut c = Converter::new(target(false));
        let a = parse(
            "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_count 1\ng{k=\"a\"} 1\n",
            Format::Text,
        )
        .unwrap();
        assert_eq!(c.series_added(&a), 4, "every series of the first scrape is new");
        assert_eq!(c.series_added(&a), 0, "the same series again");
        let b = parse("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 2\nh_bucket{le=\"+Inf\"} 2\nh_count 2\ng{k=\"b\"} 1\n", Format::Text)
            .unwrap();
        assert_eq!(c.series_added(&b), 2, "a new bucket bound and a new label value");
        assert_eq!(c.series_added(&a), 1, "g{{k=a}} is back; the others were in the last scrape");
    }
}
