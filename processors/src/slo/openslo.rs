//! OpenSLO v1 documents read as `slo` objectives (`openslo: [path, ...]`).
//!
//! Every document of `kind: SLO` (`apiVersion: openslo/v1`) becomes one objective; an `SLI`
//! is read when an SLO names it in `indicatorRef`, a `DataSource` when a metric source names
//! it in `metricSourceRef` (for its `type` only); the other kinds are skipped. What maps and
//! what is refused: docs/detectors/slo.md, "OpenSLO".

use crate::slo::config::{Objective, ObjectiveConfig, Source, Target, Threshold, latency_metric};
use crate::trend_forecast::config::{Span, parse_span};
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::config::yaml::{self, Node, NodeKind};
use serde_json::Value;
use std::collections::HashMap;

/// The only `apiVersion` read.
pub const API_VERSION: &str = "openslo/v1";
/// The `metricSource.type` that names an inferwatch signal directly.
pub const SOURCE_INFERWATCH: &str = "inferwatch";
/// The kinds of OpenSLO v1.
const KINDS: [&str; 7] =
    ["SLO", "SLI", "DataSource", "AlertPolicy", "AlertCondition", "AlertNotificationTarget", "Service"];
/// llm_signals' window error rate.
const ERROR_RATE: &str = "llm.request.error_rate";
/// Largest file read.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// One non-empty YAML document of a file.
struct Doc {
    /// Index of its file in `openslo`.
    file_index: usize,
    /// The file as configured.
    file: String,
    /// 1-based, among the file's non-empty documents.
    ordinal: usize,
    /// Lines of the file before the document's chunk.
    line_offset: usize,
    node: Node,
    json: Value,
    kind: String,
    name: String,
}

/// A dotted field path (`spec.objectives[0].op`) as path segments.
fn segs(field: &str) -> Vec<PathSeg> {
    let mut out = Vec::new();
    for part in field.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            out.push(PathSeg::Key(rest[..i].to_string()));
            rest = &rest[i..];
            while let Some(end) = rest.find(']') {
                if let Ok(n) = rest[1..end].parse() {
                    out.push(PathSeg::Index(n));
                }
                rest = &rest[end + 1..];
            }
        } else {
            out.push(PathSeg::Key(rest.to_string()));
        }
    }
    out
}

fn join(base: &str, key: &str) -> String {
    if base.is_empty() { key.to_string() } else { format!("{base}.{key}") }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

impl Doc {
    /// An error at `field` of this document, at `openslo[file_index]`.
    fn err(&self, field: &str, message: impl std::fmt::Display) -> FieldError {
        let loc = self.node.locate(&segs(field)).unwrap_or_else(|| self.node.location.clone());
        let what = match (self.kind.is_empty(), self.name.is_empty()) {
            (true, _) => "no kind".to_string(),
            (false, true) => self.kind.clone(),
            (false, false) => format!("{} {:?}", self.kind, self.name),
        };
        let field = if field.is_empty() { String::new() } else { format!("{field}: ") };
        FieldError {
            path: vec![PathSeg::Key("openslo".into()), PathSeg::Index(self.file_index)],
            message: format!(
                "{}:{}:{} (document {}, {what}): {field}{message}",
                self.file,
                loc.line + self.line_offset,
                loc.column,
                self.ordinal
            ),
        }
    }

    /// Where `field` is, as `file:line`.
    fn place(&self, field: &str) -> String {
        let loc = self.node.locate(&segs(field)).unwrap_or_else(|| self.node.location.clone());
        format!("{}:{}", self.file, loc.line + self.line_offset)
    }

    /// The value at `field` (absent and `null` alike: `None`).
    fn get(&self, field: &str) -> Option<&Value> {
        segs(field)
            .iter()
            .try_fold(&self.json, |v, s| match s {
                PathSeg::Key(k) => v.get(k.as_str()),
                PathSeg::Index(i) => v.get(*i),
            })
            .filter(|v| !v.is_null())
    }

    /// Refuses keys of the map at `field` outside `allowed`; errors when it is not a map.
    fn keys(&self, field: &str, allowed: &[&str]) -> Result<(), FieldError> {
        let Some(v) = self.get(field) else { return Ok(()) };
        let Value::Object(m) = v else {
            return Err(self.err(field, format!("expected a map, got {}", type_name(v))));
        };
        for k in m.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(&join(field, k), format!("unknown field: expected one of {}", allowed.join(", "))));
            }
        }
        Ok(())
    }

    /// The string at `field`, if any.
    fn str(&self, field: &str) -> Result<Option<&str>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.err(field, format!("expected a string, got {}", type_name(v)))),
        }
    }

    /// The number at `field`, if any.
    fn num(&self, field: &str) -> Result<Option<f64>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(self.err(field, format!("expected a number, got {}", type_name(v)))),
        }
    }
}

