//! `coupled_model` driven through the ArrowProcessor trait with batches from `metrics::to_batch`:
//! convergence on synthetic data of known coefficients, attribution of latency rises, missing and
//! invalid inputs, checkpoint continuity, configuration errors.

use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory};
use inferwatch_core::component::{ComponentId, CreateContext, PathSeg, ProcessorFactory};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::coupled_model::{CoupledModel, CoupledModelFactory, STATE_VERSION, Skipped};
use inferwatch_testkit::harness as kit;
use inferwatch_testkit::otlp::{self, GaugePoint, gauge, gauge_points, kv, kvs, point, scope};
use inferwatch_testkit::rng::SplitMix64 as Rng;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use serde_json::json;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
const MIN: u64 = 60 * S;
const BASE: u64 = 1_700_000_040 * S - (1_700_000_040 * S) % MIN;

const LAT: &str = "llm.e2e.p95";
const TPS: &str = "llm.tokens.output.rate";
const TTFT: &str = "llm.ttft.p95";
const QUAL: &str = "llm.quality";

/// One input point: metric, model, offset from BASE (ns), value.
#[derive(Clone, Debug)]
struct In {
    name: &'static str,
    model: &'static str,
    at: u64,
    value: f64,
}

fn request(points: &[In]) -> ExportMetricsServiceRequest {
    let resource_metrics = points
        .iter()
        .map(|p| {
            let attrs = kvs(&[
                ("gen_ai.request.model", p.model),
                ("service.version", "v1"),
                ("service.instance.id", "i1"),
                ("source", "spans"),
            ]);
            let g = gauge(p.name, "", vec![point(attrs, BASE + p.at, p.value)]);
            otlp::resource_metrics(vec![kv("service.name", "inferwatch")], scope("llm_signals", ""), vec![g])
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

/// One output point: gauge name, time, value, attributes (as text), resource attributes.
type Out = GaugePoint;

type Harness = kit::Harness<CoupledModel>;

/// The kit's harness on this file's points.
trait Coupled {
    fn new(cfg: serde_json::Value) -> Self;
    fn process(&mut self, points: &[In]);
    fn advance(&mut self, at: u64) -> Vec<Out>;
    fn run(&mut self, buckets: &[Vec<In>], chunk: usize) -> Vec<Out>;
}

impl Coupled for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::build("coupled_model/test", |ctx| Box::new(CoupledModel::new(ctx, &cfg).unwrap()))
    }

    fn process(&mut self, points: &[In]) {
        let out = self.process_metrics(&request(points));
        assert!(out.is_empty(), "coupled_model emits when buckets close, not on input");
    }

    fn advance(&mut self, at: u64) -> Vec<Out> {
        self.advance_one(BASE + at).iter().flat_map(gauge_points).collect()
    }

    /// Feeds `buckets` (one Vec of points per minute, in order) in batches of `chunk` minutes,
    /// advancing the watermark to the end of each chunk.
    fn run(&mut self, buckets: &[Vec<In>], chunk: usize) -> Vec<Out> {
        let mut out = Vec::new();
        for (i, part) in buckets.chunks(chunk).enumerate() {
            let pts: Vec<In> = part.iter().flatten().cloned().collect();
            self.process(&pts);
            let end = pts.iter().map(|p| p.at / MIN + 1).max().unwrap_or(((i + 1) * chunk) as u64);
            out.extend(self.advance(end * MIN));
        }
        out
    }
}

/// The true model of the synthetic data.
#[derive(Clone, Copy)]
struct Truth {
    alpha: f64,
    beta: f64,
    gamma: f64,
    c: f64,
    noise: f64,
}

const TRUTH: Truth = Truth { alpha: 1.2, beta: 0.8, gamma: 0.5, c: 0.3, noise: 0.002 };

impl Truth {
    fn latency(&self, t: f64, f: f64, q: f64, r: &mut Rng) -> f64 {
        self.c + self.alpha / t + self.beta * f + self.gamma * (1.0 - q) + self.noise * r.normal()
    }
}

/// The points of minute `m` of `model`: T, F, Q at 10, 20, 30 s and L at 40 s (so the output's
/// time is minute m + 40 s).
fn minute(model: &'static str, m: u64, t: f64, f: f64, q: Option<f64>, l: f64) -> Vec<In> {
    let mut v = vec![
        In { name: TPS, model, at: m * MIN + 10 * S, value: t },
        In { name: TTFT, model, at: m * MIN + 20 * S, value: f },
        In { name: LAT, model, at: m * MIN + 40 * S, value: l },
    ];
    if let Some(q) = q {
        v.push(In { name: QUAL, model, at: m * MIN + 30 * S, value: q });
    }
    v
}

/// `n` minutes of random T ∈ [0.5, 4], F ∈ [0.1, 1.5], Q ∈ [0.5, 1] and L from `truth`.
fn synthetic(model: &'static str, from: u64, n: u64, quality: bool, truth: Truth, r: &mut Rng) -> Vec<Vec<In>> {
    (from..from + n)
        .map(|m| {
            let (t, f, q) = (r.range(0.5, 4.0), r.range(0.1, 1.5), r.range(0.5, 1.0));
            let q_in = quality.then_some(q);
            minute(model, m, t, f, q_in, truth.latency(t, f, q_in.unwrap_or(1.0), r))
        })
        .collect()
}

fn last<'a>(out: &'a [Out], name: &str) -> &'a Out {
    out.iter().rev().find(|o| o.name == name).unwrap_or_else(|| panic!("no {name}"))
}

