//! The real-time driver keeps the engine's timing: measured by a client over HTTP with the
//! study's method, the a10g profile reproduces the study's TTFT and TPS within 10 %.

use crate::support;

use std::time::Instant;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_ttft_and_tps_match_the_calibration() {
    let mut a = args();
    a.gpu = Some(inferwatch_sim::server::GpuName::A10g);
    let server = start(a).await;
    let c = client();
    let url = format!("{}/v1/completions", server.base_url());

    // TTFT: 2048 prompt tokens, max_tokens 1, time to the first SSE chunk
    let prompt: Vec<u32> = (0..2048).map(|i| 1000 + i % 7).collect();
    let t0 = Instant::now();
    let mut resp =
        c.post(&url).json_body(&json!({"prompt": prompt, "max_tokens": 1, "stream": true})).send().await.unwrap();
    let mut first = None;
    let mut raw = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        if first.is_none() && chunk.starts_with(b"data: {") {
            first = Some(t0.elapsed());
        }
        raw.extend_from_slice(&chunk);
    }
    let ttft_ms = first.expect("a token chunk").as_secs_f64() * 1e3;
    assert!(parse_sse(std::str::from_utf8(&raw).unwrap()).done);
    assert!((ttft_ms / 421.3 - 1.0).abs() < 0.10, "a10g TTFT {ttft_ms:.1} ms vs the study's 421.3 ms");

    // TPS: 128 new tokens after the first, from chunk arrival times
    let prompt: Vec<u32> = (0..2048).map(|i| 2000 + i % 11).collect();
    let mut resp = c
        .post(&url)
        .json_body(&json!({"prompt": prompt, "max_tokens": 128, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut arrivals = Vec::new();
    let mut buf = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        let now = Instant::now();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(i) = buf.find("\n\n") {
            let ev: String = buf.drain(..i + 2).collect();
            if ev.starts_with("data: {") {
                arrivals.push(now);
            }
        }
    }
    assert_eq!(arrivals.len(), 128);
    let decode = (arrivals[127] - arrivals[0]).as_secs_f64();
    let tps = 127.0 / decode;
    println!("a10g over HTTP: TTFT {ttft_ms:.1} ms (study 421.3), TPS {tps:.2} (study 38.2)");
    assert!((tps / 38.2 - 1.0).abs() < 0.10, "a10g TPS {tps:.2} vs the study's 38.2");
    server.shutdown().await;
}
