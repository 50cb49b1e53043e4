//! `otlp-load sink`: an OTLP trace receiver (gRPC and HTTP) that counts spans and records
//! every `blast.seq`, standing in for the backend a collector exports to.
//!
//! It accepts gzip over both transports, answers `GET /stats` on the HTTP port with its
//! running totals, and on SIGTERM / SIGINT (or after `--idle-exit` without requests, counted
//! from the last request) prints its summary as JSON and writes the seqs it saw.

use crate::codec::{EXPORT_PATH, ServerCodec, TRACE_SERVICE};
use crate::procstat::{round1, round3};
use crate::scan::scan_traces;
use crate::seqset::{SeqBitmap, write_ranges};
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codec::{CompressionEncoding, EnabledCompressionEncodings};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// Options of `sink`.
#[derive(Debug, Clone)]
pub struct SinkOpts {
    /// OTLP/gRPC listen address.
    pub grpc: Option<SocketAddr>,
    /// OTLP/HTTP listen address.
    pub http: Option<SocketAddr>,
    /// Exit after this long without a request (once one has arrived).
    pub idle_exit: Option<Duration>,
    /// File to write the seqs seen to.
    pub seqs_out: Option<PathBuf>,
    /// Refuse every Nth export (UNAVAILABLE / 503), to exercise the sender's retries; 0: never.
    pub fail_every: u64,
}

/// Counters shared by both transports.
pub struct SinkState {
    start: Instant,
    fail_every: u64,
    export_calls: AtomicU64,
    refused: AtomicU64,
    requests: AtomicU64,
    spans: AtomicU64,
    unique: AtomicU64,
    duplicates: AtomicU64,
    no_seq: AtomicU64,
    bytes_decoded: AtomicU64,
    http_bytes_wire: AtomicU64,
    first_us: AtomicU64,
    last_us: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    encodings: Mutex<BTreeMap<String, u64>>,
    duplicate_samples: Mutex<Vec<u64>>,
    seqs: SeqBitmap,
}

fn bump(m: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
    match m.get_mut(key) {
        Some(v) => *v += 1,
        None => {
            m.insert(key.to_string(), 1);
        }
    }
}

