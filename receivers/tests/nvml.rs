//! Tests of the `nvml` receiver: golden conversions of a fake H100 in both naming modes, memory
//! creep and its peak, throttling, a device lost mid-run, the receiver without NVML on this
//! machine, and (ignored, `-- --ignored real_gpu`) the real source on a GPU.

// The request capture (tests wait on it with a deadline) is the kit's sink.
use inferwatch_core::component::{ComponentId, CreateContext, PathSeg, Receiver, ReceiverConsumers, ReceiverFactory};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::nvml::config::NvmlConfig;
use inferwatch_receivers::nvml::convert::{ConvertOptions, Converter};
use inferwatch_receivers::nvml::fake::{FakeDevice, FakeSource, Script, h100_sample};
use inferwatch_receivers::nvml::names::Naming;
use inferwatch_receivers::nvml::source::{DeviceInfo, GpuSource, XidEvent};
use inferwatch_receivers::nvml::{NvmlReceiver, NvmlReceiverFactory, SourceOpener, nvml_opener};
pub(crate) use inferwatch_testkit::harness::Sink as Capture;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, Metric, NumberDataPoint};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The sample time of the golden tests.
const T: u64 = 1_800_000_000_000_000_000;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const H100: &str = "NVIDIA H100 80GB HBM3";

// ---- helpers ------------------------------------------------------------------------------

fn dev(index: u32, uuid: &str) -> DeviceInfo {
    DeviceInfo { index, uuid: uuid.into(), name: H100.into() }
}

fn converter(naming: Naming, peak: Duration) -> Converter {
    Converter::new(ConvertOptions {
        naming,
        host: "node-1".into(),
        hostname_label: "Hostname".into(),
        peak_window: peak,
        process_metrics: true,
    })
}

fn any_json(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> Value {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyV::StringValue(s)) => json!(s),
        Some(AnyV::IntValue(i)) => json!(i),
        Some(AnyV::DoubleValue(d)) => json!(d),
        other => json!(format!("{other:?}")),
    }
}

fn attrs_json(kvs: &[KeyValue]) -> Value {
    Value::Array(kvs.iter().map(|kv| json!([kv.key, any_json(&kv.value)])).collect())
}

fn value_json(p: &NumberDataPoint) -> Value {
    match p.value {
        Some(NumV::AsInt(i)) => json!(i),
        Some(NumV::AsDouble(d)) => json!(d),
        None => Value::Null,
    }
}

/// A metric as `{name, unit, type, points: [[extra attributes, value]]}`, after checking that
/// every point starts with `base` attributes and is stamped `t`.
fn normalize(m: &Metric, base: &[KeyValue], t: u64) -> Value {
    let (kind, points): (&str, &[NumberDataPoint]) = match &m.data {
        Some(Data::Gauge(g)) => ("gauge", &g.data_points),
        Some(Data::Sum(s)) => {
            assert_eq!(s.aggregation_temporality, AggregationTemporality::Cumulative as i32, "{}", m.name);
            (if s.is_monotonic { "counter" } else { "updowncounter" }, &s.data_points)
        }
        other => panic!("{}: unexpected data {other:?}", m.name),
    };
    assert!(!m.description.is_empty(), "{} has no description", m.name);
    let pts: Vec<Value> = points
        .iter()
        .map(|p| {
            assert_eq!(&p.attributes[..base.len()], base, "{}: identity attributes", m.name);
            assert_eq!(p.time_unix_nano, t, "{}", m.name);
            json!([attrs_json(&p.attributes[base.len()..]), value_json(p)])
        })
        .collect();
    json!({"name": m.name, "unit": m.unit, "type": kind, "points": pts})
}

fn str_kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(opentelemetry_proto::tonic::common::v1::AnyValue { value: Some(AnyV::StringValue(v.into())) }),
        ..Default::default()
    }
}

fn int_kv(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(opentelemetry_proto::tonic::common::v1::AnyValue { value: Some(AnyV::IntValue(v)) }),
        ..Default::default()
    }
}

fn otel_base(uuid: &str, index: i64) -> Vec<KeyValue> {
    vec![
        str_kv("hw.id", uuid),
        str_kv("hw.type", "gpu"),
        str_kv("gpu.uuid", uuid),
        int_kv("gpu.index", index),
        str_kv("gpu.name", H100),
    ]
}

