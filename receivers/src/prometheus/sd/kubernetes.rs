//! `kubernetes_sd_configs` with roles `pod` and `endpoints`: list + watch against the API server
//! (`GET /api/v1[/namespaces/<ns>]/<pods|endpoints>` with `labelSelector` / `fieldSelector`, then
//! `?watch=1&resourceVersion=<rv>&allowWatchBookmarks=true`, handling `ADDED`, `MODIFIED`,
//! `DELETED`, `BOOKMARK` and `ERROR`; `410 Gone`, as a status or as an `ERROR` event, relists),
//! producing the `__meta_kubernetes_*` labels Prometheus produces.
//!
//! - pod: one group per pod (`__meta_kubernetes_namespace`, `__meta_kubernetes_pod_{name, ip,
//!   label_*, labelpresent_*, annotation_*, annotationpresent_*, ready, phase, node_name, host_ip,
//!   uid, controller_kind, controller_name}`), one target per declared container port
//!   (`container_{name, image, init, id, port_name, port_number, port_protocol}`), or one
//!   port-free target per container without ports; a pod without an IP has no targets.
//! - endpoints: one group per Endpoints object (`__meta_kubernetes_endpoints_{name, label_*,
//!   labelpresent_*, annotation_*, annotationpresent_*}`), one target per address and port
//!   (`__meta_kubernetes_endpoint_{hostname, node_name, ready, port_name, port_protocol,
//!   address_target_kind, address_target_name}`). The pod and service labels Prometheus also
//!   attaches to endpoints targets are not (no pod / service watch).
//!
//! Without `api_server`, the in-cluster service account is used: `https://$KUBERNETES_SERVICE_HOST:
//! $KUBERNETES_SERVICE_PORT`, the token (re-read as it rotates) and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount/`. `kubeconfig_file` is refused.
//! Bounded: at most [`MAX_OBJECTS`] objects per config and [`MAX_EVENT`] bytes per watch event.

use super::{SdContext, Slot, TargetGroup, sanitize};
use crate::prometheus::ScrapeAuth;
use crate::prometheus::config::{AuthorizationConfig, BasicAuthConfig, ScrapeTlsConfig};
use inferwatch_core::extension::client_auth::Secret;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The service account's files in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Most objects (pods or endpoints) one config tracks; more are ignored and counted.
pub const MAX_OBJECTS: usize = 50_000;
/// Largest watch event (one line of the stream) or list page.
pub const MAX_EVENT: usize = 8 * 1024 * 1024;
/// Page size of list requests.
pub const PAGE: usize = 500;
/// Server-side end of one watch request (it is then resumed from the last resourceVersion).
pub const WATCH_SECONDS: u64 = 300;
/// Most time a list page or the start of a watch may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `namespaces:` of a Kubernetes SD config.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    /// Namespaces to watch (none: all).
    #[serde(default)]
    pub names: Vec<String>,
    /// Also the namespace the agent runs in (from the service account).
    #[serde(default)]
    pub own_namespace: bool,
}

/// One `selectors:` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// The role it filters (must be the config's role).
    pub role: String,
    /// A label selector (`app=vllm,tier!=cache`).
    #[serde(default)]
    pub label: Option<String>,
    /// A field selector (`spec.nodeName=node-1`).
    #[serde(default)]
    pub field: Option<String>,
}

/// One `kubernetes_sd_configs` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSdConfig {
    /// `pod` or `endpoints`.
    pub role: String,
    /// The API server URL (default: in-cluster).
    #[serde(default)]
    pub api_server: Option<String>,
    /// Refused: use in-cluster credentials or `api_server` with TLS and credentials.
    #[serde(default)]
    pub kubeconfig_file: Option<String>,
    /// Which namespaces.
    #[serde(default)]
    pub namespaces: Option<Namespaces>,
    /// Label / field selectors sent to the API server.
    #[serde(default)]
    pub selectors: Vec<Selector>,
    /// TLS towards `api_server`.
    #[serde(default)]
    pub tls_config: Option<ScrapeTlsConfig>,
    /// `Authorization` header towards `api_server`.
    #[serde(default)]
    pub authorization: Option<AuthorizationConfig>,
    /// HTTP Basic credentials towards `api_server`.
    #[serde(default)]
    pub basic_auth: Option<BasicAuthConfig>,
    /// Bearer token (deprecated in Prometheus).
    #[serde(default)]
    pub bearer_token: Option<Secret>,
    /// Bearer token file (deprecated in Prometheus).
    #[serde(default)]
    pub bearer_token_file: Option<String>,
    /// Follow redirects (default true).
    #[serde(default = "yes")]
    pub follow_redirects: bool,
}

