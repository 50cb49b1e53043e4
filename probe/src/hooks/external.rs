//! External hooks: one long-lived process per hook and bench run, spoken to in JSON lines
//! over its stdin/stdout (probe/README.md, "Plug-in hooks", has the messages).
//!
//! The bench writes one JSON object per line (`hello`, `pre_inference`, `post_decode`,
//! `metric_finalize`, `shutdown`); the hook answers `hello`, `pre_inference` and
//! `metric_finalize` with one line each carrying the same `type` and `id` (or
//! `{"type": "error", "id": ..., "message": ...}`), in any order. `post_decode` and `shutdown`
//! get no answer. A call without an answer within the hook's timeout fails and the request
//! goes on unchanged; after three such calls in a row the hook is given up on
//! (`unresponsive`). A process that exits, or never says hello, is `failed`: its calls fail
//! at once. Lines that are not protocol messages are counted (`protocol_errors`). None of
//! this stops the bench: the report says what failed.

use super::{Finalized, Health, Hook, HookError, HookMetric, HookRequest, Points};
use crate::client::{Api, Message, Outcome, Prompt, TokenEvent};
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot};

/// The protocol version sent in `hello`.
pub const PROTOCOL: u32 = 1;
/// Longest line accepted from a hook (longer ones are protocol errors).
const MAX_LINE: usize = 4 << 20;
/// Lines queued for the hook's stdin.
const QUEUE: usize = 1024;
/// Calls in a row without an answer after which the hook is given up on.
const GIVE_UP_AFTER: u32 = 3;
/// Lines of the hook's stderr kept for error messages.
const STDERR_LINES: usize = 10;
/// Longest wait for the hello (a slow interpreter start), at least the call timeout.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// Most metrics one `metric_finalize` answer may add.
const MAX_METRICS_PER_REPLY: usize = 32;
/// Body fields a hook may not set through `params` (OpenAI-style, and TGI's `parameters` the
/// run sets: output length and the details the report reads).
const PROTECTED: &[&str] =
    &["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_new_tokens", "details", "inputs"];

/// How to start one external hook.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalSpec {
    /// Its name (else the hello's, else the script's file name).
    pub name: Option<String>,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Timeout of one call.
    pub timeout: Duration,
}

/// What the bench tells a hook in `hello`.
#[derive(Debug, Clone)]
pub struct BenchInfo {
    /// `--model`.
    pub model: String,
    /// The URL requests go to.
    pub url: String,
    /// The API called.
    pub api: Api,
    /// Whether answers are streamed.
    pub stream: bool,
}

/// Splits a command line into words like a POSIX shell would, without any expansion:
/// whitespace separates, `'...'` and `"..."` quote (`\` escapes inside double quotes and outside).
pub fn split_command(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(x @ ('"' | '\\' | '$' | '`')) => cur.push(x),
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(x) => cur.push(x),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(x) => cur.push(x),
                    None => return Err("a trailing backslash".into()),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    if words.is_empty() {
        return Err("the command is empty".into());
    }
    Ok(words)
}

/// The default name of a hook: the first argument that names a script (`hook.py` → `hook`),
/// else the program's file name.
fn default_name(argv: &[String]) -> String {
    let stem = |a: &str| Path::new(a).file_stem().map(|s| s.to_string_lossy().into_owned());
    argv.iter()
        .skip(1)
        .find(|a| {
            let ext = Path::new(a.as_str()).extension().map(|e| e.to_string_lossy().into_owned());
            !a.starts_with('-')
                && !a.contains(char::is_whitespace)
                && ext.is_some_and(|e| !e.is_empty() && e.len() <= 5 && e.chars().all(|c| c.is_ascii_alphanumeric()))
        })
        .and_then(|a| stem(a))
        .or_else(|| argv.first().and_then(|a| stem(a)))
        .unwrap_or_else(|| "hook".into())
}

fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// At most `n` bytes of `s` on a character boundary, with `…` when cut.
fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