/// Whether a line starts a YAML document (`---` at column 1).
fn is_doc_start(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// Whether a chunk holds no content (blank lines, comments, directives).
fn is_blank(lines: &[&str]) -> bool {
    lines.iter().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || l.starts_with('%') || t == "---" || t == "..."
    })
}

fn file_err(i: usize, message: String) -> FieldError {
    FieldError { path: vec![PathSeg::Key("openslo".into()), PathSeg::Index(i)], message }
}

/// Reads the documents of file `i`.
fn read(i: usize, path: &str, out: &mut Vec<Doc>) -> Result<(), FieldError> {
    let cwd = || std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "?".into());
    let meta = std::fs::metadata(path)
        .map_err(|e| file_err(i, format!("cannot read {path:?} (relative to the working directory {}): {e}", cwd())))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(file_err(i, format!("{path}: larger than {} MiB", MAX_FILE_BYTES >> 20)));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| file_err(i, format!("cannot read {path:?} (relative to the working directory {}): {e}", cwd())))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut starts: Vec<usize> = vec![0];
    starts.extend((1..lines.len()).filter(|&n| is_doc_start(lines[n])));
    starts.push(lines.len());
    let mut ordinal = 0;
    for w in starts.windows(2) {
        let chunk = &lines[w[0]..w[1]];
        if is_blank(chunk) {
            continue;
        }
        let node = yaml::parse(path, &chunk.join("\n")).map_err(|errs| {
            let e = errs.first();
            let (line, col) = e.and_then(|e| e.location.as_ref()).map_or((w[0] + 1, 1), |l| (l.line + w[0], l.column));
            let msg = e.map_or_else(|| "invalid YAML".to_string(), |e| e.message.clone());
            file_err(i, format!("{path}:{line}:{col}: {msg}"))
        })?;
        if matches!(node.kind, NodeKind::Null) {
            continue;
        }
        ordinal += 1;
        let json = node.to_json();
        let mut doc = Doc {
            file_index: i,
            file: path.to_string(),
            ordinal,
            line_offset: w[0],
            node,
            json,
            kind: String::new(),
            name: String::new(),
        };
        if !doc.json.is_object() {
            return Err(doc.err("", "expected an OpenSLO object (apiVersion, kind, metadata, spec)"));
        }
        doc.kind = doc.str("kind")?.unwrap_or_default().to_string();
        doc.name = doc.str("metadata.name")?.unwrap_or_default().trim().to_string();
        match doc.str("apiVersion")? {
            Some(API_VERSION) => {}
            Some(v) => {
                return Err(doc.err("apiVersion", format!("{v:?} is not read: only {API_VERSION} documents are")));
            }
            None => return Err(doc.err("apiVersion", format!("required: {API_VERSION}"))),
        }
        if !KINDS.contains(&doc.kind.as_str()) {
            let msg = format!("expected one of the {API_VERSION} kinds {}, got {:?}", KINDS.join(", "), doc.kind);
            return Err(doc.err("kind", msg));
        }
        if doc.name.is_empty() {
            return Err(doc.err("metadata.name", "required"));
        }
        out.push(doc);
    }
    Ok(())
}

