//! `kv_pressure` driven through the ArrowProcessor trait with batches from `metrics::to_batch`.

use inferwatch_core::arrow::ArrowProcessorFactory;
use inferwatch_core::component::{ComponentId, CreateContext, PathSeg, ProcessorFactory};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::kv_pressure::{KvPressureFactory, STATE_VERSION};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{self, gauge, gauge_points, kv, kvs, metrics_request, point, scope, sum};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::NumberDataPoint;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
const BASE: u64 = 1_700_000_400 * S;

/// One input point: metric name, point attributes, resource attributes, offset (s), value.
#[derive(Clone, Debug)]
struct In {
    name: &'static str,
    attrs: Vec<(&'static str, &'static str)>,
    resource: Vec<(&'static str, &'static str)>,
    at: u64,
    value: f64,
}

/// A point as `llm_signals` emits it for model `model` (version v1, instance i1).
fn signal(name: &'static str, model: &'static str, at: u64, value: f64) -> In {
    In {
        name,
        attrs: vec![
            ("gen_ai.request.model", model),
            ("service.version", "v1"),
            ("service.instance.id", "i1"),
            ("source", "scrape"),
        ],
        resource: vec![("service.name", "inferwatch")],
        at,
        value,
    }
}

/// A raw scraped point of the simulator's server (model label, identity in the resource).
fn scraped(name: &'static str, extra: Vec<(&'static str, &'static str)>, at: u64, value: f64) -> In {
    let mut attrs = vec![("model_name", "m"), ("engine", "0")];
    attrs.extend(extra);
    In {
        name,
        attrs,
        resource: vec![("service.name", "vllm-server"), ("service.version", "v1"), ("service.instance.id", "i1")],
        at,
        value,
    }
}

fn request(points: &[In]) -> ExportMetricsServiceRequest {
    let resource_metrics = points
        .iter()
        .map(|p| {
            let pt = point(kvs(&p.attrs), BASE + p.at * S, p.value);
            otlp::resource_metrics(kvs(&p.resource), scope("src", ""), vec![gauge(p.name, "", vec![pt])])
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

/// One output (a score and its level joined): time, metric, score, level, attributes, resource.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    time: u64,
    metric: String,
    score: f64,
    level: f64,
    attrs: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
}

fn flatten(req: &ExportMetricsServiceRequest) -> Vec<Out> {
    let points: Vec<_> =
        gauge_points(req).into_iter().map(|p| (p.name, p.time, p.value, p.attrs, p.resource)).collect();
    // Score and level points come in two Metrics per scope, each in input order: pair them up.
    let (scores, levels): (Vec<_>, Vec<_>) = points.into_iter().partition(|p| p.0 == "llm.anomaly.score");
    assert_eq!(scores.len(), levels.len());
    assert!(levels.iter().all(|p| p.0 == "llm.anomaly.level"));
    scores
        .into_iter()
        .zip(levels)
        .map(|(s, l)| {
            assert_eq!((s.1, &s.3), (l.1, &l.3), "score and level share time and attributes");
            Out { time: s.1, metric: s.3["metric"].clone(), score: s.2, level: l.2, attrs: s.3.clone(), resource: s.4 }
        })
        .collect()
}

/// The kit's harness on this file's points.
trait KvPressure {
    fn new(cfg: serde_json::Value) -> Self;
    fn process(&mut self, points: &[In]) -> Vec<Out>;
    fn process_request(&mut self, req: &ExportMetricsServiceRequest) -> Vec<Out>;
    fn advance(&mut self, at: u64);
}

impl KvPressure for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::create(&KvPressureFactory, "kv_pressure/test", &cfg, Signal::Metrics)
    }

    fn process(&mut self, points: &[In]) -> Vec<Out> {
        self.process_request(&request(points))
    }

    fn process_request(&mut self, req: &ExportMetricsServiceRequest) -> Vec<Out> {
        let out = self.process_metrics(req);
        assert!(out.len() <= 1, "one derived batch per input batch");
        out.iter().flat_map(flatten).collect()
    }

    fn advance(&mut self, at: u64) {
        assert!(self.advance_metrics(BASE + at * S).is_empty(), "kv_pressure emits on input only");
    }
}

