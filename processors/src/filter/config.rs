//! Settings of `filter` in otelcol-contrib's shape: OTTL conditions per context, and the legacy
//! `include` / `exclude` match properties translated into the same compiled conditions.

use super::compile::{self, Context};
use super::eval::{Cond, Const, Field, Val};
use super::parser::{CmpOp, Key};
use inferwatch_core::component::{FieldError, PathSeg};
use regex::Regex;
use serde::Deserialize;

/// What a condition that fails at run time does (otelcol's `error_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorMode {
    /// The payload is refused with a permanent error (otelcol's default).
    #[default]
    Propagate,
    /// The error is logged (rate-limited) and the condition counts as false.
    Ignore,
    /// As `ignore`, without the log.
    Silent,
}

/// A list of OTTL conditions; `null` items are skipped.
pub type Conditions = Vec<Option<String>>;

/// `filter`'s settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// What a failing condition does.
    pub error_mode: ErrorMode,
    /// Span and span event conditions.
    pub traces: TracesConfig,
    /// Metric and data point conditions (or legacy include / exclude).
    pub metrics: MetricsConfig,
    /// Log record conditions (or legacy include / exclude).
    pub logs: LogsConfig,
    /// Legacy span include / exclude.
    pub spans: SpansLegacy,
}

/// `traces:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracesConfig {
    /// Drop the span when any is true.
    pub span: Conditions,
    /// Drop the span event when any is true.
    pub spanevent: Conditions,
}

/// `metrics:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Drop the metric (all its points) when any is true.
    pub metric: Conditions,
    /// Drop the data point when any is true.
    pub datapoint: Conditions,
    /// Legacy: keep only matching metrics.
    pub include: Option<MetricMatch>,
    /// Legacy: drop matching metrics.
    pub exclude: Option<MetricMatch>,
}

/// `logs:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogsConfig {
    /// Drop the log record when any is true.
    pub log_record: Conditions,
    /// Legacy: keep only matching records.
    pub include: Option<LogMatch>,
    /// Legacy: drop matching records.
    pub exclude: Option<LogMatch>,
}

/// `spans:` (legacy).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpansLegacy {
    /// Keep only matching spans.
    pub include: Option<SpanMatch>,
    /// Drop matching spans.
    pub exclude: Option<SpanMatch>,
}

/// Legacy `match_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatchType {
    /// Exact equality.
    Strict,
    /// RE2-style regular expression, unanchored.
    Regexp,
    /// antonmedv/expr expressions (refused: write OTTL instead).
    Expr,
}

/// Legacy regexp cache options (accepted; patterns are compiled once, so they change nothing).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegexpOptions {
    /// otelcol's `cacheenabled`.
    pub cacheenabled: bool,
    /// otelcol's `cachemaxnumentries`.
    pub cachemaxnumentries: u64,
}

/// A legacy `{key, value}` attribute matcher; without `value` only the key must exist.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttrMatch {
    /// Attribute key.
    #[serde(alias = "Key")]
    pub key: String,
    /// Value (strict) or pattern (regexp).
    #[serde(alias = "Value", default)]
    pub value: Option<serde_json::Value>,
}

/// A legacy `{name, version}` library (instrumentation scope) matcher.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibraryMatch {
    /// Scope name.
    #[serde(alias = "Name")]
    pub name: String,
    /// Scope version (any when absent).
    #[serde(alias = "Version", default)]
    pub version: Option<String>,
}

/// Legacy span match properties (all given properties must match).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpanMatch {
    /// `strict` or `regexp`.
    pub match_type: Option<MatchType>,
    /// Regexp cache options.
    #[serde(default)]
    pub regexp: Option<RegexpOptions>,
    /// Any of these `service.name` resource attributes.
    #[serde(default)]
    pub services: Vec<String>,
    /// Any of these span names.
    #[serde(default)]
    pub span_names: Vec<String>,
    /// Any of these kinds (`Server` or `SPAN_KIND_SERVER`).
    #[serde(default)]
    pub span_kinds: Vec<String>,
    /// All of these span attributes.
    #[serde(default)]
    pub attributes: Vec<AttrMatch>,
    /// All of these resource attributes.
    #[serde(default)]
    pub resources: Vec<AttrMatch>,
    /// Any of these instrumentation scopes.
    #[serde(default)]
    pub libraries: Vec<LibraryMatch>,
}