fn scores(out: &[Out]) -> Vec<&Out> {
    out.iter().filter(|o| o.name == "llm.anomaly.level").collect()
}

#[test]
fn coupled_model_converges_to_the_true_coefficients() {
    let mut h = Harness::new(json!({"quality_metric": QUAL}));
    let mut r = Rng(7);
    let out = h.run(&synthetic("m", 0, 1500, true, TRUTH, &mut r), 100);
    for (name, want) in
        [("llm.coupled.alpha", TRUTH.alpha), ("llm.coupled.beta", TRUTH.beta), ("llm.coupled.gamma", TRUTH.gamma)]
    {
        let got = last(&out, name).value;
        assert!((got - want).abs() <= 0.02 * want, "{name}: {got} vs {want}");
    }
    let r2 = last(&out, "llm.coupled.r2").value;
    assert!(r2 > 0.95 && r2 <= 1.0, "R² {r2}");
    // Every minute gives α, β, γ and (from the second) R²; scores start after min_updates = 30.
    assert_eq!(out.iter().filter(|o| o.name == "llm.coupled.alpha").count(), 1500);
    assert_eq!(out.iter().filter(|o| o.name == "llm.coupled.r2").count(), 1499);
    let levels = scores(&out);
    assert_eq!(levels.len(), 1500 - 30);
    assert_eq!(levels[0].time, BASE + 30 * MIN + 40 * S, "first score on the 31st minute, at the latency's time");
    assert_eq!(levels[0].attrs["coupled.updates"], "30");
    // On healthy data the level stays low: at most a handful of 3σ excursions.
    assert!(levels.iter().filter(|o| o.value > 0.0).count() < 15);
    assert!(levels.iter().all(|o| o.value < 0.6), "no warning on healthy data");
    let a = last(&out, "llm.coupled.alpha");
    assert_eq!(a.time, BASE + 1499 * MIN + 40 * S);
    assert_eq!(a.resource["service.name"], "inferwatch");
    let group: Vec<(&str, &str)> = a.attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(group, vec![("gen_ai.request.model", "m"), ("service.instance.id", "i1"), ("service.version", "v1")]);
    let s = levels.last().unwrap();
    assert_eq!((s.attrs["detector"].as_str(), s.attrs["metric"].as_str()), ("coupled_model", LAT));
    assert_eq!(h.proc.skipped(), Skipped::default());
}

#[test]
fn coupled_model_without_quality_fits_two_terms_and_an_intercept() {
    let mut h = Harness::new(json!({}));
    let mut r = Rng(11);
    let truth = Truth { gamma: 0.0, ..TRUTH };
    let out = h.run(&synthetic("m", 0, 800, false, truth, &mut r), 200);
    assert!(out.iter().all(|o| o.name != "llm.coupled.gamma"), "γ is not fitted without a quality metric");
    assert!((last(&out, "llm.coupled.alpha").value - truth.alpha).abs() <= 0.02 * truth.alpha);
    assert!((last(&out, "llm.coupled.beta").value - truth.beta).abs() <= 0.02 * truth.beta);
    let s = scores(&out).pop().unwrap().clone();
    assert!(s.attrs.contains_key("coupled.contribution.ttft") && !s.attrs.contains_key("coupled.contribution.quality"));
    assert!(!s.attrs.contains_key("coupled.quality"));
}

/// A processor trained on 400 healthy minutes, restored from its snapshot (a branch point).
fn trained(cfg: &serde_json::Value) -> (Vec<u8>, Rng) {
    let mut h = Harness::new(cfg.clone());
    let mut r = Rng(3);
    let out = h.run(&synthetic("m", 0, 400, true, TRUTH, &mut r), 100);
    assert!(scores(&out).iter().rev().take(50).all(|o| o.value < 0.6));
    (h.proc.snapshot().unwrap(), r)
}

