//! `inferwatch sim --flavor tgi`: `/metrics` as Hugging Face TGI exposes it (names, types,
//! no `_total`, no model label, TGI's buckets, the `tgi_request_skipped_tokens` summary)
//! with counts that follow the traffic, `GET /info`, and TGI's router handler spans with
//! Debug-formatted durations (tests/fixtures/servers/tgi-*).

use crate::support;

use std::collections::BTreeSet;

use clap::Parser;
use inferwatch_sim::server::{Flavor, SimArgs};
use inferwatch_testkit::attrs::{attr, str_of};
use inferwatch_testkit::capture;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::span;
use serde_json::{Value, json};
use support::*;

const COUNTERS: &[&str] = &[
    "tgi_request_count",
    "tgi_request_success",
    "tgi_request_failure",
    "tgi_batch_inference_count",
    "tgi_batch_inference_success",
];
const GAUGES: &[&str] =
    &["tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens"];
const REQUEST_DURATIONS: &[&str] = &[
    "tgi_request_duration",
    "tgi_request_validation_duration",
    "tgi_request_queue_duration",
    "tgi_request_inference_duration",
    "tgi_request_mean_time_per_token_duration",
];
const BATCH_DURATIONS: &[&str] = &[
    "tgi_batch_inference_duration",
    "tgi_batch_forward_duration",
    "tgi_batch_decode_duration",
    "tgi_batch_filter_duration",
];
/// TGI's source (tests/fixtures/servers/tgi-*.metrics.json), rounded to 6 decimals.
const REFERENCE_DURATION_BUCKETS: &[f64] = &[
    0.00015, 0.000225, 0.000338, 0.000506, 0.000759, 0.001139, 0.001709, 0.002563, 0.003844, 0.005767, 0.00865,
    0.012975, 0.019462, 0.029193, 0.043789, 0.065684, 0.098526, 0.147789, 0.221684, 0.332526, 0.498789, 0.748183,
    1.122274, 1.683411, 2.525117, 3.787675, 5.681513, 8.522269, 12.783404, 19.175106, 28.762659, 43.143988, 64.715982,
    97.073974, 145.610961,
];

fn tgi_args() -> SimArgs {
    SimArgs { flavor: Flavor::Tgi, ..args() }
}

/// TGI's duration buckets, computed as its router computes them.
fn duration_buckets() -> Vec<f64> {
    let mut value = 0.0001;
    let mut out = Vec::new();
    for _ in 0..35 {
        value *= 1.5;
        out.push(value);
    }
    out
}

