//! `llm_signals` driven through the ArrowProcessor trait with batches from `spans::to_batch` /
//! `metrics::to_batch`, and once as a connector built by its factory (`build_connector`).

use inferwatch_core::arrow::ArrowProcessorFactory;
use inferwatch_core::component::{ComponentId, ConnectorFactory, CreateContext, PathSeg};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::state::StateError;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_processors::llm_signals::hist::{DURATION_BOUNDS, TPOT_BOUNDS, TTFT_BOUNDS};
use inferwatch_testkit::harness::{Harness, Sink};
use inferwatch_testkit::otlp::{
    self, f64_kv as dbl, histogram_point, int_kv as int, kv as s, metrics_request, point, resource, scope,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, NumberDataPoint, metric, number_data_point};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const S: u64 = 1_000_000_000;
/// A boundary of every window and flush interval used here (a multiple of 60 s).
const BASE: u64 = 1_699_999_980 * S;
const ALPHA: f64 = 0.01;

fn at(secs: f64) -> u64 {
    BASE + (secs * 1e9).round() as u64
}

// ---- inputs -------------------------------------------------------------------------------------

fn span(name: &str, end_s: f64, dur_s: f64, attrs: Vec<KeyValue>, error: bool) -> Span {
    let end = at(end_s);
    Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        name: name.into(),
        kind: 2,
        start_time_unix_nano: end - (dur_s * 1e9).round() as u64,
        end_time_unix_nano: end,
        attributes: attrs,
        status: Some(Status { code: if error { 2 } else { 0 }, message: String::new() }),
        ..Default::default()
    }
}

fn traces(groups: Vec<(Resource, Vec<Span>)>) -> ExportTraceServiceRequest {
    let resource_spans =
        groups.into_iter().map(|(r, spans)| otlp::resource_spans(r.attributes, scope("vllm.llm_engine", ""), spans));
    ExportTraceServiceRequest { resource_spans: resource_spans.collect() }
}

fn gauge(name: &str, attrs: &[KeyValue], t: f64, v: f64) -> Metric {
    otlp::gauge(name, "", vec![point(attrs.to_vec(), at(t), v)])
}

fn counter(name: &str, attrs: &[KeyValue], start: f64, t: f64, v: f64) -> Metric {
    otlp::sum(
        name,
        "",
        vec![NumberDataPoint { start_time_unix_nano: at(start), ..point(attrs.to_vec(), at(t), v) }],
        true,
    )
}

fn histo(name: &str, attrs: &[KeyValue], start: f64, t: f64, bounds: &[f64], counts: &[u64], sum: f64) -> Metric {
    otlp::histogram(name, "", vec![histogram_point(attrs.to_vec(), at(start), at(t), bounds, counts, sum)])
}

fn scrape(res: &Resource, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
    metrics_request(res.attributes.clone(), scope("prometheus", ""), metrics)
}

// ---- outputs ------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum V {
    I(i64),
    D(f64),
    H { bounds: Vec<f64>, counts: Vec<u64>, count: u64, sum: f64 },
}

impl V {
    pub(crate) fn f(&self) -> f64 {
        match self {
            V::I(i) => *i as f64,
            V::D(d) => *d,
            V::H { .. } => panic!("histogram, not a number"),
        }
    }
}

/// One output point with what it carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pt {
    pub(crate) name: String,
    pub(crate) unit: String,
    pub(crate) attrs: BTreeMap<String, String>,
    pub(crate) start: u64,
    pub(crate) time: u64,
    pub(crate) value: V,
}

impl Pt {
    fn model(&self) -> &str {
        &self.attrs["gen_ai.request.model"]
    }
}

fn attr_map(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// Every point of an llm_signals output request (also used by llm_signals_buckets.rs).
pub(crate) fn flatten(req: &ExportMetricsServiceRequest) -> Vec<Pt> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        assert_eq!(attr_map(&rm.resource.as_ref().unwrap().attributes)["service.name"], "inferwatch");
        for sm in &rm.scope_metrics {
            assert_eq!(sm.scope.as_ref().unwrap().name, "inferwatch.llm_signals");
            for m in &sm.metrics {
                match m.data.as_ref().unwrap() {
                    metric::Data::Gauge(g) => {
                        for p in &g.data_points {
                            let value = match p.value.unwrap() {
                                number_data_point::Value::AsInt(i) => V::I(i),
                                number_data_point::Value::AsDouble(d) => V::D(d),
                            };
                            out.push(Pt {
                                name: m.name.clone(),
                                unit: m.unit.clone(),
                                attrs: attr_map(&p.attributes),
                                start: p.start_time_unix_nano,
                                time: p.time_unix_nano,
                                value,
                            });
                        }
                    }
                    metric::Data::Histogram(h) => {
                        assert_eq!(h.aggregation_temporality, 2, "cumulative");
                        for p in &h.data_points {
                            assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count);
                            out.push(Pt {
                                name: m.name.clone(),
                                unit: m.unit.clone(),
                                attrs: attr_map(&p.attributes),
                                start: p.start_time_unix_nano,
                                time: p.time_unix_nano,
                                value: V::H {
                                    bounds: p.explicit_bounds.clone(),
                                    counts: p.bucket_counts.clone(),
                                    count: p.count,
                                    sum: p.sum.unwrap(),
                                },
                            });
                        }
                    }
                    other => panic!("unexpected kind {other:?}"),
                }
            }
        }
    }
    out
}

/// The kit's harness on this file's requests and points.
trait LlmSignals {
    fn new(signal: Signal, cfg: serde_json::Value) -> Self;
    fn spans(&mut self, req: &ExportTraceServiceRequest);
    fn metrics(&mut self, req: &ExportMetricsServiceRequest);
    fn advance_ns(&mut self, wm: u64) -> Vec<Pt>;
    fn advance(&mut self, secs: f64) -> Vec<Pt>;
    fn spans_out(&mut self, req: &ExportTraceServiceRequest) -> Vec<Pt>;
}

impl LlmSignals for Harness {
    fn new(signal: Signal, cfg: serde_json::Value) -> Self {
        Harness::create(&LlmSignalsFactory, "llm_signals/test", &cfg, signal)
    }

    fn spans(&mut self, req: &ExportTraceServiceRequest) {
        assert!(self.process_spans(req).is_empty(), "output only on advance");
    }

    fn metrics(&mut self, req: &ExportMetricsServiceRequest) {
        assert!(self.process_metrics(req).is_empty(), "output only on advance");
    }

    /// Advances to `wm` (ns) and returns the points emitted; none is after the watermark.
    fn advance_ns(&mut self, wm: u64) -> Vec<Pt> {
        let pts: Vec<Pt> = self.advance_one(wm).iter().flat_map(flatten).collect();
        assert!(pts.iter().all(|p| p.time <= wm), "a window or flush after the watermark was emitted");
        pts
    }

    fn advance(&mut self, secs: f64) -> Vec<Pt> {
        self.advance_ns(at(secs))
    }

