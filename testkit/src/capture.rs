//! An OTLP capture server for tests: gRPC ([`grpc`]) or HTTP ([`http`]: protobuf or JSON, gzip
//! or not) on 127.0.0.1, keeping every export request it receives. Tests wait for what they
//! expect with [`Captured::wait_for`], woken by each request (no polling sleeps).

use crate::otlp;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

/// The most [`Captured::wait_for`] waits before failing the test.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Every export request received, by signal, in arrival order.
#[derive(Debug, Default)]
pub struct Captured {
    traces: Mutex<Vec<ExportTraceServiceRequest>>,
    metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
    logs: Mutex<Vec<ExportLogsServiceRequest>>,
    arrived: Notify,
}

impl Captured {
    /// The trace requests so far.
    pub fn traces(&self) -> Vec<ExportTraceServiceRequest> {
        self.traces.lock().clone()
    }

    /// The metric requests so far.
    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        self.metrics.lock().clone()
    }

    /// The log requests so far.
    pub fn logs(&self) -> Vec<ExportLogsServiceRequest> {
        self.logs.lock().clone()
    }

    /// Every span so far with its resource attributes and scope name.
    pub fn spans(&self) -> Vec<(Vec<KeyValue>, String, Span)> {
        self.traces.lock().iter().flat_map(otlp::spans_of).collect()
    }

    /// Waits until `check` gives `Some` (checked now and after each request that arrives) and
    /// returns it; fails the test after [`DEADLINE`] naming `what`.
    pub async fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Captured) -> Option<T>) -> T {
        wait_notified(&self.arrived, what, || check(self)).await
    }

    /// Waits until `check` holds (see [`Captured::wait_for`]).
    pub async fn wait_until(&self, what: &str, mut check: impl FnMut(&Captured) -> bool) {
        self.wait_for(what, |c| check(c).then_some(())).await
    }

    /// Waits for at least `n` spans and returns them all.
    pub async fn wait_spans(&self, n: usize) -> Vec<(Vec<KeyValue>, String, Span)> {
        self.wait_for(&format!("{n} spans"), |c| {
            let s = c.spans();
            (s.len() >= n).then_some(s)
        })
        .await
    }

    fn push_traces(&self, r: ExportTraceServiceRequest) {
        self.traces.lock().push(r);
        self.arrived.notify_waiters();
    }

    fn push_metrics(&self, r: ExportMetricsServiceRequest) {
        self.metrics.lock().push(r);
        self.arrived.notify_waiters();
    }

    fn push_logs(&self, r: ExportLogsServiceRequest) {
        self.logs.lock().push(r);
        self.arrived.notify_waiters();
    }
}

/// Waits until `check` gives `Some`, checking now and after each `notify_waiters` of `arrived`;
/// fails the test after [`DEADLINE`] naming `what`.
pub(crate) async fn wait_notified<T>(arrived: &Notify, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let notified = arrived.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the check, so an arrival between the check and the wait wakes it.
        notified.as_mut().enable();
        if let Some(v) = check() {
            return v;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            panic!("timed out after {DEADLINE:?} waiting for {what}");
        }
    }
}

#[derive(Clone)]
struct Svc(Arc<Captured>);