/// Legacy metric match properties.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricMatch {
    /// `strict`, `regexp` (or `expr`, refused).
    pub match_type: Option<MatchType>,
    /// Regexp cache options.
    #[serde(default)]
    pub regexp: Option<RegexpOptions>,
    /// Any of these metric names.
    #[serde(default)]
    pub metric_names: Vec<String>,
    /// expr expressions (refused).
    #[serde(default)]
    pub expressions: Vec<String>,
    /// All of these resource attributes.
    #[serde(default)]
    pub resource_attributes: Vec<AttrMatch>,
}

/// Legacy `severity_number` matcher.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeverityMatch {
    /// Lowest severity matched: a name (`INFO`, `warn2`) or a number.
    pub min: serde_json::Value,
    /// Whether records with no severity (0) match too.
    #[serde(default)]
    pub match_undefined: bool,
}

/// Legacy log match properties.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogMatch {
    /// `strict` or `regexp`.
    pub match_type: Option<MatchType>,
    /// Regexp cache options.
    #[serde(default)]
    pub regexp: Option<RegexpOptions>,
    /// All of these resource attributes.
    #[serde(default)]
    pub resource_attributes: Vec<AttrMatch>,
    /// All of these record attributes.
    #[serde(default)]
    pub record_attributes: Vec<AttrMatch>,
    /// Any of these severity texts.
    #[serde(default)]
    pub severity_texts: Vec<String>,
    /// Severity at or above `min`.
    #[serde(default)]
    pub severity_number: Option<SeverityMatch>,
    /// Any of these string bodies.
    #[serde(default)]
    pub bodies: Vec<String>,
}

/// One compiled drop rule with its source (for logs).
#[derive(Debug)]
pub struct Rule {
    /// The condition; the record is dropped when it is true.
    pub cond: Cond,
    /// Where it came from: the condition text, or the legacy block.
    pub source: String,
}

/// Every rule, per context.
#[derive(Debug, Default)]
pub struct Compiled {
    /// What a failing condition does.
    pub error_mode: ErrorMode,
    /// `traces.span` (or legacy `spans`).
    pub span: Vec<Rule>,
    /// `traces.spanevent`.
    pub spanevent: Vec<Rule>,
    /// `metrics.metric` (or legacy `metrics.include/exclude`).
    pub metric: Vec<Rule>,
    /// `metrics.datapoint`.
    pub datapoint: Vec<Rule>,
    /// `logs.log_record` (or legacy `logs.include/exclude`).
    pub log: Vec<Rule>,
}

impl Compiled {
    /// Whether any rule applies to traces.
    pub fn has_traces(&self) -> bool {
        !self.span.is_empty() || !self.spanevent.is_empty()
    }
    /// Whether any rule applies to metrics.
    pub fn has_metrics(&self) -> bool {
        !self.metric.is_empty() || !self.datapoint.is_empty()
    }
    /// Whether any rule applies to logs.
    pub fn has_logs(&self) -> bool {
        !self.log.is_empty()
    }
}

