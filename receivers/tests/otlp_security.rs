//! The otlp receiver's listener security over real sockets: authentication (401 /
//! UNAUTHENTICATED), include_metadata into ClientInfo, TLS on gRPC, decompression bombs and
//! the attribute-count limit.

use async_trait::async_trait;
use flate2::Compression;
use flate2::write::GzEncoder;
use inferwatch_core::auth::{AuthError, AuthInfo, Authenticator, ClientInfo, ServerAuth};
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers};
use inferwatch_core::consumer::{ConsumeError, Consumer};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::otlp::OtlpReceiver;
use inferwatch_receivers::otlp::config::OtlpConfig;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::json;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::codec::CompressionEncoding;

/// Accepts `authorization: Bearer good` (subject "alice").
struct StubAuth;

impl ServerAuth for StubAuth {
    fn authenticate(&self, headers: &http::HeaderMap) -> Result<AuthInfo, AuthError> {
        match headers.get("authorization").map(|v| v.as_bytes()) {
            None => Err(AuthError::Missing),
            Some(b"Bearer good") => Ok(AuthInfo { subject: Some("alice".into()) }),
            Some(_) => Err(AuthError::Invalid),
        }
    }
}

/// Records the ClientInfo each payload arrived with.
#[derive(Default)]
struct Seen {
    clients: Mutex<Vec<Option<Arc<ClientInfo>>>>,
}

#[async_trait]
impl Consumer for Seen {
    async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
        self.clients.lock().unwrap().push(ClientInfo::current());
        Ok(())
    }
}

struct H {
    _rx: OtlpReceiver,
    telemetry: Arc<Telemetry>,
    seen: Arc<Seen>,
    grpc: SocketAddr,
    http: SocketAddr,
}

async fn start(cfg: serde_json::Value) -> H {
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("otlp").unwrap(), telemetry.clone());
    ctx.host.services.provide("bearertokenauth", Authenticator { server: Some(Arc::new(StubAuth)), client: None });
    let mut rx = OtlpReceiver::new(ctx, OtlpConfig::from_value(&cfg).unwrap());
    let seen = Arc::new(Seen::default());
    let mut consumers = ReceiverConsumers::default();
    consumers.set(Signal::Traces, seen.clone());
    rx.start(consumers).await.unwrap();
    let a = rx.local_addrs();
    let none: SocketAddr = "127.0.0.1:1".parse().unwrap();
    H { _rx: rx, telemetry, seen, grpc: a.grpc.unwrap_or(none), http: a.http.unwrap_or(none) }
}

fn both(extra: serde_json::Value) -> serde_json::Value {
    let mut g = json!({"endpoint": "127.0.0.1:0"});
    let mut h = json!({"endpoint": "127.0.0.1:0"});
    for (k, v) in extra.as_object().unwrap() {
        g[k] = v.clone();
        h[k] = v.clone();
    }
    json!({"protocols": {"grpc": g, "http": h}})
}

fn request() -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    name: "s".into(),
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::best());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn auth_failures(t: &Telemetry, transport: &str) -> u64 {
    let prefix = format!("inferwatch_receiver_auth_failures_total{{receiver=\"otlp\",transport=\"{transport}\"}} ");
    t.render().lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().parse().unwrap()).unwrap_or(0)
}

async fn post(h: &H, auth: Option<&str>, body: Vec<u8>, encoding: Option<&str>) -> reqwest::Response {
    let mut r = http_client()
        .post(format!("http://{}/v1/traces", h.http))
        .header("content-type", "application/x-protobuf")
        .header("x-tenant", "acme");
    if let Some(a) = auth {
        r = r.header("authorization", a);
    }
    if let Some(e) = encoding {
        r = r.header("content-encoding", e);
    }
    r.body(body).send().await.unwrap()
}