struct Shared {
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    hello: Mutex<Option<oneshot::Sender<Value>>>,
    /// (state, why) once the hook is failed or unresponsive.
    dead: Mutex<Option<(&'static str, String)>>,
    protocol_errors: AtomicU64,
    last_protocol_error: Mutex<Option<String>>,
    stderr: Mutex<VecDeque<String>>,
    stderr_done: tokio::sync::Notify,
    stderr_closed: AtomicBool,
    child: tokio::sync::Mutex<Option<Child>>,
    shutting_down: AtomicBool,
    note: Mutex<Option<String>>,
}

impl Shared {
    fn dead(&self) -> Option<String> {
        lock(&self.dead).as_ref().map(|(_, why)| why.clone())
    }

    /// Marks the hook failed (the first reason wins) and fails every pending call.
    fn mark_dead(&self, state: &'static str, why: String) {
        {
            let mut d = lock(&self.dead);
            if d.is_some() {
                return;
            }
            tracing::warn!(state, reason = %why, "bench: hook given up");
            *d = Some((state, why));
        }
        lock(&self.pending).clear();
        lock(&self.hello).take();
    }

    fn protocol_error(&self, what: String) {
        self.protocol_errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(error = %what, "bench: hook protocol error");
        *lock(&self.last_protocol_error) = Some(what);
    }

    fn stderr_tail(&self) -> String {
        let s = lock(&self.stderr);
        if s.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = s.iter().map(String::as_str).collect();
        format!("; stderr: {}", lines.join(" | "))
    }

    /// Waits (briefly) until the hook's stderr is read to its end.
    async fn stderr_end(&self) {
        let wait = async {
            while !self.stderr_closed.load(Ordering::Acquire) {
                let n = self.stderr_done.notified();
                if self.stderr_closed.load(Ordering::Acquire) {
                    break;
                }
                n.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), wait).await;
    }

    fn handle_line(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            return;
        }
        let v: Value = match serde_json::from_slice(line) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                self.protocol_error(format!("not a JSON object: {}", cut(text.trim(), 120)));
                return;
            }
        };
        let Some(ty) = v.get("type").and_then(Value::as_str) else {
            self.protocol_error(format!("a message without a \"type\": {}", cut(text.trim(), 120)));
            return;
        };
        if ty == "hello" {
            match lock(&self.hello).take() {
                Some(tx) => {
                    let _ = tx.send(v);
                }
                None => self.protocol_error("an unexpected hello".into()),
            }
            return;
        }
        let id = match v.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => {
                self.protocol_error(format!("a {ty:?} message without an \"id\""));
                return;
            }
        };
        let tx = lock(&self.pending).remove(&id);
        match tx {
            Some(tx) => {
                let _ = tx.send(v);
            }
            None => self.protocol_error(format!("a {ty:?} answer for an unknown or expired id {id}")),
        }
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes: `None` at the end, `Some(false)` for a line
/// that was too long (discarded).
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(any.then_some(!too_long));
        }
        any = true;
        let (take, end) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, Some(i + 1)),
            None => (avail.len(), None),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&avail[..take]);
            }
        }
        r.consume(end.unwrap_or(take));
        if end.is_some() {
            return Ok(Some(!too_long));
        }
    }
}

async fn writer(mut stdin: ChildStdin, mut rx: mpsc::Receiver<Option<Vec<u8>>>) {
    while let Some(Some(line)) = rx.recv().await {
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            break;
        }
    }
    // Dropping stdin closes it: the hook reads its end.
}

