//! Type-checks a parsed condition for one OTTL context: paths, enums and functions resolved,
//! regexes compiled, so evaluation needs no lookups.

use super::eval::{Cond, Const, Field, TypeTest, Val, ValFn};
use super::parser::{self, Expr, Key, Literal, Node, ParseError};
use regex::Regex;

/// The OTTL context a condition is evaluated in (the filter's config keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// `traces.span`
    Span,
    /// `traces.spanevent`
    SpanEvent,
    /// `metrics.metric`
    Metric,
    /// `metrics.datapoint`
    DataPoint,
    /// `logs.log_record`
    Log,
}

impl Context {
    /// The context's name in messages and as a path prefix.
    pub fn name(self) -> &'static str {
        match self {
            Context::Span => "span",
            Context::SpanEvent => "spanevent",
            Context::Metric => "metric",
            Context::DataPoint => "datapoint",
            Context::Log => "log",
        }
    }
}

/// Parses and compiles one condition for `ctx`.
pub fn condition(src: &str, ctx: Context) -> Result<Cond, ParseError> {
    let node = parser::parse(src)?;
    cond(&node, ctx)
}

fn fail<T>(col: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError { column: col, message: message.into() })
}

fn cond(n: &Node, ctx: Context) -> Result<Cond, ParseError> {
    match &n.expr {
        Expr::Or(v) => Ok(Cond::Or(v.iter().map(|x| cond(x, ctx)).collect::<Result<_, _>>()?)),
        Expr::And(v) => Ok(Cond::And(v.iter().map(|x| cond(x, ctx)).collect::<Result<_, _>>()?)),
        Expr::Not(x) => Ok(Cond::Not(Box::new(cond(x, ctx)?))),
        Expr::Cmp(a, op, b) => Ok(Cond::Cmp(val(a, ctx)?, *op, val(b, ctx)?)),
        Expr::Lit(Literal::Bool(b)) => Ok(Cond::Const(*b)),
        Expr::Call { name, args, keys } => match bool_fn(n.col, name, args, ctx)? {
            Some(c) if keys.is_empty() => Ok(c),
            Some(_) => fail(n.col, format!("{name} returns a bool, which cannot be indexed")),
            None => {
                fail(n.col, format!("{name} returns a value, not a condition; compare it, e.g. `{name}(...) == ...`"))
            }
        },
        Expr::Path { segs, .. } => fail(
            n.col,
            format!(
                "`{}` is a value, not a condition; compare it, e.g. `{} == true` or `{} != nil`",
                segs.join("."),
                segs.join("."),
                segs.join(".")
            ),
        ),
        Expr::Math(..) => fail(n.col, "an arithmetic expression is not a condition; compare it with a value"),
        Expr::Lit(_) | Expr::Enum(_) | Expr::List(_) => {
            fail(n.col, "a literal other than true / false is not a condition")
        }
    }
}

fn val(n: &Node, ctx: Context) -> Result<Val, ParseError> {
    match &n.expr {
        Expr::Lit(l) => Ok(Val::Const(match l {
            Literal::Str(s) => Const::Str(s.clone()),
            Literal::Int(i) => Const::Int(*i),
            Literal::Float(f) => Const::Double(*f),
            Literal::Bool(b) => Const::Bool(*b),
            Literal::Nil => Const::Nil,
            Literal::Bytes(b) => Const::Bytes(b.clone()),
        })),
        Expr::Enum(e) => match enum_value(e, ctx) {
            Some(v) => Ok(Val::Const(Const::Int(v))),
            None => fail(
                n.col,
                format!("unknown enum `{e}` in the {} context (known: {})", ctx.name(), enum_names(ctx).join(", ")),
            ),
        },
        Expr::Path { segs, keys } => path(n.col, segs, keys, ctx),
        Expr::Math(a, op, b) => Ok(Val::Math(Box::new(val(a, ctx)?), *op, Box::new(val(b, ctx)?))),
        Expr::Call { name, args, keys } => {
            if let Some(c) = bool_fn(n.col, name, args, ctx)? {
                if !keys.is_empty() {
                    return fail(n.col, format!("{name} returns a bool, which cannot be indexed"));
                }
                return Ok(Val::Cond(Box::new(c)));
            }
            let f = match name.as_str() {
                "Len" => ValFn::Len,
                "Int" => ValFn::Int,
                "Double" => ValFn::Double,
                "String" => ValFn::String,
                _ => unreachable_fn(n.col, name)?,
            };
            let [arg] = args.as_slice() else {
                return fail(n.col, format!("{name} takes 1 argument, got {}", args.len()));
            };
            Ok(Val::Call(f, Box::new(val(arg, ctx)?), keys.clone()))
        }
        Expr::Or(_) | Expr::And(_) | Expr::Not(_) | Expr::Cmp(..) => Ok(Val::Cond(Box::new(cond(n, ctx)?))),
        Expr::List(_) => {
            fail(n.col, "lists are only accepted as function arguments, and no supported function takes one")
        }
    }
}

