//! The OpenAI-compatible API of the real-time simulator, end to end over HTTP.

use crate::support;

use serde_json::{Value, json};
use support::*;

fn content_of_chat_chunks(chunks: &[Value]) -> (String, u32, Vec<Value>) {
    let mut text = String::new();
    let mut tokens = 0;
    let mut finishes = Vec::new();
    for c in chunks {
        for ch in c["choices"].as_array().expect("choices") {
            if let Some(t) = ch["delta"]["content"].as_str()
                && ch["delta"].get("role").is_none()
            {
                text.push_str(t);
                tokens += 1;
            }
            finishes.push(ch["finish_reason"].clone());
        }
    }
    (text, tokens, finishes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_matches_whole_and_usage_counts_tokens() {
    let server = start(args()).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", server.base_url());
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Recommend a book."}]);

    let (status, whole) =
        post_json(&c, &url, &json!({"model": "sim-model", "messages": messages, "max_tokens": 12})).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "sim-model");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &whole["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    assert!(choice["logprobs"].is_null());
    let usage = &whole["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + completion);

    let sse = post_sse(
        &c,
        &url,
        &json!({"model": "sim-model", "messages": messages, "max_tokens": 12, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await;
    assert!(sse.done, "ends with [DONE]");
    let first = &sse.chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert!(first["choices"][0]["finish_reason"].is_null());
    let last = sse.chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]), "usage chunk has no choices");
    let content_chunks = &sse.chunks[..sse.chunks.len() - 1];
    let (streamed, n_tokens, finishes) = content_of_chat_chunks(content_chunks);
    assert_eq!(streamed, text, "same prompt, same answer");
    assert_eq!(u64::from(n_tokens), last["usage"]["completion_tokens"].as_u64().unwrap(), "usage = tokens streamed");
    assert_eq!(last["usage"]["prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(u64::from(n_tokens), completion);
    // finish_reason only on the last content chunk
    let (last_finish, earlier) = finishes.split_last().unwrap();
    assert_eq!(last_finish, &choice["finish_reason"]);
    assert!(earlier.iter().all(Value::is_null), "{finishes:?}");
    for ch in &sse.chunks {
        assert_eq!(ch["id"], sse.chunks[0]["id"]);
        assert!(ch.get("usage").is_none() || ch["choices"] == json!([]), "usage only in the last chunk: {ch}");
    }

    // without include_usage there is no usage chunk
    let sse = post_sse(&c, &url, &json!({"messages": messages, "max_tokens": 3, "stream": true})).await;
    assert!(sse.done);
    assert!(sse.chunks.iter().all(|c| c.get("usage").is_none() && !c["choices"].as_array().unwrap().is_empty()));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streamed_and_whole_with_logprobs() {
    let server = start(args()).await;
    let c = client();
    let url = format!("{}/v1/completions", server.base_url());
    let body = json!({"model": "sim-model", "prompt": "The capital of France is", "max_tokens": 6,
                      "logprobs": 3, "ignore_eos": true});
    let (status, whole) = post_json(&c, &url, &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert!(whole["id"].as_str().unwrap().starts_with("cmpl-"));
    let ch = &whole["choices"][0];
    assert_eq!(ch["finish_reason"], "length", "ignore_eos runs to max_tokens");
    assert_eq!(whole["usage"]["completion_tokens"], 6);
    let lp = &ch["logprobs"];
    let toks: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(toks.len(), 6);
    assert_eq!(toks.concat(), ch["text"].as_str().unwrap());
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] < w[1]));
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let m = top.as_object().unwrap();
        assert!((1..=3).contains(&m.len()));
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen < 0.0);
        assert_eq!(m.get(toks[i]).and_then(Value::as_f64), Some(chosen), "the sampled token is in the top-k");
    }

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let sse = post_sse(&c, &url, &sbody).await;
    assert!(sse.done);
    let (usage_chunk, chunks) = sse.chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"].as_u64().unwrap(), chunks.len() as u64);
    let mut text = String::new();
    for (i, ch) in chunks.iter().enumerate() {
        assert_eq!(ch["object"], "text_completion");
        let choice = &ch["choices"][0];
        text.push_str(choice["text"].as_str().unwrap());
        assert_eq!(choice["logprobs"]["tokens"][0], choice["text"]);
        assert_eq!(choice["logprobs"]["text_offset"][0].as_u64().unwrap(), offsets[i]);
        if i + 1 == chunks.len() {
            assert_eq!(choice["finish_reason"], "length");
        } else {
            assert!(choice["finish_reason"].is_null());
        }
    }
    assert_eq!(text, ch["text"].as_str().unwrap());

    // token-id prompts and batches of prompts with n
    let (status, v) = post_json(&c, &url, &json!({"prompt": [1, 2, 3, 4], "max_tokens": 2})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let (status, v) = post_json(&c, &url, &json!({"prompt": ["a b", "c d e"], "n": 2, "max_tokens": 3})).await;
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_ne!(choices[0]["text"], choices[1]["text"], "the n choices differ");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_and_n() {
    let server = start(args()).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
                      "max_tokens": 5, "logprobs": true, "top_logprobs": 2, "n": 2, "temperature": 0.7});
    let (status, v) = post_json(&c, &url, &body).await;
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let mut total = 0;
    for ch in choices {
        let content = ch["logprobs"]["content"].as_array().unwrap();
        let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(text, ch["message"]["content"].as_str().unwrap());
        for e in content {
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 2);
            assert_eq!(top[0]["token"], e["token"]);
            assert_eq!(top[0]["logprob"], e["logprob"]);
            let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
            assert_eq!(bytes, e["token"].as_str().unwrap().as_bytes());
        }
        total += content.len() as u64;
    }
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap(), total);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    let sse = post_sse(&c, &url, &sbody).await;
    let (usage_chunk, chunks) = sse.chunks.split_last().unwrap();
    let mut per_choice = [0u64; 2];
    for ch in chunks {
        let choice = &ch["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if choice["delta"].get("role").is_none() {
            per_choice[i] += 1;
            assert_eq!(choice["logprobs"]["content"].as_array().unwrap().len(), 1);
        }
        assert_eq!(ch["usage"]["completion_tokens"].as_u64().unwrap(), per_choice[i], "continuous usage");
    }
    assert_eq!(usage_chunk["usage"]["completion_tokens"].as_u64().unwrap(), per_choice.iter().sum::<u64>());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    let server = start(args()).await;
    let c = client();
    let chat = format!("{}/v1/chat/completions", server.base_url());
    let cmpl = format!("{}/v1/completions", server.base_url());
    let check = |status: u16, v: &Value, want: u16| {
        assert_eq!(status, want, "{v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(e["code"], want, "{v}");
        assert!(e["type"].as_str().is_some_and(|t| t.ends_with("Error")), "{v}");
    };
    for raw in ["{not json", "", "[1,2]", "{\"messages\": \"hi\"}", "{\"max_tokens\": 3}"] {
        let (s, v) = post_raw(&c, &chat, raw).await;
        check(s, &v, 400);
    }
    let (s, v) = post_raw(&c, &cmpl, "{\"prompt\": {\"x\": 1}}").await;
    check(s, &v, 400);
    let m = json!([{"role": "user", "content": "hi"}]);
    for body in [
        json!({"messages": m, "max_tokens": "ten"}),
        json!({"messages": m, "max_tokens": 0}),
        json!({"messages": m, "max_tokens": 100000}),
        json!({"messages": m, "temperature": -1}),
        json!({"messages": m, "top_p": 0}),
        json!({"messages": m, "n": 0}),
        json!({"messages": m, "stream_options": {"include_usage": true}}),
        json!({"messages": m, "top_logprobs": 3}),
        json!({"messages": m, "logprobs": true, "top_logprobs": 99}),
        json!({"messages": []}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ] {
        let (s, v) = post_json(&c, &chat, &body).await;
        check(s, &v, 400);
    }
    let (s, v) = post_json(&c, &chat, &json!({"model": "nope", "messages": m})).await;
    check(s, &v, 404);
    assert_eq!(v["error"]["type"], "NotFoundError");
    for body in
        [json!({"prompt": []}), json!({"prompt": "x", "logprobs": 50}), json!({"prompt": "x", "max_tokens": -1})]
    {
        let (s, v) = post_json(&c, &cmpl, &body).await;
        check(s, &v, 400);
    }
    // the server is still fine
    let (s, v) = post_json(&c, &chat, &json!({"messages": m, "max_tokens": 2})).await;
    assert_eq!(s, 200, "{v}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_admin_faults() {
    let server = start(args()).await;
    let c = client();
    let base = server.base_url();
    let (s, body) = get_text(&c, &format!("{base}/health")).await;
    assert_eq!((s, body.as_str()), (200, ""));
    let (s, body) = get_text(&c, &format!("{base}/v1/models")).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "sim-model");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["owned_by"], "vllm");
    assert!(v["data"][0]["max_model_len"].as_u64().unwrap() > 0);
    let (s, _) = get_text(&c, &format!("{base}/nope")).await;
    assert_eq!(s, 404);

    let faults = format!("{base}/admin/faults");
    let (s, body) = get_text(&c, &faults).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["faults"], json!([]));
    assert_eq!(v["version"], "vT");

    let (s, v) = post_json(
        &c,
        &faults,
        &json!({"faults": [{"kind": "queue_blocking", "strength": 0.25, "period": 2},
                           {"kind": "slow_drift", "onset": "1h", "rate_per_day": 0.5}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let now = v["now"].as_f64().unwrap();
    assert!((v["faults"][0]["onset"].as_f64().unwrap() - now).abs() < 1.0, "onset counts from now: {v}");
    assert!(v["faults"][1]["onset"].as_f64().unwrap() >= 3600.0);
    let (s, body) = get_text(&c, &faults).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let kinds: Vec<&str> = v["faults"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["queue_blocking", "slow_drift"]);
    assert_eq!(v["active"], json!(["queue_blocking"]), "the drift starts in an hour");

    let (s, v) = post_json(&c, &faults, &json!({"kind": "kv_pressure", "strength": 3})).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = post_raw(&c, &faults, "{\"kind\": \"kv_pressure\", \"strenght\": 0.5}").await;
    assert_eq!(s, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("strenght"), "{v}");
    let resp = c.delete(&faults).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let (_, body) = get_text(&c, &faults).await;
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["faults"], json!([]));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_and_concurrent_streams_finish() {
    let server = start(args()).await;
    let c = client();
    let base = server.base_url();
    let url = format!("{base}/v1/chat/completions");
    // a long answer: read its first chunk, then hang up
    let body = json!({"messages": [{"role": "user", "content": "talk"}], "max_tokens": 2000, "ignore_eos": true,
                      "stream": true});
    let mut resp = c.post(&url).json_body(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(resp);
    let metrics = format!("{base}/metrics");
    poll("the abort to be counted", || {
        let c = c.clone();
        let metrics = metrics.clone();
        async move {
            let (_, text) = get_text(&c, &metrics).await;
            let e = parse_exposition(&text);
            let aborted = e
                .named("vllm:request_success_total")
                .find(|s| s.label("finished_reason") == Some("abort"))
                .map(|s| s.value);
            (aborted == Some(1.0) && e.value("vllm:num_requests_running") == 0.0).then_some(())
        }
    })
    .await;

    let mut tasks = Vec::new();
    for i in 0..8 {
        let c = c.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"messages": [{"role": "user", "content": format!("question {i}")}],
                              "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}});
            let sse = post_sse(&c, &url, &body).await;
            let (u, chunks) = sse.chunks.split_last().unwrap();
            let (_, n, _) = content_of_chat_chunks(chunks);
            assert_eq!(u64::from(n), u["usage"]["completion_tokens"].as_u64().unwrap());
            n
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap() >= 1);
    }
    server.shutdown().await;
}