    /// Processes spans and returns the points `process` emitted (per-request points only).
    fn spans_out(&mut self, req: &ExportTraceServiceRequest) -> Vec<Pt> {
        let out = self.process_spans(req);
        assert!(out.len() <= 1, "one derived batch per processed batch");
        out.iter().flat_map(flatten).collect()
    }
}

fn find<'a>(pts: &'a [Pt], name: &str, model: &str, time: u64) -> Option<&'a Pt> {
    pts.iter().find(|p| p.name == name && p.model() == model && p.time == time)
}

fn value(pts: &[Pt], name: &str, model: &str, time: u64) -> f64 {
    find(pts, name, model, time).unwrap_or_else(|| panic!("no {name} for {model} at {time}: {pts:#?}")).value.f()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

/// Per-bucket counts of `values` over `bounds`, upper-inclusive, computed independently.
fn bucketize(bounds: &[f64], values: &[f64]) -> Vec<u64> {
    (0..=bounds.len())
        .map(|i| {
            values.iter().filter(|v| (i == 0 || **v > bounds[i - 1]) && (i == bounds.len() || **v <= bounds[i])).count()
                as u64
        })
        .collect()
}

/// The value at rank ⌊q·(n−1)⌋ of the sorted values (what the sketch approximates within α).
fn exact_quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

fn assert_hist(p: &Pt, bounds: &[f64], values: &[f64]) {
    let V::H { bounds: b, counts, count, sum } = &p.value else { panic!("{p:?} is not a histogram") };
    assert_eq!(b, bounds, "{}", p.name);
    assert_eq!(counts, &bucketize(bounds, values), "{} at {}", p.name, p.time);
    assert_eq!(*count, values.len() as u64);
    close(*sum, values.iter().sum(), &p.name);
}

// ---- vLLM spans ---------------------------------------------------------------------------------

/// One vLLM V1 request of model A (llama, from the resource).
struct ReqA {
    end: f64,
    ttft: f64,
    e2e: f64,
    queue: f64,
    completion: i64,
    error: bool,
}

fn requests_a() -> Vec<ReqA> {
    (0..20)
        .map(|i| ReqA {
            end: 2.0 * i as f64 + 1.0,
            ttft: 0.003 + 0.0137 * i as f64,
            e2e: 1.013 + 0.1 * i as f64,
            queue: 0.001 + 0.05 * i as f64,
            completion: 10 + i,
            error: [4, 9, 14, 19].contains(&i),
        })
        .collect()
}

fn vllm_spans() -> ExportTraceServiceRequest {
    let res_a = resource(vec![
        s("service.name", "vllm-a"),
        s("service.version", "v1"),
        s("service.instance.id", "i-a"),
        s("gen_ai.request.model", "llama"),
    ]);
    let mut spans_a: Vec<Span> = requests_a()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let finish = match i {
                4 => "[\"abort\"]",
                14 => "[\"error\"]",
                _ => "[\"stop\"]",
            };
            // vLLM's errors on a span are its status only: the finish reasons (which real vLLM
            // never writes) do not count (llm_signals_fixtures.rs checks that on its own).
            let status_error = [4, 9, 14, 19].contains(&i);
            span(
                "llm_request",
                r.end,
                r.e2e + 0.001,
                vec![
                    s("gen_ai.request.id", &format!("req-{i}")),
                    int("gen_ai.usage.prompt_tokens", 100),
                    int("gen_ai.usage.completion_tokens", r.completion),
                    dbl("gen_ai.latency.time_to_first_token", r.ttft),
                    dbl("gen_ai.latency.e2e", r.e2e),
                    dbl("gen_ai.latency.time_in_queue", r.queue),
                    s("gen_ai.response.finish_reasons", finish),
                ],
                status_error,
            )
        })
        .collect();
    // Not request spans: skipped.
    spans_a.push(span("Load model", 3.0, 2.0, vec![s("code.function", "load")], false));
    spans_a.push(span("HTTP GET", 4.0, 0.1, vec![], false));
    let res_b =
        resource(vec![s("service.name", "vllm-b"), s("service.version", "v2"), s("service.instance.id", "i-b")]);
    let b = |end: f64, ttft: f64, e2e: f64, queue: f64, out: i64, prompt: i64, error: bool| {
        span(
            "llm_request",
            end,
            e2e,
            vec![
                s("gen_ai.response.model", "qwen"),
                int("gen_ai.usage.prompt_tokens", prompt),
                int("gen_ai.usage.completion_tokens", out),
                dbl("gen_ai.latency.time_to_first_token", ttft),
                dbl("gen_ai.latency.e2e", e2e),
                dbl("gen_ai.latency.time_in_queue", queue),
            ],
            error,
        )
    };
    let spans_b = vec![
        b(10.0, 0.03, 0.5, 0.002, 5, 50, false),
        b(20.0, 0.3, 2.0, 0.9, 11, 60, false),
        b(40.0, 0.07, 1.2, 0.05, 1, 70, true),
    ];
    traces(vec![(res_a, spans_a), (res_b, spans_b)])
}