/// The documents of `kind` by name; a name given twice is refused.
fn by_name<'a>(docs: &'a [Doc], kind: &str) -> Result<HashMap<&'a str, &'a Doc>, FieldError> {
    let mut m: HashMap<&str, &Doc> = HashMap::new();
    for d in docs.iter().filter(|d| d.kind == kind) {
        if let Some(first) = m.insert(d.name.as_str(), d) {
            return Err(d.err("metadata.name", format!("a {kind} of this name is declared at {} too", first.place(""))));
        }
    }
    Ok(m)
}

/// The objectives of the `SLO` documents of `paths`, in file and document order; `existing`
/// (the objectives declared natively) must not share their names.
pub fn objectives(paths: &[String], existing: &[Objective]) -> Result<Vec<Objective>, FieldError> {
    let mut docs = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        read(i, p, &mut docs)?;
    }
    let slis = by_name(&docs, "SLI")?;
    let sources = by_name(&docs, "DataSource")?;
    let refs = Refs { slis, sources };
    let mut out: Vec<Objective> = Vec::new();
    let mut from: Vec<&Doc> = Vec::new();
    for d in docs.iter().filter(|d| d.kind == "SLO") {
        let o = slo(d, &refs)?;
        if existing.iter().any(|e| e.name == o.name) {
            return Err(
                d.err("metadata.name", format!("duplicate objective name {:?}: declared in objectives too", o.name))
            );
        }
        if let Some(k) = out.iter().position(|e| e.name == o.name) {
            return Err(d.err(
                "metadata.name",
                format!("duplicate objective name {:?}: an SLO at {} has it too", o.name, from[k].place("")),
            ));
        }
        out.push(o);
        from.push(d);
    }
    if out.is_empty() {
        return Err(FieldError::at(
            "openslo",
            format!("no document of kind SLO (apiVersion {API_VERSION}) in {paths:?}"),
        ));
    }
    Ok(out)
}

/// The documents an SLO may refer to.
struct Refs<'a> {
    slis: HashMap<&'a str, &'a Doc>,
    sources: HashMap<&'a str, &'a Doc>,
}

/// What a metric source names: an llm_signals gauge, with the source and model filters.
struct Metric {
    /// A latency gauge (`llm.tpot.p95`) or [`ERROR_RATE`].
    metric: String,
    source: Source,
    model: String,
}

/// An indicator: a threshold metric or a precomputed failure ratio (`raw`, `rawType: failure`).
enum Indicator {
    Threshold(Metric),
    FailureRatio(Metric),
}

/// Where an indicator's spec is: its document and the path of its `spec`.
struct At<'a> {
    doc: &'a Doc,
    spec: String,
}

