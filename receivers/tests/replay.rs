//! Tests of the `replay` receiver: every input format, time order across files, the
//! checkpointed position, retries on backpressure, bad input and prompt shutdown.

use async_trait::async_trait;
use inferwatch_core::arrow::payload_to_batch;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers, ReceiverFactory};
use inferwatch_core::consumer::{ConsumeError, Consumer, RefuseReason};
use inferwatch_core::host::{Host, RunValues};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::state::{StateRegistry, Store};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::replay::{REPLAY_ITEMS, ReplayControl, ReplayReceiverFactory};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---- inputs -------------------------------------------------------------------------------

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iw-replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// One OTLP/JSON traces line: spans `(name, end time)`, as the otelcol file exporter writes them.
fn spans_line(spans: &[(&str, u64)]) -> String {
    let spans: Vec<_> = spans
        .iter()
        .enumerate()
        .map(|(i, (name, t))| {
            json!({"traceId": format!("{:032x}", t + 1), "spanId": format!("{:016x}", i + 1), "name": name,
                   "kind": 2, "startTimeUnixNano": (t - 1).to_string(), "endTimeUnixNano": t.to_string()})
        })
        .collect();
    json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{"scope": {"name": "s"}, "spans": spans}]}]})
    .to_string()
}

/// One OTLP/JSON metrics line: a gauge with one point per time.
fn gauge_line(name: &str, times: &[u64]) -> String {
    let points: Vec<_> = times.iter().map(|t| json!({"timeUnixNano": t.to_string(), "asDouble": 1.5})).collect();
    json!({"resourceMetrics": [{"resource": {}, "scopeMetrics": [{"scope": {},
        "metrics": [{"name": name, "gauge": {"dataPoints": points}}]}]}]})
    .to_string()
}

/// One OTLP/JSON logs line, in the compact form of the simulator (enum names, no empty keys).
fn logs_line(records: &[(&str, u64)]) -> String {
    let recs: Vec<_> = records
        .iter()
        .map(|(b, t)| {
            json!({"timeUnixNano": t.to_string(), "severityNumber": "SEVERITY_NUMBER_INFO",
                             "body": {"stringValue": b}, "attributes": [{"value": {"arrayValue": {}}}]})
        })
        .collect();
    json!({"resourceLogs": [{"scopeLogs": [{"logRecords": recs}]}]}).to_string()
}

