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

    #[test]
    fn doubles_are_decoded_exactly() {
        // Without serde_json's float_roundtrip, ~8 % of realistic doubles came back one ulp off.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut values = vec![0.1, 1e-300, 123456.789, f64::MAX, f64::MIN_POSITIVE, 2.2250738585072014e-308];
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if v.is_finite() {
                values.push(v);
            }
            values.push((x % 10_000_000) as f64 / 997.0); // latency-like values
        }
        let points: Vec<String> = values.iter().map(|v| format!(r#"{{"asDouble":{v:?}}}"#)).collect();
        let body = format!(
            r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{{"name":"m","gauge":{{"dataPoints":[{}]}}}}]}}]}}]}}"#,
            points.join(",")
        );
        let r = metrics(&body).unwrap();
        let Some(Data::Gauge(g)) = &r.resource_metrics[0].scope_metrics[0].metrics[0].data else { panic!("no gauge") };
        assert_eq!(g.data_points.len(), values.len());
        let off = g
            .data_points
            .iter()
            .zip(&values)
            .filter(|(p, v)| !matches!(p.value, Some(NumV::AsDouble(d)) if d.to_bits() == v.to_bits()))
            .count();
        assert_eq!(off, 0, "{off} of {} doubles changed", values.len());
    }
}

