//! The request template: OTLP trace export requests whose spans look like the request spans
//! an LLM server (vLLM, TGI) emits, encoded fast.
//!
//! Everything that is the same from span to span (names, most attributes, the resource, the
//! scope, the event's name and attributes, status and flags) is encoded once with prost.
//! A request is then written by splicing those segments with the few fields that change
//! per span: ids, timestamps, five numeric attributes of fixed width and the `blast.seq`
//! attribute. The output is byte-for-byte what prost would encode for the same message (a
//! unit test checks it), so collectors see canonical protobuf, and the generator costs a
//! memcpy per span instead of a full encode.
//!
//! Spans come in traces of [`SPANS_PER_TRACE`]: a SERVER root (`seq % 4 == 0`) and three
//! INTERNAL children whose parent is the root. Ids are derived from `seq`, so they are unique
//! within a run and the same `seq` always gives the same span.

use bytes::{BufMut, BytesMut};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

/// Spans per trace: one root and three children.
pub const SPANS_PER_TRACE: u64 = 4;
/// The attribute that carries each span's sequence number.
pub const SEQ_KEY: &str = "blast.seq";
/// Span names by position in the trace.
const NAMES: [&str; 4] =
    ["POST /v1/chat/completions", "llm_request queue", "llm_request prefill", "llm_request decode"];
/// The model both `gen_ai.request.model` and `gen_ai.response.model` name.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// Span flags: sampled, and "is_remote is known (false)".
const SPAN_FLAGS: u32 = 0x101;

/// Keys of the per-span numeric attributes, in the order they are written.
const DYN_INT_KEYS: [&str; 2] = ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"];
const DYN_DOUBLE_KEYS: [&str; 3] =
    ["gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e", "gen_ai.latency.time_in_queue"];

/// The values that change from span to span, all derived from `seq`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpanValues {
    /// Prompt tokens, in 128..=16383 so that its varint is always 2 bytes.
    pub input_tokens: u64,
    /// Completion tokens, in 128..=16383.
    pub output_tokens: u64,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// End-to-end latency, seconds.
    pub e2e_s: f64,
    /// Time spent queued, seconds.
    pub queue_s: f64,
}

/// splitmix64: a cheap, well-mixed hash of the sequence number.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl SpanValues {
    /// The values of span `seq`.
    pub fn of(seq: u64) -> SpanValues {
        let h = mix(seq);
        let input_tokens = 128 + h % 8000;
        let output_tokens = 128 + (h >> 16) % 2000;
        let ttft_s = 0.020 + ((h >> 32) % 480) as f64 / 1000.0;
        let queue_s = ((h >> 44) % 50) as f64 / 1000.0;
        let e2e_s = queue_s + ttft_s + output_tokens as f64 * 0.012;
        SpanValues { input_tokens, output_tokens, ttft_s, e2e_s, queue_s }
    }
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

fn s(key: &str, v: &str) -> KeyValue {
    kv(key, Value::StringValue(v.to_string()))
}

fn i(key: &str, v: i64) -> KeyValue {
    kv(key, Value::IntValue(v))
}

fn d(key: &str, v: f64) -> KeyValue {
    kv(key, Value::DoubleValue(v))
}

/// The resource of stream `stream`: 15 attributes; the instance and pod names differ per stream.
pub fn resource(stream: usize) -> Resource {
    let pod = format!("vllm-llama-8b-7f9c4-{stream}");
    Resource {
        attributes: vec![
            s("service.name", "vllm"),
            s("service.version", "0.6.3"),
            s("service.instance.id", &format!("{pod}-0")),
            s("host.name", "gpu-node-017"),
            s("host.arch", "amd64"),
            s("os.type", "linux"),
            i("process.pid", 4242 + stream as i64),
            s("process.runtime.name", "cpython"),
            s("process.runtime.version", "3.11.9"),
            s("telemetry.sdk.name", "opentelemetry"),
            s("telemetry.sdk.language", "python"),
            s("telemetry.sdk.version", "1.27.0"),
            s("k8s.namespace.name", "inference"),
            s("k8s.pod.name", &pod),
            s("k8s.node.name", "gpu-node-017"),
        ],
        ..Default::default()
    }
}

/// The instrumentation scope.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope { name: "vllm.tracing".into(), version: "0.6.3".into(), ..Default::default() }
}

