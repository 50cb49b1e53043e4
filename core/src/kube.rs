//! A small Kubernetes API client shared by the prometheus receiver's `kubernetes_sd_configs`, the
//! `k8sattributes` processor and the `loadbalancing` exporter's k8s resolver: how to reach the
//! API server (in-cluster service account, or an explicit URL), and the list + watch loop of one
//! resource path (any API group: `api/v1/...` or `apis/<group>/<version>/...`).
//!
//! The loop lists in pages (`limit` / `continue`), then watches from the list's
//! `resourceVersion` (`?watch=1&allowWatchBookmarks=true&timeoutSeconds=..`), resuming from the
//! last seen version when the server ends the stream; `410 Gone` (as a status or as an `ERROR`
//! event) lists again; any other failure backs off (200 ms doubling to 30 s) and lists again.
//! Bodies and watch events are read with a bound ([`MAX_EVENT`]); a list keeps at most the
//! sink's [`WatchSink::max_objects`] objects. The shapes are the Kubernetes API reference's
//! (`PodList` / `EndpointsList` / `NamespaceList` / `EndpointSliceList`, `WatchEvent` one JSON
//! object per line).

use crate::auth::{AuthError, ClientAuth};
use crate::extension::client_auth::FileSecret;
use crate::settings::TlsClientSettings;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The service account's files in a pod (`token`, `ca.crt`, `namespace`).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Largest watch event (one line of the stream) or list page.
pub const MAX_EVENT: usize = 8 * 1024 * 1024;
/// Default bound of the objects one list keeps.
pub const MAX_OBJECTS: usize = 50_000;
/// Page size of list requests.
pub const PAGE: usize = 500;
/// Server-side end of one watch request (it is then resumed from the last resourceVersion).
pub const WATCH_SECONDS: u64 = 300;
/// Most time a list page or the start of a watch may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The in-cluster API server URL from `KUBERNETES_SERVICE_HOST` / `_PORT`.
pub fn in_cluster_url(host: Option<String>, port: Option<String>) -> Result<String, String> {
    match (host, port) {
        (Some(h), Some(p)) if !h.is_empty() && !p.is_empty() => {
            let h = if h.contains(':') { format!("[{h}]") } else { h };
            Ok(format!("https://{h}:{p}"))
        }
        _ => Err("KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT are not in the environment: not running in \
                  a cluster"
            .into()),
    }
}

/// `Authorization: Bearer <token>` from a token file, re-read as it rotates (the projected
/// service-account token is refreshed by the kubelet).
pub struct TokenFile(FileSecret);

impl TokenFile {
    /// Reads `path` now.
    pub fn open(path: &str) -> Result<Self, String> {
        FileSecret::open(path).map(TokenFile)
    }
}

impl ClientAuth for TokenFile {
    fn headers(&self) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, AuthError> {
        let mut v = http::HeaderValue::from_str(&format!("Bearer {}", self.0.current().expose()))
            .map_err(|_| AuthError::Unavailable("the token is not usable in an HTTP header".into()))?;
        v.set_sensitive(true);
        Ok(vec![(http::header::AUTHORIZATION, v)])
    }
}

/// How to reach the API server.
#[derive(Clone)]
pub struct ApiConn {
    /// Base URL, ending in `/` (`https://10.0.0.1:443/`).
    pub base: reqwest::Url,
    /// The HTTP client (its TLS configured).
    pub client: reqwest::Client,
    /// Credentials added to each request.
    pub auth: Option<Arc<dyn ClientAuth>>,
}

