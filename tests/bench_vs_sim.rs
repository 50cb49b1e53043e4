//! The bench client against the simulator: its TTFT and e2e percentiles agree with the
//! simulator's own Prometheus histograms within the buckets' resolution, and every request
//! it completed is counted by the server.

use clap::Parser;

#[derive(Parser)]
struct SimCli {
    #[command(flatten)]
    a: inferwatch_sim::server::SimArgs,
}

/// Cumulative bucket counts `(le, count)` of one histogram family in Prometheus text.
fn buckets(text: &str, family: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{family}_bucket{{");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            let v: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, v))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The bucket `(lower, upper]` holding quantile `q` of a cumulative histogram.
fn bucket_of(b: &[(f64, f64)], q: f64) -> (f64, f64) {
    let total = b.last().map_or(0.0, |x| x.1);
    let rank = q * total;
    let mut lower = 0.0;
    for &(le, c) in b {
        if c >= rank {
            return (lower, le);
        }
        lower = le;
    }
    (lower, f64::INFINITY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bench_percentiles_agree_with_the_simulators_histograms() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim_args = SimCli::parse_from(["sim", "--port", "0", "--served-model-name", "m", "--seed", "3"]).a;
    let sim = inferwatch_sim::server::SimServer::start(sim_args).await.unwrap();

    let mut args = inferwatch_probe::BenchArgs::new(&sim.base_url(), "m");
    args.concurrency = Some(4);
    args.requests = Some(48);
    args.max_tokens = Some(24);
    args.prompt_tokens = 300;
    args.quiet = true;
    let report = inferwatch_probe::run(args).await.unwrap();
    let r = serde_json::to_value(&report).unwrap();
    let completed = r["requests"]["completed"].as_f64().unwrap();
    assert_eq!(completed, 48.0, "{r}");

    let text = reqwest::get(format!("{}/metrics", sim.base_url())).await.unwrap().text().await.unwrap();
    // Client-side overhead (loopback, SSE parsing) is well under this.
    let slack = 0.010;
    for (metric, family) in [("ttft", "vllm:time_to_first_token_seconds"), ("e2e", "vllm:e2e_request_latency_seconds")]
    {
        let b = buckets(&text, family);
        assert!(!b.is_empty(), "{family} missing from /metrics");
        assert_eq!(b.last().unwrap().1, completed, "{family}: server counted every request");
        for (q, key) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
            let (lo, hi) = bucket_of(&b, q);
            let ours = r[metric][key].as_f64().unwrap();
            assert!(
                ours >= lo - slack && ours <= hi + slack,
                "{metric} {key}: bench {ours:.4}s outside the server's bucket ({lo}, {hi}]"
            );
        }
    }
    sim.shutdown().await;
}

/// Runs the bench client (closed loop) against a fresh simulator, optionally with a fault
/// active from the start, and returns its JSON report.
async fn bench_with_fault(fault: Option<serde_json::Value>, prompt_tokens: usize, requests: u64) -> serde_json::Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim_args = SimCli::parse_from(["sim", "--port", "0", "--served-model-name", "m", "--seed", "5"]).a;
    let sim = inferwatch_sim::server::SimServer::start(sim_args).await.unwrap();
    if let Some(f) = fault {
        let r = reqwest::Client::new()
            .post(format!("{}/admin/faults", sim.base_url()))
            .json(&serde_json::json!({ "faults": [f] }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    }
    let mut args = inferwatch_probe::BenchArgs::new(&sim.base_url(), "m");
    args.concurrency = Some(2);
    args.requests = Some(requests);
    args.max_tokens = Some(4);
    args.prompt_tokens = prompt_tokens;
    args.quiet = true;
    let report = inferwatch_probe::run(args).await.unwrap();
    sim.shutdown().await;
    serde_json::to_value(&report).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_blocking_measured_by_the_bench_client() {
    let healthy = bench_with_fault(None, 300, 16).await;
    let blocked = bench_with_fault(
        Some(serde_json::json!({"kind": "queue_blocking", "onset": 0, "strength": 0.5, "period": "4s"})),
        300,
        16,
    )
    .await;
    let p99 = |r: &serde_json::Value| r["ttft"]["p99"].as_f64().unwrap();
    assert!(p99(&healthy) < 0.8, "healthy ttft p99 {}", p99(&healthy));
    assert!(p99(&blocked) > 0.8, "queue blocking: ttft p99 {} should exceed 800 ms", p99(&blocked));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_collapse_measured_by_the_bench_client() {
    let fault = serde_json::json!({"kind": "context_collapse", "onset": 0, "strength": 3});
    let short = bench_with_fault(Some(fault.clone()), 500, 6).await;
    let long = bench_with_fault(Some(fault), 5000, 4).await;
    let healthy_long = bench_with_fault(None, 5000, 4).await;
    let p95 = |r: &serde_json::Value| r["ttft"]["p95"].as_f64().unwrap();
    assert!(p95(&long) > 3.0 * p95(&short), "long {} vs short {}", p95(&long), p95(&short));
    assert!(p95(&long) > 1.3 * p95(&healthy_long), "collapse {} vs healthy {}", p95(&long), p95(&healthy_long));
}

#[test]
fn bad_dialogue_yaml_exits_2_with_line_numbers() {
    let dir = std::env::temp_dir().join(format!("iw-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let flow = dir.join("bad.yaml");
    std::fs::write(
        &flow,
        "dialogue_flow:\n  start_state: greeting\n  states:\n    greeting: { next: nowhere, prompt: \"hi\" }\n  qps_schedule:\n    - { state: greeting, qps: -5 }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferwatch"))
        .args(["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--flow"])
        .arg(&flow)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.yaml:4:") && err.contains("nowhere"), "{err}");
    assert!(err.contains("bad.yaml:6:"), "negative qps located: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
