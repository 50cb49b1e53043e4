//! `window_stats` driven directly through the ArrowProcessor trait with batches from `metrics::to_batch`.

use arrow_array::{Array, RecordBatch, UInt64Array};
use inferwatch_core::arrow::{ArrowProcessorFactory, metrics, schema};
use inferwatch_core::component::{ComponentId, CreateContext, PathSeg, ProcessorFactory};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::window_stats::WindowStatsFactory;
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{gauge, histogram, kv, metrics_request, point, scope, sum};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{HistogramDataPoint, NumberDataPoint, metric, number_data_point};
use serde_json::json;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
/// A window boundary (a multiple of 60 s) in 2023.
const BASE: u64 = 1_699_999_980 * S;

/// One input point: metric, point attribute `model`, offset from BASE (s), value.
#[derive(Clone, Copy)]
struct In(&'static str, &'static str, f64, f64);

fn number_point(model: &str, at_s: f64, v: f64) -> NumberDataPoint {
    point(vec![kv("model", model)], BASE + (at_s * S as f64) as u64, v)
}

/// A request with one resource (service `svc`, host `h1`), one scope, and one metric per point
/// (`tpot` points are sums, `hist` a histogram, everything else gauges).
fn request(points: &[In]) -> ExportMetricsServiceRequest {
    let metrics = points
        .iter()
        .map(|&In(name, model, at, v)| match name {
            "tpot" => sum(name, "s", vec![number_point(model, at, v)], false),
            "hist" => histogram(
                name,
                "s",
                vec![HistogramDataPoint {
                    attributes: vec![kv("model", model)],
                    time_unix_nano: BASE + (at * S as f64) as u64,
                    count: 1,
                    sum: Some(v),
                    ..Default::default()
                }],
            ),
            _ => gauge(name, "s", vec![number_point(model, at, v)]),
        })
        .collect();
    metrics_request(vec![kv("host.name", "h1"), kv("service.name", "svc")], scope("test.scope", "1"), metrics)
}

fn batch(points: &[In]) -> RecordBatch {
    metrics::to_batch(&request(points)).unwrap()
}

/// The series id the converter gives a point of `metric` with `model`.
fn series_id(metric: &'static str, model: &'static str) -> u64 {
    let b = batch(&[In(metric, model, 0.0, 1.0)]);
    b.column_by_name(schema::SERIES_ID).unwrap().as_any().downcast_ref::<UInt64Array>().unwrap().value(0)
}

/// The kit's harness on this file's points.
trait WindowStats {
    fn new(cfg: serde_json::Value) -> Self;
    fn process(&mut self, points: &[In]);
    fn advance(&mut self, at_s: u64) -> Vec<Out>;
}

impl WindowStats for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::create(&WindowStatsFactory, "window_stats/test", &cfg, Signal::Metrics)
    }

    fn process(&mut self, points: &[In]) {
        assert!(self.process_batch(&batch(points)).is_empty(), "window_stats emits only on advance");
    }

    /// Advances to BASE + `at_s` and returns the emitted points.
    fn advance(&mut self, at_s: u64) -> Vec<Out> {
        self.advance_one(BASE + at_s * S).iter().flat_map(flatten).collect()
    }
}

#[derive(Debug, Clone, PartialEq)]
enum V {
    I(i64),
    D(f64),
}

/// One derived point with everything it carries.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    resource: Vec<(String, String)>,
    scope: (String, String),
    name: String,
    unit: String,
    attrs: Vec<(String, String)>,
    start: u64,
    time: u64,
    value: V,
}

fn pairs(kvs: &[KeyValue]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = kvs
        .iter()
        .map(|kv| {
            let s = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), s)
        })
        .collect();
    v.sort();
    v
}

fn flatten(req: &ExportMetricsServiceRequest) -> Vec<Out> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let resource = pairs(&rm.resource.as_ref().unwrap().attributes);
        for sm in &rm.scope_metrics {
            let scope = sm.scope.as_ref().map(|s| (s.name.clone(), s.version.clone())).unwrap();
            for m in &sm.metrics {
                let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{} is not a gauge", m.name) };
                for p in &g.data_points {
                    let value = match p.value {
                        Some(number_data_point::Value::AsInt(i)) => V::I(i),
                        Some(number_data_point::Value::AsDouble(d)) => V::D(d),
                        None => panic!("no value"),
                    };
                    out.push(Out {
                        resource: resource.clone(),
                        scope: scope.clone(),
                        name: m.name.clone(),
                        unit: m.unit.clone(),
                        attrs: pairs(&p.attributes),
                        start: p.start_time_unix_nano,
                        time: p.time_unix_nano,
                        value,
                    });
                }
            }
        }
    }
    out
}