/// Fuzz-style tests: thousands of seeded mutations of valid OTLP/JSON documents. No input may
/// panic, and every accepted request must survive a protobuf round trip unchanged.
#[cfg(test)]
mod fuzz {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::fmt::Debug;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    const TRACES: &str = r#"{"resourceSpans":[{"resource":{"attributes":[
        {"key":"service.name","value":{"stringValue":"vllm"}},
        {"key":"arr","value":{"arrayValue":{"values":[{"intValue":"1"},{"doubleValue":2.5},{"boolValue":true}]}}},
        {"key":"kv","value":{"kvlistValue":{"values":[{"key":"k","value":{"bytesValue":"aGk="}}]}}}],
        "droppedAttributesCount":0,"entityRefs":[{"type":"service","idKeys":["service.name"]}]},
      "scopeSpans":[{"scope":{"name":"lib","version":"1","attributes":[]},"schemaUrl":"s",
        "spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
          "parentSpanId":"eee19b7ec3c1b173","traceState":"a=b","flags":257,"name":"chat",
          "kind":"SPAN_KIND_SERVER","startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
          "attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":42}}],
          "droppedAttributesCount":"1",
          "events":[{"timeUnixNano":"5","name":"first_token","attributes":[],"droppedAttributesCount":0}],
          "droppedEventsCount":0,
          "links":[{"traceId":"5b8efff798038103d269b633813fc60d","spanId":"eee19b7ec3c1b175","flags":1}],
          "droppedLinksCount":"0","status":{"code":"STATUS_CODE_ERROR","message":"timeout"}},
          {"trace_id":"0102030405060708090a0b0c0d0e0f10","span_id":"0102030405060708","kind":3,
           "status":{"code":1}}]}]}]}"#;

    const METRICS: &str = r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"a","value":{"stringValue":"b"}}]},
      "scopeMetrics":[{"scope":{"name":"m"},"metrics":[
        {"name":"tokens","unit":"1","description":"d","sum":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE",
          "isMonotonic":true,"dataPoints":[{"asInt":"42","startTimeUnixNano":"1","timeUnixNano":"2",
          "attributes":[{"key":"model","value":{"stringValue":"m"}}],"flags":0,
          "exemplars":[{"asDouble":1.5,"timeUnixNano":"3","traceId":"5b8efff798038103d269b633813fc60c",
            "spanId":"eee19b7ec3c1b174","filteredAttributes":[{"key":"x","value":{"intValue":"1"}}]}]}]}},
        {"name":"g","gauge":{"dataPoints":[{"asDouble":0.25,"timeUnixNano":7}]}},
        {"name":"h","histogram":{"aggregationTemporality":2,"dataPoints":[{"count":"3","sum":1.5,"min":0.1,"max":1,
          "bucketCounts":["1","2"],"explicitBounds":[0.5],"timeUnixNano":"9",
          "exemplars":[{"asInt":"1","timeUnixNano":"9"}]}]}},
        {"name":"e","exponentialHistogram":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_DELTA",
          "dataPoints":[{"count":4,"sum":2,"scale":"-2","zeroCount":"1","zeroThreshold":0.0,
          "positive":{"offset":"1","bucketCounts":[1,2]},"negative":{"offset":-1,"bucketCounts":["1"]}}]}},
        {"name":"s","summary":{"dataPoints":[{"count":"2","sum":3,"quantileValues":[{"quantile":0.5,"value":1}]}]}},
        {"name":"meta","metadata":[{"key":"k","value":{"stringValue":"v"}}]}]}]}]}"#;

    const LOGS: &str = r#"{"resourceLogs":[{"resource":{},"scopeLogs":[{"scope":{"name":"l"},"logRecords":[
        {"timeUnixNano":"3","observedTimeUnixNano":4,"severityNumber":"SEVERITY_NUMBER_WARN","severityText":"WARN",
         "body":{"stringValue":"kv cache at 95%"},"traceId":"5b8efff798038103d269b633813fc60c",
         "spanId":"eee19b7ec3c1b174","flags":1,"eventName":"e","droppedAttributesCount":0,
         "attributes":[{"key":"n","value":{"kvlistValue":{"values":[{"key":"a","value":{"arrayValue":{}}}]}}}]},
        {"severity_number":17,"body":{"intValue":"-5"}}]}]}]}"#;

    /// Values a mutation may put in place of a JSON value.
    const VALUES: &[&str] = &[
        "null",
        "true",
        "false",
        "0",
        "-1",
        "1.5",
        "1e400",
        "-1e400",
        "1e-400",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "4294967296",
        "2147483648",
        "-2147483649",
        "99999999999999999999999999999999999999",
        "\"\"",
        "\"x\"",
        "\"-1\"",
        "\" 7 \"",
        "\"18446744073709551616\"",
        "\"5b8efff798038103d269b633813fc60c\"",
        "\"zz\"",
        "\"abc\"",
        "\"SPAN_KIND_NOPE\"",
        "\"STATUS_CODE_OK\"",
        "\"SEVERITY_NUMBER_FATAL4\"",
        "\"AGGREGATION_TEMPORALITY_UNSPECIFIED\"",
        "\"\\ud800\"",
        "\"\\u0000\"",
        "{}",
        "[]",
        "[null]",
        "[{}]",
        "{\"values\":null}",
        "{\"key\":1}",
        "{\"stringValue\":1}",
        "{\"asInt\":\"x\"}",
        "{\"asDouble\":\"1\"}",
    ];

    /// Object keys a mutation may introduce (known fields in odd places, snake_case, unknown).
    const KEYS: &[&str] = &[
        "kind",
        "code",
        "severityNumber",
        "aggregationTemporality",
        "flags",
        "scale",
        "offset",
        "droppedAttributesCount",
        "attributes",
        "arrayValue",
        "kvlistValue",
        "values",
        "entityRefs",
        "traceId",
        "trace_id",
        "span_id",
        "asInt",
        "asDouble",
        "gauge",
        "sum",
        "histogram",
        "exponentialHistogram",
        "summary",
        "dataPoints",
        "exemplars",
        "intValue",
        "bytesValue",
        "timeUnixNano",
        "bucketCounts",
        "_",
        "a__b_",
        "zz9_",
        "unknownField",
    ];

    /// A JSON token: its byte range in the text.
    fn tokens(s: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let start = i;
            match s[i] {
                b' ' | b'\n' | b'\r' | b'\t' => {
                    i += 1;
                    continue;
                }
                b'"' => {
                    i += 1;
                    while i < s.len() && s[i] != b'"' {
                        i += if s[i] == b'\\' { 2 } else { 1 };
                    }
                    i = (i + 1).min(s.len());
                }
                b'{' | b'}' | b'[' | b']' | b':' | b',' => i += 1,
                _ => {
                    while i < s.len() && !b" \n\r\t{}[]:,\"".contains(&s[i]) {
                        i += 1;
                    }
                }
            }
            out.push((start, i));
        }
        out
    }

    /// A random path to a node of `v`, as a mutable reference.
    fn random_node<'a>(v: &'a mut Value, rng: &mut StdRng) -> &'a mut Value {
        let stop = rng.random_bool(0.2);
        let len = match &*v {
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            _ => 0,
        };
        if stop || len == 0 {
            return v;
        }
        let i = rng.random_range(0..len);
        match v {
            Value::Array(a) => random_node(&mut a[i], rng),
            Value::Object(m) => {
                let (_, child) = m.iter_mut().nth(i).expect("index in range");
                random_node(child, rng)
            }
            _ => unreachable!(),
        }
    }

    /// A random JSON value from [`VALUES`].
    fn random_value(rng: &mut StdRng) -> Value {
        let s = VALUES[rng.random_range(0..VALUES.len())];
        serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.into()))
    }

    /// Wraps `inner` in `depth` levels of OTLP nesting (arrays or key/value lists), or plain JSON.
    fn nest(inner: &str, depth: usize, style: u8) -> String {
        let (open, close) = match style {
            0 => (r#"{"arrayValue":{"values":["#, "]}}"),
            1 => (r#"{"kvlistValue":{"values":[{"key":"k","value":"#, "}]}}"),
            2 => ("[", "]"),
            _ => (r#"{"a":"#, "}"),
        };
        let mut s = String::with_capacity(inner.len() + depth * (open.len() + close.len()));
        for _ in 0..depth {
            s.push_str(open);
        }
        s.push_str(inner);
        for _ in 0..depth {
            s.push_str(close);
        }
        s
    }

    /// One mutated document made from `base`.
    fn mutate(base: &str, rng: &mut StdRng) -> Vec<u8> {
        let mut b = base.as_bytes().to_vec();
        match rng.random_range(0..10) {
            // Byte-level: flips, insertions, deletions, truncation, invalid UTF-8.
            0 => {
                for _ in 0..rng.random_range(1..5) {
                    if b.is_empty() {
                        break;
                    }
                    let i = rng.random_range(0..b.len());
                    match rng.random_range(0..5) {
                        0 => b[i] ^= 1 << rng.random_range(0..8),
                        1 => b[i] = rng.random(),
                        2 => b.insert(i, [0xff, 0xc3, 0x80, 0xed, b'"', b'\\', b'{'][rng.random_range(0..7)]),
                        3 => {
                            b.remove(i);
                        }
                        _ => b.truncate(i),
                    }
                }
            }
            // Token-level: delete, duplicate, swap or replace JSON tokens.
            1 | 2 => {
                for _ in 0..rng.random_range(1..4) {
                    let toks = tokens(&b);
                    if toks.is_empty() {
                        break;
                    }
                    let (s, e) = toks[rng.random_range(0..toks.len())];
                    let tok = b[s..e].to_vec();
                    match rng.random_range(0..4) {
                        0 => {
                            b.drain(s..e);
                        }
                        1 => {
                            b.splice(s..s, tok);
                        }
                        2 => {
                            let (s2, e2) = toks[rng.random_range(0..toks.len())];
                            let other = b[s2..e2].to_vec();
                            if s2 >= e {
                                b.splice(s2..e2, tok);
                                b.splice(s..e, other);
                            } else if e2 <= s {
                                b.splice(s..e, other);
                                b.splice(s2..e2, tok);
                            }
                        }
                        _ => {
                            let v = VALUES[rng.random_range(0..VALUES.len())];
                            b.splice(s..e, v.bytes());
                        }
                    }
                }
            }
            // Structural: swap value types, rename keys, duplicate entries, on the parsed tree.
            3..=6 => {
                let mut v: Value = serde_json::from_str(base).expect("seed is valid JSON");
                for _ in 0..rng.random_range(1..4) {
                    let node = random_node(&mut v, rng);
                    match rng.random_range(0..5) {
                        0 | 1 => *node = random_value(rng),
                        2 => {
                            if let Value::Object(m) = node {
                                let k = KEYS[rng.random_range(0..KEYS.len())];
                                m.insert(k.into(), random_value(rng));
                            }
                        }
                        3 => {
                            if let Value::Array(a) = node
                                && !a.is_empty()
                            {
                                let i = rng.random_range(0..a.len());
                                let dup = a[i].clone();
                                a.insert(i, dup);
                            } else if let Value::Object(m) = node
                                && let Some(k) = m.keys().nth(rng.random_range(0..m.len().max(1))).cloned()
                                && let Some(val) = m.remove(&k)
                            {
                                let k2 = KEYS[rng.random_range(0..KEYS.len())];
                                m.insert(k2.into(), val);
                            }
                        }
                        _ => {
                            let text = nest(&node.to_string(), rng.random_range(1..40), rng.random_range(0..4));
                            *node = serde_json::from_str(&text).unwrap_or(Value::Null);
                        }
                    }
                }
                b = v.to_string().into_bytes();
            }
            // Deep nesting of attribute values and of plain JSON, up to a few hundred levels.
            7 | 8 => {
                let depth = rng.random_range(1..400);
                let style = rng.random_range(0..4);
                let leaf = VALUES[rng.random_range(0..VALUES.len())];
                let leaf = if style < 2 { r#"{"intValue":"1"}"# } else { leaf };
                let nested = nest(leaf, depth, style);
                b = match rng.random_range(0..3) {
                    // As an attribute value, where OTLP allows nesting.
                    0 => base.replacen(r#""value":{"#, &format!(r#""value":{nested},"v2":{{"#), 1).into_bytes(),
                    // As an unknown key inside an AnyValue.
                    1 => base
                        .replacen(r#"{"stringValue":"#, &format!(r#"{{"x":{nested},"stringValue":"#), 1)
                        .into_bytes(),
                    _ => nested.into_bytes(),
                };
            }
            // Truncation at every kind of place.
            _ => b.truncate(rng.random_range(0..=b.len())),
        }
        b
    }

    /// Decodes `body`; fails on a panic and checks that an accepted request round-trips.
    fn check_one<T>(body: &[u8], check: fn(&Value, &T) -> Result<(), String>) -> bool
    where
        T: DeserializeOwned + Message + Default + PartialEq + Debug,
    {
        let got = catch_unwind(AssertUnwindSafe(|| decode::<T>(body, check)));
        let got = got.unwrap_or_else(|_| panic!("decode panicked on {:?}", String::from_utf8_lossy(body)));
        match got {
            Ok(req) => {
                let back = T::decode(req.encode_to_vec().as_slice())
                    .unwrap_or_else(|e| panic!("re-encoded request does not decode ({e}): {body:?}"));
                assert_eq!(back, req, "round trip changed the request for {:?}", String::from_utf8_lossy(body));
                true
            }
            Err(e) => {
                assert!(e.0.starts_with("invalid JSON") || e.0.starts_with("invalid OTLP/JSON"), "{e}");
                false
            }
        }
    }

    fn run<T>(seed: u64, base: &str, check: fn(&Value, &T) -> Result<(), String>, n: usize)
    where
        T: DeserializeOwned + Message + Default + PartialEq + Debug,
    {
        assert!(check_one::<T>(base.as_bytes(), check), "the seed document must decode");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ok = 0;
        for _ in 0..n {
            let body = mutate(base, &mut rng);
            ok += usize::from(check_one::<T>(&body, check));
        }
        // The mutations must reach past the JSON parser, not only be rejected by it.
        assert!(ok > n / 20, "only {ok} of {n} mutated documents decoded");
    }

    fn no_check<T>(_: &Value, _: &T) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn fuzz_traces_json() {
        run::<ExportTraceServiceRequest>(1, TRACES, no_check, 8000);
    }

    #[test]
    fn fuzz_metrics_json() {
        run::<ExportMetricsServiceRequest>(2, METRICS, check_metrics, 8000);
    }

    #[test]
    fn fuzz_logs_json() {
        run::<ExportLogsServiceRequest>(3, LOGS, no_check, 8000);
    }
}
