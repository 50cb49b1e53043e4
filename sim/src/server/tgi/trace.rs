//! TGI's request timings and its router handler spans (tests/fixtures/servers/tgi-*.spans.json).
//!
//! TGI's HTTP handlers (`chat_completions`, `completions`) are `#[instrument]`ed with the
//! empty fields `total_time`, `validation_time`, `queue_time`, `inference_time`,
//! `time_per_token` and `seed`, which `generate_internal` / `generate_stream_internal` fill
//! with `format!("{:?}", Duration)` strings ("12.345ms", "850µs") once the generation ends;
//! tracing-opentelemetry exports them as string attributes. One handler span covers the
//! whole HTTP request, however many generations it runs (the last one to finish writes the
//! fields). Handler spans of `chat_completions` and `completions` carry no `parameters`
//! field: TGI comments it out there (it records it on `/generate` only).

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};

use crate::engine::{FinishReason, Nanos, RequestId, RequestRecord};
use crate::server::telemetry::{SpanMeta, kv_str, span_context};

/// `service.name` of TGI's router (`--otlp-service-name` default).
pub const SERVICE_NAME: &str = "text-generation-inference.router";
/// The tracer opentelemetry-otlp 0.13 installs for tracing-opentelemetry in TGI's router.
pub const SCOPE_NAME: &str = "opentelemetry-otlp";
/// Its version.
pub const SCOPE_VERSION: &str = "0.13.0";

/// The instrumentation scope of TGI's router spans.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope { name: SCOPE_NAME.into(), version: SCOPE_VERSION.into(), ..Default::default() }
}

/// What the TGI handler span of an HTTP request needs to know about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handler {
    /// The handler (span name): `chat_completions` or `completions`.
    pub name: &'static str,
    /// Key of the HTTP request: the engine id of its first generation.
    pub group: RequestId,
    /// Generations (engine requests) the HTTP request runs.
    pub members: u32,
    /// The seed TGI reports: the request's, a random one when sampling, none when greedy.
    pub seed: Option<u64>,
    /// Engine time when the HTTP request reached the handler (its generations enter the
    /// engine after validation).
    pub arrival: Nanos,
    /// The span's `parameters` field (`Debug` of `GenerateParameters`): `/generate` and
    /// `/generate_stream` record it, the OpenAI handlers do not.
    pub parameters: Option<String>,
}

/// TGI's per-request intervals (`generate_internal`): validation = queued − start,
/// queue = batch start − queued, inference = end − batch start, time per token = inference /
/// generated tokens (integer nanoseconds, as `Duration / u32`), total = end − start, where
/// start is the handler's arrival and queued the generation's arrival in the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Arrival to end.
    pub total: Duration,
    /// Handler arrival to entering the queue (validation and tokenisation).
    pub validation: Duration,
    /// In the queue until first scheduled.
    pub queue: Duration,
    /// First scheduled to end (prefill included).
    pub inference: Duration,
    /// `inference / generated_tokens`.
    pub time_per_token: Duration,
}

impl Timings {
    /// The timings of a finished generation whose HTTP request reached the handler at engine
    /// time `handler_arrival`.
    pub fn of(r: &RequestRecord, handler_arrival: Nanos) -> Self {
        let queued = r.arrival.min(r.finished);
        let begin = handler_arrival.min(queued);
        let start = r.scheduled.unwrap_or(r.finished).clamp(queued, r.finished);
        let inference = Duration::from_nanos(r.finished - start);
        Timings {
            total: Duration::from_nanos(r.finished - begin),
            validation: Duration::from_nanos(queued - begin),
            queue: Duration::from_nanos(start - queued),
            inference,
            time_per_token: inference / r.completion_tokens.max(1),
        }
    }
}

/// The handler span of an HTTP request; `timings` is `None` when it failed or was dropped
/// (TGI records no timing fields then).
pub fn handler_span(meta: &SpanMeta, r: &RequestRecord, timings: Option<&Timings>, start_unix_ns: u64) -> Span {
    let ids = span_context(meta.parent.as_ref());
    let mut attributes: Vec<_> = meta.handler.parameters.iter().map(|p| kv_str("parameters", p.clone())).collect();
    attributes.extend(match timings {
        Some(t) => vec![
            kv_str("total_time", format!("{:?}", t.total)),
            kv_str("validation_time", format!("{:?}", t.validation)),
            kv_str("queue_time", format!("{:?}", t.queue)),
            kv_str("inference_time", format!("{:?}", t.inference)),
            kv_str("time_per_token", format!("{:?}", t.time_per_token)),
            kv_str("seed", format!("{:?}", meta.handler.seed)),
        ],
        None => Vec::new(),
    });
    let status = (r.finish_reason == FinishReason::Error).then(|| Status {
        message: "Request failed during generation: the KV cache could not hold it".into(),
        code: status::StatusCode::Error as i32,
    });
    Span {
        trace_id: ids.trace_id,
        span_id: ids.span_id,
        trace_state: ids.trace_state,
        parent_span_id: ids.parent_span_id,
        flags: ids.flags,
        name: meta.handler.name.into(),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start_unix_ns.saturating_add(meta.handler.arrival.min(r.arrival)),
        end_time_unix_nano: start_unix_ns.saturating_add(r.finished),
        attributes,
        status,
        ..Default::default()
    }
}

