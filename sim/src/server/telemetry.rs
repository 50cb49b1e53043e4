//! OTLP out of the real-time server: `llm_request` SERVER spans as vLLM V1 emits them
//! (tests/fixtures/servers/vllm-*.spans.json), W3C `traceparent` propagation, and the per-layer
//! KV usage gauge `llm.decoder.kvcache.usage_ratio{layer}`. Delivery reuses the project's
//! exporters (`otlp` over gRPC, `otlphttp` with protobuf) behind their queue and retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferwatch_core::ComponentId;
use inferwatch_core::component::{CreateContext, ExporterFactory, NodeRef};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::{OtlpExporterFactory, OtlpHttpExporterFactory};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ServerError;
use super::tgi::trace::Handler;
use crate::engine::RequestRecord;

/// Instrumentation scope of vLLM's tracer.
pub const TRACE_SCOPE: &str = "vllm.llm_engine";
/// Name of the per-layer KV usage gauge.
pub const KV_LAYER_METRIC: &str = "llm.decoder.kvcache.usage_ratio";
/// Spans per export request at most (the OTel SDK's BatchSpanProcessor default).
pub const MAX_EXPORT_BATCH: usize = 512;

/// A string attribute.
pub fn kv_str(key: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }),
        ..Default::default()
    }
}

/// An integer attribute.
pub fn kv_int(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }),
        ..Default::default()
    }
}

/// A double attribute.
pub fn kv_f64(key: &str, v: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }),
        ..Default::default()
    }
}

/// A W3C trace context taken from `traceparent` / `tracestate` request headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// Trace id (16 bytes, not all zero).
    pub trace_id: [u8; 16],
    /// The caller's span id (8 bytes, not all zero), the parent of `llm_request`.
    pub span_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
    /// The `tracestate` header, passed through.
    pub trace_state: String,
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl TraceParent {
    /// Parses a `traceparent` header (W3C Trace Context level 1: `00-<trace>-<span>-<flags>`;
    /// later versions are read by their first four fields). Invalid values give `None`.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let t = traceparent.trim();
        let version = hex_bytes::<1>(t.get(0..2)?)?[0];
        if version == 0xff || (version == 0 && t.len() != 55) || t.len() < 55 {
            return None;
        }
        if t.as_bytes().get(55).is_some_and(|b| *b != b'-') {
            return None;
        }
        let parts: Vec<&str> = t.get(..55)?.split('-').collect();
        let [_, trace, span, flags] = parts.as_slice() else { return None };
        let trace_id = hex_bytes::<16>(trace)?;
        let span_id = hex_bytes::<8>(span)?;
        let flags = hex_bytes::<1>(flags)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags, trace_state: tracestate.unwrap_or_default().trim().to_string() })
    }
}

/// What the frontend knows about a request that the span needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanMeta {
    /// `gen_ai.request.id` (the external request id).
    pub request_id: String,
    /// Effective `max_tokens`.
    pub max_tokens: u32,
    /// `temperature` (omitted from the span when 0, as vLLM does).
    pub temperature: f64,
    /// `top_p` (omitted when 0).
    pub top_p: f64,
    /// `n`.
    pub n: u32,
    /// The incoming trace context, if any.
    pub parent: Option<TraceParent>,
    /// The HTTP request it belongs to (TGI-flavoured spans cover the whole request).
    pub handler: Handler,
}

/// The identity of a new span: its ids, its parent and the trace flags and state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanIds {
    /// Trace id (the parent's, or a new one).
    pub trace_id: Vec<u8>,
    /// A new span id.
    pub span_id: Vec<u8>,
    /// The parent span id (empty for a root span).
    pub parent_span_id: Vec<u8>,
    /// Span flags (W3C flags, and whether the parent is remote).
    pub flags: u32,
    /// The parent's `tracestate`.
    pub trace_state: String,
}

/// New ids for a server span continuing `parent` (a root span when `None`).
pub fn span_context(parent: Option<&TraceParent>) -> SpanIds {
    let (trace_id, parent_span_id, flags, trace_state) = match parent {
        Some(p) => (p.trace_id.to_vec(), p.span_id.to_vec(), u32::from(p.flags) | 0x300, p.trace_state.clone()),
        None => {
            let mut id = rand::random::<u128>().to_be_bytes();
            if id == [0; 16] {
                id[15] = 1;
            }
            (id.to_vec(), Vec::new(), 0x101, String::new())
        }
    };
    let span_id = rand::random::<u64>().max(1).to_be_bytes().to_vec();
    SpanIds { trace_id, span_id, parent_span_id, flags, trace_state }
}

