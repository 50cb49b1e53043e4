use super::config::*;
use super::factory::*;
use super::parse_retry_after;
use super::send::*;
use inferwatch_core::component::ExporterFactory;
use inferwatch_core::exporterhelper::SendError;
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::Compression;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use std::time::Duration;

use inferwatch_core::component::PathSeg;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;
use serde_json::json;

fn url(v: serde_json::Value, s: Signal) -> Option<String> {
    OtlpHttpConfig::from_value(&v).unwrap().signal_url(s).unwrap().map(|u| u.to_string())
}

#[test]
fn signal_paths_are_appended_to_the_base() {
    let v = json!({"endpoint": "https://otlp.example.com:4318"});
    assert_eq!(url(v.clone(), Signal::Traces).as_deref(), Some("https://otlp.example.com:4318/v1/traces"));
    assert_eq!(url(v, Signal::Logs).as_deref(), Some("https://otlp.example.com:4318/v1/logs"));
    let v = json!({"endpoint": "http://gw/otlp/", "metrics_endpoint": "http://m:9/custom"});
    assert_eq!(url(v.clone(), Signal::Traces).as_deref(), Some("http://gw/otlp/v1/traces"));
    assert_eq!(url(v, Signal::Metrics).as_deref(), Some("http://m:9/custom"));
    let v = json!({"traces_endpoint": "http://t:1/x"});
    assert_eq!(url(v.clone(), Signal::Logs), None);
    let e = HttpSender::new("otlphttp".into(), &OtlpHttpConfig::from_value(&v).unwrap(), Signal::Logs).err().unwrap();
    assert!(e.message.contains("logs_endpoint"), "{}", e.message);
    assert_eq!(
        url(json!({"endpoint": "collector:4318"}), Signal::Traces).as_deref(),
        Some("https://collector:4318/v1/traces")
    );
    let v = json!({"endpoint": "collector:4318", "tls": {"insecure": true}});
    assert_eq!(url(v, Signal::Traces).as_deref(), Some("http://collector:4318/v1/traces"));
}

#[test]
fn defaults_follow_otelcol() {
    let c = OtlpHttpConfig::from_value(&json!({"endpoint": "http://c:4318"})).unwrap();
    assert_eq!(c.exporter.timeout.0, Duration::from_secs(30));
    assert_eq!(c.encoding, Encoding::Proto);
    assert_eq!(c.client.compression, Compression::Gzip);
}

#[test]
fn bad_settings_point_at_the_field() {
    let key = |p: &[PathSeg]| -> Vec<String> {
        p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
    };
    let cases = [
        (json!({}), vec!["endpoint"]),
        (json!({"endpoint": "ftp://x"}), vec!["endpoint"]),
        (json!({"endpoint": "http://"}), vec!["endpoint"]),
        (json!({"endpoint": "http://c", "logs_endpoint": "nope://"}), vec!["logs_endpoint"]),
        (json!({"endpoint": "http://c", "encoding": "xml"}), vec!["encoding"]),
        (json!({"endpoint": "http://c", "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
        (json!({"endpoint": "http://c", "unknown": 1}), vec!["unknown"]),
        (json!({"endpoint": "http://c", "tls": {"key_file": "k"}}), vec!["tls", "cert_file"]),
    ];
    for (v, path) in cases {
        let e = OtlpHttpExporterFactory.validate(&v).expect_err(&v.to_string());
        assert_eq!(key(&e.path), path, "{v}: {}", e.message);
    }
}

#[test]
fn status_mapping() {
    for s in [429, 502, 503, 504] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
    }
    for s in [300, 400, 401, 403, 404, 413, 500, 501] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
    }
}

#[test]
fn retry_after_forms() {
    let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
    assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
    assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
    assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now), Some(Duration::from_secs(30)));
    assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), None);
    assert_eq!(parse_retry_after("0", now), None);
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("-5", now), None);
}

#[test]
fn partial_success_and_error_bodies() {
    use prost::Message;
    let r = ExportTraceServiceResponse {
        partial_success: Some(ExportTracePartialSuccess { rejected_spans: 3, error_message: "too old".into() }),
    };
    let got = parse_partial_success(Signal::Traces, "application/x-protobuf", &r.encode_to_vec()).unwrap();
    assert_eq!(got, Some((3, "too old".to_string())));
    let j = serde_json::to_vec(&r).unwrap();
    assert_eq!(parse_partial_success(Signal::Traces, "application/json; charset=utf-8", &j).unwrap(), got);
    assert_eq!(parse_partial_success(Signal::Traces, "application/json", b"{\"partialSuccess\":null}").unwrap(), None);
    assert_eq!(parse_partial_success(Signal::Traces, "text/plain", b"ok").unwrap(), None);
    assert!(parse_partial_success(Signal::Logs, "application/x-protobuf", b"\xff\xff").is_err());

    let st = tonic_types::Status { code: 3, message: "bad span".into(), details: vec![] };
    assert_eq!(error_detail("application/x-protobuf", &st.encode_to_vec()), ": bad span");
    assert_eq!(error_detail("application/json", br#"{"code":3,"message":"nope"}"#), ": nope");
    assert_eq!(error_detail("text/plain", b"  overloaded \n"), ": overloaded");
    assert_eq!(error_detail("", b""), "");
    assert!(error_detail("text/plain", &[b'x'; 1000]).chars().count() < 300);
}