fn branch(cfg: &serde_json::Value, bytes: &[u8]) -> Harness {
    let mut h = Harness::new(cfg.clone());
    h.proc.restore(bytes).unwrap();
    h
}

#[test]
fn coupled_model_attributes_latency_rises_to_their_cause() {
    let cfg = json!({"quality_metric": QUAL});
    let (bytes, mut r) = trained(&cfg);
    // Typical inputs: near the running means, so every regressor's contribution change is small.
    let (t0, f0, q0) = (1.68, 0.8, 0.75);
    let cases: [(&str, f64, f64, f64, f64); 4] = [
        // TTFT rises 0.8 → 3.5 s; L follows the model.
        ("ttft", t0, 3.5, q0, 0.0),
        // Throughput collapses 1.68 → 0.25: 1/T rises by ~3.4.
        ("throughput", 0.25, f0, q0, 0.0),
        // Quality drops 0.75 → 0 with a larger γ effect than anything else moves.
        ("quality", t0, f0, 0.0, 0.0),
        // Inputs unchanged, L jumps by 1 s: nothing in the model explains it.
        ("unexplained", t0, f0, q0, 1.0),
    ];
    for (want, t, f, q, jump) in cases {
        let mut h = branch(&cfg, &bytes);
        let l = TRUTH.latency(t, f, q, &mut r) + jump;
        h.process(&minute("m", 400, t, f, Some(q), l));
        let out = h.advance(401 * MIN);
        let s = scores(&out);
        assert_eq!(s.len(), 1, "{want}");
        let s = s[0];
        assert_eq!(s.attrs["coupled.attribution"], want, "{want}: {:?}", s.attrs);
        let residual = s.num("coupled.residual");
        assert!((s.num("coupled.predicted") + residual - l).abs() < 1e-9, "predicted + residual = L");
        if want == "unexplained" {
            assert!((residual - 1.0).abs() < 0.05 && s.value == 1.0, "{want}: level {} {:?}", s.value, s.attrs);
        } else {
            let c = s.num(&format!("coupled.contribution.{want}"));
            assert!(c > 0.3, "{want}: the cause's contribution {c} is a rise");
            assert!(s.value < 0.6, "{want}: explained by the model, level {}", s.value);
        }
    }
}

#[test]
fn coupled_model_needs_every_input_in_a_bucket() {
    let mut h = Harness::new(json!({"quality_metric": QUAL, "min_updates": 1}));
    // Minute 0 lacks throughput, minute 1 lacks quality, minute 2 lacks latency.
    let mut pts: Vec<In> = minute("m", 0, 2.0, 0.5, Some(0.9), 1.0).into_iter().filter(|p| p.name != TPS).collect();
    pts.extend(minute("m", 1, 2.0, 0.5, None, 1.0));
    pts.extend(minute("m", 2, 2.0, 0.5, Some(0.9), 1.0).into_iter().filter(|p| p.name != LAT));
    // Points of other metrics are not inputs.
    pts.push(In { name: "llm.request.rate", model: "m", at: 10 * S, value: 3.0 });
    h.process(&pts);
    assert!(h.advance(3 * MIN).is_empty());
    assert_eq!(h.proc.skipped().incomplete, 3);
    // Inputs split across a bucket boundary do not join: T at 59 s, the rest in minute 1.
    let mut split = minute("m", 3, 2.0, 0.5, Some(0.9), 1.0);
    split[0].at = 4 * MIN + 59 * S;
    h.process(&split);
    assert!(h.advance(5 * MIN).is_empty());
    assert_eq!(h.proc.skipped().incomplete, 5);
    // A complete bucket does emit.
    h.process(&minute("m", 5, 2.0, 0.5, Some(0.9), 1.0));
    let out = h.advance(6 * MIN);
    let names: Vec<&str> = out.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, vec!["llm.coupled.alpha", "llm.coupled.beta", "llm.coupled.gamma"]);
}