/// Builds the `llm_request` span of a finished request; `start_unix_ns` maps engine time
/// to wall-clock time.
pub fn request_span(meta: &SpanMeta, r: &RequestRecord, start_unix_ns: u64) -> Span {
    let SpanIds { trace_id, span_id, parent_span_id, flags, trace_state } = span_context(meta.parent.as_ref());
    let mut attributes = vec![kv_str("gen_ai.request.id", meta.request_id.clone())];
    if meta.top_p != 0.0 {
        attributes.push(kv_f64("gen_ai.request.top_p", meta.top_p));
    }
    attributes.push(kv_int("gen_ai.request.max_tokens", i64::from(meta.max_tokens)));
    if meta.temperature != 0.0 {
        attributes.push(kv_f64("gen_ai.request.temperature", meta.temperature));
    }
    if meta.n != 0 {
        attributes.push(kv_int("gen_ai.request.n", i64::from(meta.n)));
    }
    attributes.extend([
        kv_int("gen_ai.usage.prompt_tokens", i64::from(r.prompt_tokens)),
        kv_int("gen_ai.usage.completion_tokens", i64::from(r.completion_tokens)),
        kv_f64("gen_ai.latency.time_in_queue", r.queue_s()),
        kv_f64("gen_ai.latency.time_to_first_token", r.ttft_s()),
        kv_f64("gen_ai.latency.e2e", r.e2e_s()),
        kv_f64("gen_ai.latency.time_in_model_prefill", r.prefill_s()),
        kv_f64("gen_ai.latency.time_in_model_decode", r.decode_s()),
        kv_f64("gen_ai.latency.time_in_model_inference", r.inference_s()),
    ]);
    // vLLM (every version) sets no `gen_ai.response.finish_reasons` and no span status on
    // `llm_request` (vllm/tracing, output_processor.py): how a request ended is only in
    // `vllm:request_success_total{finished_reason}`.
    Span {
        trace_id,
        span_id,
        trace_state,
        parent_span_id,
        flags,
        name: "llm_request".into(),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start_unix_ns.saturating_add(r.arrival),
        end_time_unix_nano: start_unix_ns.saturating_add(r.finished),
        attributes,
        ..Default::default()
    }
}

/// The resource of this server's telemetry: `service.name` from `OTEL_SERVICE_NAME` (else
/// `vllm-server`, the name vLLM's docs use), `service.version` from `--version`, the
/// attributes of `OTEL_RESOURCE_ATTRIBUTES`, and the SDK attributes the Python SDK sets.
pub fn resource(version: &str) -> Resource {
    resource_named(version, "vllm-server")
}

/// [`resource`] with another default `service.name` (TGI's router: `text-generation-inference.router`).
pub fn resource_named(version: &str, default_service_name: &str) -> Resource {
    let mut attrs: Vec<KeyValue> = Vec::new();
    if let Ok(extra) = std::env::var("OTEL_RESOURCE_ATTRIBUTES") {
        for pair in extra.split(',') {
            if let Some((k, v)) = pair.split_once('=') {
                let k = k.trim();
                if !k.is_empty() {
                    attrs.push(kv_str(k, v.trim()));
                }
            }
        }
    }
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default_service_name.to_string());
    attrs.retain(|kv| kv.key != "service.name" && kv.key != "service.version");
    attrs.extend([
        kv_str("service.name", name),
        kv_str("service.version", version),
        kv_str("telemetry.sdk.language", "rust"),
        kv_str("telemetry.sdk.name", "inferwatch-sim"),
        kv_str("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
    ]);
    Resource { attributes: attrs, ..Default::default() }
}

/// Where an `--otlp-*-endpoint` URL sends data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OtlpTarget {
    /// OTLP/gRPC to `http(s)://host:port`.
    Grpc(String),
    /// OTLP/HTTP protobuf POSTed to this full URL.
    Http(String),
}