async fn reader(stdout: tokio::process::ChildStdout, shared: Arc<Shared>) {
    let mut r = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut r, &mut buf).await {
            Ok(Some(true)) => shared.handle_line(&buf),
            Ok(Some(false)) => shared.protocol_error(format!("a line longer than {MAX_LINE} bytes")),
            Ok(None) | Err(_) => break,
        }
    }
    if shared.shutting_down.load(Ordering::Acquire) {
        return;
    }
    // The hook closed its stdout: it has exited (or is about to).
    let status = {
        let mut c = shared.child.lock().await;
        match c.as_mut() {
            Some(ch) => match tokio::time::timeout(Duration::from_secs(2), ch.wait()).await {
                Ok(Ok(st)) => format!("the hook process exited ({st})"),
                Ok(Err(e)) => format!("the hook process closed its stdout ({e})"),
                Err(_) => "the hook process closed its stdout".to_string(),
            },
            None => "the hook process closed its stdout".to_string(),
        }
    };
    shared.stderr_end().await;
    shared.mark_dead("failed", format!("{status}{}", shared.stderr_tail()));
}

async fn stderr_reader(stderr: tokio::process::ChildStderr, shared: Arc<Shared>) {
    let mut r = BufReader::new(stderr);
    let mut buf = Vec::new();
    while let Ok(Some(_)) = read_line(&mut r, &mut buf).await {
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        tracing::debug!(line, "bench: hook stderr");
        let mut s = lock(&shared.stderr);
        if s.len() == STDERR_LINES {
            s.pop_front();
        }
        s.push_back(cut(line, 300));
    }
    shared.stderr_closed.store(true, Ordering::Release);
    shared.stderr_done.notify_waiters();
}

/// An external hook process (see the module docs).
pub struct ExternalHook {
    name: String,
    command: String,
    timeout: Duration,
    points: Points,
    model: String,
    tx: mpsc::Sender<Option<Vec<u8>>>,
    shared: Arc<Shared>,
    timeouts_in_a_row: AtomicU32,
    stopped: AtomicBool,
}

fn encode(v: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    line
}

