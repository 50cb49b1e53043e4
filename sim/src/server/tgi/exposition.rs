//! A metric registry that renders the Prometheus text format exactly as the Rust crate
//! metrics-exporter-prometheus 0.15.3 (the exporter of Hugging Face TGI's router) does:
//! counters exactly as named (no `_total`, no `_created`), no unit suffixes, values and `le` /
//! `quantile` labels written with Rust's `Display` for `u64` / `f64` (`3`, `0.5`,
//! `0.00015000000000000001`), histograms as cumulative `_bucket{le}` lines then `_sum` and
//! `_count`, anything recorded as a histogram without configured buckets as a summary with
//! the crate's default quantiles, `# HELP` only for described metrics, and a blank line after
//! every family. A metric appears once it has been touched, as with the crate's registry.
//!
//! The crate iterates its families out of hash maps, so their order is arbitrary; this
//! registry writes counters, then gauges, then histograms and summaries, each by name.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;

/// The crate's default summary quantiles.
pub const SUMMARY_QUANTILES: [f64; 7] = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
/// Samples a summary keeps for its quantiles (the crate keeps a rolling window).
const SUMMARY_WINDOW: usize = 4096;

/// A metric's label: TGI's metrics carry one label at most.
pub type Label = Option<(&'static str, &'static str)>;
type Key = (&'static str, Label);

/// Which histograms get which buckets (`PrometheusBuilder::set_buckets_for_metric`).
#[derive(Clone, Debug, PartialEq)]
pub enum Matcher {
    /// The whole name.
    Full(&'static str),
    /// Names ending with this.
    Suffix(&'static str),
}

impl Matcher {
    fn matches(&self, name: &str) -> bool {
        match self {
            Matcher::Full(n) => name == *n,
            Matcher::Suffix(s) => name.ends_with(s),
        }
    }
}

#[derive(Clone, Debug)]
struct Histogram {
    bounds: Vec<f64>,
    /// Cumulative counts per bound (a sample increments every bound >= it).
    cumulative: Vec<u64>,
    count: u64,
    sum: f64,
}

#[derive(Clone, Debug, Default)]
struct Summary {
    window: VecDeque<f64>,
    count: u64,
    sum: f64,
}

impl Summary {
    /// Nearest-rank quantile of the window; 0 when empty (the crate's `unwrap_or(0.0)`).
    fn quantile(&self, q: f64) -> f64 {
        if self.window.is_empty() {
            return 0.0;
        }
        let mut v: Vec<f64> = self.window.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let idx = (q * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)]
    }
}

#[derive(Clone, Debug)]
enum Distribution {
    Histogram(Histogram),
    Summary(Summary),
}

/// Counters, gauges and distributions by name and label.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    counters: BTreeMap<Key, u64>,
    gauges: BTreeMap<Key, f64>,
    distributions: BTreeMap<Key, Distribution>,
    buckets: Vec<(Matcher, Vec<f64>)>,
    descriptions: BTreeMap<&'static str, &'static str>,
}

impl Registry {
    /// An empty registry with these bucket overrides (first match wins).
    pub fn new(buckets: Vec<(Matcher, Vec<f64>)>) -> Self {
        Registry { buckets, ..Registry::default() }
    }

    /// Registers a `# HELP` text; the first description of a name wins, as in the crate.
    pub fn describe(&mut self, name: &'static str, help: &'static str) {
        self.descriptions.entry(name).or_insert(help);
    }

    /// `counter!(name, label).increment(by)`.
    pub fn increment(&mut self, name: &'static str, label: Label, by: u64) {
        *self.counters.entry((name, label)).or_insert(0) += by;
    }

    /// `gauge!(name).set(v)`.
    pub fn set(&mut self, name: &'static str, v: f64) {
        self.gauges.insert((name, None), v);
    }

    /// `gauge!(name).increment(v)`.
    pub fn add(&mut self, name: &'static str, v: f64) {
        *self.gauges.entry((name, None)).or_insert(0.0) += v;
    }

    /// `histogram!(name, label).record(v)`.
    pub fn record(&mut self, name: &'static str, label: Label, v: f64) {
        let buckets = &self.buckets;
        let d = self.distributions.entry((name, label)).or_insert_with(|| {
            match buckets.iter().find(|(m, _)| m.matches(name)) {
                Some((_, b)) => Distribution::Histogram(Histogram {
                    bounds: b.clone(),
                    cumulative: vec![0; b.len()],
                    count: 0,
                    sum: 0.0,
                }),
                None => Distribution::Summary(Summary::default()),
            }
        });
        match d {
            Distribution::Histogram(h) => {
                for (bound, c) in h.bounds.iter().zip(h.cumulative.iter_mut()) {
                    if v <= *bound {
                        *c += 1;
                    }
                }
                h.count += 1;
                h.sum += v;
            }
            Distribution::Summary(s) => {
                if s.window.len() == SUMMARY_WINDOW {
                    s.window.pop_front();
                }
                s.window.push_back(v);
                s.count += 1;
                s.sum += v;
            }
        }
    }

    /// A gauge's value, if it was ever set.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.gauges.iter().find(|((n, _), _)| *n == name).map(|(_, v)| *v)
    }

    /// A counter's value, if it was ever incremented.
    pub fn counter(&self, name: &str, label: Label) -> Option<u64> {
        self.counters.iter().find(|((n, l), _)| *n == name && *l == label).map(|(_, v)| *v)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        render_families(&mut out, &self.counters, "counter", &self.descriptions, |out, name, label, v| {
            line(out, name, None, *label, None, v);
        });
        render_families(&mut out, &self.gauges, "gauge", &self.descriptions, |out, name, label, v| {
            line(out, name, None, *label, None, v);
        });
        let mut names: Vec<&'static str> = self.distributions.keys().map(|(n, _)| *n).collect();
        names.dedup();
        for name in names {
            let children: Vec<(&Label, &Distribution)> =
                self.distributions.iter().filter(|((n, _), _)| *n == name).map(|((_, l), d)| (l, d)).collect();
            let kind = match children.first() {
                Some((_, Distribution::Summary(_))) => "summary",
                _ => "histogram",
            };
            header(&mut out, name, kind, &self.descriptions);
            for (label, d) in children {
                let (sum, count) = match d {
                    Distribution::Histogram(h) => {
                        for (bound, c) in h.bounds.iter().zip(&h.cumulative) {
                            line(&mut out, name, Some("bucket"), *label, Some(("le", bound.to_string())), c);
                        }
                        line(&mut out, name, Some("bucket"), *label, Some(("le", "+Inf".into())), h.count);
                        (h.sum, h.count)
                    }
                    Distribution::Summary(s) => {
                        for q in SUMMARY_QUANTILES {
                            line(&mut out, name, None, *label, Some(("quantile", q.to_string())), s.quantile(q));
                        }
                        (s.sum, s.count)
                    }
                };
                line(&mut out, name, Some("sum"), *label, None, sum);
                line(&mut out, name, Some("count"), *label, None, count);
            }
            out.push('\n');
        }
        out
    }
}