/// An HTTP client for the API server with `tls` (plain text for an `http` URL).
pub fn http_client(https: bool, tls: &TlsClientSettings) -> Result<reqwest::Client, String> {
    let cfg = if https {
        crate::tls::client_config(tls).map_err(|e| format!("{}: {e}", e.field()))?
    } else {
        crate::tls::plaintext_client_config().map_err(|e| e.to_string())?
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(cfg)
        .no_proxy()
        .user_agent(concat!("inferwatch/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

impl ApiConn {
    /// A connection to `url` (http or https) with `auth` and `tls`.
    pub fn new(url: &str, auth: Option<Arc<dyn ClientAuth>>, tls: &TlsClientSettings) -> Result<ApiConn, String> {
        let with_slash = if url.ends_with('/') { url.to_string() } else { format!("{url}/") };
        let base = reqwest::Url::parse(&with_slash).map_err(|e| format!("{url:?}: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(format!("{url:?} is not an http(s) URL"));
        }
        let client = http_client(base.scheme() == "https", tls)?;
        Ok(ApiConn { base, client, auth })
    }

    /// The in-cluster connection: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
    /// verified with the service account's `ca.crt`, authenticated with its token.
    pub fn in_cluster() -> Result<ApiConn, String> {
        let url = in_cluster_url(
            std::env::var("KUBERNETES_SERVICE_HOST").ok(),
            std::env::var("KUBERNETES_SERVICE_PORT").ok(),
        )?;
        Self::service_account(&url, SERVICE_ACCOUNT_DIR)
    }

    /// `url` with the service account files under `dir` (token re-read as it rotates, CA).
    pub fn service_account(url: &str, dir: &str) -> Result<ApiConn, String> {
        let token = TokenFile::open(&format!("{dir}/token"))?;
        let tls = TlsClientSettings { ca_file: Some(format!("{dir}/ca.crt")), ..Default::default() };
        Self::new(url, Some(Arc::new(token)), &tls)
    }

    /// `GET url` with the credentials, answering within [`REQUEST_TIMEOUT`]; 410 is [`WatchEnd::Gone`].
    pub async fn get(&self, url: reqwest::Url) -> Result<reqwest::Response, WatchEnd> {
        self.get_within(url, REQUEST_TIMEOUT).await
    }

    /// [`ApiConn::get`], answering (status and headers) within `timeout`.
    pub async fn get_within(&self, url: reqwest::Url, timeout: Duration) -> Result<reqwest::Response, WatchEnd> {
        let mut headers = http::HeaderMap::new();
        if let Some(a) = &self.auth {
            a.apply(&mut headers).map_err(|e| WatchEnd::Failed(e.to_string()))?;
        }
        let send =
            self.client.get(url.clone()).headers(headers).header(http::header::ACCEPT, "application/json").send();
        let resp = match tokio::time::timeout(timeout, send).await {
            Err(_) => return Err(WatchEnd::Failed(format!("{url}: no answer within {timeout:?}"))),
            Ok(Err(e)) => return Err(WatchEnd::Failed(format!("{url}: {e}"))),
            Ok(Ok(r)) => r,
        };
        match resp.status().as_u16() {
            200 => Ok(resp),
            410 => Err(WatchEnd::Gone),
            code => Err(WatchEnd::Failed(format!("{url}: HTTP {code}"))),
        }
    }
}

/// The path of a core (`api/v1`) resource, in one namespace or in all.
pub fn core_path(namespace: Option<&str>, resource: &str) -> String {
    match namespace {
        Some(ns) => format!("api/v1/namespaces/{ns}/{resource}"),
        None => format!("api/v1/{resource}"),
    }
}

/// Why a list or watch stopped.
#[derive(Debug)]
pub enum WatchEnd {
    /// The resourceVersion is too old: list again.
    Gone,
    /// Anything else: back off, then list again.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// A new object.
    Added,
    /// A changed object.
    Modified,
    /// A removed object (the event carries its last state).
    Deleted,
}

/// Failures the loop reports to its sink (to be counted by the caller's self-metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A list or watch failed (it is retried after a back-off).
    Error,
    /// A list had more objects than [`WatchSink::max_objects`]: the rest were not kept.
    ObjectsCut,
    /// A watch event or list page was larger than [`MAX_EVENT`].
    EventTooLarge,
}

/// What receives the objects of one list + watch.
pub trait WatchSink: Send + Sync {
    /// A complete list: the objects there are now (replacing what this sink had).
    fn replace(&self, objects: Vec<Value>);
    /// One `ADDED`, `MODIFIED` or `DELETED` event; true when it changed something.
    fn apply(&self, event: EventType, object: Value) -> bool;
    /// Called after events that changed something (once per received chunk).
    fn flush(&self) {}
    /// A failure, to be counted.
    fn failed(&self, failure: Failure);
    /// How many objects of a list were not kept ([`Failure::ObjectsCut`] is reported too).
    fn objects_cut(&self, _n: usize) {}
    /// Most objects one list keeps.
    fn max_objects(&self) -> usize {
        MAX_OBJECTS
    }
    /// Most time a list page or the start of a watch may take.
    fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }
    /// A list or watch of `path` failed with `error` (after [`WatchSink::failed`]) and is retried
    /// after `backoff`; the default logs a warning each time.
    fn retrying(&self, path: &str, error: &str, backoff: Duration) {
        tracing::warn!(path = %path, error = %error, "kubernetes list/watch failed; retrying in {backoff:?}");
    }
}

/// A string at `path` in `v` ("" when absent).
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// One resource path to list and watch, with its query (`labelSelector`, `fieldSelector`).
#[derive(Debug, Clone)]
pub struct Watch {
    /// Relative to the base URL (`api/v1/pods`, see [`core_path`]).
    pub path: String,
    /// Extra query pairs of every request.
    pub query: Vec<(String, String)>,
}

impl Watch {
    /// Lists and watches until cancelled, feeding `sink`.
    pub async fn run(self, conn: ApiConn, sink: Arc<dyn WatchSink>, cancel: CancellationToken) {
        let w = Looper { w: self, conn, sink, cancel };
        w.run().await
    }
}

struct Looper {
    w: Watch,
    conn: ApiConn,
    sink: Arc<dyn WatchSink>,
    cancel: CancellationToken,
}

impl Looper {
    fn url(&self, extra: &[(&str, String)]) -> Result<reqwest::Url, String> {
        let mut u = self.conn.base.join(&self.w.path).map_err(|e| format!("{}: {e}", self.w.path))?;
        {
            let mut q = u.query_pairs_mut();
            for (k, v) in self.w.query.iter().map(|(k, v)| (k.as_str(), v)).chain(extra.iter().map(|(k, v)| (*k, v))) {
                q.append_pair(k, v);
            }
        }
        Ok(u)
    }

    async fn run(self) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let end = match self.list().await {
                Ok(rv) => {
                    backoff = Duration::from_millis(200);
                    self.watch(rv).await
                }
                Err(e) => e,
            };
            match end {
                WatchEnd::Cancelled => return,
                WatchEnd::Gone => {
                    tracing::debug!(path = %self.w.path, "kubernetes: resourceVersion too old; listing again")
                }
                WatchEnd::Failed(e) => {
                    self.sink.failed(Failure::Error);
                    self.sink.retrying(&self.w.path, &e, backoff);
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Lists every object (in pages) into the sink; returns the list's resourceVersion.
    async fn list(&self) -> Result<String, WatchEnd> {
        let mut cont = String::new();
        let mut fresh: Vec<Value> = Vec::new();
        let max = self.sink.max_objects();
        let mut cut = 0usize;
        let rv = loop {
            let mut extra = vec![("limit", PAGE.to_string())];
            if !cont.is_empty() {
                extra.push(("continue", cont.clone()));
            }
            let url = self.url(&extra).map_err(WatchEnd::Failed)?;
            let resp = tokio::select! {
                _ = self.cancel.cancelled() => return Err(WatchEnd::Cancelled),
                r = self.conn.get_within(url.clone(), self.sink.request_timeout()) => r?,
            };
            let body = tokio::select! {
                _ = self.cancel.cancelled() => return Err(WatchEnd::Cancelled),
                b = read_limited(resp) => match b {
                    Ok(b) => b,
                    Err(e) => {
                        if e.starts_with("answer larger") {
                            self.sink.failed(Failure::EventTooLarge);
                        }
                        return Err(WatchEnd::Failed(format!("{url}: {e}")));
                    }
                },
            };
            let mut list: Value = serde_json::from_slice(&body).map_err(|e| WatchEnd::Failed(format!("{url}: {e}")))?;
            if let Some(Value::Array(items)) = list.get_mut("items").map(Value::take) {
                for item in items {
                    if fresh.len() >= max {
                        cut += 1;
                        continue;
                    }
                    fresh.push(item);
                }
            }
            cont = str_at(&list, &["metadata", "continue"]).to_string();
            if cont.is_empty() {
                break str_at(&list, &["metadata", "resourceVersion"]).to_string();
            }
        };
        if cut > 0 {
            self.sink.failed(Failure::ObjectsCut);
            self.sink.objects_cut(cut);
        }
        self.sink.replace(fresh);
        Ok(rv)
    }

    /// Follows the watch stream from `rv` until it fails, is gone, or is cancelled.
    async fn watch(&self, mut rv: String) -> WatchEnd {
        loop {
            let extra = [
                ("watch", "1".to_string()),
                ("resourceVersion", rv.clone()),
                ("allowWatchBookmarks", "true".to_string()),
                ("timeoutSeconds", WATCH_SECONDS.to_string()),
            ];
            let url = match self.url(&extra) {
                Ok(u) => u,
                Err(e) => return WatchEnd::Failed(e),
            };
            let mut resp = tokio::select! {
                _ = self.cancel.cancelled() => return WatchEnd::Cancelled,
                r = self.conn.get_within(url, self.sink.request_timeout()) => match r { Ok(r) => r, Err(e) => return e },
            };
            let mut buf: Vec<u8> = Vec::new();
            loop {
                let chunk = tokio::select! {
                    _ = self.cancel.cancelled() => return WatchEnd::Cancelled,
                    c = tokio::time::timeout(Duration::from_secs(WATCH_SECONDS + 60), resp.chunk()) => c,
                };
                let chunk = match chunk {
                    Err(_) => return WatchEnd::Failed("watch stream silent for too long".into()),
                    Ok(Err(e)) => return WatchEnd::Failed(format!("watch stream: {e}")),
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(c))) => c,
                };
                buf.extend_from_slice(&chunk);
                let mut changed = false;
                while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    match self.event(&line[..line.len() - 1], &mut rv) {
                        Ok(c) => changed |= c,
                        Err(end) => {
                            if changed {
                                self.sink.flush();
                            }
                            return end;
                        }
                    }
                }
                if changed {
                    self.sink.flush();
                }
                if buf.len() > MAX_EVENT {
                    self.sink.failed(Failure::EventTooLarge);
                    return WatchEnd::Failed(format!("a watch event is larger than {MAX_EVENT} bytes"));
                }
            }
            if !buf.iter().all(u8::is_ascii_whitespace) {
                let line = std::mem::take(&mut buf);
                match self.event(&line, &mut rv) {
                    Ok(true) => self.sink.flush(),
                    Ok(false) => {}
                    Err(end) => return end,
                }
            }
        }
    }

    /// Applies one watch event; true when the sink's objects changed.
    fn event(&self, line: &[u8], rv: &mut String) -> Result<bool, WatchEnd> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(false);
        }
        let mut ev: Value =
            serde_json::from_slice(line).map_err(|e| WatchEnd::Failed(format!("bad watch event: {e}")))?;
        let obj = ev.get_mut("object").map(Value::take).unwrap_or(Value::Null);
        let kind = str_at(&ev, &["type"]);
        if kind == "ERROR" {
            let code = obj.get("code").and_then(Value::as_u64).unwrap_or(0);
            if code == 410 {
                return Err(WatchEnd::Gone);
            }
            return Err(WatchEnd::Failed(format!("watch error {code}: {}", str_at(&obj, &["message"]))));
        }
        let new_rv = str_at(&obj, &["metadata", "resourceVersion"]);
        if !new_rv.is_empty() {
            *rv = new_rv.to_string();
        }
        let t = match kind {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => return Ok(false),
            other => {
                tracing::debug!(event = %other, "kubernetes: unknown watch event type; ignored");
                return Ok(false);
            }
        };
        Ok(self.sink.apply(t, obj))
    }
}

/// Reads a whole answer, refusing one larger than [`MAX_EVENT`].
pub async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_EVENT {
            return Err(format!("answer larger than {MAX_EVENT} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_cluster_needs_the_environment() {
        assert_eq!(in_cluster_url(Some("10.0.0.1".into()), Some("443".into())).unwrap(), "https://10.0.0.1:443");
        assert_eq!(in_cluster_url(Some("fd00::1".into()), Some("443".into())).unwrap(), "https://[fd00::1]:443");
        assert!(in_cluster_url(None, Some("443".into())).is_err());
    }

    #[test]
    fn urls_are_checked() {
        let tls = TlsClientSettings::default();
        assert!(ApiConn::new("ftp://x", None, &tls).is_err());
        let c = ApiConn::new("http://127.0.0.1:1", None, &tls).unwrap();
        assert_eq!(c.base.as_str(), "http://127.0.0.1:1/");
        assert_eq!(core_path(Some("ml"), "pods"), "api/v1/namespaces/ml/pods");
    }
}