/// Reads an endpoint as vLLM does: `grpc://H:P`, `http(s)://H:P` and bare `H:P` mean OTLP/gRPC
/// (plain text unless `https`); a URL with a path (`http://H:4318/v1/traces`) means
/// http/protobuf to exactly that URL. `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL` (or
/// `OTEL_EXPORTER_OTLP_PROTOCOL`) `= http/protobuf` turns a path-less URL into `URL/v1/<signal>`.
pub fn parse_endpoint(url: &str, signal: Signal) -> Result<OtlpTarget, String> {
    let u = url.trim();
    let (scheme, rest) = match u.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => (String::new(), u),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("invalid OTLP endpoint {url:?}: missing host"));
    }
    let env_key = format!("OTEL_EXPORTER_OTLP_{}_PROTOCOL", signal.as_str().to_ascii_uppercase());
    let protocol = std::env::var(env_key).or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")).unwrap_or_default();
    let http_wanted = protocol.trim() == "http/protobuf";
    match scheme.as_str() {
        "grpc" | "" => {
            if !path.is_empty() {
                return Err(format!("invalid OTLP endpoint {url:?}: a gRPC endpoint has no path"));
            }
            if !authority.contains(':') {
                return Err(format!("invalid OTLP endpoint {url:?}: expected host:port"));
            }
            Ok(OtlpTarget::Grpc(format!("http://{authority}")))
        }
        "grpcs" => Ok(OtlpTarget::Grpc(format!("https://{authority}"))),
        "http" | "https" if !path.is_empty() => Ok(OtlpTarget::Http(format!("{scheme}://{authority}{path}"))),
        "http" | "https" if http_wanted => {
            Ok(OtlpTarget::Http(format!("{scheme}://{authority}/v1/{}", signal.as_str())))
        }
        "http" | "https" => Ok(OtlpTarget::Grpc(format!("{scheme}://{authority}"))),
        other => Err(format!("invalid OTLP endpoint {url:?}: unknown scheme {other:?} (use grpc, http or https)")),
    }
}

/// Builds and starts an exporter node (the project's `otlp` or `otlphttp`) for one signal.
pub async fn exporter(target: &OtlpTarget, signal: Signal) -> Result<NodeRef, ServerError> {
    let retry = json!({"enabled": true, "initial_interval": "500ms", "max_interval": "5s", "max_elapsed_time": "60s"});
    let queue = json!({"enabled": true, "num_consumers": 2, "queue_size": 256});
    let (factory, cfg, id): (&dyn ExporterFactory, _, _) = match target {
        OtlpTarget::Grpc(ep) => (
            &OtlpExporterFactory,
            json!({"endpoint": ep, "compression": "none", "timeout": "10s",
                   "retry_on_failure": retry, "sending_queue": queue}),
            "otlp/sim",
        ),
        OtlpTarget::Http(url) => {
            let key = format!("{}_endpoint", signal.as_str());
            let mut cfg = json!({"compression": "none", "encoding": "proto", "timeout": "10s",
                                 "retry_on_failure": retry, "sending_queue": queue});
            cfg[key] = json!(url);
            (&OtlpHttpExporterFactory, cfg, "otlphttp/sim")
        }
    };
    let id = ComponentId::parse(id).map_err(|e| ServerError::Exporter(e.to_string()))?;
    let ctx = CreateContext::new(id, Arc::new(Telemetry::new()));
    let node = factory.create(ctx, &cfg, signal).map_err(|e| ServerError::Exporter(e.to_string()))?;
    node.start().await.map_err(|e| ServerError::Exporter(e.to_string()))?;
    Ok(node)
}

async fn push(node: &NodeRef, payload: Payload, what: &str) {
    if let Err(e) = node.consume(payload).await {
        tracing::warn!(error = %e, "dropping {what}: the exporter refused them");
    }
}

/// The instrumentation scope of vLLM's spans.
pub fn vllm_scope() -> InstrumentationScope {
    InstrumentationScope { name: TRACE_SCOPE.into(), ..Default::default() }
}

