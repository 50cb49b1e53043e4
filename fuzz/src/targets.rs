//! The fuzz targets: every decoder and parser of inferwatch that takes outside input. Each
//! returns an outcome signature, or `Err` when one of its invariants is broken.

use crate::engine::{Outcome, Target};
use crate::http::{RawServer, runtime};
use crate::mutate::InputKind::{Binary, Protobuf, Text};
use crate::sig;
use bytes::Bytes;
use inferwatch_core::arrow::{batch_to_payload, payload_to_batch};
use inferwatch_core::exporterhelper::{SendError, Sender};
use inferwatch_core::pdata::wire::{self, WireError};
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

const MS: Duration = Duration::from_millis(1);

/// Every target.
pub fn all() -> Vec<Target> {
    let t = |name, kind, dict, run, short_execs, budget_ms| Target {
        name,
        kind,
        dict,
        run,
        short_execs,
        budget: MS * budget_ms,
    };
    vec![
        t("otlp_proto_traces", Protobuf, &[], |d| otlp_proto(Signal::Traces, d), 1500, 1000),
        t("otlp_proto_metrics", Protobuf, &[], |d| otlp_proto(Signal::Metrics, d), 1500, 1000),
        t("otlp_proto_logs", Protobuf, &[], |d| otlp_proto(Signal::Logs, d), 1500, 1000),
        t("otlp_json_traces", Text, JSON_DICT, |d| otlp_json(Signal::Traces, d), 800, 1000),
        t("otlp_json_metrics", Text, JSON_DICT, |d| otlp_json(Signal::Metrics, d), 800, 1000),
        t("otlp_json_logs", Text, JSON_DICT, |d| otlp_json(Signal::Logs, d), 800, 1000),
        t("prometheus_text", Text, PROM_DICT, |d| prometheus(Format::Text, d), 800, 1000),
        t("openmetrics", Text, PROM_DICT, |d| prometheus(Format::OpenMetrics, d), 800, 1000),
        t("tgi_info", Text, JSON_DICT, tgi_info, 500, 1000),
        t("config_yaml", Text, YAML_DICT, config_yaml, 400, 1000),
        t("replay_jsonl", Text, JSON_DICT, replay_jsonl, 600, 1000),
        t("replay_arrow_ipc", Binary, &[], replay_arrow_ipc, 600, 1000),
        t("replay_parquet", Binary, &[], replay_parquet, 300, 1000),
        t("retry_after", Text, RETRY_DICT, retry_after, 1000, 1000),
        t("otlphttp_response", Text, HTTP_DICT, otlphttp_response, 150, 3000),
        t("alertmanager_response", Text, HTTP_DICT, alertmanager_response, 150, 3000),
        t("remotewrite_response", Text, HTTP_DICT, remotewrite_response, 150, 3000),
        t("otlp_http_receiver", Protobuf, &[], otlp_http_receiver, 200, 3000),
    ]
}

use inferwatch_receivers::prometheus::parse::Format;

/// A power-of-two bucket of a count, so that signatures do not grow with every count.
fn bucket(n: usize) -> u32 {
    usize::BITS - n.leading_zeros()
}

fn decode(signal: Signal, data: &[u8]) -> Result<Payload, prost::DecodeError> {
    Ok(match signal {
        Signal::Traces => Payload::Traces(ExportTraceServiceRequest::decode(data)?),
        Signal::Metrics => Payload::Metrics(ExportMetricsServiceRequest::decode(data)?),
        Signal::Logs => Payload::Logs(ExportLogsServiceRequest::decode(data)?),
    })
}