/// The points a window should give: (stat, unit, value) for count, min, max, mean, p50, p95, p99.
fn expected(metric: &str, model: &str, window: u64, stats: [(&str, V); 7]) -> Vec<Out> {
    stats
        .into_iter()
        .map(|(stat, value)| Out {
            resource: vec![("host.name".into(), "h1".into()), ("service.name".into(), "svc".into())],
            scope: ("test.scope".into(), "1".into()),
            name: format!("{metric}.window.{stat}"),
            unit: if stat == "count" { "{point}".into() } else { "s".into() },
            attrs: vec![("model".into(), model.into())],
            start: BASE + window * 60 * S,
            time: BASE + (window + 1) * 60 * S,
            value,
        })
        .collect()
}

/// Asserts equality, with percentiles (p*) allowed a relative error of α = 0.01.
fn assert_points(got: &[Out], want: &[Out]) {
    assert_eq!(got.len(), want.len(), "got {got:#?}\nwant {want:#?}");
    for (g, w) in got.iter().zip(want) {
        if w.name.rsplit('.').next().is_some_and(|s| s.starts_with('p')) {
            let (V::D(gv), V::D(wv)) = (&g.value, &w.value) else { panic!("{g:?} vs {w:?}") };
            assert!(((gv - wv) / wv).abs() <= 0.01 + 1e-12, "{}: {gv} vs {wv}", w.name);
            assert_eq!(Out { value: w.value.clone(), ..g.clone() }, *w);
        } else {
            assert_eq!(g, w);
        }
    }
}

#[test]
fn window_stats_two_series_two_windows_exact_output() {
    let mut h = Harness::new(json!({"window": "1m"}));
    // ttft (gauge) model a: window 0 = [1, 2, 3, 4], window 1 = [10]
    // tpot (sum)   model b: window 0 = [5],          window 1 = [9, 7]
    // a histogram is not a number point and is skipped.
    h.process(&[
        In("ttft", "a", 1.0, 3.0),
        In("ttft", "a", 2.0, 1.0),
        In("tpot", "b", 3.0, 5.0),
        In("hist", "a", 4.0, 100.0),
        In("ttft", "a", 61.0, 10.0),
    ]);
    h.process(&[In("ttft", "a", 30.0, 4.0), In("ttft", "a", 59.9, 2.0), In("tpot", "b", 119.0, 9.0)]);
    h.process(&[In("tpot", "b", 60.0, 7.0)]);
    assert_eq!(h.proc.series_count(), 2);

    assert!(h.advance(59).is_empty(), "window 0 ends at 60s");
    let w0 = h.advance(60);
    let a0 = expected(
        "ttft",
        "a",
        0,
        [
            ("count", V::I(4)),
            ("min", V::D(1.0)),
            ("max", V::D(4.0)),
            ("mean", V::D(2.5)),
            ("p50", V::D(2.0)),
            ("p95", V::D(3.0)),
            ("p99", V::D(3.0)),
        ],
    );
    let b0 = expected(
        "tpot",
        "b",
        0,
        [
            ("count", V::I(1)),
            ("min", V::D(5.0)),
            ("max", V::D(5.0)),
            ("mean", V::D(5.0)),
            ("p50", V::D(5.0)),
            ("p95", V::D(5.0)),
            ("p99", V::D(5.0)),
        ],
    );
    let a_first = series_id("ttft", "a") < series_id("tpot", "b");
    let want0: Vec<Out> = if a_first { [a0, b0].concat() } else { [b0, a0].concat() };
    assert_points(&w0, &want0);

    assert!(h.advance(119).is_empty(), "window 1 ends at 120s");
    let w1 = h.advance(120);
    let a1 = expected(
        "ttft",
        "a",
        1,
        [
            ("count", V::I(1)),
            ("min", V::D(10.0)),
            ("max", V::D(10.0)),
            ("mean", V::D(10.0)),
            ("p50", V::D(10.0)),
            ("p95", V::D(10.0)),
            ("p99", V::D(10.0)),
        ],
    );
    let b1 = expected(
        "tpot",
        "b",
        1,
        [
            ("count", V::I(2)),
            ("min", V::D(7.0)),
            ("max", V::D(9.0)),
            ("mean", V::D(8.0)),
            ("p50", V::D(7.0)),
            ("p95", V::D(7.0)),
            ("p99", V::D(7.0)),
        ],
    );
    let want1: Vec<Out> = if a_first { [a1, b1].concat() } else { [b1, a1].concat() };
    assert_points(&w1, &want1);
    assert!(h.advance(600).is_empty());
}