fn yes() -> bool {
    true
}

/// The two supported roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Pods.
    Pod,
    /// Endpoints.
    Endpoints,
}

impl Role {
    fn resource(self) -> &'static str {
        match self {
            Role::Pod => "pods",
            Role::Endpoints => "endpoints",
        }
    }
}

impl KubernetesSdConfig {
    /// Checks the settings; the error names the field (relative to the entry).
    pub fn check(&self) -> Result<Role, (Vec<String>, String)> {
        let role = match self.role.as_str() {
            "pod" => Role::Pod,
            "endpoints" => Role::Endpoints,
            other => {
                return Err((
                    vec!["role".into()],
                    format!(
                        "unknown Kubernetes SD role {other:?} (pod, endpoints; node, service, endpointslice \
                         and ingress are not supported)"
                    ),
                ));
            }
        };
        if self.kubeconfig_file.is_some() {
            return Err((
                vec!["kubeconfig_file".into()],
                "kubeconfig files are not supported: run in the cluster (service account) or set api_server \
                 with tls_config and authorization"
                    .into(),
            ));
        }
        if let Some(a) = &self.api_server {
            match reqwest::Url::parse(a) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
                _ => return Err((vec!["api_server".into()], format!("{a:?} is not an http(s) URL"))),
            }
        } else if self.tls_config.is_some()
            || self.authorization.is_some()
            || self.basic_auth.is_some()
            || self.bearer_token.is_some()
            || self.bearer_token_file.is_some()
        {
            return Err((
                vec!["api_server".into()],
                "TLS and credentials settings need api_server (in the cluster the service account is used)".into(),
            ));
        }
        let mut seen = HashSet::new();
        for (i, s) in self.selectors.iter().enumerate() {
            let at = |k: &str| vec!["selectors".into(), i.to_string(), k.into()];
            if s.role != self.role {
                return Err((
                    at("role"),
                    format!(
                        "selector role {:?} is not supported for role {:?} (only the config's own role)",
                        s.role, self.role
                    ),
                ));
            }
            if !seen.insert(s.role.clone()) {
                return Err((at("role"), format!("duplicated selector role {:?}", s.role)));
            }
        }
        if let Some(n) = &self.namespaces {
            for (i, name) in n.names.iter().enumerate() {
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
                    return Err((
                        vec!["namespaces".into(), "names".into(), i.to_string()],
                        format!("{name:?} is not a namespace name"),
                    ));
                }
            }
        }
        Ok(role)
    }

    /// The namespaces to watch (empty: all), reading the own namespace if asked.
    pub fn namespace_list(&self) -> Result<Vec<String>, String> {
        let Some(n) = &self.namespaces else { return Ok(Vec::new()) };
        let mut out = n.names.clone();
        if n.own_namespace {
            let p = format!("{SERVICE_ACCOUNT_DIR}/namespace");
            let own =
                std::fs::read_to_string(&p).map_err(|e| format!("namespaces.own_namespace: cannot read {p}: {e}"))?;
            out.push(own.trim().to_string());
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn selector_query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        for s in &self.selectors {
            if let Some(l) = &s.label {
                q.push(("labelSelector", l.clone()));
            }
            if let Some(f) = &s.field {
                q.push(("fieldSelector", f.clone()));
            }
        }
        q
    }
}

/// The in-cluster API server URL from `KUBERNETES_SERVICE_HOST` / `_PORT`.
pub fn in_cluster_url(host: Option<String>, port: Option<String>) -> Result<String, String> {
    match (host, port) {
        (Some(h), Some(p)) if !h.is_empty() && !p.is_empty() => {
            let h = if h.contains(':') { format!("[{h}]") } else { h };
            Ok(format!("https://{h}:{p}"))
        }
        _ => Err("api_server is not set and KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT are not in the \
                  environment: not running in a cluster"
            .into()),
    }
}

