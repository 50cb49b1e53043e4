//! Renders the accumulated series in the Prometheus text format 0.0.4 or in OpenMetrics 1.0.
//!
//! No timestamps are written (Prometheus stamps samples with the scrape time, as with otelcol's
//! default `send_timestamps: false`). Families and series are sorted, so equal state renders
//! byte for byte the same.

use super::accumulator::{Accumulator, FamilyState, Series};
use super::translate::{FamilyType, Value, format_float};
use std::collections::HashSet;
use std::fmt::Write as _;

pub use inferwatch_core::telemetry::exposition::{Format, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
use inferwatch_core::telemetry::exposition::{escape_help, escape_label_value};

/// A sample value: shortest round-trip digits, exponent form for very large or small numbers.
pub fn sample_value(f: f64) -> String {
    let a = f.abs();
    if f.is_finite() && a != 0.0 && !(1e-6..1e21).contains(&a) { format!("{f:e}") } else { format_float(f) }
}

/// Writes `name{labels,extra} value\n`.
fn sample(out: &mut String, name: &str, labels: &[(String, String)], extra: Option<(&str, &str)>, value: f64) {
    out.push_str(name);
    // `le` / `quantile` replace a point label of the same name (a duplicate fails the scrape).
    let all = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .filter(|(k, _)| extra.is_none_or(|(e, _)| e != *k))
        .chain(extra);
    let mut first = true;
    for (k, v) in all {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        escape_label_value(v, out);
        out.push('"');
    }
    if !first {
        out.push('}');
    }
    out.push(' ');
    out.push_str(&sample_value(value));
    out.push('\n');
}

/// Renders every family of `acc` in `format`.
pub fn render(acc: &Accumulator, format: Format) -> String {
    let om = format == Format::OpenMetrics;
    let mut out = String::new();
    let mut seen: HashSet<String> = HashSet::new();
    for (name, fam) in acc.families() {
        let family_name = match (om, fam.kind) {
            (true, FamilyType::Counter) => name.strip_suffix("_total").unwrap_or(name),
            _ => name.as_str(),
        };
        if om && !seen.insert(family_name.to_string()) {
            tracing::debug!(family = family_name, "two families share one OpenMetrics name; the second is not served");
            continue;
        }
        render_family(&mut out, family_name, name, fam, om);
    }
    if om {
        out.push_str("# EOF\n");
    }
    out
}

fn render_family(out: &mut String, family_name: &str, name: &str, fam: &FamilyState, om: bool) {
    if !fam.help.is_empty() {
        let _ = write!(out, "# HELP {family_name} ");
        escape_help(&fam.help, if om { Format::OpenMetrics } else { Format::Text }, out);
        out.push('\n');
    }
    let _ = writeln!(out, "# TYPE {family_name} {}", fam.kind.as_str());
    let mut series: Vec<(&Vec<(String, String)>, &Series)> = fam.series.iter().collect();
    series.sort_by(|a, b| a.0.cmp(b.0));
    let counter_name =
        if om && fam.kind == FamilyType::Counter { format!("{family_name}_total") } else { name.to_string() };
    for (labels, s) in series {
        match &s.value {
            Value::Number(v) => sample(out, &counter_name, labels, None, *v),
            Value::Histogram { count, sum, bounds, counts } => {
                let bucket = format!("{name}_bucket");
                let mut cum = 0u64;
                for (b, c) in bounds.iter().zip(counts) {
                    cum = cum.saturating_add(*c);
                    sample(out, &bucket, labels, Some(("le", &format_float(*b))), cum as f64);
                }
                sample(out, &bucket, labels, Some(("le", "+Inf")), *count as f64);
                if let Some(sum) = sum {
                    sample(out, &format!("{name}_sum"), labels, None, *sum);
                }
                sample(out, &format!("{name}_count"), labels, None, *count as f64);
            }
            Value::Summary { count, sum, quantiles } => {
                for (q, v) in quantiles {
                    sample(out, name, labels, Some(("quantile", &format_float(*q))), *v);
                }
                sample(out, &format!("{name}_sum"), labels, None, *sum);
                sample(out, &format!("{name}_count"), labels, None, *count as f64);
            }
        }
    }
}