/// The ten attributes every span has with the same value.
fn static_attributes() -> Vec<KeyValue> {
    vec![
        s("gen_ai.system", "vllm"),
        s("gen_ai.operation.name", "chat"),
        s("gen_ai.request.model", MODEL),
        s("gen_ai.response.model", MODEL),
        i("gen_ai.request.max_tokens", 2048),
        d("gen_ai.request.temperature", 0.7),
        d("gen_ai.request.top_p", 0.95),
        s("server.address", "10.0.3.17"),
        i("server.port", 8000),
        i("http.response.status_code", 200),
    ]
}

/// The six attributes that change per span, in the order the template writes them.
#[cfg(test)]
fn dynamic_attributes(v: &SpanValues, seq: u64) -> Vec<KeyValue> {
    vec![
        i(DYN_INT_KEYS[0], v.input_tokens as i64),
        i(DYN_INT_KEYS[1], v.output_tokens as i64),
        d(DYN_DOUBLE_KEYS[0], v.ttft_s),
        d(DYN_DOUBLE_KEYS[1], v.e2e_s),
        d(DYN_DOUBLE_KEYS[2], v.queue_s),
        i(SEQ_KEY, seq as i64),
    ]
}

fn event_static() -> span::Event {
    span::Event {
        name: "gen_ai.first_token".into(),
        attributes: vec![i("gen_ai.token.index", 0)],
        ..Default::default()
    }
}

fn span_kind(pos: usize) -> span::SpanKind {
    if pos == 0 { span::SpanKind::Server } else { span::SpanKind::Internal }
}

fn span_status() -> Status {
    Status { code: status::StatusCode::Ok as i32, ..Default::default() }
}

/// Times of span `seq` for a request built at `now_ns`: (start, end, event).
fn times(v: &SpanValues, now_ns: u64) -> (u64, u64, u64) {
    let end = now_ns;
    let start = end.saturating_sub((v.e2e_s * 1e9) as u64);
    let event = start + ((v.queue_s + v.ttft_s) * 1e9) as u64;
    (start, end, event)
}

/// Encodes `kv` as one `attributes` (field 9) entry and returns the bytes before the last
/// `value_len` bytes, which hold the value.
fn attr_prefix(kv: &KeyValue, value_len: usize) -> Vec<u8> {
    let mut b = Vec::new();
    prost::encoding::message::encode(9, kv, &mut b);
    b.truncate(b.len() - value_len);
    b
}

/// Pre-encoded parts of the request.
pub struct Template {
    /// High 8 bytes of every trace id: distinguishes runs.
    run_id: u64,
    /// XORed into `seq + 1` to form span ids; its top bit is set, so no span id is zero.
    span_salt: u64,
    /// Encoded `Resource` of each stream.
    resources: Vec<Vec<u8>>,
    /// Encoded `InstrumentationScope`.
    scope: Vec<u8>,
    /// Fields 5 (name) and 6 (kind) of a span, by position in the trace.
    name_kind: [Vec<u8>; 4],
    /// The static attributes as field-9 entries.
    static_attrs: Vec<u8>,
    /// Per dynamic int attribute: its entry up to the 2-byte varint value.
    int_prefix: [Vec<u8>; 2],
    /// Per dynamic double attribute: its entry up to the 8-byte value.
    double_prefix: [Vec<u8>; 3],
    /// The event's fields after its time (name and attributes).
    event_rest: Vec<u8>,
    /// Fields 15 (status) and 16 (flags).
    tail: Vec<u8>,
}

impl Template {
    /// A template for `streams` streams; `run_id` and `span_salt` make this run's ids unique.
    pub fn new(streams: usize, run_id: u64, span_salt: u64) -> Template {
        let resources = (0..streams.max(1)).map(|s| resource(s).encode_to_vec()).collect();
        let name_kind = std::array::from_fn(|pos| {
            Span { name: NAMES[pos].into(), kind: span_kind(pos) as i32, ..Default::default() }.encode_to_vec()
        });
        let static_attrs = Span { attributes: static_attributes(), ..Default::default() }.encode_to_vec();
        let int_prefix = std::array::from_fn(|k| attr_prefix(&i(DYN_INT_KEYS[k], 200), 2));
        let double_prefix = std::array::from_fn(|k| attr_prefix(&d(DYN_DOUBLE_KEYS[k], 1.0), 8));
        let event_rest = event_static().encode_to_vec();
        let tail = Span { status: Some(span_status()), flags: SPAN_FLAGS, ..Default::default() }.encode_to_vec();
        Template {
            run_id,
            span_salt: span_salt | (1 << 63),
            resources,
            scope: scope().encode_to_vec(),
            name_kind,
            static_attrs,
            int_prefix,
            double_prefix,
            event_rest,
            tail,
        }
    }