/// Compiles a pattern once (RE2 syntax, as Go's `regexp`); a one-line message when invalid.
pub fn regex(pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern).map_err(|e| {
        let why = e.to_string();
        let last = why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim();
        format!("invalid regular expression {pattern:?}: {}", last.trim_start_matches("error: "))
    })
}

/// The converters this filter knows, for messages.
const FUNCTIONS: &str = "IsMatch, IsString, IsInt, IsDouble, IsBool, IsMap, IsList, Len, Int, Double, String, \
                         HasAttrKeyOnDatapoint, HasAttrOnDatapoint (metric context)";

fn unreachable_fn<T>(col: usize, name: &str) -> Result<T, ParseError> {
    fail(col, format!("unknown or unsupported function `{name}` (supported: {FUNCTIONS})"))
}

fn string_arg<'a>(n: &'a Node, what: &str, fname: &str) -> Result<&'a str, ParseError> {
    match &n.expr {
        Expr::Lit(Literal::Str(s)) => Ok(s),
        _ => fail(n.col, format!("the {what} of {fname} must be a string literal")),
    }
}

/// A bool converter, `None` when `name` is a value converter; errors for unknown names.
fn bool_fn(col: usize, name: &str, args: &[Node], ctx: Context) -> Result<Option<Cond>, ParseError> {
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            fail(col, format!("{name} takes {n} argument{}, got {}", if n == 1 { "" } else { "s" }, args.len()))
        }
    };
    let test = match name {
        "IsMatch" => {
            arity(2)?;
            let target = val(&args[0], ctx)?;
            let pattern = string_arg(&args[1], "pattern", name)?;
            let re = regex(pattern).map_err(|message| ParseError { column: args[1].col, message })?;
            return Ok(Some(Cond::IsMatch(target, Box::new(re))));
        }
        "HasAttrKeyOnDatapoint" | "HasAttrOnDatapoint" => {
            if ctx != Context::Metric {
                return fail(
                    col,
                    format!("{name} is only available in the metric context (metrics.metric), not in {}", ctx.name()),
                );
            }
            if name == "HasAttrKeyOnDatapoint" {
                arity(1)?;
                return Ok(Some(Cond::HasAttrKey(string_arg(&args[0], "key", name)?.to_string())));
            }
            arity(2)?;
            let k = string_arg(&args[0], "key", name)?.to_string();
            let v = string_arg(&args[1], "value", name)?.to_string();
            return Ok(Some(Cond::HasAttr(k, v)));
        }
        "IsString" => TypeTest::String,
        "IsInt" => TypeTest::Int,
        "IsDouble" => TypeTest::Double,
        "IsBool" => TypeTest::Bool,
        "IsMap" => TypeTest::Map,
        "IsList" => TypeTest::List,
        "Len" | "Int" | "Double" | "String" => return Ok(None),
        _ => return unreachable_fn(col, name),
    };
    arity(1)?;
    Ok(Some(Cond::IsType(test, val(&args[0], ctx)?)))
}