#[test]
fn coupled_model_last_value_of_each_input_joins() {
    let mut h = Harness::new(json!({"min_updates": 1}));
    // Two latency points in minute 0: the later one (50 s, arriving first) counts.
    let mut pts = minute("m", 0, 2.0, 0.5, None, 1.0);
    pts.insert(0, In { name: LAT, model: "m", at: 50 * S, value: 1.5 });
    h.process(&pts);
    h.advance(MIN);
    let mut pts = minute("m", 1, 2.0, 0.5, None, 1.0);
    pts.push(In { name: TTFT, model: "m", at: MIN + 55 * S, value: 0.9 });
    h.process(&pts);
    let out = h.advance(2 * MIN);
    let s = scores(&out)[0];
    assert_eq!((s.time, s.num("coupled.ttft")), (BASE + MIN + 40 * S, 0.9));
    // First minute: θ₀ = (0.38, 0.52, 0) learnt from L = 1.5 (the 50 s point), not 1.0.
    let p0: f64 = 0.38 / 2.0 + 0.52 * 0.5;
    let residual0 = 1.5 - p0;
    assert!((s.num("coupled.residual_std") - residual0.abs()).abs() < 1e-9, "{:?}", s.attrs);
}

#[test]
fn coupled_model_ignores_and_counts_invalid_points() {
    let cfg = json!({"quality_metric": QUAL, "min_updates": 5});
    let mut r = Rng(5);
    let clean = synthetic("m", 0, 40, true, TRUTH, &mut r);
    let mut dirty = clean.clone();
    let bad = [
        (3, LAT, f64::NAN),
        (5, TPS, f64::INFINITY),
        (7, TTFT, f64::NEG_INFINITY),
        (9, TPS, 0.0),
        (11, TPS, -1.0),
        (13, QUAL, 1.5),
        (15, LAT, -0.1),
    ];
    for &(m, name, v) in &bad {
        // After the valid point of that minute (later in time), so a taken value would win.
        dirty[m].push(In { name, model: "m", at: m as u64 * MIN + 50 * S, value: v });
    }
    let mut a = Harness::new(cfg.clone());
    let mut b = Harness::new(cfg);
    let want = a.run(&clean, 10);
    let got = b.run(&dirty, 10);
    assert!(scores(&want).len() == 35);
    assert_eq!(got, want, "invalid points change nothing");
    assert_eq!(b.proc.skipped(), Skipped { non_finite: 3, out_of_domain: 4, ..Skipped::default() });
    // A point for a bucket already closed is late.
    b.process(&minute("m", 2, 2.0, 0.5, Some(0.9), 1.0));
    assert_eq!(b.proc.skipped().late, 4);
}

/// Three models over 60 minutes; m2 stops after minute 20 (idle), m1 misses every 7th minute.
fn script() -> Vec<Vec<In>> {
    let mut r = Rng(99);
    let (a, b, c) = (
        synthetic("m0", 0, 60, true, TRUTH, &mut r),
        synthetic("m1", 0, 60, true, Truth { alpha: 0.5, noise: 0.05, ..TRUTH }, &mut r),
        synthetic("m2", 0, 20, true, TRUTH, &mut r),
    );
    (0..60)
        .map(|m| {
            let mut v = a[m].clone();
            if m % 7 != 3 {
                v.extend(b[m].clone());
            }
            if m < 20 {
                v.extend(c[m].clone());
            }
            // One unexplained jump in m0 so high levels are part of the comparison.
            if m == 45 {
                v.iter_mut().filter(|p| p.name == LAT && p.model == "m0").for_each(|p| p.value += 2.0);
            }
            v
        })
        .collect()
}

#[test]
fn coupled_model_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"quality_metric": QUAL, "min_updates": 10, "idle_timeout": "10m", "max_series": 3});
    let steps = script();
    let mut whole = Harness::new(cfg.clone());
    let want = whole.run(&steps, 1);
    assert!(scores(&want).iter().any(|o| o.value == 1.0) && scores(&want).iter().any(|o| o.value == 0.0));
    assert_eq!(whole.telemetry.series_evicted(&whole.id, "idle").get(), 1, "m2 expires");
    assert_eq!(whole.proc.series_count(), 2);
    for cut in [1, 15, 33, 59] {
        let mut first = Harness::new(cfg.clone());
        let mut got = first.run(&steps[..cut], 1);
        let bytes = first.proc.snapshot().unwrap();
        assert_eq!(first.proc.state_version(), STATE_VERSION);
        let mut second = Harness::new(cfg.clone());
        second.proc.restore(&bytes).unwrap();
        assert_eq!(second.proc.series_count(), first.proc.series_count());
        assert_eq!(second.proc.snapshot().unwrap(), bytes);
        got.extend(second.run(&steps[cut..], 1));
        assert_eq!(got, want, "cut after minute {cut}");
    }
    // A checkpoint of the earlier state version (v1: before the kit's series map) is refused.
    assert_eq!(STATE_VERSION, 2);
    let old = inferwatch_core::state::seal("coupled_model", 1, &whole.proc.snapshot().unwrap());
    let msg = inferwatch_core::state::unseal("stage/coupled_model", "coupled_model", STATE_VERSION, &old)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("state version 1, this build reads 2"), "{msg}");
    // A snapshot taken with open buckets (input processed, watermark not yet past) continues too.
    let mut first = Harness::new(cfg.clone());
    let mut got = first.run(&steps[..30], 1);
    first.process(&steps[30]);
    let mut second = Harness::new(cfg.clone());
    second.proc.restore(&first.proc.snapshot().unwrap()).unwrap();
    got.extend(second.advance(31 * MIN));
    got.extend(second.run(&steps[31..], 1));
    assert_eq!(got, want);
    // Corrupt bytes and a model of another shape are refused, the state kept.
    let mut fresh = Harness::new(cfg.clone());
    assert!(matches!(fresh.proc.restore(b"not a snapshot at all"), Err(StateError::Corrupt { .. })));
    let mut no_quality = Harness::new(json!({"min_updates": 10}));
    assert!(matches!(no_quality.proc.restore(&first.proc.snapshot().unwrap()), Err(StateError::Corrupt { .. })));
    assert_eq!((fresh.proc.series_count(), no_quality.proc.series_count()), (0, 0));
}

