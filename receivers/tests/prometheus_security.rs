//! Scrape safety of the prometheus receiver: TLS with a test CA, credentials, redirects, and
//! the sample / label / body limits (each refusal counted by reason, nothing forwarded).

use base64::Engine;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers, ReceiverFactory};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::prometheus::{PrometheusReceiverFactory, SCRAPE_FAILURES};
use inferwatch_testkit::harness::Sink;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(10);

/// Names of every metric forwarded so far.
fn names(cap: &Sink) -> Vec<String> {
    cap.metrics()
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .map(|m| m.name.clone())
        .collect()
}

/// Polls `cond` until it holds or the deadline passes.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the test server saw and answers.
type Respond = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// A one-request-per-connection HTTP/1.1 server (optionally TLS) that records request heads.
async fn serve(tls: Option<tokio_rustls::TlsAcceptor>, respond: Respond, seen: Arc<Mutex<Vec<String>>>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = l.accept().await else { return };
            let (tls, respond, seen) = (tls.clone(), respond.clone(), seen.clone());
            tokio::spawn(async move {
                match tls {
                    Some(acc) => {
                        if let Ok(s) = acc.accept(sock).await {
                            one(s, respond, seen).await;
                        }
                    }
                    None => one(sock, respond, seen).await,
                }
            });
        }
    });
    addr
}

async fn one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    respond: Respond,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    seen.lock().unwrap().push(head.to_ascii_lowercase());
    let _ = s.write_all(respond(&path).as_bytes()).await;
    let _ = s.shutdown().await;
}

fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn redirect(to: &str) -> String {
    format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
}

async fn start(cfg: serde_json::Value) -> (Box<dyn Receiver>, Arc<Sink>, Arc<Telemetry>) {
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("prometheus").unwrap(), telemetry.clone());
    let f = PrometheusReceiverFactory;
    f.validate(&cfg).unwrap();
    let mut r = f.create(ctx, &cfg).unwrap();
    let cap = Sink::new();
    r.start(ReceiverConsumers { metrics: Some(cap.clone()), ..Default::default() }).await.unwrap();
    (r, cap, telemetry)
}

fn job(addr: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut j = json!({"job_name": "j", "scrape_interval": "200ms", "static_configs": [{"targets": [addr]}]});
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    json!({"config": {"scrape_configs": [j]}})
}

