//! The `otlphttp` exporter against an in-process axum OTLP/HTTP server with scripted answers.

use crate::common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use common::{PATIENCE, Pki, fast_retry, payload, start};
use inferwatch_core::consumer::{ConsumeError, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_exporters::OtlpHttpExporterFactory;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A scripted answer.
enum Reply {
    /// Status, headers and body.
    With(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// Never answer.
    Hang,
}

/// One request as the server saw it.
struct Got {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    at: Instant,
}

impl Got {
    fn header(&self, k: &str) -> Option<&str> {
        self.headers.get(k).and_then(|v| v.to_str().ok())
    }

    /// Decodes the body as the exporter claims it is encoded.
    fn payload(&self, signal: Signal) -> Payload {
        let raw = match self.header("content-encoding") {
            Some("gzip") => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&self.body[..]).read_to_end(&mut out).unwrap();
                out
            }
            None => self.body.clone(),
            Some(other) => panic!("unexpected content-encoding {other}"),
        };
        match (self.header("content-type"), signal) {
            (Some("application/x-protobuf"), Signal::Traces) => {
                Payload::Traces(ExportTraceServiceRequest::decode(&raw[..]).unwrap())
            }
            (Some("application/x-protobuf"), Signal::Metrics) => {
                Payload::Metrics(ExportMetricsServiceRequest::decode(&raw[..]).unwrap())
            }
            (Some("application/x-protobuf"), Signal::Logs) => {
                Payload::Logs(ExportLogsServiceRequest::decode(&raw[..]).unwrap())
            }
            (Some("application/json"), Signal::Traces) => Payload::Traces(serde_json::from_slice(&raw).unwrap()),
            (Some("application/json"), Signal::Metrics) => Payload::Metrics(serde_json::from_slice(&raw).unwrap()),
            (Some("application/json"), Signal::Logs) => Payload::Logs(serde_json::from_slice(&raw).unwrap()),
            (ct, _) => panic!("unexpected content-type {ct:?}"),
        }
    }
}

#[derive(Clone)]
struct Shared {
    script: Arc<Mutex<VecDeque<Reply>>>,
    tx: mpsc::UnboundedSender<Got>,
}

async fn handle(State(st): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> axum::response::Response {
    let _ = st.tx.send(Got { path: uri.path().to_string(), headers, body: body.to_vec(), at: Instant::now() });
    let reply = st.script.lock().unwrap().pop_front();
    let (status, hdrs, body) = match reply {
        None => (200, vec![("content-type", "application/x-protobuf".to_string())], Vec::new()),
        Some(Reply::With(s, h, b)) => (s, h, b),
        Some(Reply::Hang) => std::future::pending().await,
    };
    let mut r = axum::http::Response::builder().status(status);
    for (k, v) in hdrs {
        r = r.header(k, v);
    }
    r.body(Body::from(body)).unwrap()
}

/// A running test server.
struct TestServer {
    addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Reply>>>,
    rx: mpsc::UnboundedReceiver<Got>,
}

impl TestServer {
    fn router() -> (Router, Arc<Mutex<VecDeque<Reply>>>, mpsc::UnboundedReceiver<Got>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let app = Router::new().fallback(handle).with_state(Shared { script: script.clone(), tx });
        (app, script, rx)
    }

    async fn start() -> TestServer {
        let (app, script, rx) = Self::router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestServer { addr, script, rx }
    }

    /// An HTTPS server (h2 and HTTP/1.1) that requires a client certificate signed by the test CA.
    async fn start_mtls(pki: &Pki) -> TestServer {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use rustls::server::WebPkiClientVerifier;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap()).unwrap();
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
        let chain =
            CertificateDer::pem_slice_iter(pki.server_cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_slice(pki.server_key_pem.as_bytes()).unwrap();
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));

        let (app, script, rx) = Self::router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // Handshake failures (no client certificate) just close the connection.
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let svc = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TestServer { addr, script, rx }
    }

    fn then(&self, r: Reply) -> &Self {
        self.script.lock().unwrap().push_back(r);
        self
    }

    async fn next(&mut self) -> Got {
        tokio::time::timeout(PATIENCE, self.rx.recv()).await.expect("no request arrived").expect("server gone")
    }

    fn nothing_more(&mut self) {
        assert!(self.rx.try_recv().is_err(), "unexpected extra request");
    }
}

