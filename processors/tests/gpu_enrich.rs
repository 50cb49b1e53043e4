//! `gpu_enrich`: the as-of join against a brute-force scan (proptest), sharing between pipeline
//! instances, unmatched counting, GPU-set resolution, and memory creep moving the joined VRAM.

use inferwatch_core::component::{ComponentId, CreateContext, ProcessorFactory};
use inferwatch_core::consumer::ConsumerRef;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::gpu_enrich::{GpuEnrich, GpuEnrichFactory};
use inferwatch_testkit::attrs::{bool_attr, f64_attr, int_attr};
use inferwatch_testkit::harness::Sink;
use inferwatch_testkit::otlp::{int_kv as i, kv as s};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use proptest::prelude::*;
use serde_json::json;
use std::sync::Arc;

const MS: u64 = 1_000_000;
const BASE: u64 = 1_700_000_000_000 * MS;
/// Time unit of the generated data: 100 ms.
const TICK: u64 = 100 * MS;

/// One gauge point in its own resource.
fn point(name: &str, ts: u64, value: f64, attrs: Vec<KeyValue>, resource: Vec<KeyValue>) -> ResourceMetrics {
    ResourceMetrics {
        resource: Some(Resource { attributes: resource, ..Default::default() }),
        scope_metrics: vec![ScopeMetrics {
            metrics: vec![Metric {
                name: name.into(),
                data: Some(metric::Data::Gauge(Gauge {
                    data_points: vec![NumberDataPoint {
                        attributes: attrs,
                        time_unix_nano: ts,
                        value: Some(number_data_point::Value::AsDouble(value)),
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn metrics(rms: Vec<ResourceMetrics>) -> Payload {
    Payload::Metrics(ExportMetricsServiceRequest { resource_metrics: rms })
}

/// Spans ending at `ends`, under a resource with `resource` attributes.
fn spans(ends: &[u64], resource: Vec<KeyValue>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: resource, ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                spans: ends
                    .iter()
                    .map(|&e| Span {
                        name: "llm_request".into(),
                        start_time_unix_nano: e.saturating_sub(500 * MS),
                        end_time_unix_nano: e,
                        attributes: vec![s("gen_ai.request.model", "m")],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn span_attrs(p: &Payload) -> Vec<Vec<KeyValue>> {
    let Payload::Traces(r) = p else { panic!("not traces: {p:?}") };
    r.resource_spans
        .iter()
        .flat_map(|rs| rs.scope_spans.iter())
        .flat_map(|ss| ss.spans.iter())
        .map(|s| s.attributes.clone())
        .collect()
}

fn ctx(name: &str) -> CreateContext {
    CreateContext::new(ComponentId::parse(name).unwrap(), Arc::new(Telemetry::new()))
}

fn build(ctx: &CreateContext, cfg: serde_json::Value, signal: Signal, cvd: Option<&str>) -> Arc<GpuEnrich> {
    let next: ConsumerRef = Sink::new();
    GpuEnrich::build(ctx, &cfg, signal, next, cvd).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Property test: the join equals a brute-force scan.

/// A generated GPU sample.
#[derive(Debug, Clone)]
struct Sample {
    /// None = no host.name (the agent's host, "a").
    host: Option<&'static str>,
    gpu: i64,
    /// 0 memory, 1 utilisation, 2 power, 3 throttle flag, 4 throttle bitmask.
    kind: usize,
    tick: u64,
    value: f64,
}

const HOSTS: [Option<&str>; 3] = [None, Some("a"), Some("b")];
const TOL_TICKS: u64 = 20; // tolerance 2s

fn sample_strategy() -> impl Strategy<Value = Sample> {
    (0..3usize, 0..3i64, 0..5usize, 1..120u64, 0..1000u32).prop_map(|(h, gpu, kind, tick, v)| {
        let value = match kind {
            0 => f64::from(v) * 1_048_576.0,
            1 => f64::from(v) / 1000.0,
            2 => f64::from(v) / 4.0,
            3 => f64::from(v % 2),
            _ => f64::from([0x1u32, 0x4, 0x10, 0x40, 0x0][v as usize % 5]),
        };
        Sample { host: HOSTS[h], gpu, kind, tick, value }
    })
}

fn sample_payload(batch: &[Sample]) -> Payload {
    const NAMES: [&str; 5] =
        ["hw.gpu.memory.usage", "hw.gpu.utilization", "hw.power", "hw.gpu.throttle", "nvml.clock_event_reasons"];
    let rms = batch
        .iter()
        .map(|x| {
            let mut attrs = vec![i("gpu.index", x.gpu), s("gpu.uuid", &format!("GPU-{}", x.gpu))];
            if x.kind == 3 {
                attrs.push(s("hw.gpu.throttle.reason", if x.gpu % 2 == 0 { "power" } else { "thermal" }));
            }
            // Host as a resource attribute on some, a point attribute on others.
            let res = match x.host {
                Some(h) if x.tick % 2 == 0 => vec![s("host.name", h)],
                Some(h) => {
                    attrs.push(s("host.name", h));
                    vec![]
                }
                None => vec![s("service.instance.id", "i1")],
            };
            point(NAMES[x.kind], BASE + x.tick * TICK, x.value, attrs, res)
        })
        .collect();
    metrics(rms)
}

#[derive(Debug, Clone, PartialEq)]
struct Expect {
    memory: Option<i64>,
    util: Option<f64>,
    power: Option<f64>,
    throttled: Option<bool>,
    count: i64,
}

/// Scans every sample: per GPU and measurement, the latest with ts ≤ t and t − ts ≤ tolerance
/// (on equal timestamps the later arrival, or for throttle any set).
fn brute(samples: &[Sample], host: &str, gpus: Option<&[i64]>, t_tick: u64) -> Option<Expect> {
    let host_of = |x: &Sample| x.host.unwrap_or("a");
    let mut seen: Vec<i64> = samples.iter().filter(|x| host_of(x) == host).map(|x| x.gpu).collect();
    seen.sort_unstable();
    seen.dedup();
    let selected: Vec<i64> = seen.into_iter().filter(|g| gpus.is_none_or(|set| set.contains(g))).collect();
    let (mut mem, mut util, mut power, mut thr, mut count) = (None::<f64>, vec![], None::<f64>, None::<bool>, 0);
    for g in selected {
        let mut any = false;
        for field in 0..4 {
            let mut best: Option<(u64, f64)> = None;
            for x in samples.iter().filter(|x| host_of(x) == host && x.gpu == g) {
                let xf = if x.kind == 4 { 3 } else { x.kind };
                if xf != field || x.tick > t_tick || t_tick - x.tick > TOL_TICKS {
                    continue;
                }
                let v = match x.kind {
                    3 => f64::from(x.value != 0.0),
                    4 => f64::from((x.value as u64) & 0xEC != 0),
                    _ => x.value,
                };
                best = match best {
                    Some((bt, bv)) if bt > x.tick => Some((bt, bv)),
                    Some((bt, bv)) if bt == x.tick && field == 3 => Some((bt, bv.max(v))),
                    _ => Some((x.tick, v)),
                };
            }
            let Some((_, v)) = best else { continue };
            any = true;
            match field {
                0 => mem = Some(mem.unwrap_or(0.0) + v),
                1 => util.push(v),
                2 => power = Some(power.unwrap_or(0.0) + v),
                _ => thr = Some(thr.unwrap_or(false) || v > 0.0),
            }
        }
        count += i64::from(any);
    }
    (count > 0).then(|| Expect {
        memory: mem.map(|m| m.round() as i64),
        util: (!util.is_empty()).then(|| util.iter().sum::<f64>() / util.len() as f64),
        power,
        throttled: thr,
        count,
    })
}

fn got(attrs: &[KeyValue]) -> Option<Expect> {
    let count = int_attr(attrs, "gpu.count")?;
    Some(Expect {
        memory: int_attr(attrs, "gpu.memory.used"),
        util: f64_attr(attrs, "gpu.utilization"),
        power: f64_attr(attrs, "gpu.power"),
        throttled: bool_attr(attrs, "gpu.throttled"),
        count,
    })
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(1.0),
        (None, None) => true,
        _ => false,
    }
}

/// An item: a span end time, either anywhere or pinned to a sample's tolerance edge.
fn item_strategy() -> impl Strategy<Value = (usize, u64, i8)> {
    (0..3usize, 0..150u64, -1i8..=2)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn join_equals_brute_force(
        samples in prop::collection::vec(sample_strategy(), 0..80),
        items in prop::collection::vec(item_strategy(), 1..40),
        chunk in 1..8usize,
        fixed in any::<bool>(),
    ) {
        let cfg = if fixed { json!({"host_name": "a", "gpus": [0, "GPU-2"]}) } else { json!({"host_name": "a"}) };
        let c = ctx("gpu_enrich");
        let m = build(&c, cfg.clone(), Signal::Metrics, None);
        let t = build(&c, cfg, Signal::Traces, None);
        for batch in samples.chunks(chunk) {
            let input = sample_payload(batch);
            prop_assert_eq!(m.process(input.clone()), input, "GPU samples pass through unchanged");
        }
        let mut expected_unmatched = 0;
        for (h, tick, edge) in items {
            // edge -1: anywhere; 0..=2: a sample's tick + tolerance - 1 + edge (inside, on, past the edge).
            let t_tick = match (edge, samples.get(tick as usize % samples.len().max(1))) {
                (e, Some(x)) if e >= 0 => x.tick + TOL_TICKS + e as u64 - 1,
                _ => tick,
            };
            let ts = BASE + t_tick * TICK;
            let (res, host) = match HOSTS[h] {
                Some(name) => (vec![s("host.name", name)], name),
                None => (vec![s("service.name", "vllm")], "a"),
            };
            let out = t.process(Payload::Traces(spans(&[ts], res)));
            let attrs = span_attrs(&out);
            let gpus: &[i64] = &[0, 2];
            let want = brute(&samples, host, fixed.then_some(gpus), t_tick);
            let have = got(&attrs[0]);
            if want.is_none() {
                expected_unmatched += 1;
                prop_assert_eq!(attrs[0].len(), 1, "unmatched spans pass unchanged");
            }
            match (&want, &have) {
                (Some(w), Some(g)) => {
                    prop_assert_eq!((w.memory, w.throttled, w.count), (g.memory, g.throttled, g.count));
                    prop_assert!(close(w.util, g.util) && close(w.power, g.power), "{:?} vs {:?}", w, g);
                }
                _ => prop_assert_eq!(want, have, "at tick {}", t_tick),
            }
        }
        prop_assert_eq!(t.shared().counts.unmatched(Signal::Traces), expected_unmatched);
    }
}

// ---------------------------------------------------------------------------------------------

fn mem_sample(ts: u64, gpu: i64, bytes: f64) -> ResourceMetrics {
    point("hw.gpu.memory.usage", ts, bytes, vec![i("gpu.index", gpu), s("host.name", "node1")], vec![])
}

#[tokio::test]
async fn spans_are_enriched_from_samples_of_the_metrics_pipeline_instance() {
    let f = GpuEnrichFactory;
    let c = ctx("gpu_enrich");
    let (mout, tout) = (Sink::new(), Sink::new());
    let cfg = json!({"host_name": "node1"});
    let m = f.create(c.clone(), &cfg, Signal::Metrics, mout.clone()).unwrap();
    let t = f.create(c.clone(), &cfg, Signal::Traces, tout.clone()).unwrap();
    // The same id in another graph (another host) has its own store.
    let other = ctx("gpu_enrich");
    let t2out = Sink::new();
    let t2 = f.create(other, &cfg, Signal::Traces, t2out.clone()).unwrap();

    let samples =
        metrics(vec![mem_sample(BASE, 0, 1e9), mem_sample(BASE, 1, 2e9), mem_sample(BASE + 1000 * MS, 0, 3e9)]);
    m.consume(samples.clone()).await.unwrap();
    assert_eq!(mout.payloads().as_slice(), &[samples]);
    t.consume(Payload::Traces(spans(&[BASE + 500 * MS, BASE + 1500 * MS], vec![]))).await.unwrap();
    let out = span_attrs(&tout.payloads()[0]);
    assert_eq!(int_attr(&out[0], "gpu.memory.used"), Some(3_000_000_000), "GPU 0 at 0 s + GPU 1 at 0 s");
    assert_eq!(int_attr(&out[1], "gpu.memory.used"), Some(5_000_000_000), "GPU 0 at 1 s + GPU 1 at 0 s");
    assert_eq!(int_attr(&out[1], "gpu.count"), Some(2));
    t2.consume(Payload::Traces(spans(&[BASE + 500 * MS], vec![]))).await.unwrap();
    assert_eq!(int_attr(&span_attrs(&t2out.payloads()[0])[0], "gpu.count"), None);
    assert!(f.create(c, &cfg, Signal::Logs, Sink::new()).is_err());
}

#[test]
fn unmatched_items_pass_unchanged_and_are_counted() {
    let c = ctx("gpu_enrich/u");
    let m = build(&c, json!({"host_name": "node1", "tolerance": "1s"}), Signal::Metrics, None);
    let t = build(&c, json!({"host_name": "node1", "tolerance": "1s"}), Signal::Traces, None);
    let before = Payload::Traces(spans(&[BASE], vec![]));
    assert_eq!(t.process(before.clone()), before, "before any sample");
    m.process(metrics(vec![mem_sample(BASE + 10_000 * MS, 0, 1e9)]));
    let input = Payload::Traces(spans(
        &[BASE + 9_999 * MS, BASE + 10_000 * MS, BASE + 11_000 * MS, BASE + 11_001 * MS],
        vec![],
    ));
    let out = span_attrs(&t.process(input));
    let joined: Vec<Option<i64>> = out.iter().map(|a| int_attr(a, "gpu.memory.used")).collect();
    assert_eq!(joined, vec![None, Some(1_000_000_000), Some(1_000_000_000), None], "before, at, edge, past");
    let counts = &t.shared().counts;
    assert_eq!((counts.unmatched(Signal::Traces), counts.matched(Signal::Traces)), (3, 2));
    // Another host's spans do not see node1's GPUs.
    let far = span_attrs(&t.process(Payload::Traces(spans(&[BASE + 10_000 * MS], vec![s("host.name", "node2")]))));
    assert_eq!(int_attr(&far[0], "gpu.count"), None);
    assert_eq!(counts.unmatched(Signal::Traces), 4);
}

/// Memory of GPUs 0..4 (g × 1 GB) and a pid on each, on host node1 at BASE.
fn four_gpus() -> Payload {
    let mut rms: Vec<ResourceMetrics> = (0..4)
        .map(|g| {
            point(
                "hw.gpu.memory.usage",
                BASE,
                (g + 1) as f64 * 1e9,
                vec![i("gpu.index", g), s("gpu.uuid", &format!("GPU-{g}aaa")), s("host.name", "node1")],
                vec![],
            )
        })
        .collect();
    for (g, pid) in [(0, 7), (2, 4242), (3, 4242)] {
        rms.push(point(
            "process.gpu.memory.usage",
            BASE,
            1e8,
            vec![i("process.pid", pid), s("process.executable.name", if pid == 7 { "python" } else { "vllm" })],
            vec![i("gpu.index", g), s("gpu.uuid", &format!("GPU-{g}aaa")), s("host.name", "node1")],
        ));
    }
    metrics(rms)
}

fn joined(cfg: serde_json::Value, cvd: Option<&str>) -> (Option<i64>, Option<i64>) {
    let c = ctx("gpu_enrich/set");
    let m = build(&c, cfg.clone(), Signal::Metrics, cvd);
    let t = build(&c, cfg, Signal::Traces, cvd);
    m.process(four_gpus());
    let out = span_attrs(&t.process(Payload::Traces(spans(&[BASE + 100 * MS], vec![s("host.name", "node1")]))));
    (int_attr(&out[0], "gpu.memory.used"), int_attr(&out[0], "gpu.count"))
}

#[test]
fn gpu_set_from_config_cuda_visible_devices_process_list_or_all() {
    let gb = 1_000_000_000;
    assert_eq!(joined(json!({}), None), (Some(10 * gb), Some(4)), "no hint: every GPU of the host");
    assert_eq!(joined(json!({}), Some("1")), (Some(2 * gb), Some(1)), "CUDA_VISIBLE_DEVICES=1");
    assert_eq!(joined(json!({}), Some("GPU-3a,0")), (Some(5 * gb), Some(2)), "UUID prefix and index");
    assert_eq!(joined(json!({"gpus": [2]}), Some("1")), (Some(3 * gb), Some(1)), "config wins over the env");
    assert_eq!(joined(json!({"server_pid": 4242}), None), (Some(7 * gb), Some(2)), "process list: GPUs 2 and 3");
    assert_eq!(joined(json!({"server_process": "python"}), None), (Some(gb), Some(1)), "process list by name");
    assert_eq!(joined(json!({"server_pid": 4242}), Some("0")), (Some(gb), Some(1)), "env before process list");
    assert_eq!(joined(json!({"server_pid": 1}), None), (Some(10 * gb), Some(4)), "pid never seen: every GPU");
    assert_eq!(joined(json!({}), Some("7")), (None, None), "a GPU the host does not have: unmatched");
}

/// `llm_signals` output points (as that connector shapes them) for `llm.ttft.p95` and `llm.kv_cache.usage`.
fn signal_points(ts: u64) -> Vec<ResourceMetrics> {
    ["llm.ttft.p95", "llm.kv_cache.usage"]
        .into_iter()
        .map(|name| {
            point(
                name,
                ts,
                0.25,
                vec![s("gen_ai.request.model", "m"), s("service.instance.id", "i1"), s("source", "spans")],
                vec![s("service.name", "inferwatch")],
            )
        })
        .collect()
}

#[test]
fn memory_creep_moves_joined_vram_on_llm_signals_points_monotonically() {
    // Simulator-shaped samples: no host, no GPU attributes (the agent's host, GPU 0), 1 s apart,
    // memory creeping 40 MiB/s with a 200 ms sawtooth of noise that never undoes the creep.
    let c = ctx("gpu_enrich/creep");
    let cfg = json!({"metrics": ["llm.ttft.*"]});
    let m = build(&c, cfg, Signal::Metrics, None);
    let sim = |ts: u64, v: f64| {
        point(
            "hw.gpu.memory.usage",
            ts,
            v,
            vec![s("hw.id", "gpu-0"), s("hw.type", "gpu")],
            vec![s("service.instance.id", "i1")],
        )
    };
    let mut joined = Vec::new();
    for sec in 0..300u64 {
        let v = 20e9 + sec as f64 * 40.0 * 1_048_576.0 + (sec % 3) as f64 * 1e6;
        let mut rms = vec![sim(BASE + sec * 1000 * MS, v)];
        if sec % 15 == 14 {
            rms.extend(signal_points(BASE + sec * 1000 * MS + 400 * MS));
        }
        let out = m.process(metrics(rms.clone()));
        let Payload::Metrics(req) = out else { panic!() };
        assert_eq!(req.resource_metrics[0], rms[0], "the sample itself is unchanged");
        for rm in &req.resource_metrics[1..] {
            let mm = &rm.scope_metrics[0].metrics[0];
            let Some(metric::Data::Gauge(g)) = &mm.data else { panic!() };
            let a = &g.data_points[0].attributes;
            if mm.name == "llm.ttft.p95" {
                assert_eq!(int_attr(a, "gpu.memory.used"), Some(v.round() as i64), "the sample of the same second");
                joined.push(int_attr(a, "gpu.memory.used").unwrap());
            } else {
                assert_eq!(int_attr(a, "gpu.memory.used"), None, "llm.kv_cache.usage is not in `metrics`");
            }
        }
    }
    assert_eq!(joined.len(), 20);
    assert!(joined.windows(2).all(|w| w[1] > w[0]), "{joined:?}");
    assert!(joined[19] - joined[0] > 10_000_000_000, "creep of ~11 GiB over the run");
}

#[test]
fn encoded_payloads_are_enriched_or_passed_as_they_came() {
    let c = ctx("gpu_enrich/enc");
    let m = build(&c, json!({"host_name": "node1"}), Signal::Metrics, None);
    let t = build(&c, json!({"host_name": "node1"}), Signal::Traces, None);
    let enc_samples = Payload::Encoded(Encoded::from_decoded(&metrics(vec![mem_sample(BASE, 0, 5e9)])));
    assert_eq!(m.process(enc_samples.clone()), enc_samples, "nothing enriched: still encoded");
    let before = Payload::Encoded(Encoded::from_decoded(&Payload::Traces(spans(&[BASE - 1], vec![]))));
    assert_eq!(t.process(before.clone()), before);
    let enc = Payload::Encoded(Encoded::from_decoded(&Payload::Traces(spans(&[BASE + 1], vec![]))));
    let out = t.process(enc);
    assert_eq!(int_attr(&span_attrs(&out)[0], "gpu.memory.used"), Some(5_000_000_000));
}

#[test]
fn throttle_from_reason_flags_or_bitmask() {
    let c = ctx("gpu_enrich/thr");
    let cfg = json!({"host_name": "node1"});
    let m = build(&c, cfg.clone(), Signal::Metrics, None);
    let t = build(&c, cfg, Signal::Traces, None);
    let flag = |ts: u64, reason: &str, v: f64| {
        point("hw.gpu.throttle", ts, v, vec![i("gpu.index", 0), s("hw.gpu.throttle.reason", reason)], vec![])
    };
    let mask = |ts: u64, v: f64| point("nvml.clock_event_reasons", ts, v, vec![i("gpu.index", 0)], vec![]);
    // At 0 s: power 1, thermal 0 (any set); at 1 s: both 0; at 2 s: idle bit only; at 3 s: SW power cap bit.
    m.process(metrics(vec![
        flag(BASE, "power", 1.0),
        flag(BASE, "thermal", 0.0),
        flag(BASE + 1000 * MS, "power", 0.0),
        flag(BASE + 1000 * MS, "thermal", 0.0),
        mask(BASE + 2000 * MS, 1.0),
        mask(BASE + 3000 * MS, 4.0),
    ]));
    let ends: Vec<u64> = (0..4).map(|k| BASE + k * 1000 * MS + 10 * MS).collect();
    let out = span_attrs(&t.process(Payload::Traces(spans(&ends, vec![]))));
    let got: Vec<Option<bool>> = out.iter().map(|a| bool_attr(a, "gpu.throttled")).collect();
    assert_eq!(got, vec![Some(true), Some(false), Some(false), Some(true)]);
}