impl SinkState {
    fn new(fail_every: u64) -> SinkState {
        SinkState {
            start: Instant::now(),
            fail_every,
            export_calls: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            spans: AtomicU64::new(0),
            unique: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            no_seq: AtomicU64::new(0),
            bytes_decoded: AtomicU64::new(0),
            http_bytes_wire: AtomicU64::new(0),
            first_us: AtomicU64::new(u64::MAX),
            last_us: AtomicU64::new(0),
            errors: Mutex::new(BTreeMap::new()),
            encodings: Mutex::new(BTreeMap::new()),
            duplicate_samples: Mutex::new(Vec::new()),
            seqs: SeqBitmap::default(),
        }
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// True when this export is to be refused (`--fail-every`).
    fn should_fail(&self) -> bool {
        let n = self.export_calls.fetch_add(1, Ordering::Relaxed) + 1;
        let fail = self.fail_every > 0 && n.is_multiple_of(self.fail_every);
        if fail {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        fail
    }

    fn error(&self, kind: &str) {
        bump(&self.errors, kind);
    }

    /// Counts the spans of one decoded request; `encoding` is e.g. `grpc:gzip`.
    fn record(&self, body: &[u8], encoding: &str) -> Result<u64, String> {
        let (mut dups, mut fresh, mut no_seq) = (0u64, 0u64, 0u64);
        let mut dup_samples = Vec::new();
        let res = scan_traces(body, |seq| match seq {
            Some(s) if self.seqs.insert(s) => fresh += 1,
            Some(s) => {
                dups += 1;
                if dup_samples.len() < 20 {
                    dup_samples.push(s);
                }
            }
            None => no_seq += 1,
        });
        // Whatever was read before a decode error still counts as seen.
        self.unique.fetch_add(fresh, Ordering::Relaxed);
        self.duplicates.fetch_add(dups, Ordering::Relaxed);
        self.no_seq.fetch_add(no_seq, Ordering::Relaxed);
        if !dup_samples.is_empty() {
            let mut v = self.duplicate_samples.lock().unwrap_or_else(|p| p.into_inner());
            let room = 20usize.saturating_sub(v.len());
            v.extend(dup_samples.into_iter().take(room));
        }
        let spans = res.map_err(|e| {
            self.error("decode");
            e.to_string()
        })?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.spans.fetch_add(spans, Ordering::Relaxed);
        self.bytes_decoded.fetch_add(body.len() as u64, Ordering::Relaxed);
        let now = self.now_us();
        self.first_us.fetch_min(now, Ordering::Relaxed);
        self.last_us.fetch_max(now, Ordering::Relaxed);
        bump(&self.encodings, encoding);
        Ok(spans)
    }

    /// Seconds since the last request, if any arrived.
    fn idle_for(&self) -> Option<Duration> {
        if self.requests.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let last = self.last_us.load(Ordering::Relaxed);
        Some(Duration::from_micros(self.now_us().saturating_sub(last)))
    }

    /// Running totals.
    pub fn stats(&self) -> Value {
        let spans = self.spans.load(Ordering::Relaxed);
        let first = self.first_us.load(Ordering::Relaxed);
        let last = self.last_us.load(Ordering::Relaxed);
        let active_s = if first == u64::MAX { 0.0 } else { last.saturating_sub(first) as f64 / 1e6 };
        let lock = |m: &Mutex<BTreeMap<String, u64>>| m.lock().unwrap_or_else(|p| p.into_inner()).clone();
        json!({
            "requests": self.requests.load(Ordering::Relaxed),
            "spans": spans,
            "unique_seqs": self.unique.load(Ordering::Relaxed),
            "duplicates": self.duplicates.load(Ordering::Relaxed),
            "duplicate_samples": *self.duplicate_samples.lock().unwrap_or_else(|p| p.into_inner()),
            "no_seq": self.no_seq.load(Ordering::Relaxed),
            "refused_fail_every": self.refused.load(Ordering::Relaxed),
            "errors": lock(&self.errors),
            "request_encodings": lock(&self.encodings),
            "bytes_decoded": self.bytes_decoded.load(Ordering::Relaxed),
            "http_bytes_wire": self.http_bytes_wire.load(Ordering::Relaxed),
            "active_s": round3(active_s),
            "spans_per_s_active": if active_s > 0.0 { Some(round1(spans as f64 / active_s)) } else { None },
            "uptime_s": round3(self.start.elapsed().as_secs_f64()),
        })
    }
}

/// The gRPC `TraceService`.
#[derive(Clone)]
struct GrpcSink(Arc<SinkState>);

impl NamedService for GrpcSink {
    const NAME: &'static str = TRACE_SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for GrpcSink {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let st = self.0.clone();
        if req.uri().path() != EXPORT_PATH {
            st.error("grpc:unknown_method");
            let m = req.uri().path().to_string();
            return Box::pin(async move { Ok(Status::unimplemented(format!("unknown method {m}")).into_http()) });
        }
        let encoding =
            req.headers().get("grpc-encoding").and_then(|v| v.to_str().ok()).unwrap_or("identity").to_ascii_lowercase();
        let mut accept = EnabledCompressionEncodings::default();
        accept.enable(CompressionEncoding::Gzip);
        let mut grpc = tonic::server::Grpc::new(ServerCodec)
            .apply_compression_config(accept, EnabledCompressionEncodings::default())
            .apply_max_message_size_config(Some(1 << 30), None);
        let call = ExportCall { st: st.clone(), encoding: format!("grpc:{encoding}") };
        Box::pin(async move {
            let resp = grpc.unary(call, req).await;
            // tonic answers INTERNAL itself when the framing or gzip is broken.
            if Status::from_header_map(resp.headers()).is_some_and(|s| s.code() == Code::Internal) {
                st.error("grpc:internal");
            }
            Ok(resp)
        })
    }
}

struct ExportCall {
    st: Arc<SinkState>,
    encoding: String,
}

impl tonic::server::UnaryService<Bytes> for ExportCall {
    type Response = ExportTraceServiceResponse;
    type Future = std::future::Ready<Result<tonic::Response<ExportTraceServiceResponse>, Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        if self.st.should_fail() {
            return std::future::ready(Err(Status::unavailable("sink refuses this export (--fail-every)")));
        }
        let r = match self.st.record(req.get_ref(), &self.encoding) {
            Ok(_) => Ok(tonic::Response::new(ExportTraceServiceResponse::default())),
            Err(e) => Err(Status::invalid_argument(e)),
        };
        std::future::ready(r)
    }
}

