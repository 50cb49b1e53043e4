//! SGLang's request spans (`--enable-trace`, tests/fixtures/servers/sglang-0.5.23.spans.json,
//! `sglang/srt/observability/trace.py`, `req_time_stats.py`): per request a root span
//! `"<role> Req <rid[:8]>"` (the role is empty on a unified server, hence the leading space)
//! with `rid` and `module`, and at its end the `gen_ai.*` usage, request and latency attributes
//! and `gen_ai.response.finish_reasons` as a JSON string (`"[\"stop\"]"`); under it one thread
//! span per process that handled the request (`Tokenizer`, `Scheduler [TP 0]  [PP 0]`, named
//! with host and pid) holding the stage slices (`tokenize`, `prefill_waiting`,
//! `prefill_forward`). The root span never has a status; an aborted request's scheduler thread
//! span gets status ERROR and the abort's fields (`type`, `message`, and `status_code`,
//! `err_type` when set). All spans are INTERNAL, scope `sglang server`, service `sglang`.

use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};

use crate::engine::tokens::{mix64, prompt_key};
use crate::engine::{FinishReason, Nanos, RequestRecord};
use crate::server::telemetry::{SpanMeta, kv_f64, kv_int, kv_str, span_context};

/// `service.name` default (`OTEL_SERVICE_NAME` overrides it).
pub const SERVICE_NAME: &str = "sglang";
/// The tracer's name (`trace.get_tracer("sglang server")`).
pub const SCOPE_NAME: &str = "sglang server";

/// The instrumentation scope of SGLang's spans.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope { name: SCOPE_NAME.into(), ..Default::default() }
}

/// SGLang's request id for a request: 32 hex digits (`uuid.uuid4().hex`), stable per request.
pub fn rid(request_id: &str, engine_id: u64) -> String {
    let a = mix64(prompt_key(request_id) ^ engine_id);
    format!("{a:016x}{:016x}", mix64(a ^ 0x5151_5eed))
}

/// The finish reason type SGLang reports (`stop`, `length`, `abort`): a failure inside the
/// engine is an abort the scheduler sends back.
pub fn finish_type(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort | FinishReason::Error => "abort",
    }
}

/// The tokenizer's work on a prompt before it reaches the scheduler, as modelled here:
/// 30 µs plus 100 ns per prompt token (never past the request's scheduling).
pub fn tokenize_ns(prompt_tokens: u32) -> Nanos {
    30_000 + 100 * u64::from(prompt_tokens)
}

/// Where this server runs: the process id and SGLang's host id (the first 8 hex digits show
/// in thread span names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    /// The process id.
    pub pid: u32,
    /// The host id.
    pub host_id: String,
}

impl Process {
    /// This process.
    pub fn current() -> Self {
        let pid = std::process::id();
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
        let a = mix64(prompt_key(&host));
        Process { pid, host_id: format!("{a:016x}{:016x}", mix64(a)) }
    }
}

fn child(parent: &Span, name: String, start: u64, end: u64, attributes: Vec<KeyValue>) -> Span {
    Span {
        trace_id: parent.trace_id.clone(),
        span_id: rand::random::<u64>().max(1).to_be_bytes().to_vec(),
        parent_span_id: parent.span_id.clone(),
        flags: 0x101,
        name,
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: end.max(start),
        attributes,
        ..Default::default()
    }
}

