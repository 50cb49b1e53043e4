//! `/metrics` against vLLM's metric table (tests/fixtures/servers/vllm-*.metrics.json; names, types,
//! labels, buckets), its values against the requests served, and `promtool check metrics`.

use crate::support;

use serde_json::json;
use support::*;

const TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const LATENCY: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// `build_1_2_5_buckets(8192)` (the default max_model_len).
const TOKENS_8192: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0];
const ITERATION: &[f64] = &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
const PARAMS_N: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// The reference's gauges (exposed name; labels besides model_name / engine).
const GAUGES: &[&str] = &["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"];
/// The reference's counters (registered name → exposed `<name>_total`).
const COUNTERS: &[&str] = &[
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
];
/// The reference's histograms with their buckets.
const HISTOGRAMS: &[(&str, &[f64])] = &[
    ("vllm:time_to_first_token_seconds", TTFT),
    ("vllm:inter_token_latency_seconds", ITL),
    ("vllm:request_time_per_output_token_seconds", ITL),
    ("vllm:e2e_request_latency_seconds", LATENCY),
    ("vllm:request_queue_time_seconds", LATENCY),
    ("vllm:request_prefill_time_seconds", LATENCY),
    ("vllm:request_decode_time_seconds", LATENCY),
    ("vllm:request_inference_time_seconds", LATENCY),
    ("vllm:request_prompt_tokens", TOKENS_8192),
    ("vllm:request_generation_tokens", TOKENS_8192),
    ("vllm:request_max_num_generation_tokens", TOKENS_8192),
    ("vllm:request_params_max_tokens", TOKENS_8192),
    ("vllm:request_params_n", PARAMS_N),
    ("vllm:request_prefill_kv_computed_tokens", TOKENS_8192),
    ("vllm:iteration_tokens_total", ITERATION),
];