/// The evidence of an output: its `kv_pressure.*` attributes.
fn evidence(o: &Out) -> Vec<(String, String)> {
    o.attrs.iter().filter(|(k, _)| k.starts_with("kv_pressure.")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn ev(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs.iter().map(|(k, v)| (format!("kv_pressure.{k}"), v.to_string())).collect();
    v.sort();
    v
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// One step of a hand-made series: input, expected score, level and evidence.
type Step = (In, f64, f64, Vec<(String, String)>);

#[test]
fn kv_pressure_hand_made_series_give_exact_levels_and_evidence() {
    // No warm-up: this script checks the conditions; the warm-up has its own tests below.
    let mut h = Harness::new(json!({"warmup": "0s"}));
    // (input, expected score, level, evidence), one point per batch, in time order.
    let script: Vec<Step> = vec![
        (signal("llm.kv_cache.usage", "m", 0, 0.5), 0.0, 0.0, ev(&[("usage", "0.5"), ("flags", "")])),
        (
            signal("llm.prefix_cache.hit_rate", "m", 0, 0.7),
            0.0,
            0.0,
            ev(&[("usage", "0.5"), ("hit_rate", "0.7"), ("flags", "")]),
        ),
        (
            signal("llm.kv_cache.usage", "m", 60, 0.95),
            0.2,
            0.6,
            ev(&[("usage", "0.95"), ("hit_rate", "0.7"), ("flags", "usage_high")]),
        ),
        (
            signal("llm.preemption.rate", "m", 60, 0.5),
            0.45,
            0.85,
            ev(&[
                ("usage", "0.95"),
                ("hit_rate", "0.7"),
                ("preemption_rate", "0.5"),
                ("flags", "usage_high,preempting"),
            ]),
        ),
        (
            signal("llm.queue.p99", "m", 120, 0.9),
            0.75,
            0.9,
            ev(&[
                ("usage", "0.95"),
                ("hit_rate", "0.7"),
                ("preemption_rate", "0.5"),
                ("queue_p99_s", "0.9"),
                ("flags", "usage_high,queue_blocking,preempting"),
            ]),
        ),
        (
            signal("llm.prefix_cache.hit_rate", "m", 120, 0.5),
            0.9,
            0.95,
            ev(&[
                ("usage", "0.95"),
                ("hit_rate", "0.5"),
                ("preemption_rate", "0.5"),
                ("queue_p99_s", "0.9"),
                ("flags", "usage_high,hit_rate_low,queue_blocking,preempting"),
            ]),
        ),
        // Another model: its own group, queue blocking alone is critical.
        (signal("llm.queue.p99", "m2", 130, 1.5), 0.3, 0.8, ev(&[("queue_p99_s", "1.5"), ("flags", "queue_blocking")])),
        // 400 s later everything but this point is older than stale_after (5m).
        (signal("llm.kv_cache.usage", "m", 500, 0.5), 0.0, 0.0, ev(&[("usage", "0.5"), ("flags", "")])),
        // Preemptions without high usage: a warning only.
        (
            signal("llm.preemption.rate", "m", 510, 2.0),
            0.25,
            0.6,
            ev(&[("usage", "0.5"), ("preemption_rate", "2"), ("flags", "preempting")]),
        ),
    ];
    for (i, (input, score, level, want)) in script.into_iter().enumerate() {
        let out = h.process(std::slice::from_ref(&input));
        assert_eq!(out.len(), 1, "step {i}: one output per input point");
        let o = &out[0];
        assert_eq!(o.time, BASE + input.at * S, "step {i}: at the input's time");
        assert_eq!(o.metric, input.name);
        assert_eq!(o.attrs["detector"], "kv_pressure");
        assert_eq!(o.attrs["gen_ai.request.model"], input.attrs[0].1);
        assert_eq!(o.attrs["source"], "scrape", "the input's own attributes are kept");
        assert_eq!(o.resource["service.name"], "inferwatch", "the input's resource");
        assert!(approx(o.score, score) && approx(o.level, level), "step {i}: {o:?}, want {score} / {level}");
        assert_eq!(evidence(o), want, "step {i}");
    }
    assert_eq!(h.proc.series_count(), 2);
    // With a fixed output metric, every input of a group shares one alert identity.
    let mut fixed = Harness::new(json!({"output_metric": "llm.kv_cache.pressure"}));
    let out = fixed.process(&[signal("llm.queue.p99", "m", 0, 0.9), signal("llm.kv_cache.usage", "m", 1, 0.2)]);
    assert_eq!(out.len(), 2);
    for (o, input) in out.iter().zip(["llm.queue.p99", "llm.kv_cache.usage"]) {
        assert_eq!(
            (o.metric.as_str(), o.attrs["kv_pressure.input"].as_str(), o.level),
            ("llm.kv_cache.pressure", input, 0.8)
        );
    }
    // Other metrics and non-number points are not inputs.
    assert!(h.process(&[signal("llm.ttft.p95", "m", 520, 9.0)]).is_empty());
}

#[test]
fn kv_pressure_fragmentation_from_a_gauge_and_from_free_runs() {
    let mut h = Harness::new(json!({"kvf_metric": "sim:kv_cache_fragmentation"}));
    // The simulator's raw gauge: model from `model_name`, version and instance from the resource.
    let out = h.process(&[scraped("sim:kv_cache_fragmentation", vec![], 0, 0.7)]);
    assert_eq!(out.len(), 1);
    let o = &out[0];
    assert_eq!((o.score, o.level), (0.1, 0.6));
    assert_eq!(evidence(o), ev(&[("kvf", "0.7"), ("flags", "fragmented")]));
    for (k, v) in
        [("gen_ai.request.model", "m"), ("service.version", "v1"), ("service.instance.id", "i1"), ("model_name", "m")]
    {
        assert_eq!(o.attrs[k], v, "{k}: the group's attributes are added to the point's");
    }
    // Free runs of one pool snapshot (one point per run): 30 + 10 free, largest 30 → KVF 0.25.
    let runs = |at: u64, lens: &[f64]| -> Vec<In> {
        const IDS: [&str; 4] = ["0", "1", "2", "3"];
        lens.iter().zip(IDS).map(|(&v, id)| scraped("llm.kv_cache.free_runs", vec![("run", id)], at, v)).collect()
    };
    let out = h.process(&runs(15, &[30.0, 10.0]));
    assert_eq!(out.len(), 1, "one evaluation per snapshot, not per run: {out:?}");
    assert_eq!(out[0].metric, "llm.kv_cache.free_runs");
    assert_eq!(out[0].time, BASE + 15 * S);
    assert_eq!(out[0].level, 0.0);
    assert_eq!(
        evidence(&out[0]),
        ev(&[("kvf", "0.25"), ("free_blocks", "40"), ("largest_free_run", "30"), ("flags", "")])
    );
    assert!(!out[0].attrs.contains_key("run"), "the output carries the group, not one run");
    // Four holes of one block: KVF 0.75 → fragmented, together with high usage → 0.65.
    h.process(&[scraped("llm.kv_cache.usage", vec![], 29, 0.97)]);
    let out = h.process(&runs(30, &[1.0, 1.0, 1.0, 1.0]));
    assert!(approx(out[0].level, 0.65) && approx(out[0].score, 0.3), "{out:?}");
    assert_eq!(out[0].attrs["kv_pressure.kvf"], "0.75");
    assert_eq!(out[0].attrs["kv_pressure.flags"], "usage_high,fragmented");
}

/// Points over 12 steps for models m0..m5 (m4, m5 stop after step 3), each followed by an advance.
fn script() -> Vec<(Vec<In>, u64)> {
    const MODELS: [&str; 6] = ["m0", "m1", "m2", "m3", "m4", "m5"];
    const NAMES: [&str; 4] =
        ["llm.kv_cache.usage", "llm.preemption.rate", "llm.prefix_cache.hit_rate", "llm.queue.p99"];
    let mut steps = Vec::new();
    for step in 0..12u64 {
        let mut pts = Vec::new();
        for (k, m) in MODELS.iter().enumerate() {
            if k >= 4 && step > 3 {
                continue;
            }
            for (j, name) in NAMES.iter().enumerate() {
                let v = ((step * 7 + k as u64 * 3 + j as u64 * 5) % 11) as f64 / 10.0;
                pts.push(signal(name, m, step * 60 + j as u64, v));
            }
        }
        steps.push((pts, step * 60 + 10));
    }
    steps
}

fn run(h: &mut Harness, steps: &[(Vec<In>, u64)]) -> Vec<Out> {
    let mut out = Vec::new();
    for (pts, wm) in steps {
        out.extend(h.process(pts));
        h.advance(*wm);
    }
    out
}

#[test]
fn kv_pressure_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"max_series": 5, "idle_timeout": "2m", "stale_after": "90s"});
    let steps = script();
    let mut whole = Harness::new(cfg.clone());
    let want = run(&mut whole, &steps);
    assert!(want.len() > 150 && want.iter().any(|o| o.level >= 0.8) && want.iter().any(|o| o.level == 0.0));
    assert!(whole.evicted("max_series") > 0 && whole.evicted("idle") > 0, "the script must evict");
    for cut in [1, 4, 7] {
        let mut first = Harness::new(cfg.clone());
        let mut got = run(&mut first, &steps[..cut]);
        let bytes = first.proc.snapshot().unwrap();
        assert_eq!(first.proc.state_version(), STATE_VERSION);
        let mut second = Harness::new(cfg.clone());
        second.proc.restore(&bytes).unwrap();
        assert_eq!(second.proc.series_count(), first.proc.series_count());
        assert_eq!(second.proc.snapshot().unwrap(), bytes);
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
    }
    // A checkpoint of an earlier state version (v2: group keys model-first) is refused.
    assert_eq!(STATE_VERSION, 3);
    for v in [1, 2] {
        let old = inferwatch_core::state::seal("kv_pressure", v, &whole.proc.snapshot().unwrap());
        let msg = inferwatch_core::state::unseal("stage/kv_pressure", "kv_pressure", STATE_VERSION, &old)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&format!("state version {v}, this build reads 3")), "{msg}");
    }
    let mut fresh = Harness::new(cfg);
    assert!(matches!(fresh.proc.restore(b"not a snapshot at all"), Err(StateError::Corrupt { .. })));
    assert_eq!(fresh.proc.series_count(), 0);
}