/// The spans of one finished request (root first); `engine_id` keys its rid, `model` is the
/// served model name, `start_unix_ns` maps engine time to wall-clock time.
pub fn request_spans(
    meta: &SpanMeta,
    r: &RequestRecord,
    engine_id: u64,
    model: &str,
    proc_: &Process,
    start_unix_ns: u64,
) -> Vec<Span> {
    let ids = span_context(meta.parent.as_ref());
    let rid = rid(&meta.request_id, engine_id);
    let at = |t: Nanos| start_unix_ns.saturating_add(t);
    let arrival = r.arrival;
    let dispatched =
        arrival + tokenize_ns(r.prompt_tokens).min(r.scheduled.unwrap_or(r.finished).saturating_sub(arrival));
    let secs = |a: Nanos, b: Nanos| b.saturating_sub(a) as f64 / 1e9;
    let mut attributes = vec![
        kv_str("rid", rid.clone()),
        kv_str("module", "sglang::request"),
        kv_int("gen_ai.usage.completion_tokens", i64::from(r.completion_tokens)),
        kv_int("gen_ai.usage.prompt_tokens", i64::from(r.prompt_tokens)),
        kv_int("gen_ai.usage.cached_tokens", i64::from(r.cached_tokens.min(r.prompt_tokens))),
        kv_str("gen_ai.request.id", rid.clone()),
        kv_int("gen_ai.request.max_tokens", i64::from(meta.max_tokens)),
    ];
    // only truthy sampling parameters are recorded
    if meta.top_p != 0.0 {
        attributes.push(kv_f64("gen_ai.request.top_p", meta.top_p));
    }
    if meta.temperature != 0.0 {
        attributes.push(kv_f64("gen_ai.request.temperature", meta.temperature));
    }
    if meta.n != 0 {
        attributes.push(kv_int("gen_ai.request.n", i64::from(meta.n)));
    }
    attributes.push(kv_str("gen_ai.response.model", model));
    attributes.push(kv_str("gen_ai.response.finish_reasons", format!("[\"{}\"]", finish_type(r.finish_reason))));
    if let Some(first) = r.first_token {
        attributes.push(kv_f64("gen_ai.latency.time_to_first_token", secs(arrival, first)));
    }
    attributes.push(kv_f64("gen_ai.latency.e2e", secs(arrival, r.finished)));
    if let Some(first) = r.first_token {
        attributes.push(kv_f64("gen_ai.latency.time_in_model_decode", secs(first, r.finished)));
    }
    attributes.push(kv_f64("gen_ai.latency.time_in_model_inference", secs(dispatched, r.finished)));
    if let Some(first) = r.first_token {
        attributes.push(kv_f64("gen_ai.latency.time_in_model_prefill", secs(dispatched, first)));
    }
    let root = Span {
        trace_id: ids.trace_id,
        span_id: ids.span_id,
        trace_state: ids.trace_state,
        parent_span_id: ids.parent_span_id,
        flags: ids.flags,
        name: format!(" Req {}", &rid[..8]),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: at(arrival),
        end_time_unix_nano: at(r.finished),
        attributes,
        ..Default::default()
    };
    let host8 = &proc_.host_id[..8];
    let thread_attrs = |label: &str, ranks: bool| {
        let mut a = Vec::new();
        if ranks {
            a.push(kv_int("tp_rank", 0));
            a.push(kv_int("pp_rank", 0));
        }
        a.extend([
            kv_str("host_id", proc_.host_id.clone()),
            kv_int("pid", i64::from(proc_.pid)),
            kv_str("thread_label", label),
        ]);
        a
    };
    let tokenizer = child(
        &root,
        format!("Tokenizer (host:{host8} | pid:{})", proc_.pid),
        at(arrival),
        at(dispatched),
        thread_attrs("Tokenizer", false),
    );
    let tokenize = child(&tokenizer, "tokenize".into(), at(arrival), at(dispatched), Vec::new());
    let mut scheduler = child(
        &root,
        format!("Scheduler [TP 0]  [PP 0] (host:{host8} | pid:{})", proc_.pid),
        at(dispatched),
        at(r.finished),
        thread_attrs("Scheduler", true),
    );
    let mut spans = Vec::with_capacity(6);
    let scheduled = r.scheduled.map(|s| s.max(dispatched));
    let waiting =
        child(&scheduler, "prefill_waiting".into(), at(dispatched), at(scheduled.unwrap_or(r.finished)), Vec::new());
    let forward = scheduled.map(|s| {
        child(&scheduler, "prefill_forward".into(), at(s), at(r.first_token.unwrap_or(r.finished).max(s)), Vec::new())
    });
    match r.finish_reason {
        FinishReason::Abort => {
            scheduler.status = Some(Status { message: String::new(), code: status::StatusCode::Error as i32 });
            scheduler.attributes.extend([kv_str("type", "abort"), kv_str("message", "Aborted")]);
        }
        FinishReason::Error => {
            scheduler.status = Some(Status { message: String::new(), code: status::StatusCode::Error as i32 });
            scheduler.attributes.extend([
                kv_str("type", "abort"),
                kv_str("message", "The KV cache could not hold the request: retracted and aborted."),
                kv_int("status_code", 503),
                kv_str("err_type", "ServiceUnavailable"),
            ]);
        }
        FinishReason::Stop | FinishReason::Length => {}
    }
    spans.push(root);
    spans.push(tokenizer);
    spans.push(tokenize);
    spans.push(scheduler);
    spans.push(waiting);
    spans.extend(forward);
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tgi::trace::Handler;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;

    fn record(fr: FinishReason) -> RequestRecord {
        RequestRecord {
            id: 3,
            arrival: 1_000_000,
            scheduled: Some(3_000_000),
            first_token: Some(10_000_000),
            last_token: Some(50_000_000),
            finished: 50_000_000,
            prompt_tokens: 20,
            completion_tokens: 5,
            max_tokens: 16,
            cached_tokens: 4,
            preemptions: 0,
            finish_reason: fr,
        }
    }

    fn meta() -> SpanMeta {
        SpanMeta {
            request_id: "chatcmpl-1".into(),
            max_tokens: 16,
            temperature: 0.0,
            top_p: 1.0,
            n: 1,
            parent: None,
            handler: Handler::default(),
        }
    }

    fn get<'a>(s: &'a Span, k: &str) -> Option<&'a Value> {
        s.attributes.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
    }

    #[test]
    fn root_span_in_sglangs_shape() {
        let p = Process::current();
        let spans = request_spans(&meta(), &record(FinishReason::Stop), 3, "m", &p, 1_000);
        let root = &spans[0];
        let Some(Value::StringValue(rid)) = get(root, "rid") else { panic!("rid") };
        assert_eq!(rid.len(), 32);
        assert_eq!(root.name, format!(" Req {}", &rid[..8]));
        assert_eq!(root.kind, span::SpanKind::Internal as i32);
        assert!(root.status.is_none());
        assert_eq!(get(root, "gen_ai.response.finish_reasons"), Some(&Value::StringValue("[\"stop\"]".into())));
        assert_eq!(get(root, "gen_ai.latency.e2e"), Some(&Value::DoubleValue(0.049)));
        assert_eq!(get(root, "gen_ai.latency.time_to_first_token"), Some(&Value::DoubleValue(0.009)));
        assert_eq!(get(root, "gen_ai.usage.cached_tokens"), Some(&Value::IntValue(4)));
        assert!(get(root, "gen_ai.request.temperature").is_none(), "0 is not truthy");
        assert!(get(root, "gen_ai.latency.time_in_queue").is_none(), "SGLang has no queue attribute");
        assert_eq!(spans.len(), 6);
        for s in &spans[1..] {
            assert_eq!(s.trace_id, root.trace_id);
            assert!(get(s, "gen_ai.latency.e2e").is_none(), "only the root is a request span");
            assert!(s.start_time_unix_nano <= s.end_time_unix_nano);
        }
        assert!(spans[3].name.starts_with("Scheduler [TP 0]  [PP 0] (host:"));
        assert_eq!(spans[3].parent_span_id, root.span_id);
        assert!(spans[3].status.is_none());
    }

    #[test]
    fn aborts_mark_the_scheduler_thread_span() {
        let p = Process::current();
        for fr in [FinishReason::Abort, FinishReason::Error] {
            let spans = request_spans(&meta(), &record(fr), 3, "m", &p, 0);
            assert!(spans[0].status.is_none(), "the root span carries no status");
            assert_eq!(
                get(&spans[0], "gen_ai.response.finish_reasons"),
                Some(&Value::StringValue("[\"abort\"]".into()))
            );
            assert_eq!(spans[3].status.as_ref().map(|s| s.code), Some(status::StatusCode::Error as i32));
            assert_eq!(get(&spans[3], "type"), Some(&Value::StringValue("abort".into())));
        }
        assert_eq!(rid("a", 1), rid("a", 1));
        assert_ne!(rid("a", 1), rid("a", 2));
    }
}