fn path_of(parts: &[PathSeg]) -> Vec<PathSeg> {
    parts.to_vec()
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

/// Collects every problem; the compiled rules when there is none.
struct Builder {
    errors: Vec<FieldError>,
}

impl Builder {
    fn err(&mut self, path: Vec<PathSeg>, message: impl Into<String>) {
        self.errors.push(FieldError { path, message: message.into() });
    }

    fn conditions(&mut self, list: &Conditions, ctx: Context, at: &[&str]) -> Vec<Rule> {
        let mut out = Vec::new();
        for (i, c) in list.iter().enumerate() {
            let Some(src) = c else { continue };
            let mut p: Vec<PathSeg> = at.iter().map(|s| key(s)).collect();
            p.push(PathSeg::Index(i));
            match compile::condition(src, ctx) {
                Ok(cond) => out.push(Rule { cond, source: src.clone() }),
                Err(e) => self.err(p, format!("column {} of `{src}`: {}", e.column, e.message)),
            }
        }
        out
    }

    fn regex(&mut self, pattern: &str, at: Vec<PathSeg>) -> Option<Regex> {
        match compile::regex(pattern) {
            Ok(r) => Some(r),
            Err(e) => {
                self.err(at, e);
                None
            }
        }
    }

    /// `field` equals / matches one of `values`.
    fn any_of(&mut self, mt: MatchType, field: Field, values: &[String], at: Vec<PathSeg>) -> Cond {
        let mut alts = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let mut p = at.clone();
            p.push(PathSeg::Index(i));
            alts.push(self.one(mt, Val::Path(field, vec![]), v, p));
        }
        Cond::Or(alts)
    }

    fn one(&mut self, mt: MatchType, target: Val, value: &str, at: Vec<PathSeg>) -> Cond {
        match mt {
            MatchType::Regexp => match self.regex(value, at) {
                Some(r) => Cond::IsMatch(target, Box::new(r)),
                None => Cond::Const(false),
            },
            _ => Cond::Cmp(target, CmpOp::Eq, Val::Const(Const::Str(value.to_string()))),
        }
    }

    /// Every attribute matcher holds.
    fn all_attrs(&mut self, mt: MatchType, field: Field, attrs: &[AttrMatch], at: Vec<PathSeg>) -> Cond {
        let mut all = Vec::new();
        for (i, a) in attrs.iter().enumerate() {
            let mut p = at.clone();
            p.push(PathSeg::Index(i));
            let target = Val::Path(field, vec![Key::Str(a.key.clone())]);
            let c = match (&a.value, mt) {
                (None | Some(serde_json::Value::Null), _) => Cond::Cmp(target, CmpOp::Ne, Val::Const(Const::Nil)),
                (Some(serde_json::Value::String(s)), MatchType::Regexp) => {
                    p.push(key("value"));
                    self.one(mt, target, s, p)
                }
                (Some(_), MatchType::Regexp) => {
                    p.push(key("value"));
                    self.err(p, "with match_type regexp an attribute value must be a string pattern");
                    Cond::Const(false)
                }
                (Some(v), _) => {
                    let c = match v {
                        serde_json::Value::String(s) => Const::Str(s.clone()),
                        serde_json::Value::Bool(b) => Const::Bool(*b),
                        serde_json::Value::Number(n) => match n.as_i64() {
                            Some(i) => Const::Int(i),
                            None => Const::Double(n.as_f64().unwrap_or(f64::NAN)),
                        },
                        _ => {
                            p.push(key("value"));
                            self.err(p, "an attribute value must be a string, number or bool");
                            Const::Nil
                        }
                    };
                    Cond::Cmp(target, CmpOp::Eq, Val::Const(c))
                }
            };
            all.push(c);
        }
        Cond::And(all)
    }

    fn match_type(&mut self, mt: Option<MatchType>, at: &[PathSeg], expr_ok: bool) -> MatchType {
        let mut p = path_of(at);
        p.push(key("match_type"));
        match mt {
            None => {
                self.err(p, "match_type is required: strict or regexp");
                MatchType::Strict
            }
            Some(MatchType::Expr) if expr_ok => {
                self.err(
                    p,
                    "match_type expr (antonmedv/expr expressions) is not supported; write OTTL conditions under \
                     metrics.metric instead, e.g. 'name == \"my.metric\" and HasAttrOnDatapoint(\"my_label\", \"abc123\")'",
                );
                MatchType::Strict
            }
            Some(MatchType::Expr) => {
                self.err(p, "match_type expr is only for metrics; use strict or regexp");
                MatchType::Strict
            }
            Some(m) => m,
        }
    }

    fn span_match(&mut self, m: &SpanMatch, at: Vec<PathSeg>) -> Cond {
        let mt = self.match_type(m.match_type, &at, false);
        let sub = |k: &str| {
            let mut p = at.clone();
            p.push(key(k));
            p
        };
        let mut all = Vec::new();
        if !m.services.is_empty() {
            let mut alts = Vec::new();
            for (i, s) in m.services.iter().enumerate() {
                let mut p = sub("services");
                p.push(PathSeg::Index(i));
                let target = Val::Path(Field::ResourceAttributes, vec![Key::Str("service.name".into())]);
                alts.push(self.one(mt, target, s, p));
            }
            all.push(Cond::Or(alts));
        }
        if !m.span_names.is_empty() {
            all.push(self.any_of(mt, Field::SpanName, &m.span_names, sub("span_names")));
        }
        if !m.span_kinds.is_empty() {
            let a = self.any_of(mt, Field::SpanKindString, &m.span_kinds, sub("span_kinds"));
            let b = self.any_of(mt, Field::SpanKindDeprecatedString, &m.span_kinds, sub("span_kinds"));
            all.push(Cond::Or(vec![a, b]));
        }
        if !m.attributes.is_empty() {
            all.push(self.all_attrs(mt, Field::SpanAttributes, &m.attributes, sub("attributes")));
        }
        if !m.resources.is_empty() {
            all.push(self.all_attrs(mt, Field::ResourceAttributes, &m.resources, sub("resources")));
        }
        if !m.libraries.is_empty() {
            let mut alts = Vec::new();
            for (i, l) in m.libraries.iter().enumerate() {
                let mut p = sub("libraries");
                p.push(PathSeg::Index(i));
                let mut both = vec![self.one(mt, Val::Path(Field::ScopeName, vec![]), &l.name, p.clone())];
                if let Some(v) = &l.version {
                    both.push(self.one(mt, Val::Path(Field::ScopeVersion, vec![]), v, p));
                }
                alts.push(Cond::And(both));
            }
            all.push(Cond::Or(alts));
        }
        if all.is_empty() {
            self.err(
                at,
                "at least one of services, span_names, span_kinds, attributes, resources or libraries must be given",
            );
        }
        Cond::And(all)
    }

    fn metric_match(&mut self, m: &MetricMatch, at: Vec<PathSeg>) -> Cond {
        let mt = self.match_type(m.match_type, &at, true);
        let sub = |k: &str| {
            let mut p = at.clone();
            p.push(key(k));
            p
        };
        if !m.expressions.is_empty() && m.match_type != Some(MatchType::Expr) {
            self.err(
                sub("expressions"),
                "expressions are only read with match_type expr, which is not supported; use OTTL under metrics.metric",
            );
        }
        let mut all = Vec::new();
        if !m.metric_names.is_empty() {
            all.push(self.any_of(mt, Field::MetricName, &m.metric_names, sub("metric_names")));
        }
        if !m.resource_attributes.is_empty() {
            all.push(self.all_attrs(mt, Field::ResourceAttributes, &m.resource_attributes, sub("resource_attributes")));
        }
        if all.is_empty() && m.match_type != Some(MatchType::Expr) {
            self.err(at, "at least one of metric_names or resource_attributes must be given");
        }
        Cond::And(all)
    }

    fn log_match(&mut self, m: &LogMatch, at: Vec<PathSeg>) -> Cond {
        let mt = self.match_type(m.match_type, &at, false);
        let sub = |k: &str| {
            let mut p = at.clone();
            p.push(key(k));
            p
        };
        let mut all = Vec::new();
        if !m.resource_attributes.is_empty() {
            all.push(self.all_attrs(mt, Field::ResourceAttributes, &m.resource_attributes, sub("resource_attributes")));
        }
        if !m.record_attributes.is_empty() {
            all.push(self.all_attrs(mt, Field::LogAttributes, &m.record_attributes, sub("record_attributes")));
        }
        if !m.severity_texts.is_empty() {
            all.push(self.any_of(mt, Field::LogSeverityText, &m.severity_texts, sub("severity_texts")));
        }
        if let Some(s) = &m.severity_number {
            let mut p = sub("severity_number");
            p.push(key("min"));
            let min = match &s.min {
                serde_json::Value::Number(n) => n.as_i64().filter(|v| (0..=24).contains(v)),
                serde_json::Value::String(name) => severity_from_name(name),
                _ => None,
            };
            let sev = || Val::Path(Field::LogSeverityNumber, vec![]);
            match min {
                Some(min) => {
                    let mut c = vec![Cond::Cmp(sev(), CmpOp::Ge, Val::Const(Const::Int(min)))];
                    if s.match_undefined {
                        c.push(Cond::Cmp(sev(), CmpOp::Eq, Val::Const(Const::Int(0))));
                    }
                    all.push(Cond::Or(c));
                }
                None => self.err(p, "must be a severity name (TRACE..FATAL4, e.g. INFO or warn2) or a number 0..24"),
            }
        }
        if !m.bodies.is_empty() {
            all.push(self.any_of(mt, Field::LogBody, &m.bodies, sub("bodies")));
        }
        if all.is_empty() {
            self.err(at, "at least one of resource_attributes, record_attributes, severity_texts, severity_number or bodies must be given");
        }
        Cond::And(all)
    }

    /// Drop when not included or excluded.
    fn legacy<M>(
        &mut self,
        include: Option<&M>,
        exclude: Option<&M>,
        at: &[&str],
        f: impl Fn(&mut Self, &M, Vec<PathSeg>) -> Cond,
    ) -> Option<Rule> {
        let base: Vec<PathSeg> = at.iter().map(|s| key(s)).collect();
        let mut drop = Vec::new();
        if let Some(m) = include {
            let mut p = base.clone();
            p.push(key("include"));
            drop.push(Cond::Not(Box::new(f(self, m, p))));
        }
        if let Some(m) = exclude {
            let mut p = base.clone();
            p.push(key("exclude"));
            drop.push(f(self, m, p));
        }
        (!drop.is_empty()).then(|| Rule { cond: Cond::Or(drop), source: format!("{} include/exclude", at.join(".")) })
    }
}