/// A CA, and a server certificate for localhost / 127.0.0.1 it signed, written to a temp dir.
struct Pki {
    dir: std::path::PathBuf,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        use rustls::pki_types::pem::PemObject;
        let dir = std::env::temp_dir().join(format!("iw-prom-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "scrape test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        leaf.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        let chain = vec![rustls::pki_types::CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
        let pk = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, pk)
            .unwrap();
        Pki { dir, acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)) }
    }

    fn ca_file(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_test_ca_and_bearer_credentials() {
    let pki = Pki::new("bearer");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr =
        serve(Some(pki.acceptor.clone()), Arc::new(|_: &str| ok("# TYPE up_tls gauge\nup_tls 1\n")), seen.clone())
            .await;
    let (mut r, cap, telemetry) = start(job(
        &addr,
        json!({"scheme": "https", "tls_config": {"ca_file": pki.ca_file()},
        "authorization": {"credentials": "s3cret"}}),
    ))
    .await;
    until("a TLS scrape", || names(&cap).iter().any(|n| n == "up_tls")).await;
    r.shutdown().await;
    assert!(seen.lock().unwrap().iter().all(|h| h.contains("\r\nauthorization: bearer s3cret\r\n")), "{seen:?}");
    assert_eq!(SCRAPE_FAILURES.get(&telemetry, ["j", &addr, "unreachable"]).get(), 0);

    // A certificate that does not name the expected server is refused: the handshake fails.
    let (mut r, cap, telemetry) = start(job(
        &addr,
        json!({"scheme": "https",
        "tls_config": {"ca_file": pki.ca_file(), "server_name": "not-the-host.example"}}),
    ))
    .await;
    until("a refused certificate", || SCRAPE_FAILURES.get(&telemetry, ["j", &addr, "unreachable"]).get() >= 1).await;
    r.shutdown().await;
    assert!(!names(&cap).iter().any(|n| n == "up_tls"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_with_a_password_file_and_bearer_token() {
    let dir = std::env::temp_dir().join(format!("iw-prom-basic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pw = dir.join("pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = serve(None, Arc::new(|_: &str| ok("m 1\n")), seen.clone()).await;
    let (mut r, cap, _) =
        start(job(&addr, json!({"basic_auth": {"username": "agent", "password_file": pw.display().to_string()}})))
            .await;
    until("a scrape", || names(&cap).iter().any(|n| n == "m")).await;
    r.shutdown().await;
    let want = format!(
        "\r\nauthorization: basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode("agent:hunter2").to_ascii_lowercase()
    );
    assert!(seen.lock().unwrap()[0].contains(&want), "{seen:?}");

    seen.lock().unwrap().clear();
    let (mut r, cap, _) = start(job(&addr, json!({"bearer_token": "legacy"}))).await;
    until("a scrape", || names(&cap).iter().any(|n| n == "m")).await;
    r.shutdown().await;
    assert!(seen.lock().unwrap()[0].contains("\r\nauthorization: bearer legacy\r\n"));
    std::fs::remove_dir_all(&dir).unwrap();

    let e = PrometheusReceiverFactory
        .validate(&job(&addr, json!({"bearer_token": "a", "basic_auth": {"username": "u", "password": "p"}})))
        .unwrap_err();
    assert!(e.message.contains("mutually exclusive"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_follow_only_when_allowed_and_only_to_http() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = serve(
        None,
        Arc::new(|path: &str| match path {
            "/metrics" => redirect("/moved"),
            "/moved" => ok("moved_here 1\n"),
            "/ftp/metrics" => redirect("ftp://127.0.0.1/x"),
            _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
        }),
        seen.clone(),
    )
    .await;
    // Default: followed.
    let (mut r, cap, _) = start(job(&addr, json!({}))).await;
    until("a scrape through the redirect", || names(&cap).iter().any(|n| n == "moved_here")).await;
    r.shutdown().await;

    let (mut r, cap, telemetry) = start(job(&addr, json!({"follow_redirects": false}))).await;
    until("a refused redirect", || SCRAPE_FAILURES.get(&telemetry, ["j", &addr, "redirect"]).get() >= 1).await;
    r.shutdown().await;
    assert!(!names(&cap).iter().any(|n| n == "moved_here"), "nothing scraped through a refused redirect");

    let (mut r, cap, telemetry) = start(job(&addr, json!({"metrics_path": "/ftp/metrics"}))).await;
    until("a refused ftp redirect", || SCRAPE_FAILURES.get(&telemetry, ["j", &addr, "redirect"]).get() >= 1).await;
    r.shutdown().await;
    assert!(names(&cap).iter().all(|n| n.starts_with("up") || n.starts_with("scrape_")), "{:?}", names(&cap));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_the_whole_scrape_and_are_counted() {
    let long = "v".repeat(300);
    let page = format!(
        "# TYPE a gauge\na{{x=\"1\"}} 1\na{{x=\"2\"}} 2\na{{x=\"3\",y=\"4\",z=\"5\"}} 3\nb{{x=\"{long}\"}} 4\n{}",
        "pad 0\n".repeat(300)
    );
    let addr = serve(None, Arc::new(move |_: &str| ok(&page)), Arc::new(Mutex::new(Vec::new()))).await;
    let cases = [
        (json!({"sample_limit": 2}), "sample_limit"),
        (json!({"label_limit": 4}), "label_limit"),
        (json!({"label_value_length_limit": 100}), "label_value_length_limit"),
        (json!({"label_name_length_limit": 0, "body_size_limit": "1KB"}), "too_large"),
    ];
    for (extra, reason) in cases {
        let (mut r, cap, telemetry) = start(job(&addr, extra.clone())).await;
        until(reason, || SCRAPE_FAILURES.get(&telemetry, ["j", &addr, reason]).get() >= 1).await;
        r.shutdown().await;
        let names = names(&cap);
        assert!(!names.iter().any(|n| n == "a" || n == "b" || n == "pad"), "{extra}: forwarded {names:?}");
    }
    // Under the limits the same page goes through.
    let (mut r, cap, _) = start(job(
        &addr,
        json!({"sample_limit": 1000, "label_limit": 6,
        "label_value_length_limit": 300, "body_size_limit": "1MiB"}),
    ))
    .await;
    until("a good scrape", || names(&cap).iter().any(|n| n == "b")).await;
    r.shutdown().await;
}

#[test]
fn settings_are_checked() {
    let f = PrometheusReceiverFactory;
    for (extra, needle) in [
        (json!({"tls_config": {"cert_file": "c.pem"}}), "key_file"),
        (json!({"tls_config": {"min_version": "TLS14"}}), "TLS14"),
        (json!({"authorization": {"credentials": "a", "credentials_file": "/f"}}), "exactly one"),
        (json!({"authorization": {"type": "Basic", "credentials": "a"}}), "basic_auth"),
        (json!({"body_size_limit": "10 parsecs"}), "unit"),
        (json!({"bearer_token": "a", "bearer_token_file": "/f"}), "at most one"),
    ] {
        let e = f.validate(&job("h:1", extra.clone())).unwrap_err();
        assert!(format!("{:?} {}", e.path, e.message).contains(needle), "{extra}: {e}");
    }
    // Debug of the settings never shows a credential.
    let c = inferwatch_receivers::prometheus::config::PrometheusConfig::from_value(&job(
        "h:1",
        json!({"authorization": {"credentials": "hunter2"}, "basic_auth": null}),
    ))
    .unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));
}
