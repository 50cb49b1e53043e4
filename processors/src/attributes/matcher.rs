//! otelcol's `include` / `exclude` properties of the `attributes` processor: which spans,
//! metrics and log records the actions apply to.
//!
//! Within one property the items are alternatives (any matches); the properties set are all
//! required (and), as in otelcol's filter matcher. `attributes` and `resources` entries are all
//! required; an entry without `value` matches when the key is present.

use crate::attraction::{any_value_of, value_as_string};
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::pdata::Signal;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::trace::v1::Span;
use regex::Regex;
use serde::Deserialize;

/// An attribute to match: the key, and the value when set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttributeMatch {
    /// The attribute key.
    pub key: String,
    /// The value (strict: equal, typed; regexp: a pattern on the value as a string).
    #[serde(default)]
    pub value: Option<serde_json::Value>,
}

/// An instrumentation library (scope) to match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibraryMatch {
    /// Scope name.
    pub name: String,
    /// Scope version; any version when not set.
    #[serde(default)]
    pub version: Option<String>,
}

/// otelcol's `regexp` cache section (accepted; inferwatch compiles patterns once and needs no cache).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexpConfig {
    /// Accepted for compatibility; no effect.
    #[serde(default)]
    pub cacheenabled: bool,
    /// Accepted for compatibility; no effect.
    #[serde(default)]
    pub cachemaxnumentries: usize,
}

/// `log_severity_number`: the lowest severity that matches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeverityMatch {
    /// Lowest severity: a number (1-24) or a name (`INFO`, `WARN2`, ...).
    pub min: serde_json::Value,
    /// Whether records with no severity (0) match.
    #[serde(default)]
    pub match_undefined: bool,
}

/// `include` / `exclude` as written (otelcol's keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MatchConfig {
    /// `strict` or `regexp` (required).
    pub match_type: String,
    /// Regexp cache settings (accepted, no effect).
    pub regexp: Option<RegexpConfig>,
    /// Resource `service.name` values (spans).
    pub services: Vec<String>,
    /// Span names (spans).
    pub span_names: Vec<String>,
    /// Span kinds, `SPAN_KIND_SERVER` ... (spans; strict names).
    pub span_kinds: Vec<String>,
    /// Metric names (metrics).
    pub metric_names: Vec<String>,
    /// String log bodies (logs).
    pub log_bodies: Vec<String>,
    /// Log severity texts (logs).
    pub log_severity_texts: Vec<String>,
    /// Log severity number range (logs).
    pub log_severity_number: Option<SeverityMatch>,
    /// Item attributes, all required (spans, logs).
    pub attributes: Vec<AttributeMatch>,
    /// Resource attributes, all required.
    pub resources: Vec<AttributeMatch>,
    /// Instrumentation scopes, any (spans, logs).
    pub libraries: Vec<LibraryMatch>,
}

#[derive(Debug, Clone)]
enum Strings {
    Strict(Vec<String>),
    Regexp(Vec<Regex>),
}

impl Strings {
    fn any(&self, s: &str) -> bool {
        match self {
            Strings::Strict(v) => v.iter().any(|x| x == s),
            Strings::Regexp(v) => v.iter().any(|r| r.is_match(s)),
        }
    }
}

#[derive(Debug, Clone)]
enum ValueMatch {
    Any,
    Equal(AnyValue),
    Regexp(Regex),
}

const SPAN_KINDS: [&str; 6] = [
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
];

const SEVERITIES: [&str; 6] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"];

/// A checked `include` or `exclude`.
#[derive(Debug, Clone)]
pub struct Matcher {
    services: Option<Strings>,
    span_names: Option<Strings>,
    span_kinds: Vec<i32>,
    metric_names: Option<Strings>,
    log_bodies: Option<Strings>,
    severity_texts: Option<Strings>,
    severity: Option<(i32, bool)>,
    attributes: Vec<(String, ValueMatch)>,
    resources: Vec<(String, ValueMatch)>,
    libraries: Vec<(Strings, Option<Strings>)>,
    set: Vec<&'static str>,
}

fn err(base: &str, field: &str, index: Option<usize>, message: impl Into<String>) -> FieldError {
    let mut path = vec![PathSeg::Key(base.into()), PathSeg::Key(field.into())];
    path.extend(index.map(PathSeg::Index));
    FieldError { path, message: message.into() }
}

fn severity_of(v: &serde_json::Value) -> Option<i32> {
    if let Some(n) = v.as_i64() {
        return (1..=24).contains(&n).then_some(n as i32);
    }
    let s = v.as_str()?.to_ascii_uppercase();
    let (name, k) = match s.char_indices().find(|(_, c)| c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], s[i..].parse::<i32>().ok().filter(|k| (1..=4).contains(k))?),
        None => (s.as_str(), 1),
    };
    let base = SEVERITIES.iter().position(|x| *x == name)? as i32;
    Some(base * 4 + k)
}