fn label_names(s: &Sample) -> Vec<&str> {
    s.labels.iter().map(|(k, _)| k.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_reference_table_and_the_traffic() {
    let server = start(args()).await;
    let c = client();
    let base = server.base_url();

    // idle: every series is there already, at zero
    let (status, text) = get_text(&c, &format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let idle = parse_exposition(&text);
    assert_eq!(idle.value("vllm:num_requests_running"), 0.0);
    assert_eq!(idle.named("vllm:request_success_total").count(), 5);

    // traffic: 3 chat + 2 completions, with known token counts
    let mut completion = 0u64;
    let mut prompt = 0u64;
    for i in 0..3 {
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
    for p in ["once upon a time", "the answer is"] {
        let (s, v) = post_json(
            &c,
            &format!("{base}/v1/completions"),
            &json!({"prompt": p, "max_tokens": 4, "ignore_eos": true, "stream": false}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        completion += v["usage"]["completion_tokens"].as_u64().unwrap();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }

    let resp = c.get(format!("{base}/metrics")).send().await.unwrap();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    let text = resp.text().await.unwrap();
    let e = parse_exposition(&text);

    for name in GAUGES {
        assert_eq!(e.type_of(name), Some("gauge"), "{name}");
        let s: Vec<&Sample> = e.named(name).collect();
        assert_eq!(s.len(), 1, "{name}");
        assert_eq!(label_names(s[0]), vec!["model_name", "engine"], "{name}");
        assert_eq!(s[0].label("model_name"), Some("sim-model"));
        assert_eq!(s[0].label("engine"), Some("0"));
    }
    let kv = e.value("vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&kv), "a fraction: {kv}");

    for name in COUNTERS {
        let total = format!("{name}_total");
        assert_eq!(e.type_of(&total), Some("counter"), "{total}");
        assert!(e.named(name).next().is_none(), "{name} is only exposed with _total");
        let created = format!("{name}_created");
        assert_eq!(e.type_of(&created), Some("gauge"), "{created}");
        for s in e.named(&total) {
            let mut want = vec!["model_name", "engine"];
            if *name == "vllm:request_success" {
                want.push("finished_reason");
            }
            assert_eq!(label_names(s), want, "{total}");
            assert!(s.value >= 0.0);
        }
        assert_eq!(e.named(&created).count(), e.named(&total).count());
    }
    let reasons: Vec<&str> =
        e.named("vllm:request_success_total").map(|s| s.label("finished_reason").unwrap()).collect();
    assert_eq!(reasons, vec!["stop", "length", "abort", "error", "repetition"]);
    let finished: f64 = e.named("vllm:request_success_total").map(|s| s.value).sum();
    assert_eq!(finished, 5.0);
    assert_eq!(e.value("vllm:generation_tokens_total"), completion as f64, "generation tokens = usage");
    assert_eq!(e.value("vllm:prompt_tokens_total"), prompt as f64, "prompt tokens = usage");
    assert_eq!(e.value("vllm:num_preemptions_total"), 0.0);
    assert!(e.value("vllm:prefix_cache_queries_total") >= e.value("vllm:prefix_cache_hits_total"));

    for (name, buckets) in HISTOGRAMS {
        assert_eq!(e.type_of(name), Some("histogram"), "{name}");
        let bucket = format!("{name}_bucket");
        let b: Vec<&Sample> = e.named(&bucket).collect();
        let les: Vec<f64> = b.iter().map(|s| s.label("le").unwrap().parse::<f64>().unwrap()).collect();
        let mut want = buckets.to_vec();
        want.push(f64::INFINITY);
        assert_eq!(les, want, "{name} buckets");
        assert_eq!(b.last().unwrap().label("le"), Some("+Inf"));
        for s in &b {
            assert_eq!(label_names(s), vec!["model_name", "engine", "le"], "{name}");
        }
        assert!(b.windows(2).all(|w| w[0].value <= w[1].value), "{name} is cumulative");
        let count = e.value(&format!("{name}_count"));
        assert_eq!(count, b.last().unwrap().value, "{name}: _count = +Inf bucket");
        assert!(e.value(&format!("{name}_sum")) >= 0.0);
        assert_eq!(e.type_of(&format!("{name}_created")), Some("gauge"));
    }
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_params_n",
    ] {
        assert_eq!(e.value(&format!("{name}_count")), 5.0, "{name}: one per request");
    }
    assert_eq!(e.value("vllm:request_generation_tokens_sum"), completion as f64);
    assert_eq!(e.value("vllm:request_prompt_tokens_sum"), prompt as f64);
    // one inter-token interval per token after the first
    assert_eq!(e.value("vllm:inter_token_latency_seconds_count"), (completion - 5) as f64);
    assert_eq!(e.value("vllm:request_params_max_tokens_sum"), (3 * 5 + 2 * 4) as f64);

    let info: Vec<&Sample> = e.named("vllm:cache_config_info").collect();
    assert_eq!(info.len(), 1);
    assert_eq!(e.type_of("vllm:cache_config_info"), Some("gauge"));
    assert_eq!(info[0].value, 1.0);
    assert_eq!(info[0].label("block_size"), Some("16"));
    assert_eq!(info[0].label("engine"), Some("0"));
    assert!(info[0].label("num_gpu_blocks").unwrap().parse::<u64>().unwrap() > 0);
    for k in ["gpu_memory_utilization", "cache_dtype", "enable_prefix_caching"] {
        assert!(info[0].label(k).is_some(), "{k}");
    }
    assert!(info[0].label("model_name").is_none(), "cache_config_info has no model_name");

    // every family has HELP and TYPE
    for (n, _) in &e.types {
        assert!(e.helps.contains(n), "HELP for {n}");
    }
    promtool_accepts(&text);
    server.shutdown().await;
}

/// `promtool check metrics` must parse the exposition; its only lint complaints may be the ones
/// real vLLM output gets too (colons in names, and `vllm:iteration_tokens_total` being a
/// histogram with a `_total` name).
fn promtool_accepts(text: &str) {
    support::promtool_accepts(text, |line| {
        line.ends_with("metric names should not contain ':'")
            || line == "vllm:iteration_tokens_total non-counter metrics should not have \"_total\" suffix"
    });
}