/// How to reach the API server.
#[derive(Clone)]
pub struct ApiConn {
    /// Base URL (`https://10.0.0.1:443`).
    pub base: reqwest::Url,
    /// The HTTP client (TLS).
    pub client: reqwest::Client,
    /// Credentials.
    pub auth: Option<Arc<ScrapeAuth>>,
}

/// Why a list or watch stopped.
#[derive(Debug)]
enum WatchEnd {
    /// The resourceVersion is too old: list again.
    Gone,
    /// Anything else: back off, then list again.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

/// The objects one config tracks, keyed `namespace/name`, shared by its namespace tasks.
struct Store {
    groups: Mutex<BTreeMap<String, TargetGroup>>,
    slot: Slot,
    ctx: SdContext,
}

impl Store {
    fn publish(&self) {
        let all: Vec<TargetGroup> = self.groups.lock().values().cloned().collect();
        if self.slot.publish(all) > 0 {
            self.ctx.failed("kubernetes", "sd_targets_cut");
        }
    }

    fn upsert(&self, key: String, g: TargetGroup) {
        let mut m = self.groups.lock();
        if !m.contains_key(&key) && m.len() >= MAX_OBJECTS {
            drop(m);
            self.ctx.failed("kubernetes", "kubernetes_sd_objects_cut");
            return;
        }
        m.insert(key, g);
    }
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn object_key(obj: &Value) -> String {
    format!("{}/{}", s(obj, &["metadata", "namespace"]), s(obj, &["metadata", "name"]))
}

fn join_host_port(ip: &str, port: &str) -> String {
    if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
}

fn number(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

/// `metadata.labels` and `metadata.annotations` as `<prefix>_label_*` etc.
fn meta_maps(obj: &Value, prefix: &str, out: &mut BTreeMap<String, String>) {
    for (field, kind) in [("labels", "label"), ("annotations", "annotation")] {
        if let Some(m) = obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_object) {
            for (k, v) in m {
                let name = sanitize(k);
                out.insert(format!("{prefix}_{kind}_{name}"), v.as_str().unwrap_or("").to_string());
                out.insert(format!("{prefix}_{kind}present_{name}"), "true".into());
            }
        }
    }
}

/// A pod's target group, as Prometheus' pod role builds it.
pub fn pod_group(pod: &Value) -> TargetGroup {
    let ns = s(pod, &["metadata", "namespace"]);
    let name = s(pod, &["metadata", "name"]);
    let mut labels = BTreeMap::new();
    let p = "__meta_kubernetes_pod";
    labels.insert("__meta_kubernetes_namespace".to_string(), ns.to_string());
    labels.insert(format!("{p}_name"), name.to_string());
    let ip = s(pod, &["status", "podIP"]);
    labels.insert(format!("{p}_ip"), ip.to_string());
    let ready = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| s(c, &["type"]) == "Ready"))
        .map_or("unknown".to_string(), |c| s(c, &["status"]).to_lowercase());
    labels.insert(format!("{p}_ready"), ready);
    labels.insert(format!("{p}_phase"), s(pod, &["status", "phase"]).to_string());
    labels.insert(format!("{p}_node_name"), s(pod, &["spec", "nodeName"]).to_string());
    labels.insert(format!("{p}_host_ip"), s(pod, &["status", "hostIP"]).to_string());
    labels.insert(format!("{p}_uid"), s(pod, &["metadata", "uid"]).to_string());
    if let Some(owner) = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|os| os.iter().find(|o| o.get("controller").and_then(Value::as_bool) == Some(true)))
    {
        labels.insert(format!("{p}_controller_kind"), s(owner, &["kind"]).to_string());
        labels.insert(format!("{p}_controller_name"), s(owner, &["name"]).to_string());
    }
    meta_maps(pod, p, &mut labels);
    labels.retain(|_, v| !v.is_empty());
    let mut g = TargetGroup { source: format!("pod/{ns}/{name}"), targets: Vec::new(), labels };
    if ip.is_empty() {
        return g;
    }
    let statuses = |field: &str| -> BTreeMap<String, String> {
        pod.pointer(&format!("/status/{field}"))
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|c| (s(c, &["name"]).to_string(), s(c, &["containerID"]).to_string())).collect())
            .unwrap_or_default()
    };
    for (field, status_field, init) in
        [("containers", "containerStatuses", "false"), ("initContainers", "initContainerStatuses", "true")]
    {
        let ids = statuses(status_field);
        let Some(cs) = pod.pointer(&format!("/spec/{field}")).and_then(Value::as_array) else { continue };
        for c in cs {
            let cname = s(c, &["name"]);
            let mut base = BTreeMap::new();
            base.insert(format!("{p}_container_name"), cname.to_string());
            base.insert(format!("{p}_container_image"), s(c, &["image"]).to_string());
            base.insert(format!("{p}_container_init"), init.to_string());
            if let Some(id) = ids.get(cname).filter(|i| !i.is_empty()) {
                base.insert(format!("{p}_container_id"), id.clone());
            }
            let ports = c.get("ports").and_then(Value::as_array).filter(|a| !a.is_empty());
            match ports {
                None => {
                    let mut t = base.clone();
                    t.insert("__address__".into(), ip.to_string());
                    g.targets.push(t);
                }
                Some(ports) => {
                    for port in ports {
                        let num = port.get("containerPort").map(number).unwrap_or_default();
                        let mut t = base.clone();
                        t.insert("__address__".into(), join_host_port(ip, &num));
                        t.insert(format!("{p}_container_port_name"), s(port, &["name"]).to_string());
                        t.insert(format!("{p}_container_port_number"), num);
                        let proto = s(port, &["protocol"]);
                        t.insert(
                            format!("{p}_container_port_protocol"),
                            if proto.is_empty() { "TCP" } else { proto }.to_string(),
                        );
                        t.retain(|_, v| !v.is_empty());
                        g.targets.push(t);
                    }
                }
            }
        }
    }
    g
}