    /// Trace id of span `seq`.
    pub fn trace_id(&self, seq: u64) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.run_id.to_be_bytes());
        id[8..].copy_from_slice(&(seq / SPANS_PER_TRACE).to_be_bytes());
        id
    }

    /// Span id of span `seq` (never zero while `seq < 2^63`).
    pub fn span_id(&self, seq: u64) -> [u8; 8] {
        (self.span_salt ^ seq.wrapping_add(1)).to_be_bytes()
    }

    fn seq_entry_len(seq: u64) -> usize {
        // tag, len, [0x0A, klen, key], [0x12, avlen, [0x18, varint]]
        let any = 1 + encoded_len_varint(seq);
        let kv = 2 + SEQ_KEY.len() + 2 + any;
        2 + kv
    }

    fn event_len(&self) -> usize {
        9 + self.event_rest.len()
    }

    /// Length of span `seq`'s message body.
    fn span_len(&self, seq: u64) -> usize {
        let pos = (seq % SPANS_PER_TRACE) as usize;
        let ids = 18 + 10 + if pos == 0 { 0 } else { 10 };
        let dyn_attrs: usize = self.int_prefix.iter().map(|p| p.len() + 2).sum::<usize>()
            + self.double_prefix.iter().map(|p| p.len() + 8).sum::<usize>()
            + Self::seq_entry_len(seq);
        let ev = self.event_len();
        ids + self.name_kind[pos].len()
            + 18
            + self.static_attrs.len()
            + dyn_attrs
            + 1
            + encoded_len_varint(ev as u64)
            + ev
            + self.tail.len()
    }

    /// Bytes of one `ExportTraceServiceRequest` with `n` spans `first_seq..first_seq + n`.
    pub fn encoded_len(&self, stream: usize, first_seq: u64, n: usize) -> usize {
        let (_, _, rs) = self.lengths(stream, first_seq, n);
        1 + encoded_len_varint(rs as u64) + rs
    }

    /// (spans field bytes, scope_spans body, resource_spans body).
    fn lengths(&self, stream: usize, first_seq: u64, n: usize) -> (usize, usize, usize) {
        let mut spans = 0usize;
        for seq in first_seq..first_seq + n as u64 {
            let l = self.span_len(seq);
            spans += 1 + encoded_len_varint(l as u64) + l;
        }
        let ss = 1 + encoded_len_varint(self.scope.len() as u64) + self.scope.len() + spans;
        let res = &self.resources[stream % self.resources.len()];
        let rs = 1 + encoded_len_varint(res.len() as u64) + res.len() + 1 + encoded_len_varint(ss as u64) + ss;
        (spans, ss, rs)
    }

    /// Appends one `ExportTraceServiceRequest` (one resource, one scope, spans
    /// `first_seq..first_seq + n`, timed to end at `now_ns`) to `out`.
    pub fn encode(&self, stream: usize, first_seq: u64, n: usize, now_ns: u64, out: &mut BytesMut) {
        let (_, ss, rs) = self.lengths(stream, first_seq, n);
        let res = &self.resources[stream % self.resources.len()];
        out.reserve(1 + encoded_len_varint(rs as u64) + rs);
        // request.resource_spans (1)
        out.put_u8(0x0A);
        encode_varint(rs as u64, out);
        // resource_spans.resource (1)
        out.put_u8(0x0A);
        encode_varint(res.len() as u64, out);
        out.put_slice(res);
        // resource_spans.scope_spans (2)
        out.put_u8(0x12);
        encode_varint(ss as u64, out);
        // scope_spans.scope (1)
        out.put_u8(0x0A);
        encode_varint(self.scope.len() as u64, out);
        out.put_slice(&self.scope);
        for seq in first_seq..first_seq + n as u64 {
            // scope_spans.spans (2)
            out.put_u8(0x12);
            encode_varint(self.span_len(seq) as u64, out);
            self.encode_span(seq, now_ns, out);
        }
    }

    fn encode_span(&self, seq: u64, now_ns: u64, out: &mut BytesMut) {
        let pos = seq % SPANS_PER_TRACE;
        let v = SpanValues::of(seq);
        let (start, end, event) = times(&v, now_ns);
        out.put_slice(&[0x0A, 16]);
        out.put_slice(&self.trace_id(seq));
        out.put_slice(&[0x12, 8]);
        out.put_slice(&self.span_id(seq));
        if pos != 0 {
            out.put_slice(&[0x22, 8]);
            out.put_slice(&self.span_id(seq - pos));
        }
        out.put_slice(&self.name_kind[pos as usize]);
        out.put_u8(0x39);
        out.put_u64_le(start);
        out.put_u8(0x41);
        out.put_u64_le(end);
        out.put_slice(&self.static_attrs);
        for (p, val) in self.int_prefix.iter().zip([v.input_tokens, v.output_tokens]) {
            out.put_slice(p);
            // Values are in 128..=16383: exactly two varint bytes.
            out.put_u8((val as u8 & 0x7F) | 0x80);
            out.put_u8((val >> 7) as u8);
        }
        for (p, val) in self.double_prefix.iter().zip([v.ttft_s, v.e2e_s, v.queue_s]) {
            out.put_slice(p);
            out.put_f64_le(val);
        }
        let any = 1 + encoded_len_varint(seq);
        out.put_slice(&[0x4A, (2 + SEQ_KEY.len() + 2 + any) as u8, 0x0A, SEQ_KEY.len() as u8]);
        out.put_slice(SEQ_KEY.as_bytes());
        out.put_slice(&[0x12, any as u8, 0x18]);
        encode_varint(seq, out);
        // events (11)
        out.put_u8(0x5A);
        encode_varint(self.event_len() as u64, out);
        out.put_u8(0x09);
        out.put_u64_le(event);
        out.put_slice(&self.event_rest);
        out.put_slice(&self.tail);
    }

    /// The span `seq` as a prost message, as [`Template::encode`] writes it (for tests).
    #[cfg(test)]
    pub fn span_message(&self, seq: u64, now_ns: u64) -> Span {
        let pos = (seq % SPANS_PER_TRACE) as usize;
        let v = SpanValues::of(seq);
        let (start, end, event) = times(&v, now_ns);
        let mut attributes = static_attributes();
        attributes.extend(dynamic_attributes(&v, seq));
        let mut ev = event_static();
        ev.time_unix_nano = event;
        Span {
            trace_id: self.trace_id(seq).to_vec(),
            span_id: self.span_id(seq).to_vec(),
            parent_span_id: if pos == 0 { vec![] } else { self.span_id(seq - pos as u64).to_vec() },
            flags: SPAN_FLAGS,
            name: NAMES[pos].into(),
            kind: span_kind(pos) as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes,
            events: vec![ev],
            status: Some(span_status()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn reference(t: &Template, stream: usize, first: u64, n: usize, now: u64) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource(stream % 4)),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope()),
                    spans: (first..first + n as u64).map(|q| t.span_message(q, now)).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn template_matches_prost_byte_for_byte() {
        let t = Template::new(4, 0x1122_3344_5566_7788, 0x0BAD_CAFE);
        let now = 1_750_000_000_123_456_789;
        // Seq widths 1..5 bytes and batches that straddle trace boundaries.
        for (stream, first, n) in
            [(0, 0, 512), (1, 125, 7), (2, 16_380, 9), (3, 2_097_150, 5), (5, 1 << 30, 3), (0, 7, 1)]
        {
            let mut out = BytesMut::new();
            t.encode(stream, first, n, now, &mut out);
            let want = reference(&t, stream, first, n, now).encode_to_vec();
            assert_eq!(out.len(), want.len(), "len at {first}+{n}");
            let diff = out.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(diff, None, "first differing byte, at {first}+{n}");
            assert_eq!(t.encoded_len(stream, first, n), want.len());
        }
    }

    #[test]
    fn spans_have_sixteen_attributes_and_unique_ids() {
        let t = Template::new(1, 1, 2);
        let sp = t.span_message(5, 1_000_000_000_000);
        assert_eq!(sp.attributes.len(), 16);
        assert_eq!(resource(0).attributes.len(), 15);
        assert_eq!(sp.parent_span_id, t.span_id(4).to_vec());
        assert!(t.span_message(4, 0).parent_span_id.is_empty());
        let ids: std::collections::HashSet<_> = (0..10_000).map(|q| t.span_id(q)).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&[0u8; 8]));
        for q in 0..10_000 {
            let v = SpanValues::of(q);
            assert!((128..16384).contains(&v.input_tokens) && (128..16384).contains(&v.output_tokens));
        }
    }

    #[test]
    fn request_size_is_about_750_bytes_per_span() {
        let t = Template::new(4, 1, 2);
        let per_span = t.encoded_len(0, 1_000_000, 512) as f64 / 512.0;
        assert!((650.0..900.0).contains(&per_span), "{per_span}");
    }
}
