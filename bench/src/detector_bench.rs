//! Shared parts of the detector benchmarks (`zscore-bench`, `peer-outlier-bench`): the
//! test kit's deterministic generator, gauge batches as `llm_signals` writes them, and the timed
//! loop that drives an [`ArrowProcessor`] over prepared batches. Included with `#[path]` by
//! each benchmark binary.

// Each binary uses a part of it.
#![allow(dead_code)]

use inferwatch_core::arrow::{ArrowProcessor, RecordBatch, metrics};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::time::{Duration, Instant};

/// A double gauge point at a time with attributes (the test kit's).
pub use inferwatch_testkit::otlp::point;
/// The deterministic generator of the test kit (SplitMix64).
pub use inferwatch_testkit::rng::SplitMix64 as Gen;

/// A string attribute.
pub fn kv_str(k: &str, v: String) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v)) }), key_strindex: 0 }
}

/// One Arrow batch: the gauge `metric` (unit seconds) with `points`, under one resource
/// (`resource` attributes) and scope `scope`.
pub fn gauge_batch(
    resource: Vec<KeyValue>,
    scope: &str,
    metric: &str,
    points: Vec<NumberDataPoint>,
) -> anyhow::Result<RecordBatch> {
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource { attributes: resource, ..Default::default() }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope { name: scope.into(), ..Default::default() }),
                metrics: vec![Metric {
                    name: metric.into(),
                    unit: "s".into(),
                    data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    Ok(metrics::to_batch(&req)?)
}

/// Drives `p` over `input` (each batch with the watermark to advance to after it, none: no
/// advance), timing only `process` + `advance`; `inspect` sees every output batch outside the
/// timing. Returns the busy time and the output rows.
pub fn drive(
    p: &mut dyn ArrowProcessor,
    input: &[(RecordBatch, Option<u64>)],
    mut inspect: impl FnMut(&RecordBatch) -> anyhow::Result<()>,
) -> anyhow::Result<(Duration, usize)> {
    let mut busy = Duration::ZERO;
    let mut rows = 0usize;
    for (b, wm) in input {
        let mut out = Vec::new();
        let t = Instant::now();
        p.process(b, &mut out)?;
        if let Some(wm) = wm {
            p.advance(*wm, &mut out)?;
        }
        busy += t.elapsed();
        for o in &out {
            rows += o.num_rows();
            inspect(o)?;
        }
    }
    Ok((busy, rows))
}

/// Points per second of `n` points in `d`.
pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}
