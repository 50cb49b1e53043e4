//! `otlp-load gen`: sends OTLP trace export requests over gRPC or HTTP and counts what the
//! receiver acknowledged.
//!
//! Each stream has its own connection and at most one request in flight. Without `--rate`
//! each stream sends its next request as soon as the previous one is answered (closed loop).
//! With `--rate R` the requests follow one shared schedule of `R / batch` requests per
//! second; a free stream takes the next slot and waits for its time, and a stream that falls
//! behind sends at once, so the rate is reached whenever enough streams are free.
//! Failed requests are counted, not retried (after a failure the stream pauses 10 ms).

use crate::codec::{ClientCodec, EXPORT_PATH};
use crate::procstat::{Watcher, round1, round3};
use crate::seqset::{Range, merge, write_ranges};
use crate::template::Template;
use bytes::{Bytes, BytesMut};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

/// Wire protocol of the export requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// OTLP/gRPC (`TraceService/Export`).
    Grpc,
    /// OTLP/HTTP with binary protobuf bodies (`POST /v1/traces`).
    Http,
}

/// Options of `gen`.
#[derive(Debug, Clone)]
pub struct GenOpts {
    /// Receiver URL: `http://127.0.0.1:4317` (gRPC) or `http://127.0.0.1:4318[/v1/traces]` (HTTP).
    pub endpoint: String,
    /// gRPC or HTTP.
    pub protocol: Protocol,
    /// Concurrent streams, each with its own connection.
    pub streams: usize,
    /// Spans per request.
    pub batch: usize,
    /// How long to start new requests.
    pub duration: Duration,
    /// Target spans per second over all streams; closed loop when `None`.
    pub rate: Option<f64>,
    /// Compress requests with gzip.
    pub gzip: bool,
    /// Per-request timeout.
    pub timeout: Duration,
    /// How long to keep trying to connect at start.
    pub connect_timeout: Duration,
    /// File to write the acknowledged seqs to.
    pub acked_out: Option<PathBuf>,
    /// Processes whose CPU and RSS to sample during the run.
    pub watch: Vec<u32>,
    /// First `blast.seq`.
    pub seq_start: u64,
}

/// What one stream saw.
#[derive(Default)]
struct StreamStats {
    requests_sent: u64,
    requests_ok: u64,
    spans_sent: u64,
    spans_acked: u64,
    spans_rejected: u64,
    errors: BTreeMap<String, u64>,
    error_samples: BTreeMap<String, String>,
    acked: Vec<Range>,
    latency_us: Vec<u32>,
}

/// State shared by the streams.
struct Shared {
    template: Template,
    seq: AtomicU64,
    slots: AtomicU64,
    start: Instant,
    end: Instant,
    interval_s: Option<f64>,
}

/// A failed export: (kind, message).
type Failure = (String, String);

enum Client {
    Grpc(tonic::client::Grpc<Channel>),
    Http { client: reqwest::Client, url: String, gzip: bool },
}

/// Adds `http://` when the endpoint has no scheme.
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") { endpoint.to_string() } else { format!("http://{endpoint}") }
}

/// The OTLP/HTTP traces URL: `/v1/traces` is appended when the endpoint has no path.
pub fn http_traces_url(endpoint: &str) -> String {
    let e = with_scheme(endpoint);
    let after_scheme = e.split_once("://").map(|(_, r)| r).unwrap_or(&e);
    match after_scheme.find('/') {
        Some(i) if after_scheme.len() > i + 1 => e,
        _ => format!("{}/v1/traces", e.trim_end_matches('/')),
    }
}

fn gzip_fast(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 4), flate2::Compression::fast());
    enc.write_all(data)?;
    enc.finish()
}

fn rejected(resp: &ExportTraceServiceResponse) -> u64 {
    resp.partial_success.as_ref().map(|p| p.rejected_spans.max(0) as u64).unwrap_or(0)
}

