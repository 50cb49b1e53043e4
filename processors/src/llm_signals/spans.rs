//! Request spans → per-request measurements: vLLM `llm_request`, SGLang request root spans, TGI
//! router handler spans, GenAI-semconv spans (tests/fixtures/servers/*.spans.json).
//!
//! * **vLLM** (`llm_request`, or any span with a double `gen_ai.latency.e2e` / `.time_to_first_token`):
//!   latencies from `gen_ai.latency.*` (float seconds; e2e falls back to the span duration),
//!   tokens from `gen_ai.usage.*` (old and new names).
//! * **SGLang** (the request's root span `"<role> Req <rid[:8]>"`, `" Req 1a2b3c4d"` on a unified
//!   server): read as vLLM's (`gen_ai.latency.*`, `gen_ai.usage.*`).
//! * **TGI** (the handler spans: `completions` and `chat_completions`, with or without
//!   `total_time`, which TGI records on success only; `generate` and `generate_stream` when they
//!   carry `total_time` or `parameters`, since `router/src/infer`'s inner spans of those names
//!   carry neither; `compat_generate` wraps them and is not counted again): Rust Debug duration strings in
//!   `total_time`, `queue_time`, `inference_time`, `time_per_token`; e2e falls back to the span
//!   duration. No TTFT. Output tokens ≈ inference_time / time_per_token.
//! * **GenAI semconv** (string `gen_ai.operation.name`, not a non-inference operation): e2e is the
//!   span duration; TTFT from `gen_ai.server.time_to_first_token` or
//!   `gen_ai.response.time_to_first_chunk` when present.
//!
//! A request is an error only by what its producer really sets: status ERROR (any flavour); for
//! SGLang also `gen_ai.response.finish_reasons` naming `abort` (a JSON string, `"[\"abort\"]"`);
//! for semconv spans also `error.type` or a finish reason `error` / `abort`. vLLM sets none of
//! them (no status, no finish reason on `llm_request`): its errors come from the scraped
//! `vllm:request_success_total{finished_reason}`. TTFT and TPOT count successful requests only
//! (as semconv defines its server histograms); TPOT = (e2e − TTFT) / (output tokens − 1), or
//! TGI's own `time_per_token`. The bench's quality attributes (`inferwatch.bench.tle_bits`,
//! `inferwatch.bench.rci`) are read from successful requests of every flavour.

use super::hist::Lat;
use super::model::{column, opt_column};
use super::quality::{Qual, RCI_NAME, TLE_NAME};
use arrow_array::{Array, Float64Array, Int32Array, Int64Array, MapArray, RecordBatch, StringArray};
use inferwatch_core::arrow::anyvalue::AttributesReader;
use inferwatch_core::arrow::{ConvError, schema};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// Span names of TGI's HTTP handler spans, one per request (they record `total_time` on success).
pub const TGI_SPAN_NAMES: &[&str] = &["generate", "generate_stream", "completions", "chat_completions"];
/// The TGI handler spans no inner span shares a name with: requests by their name alone.
pub const TGI_OPENAI_HANDLERS: &[&str] = &["completions", "chat_completions"];
/// `gen_ai.operation.name` values that are not model inference (such spans are skipped).
pub const NON_INFERENCE_OPERATIONS: &[&str] =
    &["embeddings", "retrieval", "execute_tool", "create_agent", "invoke_agent", "invoke_workflow"];
/// Span attribute holding the request id (equal on mirrored copies of a request).
pub const REQUEST_ID_ATTRIBUTE: &str = "gen_ai.request.id";
/// OTLP status code ERROR.
const STATUS_ERROR: i32 = 2;

/// Where a request span came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// vLLM `llm_request`.
    Vllm,
    /// SGLang request root span (`" Req <rid[:8]>"`).
    Sglang,
    /// TGI router handler span.
    Tgi,
    /// GenAI semantic-convention span.
    Semconv,
}

/// What one request span measured (seconds and tokens; `None` when not measured).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// Time to first token (successful requests only).
    pub ttft: Option<f64>,
    /// Time per output token after the first (successful requests only).
    pub tpot: Option<f64>,
    /// End-to-end duration.
    pub e2e: Option<f64>,
    /// Queue time.
    pub queue: Option<f64>,
    /// Output tokens.
    pub output_tokens: Option<f64>,
    /// Input (prompt) tokens.
    pub input_tokens: Option<f64>,
    /// Whether the request failed.
    pub error: bool,
    /// First-token entropy, bits (the bench's `inferwatch.bench.tle_bits`; successful requests only).
    pub tle: Option<f64>,
    /// Consistency index in [0, 1] (the bench's `inferwatch.bench.rci`; successful requests only).
    pub rci: Option<f64>,
    /// `gen_ai.request.id` (read only by a reader built [`SpanReader::with_request_ids`]).
    pub request_id: Option<String>,
}