#[test]
fn coupled_model_groups_are_capped_and_expire() {
    let mut h = Harness::new(json!({"max_series": 2, "idle_timeout": "5m"}));
    let mut r = Rng(1);
    for model in ["a", "b", "c"] {
        h.process(&synthetic(model, 0, 1, false, TRUTH, &mut r)[0]);
    }
    assert_eq!(h.proc.series_count(), 2);
    assert_eq!(h.telemetry.series_evicted(&h.id, "max_series").get(), 1);
    let out = h.advance(MIN);
    let models: Vec<&str> = out
        .iter()
        .filter(|o| o.name == "llm.coupled.alpha")
        .map(|o| o.attrs["gen_ai.request.model"].as_str())
        .collect();
    assert_eq!(models, vec!["b", "c"], "a was evicted with its open bucket");
    h.process(&synthetic("c", 3, 1, false, TRUTH, &mut r)[0]);
    h.advance(4 * MIN);
    h.advance(5 * MIN + 40 * S);
    assert_eq!(h.proc.series_count(), 1, "b (last point 0:40) is idle at 5:40");
    assert_eq!(h.telemetry.series_evicted(&h.id, "idle").get(), 1);
    // The end of input closes every bucket but forgets no group.
    h.process(&synthetic("c", 9, 1, false, TRUTH, &mut r)[0]);
    let mut out = Vec::new();
    h.proc.advance(u64::MAX, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(h.proc.series_count(), 1);
}

#[test]
fn coupled_model_config_errors_name_the_key() {
    let f = CoupledModelFactory;
    assert_eq!(f.type_name(), "coupled_model");
    assert_eq!(f.signals(), &[Signal::Metrics]);
    assert!(f.arrow().is_some());
    assert!(f.validate(&serde_json::Value::Null).is_ok(), "every key has a default");
    let key = |k: &str| PathSeg::Key(k.into());
    for (cfg, path) in [
        (json!({"latency_metric": ""}), vec![key("latency_metric")]),
        (json!({"quality_metric": "llm.ttft.p95"}), vec![key("quality_metric")]),
        (json!({"quality_metric": ""}), vec![key("quality_metric")]),
        (json!({"group_by": ["a", ""]}), vec![key("group_by")]),
        (json!({"align": "0s"}), vec![key("align")]),
        (json!({"idle_timeout": "1m"}), vec![key("idle_timeout")]),
        (json!({"forgetting": 1.5}), vec![key("forgetting")]),
        (json!({"forgetting": 0.1}), vec![key("forgetting")]),
        (json!({"min_updates": 0}), vec![key("min_updates")]),
        (json!({"residual_level": {"zero": 3, "one": 2}}), vec![key("residual_level"), key("one")]),
        (json!({"max_series": 0}), vec![key("max_series")]),
    ] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path, path, "{cfg}: {e:?}");
    }
    assert!(f.validate(&json!({"initial": {"delta": 1}})).is_err(), "unknown keys are refused");
    assert!(f.validate(&json!({"bogus": 1})).is_err());
    let ctx = CreateContext::new(ComponentId::parse("coupled_model").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create_arrow(ctx.clone(), &json!({}), Signal::Metrics).is_ok());
    assert!(f.create_arrow(ctx, &json!({}), Signal::Traces).is_err());
}