fn slo(d: &Doc, refs: &Refs) -> Result<Objective, FieldError> {
    d.keys("", &["apiVersion", "kind", "metadata", "spec"])?;
    if d.get("spec").is_none() {
        return Err(d.err("spec", "required"));
    }
    d.keys(
        "spec",
        &[
            "description",
            "service",
            "indicator",
            "indicatorRef",
            "timeWindow",
            "budgetingMethod",
            "objectives",
            "alertPolicies",
        ],
    )?;
    // The indicator: inline, or an SLI document of the same files.
    let at = match (d.get("spec.indicator"), d.str("spec.indicatorRef")?) {
        (Some(_), Some(_)) => return Err(d.err("spec.indicatorRef", "give indicator or indicatorRef, not both")),
        (None, None) => return Err(d.err("spec", "indicator or indicatorRef is required")),
        (Some(_), None) => {
            d.keys("spec.indicator", &["apiVersion", "kind", "metadata", "spec"])?;
            if let Some(k) = d.str("spec.indicator.kind")?
                && k != "SLI"
            {
                return Err(d.err("spec.indicator.kind", format!("expected SLI, got {k:?}")));
            }
            At { doc: d, spec: "spec.indicator.spec".into() }
        }
        (None, Some(name)) => match refs.slis.get(name.trim()) {
            Some(sli) => At { doc: sli, spec: "spec".into() },
            None => {
                return Err(d.err(
                    "spec.indicatorRef",
                    format!(
                        "no SLI document named {name:?} in the openslo files (an SLI is looked up by metadata.name)"
                    ),
                ));
            }
        },
    };
    let indicator = indicator(&at, refs)?;

    // The compliance period: one rolling window.
    let period = match d.get("spec.timeWindow") {
        None => Span::days(28),
        Some(Value::Array(items)) if items.len() == 1 => {
            let f = "spec.timeWindow[0]";
            d.keys(f, &["duration", "isRolling", "calendar"])?;
            let rolling = match d.get(&join(f, "isRolling")) {
                None => d.get(&join(f, "calendar")).is_none(),
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(d.err(&join(f, "isRolling"), format!("expected a boolean, got {}", type_name(v))));
                }
            };
            if !rolling || d.get(&join(f, "calendar")).is_some() {
                return Err(d.err(
                    &join(f, "isRolling"),
                    "calendar-aligned windows are not supported: the budget is over a rolling period (isRolling: true)",
                ));
            }
            let field = join(f, "duration");
            let Some(dur) = d.str(&field)? else {
                return Err(d.err(&field, "required: a duration such as 28d or 4w"));
            };
            let t = dur.trim();
            if t.ends_with(['M', 'Q', 'Y']) {
                return Err(
                    d.err(&field, format!("{dur:?}: months, quarters and years vary in length: write days, e.g. 30d"))
                );
            }
            Span(parse_span(t).map_err(|e| d.err(&field, e))?)
        }
        Some(_) => return Err(d.err("spec.timeWindow", "expected a list of exactly one window")),
    };

    // The one objective.
    let objs = match d.get("spec.objectives") {
        Some(Value::Array(items)) if items.len() == 1 => "spec.objectives[0]",
        Some(Value::Array(items)) if items.len() > 1 => {
            return Err(d.err(
                "spec.objectives",
                format!(
                    "{} objectives: an inferwatch objective has one target: write one SLO document per objective",
                    items.len()
                ),
            ));
        }
        _ => {
            return Err(d.err(
                "spec.objectives",
                "required: a list of one objective (target, and op / value for a thresholdMetric)",
            ));
        }
    };
    d.keys(objs, &["displayName", "op", "value", "target", "targetPercent", "timeSliceTarget", "timeSliceWindow"])?;
    let target_field;
    let target = match (d.num(&join(objs, "target"))?, d.num(&join(objs, "targetPercent"))?) {
        (Some(_), Some(_)) => return Err(d.err(&join(objs, "targetPercent"), "give target or targetPercent, not both")),
        (None, None) => {
            return Err(d.err(objs, "target or targetPercent is required (e.g. target: 0.99 or targetPercent: 99)"));
        }
        (Some(t), None) => {
            target_field = join(objs, "target");
            if !(t > 0.0 && t < 1.0) {
                return Err(d.err(&target_field, format!("must be strictly between 0 and 1, got {t}")));
            }
            t
        }
        (None, Some(p)) => {
            target_field = join(objs, "targetPercent");
            if !(p > 0.0 && p < 100.0) {
                return Err(d.err(&target_field, format!("must be strictly between 0 and 100, got {p}")));
            }
            p / 100.0
        }
    };

    // Budgeting method × indicator → the event rule.
    let method = d.str("spec.budgetingMethod")?;
    let timeslices = match method {
        Some("Occurrences") => false,
        Some("Timeslices") => true,
        Some("RatioTimeslices") => {
            return Err(d.err(
                "spec.budgetingMethod",
                "RatioTimeslices (the mean of the slices' ratios) has no inferwatch equivalent: use Occurrences \
                 (requests, or windows for a thresholdMetric) or Timeslices (1-minute windows)",
            ));
        }
        Some(other) => {
            return Err(d.err(
                "spec.budgetingMethod",
                format!("unknown budgeting method {other:?}: expected Occurrences or Timeslices"),
            ));
        }
        None => return Err(d.err("spec.budgetingMethod", "required: Occurrences or Timeslices")),
    };
    let slice_target = d.num(&join(objs, "timeSliceTarget"))?;
    if timeslices {
        let field = join(objs, "timeSliceWindow");
        let ns = match d.get(&field) {
            None => return Err(d.err(&field, "required with Timeslices: 1m (one llm_signals window)")),
            Some(Value::Number(n)) => n.as_f64().map(|m| (m * 60e9) as u64).unwrap_or(0),
            Some(Value::String(s)) => parse_span(s).map_err(|e| d.err(&field, e))?,
            Some(v) => return Err(d.err(&field, format!("expected a duration, got {}", type_name(v)))),
        };
        if ns != 60_000_000_000 {
            return Err(d.err(
                &field,
                "must be 1m: a slice is one llm_signals window (its default window of 1 minute), whose point is one event",
            ));
        }
        if let Some(t) = slice_target
            && !(t > 0.0 && t <= 1.0)
        {
            return Err(d.err(&join(objs, "timeSliceTarget"), format!("must be in (0, 1], got {t}")));
        }
    }
    let (op, value) = (d.str(&join(objs, "op"))?, d.get(&join(objs, "value")));
    let (signal, threshold, metric, threshold_field) = match indicator {
        Indicator::Threshold(m) => {
            let op_field = join(objs, "op");
            match op {
                Some("lte") => {}
                Some("lt") => {
                    return Err(d.err(
                        &op_field,
                        "lt: a window is good when its value is at most the threshold: write op: lte",
                    ));
                }
                Some(o @ ("gt" | "gte")) => {
                    return Err(d.err(
                        &op_field,
                        format!(
                            "{o}: a latency or error rate is good when low: write op: lte (good when the metric ≤ value)"
                        ),
                    ));
                }
                Some(o) => return Err(d.err(&op_field, format!("unknown operator {o:?}: expected lte"))),
                None => return Err(d.err(&op_field, "required with a thresholdMetric: lte")),
            }
            let vfield = join(objs, "value");
            let Some(v) = value else {
                return Err(d.err(&vfield, "required with a thresholdMetric: the largest good value"));
            };
            let th: Threshold =
                serde_json::from_value(v.clone()).map_err(|e| d.err(&vfield, e.to_string().replace("\\\"", "\"")))?;
            if m.metric == ERROR_RATE {
                // A window is good when its error rate is at most the value: availability.
                let Some(t) = th.0.filter(|t| (0.0..1.0).contains(t)) else {
                    return Err(d.err(&vfield, "an error rate's threshold is a ratio in [0, 1), e.g. 0.05"));
                };
                ("availability".to_string(), Threshold(Some(t)), m, vfield)
            } else {
                (m.metric.clone(), th, m, vfield)
            }
        }
        Indicator::FailureRatio(m) => {
            if op.is_some() || value.is_some() {
                let f = if op.is_some() { join(objs, "op") } else { join(objs, "value") };
                return Err(d.err(&f, "op and value apply to a thresholdMetric, not to a ratioMetric"));
            }
            if timeslices {
                // A slice (window) is good when its success ratio reaches timeSliceTarget.
                let f = join(objs, "timeSliceTarget");
                let Some(t) = slice_target else {
                    return Err(
                        d.err(&f, "required with Timeslices and a ratioMetric: the good share of a window, e.g. 0.95")
                    );
                };
                // 1 is allowed: then a window with any failure is bad.
                let th = ((1.0 - t) * 1e12).round() / 1e12;
                ("availability".to_string(), Threshold(Some(th)), m, f)
            } else {
                ("error_ratio".to_string(), Threshold(None), m, at.spec.clone())
            }
        }
    };
    let cfg = ObjectiveConfig {
        name: d.name.clone(),
        signal,
        threshold,
        target: Target(target),
        period,
        source: metric.source,
        model: metric.model,
        ..ObjectiveConfig::default()
    };
    cfg.check(0).map_err(|e| {
        let key = match e.path.get(2) {
            Some(PathSeg::Key(k)) => k.as_str(),
            _ => "",
        };
        let field = match key {
            "name" => "metadata.name".to_string(),
            "target" => target_field.clone(),
            "period" => "spec.timeWindow[0].duration".to_string(),
            "threshold" => threshold_field.clone(),
            _ => at.spec.clone(),
        };
        let doc = if key == "signal" { at.doc } else { d };
        doc.err(&field, e.message)
    })
}