#[test]
fn llm_signals_vllm_spans_two_models_exact_histograms_and_window_signals() {
    let mut h = Harness::new(Signal::Traces, json!({"window": "1m", "flush_interval": "15s"}));
    h.spans(&vllm_spans());
    assert_eq!(h.proc.series_count(), 2, "two (model, version, instance) groups");

    let a = requests_a();
    let ok_a: Vec<&ReqA> = a.iter().filter(|r| !r.error).collect();
    let tpot = |r: &ReqA| (r.e2e - r.ttft) / (r.completion - 1) as f64;
    let hist_a = |lat: &str, b: f64| -> Vec<f64> {
        let before = |r: &&ReqA| r.end < b;
        match lat {
            "ttft" => ok_a.iter().copied().filter(before).map(|r| r.ttft).collect(),
            "tpot" => ok_a.iter().copied().filter(before).map(tpot).collect(),
            "e2e" => a.iter().filter(before).map(|r| r.e2e).collect(),
            _ => a.iter().filter(before).map(|r| r.queue).collect(),
        }
    };

    // Before the window ends only the cumulative histograms of the flush boundaries come out.
    let early = h.advance(59.0);
    assert!(early.iter().all(|p| p.name.starts_with("gen_ai.server.") || p.name == "llm.request.queue_time"));
    let names = [
        ("gen_ai.server.time_to_first_token", "ttft", TTFT_BOUNDS),
        ("gen_ai.server.time_per_output_token", "tpot", TPOT_BOUNDS),
        ("gen_ai.server.request.duration", "e2e", DURATION_BOUNDS),
        ("llm.request.queue_time", "queue", DURATION_BOUNDS),
    ];
    for b in [15.0, 30.0, 45.0] {
        for (name, lat, bounds) in names {
            let p = find(&early, name, "llama", at(b)).unwrap_or_else(|| panic!("{name} at {b}"));
            assert_eq!((p.start, p.unit.as_str()), (at(1.0), "s"), "start = first seen");
            assert_hist(p, bounds, &hist_a(lat, b));
        }
    }
    assert_eq!(early.len(), 4 * 3 * 2, "4 histograms × 3 flushes × 2 models");
    // Model B, by hand: TTFT 0.03 → (0.02, 0.04], 0.3 → (0.25, 0.5]; the failed request has none.
    let ttft_b = find(&early, "gen_ai.server.time_to_first_token", "qwen", at(45.0)).unwrap();
    let V::H { counts, sum, .. } = &ttft_b.value else { panic!() };
    assert_eq!(counts, &[0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    close(*sum, 0.33, "ttft sum");
    let e2e_b = find(&early, "gen_ai.server.request.duration", "qwen", at(45.0)).unwrap();
    let V::H { counts, count, .. } = &e2e_b.value else { panic!() };
    assert_eq!((counts.as_slice(), *count), (&[0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0][..], 3));
    let e2e_b15 = find(&early, "gen_ai.server.request.duration", "qwen", at(15.0)).unwrap();
    assert!(matches!(&e2e_b15.value, V::H { count: 1, .. }), "flush at 15 s holds only the request ended at 10 s");
    let want_attrs: BTreeMap<String, String> = [
        ("gen_ai.request.model", "qwen"),
        ("service.name", "vllm-b"),
        ("service.version", "v2"),
        ("service.instance.id", "i-b"),
        ("source", "spans"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(e2e_b.attrs, want_attrs);

    let w0 = h.advance(60.0);
    let end = at(60.0);
    // Model A: 20 requests, 4 failed (abort, status, error, status).
    assert_eq!(find(&w0, "llm.requests.finished", "llama", end).unwrap().value, V::I(20));
    close(value(&w0, "llm.request.rate", "llama", end), 20.0 / 60.0, "rate");
    close(value(&w0, "llm.request.error_rate", "llama", end), 0.2, "error rate");
    close(value(&w0, "llm.tokens.output.rate", "llama", end), 390.0 / 60.0, "tokens/s");
    close(value(&w0, "llm.tokens.input.rate", "llama", end), 2000.0 / 60.0, "input tokens/s");
    let ttft: Vec<f64> = ok_a.iter().map(|r| r.ttft).collect();
    let e2e: Vec<f64> = a.iter().map(|r| r.e2e).collect();
    let tpots: Vec<f64> = ok_a.iter().map(|r| tpot(r)).collect();
    for (name, vals, q) in [
        ("llm.ttft.p95", &ttft, 0.95),
        ("llm.ttft.p50", &ttft, 0.5),
        ("llm.e2e.p95", &e2e, 0.95),
        ("llm.tpot.p95", &tpots, 0.95),
    ] {
        let got = value(&w0, name, "llama", end);
        let want = exact_quantile(vals, q);
        assert!((got - want).abs() <= ALPHA * want, "{name}: {got} vs exact {want}");
    }
    let p = find(&w0, "llm.ttft.p95", "llama", end).unwrap();
    assert_eq!((p.start, p.unit.as_str()), (at(0.0), "s"));
    assert_eq!(find(&w0, "llm.queue.blocking", "llama", end).unwrap().value, V::I(1), "queue p99 ≈ 0.9 s > 0.8 s");
    // Model B: 3 requests, 1 failed; 17 output and 180 input tokens.
    assert_eq!(find(&w0, "llm.requests.finished", "qwen", end).unwrap().value, V::I(3));
    close(value(&w0, "llm.request.error_rate", "qwen", end), 1.0 / 3.0, "error rate b");
    close(value(&w0, "llm.tokens.output.rate", "qwen", end), 17.0 / 60.0, "tokens/s b");
    close(value(&w0, "llm.tokens.input.rate", "qwen", end), 3.0, "input b");
    assert_eq!(find(&w0, "llm.queue.blocking", "qwen", end).unwrap().value, V::I(0));
    // Two TPOTs, 0.1175 and 0.17: rank ⌊0.99·1⌋ = 0 is the exact minimum.
    assert_eq!(value(&w0, "llm.tpot.p99", "qwen", end), 0.1175);
    // Histograms are re-emitted at the 60 s flush, unchanged.
    let e2e_60 = find(&w0, "gen_ai.server.request.duration", "qwen", end).unwrap();
    assert_eq!(e2e_60.value, e2e_b.value);
    assert!(h.advance(60.0).is_empty(), "an old watermark emits nothing");
}

#[test]
fn llm_signals_zero_windows_then_idle_eviction() {
    let mut h = Harness::new(Signal::Traces, json!({"idle_timeout": "2m", "max_series": 10}));
    h.spans(&vllm_spans());
    let w0 = h.advance(60.0);
    assert!(find(&w0, "llm.requests.finished", "qwen", at(60.0)).is_some());
    // No request of qwen in [60 s, 120 s): zero rates, no percentiles, no error rate.
    let w1 = h.advance(120.0);
    let qwen: BTreeSet<&str> =
        w1.iter().filter(|p| p.model() == "qwen" && p.time == at(120.0)).map(|p| p.name.as_str()).collect();
    let want: BTreeSet<&str> = [
        "llm.requests.finished",
        "llm.request.rate",
        "llm.tokens.output.rate",
        "llm.tokens.input.rate",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
        "llm.request.queue_time",
    ]
    .into();
    assert_eq!(qwen, want);
    assert_eq!(find(&w1, "llm.requests.finished", "qwen", at(120.0)).unwrap().value, V::I(0));
    assert_eq!(value(&w1, "llm.tokens.output.rate", "qwen", at(120.0)), 0.0);
    assert_eq!((h.proc.series_count(), h.evicted("idle")), (2, 0));
    // qwen's last request ended at 40 s, llama's at 39 s: idle from 160 s / 159 s on.
    let w2 = h.advance(180.0);
    assert!(find(&w2, "llm.requests.finished", "qwen", at(180.0)).is_none(), "window ending after idle: none");
    assert!(find(&w2, "gen_ai.server.request.duration", "qwen", at(150.0)).is_some());
    assert!(find(&w2, "gen_ai.server.request.duration", "qwen", at(165.0)).is_none());
    assert_eq!((h.proc.series_count(), h.evicted("idle"), h.evicted("max_series")), (0, 2, 0));
}

#[test]
fn llm_signals_max_series_evicts_least_recent_groups() {
    let mut h = Harness::new(Signal::Traces, json!({"max_series": 3}));
    let one = |model: &str, end: f64| {
        traces(vec![(
            resource(vec![s("service.name", "x")]),
            vec![span(
                "llm_request",
                end,
                1.0,
                vec![s("gen_ai.request.model", model), dbl("gen_ai.latency.e2e", 1.0)],
                false,
            )],
        )])
    };
    for (m, t) in [("m0", 1.0), ("m1", 2.0), ("m2", 3.0), ("m0", 4.0)] {
        h.spans(&one(m, t));
    }
    assert_eq!((h.proc.series_count(), h.evicted("max_series")), (3, 0));
    h.spans(&one("m3", 5.0));
    assert_eq!((h.proc.series_count(), h.evicted("max_series")), (3, 1));
    let models: BTreeSet<String> = h
        .advance(60.0)
        .into_iter()
        .filter(|p| p.name == "llm.requests.finished")
        .map(|p| p.model().to_string())
        .collect();
    assert_eq!(models, ["m0", "m2", "m3"].into_iter().map(String::from).collect(), "m1 was least recently seen");
}

// ---- TGI and semconv spans ----------------------------------------------------------------------

#[test]
fn llm_signals_tgi_debug_durations_and_semconv_spans() {
    let mut h = Harness::new(Signal::Traces, json!({"tgi_model": "bigscience/bloom", "default_model": "fallback"}));
    let tgi = resource(vec![s("service.name", "text-generation-inference.router")]);
    let tgi_spans = vec![
        span(
            "generate",
            10.0,
            1.25,
            vec![
                s("parameters", "GenerateParameters { .. }"),
                s("total_time", "1.2s"),
                s("validation_time", "1.1ms"),
                s("queue_time", "850µs"),
                s("inference_time", "1.19s"),
                s("time_per_token", "11.9ms"),
            ],
            false,
        ),
        // The inner `generate` span of router/src/infer records no durations: not a request.
        span("generate", 10.0, 1.2, vec![], false),
        span(
            "generate_stream",
            20.0,
            0.32,
            vec![
                s("total_time", "312.5ms"),
                s("queue_time", "12.3ms"),
                s("inference_time", "300ms"),
                s("time_per_token", "6ms"),
            ],
            false,
        ),
        span("chat_completions", 30.0, 2.5, vec![s("total_time", "2.5s"), s("queue_time", "1.5s")], true),
        span("batch", 30.0, 1.0, vec![int("batch_size", 2)], false),
    ];
    let app = resource(vec![s("service.name", "my-app")]);
    let app_spans = vec![
        span(
            "chat m3",
            15.0,
            2.0,
            vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.provider.name", "openai"),
                s("gen_ai.request.model", "m3"),
                int("gen_ai.usage.output_tokens", 20),
                int("gen_ai.usage.input_tokens", 7),
                dbl("gen_ai.server.time_to_first_token", 0.2),
            ],
            false,
        ),
        span("embeddings m3", 16.0, 0.1, vec![s("gen_ai.operation.name", "embeddings")], false),
        span("text_completion", 25.0, 1.0, vec![s("gen_ai.operation.name", "text_completion")], false),
    ];
    h.spans(&traces(vec![(tgi, tgi_spans), (app, app_spans)]));
    let out = h.advance(60.0);
    let end = at(60.0);
    let bloom: Vec<&Pt> = out.iter().filter(|p| p.model() == "bigscience/bloom").collect();
    assert!(!bloom.is_empty());
    assert!(bloom.iter().all(|p| !p.name.contains("ttft") && !p.name.contains("time_to_first_token")), "TGI: no TTFT");
    assert_eq!(find(&out, "llm.requests.finished", "bigscience/bloom", end).unwrap().value, V::I(3));
    close(value(&out, "llm.request.error_rate", "bigscience/bloom", end), 1.0 / 3.0, "tgi error rate");
    // Output tokens = round(inference_time / time_per_token): 100 + 50.
    close(value(&out, "llm.tokens.output.rate", "bigscience/bloom", end), 150.0 / 60.0, "tgi tokens/s");
    let hist = |name: &str| find(&out, name, "bigscience/bloom", end).unwrap_or_else(|| panic!("{name}"));
    assert_hist(hist("gen_ai.server.request.duration"), DURATION_BOUNDS, &[1.2, 0.3125, 2.5]);
    assert_hist(hist("llm.request.queue_time"), DURATION_BOUNDS, &[0.00085, 0.0123, 1.5]);
    assert_hist(hist("gen_ai.server.time_per_output_token"), TPOT_BOUNDS, &[0.0119, 0.006]);
    assert_eq!(hist("llm.request.queue_time").attrs["service.instance.id"], "");
    // Semconv: e2e = span duration, TTFT from its attribute, TPOT = (2.0 − 0.2) / 19.
    assert_hist(find(&out, "gen_ai.server.time_to_first_token", "m3", end).unwrap(), TTFT_BOUNDS, &[0.2]);
    assert_hist(find(&out, "gen_ai.server.request.duration", "m3", end).unwrap(), DURATION_BOUNDS, &[2.0]);
    assert_hist(find(&out, "gen_ai.server.time_per_output_token", "m3", end).unwrap(), TPOT_BOUNDS, &[1.8 / 19.0]);
    assert_eq!(find(&out, "llm.requests.finished", "m3", end).unwrap().value, V::I(1), "embeddings skipped");
    // No model anywhere: default_model comes before service.name.
    assert_eq!(find(&out, "llm.requests.finished", "fallback", end).unwrap().value, V::I(1));
    assert!(find(&out, "gen_ai.server.time_to_first_token", "fallback", end).is_none());
    assert_eq!(h.proc.series_count(), 3);
}

// ---- scraped metrics ----------------------------------------------------------------------------

const QUEUE_BOUNDS: &[f64] = &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0];
const TTFT_SCRAPE_BOUNDS: &[f64] = &[0.1, 0.25, 0.5, 1.0];

/// Three scrapes of vLLM (at 5 s, 20 s, 35 s): gauges, counters (one reset with a new start
/// time, one without), and histograms (one reset).
fn vllm_scrapes() -> Vec<ExportMetricsServiceRequest> {
    let res = resource(vec![
        s("service.name", "vllm"),
        s("service.instance.id", "10.0.0.1:8000"),
        s("service.version", "0.15"),
    ]);
    let l = [s("model_name", "llama"), s("engine", "0")];
    let reason = |r: &str| [s("model_name", "llama"), s("engine", "0"), s("finished_reason", r)];
    let t = [5.0, 20.0, 35.0];
    let kv_usage = [0.30, 0.55, 0.72];
    let waiting = [3.0, 7.0, 2.0];
    let running = [10.0, 12.0, 9.0];
    let preempt = [(-100.0, 100.0), (-100.0, 110.0), (30.0, 4.0)]; // restarted at 30 s
    let queries = [1000.0, 1600.0, 2400.0];
    let hits = [500.0, 800.0, 300.0]; // dropped: a reset with the same start time
    let generated = [5000.0, 5600.0, 6500.0];
    // Restarted at 30 s and already above the old value: only the start time tells.
    let prompt = [(-100.0, 1000.0), (-100.0, 1300.0), (30.0, 1500.0)];
    let success = [
        ("stop", [100.0, 130.0, 160.0]),
        ("length", [10.0, 12.0, 14.0]),
        ("abort", [1.0, 1.0, 3.0]),
        ("error", [0.0, 1.0, 1.0]),
    ];
    let queue: [[u64; 7]; 3] = [[10, 5, 2, 0, 0, 0, 0], [20, 9, 4, 1, 0, 0, 0], [25, 12, 6, 3, 1, 0, 0]];
    let ttft: [(f64, [u64; 5]); 3] = [(-100.0, [4, 2, 1, 0, 0]), (-100.0, [10, 6, 2, 1, 0]), (30.0, [1, 1, 0, 0, 0])];
    (0..3)
        .map(|k| {
            let mut m = vec![
                gauge("vllm:kv_cache_usage_perc", &l, t[k], kv_usage[k]),
                gauge("vllm:num_requests_waiting", &l, t[k], waiting[k]),
                gauge("vllm:num_requests_running", &l, t[k], running[k]),
                counter("vllm:num_preemptions_total", &l, preempt[k].0, t[k], preempt[k].1),
                counter("vllm:prefix_cache_queries", &l, -100.0, t[k], queries[k]),
                counter("vllm:prefix_cache_hits_total", &l, -100.0, t[k], hits[k]),
                counter("vllm:generation_tokens_total", &l, -100.0, t[k], generated[k]),
                counter("vllm:prompt_tokens_total", &l, prompt[k].0, t[k], prompt[k].1),
                histo("vllm:request_queue_time_seconds", &l, -100.0, t[k], QUEUE_BOUNDS, &queue[k], 10.0 * k as f64),
                histo("vllm:time_to_first_token_seconds", &l, ttft[k].0, t[k], TTFT_SCRAPE_BOUNDS, &ttft[k].1, 1.0),
                // Not an input of llm_signals.
                gauge("vllm:cache_config_info", &[s("block_size", "16")], t[k], 1.0),
            ];
            for (r, v) in &success {
                m.push(counter("vllm:request_success_total", &reason(r), -100.0, t[k], v[k]));
            }
            scrape(&res, m)
        })
        .collect()
}

#[test]
fn llm_signals_scraped_vllm_three_scrapes_match_hand_computation() {
    let mut h = Harness::new(Signal::Metrics, json!({"window": "1m"}));
    for req in vllm_scrapes() {
        h.metrics(&req);
    }
    assert_eq!(h.proc.series_count(), 1);
    assert!(h.advance(59.0).is_empty(), "the window closes at 60 s");
    let out = h.advance(60.0);
    let end = at(60.0);
    let v = |name: &str| value(&out, name, "llama", end);
    let names: BTreeSet<&str> = out.iter().map(|p| p.name.as_str()).collect();
    let want: BTreeSet<&str> = [
        "llm.kv_cache.usage",
        "llm.requests.waiting",
        "llm.requests.running",
        "llm.preemption.rate",
        "llm.prefix_cache.hit_rate",
        "llm.prefix_cache.low",
        "llm.tokens.output.rate",
        "llm.tokens.input.rate",
        "llm.request.rate",
        "llm.request.error_rate",
        "llm.ttft.p50",
        "llm.ttft.p95",
        "llm.ttft.p99",
        "llm.queue.p50",
        "llm.queue.p95",
        "llm.queue.p99",
        "llm.queue.blocking",
    ]
    .into();
    assert_eq!(names, want);
    assert!(out.iter().all(|p| p.attrs["source"] == "scrape" && p.start == at(0.0) && p.time == end));
    assert_eq!(out[0].attrs["service.instance.id"], "10.0.0.1:8000");
    assert_eq!(out[0].attrs["service.version"], "0.15");
    close(v("llm.kv_cache.usage"), 0.72, "kv usage: last value");
    close(v("llm.requests.waiting"), 2.0, "waiting");
    close(v("llm.requests.running"), 9.0, "running");
    // Preemptions: +10 over 15 s, then restarted (start 30 s) and at 4 by 35 s: +4 over 15 s.
    close(v("llm.preemption.rate"), 14.0 / 30.0, "preemption rate");
    // Hits 300 + 300 (the drop is a reset) over 30 s; queries 600 + 800 over 30 s.
    close(v("llm.prefix_cache.hit_rate"), 600.0 / 1400.0, "hit rate");
    let low = find(&out, "llm.prefix_cache.low", "llama", end).unwrap();
    assert_eq!((&low.value, low.unit.as_str()), (&V::I(1), ""), "0.43 < 0.62; a flag has no unit");
    assert_eq!(out[0].attrs["service.name"], "vllm");
    close(v("llm.tokens.output.rate"), 1500.0 / 30.0, "tokens/s");
    close(v("llm.tokens.input.rate"), (300.0 + 1500.0) / 30.0, "input tokens/s: a restart by start time");
    // stop +60, length +4, abort +2, error +1, all over 30 s.
    close(v("llm.request.rate"), 67.0 / 30.0, "request rate");
    close(v("llm.request.error_rate"), 3.0 / 67.0, "error rate");
    // Queue delta [15, 7, 4, 3, 1, 0, 0] (n = 30): histogram_quantile by hand.
    close(v("llm.queue.p50"), 0.3, "queue p50: rank 15 in (0, 0.3]");
    close(v("llm.queue.p95"), 0.8 + 0.2 * (28.5 - 26.0) / 3.0, "queue p95: rank 28.5 in (0.8, 1.0]");
    close(v("llm.queue.p99"), 1.0 + 0.5 * (29.7 - 29.0) / 1.0, "queue p99: rank 29.7 in (1.0, 1.5]");
    assert_eq!(find(&out, "llm.queue.blocking", "llama", end).unwrap().value, V::I(1));
    // TTFT delta [6, 4, 1, 1, 0] + after the reset [1, 1, 0, 0, 0] = [7, 5, 1, 1, 0] (n = 14).
    close(v("llm.ttft.p50"), 0.1, "ttft p50: rank 7 in (0, 0.1]");
    close(v("llm.ttft.p95"), 0.5 + 0.5 * (13.3 - 13.0), "ttft p95: rank 13.3 in (0.5, 1.0]");
    close(v("llm.ttft.p99"), 0.5 + 0.5 * (13.86 - 13.0), "ttft p99");
}

#[test]
fn llm_signals_scraped_tgi_gives_what_tgi_can() {
    let mut h = Harness::new(Signal::Metrics, json!({"tgi_model": "bloom"}));
    let res = resource(vec![s("service.name", "tgi"), s("server.address", "10.0.0.2"), int("server.port", 80)]);
    let dur = [0.5, 1.0, 2.0];
    let one = |t: f64, k: usize| {
        scrape(
            &res,
            vec![
                gauge("tgi_queue_size", &[], t, [4.0, 6.0][k]),
                gauge("tgi_batch_current_size", &[], t, [8.0, 5.0][k]),
                counter("tgi_request_success", &[], -10.0, t, [10.0, 25.0][k]),
                counter("tgi_request_failure", &[s("err", "validation")], -10.0, t, [1.0, 2.0][k]),
                counter("tgi_request_failure", &[s("err", "overloaded")], -10.0, t, [0.0, 3.0][k]),
                histo("tgi_request_duration", &[], -10.0, t, &dur, &[[1u64, 1, 0, 0], [3, 6, 2, 1]][k], 1.0),
                histo(
                    "tgi_request_generated_tokens",
                    &[],
                    -10.0,
                    t,
                    &[100.0],
                    &[[5u64, 0], [9, 1]][k],
                    [1000.0, 1600.0][k],
                ),
            ],
        )
    };
    h.metrics(&one(10.0, 0));
    h.metrics(&one(40.0, 1));
    let out = h.advance(60.0);
    let end = at(60.0);
    assert!(out.iter().all(|p| p.model() == "bloom" && p.attrs["service.instance.id"] == "10.0.0.2:80"));
    assert!(out.iter().all(|p| !p.name.contains("ttft")), "TGI gives no TTFT");
    let v = |name: &str| value(&out, name, "bloom", end);
    close(v("llm.requests.waiting"), 6.0, "queue size");
    close(v("llm.requests.running"), 5.0, "batch size");
    close(v("llm.request.rate"), 19.0 / 30.0, "success 15 + failures 4 over 30 s");
    close(v("llm.request.error_rate"), 4.0 / 19.0, "error rate");
    close(v("llm.tokens.output.rate"), 20.0, "generated-tokens histogram sum: 600 over 30 s");
    // Duration delta [2, 5, 2, 1]: p50 rank 5 in (0.5, 1.0]; p99 rank 9.9 in +Inf → highest bound.
    close(v("llm.e2e.p50"), 0.5 + 0.5 * 3.0 / 5.0, "e2e p50");
    close(v("llm.e2e.p99"), 2.0, "e2e p99");
}

/// The spans and the scrape of one server, as a pod's agent gets them: one resource rule for both
/// (service.name, service.instance.id, the pod identity), the version on the spans' resource and,
/// for the scrape, as a target label (`service_version`, set by a static label or a relabel).
#[test]
fn llm_signals_span_and_scrape_groups_of_one_instance_carry_the_same_identifying_attributes() {
    let pod = [s("k8s.namespace.name", "llm"), s("k8s.pod.name", "vllm-0"), s("k8s.node.name", "gpu-1")];
    let mut span_res = vec![s("service.name", "vllm"), s("service.version", "0.9.1")];
    span_res.extend([s("service.instance.id", "10.0.0.7:8000"), s("gen_ai.request.model", "llama")]);
    span_res.extend(pod.iter().cloned());
    let req = |end: f64| {
        span(
            "llm_request",
            end,
            0.5,
            vec![dbl("gen_ai.latency.time_to_first_token", 0.05), dbl("gen_ai.latency.time_in_queue", 0.01)],
            false,
        )
    };
    let mut spans_h = Harness::new(Signal::Traces, json!({"window": "1m"}));
    spans_h.spans(&traces(vec![(resource(span_res), vec![req(10.0), req(20.0)])]));
    // The prometheus receiver's resource: no version.
    let mut scrape_res = vec![s("service.name", "vllm"), s("service.instance.id", "10.0.0.7:8000")];
    scrape_res.extend([s("server.address", "10.0.0.7"), s("server.port", "8000"), s("url.scheme", "http")]);
    scrape_res.extend(pod.iter().cloned());
    let scrape_res = resource(scrape_res);
    let labels = [s("model_name", "llama"), s("engine", "0"), s("service_version", "0.9.1")];
    let mut scrape_h = Harness::new(Signal::Metrics, json!({"window": "1m"}));
    for (t, v) in [(5.0, 10.0), (35.0, 40.0)] {
        let m = vec![
            gauge("vllm:num_requests_waiting", &labels, t, 1.0),
            counter("vllm:request_success_total", &labels, 0.0, t, v),
        ];
        scrape_h.metrics(&scrape(&scrape_res, m));
    }
    let from_spans = spans_h.advance(60.0);
    let from_scrape = scrape_h.advance(60.0);
    let rate = |pts: &[Pt]| find(pts, "llm.request.rate", "llama", at(60.0)).cloned().unwrap();
    let (a, b) = (rate(&from_spans), rate(&from_scrape));
    let without_source = |p: &Pt| {
        let mut m = p.attrs.clone();
        m.remove("source");
        m
    };
    let want: BTreeMap<String, String> = [
        ("gen_ai.request.model", "llama"),
        ("service.name", "vllm"),
        ("service.version", "0.9.1"),
        ("service.instance.id", "10.0.0.7:8000"),
        ("k8s.namespace.name", "llm"),
        ("k8s.pod.name", "vllm-0"),
        ("k8s.node.name", "gpu-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(without_source(&a), want, "span-derived");
    assert_eq!(without_source(&b), want, "scrape-derived");
    assert_eq!((a.attrs["source"].as_str(), b.attrs["source"].as_str()), ("spans", "scrape"));

    // The scrape label is the data's own version: it wins over the resource's; an empty label
    // leaves the resource's.
    let mut h = Harness::new(Signal::Metrics, json!({"window": "1m"}));
    let mut res = scrape_res.clone();
    res.attributes.push(s("service.version", "from-resource"));
    for (t, v) in [(5.0, 1.0), (35.0, 2.0)] {
        let m = vec![
            counter("vllm:request_success_total", &[s("model_name", "a"), s("service_version", "v9")], 0.0, t, v),
            counter("vllm:request_success_total", &[s("model_name", "b"), s("service_version", "")], 0.0, t, v),
        ];
        h.metrics(&scrape(&res, m));
    }
    let out = h.advance(60.0);
    assert_eq!(find(&out, "llm.request.rate", "a", at(60.0)).unwrap().attrs["service.version"], "v9");
    assert_eq!(find(&out, "llm.request.rate", "b", at(60.0)).unwrap().attrs["service.version"], "from-resource");
}

/// The 0/1 flags have no unit (unit `1` would make their Prometheus names end in `_ratio`), the
/// windowed request count is `llm.requests.finished` (a gauge named `…_count` would read as a
/// histogram's count), the fractions keep `1`.
#[test]
fn llm_signals_units_say_what_the_values_are() {
    let mut h = Harness::new(Signal::Traces, json!({"window": "1m"}));
    let res = resource(vec![s("service.name", "vllm"), s("gen_ai.request.model", "m")]);
    let sp = span(
        "llm_request",
        10.0,
        1.0,
        vec![dbl("gen_ai.latency.time_to_first_token", 0.1), dbl("gen_ai.latency.time_in_queue", 0.9)],
        false,
    );
    h.spans(&traces(vec![(res, vec![sp])]));
    let out = h.advance(60.0);
    let unit = |name: &str| out.iter().find(|p| p.name == name).map(|p| p.unit.clone());
    assert_eq!(unit("llm.queue.blocking").as_deref(), Some(""));
    assert_eq!(find(&out, "llm.queue.blocking", "m", at(60.0)).unwrap().value, V::I(1), "p99 0.9 s > 0.8 s");
    assert_eq!(unit("llm.requests.finished").as_deref(), Some("{request}"));
    assert_eq!(unit("llm.request.error_rate").as_deref(), Some("1"));
    assert!(unit("llm.request.count").is_none(), "the old name is gone");
}

// ---- watermark, checkpoints -----------------------------------------------------------------------

const MODELS: [&str; 5] = ["m0", "m1", "m2", "m3", "m4"];

/// Batches of spans of five models (three versions), each followed by an advance; models 3 and 4
/// stop after step 4 (idle later) and five models exceed max_series 4.
fn span_script() -> Vec<(ExportTraceServiceRequest, f64)> {
    (0..14u64)
        .map(|step| {
            let mut groups = Vec::new();
            for (k, m) in MODELS.iter().enumerate() {
                if (step + k as u64).is_multiple_of(3) || (k >= 3 && step >= 4) {
                    continue;
                }
                let res = resource(vec![s("service.name", "vllm"), s("service.version", &format!("v{}", k % 3))]);
                let spans = (0..3u64)
                    .map(|j| {
                        let end = (step * 25 + k as u64 * 2 + j * 7) as f64 + 0.5;
                        let x = ((step * 7 + k as u64 * 3 + j) % 11) as f64;
                        span(
                            "llm_request",
                            end,
                            1.0,
                            vec![
                                s("gen_ai.request.model", m),
                                int("gen_ai.usage.completion_tokens", 5 + x as i64),
                                dbl("gen_ai.latency.time_to_first_token", 0.01 + x / 50.0),
                                dbl("gen_ai.latency.e2e", 0.5 + x / 4.0),
                                dbl("gen_ai.latency.time_in_queue", x / 10.0),
                            ],
                            (step + j).is_multiple_of(4),
                        )
                    })
                    .collect();
                groups.push((res, spans));
            }
            (traces(groups), (step * 25 + 5) as f64)
        })
        .collect()
}

/// Scrapes of two models every 10 s with counters (a reset at step 6), gauges and a histogram.
fn scrape_script() -> Vec<(ExportMetricsServiceRequest, f64)> {
    let res = resource(vec![s("service.name", "vllm"), s("service.instance.id", "h:1")]);
    (0..14u64)
        .map(|step| {
            let t = (step * 10 + 3) as f64;
            let mut m = Vec::new();
            for (k, model) in ["a", "b"].iter().enumerate() {
                let l = [s("model_name", model)];
                let n = if step >= 6 && k == 0 { step - 6 } else { step } as f64;
                let start = if step >= 6 && k == 0 { 62.0 } else { -5.0 };
                m.push(gauge("vllm:kv_cache_usage_perc", &l, t, (n * 0.07 + k as f64 * 0.1) % 1.0));
                m.push(counter("vllm:num_preemptions_total", &l, start, t, n * n));
                m.push(counter("vllm:generation_tokens_total", &l, start, t, n * 300.0));
                let c = (n * 3.0) as u64;
                m.push(histo(
                    "vllm:e2e_request_latency_seconds",
                    &l,
                    start,
                    t,
                    &[0.5, 1.0, 2.0],
                    &[c, c / 2, c / 3, 1],
                    n,
                ));
            }
            (scrape(&res, m), (step * 10) as f64 + 1.0)
        })
        .collect()
}

enum Input {
    Spans(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
}

fn run(h: &mut Harness, steps: &[(Input, f64)]) -> Vec<Pt> {
    let mut out = Vec::new();
    for (input, wm) in steps {
        match input {
            Input::Spans(r) => h.spans(r),
            Input::Metrics(r) => h.metrics(r),
        }
        out.extend(h.advance(*wm));
    }
    out
}

fn check_restore_continues(signal: Signal, cfg: serde_json::Value, steps: Vec<(Input, f64)>, min_points: usize) {
    let mut whole = Harness::new(signal, cfg.clone());
    let want = run(&mut whole, &steps);
    assert!(want.len() >= min_points, "the script must produce output ({})", want.len());
    for cut in [1, 5, 9] {
        let mut first = Harness::new(signal, cfg.clone());
        let mut got = run(&mut first, &steps[..cut]);
        assert_eq!(first.proc.state_version(), inferwatch_processors::llm_signals::STATE_VERSION);
        let mut second = first.restore_into(Harness::new(signal, cfg.clone()));
        got.extend(run(&mut second, &steps[cut..]));
        assert_eq!(got, want, "cut after step {cut}");
        for reason in ["idle", "max_series"] {
            assert_eq!(first.evicted(reason) + second.evicted(reason), whole.evicted(reason), "{reason}, cut {cut}");
        }
    }
}

#[test]
fn llm_signals_span_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"window": "30s", "flush_interval": "10s", "max_series": 4, "idle_timeout": "40s"});
    let steps: Vec<(Input, f64)> = span_script().into_iter().map(|(r, wm)| (Input::Spans(r), wm)).collect();
    let mut probe = Harness::new(Signal::Traces, cfg.clone());
    run(&mut probe, &steps);
    assert!(probe.evicted("max_series") > 0 && probe.evicted("idle") > 0, "the script must evict");
    check_restore_continues(Signal::Traces, cfg, steps, 500);
}

#[test]
fn llm_signals_scrape_snapshot_restore_continues_as_if_never_stopped() {
    let cfg = json!({"window": "30s"});
    let steps: Vec<(Input, f64)> = scrape_script().into_iter().map(|(r, wm)| (Input::Metrics(r), wm)).collect();
    check_restore_continues(Signal::Metrics, cfg, steps, 40);
}

#[test]
fn llm_signals_restore_refuses_corrupt_or_other_window_state() {
    let mut h = Harness::new(Signal::Traces, json!({}));
    h.spans(&vllm_spans());
    let bytes = h.proc.snapshot().unwrap();
    let mut fresh = Harness::new(Signal::Traces, json!({}));
    for bad in [&b"not a snapshot"[..], &bytes[..bytes.len() - 3]] {
        assert!(matches!(fresh.proc.restore(bad), Err(StateError::Corrupt { .. })));
    }
    assert_eq!(fresh.proc.series_count(), 0, "a refused restore leaves the state as it was");
    let mut other = Harness::new(Signal::Traces, json!({"window": "30s"}));
    assert!(matches!(other.proc.restore(&bytes), Err(StateError::Incompatible { what: "window", .. })));
}

// ---- factory and connector ------------------------------------------------------------------------

#[test]
fn llm_signals_factory_and_config_errors() {
    let f = LlmSignalsFactory;
    assert_eq!(f.type_name(), "llm_signals");
    assert_eq!(f.signal_pairs(), &[(Signal::Traces, Signal::Metrics), (Signal::Metrics, Signal::Metrics)]);
    assert!(f.validate(&serde_json::Value::Null).is_ok());
    let key = |k: &str| PathSeg::Key(k.into());
    for (cfg, path) in [
        (json!({"window": "0s"}), vec![key("window")]),
        (json!({"flush_interval": "0s"}), vec![key("flush_interval")]),
        (json!({"relative_accuracy": 1.0}), vec![key("relative_accuracy")]),
        (json!({"max_series": 0}), vec![key("max_series")]),
        (json!({"model_attributes": ["a", ""]}), vec![key("model_attributes"), PathSeg::Index(1)]),
        (json!({"idle_timeout": "soon"}), vec![key("idle_timeout")]),
    ] {
        let e = f.validate(&cfg).unwrap_err();
        assert_eq!(e.path, path, "{cfg}: {}", e.message);
    }
    let e = f.validate(&json!({"windw": "1m"})).unwrap_err();
    assert!(e.message.contains("windw"), "{}", e.message);
    let ctx = CreateContext::new(ComponentId::parse("llm_signals").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create_arrow(ctx, &json!({}), Signal::Logs).is_err());
}

#[tokio::test]
async fn llm_signals_connector_emits_only_derived_metrics() {
    let capture = Sink::new();
    let ctx = CreateContext::new(ComponentId::parse("llm_signals").unwrap(), Arc::new(Telemetry::new()));
    let f = LlmSignalsFactory;
    let wrong = CreateContext::new(ComponentId::parse("llm_signals").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.create(wrong, &json!({}), Signal::Traces, Signal::Traces, capture.clone()).is_err());
    let node =
        f.create(ctx, &json!({"allowed_lateness": "0s"}), Signal::Traces, Signal::Metrics, capture.clone()).unwrap();
    node.consume(Payload::Traces(vllm_spans())).await.unwrap();
    // The spans themselves never reach the output; the watermark (40 s) closes the flushes before it.
    let got: Vec<Payload> = capture.take();
    assert!(got.iter().all(|p| matches!(p, Payload::Metrics(_))));
    let early: Vec<Pt> =
        got.iter().flat_map(|p| if let Payload::Metrics(m) = p { flatten(m) } else { vec![] }).collect();
    assert!(early.iter().all(|p| p.time <= at(40.0)) && !early.is_empty());
    node.end_of_input().await;
    let rest: Vec<Pt> = capture
        .payloads()
        .iter()
        .flat_map(|p| if let Payload::Metrics(m) = p { flatten(m) } else { panic!("not metrics") })
        .collect();
    assert_eq!(find(&rest, "llm.requests.finished", "llama", at(60.0)).unwrap().value, V::I(20));
    assert_eq!(find(&rest, "llm.requests.finished", "qwen", at(60.0)).unwrap().value, V::I(3));
    assert!(rest.iter().all(|p| p.time <= at(60.0)), "end of input emits only windows and flushes holding data");
}

// ---- per_request ----------------------------------------------------------------------------------

#[test]
fn llm_signals_per_request_points_carry_each_measured_latency_and_the_request_id() {
    let cfg = json!({"window": "1m", "flush_interval": "15s", "per_request": true});
    let mut h = Harness::new(Signal::Traces, cfg);
    let pts = h.spans_out(&vllm_spans());
    let names: BTreeSet<&str> = pts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["llm.request.ttft", "llm.request.tpot", "llm.request.e2e", "llm.request.queue"]));
    assert!(pts.iter().all(|p| p.unit == "s" && p.start == 0 && p.attrs["source"] == "spans"));
    let get = |name: &str, model: &str, time: u64| {
        let found: Vec<&Pt> = pts.iter().filter(|p| p.name == name && p.model() == model && p.time == time).collect();
        assert!(found.len() <= 1, "{name} {model} {time}: {found:?}");
        found.first().map(|p| (p.value.f(), p.attrs.clone()))
    };
    // Model A: ids on every span; failed requests (4, 9, 14, 19) have no TTFT and no TPOT.
    for (i, r) in requests_a().iter().enumerate() {
        let t = at(r.end);
        let (e2e, attrs) = get("llm.request.e2e", "llama", t).unwrap();
        close(e2e, r.e2e, "e2e");
        assert_eq!(attrs["gen_ai.request.id"], format!("req-{i}"));
        assert_eq!((attrs["service.version"].as_str(), attrs["service.instance.id"].as_str()), ("v1", "i-a"));
        close(get("llm.request.queue", "llama", t).unwrap().0, r.queue, "queue");
        match (get("llm.request.ttft", "llama", t), get("llm.request.tpot", "llama", t)) {
            (None, None) => assert!(r.error, "request {i}"),
            (Some((ttft, _)), Some((tpot, _))) => {
                assert!(!r.error, "request {i}");
                close(ttft, r.ttft, "ttft");
                close(tpot, (r.e2e - r.ttft) / (r.completion - 1) as f64, "tpot");
            }
            other => panic!("request {i}: ttft and tpot both or neither: {other:?}"),
        }
    }
    // Model B: no request id attribute; the failed request (40 s) has e2e and queue only.
    let (ttft, attrs) = get("llm.request.ttft", "qwen", at(20.0)).unwrap();
    close(ttft, 0.3, "qwen ttft");
    assert!(!attrs.contains_key("gen_ai.request.id"), "{attrs:?}");
    close(get("llm.request.tpot", "qwen", at(10.0)).unwrap().0, 0.47 / 4.0, "qwen tpot");
    assert!(get("llm.request.ttft", "qwen", at(40.0)).is_none());
    close(get("llm.request.e2e", "qwen", at(40.0)).unwrap().0, 1.2, "qwen failed e2e");
    let count = |name: &str| pts.iter().filter(|p| p.name == name).count();
    assert_eq!((count("llm.request.ttft"), count("llm.request.tpot")), (18, 18));
    assert_eq!((count("llm.request.e2e"), count("llm.request.queue")), (23, 23));
    // Points of one metric are in time order.
    let times: Vec<u64> = pts.iter().filter(|p| p.name == "llm.request.e2e").map(|p| p.time).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));

    // A span before the watermark yields nothing.
    h.advance(60.0);
    let late = traces(vec![(
        resource(vec![s("service.name", "vllm-a")]),
        vec![span(
            "llm_request",
            30.0,
            1.0,
            vec![s("gen_ai.request.id", "late"), dbl("gen_ai.latency.e2e", 1.0)],
            false,
        )],
    )]);
    assert!(h.spans_out(&late).is_empty());
}

#[test]
fn llm_signals_per_request_leaves_the_windowed_outputs_unchanged() {
    let base = json!({"window": "1m", "flush_interval": "15s"});
    let mut off = Harness::new(Signal::Traces, base.clone());
    let mut on_cfg = base;
    on_cfg["per_request"] = json!(true);
    let mut on = Harness::new(Signal::Traces, on_cfg);
    off.spans(&vllm_spans());
    assert!(!on.spans_out(&vllm_spans()).is_empty());
    for wm in [30.0, 61.0, 200.0] {
        let (a, b) = (off.advance(wm), on.advance(wm));
        assert!(!a.is_empty() || wm == 200.0);
        assert_eq!(a, b, "at {wm}");
    }
    assert_eq!(off.proc.snapshot().unwrap(), on.proc.snapshot().unwrap(), "per_request keeps no state");
    let e = LlmSignalsFactory.validate(&json!({"per_request": "yes"})).unwrap_err();
    assert_eq!(e.path, vec![PathSeg::Key("per_request".into())], "{}", e.message);
}