/// The wire validator, its resource split, `Encoded` splitting, prost and the Arrow conversion.
/// Invariants: what the wire check accepts prost decodes with the same item count; the
/// resource entries tile the request and count the same; a split keeps every item; a batch
/// made from OTLP converts back.
pub fn otlp_proto(signal: Signal, data: &[u8]) -> Outcome {
    let v = wire::validate(signal, data);
    let d = decode(signal, data);
    match (&v, &d) {
        (Ok(n), Ok(p)) if p.item_count() != *n => {
            return Err(format!("wire counts {n} items, prost decodes {}", p.item_count()));
        }
        (Ok(_), Err(e)) => return Err(format!("the wire check accepts what prost refuses: {e}")),
        (Err(WireError::NeedsDecode), Err(e)) => {
            return Err(format!("the wire check finds only bad ids where prost refuses: {e}"));
        }
        _ => {}
    }
    if let Ok(n) = v {
        let entries = wire::resource_entries(signal, data)
            .map_err(|e| format!("resource_entries refuses a valid request: {e}"))?;
        let mut at = 0;
        let mut total = 0;
        for (r, k) in &entries {
            if r.start != at {
                return Err(format!("resource entries leave a gap at {at}"));
            }
            at = r.end;
            total += k;
            match wire::validate(signal, &data[r.clone()]) {
                Ok(m) if m == *k => {}
                other => return Err(format!("a resource entry validates as {other:?}, counted {k}")),
            }
        }
        if at != data.len() || total != n {
            return Err(format!("resource entries cover {at} of {} bytes, {total} of {n} items", data.len()));
        }
        let mut enc = Encoded::new(signal, Bytes::copy_from_slice(data)).map_err(|e| e.to_string())?;
        if let Some(front) = enc.split_off_front(n / 2) {
            if front.item_count() + enc.item_count() != n {
                return Err(format!("a split keeps {} + {} of {n} items", front.item_count(), enc.item_count()));
            }
            for part in [&front, &enc] {
                let p = part.decode().map_err(|e| format!("a split part does not decode: {e}"))?;
                if p.item_count() != part.item_count() {
                    return Err("a split part's count is wrong".into());
                }
            }
        }
    }
    let arrow = match &d {
        Ok(p) if signal != Signal::Logs => match payload_to_batch(p) {
            Ok(b) => {
                batch_to_payload(&b).map_err(|e| format!("a batch made from OTLP does not convert back: {e}"))?;
                0
            }
            Err(e) => sig(&e.to_string()),
        },
        _ => 1,
    };
    let vs = match &v {
        Ok(n) => format!("ok{}", bucket(*n)),
        Err(e) => e.to_string(),
    };
    let ds = match &d {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    Ok(sig(&format!("{vs}|{arrow}|{ds}")))
}

/// OTLP/JSON as the HTTP receiver decodes it. Invariant: an accepted request encodes to
/// protobuf that the wire check accepts (or finds only bad ids in) and that round-trips.
pub fn otlp_json(signal: Signal, data: &[u8]) -> Outcome {
    match inferwatch_receivers::fuzzing::otlp_json(signal, data) {
        Err(e) => Ok(sig(&e)),
        Ok(p) => {
            let bytes = p.encode_to_vec();
            check_encoded(signal, &bytes, p.item_count())?;
            Ok(sig(&format!("ok{}", bucket(p.item_count()))))
        }
    }
}

/// `bytes` (the encoding of a payload of `items` items) passes the wire check and round-trips.
fn check_encoded(signal: Signal, bytes: &[u8], items: usize) -> Result<(), String> {
    match wire::validate(signal, bytes) {
        Ok(n) if n != items => return Err(format!("wire counts {n}, the payload has {items}")),
        Ok(_) | Err(WireError::NeedsDecode) => {}
        Err(e) => return Err(format!("accepted input encodes to protobuf the wire check refuses: {e}")),
    }
    let back = decode(signal, bytes).map_err(|e| format!("its protobuf does not decode: {e}"))?;
    if back.encode_to_vec() != bytes {
        return Err("the protobuf round trip changes it".into());
    }
    Ok(())
}

fn prom_target() -> inferwatch_receivers::prometheus::convert::Target {
    use inferwatch_receivers::prometheus::config::TargetAddr;
    inferwatch_receivers::prometheus::convert::Target {
        job: "fuzz".into(),
        addr: TargetAddr { host: "127.0.0.1".into(), port: 8000 },
        scheme: "http".into(),
        labels: vec![("env".into(), "fuzz".into())],
        honor_labels: false,
    }
}

/// The exposition parser and the conversion to OTLP. Invariants: an error names a line of
/// the input; what parses converts (twice, on one converter) into valid OTLP.
pub fn prometheus(format: Format, data: &[u8]) -> Outcome {
    use inferwatch_receivers::prometheus::convert::Converter;
    use inferwatch_receivers::prometheus::parse::parse_bytes;
    match parse_bytes(data, format) {
        Err(e) => {
            let lines = data.split(|b| *b == b'\n').count();
            if e.line > lines + 1 {
                return Err(format!("an error names line {} of {lines}", e.line));
            }
            Ok(sig(&e.message))
        }
        Ok(expo) => {
            let mut c = Converter::new(prom_target());
            let t0 = 1_700_000_000_000_000_000u64;
            let _ = c.convert(&expo, t0, &[]);
            let m = c.convert(&expo, t0 + 15_000_000_000, &[("extra".into(), "x".into())]);
            let req = c.request(m);
            let items = Payload::Metrics(req.clone()).item_count();
            check_encoded(Signal::Metrics, &req.encode_to_vec(), items)?;
            Ok(sig(&format!("ok{}|{}", bucket(expo.sample_count()), bucket(expo.families.len()))))
        }
    }
}

/// TGI's `/info` document.
pub fn tgi_info(data: &[u8]) -> Outcome {
    Ok(match inferwatch_receivers::prometheus::tgi::model_id(data) {
        Ok(_) => 1,
        Err(e) => sig(&e),
    })
}

fn registry() -> &'static inferwatch_core::registry::Registry {
    static R: OnceLock<inferwatch_core::registry::Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = inferwatch_core::registry::Registry::new();
        inferwatch_receivers::register(&mut r);
        inferwatch_processors::register(&mut r);
        inferwatch_exporters::register(&mut r);
        r
    })
}

