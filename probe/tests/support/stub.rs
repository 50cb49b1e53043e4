//! A tiny OpenAI-compatible server that streams SSE exactly like vLLM (`data: {chunk}\n\n` …
//! `data: [DONE]\n\n`, `usage` in a last chunk with empty `choices` when
//! `stream_options.include_usage`), with scripted delays, plus a "minimal" TGI-like flavour
//! (no usage, no role-only chunk, empty deltas, `data:` without a space, CRLF, comments).
//!
//! Markers in the last user message script the answer: `[hang]` (never answers in time),
//! `[fail]` (HTTP 500), `[fail-once]` (500 the first time this exact prompt is seen),
//! `[stream-error]` (an error event after the first token), `[echo-len]` (the answer depends
//! on the prompt's length).

#![allow(dead_code)]

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the stub streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Exactly as vLLM's OpenAI server.
    Vllm,
    /// TGI-like and sloppy: no usage, no role chunk, empty deltas, `data:` without space, CRLF.
    Minimal,
}

/// Scripted behaviour.
#[derive(Debug, Clone)]
pub struct StubConfig {
    /// Delay before the first content token (the role chunk goes out at once).
    pub ttft: Duration,
    /// Delay between tokens.
    pub itl: Duration,
    /// Tokens per answer (capped by max_tokens).
    pub tokens: usize,
    /// Streaming flavour.
    pub flavor: Flavor,
    /// Words of the answer (cycled); default `tok0 tok1 ...`.
    pub answer: Option<String>,
    /// Answer every chat request with one pre-rendered zero-latency stream (for the ceiling
    /// benchmark: the stub must cost as little as possible).
    pub canned: bool,
}

impl Default for StubConfig {
    fn default() -> Self {
        StubConfig {
            ttft: Duration::ZERO,
            itl: Duration::ZERO,
            tokens: 8,
            flavor: Flavor::Vllm,
            answer: None,
            canned: false,
        }
    }
}

/// What the stub saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Request bodies in arrival order.
    pub bodies: Mutex<Vec<Value>>,
    /// `traceparent` headers.
    pub traceparents: Mutex<Vec<String>>,
    /// Requests being answered now.
    pub inflight: AtomicUsize,
    /// Most requests answered at once.
    pub max_inflight: AtomicUsize,
    /// Prompts seen with [fail-once].
    pub once: Mutex<HashMap<String, u32>>,
}

/// A running stub.
pub struct Stub {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it saw.
    pub seen: Arc<Seen>,
}

impl Stub {
    /// The base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Bodies received so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.seen.bodies.lock().unwrap().clone()
    }
}

struct App {
    cfg: StubConfig,
    seen: Arc<Seen>,
    canned: Bytes,
}

/// Starts a stub on 127.0.0.1 on the current runtime.
pub async fn start(cfg: StubConfig) -> Stub {
    let seen = Arc::new(Seen::default());
    let canned = if cfg.canned { canned_stream(&cfg) } else { Bytes::new() };
    let app = Arc::new(App { cfg, seen: seen.clone(), canned });
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Stub { addr, seen }
}

