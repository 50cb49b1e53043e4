//! The `debug` exporter: writes what it receives to stdout (otelcol's `debug` exporter).

use async_trait::async_trait;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, parse_config};
use inferwatch_core::exporterhelper::{QueuedExporter, SendError, Sender};
use inferwatch_core::pdata::{Payload, Signal, metric_point_count};
use inferwatch_core::settings::{QueueSettings, RetrySettings};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use serde::Deserialize;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much the `debug` exporter prints.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    /// One summary line per payload.
    #[default]
    Basic,
    /// The summary, then one line per span, metric data point or log record.
    Normal,
    /// The summary, then the whole payload as pretty OTLP/JSON.
    Detailed,
}

/// Settings of the `debug` exporter, in otelcol's shape.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// `basic` (default), `normal` or `detailed`.
    #[serde(default)]
    pub verbosity: Verbosity,
    /// Payloads printed each second before sampling starts.
    #[serde(default = "default_sampling_initial")]
    pub sampling_initial: u64,
    /// After `sampling_initial` in a second, print every N-th payload (0: none).
    #[serde(default = "default_sampling_thereafter")]
    pub sampling_thereafter: u64,
    /// Write through the agent's log (`tracing`) instead of stdout.
    #[serde(default)]
    pub use_internal_logger: bool,
    /// Sending queue; off by default, so output is written in the pipeline's task.
    #[serde(default = "default_queue")]
    pub sending_queue: QueueSettings,
}

fn default_sampling_initial() -> u64 {
    2
}

fn default_sampling_thereafter() -> u64 {
    1
}

fn default_queue() -> QueueSettings {
    QueueSettings { enabled: false, ..QueueSettings::default() }
}

impl DebugConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: DebugConfig = parse_config(v)?;
        c.sending_queue.check()?;
        Ok(c)
    }
}

/// Factory of the `debug` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct DebugExporterFactory;

impl ExporterFactory for DebugExporterFactory {
    fn type_name(&self) -> &'static str {
        "debug"
    }

    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(DebugConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<DebugConfig>(parsed)?;
        let out = if c.use_internal_logger { Output::Log } else { Output::Stdout };
        let sender = DebugSender::new(ctx.id.to_string(), c, out);
        let no_retry = RetrySettings { enabled: false, ..RetrySettings::default() };
        Ok(Arc::new(QueuedExporter::create(&ctx, signal, Arc::new(sender), c.sending_queue.clone(), no_retry)?))
    }
}

/// Where the `debug` exporter writes.
pub enum Output {
    /// The process's standard output.
    Stdout,
    /// `tracing` at INFO level.
    Log,
    /// Any writer (tests, files).
    Writer(Mutex<Box<dyn Write + Send>>),
}

/// otelcol-style log sampling: the first `initial` payloads of each second, then every N-th.
struct Sampler {
    initial: u64,
    thereafter: u64,
    window: Mutex<(Instant, u64)>,
}

impl Sampler {
    fn admit(&self) -> bool {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now.duration_since(w.0) >= Duration::from_secs(1) {
            *w = (now, 0);
        }
        w.1 += 1;
        let n = w.1;
        n <= self.initial || (self.thereafter > 0 && (n - self.initial).is_multiple_of(self.thereafter))
    }
}

/// Renders each payload and writes it.
pub struct DebugSender {
    name: String,
    verbosity: Verbosity,
    sampler: Sampler,
    out: Output,
}

impl DebugSender {
    /// A sender with the given settings and output.
    pub fn new(name: String, c: &DebugConfig, out: Output) -> Self {
        DebugSender {
            name,
            verbosity: c.verbosity,
            sampler: Sampler {
                initial: c.sampling_initial,
                thereafter: c.sampling_thereafter,
                window: Mutex::new((Instant::now(), 0)),
            },
            out,
        }
    }
}

#[async_trait]
impl Sender for DebugSender {
    async fn send(&self, data: &Payload) -> Result<(), SendError> {
        if !self.sampler.admit() {
            return Ok(());
        }
        let text = render(data, self.verbosity);
        let failed = |e: std::io::Error| SendError::Permanent(format!("writing debug output failed: {e}"));
        match &self.out {
            Output::Log => {
                tracing::info!(exporter = %self.name, signal = %data.signal(), "{}", text.trim_end());
                Ok(())
            }
            Output::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(text.as_bytes()).and_then(|_| o.flush()).map_err(failed)
            }
            Output::Writer(w) => {
                let mut o = w.lock().unwrap_or_else(|p| p.into_inner());
                o.write_all(text.as_bytes()).and_then(|_| o.flush()).map_err(failed)
            }
        }
    }
}

