//! A small OTLP/gRPC capture server (traces and metrics) for the tests.

#![allow(dead_code)]

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

/// What was received.
#[derive(Debug, Default)]
pub struct Captured {
    /// Trace exports.
    pub traces: Mutex<Vec<ExportTraceServiceRequest>>,
    /// Metric exports.
    pub metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
}

#[derive(Clone)]
struct Svc(Arc<Captured>);

#[tonic::async_trait]
impl TraceService for Svc {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.0.traces.lock().unwrap().push(req.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Svc {
    async fn export(
        &self,
        req: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.0.metrics.lock().unwrap().push(req.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// Starts the capture server on 127.0.0.1.
pub async fn start() -> (SocketAddr, Arc<Captured>) {
    let captured = Arc::new(Captured::default());
    let svc = Svc(captured.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(svc.clone()).accept_compressed(CompressionEncoding::Gzip))
            .add_service(MetricsServiceServer::new(svc).accept_compressed(CompressionEncoding::Gzip))
            .serve_with_incoming(incoming)
            .await;
    });
    (addr, captured)
}

/// Starts an OTLP/HTTP (protobuf, optionally gzip) capture server on 127.0.0.1.
pub async fn start_http() -> (SocketAddr, Arc<Captured>) {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use prost::Message;
    use std::io::Read;

    fn body(headers: &HeaderMap, b: &Bytes) -> Vec<u8> {
        if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&b[..]).read_to_end(&mut out).unwrap();
            out
        } else {
            b.to_vec()
        }
    }
    async fn traces(State(c): State<Arc<Captured>>, h: HeaderMap, b: Bytes) -> Vec<u8> {
        let req = ExportTraceServiceRequest::decode(&body(&h, &b)[..]).unwrap();
        c.traces.lock().unwrap().push(req);
        ExportTraceServiceResponse::default().encode_to_vec()
    }
    async fn metrics(State(c): State<Arc<Captured>>, h: HeaderMap, b: Bytes) -> Vec<u8> {
        let req = ExportMetricsServiceRequest::decode(&body(&h, &b)[..]).unwrap();
        c.metrics.lock().unwrap().push(req);
        ExportMetricsServiceResponse::default().encode_to_vec()
    }
    let captured = Arc::new(Captured::default());
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(traces))
        .route("/v1/metrics", axum::routing::post(metrics))
        .with_state(captured.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, captured)
}
