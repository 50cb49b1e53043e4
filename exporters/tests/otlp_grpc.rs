//! The `otlp` exporter against an in-process tonic OTLP server with scripted answers.

use crate::common;

use common::{PATIENCE, Pki, fast_retry, payload, start};
use inferwatch_core::consumer::{ConsumeError, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_exporters::OtlpExporterFactory;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use serde_json::json;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// What the server does with the next request.
enum Step {
    /// Partial success with this many items rejected.
    Partial(i64),
    /// Fail with this status.
    Fail(Status),
    /// Never answer.
    Hang,
}

/// One request as the server saw it.
struct Got {
    headers: http::HeaderMap,
    payload: Payload,
    at: Instant,
}

#[derive(Clone)]
struct Recorder {
    script: Arc<Mutex<VecDeque<Step>>>,
    tx: mpsc::UnboundedSender<Got>,
}

impl Recorder {
    /// Records the request and plays the next scripted step (success when the script is empty).
    async fn record(&self, md: &MetadataMap, payload: Payload) -> Result<Option<i64>, Status> {
        let _ = self.tx.send(Got { headers: md.clone().into_headers(), payload, at: Instant::now() });
        let step = self.script.lock().unwrap().pop_front();
        match step {
            None => Ok(None),
            Some(Step::Partial(n)) => Ok(Some(n)),
            Some(Step::Fail(s)) => Err(s),
            Some(Step::Hang) => std::future::pending().await,
        }
    }
}

#[async_trait::async_trait]
impl TraceService for Recorder {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let rejected = self.record(req.metadata(), Payload::Traces(req.get_ref().clone())).await?;
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: rejected
                .map(|n| ExportTracePartialSuccess { rejected_spans: n, error_message: "too old".into() }),
        }))
    }
}

#[async_trait::async_trait]
impl MetricsService for Recorder {
    async fn export(
        &self,
        req: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let rejected = self.record(req.metadata(), Payload::Metrics(req.get_ref().clone())).await?;
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success: rejected
                .map(|n| ExportMetricsPartialSuccess { rejected_data_points: n, error_message: "too old".into() }),
        }))
    }
}

#[async_trait::async_trait]
impl LogsService for Recorder {
    async fn export(
        &self,
        req: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let rejected = self.record(req.metadata(), Payload::Logs(req.get_ref().clone())).await?;
        Ok(Response::new(ExportLogsServiceResponse {
            partial_success: rejected
                .map(|n| ExportLogsPartialSuccess { rejected_log_records: n, error_message: "too old".into() }),
        }))
    }
}

/// A running test server.
struct TestServer {
    addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Step>>>,
    rx: mpsc::UnboundedReceiver<Got>,
}

impl TestServer {
    async fn start(tls: Option<ServerTlsConfig>) -> TestServer {
        let (tx, rx) = mpsc::unbounded_channel();
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let rec = Recorder { script: script.clone(), tx };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut b = Server::builder();
        if let Some(t) = tls {
            b = b.tls_config(t).unwrap();
        }
        let router = b
            .add_service(TraceServiceServer::new(rec.clone()).accept_compressed(CompressionEncoding::Gzip))
            .add_service(MetricsServiceServer::new(rec.clone()).accept_compressed(CompressionEncoding::Gzip))
            .add_service(LogsServiceServer::new(rec).accept_compressed(CompressionEncoding::Gzip));
        tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
        TestServer { addr, script, rx }
    }

    fn then(&self, step: Step) -> &Self {
        self.script.lock().unwrap().push_back(step);
        self
    }

    async fn next(&mut self) -> Got {
        tokio::time::timeout(PATIENCE, self.rx.recv()).await.expect("no request arrived").expect("server gone")
    }

    fn nothing_more(&mut self) {
        assert!(self.rx.try_recv().is_err(), "unexpected extra request");
    }
}