fn gunzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len().saturating_mul(6));
    flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out)?;
    Ok(out)
}

async fn http_traces(State(st): State<Arc<SinkState>>, headers: HeaderMap, body: Bytes) -> Response {
    if st.should_fail() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "sink refuses this export (--fail-every)",
        )
            .into_response();
    }
    st.http_bytes_wire.fetch_add(body.len() as u64, Ordering::Relaxed);
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !ct.contains("protobuf") {
        st.error("http:unsupported_content_type");
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("the sink takes application/x-protobuf, not {ct:?}"))
            .into_response();
    }
    let enc =
        headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("identity").to_ascii_lowercase();
    let decoded: Cow<'_, [u8]> = match enc.as_str() {
        "gzip" => match gunzip(&body) {
            Ok(v) => Cow::Owned(v),
            Err(e) => {
                st.error("http:gzip");
                return (StatusCode::BAD_REQUEST, format!("bad gzip: {e}")).into_response();
            }
        },
        "identity" | "" => Cow::Borrowed(&body[..]),
        other => {
            st.error("http:unsupported_encoding");
            return (StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("unsupported content-encoding {other:?}"))
                .into_response();
        }
    };
    match st.record(&decoded, &format!("http:{enc}")) {
        Ok(_) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-protobuf")], Bytes::new()).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn http_stats(State(st): State<Arc<SinkState>>) -> axum::Json<Value> {
    axum::Json(st.stats())
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Runs the sink until a signal or `--idle-exit`; returns the summary.
pub async fn run(opts: SinkOpts) -> anyhow::Result<Value> {
    anyhow::ensure!(opts.grpc.is_some() || opts.http.is_some(), "give --grpc and/or --http");
    let st = Arc::new(SinkState::new(opts.fail_every));
    let token = CancellationToken::new();
    let mut servers = Vec::new();
    if let Some(addr) = opts.grpc {
        let l = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding gRPC {addr}: {e}"))?;
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        let svc = GrpcSink(st.clone());
        let t = token.clone();
        servers.push(tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, t.cancelled_owned())
                .await;
            if let Err(e) = r {
                eprintln!("otlp-load sink: gRPC server: {e}");
            }
        }));
    }
    if let Some(addr) = opts.http {
        let l = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding HTTP {addr}: {e}"))?;
        let l = l.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let app = Router::new()
            .route("/v1/traces", post(http_traces))
            .route("/stats", get(http_stats))
            .layer(DefaultBodyLimit::disable())
            .with_state(st.clone());
        let t = token.clone();
        servers.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(l, app).with_graceful_shutdown(t.cancelled_owned()).await {
                eprintln!("otlp-load sink: HTTP server: {e}");
            }
        }));
    }
    eprintln!(
        "otlp-load sink: listening grpc={} http={}",
        opts.grpc.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
        opts.http.map(|a| a.to_string()).unwrap_or_else(|| "-".into())
    );
    let idle = {
        let st = st.clone();
        let limit = opts.idle_exit;
        async move {
            let Some(limit) = limit else { return std::future::pending::<&'static str>().await };
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if st.idle_for().is_some_and(|d| d >= limit) {
                    return "idle";
                }
            }
        }
    };
    let reason = tokio::select! {
        _ = terminated() => "signal",
        r = idle => r,
    };
    token.cancel();
    for s in servers {
        // Connections that stay open would hold a graceful shutdown; don't wait long for them.
        let _ = tokio::time::timeout(Duration::from_secs(2), s).await;
    }
    let mut out = st.stats();
    let ranges = st.seqs.ranges();
    if let Some(p) = &opts.seqs_out {
        write_ranges(p, &ranges).map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
    }
    out["seq_ranges"] = json!(ranges.len());
    out["seqs_out"] = json!(opts.seqs_out.as_ref().map(|p| p.display().to_string()));
    out["exit_reason"] = json!(reason);
    Ok(out)
}