/// Reads an indicator's spec (`thresholdMetric` or `ratioMetric`).
fn indicator(at: &At, refs: &Refs) -> Result<Indicator, FieldError> {
    let (d, s) = (at.doc, at.spec.as_str());
    if d.get(s).is_none() {
        return Err(d.err(s, "required: thresholdMetric or ratioMetric"));
    }
    if s == "spec" {
        d.keys("", &["apiVersion", "kind", "metadata", "spec"])?;
    }
    d.keys(s, &["description", "thresholdMetric", "ratioMetric"])?;
    match (d.get(&join(s, "thresholdMetric")), d.get(&join(s, "ratioMetric"))) {
        (Some(_), Some(_)) => Err(d.err(&join(s, "ratioMetric"), "give thresholdMetric or ratioMetric, not both")),
        (None, None) => Err(d.err(s, "thresholdMetric or ratioMetric is required")),
        (Some(_), None) => {
            let f = join(s, "thresholdMetric");
            d.keys(&f, &["metricSource"])?;
            Ok(Indicator::Threshold(metric_source(d, &join(&f, "metricSource"), refs)?))
        }
        (None, Some(_)) => {
            let f = join(s, "ratioMetric");
            d.keys(&f, &["counter", "good", "bad", "total", "rawType", "raw"])?;
            for k in ["good", "bad", "total"] {
                if d.get(&join(&f, k)).is_some() {
                    return Err(d.err(
                        &join(&f, k),
                        "llm_signals emits each window's error ratio, not good / bad / total counts: write \
                         ratioMetric.raw naming llm.request.error_rate (type inferwatch) or llm_request_error_rate_ratio \
                         (type Prometheus), with rawType: failure",
                    ));
                }
            }
            let raw = join(&f, "raw");
            if d.get(&raw).is_none() {
                return Err(d.err(&f, "raw (with rawType: failure) is required"));
            }
            match d.str(&join(&f, "rawType"))? {
                Some("failure") => {}
                Some("success") => {
                    return Err(d.err(
                        &join(&f, "rawType"),
                        "success: llm_signals' ratio is llm.request.error_rate, a failure ratio: write rawType: failure",
                    ));
                }
                Some(o) => return Err(d.err(&join(&f, "rawType"), format!("expected failure, got {o:?}"))),
                None => return Err(d.err(&join(&f, "rawType"), "required with raw: failure")),
            }
            d.keys(&raw, &["metricSource"])?;
            let m = metric_source(d, &join(&raw, "metricSource"), refs)?;
            if m.metric != ERROR_RATE {
                return Err(d.err(
                    &join(&raw, "metricSource"),
                    format!("{} is not a ratio: a raw failure ratio is llm.request.error_rate", m.metric),
                ));
            }
            Ok(Indicator::FailureRatio(m))
        }
    }
}

