//! The Arrow stage with a recording fake processor: late rows excluded and counted, input passed
//! on unchanged, watermark-driven advance, and checkpoints refused when they do not fit.

use async_trait::async_trait;
use inferwatch_core::arrow::stage::{ArrowStage, StageContext};
use inferwatch_core::arrow::{ArrowProcessor, ConvError, Needs, RecordBatch, time_column};
use inferwatch_core::component::{ComponentId, Node};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::host::Host;
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::state::{StateError, Store};
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
};
use parking_lot::Mutex;
use std::sync::Arc;

const S: u64 = 1_000_000_000;

#[derive(Default)]
struct Seen {
    times: Vec<u64>,
    advanced: Vec<u64>,
}

struct Fake {
    seen: Arc<Mutex<Seen>>,
    lateness: u64,
    version: u32,
}

impl ArrowProcessor for Fake {
    fn needs(&self) -> Needs {
        Needs { signal: Signal::Metrics, columns: vec!["time_unix_nano"] }
    }
    fn allowed_lateness_ns(&self) -> u64 {
        self.lateness
    }
    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let t = time_column(batch)?;
        self.seen.lock().times.extend(t.values().iter().map(|v| *v as u64));
        Ok(())
    }
    fn advance(&mut self, wm: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        self.seen.lock().advanced.push(wm);
        Ok(())
    }
    fn state_version(&self) -> u32 {
        self.version
    }
    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        Ok((self.seen.lock().times.len() as u64).to_le_bytes().to_vec())
    }
    fn restore(&mut self, _bytes: &[u8]) -> Result<(), StateError> {
        Ok(())
    }
    fn series_count(&self) -> usize {
        0
    }
}

struct Sink(Mutex<Vec<Payload>>);

#[async_trait]
impl Consumer for Sink {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.lock().push(data);
        Ok(())
    }
}

fn gauge(times_s: &[u64]) -> Payload {
    let points = times_s
        .iter()
        .map(|t| NumberDataPoint {
            time_unix_nano: t * S,
            value: Some(number_data_point::Value::AsDouble(*t as f64)),
            ..Default::default()
        })
        .collect();
    Payload::Metrics(ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "g".into(),
                    data: Some(Data::Gauge(Gauge { data_points: points })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    })
}

fn stage(
    host: Arc<Host>,
    telemetry: Arc<Telemetry>,
    procs: Vec<(&str, Fake)>,
    sink: Arc<Sink>,
) -> Result<Arc<ArrowStage>, inferwatch_core::component::ComponentError> {
    let list = procs
        .into_iter()
        .map(|(id, f)| (ComponentId::parse(id).unwrap(), Box::new(f) as Box<dyn ArrowProcessor>))
        .collect();
    ArrowStage::build(StageContext { pipeline: "metrics".into(), telemetry, host }, list, Signal::Metrics, sink)
}

#[tokio::test]
async fn late_rows_are_excluded_counted_and_still_passed_on() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let telemetry = Arc::new(Telemetry::new());
    let sink = Arc::new(Sink(Mutex::new(Vec::new())));
    let st = stage(
        Host::new(),
        telemetry.clone(),
        vec![("fake", Fake { seen: seen.clone(), lateness: 2 * S, version: 1 })],
        sink.clone(),
    )
    .unwrap();
    st.consume(gauge(&[10, 20])).await.unwrap(); // watermark 18 s
    st.consume(gauge(&[5, 17, 19, 30])).await.unwrap(); // 5 and 17 late; watermark 28 s
    st.consume(gauge(&[28, 27])).await.unwrap(); // 28 on time, 27 late
    assert_eq!(seen.lock().times, vec![10 * S, 20 * S, 19 * S, 30 * S, 28 * S]);
    assert_eq!(seen.lock().advanced, vec![18 * S, 28 * S]);
    assert_eq!(st.watermark(), 28 * S);
    let text = telemetry.render();
    assert!(text.contains("inferwatch_arrow_late_items_total{pipeline=\"metrics\"} 3"), "{text}");
    assert!(
        text.contains("inferwatch_arrow_conversions_total{component=\"stage metrics/fake\",data_type=\"metrics\"} 3")
    );
    // The input went on unchanged, late rows included.
    let got = sink.0.lock().clone();
    assert_eq!(got, vec![gauge(&[10, 20]), gauge(&[5, 17, 19, 30]), gauge(&[28, 27])]);
    // End of input moves the watermark to the end of time.
    st.end_of_input().await;
    assert_eq!(seen.lock().advanced.last(), Some(&u64::MAX));
}

#[tokio::test]
async fn checkpoint_of_another_version_or_processor_list_is_refused() {
    let dir = std::env::temp_dir().join(format!("iw-stage-ck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sink = Arc::new(Sink(Mutex::new(Vec::new())));
    let fake = |v| Fake { seen: Arc::default(), lateness: 0, version: v };
    {
        let host = Host::new();
        let st = stage(host.clone(), Arc::new(Telemetry::new()), vec![("fake", fake(1))], sink.clone()).unwrap();
        host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap();
        st.consume(gauge(&[1, 2, 3])).await.unwrap();
        assert_eq!(host.state.checkpoint().await.unwrap(), 1);
    }
    // Same processors, same version: restored.
    {
        let host = Host::new();
        let st = stage(host.clone(), Arc::new(Telemetry::new()), vec![("fake", fake(1))], sink.clone()).unwrap();
        assert_eq!(host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap(), 1);
        assert_eq!(st.watermark(), 3 * S);
    }
    // A new state version of the processor: refused, naming both versions.
    {
        let host = Host::new();
        let _st = stage(host.clone(), Arc::new(Telemetry::new()), vec![("fake", fake(2))], sink.clone()).unwrap();
        let e = host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap_err().to_string();
        assert!(e.contains("state version 1, this build reads 2"), "{e}");
    }
    // A different processor list under the same key cannot happen (the key names the list); a
    // stage with another list has another key and starts fresh.
    {
        let host = Host::new();
        let st = stage(host.clone(), Arc::new(Telemetry::new()), vec![("fake/b", fake(1))], sink.clone()).unwrap();
        assert_eq!(host.state.attach(Arc::new(Store::open(&dir).unwrap())).unwrap(), 0);
        assert_eq!(st.watermark(), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
