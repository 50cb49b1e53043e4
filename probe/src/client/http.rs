//! The HTTP client for one endpoint: sends a request, reads the answer (streamed or whole)
//! and measures it.

use super::outcome::{ErrorKind, Outcome, RequestError, truncate};
use super::request::{Api, ClientConfig, Prompt, RequestSpec, api_url, estimate_tokens};
use super::sse::SseParser;
use super::stream::StreamState;
use super::wire::{Body, ContentRef, Full, MessageRef, PartRef, StreamOptions, UrlRef, first_logprobs};
use crate::quality::Rci;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// An HTTP client for one endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    parsed: reqwest::Url,
    cfg: Arc<ClientConfig>,
    auth: Option<String>,
}

/// Installs rustls' ring provider once (reqwest is built without a default provider).
pub fn install_crypto_provider() {
    // An error only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn transport_error(e: &reqwest::Error) -> RequestError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() {
        ErrorKind::Connect
    } else if e.is_decode() {
        ErrorKind::Decode
    } else {
        ErrorKind::Transport
    };
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    RequestError { kind, message: truncate(&msg) }
}

impl Client {
    /// Builds the client (no connection is made yet).
    pub fn new(cfg: ClientConfig) -> Result<Client, String> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(cfg.pool_size.max(1))
            .pool_idle_timeout(Duration::from_secs(60))
            .tls_danger_accept_invalid_certs(cfg.insecure)
            .user_agent(concat!("inferwatch-bench/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let url = match cfg.api {
            Api::Tgi => super::tgi::url(&cfg.endpoint, cfg.stream),
            _ => api_url(&cfg.endpoint, cfg.api),
        };
        let parsed = reqwest::Url::parse(&url).map_err(|e| format!("invalid --endpoint {:?}: {e}", cfg.endpoint))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("invalid --endpoint {:?}: the scheme must be http or https", cfg.endpoint));
        }
        let auth = cfg.api_key.as_ref().filter(|k| !k.is_empty()).map(|k| format!("Bearer {k}"));
        Ok(Client { http, url, parsed, cfg: Arc::new(cfg), auth })
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The JSON body of a request.
    pub fn body(&self, spec: &RequestSpec<'_>) -> Vec<u8> {
        let c = &self.cfg;
        if c.api == Api::Tgi {
            return super::tgi::body(c, spec);
        }
        let text;
        let (m, p) = match c.api {
            Api::Chat => {
                let mut m: Vec<MessageRef<'_>> = match spec.prompt {
                    Prompt::Text(t) => vec![MessageRef { role: "user", content: ContentRef::Text(t) }],
                    Prompt::Messages(m) => {
                        m.iter().map(|x| MessageRef { role: &x.role, content: ContentRef::Text(&x.content) }).collect()
                    }
                };
                // Images go with the last user message, before its text.
                if !spec.images.is_empty()
                    && let Some(last) = m.iter_mut().rev().find(|x| x.role == "user")
                    && let ContentRef::Text(text) = last.content
                {
                    let mut parts: Vec<PartRef<'_>> =
                        spec.images.iter().map(|u| PartRef::ImageUrl { image_url: UrlRef { url: u } }).collect();
                    parts.push(PartRef::Text { text });
                    last.content = ContentRef::Parts(parts);
                }
                (Some(m), None)
            }
            Api::Completions | Api::Tgi => {
                text = spec.prompt.to_text();
                (None, Some(&text[..]))
            }
        };
        let (logprobs, top_logprobs) = match (c.logprobs, c.api) {
            (None, _) => (None, None),
            (Some(k), Api::Chat) => (Some(serde_json::Value::Bool(true)), Some(k)),
            (Some(k), Api::Completions | Api::Tgi) => (Some(serde_json::Value::from(k)), None),
        };
        let body = Body {
            model: &c.model,
            messages: m,
            prompt: p,
            max_tokens: spec.max_tokens,
            stream: c.stream,
            stream_options: (c.stream && c.stream_usage).then_some(StreamOptions { include_usage: true }),
            temperature: c.temperature,
            logprobs,
            top_logprobs,
            ignore_eos: c.ignore_eos.then_some(true),
        };
        // Serialising plain structs and strings cannot fail.
        match spec.params.filter(|p| !p.is_empty()) {
            None => serde_json::to_vec(&body).unwrap_or_default(),
            Some(extra) => {
                let mut v = serde_json::to_value(&body).unwrap_or_default();
                if let Some(m) = v.as_object_mut() {
                    m.extend(extra.iter().map(|(k, x)| (k.clone(), x.clone())));
                }
                serde_json::to_vec(&v).unwrap_or_default()
            }
        }
    }

    /// Sends one request and measures it. Never fails: errors are in the outcome.
    pub async fn execute(&self, spec: &RequestSpec<'_>, cancel: &CancellationToken) -> Outcome {
        let body = self.body(spec);
        let start_wall = SystemTime::now();
        let start = Instant::now();
        let mut out = Outcome::new(start, start_wall);
        let run = self.run(spec, body, start, &mut out);
        let err = tokio::select! {
            r = tokio::time::timeout(spec.timeout, run) => match r {
                Ok(r) => r.err(),
                Err(_) => Some(RequestError {
                    kind: ErrorKind::Timeout,
                    message: format!("no complete answer within {:?}", spec.timeout),
                }),
            },
            _ = cancel.cancelled() => Some(RequestError { kind: ErrorKind::Cancelled, message: "stopped".into() }),
        };
        if out.e2e.is_zero() {
            out.e2e = start.elapsed();
        }
        if out.input_tokens == 0 && !out.usage_reported {
            out.input_tokens = estimate_tokens(spec.prompt.char_len());
        }
        out.error = err;
        out
    }

    async fn run(
        &self,
        spec: &RequestSpec<'_>,
        body: Vec<u8>,
        start: Instant,
        out: &mut Outcome,
    ) -> Result<(), RequestError> {
        let mut req =
            self.http.post(self.parsed.clone()).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        if self.cfg.stream {
            req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        if let Some(a) = &self.auth {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(tp) = &spec.traceparent {
            req = req.header("traceparent", tp);
        }
        let mut resp = req.send().await.map_err(|e| transport_error(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(RequestError { kind: ErrorKind::Http(status.as_u16()), message: truncate(text.trim()) });
        }
        let is_sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !self.cfg.stream || !is_sse {
            let prompt_tokens = super::tgi::prompt_tokens(resp.headers());
            let bytes = resp.bytes().await.map_err(|e| transport_error(&e))?;
            out.e2e = start.elapsed();
            if self.cfg.api == Api::Tgi {
                return super::tgi::full(spec, &bytes, prompt_tokens, self.cfg.logprobs.is_some(), out);
            }
            return self.full(spec, &bytes, out);
        }
        let mut st = StreamState {
            start,
            last: None,
            keep_text: spec.keep_text,
            record_tokens: spec.record_tokens,
            want_logprobs: self.cfg.logprobs.is_some(),
            rci: spec.reference.clone().map(Rci::new),
            done: false,
            streamed_tokens: 0,
            usage: None,
            error: None,
        };
        let mut sse = SseParser::new();
        let tgi = self.cfg.api == Api::Tgi;
        loop {
            let chunk = resp.chunk().await.map_err(|e| transport_error(&e))?;
            let now = Instant::now();
            let mut on = |d: &str| if tgi { super::tgi::event(&mut st, d, now, out) } else { st.event(d, now, out) };
            let ok = match &chunk {
                Some(b) => sse.feed(b, &mut on),
                None => sse.finish(&mut on),
            };
            if !ok && st.error.is_none() {
                st.error = Some(RequestError { kind: ErrorKind::Decode, message: "the stream is not UTF-8".into() });
            }
            if let Some(e) = st.error.take() {
                out.e2e = now - start;
                return Err(e);
            }
            if chunk.is_none() || st.done {
                out.e2e = now - start;
                if chunk.is_some() {
                    // Read the end of the body (it follows [DONE] at once) so that the
                    // connection goes back to the pool instead of being closed: at once when
                    // it is there already, else in the background.
                    use futures::FutureExt;
                    let ended = loop {
                        match resp.chunk().now_or_never() {
                            Some(Ok(Some(_))) => continue,
                            Some(_) => break true,
                            None => break false,
                        }
                    };
                    if !ended {
                        tokio::spawn(async move {
                            let drain = async { while let Ok(Some(_)) = resp.chunk().await {} };
                            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                        });
                    }
                }
                break;
            }
        }
        match st.usage {
            Some(u) => {
                out.usage_reported = true;
                out.input_tokens = u.prompt_tokens.unwrap_or(0);
                out.output_tokens = u.completion_tokens.unwrap_or(st.streamed_tokens);
            }
            None => out.output_tokens = st.streamed_tokens,
        }
        if let Some(r) = st.rci {
            out.rci = Some(r.finish(spec.rci_weights));
        }
        if !st.done && out.finish_reason.is_none() {
            return Err(RequestError {
                kind: ErrorKind::Incomplete,
                message: "the stream ended without [DONE] or a finish reason".into(),
            });
        }
        Ok(())
    }

    fn full(&self, spec: &RequestSpec<'_>, bytes: &[u8], out: &mut Outcome) -> Result<(), RequestError> {
        let full: Full = serde_json::from_slice(bytes).map_err(|e| {
            // An error object in a 200 response.
            let msg = serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()
                .and_then(|v| v.get("error").map(|e| e.to_string()))
                .unwrap_or_else(|| format!("bad response: {e}"));
            RequestError { kind: ErrorKind::Decode, message: truncate(&msg) }
        })?;
        out.response_id = full.id;
        out.response_model = full.model;
        let text = match full.choices.into_iter().next() {
            Some(c) => {
                out.finish_reason = c.finish_reason;
                if self.cfg.logprobs.is_some() {
                    out.first_top_logprobs = c.logprobs.as_ref().and_then(|lp| first_logprobs(lp).0);
                }
                let reasoning = c.message.as_ref().and_then(|m| m.reasoning_content.clone()).unwrap_or_default();
                let text = c.message.and_then(|m| m.content).or(c.text).unwrap_or_default();
                (text, reasoning)
            }
            None => (String::new(), String::new()),
        };
        match full.usage {
            Some(u) if u.completion_tokens.is_some() => {
                out.usage_reported = true;
                out.input_tokens = u.prompt_tokens.unwrap_or(0);
                out.output_tokens = u.completion_tokens.unwrap_or(0);
            }
            _ => out.output_tokens = estimate_tokens(text.0.len() + text.1.len()),
        }
        if spec.record_tokens && !(text.0.is_empty() && text.1.is_empty()) {
            out.tokens.push(super::outcome::TokenEvent {
                at: out.e2e,
                text: text.0.clone(),
                reasoning: text.1.clone(),
                tokens: out.output_tokens,
            });
        }
        if let Some(r) = &spec.reference {
            let mut rci = Rci::new(r.clone());
            rci.push(&text.0);
            out.rci = Some(rci.finish(spec.rci_weights));
        }
        if spec.keep_text {
            out.text = text.0;
        }
        Ok(())
    }
}