impl Matcher {
    /// Checks one `include` / `exclude` (`base` is its key, for error paths).
    pub fn new(c: &MatchConfig, base: &str) -> Result<Matcher, FieldError> {
        let regexp = match c.match_type.as_str() {
            "strict" => false,
            "regexp" => true,
            "" => return Err(err(base, "match_type", None, "is required (strict or regexp)")),
            other => return Err(err(base, "match_type", None, format!("{other:?} is not one of strict, regexp"))),
        };
        if c.regexp.is_some() && !regexp {
            return Err(err(base, "regexp", None, "is only valid with match_type: regexp"));
        }
        let strings = |field: &str, v: &[String]| -> Result<Option<Strings>, FieldError> {
            if v.is_empty() {
                return Ok(None);
            }
            if !regexp {
                return Ok(Some(Strings::Strict(v.to_vec())));
            }
            v.iter()
                .enumerate()
                .map(|(i, p)| {
                    Regex::new(p).map_err(|e| err(base, field, Some(i), format!("invalid regular expression: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|r| Some(Strings::Regexp(r)))
        };
        let values = |field: &str, v: &[AttributeMatch]| -> Result<Vec<(String, ValueMatch)>, FieldError> {
            v.iter()
                .enumerate()
                .map(|(i, a)| {
                    if a.key.is_empty() {
                        return Err(err(base, field, Some(i), "key must not be empty"));
                    }
                    let m = match (&a.value, regexp) {
                        (None | Some(serde_json::Value::Null), _) => ValueMatch::Any,
                        (Some(serde_json::Value::String(p)), true) => ValueMatch::Regexp(
                            Regex::new(p)
                                .map_err(|e| err(base, field, Some(i), format!("invalid regular expression: {e}")))?,
                        ),
                        (Some(_), true) => {
                            return Err(err(base, field, Some(i), "value must be a string with match_type: regexp"));
                        }
                        (Some(v), false) => ValueMatch::Equal(any_value_of(v).unwrap_or_default()),
                    };
                    Ok((a.key.clone(), m))
                })
                .collect()
        };
        let mut span_kinds = Vec::new();
        for (i, k) in c.span_kinds.iter().enumerate() {
            match SPAN_KINDS.iter().position(|x| x == k) {
                Some(p) => span_kinds.push(p as i32),
                None => {
                    return Err(err(
                        base,
                        "span_kinds",
                        Some(i),
                        format!("{k:?} is not one of {}", SPAN_KINDS.join(", ")),
                    ));
                }
            }
        }
        let severity = match &c.log_severity_number {
            None => None,
            Some(s) => Some((
                severity_of(&s.min).ok_or_else(|| {
                    err(
                        base,
                        "log_severity_number",
                        None,
                        format!("min {} is not a severity (1-24, or INFO, WARN2, ...)", s.min),
                    )
                })?,
                s.match_undefined,
            )),
        };
        let mut libraries = Vec::new();
        for (i, l) in c.libraries.iter().enumerate() {
            let name = strings("libraries", std::slice::from_ref(&l.name))?
                .ok_or_else(|| err(base, "libraries", Some(i), "name is required"))?;
            let version =
                l.version.as_ref().map(|v| strings("libraries", std::slice::from_ref(v))).transpose()?.flatten();
            libraries.push((name, version));
        }
        let mut set = Vec::new();
        for (name, present) in [
            ("services", !c.services.is_empty()),
            ("span_names", !c.span_names.is_empty()),
            ("span_kinds", !c.span_kinds.is_empty()),
            ("metric_names", !c.metric_names.is_empty()),
            ("log_bodies", !c.log_bodies.is_empty()),
            ("log_severity_texts", !c.log_severity_texts.is_empty()),
            ("log_severity_number", c.log_severity_number.is_some()),
            ("attributes", !c.attributes.is_empty()),
            ("resources", !c.resources.is_empty()),
            ("libraries", !c.libraries.is_empty()),
        ] {
            if present {
                set.push(name);
            }
        }
        if set.is_empty() {
            return Err(err(
                base,
                "match_type",
                None,
                "set at least one property to match (services, span_names, span_kinds, metric_names, log_bodies, log_severity_texts, log_severity_number, attributes, resources, libraries)",
            ));
        }
        Ok(Matcher {
            services: strings("services", &c.services)?,
            span_names: strings("span_names", &c.span_names)?,
            span_kinds,
            metric_names: strings("metric_names", &c.metric_names)?,
            log_bodies: strings("log_bodies", &c.log_bodies)?,
            severity_texts: strings("log_severity_texts", &c.log_severity_texts)?,
            severity,
            attributes: values("attributes", &c.attributes)?,
            resources: values("resources", &c.resources)?,
            libraries,
            set,
        })
    }

    /// Refuses properties otelcol does not allow for `signal`, naming the first one.
    pub fn check_signal(&self, signal: Signal, base: &str) -> Result<(), FieldError> {
        let (invalid, needed): (&[&str], &[&str]) = match signal {
            Signal::Traces => (
                &["log_bodies", "log_severity_texts", "log_severity_number", "metric_names"],
                &["services", "span_names", "span_kinds", "attributes", "resources", "libraries"],
            ),
            Signal::Logs => (
                &["span_names", "span_kinds", "metric_names", "services"],
                &["log_bodies", "log_severity_texts", "log_severity_number", "attributes", "resources", "libraries"],
            ),
            Signal::Metrics => (
                &[
                    "span_names",
                    "span_kinds",
                    "log_bodies",
                    "log_severity_texts",
                    "log_severity_number",
                    "services",
                    "attributes",
                    "libraries",
                ],
                &["metric_names", "resources"],
            ),
        };
        if let Some(bad) = self.set.iter().find(|k| invalid.contains(k)) {
            return Err(err(base, bad, None, format!("is not valid in a {signal} pipeline")));
        }
        if !self.set.iter().any(|k| needed.contains(k)) {
            return Err(err(
                base,
                "match_type",
                None,
                format!("a {signal} pipeline needs one of {}", needed.join(", ")),
            ));
        }
        Ok(())
    }

    fn resource_ok(&self, resource: &[KeyValue]) -> bool {
        all_match(&self.resources, resource)
            && self
                .services
                .as_ref()
                .is_none_or(|s| s.any(&find(resource, "service.name").map(value_as_string_any).unwrap_or_default()))
    }

    fn scope_ok(&self, scope: Option<&InstrumentationScope>) -> bool {
        if self.libraries.is_empty() {
            return true;
        }
        let (name, version) = scope.map(|s| (s.name.as_str(), s.version.as_str())).unwrap_or(("", ""));
        self.libraries.iter().any(|(n, v)| n.any(name) && v.as_ref().is_none_or(|v| v.any(version)))
    }

    /// Whether a span under `resource` and `scope` matches.
    pub fn span(&self, resource: &[KeyValue], scope: Option<&InstrumentationScope>, span: &Span) -> bool {
        self.resource_ok(resource)
            && self.scope_ok(scope)
            && self.span_names.as_ref().is_none_or(|s| s.any(&span.name))
            && (self.span_kinds.is_empty() || self.span_kinds.contains(&span.kind))
            && all_match(&self.attributes, &span.attributes)
    }

    /// Whether a metric named `name` under `resource` matches.
    pub fn metric(&self, resource: &[KeyValue], name: &str) -> bool {
        self.resource_ok(resource) && self.metric_names.as_ref().is_none_or(|s| s.any(name))
    }

    /// Whether a log record under `resource` and `scope` matches.
    pub fn log(&self, resource: &[KeyValue], scope: Option<&InstrumentationScope>, r: &LogRecord) -> bool {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        self.resource_ok(resource)
            && self.scope_ok(scope)
            && self.log_bodies.as_ref().is_none_or(|s| match r.body.as_ref().and_then(|b| b.value.as_ref()) {
                Some(Value::StringValue(b)) => s.any(b),
                _ => false,
            })
            && self.severity_texts.as_ref().is_none_or(|s| s.any(&r.severity_text))
            && self.severity.is_none_or(
                |(min, undefined)| {
                    if r.severity_number == 0 { undefined } else { r.severity_number >= min }
                },
            )
            && all_match(&self.attributes, &r.attributes)
    }
}

fn find<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

fn value_as_string_any(v: &AnyValue) -> String {
    v.value.as_ref().map(value_as_string).unwrap_or_default()
}

fn all_match(wanted: &[(String, ValueMatch)], attrs: &[KeyValue]) -> bool {
    wanted.iter().all(|(k, m)| match (find(attrs, k), m) {
        (None, _) => false,
        (Some(_), ValueMatch::Any) => true,
        (Some(v), ValueMatch::Equal(want)) => v == want,
        (Some(v), ValueMatch::Regexp(r)) => r.is_match(&value_as_string_any(v)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_names_and_numbers() {
        assert_eq!(severity_of(&serde_json::json!("INFO")), Some(9));
        assert_eq!(severity_of(&serde_json::json!("warn2")), Some(14));
        assert_eq!(severity_of(&serde_json::json!("FATAL4")), Some(24));
        assert_eq!(severity_of(&serde_json::json!(17)), Some(17));
        assert_eq!(severity_of(&serde_json::json!("LOUD")), None);
        assert_eq!(severity_of(&serde_json::json!("INFO5")), None);
        assert_eq!(severity_of(&serde_json::json!(0)), None);
    }
}