/// Reads a `metricSource`: type `inferwatch` (`spec: {signal, source, model}`) or `Prometheus`
/// (`spec: {query}` a selector of one llm_signals gauge).
fn metric_source(d: &Doc, f: &str, refs: &Refs) -> Result<Metric, FieldError> {
    if d.get(f).is_none() {
        return Err(d.err(f, "required"));
    }
    d.keys(f, &["metricSourceRef", "type", "spec"])?;
    let own = d.str(&join(f, "type"))?.map(str::trim);
    let via_ref = match d.str(&join(f, "metricSourceRef"))? {
        None => None,
        Some(name) => {
            let Some(ds) = refs.sources.get(name.trim()) else {
                return Err(d.err(
                    &join(f, "metricSourceRef"),
                    format!("no DataSource document named {name:?} in the openslo files"),
                ));
            };
            Some((ds.str("spec.type")?.map(str::trim).unwrap_or_default(), *ds))
        }
    };
    let ty = match (own, via_ref) {
        (Some(t), Some((r, ds))) if !t.eq_ignore_ascii_case(r) => {
            return Err(d.err(
                &join(f, "type"),
                format!("{t:?}, but the DataSource at {} has type {r:?}", ds.place("spec.type")),
            ));
        }
        (Some(t), _) => t,
        (None, Some((r, _))) => r,
        (None, None) => {
            return Err(d.err(
                &join(f, "type"),
                "required (inferwatch or Prometheus), or a metricSourceRef to a DataSource with spec.type",
            ));
        }
    };
    let spec = join(f, "spec");
    if d.get(&spec).is_none() {
        return Err(d.err(&spec, "required"));
    }
    if ty.eq_ignore_ascii_case(SOURCE_INFERWATCH) {
        d.keys(&spec, &["signal", "source", "model"])?;
        let field = join(&spec, "signal");
        let Some(signal) = d.str(&field)? else {
            return Err(d.err(&field, "required: an llm_signals gauge, e.g. llm.tpot.p95 or llm.request.error_rate"));
        };
        let metric = match signal.trim() {
            ERROR_RATE => ERROR_RATE.to_string(),
            s @ ("error_ratio" | "availability") => {
                return Err(d.err(
                    &field,
                    format!(
                        "{s} is an objective, not a metric: name the metric llm.request.error_rate (in ratioMetric.raw \
                         for error_ratio or availability, in thresholdMetric for availability)"
                    ),
                ));
            }
            s => latency_metric(s).ok_or_else(|| {
                d.err(
                    &field,
                    format!(
                        "unknown signal {s:?}: expected llm.<ttft|tpot|e2e|queue>.<p50|p95|p99> (or ttft_p95 ...) or \
                         llm.request.error_rate"
                    ),
                )
            })?,
        };
        let source = match d.str(&join(&spec, "source"))? {
            None | Some("spans") => Source::Spans,
            Some("scrape") => Source::Scrape,
            Some("any") => Source::Any,
            Some(o) => return Err(d.err(&join(&spec, "source"), format!("expected spans, scrape or any, got {o:?}"))),
        };
        let model = d.str(&join(&spec, "model"))?.unwrap_or_default().trim().to_string();
        return Ok(Metric { metric, source, model });
    }
    if ty.eq_ignore_ascii_case("prometheus") {
        d.keys(&spec, &["query"])?;
        let field = join(&spec, "query");
        let Some(q) = d.str(&field)? else {
            return Err(d.err(&field, "required: a selector of one llm_signals gauge, e.g. llm_tpot_p95_seconds"));
        };
        return selector(q).map_err(|m| d.err(&field, m));
    }
    Err(d.err(
        &join(f, "type"),
        format!(
            "{ty:?} is not read: inferwatch computes the SLI from its own llm_signals gauges; use type inferwatch \
             (spec.signal) or Prometheus (spec.query naming an llm_signals gauge)"
        ),
    ))
}

