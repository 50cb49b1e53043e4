use super::config::*;
use super::factory::*;
use super::send::*;
use inferwatch_core::component::ExporterFactory;
use inferwatch_core::exporterhelper::SendError;
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::Compression;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use std::time::Duration;
use tonic::{Code, Status};
use tonic_types::StatusExt;

#[test]
fn malformed_status_details_do_not_panic() {
    let mut h = http::HeaderMap::new();
    h.insert("grpc-status", http::HeaderValue::from_static("14"));
    h.insert("grpc-message", http::HeaderValue::from_static("down"));
    h.insert("grpc-status-details-bin", http::HeaderValue::from_static("!!!not base64!!!"));
    let st = grpc_status(&h).unwrap();
    assert_eq!(st.code(), Code::Unavailable);
    assert_eq!(st.message(), "down");
    assert!(grpc_status(&http::HeaderMap::new()).is_none());
}

#[test]
fn http_errors_and_timeouts_follow_the_grpc_spec() {
    assert_eq!(http_status(http::StatusCode::UNAUTHORIZED).code(), Code::Unauthenticated);
    assert_eq!(http_status(http::StatusCode::NOT_FOUND).code(), Code::Unimplemented);
    assert_eq!(http_status(http::StatusCode::SERVICE_UNAVAILABLE).code(), Code::Unavailable);
    assert!(matches!(classify(&http_status(http::StatusCode::FORBIDDEN)), SendError::Permanent(_)));
    assert_eq!(grpc_timeout(Duration::from_secs(5)), "5000m");
    assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
    assert!(grpc_timeout(Duration::from_secs(u64::MAX / 2)).len() <= 9);
}

#[test]
fn partial_success_is_read_from_compressed_responses() {
    use prost::Message;
    use std::io::Write;
    let resp = ExportTraceServiceResponse {
        partial_success: Some(opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess {
            rejected_spans: 3,
            error_message: "bad".into(),
        }),
    };
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&resp.encode_to_vec()).unwrap();
    let z = z.finish().unwrap();
    let mut frame = vec![1u8];
    frame.extend_from_slice(&(z.len() as u32).to_be_bytes());
    frame.extend_from_slice(&z);
    assert_eq!(partial_success(Signal::Traces, &frame), (3, "bad".to_string()));
    assert_eq!(partial_success(Signal::Traces, &frame[..4]), (0, String::new()));
}

use inferwatch_core::component::PathSeg;
use serde_json::json;
use tonic_types::ErrorDetails;

fn key(path: &[PathSeg]) -> Vec<String> {
    path.iter()
        .map(|p| match p {
            PathSeg::Key(k) => k.clone(),
            PathSeg::Index(i) => i.to_string(),
        })
        .collect()
}

#[test]
fn defaults_follow_otelcol() {
    let c = OtlpConfig::from_value(&json!({"endpoint": "tempo:4317"})).unwrap();
    assert_eq!(c.client.compression, Compression::Gzip);
    assert_eq!(c.exporter.timeout.0, Duration::from_secs(5));
    assert!(c.use_tls());
    assert!(c.exporter.sending_queue.enabled);
    assert!(c.exporter.retry_on_failure.enabled);
    let c = OtlpConfig::from_value(&json!({"endpoint": "tempo:4317", "tls": {"insecure": true}})).unwrap();
    assert!(!c.use_tls());
    let c = OtlpConfig::from_value(&json!({"endpoint": "http://tempo:4317"})).unwrap();
    assert!(!c.use_tls());
    let c = OtlpConfig::from_value(&json!({"endpoint": "https://tempo", "tls": {"insecure": true}})).unwrap();
    assert!(c.use_tls());
    assert_eq!(c.endpoint().unwrap().authority, "tempo:443");
}

#[test]
fn otelcol_keys_are_accepted() {
    let v = json!({
        "endpoint": "tempo:4317",
        "balancer_name": "round_robin",
        "keepalive": {"time": "20s", "timeout": "5s", "permit_without_stream": true},
        "headers": {"X-Scope-OrgID": "team-a", "trace-bin": "raw"},
        "compression": "none",
        "timeout": "2s",
        "sending_queue": {"enabled": true, "num_consumers": 2, "queue_size": 10},
        "retry_on_failure": {"enabled": true, "initial_interval": "1s", "max_interval": "5s", "max_elapsed_time": "1m"},
    });
    let c = OtlpConfig::from_value(&v).unwrap();
    assert_eq!(c.keepalive.time.0, Duration::from_secs(20));
    let m = metadata(&c.client.headers).unwrap();
    assert_eq!(m.get("x-scope-orgid").and_then(|v| v.to_str().ok()), Some("team-a"));
    assert!(m.get_bin("trace-bin").is_some());
}