/// Settings for an exporter to `addr` that sends in the caller's task with fast retries.
fn sync_cfg(addr: SocketAddr) -> serde_json::Value {
    json!({
        "endpoint": format!("http://{addr}"),
        "sending_queue": {"enabled": false},
        "retry_on_failure": fast_retry(),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn protobuf_gzip_for_every_signal_with_headers() {
    let mut srv = TestServer::start().await;
    for signal in Signal::ALL {
        let cfg = json!({"endpoint": format!("http://{}/otlp/", srv.addr), "headers": {"X-Scope-OrgID": "tenant-7"}});
        let e = start(&OtlpHttpExporterFactory, cfg, signal).await;
        let sent = payload(signal, 3);
        e.node.consume(sent.clone()).await.unwrap();
        let got = srv.next().await;
        assert_eq!(got.path, format!("/otlp/v1/{signal}"));
        assert_eq!(got.header("content-type"), Some("application/x-protobuf"));
        assert_eq!(got.header("content-encoding"), Some("gzip"));
        assert_eq!(got.header("x-scope-orgid"), Some("tenant-7"));
        assert!(got.header("user-agent").unwrap_or_default().starts_with("inferwatch/"));
        assert_eq!(got.payload(signal), sent);
        assert_eq!(e.stop().await, 0);
        assert_eq!(e.metrics.sent.get(), 3);
    }
    srv.nothing_more();
}

#[tokio::test(flavor = "multi_thread")]
async fn json_encoding_decodes_to_what_was_sent() {
    let mut srv = TestServer::start().await;
    for signal in Signal::ALL {
        let mut cfg = sync_cfg(srv.addr);
        cfg["encoding"] = json!("json");
        cfg["compression"] = json!("none");
        let e = start(&OtlpHttpExporterFactory, cfg, signal).await;
        let sent = payload(signal, 2);
        e.node.consume(sent.clone()).await.unwrap();
        let got = srv.next().await;
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(got.header("content-encoding"), None);
        assert_eq!(got.payload(signal), sent);
        if signal == Signal::Traces {
            // OTLP/JSON: camelCase keys and hex ids.
            let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
            assert_eq!(v["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"], "5a".repeat(16));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn service_unavailable_honours_retry_after() {
    let mut srv = TestServer::start().await;
    srv.then(Reply::With(503, vec![("retry-after", "1".into())], b"overloaded".to_vec()));
    let e = start(&OtlpHttpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 2)).await.unwrap();
    let first = srv.next().await.at;
    let second = srv.next().await;
    // The retry interval is 1ms; only Retry-After explains this wait.
    assert!(second.at - first >= Duration::from_secs(1), "retried after {:?}", second.at - first);
    assert_eq!(second.payload(Signal::Traces), payload(Signal::Traces, 2));
    srv.nothing_more();
    assert_eq!(e.metrics.sent.get(), 2);
    assert_eq!(e.metrics.send_failed.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn retryable_statuses_without_retry_after_back_off() {
    let mut srv = TestServer::start().await;
    srv.then(Reply::With(429, vec![], vec![])).then(Reply::With(502, vec![], vec![])).then(Reply::With(
        504,
        vec![],
        vec![],
    ));
    let e = start(&OtlpHttpExporterFactory, sync_cfg(srv.addr), Signal::Logs).await;
    e.node.consume(payload(Signal::Logs, 1)).await.unwrap();
    for _ in 0..4 {
        srv.next().await;
    }
    srv.nothing_more();
    assert_eq!(e.metrics.sent.get(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_request_is_permanent() {
    let mut srv = TestServer::start().await;
    let status = json!({"code": 3, "message": "invalid span kind"}).to_string().into_bytes();
    srv.then(Reply::With(400, vec![("content-type", "application/json".into())], status));
    let e = start(&OtlpHttpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    match e.node.consume(payload(Signal::Traces, 4)).await {
        Err(ConsumeError::Permanent(m)) => {
            assert!(m.contains("400") && m.contains("invalid span kind"), "{m}")
        }
        other => panic!("expected a permanent error, got {other:?}"),
    }
    srv.next().await;
    srv.nothing_more();
    assert_eq!(e.metrics.send_failed.get(), 4);
    assert_eq!(e.metrics.sent.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_error_500_is_permanent() {
    let mut srv = TestServer::start().await;
    srv.then(Reply::With(500, vec![], b"boom".to_vec()));
    let e = start(&OtlpHttpExporterFactory, sync_cfg(srv.addr), Signal::Metrics).await;
    assert!(matches!(e.node.consume(payload(Signal::Metrics, 1)).await, Err(ConsumeError::Permanent(_))));
    srv.next().await;
    srv.nothing_more();
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_success_counts_as_sent() {
    let mut srv = TestServer::start().await;
    let body = ExportTraceServiceResponse {
        partial_success: Some(ExportTracePartialSuccess { rejected_spans: 1, error_message: "too old".into() }),
    }
    .encode_to_vec();
    srv.then(Reply::With(200, vec![("content-type", "application/x-protobuf".into())], body));
    let e = start(&OtlpHttpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 3)).await.unwrap();
    srv.next().await;
    srv.nothing_more();
    assert_eq!(e.metrics.sent.get(), 3);
    assert_eq!(e.metrics.send_failed.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn signal_endpoint_overrides_the_base() {
    let mut srv = TestServer::start().await;
    let mut cfg = sync_cfg(srv.addr);
    cfg["traces_endpoint"] = json!(format!("http://{}/custom/traces", srv.addr));
    let e = start(&OtlpHttpExporterFactory, cfg.clone(), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 1)).await.unwrap();
    assert_eq!(srv.next().await.path, "/custom/traces");
    let e = start(&OtlpHttpExporterFactory, cfg, Signal::Logs).await;
    e.node.consume(payload(Signal::Logs, 1)).await.unwrap();
    assert_eq!(srv.next().await.path, "/v1/logs");
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_and_refused_connections_are_retryable() {
    let mut srv = TestServer::start().await;
    srv.then(Reply::Hang);
    let mut cfg = sync_cfg(srv.addr);
    cfg["timeout"] = json!("200ms");
    let e = start(&OtlpHttpExporterFactory, cfg, Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 1)).await.unwrap();
    srv.next().await;
    srv.next().await;
    assert_eq!(e.metrics.sent.get(), 1);

    let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let mut cfg = sync_cfg(addr);
    cfg["retry_on_failure"] = json!({"enabled": false});
    let e = start(&OtlpHttpExporterFactory, cfg, Signal::Traces).await;
    let r = e.node.consume(payload(Signal::Traces, 2)).await;
    assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::Downstream, .. })), "{r:?}");
    assert_eq!(e.metrics.send_failed.get(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls() {
    let pki = Pki::generate("http-mtls");
    let mut srv = TestServer::start_mtls(&pki).await;
    let addr = srv.addr;
    let cfg = |tls: serde_json::Value| {
        json!({
            "endpoint": format!("https://{addr}"),
            "tls": tls,
            "sending_queue": {"enabled": false},
            "retry_on_failure": {"enabled": false},
        })
    };
    let full =
        json!({"ca_file": pki.ca_file(), "cert_file": pki.client_cert_file(), "key_file": pki.client_key_file()});

    let e = start(&OtlpHttpExporterFactory, cfg(full.clone()), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 2)).await.unwrap();
    let got = srv.next().await;
    assert_eq!(got.payload(Signal::Traces), payload(Signal::Traces, 2));

    // Without a client certificate the server ends the handshake: a retryable transport error.
    let e = start(&OtlpHttpExporterFactory, cfg(json!({"ca_file": pki.ca_file()})), Signal::Traces).await;
    match e.node.consume(payload(Signal::Traces, 1)).await {
        // TLS 1.3: the alert arrives after the client's side of the handshake, so hyper reports
        // only a closed connection.
        Err(ConsumeError::Refused { reason: RefuseReason::Downstream, .. }) => {}
        other => panic!("delivered without a client certificate: {other:?}"),
    }

    // The server certificate is checked against the expected name.
    let mut wrong = full.clone();
    wrong["server_name_override"] = json!("other.example");
    let e = start(&OtlpHttpExporterFactory, cfg(wrong), Signal::Traces).await;
    match e.node.consume(payload(Signal::Traces, 1)).await {
        Err(ConsumeError::Refused { message, .. }) => assert!(message.contains("other.example"), "{message}"),
        other => panic!("accepted a certificate for another name: {other:?}"),
    }

    // insecure_skip_verify: no CA needed, the client certificate still works.
    let skip =
        json!({"insecure_skip_verify": true, "cert_file": pki.client_cert_file(), "key_file": pki.client_key_file()});
    let e = start(&OtlpHttpExporterFactory, cfg(skip), Signal::Logs).await;
    e.node.consume(payload(Signal::Logs, 1)).await.unwrap();
    assert_eq!(srv.next().await.payload(Signal::Logs), payload(Signal::Logs, 1));
    srv.nothing_more();
}

/// Counts the encodes of the sender it wraps.
struct Counting {
    inner: inferwatch_exporters::otlphttp::HttpSender,
    encodes: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl inferwatch_core::exporterhelper::RequestSender for Counting {
    type Request =
        <inferwatch_exporters::otlphttp::HttpSender as inferwatch_core::exporterhelper::RequestSender>::Request;
    fn encode(&self, data: &Payload) -> Result<Self::Request, inferwatch_core::exporterhelper::SendError> {
        self.encodes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.encode(data)
    }
    async fn send(&self, r: &Self::Request) -> Result<(), inferwatch_core::exporterhelper::SendError> {
        inferwatch_core::exporterhelper::RequestSender::send(&self.inner, r).await
    }
}

/// Encode-once: a retried request is the bytes built for the first attempt, not a re-encode.
#[tokio::test(flavor = "multi_thread")]
async fn retries_resend_the_bytes_encoded_once() {
    use inferwatch_core::exporterhelper::QueuedExporter;
    use inferwatch_core::settings::{QueueSettings, RetrySettings};
    let mut srv = TestServer::start().await;
    srv.then(Reply::With(503, vec![], vec![])).then(Reply::With(429, vec![], vec![]));
    let c = inferwatch_exporters::OtlpHttpConfig::from_value(&sync_cfg(srv.addr)).unwrap();
    let inner = inferwatch_exporters::otlphttp::HttpSender::new("otlphttp".into(), &c, Signal::Traces).unwrap();
    let sender = Arc::new(Counting { inner, encodes: Default::default() });
    let telemetry = inferwatch_core::telemetry::Telemetry::new();
    let id = inferwatch_core::ComponentId::parse("otlphttp").unwrap();
    let metrics = telemetry.exporter(&id, Signal::Traces);
    let retry: RetrySettings = serde_json::from_value(fast_retry()).unwrap();
    let queue = QueueSettings { enabled: false, ..QueueSettings::default() };
    let e = QueuedExporter::new("otlphttp".into(), Signal::Traces, sender.clone(), metrics.clone(), queue, retry);
    let sent = payload(Signal::Traces, 3);
    inferwatch_core::Consumer::consume(&e, sent.clone()).await.unwrap();
    let (a, b, c) = (srv.next().await, srv.next().await, srv.next().await);
    srv.nothing_more();
    assert_eq!(sender.encodes.load(std::sync::atomic::Ordering::SeqCst), 1, "encoded once for three attempts");
    assert_eq!(a.body, b.body, "the retry after 503 sent the first attempt's bytes");
    assert_eq!(b.body, c.body, "the retry after 429 sent them again");
    assert_eq!(c.header("content-encoding"), Some("gzip"));
    assert_eq!(c.payload(Signal::Traces), sent);
    assert_eq!(metrics.sent.get(), 3);
}
