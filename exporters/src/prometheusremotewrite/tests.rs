use super::config::*;
use super::encode::*;
use super::factory::*;
use super::proto::*;
use super::send::*;
use inferwatch_core::component::ExporterFactory;
use inferwatch_core::exporterhelper::SendError;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE};
use std::time::Duration;

use inferwatch_core::component::PathSeg;
use serde_json::json;

#[test]
fn defaults() {
    let c = RemoteWriteConfig::from_value(&json!({"endpoint": "http://127.0.0.1:9090/api/v1/write"})).unwrap();
    assert_eq!(c.exporter.timeout.0, Duration::from_secs(5));
    assert_eq!(c.exporter.sending_queue.num_consumers, 1);
    assert!(c.exporter.sending_queue.enabled);
    assert!(c.add_metric_suffixes);
    let q = json!({"endpoint": "http://p:1/w", "sending_queue": {"queue_size": 7}});
    let c2 = RemoteWriteConfig::from_value(&q).unwrap();
    assert_eq!((c2.exporter.sending_queue.num_consumers, c2.exporter.sending_queue.queue_size), (1, 7));
    let s = c.sender().unwrap();
    assert_eq!(s.headers.get(CONTENT_ENCODING).unwrap(), "snappy");
    assert_eq!(s.headers.get(CONTENT_TYPE).unwrap(), "application/x-protobuf");
    assert_eq!(s.headers.get("x-prometheus-remote-write-version").unwrap(), "0.1.0");
}

#[test]
fn bad_settings_point_at_the_field() {
    let key = |p: &[PathSeg]| -> Vec<String> {
        p.iter().map(|s| if let PathSeg::Key(k) = s { k.clone() } else { String::new() }).collect()
    };
    let ok = "http://p:9090/api/v1/write";
    let cases = [
        (json!({}), vec!["endpoint"]),
        (json!({"endpoint": "p:9090"}), vec!["endpoint"]),
        (json!({"endpoint": "ftp://p/x"}), vec!["endpoint"]),
        (json!({"endpoint": ok, "sending_queue": {"num_consumers": 4}}), vec!["sending_queue", "num_consumers"]),
        (json!({"endpoint": ok, "external_labels": {"__x": "1"}}), vec!["external_labels", "__x"]),
        (json!({"endpoint": ok, "headers": {"bad key": "v"}}), vec!["headers", "bad key"]),
        (json!({"endpoint": ok, "namespace": "a-b"}), vec!["namespace"]),
        (json!({"endpoint": ok, "remote_write_queue": {}}), vec!["remote_write_queue"]),
    ];
    for (v, path) in cases {
        let e = RemoteWriteExporterFactory.validate(&v).expect_err(&v.to_string());
        assert_eq!(key(&e.path), path, "{v}: {}", e.message);
    }
    // A disabled queue sends in the caller's task: num_consumers does not matter then.
    let v = json!({"endpoint": ok, "sending_queue": {"enabled": false, "num_consumers": 4}});
    assert!(RemoteWriteExporterFactory.validate(&v).is_ok());
}

#[test]
fn status_mapping() {
    for s in [429, 500, 502, 503, 504] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
    }
    for s in [300, 400, 401, 403, 404, 409, 413] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
    }
}

#[test]
fn samples_sorted_and_deduplicated() {
    let mut v = vec![
        Sample { value: 3.0, timestamp: 30 },
        Sample { value: 1.0, timestamp: 10 },
        Sample { value: 2.0, timestamp: 10 },
    ];
    sort_samples(&mut v);
    assert_eq!(v, vec![Sample { value: 2.0, timestamp: 10 }, Sample { value: 3.0, timestamp: 30 }]);
}
