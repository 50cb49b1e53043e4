//! Helpers shared by the `server_*` tests (included with `#[path]`; also built on its own).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use inferwatch_sim::server::{SimArgs, SimServer};
use serde_json::Value;

/// Most a test waits for anything.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Installs the ring crypto provider reqwest needs (once per process).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(DEADLINE).build().expect("reqwest client")
}

/// Arguments of a fast test server on 127.0.0.1:0 (MI300X profile, short answers).
pub fn args() -> SimArgs {
    SimArgs {
        port: 0,
        served_model_name: vec!["sim-model".into()],
        model_version: Some("vT".into()),
        seed: Some(7),
        otlp_batch_delay_ms: 50,
        ..SimArgs::default()
    }
}

/// Starts a server.
pub async fn start(args: SimArgs) -> SimServer {
    SimServer::start(args).await.expect("server starts")
}

/// One parsed SSE stream.
#[derive(Debug, Default)]
pub struct Sse {
    /// The JSON of every `data:` event before `[DONE]`.
    pub chunks: Vec<Value>,
    /// Whether `data: [DONE]` ended the stream.
    pub done: bool,
    /// The raw text.
    pub raw: String,
}

/// POSTs `body` and reads the whole SSE stream, checking its framing.
pub async fn post_sse(c: &reqwest::Client, url: &str, body: &Value) -> Sse {
    let mut resp = c.post(url).json_body(body).send().await.expect("request");
    assert_eq!(resp.status(), 200, "status of {url}");
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let mut raw = String::new();
    while let Some(chunk) = resp.chunk().await.expect("body chunk") {
        raw.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    parse_sse(&raw)
}

/// Splits SSE text into events; every event must be exactly `data: ...\n\n`.
pub fn parse_sse(raw: &str) -> Sse {
    let mut out = Sse { raw: raw.to_string(), ..Sse::default() };
    assert!(raw.ends_with("\n\n"), "stream ends with a blank line: {raw:?}");
    for ev in raw.trim_end_matches("\n\n").split("\n\n") {
        let data = ev.strip_prefix("data: ").unwrap_or_else(|| panic!("event without 'data: ': {ev:?}"));
        assert!(!data.contains('\n'), "one line per event: {ev:?}");
        assert!(!out.done, "nothing after [DONE]");
        if data == "[DONE]" {
            out.done = true;
        } else {
            out.chunks.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("chunk {data:?}: {e}")));
        }
    }
    out
}

/// POSTs JSON and returns (status, JSON body).
pub async fn post_json(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let resp = c.post(url).json_body(body).send().await.expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// POSTs raw bytes and returns (status, JSON body).
pub async fn post_raw(c: &reqwest::Client, url: &str, body: &'static str) -> (u16, Value) {
    let resp = c.post(url).header("content-type", "application/json").body(body).send().await.expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// GETs a URL and returns (status, text).
pub async fn get_text(c: &reqwest::Client, url: &str) -> (u16, String) {
    let resp = c.get(url).send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// `RequestBuilder::json` needs reqwest's `json` feature; this is the same without it.
pub trait JsonBody {
    /// Sets a JSON body.
    fn json_body(self, v: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, v: &Value) -> Self {
        self.header("content-type", "application/json").body(v.to_string())
    }
}

/// Polls `f` until it returns `Some`, or panics after [`DEADLINE`].
pub async fn poll<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One sample of the Prometheus text format.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// A label's value.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition: `# TYPE` lines, `# HELP` lines and samples.
#[derive(Debug, Default)]
pub struct Exposition {
    /// name → type.
    pub types: Vec<(String, String)>,
    /// names with HELP.
    pub helps: Vec<String>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The declared type of a metric family.
    pub fn type_of(&self, name: &str) -> Option<&str> {
        self.types.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }

    /// Samples with this name.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The value of the only sample with this name.
    pub fn value(&self, name: &str) -> f64 {
        let v: Vec<&Sample> = self.named(name).collect();
        assert_eq!(v.len(), 1, "exactly one sample of {name}");
        v[0].value
    }
}

/// A strict parser of the text format 0.0.4 (what `promtool check metrics` reads).
pub fn parse_exposition(text: &str) -> Exposition {
    let mut e = Exposition::default();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()))
    };
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (n, t) = rest.split_once(' ').expect("TYPE line");
            assert!(valid_name(n), "metric name {n:?}");
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&t), "type {t}");
            assert!(e.type_of(n).is_none(), "TYPE declared twice for {n}");
            e.types.push((n.into(), t.into()));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (n, _) = rest.split_once(' ').expect("HELP line");
            e.helps.push(n.into());
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (head, value) = line.rsplit_once(' ').expect("sample line");
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse::<f64>().unwrap_or_else(|_| panic!("value {v:?} in {line:?}")),
        };
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), Vec::new()),
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = Vec::new();
                let mut chars = body.chars().peekable();
                while chars.peek().is_some() {
                    let k: String = chars.by_ref().take_while(|c| *c != '=').collect();
                    assert_eq!(chars.next(), Some('"'), "quoted label value in {line:?}");
                    let mut v = String::new();
                    loop {
                        match chars.next().expect("unterminated label value") {
                            '\\' => match chars.next() {
                                Some('n') => v.push('\n'),
                                Some(c) => v.push(c),
                                None => panic!("dangling escape"),
                            },
                            '"' => break,
                            c => v.push(c),
                        }
                    }
                    labels.push((k, v));
                    if chars.peek() == Some(&',') {
                        chars.next();
                    }
                }
                (n.to_string(), labels)
            }
        };
        assert!(valid_name(&name), "metric name {name:?}");
        e.samples.push(Sample { name, labels, value });
    }
    e
}

/// `promtool check metrics` (Debian package `prometheus`) must parse `text`, and every lint
/// finding it reports must be `known`; skipped (with a note) where promtool is not installed.
pub fn promtool_accepts(text: &str, known: impl Fn(&str) -> bool) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not found; skipping `promtool check metrics` (apt-get install prometheus)");
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(1), "promtool could not parse /metrics:\n{report}");
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(known(line), "unexpected promtool finding: {line}");
    }
}
