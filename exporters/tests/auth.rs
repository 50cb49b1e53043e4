//! `auth: { authenticator: <id> }` on the HTTP and gRPC exporters: the extension's headers go
//! out with every request (a bearer token, a tenant header from the client's metadata).

use crate::common;

use axum::Router;
use axum::http::HeaderMap;
use common::{PATIENCE, payload};
use inferwatch_core::auth::ClientInfo;
use inferwatch_core::component::{ComponentId, CreateContext, ExporterFactory, ExtensionFactory, NodeRef};
use inferwatch_core::extension::bearertokenauth::BearerTokenAuthFactory;
use inferwatch_core::extension::headers_setter::HeadersSetterFactory;
use inferwatch_core::host::Host;
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::{
    AlertmanagerExporterFactory, OtlpExporterFactory, OtlpHttpExporterFactory, RemoteWriteExporterFactory,
};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Instant;

type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// Answers every POST with success for the protocol asked (HTTP/1.1 and h2c), keeping headers.
async fn server(seen: Seen) -> String {
    let app = Router::new().fallback(move |headers: HeaderMap| {
        let seen = seen.clone();
        async move {
            let grpc = headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            seen.lock().unwrap().push(headers);
            if grpc {
                ([("content-type", "application/grpc"), ("grpc-status", "0")], Vec::new())
            } else {
                ([("content-type", "application/x-protobuf"), ("x-ok", "1")], Vec::new())
            }
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// Creates the two authenticator extensions in `host`.
fn extensions(host: &Arc<Host>) {
    let t = Arc::new(Telemetry::new());
    let ctx =
        |id: &str| CreateContext { id: ComponentId::parse(id).unwrap(), telemetry: t.clone(), host: host.clone() };
    BearerTokenAuthFactory.create(ctx("bearertokenauth/out"), &json!({"token": "t0ken"})).unwrap();
    HeadersSetterFactory
        .create(
            ctx("headers_setter"),
            &json!({"headers": [{"key": "X-Scope-OrgID", "from_context": "x-tenant", "default_value": "none"}]}),
        )
        .unwrap();
}

fn exporter(f: &dyn ExporterFactory, host: &Arc<Host>, cfg: serde_json::Value, signal: Signal) -> NodeRef {
    f.validate(&cfg).unwrap();
    let ctx = CreateContext {
        id: ComponentId::parse(f.type_name()).unwrap(),
        telemetry: Arc::new(Telemetry::new()),
        host: host.clone(),
    };
    f.create(ctx, &cfg, signal).unwrap_or_else(|e| panic!("{cfg}: {e}"))
}

async fn until_seen(seen: &Seen, n: usize) {
    let end = Instant::now() + PATIENCE;
    while seen.lock().unwrap().len() < n {
        assert!(Instant::now() < end, "the server got {} of {n} requests", seen.lock().unwrap().len());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn tenant(t: &'static str) -> Arc<ClientInfo> {
    let mut md = http::HeaderMap::new();
    md.insert("x-tenant", http::HeaderValue::from_static(t));
    Arc::new(ClientInfo { metadata: md, ..Default::default() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exporter_sends_the_authenticators_headers() {
    let host = Host::new();
    extensions(&host);
    let seen: Seen = Arc::default();
    let addr = server(seen.clone()).await;
    let q = json!({"enabled": false});
    let cases: Vec<(&dyn ExporterFactory, serde_json::Value, Signal)> = vec![
        (
            &OtlpHttpExporterFactory,
            json!({"endpoint": format!("http://{addr}"), "compression": "none", "sending_queue": q,
                "auth": {"authenticator": "bearertokenauth/out"}}),
            Signal::Traces,
        ),
        (
            &OtlpExporterFactory,
            json!({"endpoint": format!("http://{addr}"), "compression": "none", "sending_queue": q,
                "auth": {"authenticator": "bearertokenauth/out"}}),
            Signal::Traces,
        ),
        (
            &RemoteWriteExporterFactory,
            json!({"endpoint": format!("http://{addr}/api/v1/write"), "sending_queue": q,
                "auth": {"authenticator": "bearertokenauth/out"}}),
            Signal::Metrics,
        ),
    ];
    for (i, (f, cfg, signal)) in cases.into_iter().enumerate() {
        let node = exporter(f, &host, cfg, signal);
        node.start().await.unwrap();
        node.consume(payload(signal, 2)).await.unwrap_or_else(|e| panic!("{}: {e}", f.type_name()));
        until_seen(&seen, i + 1).await;
        node.shutdown(Instant::now() + PATIENCE).await;
        let h = seen.lock().unwrap()[i].clone();
        assert_eq!(h.get("authorization").map(|v| v.as_bytes()), Some(&b"Bearer t0ken"[..]), "{}", f.type_name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_setter_forwards_the_tenant_of_each_request() {
    let host = Host::new();
    extensions(&host);
    let seen: Seen = Arc::default();
    let addr = server(seen.clone()).await;
    let node = exporter(
        &OtlpHttpExporterFactory,
        &host,
        json!({"endpoint": format!("http://{addr}"), "compression": "none",
            "auth": {"authenticator": "headers_setter"}}),
        Signal::Logs,
    );
    node.start().await.unwrap();
    ClientInfo::scope(tenant("team-a"), node.consume(payload(Signal::Logs, 1))).await.unwrap();
    until_seen(&seen, 1).await;
    ClientInfo::scope(tenant("team-b"), node.consume(payload(Signal::Logs, 1))).await.unwrap();
    until_seen(&seen, 2).await;
    node.shutdown(Instant::now() + PATIENCE).await;
    let got: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|h| h.get("x-scope-orgid").and_then(|v| v.to_str().ok()).unwrap_or("-").to_string())
        .collect();
    assert_eq!(got, vec!["team-a", "team-b"], "through the sending queue, each request keeps its tenant");
}

#[test]
fn unknown_or_server_only_authenticators_are_refused_at_create() {
    let host = Host::new();
    let t = Arc::new(Telemetry::new());
    inferwatch_core::extension::basicauth::BasicAuthFactory
        .create(
            CreateContext { id: ComponentId::parse("basicauth/in").unwrap(), telemetry: t.clone(), host: host.clone() },
            &json!({"htpasswd": {"inline": "u:{SHA}AAAAAAAAAAAAAAAAAAAAAAAAAAA="}}),
        )
        .unwrap();
    for (id, needle) in [("bearertokenauth/none", "not defined"), ("basicauth/in", "cannot authenticate clients")] {
        let cfg = json!({"endpoint": "http://127.0.0.1:1", "auth": {"authenticator": id}});
        let ctx =
            CreateContext { id: ComponentId::parse("alertmanager").unwrap(), telemetry: t.clone(), host: host.clone() };
        let e = AlertmanagerExporterFactory.create(ctx, &cfg, Signal::Logs).err().expect("refused");
        assert!(e.to_string().contains(needle) && e.to_string().contains("auth"), "{id}: {e}");
    }
}