/// The `le` bounds (without `+Inf`) of a histogram, checking it is cumulative and complete.
fn bounds(e: &Exposition, name: &str, label: Option<(&str, &str)>) -> Vec<f64> {
    let bucket = format!("{name}_bucket");
    let b: Vec<&Sample> = e.named(&bucket).filter(|s| label.is_none_or(|(k, v)| s.label(k) == Some(v))).collect();
    assert!(!b.is_empty(), "{name} has buckets");
    assert_eq!(b.last().unwrap().label("le"), Some("+Inf"), "{name}");
    assert!(b.windows(2).all(|w| w[0].value <= w[1].value), "{name} is cumulative");
    let count: Vec<f64> = e
        .named(&format!("{name}_count"))
        .filter(|s| label.is_none_or(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
        .collect();
    assert_eq!(count, vec![b.last().unwrap().value], "{name}: _count = +Inf bucket");
    b[..b.len() - 1].iter().map(|s| s.label("le").unwrap().parse::<f64>().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_tgis_and_follow_the_traffic() {
    let server = start(tgi_args()).await;
    let c = client();
    let base = server.base_url();

    // idle: only what TGI sets at start-up
    let resp = c.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"].to_str().unwrap(), "text/plain; charset=utf-8");
    let idle = parse_exposition(&resp.text().await.unwrap());
    assert_eq!(idle.types, vec![("tgi_batch_max_total_tokens".to_string(), "gauge".to_string())]);
    let capacity = idle.value("tgi_batch_max_total_tokens");
    assert!(capacity > 0.0 && capacity % 16.0 == 0.0, "KV capacity in tokens: {capacity}");

    // traffic: 2 chats, 1 streamed chat, 1 completion of 2 prompts, 1 invalid chat
    let (mut completion, mut prompt) = (0u64, 0u64);
    for i in 0..2 {
        let (s, v) = post_json(
            &c,
            &format!("{base}/v1/chat/completions"),
            &json!({"messages": [{"role": "user", "content": format!("question number {i}")}], "max_tokens": 5}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        completion += v["usage"]["completion_tokens"].as_u64().unwrap();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    let sse = post_sse(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "stream it"}], "max_tokens": 4, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await;
    assert!(sse.done);
    let usage = &sse.chunks.last().unwrap()["usage"];
    completion += usage["completion_tokens"].as_u64().unwrap();
    prompt += usage["prompt_tokens"].as_u64().unwrap();
    let (s, v) = post_json(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": ["a b c", "d e f g h"], "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    completion += v["usage"]["completion_tokens"].as_u64().unwrap();
    prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
    let (s, v) = post_json(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "too much"}], "max_tokens": 100000}),
    )
    .await;
    assert_eq!(s, 400, "{v}");

    let (status, text) = get_text(&c, &format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let e = parse_exposition(&text);

    // names, types, labels: TGI's, as metrics-exporter-prometheus writes them
    for name in COUNTERS {
        assert_eq!(e.type_of(name), Some("counter"), "{name}");
    }
    for name in GAUGES {
        assert_eq!(e.type_of(name), Some("gauge"), "{name}");
    }
    for name in REQUEST_DURATIONS.iter().chain(BATCH_DURATIONS).chain(&[
        "tgi_request_generated_tokens",
        "tgi_request_input_length",
        "tgi_request_max_new_tokens",
        "tgi_batch_next_size",
    ]) {
        assert_eq!(e.type_of(name), Some("histogram"), "{name}");
    }
    assert_eq!(e.type_of("tgi_request_skipped_tokens"), Some("summary"));
    for s in &e.samples {
        assert!(s.name.starts_with("tgi_"), "{}", s.name);
        assert!(!s.name.ends_with("_total") && !s.name.ends_with("_created"), "no _total, no _created: {}", s.name);
        for (k, v) in &s.labels {
            let ok = match k.as_str() {
                "le" | "quantile" => true,
                "err" => s.name == "tgi_request_failure",
                "method" => s.name.starts_with("tgi_batch_") && (v == "prefill" || v == "decode"),
                "reason" => s.name == "tgi_batch_concat",
                _ => false,
            };
            assert!(ok, "label {k}={v} on {}: TGI metrics have no model label", s.name);
        }
    }
    assert!(text.contains("# HELP tgi_request_count Total number of requests\n# TYPE tgi_request_count counter\n"));
    assert!(text.contains("\n\n# TYPE tgi_request_failure counter\n"), "no HELP for the undescribed failure counter");

    // counts: TGI counts a request in its OpenAI handler and again per generation
    assert_eq!(e.value("tgi_request_count"), (2 * 2 + 2 + (1 + 2) + 2) as f64);
    assert_eq!(e.value("tgi_request_success"), 5.0);
    let failures: Vec<(&str, f64)> =
        e.named("tgi_request_failure").map(|s| (s.label("err").unwrap(), s.value)).collect();
    assert_eq!(failures, vec![("validation", 1.0)]);
    for name in REQUEST_DURATIONS.iter().chain(&["tgi_request_generated_tokens"]) {
        assert_eq!(e.value(&format!("{name}_count")), 5.0, "{name}: one per generation");
    }
    assert_eq!(e.value("tgi_request_generated_tokens_sum"), completion as f64, "generated tokens = usage");
    assert_eq!(e.value("tgi_request_input_length_count"), 5.0);
    assert_eq!(e.value("tgi_request_input_length_sum"), prompt as f64, "input length = usage");
    assert_eq!(e.value("tgi_request_max_new_tokens_sum"), (5 + 5 + 4 + 3 + 3) as f64);
    let sum = |n: &str| e.value(&format!("{n}_sum"));
    let parts = sum("tgi_request_validation_duration")
        + sum("tgi_request_queue_duration")
        + sum("tgi_request_inference_duration");
    assert!((parts - sum("tgi_request_duration")).abs() < 1e-6, "validation + queue + inference = total");
    assert!(sum("tgi_request_duration") > 0.0 && sum("tgi_request_duration") < 60.0);
    assert!(sum("tgi_request_mean_time_per_token_duration") < sum("tgi_request_inference_duration"));

    // the batching loop
    for method in ["prefill", "decode"] {
        let l = Some(("method", method));
        let calls: f64 =
            e.named("tgi_batch_inference_count").filter(|s| s.label("method") == Some(method)).map(|s| s.value).sum();
        assert!(calls >= 1.0, "{method} calls");
        let ok: f64 =
            e.named("tgi_batch_inference_success").filter(|s| s.label("method") == Some(method)).map(|s| s.value).sum();
        assert_eq!(ok, calls, "{method}: every call succeeded");
        for name in BATCH_DURATIONS {
            assert_eq!(bounds(&e, name, l), duration_buckets(), "{name}{{method={method}}}");
            let n: f64 =
                e.named(&format!("{name}_count")).filter(|s| s.label("method") == Some(method)).map(|s| s.value).sum();
            assert_eq!(n, calls, "{name}: one per {method} call");
        }
    }
    assert!(e.value("tgi_batch_next_size_sum") >= 5.0, "every generation joined a batch");
    assert_eq!(bounds(&e, "tgi_batch_next_size", None), (1..=1024).map(f64::from).collect::<Vec<_>>());
    for name in GAUGES.iter().take(3) {
        assert_eq!(e.value(name), 0.0, "{name} at idle");
    }
    assert_eq!(e.value("tgi_batch_max_total_tokens"), capacity);

    // buckets: TGI's, to the last bit
    let d = duration_buckets();
    for name in REQUEST_DURATIONS {
        assert_eq!(bounds(&e, name, None), d, "{name}");
    }
    assert_eq!(d.len(), REFERENCE_DURATION_BUCKETS.len());
    for (got, want) in d.iter().zip(REFERENCE_DURATION_BUCKETS) {
        assert!((got - want).abs() <= 1e-6 * want.max(1.0), "{got} vs the reference's {want}");
    }
    assert!(text.contains("tgi_request_duration_bucket{le=\"0.00015000000000000001\"} "), "le as Rust Display");
    let linear = |max: f64| (1..=100).map(|k| (max / 100.0) * f64::from(k)).collect::<Vec<f64>>();
    assert_eq!(bounds(&e, "tgi_request_input_length", None), linear(8191.0));
    assert_eq!(bounds(&e, "tgi_request_generated_tokens", None), linear(8192.0));
    assert_eq!(bounds(&e, "tgi_request_max_new_tokens", None), linear(8192.0));

    // the summary: one zero per generated token (no speculation)
    let q: Vec<(&str, f64)> =
        e.named("tgi_request_skipped_tokens").map(|s| (s.label("quantile").unwrap(), s.value)).collect();
    assert_eq!(
        q,
        vec![("0", 0.0), ("0.5", 0.0), ("0.9", 0.0), ("0.95", 0.0), ("0.99", 0.0), ("0.999", 0.0), ("1", 0.0)]
    );
    assert_eq!(e.value("tgi_request_skipped_tokens_count"), completion as f64);
    assert_eq!(e.value("tgi_request_skipped_tokens_sum"), 0.0);

    promtool_accepts(&text);
    server.shutdown().await;
}

/// `promtool check metrics` parses it; its only lint findings are what real TGI output gets.
fn promtool_accepts(text: &str) {
    support::promtool_accepts(text, |line| {
        line.ends_with("counter metrics should have \"_total\" suffix")
            || line.ends_with("non-histogram and non-summary metrics should not have \"_count\" suffix")
            || line.ends_with("no help text")
    });
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_and_the_flavor_flag() {
    assert_eq!(Cli::try_parse_from(["sim", "--flavor", "tgi"]).unwrap().sim.flavor, Flavor::Tgi);
    assert_eq!(Cli::try_parse_from(["sim"]).unwrap().sim.flavor, Flavor::Vllm, "vllm by default");
    assert_eq!(Cli::try_parse_from(["sim", "--flavor", "sglang"]).unwrap().sim.flavor, Flavor::Sglang);
    assert!(Cli::try_parse_from(["sim", "--flavor", "trtllm"]).is_err());

    let c = client();
    let tgi = start(tgi_args()).await;
    let (status, text) = get_text(&c, &format!("{}/info", tgi.base_url())).await;
    assert_eq!(status, 200);
    let info: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(info["model_id"], "sim-model");
    assert_eq!(info["max_total_tokens"], 8192);
    assert_eq!(info["max_input_tokens"], 8191);
    assert_eq!(info["router"], "text-generation-router");
    assert!(info["version"].as_str().is_some_and(|v| v.starts_with('3')));
    let sha = info["model_sha"].as_str().unwrap();
    assert!(sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()), "{sha}");
    let keys = [
        "model_id",
        "model_sha",
        "model_pipeline_tag",
        "max_concurrent_requests",
        "max_best_of",
        "max_stop_sequences",
        "max_input_tokens",
        "max_total_tokens",
        "validation_workers",
        "max_client_batch_size",
        "router",
        "version",
        "sha",
        "docker_label",
    ];
    let pos: Vec<usize> = keys.iter().map(|k| text.find(&format!("\"{k}\":")).expect(k)).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "TGI's field order: {text}");
    assert_eq!(info.as_object().unwrap().len(), keys.len());
    // the OpenAI API is the same in both flavours
    let (s, models) = get_text(&c, &format!("{}/v1/models", tgi.base_url())).await;
    assert_eq!(s, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "sim-model");
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    tgi.shutdown().await;

    // vLLM flavour: no /info, vLLM's metrics
    let vllm = start(args()).await;
    let (status, _) = get_text(&c, &format!("{}/info", vllm.base_url())).await;
    assert_eq!(status, 404);
    let (_, text) = get_text(&c, &format!("{}/metrics", vllm.base_url())).await;
    assert!(text.contains("# TYPE vllm:num_requests_running gauge\n") && !text.contains("tgi_"));
    vllm.shutdown().await;
}

/// Parses Rust's `Debug` of a `Duration` ("12.345ms", "1.5s", "850µs", "0ns") back into
/// nanoseconds, exactly.
fn debug_duration_ns(s: &str) -> u128 {
    let (num, digits) = if let Some(n) = s.strip_suffix("ns") {
        (n, 0)
    } else if let Some(n) = s.strip_suffix("µs") {
        (n, 3)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 9)
    } else {
        panic!("not a Debug duration: {s:?}")
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    assert!(!int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()), "{s:?}");
    assert!(frac.len() <= digits && frac.bytes().all(|b| b.is_ascii_digit()), "{s:?}");
    assert!(frac.is_empty() || !frac.ends_with('0'), "Debug trims trailing zeros: {s:?}");
    let padded = format!("{frac:0<digits$}");
    int.parse::<u128>().unwrap() * 10u128.pow(digits as u32)
        + if digits == 0 { 0 } else { padded.parse::<u128>().unwrap() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_tgi_handler_spans() {
    assert_eq!(debug_duration_ns("12.345ms"), 12_345_000);
    assert_eq!(debug_duration_ns("1.2s"), 1_200_000_000);
    assert_eq!(debug_duration_ns("850µs"), 850_000);

    let (addr, cap) = capture::grpc().await;
    let mut a = tgi_args();
    a.otlp_traces_endpoint = Some(format!("grpc://{addr}"));
    let server = start(a).await;
    let c = client();
    let base = server.base_url();

    let trace_hex = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_hex = "00f067aa0ba902b7";
    let resp = c
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_hex}-{parent_hex}-01"))
        .json_body(&json!({"messages": [{"role": "user", "content": "greedy please"}], "max_tokens": 6,
                           "temperature": 0, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let greedy: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    let sse = post_sse(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "seeded"}], "max_tokens": 4, "seed": 42, "stream": true,
                "stream_options": {"include_usage": true}, "ignore_eos": true}),
    )
    .await;
    assert!(sse.done);
    let (s, v) = post_json(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "two answers", "n": 2, "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    server.shutdown().await; // flushes every span

    let got = cap.spans();
    let names: Vec<&str> = got.iter().map(|(_, _, s)| s.name.as_str()).collect();
    assert_eq!(names.len(), 3, "one handler span per HTTP request: {names:?}");
    assert_eq!(names.iter().filter(|n| **n == "chat_completions").count(), 2, "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "completions").count(), 1, "{names:?}");

    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "text-generation-inference.router".into());
    let fields: BTreeSet<&str> =
        ["total_time", "validation_time", "queue_time", "inference_time", "time_per_token", "seed"].into();
    for (res, scope, s) in &got {
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(scope, "opentelemetry-otlp");
        let svc = attr(res, "service.name");
        assert_eq!(svc, Some(&any_value::Value::StringValue(service.clone())));
        let keys: BTreeSet<&str> = s.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, fields, "TGI's recorded fields only, no gen_ai.*");
        let ns = |k| debug_duration_ns(str_of(&s.attributes, k));
        let (total, validation, queue, inference) =
            (ns("total_time"), ns("validation_time"), ns("queue_time"), ns("inference_time"));
        assert_eq!(validation + queue + inference, total, "the intervals add up, to the nanosecond");
        assert!(total > 0 && total < 60_000_000_000 && inference > 0, "plausible: {total} ns");
        assert_eq!(u128::from(s.end_time_unix_nano - s.start_time_unix_nano), total, "span length = total_time");
        let tokens: u128 = if s.name == "completions" {
            3
        } else if str_of(&s.attributes, "seed") == "None" {
            6
        } else {
            4
        };
        assert_eq!(ns("time_per_token"), inference / tokens, "time_per_token = inference / generated tokens");
        assert!(s.status.as_ref().is_none_or(|st| st.code == 0), "succeeded");
    }
    let greedy_span = &got.iter().find(|(_, _, s)| str_of(&s.attributes, "seed") == "None").expect("greedy span").2;
    assert_eq!(greedy["usage"]["completion_tokens"], 6);
    assert_eq!(hex(&greedy_span.trace_id), trace_hex, "traceparent honoured");
    assert_eq!(hex(&greedy_span.parent_span_id), parent_hex);
    assert!(got.iter().any(|(_, _, s)| s.name == "chat_completions" && str_of(&s.attributes, "seed") == "Some(42)"));
    let cmpl = &got.iter().find(|(_, _, s)| s.name == "completions").unwrap().2;
    assert!(
        str_of(&cmpl.attributes, "seed").starts_with("Some("),
        "sampling draws a seed: {}",
        str_of(&cmpl.attributes, "seed")
    );
    assert!(cmpl.parent_span_id.is_empty(), "no traceparent: a root span");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