/// The text the exporter prints for `data` at `verbosity`, newline-terminated.
pub fn render(data: &Payload, verbosity: Verbosity) -> String {
    let decoded = match data.decoded() {
        Ok(d) => d,
        Err(e) => return format!("{} payload that cannot be decoded: {}\n", data.signal(), esc(&e.to_string())),
    };
    let data = decoded.as_ref();
    let mut s = summary(data);
    s.push('\n');
    match verbosity {
        Verbosity::Basic => {}
        Verbosity::Normal => items(data, &mut s),
        Verbosity::Detailed => {
            let json = match data {
                Payload::Traces(r) => serde_json::to_string_pretty(r),
                Payload::Metrics(r) => serde_json::to_string_pretty(r),
                Payload::Logs(r) => serde_json::to_string_pretty(r),
                Payload::Encoded(_) => Ok(String::new()),
            };
            match json {
                // JSON escapes C0 controls already; DEL, C1 and bidi controls pass it raw.
                Ok(j) => s.push_str(&escape_json_extra(&j)),
                Err(_) => {
                    let _ = write!(s, "{}", esc(&format!("{data:#?}")));
                }
            }
            s.push('\n');
        }
    }
    s
}

/// `Traces: resource spans: N, spans: M` and the like.
fn summary(data: &Payload) -> String {
    match data {
        Payload::Traces(r) => {
            format!("Traces: resource spans: {}, spans: {}", r.resource_spans.len(), data.item_count())
        }
        Payload::Metrics(r) => {
            let metrics: usize =
                r.resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).map(|sm| sm.metrics.len()).sum();
            format!(
                "Metrics: resource metrics: {}, metrics: {metrics}, data points: {}",
                r.resource_metrics.len(),
                data.item_count()
            )
        }
        Payload::Logs(r) => {
            format!("Logs: resource logs: {}, log records: {}", r.resource_logs.len(), data.item_count())
        }
        Payload::Encoded(e) => format!("{}: {} items (encoded)", e.signal(), e.item_count()),
    }
}

/// One line per span / data point / log record.
fn items(data: &Payload, s: &mut String) {
    match data {
        Payload::Traces(r) => {
            for span in r.resource_spans.iter().flat_map(|rs| &rs.scope_spans).flat_map(|ss| &ss.spans) {
                let _ = writeln!(
                    s,
                    "{} {} {}{}",
                    esc(&span.name),
                    hex(&span.trace_id),
                    hex(&span.span_id),
                    attrs(&span.attributes)
                );
            }
        }
        Payload::Metrics(r) => {
            for m in r.resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).flat_map(|sm| &sm.metrics) {
                metric_lines(m, s);
            }
        }
        Payload::Logs(r) => {
            for l in r.resource_logs.iter().flat_map(|rl| &rl.scope_logs).flat_map(|sl| &sl.log_records) {
                let body = l.body.as_ref().map(any_value).unwrap_or_default();
                let _ = writeln!(s, "{body}{}", attrs(&l.attributes));
            }
        }
        Payload::Encoded(_) => {}
    }
}