/// An Endpoints object's target group, as Prometheus' endpoints role builds it.
pub fn endpoints_group(ep: &Value) -> TargetGroup {
    let ns = s(ep, &["metadata", "namespace"]);
    let name = s(ep, &["metadata", "name"]);
    let mut labels = BTreeMap::new();
    labels.insert("__meta_kubernetes_namespace".to_string(), ns.to_string());
    labels.insert("__meta_kubernetes_endpoints_name".to_string(), name.to_string());
    meta_maps(ep, "__meta_kubernetes_endpoints", &mut labels);
    labels.retain(|_, v| !v.is_empty());
    let mut g = TargetGroup { source: format!("endpoints/{ns}/{name}"), targets: Vec::new(), labels };
    let e = "__meta_kubernetes_endpoint";
    for subset in ep.get("subsets").and_then(Value::as_array).into_iter().flatten() {
        let ports = subset.get("ports").and_then(Value::as_array).cloned().unwrap_or_default();
        for (field, ready) in [("addresses", "true"), ("notReadyAddresses", "false")] {
            for addr in subset.get(field).and_then(Value::as_array).into_iter().flatten() {
                for port in &ports {
                    let num = port.get("port").map(number).unwrap_or_default();
                    let mut t = BTreeMap::new();
                    t.insert("__address__".to_string(), join_host_port(s(addr, &["ip"]), &num));
                    t.insert(format!("{e}_port_name"), s(port, &["name"]).to_string());
                    let proto = s(port, &["protocol"]);
                    t.insert(format!("{e}_port_protocol"), if proto.is_empty() { "TCP" } else { proto }.to_string());
                    t.insert(format!("{e}_ready"), ready.to_string());
                    t.insert(format!("{e}_hostname"), s(addr, &["hostname"]).to_string());
                    t.insert(format!("{e}_node_name"), s(addr, &["nodeName"]).to_string());
                    t.insert(format!("{e}_address_target_kind"), s(addr, &["targetRef", "kind"]).to_string());
                    t.insert(format!("{e}_address_target_name"), s(addr, &["targetRef", "name"]).to_string());
                    t.retain(|_, v| !v.is_empty());
                    g.targets.push(t);
                }
            }
        }
    }
    g
}

fn group_of(role: Role, obj: &Value) -> TargetGroup {
    match role {
        Role::Pod => pod_group(obj),
        Role::Endpoints => endpoints_group(obj),
    }
}