fn dcgm_base(uuid: &str, index: u32) -> Vec<KeyValue> {
    vec![
        str_kv("gpu", &index.to_string()),
        str_kv("UUID", uuid),
        str_kv("modelName", H100),
        str_kv("Hostname", "node-1"),
    ]
}

/// The metric named `name`.
fn find<'a>(ms: &'a [Metric], name: &str) -> Option<&'a Metric> {
    ms.iter().find(|m| m.name == name)
}

fn points(m: &Metric) -> &[NumberDataPoint] {
    match &m.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

fn int_of(p: &NumberDataPoint) -> i64 {
    match p.value {
        Some(NumV::AsInt(i)) => i,
        other => panic!("not an int: {other:?}"),
    }
}

fn attr<'a>(p: &'a NumberDataPoint, key: &str) -> Option<&'a AnyV> {
    p.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

// ---- golden conversions ---------------------------------------------------------------------

#[test]
fn golden_otel_naming() {
    let mut c = converter(Naming::Otel, Duration::ZERO);
    let d = dev(0, "GPU-aaaa");
    let ms = c.convert(&d, &h100_sample(), T);
    let base = otel_base("GPU-aaaa", 0);
    let got: Vec<Value> = ms.iter().map(|m| normalize(m, &base, T)).collect();
    let reasons: Vec<Value> = [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ]
    .iter()
    .map(|r| json!([[["hw.gpu.throttle.reason", r]], 0]))
    .collect();
    let expected = json!([
        {"name": "hw.gpu.memory.usage", "unit": "By", "type": "updowncounter", "points": [[[], 40 * GIB]]},
        {"name": "hw.gpu.memory.limit", "unit": "By", "type": "updowncounter", "points": [[[], 80 * GIB]]},
        {"name": "hw.gpu.memory.utilization", "unit": "1", "type": "gauge", "points": [[[], 0.5]]},
        {"name": "gpu.memory.free", "unit": "By", "type": "updowncounter", "points": [[[], 39 * GIB]]},
        {"name": "hw.gpu.utilization", "unit": "1", "type": "gauge",
            "points": [[[["hw.gpu.task", "general"]], 0.75]]},
        {"name": "gpu.memory.bandwidth.utilization", "unit": "1", "type": "gauge", "points": [[[], 0.3]]},
        {"name": "gpu.clock.frequency", "unit": "MHz", "type": "gauge",
            "points": [[[["gpu.clock.type", "sm"]], 1980], [[["gpu.clock.type", "memory"]], 2619]]},
        {"name": "hw.power", "unit": "W", "type": "gauge", "points": [[[], 350.5]]},
        {"name": "gpu.power.limit", "unit": "W", "type": "gauge", "points": [[[], 700.0]]},
        {"name": "hw.energy", "unit": "J", "type": "counter", "points": [[[], 123456.789]]},
        {"name": "hw.temperature", "unit": "Cel", "type": "gauge", "points": [[[], 54]]},
        {"name": "hw.gpu.throttle", "unit": "1", "type": "gauge", "points": reasons},
        {"name": "hw.gpu.io", "unit": "By", "type": "counter",
            "points": [[[["network.io.direction", "receive"]], 0], [[["network.io.direction", "transmit"]], 0]]},
        {"name": "hw.errors", "unit": "{error}", "type": "counter",
            "points": [[[["error.type", "corrected"]], 2], [[["error.type", "uncorrected"]], 0]]},
        {"name": "process.gpu.memory.usage", "unit": "By", "type": "updowncounter",
            "points": [[[["process.pid", 4242]], 38 * GIB]]},
    ]);
    assert_eq!(Value::Array(got), expected);

    // Cumulative sums start at the device's first sample.
    for m in &ms {
        if let Some(Data::Sum(s)) = &m.data {
            assert!(s.data_points.iter().all(|p| p.start_time_unix_nano == T), "{}", m.name);
        }
    }
    // The request: host.name on the resource, the receiver's scope.
    let req = c.request(ms);
    let rm = &req.resource_metrics[0];
    assert_eq!(rm.resource.as_ref().unwrap().attributes, vec![str_kv("host.name", "node-1")]);
    assert_eq!(rm.scope_metrics[0].scope.as_ref().unwrap().name, "inferwatch/nvml");

    // One second later at 1000 / 500 KB/s: 1,024,000 / 512,000 bytes more; XID events counted.
    c.record_xid(&[XidEvent { uuid: "GPU-aaaa".into(), xid: 79 }, XidEvent { uuid: "GPU-aaaa".into(), xid: 43 }]);
    let ms = c.convert(&d, &h100_sample(), T + 1_000_000_000);
    let io = find(&ms, "hw.gpu.io").unwrap();
    assert_eq!(points(io).iter().map(int_of).collect::<Vec<_>>(), vec![1_024_000, 512_000]);
    assert!(points(io).iter().all(|p| p.start_time_unix_nano == T));
    let errs = normalize(find(&ms, "hw.errors").unwrap(), &base, T + 1_000_000_000);
    assert_eq!(
        errs["points"],
        json!([[[["error.type", "corrected"]], 2], [[["error.type", "uncorrected"]], 0], [[["error.type", "xid"]], 2]])
    );
}