#[tonic::async_trait]
impl TraceService for Svc {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.0.push_traces(req.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Svc {
    async fn export(
        &self,
        req: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.0.push_metrics(req.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Svc {
    async fn export(
        &self,
        req: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.0.push_logs(req.into_inner());
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    (listener, addr)
}

/// Starts an OTLP/gRPC capture server (traces, metrics, logs; gzip accepted) on 127.0.0.1.
pub async fn grpc() -> (SocketAddr, Arc<Captured>) {
    let captured = Arc::new(Captured::default());
    let svc = Svc(captured.clone());
    let (listener, addr) = listen().await;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(svc.clone()).accept_compressed(CompressionEncoding::Gzip))
            .add_service(MetricsServiceServer::new(svc.clone()).accept_compressed(CompressionEncoding::Gzip))
            .add_service(LogsServiceServer::new(svc).accept_compressed(CompressionEncoding::Gzip))
            .serve_with_incoming(incoming)
            .await;
    });
    (addr, captured)
}

/// The body, gunzipped when `content-encoding: gzip`.
fn body(headers: &HeaderMap, b: &Bytes) -> Vec<u8> {
    if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&b[..]).read_to_end(&mut out).expect("a gzip body");
        out
    } else {
        b.to_vec()
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"))
}

/// Decodes an OTLP/HTTP request body as protobuf or, by its content type, JSON.
fn decode<T: Message + Default + serde::de::DeserializeOwned>(headers: &HeaderMap, b: &Bytes) -> T {
    let raw = body(headers, b);
    if is_json(headers) {
        serde_json::from_slice(&raw).expect("an OTLP/JSON body")
    } else {
        T::decode(&raw[..]).expect("an OTLP/protobuf body")
    }
}

/// The (empty) response in the request's encoding.
fn answer<T: Message + Default + serde::Serialize>(
    headers: &HeaderMap,
) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    if is_json(headers) {
        ([("content-type", "application/json")], serde_json::to_vec(&T::default()).expect("JSON"))
    } else {
        ([("content-type", "application/x-protobuf")], T::default().encode_to_vec())
    }
}

type Answer = ([(&'static str, &'static str); 1], Vec<u8>);

async fn http_traces(State(c): State<Arc<Captured>>, h: HeaderMap, b: Bytes) -> Answer {
    c.push_traces(decode(&h, &b));
    answer::<ExportTraceServiceResponse>(&h)
}

async fn http_metrics(State(c): State<Arc<Captured>>, h: HeaderMap, b: Bytes) -> Answer {
    c.push_metrics(decode(&h, &b));
    answer::<ExportMetricsServiceResponse>(&h)
}

async fn http_logs(State(c): State<Arc<Captured>>, h: HeaderMap, b: Bytes) -> Answer {
    c.push_logs(decode(&h, &b));
    answer::<ExportLogsServiceResponse>(&h)
}

/// Starts an OTLP/HTTP capture server (`/v1/traces`, `/v1/metrics`, `/v1/logs`; protobuf or
/// JSON, gzip or not) on 127.0.0.1.
pub async fn http() -> (SocketAddr, Arc<Captured>) {
    let captured = Arc::new(Captured::default());
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(http_traces))
        .route("/v1/metrics", axum::routing::post(http_metrics))
        .route("/v1/logs", axum::routing::post(http_logs))
        .with_state(captured.clone());
    let (listener, addr) = listen().await;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, captured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{gauge, kv, log_record, logs_request, metrics_request, point, scope, span, traces_request};
    use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use std::io::Write;

    fn traces(name: &str) -> ExportTraceServiceRequest {
        traces_request(vec![kv("service.name", "svc")], scope("s", ""), vec![span(name, 2, vec![])])
    }

    #[tokio::test]
    async fn grpc_keeps_every_signal_gzip_or_not_and_wakes_a_waiter() {
        let (addr, cap) = grpc().await;
        let url = format!("http://{addr}");
        let waiter = {
            let cap = cap.clone();
            tokio::spawn(async move { cap.wait_spans(2).await })
        };
        let mut t = TraceServiceClient::connect(url.clone()).await.unwrap();
        t.export(traces("a")).await.unwrap();
        let mut tz = TraceServiceClient::connect(url.clone()).await.unwrap().send_compressed(CompressionEncoding::Gzip);
        tz.export(traces("b")).await.unwrap();
        let spans = waiter.await.unwrap();
        let names: Vec<&str> = spans.iter().map(|(_, _, s)| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(spans[0].1, "s");

        let m = metrics_request(vec![], None, vec![gauge("g", "1", vec![point(vec![], 1, 2.0)])]);
        MetricsServiceClient::connect(url.clone()).await.unwrap().export(m.clone()).await.unwrap();
        let l = logs_request(vec![], None, vec![log_record(9, "INFO", Value::StringValue("x".into()))]);
        LogsServiceClient::connect(url).await.unwrap().export(l.clone()).await.unwrap();
        cap.wait_until("one of each", |c| !c.metrics().is_empty() && !c.logs().is_empty()).await;
        assert_eq!((cap.metrics(), cap.logs(), cap.traces().len()), (vec![m], vec![l], 2));
    }

    #[tokio::test]
    async fn http_decodes_protobuf_gzip_and_json() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (addr, cap) = http().await;
        let client = reqwest::Client::new();
        let proto = traces("p").encode_to_vec();
        let r = client
            .post(format!("http://{addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(proto)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&traces("z").encode_to_vec()).unwrap();
        let r = client
            .post(format!("http://{addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "gzip")
            .body(gz.finish().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let m =
            metrics_request(vec![kv("service.name", "j")], None, vec![gauge("g", "1", vec![point(vec![], 1, 0.5)])]);
        let r = client
            .post(format!("http://{addr}/v1/metrics"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&m).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-type"], "application/json");
        let names: Vec<String> = cap.spans().into_iter().map(|(_, _, s)| s.name).collect();
        assert_eq!(names, ["p", "z"]);
        assert_eq!(cap.metrics(), vec![m]);
        assert!(cap.logs().is_empty());
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 30s waiting for 1 spans")]
    async fn waiting_for_what_never_comes_fails_naming_it() {
        Captured::default().wait_spans(1).await;
    }
}