impl ExternalHook {
    /// Starts the process and exchanges `hello`. Fails only when the program cannot be
    /// started; a hook that starts but does not answer is returned `failed` (calls fail, the
    /// report says why).
    pub async fn start(spec: &ExternalSpec, info: &BenchInfo) -> Result<ExternalHook, String> {
        let command = shell_join(&spec.argv);
        let Some(program) = spec.argv.first() else {
            return Err("a hook needs a command".into());
        };
        let mut child = tokio::process::Command::new(program)
            .args(&spec.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start hook `{command}`: {e}"))?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(format!("cannot start hook `{command}`: no pipes"));
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            hello: Mutex::new(None),
            dead: Mutex::new(None),
            protocol_errors: AtomicU64::new(0),
            last_protocol_error: Mutex::new(None),
            stderr: Mutex::new(VecDeque::new()),
            stderr_done: tokio::sync::Notify::new(),
            stderr_closed: AtomicBool::new(false),
            child: tokio::sync::Mutex::new(Some(child)),
            shutting_down: AtomicBool::new(false),
            note: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        let (htx, hrx) = oneshot::channel();
        *lock(&shared.hello) = Some(htx);
        tokio::spawn(writer(stdin, rx));
        tokio::spawn(reader(stdout, shared.clone()));
        tokio::spawn(stderr_reader(stderr, shared.clone()));
        let mut hook = ExternalHook {
            name: spec.name.clone().unwrap_or_else(|| default_name(&spec.argv)),
            command,
            timeout: spec.timeout,
            points: Points::ALL,
            model: info.model.clone(),
            tx,
            shared,
            timeouts_in_a_row: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
        };
        let hello = json!({
            "type": "hello",
            "protocol": PROTOCOL,
            "hook": hook.name,
            "bench": { "model": info.model, "url": info.url, "api": info.api.operation(), "stream": info.stream },
        });
        let _ = hook.tx.send(Some(encode(&hello))).await;
        let wait = spec.timeout.max(HELLO_WAIT);
        match tokio::time::timeout(wait, hrx).await {
            Ok(Ok(v)) => {
                if let Err(e) = hook.accept_hello(&v, spec.name.is_some()) {
                    hook.shared.mark_dead("failed", format!("bad hello: {e}"));
                }
            }
            Ok(Err(_)) => {
                // The reader marked the hook failed (it exited) before any hello.
                if hook.shared.dead().is_none() {
                    hook.shared.mark_dead("failed", "the hook process ended before its hello".into());
                }
            }
            Err(_) => hook.shared.mark_dead("failed", format!("no hello within {wait:?}{}", hook.shared.stderr_tail())),
        }
        Ok(hook)
    }

    fn accept_hello(&mut self, v: &Value, named: bool) -> Result<(), String> {
        if !named
            && let Some(n) = v.get("name").and_then(Value::as_str)
            && !n.trim().is_empty()
        {
            self.name = cut(n.trim(), 64);
        }
        if let Some(w) = v.get("wants") {
            let list = w.as_array().ok_or("\"wants\" must be a list")?;
            let mut p = Points::default();
            for x in list {
                match x.as_str() {
                    Some("pre_inference") => p.pre_inference = true,
                    Some("post_decode") => p.post_decode = true,
                    Some("metric_finalize") => p.metric_finalize = true,
                    _ => return Err(format!("unknown hook point {x} in \"wants\"")),
                }
            }
            self.points = p;
        }
        Ok(())
    }

    fn dead_err(&self) -> HookError {
        HookError::Dead(self.shared.dead().unwrap_or_else(|| "its stdin is closed".into()))
    }

    /// Sends a message and waits for the answer of the same type and id.
    async fn call(&self, ty: &str, id: String, msg: Value) -> Result<Value, HookError> {
        if let Some(d) = self.shared.dead() {
            return Err(HookError::Dead(d));
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id.clone(), tx);
        if self.shared.dead().is_some() {
            lock(&self.shared.pending).remove(&id);
            return Err(self.dead_err());
        }
        let line = encode(&msg);
        let r = tokio::time::timeout(self.timeout, async {
            if self.tx.send(Some(line)).await.is_err() {
                return Err(self.dead_err());
            }
            rx.await.map_err(|_| self.dead_err())
        })
        .await;
        let v = match r {
            Err(_) => {
                lock(&self.shared.pending).remove(&id);
                let n = self.timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= GIVE_UP_AFTER {
                    self.shared.mark_dead(
                        "unresponsive",
                        format!("{n} calls in a row got no answer within {:?}", self.timeout),
                    );
                }
                return Err(HookError::Timeout(self.timeout));
            }
            Ok(Err(e)) => {
                lock(&self.shared.pending).remove(&id);
                return Err(e);
            }
            Ok(Ok(v)) => v,
        };
        self.timeouts_in_a_row.store(0, Ordering::Relaxed);
        match v.get("type").and_then(Value::as_str) {
            Some("error") => {
                let m = v.get("message").map_or_else(
                    || "(no message)".to_string(),
                    |m| match m {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                );
                Err(HookError::Failed(format!("the hook answered an error: {}", cut(&m, 300))))
            }
            Some(t) if t == ty => Ok(v),
            other => Err(HookError::Failed(format!("expected a {ty:?} answer, got {:?}", other.unwrap_or("")))),
        }
    }

    fn request_json(&self, req: &HookRequest<'_>) -> Value {
        let mut r = Map::new();
        r.insert("model".into(), Value::from(self.model.clone()));
        match req.api {
            Api::Chat => {
                r.insert("messages".into(), serde_json::to_value(req.prompt.to_messages()).unwrap_or_default());
            }
            Api::Completions | Api::Tgi => {
                r.insert("prompt".into(), Value::from(req.prompt.to_text().into_owned()));
            }
        }
        r.insert("max_tokens".into(), Value::from(req.max_tokens));
        r.insert("params".into(), Value::Object(req.params.clone()));
        Value::Object(r)
    }
}

/// Applies a `pre_inference` answer to `req`, all or nothing.
fn apply_rewrite(req: &mut HookRequest<'_>, v: &Value) -> Result<(), String> {
    let mut prompt = None;
    let mut max_tokens = None;
    let mut params = None;
    if let Some(r) = v.get("request").filter(|r| !r.is_null()) {
        let r = r.as_object().ok_or("\"request\" must be an object")?;
        if r.contains_key("messages") && r.contains_key("prompt") {
            return Err("request: give \"messages\" or \"prompt\", not both".into());
        }
        for (k, x) in r {
            match k.as_str() {
                "messages" => {
                    let m: Vec<Message> =
                        serde_json::from_value(x.clone()).map_err(|e| format!("request.messages: {e}"))?;
                    if m.is_empty() {
                        return Err("request.messages must not be empty".into());
                    }
                    prompt = Some(Prompt::Messages(m));
                }
                "prompt" => {
                    let s = x.as_str().ok_or("request.prompt must be a string")?;
                    prompt = Some(Prompt::Text(s.to_string()));
                }
                "max_tokens" => {
                    let n = x
                        .as_u64()
                        .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
                        .ok_or("request.max_tokens must be a positive integer")?;
                    max_tokens = Some(n as u32);
                }
                "params" => {
                    let p = x.as_object().ok_or("request.params must be an object")?;
                    if let Some(bad) = p.keys().find(|k| PROTECTED.contains(&k.as_str())) {
                        return Err(format!("request.params may not set {bad:?}"));
                    }
                    params = Some(p.clone());
                }
                // Fixed by the run; accepted so that a hook may echo the request back.
                "model" => {}
                other => return Err(format!("unknown field request.{other}")),
            }
        }
    }
    let mut meta = None;
    if let Some(m) = v.get("metadata").filter(|m| !m.is_null()) {
        let m = m.as_object().ok_or("\"metadata\" must be an object")?;
        for (k, x) in m {
            if k.is_empty() || k.len() > 64 {
                return Err(format!("metadata key {k:?}: 1 to 64 characters"));
            }
            match x {
                Value::String(s) if s.len() <= 256 => {}
                Value::Number(_) | Value::Bool(_) => {}
                _ => return Err(format!("metadata {k:?}: a string (≤ 256 bytes), number or boolean")),
            }
        }
        meta = Some(m);
    }
    if let Some(p) = prompt {
        req.prompt = std::borrow::Cow::Owned(p);
    }
    if let Some(n) = max_tokens {
        req.max_tokens = n;
    }
    if let Some(p) = params {
        req.params = p;
    }
    if let Some(m) = meta {
        req.metadata.extend(m.iter().map(|(k, x)| (k.clone(), x.clone())));
    }
    Ok(())
}

/// A metric name: a letter, then letters, digits, `_` or `.`; at most 64 characters.
fn valid_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    s.len() <= 64
        && c.next().is_some_and(|x| x.is_ascii_alphabetic())
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == '.')
}