/// Fields readable without a prefix in a context, and under its own prefix.
fn own_field(ctx: Context, segs: &[&str]) -> Option<Field> {
    use Field::*;
    let f = match (ctx, segs) {
        (Context::Span, _) => match segs {
            ["name"] => SpanName,
            ["kind"] => SpanKind,
            ["kind", "string"] => SpanKindString,
            ["kind", "deprecated_string"] => SpanKindDeprecatedString,
            ["status", "code"] => StatusCode,
            ["status", "message"] => StatusMessage,
            ["attributes"] => SpanAttributes,
            ["trace_id"] => TraceId,
            ["trace_id", "string"] => TraceIdString,
            ["span_id"] => SpanId,
            ["span_id", "string"] => SpanIdString,
            ["parent_span_id"] => ParentSpanId,
            ["parent_span_id", "string"] => ParentSpanIdString,
            ["trace_state"] => TraceState,
            ["start_time_unix_nano"] => SpanStartTime,
            ["end_time_unix_nano"] => SpanEndTime,
            ["dropped_attributes_count"] => SpanDroppedAttributesCount,
            ["dropped_events_count"] => SpanDroppedEventsCount,
            ["dropped_links_count"] => SpanDroppedLinksCount,
            _ => return None,
        },
        (Context::SpanEvent, _) => match segs {
            ["name"] => EventName,
            ["attributes"] => EventAttributes,
            ["time_unix_nano"] => EventTime,
            ["dropped_attributes_count"] => EventDroppedAttributesCount,
            _ => return None,
        },
        (Context::Metric, _) => match segs {
            ["name"] => MetricName,
            ["description"] => MetricDescription,
            ["unit"] => MetricUnit,
            ["type"] => MetricType,
            ["aggregation_temporality"] => MetricAggregationTemporality,
            ["is_monotonic"] => MetricIsMonotonic,
            _ => return None,
        },
        (Context::DataPoint, _) => match segs {
            ["attributes"] => PointAttributes,
            ["start_time_unix_nano"] => PointStartTime,
            ["time_unix_nano"] => PointTime,
            ["value_double"] => PointValueDouble,
            ["value_int"] => PointValueInt,
            ["flags"] => PointFlags,
            ["count"] => PointCount,
            ["sum"] => PointSum,
            _ => return None,
        },
        (Context::Log, _) => match segs {
            ["body"] => LogBody,
            ["severity_number"] => LogSeverityNumber,
            ["severity_text"] => LogSeverityText,
            ["attributes"] => LogAttributes,
            ["time_unix_nano"] => LogTime,
            ["observed_time_unix_nano"] => LogObservedTime,
            ["trace_id"] => LogTraceId,
            ["trace_id", "string"] => LogTraceIdString,
            ["span_id"] => LogSpanId,
            ["span_id", "string"] => LogSpanIdString,
            ["flags"] => LogFlags,
            ["event_name"] => LogEventName,
            ["dropped_attributes_count"] => LogDroppedAttributesCount,
            _ => return None,
        },
    };
    Some(f)
}

fn resolve(ctx: Context, segs: &[&str]) -> Option<Field> {
    use Field::*;
    match segs {
        ["resource", "attributes"] => return Some(ResourceAttributes),
        ["resource", "dropped_attributes_count"] => return Some(ResourceDroppedAttributesCount),
        ["instrumentation_scope" | "scope", rest @ ..] => {
            return match rest {
                ["name"] => Some(ScopeName),
                ["version"] => Some(ScopeVersion),
                ["attributes"] => Some(ScopeAttributes),
                ["dropped_attributes_count"] => Some(ScopeDroppedAttributesCount),
                _ => None,
            };
        }
        _ => {}
    }
    // The context's own prefix (`span.name`, `datapoint.attributes`) or none (`name`).
    if let [first, rest @ ..] = segs {
        if *first == ctx.name() && !rest.is_empty() {
            return own_field(ctx, rest);
        }
        // Enclosing contexts: the span of a span event, the metric of a data point.
        match (ctx, *first) {
            (Context::SpanEvent, "span") => return own_field(Context::Span, rest),
            (Context::DataPoint, "metric") => return own_field(Context::Metric, rest),
            _ => {}
        }
    }
    own_field(ctx, segs)
}

fn is_map(f: Field) -> bool {
    use Field::*;
    matches!(
        f,
        ResourceAttributes
            | ScopeAttributes
            | SpanAttributes
            | EventAttributes
            | PointAttributes
            | LogAttributes
            | LogBody
    )
}