fn render_families<V>(
    out: &mut String,
    map: &BTreeMap<Key, V>,
    kind: &str,
    descriptions: &BTreeMap<&'static str, &'static str>,
    mut sample: impl FnMut(&mut String, &str, &Label, &V),
) {
    let mut current: Option<&str> = None;
    for ((name, label), v) in map {
        if current != Some(name) {
            if current.is_some() {
                out.push('\n');
            }
            header(out, name, kind, descriptions);
            current = Some(name);
        }
        sample(out, name, label, v);
    }
    if current.is_some() {
        out.push('\n');
    }
}

fn header(out: &mut String, name: &str, kind: &str, descriptions: &BTreeMap<&'static str, &'static str>) {
    if let Some(help) = descriptions.get(name) {
        let _ = writeln!(out, "# HELP {name} {}", help.replace('\\', "\\\\").replace('\n', "\\n"));
    }
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample line, as the crate's `write_metric_line`.
fn line(
    out: &mut String,
    name: &str,
    suffix: Option<&str>,
    label: Label,
    extra: Option<(&str, String)>,
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    if let Some(s) = suffix {
        out.push('_');
        out.push_str(s);
    }
    if label.is_some() || extra.is_some() {
        out.push('{');
        if let Some((k, v)) = label {
            let _ = write!(out, "{k}=\"{v}\"");
        }
        if let Some((k, v)) = extra {
            if label.is_some() {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{v}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_metrics_exporter_prometheus() {
        let mut r = Registry::new(vec![(Matcher::Suffix("duration"), vec![0.5, 1.0])]);
        r.describe("x_count", "Total number of x");
        r.describe("x_count", "ignored: the first description wins");
        r.increment("x_count", None, 2);
        r.increment("x_failure", Some(("err", "validation")), 1);
        r.set("x_size", 3.0);
        r.record("x_duration", Some(("method", "decode")), 0.25);
        r.record("x_duration", Some(("method", "decode")), 0.75);
        r.record("x_duration", Some(("method", "decode")), 7.0);
        r.record("x_skipped", None, 0.0);
        let expected = "# HELP x_count Total number of x\n# TYPE x_count counter\nx_count 2\n\n\
             # TYPE x_failure counter\nx_failure{err=\"validation\"} 1\n\n\
             # TYPE x_size gauge\nx_size 3\n\n\
             # TYPE x_duration histogram\n\
             x_duration_bucket{method=\"decode\",le=\"0.5\"} 1\n\
             x_duration_bucket{method=\"decode\",le=\"1\"} 2\n\
             x_duration_bucket{method=\"decode\",le=\"+Inf\"} 3\n\
             x_duration_sum{method=\"decode\"} 8\n\
             x_duration_count{method=\"decode\"} 3\n\n\
             # TYPE x_skipped summary\n\
             x_skipped{quantile=\"0\"} 0\nx_skipped{quantile=\"0.5\"} 0\nx_skipped{quantile=\"0.9\"} 0\n\
             x_skipped{quantile=\"0.95\"} 0\nx_skipped{quantile=\"0.99\"} 0\nx_skipped{quantile=\"0.999\"} 0\n\
             x_skipped{quantile=\"1\"} 0\nx_skipped_sum 0\nx_skipped_count 1\n\n";
        assert_eq!(r.render(), expected);
        assert_eq!(r.counter("x_failure", Some(("err", "validation"))), Some(1));
        assert_eq!(r.counter("x_failure", Some(("err", "dropped"))), None);
        assert_eq!(r.gauge("x_size"), Some(3.0));
    }

    #[test]
    fn summary_quantiles_follow_the_window() {
        let mut r = Registry::new(Vec::new());
        for v in [1.0, 2.0, 3.0, 4.0, 5.0] {
            r.record("s", None, v);
        }
        let text = r.render();
        assert!(text.contains("s{quantile=\"0\"} 1\n"), "{text}");
        assert!(text.contains("s{quantile=\"0.5\"} 3\n"), "{text}");
        assert!(text.contains("s{quantile=\"1\"} 5\n"), "{text}");
        assert!(text.contains("s_sum 15\ns_count 5\n"), "{text}");
        assert_eq!(Registry::default().render(), "", "nothing touched, nothing rendered");
    }
}
