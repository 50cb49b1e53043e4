//! `llm_signals` on what the servers' spans really carry (tests/fixtures/servers/*.spans.json:
//! names, attribute keys, status, finish reasons) and on the bench's quality signals (issue 20,
//! items 1 and 7). Spans and metrics go through the real OTLP → Arrow conversion of the stage.

use inferwatch_core::pdata::Signal;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{
    self, f64_kv as dbl, histogram_point, int_kv as int, kv as s, metrics_request, resource, scope,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const S: u64 = 1_000_000_000;
/// A window boundary (a multiple of 60 s).
const BASE: u64 = 1_699_999_980 * S;

fn at(secs: f64) -> u64 {
    BASE + (secs * 1e9).round() as u64
}

fn fixture(file: &str) -> Value {
    let path = format!("{}/../tests/fixtures/servers/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fixture's description of the span whose `name` field starts with `prefix`.
fn span_spec<'a>(spans: &'a Value, prefix: &str) -> &'a Value {
    spans["spans"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix))))
        .unwrap_or_else(|| panic!("no span {prefix:?} in the fixture"))
}

fn keys(spec: &Value, field: &str) -> Vec<String> {
    spec[field]
        .as_array()
        .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn span(name: &str, end_s: f64, dur_s: f64, attrs: Vec<KeyValue>, error: bool) -> Span {
    let end = at(end_s);
    Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        name: name.into(),
        kind: 1,
        start_time_unix_nano: end - (dur_s * 1e9).round() as u64,
        end_time_unix_nano: end,
        attributes: attrs,
        status: Some(Status { code: if error { 2 } else { 0 }, message: String::new() }),
        ..Default::default()
    }
}

fn traces(res: Resource, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest { resource_spans: vec![otlp::resource_spans(res.attributes, scope("server", ""), spans)] }
}

/// Output points: (name, model, version, source) → value (one point per key asserted).
type Out = BTreeMap<(String, String, String, String), f64>;

fn attr(kvs: &[KeyValue], key: &str) -> String {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn gauges(reqs: &[ExportMetricsServiceRequest]) -> Out {
    let mut out = Out::new();
    for m in reqs.iter().flat_map(|r| &r.resource_metrics).flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
        let Some(metric::Data::Gauge(g)) = &m.data else { continue };
        // The prompt-length split (one point per `llm.input_bucket`) is tested in llm_signals_buckets.rs.
        for p in g.data_points.iter().filter(|p| p.attributes.iter().all(|kv| kv.key != "llm.input_bucket")) {
            let key = (
                m.name.clone(),
                attr(&p.attributes, "gen_ai.request.model"),
                attr(&p.attributes, "service.version"),
                attr(&p.attributes, "source"),
            );
            let v = match p.value {
                Some(number_data_point::Value::AsDouble(d)) => d,
                Some(number_data_point::Value::AsInt(i)) => i as f64,
                None => f64::NAN,
            };
            assert!(out.insert(key.clone(), v).is_none(), "{key:?} twice");
        }
    }
    out
}