fn path(col: usize, segs: &[String], keys: &[Key], ctx: Context) -> Result<Val, ParseError> {
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let Some(f) = resolve(ctx, &s) else {
        return fail(
            col,
            format!("unknown path `{}` in the {} context (known: {})", segs.join("."), ctx.name(), known_paths(ctx)),
        );
    };
    if !keys.is_empty() && !is_map(f) {
        return fail(col, format!("`{}` cannot be indexed", segs.join(".")));
    }
    if let Some(Key::Int(_)) = keys.first().filter(|_| f != Field::LogBody) {
        return fail(col, format!("`{}` is a map: index it with a string key", segs.join(".")));
    }
    Ok(Val::Path(f, keys.to_vec()))
}

fn known_paths(ctx: Context) -> &'static str {
    match ctx {
        Context::Span => {
            "name, kind, kind.string, status.code, status.message, attributes[\"k\"], trace_id.string, span_id.string, parent_span_id.string, trace_state, start_time_unix_nano, end_time_unix_nano, dropped_*_count, resource.attributes[\"k\"], instrumentation_scope.name / version / attributes"
        }
        Context::SpanEvent => {
            "name, attributes[\"k\"], time_unix_nano, dropped_attributes_count, span.<span path>, resource.attributes[\"k\"], instrumentation_scope.name / version / attributes"
        }
        Context::Metric => {
            "name, description, unit, type, aggregation_temporality, is_monotonic, resource.attributes[\"k\"], instrumentation_scope.name / version / attributes"
        }
        Context::DataPoint => {
            "attributes[\"k\"], value_double, value_int, start_time_unix_nano, time_unix_nano, flags, count, sum, metric.name / description / unit / type / aggregation_temporality / is_monotonic, resource.attributes[\"k\"], instrumentation_scope.name / version / attributes"
        }
        Context::Log => {
            "body, severity_number, severity_text, attributes[\"k\"], time_unix_nano, observed_time_unix_nano, trace_id.string, span_id.string, flags, event_name, dropped_attributes_count, resource.attributes[\"k\"], instrumentation_scope.name / version / attributes"
        }
    }
}

const SPAN_ENUMS: &[(&str, i64)] = &[
    ("SPAN_KIND_UNSPECIFIED", 0),
    ("SPAN_KIND_INTERNAL", 1),
    ("SPAN_KIND_SERVER", 2),
    ("SPAN_KIND_CLIENT", 3),
    ("SPAN_KIND_PRODUCER", 4),
    ("SPAN_KIND_CONSUMER", 5),
    ("STATUS_CODE_UNSET", 0),
    ("STATUS_CODE_OK", 1),
    ("STATUS_CODE_ERROR", 2),
];

const METRIC_ENUMS: &[(&str, i64)] = &[
    ("METRIC_DATA_TYPE_NONE", 0),
    ("METRIC_DATA_TYPE_GAUGE", 1),
    ("METRIC_DATA_TYPE_SUM", 2),
    ("METRIC_DATA_TYPE_HISTOGRAM", 3),
    ("METRIC_DATA_TYPE_EXPONENTIAL_HISTOGRAM", 4),
    ("METRIC_DATA_TYPE_SUMMARY", 5),
    ("AGGREGATION_TEMPORALITY_UNSPECIFIED", 0),
    ("AGGREGATION_TEMPORALITY_DELTA", 1),
    ("AGGREGATION_TEMPORALITY_CUMULATIVE", 2),
    ("FLAG_NONE", 0),
    ("FLAG_NO_RECORDED_VALUE", 1),
];

