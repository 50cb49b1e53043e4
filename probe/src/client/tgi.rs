//! TGI's own API (`--api tgi`): `POST /generate_stream` when streaming, `POST /generate`
//! otherwise, with `{"inputs", "parameters": {"max_new_tokens", "details": true, ...}}`.
//!
//! A stream is TGI's SSE events (`data:{"index", "token": {"id", "text", "logprob",
//! "special"}, "top_tokens", "generated_text", "details"}`, no `[DONE]`): every event is one
//! token (TTFT at the first, ITL between them; special tokens such as EOS count but add no
//! text), and the last one carries `generated_text` and `details` (`generated_tokens`,
//! `input_length`, `finish_reason`), read as usage. Errors come as `{"error", "error_type"}`,
//! as an event or as the body of a 4xx/5xx. A whole answer reads `details` for the output
//! tokens and the `x-prompt-tokens` header for the input. `--logprobs K` asks for
//! `top_n_tokens` (TGI allows 5 by default); TGI has no `ignore_eos`, so `--ignore-eos` is
//! not sent.

use super::outcome::{ErrorKind, Outcome, RequestError, truncate};
use super::request::{ClientConfig, RequestSpec};
use super::stream::StreamState;
use super::wire::Usage;
use crate::quality::Rci;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The URL of a TGI call: `/generate_stream` or `/generate` under the base endpoint (a
/// trailing `/v1` is dropped; a full `/generate...` path is kept).
pub(super) fn url(endpoint: &str, stream: bool) -> String {
    let e = endpoint.trim_end_matches('/');
    if e.ends_with("/generate") || e.ends_with("/generate_stream") {
        return e.to_string();
    }
    let e = e.strip_suffix("/v1").unwrap_or(e);
    format!("{e}/{}", if stream { "generate_stream" } else { "generate" })
}

#[derive(Serialize)]
struct Body<'a> {
    inputs: &'a str,
    parameters: Parameters,
}

#[derive(Serialize)]
struct Parameters {
    max_new_tokens: u32,
    details: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    do_sample: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_n_tokens: Option<u32>,
}

/// The JSON body of a TGI request. TGI refuses `temperature` 0: greedy is its default once
/// `parameters` is given, so 0 sends none.
pub(super) fn body(c: &ClientConfig, spec: &RequestSpec<'_>) -> Vec<u8> {
    let text = spec.prompt.to_text();
    let temperature = c.temperature.filter(|t| *t > 0.0);
    let b = Body {
        inputs: &text,
        parameters: Parameters {
            max_new_tokens: spec.max_tokens,
            details: true,
            do_sample: temperature.map(|_| true),
            temperature,
            top_n_tokens: c.logprobs,
        },
    };
    // Serialising plain structs and strings cannot fail.
    match spec.params.filter(|p| !p.is_empty()) {
        None => serde_json::to_vec(&b).unwrap_or_default(),
        Some(extra) => {
            // a hook's extra parameters are TGI generation parameters
            let mut v = serde_json::to_value(&b).unwrap_or_default();
            if let Some(m) = v.get_mut("parameters").and_then(serde_json::Value::as_object_mut) {
                m.extend(extra.iter().map(|(k, x)| (k.clone(), x.clone())));
            }
            serde_json::to_vec(&v).unwrap_or_default()
        }
    }
}