#[test]
fn golden_dcgm_naming() {
    let mut c = converter(Naming::Dcgm, Duration::ZERO);
    let d = dev(3, "GPU-bbbb");
    c.register(&d);
    c.record_xid(&[XidEvent { uuid: "GPU-bbbb".into(), xid: 48 }, XidEvent { uuid: "GPU-bbbb".into(), xid: 79 }]);
    let ms = c.convert(&d, &h100_sample(), T);
    let base = dcgm_base("GPU-bbbb", 3);
    let got: Vec<Value> = ms.iter().map(|m| normalize(m, &base, T)).collect();
    let g = |name: &str, v: Value| json!({"name": name, "unit": "", "type": "gauge", "points": [[[], v]]});
    let expected = json!([
        g("DCGM_FI_DEV_FB_USED", json!(40960)),
        g("DCGM_FI_DEV_FB_FREE", json!(39936)),
        g("DCGM_FI_DEV_FB_RESERVED", json!(1024)),
        g("DCGM_FI_DEV_FB_TOTAL", json!(81920)),
        g("DCGM_FI_DEV_GPU_UTIL", json!(75)),
        g("DCGM_FI_DEV_MEM_COPY_UTIL", json!(30)),
        g("DCGM_FI_DEV_SM_CLOCK", json!(1980)),
        g("DCGM_FI_DEV_MEM_CLOCK", json!(2619)),
        g("DCGM_FI_DEV_GPU_TEMP", json!(54)),
        g("DCGM_FI_DEV_POWER_USAGE", json!(350.5)),
        g("DCGM_FI_DEV_POWER_MGMT_LIMIT", json!(700.0)),
        g("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", json!(123456789)),
        g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", json!(0)),
        g("DCGM_FI_PROF_PCIE_TX_BYTES", json!(512000)),
        g("DCGM_FI_PROF_PCIE_RX_BYTES", json!(1024000)),
        g("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", json!(2)),
        g("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", json!(0)),
        g("DCGM_FI_DEV_XID_ERRORS", json!(79)),
        {"name": "inferwatch_gpu_process_fb_used", "unit": "", "type": "gauge",
            "points": [[[["pid", "4242"]], 38912]]},
    ]);
    assert_eq!(Value::Array(got), expected);

    // The newer dcgm-exporter label spelling.
    let mut c = Converter::new(ConvertOptions {
        naming: Naming::Dcgm,
        host: "node-1".into(),
        hostname_label: "hostname".into(),
        peak_window: Duration::ZERO,
        process_metrics: false,
    });
    let ms = c.convert(&d, &h100_sample(), T);
    assert_eq!(points(&ms[0])[0].attributes[3], str_kv("hostname", "node-1"));
    assert!(find(&ms, "inferwatch_gpu_process_fb_used").is_none(), "process_metrics: false");
    assert!(find(&ms, "DCGM_FI_DEV_XID_ERRORS").is_none(), "no XID support reported");
}

#[test]
fn missing_fields_emit_nothing_for_them() {
    let mut c = converter(Naming::Otel, Duration::ZERO);
    let s = inferwatch_receivers::nvml::source::GpuSample {
        memory_used_bytes: Some(GIB),
        memory_total_bytes: Some(4 * GIB),
        sm_clock_mhz: Some(1000),
        ..Default::default()
    };
    let ms = c.convert(&dev(0, "GPU-x"), &s, T);
    let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        ["hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.gpu.memory.utilization", "gpu.clock.frequency"]
    );
    assert_eq!(points(ms.last().unwrap()).len(), 1, "only the SM clock");
}

// ---- scripted faults --------------------------------------------------------------------------