#[test]
fn window_stats_windows_stay_open_until_the_watermark_passes_their_end() {
    let mut h = Harness::new(json!({"window": "10s", "stats": ["count"], "allowed_lateness": "30s"}));
    assert_eq!(h.proc.allowed_lateness_ns(), 30 * S);
    h.process(&[In("ttft", "a", 5.0, 1.0), In("ttft", "a", 25.0, 1.0)]);
    assert!(h.advance(9).is_empty());
    // A late but allowed point joins window [0, 10s), still open.
    h.process(&[In("ttft", "a", 9.5, 1.0)]);
    let out = h.advance(10);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].start, out[0].time, &out[0].value), (BASE, BASE + 10 * S, &V::I(2)));
    // Behind the watermark now: ignored, and window [0, 10s) is not reopened.
    h.process(&[In("ttft", "a", 9.9, 1.0), In("ttft", "a", 29.0, 1.0)]);
    assert!(h.advance(29).is_empty());
    let out = h.advance(30);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].start, out[0].time, &out[0].value), (BASE + 20 * S, BASE + 30 * S, &V::I(2)));
    // An older watermark changes nothing.
    assert!(h.advance(5).is_empty());
}

#[test]
fn window_stats_metrics_filter_selects_by_exact_name() {
    let mut h = Harness::new(json!({"metrics": ["ttft"], "stats": ["max"]}));
    h.process(&[In("ttft", "a", 1.0, 2.0), In("tpot", "a", 1.0, 3.0), In("ttft_x", "a", 1.0, 4.0)]);
    assert_eq!(h.proc.series_count(), 1);
    let out = h.advance(60);
    assert_eq!(
        out.iter().map(|o| (o.name.as_str(), o.value.clone())).collect::<Vec<_>>(),
        [("ttft.window.max", V::D(2.0))]
    );
}

const MODELS: [&str; 12] = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10", "m11"];

#[test]
fn window_stats_max_series_evicts_least_recently_seen_and_counts() {
    let mut h = Harness::new(json!({"max_series": 10, "stats": ["count"]}));
    for m in &MODELS[..10] {
        h.process(&[In("ttft", m, 1.0, 1.0)]);
    }
    h.process(&[In("ttft", "m0", 2.0, 1.0)]); // m0 seen again: m1 is now the least recent
    assert_eq!(h.evicted("max_series"), 0);
    h.process(&[In("ttft", "m10", 3.0, 1.0)]);
    assert_eq!(h.evicted("max_series"), 1);
    assert_eq!(h.proc.series_count(), 10);
    let mut models: Vec<String> = h.advance(60).into_iter().map(|o| o.attrs[0].1.clone()).collect();
    models.sort();
    let mut want: Vec<String> = MODELS[..11].iter().filter(|m| **m != "m1").map(|m| m.to_string()).collect();
    want.sort();
    assert_eq!(models, want, "m1's window is dropped, nothing emitted for it");
    assert_eq!(h.evicted("idle"), 0);
}

#[test]
fn window_stats_idle_series_are_evicted_after_their_windows_and_counted() {
    let mut h = Harness::new(json!({"idle_timeout": "2m", "stats": ["count"]}));
    h.process(&[In("ttft", "a", 1.0, 1.0), In("ttft", "b", 1.0, 1.0), In("ttft", "b", 170.0, 1.0)]);
    assert_eq!(h.advance(60).len(), 2);
    assert_eq!(h.proc.series_count(), 2);
    assert!(h.advance(120).is_empty());
    assert_eq!((h.proc.series_count(), h.evicted("idle")), (2, 0), "a's last point + 2m = 121s");
    assert!(h.advance(121).is_empty());
    assert_eq!((h.proc.series_count(), h.evicted("idle")), (1, 1));
    let out = h.advance(180);
    assert_eq!(out.len(), 1, "b's window [120s, 180s) is still emitted");
    assert_eq!(out[0].attrs[0].1, "b");
    assert!(h.advance(289).is_empty());
    assert_eq!(h.proc.series_count(), 1);
    assert!(h.advance(290).is_empty());
    assert_eq!((h.proc.series_count(), h.evicted("idle")), (0, 2));
    assert_eq!(h.evicted("max_series"), 0);
}