#[tokio::test]
async fn unauthenticated_requests_are_refused_and_counted_on_both_transports() {
    let h = start(both(json!({"auth": {"authenticator": "bearertokenauth"}}))).await;
    let body = request().encode_to_vec();
    for auth in [None, Some("Bearer wrong")] {
        let r = post(&h, auth, body.clone(), None).await;
        assert_eq!(r.status(), 401);
        let challenges: Vec<_> = r.headers().get_all("www-authenticate").iter().collect();
        assert!(!challenges.is_empty());
        let st = tonic_types::Status::decode(r.bytes().await.unwrap()).unwrap();
        assert_eq!(st.code, Code::Unauthenticated as i32);
        assert!(!st.message.contains("wrong"), "the credential must not be echoed: {}", st.message);
    }
    assert_eq!(post(&h, Some("Bearer good"), body, None).await.status(), 200);
    assert_eq!(auth_failures(&h.telemetry, "http"), 2);

    let mut c = TraceServiceClient::connect(format!("http://{}", h.grpc)).await.unwrap();
    let e = c.export(request()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let mut req = tonic::Request::new(request());
    req.metadata_mut().insert("authorization", "Bearer good".parse().unwrap());
    c.export(req).await.unwrap();
    assert_eq!(auth_failures(&h.telemetry, "grpc"), 1);
    assert_eq!(h.seen.clients.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn include_metadata_reaches_client_info_inside_the_consumer() {
    let h = start(both(json!({"auth": {"authenticator": "bearertokenauth"}, "include_metadata": true}))).await;
    assert_eq!(post(&h, Some("Bearer good"), request().encode_to_vec(), None).await.status(), 200);
    let mut c = TraceServiceClient::connect(format!("http://{}", h.grpc)).await.unwrap();
    let mut req = tonic::Request::new(request());
    req.metadata_mut().insert("authorization", "Bearer good".parse().unwrap());
    req.metadata_mut().insert("x-tenant", "acme".parse().unwrap());
    c.export(req).await.unwrap();
    let seen = h.seen.clients.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for info in seen {
        let info = info.expect("the pipeline call runs inside ClientInfo::scope");
        assert_eq!(info.metadata_values("x-tenant"), vec!["acme".to_string()]);
        assert_eq!(info.auth.as_ref().and_then(|a| a.subject.clone()).as_deref(), Some("alice"));
        assert!(info.addr.is_some_and(|a| a.ip().is_loopback()));
    }
    // Without include_metadata the headers stay out (the address and auth still arrive).
    let h = start(both(json!({}))).await;
    assert_eq!(post(&h, None, request().encode_to_vec(), None).await.status(), 200);
    let info = h.seen.clients.lock().unwrap()[0].clone().unwrap();
    assert!(info.metadata.is_empty());
}

#[tokio::test]
async fn decompression_bombs_are_refused_early_on_both_transports() {
    let h = start(json!({"protocols": {
        "grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1},
        "http": {"endpoint": "127.0.0.1:0", "max_request_body_size": 1048576}
    }}))
    .await;
    // 256 MiB of zeros, about 250 KiB compressed.
    let bomb = gzip(&vec![0u8; 256 * 1024 * 1024]);
    let t0 = Instant::now();
    let r = post(&h, None, bomb.clone(), Some("gzip")).await;
    assert_eq!(r.status(), 413);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(inferwatch_core::server::inflate::inflight_bytes(), 0, "the budget is given back");
    // gRPC: a compressed frame whose message inflates past max_recv_msg_size_mib.
    let mut frame = vec![1u8];
    frame.extend_from_slice(&(bomb.len() as u32).to_be_bytes());
    frame.extend_from_slice(&bomb);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t0 = Instant::now();
    let resp = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .post(format!("http://{}/opentelemetry.proto.collector.trace.v1.TraceService/Export", h.grpc))
        .header("content-type", "application/grpc")
        .header("grpc-encoding", "gzip")
        .header("te", "trailers")
        .body(frame)
        .send()
        .await
        .unwrap();
    let code = resp.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_string());
    // The frame (about 250 KiB) is under the limit; its inflated size trips it.
    assert_eq!(code.as_deref(), Some("8"), "RESOURCE_EXHAUSTED expected");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(inferwatch_core::server::inflate::inflight_bytes(), 0);
    // A good gzip'd request still works.
    let mut c = TraceServiceClient::connect(format!("http://{}", h.grpc))
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip);
    c.export(request()).await.unwrap();
}

#[tokio::test]
async fn too_many_attributes_are_invalid_argument() {
    let h = start(both(json!({}))).await;
    let mut req = request();
    let kv = |i: i64| KeyValue {
        key: format!("k{i}"),
        value: Some(AnyValue { value: Some(Value::IntValue(i)) }),
        ..Default::default()
    };
    req.resource_spans[0].resource = Some(Resource { attributes: (0..2000).map(kv).collect(), ..Default::default() });
    let r = post(&h, None, req.encode_to_vec(), None).await;
    assert_eq!(r.status(), 400);
    let st = tonic_types::Status::decode(r.bytes().await.unwrap()).unwrap();
    assert!(st.message.contains("attributes"), "{}", st.message);
    let mut c = TraceServiceClient::connect(format!("http://{}", h.grpc)).await.unwrap();
    let e = c.export(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(h.seen.clients.lock().unwrap().is_empty());
}

#[tokio::test]
async fn grpc_over_tls_with_the_right_ca() {
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    let dir = std::env::temp_dir().join(format!("inferwatch-otlp-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let (cf, kf) = (dir.join("s.pem"), dir.join("s.key"));
    std::fs::write(&cf, cert.pem()).unwrap();
    std::fs::write(&kf, key.serialize_pem()).unwrap();
    let tls = json!({"tls": {"cert_file": cf, "key_file": kf}});
    let h = start(both(tls)).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ep = tonic::transport::Endpoint::from_shared(format!("https://localhost:{}", h.grpc.port()))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem))
                .domain_name("localhost"),
        )
        .unwrap();
    let mut c = TraceServiceClient::new(ep.connect().await.unwrap());
    c.export(request()).await.unwrap();
    // Plain text on the TLS port fails.
    let plain = TraceServiceClient::connect(format!("http://{}", h.grpc)).await;
    if let Ok(mut p) = plain {
        assert!(p.export(request()).await.is_err());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