#[test]
fn bad_settings_point_at_the_field() {
    let cases = [
        (json!({}), vec!["endpoint"]),
        (json!(null), vec!["endpoint"]),
        (json!({"endpoint": "tempo"}), vec!["endpoint"]),
        (json!({"endpoint": "tempo:4317/x"}), vec!["endpoint"]),
        (json!({"endpoint": "tempo:4317", "bogus": 1}), vec!["bogus"]),
        (json!({"endpoint": "tempo:4317", "tls": {"bogus": 1}}), vec!["tls", "bogus"]),
        (json!({"endpoint": "tempo:4317", "compression": "zstd"}), vec!["compression"]),
        (json!({"endpoint": "tempo:4317", "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
        (json!({"endpoint": "tempo:4317", "headers": {"k": "line\nbreak"}}), vec!["headers", "k"]),
        (json!({"endpoint": "tempo:4317", "balancer_name": "random"}), vec!["balancer_name"]),
        (json!({"endpoint": "http://tempo:4317", "tls": {"ca_file": "ca.pem"}}), vec!["tls"]),
        (json!({"endpoint": "tempo:4317", "tls": {"cert_file": "c.pem"}}), vec!["tls", "key_file"]),
        (json!({"endpoint": "tempo:4317", "sending_queue": {"queue_size": 0}}), vec!["sending_queue", "queue_size"]),
        (json!({"endpoint": "tempo:4317", "timeout": "5 parsecs"}), vec!["timeout"]),
    ];
    for (v, path) in cases {
        let e = OtlpExporterFactory.validate(&v).expect_err(&v.to_string());
        assert_eq!(key(&e.path), path, "{v}: {}", e.message);
    }
}

#[test]
fn missing_ca_file_fails_at_create_not_validate() {
    let v = json!({"endpoint": "tempo:4317", "tls": {"ca_file": "/nonexistent/ca.pem"}});
    assert!(OtlpExporterFactory.validate(&v).is_ok());
    let c = OtlpConfig::from_value(&v).unwrap();
    let e = GrpcSender::new("otlp".into(), &c).err().unwrap();
    assert_eq!(key(&e.path), vec!["tls", "ca_file"]);
}

#[test]
fn status_mapping_follows_the_spec() {
    for code in
        [Code::Cancelled, Code::DeadlineExceeded, Code::Aborted, Code::OutOfRange, Code::Unavailable, Code::DataLoss]
    {
        assert!(
            matches!(classify(&Status::new(code, "x")), SendError::Retryable { retry_after: None, .. }),
            "{code:?}"
        );
    }
    for code in [
        Code::InvalidArgument,
        Code::NotFound,
        Code::PermissionDenied,
        Code::Unauthenticated,
        Code::Unimplemented,
        Code::Internal,
        Code::Unknown,
        Code::ResourceExhausted,
    ] {
        assert!(matches!(classify(&Status::new(code, "x")), SendError::Permanent(_)), "{code:?}");
    }
    let d = Duration::from_millis(1500);
    let s = Status::with_error_details(Code::ResourceExhausted, "slow down", ErrorDetails::with_retry_info(Some(d)));
    assert_eq!(classify(&s), SendError::Retryable { message: describe(&s), retry_after: Some(d) });
    let s = Status::with_error_details(Code::Unavailable, "later", ErrorDetails::with_retry_info(Some(d)));
    assert!(matches!(classify(&s), SendError::Retryable { retry_after: Some(x), .. } if x == d));
    assert!(describe(&Status::invalid_argument("bad span")).contains("InvalidArgument desc = bad span"));
    // UNKNOWN from the server is permanent; UNKNOWN raised by the local transport is not.
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
    assert!(matches!(classify(&Status::from_error(Box::new(io))), SendError::Retryable { .. }));
}
