//! Listener tests on real sockets (127.0.0.1) with certificates made here by rcgen.

use super::*;
use crate::telemetry::Telemetry;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA and helpers to issue leaves, in a temporary directory.
struct Pki {
    dir: PathBuf,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("inferwatch-core-server-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = ca.self_signed(&key).unwrap();
        let pki = Pki { dir, ca_pem: cert.pem(), issuer: Issuer::new(ca, key) };
        std::fs::write(pki.path("ca.pem"), &pki.ca_pem).unwrap();
        pki
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A leaf (cert PEM, key PEM).
    fn leaf(&self, cn: &str, server: bool) -> (String, String) {
        let sans = if server { vec!["localhost".to_string(), "127.0.0.1".to_string()] } else { vec![] };
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages =
            vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes a server leaf as server.pem / server.key; returns its DER.
    fn write_server(&self, cn: &str) -> Vec<u8> {
        let (c, k) = self.leaf(cn, true);
        std::fs::write(self.path("server.pem"), &c).unwrap();
        std::fs::write(self.path("server.key"), &k).unwrap();
        CertificateDer::from_pem_slice(c.as_bytes()).unwrap().to_vec()
    }

    fn client_config(&self, identity: Option<(String, String)>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).unwrap()).unwrap();
        let b = rustls::ClientConfig::builder_with_provider(crate::tls::client::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut c = match identity {
            Some((c, k)) => b
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(c.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        c
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn app() -> axum::Router {
    axum::Router::new().route("/", axum::routing::get(|| async { "ok" }))
}

fn tls_settings(pki: &Pki, mtls: bool, reload: Option<Duration>) -> TlsServerSettings {
    let mut v = serde_json::json!({"cert_file": pki.path("server.pem"), "key_file": pki.path("server.key")});
    if mtls {
        v["client_ca_file"] = pki.path("ca.pem").into();
    }
    if let Some(r) = reload {
        v["reload_interval"] = format!("{}ms", r.as_millis()).into();
    }
    serde_json::from_value(v).unwrap()
}

/// Starts `app` on 127.0.0.1:0; returns the address, the shutdown token and the metrics.
async fn start(tls: Option<TlsServerSettings>, limits: Limits) -> (SocketAddr, CancellationToken, ListenerMetrics) {
    let t = Telemetry::new();
    let m = t.listener("test");
    let ep = HostPort { host: "127.0.0.1".into(), port: 0 };
    let l = Listener::bind("test", &ep, tls.as_ref(), limits, m.clone()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(l, app(), stop.clone()));
    (addr, stop, m)
}

/// One HTTP/1.1 GET over `io`; the response's first line.
async fn get<I: AsyncRead + AsyncWrite + Unpin>(io: &mut I) -> std::io::Result<String> {
    io.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n").await?;
    let mut buf = vec![0u8; 1024];
    let n = io.read(&mut buf).await?;
    if n == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
    }
    Ok(String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string())
}

/// A TLS GET; the status line and the server's leaf certificate.
async fn tls_get(addr: SocketAddr, cfg: rustls::ClientConfig) -> std::io::Result<(String, Vec<u8>)> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let mut s = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await?;
    let leaf = s.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec()).unwrap_or_default();
    let line = get(&mut s).await?;
    Ok((line, leaf))
}

/// Whether the server has closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 256];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn tls_is_served_with_the_right_ca_and_plain_text_is_refused() {
    let pki = Pki::new("tls");
    pki.write_server("server-1");
    let (addr, stop, m) = start(Some(tls_settings(&pki, false, None)), Limits::new(Role::Ingest)).await;
    let (line, _) = tls_get(addr, pki.client_config(None)).await.unwrap();
    assert_eq!(line, "HTTP/1.1 200 OK");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    let r = get(&mut plain).await;
    assert!(r.as_ref().map_or(true, |l| !l.starts_with("HTTP/1.1 200")), "{r:?}");
    // A client trusting another CA refuses the server.
    let other = Pki::new("tls-other");
    assert!(tls_get(addr, other.client_config(None)).await.is_err());
    let deadline = Instant::now() + Duration::from_secs(2);
    while m.tls_handshake_failures.get() < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(m.tls_handshake_failures.get() >= 1);
    stop.cancel();
}

#[tokio::test]
async fn mtls_requires_a_client_certificate() {
    let pki = Pki::new("mtls");
    pki.write_server("server");
    let (addr, stop, _) = start(Some(tls_settings(&pki, true, None)), Limits::new(Role::Ingest)).await;
    // Without a certificate: TLS 1.3 clients learn of the refusal on the first read.
    let r = tls_get(addr, pki.client_config(None)).await;
    assert!(r.is_err(), "{r:?}");
    let stranger = Pki::new("mtls-stranger");
    let r = tls_get(addr, pki.client_config(Some(stranger.leaf("intruder", false)))).await;
    assert!(r.is_err(), "a certificate from another CA must be refused: {r:?}");
    let (line, _) = tls_get(addr, pki.client_config(Some(pki.leaf("agent", false)))).await.unwrap();
    assert_eq!(line, "HTTP/1.1 200 OK");
    stop.cancel();
}

#[tokio::test]
async fn rotated_certificates_are_picked_up_and_bad_ones_ignored() {
    let pki = Pki::new("rotate");
    let first = pki.write_server("first");
    let (addr, stop, _) =
        start(Some(tls_settings(&pki, false, Some(Duration::from_millis(50)))), Limits::new(Role::Ingest)).await;
    assert_eq!(tls_get(addr, pki.client_config(None)).await.unwrap().1, first);
    // A broken pair keeps the current certificate.
    std::fs::write(pki.path("server.pem"), "garbage").unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await; // let the interval pass (not synchronisation)
    assert_eq!(tls_get(addr, pki.client_config(None)).await.unwrap().1, first);
    let second = pki.write_server("second");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (_, leaf) = tls_get(addr, pki.client_config(None)).await.unwrap();
        if leaf == second {
            break;
        }
        assert!(Instant::now() < deadline, "the new certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
}

#[tokio::test]
async fn idle_and_slow_clients_do_not_starve_a_good_one() {
    // 300 idle connections (not 2,000: the unit suite shares its descriptors; the end-to-end
    // test runs 2,000) against a cap of 100, plus a slowloris sending a header byte at a time.
    let mut limits = Limits::new(Role::Ingest);
    limits.max_connections = 100;
    limits.read_header_timeout = Duration::from_millis(400);
    let (addr, stop, m) = start(None, limits).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nx-slow: ").await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let t0 = Instant::now();
    let mut good = TcpStream::connect(addr).await.unwrap();
    let line = tokio::time::timeout(Duration::from_secs(1), get(&mut good)).await.unwrap().unwrap();
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(m.evicted.get() >= 200, "evicted {}", m.evicted.get());
    // The slowloris is cut (evicted or timed out) well within a few header timeouts.
    let mut cut = false;
    for _ in 0..20 {
        if slow.write_all(b"a").await.is_err() || closed_within(&mut slow, Duration::from_millis(100)).await {
            cut = true;
            break;
        }
    }
    assert!(cut, "the slow-header client was never cut");
    assert!(m.connections.get() <= 101, "open {}", m.connections.get());
    stop.cancel();
}

#[tokio::test]
async fn slow_headers_are_cut_after_read_header_timeout() {
    let mut limits = Limits::new(Role::Ingest);
    limits.read_header_timeout = Duration::from_millis(300);
    let (addr, stop, m) = start(None, limits).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let t0 = Instant::now();
    let mut cut = false;
    while t0.elapsed() < Duration::from_secs(2) {
        // One byte every 50 ms keeps a byte-rate timeout happy; only a header deadline cuts it.
        if slow.write_all(b"x").await.is_err() || closed_within(&mut slow, Duration::from_millis(50)).await {
            cut = true;
            break;
        }
    }
    assert!(cut && t0.elapsed() < Duration::from_secs(1), "cut {cut} after {:?}", t0.elapsed());
    // A silent connection is cut too.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(1)).await);
    assert!(m.timed_out.get() >= 1);
    stop.cancel();
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let mut limits = Limits::new(Role::Ingest);
    limits.idle_timeout = Duration::from_millis(200);
    let (addr, stop, _) = start(None, limits).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get(&mut c).await.unwrap(), "HTTP/1.1 200 OK");
    let t0 = Instant::now();
    assert!(closed_within(&mut c, Duration::from_secs(2)).await);
    assert!(t0.elapsed() >= Duration::from_millis(150), "closed too early: {:?}", t0.elapsed());
    stop.cancel();
}

#[tokio::test]
async fn at_the_cap_busy_connections_are_kept_and_the_new_one_refused() {
    let release = Arc::new(tokio::sync::Notify::new());
    let r2 = release.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let r = r2.clone();
            async move {
                r.notified().await;
                "done"
            }
        }),
    );
    let mut limits = Limits::new(Role::Ingest);
    limits.max_connections = 2;
    let t = Telemetry::new();
    let m = t.listener("cap");
    let ep = HostPort { host: "127.0.0.1".into(), port: 0 };
    let l = Listener::bind("cap", &ep, None, limits, m.clone()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(l, app, stop.clone()));
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        busy.push(s);
    }
    // Wait until both requests are in flight.
    let deadline = Instant::now() + Duration::from_secs(2);
    while m.connections.get() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // the handlers are now waiting (not synchronisation)
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(1)).await, "the third connection was not refused");
    assert_eq!(m.refused.get(), 1);
    release.notify_waiters();
    for mut s in busy {
        let mut b = vec![0u8; 256];
        let n = s.read(&mut b).await.unwrap();
        assert!(String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"));
    }
    stop.cancel();
}

#[tokio::test]
async fn h2_settings_advertise_the_stream_limit() {
    let (addr, stop, _) = start(None, Limits::new(Role::Ingest)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // empty SETTINGS
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 4, "first server frame must be SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    let streams = body.chunks(6).find(|c| c[0] == 0 && c[1] == 3).map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]));
    assert_eq!(streams, Some(DEFAULT_MAX_CONCURRENT_STREAMS));
    stop.cancel();
}

#[test]
fn default_caps_fit_the_descriptor_budget() {
    // Two ingest and three auxiliary listeners at their caps leave the reserve free at 1,024.
    let ingest = max_connections_for(1024, Role::Ingest) as u64;
    let aux = max_connections_for(1024, Role::Auxiliary) as u64;
    assert_eq!(ingest, 288);
    assert!(2 * ingest + 3 * aux + FD_RESERVE < 1024);
    assert_eq!(max_connections_for(1 << 20, Role::Ingest), 16_384);
    assert!(nofile_soft_limit() >= 1);
}