/// Starts a stub on its own thread and runtime (so that the client under test may be
/// confined to one core); returns once it listens.
pub fn start_on_thread(cfg: StubConfig, threads: usize) -> Stub {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap();
        rt.block_on(async move {
            let stub = start(cfg).await;
            tx.send(stub).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    if app.cfg.canned {
        return ([(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")], app.canned.clone()).into_response();
    }
    handle(app, headers, body, true).await
}

/// A vLLM chat stream of `cfg.tokens` tokens with usage, rendered once.
fn canned_stream(cfg: &StubConfig) -> Bytes {
    let mut s = String::new();
    let head = r#"{"id":"chatcmpl-canned","object":"chat.completion.chunk","created":1,"model":"m","choices":"#;
    s.push_str(&format!(
        "data: {head}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
    ));
    for i in 0..cfg.tokens {
        let fin = if i + 1 == cfg.tokens { "\"length\"" } else { "null" };
        s.push_str(&format!(
            "data: {head}[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"logprobs\":null,\"finish_reason\":{fin}}}],\"usage\":null}}\n\n"
        ));
    }
    s.push_str(&format!(
        "data: {head}[],\"usage\":{{\"prompt_tokens\":128,\"total_tokens\":{},\"completion_tokens\":{}}}}}\n\n",
        128 + cfg.tokens,
        cfg.tokens
    ));
    s.push_str("data: [DONE]\n\n");
    Bytes::from(s)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(app, headers, body, false).await
}

fn last_user_text(v: &Value, chat: bool) -> String {
    if chat {
        v["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|x| x["role"] == "user"))
            .and_then(|x| x["content"].as_str())
            .unwrap_or_default()
            .to_string()
    } else {
        v["prompt"].as_str().unwrap_or_default().to_string()
    }
}

fn prompt_tokens(v: &Value, chat: bool) -> usize {
    if chat {
        v["messages"]
            .as_array()
            .map(|m| m.iter().map(|x| x["content"].as_str().unwrap_or("").split_whitespace().count()).sum())
            .unwrap_or(0)
    } else {
        v["prompt"].as_str().unwrap_or("").split_whitespace().count()
    }
}

struct Gauge(Arc<Seen>);

impl Gauge {
    fn new(seen: &Arc<Seen>) -> Gauge {
        let n = seen.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_inflight.fetch_max(n, Ordering::SeqCst);
        Gauge(seen.clone())
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(app: Arc<App>, headers: HeaderMap, body: Bytes, chat: bool) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    if let Some(tp) = headers.get("traceparent").and_then(|h| h.to_str().ok()) {
        app.seen.traceparents.lock().unwrap().push(tp.to_string());
    }
    app.seen.bodies.lock().unwrap().push(v.clone());
    let gauge = Gauge::new(&app.seen);
    let text = last_user_text(&v, chat);
    if text.contains("[hang]") {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let fail_once = text.contains("[fail-once]") && {
        let mut once = app.seen.once.lock().unwrap();
        let n = once.entry(serde_json::to_string(&v["messages"]).unwrap() + &text).or_insert(0);
        *n += 1;
        *n == 1
    };
    if text.contains("[fail]") || fail_once {
        let err = json!({"object": "error", "message": "scripted failure", "type": "InternalServerError", "code": 500});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(err)).into_response();
    }
    let cfg = &app.cfg;
    let max_tokens = v["max_tokens"].as_u64().unwrap_or(16) as usize;
    let n = cfg.tokens.min(max_tokens);
    let words: Vec<String> = if text.contains("[echo-len]") {
        let len = text.split_whitespace().count();
        (0..n).map(|i| format!("len{len}w{i}")).collect()
    } else {
        match &cfg.answer {
            Some(a) => a.split_whitespace().cycle().take(n).map(str::to_string).collect(),
            None => (0..n).map(|i| format!("tok{i}")).collect(),
        }
    };
    let pieces: Vec<String> =
        words.iter().enumerate().map(|(i, w)| if i == 0 { w.clone() } else { format!(" {w}") }).collect();
    let k = if chat {
        if v["logprobs"] == json!(true) { v["top_logprobs"].as_u64().unwrap_or(0) as usize } else { 0 }
    } else {
        v["logprobs"].as_u64().unwrap_or(0) as usize
    };
    let stream = v["stream"].as_bool().unwrap_or(false);
    let usage = v["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let model = v["model"].as_str().unwrap_or("stub").to_string();
    let pt = prompt_tokens(&v, chat);
    let finish = if n < cfg.tokens { "length" } else { "stop" };
    let usage_obj = json!({"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n});
    let id = format!("{}-stub{}", if chat { "chatcmpl" } else { "cmpl" }, app.seen.bodies.lock().unwrap().len());

    if !stream {
        tokio::time::sleep(cfg.ttft + cfg.itl * n.saturating_sub(1) as u32).await;
        let full: String = pieces.concat();
        let lp = (k > 0).then(|| logprobs(chat, &words[0], k, pieces.len()));
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": full}, "logprobs": lp, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": full, "logprobs": lp, "finish_reason": finish})
        };
        let mut resp = json!({
            "id": id, "object": if chat { "chat.completion" } else { "text_completion" },
            "created": 1, "model": model, "choices": [choice],
        });
        if cfg.flavor == Flavor::Vllm {
            resp["usage"] = usage_obj;
        }
        drop(gauge);
        return axum::Json(resp).into_response();
    }

    let flavor = cfg.flavor;
    let sse = |data: &str| -> Bytes {
        match flavor {
            Flavor::Vllm => Bytes::from(format!("data: {data}\n\n")),
            Flavor::Minimal => Bytes::from(format!("data:{data}\r\n\r\n")),
        }
    };
    let chunk = |content: Option<&str>, role: bool, finish: Option<&str>, lp: Option<Value>| -> Value {
        let choice = if chat {
            let mut delta = json!({});
            if role {
                delta["role"] = json!("assistant");
            }
            if let Some(c) = content {
                delta["content"] = json!(c);
            }
            json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": content.unwrap_or(""), "logprobs": lp, "finish_reason": finish, "stop_reason": null})
        };
        let mut c = json!({
            "id": id, "object": if chat { "chat.completion.chunk" } else { "text_completion" },
            "created": 1, "model": model, "choices": [choice],
        });
        if flavor == Flavor::Vllm && usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let mut events: Vec<(Duration, Bytes)> = Vec::new();
    match (flavor, chat) {
        // vLLM's first chat chunk: the role with empty content.
        (Flavor::Vllm, true) => events.push((Duration::ZERO, sse(&chunk(Some(""), true, None, None).to_string()))),
        (Flavor::Vllm, false) => {}
        (Flavor::Minimal, _) => events.push((Duration::ZERO, Bytes::from_static(b": keep-alive\r\n\r\n"))),
    }
    for (i, p) in pieces.iter().enumerate() {
        let delay = if i == 0 { cfg.ttft } else { cfg.itl };
        let last = i + 1 == pieces.len();
        let lp = (k > 0).then(|| logprobs(chat, &words[i], k, 1));
        let c = chunk(Some(p), false, last.then_some(finish), lp);
        events.push((delay, sse(&c.to_string())));
        if flavor == Flavor::Minimal && !last {
            events.push((Duration::ZERO, sse(&chunk(Some(""), false, None, None).to_string())));
        }
        if i == 0 && text.contains("[stream-error]") {
            let e = json!({"error": {"object": "error", "message": "scripted stream error", "type": "BadRequestError", "code": 400}});
            events.push((Duration::ZERO, sse(&e.to_string())));
            break;
        }
    }
    if pieces.is_empty() {
        events.push((cfg.ttft, sse(&chunk(Some(""), false, Some(finish), None).to_string())));
    }
    if flavor == Flavor::Vllm && usage {
        let mut u = chunk(None, false, None, None);
        u["choices"] = json!([]);
        u["usage"] = usage_obj;
        events.push((Duration::ZERO, sse(&u.to_string())));
    }
    let done = sse("[DONE]");
    let headers = [(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")];
    if events.iter().all(|(d, _)| d.is_zero()) {
        // Zero latency: the whole stream at once.
        let mut all = Vec::new();
        for (_, b) in &events {
            all.extend_from_slice(b);
        }
        all.extend_from_slice(&done);
        drop(gauge);
        return (headers, all).into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        for (d, b) in events {
            if !d.is_zero() {
                tokio::time::sleep(d).await;
            }
            if tx.send(b).await.is_err() {
                return;
            }
        }
        // Not in flight any more before the client can see the end of the answer.
        drop(gauge);
        let _ = tx.send(done).await;
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx)) });
    (headers, Body::from_stream(stream)).into_response()
}

fn logprobs(chat: bool, token: &str, k: usize, n_tokens: usize) -> Value {
    // Uniform over the top K: TLE = log2 K exactly.
    let l = (1.0 / k as f64).ln();
    if chat {
        let top: Vec<Value> = (0..k).map(|j| json!({"token": format!("{token}{j}"), "logprob": l})).collect();
        let entries: Vec<Value> =
            (0..n_tokens).map(|_| json!({"token": token, "logprob": l, "top_logprobs": top})).collect();
        json!({"content": entries})
    } else {
        let mut m = serde_json::Map::new();
        for j in 0..k {
            m.insert(format!("{token}{j}"), json!(l));
        }
        let tops: Vec<Value> = (0..n_tokens).map(|_| Value::Object(m.clone())).collect();
        json!({"tokens": vec![token; n_tokens], "token_logprobs": vec![l; n_tokens], "top_logprobs": tops})
    }
}