impl Client {
    async fn connect(opts: &GenOpts) -> anyhow::Result<Client> {
        match opts.protocol {
            Protocol::Grpc => {
                let ep = Endpoint::from_shared(with_scheme(&opts.endpoint))?
                    .tcp_nodelay(true)
                    .connect_timeout(Duration::from_secs(1));
                let deadline = Instant::now() + opts.connect_timeout;
                let channel = loop {
                    match ep.connect().await {
                        Ok(c) => break c,
                        Err(e) if Instant::now() >= deadline => {
                            anyhow::bail!("cannot connect to {}: {e}", opts.endpoint)
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                };
                let mut g = tonic::client::Grpc::new(channel)
                    .max_encoding_message_size(usize::MAX)
                    .max_decoding_message_size(64 << 20);
                if opts.gzip {
                    g = g.send_compressed(CompressionEncoding::Gzip);
                }
                Ok(Client::Grpc(g))
            }
            Protocol::Http => {
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .tcp_nodelay(true)
                    .http1_only()
                    .pool_max_idle_per_host(1)
                    .connect_timeout(Duration::from_secs(1))
                    .build()?;
                Ok(Client::Http { client, url: http_traces_url(&opts.endpoint), gzip: opts.gzip })
            }
        }
    }

    /// One export; the number of spans the receiver rejected in a partial success.
    async fn export(&mut self, body: Bytes) -> Result<u64, Failure> {
        match self {
            Client::Grpc(g) => {
                g.ready().await.map_err(|e| ("grpc:not_ready".to_string(), e.to_string()))?;
                let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
                match g.unary(tonic::Request::new(body), path, ClientCodec).await {
                    Ok(resp) => Ok(rejected(resp.get_ref())),
                    Err(st) => Err((format!("grpc:{:?}", st.code()), st.message().to_string())),
                }
            }
            Client::Http { client, url, gzip } => {
                let mut rb = client.post(url.as_str()).header(http::header::CONTENT_TYPE, "application/x-protobuf");
                let body = if *gzip {
                    rb = rb.header(http::header::CONTENT_ENCODING, "gzip");
                    Bytes::from(gzip_fast(&body).map_err(|e| ("gzip".to_string(), e.to_string()))?)
                } else {
                    body
                };
                let resp = rb.body(body).send().await.map_err(|e| {
                    let kind = if e.is_timeout() {
                        "timeout"
                    } else if e.is_connect() {
                        "http:connect"
                    } else {
                        "http:transport"
                    };
                    (kind.to_string(), e.to_string())
                })?;
                let status = resp.status();
                let bytes = resp.bytes().await.map_err(|e| ("http:body".to_string(), e.to_string()))?;
                if !status.is_success() {
                    let msg = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                    return Err((format!("http:{}", status.as_u16()), msg));
                }
                // A JSON or empty answer carries no partial success we can read; count it as full.
                Ok(ExportTraceServiceResponse::decode(bytes).map(|r| rejected(&r)).unwrap_or(0))
            }
        }
    }
}

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

async fn run_stream(idx: usize, mut client: Client, sh: Arc<Shared>, opts: Arc<GenOpts>) -> StreamStats {
    let mut st = StreamStats::default();
    let batch = opts.batch as u64;
    loop {
        if let Some(iv) = sh.interval_s {
            let k = sh.slots.fetch_add(1, Ordering::Relaxed);
            let at = sh.start + Duration::from_secs_f64(iv * k as f64);
            if at >= sh.end {
                break;
            }
            tokio::time::sleep_until(at).await;
        } else if Instant::now() >= sh.end {
            break;
        }
        let first = sh.seq.fetch_add(batch, Ordering::Relaxed);
        let mut buf = BytesMut::with_capacity(sh.template.encoded_len(idx, first, opts.batch));
        sh.template.encode(idx, first, opts.batch, now_unix_ns(), &mut buf);
        st.requests_sent += 1;
        st.spans_sent += batch;
        let t0 = Instant::now();
        let outcome = match tokio::time::timeout(opts.timeout, client.export(buf.freeze())).await {
            Ok(r) => r,
            Err(_) => Err(("timeout".to_string(), format!("no answer within {:?}", opts.timeout))),
        };
        st.latency_us.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        match outcome {
            Ok(0) => {
                st.requests_ok += 1;
                st.spans_acked += batch;
                match st.acked.last_mut() {
                    Some((_, last)) if *last + 1 == first => *last = first + batch - 1,
                    _ => st.acked.push((first, first + batch - 1)),
                }
            }
            Ok(rej) => {
                // Which spans were refused is not known, so none of this request's seqs are listed.
                st.requests_ok += 1;
                st.spans_rejected += rej.min(batch);
                st.spans_acked += batch - rej.min(batch);
            }
            Err((kind, msg)) => {
                *st.errors.entry(kind.clone()).or_insert(0) += 1;
                st.error_samples.entry(kind).or_insert(msg);
                if sh.interval_s.is_none() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    st
}

fn percentile_ms(sorted_us: &[u32], p: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let i = ((sorted_us.len() as f64 * p).ceil() as usize).clamp(1, sorted_us.len()) - 1;
    Some(round3(sorted_us[i] as f64 / 1000.0))
}

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_unix_ns());
    h.write_u32(std::process::id());
    h.finish()
}

/// Runs the load and returns the summary.
pub async fn run(opts: GenOpts) -> anyhow::Result<Value> {
    anyhow::ensure!(opts.streams > 0, "--streams must be at least 1");
    anyhow::ensure!(opts.batch > 0, "--batch must be at least 1");
    // Span ids are `salt ^ (seq + 1)` with the salt's top bit set: seqs stay below 2^62.
    anyhow::ensure!(opts.seq_start < 1 << 62, "--seq-start must be below 2^62");
    if let Some(r) = opts.rate {
        anyhow::ensure!(r.is_finite() && r > 0.0, "--rate must be a positive number of spans per second");
    }
    let opts = Arc::new(opts);
    let mut clients = Vec::with_capacity(opts.streams);
    for _ in 0..opts.streams {
        clients.push(Client::connect(&opts).await?);
    }
    let template = Template::new(opts.streams, random_u64(), random_u64());
    let bytes_per_request = template.encoded_len(0, opts.seq_start, opts.batch);
    let watcher = Watcher::start(&opts.watch);
    let start = Instant::now();
    let shared = Arc::new(Shared {
        template,
        seq: AtomicU64::new(opts.seq_start),
        slots: AtomicU64::new(0),
        start,
        end: start + opts.duration,
        interval_s: opts.rate.map(|r| opts.batch as f64 / r),
    });
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(run_stream(i, c, shared.clone(), opts.clone())))
        .collect();
    let mut all = StreamStats::default();
    let mut panics = 0u64;
    for t in tasks {
        let Ok(s) = t.await else {
            panics += 1;
            continue;
        };
        all.requests_sent += s.requests_sent;
        all.requests_ok += s.requests_ok;
        all.spans_sent += s.spans_sent;
        all.spans_acked += s.spans_acked;
        all.spans_rejected += s.spans_rejected;
        for (k, v) in s.errors {
            *all.errors.entry(k).or_insert(0) += v;
        }
        for (k, v) in s.error_samples {
            all.error_samples.entry(k).or_insert(v);
        }
        all.acked.extend(s.acked);
        all.latency_us.extend(s.latency_us);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let watch = watcher.stop();
    if panics > 0 {
        all.errors.insert("stream_panicked".into(), panics);
    }
    let acked = merge(all.acked);
    if let Some(p) = &opts.acked_out {
        write_ranges(p, &acked).map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
    }
    all.latency_us.sort_unstable();
    let lat = &all.latency_us;
    let n_err: u64 = all.errors.values().sum();
    let spans_per_s = all.spans_acked as f64 / elapsed.max(1e-9);
    Ok(json!({
        "protocol": match opts.protocol { Protocol::Grpc => "grpc", Protocol::Http => "http" },
        "endpoint": opts.endpoint,
        "streams": opts.streams,
        "batch": opts.batch,
        "gzip": opts.gzip,
        "duration_s": opts.duration.as_secs_f64(),
        "rate_target": opts.rate,
        "rate_reached": opts.rate.map(|r| spans_per_s >= 0.97 * r),
        "requests_sent": all.requests_sent,
        "requests_ok": all.requests_ok,
        "requests_failed": n_err,
        "spans_sent": all.spans_sent,
        "spans_acked": all.spans_acked,
        "spans_rejected_partial": all.spans_rejected,
        "errors": all.errors,
        "error_samples": all.error_samples,
        "elapsed_s": round3(elapsed),
        "spans_per_s": round1(spans_per_s),
        "requests_per_s": round1(all.requests_ok as f64 / elapsed.max(1e-9)),
        "bytes_per_request": bytes_per_request,
        "latency_ms": {
            "p50": percentile_ms(lat, 0.50),
            "p90": percentile_ms(lat, 0.90),
            "p99": percentile_ms(lat, 0.99),
            "max": lat.last().map(|v| round3(*v as f64 / 1000.0)),
        },
        "exact_check": n_err == 0 && all.spans_rejected == 0,
        "seq_first": opts.seq_start,
        "seq_next": shared.seq.load(Ordering::Relaxed),
        "acked_ranges": acked.len(),
        "acked_out": opts.acked_out.as_ref().map(|p| p.display().to_string()),
        "watch": watch,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url() {
        assert_eq!(http_traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("http://h:1/custom/path"), "http://h:1/custom/path");
    }

    #[test]
    fn percentiles() {
        let v: Vec<u32> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.5), Some(50.0));
        assert_eq!(percentile_ms(&v, 0.99), Some(99.0));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }
}
