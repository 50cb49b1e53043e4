//! OTLP emission of the bench's measurements: one CLIENT span per request (`chat {model}`,
//! `gen_ai.*` attributes), the `gen_ai.client.*` histograms and the quality histograms
//! `inferwatch.bench.tle_bits` / `inferwatch.bench.rci`, sent with the exporters crate's OTLP
//! senders (gRPC or HTTP/protobuf). The resource holds `service.name` (`--otlp-service-name`)
//! and the attributes of `OTEL_RESOURCE_ATTRIBUTES` (e.g. `service.version=B`: the version
//! under test, which `llm_signals` and `delta_ab` key on).

use crate::client::{Api, Outcome};
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::pdata::Payload;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, ResourceMetrics, ScopeMetrics, metric,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The OTLP transport for `--otlp-endpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (port 4317).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, `/v1/traces`, `/v1/metrics`).
    #[value(name = "http/protobuf", alias = "http")]
    HttpProtobuf,
}

/// Bucket boundaries the GenAI semantic conventions recommend for durations, seconds.
pub const DURATION_BOUNDS: &[f64] =
    &[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
/// Bucket boundaries the GenAI semantic conventions recommend for token counts.
pub const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

/// Bucket boundaries of `inferwatch.bench.tle_bits`, bits: 0.25-bit steps to 7 bits (log2 of
/// the largest K the bench asks for, 100, is 6.64), then the study's full-vocabulary 8.5 bits.
pub const TLE_BOUNDS: &[f64] = &[
    0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 4.75, 5.0, 5.25,
    5.5, 5.75, 6.0, 6.25, 6.5, 6.75, 7.0, 8.5,
];
/// Bucket boundaries of `inferwatch.bench.rci` (in [0, 1]): steps of 0.05.
pub const RCI_BOUNDS: &[f64] =
    &[0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95];
/// Metric (and span attribute) of the first token's TLE, bits.
pub const TLE_METRIC: &str = "inferwatch.bench.tle_bits";
/// Metric (and span attribute) of an answer's RCI against its reference.
pub const RCI_METRIC: &str = "inferwatch.bench.rci";
/// Span attribute: how many top log-probabilities the server returned for the first token (K).
pub const TOP_K_ATTRIBUTE: &str = "inferwatch.bench.top_k";

/// A 16-byte trace id and an 8-byte span id, random.
pub fn new_ids() -> ([u8; 16], [u8; 8]) {
    let mut rng = rand::rng();
    let mut t = [0u8; 16];
    let mut s = [0u8; 8];
    rng.fill(&mut t);
    rng.fill(&mut s);
    (t, s)
}

/// A new random span id.
pub fn new_span_id() -> [u8; 8] {
    let mut s = [0u8; 8];
    rand::rng().fill(&mut s);
    s
}

/// The W3C `traceparent` header for a span.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8]) -> String {
    let mut s = String::with_capacity(55);
    s.push_str("00-");
    for b in trace_id {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('-');
    for b in span_id {
        s.push_str(&format!("{b:02x}"));
    }
    s.push_str("-01");
    s
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn kv_str(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

fn kv_int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}

fn kv_f64(key: &str, v: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(v))
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// What the spans and metrics of a run share.
#[derive(Debug, Clone)]
pub struct Common {
    /// chat or completions.
    pub api: Api,
    /// `gen_ai.request.model`.
    pub model: String,
    /// `gen_ai.provider.name`.
    pub provider: String,
    /// `server.address`.
    pub server_address: String,
    /// `server.port`.
    pub server_port: u16,
    /// `gen_ai.request.stream`.
    pub stream: bool,
    /// `gen_ai.request.temperature`.
    pub temperature: Option<f64>,
    /// `service.name` of the resource.
    pub service_name: String,
}

/// Per-request details for a span beyond the outcome.
#[derive(Debug, Clone, Default)]
pub struct SpanContext {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span, if any.
    pub parent: Option<[u8; 8]>,
    /// `gen_ai.conversation.id` (dialogue flows).
    pub conversation: Option<String>,
    /// Dialogue state of the turn.
    pub state: Option<String>,
    /// Attempt number (1 for the first).
    pub attempt: u32,
    /// `gen_ai.request.max_tokens`.
    pub max_tokens: u32,
    /// TLE of the first token, bits.
    pub tle: Option<f64>,
    /// Set for the paired perturbation run: `baseline` or the profile name.
    pub perturbation: Option<String>,
    /// Index of the prompt in the dataset (plug-in hooks, perturbation pairs).
    pub index: Option<u64>,
    /// Attributes added by plug-in hooks (`inferwatch.bench.hook.*`).
    pub hook_attributes: Vec<KeyValue>,
}

#[derive(Debug, Clone)]
struct Agg {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Agg {
    fn new(bounds: &'static [f64]) -> Agg {
        Agg {
            bounds,
            counts: vec![0; bounds.len() + 1],
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn record(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

type SeriesKey = (&'static str, Vec<(String, String)>);

/// Cumulative explicit-bucket histograms keyed by metric name and attributes.
#[derive(Debug, Default)]
struct Aggregates {
    series: BTreeMap<SeriesKey, Agg>,
    /// Plug-in hooks' metrics: (`inferwatch.bench.hook.<name>`, attributes).
    hooks: BTreeMap<(String, Vec<(String, String)>), Agg>,
}

const METRICS: &[(&str, &str, &str)] = &[
    ("gen_ai.client.operation.duration", "s", "GenAI operation duration, measured by the bench client"),
    ("gen_ai.client.token.usage", "{token}", "Tokens used per request (input and output)"),
    ("gen_ai.client.operation.time_to_first_chunk", "s", "Time to the first streamed chunk with output"),
    ("gen_ai.client.operation.time_per_output_chunk", "s", "Time between streamed chunks with output"),
    (TLE_METRIC, "bit", "Entropy of the renormalised top-K distribution of the first output token (TLE)"),
    (RCI_METRIC, "1", "Consistency index of an answer against its reference (0 = identical, no repetition)"),
];

/// What was exported, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct OtlpStats {
    /// Spans delivered.
    pub spans_sent: u64,
    /// Spans that could not be delivered or were dropped on a full queue.
    pub spans_failed: u64,
    /// Metric exports delivered.
    pub metric_exports: u64,
    /// Metric exports that failed.
    pub metric_exports_failed: u64,
}

#[derive(Default)]
struct Counters {
    spans_sent: AtomicU64,
    spans_failed: AtomicU64,
    metric_exports: AtomicU64,
    metric_exports_failed: AtomicU64,
}

enum Msg {
    Span(Box<Span>),
    Flush(tokio::sync::oneshot::Sender<()>),
    Shutdown,
}

/// Emits spans and metrics in the background; `shutdown` flushes everything.
pub struct OtlpSink {
    common: Arc<Common>,
    tx: mpsc::Sender<Msg>,
    aggregates: Arc<Mutex<Aggregates>>,
    counters: Arc<Counters>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Largest number of spans in one export.
const BATCH: usize = 512;
/// Spans queued before new ones are dropped.
const QUEUE: usize = 16384;

struct Senders {
    traces: Arc<dyn Sender>,
    metrics: Arc<dyn Sender>,
}

fn senders(endpoint: &str, protocol: OtlpProtocol) -> Result<Senders, String> {
    use inferwatch_core::pdata::Signal;
    use inferwatch_exporters::otlp::{GrpcSender, OtlpConfig};
    use inferwatch_exporters::otlphttp::OtlpHttpConfig;
    let ep = if endpoint.contains("://") { endpoint.to_string() } else { format!("http://{endpoint}") };
    let v = serde_json::json!({
        "endpoint": ep,
        "timeout": "10s",
        "sending_queue": { "enabled": false },
        "retry_on_failure": { "enabled": false },
    });
    let bad = |e: inferwatch_core::component::FieldError| format!("--otlp-endpoint {endpoint:?}: {e}");
    match protocol {
        OtlpProtocol::Grpc => {
            let c = OtlpConfig::from_value(&v).map_err(bad)?;
            let s: Arc<dyn Sender> = Arc::new(GrpcSender::new("bench".into(), &c).map_err(bad)?);
            Ok(Senders { traces: s.clone(), metrics: s })
        }
        OtlpProtocol::HttpProtobuf => {
            use inferwatch_exporters::otlphttp::HttpSender;
            let c = OtlpHttpConfig::from_value(&v).map_err(bad)?;
            Ok(Senders {
                traces: Arc::new(HttpSender::new("bench".into(), &c, Signal::Traces).map_err(bad)?),
                metrics: Arc::new(HttpSender::new("bench".into(), &c, Signal::Metrics).map_err(bad)?),
            })
        }
    }
}

/// Sends with up to three attempts on retryable errors.
async fn send(sender: &dyn Sender, p: &Payload) -> Result<(), SendError> {
    let mut delay = Duration::from_millis(200);
    let mut last = None;
    for _ in 0..3 {
        match sender.send(p).await {
            Ok(()) => return Ok(()),
            Err(SendError::Retryable { message, retry_after }) => {
                tokio::time::sleep(retry_after.unwrap_or(delay).min(Duration::from_secs(2))).await;
                delay *= 2;
                last = Some(SendError::Retryable { message, retry_after });
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(SendError::Permanent("no attempt".into())))
}

impl OtlpSink {
    /// Starts the background exporter. Metrics go out every `interval` and at shutdown.
    pub fn start(
        endpoint: &str,
        protocol: OtlpProtocol,
        common: Common,
        interval: Duration,
        start: SystemTime,
    ) -> Result<OtlpSink, String> {
        let snd = senders(endpoint, protocol)?;
        let common = Arc::new(common);
        let (tx, mut rx) = mpsc::channel::<Msg>(QUEUE);
        let aggregates = Arc::new(Mutex::new(Aggregates::default()));
        let counters = Arc::new(Counters::default());
        let (c2, a2, k2) = (common.clone(), aggregates.clone(), counters.clone());
        let task = tokio::spawn(async move {
            let resource = resource(&c2);
            let mut batch: Vec<Span> = Vec::new();
            let mut span_tick = tokio::time::interval(Duration::from_secs(1));
            let mut metric_tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
            metric_tick.tick().await;
            loop {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some(Msg::Span(s)) => {
                            batch.push(*s);
                            if batch.len() >= BATCH {
                                export_spans(&*snd.traces, &resource, &mut batch, &k2).await;
                            }
                        }
                        Some(Msg::Flush(done)) => {
                            export_spans(&*snd.traces, &resource, &mut batch, &k2).await;
                            export_metrics(&*snd.metrics, &resource, &a2, start, &k2).await;
                            let _ = done.send(());
                        }
                        Some(Msg::Shutdown) | None => {
                            export_spans(&*snd.traces, &resource, &mut batch, &k2).await;
                            export_metrics(&*snd.metrics, &resource, &a2, start, &k2).await;
                            break;
                        }
                    },
                    _ = span_tick.tick() => export_spans(&*snd.traces, &resource, &mut batch, &k2).await,
                    _ = metric_tick.tick() => export_metrics(&*snd.metrics, &resource, &a2, start, &k2).await,
                }
            }
        });
        Ok(OtlpSink { common, tx, aggregates, counters, task: Mutex::new(Some(task)) })
    }

    /// The shared attributes.
    pub fn common(&self) -> &Common {
        &self.common
    }

    /// Emits the span of one request attempt and records its metrics.
    pub fn request(&self, o: &Outcome, cx: &SpanContext) {
        let span = request_span(&self.common, o, cx);
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            self.counters.spans_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.record_metrics(o, cx);
    }

    /// Records a plug-in hook's per-request metric as the histogram
    /// `inferwatch.bench.hook.<name>` with `inferwatch.hook.name` = `hook` (at most
    /// [`MAX_HOOK_SERIES`] series; later ones are dropped).
    pub fn hook_metric(&self, hook: &str, name: &str, value: f64) {
        if !value.is_finite() {
            return;
        }
        let c = &self.common;
        let mut attrs = vec![
            ("gen_ai.operation.name".to_string(), c.api.operation().to_string()),
            ("gen_ai.provider.name".to_string(), c.provider.clone()),
            ("gen_ai.request.model".to_string(), c.model.clone()),
            ("inferwatch.hook.name".to_string(), hook.to_string()),
            ("server.address".to_string(), c.server_address.clone()),
            ("server.port".to_string(), c.server_port.to_string()),
        ];
        attrs.sort();
        let Ok(mut a) = self.aggregates.lock() else { return };
        let key = (format!("inferwatch.bench.hook.{name}"), attrs);
        if !a.hooks.contains_key(&key) && a.hooks.len() >= MAX_HOOK_SERIES {
            return;
        }
        a.hooks.entry(key).or_insert_with(|| Agg::new(HOOK_BOUNDS)).record(value);
    }

    /// Emits an arbitrary span (e.g. a conversation's root span).
    pub fn span(&self, span: Span) {
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            self.counters.spans_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_metrics(&self, o: &Outcome, cx: &SpanContext) {
        let c = &self.common;
        let mut base = vec![
            ("gen_ai.operation.name".to_string(), c.api.operation().to_string()),
            ("gen_ai.provider.name".to_string(), c.provider.clone()),
            ("gen_ai.request.model".to_string(), c.model.clone()),
            ("server.address".to_string(), c.server_address.clone()),
            ("server.port".to_string(), c.server_port.to_string()),
        ];
        let Ok(mut a) = self.aggregates.lock() else { return };
        let mut rec = |name: &'static str, attrs: Vec<(String, String)>, bounds: &'static [f64], v: f64| {
            a.series.entry((name, attrs)).or_insert_with(|| Agg::new(bounds)).record(v);
        };
        match &o.error {
            Some(e) => {
                let mut attrs = base.clone();
                attrs.push(("error.type".into(), e.kind.name().into_owned()));
                attrs.sort();
                rec("gen_ai.client.operation.duration", attrs, DURATION_BOUNDS, o.e2e.as_secs_f64());
            }
            None => {
                base.sort();
                rec("gen_ai.client.operation.duration", base.clone(), DURATION_BOUNDS, o.e2e.as_secs_f64());
                for (ty, n) in [("input", o.input_tokens), ("output", o.output_tokens)] {
                    let mut attrs = base.clone();
                    attrs.push(("gen_ai.token.type".into(), ty.into()));
                    attrs.sort();
                    rec("gen_ai.client.token.usage", attrs, TOKEN_BOUNDS, n as f64);
                }
                if let Some(t) = o.ttft {
                    rec("gen_ai.client.operation.time_to_first_chunk", base.clone(), DURATION_BOUNDS, t.as_secs_f64());
                }
                for g in &o.itl {
                    rec(
                        "gen_ai.client.operation.time_per_output_chunk",
                        base.clone(),
                        DURATION_BOUNDS,
                        g.as_secs_f64(),
                    );
                }
                if let Some(t) = cx.tle.filter(|t| t.is_finite()) {
                    rec(TLE_METRIC, base.clone(), TLE_BOUNDS, t);
                }
                if let Some(r) = o.rci.as_ref().map(|r| r.rci).filter(|r| r.is_finite()) {
                    rec(RCI_METRIC, base.clone(), RCI_BOUNDS, r);
                }
            }
        }
    }

    /// Exports what is pending now and waits for it (bounded by `timeout`).
    pub async fn flush(&self, timeout: Duration) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(timeout, wait).await;
        }
    }

    /// Flushes everything and stops (later spans are dropped); returns what was delivered.
    pub async fn shutdown(&self, timeout: Duration) -> OtlpStats {
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let abort = task.abort_handle();
            let stop = async {
                let _ = self.tx.send(Msg::Shutdown).await;
                let _ = task.await;
            };
            if tokio::time::timeout(timeout, stop).await.is_err() {
                abort.abort();
            }
        }
        let counters = &self.counters;
        OtlpStats {
            spans_sent: counters.spans_sent.load(Ordering::Relaxed),
            spans_failed: counters.spans_failed.load(Ordering::Relaxed),
            metric_exports: counters.metric_exports.load(Ordering::Relaxed),
            metric_exports_failed: counters.metric_exports_failed.load(Ordering::Relaxed),
        }
    }
}

fn resource(c: &Common) -> Resource {
    let env = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let mut attributes = vec![kv_str("service.name", c.service_name.clone())];
    for (k, v) in resource_attributes(&env) {
        if !["service.name", "telemetry.sdk.name", "telemetry.sdk.language", "telemetry.sdk.version"]
            .contains(&k.as_str())
        {
            attributes.push(kv_str(&k, v));
        }
    }
    attributes.extend([
        kv_str("telemetry.sdk.name", "inferwatch-bench"),
        kv_str("telemetry.sdk.language", "rust"),
        kv_str("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
    ]);
    Resource { attributes, ..Default::default() }
}

/// The pairs of an `OTEL_RESOURCE_ATTRIBUTES` value (`k=v,k2=v2`, values percent-decoded as the
/// OTel spec says); as the spec asks, a malformed value (a pair without `=`, an empty key, a bad
/// escape) is discarded whole, with a warning.
pub fn resource_attributes(raw: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = pair.split_once('=').and_then(|(k, v)| {
            let k = k.trim();
            (!k.is_empty()).then_some(())?;
            Some((k.to_string(), percent_decode(v.trim())?))
        });
        match parsed {
            Some((k, v)) => {
                out.retain(|(o, _)| *o != k);
                out.push((k, v));
            }
            None => {
                tracing::warn!(pair, "bench: OTEL_RESOURCE_ATTRIBUTES is malformed, ignored");
                return Vec::new();
            }
        }
    }
    out
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "inferwatch.bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

async fn export_spans(sender: &dyn Sender, resource: &Resource, batch: &mut Vec<Span>, k: &Counters) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let n = spans.len() as u64;
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans { scope: Some(scope()), spans, schema_url: String::new() }],
            schema_url: String::new(),
        }],
    };
    match send(sender, &Payload::Traces(req)).await {
        Ok(()) => k.spans_sent.fetch_add(n, Ordering::Relaxed),
        Err(e) => {
            tracing::warn!(error = %e, spans = n, "bench: cannot export spans");
            k.spans_failed.fetch_add(n, Ordering::Relaxed)
        }
    };
}

async fn export_metrics(
    sender: &dyn Sender,
    resource: &Resource,
    aggregates: &Mutex<Aggregates>,
    start: SystemTime,
    k: &Counters,
) {
    let now = unix_nanos(SystemTime::now());
    let start = unix_nanos(start);
    let metrics: Vec<Metric> = {
        let Ok(a) = aggregates.lock() else { return };
        if a.series.is_empty() {
            return;
        }
        METRICS
            .iter()
            .filter_map(|&(name, unit, description)| {
                let points: Vec<HistogramDataPoint> = a
                    .series
                    .iter()
                    .filter(|((n, _), _)| *n == name)
                    .map(|((_, attrs), g)| histogram_point(attrs, g, start, now))
                    .collect();
                (!points.is_empty()).then(|| Metric {
                    name: name.into(),
                    unit: unit.into(),
                    description: description.into(),
                    data: Some(metric::Data::Histogram(Histogram {
                        data_points: points,
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    })),
                    ..Default::default()
                })
            })
            .chain(hook_metric_list(&a, start, now))
            .collect()
    };
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics { scope: Some(scope()), metrics, schema_url: String::new() }],
            schema_url: String::new(),
        }],
    };
    match send(sender, &Payload::Metrics(req)).await {
        Ok(()) => k.metric_exports.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            tracing::warn!(error = %e, "bench: cannot export metrics");
            k.metric_exports_failed.fetch_add(1, Ordering::Relaxed)
        }
    };
}

/// Bucket boundaries of the plug-in hooks' metrics (any unit): 1-2-5 steps from 0.001 to 10⁶.
pub const HOOK_BOUNDS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3,
    2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6,
];
/// Most series of plug-in hook metrics kept for OTLP.
pub const MAX_HOOK_SERIES: usize = 256;

/// The plug-in hooks' histograms, one metric per name.
fn hook_metric_list(a: &Aggregates, start: u64, now: u64) -> Vec<Metric> {
    let mut by_name: BTreeMap<&str, Vec<HistogramDataPoint>> = BTreeMap::new();
    for ((name, attrs), g) in &a.hooks {
        by_name.entry(name).or_default().push(histogram_point(attrs, g, start, now));
    }
    by_name
        .into_iter()
        .map(|(name, points)| Metric {
            name: name.into(),
            description: "A per-request metric of a bench plug-in hook".into(),
            data: Some(metric::Data::Histogram(Histogram {
                data_points: points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        })
        .collect()
}

/// The CLIENT span of one request attempt.
pub fn request_span(c: &Common, o: &Outcome, cx: &SpanContext) -> Span {
    let op = c.api.operation();
    let mut attrs = vec![
        kv_str("gen_ai.operation.name", op),
        kv_str("gen_ai.provider.name", c.provider.clone()),
        kv_str("gen_ai.request.model", c.model.clone()),
        kv("gen_ai.request.stream", any_value::Value::BoolValue(c.stream)),
        kv_int("gen_ai.request.max_tokens", i64::from(cx.max_tokens)),
        kv_str("gen_ai.output.type", "text"),
        kv_str("server.address", c.server_address.clone()),
        kv_int("server.port", i64::from(c.server_port)),
    ];
    if let Some(t) = c.temperature {
        attrs.push(kv_f64("gen_ai.request.temperature", t));
    }
    if let Some(id) = &o.response_id {
        attrs.push(kv_str("gen_ai.response.id", id.clone()));
    }
    if let Some(m) = &o.response_model {
        attrs.push(kv_str("gen_ai.response.model", m.clone()));
    }
    if let Some(f) = &o.finish_reason {
        let arr = ArrayValue { values: vec![AnyValue { value: Some(any_value::Value::StringValue(f.clone())) }] };
        attrs.push(kv("gen_ai.response.finish_reasons", any_value::Value::ArrayValue(arr)));
    }
    if o.ok() {
        attrs.push(kv_int("gen_ai.usage.input_tokens", o.input_tokens.min(i64::MAX as u64) as i64));
        attrs.push(kv_int("gen_ai.usage.output_tokens", o.output_tokens.min(i64::MAX as u64) as i64));
    }
    if let Some(t) = o.ttft {
        attrs.push(kv_f64("gen_ai.response.time_to_first_chunk", t.as_secs_f64()));
    }
    if let Some(conv) = &cx.conversation {
        attrs.push(kv_str("gen_ai.conversation.id", conv.clone()));
    }
    if let Some(s) = &cx.state {
        attrs.push(kv_str("inferwatch.bench.state", s.clone()));
    }
    if cx.attempt > 1 {
        attrs.push(kv_int("inferwatch.bench.attempt", i64::from(cx.attempt)));
    }
    if let Some(t) = o.tpot() {
        attrs.push(kv_f64("inferwatch.bench.tpot", t.as_secs_f64()));
    }
    if let Some(t) = cx.tle {
        attrs.push(kv_f64(TLE_METRIC, t));
        if let Some(top) = &o.first_top_logprobs {
            attrs.push(kv_int(TOP_K_ATTRIBUTE, top.len().min(i64::MAX as usize) as i64));
        }
    }
    if let Some(r) = &o.rci {
        attrs.push(kv_f64(RCI_METRIC, r.rci));
    }
    if let Some(p) = &cx.perturbation {
        attrs.push(kv_str("inferwatch.bench.perturbation", p.clone()));
    }
    attrs.extend(cx.hook_attributes.iter().cloned());
    let status = match &o.error {
        Some(e) => {
            attrs.push(kv_str("error.type", e.kind.name()));
            Status { code: status::StatusCode::Error as i32, message: e.message.clone() }
        }
        None => Status::default(),
    };
    let start = unix_nanos(o.start_wall);
    Span {
        trace_id: cx.trace_id.to_vec(),
        span_id: cx.span_id.to_vec(),
        parent_span_id: cx.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: 0x100 | 1,
        name: format!("{op} {}", c.model),
        kind: span::SpanKind::Client as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start + o.e2e.as_nanos().min(u64::MAX as u128) as u64,
        attributes: attrs,
        status: Some(status),
        ..Default::default()
    }
}

/// A finished conversation of a dialogue flow.
#[derive(Debug, Clone)]
pub struct Conversation<'a> {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its root span id (the turns' parent).
    pub span_id: [u8; 8],
    /// `gen_ai.conversation.id`.
    pub id: &'a str,
    /// When the user arrived.
    pub start: SystemTime,
    /// When the user left.
    pub end: SystemTime,
    /// Turns answered.
    pub turns: u32,
    /// completed, failed, dropped, unfinished or cancelled.
    pub outcome: &'a str,
}

/// An INTERNAL span covering a whole conversation (dialogue flows).
pub fn conversation_span(c: &Common, conv: &Conversation<'_>) -> Span {
    Span {
        trace_id: conv.trace_id.to_vec(),
        span_id: conv.span_id.to_vec(),
        flags: 0x100 | 1,
        name: format!("invoke_workflow {}", c.model),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: unix_nanos(conv.start),
        end_time_unix_nano: unix_nanos(conv.end),
        attributes: vec![
            kv_str("gen_ai.operation.name", "invoke_workflow"),
            kv_str("gen_ai.provider.name", c.provider.clone()),
            kv_str("gen_ai.request.model", c.model.clone()),
            kv_str("gen_ai.conversation.id", conv.id),
            kv_int("inferwatch.bench.turns", i64::from(conv.turns)),
            kv_str("inferwatch.bench.outcome", conv.outcome),
        ],
        status: Some(Status::default()),
        ..Default::default()
    }
}

/// One histogram point of a series: its attributes (`server.port` as an int), `start..now`.
fn histogram_point(attrs: &[(String, String)], g: &Agg, start: u64, now: u64) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes: attrs
            .iter()
            .map(|(k, v)| match (k.as_str(), v.parse::<i64>()) {
                ("server.port", Ok(p)) => kv_int(k, p),
                _ => kv_str(k, v.clone()),
            })
            .collect(),
        start_time_unix_nano: start,
        time_unix_nano: now,
        count: g.count,
        sum: Some(g.sum),
        bucket_counts: g.counts.clone(),
        explicit_bounds: g.bounds.to_vec(),
        min: (g.count > 0).then_some(g.min),
        max: (g.count > 0).then_some(g.max),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_format() {
        let tp = traceparent(&[0xab; 16], &[0x01; 8]);
        assert_eq!(tp, format!("00-{}-{}-01", "ab".repeat(16), "01".repeat(8)));
    }

    #[test]
    fn resource_attributes_follow_the_spec() {
        let got = resource_attributes("service.version=B, deployment.environment=prod%2Ceu,service.version=C");
        assert_eq!(
            got,
            vec![("deployment.environment".to_string(), "prod,eu".to_string()), ("service.version".into(), "C".into())]
        );
        assert!(resource_attributes("good=1,bad").is_empty(), "a malformed value is discarded whole");
        assert!(resource_attributes("k=%zz").is_empty());
        assert!(resource_attributes("k=%+1").is_empty(), "a sign is not a hex digit");
        assert!(resource_attributes("=v").is_empty());
        assert!(resource_attributes("").is_empty());
    }

    #[test]
    fn quality_buckets_cover_their_ranges() {
        assert!(TLE_BOUNDS.windows(2).all(|w| w[0] < w[1]) && RCI_BOUNDS.windows(2).all(|w| w[0] < w[1]));
        assert!(*TLE_BOUNDS.last().unwrap_or(&0.0) >= crate::quality::TLE_UNCERTAIN_BITS);
        assert!(TLE_BOUNDS.iter().rev().nth(1).is_some_and(|b| *b > 100f64.log2()), "log2 of the largest K");
        assert!(RCI_BOUNDS.iter().all(|b| (0.0..1.0).contains(b)));
    }

    #[test]
    fn buckets() {
        let mut a = Agg::new(DURATION_BOUNDS);
        a.record(0.005);
        a.record(0.01); // on the bound: the bucket (.., 0.01]
        a.record(0.015);
        a.record(100.0);
        assert_eq!(a.counts[0], 2);
        assert_eq!(a.counts[1], 1);
        assert_eq!(a.counts[DURATION_BOUNDS.len()], 1);
        assert_eq!(a.count, 4);
    }
}
