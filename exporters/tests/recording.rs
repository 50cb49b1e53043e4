//! The recording exporters (`parquet`, `arrow_ipc`) end to end inside the crate: payloads go in
//! through the factory-built node, files are read back with the parquet crate and the Arrow IPC
//! stream reader and compared with what the OTLP → Arrow converter makes of the input.

use arrow_ipc::reader::StreamReader;
use arrow_select::concat::concat_batches;
use inferwatch_core::arrow::{RecordBatch, batch_to_payload, payload_to_batch};
use inferwatch_core::component::{ComponentId, CreateContext, ExporterFactory, NodeRef};
use inferwatch_core::consumer::ConsumeError;
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::state::Store;
use inferwatch_core::telemetry::{ExporterMetrics, Telemetry};
use inferwatch_exporters::{ArrowIpcExporterFactory, ParquetExporterFactory};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

// ---- payloads ----------------------------------------------------------------------------

fn kv_str(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

fn kv_int(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }),
        ..Default::default()
    }
}

/// The converter puts promoted `service.*` attributes after the others on the way back, so they
/// come last here for the round trip to be exact.
fn resource() -> Option<Resource> {
    Some(Resource {
        attributes: vec![kv_str("host.name", "gpu-node-1"), kv_str("service.name", "vllm")],
        ..Default::default()
    })
}

fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope { name: "inferwatch.test".into(), version: "1.0".into(), ..Default::default() })
}