#[test]
fn kv_pressure_config_errors_name_the_key() {
    let f = KvPressureFactory;
    assert_eq!(f.type_name(), "kv_pressure");
    assert_eq!(f.signals(), &[Signal::Metrics]);
    assert!(f.arrow().is_some());
    assert!(f.validate(&serde_json::Value::Null).is_ok(), "every key has a default");
    assert!(f.validate(&json!({"kvf_metric": "", "free_runs_metric": ""})).is_ok(), "optional inputs");
    let key = |k: &str| PathSeg::Key(k.into());
    for (cfg, path) in [
        (json!({"usage_metric": ""}), vec![key("usage_metric")]),
        (json!({"kvf_metric": "llm.queue.p99"}), vec![key("kvf_metric")]),
        (json!({"thresholds": {"usage": 1.5}}), vec![key("thresholds"), key("usage")]),
        (json!({"thresholds": {"queue_p99_s": -1.0}}), vec![key("thresholds"), key("queue_p99_s")]),
        (json!({"thresholds": {"queue": 1.0}}), vec![key("thresholds"), key("queue")]),
        (json!({"stale_after": "0s"}), vec![key("stale_after")]),
        (json!({"max_series": 0}), vec![key("max_series")]),
        (json!({"usage": "x"}), vec![key("usage")]),
        (json!({"warmup": "10"}), vec![key("warmup")]),
        (json!({"reset_metrics": ["a", ""]}), vec![key("reset_metrics"), PathSeg::Index(1)]),
        (json!({"reset_metrics": ["llm.kv_cache.usage"]}), vec![key("reset_metrics"), PathSeg::Index(0)]),
    ] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path, path, "{cfg}: {}", e.message);
    }
    let ctx = CreateContext::new(ComponentId::parse("kv_pressure").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create_arrow(ctx, &json!({}), Signal::Logs).is_err());
}