#[derive(Deserialize)]
struct TokenW {
    #[serde(default)]
    text: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct TopW {
    #[serde(default)]
    logprob: Option<f64>,
}

#[derive(Deserialize)]
struct DetailsW {
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    generated_tokens: Option<u64>,
    #[serde(default)]
    input_length: Option<u64>,
    #[serde(default)]
    top_tokens: Vec<Vec<TopW>>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    token: Option<TokenW>,
    #[serde(default)]
    top_tokens: Vec<TopW>,
    #[serde(default)]
    generated_text: Option<String>,
    #[serde(default)]
    details: Option<DetailsW>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    error_type: Option<String>,
}

fn tgi_error(error: &str, error_type: Option<&str>) -> String {
    match error_type {
        Some(t) => truncate(&format!("{t}: {error}")),
        None => truncate(error),
    }
}

/// The message of an error body (`{"error", "error_type"}`), if it is one.
pub(super) fn error_message(body: &str) -> Option<String> {
    let e: Event = serde_json::from_str(body).ok()?;
    e.error.map(|m| tgi_error(&m, e.error_type.as_deref()))
}

/// One SSE event of a TGI stream.
pub(super) fn event(st: &mut StreamState, data: &str, now: Instant, out: &mut Outcome) {
    if st.error.is_some() || st.done {
        return;
    }
    let data = data.trim();
    if data.is_empty() {
        return;
    }
    let ev: Event = match serde_json::from_str(data) {
        Ok(e) => e,
        Err(e) => {
            st.error = Some(RequestError { kind: ErrorKind::Decode, message: format!("bad event: {e}") });
            return;
        }
    };
    if let Some(msg) = &ev.error {
        st.error = Some(RequestError { kind: ErrorKind::Stream, message: tgi_error(msg, ev.error_type.as_deref()) });
        return;
    }
    if let Some(t) = &ev.token {
        match st.last {
            None => out.ttft = Some(now - st.start),
            Some(prev) => out.itl.push(now - prev),
        }
        st.last = Some(now);
        st.streamed_tokens += 1;
        if st.want_logprobs && out.first_top_logprobs.is_none() && !ev.top_tokens.is_empty() {
            out.first_top_logprobs = Some(ev.top_tokens.iter().filter_map(|x| x.logprob).collect());
        }
        if st.record_tokens {
            let text = if t.special { String::new() } else { t.text.clone() };
            out.tokens.push(super::outcome::TokenEvent {
                at: now - st.start,
                text,
                reasoning: String::new(),
                tokens: 1,
            });
        }
        if !t.special && !t.text.is_empty() {
            if let Some(r) = &mut st.rci {
                r.push(&t.text);
            }
            if st.keep_text {
                out.text.push_str(&t.text);
            }
        }
    }
    if let Some(d) = &ev.details {
        if d.generated_tokens.is_some() || d.input_length.is_some() {
            st.usage = Some(Usage { prompt_tokens: d.input_length, completion_tokens: d.generated_tokens });
        }
        out.finish_reason = d.finish_reason.clone();
    }
    if ev.generated_text.is_some() {
        st.done = true;
        if out.finish_reason.is_none() {
            // the last event without details (details: false): it ended all the same
            out.finish_reason = Some("unknown".into());
        }
    }
}

#[derive(Deserialize)]
struct WholeW {
    generated_text: String,
    #[serde(default)]
    details: Option<DetailsW>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Whole {
    One(WholeW),
    List(Vec<WholeW>),
}

/// `x-prompt-tokens` of a `/generate` answer.
pub(super) fn prompt_tokens(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers.get("x-prompt-tokens")?.to_str().ok()?.trim().parse().ok()
}

/// A whole `/generate` answer (or the one-element list `POST /` gives).
pub(super) fn full(
    spec: &RequestSpec<'_>,
    bytes: &[u8],
    prompt_tokens: Option<u64>,
    want_logprobs: bool,
    out: &mut Outcome,
) -> Result<(), RequestError> {
    let whole: Whole = serde_json::from_slice(bytes).map_err(|e| {
        let msg =
            std::str::from_utf8(bytes).ok().and_then(error_message).unwrap_or_else(|| format!("bad response: {e}"));
        RequestError { kind: ErrorKind::Decode, message: truncate(&msg) }
    })?;
    let w = match whole {
        Whole::One(w) => w,
        Whole::List(l) => l
            .into_iter()
            .next()
            .ok_or_else(|| RequestError { kind: ErrorKind::Decode, message: "an empty list of generations".into() })?,
    };
    match &w.details {
        Some(d) => {
            out.finish_reason = d.finish_reason.clone();
            if let Some(n) = d.generated_tokens {
                out.usage_reported = true;
                out.output_tokens = n;
                out.input_tokens = prompt_tokens.unwrap_or(0);
            }
            if want_logprobs {
                out.first_top_logprobs =
                    d.top_tokens.first().map(|t| t.iter().filter_map(|x| x.logprob).collect::<Vec<_>>());
            }
        }
        None => out.output_tokens = super::request::estimate_tokens(w.generated_text.len()),
    }
    if spec.record_tokens && !w.generated_text.is_empty() {
        out.tokens.push(super::outcome::TokenEvent {
            at: out.e2e,
            text: w.generated_text.clone(),
            reasoning: String::new(),
            tokens: out.output_tokens,
        });
    }
    if let Some(r) = &spec.reference {
        let mut rci = Rci::new(r.clone());
        rci.push(&w.generated_text);
        out.rci = Some(rci.finish(spec.rci_weights));
    }
    if spec.keep_text {
        out.text = w.generated_text;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Api, Prompt};
    use std::time::{Duration, SystemTime};

    fn state(start: Instant) -> StreamState {
        StreamState {
            start,
            last: None,
            keep_text: true,
            record_tokens: true,
            want_logprobs: true,
            rci: None,
            done: false,
            streamed_tokens: 0,
            usage: None,
            error: None,
        }
    }

    #[test]
    fn urls() {
        assert_eq!(url("http://h:80", true), "http://h:80/generate_stream");
        assert_eq!(url("http://h:80/v1/", false), "http://h:80/generate");
        assert_eq!(url("http://h/x/generate", true), "http://h/x/generate");
    }

    #[test]
    fn reads_tgis_events() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let mut out = Outcome::new(t0, SystemTime::now());
        let ev = [
            r#"{"index":1,"token":{"id":5,"text":"Hi","logprob":-0.1,"special":false},"top_tokens":[{"id":5,"text":"Hi","logprob":-0.1,"special":false},{"id":6,"text":"Yo","logprob":-2.5,"special":false}],"generated_text":null,"details":null}"#,
            r#"{"index":2,"token":{"id":7,"text":" there","logprob":-0.2,"special":false},"generated_text":null,"details":null}"#,
            r#"{"index":3,"token":{"id":2,"text":"</s>","logprob":-0.3,"special":true},"generated_text":"Hi there","details":{"finish_reason":"eos_token","generated_tokens":3,"seed":null,"input_length":9}}"#,
        ];
        for (i, e) in ev.iter().enumerate() {
            assert!(!st.done);
            event(&mut st, e, t0 + Duration::from_millis(10 * (i as u64 + 1)), &mut out);
        }
        assert!(st.done && st.error.is_none());
        assert_eq!(out.ttft, Some(Duration::from_millis(10)));
        assert_eq!(out.itl, vec![Duration::from_millis(10); 2]);
        assert_eq!(st.streamed_tokens, 3, "EOS counts");
        assert_eq!(out.text, "Hi there", "but adds no text");
        assert_eq!(out.finish_reason.as_deref(), Some("eos_token"));
        assert_eq!(out.first_top_logprobs, Some(vec![-0.1, -2.5]));
        assert_eq!(out.tokens.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(), ["Hi", " there", ""]);
        let u = st.usage.as_ref().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(9), Some(3)));