/// The YAML parser and the configuration loader (empty environment), then validation
/// against every component of the agent.
pub fn config_yaml(data: &[u8]) -> Outcome {
    use inferwatch_core::config;
    let text = String::from_utf8_lossy(data);
    let parsed = config::yaml::parse("fuzz.yaml", &text).is_ok();
    match config::load_str("fuzz.yaml", &text, &|_| None) {
        Ok(cfg) => {
            let errors = config::validate(&cfg, registry());
            let _ = config::warnings(&cfg, registry());
            let first = errors.first().map(|e| e.to_string()).unwrap_or_default();
            Ok(sig(&format!("ok|{}|{first}", bucket(errors.len()))))
        }
        Err(errors) => {
            let first = errors.first().map(|e| e.to_string()).unwrap_or_default();
            Ok(sig(&format!("{parsed}|{first}")))
        }
    }
}

/// One line of the otelcol file exporter format, as the replay receiver reads it.
pub fn replay_jsonl(data: &[u8]) -> Outcome {
    match inferwatch_receivers::replay::decode_otlp_json_line(data) {
        Err(e) => Ok(sig(&e)),
        Ok(p) => {
            let t = inferwatch_receivers::replay::payload_first_time(&p).is_some();
            check_encoded(p.signal(), &p.encode_to_vec(), p.item_count())?;
            Ok(sig(&format!("ok{}|{t}|{}", bucket(p.item_count()), p.signal())))
        }
    }
}

fn replay_outcome(len: usize, r: Result<inferwatch_receivers::fuzzing::ReplayOutcome, String>) -> Outcome {
    match r {
        Err(e) => Ok(sig(&e)),
        Ok(out) => {
            // More rows than the input has bits: the replay reader would slice and convert the
            // batch rows/batch_size times, each failing (a hang on a small file).
            if out.max_rows > len.saturating_mul(8).max(1 << 16) {
                return Err(format!("a batch of {} rows from a {len}-byte input", out.max_rows));
            }
            for (p, _) in &out.chunks {
                check_encoded(p.signal(), &p.encode_to_vec(), p.item_count())?;
            }
            let first = out.bad.first().cloned().unwrap_or_default();
            Ok(sig(&format!("ok{}|{}|{first}", bucket(out.chunks.len()), bucket(out.bad.len()))))
        }
    }
}