fn metrics_of(v: &Value) -> Result<Vec<(String, f64)>, String> {
    let Some(m) = v.get("metrics").filter(|m| !m.is_null()) else {
        return Ok(Vec::new());
    };
    let m = m.as_object().ok_or("\"metrics\" must be an object of name → number")?;
    if m.len() > MAX_METRICS_PER_REPLY {
        return Err(format!("at most {MAX_METRICS_PER_REPLY} metrics per answer, got {}", m.len()));
    }
    m.iter()
        .map(|(k, x)| {
            if !valid_metric_name(k) {
                return Err(format!("metric name {k:?}: a letter, then letters, digits, _ or . (≤ 64)"));
            }
            match x.as_f64() {
                Some(f) if f.is_finite() => Ok((k.clone(), f)),
                _ => Err(format!("metric {k:?}: a finite number, got {x}")),
            }
        })
        .collect()
}

fn token_text(tokens: &[TokenEvent], o: &Outcome) -> String {
    if tokens.is_empty() {
        return o.text.clone();
    }
    tokens.iter().map(|t| t.text.as_str()).collect()
}

fn outcome_json(o: &Outcome, tokens: &[TokenEvent]) -> Value {
    json!({
        "ok": o.ok(),
        "error": o.error.as_ref().map(|e| json!({ "type": e.kind.name(), "message": e.message })),
        "ttft_s": o.ttft.map(|d| d.as_secs_f64()),
        "e2e_s": o.e2e.as_secs_f64(),
        "tpot_s": o.tpot().map(|d| d.as_secs_f64()),
        "input_tokens": o.input_tokens,
        "output_tokens": o.output_tokens,
        "usage_reported": o.usage_reported,
        "finish_reason": o.finish_reason,
        "chunks": tokens.len(),
        "text": cut(&token_text(tokens, o), 1 << 20),
    })
}

