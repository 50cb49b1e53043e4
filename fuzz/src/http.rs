//! Loopback harnesses for the decoders that only a network exchange reaches: a raw HTTP/1.1
//! server that answers every request with the fuzzed response bytes (for the exporters'
//! response handling), and a running OTLP receiver (for its request handling).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A server that answers each request with the bytes last set.
pub struct RawServer {
    /// Where it listens.
    pub addr: SocketAddr,
    response: Arc<Mutex<Vec<u8>>>,
}

impl RawServer {
    /// The process-wide instance (started on first use).
    pub fn get() -> &'static RawServer {
        static S: OnceLock<RawServer> = OnceLock::new();
        S.get_or_init(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("cannot listen on loopback: {e}"));
            let addr = l.local_addr().unwrap_or_else(|e| panic!("no local address: {e}"));
            let response = Arc::new(Mutex::new(Vec::new()));
            let r = response.clone();
            std::thread::Builder::new()
                .name("fuzz-raw-http".into())
                .spawn(move || {
                    for stream in l.incoming().flatten() {
                        let bytes = r.lock().map(|v| v.clone()).unwrap_or_default();
                        serve_one(stream, &bytes);
                    }
                })
                .unwrap_or_else(|e| panic!("cannot start the server thread: {e}"));
            RawServer { addr, response }
        })
    }

    /// Sets the response of the next requests.
    pub fn set(&self, bytes: &[u8]) {
        if let Ok(mut r) = self.response.lock() {
            r.clear();
            r.extend_from_slice(bytes);
        }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Reads one request (head and `Content-Length` body), writes `response`, closes.
fn serve_one(mut s: TcpStream, response: &[u8]) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let _ = s.write_all(response);
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Drain until the client closes, so that it reads the whole answer.
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    while matches!(s.read(&mut chunk), Ok(n) if n > 0) {}
}

/// A current-thread runtime shared by the exporter targets.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a runtime: {e}"))
    })
}