/// An Arrow IPC input (file or stream) of the replay receiver.
pub fn replay_arrow_ipc(data: &[u8]) -> Outcome {
    replay_outcome(data.len(), inferwatch_receivers::fuzzing::replay_arrow_ipc(data, 3))
}

/// A Parquet input of the replay receiver.
pub fn replay_parquet(data: &[u8]) -> Outcome {
    replay_outcome(data.len(), inferwatch_receivers::fuzzing::replay_parquet(data, 3))
}

/// `Retry-After` values and the three status classifications. Invariant: a parsed delay is
/// positive; 429 and 503 are retryable everywhere.
pub fn retry_after(data: &[u8]) -> Outcome {
    use inferwatch_exporters::{alertmanager, otlphttp, prometheusremotewrite::sender};
    let text = String::from_utf8_lossy(data);
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let d = otlphttp::parse_retry_after(&text, now);
    if d.is_some_and(|d| d.is_zero()) {
        return Err("a zero Retry-After was returned as a delay".into());
    }
    let status = text.get(..3).and_then(|s| s.parse::<u16>().ok()).unwrap_or(503);
    let classes = [
        otlphttp::classify(status, String::new(), d),
        alertmanager::classify(status, String::new(), d),
        sender::classify(status, String::new(), d),
    ];
    if matches!(status, 429 | 503) && classes.iter().any(|c| matches!(c, SendError::Permanent(_))) {
        return Err(format!("{status} classified as permanent"));
    }
    let kinds: String = classes.iter().map(|c| if matches!(c, SendError::Permanent(_)) { 'p' } else { 'r' }).collect();
    let form = if text.trim().parse::<u64>().is_ok() { "secs" } else { "date" };
    Ok(sig(&format!("{}|{form}|{status}|{kinds}", d.map(|d| bucket(d.as_secs() as usize)).unwrap_or(99))))
}

/// The signature of a send result: the variant and the message up to the URL.
fn send_sig(r: &Result<(), SendError>) -> u64 {
    match r {
        Ok(()) => 1,
        Err(SendError::Retryable { message, retry_after }) => {
            let head = message.split(" from ").next().unwrap_or_default();
            sig(&format!("retry|{}|{}", retry_after.is_some(), head.chars().take(40).collect::<String>()))
        }
        Err(SendError::Permanent(message)) => {
            let head = message.split(" from ").next().unwrap_or_default();
            sig(&format!("perm|{}", head.chars().take(40).collect::<String>()))
        }
    }
}

fn send_with(sender: &dyn Sender, payload: &Payload, response: &[u8]) -> Outcome {
    RawServer::get().set(response);
    let r = runtime().block_on(sender.send(payload));
    Ok(send_sig(&r))
}

fn one_span() -> Payload {
    Payload::Traces(crate::seeds::traces_small())
}