#[test]
fn memory_creep_raises_usage_and_the_peak_follows() {
    let step = 256 * MIB;
    let mut src = FakeSource::new(vec![FakeDevice::new(
        0,
        "GPU-creep",
        H100,
        Script::MemoryCreep { base: h100_sample(), step_bytes: step },
    )]);
    let d = src.devices().unwrap().remove(0);
    let mut c = converter(Naming::Otel, Duration::from_secs(1));
    let base = 40 * GIB;
    let (mut usage, mut peaks, mut proc_peaks) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..16u64 {
        let t = T + i * 200_000_000;
        let ms = c.convert(&d, &src.sample(&d).unwrap(), t);
        usage.push(int_of(&points(find(&ms, "hw.gpu.memory.usage").unwrap())[0]));
        if let Some(p) = find(&ms, "gpu.memory.peak") {
            assert_eq!(p.unit, "By");
            peaks.push((points(p)[0].time_unix_nano, int_of(&points(p)[0])));
        }
        if let Some(p) = find(&ms, "process.gpu.memory.peak") {
            assert_eq!(attr(&points(p)[0], "process.pid"), Some(&AnyV::IntValue(4242)));
            proc_peaks.push(int_of(&points(p)[0]));
        }
    }
    assert!(usage.windows(2).all(|w| w[1] > w[0]), "usage rises monotonically: {usage:?}");
    assert_eq!(usage[15], (base + 15 * step) as i64);
    // Windows [T, T+1s), [T+1s, T+2s), [T+2s, T+3s): samples 0-4, 5-9, 10-14; each peak is the
    // highest use in its window, emitted at the window's end.
    let s = 1_000_000_000;
    let expected: Vec<(u64, i64)> = (1..=3).map(|k| (T + k * s, (base + (5 * k - 1) * step) as i64)).collect();
    assert_eq!(peaks, expected);
    let p0 = 38 * GIB;
    assert_eq!(proc_peaks, (1..=3).map(|k| (p0 + (5 * k - 1) * step) as i64).collect::<Vec<_>>());
}

#[test]
fn throttling_episode_shows_in_throttle_gauges_and_the_sm_clock() {
    let mut src = FakeSource::new(vec![FakeDevice::new(
        0,
        "GPU-hot",
        H100,
        Script::Throttling { base: h100_sample(), during: 2..4, reasons: 0x4 | 0x40, sm_clock_mhz: 1100 },
    )]);
    let d = src.devices().unwrap().remove(0);
    let mut c = converter(Naming::Otel, Duration::ZERO);
    let mut seen = Vec::new();
    for i in 0..6u64 {
        let ms = c.convert(&d, &src.sample(&d).unwrap(), T + i);
        let active: Vec<String> = points(find(&ms, "hw.gpu.throttle").unwrap())
            .iter()
            .filter(|p| int_of(p) == 1)
            .map(|p| format!("{:?}", attr(p, "hw.gpu.throttle.reason").unwrap()))
            .collect();
        let sm = int_of(&points(find(&ms, "gpu.clock.frequency").unwrap())[0]);
        seen.push((active.len(), sm));
    }
    assert_eq!(seen, vec![(0, 1980), (0, 1980), (2, 1100), (2, 1100), (0, 1980), (0, 1980)]);
}

// ---- the receiver ------------------------------------------------------------------------------

fn consumers(c: &Arc<Capture>) -> ReceiverConsumers {
    ReceiverConsumers { metrics: Some(c.clone()), ..Default::default() }
}

fn ctx(t: &Arc<Telemetry>) -> CreateContext {
    CreateContext::new(ComponentId::parse("nvml").unwrap(), t.clone())
}

fn fake_opener(src: FakeSource) -> SourceOpener {
    Arc::new(move |_: &NvmlConfig| Ok(Box::new(src.clone()) as Box<dyn GpuSource>))
}