const LOG_ENUMS: &[(&str, i64)] = &[
    ("SEVERITY_NUMBER_UNSPECIFIED", 0),
    ("SEVERITY_NUMBER_TRACE", 1),
    ("SEVERITY_NUMBER_TRACE2", 2),
    ("SEVERITY_NUMBER_TRACE3", 3),
    ("SEVERITY_NUMBER_TRACE4", 4),
    ("SEVERITY_NUMBER_DEBUG", 5),
    ("SEVERITY_NUMBER_DEBUG2", 6),
    ("SEVERITY_NUMBER_DEBUG3", 7),
    ("SEVERITY_NUMBER_DEBUG4", 8),
    ("SEVERITY_NUMBER_INFO", 9),
    ("SEVERITY_NUMBER_INFO2", 10),
    ("SEVERITY_NUMBER_INFO3", 11),
    ("SEVERITY_NUMBER_INFO4", 12),
    ("SEVERITY_NUMBER_WARN", 13),
    ("SEVERITY_NUMBER_WARN2", 14),
    ("SEVERITY_NUMBER_WARN3", 15),
    ("SEVERITY_NUMBER_WARN4", 16),
    ("SEVERITY_NUMBER_ERROR", 17),
    ("SEVERITY_NUMBER_ERROR2", 18),
    ("SEVERITY_NUMBER_ERROR3", 19),
    ("SEVERITY_NUMBER_ERROR4", 20),
    ("SEVERITY_NUMBER_FATAL", 21),
    ("SEVERITY_NUMBER_FATAL2", 22),
    ("SEVERITY_NUMBER_FATAL3", 23),
    ("SEVERITY_NUMBER_FATAL4", 24),
];

fn enums(ctx: Context) -> &'static [(&'static str, i64)] {
    match ctx {
        Context::Span | Context::SpanEvent => SPAN_ENUMS,
        Context::Metric | Context::DataPoint => METRIC_ENUMS,
        Context::Log => LOG_ENUMS,
    }
}

fn enum_value(name: &str, ctx: Context) -> Option<i64> {
    enums(ctx).iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

fn enum_names(ctx: Context) -> Vec<&'static str> {
    let all = enums(ctx).iter().map(|(n, _)| *n);
    if ctx == Context::Log { all.step_by(4).collect() } else { all.collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_per_context() {
        assert!(condition(r#"name == "x""#, Context::Span).is_ok());
        assert!(condition(r#"span.name == "x""#, Context::Span).is_ok());
        assert!(condition(r#"span.name == "x" and name == "e""#, Context::SpanEvent).is_ok());
        assert!(condition(r#"metric.name == "x" and value_double > 1"#, Context::DataPoint).is_ok());
        assert!(condition(r#"datapoint.value_int > 1"#, Context::DataPoint).is_ok());
        assert!(condition(r#"severity_number >= SEVERITY_NUMBER_WARN"#, Context::Log).is_ok());
        assert!(condition(r#"instrumentation_scope.name == "a" or scope.version == "1""#, Context::Metric).is_ok());
        let e = condition(r#"value_double > 1"#, Context::Metric).unwrap_err();
        assert!(e.message.contains("unknown path `value_double` in the metric context"), "{e}");
        assert_eq!(e.column, 1);
        let e = condition(r#"kind == METRIC_DATA_TYPE_SUM"#, Context::Span).unwrap_err();
        assert_eq!(e.column, 9, "{e}");
        assert!(e.message.contains("SPAN_KIND_SERVER"), "{e}");
    }

    #[test]
    fn functions_are_checked_at_config_time() {
        let e = condition(r#"IsMatch(name, "(unclosed")"#, Context::Span).unwrap_err();
        assert_eq!(e.column, 15, "{e}");
        assert!(e.message.contains("invalid regular expression"), "{e}");
        let e = condition(r#"IsMatch(name, attributes["p"])"#, Context::Span).unwrap_err();
        assert!(e.message.contains("string literal"), "{e}");
        let e = condition(r#"HasAttrOnDatapoint("k", "v")"#, Context::DataPoint).unwrap_err();
        assert!(e.message.contains("only available in the metric context"), "{e}");
        let e = condition(r#"Foo(name)"#, Context::Span).unwrap_err();
        assert!(e.message.contains("unknown or unsupported function `Foo`"), "{e}");
        let e = condition(r#"Len(name)"#, Context::Span).unwrap_err();
        assert!(e.message.contains("returns a value, not a condition"), "{e}");
        let e = condition(r#"attributes["x"]"#, Context::Span).unwrap_err();
        assert!(e.message.contains("is a value, not a condition"), "{e}");
        let e = condition(r#"name["x"] == 1"#, Context::Span).unwrap_err();
        assert!(e.message.contains("cannot be indexed"), "{e}");
        assert!(condition(r#"IsMatch(name, "a") == true and Len(name) > 3"#, Context::Span).is_ok());
    }
}