/// The signals of one scrape window of group m at `at`: usage 0.5, hit rate `hit`, queue p99 `queue`.
fn window(at: u64, hit: f64, queue: f64) -> Vec<In> {
    vec![
        signal("llm.kv_cache.usage", "m", at, 0.5),
        signal("llm.prefix_cache.hit_rate", "m", at, hit),
        signal("llm.queue.p99", "m", at, queue),
    ]
}

/// Windows every 15 s over [from, to) s with hit rate `hit` and queue p99 0.1 s.
fn windows(h: &mut Harness, from: u64, to: u64, hit: f64) -> Vec<Out> {
    (from..to).step_by(15).flat_map(|t| h.process(&window(t, hit, 0.1))).collect()
}

/// The highest level of `out` and whether any output flags a low hit rate.
fn worst(out: &[Out]) -> (f64, bool) {
    let level = out.iter().map(|o| o.level).fold(0.0, f64::max);
    (level, out.iter().any(|o| o.attrs["kv_pressure.flags"].contains("hit_rate_low")))
}

#[test]
fn kv_pressure_cold_prefix_cache_is_not_flagged_during_the_warm_up() {
    let mut h = Harness::new(json!({}));
    // A cold start: the hit rate is 0.3 (< 0.62) for the first 5 minutes.
    let cold = windows(&mut h, 0, 300, 0.3);
    assert_eq!(cold.len(), 60);
    assert_eq!(worst(&cold), (0.0, false), "no warning during the warm-up");
    let hit_rate_point = &cold[1];
    assert_eq!(hit_rate_point.metric, "llm.prefix_cache.hit_rate");
    assert_eq!(hit_rate_point.attrs["kv_pressure.warmup_left_s"], "600", "the warm-up is in the evidence");
    assert_eq!(cold[59].attrs["kv_pressure.warmup_left_s"], "315");
    // Still low after the warm-up (10m from the first point), but this cache never hit: a workload
    // without shared prefixes is not under pressure, so no warning.
    let later = windows(&mut h, 300, 660, 0.3);
    assert!(later.iter().all(|o| o.level == 0.0), "a cache that never hit is not flagged");
    // Once it has hit (0.8 for a minute), a drop to 0.3 after the warm-up is a warning, as before.
    windows(&mut h, 660, 720, 0.8);
    // (A window's points before its hit-rate point still see the previous hit rate.)
    let dropped: Vec<Out> =
        windows(&mut h, 720, 780, 0.3).into_iter().filter(|o| o.attrs["kv_pressure.hit_rate"] == "0.3").collect();
    assert!(dropped.len() >= 8, "{dropped:?}");
    assert!(dropped.iter().all(|o| o.attrs["kv_pressure.flags"] == "hit_rate_low"));
    // The warning goes on the hit rate's own output; usage and queue (conditions not met) read 0.
    let want = |o: &Out| if o.metric == "llm.prefix_cache.hit_rate" { 0.6 } else { 0.0 };
    assert!(dropped.iter().all(|o| o.level == want(o)), "{:?}", dropped[0]);
    assert_eq!(dropped.iter().filter(|o| o.level == 0.6).count(), 4, "one hit-rate point per window");
    assert!(!dropped[0].attrs.contains_key("kv_pressure.warmup_left_s"));
    // `warmup: 0s` flags a drop from the first point after a hit; a shorter warm-up ends earlier.
    let mut none = Harness::new(json!({"warmup": "0s"}));
    windows(&mut none, 0, 5, 0.8);
    assert_eq!(worst(&windows(&mut none, 5, 60, 0.3)), (0.6, true));
    let mut short = Harness::new(json!({"warmup": "1m"}));
    windows(&mut short, 0, 5, 0.8);
    let out = windows(&mut short, 5, 120, 0.3);
    let hit = |o: &&Out| o.metric == "llm.prefix_cache.hit_rate";
    assert!(out.iter().filter(hit).all(|o| (o.level == 0.6) == (o.time >= BASE + 60 * S)));
    assert!(out.iter().filter(|o| !hit(o)).all(|o| o.level == 0.0), "usage and queue meet no condition");
}