/// The otlphttp exporter's handling of a response (status, `Retry-After`, partial success in
/// protobuf or JSON, error bodies), from raw HTTP/1.1 bytes.
pub fn otlphttp_response(data: &[u8]) -> Outcome {
    static S: OnceLock<(inferwatch_exporters::otlphttp::HttpSender, Payload)> = OnceLock::new();
    let (s, p) = S.get_or_init(|| {
        let cfg = serde_json::json!({"endpoint": RawServer::get().url(), "timeout": "1s"});
        let c = inferwatch_exporters::OtlpHttpConfig::from_value(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let s = inferwatch_exporters::otlphttp::HttpSender::new("fuzz".into(), &c, Signal::Traces)
            .unwrap_or_else(|e| panic!("{e}"));
        (s, one_span())
    });
    send_with(s, p, data)
}

/// The alertmanager exporter's handling of a response.
pub fn alertmanager_response(data: &[u8]) -> Outcome {
    static S: OnceLock<(inferwatch_exporters::alertmanager::AlertmanagerSender, Payload)> = OnceLock::new();
    let (s, p) = S.get_or_init(|| {
        let cfg = serde_json::json!({"endpoint": RawServer::get().url(), "timeout": "1s"});
        let c = inferwatch_exporters::AlertmanagerConfig::from_value(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let s = inferwatch_exporters::alertmanager::AlertmanagerSender::new(&c).unwrap_or_else(|e| panic!("{e}"));
        (s, Payload::Logs(crate::seeds::alert_logs()))
    });
    send_with(s, p, data)
}

/// The prometheusremotewrite exporter's handling of a response.
pub fn remotewrite_response(data: &[u8]) -> Outcome {
    static S: OnceLock<(inferwatch_exporters::prometheusremotewrite::sender::RemoteWriteSender, Payload)> =
        OnceLock::new();
    let (s, p) = S.get_or_init(|| {
        let cfg = serde_json::json!({"endpoint": format!("{}/api/v1/write", RawServer::get().url()), "timeout": "1s"});
        let c = inferwatch_exporters::RemoteWriteConfig::from_value(&cfg).unwrap_or_else(|e| panic!("{e}"));
        (c.sender().unwrap_or_else(|e| panic!("{e}")), Payload::Metrics(crate::seeds::metrics_small()))
    });
    send_with(s, p, data)
}

/// A consumer that accepts everything and records what it got that does not decode.
#[derive(Default)]
struct Check {
    undecodable: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl inferwatch_core::consumer::Consumer for Check {
    async fn consume(&self, data: Payload) -> Result<(), inferwatch_core::consumer::ConsumeError> {
        let n = data.item_count();
        match data.into_decoded() {
            Err(e) => self.undecodable.lock().unwrap_or_else(|p| p.into_inner()).push(e.to_string()),
            Ok(p) if p.item_count() != n => self
                .undecodable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("counted {n}, holds {}", p.item_count())),
            Ok(_) => {}
        }
        Ok(())
    }
}

struct ReceiverHarness {
    rt: tokio::runtime::Runtime,
    base: String,
    client: reqwest::Client,
    check: Arc<Check>,
    _rx: inferwatch_receivers::otlp::OtlpReceiver,
}

fn receiver() -> &'static ReceiverHarness {
    static H: OnceLock<ReceiverHarness> = OnceLock::new();
    H.get_or_init(|| {
        use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let telemetry = Arc::new(inferwatch_core::telemetry::Telemetry::new());
        let id = ComponentId::parse("otlp").unwrap_or_else(|e| panic!("{e}"));
        let ctx = CreateContext::new(id, telemetry);
        let cfg = serde_json::json!({"protocols": {"http": {"endpoint": "127.0.0.1:0"}}});
        let cfg = inferwatch_receivers::otlp::config::OtlpConfig::from_value(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let mut rx = inferwatch_receivers::otlp::OtlpReceiver::new(ctx, cfg);
        let check = Arc::new(Check::default());
        let mut consumers = ReceiverConsumers::default();
        for s in Signal::ALL {
            consumers.set(s, check.clone());
        }
        rt.block_on(rx.start(consumers)).unwrap_or_else(|e| panic!("receiver start: {e}"));
        let addr = rx.local_addrs().http.unwrap_or_else(|| panic!("no http address"));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|e| panic!("client: {e}"));
        ReceiverHarness { rt, base: format!("http://{addr}"), client, check, _rx: rx }
    })
}

/// A protobuf request POSTed to a running OTLP/HTTP receiver: the path to the partial
/// rejection of items with invalid ids. Invariants: every request gets 2xx or 4xx; what was
/// forwarded decodes with the count it was forwarded with; a 200 carries a decodable response.
pub fn otlp_http_receiver(data: &[u8]) -> Outcome {
    let h = receiver();
    let signal = Signal::ALL
        .into_iter()
        .find(|s| matches!(wire::validate(*s, data), Ok(_) | Err(WireError::NeedsDecode)))
        .unwrap_or(Signal::Traces);
    let url = format!("{}/v1/{}", h.base, signal.as_str());
    let r = h.rt.block_on(async {
        let resp =
            h.client.post(url).header("content-type", "application/x-protobuf").body(data.to_vec()).send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        Ok::<_, reqwest::Error>((status, body))
    });
    let (status, body) = r.map_err(|e| format!("no answer: {e}"))?;
    if !(status.is_success() || status.is_client_error()) {
        return Err(format!("status {status}"));
    }
    let bad = std::mem::take(&mut *h.check.undecodable.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(b) = bad.first() {
        return Err(format!("forwarded data does not decode: {b}"));
    }
    let partial = if status.is_success() {
        let ok = match signal {
            Signal::Traces => ExportTraceServiceResponse::decode(body.as_ref()).map(|r| r.partial_success.is_some()),
            Signal::Metrics => ExportMetricsServiceResponse::decode(body.as_ref()).map(|r| r.partial_success.is_some()),
            Signal::Logs => ExportLogsServiceResponse::decode(body.as_ref()).map(|r| r.partial_success.is_some()),
        };
        ok.map_err(|e| format!("a 200 answer does not decode: {e}"))?
    } else {
        false
    };
    Ok(sig(&format!("{signal}|{}|{partial}", status.as_u16())))
}

/// Findings that are reported but do not fail the runs until the code they are in is fixed:
/// (target, text in the panic message, what it is). Remove an entry with the fix; its
/// minimised input stays in `corpus/<target>/` as the regression input.
pub const KNOWN: &[(&str, &str, &str)] = &[];

/// The note of a known finding of `target` with `message`, if it is one.
pub fn known(target: &str, message: &str) -> Option<&'static str> {
    KNOWN.iter().find(|(t, m, _)| *t == target && message.contains(m)).map(|(_, _, note)| *note)
}

/// JSON tokens.
pub const JSON_DICT: &[&[u8]] = &[
    b"\"resourceSpans\"",
    b"\"scopeSpans\"",
    b"\"spans\"",
    b"\"traceId\"",
    b"\"spanId\"",
    b"\"parentSpanId\"",
    b"\"attributes\"",
    b"\"key\"",
    b"\"value\"",
    b"\"stringValue\"",
    b"\"intValue\"",
    b"\"doubleValue\"",
    b"\"boolValue\"",
    b"\"arrayValue\"",
    b"\"kvlistValue\"",
    b"\"bytesValue\"",
    b"\"values\"",
    b"\"kind\"",
    b"\"SPAN_KIND_SERVER\"",
    b"\"status\"",
    b"\"code\"",
    b"\"resourceMetrics\"",
    b"\"scopeMetrics\"",
    b"\"metrics\"",
    b"\"sum\"",
    b"\"gauge\"",
    b"\"histogram\"",
    b"\"exponentialHistogram\"",
    b"\"summary\"",
    b"\"dataPoints\"",
    b"\"asInt\"",
    b"\"asDouble\"",
    b"\"bucketCounts\"",
    b"\"explicitBounds\"",
    b"\"exemplars\"",
    b"\"resourceLogs\"",
    b"\"scopeLogs\"",
    b"\"logRecords\"",
    b"\"body\"",
    b"\"severityNumber\"",
    b"\"timeUnixNano\"",
    b"\"startTimeUnixNano\"",
    b"\"model_id\"",
    b"null",
    b"true",
    b"false",
    b"{}",
    b"[]",
    b"\"\"",
    b":",
    b",",
    b"{",
    b"}",
    b"[",
    b"]",
    b"1e999",
    b"\"NaN\"",
    b"\"Infinity\"",
    b"-0",
    b"\"18446744073709551616\"",
    b"\"-1\"",
    b"\"5b8efff798038103d269b633813fc60c\"",
    b"\"eee19b7e\"",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
];

/// Prometheus text and OpenMetrics tokens.
pub const PROM_DICT: &[&[u8]] = &[
    b"# TYPE ",
    b"# HELP ",
    b"# UNIT ",
    b"# EOF\n",
    b" counter\n",
    b" gauge\n",
    b" histogram\n",
    b" summary\n",
    b" untyped\n",
    b" unknown\n",
    b" info\n",
    b" stateset\n",
    b" gaugehistogram\n",
    b"_total",
    b"_created",
    b"_bucket",
    b"_count",
    b"_sum",
    b"_info",
    b"{le=\"+Inf\"}",
    b"{le=\"0.5\"}",
    b"le",
    b"quantile",
    b"{",
    b"}",
    b"=",
    b",",
    b"\"",
    b"\\\"",
    b"\\n",
    b"\\\\",
    b" # {trace_id=\"abc\"} 1.0 1.5",
    b"NaN",
    b"+Inf",
    b"-Inf",
    b"\n",
    b" ",
    b"\t",
    b"1.7e9",
    b"1700000000000",
    b"vllm:",
    b"{__name__=\"x\"}",
    b"{job=\"j\",instance=\"i\"}",
];

/// YAML and configuration tokens.
pub const YAML_DICT: &[&[u8]] = &[
    b"receivers:",
    b"processors:",
    b"exporters:",
    b"connectors:",
    b"service:",
    b"pipelines:",
    b"extensions:",
    b"traces:",
    b"metrics:",
    b"logs:",
    b"otlp:",
    b"batch:",
    b"memory_limiter:",
    b"debug:",
    b"prometheus:",
    b"endpoint:",
    b"protocols:",
    b"grpc:",
    b"http:",
    b"&a ",
    b"*a",
    b"<<: ",
    b"!!str ",
    b"!!binary ",
    b"!!map ",
    b"!!int ",
    b"${env:X}",
    b"${X:-d}",
    b"${env:X:-${env:Y}}",
    b"$$",
    b"---\n",
    b"...\n",
    b"- ",
    b"[",
    b"]",
    b"{",
    b"}",
    b"|\n",
    b">-\n",
    b"? ",
    b": ",
    b"'",
    b"\"",
    b"#",
    b"~",
    b"null",
    b"0x1F",
    b"1e3",
    b"10s",
    b"1h",
    b"-1ms",
    b"  ",
    b"\n",
    b"\t",
    b"%YAML 1.2\n",
    b"!tag ",
];

/// HTTP response tokens.
pub const HTTP_DICT: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 429 Too Many Requests\r\n",
    b"HTTP/1.1 503 \r\n",
    b"HTTP/1.1 400 \r\n",
    b"HTTP/1.0 307 Temporary Redirect\r\n",
    b"HTTP/1.1 308 \r\n",
    b"Content-Length: ",
    b"Content-Length: 0\r\n",
    b"Content-Type: application/x-protobuf\r\n",
    b"Content-Type: application/json\r\n",
    b"Retry-After: ",
    b"Retry-After: 120\r\n",
    b"Retry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Encoding: gzip\r\n",
    b"Location: /v1/traces\r\n",
    b"Connection: close\r\n",
    b"\r\n",
    b"0\r\n\r\n",
    b"ffffffff\r\n",
    b"{\"partialSuccess\":{\"rejectedSpans\":\"3\",\"errorMessage\":\"x\"}}",
    b"18446744073709551616",
    b"\xff",
    b"\x00",
];

/// `Retry-After` tokens.
pub const RETRY_DICT: &[&[u8]] = &[
    b"Wed, 21 Oct 2015 07:28:00 GMT",
    b"Sun, 06 Nov 1994 08:49:37 GMT",
    b"Sunday, 06-Nov-94 08:49:37 GMT",
    b"Sun Nov  6 08:49:37 1994",
    b"Fri, 31 Dec 9999 23:59:59 GMT",
    b"18446744073709551615",
    b"-1",
    b"1.5",
    b" ",
    b"GMT",
    b"Feb 29",
    b"429",
    b"503",
    b"0",
];