/// Runs discovery until cancelled: one list + watch per namespace (or one for all).
pub async fn run(
    cfg: KubernetesSdConfig,
    role: Role,
    conn: ApiConn,
    namespaces: Vec<String>,
    slot: Slot,
    ctx: SdContext,
    cancel: CancellationToken,
) {
    let store = Arc::new(Store { groups: Mutex::new(BTreeMap::new()), slot, ctx });
    let query = cfg.selector_query();
    let paths: Vec<String> = if namespaces.is_empty() {
        vec![format!("api/v1/{}", role.resource())]
    } else {
        namespaces.iter().map(|ns| format!("api/v1/namespaces/{ns}/{}", role.resource())).collect()
    };
    let tasks: Vec<_> = paths
        .into_iter()
        .map(|path| {
            let w = Watcher {
                role,
                conn: conn.clone(),
                path,
                query: query.clone(),
                store: store.clone(),
                cancel: cancel.clone(),
            };
            tokio::spawn(w.run())
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

struct Watcher {
    role: Role,
    conn: ApiConn,
    path: String,
    query: Vec<(&'static str, String)>,
    store: Arc<Store>,
    cancel: CancellationToken,
}

impl Watcher {
    fn url(&self, extra: &[(&str, String)]) -> Result<reqwest::Url, String> {
        let mut u = self.conn.base.join(&self.path).map_err(|e| format!("{}: {e}", self.path))?;
        {
            let mut q = u.query_pairs_mut();
            for (k, v) in self.query.iter().map(|(k, v)| (*k, v)).chain(extra.iter().map(|(k, v)| (*k, v))) {
                q.append_pair(k, v);
            }
        }
        Ok(u)
    }

    async fn get(&self, url: reqwest::Url) -> Result<reqwest::Response, WatchEnd> {
        let headers = match &self.conn.auth {
            Some(a) => a.headers().map_err(WatchEnd::Failed)?,
            None => http::HeaderMap::new(),
        };
        let send =
            self.conn.client.get(url.clone()).headers(headers).header(http::header::ACCEPT, "application/json").send();
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, send).await {
            Err(_) => return Err(WatchEnd::Failed(format!("{url}: no answer within {REQUEST_TIMEOUT:?}"))),
            Ok(Err(e)) => return Err(WatchEnd::Failed(format!("{url}: {e}"))),
            Ok(Ok(r)) => r,
        };
        match resp.status().as_u16() {
            200 => Ok(resp),
            410 => Err(WatchEnd::Gone),
            code => Err(WatchEnd::Failed(format!("{url}: HTTP {code}"))),
        }
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
                    tracing::debug!(path = %self.path, "kubernetes_sd: resourceVersion too old; listing again");
                }
                WatchEnd::Failed(e) => {
                    self.store.ctx.failed("kubernetes", "kubernetes_sd_error");
                    tracing::warn!(job = %self.store.ctx.job, error = %e, "kubernetes_sd: list/watch failed; retrying in {backoff:?}");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Lists every object (in pages) and replaces this path's objects; returns the resourceVersion.
    async fn list(&self) -> Result<String, WatchEnd> {
        let mut cont = String::new();
        let mut fresh: BTreeMap<String, TargetGroup> = BTreeMap::new();
        let rv = loop {
            let mut extra = vec![("limit", PAGE.to_string())];
            if !cont.is_empty() {
                extra.push(("continue", cont.clone()));
            }
            let url = self.url(&extra).map_err(WatchEnd::Failed)?;
            let resp = tokio::select! {
                _ = self.cancel.cancelled() => return Err(WatchEnd::Cancelled),
                r = self.get(url.clone()) => r?,
            };
            let body = tokio::select! {
                _ = self.cancel.cancelled() => return Err(WatchEnd::Cancelled),
                b = read_limited(resp) => b.map_err(|e| WatchEnd::Failed(format!("{url}: {e}")))?,
            };
            let list: Value = serde_json::from_slice(&body).map_err(|e| WatchEnd::Failed(format!("{url}: {e}")))?;
            for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                if fresh.len() >= MAX_OBJECTS {
                    self.store.ctx.failed("kubernetes", "kubernetes_sd_objects_cut");
                    break;
                }
                fresh.insert(object_key(item), group_of(self.role, item));
            }
            cont = s(&list, &["metadata", "continue"]).to_string();
            if cont.is_empty() {
                break s(&list, &["metadata", "resourceVersion"]).to_string();
            }
        };
        {
            let mut m = self.store.groups.lock();
            let prefix = self.namespace_prefix();
            m.retain(|k, _| !prefix.as_ref().is_none_or(|p| k.starts_with(p.as_str())));
            for (k, g) in fresh {
                if m.len() < MAX_OBJECTS {
                    m.insert(k, g);
                }
            }
        }
        self.store.publish();
        Ok(rv)
    }

    /// `Some("ns/")` for a namespaced path, `None` for all namespaces.
    fn namespace_prefix(&self) -> Option<String> {
        self.path.strip_prefix("api/v1/namespaces/").and_then(|r| r.split('/').next()).map(|ns| format!("{ns}/"))
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
                r = self.get(url) => match r { Ok(r) => r, Err(e) => return e },
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
                                self.store.publish();
                            }
                            return end;
                        }
                    }
                }
                if changed {
                    self.store.publish();
                }
                if buf.len() > MAX_EVENT {
                    self.store.ctx.failed("kubernetes", "kubernetes_sd_event_too_large");
                    return WatchEnd::Failed(format!("a watch event is larger than {MAX_EVENT} bytes"));
                }
            }
            if !buf.iter().all(u8::is_ascii_whitespace) {
                let line = std::mem::take(&mut buf);
                match self.event(&line, &mut rv) {
                    Ok(true) => self.store.publish(),
                    Ok(false) => {}
                    Err(end) => return end,
                }
            }
        }
    }

    /// Applies one watch event; true when the objects changed.
    fn event(&self, line: &[u8], rv: &mut String) -> Result<bool, WatchEnd> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(false);
        }
        let ev: Value = serde_json::from_slice(line).map_err(|e| WatchEnd::Failed(format!("bad watch event: {e}")))?;
        let obj = ev.get("object").cloned().unwrap_or(Value::Null);
        let kind = s(&ev, &["type"]);
        if kind == "ERROR" {
            let code = obj.get("code").and_then(Value::as_u64).unwrap_or(0);
            if code == 410 {
                return Err(WatchEnd::Gone);
            }
            return Err(WatchEnd::Failed(format!("watch error {code}: {}", s(&obj, &["message"]))));
        }
        let new_rv = s(&obj, &["metadata", "resourceVersion"]);
        if !new_rv.is_empty() {
            *rv = new_rv.to_string();
        }
        match kind {
            "ADDED" | "MODIFIED" => {
                self.store.upsert(object_key(&obj), group_of(self.role, &obj));
                Ok(true)
            }
            "DELETED" => Ok(self.store.groups.lock().remove(&object_key(&obj)).is_some()),
            "BOOKMARK" => Ok(false),
            other => {
                tracing::debug!(event = %other, "kubernetes_sd: unknown watch event type; ignored");
                Ok(false)
            }
        }
    }
}