/// One 1-minute window of group m as `llm_signals` emits it, in its output order: queue p99,
/// usage, preemption rate, hit rate.
fn scrape_window(at: u64, queue: f64, usage: f64, preemption: f64, hit: f64) -> Vec<In> {
    vec![
        signal("llm.queue.p99", "m", at, queue),
        signal("llm.kv_cache.usage", "m", at, usage),
        signal("llm.preemption.rate", "m", at, preemption),
        signal("llm.prefix_cache.hit_rate", "m", at, hit),
    ]
}

/// The level of each output, keyed by its input metric.
fn levels(out: &[Out]) -> BTreeMap<String, f64> {
    out.iter().map(|o| (o.metric.clone(), o.level)).collect()
}

#[test]
fn kv_pressure_level_goes_only_on_the_inputs_whose_condition_is_met() {
    // batch_saturation_strong, onset − 96 min: a load burst fills the 256 sequence slots and the
    // queue p99 reads 2.45 s while the KV cache is 17 % used, nothing is preempted and the prefix
    // cache hits. Before, all four outputs carried 0.8 and the alerts connector (one alert per
    // (detector, metric, group)) raised four criticals for one queue condition.
    let mut h = Harness::new(json!({}));
    for t in (0..660).step_by(60) {
        assert!(h.process(&scrape_window(t, 0.03, 0.15, 0.0, 0.9)).iter().all(|o| o.level == 0.0));
    }
    let out = h.process(&scrape_window(660, 2.45, 0.17, 0.0, 0.9));
    assert_eq!(out.len(), 4);
    let want: BTreeMap<String, f64> = [
        ("llm.queue.p99", 0.8),
        ("llm.kv_cache.usage", 0.0),
        ("llm.preemption.rate", 0.0),
        ("llm.prefix_cache.hit_rate", 0.0),
    ]
    .into_iter()
    .map(|(m, l)| (m.to_string(), l))
    .collect();
    assert_eq!(levels(&out), want, "one critical, on the queue p99");
    // Score and evidence stay the group's: every output says what the group meets.
    assert!(out.iter().all(|o| approx(o.score, 0.3) && o.attrs["kv_pressure.flags"] == "queue_blocking"));
    // Preemptions while usage is high: on those two inputs, not on queue and hit rate. (The usage
    // point precedes the preemption point: it still sees no preemption, a warning.)
    let out = h.process(&scrape_window(720, 0.03, 0.95, 0.5, 0.9));
    let l = levels(&out);
    assert!(approx(l["llm.kv_cache.usage"], 0.6) && approx(l["llm.preemption.rate"], 0.85), "{l:?}");
    assert_eq!((l["llm.queue.p99"], l["llm.prefix_cache.hit_rate"]), (0.0, 0.0));
    // Everything at once: every input takes part, all carry the group's level (the points before
    // the hit-rate point still see the previous hit rate: three conditions, 0.9).
    let l = levels(&h.process(&scrape_window(780, 2.0, 0.95, 0.5, 0.3)));
    assert!(l.values().all(|&v| v >= 0.9 - 1e-12) && approx(l["llm.prefix_cache.hit_rate"], 0.95), "{l:?}");
    // With a fixed output metric the group is one alert: every output carries the group's level.
    let mut fixed = Harness::new(json!({"output_metric": "llm.kv_cache.pressure"}));
    for t in (0..660).step_by(60) {
        fixed.process(&scrape_window(t, 0.03, 0.15, 0.0, 0.9));
    }
    let out = fixed.process(&scrape_window(660, 2.45, 0.17, 0.0, 0.9));
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|o| o.metric == "llm.kv_cache.pressure" && o.level == 0.8), "{out:?}");
}