#[derive(Debug)]
struct Group {
    remaining: u32,
    emitted: bool,
}

/// Collects the generations of each HTTP request into its one handler span.
#[derive(Debug, Default)]
pub struct HandlerSpans {
    groups: HashMap<RequestId, Group>,
}

impl HandlerSpans {
    /// An HTTP request whose generations the engine accepted.
    pub fn open(&mut self, h: &Handler) {
        self.groups.entry(h.group).or_insert(Group { remaining: h.members.max(1), emitted: false });
    }

    /// One generation finished; returns the handler span when the HTTP request is over: its
    /// last generation finished, or one failed (TGI's handler returns the error at once).
    pub fn finish(&mut self, meta: &SpanMeta, r: &RequestRecord, t: &Timings, start_unix_ns: u64) -> Option<Span> {
        let ok = matches!(r.finish_reason, FinishReason::Stop | FinishReason::Length);
        let g = self.groups.entry(meta.handler.group).or_insert(Group { remaining: 1, emitted: false });
        g.remaining = g.remaining.saturating_sub(1);
        let over = g.remaining == 0;
        let span = (!g.emitted && (over || !ok)).then(|| handler_span(meta, r, ok.then_some(t), start_unix_ns));
        g.emitted |= span.is_some();
        if over {
            self.groups.remove(&meta.handler.group);
        }
        span
    }

    /// HTTP requests with generations still running.
    pub fn open_requests(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::telemetry::SpanMeta;

    fn record(
        id: u64,
        arrival: Nanos,
        scheduled: Nanos,
        finished: Nanos,
        tokens: u32,
        fr: FinishReason,
    ) -> RequestRecord {
        RequestRecord {
            id,
            arrival,
            scheduled: Some(scheduled),
            first_token: Some(scheduled + 1),
            last_token: Some(finished),
            finished,
            prompt_tokens: 10,
            completion_tokens: tokens,
            max_tokens: tokens,
            cached_tokens: 0,
            preemptions: 0,
            finish_reason: fr,
        }
    }

    fn meta(group: u64, members: u32) -> SpanMeta {
        SpanMeta {
            request_id: "chatcmpl-1".into(),
            max_tokens: 4,
            temperature: 1.0,
            top_p: 1.0,
            n: members,
            parent: None,
            handler: Handler { name: "chat_completions", group, members, seed: Some(42), arrival: 0, parameters: None },
        }
    }

    #[test]
    fn timings_add_up_and_format_as_debug_durations() {
        let r = record(1, 35_200, 2_500_000, 1_502_500_000, 3, FinishReason::Stop);
        let t = Timings::of(&r, 0);
        assert_eq!(t.validation, Duration::from_nanos(35_200));
        assert_eq!(t.validation + t.queue + t.inference, t.total);
        assert_eq!(t.time_per_token, Duration::from_nanos(500_000_000));
        assert_eq!(format!("{:?}", t.validation), "35.2µs");
        assert_eq!(format!("{:?}", t.queue), "2.4648ms");
        assert_eq!(format!("{:?}", t.inference), "1.5s");
        assert_eq!(format!("{:?}", t.total), "1.5025s");
        // a handler arrival after the engine's (not in practice): nothing goes negative
        let odd = Timings::of(&r, 10_000_000_000);
        assert_eq!(odd.validation, Duration::ZERO);
        assert_eq!(odd.validation + odd.queue + odd.inference, odd.total);
    }

    #[test]
    fn one_span_per_http_request() {
        let mut s = HandlerSpans::default();
        let m = meta(7, 2);
        s.open(&m.handler);
        let r1 = record(7, 0, 10, 1_000, 2, FinishReason::Length);
        let r2 = record(8, 0, 10, 2_000, 4, FinishReason::Stop);
        assert!(s.finish(&m, &r1, &Timings::of(&r1, 5), 0).is_none(), "the other generation still runs");
        let span = s.finish(&m, &r2, &Timings::of(&r2, 5), 100).expect("span at the end");
        assert_eq!(span.name, "chat_completions");
        assert_eq!(span.end_time_unix_nano, 2_100);
        assert_eq!(span.attributes.len(), 6);
        assert!(span.attributes.iter().all(|kv| !kv.key.starts_with("gen_ai.")));
        assert_eq!(s.open_requests(), 0);

        // a failed generation ends the request at once, without timings
        let m = meta(9, 2);
        s.open(&m.handler);
        let bad = record(9, 0, 10, 500, 1, FinishReason::Error);
        let span = s.finish(&m, &bad, &Timings::of(&bad, 5), 0).expect("error span");
        assert!(span.attributes.is_empty());
        assert_eq!(span.status.map(|st| st.code), Some(status::StatusCode::Error as i32));
        let aborted = record(10, 0, 10, 600, 1, FinishReason::Abort);
        assert!(s.finish(&m, &aborted, &Timings::of(&aborted, 5), 0).is_none(), "already reported");
        assert_eq!(s.open_requests(), 0);
    }
}