async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
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
    fn roles_and_kubeconfig_are_checked() {
        let c = |v: serde_json::Value| serde_json::from_value::<KubernetesSdConfig>(v).unwrap().check();
        assert_eq!(c(serde_json::json!({"role": "node"})).unwrap_err().0, vec!["role".to_string()]);
        assert_eq!(
            c(serde_json::json!({"role": "pod", "kubeconfig_file": "k"})).unwrap_err().0,
            vec!["kubeconfig_file".to_string()]
        );
        assert_eq!(
            c(serde_json::json!({"role": "pod", "selectors": [{"role": "service", "label": "a=b"}]})).unwrap_err().0,
            vec!["selectors".to_string(), "0".into(), "role".into()]
        );
        assert!(c(serde_json::json!({"role": "endpoints", "namespaces": {"names": ["ml"]}})).is_ok());
    }

    #[test]
    fn in_cluster_needs_the_environment() {
        assert_eq!(in_cluster_url(Some("10.0.0.1".into()), Some("443".into())).unwrap(), "https://10.0.0.1:443");
        assert_eq!(in_cluster_url(Some("fd00::1".into()), Some("443".into())).unwrap(), "https://[fd00::1]:443");
        assert!(in_cluster_url(None, Some("443".into())).is_err());
    }
}