/// The llm_signals gauge of a Prometheus metric name, with or without the unit suffix.
fn prometheus_metric(name: &str) -> Option<String> {
    if matches!(name, "llm_request_error_rate_ratio" | "llm_request_error_rate") {
        return Some(ERROR_RATE.to_string());
    }
    let base = name.strip_suffix("_seconds").unwrap_or(name);
    let parts: Vec<&str> = base.split('_').collect();
    match parts.as_slice() {
        ["llm", sig, q] => latency_metric(&format!("llm.{sig}.{q}")),
        _ => None,
    }
}

/// Parses a PromQL selector of one llm_signals gauge: `name` or `name{label="v", ...}` with
/// equality matchers on `source` and `gen_ai_request_model` only.
fn selector(q: &str) -> Result<Metric, String> {
    let refuse = |why: &str| {
        format!(
            "{q:?}: {why}; inferwatch computes the SLI from its llm_signals gauges and reads a query only as a selector \
             of one, e.g. llm_tpot_p95_seconds{{source=\"spans\", gen_ai_request_model=\"llama-3-8b\"}}"
        )
    };
    let t = q.trim();
    let end = t.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(t.len());
    let (name, rest) = (&t[..end], t[end..].trim());
    let Some(metric) = prometheus_metric(name) else {
        return Err(refuse(&format!(
            "{name:?} is not an llm_signals gauge (llm_<ttft|tpot|e2e|queue>_<p50|p95|p99>_seconds or \
             llm_request_error_rate_ratio)"
        )));
    };
    let mut m = Metric { metric, source: Source::Any, model: String::new() };
    if rest.is_empty() {
        return Ok(m);
    }
    let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) else {
        return Err(refuse("only a selector is read (no functions, ranges or operators)"));
    };
    let mut seen: Vec<&str> = Vec::new();
    for matcher in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((label, val)) = matcher.split_once('=') else {
            return Err(refuse(&format!("matcher {matcher:?} is not label=\"value\"")));
        };
        let label = label.trim();
        let val = val.trim();
        if label.ends_with('!') || val.starts_with('~') {
            return Err(refuse(&format!("matcher {matcher:?}: only = matchers are read")));
        }
        let quoted = (val.len() >= 2)
            && ((val.starts_with('"') && val.ends_with('"')) || (val.starts_with('\'') && val.ends_with('\'')));
        let v = if quoted { &val[1..val.len() - 1] } else { val };
        if !quoted || v.contains(['\\', '"', '\'']) {
            return Err(refuse(&format!("matcher {matcher:?}: the value must be a plain quoted string")));
        }
        if seen.contains(&label) {
            return Err(refuse(&format!("label {label} matched twice")));
        }
        seen.push(label);
        match label {
            "source" => {
                m.source = match v {
                    "spans" => Source::Spans,
                    "scrape" => Source::Scrape,
                    _ => return Err(refuse(&format!("source {v:?}: expected spans or scrape"))),
                }
            }
            "gen_ai_request_model" => m.model = v.to_string(),
            _ => {
                return Err(refuse(&format!(
                    "label {label}: only source and gen_ai_request_model select (group with the objective's `by`)"
                )));
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_of_llm_signals_gauges() {
        let m = selector("llm_tpot_p95_seconds").unwrap();
        assert_eq!((m.metric.as_str(), m.source, m.model.as_str()), ("llm.tpot.p95", Source::Any, ""));
        let m = selector(r#" llm_ttft_p99_seconds{ source="scrape", gen_ai_request_model='llama' , } "#).unwrap();
        assert_eq!((m.metric.as_str(), m.source, m.model.as_str()), ("llm.ttft.p99", Source::Scrape, "llama"));
        assert_eq!(selector("llm_request_error_rate_ratio{source=\"spans\"}").unwrap().metric, ERROR_RATE);
        for bad in [
            "rate(llm_tpot_p95_seconds[5m])",
            "llm_tpot_p95_seconds > 0.07",
            "llm_tpot_p97_seconds",
            "http_requests_total",
            "llm_tpot_p95_seconds{job=\"x\"}",
            "llm_tpot_p95_seconds{source=~\"spans\"}",
            "llm_tpot_p95_seconds{source!=\"spans\"}",
            "llm_tpot_p95_seconds{source=spans}",
            "llm_tpot_p95_seconds{source=\"spans\",source=\"scrape\"}",
            "llm_tpot_p95_seconds[5m]",
        ] {
            assert!(selector(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn field_paths() {
        assert_eq!(
            segs("spec.objectives[0].op"),
            vec![
                PathSeg::Key("spec".into()),
                PathSeg::Key("objectives".into()),
                PathSeg::Index(0),
                PathSeg::Key("op".into())
            ]
        );
        assert!(segs("").is_empty());
    }
}