impl Request {
    /// The measured value of latency signal `lat`, seconds.
    pub fn latency(&self, lat: Lat) -> Option<f64> {
        match lat {
            Lat::Ttft => self.ttft,
            Lat::Tpot => self.tpot,
            Lat::E2e => self.e2e,
            Lat::Queue => self.queue,
            Lat::Itl => None,
        }
    }
}

/// A span attribute value, as far as this module reads it.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Str(String),
    Num(f64),
    Strs(Vec<String>),
}

impl Val {
    fn number(&self) -> Option<f64> {
        match self {
            Val::Num(v) => Some(*v),
            _ => None,
        }
    }
    fn text(&self) -> Option<&str> {
        match self {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }
}

fn from_any(kv: &KeyValue) -> Option<Val> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(Val::Str(s.clone())),
        Value::IntValue(i) => Some(Val::Num(*i as f64)),
        Value::DoubleValue(d) => Some(Val::Num(*d)),
        Value::ArrayValue(a) => Some(Val::Strs(
            a.values
                .iter()
                .filter_map(|v| match v.value.as_ref() {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
        )),
        _ => None,
    }
}

/// A promoted span attribute column.
enum Promoted<'a> {
    Str(&'a StringArray),
    Int(&'a Int64Array),
    Double(&'a Float64Array),
}

/// Reads request spans of one batch.
pub struct SpanReader<'a> {
    names: &'a StringArray,
    status: Option<&'a Int32Array>,
    durations: Option<&'a Int64Array>,
    promoted: Vec<(&'static str, Promoted<'a>)>,
    attrs: Option<AttributesReader<'a>>,
    request_ids: bool,
}

/// One row's attributes, the map read at most once.
struct Row<'r, 'a> {
    r: &'r SpanReader<'a>,
    row: usize,
    map: Option<Vec<KeyValue>>,
}

impl Row<'_, '_> {
    /// The value of `key` from its promoted column only (no map read; `None` when not promoted).
    fn promoted(&self, key: &str) -> Option<Val> {
        let (_, col) = self.r.promoted.iter().find(|(k, _)| *k == key)?;
        let row = self.row;
        match col {
            Promoted::Str(c) => c.is_valid(row).then(|| Val::Str(c.value(row).to_string())),
            Promoted::Int(c) => c.is_valid(row).then(|| Val::Num(c.value(row) as f64)),
            Promoted::Double(c) => c.is_valid(row).then(|| Val::Num(c.value(row))),
        }
    }

    fn get(&mut self, key: &str) -> Result<Option<Val>, ConvError> {
        if let Some(v) = self.promoted(key) {
            return Ok(Some(v));
        }
        if self.map.is_none() {
            self.map = Some(match &self.r.attrs {
                Some(a) => a.read(self.row)?,
                None => Vec::new(),
            });
        }
        Ok(self.map.iter().flatten().find(|kv| kv.key == key).and_then(from_any))
    }

    fn number(&mut self, key: &str) -> Result<Option<f64>, ConvError> {
        Ok(self.get(key)?.and_then(|v| v.number()))
    }

    fn text(&mut self, key: &str) -> Result<Option<String>, ConvError> {
        Ok(self.get(key)?.and_then(|v| v.text().map(str::to_string)))
    }

    /// The first of `keys` holding a number.
    fn first_number(&mut self, keys: &[&str]) -> Result<Option<f64>, ConvError> {
        for k in keys {
            if let Some(v) = self.number(k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// A TGI duration attribute: a Debug string ("12.3ms"), or a number of seconds.
    fn duration(&mut self, key: &str) -> Result<Option<f64>, ConvError> {
        Ok(match self.get(key)? {
            Some(Val::Str(s)) => parse_debug_duration(&s),
            Some(Val::Num(v)) => Some(v),
            _ => None,
        })
    }
}

/// A non-negative finite value, else `None`.
fn valid(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite() && *v >= 0.0)
}

/// Whether a finish-reasons value (JSON-list string such as `["stop"]`, plain string, or string
/// array) names `error` or `abort`.
fn finish_is_error(v: &Val) -> bool {
    let bad = |s: &str| {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|t| t.eq_ignore_ascii_case("error") || t.eq_ignore_ascii_case("abort"))
    };
    match v {
        Val::Str(s) => bad(s),
        Val::Strs(v) => v.iter().any(|s| bad(s)),
        Val::Num(_) => false,
    }
}

/// Whether `name` is an SGLang request root span: `"<role> Req <rid[:8]>"` (trace.py:568), the
/// role empty on a unified server (`" Req 1a2b3c4d"`) or a word such as `prefill`.
pub fn is_sglang_request_span(name: &str) -> bool {
    let Some(at) = name.rfind("Req ") else { return false };
    let (before, rid) = (&name[..at], &name[at + 4..]);
    let role_ok = before.is_empty() || (before.ends_with(' ') && !before.trim().contains(' '));
    role_ok && (1..=8).contains(&rid.len()) && rid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Parses a Rust `Debug`-formatted `Duration` (`"12.3ms"`, `"1.2s"`, `"850µs"`, `"100ns"`) into seconds.
pub fn parse_debug_duration(s: &str) -> Option<f64> {
    let s = s.trim().trim_matches('"');
    let (num, scale) = if let Some(n) = s.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = s.strip_suffix("µs").or_else(|| s.strip_suffix("μs")).or_else(|| s.strip_suffix("us")) {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        return None;
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    valid(num.parse::<f64>().ok().map(|v| v * scale))
}

impl<'a> SpanReader<'a> {
    /// A reader over a spans batch.
    pub fn new(batch: &'a RecordBatch) -> Result<Self, ConvError> {
        let mut promoted = Vec::new();
        for (key, ty) in schema::PROMOTED_SPAN_ATTRIBUTES {
            let col = match ty {
                schema::PromotedType::Str => opt_column::<StringArray>(batch, key)?.map(Promoted::Str),
                schema::PromotedType::Int => opt_column::<Int64Array>(batch, key)?.map(Promoted::Int),
                schema::PromotedType::Double => opt_column::<Float64Array>(batch, key)?.map(Promoted::Double),
            };
            if let Some(c) = col {
                promoted.push((*key, c));
            }
        }
        Ok(SpanReader {
            names: column(batch, schema::NAME)?,
            status: opt_column(batch, schema::STATUS_CODE)?,
            durations: opt_column(batch, schema::DURATION)?,
            promoted,
            attrs: opt_column::<MapArray>(batch, schema::ATTRIBUTES)?.map(AttributesReader::new).transpose()?,
            request_ids: false,
        })
    }

    /// The same reader, also reading each request's `gen_ai.request.id` when `on`.
    pub fn with_request_ids(mut self, on: bool) -> Self {
        self.request_ids = on;
        self
    }

    /// The request span at `row`: its flavor, measurements and own model (first of
    /// `model_attributes` set); `None` when the span is not a request span.
    pub fn read(
        &self,
        row: usize,
        model_attributes: &[String],
    ) -> Result<Option<(Flavor, Request, Option<String>)>, ConvError> {
        let mut r = Row { r: self, row, map: None };
        let name = self.names.value(row);
        // Classification reads the name and typed columns only, so other spans cost no map read.
        let flavor = if name == "llm_request" {
            Flavor::Vllm
        } else if is_sglang_request_span(name) {
            Flavor::Sglang
        } else if r.promoted("gen_ai.latency.e2e").is_some()
            || r.promoted("gen_ai.latency.time_to_first_token").is_some()
        {
            Flavor::Vllm
        } else if TGI_SPAN_NAMES.contains(&name)
            && (TGI_OPENAI_HANDLERS.contains(&name) || r.get("total_time")?.is_some() || r.get("parameters")?.is_some())
        {
            Flavor::Tgi
        } else {
            match r.promoted("gen_ai.operation.name") {
                Some(Val::Str(op)) if !NON_INFERENCE_OPERATIONS.contains(&op.as_str()) => Flavor::Semconv,
                _ => return Ok(None),
            }
        };
        let status_error = self.status.is_some_and(|s| s.is_valid(row) && s.value(row) == STATUS_ERROR);
        // Only what each producer really sets (module docs): vLLM and TGI set no finish reason.
        let error = status_error
            || match flavor {
                Flavor::Vllm | Flavor::Tgi => false,
                Flavor::Sglang => r.get("gen_ai.response.finish_reasons")?.is_some_and(|v| finish_is_error(&v)),
                Flavor::Semconv => {
                    r.get("gen_ai.response.finish_reasons")?.is_some_and(|v| finish_is_error(&v))
                        || r.text("error.type")?.is_some_and(|e| !e.is_empty())
                }
            };
        let span_s = self
            .durations
            .filter(|d| d.is_valid(row))
            .map(|d| d.value(row))
            .filter(|d| *d >= 0)
            .map(|d| d as f64 / 1e9);
        let mut req = Request { error, ..Default::default() };
        match flavor {
            Flavor::Vllm | Flavor::Sglang | Flavor::Semconv => {
                req.output_tokens =
                    valid(r.first_number(&["gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"])?);
                req.input_tokens = valid(r.first_number(&["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"])?);
                let ttft = if flavor != Flavor::Semconv {
                    req.e2e = valid(r.number("gen_ai.latency.e2e")?).or(span_s);
                    req.queue = valid(r.number("gen_ai.latency.time_in_queue")?);
                    valid(r.number("gen_ai.latency.time_to_first_token")?)
                } else {
                    req.e2e = span_s;
                    valid(
                        r.first_number(&["gen_ai.server.time_to_first_token", "gen_ai.response.time_to_first_chunk"])?,
                    )
                };
                if !error {
                    req.ttft = ttft;
                    if let (Some(e2e), Some(ttft), Some(out)) = (req.e2e, ttft, req.output_tokens)
                        && out >= 2.0
                    {
                        req.tpot = valid(Some((e2e - ttft) / (out - 1.0)));
                    }
                }
            }
            Flavor::Tgi => {
                req.e2e = r.duration("total_time")?.or(span_s);
                req.queue = r.duration("queue_time")?;
                let per_token = r.duration("time_per_token")?;
                if let (Some(inference), Some(per_token)) = (r.duration("inference_time")?, per_token)
                    && per_token > 0.0
                {
                    req.output_tokens = valid(Some((inference / per_token).round()));
                }
                if !error {
                    req.tpot = per_token;
                }
            }
        }
        if !error {
            req.tle = r.number(TLE_NAME)?.filter(|v| Qual::Tle.accepts(*v));
            req.rci = r.number(RCI_NAME)?.filter(|v| Qual::Rci.accepts(*v));
        }
        if self.request_ids {
            req.request_id = r.text(REQUEST_ID_ATTRIBUTE)?.filter(|id| !id.is_empty());
        }
        let mut model = None;
        for key in model_attributes {
            if let Some(m) = r.text(key)?.filter(|m| !m.is_empty()) {
                model = Some(m);
                break;
            }
        }
        Ok(Some((flavor, req, model)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_durations_parse() {
        let close = |s: &str, want: f64| {
            let got = parse_debug_duration(s).unwrap_or(f64::NAN);
            assert!((got - want).abs() <= want * 1e-12, "{s}: {got} vs {want}");
        };
        close("12.3ms", 0.0123);
        close("1.2s", 1.2);
        close("850µs", 0.00085);
        close("850μs", 0.00085);
        close("850us", 0.00085);
        close("100ns", 1e-7);
        close("\"2.5s\"", 2.5);
        close("75s", 75.0);
        for bad in ["", "ms", "12", "1e3ms", "-1s", "inf s", "NaNs", "1.2 h", "abc"] {
            assert_eq!(parse_debug_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sglang_root_span_names() {
        for yes in [" Req 1a2b3c4d", "prefill Req 1a2b3c4d", "decode Req abc", "Req 0f0f0f0f"] {
            assert!(is_sglang_request_span(yes), "{yes:?}");
        }
        for no in
            ["llm_request", "Req ", " Req 1a2b3c4d5", "Scheduler", "a b Req 1a2b3c4d", "xReq 12345678", " Req 12 34"]
        {
            assert!(!is_sglang_request_span(no), "{no:?}");
        }
    }

    #[test]
    fn finish_reasons_error_detection() {
        assert!(finish_is_error(&Val::Str("[\"abort\"]".into())));
        assert!(finish_is_error(&Val::Strs(vec!["stop".into(), "error".into()])));
        assert!(!finish_is_error(&Val::Str("[\"stop\"]".into())));
        assert!(!finish_is_error(&Val::Str("errors".into())));
    }
}