impl Hook for ExternalHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "external"
    }

    fn command(&self) -> Option<&str> {
        Some(&self.command)
    }

    fn points(&self) -> Points {
        self.points
    }

    fn pre_inference<'a>(&'a self, req: &'a mut HookRequest<'_>) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let id = req.id.to_string();
            let msg = json!({
                "type": "pre_inference",
                "id": id,
                "attempt": req.attempt,
                "index": req.index,
                "variant": req.variant,
                "state": req.state,
                "request": self.request_json(req),
                "metadata": req.metadata,
            });
            let v = self.call("pre_inference", id, msg).await?;
            apply_rewrite(req, &v).map_err(HookError::Failed)
        })
    }

    fn post_decode<'a>(
        &'a self,
        req: &'a HookRequest<'_>,
        tokens: &'a [TokenEvent],
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            if let Some(d) = self.shared.dead() {
                return Err(HookError::Dead(d));
            }
            let toks: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let mut m = json!({ "t": t.at.as_secs_f64(), "text": t.text, "n": t.tokens });
                    if !t.reasoning.is_empty() {
                        m["reasoning"] = Value::from(t.reasoning.clone());
                    }
                    m
                })
                .collect();
            let msg = json!({ "type": "post_decode", "id": req.id.to_string(), "tokens": toks });
            match self.tx.try_send(Some(encode(&msg))) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Err(HookError::Failed(format!("{QUEUE} lines queued for the hook: post_decode dropped")))
                }
                Err(mpsc::error::TrySendError::Closed(_)) => Err(self.dead_err()),
            }
        })
    }

    fn metric_finalize<'a>(
        &'a self,
        req: &'a HookRequest<'_>,
        tokens: &'a [TokenEvent],
        outcome: &'a mut Outcome,
        out: &'a mut Finalized,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let id = req.id.to_string();
            let msg = json!({
                "type": "metric_finalize",
                "id": id,
                "attempt": req.attempt,
                "index": req.index,
                "variant": req.variant,
                "state": req.state,
                "metadata": req.metadata,
                "outcome": outcome_json(outcome, tokens),
            });
            let v = self.call("metric_finalize", id, msg).await?;
            let metrics = metrics_of(&v).map_err(HookError::Failed)?;
            let hook: Arc<str> = Arc::from(self.name.as_str());
            out.metrics.extend(metrics.into_iter().map(|(name, value)| HookMetric { hook: hook.clone(), name, value }));
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.stopped.swap(true, Ordering::AcqRel) {
                return;
            }
            self.shared.shutting_down.store(true, Ordering::Release);
            let bye = encode(&json!({ "type": "shutdown" }));
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                let _ = self.tx.send(Some(bye)).await;
                let _ = self.tx.send(None).await;
            })
            .await;
            let mut c = self.shared.child.lock().await;
            let Some(ch) = c.as_mut() else { return };
            let note = match tokio::time::timeout(Duration::from_secs(5), ch.wait()).await {
                Ok(Ok(st)) if st.success() => None,
                Ok(Ok(st)) => {
                    self.shared.stderr_end().await;
                    Some(format!("exited at shutdown ({st}){}", self.shared.stderr_tail()))
                }
                Ok(Err(e)) => Some(format!("cannot wait for the hook process: {e}")),
                Err(_) => {
                    let _ = ch.kill().await;
                    Some("did not exit within 5 s of shutdown: killed".into())
                }
            };
            *c = None;
            if let Some(n) = note {
                *lock(&self.shared.note) = Some(n);
            }
        })
    }

    fn health(&self) -> Health {
        let protocol_errors = self.shared.protocol_errors.load(Ordering::Relaxed);
        if let Some((state, why)) = lock(&self.shared.dead).clone() {
            return Health { state, detail: Some(why), protocol_errors };
        }
        let detail = lock(&self.shared.note)
            .clone()
            .or_else(|| lock(&self.shared.last_protocol_error).clone().map(|e| format!("last bad line: {e}")));
        Health { state: "ok", detail, protocol_errors }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(
            split_command("python3 hook.py --x 'a b' \"c \\\"d\\\"\" e\\ f").unwrap(),
            ["python3", "hook.py", "--x", "a b", "c \"d\"", "e f"]
        );
        assert_eq!(split_command("  a  ''  ").unwrap(), ["a", ""]);
        assert!(split_command("a 'b").is_err());
        assert!(split_command("   ").is_err());
    }

    #[test]
    fn default_names() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(default_name(&v(&["python3", "-u", "examples/hooks/system_prompt.py"])), "system_prompt");
        assert_eq!(default_name(&v(&["/usr/local/bin/my-hook", "--flag"])), "my-hook");
        assert_eq!(default_name(&v(&["python3", "-c", "import sys; sys.exit(4)"])), "python3");
    }

    fn req() -> HookRequest<'static> {
        HookRequest {
            id: 1,
            attempt: 1,
            index: None,
            variant: None,
            state: None,
            api: Api::Chat,
            prompt: std::borrow::Cow::Owned(Prompt::Text("hi".into())),
            max_tokens: 16,
            params: Map::new(),
            metadata: Map::new(),
            reference: None,
        }
    }

    #[test]
    fn rewrites_are_all_or_nothing() {
        let mut r = req();
        let ok = json!({"request": {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                                    "max_tokens": 7, "params": {"temperature": 0.5}},
                        "metadata": {"variant": "A", "n": 2}});
        apply_rewrite(&mut r, &ok).unwrap();
        assert_eq!(r.prompt.to_messages().len(), 2);
        assert_eq!(r.max_tokens, 7);
        assert_eq!(r.params["temperature"], 0.5);
        assert_eq!(r.metadata["variant"], "A");
        let mut r = req();
        for bad in [
            json!({"request": {"max_tokens": 5, "params": {"stream": false}}}),
            json!({"request": {"max_tokens": 5, "params": {"max_new_tokens": 900}}}),
            json!({"request": {"max_tokens": 5, "params": {"details": false}}}),
            json!({"request": {"max_tokens": 0}}),
            json!({"request": {"messages": []}}),
            json!({"request": {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}}),
            json!({"request": {"max_tokens": 5, "color": "red"}}),
            json!({"request": {"max_tokens": 5}, "metadata": {"x": [1]}}),
        ] {
            assert!(apply_rewrite(&mut r, &bad).is_err(), "{bad}");
            assert_eq!(r.max_tokens, 16, "{bad} applied in part");
        }
    }

    #[test]
    fn metric_answers_are_checked() {
        assert_eq!(metrics_of(&json!({"metrics": {"cpt": 4.5}})).unwrap(), vec![("cpt".to_string(), 4.5)]);
        assert!(metrics_of(&json!({})).unwrap().is_empty());
        assert!(metrics_of(&json!({"metrics": {"1x": 1}})).is_err());
        assert!(metrics_of(&json!({"metrics": {"x": "1"}})).is_err());
        assert!(metrics_of(&json!({"metrics": [1]})).is_err());
    }
}