#[test]
fn kv_pressure_queue_blocking_is_critical_during_the_warm_up() {
    let mut h = Harness::new(json!({}));
    windows(&mut h, 0, 60, 0.3);
    // A real fault right after start: the queue p99 is 2 s at 60 s.
    let out = h.process(&window(60, 0.3, 2.0));
    let (level, low) = worst(&out);
    assert!((level - 0.8).abs() < 1e-12 && !low, "{out:?}");
    assert_eq!(out[2].attrs["kv_pressure.flags"], "queue_blocking");
}

#[test]
fn kv_pressure_warm_up_restarts_after_a_gap() {
    let mut h = Harness::new(json!({}));
    // Warm for 20 minutes with a good hit rate, then a low one: a warning.
    assert_eq!(worst(&windows(&mut h, 0, 1200, 0.8)), (0.0, false));
    assert_eq!(worst(&windows(&mut h, 1200, 1230, 0.3)), (0.6, true));
    // No point for 3 minutes (> restart_gap 2m): a restart. The cold cache is not flagged for 10 minutes.
    let after = windows(&mut h, 1410, 2010, 0.3);
    assert_eq!(worst(&after), (0.0, false));
    assert_eq!(after[1].attrs["kv_pressure.warmup_left_s"], "600");
    assert_eq!(worst(&windows(&mut h, 2010, 2040, 0.3)), (0.6, true), "10 minutes after the restart");
    // A gap of exactly restart_gap (1185 → 1305 s) is no restart.
    let mut h = Harness::new(json!({}));
    windows(&mut h, 0, 1200, 0.8);
    assert_eq!(worst(&windows(&mut h, 1305, 1335, 0.3)), (0.6, true));
    let mut h = Harness::new(json!({}));
    windows(&mut h, 0, 1200, 0.8);
    assert_eq!(worst(&windows(&mut h, 1320, 1350, 0.3)), (0.0, false), "1185 → 1320 s is 135 s > 2m");
    let mut h = Harness::new(json!({"restart_gap": "5m"}));
    windows(&mut h, 0, 1200, 0.8);
    assert_eq!(worst(&windows(&mut h, 1320, 1350, 0.3)), (0.6, true), "135 s < 5m: no restart");
    let mut h = Harness::new(json!({"restart_gap": "0s"}));
    windows(&mut h, 0, 1200, 0.8);
    assert_eq!(worst(&windows(&mut h, 3000, 3030, 0.3)), (0.6, true), "restart_gap 0s: gaps never restart");
}