fn spans_request(spans: &[(&str, u64)]) -> ExportTraceServiceRequest {
    let spans = spans
        .iter()
        .enumerate()
        .map(|(i, (name, t))| Span {
            trace_id: (t + 1).to_be_bytes().repeat(2),
            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
            name: name.to_string(),
            start_time_unix_nano: t - 1,
            end_time_unix_nano: *t,
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    }
}

fn gauge_request(name: &str, times: &[u64]) -> ExportMetricsServiceRequest {
    let data_points = times
        .iter()
        .map(|t| NumberDataPoint { time_unix_nano: *t, value: Some(NumV::AsDouble(1.5)), ..Default::default() })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: name.into(),
                    data: Some(Data::Gauge(Gauge { data_points })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn write_parquet(path: &Path, p: &Payload) {
    let batch = payload_to_batch(p).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn write_ipc_stream(path: &Path, p: &Payload) {
    let batch = payload_to_batch(p).unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(f, &batch.schema()).unwrap();
    // Two batches, to read across batch boundaries.
    let half = batch.num_rows() / 2;
    w.write(&batch.slice(0, half)).unwrap();
    w.write(&batch.slice(half, batch.num_rows() - half)).unwrap();
    w.finish().unwrap();
}

fn write_ipc_file(path: &Path, p: &Payload) {
    let batch = payload_to_batch(p).unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w = arrow_ipc::writer::FileWriter::try_new(f, &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
}

// ---- the pipeline side ---------------------------------------------------------------------

/// The ids of a payload's items: span names, `metric@time` for points, log bodies.
fn ids(p: &Payload) -> Vec<String> {
    let p = p.decoded().unwrap();
    match p.as_ref() {
        Payload::Traces(r) => r
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.name.clone())
            .collect(),
        Payload::Metrics(r) => r
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .flat_map(|m| match &m.data {
                Some(Data::Gauge(g)) => {
                    g.data_points.iter().map(|d| format!("{}@{}", m.name, d.time_unix_nano)).collect::<Vec<_>>()
                }
                _ => vec![format!("{}@?", m.name)],
            })
            .collect(),
        Payload::Logs(r) => r
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .flat_map(|s| &s.log_records)
            .map(|l| match l.body.as_ref().and_then(|b| b.value.as_ref()) {
                Some(AnyV::StringValue(s)) => s.clone(),
                _ => "?".into(),
            })
            .collect(),
        Payload::Encoded(_) => unreachable!(),
    }
}

type Rule = dyn Fn(usize, &[String]) -> Option<ConsumeError> + Send + Sync;

/// Records the chunks it takes, in order; `rule` may refuse a call (by call number and ids).
struct Recorder {
    chunks: Mutex<Vec<Vec<String>>>,
    calls: AtomicUsize,
    rule: Box<Rule>,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Self::with_rule(|_, _| None)
    }
    fn with_rule(rule: impl Fn(usize, &[String]) -> Option<ConsumeError> + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Recorder { chunks: Mutex::new(Vec::new()), calls: AtomicUsize::new(0), rule: Box::new(rule) })
    }
    fn items(&self) -> Vec<String> {
        self.chunks.lock().unwrap().concat()
    }
}

#[async_trait]
impl Consumer for Recorder {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let ids = ids(&data);
        if let Some(e) = (self.rule)(n, &ids) {
            return Err(e);
        }
        self.chunks.lock().unwrap().push(ids);
        Ok(())
    }
}

fn all_to(c: &Arc<Recorder>) -> ReceiverConsumers {
    let mut rc = ReceiverConsumers::default();
    for s in Signal::ALL {
        rc.set(s, c.clone());
    }
    rc
}

fn host(inputs: Vec<PathBuf>, state: Arc<StateRegistry>) -> Arc<Host> {
    Arc::new(Host {
        state,
        run: RunValues::default().with(Arc::new(ReplayControl { inputs, speed: None, progress: Default::default() })),
        ..Default::default()
    })
}

fn receiver(host: &Arc<Host>, telemetry: &Arc<Telemetry>, cfg: serde_json::Value) -> Box<dyn Receiver> {
    let ctx =
        CreateContext { id: ComponentId::parse("replay").unwrap(), telemetry: telemetry.clone(), host: host.clone() };
    ReplayReceiverFactory.create(ctx, &cfg).unwrap()
}

/// Starts a receiver on `host`, waits until it read everything and stops it.
async fn replay_all(host: &Arc<Host>, consumers: ReceiverConsumers, cfg: serde_json::Value) -> Arc<Telemetry> {
    let telemetry = Arc::new(Telemetry::new());
    let mut r = receiver(host, &telemetry, cfg);
    r.start(consumers).await.unwrap();
    let control = host.run.get_arc::<ReplayControl>().unwrap();
    tokio::time::timeout(Duration::from_secs(30), control.progress.wait_finished()).await.expect("replay finishes");
    r.shutdown().await;
    telemetry
}

fn progress(host: &Host) -> [u64; 6] {
    let p = &host.run.get::<ReplayControl>().unwrap().progress;
    [
        p.files_total.load(Ordering::SeqCst),
        p.files_done.load(Ordering::SeqCst),
        p.items.load(Ordering::SeqCst),
        p.failed_items.load(Ordering::SeqCst),
        p.total_bytes.load(Ordering::SeqCst),
        p.done_bytes.load(Ordering::SeqCst),
    ]
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test]
async fn json_lines_are_fed_in_time_order_across_files_and_directories() {
    let dir = tmpdir("order");
    write(
        &dir.join("late.jsonl"),
        &format!("{}\n{}\n", spans_line(&[("l1", 300), ("l2", 301)]), gauge_line("g", &[310])),
    );
    write(
        &dir.join("sub/early.jsonl"),
        &format!("{}\r\n\n{}\n", logs_line(&[("e-log", 100)]), spans_line(&[("e1", 150)])),
    );
    write(&dir.join("mid.json"), &gauge_line("m", &[200, 201]));
    write(&dir.join("late.jsonl.inprogress"), "not json\n");
    write(&dir.join("notes.txt"), "not json\n");
    // A JSON document beside the recording (the simulator's ground_truth.json) is not an input.
    write(&dir.join("ground_truth.json"), "{\n  \"resourceSpans\": 1\n}\n");
    let h = host(vec![dir.clone()], StateRegistry::new());
    let rec = Recorder::new();
    let telemetry = replay_all(&h, all_to(&rec), json!(null)).await;

    assert_eq!(rec.items(), strs(&["e-log", "e1", "m@200", "m@201", "l1", "l2", "g@310"]));
    // One chunk per line.
    assert_eq!(rec.chunks.lock().unwrap().len(), 5);
    let [files, done, items, failed, total, done_bytes] = progress(&h);
    assert_eq!((files, done, items, failed), (3, 3, 7, 0));
    assert!(total > 0 && done_bytes == total, "{done_bytes} of {total} bytes");
    let id = ComponentId::parse("replay").unwrap();
    assert_eq!(REPLAY_ITEMS.get(&telemetry, [&id.to_string(), Signal::Traces.as_str()]).get(), 3);
    assert_eq!(REPLAY_ITEMS.get(&telemetry, [&id.to_string(), Signal::Metrics.as_str()]).get(), 3);
    assert_eq!(REPLAY_ITEMS.get(&telemetry, [&id.to_string(), Signal::Logs.as_str()]).get(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn parquet_and_arrow_ipc_are_fed_in_batches_and_time_order() {
    let dir = tmpdir("arrow");
    let spans: Vec<(String, u64)> = (0..7).map(|i| (format!("s{i}"), 500 + i)).collect();
    let spans: Vec<(&str, u64)> = spans.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let times: Vec<u64> = (1000..1010).collect();
    write_parquet(&dir.join("b.parquet"), &Payload::Metrics(gauge_request("g", &times)));
    write_ipc_stream(&dir.join("a.arrows"), &Payload::Traces(spans_request(&spans)));
    write_ipc_file(&dir.join("c.arrow"), &Payload::Traces(spans_request(&[("late", 2000)])));
    write(&dir.join("d.jsonl"), &spans_line(&[("json", 1500)]));
    let h = host(vec![dir.clone()], StateRegistry::new());
    let rec = Recorder::new();
    replay_all(&h, all_to(&rec), json!({"batch_size": 3})).await;

    let mut want: Vec<String> = (0..7).map(|i| format!("s{i}")).collect();
    want.extend(times.iter().map(|t| format!("g@{t}")));
    want.extend(strs(&["json", "late"]));
    assert_eq!(rec.items(), want);
    let sizes: Vec<usize> = rec.chunks.lock().unwrap().iter().map(Vec::len).collect();
    // The stream holds batches of 3 and 4 rows: 3 | 3, 1; parquet 10 rows: 3, 3, 3, 1.
    assert_eq!(sizes, vec![3, 3, 1, 3, 3, 3, 1, 1, 1]);
    let [files, done, items, failed, total, done_bytes] = progress(&h);
    assert_eq!((files, done, items, failed), (4, 4, 19, 0));
    assert_eq!(done_bytes, total);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a replay whose consumer takes a checkpoint while chunk `at` is being fed (so the
/// checkpoint holds the position just before that chunk), then a second receiver on the same
/// store. Returns (items fed before the checkpoint, items of the second run, items of a full run).
async fn resume_after_checkpoint(
    name: &str,
    inputs: impl Fn(&Path) -> Vec<PathBuf>,
    change_inputs: bool,
    cfg: serde_json::Value,
    at: usize,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let dir = tmpdir(name);
    let store_dir = dir.join("state");
    let ins = inputs(&dir);

    let full = Recorder::new();
    replay_all(&host(ins.clone(), StateRegistry::new()), all_to(&full), cfg.clone()).await;

    let before = {
        let state = StateRegistry::new();
        let h = host(ins.clone(), state.clone());
        let st = state.clone();
        let checkpointed = Arc::new(Mutex::new(None));
        let cp = checkpointed.clone();
        let rec = Recorder::with_rule(move |n, _| {
            if n == at {
                assert_eq!(st.checkpoint_holding_barrier().unwrap(), 1);
                *cp.lock().unwrap() = Some(());
            }
            None
        });
        let telemetry = Arc::new(Telemetry::new());
        let mut r = receiver(&h, &telemetry, cfg.clone());
        state.attach(Arc::new(Store::open(&store_dir).unwrap())).unwrap();
        r.start(all_to(&rec)).await.unwrap();
        h.run.get::<ReplayControl>().unwrap().progress.wait_finished().await;
        r.shutdown().await;
        assert!(checkpointed.lock().unwrap().is_some(), "the checkpoint was taken");
        let chunks = rec.chunks.lock().unwrap();
        chunks[..at].concat()
    };

    let mut ins2 = ins.clone();
    if change_inputs {
        let extra = dir.join("extra.jsonl");
        write(&extra, &spans_line(&[("extra", 1)]));
        ins2.push(extra);
    }
    let state = StateRegistry::new();
    let h = host(ins2, state.clone());
    let rec = Recorder::new();
    let telemetry = Arc::new(Telemetry::new());
    let mut r = receiver(&h, &telemetry, cfg);
    assert_eq!(state.attach(Arc::new(Store::open(&store_dir).unwrap())).unwrap(), 1, "position restored");
    r.start(all_to(&rec)).await.unwrap();
    h.run.get::<ReplayControl>().unwrap().progress.wait_finished().await;
    r.shutdown().await;
    let after = rec.items();
    let _ = std::fs::remove_dir_all(&dir);
    (before, after, full.items())
}

fn json_inputs(dir: &Path) -> Vec<PathBuf> {
    let a = dir.join("a.jsonl");
    let lines: Vec<String> = (0..5).map(|i| spans_line(&[(&format!("a{i}"), 100 + i)])).collect();
    write(&a, &(lines.join("\n") + "\n"));
    let b = dir.join("b.jsonl");
    let lines: Vec<String> = (0..4).map(|i| gauge_line("b", &[200 + i, 300 + i])).collect();
    write(&b, &lines.join("\n"));
    vec![b, a]
}

#[tokio::test]
async fn json_position_checkpoint_resumes_after_the_last_fed_chunk() {
    // Checkpoint in the second file, in the middle of it (chunks: 5 in a.jsonl, 4 in b.jsonl).
    let (before, after, full) = resume_after_checkpoint("cp-json", json_inputs, false, json!(null), 7).await;
    assert_eq!(full.len(), 13);
    assert_eq!(before.len(), 5 + 2 * 2);
    assert_eq!([before, after].concat(), full, "no loss, no duplicate");
}

#[tokio::test]
async fn a_different_input_list_replays_from_the_beginning() {
    let (before, after, full) = resume_after_checkpoint("cp-changed", json_inputs, true, json!(null), 3).await;
    assert_eq!(before.len(), 3);
    let mut want = vec!["extra".to_string()];
    want.extend(full);
    assert_eq!(after, want);
}

#[tokio::test]
async fn arrow_position_checkpoint_resumes_after_the_last_fed_rows() {
    let inputs = |dir: &Path| {
        let times: Vec<u64> = (1000..1010).collect();
        let p = dir.join("m.parquet");
        write_parquet(&p, &Payload::Metrics(gauge_request("g", &times)));
        let spans: Vec<(String, u64)> = (0..8).map(|i| (format!("s{i}"), 2000 + i)).collect();
        let spans: Vec<(&str, u64)> = spans.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let s = dir.join("s.arrows");
        write_ipc_stream(&s, &Payload::Traces(spans_request(&spans)));
        vec![s, p]
    };
    // Chunks of 3: parquet 3,3,3,1; stream (batches of 4): 3,1,3,1. Checkpoint inside each file.
    for at in [2, 5, 6] {
        let (before, after, full) =
            resume_after_checkpoint(&format!("cp-arrow-{at}"), inputs, false, json!({"batch_size": 3}), at).await;
        assert_eq!(full.len(), 18);
        assert_eq!([before, after].concat(), full, "checkpoint at chunk {at}");
    }
}

#[tokio::test]
async fn refusals_are_retried_and_nothing_is_lost() {
    let dir = tmpdir("retry");
    let lines: Vec<String> = (0..6).map(|i| spans_line(&[(&format!("s{i}"), 100 + i)])).collect();
    write(&dir.join("t.jsonl"), &lines.join("\n"));
    let refuse = |after: Option<Duration>| Some(ConsumeError::refused(RefuseReason::QueueFull, after, "full"));
    // The first three calls are refused with a delay, then every other call without one.
    let rec = Recorder::with_rule(move |n, _| match n {
        0..3 => refuse(Some(Duration::from_millis(1))),
        n if n % 2 == 1 => refuse(None),
        _ => None,
    });
    let h = host(vec![dir.clone()], StateRegistry::new());
    replay_all(&h, all_to(&rec), json!(null)).await;
    assert_eq!(rec.items(), (0..6).map(|i| format!("s{i}")).collect::<Vec<_>>());
    assert!(rec.calls.load(Ordering::SeqCst) >= 6 + 3 + 5, "refused calls were retried");
    let [_, _, items, failed, ..] = progress(&h);
    assert_eq!((items, failed), (6, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_input_and_permanent_rejections_are_counted_and_skipped() {
    let dir = tmpdir("bad");
    let good = [spans_line(&[("a", 10)]), "{not json".into(), spans_line(&[("reject", 11), ("r2", 11)])];
    write(&dir.join("1.jsonl"), &good.join("\n"));
    write(
        &dir.join("2.jsonl"),
        &[r#"{"resourceSpans": 5}"#.to_string(), "{}".into(), spans_line(&[("b", 20)])].join("\n"),
    );
    write(&dir.join("corrupt.parquet"), "PAR1 this is not parquet at all");
    write(&dir.join("corrupt.arrows"), "neither is this arrow");
    let rec = Recorder::with_rule(|_, ids| {
        (ids.first().map(String::as_str) == Some("reject")).then(|| ConsumeError::Permanent("no".into()))
    });
    let h = host(vec![dir.clone()], StateRegistry::new());
    let telemetry = replay_all(&h, all_to(&rec), json!(null)).await;
    assert_eq!(rec.items(), strs(&["a", "b"]));
    let [files, done, items, failed, ..] = progress(&h);
    // Bad lines: 3 (one each); corrupt files: 1 each; rejected: 2 spans.
    assert_eq!((files, done, items, failed), (4, 4, 2, 3 + 2 + 2));
    let id = ComponentId::parse("replay").unwrap();
    assert_eq!(REPLAY_ITEMS.get(&telemetry, [&id.to_string(), Signal::Traces.as_str()]).get(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fuzz harness's corrupt Arrow IPC and Parquet inputs (arrow-ipc and parquet panic on
/// them, one claims ~10^15 rows, `ARROW1ARROW1` has a footer length past its end): each is
/// a bad file, counted as failed, and the replay finishes.
#[tokio::test]
async fn corrupt_arrow_and_parquet_files_are_bad_files_not_panics_or_hangs() {
    let dir = tmpdir("corrupt-fuzz");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut n = 0;
    for target in ["replay_arrow_ipc", "replay_parquet"] {
        for e in std::fs::read_dir(corpus.join(target)).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("regress-") {
                std::fs::copy(&path, dir.join(&name)).unwrap();
                n += 1;
            }
        }
    }
    assert!(n >= 9, "regress inputs: {n}");
    std::fs::write(dir.join("tiny.arrow"), b"ARROW1ARROW1").unwrap();
    std::fs::write(dir.join("tiny.parquet"), b"PAR1\xff\xff\xff\x7fPAR1").unwrap();
    n += 2;
    let rec = Recorder::new();
    let h = host(vec![dir.clone()], StateRegistry::new());
    replay_all(&h, all_to(&rec), json!(null)).await;
    let [files, done, _, failed, ..] = progress(&h);
    assert_eq!((files, done), (n, n));
    // Every file fails at least once; a batch claiming 10^15 rows is one failure, not 10^15.
    assert!(failed >= n && failed < 1_000_000, "failed: {failed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn signals_without_a_pipeline_are_skipped() {
    let dir = tmpdir("skip");
    write(&dir.join("x.jsonl"), &[logs_line(&[("l", 1)]), spans_line(&[("t", 2)]), gauge_line("g", &[3])].join("\n"));
    let rec = Recorder::new();
    let mut rc = ReceiverConsumers::default();
    rc.set(Signal::Traces, rec.clone());
    let h = host(vec![dir.clone()], StateRegistry::new());
    replay_all(&h, rc, json!(null)).await;
    assert_eq!(rec.items(), strs(&["t"]));
    let [_, done, items, failed, ..] = progress(&h);
    assert_eq!((done, items, failed), (1, 1, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn paced_replay_under_run_stops_promptly_on_shutdown() {
    let dir = tmpdir("pace");
    // One hour of data time between the two lines: at speed 2 the second is due in 30 minutes.
    let hour = 3_600_000_000_000u64;
    write(&dir.join("x.jsonl"), &[spans_line(&[("now", hour)]), spans_line(&[("later", 2 * hour)])].join("\n"));
    let first = Arc::new(tokio::sync::Notify::new());
    let f = first.clone();
    let rec = Recorder::with_rule(move |_, _| {
        f.notify_one();
        None
    });
    let telemetry = Arc::new(Telemetry::new());
    let h = Host::new();
    let mut r = receiver(&h, &telemetry, json!({"include": [dir.clone()], "speed": 2}));
    r.start(all_to(&rec)).await.unwrap();
    first.notified().await;
    let t = std::time::Instant::now();
    r.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(2), "shutdown took {:?}", t.elapsed());
    assert_eq!(rec.items(), strs(&["now"]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn missing_input_fails_start_and_bad_settings_are_refused() {
    let telemetry = Arc::new(Telemetry::new());
    let h = host(vec![PathBuf::from("/nonexistent/inferwatch-replay")], StateRegistry::new());
    let mut r = receiver(&h, &telemetry, json!(null));
    let e = r.start(all_to(&Recorder::new())).await.unwrap_err();
    assert!(e.to_string().contains("/nonexistent/inferwatch-replay"), "{e}");
    assert!(ReplayReceiverFactory.validate(&json!({"speed": -2})).is_err());
    assert!(ReplayReceiverFactory.validate(&json!({"include": ["a"], "speed": 10, "batch_size": 5})).is_ok());
}

#[tokio::test]
async fn speed_paces_chunks_by_their_event_times() {
    let dir = tmpdir("speed");
    let s = 1_000_000_000u64;
    let lines: Vec<String> = (0..3).map(|i| spans_line(&[(&format!("s{i}"), 10 * s + i * s / 2)])).collect();
    write(&dir.join("x.jsonl"), &lines.join("\n"));
    let state = StateRegistry::new();
    let h = Arc::new(Host {
        state,
        run: RunValues::default().with(Arc::new(ReplayControl {
            inputs: vec![dir.clone()],
            speed: Some(5.0),
            progress: Default::default(),
        })),
        ..Default::default()
    });
    let rec = Recorder::new();
    let t = std::time::Instant::now();
    replay_all(&h, all_to(&rec), json!({"speed": 0})).await;
    // One second of data at 5x real time: at least 200 ms (the command's speed wins over the settings).
    assert!(t.elapsed() >= Duration::from_millis(200), "{:?}", t.elapsed());
    assert_eq!(rec.items(), strs(&["s0", "s1", "s2"]));
    let _ = std::fs::remove_dir_all(&dir);
}