/// Batches spans (up to [`MAX_EXPORT_BATCH`], or every `delay`) into export requests of
/// `scope` until the channel closes, then flushes and shuts the exporter down.
pub async fn span_export_loop(
    mut rx: mpsc::Receiver<Span>,
    node: NodeRef,
    resource: Resource,
    scope: InstrumentationScope,
    delay: Duration,
) {
    let mut buf: Vec<Span> = Vec::new();
    let mut tick = tokio::time::interval(delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let flush = |buf: &mut Vec<Span>| {
        let spans = std::mem::take(buf);
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans { scope: Some(scope.clone()), spans, schema_url: String::new() }],
                schema_url: String::new(),
            }],
        })
    };
    loop {
        tokio::select! {
            s = rx.recv() => match s {
                Some(s) => {
                    buf.push(s);
                    if buf.len() >= MAX_EXPORT_BATCH {
                        push(&node, flush(&mut buf), "spans").await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if !buf.is_empty() {
                    push(&node, flush(&mut buf), "spans").await;
                }
            }
        }
    }
    if !buf.is_empty() {
        push(&node, flush(&mut buf), "spans").await;
    }
    let dropped = node.shutdown(Instant::now() + Duration::from_secs(5)).await;
    if dropped > 0 {
        tracing::warn!(spans = dropped, "spans not delivered at shutdown");
    }
}

/// Samples the KV usage every `every` and sends `llm.decoder.kvcache.usage_ratio{layer}` for
/// `layers` layers, one export request per `per_export` samples, until `stop` fires.
pub async fn kv_layer_loop(
    usage: impl Fn() -> f64 + Send,
    layers: u32,
    every: Duration,
    per_export: usize,
    node: NodeRef,
    resource: Resource,
    stop: CancellationToken,
) {
    let mut points: Vec<NumberDataPoint> = Vec::new();
    let mut samples = 0usize;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let build = |points: Vec<NumberDataPoint>| {
        Payload::Metrics(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope { name: TRACE_SCOPE.into(), ..Default::default() }),
                    metrics: vec![Metric {
                        name: KV_LAYER_METRIC.into(),
                        description: "KV-cache block usage of each decoder layer, fraction 0-1.".into(),
                        unit: "1".into(),
                        data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                        ..Default::default()
                    }],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        })
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let v = usage();
                let t = unix_nanos_now();
                points.extend((0..layers).map(|l| NumberDataPoint {
                    attributes: vec![kv_int("layer", i64::from(l))],
                    time_unix_nano: t,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..Default::default()
                }));
                samples += 1;
                if samples >= per_export.max(1) {
                    samples = 0;
                    push(&node, build(std::mem::take(&mut points)), "KV usage samples").await;
                }
            }
            _ = stop.cancelled() => break,
        }
    }
    if !points.is_empty() {
        push(&node, build(points), "KV usage samples").await;
    }
    node.shutdown(Instant::now() + Duration::from_secs(5)).await;
}

/// Nanoseconds since the Unix epoch now.
pub fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_traceparent() {
        let p = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some("k=v")).unwrap();
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert_eq!(p.flags, 1);
        assert_eq!(p.trace_state, "k=v");
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad, None).is_none(), "{bad}");
        }
        assert!(TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None).is_some());
    }

    #[test]
    fn llm_request_has_no_finish_reason_and_no_status() {
        use crate::engine::FinishReason;
        let meta = SpanMeta {
            request_id: "cmpl-1".into(),
            max_tokens: 8,
            temperature: 0.0,
            top_p: 1.0,
            n: 1,
            parent: None,
            handler: Handler::default(),
        };
        for fr in FinishReason::ALL {
            let r = RequestRecord {
                id: 1,
                arrival: 0,
                scheduled: Some(10),
                first_token: Some(20),
                last_token: Some(30),
                finished: 30,
                prompt_tokens: 4,
                completion_tokens: 2,
                max_tokens: 8,
                cached_tokens: 0,
                preemptions: 0,
                finish_reason: fr,
            };
            let s = request_span(&meta, &r, 0);
            assert_eq!(s.name, "llm_request");
            assert!(s.status.is_none(), "{fr:?}: vLLM sets no status");
            assert!(s.attributes.iter().all(|kv| kv.key != "gen_ai.response.finish_reasons"), "{fr:?}");
            assert!(s.attributes.iter().any(|kv| kv.key == "gen_ai.latency.e2e"));
        }
    }

    #[test]
    fn endpoints_choose_the_protocol() {
        let g = |s| parse_endpoint(s, Signal::Traces);
        assert_eq!(g("grpc://localhost:4317"), Ok(OtlpTarget::Grpc("http://localhost:4317".into())));
        assert_eq!(g("localhost:4317"), Ok(OtlpTarget::Grpc("http://localhost:4317".into())));
        assert_eq!(g("http://h:4317"), Ok(OtlpTarget::Grpc("http://h:4317".into())));
        assert_eq!(g("https://h:4317/"), Ok(OtlpTarget::Grpc("https://h:4317".into())));
        assert_eq!(g("http://h:4318/v1/traces"), Ok(OtlpTarget::Http("http://h:4318/v1/traces".into())));
        assert!(g("ftp://h:1").is_err());
        assert!(g("grpc://h:1/x").is_err());
        assert!(g("localhost").is_err());
    }
}