/// A cumulative counter point of group m (as `llm_signals` labels it) with a start time.
fn counter(name: &str, at: u64, start: u64, value: f64) -> ExportMetricsServiceRequest {
    let s = signal("llm.kv_cache.usage", "m", at, value);
    let pt = NumberDataPoint { start_time_unix_nano: BASE + start * S, ..point(kvs(&s.attrs), BASE + at * S, value) };
    metrics_request(vec![kv("service.name", "vllm")], None, vec![sum(name, "", vec![pt], true)])
}

#[test]
fn kv_pressure_warm_up_restarts_after_a_counter_reset() {
    const Q: &str = "vllm:prefix_cache_queries_total";
    for (name, drop) in [("value drop", true), ("later start time", false)] {
        let mut h = Harness::new(json!({}));
        let mut out = Vec::new();
        let mut queries = 0.0;
        // Points every 15 s without a gap; the counter grows 100 per scrape and restarts at 1800 s.
        for t in (0..2400).step_by(15) {
            let (start, value) = if t < 1800 {
                queries += 100.0;
                (0, queries)
            } else if drop {
                (0, (t - 1785) as f64)
            } else {
                (1790, queries + (t - 1785) as f64)
            };
            assert!(h.process_request(&counter(Q, t, start, value)).is_empty(), "counters emit nothing");
            let hit = if (1200..1230).contains(&t) || t >= 1800 { 0.3 } else { 0.8 };
            out.push((t, h.process(&window(t, hit, 0.1))));
        }
        let at = |from: u64, to: u64| -> Vec<Out> {
            out.iter().filter(|(t, _)| (from..to).contains(t)).flat_map(|(_, o)| o.clone()).collect()
        };
        assert_eq!(worst(&at(1200, 1230)), (0.6, true), "{name}: low before the reset is flagged");
        assert_eq!(worst(&at(1800, 2100)), (0.0, false), "{name}: 5 minutes after the reset");
        assert_eq!(worst(&at(2100, 2400)), (0.0, false), "{name}: still warming up");
        assert_eq!(h.proc.series_count(), 1, "{name}: the counter joins the signals' group");
    }
    // The counter is only read under `reset_metrics`.
    let mut h = Harness::new(json!({"reset_metrics": []}));
    for t in (0..1800).step_by(15) {
        h.process_request(&counter(Q, t, 0, if t < 1500 { 1000.0 + t as f64 } else { 1.0 }));
        let out = h.process(&window(t, if t >= 1500 { 0.3 } else { 0.8 }, 0.1));
        assert_eq!(out[1].level == 0.6, t >= 1500, "at {t}");
    }
}