/// Per request, the `hw.gpu.memory.usage` value of each GPU (by UUID) it holds.
fn usage_by_gpu(reqs: &[ExportMetricsServiceRequest]) -> Vec<Vec<(String, i64)>> {
    reqs.iter()
        .map(|r| {
            let ms = &r.resource_metrics[0].scope_metrics[0].metrics;
            ms.iter()
                .filter(|m| m.name == "hw.gpu.memory.usage")
                .flat_map(|m| points(m).iter())
                .map(|p| {
                    let Some(AnyV::StringValue(u)) = attr(p, "gpu.uuid") else { panic!("no gpu.uuid") };
                    (u.clone(), int_of(p))
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn device_lost_mid_run_is_counted_and_the_others_go_on() {
    let src = FakeSource::new(vec![
        FakeDevice::new(0, "GPU-a", H100, Script::MemoryCreep { base: h100_sample(), step_bytes: MIB }),
        FakeDevice::new(1, "GPU-b", H100, Script::Constant(h100_sample())).lost_during(3..6),
    ]);
    let telemetry = Arc::new(Telemetry::new());
    let cfg = NvmlConfig::from_value(&json!({"collection_interval": "10ms", "peak_window": "0"})).unwrap();
    let mut r = NvmlReceiver::new(ctx(&telemetry), cfg, fake_opener(src));
    let capture = Capture::new();
    r.start(consumers(&capture)).await.unwrap();
    let stats = r.stats();
    assert_eq!(stats.available.get(), 1);
    assert_eq!(r.devices().len(), 2);
    capture.wait_metrics("12 rounds", |reqs| reqs.len() >= 12).await;
    r.shutdown().await;

    let rounds = usage_by_gpu(&capture.metrics());
    // Round k holds GPU-a's k-th sample; GPU-b is missing from rounds 3, 4, 5 exactly.
    for (k, round) in rounds.iter().enumerate() {
        let uuids: Vec<&str> = round.iter().map(|(u, _)| u.as_str()).collect();
        let expect: &[&str] = if (3..6).contains(&k) { &["GPU-a"] } else { &["GPU-a", "GPU-b"] };
        assert_eq!(uuids, expect, "round {k}");
        assert_eq!(round[0].1, (40 * GIB + k as u64 * MIB) as i64, "GPU-a keeps creeping in round {k}");
    }
    assert_eq!(stats.sample_errors.get(), 3);
    let text = telemetry.render();
    assert!(
        text.contains(r#"inferwatch_scrape_failures_total{job="nvml",target="GPU-b",reason="gpu_lost"} 3"#),
        "{text}"
    );
    let accepted = r#"otelcol_receiver_accepted_metric_points_total{receiver="nvml",transport="nvml"} "#;
    assert!(text.contains(accepted), "{text}");
}

#[tokio::test]
async fn receiver_in_dcgm_mode_emits_dcgm_names_through_the_loop() {
    let src = FakeSource::new(vec![FakeDevice::new(0, "GPU-d", H100, Script::Constant(h100_sample()))])
        .with_xid(vec![XidEvent { uuid: "GPU-d".into(), xid: 31 }]);
    let telemetry = Arc::new(Telemetry::new());
    let cfg =
        NvmlConfig::from_value(&json!({"collection_interval": "10ms", "naming": "dcgm", "host_name": "gpu-host"}))
            .unwrap();
    let mut r = NvmlReceiver::new(ctx(&telemetry), cfg, fake_opener(src));
    let capture = Capture::new();
    r.start(consumers(&capture)).await.unwrap();
    capture.wait_metrics("2 rounds", |reqs| reqs.len() >= 2).await;
    r.shutdown().await;
    let reqs = capture.metrics();
    let ms = &reqs[0].resource_metrics[0].scope_metrics[0].metrics;
    let fb = points(find(ms, "DCGM_FI_DEV_FB_USED").unwrap());
    assert_eq!(int_of(&fb[0]), 40960);
    assert_eq!(attr(&fb[0], "Hostname"), Some(&AnyV::StringValue("gpu-host".into())));
    assert_eq!(int_of(&points(find(ms, "DCGM_FI_DEV_XID_ERRORS").unwrap())[0]), 31);
    assert!(ms.iter().all(|m| m.name.starts_with("DCGM_FI_") || m.name.starts_with("inferwatch_gpu_")));
}

#[tokio::test]
async fn without_nvml_the_receiver_starts_idle_and_says_why() {
    let telemetry = Arc::new(Telemetry::new());
    let cfg = NvmlConfig::from_value(&json!({"collection_interval": "10ms",
        "library_path": "/nonexistent/libnvidia-ml.so.1"}))
    .unwrap();
    let mut r = NvmlReceiver::new(ctx(&telemetry), cfg, nvml_opener());
    let capture = Capture::new();
    r.start(consumers(&capture)).await.expect("start succeeds without a GPU");
    let stats = r.stats();
    assert_eq!(stats.available.get(), 0);
    let reason = stats.unavailable().expect("a reason");
    assert_eq!(reason.code(), "no_library");
    let text = reason.to_string();
    assert!(text.starts_with("no NVML library: "), "{text}");
    assert!(text.contains("/nonexistent/libnvidia-ml.so.1"), "{text}");
    assert!(text.contains("set library_path"), "{text}");
    assert!(r.devices().is_empty());
    r.shutdown().await;
    assert!(capture.metrics().is_empty(), "nothing is emitted");
    assert_eq!(stats.samples.get(), 0);
}

#[tokio::test]
async fn no_matching_device_is_a_reason_too() {
    let src = FakeSource::new(vec![FakeDevice::new(0, "GPU-a", H100, Script::Constant(h100_sample()))]);
    let cfg = NvmlConfig::from_value(&json!({"devices": [5, "GPU-zzz"]})).unwrap();
    let mut r = NvmlReceiver::new(ctx(&Arc::new(Telemetry::new())), cfg, fake_opener(src));
    r.start(consumers(&Capture::new())).await.unwrap();
    let reason = r.stats().unavailable().unwrap();
    assert_eq!(reason.code(), "no_device");
    assert!(reason.to_string().contains("0 (GPU-a)"), "{reason}");
    r.shutdown().await;
}

#[test]
fn factory_validates_with_paths() {
    let f = NvmlReceiverFactory;
    assert_eq!(f.type_name(), "nvml");
    assert!(f.validate(&json!(null)).is_ok());
    let e = f.validate(&json!({"peak_window": "10ms"})).unwrap_err();
    assert_eq!(e.path, vec![PathSeg::Key("peak_window".into())]);
}

// ---- the real GPU (ignored: run on a GPU machine) ----------------------------------------------

#[tokio::test]
#[ignore = "needs an NVIDIA GPU: cargo test -p inferwatch-receivers --test nvml -- --ignored real_gpu"]
async fn real_gpu_samples_are_plausible() {
    use inferwatch_receivers::nvml::real::NvmlSource;
    let mut src = NvmlSource::open(None, true).expect("NVML with a GPU");
    let devices = src.devices().unwrap();
    assert!(!devices.is_empty());
    let mut totals = Vec::new();
    for d in &devices {
        assert!(d.uuid.starts_with("GPU-") || d.uuid.starts_with("MIG-"), "{d:?}");
        let s = src.sample(d).unwrap();
        let (used, free, total) =
            (s.memory_used_bytes.unwrap(), s.memory_free_bytes.unwrap(), s.memory_total_bytes.unwrap());
        assert!(total > GIB, "{d:?}: total {total}");
        let reserved = s.memory_reserved_bytes.unwrap_or(0);
        let sum = used + free + reserved;
        assert!(sum.abs_diff(total) <= total / 100, "{d:?}: used+free+reserved {sum} vs total {total}");
        assert!(s.gpu_utilization_pct.is_none_or(|u| u <= 100), "{s:?}");
        assert!(s.temperature_c.is_none_or(|t| (1..=120).contains(&t)), "{s:?}");
        if let (Some(p), Some(l)) = (s.power_mw, s.power_limit_mw) {
            assert!(p > 0 && p < l * 2, "{s:?}");
        }
        println!("{} {} {:?}", d.index, d.name, s);
        totals.push((d.uuid.clone(), total));
    }
    // The receiver for 2 s: memory limit equals NVML's total, utilisation in [0, 1].
    let telemetry = Arc::new(Telemetry::new());
    let cfg = NvmlConfig::from_value(&json!({"collection_interval": "200ms"})).unwrap();
    let mut r = NvmlReceiver::new(ctx(&telemetry), cfg, nvml_opener());
    let capture = Capture::new();
    r.start(consumers(&capture)).await.unwrap();
    assert_eq!(r.stats().available.get(), 1);
    capture.wait_metrics("10 rounds", |reqs| reqs.len() >= 10).await;
    r.shutdown().await;
    let reqs = capture.metrics();
    for req in reqs.iter() {
        let ms = &req.resource_metrics[0].scope_metrics[0].metrics;
        for p in points(find(ms, "hw.gpu.memory.limit").unwrap()) {
            let Some(AnyV::StringValue(u)) = attr(p, "gpu.uuid") else { panic!() };
            let total = totals.iter().find(|(x, _)| x == u).unwrap().1;
            assert_eq!(int_of(p), total as i64);
        }
        if let Some(m) = find(ms, "hw.gpu.utilization") {
            for p in points(m) {
                let Some(NumV::AsDouble(v)) = p.value else { panic!() };
                assert!((0.0..=1.0).contains(&v), "{v}");
            }
        }
    }
    assert_eq!(r.stats().sample_errors.get(), 0);
}
