use super::config::*;
use super::encode::*;
use super::send::*;
use inferwatch_core::exporterhelper::SendError;
use serde_json::json;
use std::time::Duration;

#[test]
fn rfc3339_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339(1_700_000_000_123_456_789), "2023-11-14T22:13:20.123Z");
    assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(rfc3339(4_107_542_399 * 1_000_000_000), "2100-02-28T23:59:59.000Z");
}

#[test]
fn label_names_are_sanitised() {
    assert_eq!(label_name("gen_ai.request.model"), "gen_ai_request_model");
    assert_eq!(label_name("9x"), "_9x");
    assert_eq!(label_name(""), "_");
}

#[test]
fn status_mapping() {
    for s in [429, 500, 502, 503, 504] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Retryable { .. }), "{s}");
    }
    for s in [400, 404, 422] {
        assert!(matches!(classify(s, "x".into(), None), SendError::Permanent(_)), "{s}");
    }
}

#[test]
fn settings() {
    let c = AlertmanagerConfig::from_value(&serde_json::Value::Null).unwrap();
    assert_eq!(c.url().unwrap().as_str(), "http://127.0.0.1:9093/api/v2/alerts");
    assert_eq!(c.ends_in(), Some(Duration::from_secs(180)));
    assert_eq!(c.exporter.sending_queue.num_consumers, 1);
    let c = AlertmanagerConfig::from_value(&json!({"endpoint": "http://am:9093/prefix/", "repeat": "0s"})).unwrap();
    assert_eq!(c.url().unwrap().as_str(), "http://am:9093/prefix/api/v2/alerts");
    assert_eq!(c.ends_in(), None);
    for (v, key) in [
        (json!({"endpoint": "ftp://x"}), "endpoint"),
        (json!({"sending_queue": {"num_consumers": 4}}), "num_consumers"),
        (json!({"bogus": 1}), "bogus"),
    ] {
        let e = AlertmanagerConfig::from_value(&v).unwrap_err();
        assert!(format!("{:?}", e.path).contains(key), "{v}: {e:?}");
    }
}
