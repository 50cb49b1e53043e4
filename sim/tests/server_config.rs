//! Starting the simulator from a config file and flags; KV pressure, preemption and engine
//! errors as clients see them.

use crate::support;

use inferwatch_sim::server::{ServerError, SimServer};
use serde_json::{Value, json};
use support::*;

fn write_config(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("inferwatch-sim-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("sim.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_faults_and_flag_overrides() {
    let path = write_config(
        "ok",
        "served_model_name: from-file\nmedian_output_tokens: 3\nengine:\n  gpu: l4\n  max_model_len: 4096\n\
         faults:\n  - { kind: queue_blocking, onset: 0, strength: 0.1, period: 1 }\n",
    );
    let mut a = args();
    a.served_model_name.clear();
    a.config = Some(path);
    a.max_num_seqs = Some(4);
    let server = start(a).await;
    let c = client();
    let base = server.base_url();
    let (_, text) = get_text(&c, &format!("{base}/v1/models")).await;
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], "from-file");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
    let (_, text) = get_text(&c, &format!("{base}/admin/faults")).await;
    let f: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(f["faults"][0]["kind"], "queue_blocking");
    assert_eq!(f["version"], "vT", "--version overrides the file");
    // answers stop near the configured median length
    let (s, v) = post_json(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"model": "from-file", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 50);
    // the 1-2-5 token buckets follow max_model_len
    let (_, text) = get_text(&c, &format!("{base}/metrics")).await;
    let e = parse_exposition(&text);
    let les: Vec<String> =
        e.named("vllm:request_prompt_tokens_bucket").map(|s| s.label("le").unwrap().to_string()).collect();
    assert_eq!(les.iter().rev().nth(1).map(String::as_str), Some("2000.0"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_and_busy_port_are_errors() {
    let path = write_config("bad", "engine:\n  max_num_seqz: 4\n");
    let mut a = args();
    a.config = Some(path);
    let Err(e) = SimServer::start(a).await else { panic!("a bad key must fail") };
    assert!(matches!(e, ServerError::Config(_)), "{e}");
    assert!(e.to_string().contains("max_num_seqz"), "{e}");
    assert_eq!(e.exit_code(), 2);

    let mut a = args();
    a.otlp_traces_endpoint = Some("ftp://x:1".into());
    let Err(e) = SimServer::start(a).await else { panic!("a bad endpoint must fail") };
    assert_eq!(e.exit_code(), 2, "{e}");

    let first = start(args()).await;
    let mut a = args();
    a.port = first.local_addr().port();
    let Err(e) = SimServer::start(a).await else { panic!("the port is taken") };
    assert!(matches!(e, ServerError::Bind { .. }), "{e}");
    first.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_pressure_preempts_and_engine_errors_reach_clients() {
    // a tiny KV pool: 24 blocks of 16 tokens
    let mut a = args();
    a.max_model_len = Some(256);
    a.num_gpu_blocks_override = Some(24);
    a.gpu = Some(inferwatch_sim::server::GpuName::Mi300x);
    let server = start(a).await;
    let c = client();
    let base = server.base_url();
    let url = format!("{base}/v1/completions");
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = c.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("{i} {}", "w ".repeat(60)), "max_tokens": 40, "ignore_eos": true,
                              "stream": true, "stream_options": {"include_usage": true}});
            let sse = post_sse(&c, &url, &body).await;
            let (u, chunks) = sse.chunks.split_last().unwrap();
            assert_eq!(u["usage"]["completion_tokens"].as_u64().unwrap(), chunks.len() as u64);
            chunks.len()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 40, "every request completes despite preemption");
    }
    let (_, text) = get_text(&c, &format!("{base}/metrics")).await;
    let e = parse_exposition(&text);
    assert!(e.value("vllm:num_preemptions_total") > 0.0, "the pool is too small for six at once");
    assert_eq!(e.value("vllm:generation_tokens_total"), 240.0);

    // pin 95 % of the pool: a 100-token prompt can never fit, the engine fails it
    let (s, v) =
        post_json(&c, &format!("{base}/admin/faults"), &json!({"kind": "kv_pressure", "strength": 0.95})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post_json(&c, &url, &json!({"prompt": "w ".repeat(99), "max_tokens": 8})).await;
    assert_eq!(s, 500, "{v}");
    assert_eq!(v["error"]["code"], 500);
    let sse = post_sse(&c, &url, &json!({"prompt": "w ".repeat(99), "max_tokens": 8, "stream": true})).await;
    assert!(sse.done);
    assert_eq!(sse.chunks.last().unwrap()["error"]["code"], 500, "{}", sse.raw);
    let (_, text) = get_text(&c, &format!("{base}/metrics")).await;
    let e = parse_exposition(&text);
    let errors = e.named("vllm:request_success_total").find(|s| s.label("finished_reason") == Some("error")).unwrap();
    assert_eq!(errors.value, 2.0);
    server.shutdown().await;
}

#[test]
fn vllm_version_key_quoted_or_not() {
    use inferwatch_sim::server::{SimConfig, VllmVersion};
    assert_eq!(SimConfig::parse("vllm_version: \"0.10\"\n").unwrap().vllm_version, Some(VllmVersion::V0_10));
    // an unquoted 0.10 is the YAML float 0.1
    assert_eq!(SimConfig::parse("vllm_version: 0.10\n").unwrap().vllm_version, Some(VllmVersion::V0_10));
    assert_eq!(SimConfig::parse("vllm_version: \"0.33\"\n").unwrap().vllm_version, Some(VllmVersion::V0_33));
    assert_eq!(SimConfig::parse("median_output_tokens: 5\n").unwrap().vllm_version, None);
    // vLLM 0.6.6, the V0 engine, quoted or not
    assert_eq!(SimConfig::parse("vllm_version: \"0.6\"\n").unwrap().vllm_version, Some(VllmVersion::V0_6));
    assert_eq!(SimConfig::parse("vllm_version: 0.6\n").unwrap().vllm_version, Some(VllmVersion::V0_6));
    let err = SimConfig::parse("vllm_version: \"0.7\"\n").unwrap_err();
    assert!(err.contains("0.7"), "{err}");
}