        let mut st = state(t0);
        let err =
            r#"{"error":"Input validation error: `temperature` must be strictly positive","error_type":"validation"}"#;
        event(&mut st, err, t0, &mut out);
        let e = st.error.unwrap();
        assert_eq!(e.kind, ErrorKind::Stream);
        assert!(e.message.starts_with("validation: Input validation error"), "{}", e.message);
    }

    #[test]
    fn body_and_whole_answer() {
        let cfg = ClientConfig {
            endpoint: "http://h".into(),
            api: Api::Tgi,
            model: "m".into(),
            stream: true,
            stream_usage: true,
            api_key: None,
            insecure: false,
            temperature: Some(0.0),
            ignore_eos: true,
            logprobs: Some(3),
            pool_size: 1,
        };
        let p = Prompt::Text("Hello".into());
        let spec = RequestSpec {
            prompt: &p,
            max_tokens: 7,
            keep_text: true,
            reference: None,
            rci_weights: crate::quality::RciWeights::default(),
            traceparent: None,
            timeout: Duration::from_secs(1),
            params: None,
            record_tokens: false,
            images: &[],
        };
        let b: serde_json::Value = serde_json::from_slice(&body(&cfg, &spec)).unwrap();
        assert_eq!(
            b,
            serde_json::json!({"inputs": "Hello", "parameters": {"max_new_tokens": 7, "details": true, "top_n_tokens": 3}}),
            "no temperature 0 (TGI refuses it), no ignore_eos (TGI has none)"
        );
        let t0 = Instant::now();
        let mut out = Outcome::new(t0, SystemTime::now());
        let whole = br#"[{"generated_text":"Hi","details":{"finish_reason":"length","generated_tokens":7,"seed":null,"prefill":[],"tokens":[]}}]"#;
        full(&spec, whole, Some(4), false, &mut out).unwrap();
        assert_eq!((out.output_tokens, out.input_tokens, out.usage_reported), (7, 4, true));
        assert_eq!((out.text.as_str(), out.finish_reason.as_deref()), ("Hi", Some("length")));
        let e = full(&spec, br#"{"error":"Model is overloaded","error_type":"overloaded"}"#, None, false, &mut out);
        assert_eq!(e.unwrap_err().message, "overloaded: Model is overloaded");
    }
}