/// A gauge, a monotonic int sum and a histogram, with `n` points each at `base + i` ns.
fn metrics_at(base: u64, n: usize) -> Payload {
    let t = |i: usize| base + i as u64;
    let gauge = Metric {
        name: "vllm:gpu_cache_usage_perc".into(),
        unit: "1".into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: (0..n)
                .map(|i| NumberDataPoint {
                    time_unix_nano: t(i),
                    value: Some(number_data_point::Value::AsDouble(i as f64 / 8.0)),
                    attributes: vec![kv_str("gpu", &i.to_string())],
                    ..Default::default()
                })
                .collect(),
        })),
        ..Default::default()
    };
    let sum = Metric {
        name: "vllm:request_success_total".into(),
        description: "finished requests".into(),
        data: Some(metric::Data::Sum(Sum {
            data_points: (0..n)
                .map(|i| NumberDataPoint {
                    start_time_unix_nano: base - 60 * SEC,
                    time_unix_nano: t(i),
                    value: Some(number_data_point::Value::AsInt(100 + i as i64)),
                    attributes: vec![kv_str("finished_reason", "stop"), kv_int("replica", i as i64)],
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let hist = Metric {
        name: "vllm:time_to_first_token_seconds".into(),
        unit: "s".into(),
        data: Some(metric::Data::Histogram(Histogram {
            data_points: (0..n)
                .map(|i| HistogramDataPoint {
                    start_time_unix_nano: base - 60 * SEC,
                    time_unix_nano: t(i),
                    count: 6 + i as u64,
                    sum: Some(1.25 + i as f64),
                    bucket_counts: vec![1, 2, 3 + i as u64],
                    explicit_bounds: vec![0.1, 0.5],
                    min: Some(0.01),
                    max: Some(2.0),
                    attributes: vec![kv_str("model", "llama-3-8b")],
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        })),
        ..Default::default()
    };
    Payload::Metrics(ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource(),
            scope_metrics: vec![ScopeMetrics { scope: scope(), metrics: vec![gauge, sum, hist], ..Default::default() }],
            ..Default::default()
        }],
    })
}

/// `n` spans ending at `base + i` ns.
fn spans_at(base: u64, n: usize) -> Payload {
    Payload::Traces(ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource(),
            scope_spans: vec![ScopeSpans {
                scope: scope(),
                spans: (0..n)
                    .map(|i| Span {
                        name: format!("decode-{i}"),
                        trace_id: vec![0x5a; 16],
                        span_id: vec![i as u8 + 1; 8],
                        parent_span_id: if i == 0 { vec![] } else { vec![1; 8] },
                        kind: span::SpanKind::Server as i32,
                        start_time_unix_nano: base - SEC + i as u64,
                        end_time_unix_nano: base + i as u64,
                        // Promoted attributes come back after the others.
                        attributes: vec![kv_int("batch.size", 4), kv_str("gen_ai.request.model", "llama-3-8b")],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    })
}

fn payload_at(signal: Signal, base: u64, n: usize) -> Payload {
    match signal {
        Signal::Traces => spans_at(base, n),
        _ => metrics_at(base, n),
    }
}

// ---- exporter wiring ---------------------------------------------------------------------

/// A fresh, empty directory under the system temp dir.
fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iw-recording-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// An exporter built through its factory, with its host and self-telemetry.
struct Built {
    node: NodeRef,
    metrics: ExporterMetrics,
    telemetry: Arc<Telemetry>,
    host: Arc<Host>,
}

async fn start(factory: &dyn ExporterFactory, cfg: Value, signal: Signal) -> Built {
    factory.validate(&cfg).unwrap_or_else(|e| panic!("validate {cfg}: {e} at {:?}", e.path));
    let telemetry = Arc::new(Telemetry::new());
    let id = ComponentId::parse(factory.type_name()).unwrap();
    let metrics = telemetry.exporter(&id, signal);
    let ctx = CreateContext::new(id, telemetry.clone());
    let host = ctx.host.clone();
    let node = factory.create(ctx, &cfg, signal).unwrap_or_else(|e| panic!("create {cfg}: {e}"));
    node.start().await.unwrap();
    Built { node, metrics, telemetry, host }
}

impl Built {
    async fn stop(&self) -> u64 {
        self.node.shutdown(Instant::now() + Duration::from_secs(10)).await
    }

    fn conversions(&self, name: &str, signal: Signal) -> u64 {
        self.telemetry.arrow_conversions(&format!("exporter {name}"), signal).get()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Parquet,
    Ipc,
}

const FORMATS: [Format; 2] = [Format::Parquet, Format::Ipc];

impl Format {
    fn factory(self) -> &'static dyn ExporterFactory {
        match self {
            Format::Parquet => &ParquetExporterFactory,
            Format::Ipc => &ArrowIpcExporterFactory,
        }
    }

    fn name(self) -> &'static str {
        self.factory().type_name()
    }

    fn ext(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Ipc => "arrows",
        }
    }

    /// Every batch of one file, in order.
    fn read(self, path: &Path) -> Vec<RecordBatch> {
        let f = File::open(path).unwrap();
        match self {
            Format::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
                // The reader strips schema metadata from its batches; the file's schema has it.
                let schema = builder.schema().clone();
                let reader = builder.build().unwrap();
                reader.map(|b| b.unwrap().with_schema(schema.clone()).unwrap()).collect()
            }
            Format::Ipc => {
                let reader = StreamReader::try_new(f, None).unwrap();
                let batches = reader.map(|b| b.unwrap()).collect();
                // The stream ends with the end-of-stream marker (continuation + zero length).
                let bytes = std::fs::read(path).unwrap();
                assert_eq!(&bytes[bytes.len() - 8..], &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0], "{}", path.display());
                batches
            }
        }
    }
}

/// Every file under `root`, as paths relative to it, sorted.
fn files(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// One batch of everything in a file.
fn read_all(format: Format, path: &Path) -> RecordBatch {
    let batches = format.read(path);
    assert!(!batches.is_empty(), "{} has no batches", path.display());
    concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// Asserts a batch read back equals the converter's batch: schema (fields and metadata) and values.
fn assert_same_batch(got: &RecordBatch, want: &RecordBatch) {
    assert_eq!(got.num_rows(), want.num_rows());
    assert_eq!(got.schema().fields(), want.schema().fields());
    for (k, v) in want.schema().metadata() {
        assert_eq!(got.schema().metadata().get(k), Some(v), "schema metadata {k}");
    }
    for (i, f) in want.schema().fields().iter().enumerate() {
        assert_eq!(got.column(i).as_ref(), want.column(i).as_ref(), "column {}", f.name());
    }
}

// ---- tests -------------------------------------------------------------------------------

#[tokio::test]
async fn files_read_back_equal_the_input() {
    for format in FORMATS {
        for signal in [Signal::Metrics, Signal::Traces] {
            let dir = tmpdir(&format!("rt-{}-{signal}", format.name()));
            let b = start(format.factory(), json!({"directory": dir}), signal).await;
            let input = payload_at(signal, T0, 4);
            let items = input.item_count() as u64;
            b.node.consume(input.clone()).await.unwrap();
            assert_eq!(b.stop().await, 0);

            let list = files(&dir);
            let s = signal.as_str();
            let want_name = format!("{s}/2023-11-14/{s}-20231114T221320.000000000Z-000000.{}", format.ext());
            assert_eq!(list, vec![want_name.clone()], "{format:?} {signal}");
            let got = read_all(format, &dir.join(&want_name));
            let want = payload_to_batch(&input).unwrap();
            assert_same_batch(&got, &want);
            assert_eq!(batch_to_payload(&got).unwrap(), input, "{format:?} {signal}");

            assert_eq!(b.metrics.sent.get(), items);
            assert_eq!(b.metrics.send_failed.get(), 0);
            assert_eq!(b.conversions(format.name(), signal), 1);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[tokio::test]
async fn parquet_row_groups_and_compression_follow_settings() {
    let dir = tmpdir("rowgroups");
    let cfg = json!({"directory": dir, "row_group_size": 5, "compression": "zstd", "compression_level": 7});
    let b = start(&ParquetExporterFactory, cfg, Signal::Metrics).await;
    let input = metrics_at(T0, 4); // 12 points
    b.node.consume(input.clone()).await.unwrap();
    b.stop().await;
    let list = files(&dir);
    assert_eq!(list.len(), 1);
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(dir.join(&list[0])).unwrap()).unwrap();
    let meta = builder.metadata().clone();
    let rows: Vec<i64> = meta.row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(rows, vec![5, 5, 2]);
    let col = meta.row_group(0).column(0);
    assert!(matches!(col.compression(), parquet::basic::Compression::ZSTD(_)), "{:?}", col.compression());
    // The Arrow schema is stored: the reader gets the converter's exact types back.
    assert_eq!(builder.schema().fields(), payload_to_batch(&input).unwrap().schema().fields());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn rotation_by_max_bytes_closes_each_full_file() {
    for format in FORMATS {
        let dir = tmpdir(&format!("bytes-{}", format.name()));
        // One byte: every batch fills a file.
        let cfg = json!({"directory": dir, "rotation": {"max_bytes": 1}});
        let b = start(format.factory(), cfg, Signal::Metrics).await;
        let inputs = [metrics_at(T0, 2), metrics_at(T0 + SEC, 2), metrics_at(T0, 3)];
        for p in &inputs {
            b.node.consume(p.clone()).await.unwrap();
            // Closed right away: nothing is left in progress.
            assert!(files(&dir).iter().all(|f| !f.ends_with(".inprogress")), "{:?}", files(&dir));
        }
        b.stop().await;
        let e = format.ext();
        let want = vec![
            format!("metrics/2023-11-14/metrics-20231114T221320.000000000Z-000000.{e}"),
            format!("metrics/2023-11-14/metrics-20231114T221320.000000000Z-000001.{e}"),
            format!("metrics/2023-11-14/metrics-20231114T221321.000000000Z-000000.{e}"),
        ];
        assert_eq!(files(&dir), want, "{format:?}");
        // File i holds exactly input i (the third input reuses the first time: seq 1).
        for (name, input) in want.iter().zip([&inputs[0], &inputs[2], &inputs[1]]) {
            let got = read_all(format, &dir.join(name));
            assert_same_batch(&got, &payload_to_batch(input).unwrap());
        }

        // With the default limit the same inputs share one file.
        let dir2 = tmpdir(&format!("bytes-big-{}", format.name()));
        let b = start(format.factory(), json!({"directory": dir2}), Signal::Metrics).await;
        for p in &inputs {
            b.node.consume(p.clone()).await.unwrap();
        }
        b.stop().await;
        let list = files(&dir2);
        assert_eq!(list, vec![format!("metrics/2023-11-14/metrics-20231114T221320.000000000Z-000000.{e}")]);
        assert_eq!(read_all(format, &dir2.join(&list[0])).num_rows(), 3 * (2 + 2 + 3));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir2);
    }
}

#[tokio::test]
async fn rotation_by_event_time_age_and_day() {
    for format in FORMATS {
        for signal in [Signal::Metrics, Signal::Traces] {
            let dir = tmpdir(&format!("age-{}-{signal}", format.name()));
            let cfg = json!({"directory": dir, "rotation": {"max_age": "10s"}});
            let b = start(format.factory(), cfg, signal).await;
            // 2023-11-14T23:59:50Z: 9 s later stays; 10 s later rotates; past midnight rotates.
            let day_end = 1_700_006_390 * SEC;
            let batches = [
                payload_at(signal, day_end, 2),
                payload_at(signal, day_end + 9 * SEC, 1),
                payload_at(signal, day_end + 10 * SEC - 1, 2), // max = +10 s exactly: rotates
                payload_at(signal, day_end + 11 * SEC, 1),     // next day (00:00:01), rotates
                payload_at(signal, day_end + 12 * SEC, 1),
            ];
            for p in &batches {
                b.node.consume(p.clone()).await.unwrap();
            }
            b.stop().await;
            let (s, e) = (signal.as_str(), format.ext());
            let want = vec![
                format!("{s}/2023-11-14/{s}-20231114T235950.000000000Z-000000.{e}"),
                format!("{s}/2023-11-14/{s}-20231114T235959.999999999Z-000000.{e}"),
                format!("{s}/2023-11-15/{s}-20231115T000001.000000000Z-000000.{e}"),
            ];
            assert_eq!(files(&dir), want, "{format:?} {signal}");
            let rows: Vec<usize> = want.iter().map(|f| read_all(format, &dir.join(f)).num_rows()).collect();
            let per = |p: &Payload| payload_to_batch(p).unwrap().num_rows();
            assert_eq!(
                rows,
                vec![per(&batches[0]) + per(&batches[1]), per(&batches[2]), per(&batches[3]) + per(&batches[4])]
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[tokio::test]
async fn leftover_inprogress_files_are_removed_at_start() {
    for format in FORMATS {
        let dir = tmpdir(&format!("crash-{}", format.name()));
        let e = format.ext();
        let day = dir.join("metrics/2023-11-14");
        std::fs::create_dir_all(&day).unwrap();
        // A file a crashed run left half-written, and a complete one of the same name stem.
        let stem = "metrics-20231114T221320.000000000Z";
        let crashed = day.join(format!("{stem}-000001.{e}.inprogress"));
        std::fs::write(&crashed, b"PAR1 half a file").unwrap();
        let complete = day.join(format!("{stem}-000000.{e}"));
        std::fs::write(&complete, b"kept as is").unwrap();

        let b = start(format.factory(), json!({"directory": dir}), Signal::Metrics).await;
        assert!(!crashed.exists(), "the incomplete file is removed at start");
        assert_eq!(std::fs::read(&complete).unwrap(), b"kept as is");

        // A restart writing the same first event time does not overwrite: seq is bumped.
        b.node.consume(metrics_at(T0, 1)).await.unwrap();
        b.stop().await;
        assert_eq!(
            files(&dir),
            vec![format!("metrics/2023-11-14/{stem}-000000.{e}"), format!("metrics/2023-11-14/{stem}-000001.{e}")]
        );
        assert_eq!(read_all(format, &day.join(format!("{stem}-000001.{e}"))).num_rows(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn checkpoint_closes_the_current_file() {
    for format in FORMATS {
        let dir = tmpdir(&format!("ckpt-{}", format.name()));
        let b = start(format.factory(), json!({"directory": dir.join("rec")}), Signal::Traces).await;
        b.host.state.attach(Arc::new(Store::open(&dir.join("state")).unwrap())).unwrap();
        let first = spans_at(T0, 3);
        b.node.consume(first.clone()).await.unwrap();
        let e = format.ext();
        let name = format!("traces/2023-11-14/traces-20231114T221320.000000000Z-000000.{e}");
        assert_eq!(files(&dir.join("rec")), vec![format!("{name}.inprogress")]);

        // The checkpoint makes everything emitted so far readable, while the exporter runs on.
        b.host.state.checkpoint().await.unwrap();
        assert_eq!(files(&dir.join("rec")), vec![name.clone()]);
        let got = read_all(format, &dir.join("rec").join(&name));
        assert_eq!(batch_to_payload(&got).unwrap(), first);

        // The next batch starts a new file.
        b.node.consume(spans_at(T0 + SEC, 2)).await.unwrap();
        b.stop().await;
        let second = format!("traces/2023-11-14/traces-20231114T221321.000000000Z-000000.{e}");
        assert_eq!(files(&dir.join("rec")), vec![name, second]);
        assert_eq!(b.metrics.sent.get(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Runs one recording of a fixed input into `dir`, with rotations of both kinds.
async fn record(format: Format, dir: &Path) {
    let cfg = json!({"directory": dir, "rotation": {"max_age": "30s", "max_bytes": 20000}});
    for signal in [Signal::Metrics, Signal::Traces] {
        let b = start(format.factory(), cfg.clone(), signal).await;
        for i in 0..12u64 {
            b.node.consume(payload_at(signal, T0 + i * 7 * SEC, 1 + i as usize % 4)).await.unwrap();
        }
        b.stop().await;
    }
}

#[tokio::test]
async fn two_runs_over_the_same_input_give_identical_files() {
    for format in FORMATS {
        let (a, b) = (tmpdir(&format!("det-a-{}", format.name())), tmpdir(&format!("det-b-{}", format.name())));
        record(format, &a).await;
        record(format, &b).await;
        let (la, lb) = (files(&a), files(&b));
        assert!(la.len() >= 4, "expected several files, got {la:?}");
        assert_eq!(la, lb);
        for f in &la {
            assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f} differs");
        }
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }
}

#[tokio::test]
async fn a_write_error_names_the_path_and_the_next_batch_still_goes_out() {
    for format in FORMATS {
        let dir = tmpdir(&format!("err-{}", format.name()));
        let b = start(format.factory(), json!({"directory": dir}), Signal::Metrics).await;
        // A plain file where the day folder must go.
        let blocker = dir.join("metrics/2023-11-14");
        std::fs::write(&blocker, b"not a directory").unwrap();
        let bad = metrics_at(T0, 2);
        let err = b.node.consume(bad.clone()).await.unwrap_err();
        match &err {
            ConsumeError::Permanent(m) => assert!(m.contains(&blocker.display().to_string()), "{m}"),
            other => panic!("expected a permanent error, got {other:?}"),
        }
        assert_eq!(b.metrics.send_failed.get(), bad.item_count() as u64);
        assert_eq!(b.metrics.sent.get(), 0);

        // The next day's batch works.
        let next_day = T0 + 86_400 * SEC;
        b.node.consume(metrics_at(next_day, 1)).await.unwrap();
        b.stop().await;
        let e = format.ext();
        assert_eq!(
            files(&dir),
            vec![
                "metrics/2023-11-14".to_string(),
                format!("metrics/2023-11-15/metrics-20231115T221320.000000000Z-000000.{e}"),
            ]
        );
        assert_eq!(b.metrics.sent.get(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn logs_are_refused() {
    for format in FORMATS {
        let f = format.factory();
        assert!(!f.signals().contains(&Signal::Logs));
        let dir = tmpdir(&format!("logs-{}", format.name()));
        let telemetry = Arc::new(Telemetry::new());
        let ctx = CreateContext::new(ComponentId::parse(f.type_name()).unwrap(), telemetry);
        let err = match f.create(ctx, &json!({"directory": dir}), Signal::Logs) {
            Ok(_) => panic!("{format:?} accepted logs"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("logs") && err.contains("no Arrow schema"), "{err}");
        assert!(!dir.exists(), "nothing is created for a refused signal");
        // A logs payload reaching a traces instance is refused too, and nothing is written.
        let b = start(f, json!({"directory": dir}), Signal::Traces).await;
        let logs = Payload::Logs(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs { log_records: vec![LogRecord::default()], ..Default::default() }],
                ..Default::default()
            }],
        });
        assert!(matches!(b.node.consume(logs).await, Err(ConsumeError::Permanent(_))));
        assert_eq!(b.metrics.send_failed.get(), 1);
        b.stop().await;
        assert!(files(&dir).is_empty(), "{:?}", files(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn consume_after_shutdown_is_refused() {
    let dir = tmpdir("after-stop");
    let b = start(&ParquetExporterFactory, json!({"directory": dir}), Signal::Metrics).await;
    b.node.consume(metrics_at(T0, 1)).await.unwrap();
    assert_eq!(b.stop().await, 0);
    let r = b.node.consume(metrics_at(T0 + SEC, 1)).await;
    assert!(matches!(r, Err(ConsumeError::Refused { .. })), "{r:?}");
    assert_eq!(files(&dir).len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