fn metric_lines(m: &opentelemetry_proto::tonic::metrics::v1::Metric, s: &mut String) {
    let number = |v: &Option<number_data_point::Value>| match v {
        Some(number_data_point::Value::AsDouble(d)) => d.to_string(),
        Some(number_data_point::Value::AsInt(i)) => i.to_string(),
        None => "-".into(),
    };
    match &m.data {
        Some(Data::Gauge(g)) => {
            for p in &g.data_points {
                let _ = writeln!(s, "{}{} {}", esc(&m.name), labels(&p.attributes), number(&p.value));
            }
        }
        Some(Data::Sum(g)) => {
            for p in &g.data_points {
                let _ = writeln!(s, "{}{} {}", esc(&m.name), labels(&p.attributes), number(&p.value));
            }
        }
        Some(Data::Histogram(h)) => {
            for p in &h.data_points {
                let sum = p.sum.map_or("-".into(), |x| x.to_string());
                let _ = writeln!(s, "{}{} count={} sum={sum}", esc(&m.name), labels(&p.attributes), p.count);
            }
        }
        Some(Data::ExponentialHistogram(h)) => {
            for p in &h.data_points {
                let sum = p.sum.map_or("-".into(), |x| x.to_string());
                let _ = writeln!(s, "{}{} count={} sum={sum}", esc(&m.name), labels(&p.attributes), p.count);
            }
        }
        Some(Data::Summary(h)) => {
            for p in &h.data_points {
                let _ = writeln!(s, "{}{} count={} sum={}", esc(&m.name), labels(&p.attributes), p.count, p.sum);
            }
        }
        None => {
            let _ = writeln!(s, "{} (no data, {} points)", esc(&m.name), metric_point_count(m));
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// ` k=v k2=v2` (leading space), or empty.
fn attrs(kv: &[KeyValue]) -> String {
    kv.iter().fold(String::new(), |mut s, a| {
        let v = a.value.as_ref().map(any_value).unwrap_or_default();
        let _ = write!(s, " {}={v}", esc(&a.key));
        s
    })
}

/// `{k=v,k2=v2}`, or empty.
fn labels(kv: &[KeyValue]) -> String {
    if kv.is_empty() {
        return String::new();
    }
    let inner: Vec<String> =
        kv.iter().map(|a| format!("{}={}", esc(&a.key), a.value.as_ref().map(any_value).unwrap_or_default())).collect();
    format!("{{{}}}", inner.join(","))
}

/// Whether `c` must not reach a terminal or log file raw: C0 and C1 controls, DEL, the Unicode
/// line / paragraph separators and the bidirectional overrides ("Trojan source").
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A string from the data, printable on one line: `\n`, `\r`, `\t`, `\\` and `\u{..}` for
/// the other unsafe characters (as Rust's `escape_debug` writes them), everything else as is.
pub fn esc(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || is_unsafe(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// OTLP/JSON with the unsafe characters JSON leaves raw written as `\uXXXX` (still valid JSON).
fn escape_json_extra(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // C0 controls inside strings are escaped by JSON already; raw ones are its whitespace.
        if is_unsafe(c) && u32::from(c) >= 0x7f {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

fn any_value(v: &AnyValue) -> String {
    match &v.value {
        Some(Value::StringValue(s)) => esc(s).into_owned(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex(b),
        Some(Value::ArrayValue(a)) => {
            format!("[{}]", a.values.iter().map(any_value).collect::<Vec<_>>().join(","))
        }
        Some(Value::KvlistValue(l)) => labels(&l.values),
        // Profiles-only reference into a string table; not meaningful here.
        Some(Value::StringValueStrindex(i)) => format!("strindex:{i}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use serde_json::json;

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(Value::StringValue(v.into())) }),
            ..Default::default()
        }
    }

    fn traces() -> Payload {
        let span = |n: &str, id: u8| Span {
            name: n.into(),
            trace_id: vec![0xab; 16],
            span_id: vec![id; 8],
            attributes: vec![kv("model", "llama")],
            ..Default::default()
        };
        Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![span("prefill", 1), span("decode", 2)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    #[test]
    fn basic_is_one_line() {
        assert_eq!(render(&traces(), Verbosity::Basic), "Traces: resource spans: 1, spans: 2\n");
        let logs = Payload::Logs(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        body: Some(AnyValue { value: Some(Value::StringValue("oom".into())) }),
                        attributes: vec![kv("gpu", "0")],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert_eq!(render(&logs, Verbosity::Basic), "Logs: resource logs: 1, log records: 1\n");
        assert_eq!(render(&logs, Verbosity::Normal), "Logs: resource logs: 1, log records: 1\noom gpu=0\n");
    }

    #[test]
    fn normal_lists_items() {
        let t = render(&traces(), Verbosity::Normal);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1], format!("prefill {} 0101010101010101 model=llama", "ab".repeat(16)));
        let m = Payload::Metrics(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "gpu.util".into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                attributes: vec![kv("gpu", "0")],
                                value: Some(number_data_point::Value::AsDouble(0.5)),
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert_eq!(
            render(&m, Verbosity::Normal),
            "Metrics: resource metrics: 1, metrics: 1, data points: 1\ngpu.util{gpu=0} 0.5\n"
        );
    }

    #[test]
    fn control_characters_are_escaped_everywhere() {
        // A span name that would forge a log line, ANSI colour codes, a C1 CSI, DEL and a bidi
        // override, in a name, an attribute key and value, a metric name and a log body.
        let evil = "ok\n2024-01-01T00:00:00Z ERROR forged\r\x1b[31mred\x1b[0m\u{9b}2J\x7f\u{202e}\ttab\\";
        let want = r"ok\n2024-01-01T00:00:00Z ERROR forged\r\u{1b}[31mred\u{1b}[0m\u{9b}2J\u{7f}\u{202e}\ttab\\";
        let span = Span { name: evil.into(), attributes: vec![kv(evil, evil)], ..Default::default() };
        let t = Payload::Traces(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
                    attributes: vec![kv("service.name", evil)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans { spans: vec![span], ..Default::default() }],
                ..Default::default()
            }],
        });
        let out = render(&t, Verbosity::Normal);
        assert_eq!(out.lines().count(), 2, "{out}");
        assert_eq!(out.lines().nth(1).unwrap(), format!("{want}   {want}={want}"));
        let m = Payload::Metrics(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: evil.into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                attributes: vec![kv(evil, "v")],
                                value: Some(number_data_point::Value::AsInt(1)),
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert_eq!(render(&m, Verbosity::Normal).lines().nth(1).unwrap(), format!("{want}{{{want}=v}} 1"));
        let l = Payload::Logs(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        body: Some(AnyValue { value: Some(Value::StringValue(evil.into())) }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert_eq!(render(&l, Verbosity::Normal).lines().nth(1).unwrap(), want);
        // Detailed: valid JSON that round-trips, with no raw control character anywhere.
        for p in [&t, &m, &l] {
            let d = render(p, Verbosity::Detailed);
            assert!(!d.chars().any(|c| is_unsafe(c) && c != '\n'), "{d}");
            let (_, body) = d.split_once('\n').unwrap();
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(v.to_string().contains("forged"));
        }
        let d = render(&t, Verbosity::Detailed);
        let v: serde_json::Value = serde_json::from_str(d.split_once('\n').unwrap().1).unwrap();
        assert_eq!(v["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"], evil);
        // Plain text is untouched (no copy).
        assert!(matches!(esc("prefill café"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn detailed_is_otlp_json() {
        let t = render(&traces(), Verbosity::Detailed);
        let (head, body) = t.split_once('\n').unwrap();
        assert_eq!(head, "Traces: resource spans: 1, spans: 2");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["name"], "decode");
    }

    #[test]
    fn config_defaults_and_errors() {
        let c = DebugConfig::from_value(&serde_json::Value::Null).unwrap();
        assert_eq!(c.verbosity, Verbosity::Basic);
        assert_eq!((c.sampling_initial, c.sampling_thereafter), (2, 1));
        assert!(!c.sending_queue.enabled);
        assert!(DebugExporterFactory.validate(&json!({"verbosity": "loud"})).is_err());
        assert!(DebugExporterFactory.validate(&json!({"loglevel": "debug"})).is_err());
        assert!(DebugExporterFactory.validate(&json!({"verbosity": "detailed", "use_internal_logger": true})).is_ok());
    }

    #[test]
    fn sampling_after_initial() {
        let s = Sampler { initial: 2, thereafter: 3, window: Mutex::new((Instant::now(), 0)) };
        let got: Vec<bool> = (0..8).map(|_| s.admit()).collect();
        assert_eq!(got, vec![true, true, false, false, true, false, false, true]);
        let none = Sampler { initial: 1, thereafter: 0, window: Mutex::new((Instant::now(), 0)) };
        assert_eq!((0..3).map(|_| none.admit()).collect::<Vec<_>>(), vec![true, false, false]);
    }

    #[tokio::test]
    async fn factory_node_is_synchronous_and_counts() {
        use inferwatch_core::component::{ComponentId, CreateContext};
        use inferwatch_core::telemetry::Telemetry;
        let telemetry = Arc::new(Telemetry::new());
        let id = ComponentId::parse("debug/test").unwrap();
        let metrics = telemetry.exporter(&id, Signal::Traces);
        let node = DebugExporterFactory
            .create(CreateContext::new(id, telemetry), &json!({"use_internal_logger": true}), Signal::Traces)
            .unwrap();
        node.start().await.unwrap();
        // No queue: the item is counted by the time consume returns.
        node.consume(traces()).await.unwrap();
        assert_eq!(metrics.sent.get(), 2);
        assert_eq!(node.shutdown(Instant::now() + Duration::from_secs(1)).await, 0);
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn sender_writes_rendered_text() {
        let buf = Buf::default();
        let c = DebugConfig::from_value(&json!({"verbosity": "basic"})).unwrap();
        let s = DebugSender::new("debug".into(), &c, Output::Writer(Mutex::new(Box::new(buf.clone()))));
        s.send(&traces()).await.unwrap();
        assert_eq!(String::from_utf8(buf.0.lock().unwrap().clone()).unwrap(), "Traces: resource spans: 1, spans: 2\n");
    }
}
