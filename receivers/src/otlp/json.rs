//! OTLP/JSON decoding.
//!
//! opentelemetry-proto's `with-serde` types read camelCase keys, hex ids and 64-bit integers
//! given as strings or numbers, and ignore unknown keys. What they do not accept is normalised
//! on a `serde_json::Value` first:
//! - enum values given by name (`"SPAN_KIND_SERVER"`, `"STATUS_CODE_ERROR"`,
//!   `"AGGREGATION_TEMPORALITY_CUMULATIVE"`, `"SEVERITY_NUMBER_INFO"`) or as numeric strings;
//! - 32-bit integers given as strings (`"droppedAttributesCount": "2"`);
//! - `null` for a field (the default value in proto3 JSON);
//! - the original snake_case field names (`trace_id`), which protobuf JSON parsers accept;
//! - missing fields of messages that lack `serde(default)` (`KeyValue.key`,
//!   `ArrayValue.values`, `KeyValueList.values`, `EntityRef.*`).
//!
//! The `oneof` fields of metrics (`Metric.data`, data point and exemplar `value`) are
//! flattened options: serde turns an error inside them into `None`, silently dropping data.
//! [`check_metrics`] compares the decoded request with the JSON and reports such errors.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::logs::v1::SeverityNumber;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Exemplar, ExponentialHistogram, Gauge, Histogram, NumberDataPoint, Sum, Summary,
};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Why an OTLP/JSON body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct JsonError(pub String);

/// Decodes an OTLP/JSON export request; `check` reports data the typed decoding dropped.
pub(crate) fn decode<T: DeserializeOwned>(
    body: &[u8],
    check: fn(&Value, &T) -> Result<(), String>,
) -> Result<T, JsonError> {
    let mut v: Value = serde_json::from_slice(body).map_err(|e| JsonError(format!("invalid JSON: {e}")))?;
    if !v.is_object() {
        return Err(JsonError("invalid OTLP/JSON: the body must be a JSON object".into()));
    }
    let mut path = String::new();
    normalize(&mut v, &mut path, Ctx::Message).map_err(|e| JsonError(format!("invalid OTLP/JSON: {e}")))?;
    let req: T = from_value(&v).map_err(|e| JsonError(format!("invalid OTLP/JSON: {e}")))?;
    check(&v, &req).map_err(|e| JsonError(format!("invalid OTLP/JSON: {e}")))?;
    Ok(req)
}

/// Deserializes `v` as `T`, naming the path of the first error.
fn from_value<T: DeserializeOwned>(v: &Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        if path == "." { e.into_inner().to_string() } else { format!("{path}: {}", e.into_inner()) }
    })
}

/// What the object or array being walked holds, for filling in required fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// Any message.
    Message,
    /// An array of `KeyValue` (attributes).
    KeyValues,
    /// One `KeyValue`.
    KeyValue,
    /// An `ArrayValue`.
    ArrayValue,
    /// A `KeyValueList`.
    KvList,
    /// An array of `EntityRef`.
    EntityRefs,
    /// One `EntityRef`.
    EntityRef,
}

/// Keys holding an enum, with their name lookup.
fn enum_lookup(key: &str) -> Option<fn(&str) -> Option<i32>> {
    Some(match key {
        "kind" => |s| SpanKind::from_str_name(s).map(|e| e as i32),
        "code" => |s| StatusCode::from_str_name(s).map(|e| e as i32),
        "aggregationTemporality" => |s| AggregationTemporality::from_str_name(s).map(|e| e as i32),
        "severityNumber" => |s| SeverityNumber::from_str_name(s).map(|e| e as i32),
        _ => return None,
    })
}

/// Keys holding a 32-bit integer, which proto3 JSON also allows as a string.
const INT32_KEYS: &[&str] = &[
    "droppedAttributesCount",
    "droppedEventsCount",
    "droppedLinksCount",
    "flags",
    "scale",
    "offset",
    "keyStrindex",
    "stringValueStrindex",
];

