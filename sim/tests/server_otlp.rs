//! The simulator's OTLP output: `llm_request` spans (gRPC and http/protobuf) consistent with
//! the responses, W3C traceparent honoured, and the per-layer KV usage gauge.

use crate::support;

use inferwatch_testkit::attrs::{attr, f64_of, int_attr, str_attr};
use inferwatch_testkit::capture;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, span};
use serde_json::json;
use support::*;

/// The phase attributes add up as vLLM V1 defines them.
fn check_timings(s: &Span) {
    let ttft = f64_of(&s.attributes, "gen_ai.latency.time_to_first_token");
    let e2e = f64_of(&s.attributes, "gen_ai.latency.e2e");
    let queue = f64_of(&s.attributes, "gen_ai.latency.time_in_queue");
    let prefill = f64_of(&s.attributes, "gen_ai.latency.time_in_model_prefill");
    let decode = f64_of(&s.attributes, "gen_ai.latency.time_in_model_decode");
    let inference = f64_of(&s.attributes, "gen_ai.latency.time_in_model_inference");
    assert!(ttft > 0.0 && ttft <= e2e, "ttft {ttft} <= e2e {e2e}");
    assert!(queue >= 0.0 && prefill > 0.0 && decode >= 0.0);
    assert!(
        (queue + prefill + decode - e2e).abs() < 1e-6,
        "queue+prefill+decode {} vs e2e {e2e}",
        queue + prefill + decode
    );
    assert!((queue + prefill - ttft).abs() < 1e-6, "queue+prefill = ttft");
    assert!((prefill + decode - inference).abs() < 1e-6, "prefill+decode = inference");
    let dur = (s.end_time_unix_nano - s.start_time_unix_nano) as f64 / 1e9;
    assert!((dur - e2e).abs() < 1e-6, "span duration {dur} = e2e {e2e}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    assert!(s.end_time_unix_nano <= now && now - s.end_time_unix_nano < 60_000_000_000, "wall-clock times");
}

fn check_span_shape(res: &[KeyValue], scope: &str, s: &Span) {
    assert_eq!(s.name, "llm_request");
    assert_eq!(s.kind, span::SpanKind::Server as i32);
    assert_eq!(scope, "vllm.llm_engine");
    assert_eq!(s.trace_id.len(), 16);
    assert_eq!(s.span_id.len(), 8);
    assert!(s.trace_id.iter().any(|b| *b != 0) && s.span_id.iter().any(|b| *b != 0));
    assert!(matches!(attr(res, "service.version"), Some(any_value::Value::StringValue(v)) if v == "vT"));
    assert!(matches!(attr(res, "service.name"), Some(any_value::Value::StringValue(v)) if !v.is_empty()));
    assert!(attr(&s.attributes, "gen_ai.response.model").is_none(), "V1 spans carry no model");
    check_timings(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_spans_match_responses_and_honour_traceparent() {
    let (addr, cap) = capture::grpc().await;
    let mut a = args();
    a.otlp_traces_endpoint = Some(format!("grpc://{addr}"));
    a.otlp_metrics_endpoint = Some(format!("grpc://{addr}"));
    let server = start(a).await;
    let c = client();
    let base = server.base_url();

    // 1. streamed chat with a W3C parent
    let trace_hex = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_hex = "00f067aa0ba902b7";
    let body = json!({"messages": [{"role": "user", "content": "tell me something"}], "max_tokens": 9,
                      "stream": true, "stream_options": {"include_usage": true}, "temperature": 0.5});
    let resp = c
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_hex}-{parent_hex}-01"))
        .header("tracestate", "vendor=x")
        .json_body(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sse = parse_sse(&resp.text().await.unwrap());
    let usage = sse.chunks.last().unwrap()["usage"].clone();
    let chat_id = sse.chunks[0]["id"].as_str().unwrap().to_string();

    // 2. non-streamed completion, temperature 0 (omitted from the span), top_p 0.9
    let (s, v) = post_json(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "a b c d e f g", "max_tokens": 7, "temperature": 0, "top_p": 0.9, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200, "{v}");

    // 3. n = 2: one span per choice
    let (s, v2) = post_json(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "two answers"}], "max_tokens": 3, "n": 2}),
    )
    .await;
    assert_eq!(s, 200, "{v2}");

    let got = cap.wait_spans(4).await;
    assert_eq!(got.len(), 4, "one span per engine request");
    for (res, scope, s) in &got {
        check_span_shape(res, scope, s);
    }
    let by_id = |id: &str| -> &Span {
        &got.iter()
            .find(|(_, _, s)| str_attr(&s.attributes, "gen_ai.request.id") == Some(id))
            .unwrap_or_else(|| panic!("span {id}"))
            .2
    };

    let chat = by_id(&chat_id);
    assert_eq!(hex(&chat.trace_id), trace_hex, "trace id from traceparent");
    assert_eq!(hex(&chat.parent_span_id), parent_hex, "parent span from traceparent");
    assert_eq!(chat.trace_state, "vendor=x");
    assert_eq!(chat.flags & 0xff, 1, "sampled flag carried");
    assert_eq!(int_attr(&chat.attributes, "gen_ai.usage.completion_tokens"), usage["completion_tokens"].as_i64());
    assert_eq!(int_attr(&chat.attributes, "gen_ai.usage.prompt_tokens"), usage["prompt_tokens"].as_i64());
    assert_eq!(int_attr(&chat.attributes, "gen_ai.request.max_tokens"), Some(9));
    assert_eq!(int_attr(&chat.attributes, "gen_ai.request.n"), Some(1));
    assert_eq!(f64_of(&chat.attributes, "gen_ai.request.temperature"), 0.5);
    assert_eq!(f64_of(&chat.attributes, "gen_ai.request.top_p"), 1.0);
    // real vLLM sets neither a finish reason nor a status on `llm_request`
    assert!(attr(&chat.attributes, "gen_ai.response.finish_reasons").is_none());
    assert!(chat.status.is_none());

    let cmpl = by_id(v["id"].as_str().unwrap());
    assert!(cmpl.parent_span_id.is_empty(), "no traceparent: a root span");
    assert_ne!(cmpl.trace_id, chat.trace_id);
    assert_eq!(int_attr(&cmpl.attributes, "gen_ai.usage.completion_tokens"), Some(7));
    assert_eq!(int_attr(&cmpl.attributes, "gen_ai.usage.prompt_tokens"), v["usage"]["prompt_tokens"].as_i64());
    assert!(attr(&cmpl.attributes, "gen_ai.request.temperature").is_none(), "temperature 0 is omitted");
    assert_eq!(f64_of(&cmpl.attributes, "gen_ai.request.top_p"), 0.9);
    assert!(attr(&cmpl.attributes, "gen_ai.response.finish_reasons").is_none());

    let base_id = v2["id"].as_str().unwrap();
    let mut total = 0;
    for i in 0..2 {
        let s = by_id(&format!("{i}_{base_id}"));
        assert_eq!(int_attr(&s.attributes, "gen_ai.request.n"), Some(2));
        total += int_attr(&s.attributes, "gen_ai.usage.completion_tokens").unwrap();
    }
    assert_eq!(Some(total), v2["usage"]["completion_tokens"].as_i64());

    // the per-layer KV gauge: 32 layers per 100 ms sample, fractions, non-zero while busy
    let (s, _) = post_json(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "word ".repeat(3000), "max_tokens": 24, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200);
    let points = cap
        .wait_for("KV usage samples taken while busy", |cap| {
            let mut pts: Vec<(i64, u64, f64)> = Vec::new();
            for req in cap.metrics().iter() {
                for rm in &req.resource_metrics {
                    for sm in &rm.scope_metrics {
                        for m in &sm.metrics {
                            assert_eq!(m.name, "llm.decoder.kvcache.usage_ratio");
                            let Some(metric::Data::Gauge(g)) = &m.data else { panic!("a gauge") };
                            for p in &g.data_points {
                                let layer = match attr(&p.attributes, "layer") {
                                    Some(any_value::Value::IntValue(l)) => *l,
                                    other => panic!("layer attribute {other:?}"),
                                };
                                let Some(number_data_point::Value::AsDouble(v)) = p.value else { panic!("double") };
                                pts.push((layer, p.time_unix_nano, v));
                            }
                        }
                    }
                }
            }
            pts.iter().any(|p| p.2 > 0.0).then_some(pts)
        })
        .await;
    assert!(points.iter().all(|p| (0.0..=1.0).contains(&p.2)));
    let layers: std::collections::BTreeSet<i64> = points.iter().map(|p| p.0).collect();
    assert_eq!(layers, (0..32).collect(), "one series per decoder layer");
    let mut times: Vec<u64> = points.iter().map(|p| p.1).collect();
    times.dedup();
    let gaps: Vec<u64> = times.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
    assert!(gaps.iter().any(|g| (50_000_000..=200_000_000).contains(g)), "sampled about every 100 ms: {gaps:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_spans_and_flush_on_shutdown() {
    let (addr, cap) = capture::http().await;
    let mut a = args();
    a.otlp_traces_endpoint = Some(format!("http://{addr}/v1/traces"));
    a.otlp_batch_delay_ms = 60_000; // only the shutdown flush can deliver them
    let server = start(a).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", server.base_url());
    let mut ids = Vec::new();
    for i in 0..3 {
        let (s, v) =
            post_json(&c, &url, &json!({"messages": [{"role": "user", "content": format!("q{i}")}], "max_tokens": 2}))
                .await;
        assert_eq!(s, 200, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    server.shutdown().await;
    let got = cap.spans();
    assert_eq!(got.len(), 3, "flushed at shutdown");
    for (res, scope, s) in &got {
        check_span_shape(res, scope, s);
        assert!(ids.iter().any(|id| Some(id.as_str()) == str_attr(&s.attributes, "gen_ai.request.id")));
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