/// Settings for a plain-text exporter to `addr` that sends in the caller's task.
fn sync_cfg(addr: SocketAddr) -> serde_json::Value {
    json!({
        "endpoint": addr.to_string(),
        "tls": {"insecure": true},
        "sending_queue": {"enabled": false},
        "retry_on_failure": fast_retry(),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn delivers_every_signal_intact_with_headers_and_gzip() {
    let mut srv = TestServer::start(None).await;
    for signal in Signal::ALL {
        let cfg = json!({
            "endpoint": srv.addr.to_string(),
            "tls": {"insecure": true},
            "headers": {"X-Scope-OrgID": "tenant-7", "authorization": "Bearer s3cret"},
        });
        let e = start(&OtlpExporterFactory, cfg, signal).await;
        let sent = payload(signal, 3);
        e.node.consume(sent.clone()).await.unwrap();
        let got = srv.next().await;
        assert_eq!(got.payload, sent, "{signal}");
        let h = |k: &str| got.headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(h("x-scope-orgid").as_deref(), Some("tenant-7"));
        assert_eq!(h("authorization").as_deref(), Some("Bearer s3cret"));
        assert_eq!(h("grpc-encoding").as_deref(), Some("gzip"), "{:?}", got.headers);
        assert!(h("user-agent").unwrap_or_default().starts_with("inferwatch/"), "{:?}", got.headers);
        assert!(h("grpc-timeout").is_some(), "{:?}", got.headers);
        assert_eq!(e.stop().await, 0);
        assert_eq!(e.metrics.sent.get(), 3);
        assert_eq!(e.metrics.send_failed.get(), 0);
    }
    srv.nothing_more();
}

#[tokio::test(flavor = "multi_thread")]
async fn compression_none_sends_uncompressed() {
    let mut srv = TestServer::start(None).await;
    let mut cfg = sync_cfg(srv.addr);
    cfg["compression"] = json!("none");
    let e = start(&OtlpExporterFactory, cfg, Signal::Logs).await;
    e.node.consume(payload(Signal::Logs, 2)).await.unwrap();
    let got = srv.next().await;
    assert!(got.headers.get("grpc-encoding").is_none(), "{:?}", got.headers);
    assert_eq!(got.payload, payload(Signal::Logs, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn unavailable_is_retried_until_delivered() {
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Fail(Status::unavailable("warming up"))).then(Step::Fail(Status::unavailable("still warming up")));
    let e = start(&OtlpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 4)).await.unwrap();
    for _ in 0..3 {
        assert_eq!(srv.next().await.payload, payload(Signal::Traces, 4));
    }
    srv.nothing_more();
    assert_eq!(e.metrics.sent.get(), 4);
    assert_eq!(e.metrics.send_failed.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_argument_is_permanent_and_not_retried() {
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Fail(Status::invalid_argument("span has no trace id")));
    let e = start(&OtlpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    let r = e.node.consume(payload(Signal::Traces, 5)).await;
    match r {
        Err(ConsumeError::Permanent(m)) => assert!(m.contains("span has no trace id"), "{m}"),
        other => panic!("expected a permanent error, got {other:?}"),
    }
    srv.next().await;
    srv.nothing_more();
    assert_eq!(e.metrics.send_failed.get(), 5);
    assert_eq!(e.metrics.sent.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn resource_exhausted_without_retry_info_is_permanent() {
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Fail(Status::resource_exhausted("quota")));
    let e = start(&OtlpExporterFactory, sync_cfg(srv.addr), Signal::Metrics).await;
    let r = e.node.consume(payload(Signal::Metrics, 2)).await;
    assert!(matches!(r, Err(ConsumeError::Permanent(_))), "{r:?}");
    srv.next().await;
    srv.nothing_more();
    assert_eq!(e.metrics.send_failed.get(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn resource_exhausted_with_retry_info_waits_the_given_delay() {
    let delay = Duration::from_millis(400);
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Fail(Status::with_error_details(
        Code::ResourceExhausted,
        "memory limiter",
        ErrorDetails::with_retry_info(Some(delay)),
    )));
    let e = start(&OtlpExporterFactory, sync_cfg(srv.addr), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 1)).await.unwrap();
    let first = srv.next().await.at;
    let second = srv.next().await.at;
    // The retry interval is 1ms; only the server's RetryInfo explains this wait.
    assert!(second - first >= delay, "retried after {:?}", second - first);
    assert_eq!(e.metrics.sent.get(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_success_counts_as_sent() {
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Partial(1));
    let e = start(&OtlpExporterFactory, sync_cfg(srv.addr), Signal::Logs).await;
    e.node.consume(payload(Signal::Logs, 3)).await.unwrap();
    srv.next().await;
    srv.nothing_more();
    assert_eq!(e.metrics.sent.get(), 3);
    assert_eq!(e.metrics.send_failed.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_is_retryable() {
    let mut srv = TestServer::start(None).await;
    srv.then(Step::Hang);
    let mut cfg = sync_cfg(srv.addr);
    cfg["timeout"] = json!("200ms");
    let e = start(&OtlpExporterFactory, cfg, Signal::Traces).await;
    let t0 = Instant::now();
    e.node.consume(payload(Signal::Traces, 1)).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(200));
    srv.next().await;
    srv.next().await;
    assert_eq!(e.metrics.sent.get(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_down_endpoint_is_not_fatal_at_start() {
    // A port that was just free: nothing listens there.
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let mut cfg = sync_cfg(addr);
    cfg["retry_on_failure"] = json!({"enabled": false});
    let e = start(&OtlpExporterFactory, cfg, Signal::Traces).await;
    let r = e.node.consume(payload(Signal::Traces, 2)).await;
    assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::Downstream, .. })), "{r:?}");
    assert_eq!(e.metrics.send_failed.get(), 2);
}

#[test]
fn retry_info_round_trips_through_status() {
    let s = Status::with_error_details(
        Code::ResourceExhausted,
        "x",
        ErrorDetails::with_retry_info(Some(Duration::from_millis(250))),
    );
    assert_eq!(s.get_details_retry_info().and_then(|r| r.retry_delay), Some(Duration::from_millis(250)));
}

fn mtls_server_config(pki: &Pki) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server_cert_pem, &pki.server_key_pem))
        .client_ca_root(Certificate::from_pem(&pki.ca_pem))
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls() {
    let pki = Pki::generate("grpc-mtls");
    let mut srv = TestServer::start(Some(mtls_server_config(&pki))).await;
    let addr = srv.addr;
    let cfg = |tls: serde_json::Value| {
        json!({
            "endpoint": addr.to_string(),
            "tls": tls,
            "sending_queue": {"enabled": false},
            "retry_on_failure": {"enabled": false},
        })
    };
    let full =
        json!({"ca_file": pki.ca_file(), "cert_file": pki.client_cert_file(), "key_file": pki.client_key_file()});

    // CA + client certificate: delivered.
    let e = start(&OtlpExporterFactory, cfg(full.clone()), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 2)).await.unwrap();
    assert_eq!(srv.next().await.payload, payload(Signal::Traces, 2));

    // No client certificate: the server refuses the handshake.
    let e = start(&OtlpExporterFactory, cfg(json!({"ca_file": pki.ca_file()})), Signal::Traces).await;
    let r = e.node.consume(payload(Signal::Traces, 1)).await;
    // A TLS alert is a transport failure: retryable (retries are off here), not permanent. The
    // text depends on timing (the alert itself, or just "connection closed").
    assert!(matches!(r, Err(ConsumeError::Refused { reason: RefuseReason::Downstream, .. })), "{r:?}");

    // The certificate is checked against the expected name.
    let mut wrong = full.clone();
    wrong["server_name_override"] = json!("other.example");
    let e = start(&OtlpExporterFactory, cfg(wrong), Signal::Traces).await;
    let r = e.node.consume(payload(Signal::Traces, 1)).await;
    match r {
        Err(ConsumeError::Refused { message, .. }) => assert!(message.contains("other.example"), "{message}"),
        other => panic!("accepted a certificate for another name: {other:?}"),
    }
    let mut right = full.clone();
    right["server_name_override"] = json!("localhost");
    let e = start(&OtlpExporterFactory, cfg(right), Signal::Traces).await;
    e.node.consume(payload(Signal::Traces, 1)).await.unwrap();
    srv.next().await;

    // insecure_skip_verify: no CA needed, the client certificate still works.
    let skip =
        json!({"insecure_skip_verify": true, "cert_file": pki.client_cert_file(), "key_file": pki.client_key_file()});
    let e = start(&OtlpExporterFactory, cfg(skip), Signal::Metrics).await;
    e.node.consume(payload(Signal::Metrics, 1)).await.unwrap();
    assert_eq!(srv.next().await.payload, payload(Signal::Metrics, 1));
    srv.nothing_more();
}

#[tokio::test(flavor = "multi_thread")]
async fn plaintext_exporter_cannot_talk_to_a_tls_server() {
    let pki = Pki::generate("grpc-plain-vs-tls");
    let srv = TestServer::start(Some(mtls_server_config(&pki))).await;
    let mut cfg = sync_cfg(srv.addr);
    cfg["retry_on_failure"] = json!({"enabled": false});
    let e = start(&OtlpExporterFactory, cfg, Signal::Traces).await;
    assert!(e.node.consume(payload(Signal::Traces, 1)).await.is_err());
}