fn get(out: &Out, name: &str, model: &str, version: &str, source: &str) -> f64 {
    let key = (name.to_string(), model.to_string(), version.to_string(), source.to_string());
    *out.get(&key).unwrap_or_else(|| panic!("no {key:?} in {:#?}", out.keys().collect::<Vec<_>>()))
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

/// SGLang 0.5.23: the root span `" Req <rid[:8]>"` is the request, read as vLLM's; an abort is
/// its `gen_ai.response.finish_reasons` JSON string; the per-thread span with status ERROR is not
/// a request.
#[test]
fn llm_signals_fixtures_sglang_root_spans_are_requests_and_their_aborts_errors() {
    let fx = fixture("sglang-0.5.23.spans.json");
    let root = span_spec(&fx, "'<role> Req");
    assert_eq!(root["sets_finish_reasons"], true);
    assert_eq!(root["sets_status"], false);
    let at_finish = keys(root, "attributes_at_finish");
    for k in ["gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e", "gen_ai.usage.completion_tokens"] {
        assert!(at_finish.iter().any(|x| x == k), "{k} not in the fixture's root span");
    }
    let value = |key: &str, i: usize| -> KeyValue {
        match key {
            "gen_ai.usage.completion_tokens" => int(key, 21),
            "gen_ai.usage.prompt_tokens" => int(key, 40),
            "gen_ai.usage.cached_tokens" => int(key, 0),
            "gen_ai.request.id" => s(key, &format!("{i:08x}aaaa")),
            "gen_ai.response.model" => s(key, "qwen-sglang"),
            "gen_ai.latency.time_to_first_token" => dbl(key, 0.05),
            "gen_ai.latency.e2e" => dbl(key, 0.45),
            k => dbl(k, 0.1),
        }
    };
    let mut spans = Vec::new();
    for i in 0..4 {
        let mut attrs: Vec<KeyValue> = keys(root, "attributes_always")
            .iter()
            .map(|k| s(k, if k == "rid" { "1a2b3c4d5e6f" } else { "tokenizer" }))
            .collect();
        attrs.extend(at_finish.iter().map(|k| value(k, i)));
        // One abort: the JSON string of a one-element list, as tokenizer_manager.py writes it.
        attrs.push(s("gen_ai.response.finish_reasons", if i == 3 { "[\"abort\"]" } else { "[\"stop\"]" }));
        spans.push(span(&format!(" Req {:08x}", 0x1a2b_3c4d + i), 10.0 + i as f64, 0.45, attrs, false));
    }
    // The thread span carries ERROR on the abort; slice spans are children. Neither is a request.
    spans.push(span("Scheduler", 13.0, 0.4, vec![int("tp_rank", 0)], true));
    spans.push(span("prefill", 13.0, 0.1, vec![], false));
    let mut h = Harness::create(&LlmSignalsFactory, "llm_signals/sglang", &json!({"window": "1m"}), Signal::Traces);
    assert!(h.process_spans(&traces(resource(vec![s("service.name", "sglang")]), spans)).is_empty());
    let out = gauges(&h.advance_metrics(at(60.0)));
    let m = "qwen-sglang";
    assert_eq!(get(&out, "llm.requests.finished", m, "", "spans"), 4.0);
    close(get(&out, "llm.request.error_rate", m, "", "spans"), 0.25, "one abort in four");
    // TTFT and TPOT of the three successful requests; e2e of all four.
    assert!((get(&out, "llm.ttft.p50", m, "", "spans") - 0.05).abs() <= 0.01 * 0.05, "ttft within α");
    close(get(&out, "llm.tokens.output.rate", m, "", "spans"), 84.0 / 60.0, "output tokens");
    assert!((get(&out, "llm.tpot.p50", m, "", "spans") - 0.4 / 20.0).abs() < 0.02 * 0.02, "tpot");
}

/// vLLM 0.33 sets no status and no finish reason on `llm_request`: the spans' error rate is 0
/// whatever a finish-reason attribute (which real vLLM never writes) says. Its errors come from
/// the scrape (`vllm:request_success_total{finished_reason}`, llm_signals_servers.rs).
/// TGI: `chat_completions` / `completions` are requests with or without `total_time` (a failed
/// request records none); `generate` only with `total_time` or `parameters` (the inner
/// `router/src/infer` span of that name has neither).
#[test]
fn llm_signals_fixtures_span_errors_only_from_what_servers_set() {
    let vllm = fixture("vllm-0.33.0.spans.json");
    let req = span_spec(&vllm, "llm_request");
    assert_eq!((req["sets_finish_reasons"].clone(), req["sets_status"].clone()), (json!(false), json!(false)));
    let mk = |i: usize, extra: Vec<KeyValue>| {
        let mut attrs: Vec<KeyValue> = keys(req, "attributes_always")
            .iter()
            .map(|k| match k.as_str() {
                "gen_ai.usage.prompt_tokens" | "gen_ai.usage.completion_tokens" => int(k, 10),
                "gen_ai.request.id" => s(k, &format!("cmpl-{i}")),
                k => dbl(k, 0.2),
            })
            .collect();
        attrs.extend(extra);
        span("llm_request", 5.0 + i as f64, 0.2, attrs, false)
    };
    let spans = vec![
        mk(0, vec![]),
        mk(1, vec![s("gen_ai.response.finish_reasons", "[\"abort\"]")]),
        mk(2, vec![s("error.type", "oops")]),
    ];
    let res = resource(vec![s("service.name", "vllm"), s("gen_ai.request.model", "llama")]);
    let mut h = Harness::create(&LlmSignalsFactory, "llm_signals/vllm", &json!({"window": "1m"}), Signal::Traces);
    assert!(h.process_spans(&traces(res, spans)).is_empty());
    let out = gauges(&h.advance_metrics(at(60.0)));
    assert_eq!(get(&out, "llm.requests.finished", "llama", "", "spans"), 3.0);
    assert_eq!(get(&out, "llm.request.error_rate", "llama", "", "spans"), 0.0, "vLLM spans carry no error");

    let tgi = fixture("tgi-3.3.7.spans.json");
    assert_eq!(tgi["sets_finish_reasons"], false);
    let fields = keys(span_spec(&tgi, "generate"), "attributes_always");
    assert!(fields.iter().any(|f| f == "parameters") && fields.iter().any(|f| f == "total_time"));
    let spans = vec![
        span("generate", 10.0, 1.0, vec![s("parameters", "GenerateParameters { .. }"), s("total_time", "1s")], false),
        span("generate", 10.0, 0.99, vec![], false), // router/src/infer's inner span
        // A failed request: the handler records no timing, the span is ERROR.
        span("chat_completions", 20.0, 0.5, vec![], true),
        span("completions", 30.0, 0.25, vec![s("total_time", "250ms"), s("queue_time", "1ms")], false),
        span("compat_generate", 10.0, 1.0, vec![], false),
    ];
    let res = resource(vec![s("service.name", "text-generation-inference.router")]);
    let mut h = Harness::create(&LlmSignalsFactory, "llm_signals/tgi", &json!({"tgi_model": "bloom"}), Signal::Traces);
    assert!(h.process_spans(&traces(res, spans)).is_empty());
    let out = gauges(&h.advance_metrics(at(60.0)));
    assert_eq!(get(&out, "llm.requests.finished", "bloom", "", "spans"), 3.0, "three handler spans");
    close(get(&out, "llm.request.error_rate", "bloom", "", "spans"), 1.0 / 3.0, "the ERROR handler span");
    // e2e: total_time, else the span duration: the median of (1 s, 0.5 s, 0.25 s) is the failed one's.
    assert!((get(&out, "llm.e2e.p50", "bloom", "", "spans") - 0.5).abs() <= 0.01 * 0.5, "e2e p50");
}

/// The bench's quality span attributes (a semconv CLIENT span per request) become per-version
/// windowed quality signals and, with `per_request`, one point per request.
#[test]
fn llm_signals_fixtures_bench_quality_attributes_become_quality_signals() {
    let bench = |version: &str, values: &[(f64, f64)]| {
        let res = resource(vec![s("service.name", "inferwatch-bench"), s("service.version", version)]);
        let spans = values
            .iter()
            .enumerate()
            .map(|(i, (tle, rci))| {
                let attrs = vec![
                    s("gen_ai.operation.name", "chat"),
                    s("gen_ai.request.model", "m"),
                    dbl("gen_ai.response.time_to_first_chunk", 0.05),
                    int("gen_ai.usage.output_tokens", 10),
                    dbl("inferwatch.bench.tle_bits", *tle),
                    int("inferwatch.bench.top_k", 5),
                    dbl("inferwatch.bench.rci", *rci),
                ];
                span("chat m", 1.0 + i as f64, 0.5, attrs, false)
            })
            .collect();
        traces(res, spans)
    };
    let a = [(0.5, 0.0), (0.7, 0.0), (0.6, 0.02)];
    let b = [(1.5, 0.4), (1.9, 0.6), (1.2, 0.5), (f64::NAN, 1.5)]; // the last: out of range, not read
    let mut h = Harness::create(
        &LlmSignalsFactory,
        "llm_signals/quality",
        &json!({"window": "1m", "per_request": true}),
        Signal::Traces,
    );
    let per_request = |reqs: &[ExportMetricsServiceRequest], name: &str| -> Vec<f64> {
        reqs.iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .filter(|m| m.name == name)
            .flat_map(|m| match &m.data {
                Some(metric::Data::Gauge(g)) => g.data_points.iter().filter_map(|p| match p.value {
                    Some(number_data_point::Value::AsDouble(d)) => Some(d),
                    _ => None,
                }),
                _ => panic!("not a gauge"),
            })
            .collect()
    };
    let out_a = h.process_spans(&bench("A", &a));
    assert_eq!(per_request(&out_a, "llm.request.quality"), vec![1.0, 1.0, 0.98]);
    assert_eq!(per_request(&out_a, "llm.request.tle"), vec![0.5, 0.7, 0.6]);
    let out_b = h.process_spans(&bench("B", &b));
    assert_eq!(per_request(&out_b, "llm.request.quality"), vec![0.6, 0.4, 0.5], "1 − RCI; RCI 1.5 skipped");
    assert_eq!(per_request(&out_b, "llm.request.rci"), vec![0.4, 0.6, 0.5]);
    assert_eq!(per_request(&out_b, "llm.request.tle"), vec![1.5, 1.9, 1.2], "NaN skipped");
    let out = gauges(&h.advance_metrics(at(60.0)));
    close(get(&out, "llm.quality.rci.mean", "m", "A", "spans"), 0.02 / 3.0, "rci mean A");
    close(get(&out, "llm.quality.score", "m", "A", "spans"), 1.0 - 0.02 / 3.0, "score A");
    close(get(&out, "llm.quality.rci.mean", "m", "B", "spans"), 0.5, "rci mean B");
    close(get(&out, "llm.quality.score", "m", "B", "spans"), 0.5, "score B");
    close(get(&out, "llm.quality.tle.mean", "m", "B", "spans"), 4.6 / 3.0, "tle mean B (NaN skipped)");
    let p50 = get(&out, "llm.quality.tle.p50", "m", "B", "spans");
    assert!((p50 - 1.5).abs() <= 0.01 * 1.5, "DDSketch median within α: {p50}");
    assert!(get(&out, "llm.quality.tle.mean", "m", "A", "spans") < 0.7);
}

/// The bench's OTLP histograms `inferwatch.bench.tle_bits` / `.rci`: per model (point attribute)
/// and version (resource), windowed p50 / mean / score; the first export of a series counts from
/// its start time (the bench's first export already holds data).
#[test]
fn llm_signals_fixtures_bench_quality_histograms_become_quality_signals() {
    const RCI_BOUNDS: &[f64] =
        &[0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95];
    const TLE_BOUNDS: &[f64] = &[0.5, 1.0, 1.5, 2.0, 2.5];
    let push = |version: &str, t: f64, rci: &[u64], rci_sum: f64, tle: &[u64], tle_sum: f64| {
        let res = vec![s("service.name", "inferwatch-bench"), s("service.version", version)];
        let attrs = vec![s("gen_ai.request.model", "m"), s("gen_ai.operation.name", "chat")];
        let h = |name: &str, bounds: &[f64], counts: &[u64], sum: f64| {
            otlp::histogram(name, "", vec![histogram_point(attrs.clone(), at(0.5), at(t), bounds, counts, sum)])
        };
        metrics_request(
            res,
            scope("inferwatch.bench", ""),
            vec![
                h("inferwatch.bench.rci", RCI_BOUNDS, rci, rci_sum),
                h("inferwatch.bench.tle_bits", TLE_BOUNDS, tle, tle_sum),
                // Not a quality signal: passes through unread.
                h("gen_ai.client.operation.duration", &[1.0], &[4, 0], 1.0),
            ],
        )
    };
    let mut rci_b = vec![0u64; RCI_BOUNDS.len() + 1];
    rci_b[9] = 3; // (0.45, 0.5]
    let mut rci_b2 = rci_b.clone();
    rci_b2[11] = 1; // + one in (0.55, 0.6]
    let mut rci_a = vec![0u64; RCI_BOUNDS.len() + 1];
    rci_a[0] = 4;
    let mut h = Harness::create(&LlmSignalsFactory, "llm_signals/bench", &json!({"window": "1m"}), Signal::Metrics);
    for req in [
        push("A", 10.0, &rci_a, 0.04, &[4, 0, 0, 0, 0, 0], 1.6),
        push("B", 10.0, &rci_b, 1.44, &[0, 0, 1, 2, 0, 0], 5.2),
        push("B", 20.0, &rci_b2, 2.02, &[0, 0, 1, 3, 0, 0], 7.1),
    ] {
        assert!(h.process_metrics(&req).is_empty());
    }
    let out = gauges(&h.advance_metrics(at(60.0)));
    let src = "scrape";
    // Every observation counted, the first export's included: 4 answers of B, sum 2.02.
    close(get(&out, "llm.quality.rci.mean", "m", "B", src), 2.02 / 4.0, "rci mean B");
    close(get(&out, "llm.quality.score", "m", "B", src), 1.0 - 2.02 / 4.0, "score B");
    close(get(&out, "llm.quality.tle.mean", "m", "B", src), 7.1 / 4.0, "tle mean B");
    let p50 = get(&out, "llm.quality.tle.p50", "m", "B", src);
    assert!((1.5..=2.0).contains(&p50), "p50 in the bucket of rank 2 of 4: {p50}");
    // A: every RCI in the first bucket: the one-bucket rule gives the mean, not 0.025.
    close(get(&out, "llm.quality.rci.p50", "m", "A", src), 0.01, "rci p50 A");
    close(get(&out, "llm.quality.score", "m", "A", src), 0.99, "score A");
    assert!(out.keys().all(|k| k.0.starts_with("llm.quality.")), "nothing else from the bench's metrics: {out:?}");
}