/// `trace_id` -> `traceId`; `None` when `k` is not snake_case.
fn camel_case(k: &str) -> Option<String> {
    if !k.contains('_') || !k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return None;
    }
    let mut out = String::with_capacity(k.len());
    let mut upper = false;
    for c in k.chars() {
        if c == '_' {
            upper = !out.is_empty();
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Rewrites `v` in place into the shape the serde types accept; errors name the JSON path.
fn normalize(v: &mut Value, path: &mut String, ctx: Ctx) -> Result<(), String> {
    match v {
        Value::Array(items) => {
            let item_ctx = match ctx {
                Ctx::KeyValues => Ctx::KeyValue,
                Ctx::EntityRefs => Ctx::EntityRef,
                _ => Ctx::Message,
            };
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                normalize(item, path, item_ctx)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => normalize_object(map, path, ctx),
        _ => Ok(()),
    }
}

/// Normalises one JSON object (see [`normalize`]).
fn normalize_object(map: &mut Map<String, Value>, path: &mut String, ctx: Ctx) -> Result<(), String> {
    map.retain(|_, v| !v.is_null());
    let snake: Vec<String> = map.keys().filter(|k| camel_case(k).is_some()).cloned().collect();
    for k in snake {
        if let (Some(camel), Some(val)) = (camel_case(&k), map.remove(&k)) {
            map.entry(camel).or_insert(val);
        }
    }
    match ctx {
        Ctx::KeyValue => {
            map.entry("key").or_insert_with(|| Value::String(String::new()));
        }
        Ctx::ArrayValue | Ctx::KvList => {
            map.entry("values").or_insert_with(|| Value::Array(Vec::new()));
        }
        Ctx::EntityRef => {
            map.entry("schemaUrl").or_insert_with(|| Value::String(String::new()));
            map.entry("type").or_insert_with(|| Value::String(String::new()));
            map.entry("idKeys").or_insert_with(|| Value::Array(Vec::new()));
            map.entry("descriptionKeys").or_insert_with(|| Value::Array(Vec::new()));
        }
        _ => {}
    }
    for (key, val) in map.iter_mut() {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        if let Some(lookup) = enum_lookup(key) {
            if let Value::String(s) = val {
                let n = match s.parse::<i32>() {
                    Ok(n) => n,
                    Err(_) => lookup(s).ok_or_else(|| format!("{path}: unknown enum value {s:?}"))?,
                };
                *val = Value::from(n);
            }
        } else if INT32_KEYS.contains(&key.as_str())
            && let Value::String(s) = val
        {
            let n: i64 = s.trim().parse().map_err(|_| format!("{path}: expected an integer, got {s:?}"))?;
            *val = Value::from(n);
        }
        let child = match (ctx, key.as_str()) {
            (_, "attributes" | "filteredAttributes" | "metadata") => Ctx::KeyValues,
            (_, "arrayValue") => Ctx::ArrayValue,
            (_, "kvlistValue") => Ctx::KvList,
            (Ctx::KvList, "values") => Ctx::KeyValues,
            (_, "entityRefs") => Ctx::EntityRefs,
            _ => Ctx::Message,
        };
        normalize(val, path, child)?;
        path.truncate(len);
    }
    Ok(())
}

/// The JSON keys of `Metric.data` variants.
const DATA_KEYS: [&str; 5] = ["gauge", "sum", "histogram", "exponentialHistogram", "summary"];

/// The array under `key` in `v`, or an empty slice.
fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// Reports `oneof` values of a metrics request that were present in the JSON but lost in decoding.
pub(crate) fn check_metrics(v: &Value, req: &ExportMetricsServiceRequest) -> Result<(), String> {
    for (i, (rmj, rm)) in arr(v, "resourceMetrics").iter().zip(&req.resource_metrics).enumerate() {
        for (j, (smj, sm)) in arr(rmj, "scopeMetrics").iter().zip(&rm.scope_metrics).enumerate() {
            for (k, (mj, m)) in arr(smj, "metrics").iter().zip(&sm.metrics).enumerate() {
                let at = format!("resourceMetrics[{i}].scopeMetrics[{j}].metrics[{k}]");
                check_metric(mj, m.data.as_ref()).map_err(|e| format!("{at}.{e}"))?;
            }
        }
    }
    Ok(())
}

/// Checks one metric's data and its points.
fn check_metric(mj: &Value, data: Option<&Data>) -> Result<(), String> {
    let Some(key) = DATA_KEYS.iter().find(|k| mj.get(**k).is_some()) else { return Ok(()) };
    let dj = mj.get(*key).unwrap_or(&Value::Null);
    let Some(data) = data else {
        // Decode the variant alone to recover the error serde swallowed.
        let err = match *key {
            "gauge" => from_value::<Gauge>(dj).err(),
            "sum" => from_value::<Sum>(dj).err(),
            "histogram" => from_value::<Histogram>(dj).err(),
            "exponentialHistogram" => from_value::<ExponentialHistogram>(dj).err(),
            _ => from_value::<Summary>(dj).err(),
        };
        return Err(format!("{key}: {}", err.unwrap_or_else(|| "invalid value".into())));
    };
    let points = arr(dj, "dataPoints");
    match data {
        Data::Gauge(Gauge { data_points }) | Data::Sum(Sum { data_points, .. }) => {
            for (p, (pj, dp)) in points.iter().zip(data_points).enumerate() {
                let lost = (pj.get("asInt").is_some() || pj.get("asDouble").is_some()) && dp.value.is_none();
                if lost {
                    let err = from_value::<NumberDataPoint>(pj).err();
                    let why = err.unwrap_or_else(|| "invalid asInt / asDouble value".into());
                    return Err(format!("{key}.dataPoints[{p}]: {why}"));
                }
                check_exemplars(pj, &dp.exemplars).map_err(|e| format!("{key}.dataPoints[{p}].{e}"))?;
            }
        }
        Data::Histogram(h) => {
            for (p, (pj, dp)) in points.iter().zip(&h.data_points).enumerate() {
                check_exemplars(pj, &dp.exemplars).map_err(|e| format!("{key}.dataPoints[{p}].{e}"))?;
            }
        }
        Data::ExponentialHistogram(h) => {
            for (p, (pj, dp)) in points.iter().zip(&h.data_points).enumerate() {
                check_exemplars(pj, &dp.exemplars).map_err(|e| format!("{key}.dataPoints[{p}].{e}"))?;
            }
        }
        Data::Summary(_) => {}
    }
    Ok(())
}

/// Checks the exemplars of one data point.
fn check_exemplars(pj: &Value, exemplars: &[Exemplar]) -> Result<(), String> {
    for (e, (ej, ex)) in arr(pj, "exemplars").iter().zip(exemplars).enumerate() {
        if (ej.get("asInt").is_some() || ej.get("asDouble").is_some()) && ex.value.is_none() {
            let why = from_value::<Exemplar>(ej).err().unwrap_or_else(|| "invalid asInt / asDouble value".into());
            return Err(format!("exemplars[{e}]: {why}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;

    fn no_check<T>(_: &Value, _: &T) -> Result<(), String> {
        Ok(())
    }

    fn traces(s: &str) -> Result<ExportTraceServiceRequest, JsonError> {
        decode(s.as_bytes(), no_check)
    }

    fn metrics(s: &str) -> Result<ExportMetricsServiceRequest, JsonError> {
        decode(s.as_bytes(), check_metrics)
    }

    #[test]
    fn spec_example_with_enum_names_and_string_ints() {
        let r = traces(
            r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
            "scopeSpans":[{"scope":{"name":"lib","version":"1"},"spans":[{
              "traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"EEE19B7EC3C1B173",
              "name":"op","kind":"SPAN_KIND_SERVER","startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
              "droppedAttributesCount":"2","status":{"code":"STATUS_CODE_ERROR","message":"boom"},
              "attributes":[{"key":"n","value":{"intValue":"42"}},{"key":"arr","value":{"arrayValue":{}}},
                            {"key":"kv","value":{"kvlistValue":{"values":[{"value":{"boolValue":true}}]}}}],
              "someFutureField":{"x":1},"traceState":null}]}]}]}"#,
        )
        .unwrap();
        let s = &r.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(s.trace_id, hex("5b8efff798038103d269b633813fc60c"));
        assert_eq!(s.span_id, hex("eee19b7ec3c1b174"));
        assert_eq!(s.kind, SpanKind::Server as i32);
        assert_eq!(s.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(s.end_time_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(s.dropped_attributes_count, 2);
        let st = s.status.as_ref().unwrap();
        assert_eq!((st.code, st.message.as_str()), (StatusCode::Error as i32, "boom"));
        assert_eq!(s.attributes[0].value.as_ref().unwrap().value, Some(AnyV::IntValue(42)));
        match &s.attributes[2].value.as_ref().unwrap().value {
            Some(AnyV::KvlistValue(kv)) => assert_eq!(kv.values[0].key, ""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn snake_case_keys_and_numeric_enum_strings() {
        let r = traces(r#"{"resource_spans":[{"scope_spans":[{"spans":[{"trace_id":"0102030405060708090a0b0c0d0e0f10","kind":"3"}]}]}]}"#)
            .unwrap();
        let s = &r.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(s.kind, 3);
        assert_eq!(s.trace_id.len(), 16);
    }

    #[test]
    fn logs_severity_by_name() {
        let r: ExportLogsServiceRequest = decode(
            br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"5","severityNumber":"SEVERITY_NUMBER_INFO","body":{"stringValue":"hi"}}]}]}]}"#,
            no_check,
        )
        .unwrap();
        let l = &r.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!((l.time_unix_nano, l.severity_number), (5, SeverityNumber::Info as i32));
    }

    #[test]
    fn metrics_values_and_temporality() {
        let r = metrics(
            r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"c","sum":{
              "aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","isMonotonic":true,
              "dataPoints":[{"asInt":"9007199254740993","timeUnixNano":"7"},{"asDouble":1.5,"timeUnixNano":8}]}}]}]}]}"#,
        )
        .unwrap();
        match &r.resource_metrics[0].scope_metrics[0].metrics[0].data {
            Some(Data::Sum(s)) => {
                assert_eq!(s.aggregation_temporality, AggregationTemporality::Cumulative as i32);
                assert_eq!(s.data_points[0].value, Some(NumV::AsInt(9_007_199_254_740_993)));
                assert_eq!(s.data_points[1].value, Some(NumV::AsDouble(1.5)));
                assert_eq!((s.data_points[0].time_unix_nano, s.data_points[1].time_unix_nano), (7, 8));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_inside_metric_oneofs_are_reported_not_dropped() {
        let e = metrics(r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"a","sum":{"dataPoints":[{"asInt":"1","timeUnixNano":"x"}]}}]}]}]}"#)
            .unwrap_err();
        assert!(e.0.contains("resourceMetrics[0].scopeMetrics[0].metrics[0].sum: dataPoints[0].timeUnixNano"), "{e}");
        let e = metrics(r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"a","gauge":{"dataPoints":[{"asInt":"zz"}]}}]}]}]}"#)
            .unwrap_err();
        assert!(e.0.contains("gauge.dataPoints[0]"), "{e}");
        let e = metrics(
            r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"a","gauge":{"dataPoints":[{"asDouble":1,"exemplars":[{"asInt":"q"}]}]}}]}]}]}"#,
        )
        .unwrap_err();
        assert!(e.0.contains("exemplars[0]"), "{e}");
    }

    #[test]
    fn bad_input_names_the_problem() {
        let e = traces("{").unwrap_err();
        assert!(e.0.starts_with("invalid JSON: EOF"), "{e}");
        let e = traces("[]").unwrap_err();
        assert!(e.0.contains("must be a JSON object"), "{e}");
        let e = traces(r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"kind":"SPAN_KIND_NOPE"}]}]}]}"#).unwrap_err();
        assert!(
            e.0.contains("resourceSpans[0].scopeSpans[0].spans[0].kind: unknown enum value \"SPAN_KIND_NOPE\""),
            "{e}"
        );
        let e = traces(r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz"}]}]}]}"#).unwrap_err();
        assert!(e.0.contains("resourceSpans[0].scopeSpans[0].spans[0].traceId"), "{e}");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
}