/// Severity number of a name such as `INFO`, `warn2` (case-insensitive).
fn severity_from_name(name: &str) -> Option<i64> {
    let n = name.trim().to_ascii_uppercase();
    let (base, step) = match n.char_indices().find(|(_, c)| c.is_ascii_digit()) {
        Some((i, _)) => (&n[..i], n[i..].parse::<i64>().ok().filter(|s| (2..=4).contains(s))? - 1),
        None => (n.as_str(), 0),
    };
    let first = match base {
        "TRACE" => 1,
        "DEBUG" => 5,
        "INFO" => 9,
        "WARN" => 13,
        "ERROR" => 17,
        "FATAL" => 21,
        _ => return None,
    };
    Some(first + step)
}

impl FilterConfig {
    /// Compiles every condition; every problem found, located by path, when any is wrong.
    pub fn compile(&self) -> Result<Compiled, Vec<FieldError>> {
        let mut b = Builder { errors: Vec::new() };
        let mut c = Compiled { error_mode: self.error_mode, ..Default::default() };
        c.span = b.conditions(&self.traces.span, Context::Span, &["traces", "span"]);
        c.spanevent = b.conditions(&self.traces.spanevent, Context::SpanEvent, &["traces", "spanevent"]);
        c.metric = b.conditions(&self.metrics.metric, Context::Metric, &["metrics", "metric"]);
        c.datapoint = b.conditions(&self.metrics.datapoint, Context::DataPoint, &["metrics", "datapoint"]);
        c.log = b.conditions(&self.logs.log_record, Context::Log, &["logs", "log_record"]);

        let mixed = "OTTL conditions and the legacy include/exclude form cannot be used together for one signal (as in otelcol)";
        let has = |l: &Conditions| l.iter().any(Option::is_some);
        let spans = &self.spans;
        if spans.include.is_some() || spans.exclude.is_some() {
            if has(&self.traces.span) || has(&self.traces.spanevent) {
                b.err(vec![key("spans")], mixed);
            }
            c.span.extend(b.legacy(spans.include.as_ref(), spans.exclude.as_ref(), &["spans"], Builder::span_match));
        }
        let m = &self.metrics;
        if m.include.is_some() || m.exclude.is_some() {
            if has(&m.metric) || has(&m.datapoint) {
                b.err(vec![key("metrics")], mixed);
            }
            c.metric.extend(b.legacy(m.include.as_ref(), m.exclude.as_ref(), &["metrics"], Builder::metric_match));
        }
        let l = &self.logs;
        if l.include.is_some() || l.exclude.is_some() {
            if has(&l.log_record) {
                b.err(vec![key("logs")], mixed);
            }
            c.log.extend(b.legacy(l.include.as_ref(), l.exclude.as_ref(), &["logs"], Builder::log_match));
        }
        if b.errors.is_empty() { Ok(c) } else { Err(b.errors) }
    }
}

/// The dotted form of a settings path (`traces.span[1]`).
pub fn dotted(path: &[PathSeg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            PathSeg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// One error standing for all: located at the first, its message listing the others with
/// their paths, so that `inferwatch validate` shows every bad condition in one run.
pub fn merge(mut errors: Vec<FieldError>) -> FieldError {
    if errors.len() == 1 {
        return errors.remove(0);
    }
    let first = errors.remove(0);
    let mut message = format!(
        "{} ({} more problem{} in this processor:",
        first.message,
        errors.len(),
        if errors.len() == 1 { "" } else { "s" }
    );
    for e in &errors {
        message.push_str(&format!("\n      {}: {}", dotted(&e.path), e.message));
    }
    message.push(')');
    FieldError { path: first.path, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_names() {
        assert_eq!(severity_from_name("INFO"), Some(9));
        assert_eq!(severity_from_name("warn2"), Some(14));
        assert_eq!(severity_from_name("FATAL4"), Some(24));
        assert_eq!(severity_from_name("INFO5"), None);
        assert_eq!(severity_from_name("LOUD"), None);
    }
}