/// A run: batches of points, each followed by an advance to the given offset.
fn script() -> Vec<(Vec<In>, u64)> {
    let mut steps = Vec::new();
    for step in 0..12u64 {
        let mut pts = Vec::new();
        for (k, m) in MODELS.iter().enumerate() {
            // Models 8.. stop after step 4 (idle later); before that 24 series exceed max_series 20.
            if !(step + k as u64).is_multiple_of(3) && (k < 8 || step < 4) {
                let at = (step * 25 + k as u64) as f64 + 0.5;
                pts.push(In("ttft", m, at, (step * 7 + k as u64 * 3) as f64 % 11.0 + 0.1));
                pts.push(In("tpot", m, at + 3.0, -(k as f64) - 0.25));
            }
        }
        steps.push((pts, step * 25 + 5));
    }
    steps
}

fn run(h: &mut Harness, steps: &[(Vec<In>, u64)]) -> Vec<Out> {
    let mut out = Vec::new();
    for (pts, wm) in steps {
        h.process(pts);
        out.extend(h.advance(*wm));
    }
    out
}

#[test]
fn window_stats_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"window": "30s", "max_series": 20, "idle_timeout": "40s", "allowed_lateness": "10s"});
    let steps = script();
    let mut whole = Harness::new(cfg.clone());
    let want = run(&mut whole, &steps);
    assert!(want.len() > 300, "the script must produce output ({})", want.len());
    assert!(whole.evicted("max_series") > 0 && whole.evicted("idle") > 0, "the script must evict");

    for cut in [1, 5, 8] {
        let mut first = Harness::new(cfg.clone());
        let mut got = run(&mut first, &steps[..cut]);
        assert_eq!(first.proc.state_version(), 2, "version 2: the detector kit's series map");
        let mut second = first.restore_into(Harness::new(cfg.clone()));
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
        assert_eq!(
            first.evicted("max_series") + second.evicted("max_series"),
            whole.evicted("max_series"),
            "cut after step {cut}"
        );
        assert_eq!(first.evicted("idle") + second.evicted("idle"), whole.evicted("idle"));
    }
}

#[test]
fn window_stats_corrupt_snapshot_is_refused() {
    let mut h = Harness::new(json!({}));
    h.process(&[In("ttft", "a", 1.0, 1.0)]);
    let bytes = h.proc.snapshot().unwrap();
    let mut fresh = Harness::new(json!({}));
    for bad in [&b"not a snapshot"[..], &bytes[..bytes.len() - 3]] {
        assert!(matches!(fresh.proc.restore(bad), Err(StateError::Corrupt { .. })));
    }
    assert_eq!(fresh.proc.series_count(), 0, "a refused restore leaves the state as it was");
}

#[test]
fn window_stats_factory_and_config_errors() {
    let f = WindowStatsFactory;
    assert_eq!(f.type_name(), "window_stats");
    assert_eq!(f.signals(), &[Signal::Metrics]);
    assert!(f.arrow().is_some());
    assert!(f.validate(&serde_json::Value::Null).is_ok());
    let key = |k: &str| PathSeg::Key(k.into());
    for (cfg, path) in [
        (json!({"window": "0s"}), vec![key("window")]),
        (json!({"window": "soon"}), vec![key("window")]),
        (json!({"relative_accuracy": 1.0}), vec![key("relative_accuracy")]),
        (json!({"relative_accuracy": 0.0}), vec![key("relative_accuracy")]),
        (json!({"max_series": 0}), vec![key("max_series")]),
        (json!({"stats": ["count", "p42"]}), vec![key("stats"), PathSeg::Index(1)]),
        (json!({"stats": []}), vec![key("stats")]),
        (json!({"idle_timeout": "-1s"}), vec![key("idle_timeout")]),
    ] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path, path, "{cfg}: {}", e.message);
    }
    let e = f.validate(&json!({"windw": "1m"})).unwrap_err();
    assert!(e.message.contains("windw"), "{}", e.message);
    let ctx = CreateContext::new(ComponentId::parse("window_stats").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create_arrow(ctx, &json!({}), Signal::Traces).is_err());
}

#[test]
fn window_stats_skips_derived_window_metrics_unless_listed() {
    // A second window_stats in the same stage sees the first one's output.
    let mut all = Harness::new(json!({"stats": ["count"]}));
    all.process(&[
        In("ttft.window.p99", "a", 1.0, 2.0),
        In("ttft.window.count", "a", 1.0, 3.0),
        In("x.window", "a", 1.0, 1.0),
    ]);
    let names: Vec<String> = all.advance(60).into_iter().map(|o| o.name).collect();
    assert_eq!(names, ["x.window.window.count"]);
    let mut listed = Harness::new(json!({"stats": ["max"], "metrics": ["ttft.window.p99"]}));
    listed.process(&[In("ttft.window.p99", "a", 1.0, 2.0)]);
    let names: Vec<String> = listed.advance(60).into_iter().map(|o| o.name).collect();
    assert_eq!(names, ["ttft.window.p99.window.max"]);
}
