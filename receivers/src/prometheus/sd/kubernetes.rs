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
//! - endpoints: one group per Endpoints object (`__meta_kubernetes_namespace`,
//!   `__meta_kubernetes_endpoints_{name, label_*, labelpresent_*, annotation_*,
//!   annotationpresent_*}`, and, when the Service of the same name exists, its
//!   `__meta_kubernetes_service_{name, label_*, labelpresent_*, annotation_*,
//!   annotationpresent_*}`), one target per port and address, ready ones first
//!   (`__meta_kubernetes_endpoint_{ready, port_name, port_protocol, node_name, hostname,
//!   address_target_kind, address_target_name}`). As Prometheus' `endpoints.go`, an address whose
//!   `targetRef` is a known pod also carries that pod's labels (`__meta_kubernetes_pod_*`) and
//!   the container labels of the first container declaring the endpoint's port number, and
//!   every declared container port of such a pod that no endpoint port uses becomes a target
//!   too. Services and pods come from their own list + watch of the same namespaces (the role
//!   needs `list` / `watch` on endpoints, services and pods); `selectors` may name the roles
//!   `endpoints`, `service` and `pod`, each applied to its own watch.
//!
//! Without `api_server`, the in-cluster service account is used: `https://$KUBERNETES_SERVICE_HOST:
//! $KUBERNETES_SERVICE_PORT`, the token (re-read as it rotates) and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount/`. `kubeconfig_file` is refused.
//! Bounded: at most [`MAX_OBJECTS`] objects per config and [`MAX_EVENT`] bytes per watch event.
//! The list + watch loop itself is [`inferwatch_core::kube`], shared with `k8sattributes`.

use super::{SdContext, Slot, TargetGroup, sanitize};
use crate::prometheus::ScrapeAuth;
use crate::prometheus::http_client::HttpClientConfig;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;

use inferwatch_core::kube::{self, EventType, Failure, WatchSink, str_at as s};
pub use inferwatch_core::kube::{MAX_EVENT, MAX_OBJECTS, PAGE, REQUEST_TIMEOUT, SERVICE_ACCOUNT_DIR, WATCH_SECONDS};

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

/// One `kubernetes_sd_configs` entry. (Its `Deserialize` is in [`crate::prometheus::http_client`].)
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(remote = "Self", deny_unknown_fields)]
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
    /// TLS, credentials and redirects towards `api_server`.
    #[serde(skip)]
    pub http: HttpClientConfig,
}

/// The two supported roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Pods.
    Pod,
    /// Endpoints.
    Endpoints,
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
        } else if self.http.is_set() {
            return Err((
                vec!["api_server".into()],
                "TLS, credentials and proxy settings need api_server (in the cluster the service account is used, directly)".into(),
            ));
        }
        let mut seen = HashSet::new();
        for (i, s) in self.selectors.iter().enumerate() {
            let at = |k: &str| vec!["selectors".into(), i.to_string(), k.into()];
            let allowed: &[&str] = match role {
                Role::Pod => &["pod"],
                Role::Endpoints => &["endpoints", "service", "pod"],
            };
            if !allowed.contains(&s.role.as_str()) {
                return Err((
                    at("role"),
                    format!(
                        "selector role {:?} is not supported for role {:?} (allowed: {})",
                        s.role,
                        self.role,
                        allowed.join(", ")
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

    /// The `labelSelector` / `fieldSelector` query of the watch of `role`'s objects.
    fn selector_query(&self, role: &str) -> Query {
        let mut q = Vec::new();
        for s in self.selectors.iter().filter(|s| s.role == role) {
            if let Some(l) = &s.label {
                q.push(("labelSelector".to_string(), l.clone()));
            }
            if let Some(f) = &s.field {
                q.push(("fieldSelector".to_string(), f.clone()));
            }
        }
        q
    }
}

/// The in-cluster API server URL from `KUBERNETES_SERVICE_HOST` / `_PORT`.
pub fn in_cluster_url(host: Option<String>, port: Option<String>) -> Result<String, String> {
    kube::in_cluster_url(host, port).map_err(|e| format!("api_server is not set and {e}"))
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

/// A job's credentials as the shared API client's authenticator.
struct Credentials(Arc<ScrapeAuth>);

impl inferwatch_core::auth::ClientAuth for Credentials {
    fn headers(&self) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, inferwatch_core::auth::AuthError> {
        let h = self.0.headers().map_err(inferwatch_core::auth::AuthError::Unavailable)?;
        Ok(h.into_iter().filter_map(|(k, v)| Some((k?, v))).collect())
    }
}

impl ApiConn {
    fn shared(&self) -> kube::ApiConn {
        kube::ApiConn {
            base: self.base.clone(),
            client: self.client.clone(),
            auth: self.auth.clone().map(|a| Arc::new(Credentials(a)) as Arc<dyn inferwatch_core::auth::ClientAuth>),
        }
    }
}

/// The objects one config tracks, keyed `namespace/name`, shared by its namespace tasks: pod
/// groups (role pod), or Endpoints objects with the pods their targets refer to and the
/// services they are named after (role endpoints, whose groups are built at each publication).
struct Store {
    role: Role,
    groups: Mutex<BTreeMap<String, TargetGroup>>,
    endpoints: Mutex<BTreeMap<String, Value>>,
    pods: Mutex<BTreeMap<String, Value>>,
    services: Mutex<BTreeMap<String, Value>>,
    /// Feeds whose first list has not come yet: nothing is published before every one has
    /// listed (as Prometheus waits for its informers' caches to sync), so that no target is
    /// started or dropped on a partial view (endpoints without their service, say).
    unlisted: AtomicUsize,
    slot: Slot,
    ctx: SdContext,
}

impl Store {
    fn publish(&self) {
        if self.unlisted.load(Ordering::SeqCst) > 0 {
            return;
        }
        let all: Vec<TargetGroup> = match self.role {
            Role::Pod => self.groups.lock().values().cloned().collect(),
            Role::Endpoints => {
                let (pods, services) = (self.pods.lock(), self.services.lock());
                self.endpoints.lock().values().map(|ep| endpoints_group(ep, &pods, &services)).collect()
            }
        };
        if self.slot.publish(all) > 0 {
            self.ctx.failed("kubernetes", "sd_targets_cut");
        }
    }

    fn cut(&self) {
        self.ctx.failed("kubernetes", "kubernetes_sd_objects_cut");
    }
}

/// The query pairs of a list + watch (`labelSelector`, `fieldSelector`).
type Query = Vec<(String, String)>;

/// Which objects one list + watch brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The config's role: pods (role pod) or Endpoints objects (role endpoints).
    Main,
    /// Role endpoints: the pods that addresses refer to.
    Pods,
    /// Role endpoints: the Services the Endpoints objects are named after.
    Services,
}

/// What one list + watch feeds: objects of `kind`, of one namespace (`prefix` `ns/`) or of all
/// (`None`).
struct Feed {
    store: Arc<Store>,
    kind: Kind,
    prefix: Option<String>,
    /// The first list has come.
    listed: AtomicBool,
}

/// Replaces the objects of `prefix` in `m` by `fresh`, keeping at most [`MAX_OBJECTS`].
fn replace_in<T>(m: &mut BTreeMap<String, T>, prefix: &Option<String>, fresh: Vec<(String, T)>) -> bool {
    m.retain(|k, _| !prefix.as_ref().is_none_or(|p| k.starts_with(p.as_str())));
    let mut cut = false;
    for (k, v) in fresh {
        if m.len() < MAX_OBJECTS || m.contains_key(&k) {
            m.insert(k, v);
        } else {
            cut = true;
        }
    }
    cut
}

/// Inserts or removes one object; false (and counted) when the map is full.
fn apply_in<T>(m: &mut BTreeMap<String, T>, event: EventType, key: String, v: T) -> Result<bool, ()> {
    if event == EventType::Deleted {
        return Ok(m.remove(&key).is_some());
    }
    if !m.contains_key(&key) && m.len() >= MAX_OBJECTS {
        return Err(());
    }
    m.insert(key, v);
    Ok(true)
}

impl WatchSink for Feed {
    fn replace(&self, objects: Vec<Value>) {
        let st = &self.store;
        let cut = match (st.role, self.kind) {
            (Role::Pod, _) => {
                let fresh = objects.iter().map(|o| (object_key(o), pod_group(o))).collect();
                replace_in(&mut st.groups.lock(), &self.prefix, fresh)
            }
            (Role::Endpoints, Kind::Main) => {
                let fresh = objects.into_iter().map(|o| (object_key(&o), o)).collect();
                replace_in(&mut st.endpoints.lock(), &self.prefix, fresh)
            }
            (Role::Endpoints, Kind::Pods) => {
                let fresh = objects.into_iter().map(|o| (object_key(&o), slim_pod(o))).collect();
                replace_in(&mut st.pods.lock(), &self.prefix, fresh)
            }
            (Role::Endpoints, Kind::Services) => {
                let fresh = objects.into_iter().map(|o| (object_key(&o), slim_meta(o))).collect();
                replace_in(&mut st.services.lock(), &self.prefix, fresh)
            }
        };
        if cut {
            st.cut();
        }
        if !self.listed.swap(true, Ordering::SeqCst) {
            st.unlisted.fetch_sub(1, Ordering::SeqCst);
        }
        st.publish();
    }

    fn apply(&self, event: EventType, obj: Value) -> bool {
        let st = &self.store;
        let key = object_key(&obj);
        let r = match (st.role, self.kind) {
            (Role::Pod, _) => apply_in(&mut st.groups.lock(), event, key, pod_group(&obj)),
            (Role::Endpoints, Kind::Main) => apply_in(&mut st.endpoints.lock(), event, key, obj),
            (Role::Endpoints, Kind::Pods) => apply_in(&mut st.pods.lock(), event, key, slim_pod(obj)),
            (Role::Endpoints, Kind::Services) => apply_in(&mut st.services.lock(), event, key, slim_meta(obj)),
        };
        r.unwrap_or_else(|()| {
            st.cut();
            false
        })
    }

    fn flush(&self) {
        self.store.publish();
    }

    fn failed(&self, failure: Failure) {
        let reason = match failure {
            Failure::Error => "kubernetes_sd_error",
            Failure::ObjectsCut => "kubernetes_sd_objects_cut",
            Failure::EventTooLarge => "kubernetes_sd_event_too_large",
        };
        self.store.ctx.failed("kubernetes", reason);
    }
}

/// A pod without what the endpoints role does not read (managed fields, volumes, env, ...).
fn slim_pod(mut pod: Value) -> Value {
    if let Some(m) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.retain(|k, _| matches!(k.as_str(), "nodeName" | "containers" | "initContainers"));
        for field in ["containers", "initContainers"] {
            for c in spec.get_mut(field).and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(c) = c.as_object_mut() {
                    c.retain(|k, _| matches!(k.as_str(), "name" | "image" | "ports"));
                }
            }
        }
    }
    pod
}

/// An object's name, namespace, labels and annotations only (what a Service gives a target).
fn slim_meta(obj: Value) -> Value {
    let mut meta = serde_json::Map::new();
    if let Some(Value::Object(m)) = obj.get("metadata") {
        for k in ["name", "namespace", "labels", "annotations"] {
            if let Some(v) = m.get(k) {
                meta.insert(k.to_string(), v.clone());
            }
        }
    }
    serde_json::json!({ "metadata": meta })
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

/// The `__meta_kubernetes_pod_*` labels of a pod itself (not of a container).
fn pod_labels(pod: &Value) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let p = "__meta_kubernetes_pod";
    labels.insert(format!("{p}_name"), s(pod, &["metadata", "name"]).to_string());
    labels.insert(format!("{p}_ip"), s(pod, &["status", "podIP"]).to_string());
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
    labels
}

/// A pod's target group, as Prometheus' pod role builds it.
pub fn pod_group(pod: &Value) -> TargetGroup {
    let ns = s(pod, &["metadata", "namespace"]);
    let name = s(pod, &["metadata", "name"]);
    let p = "__meta_kubernetes_pod";
    let ip = s(pod, &["status", "podIP"]);
    let mut labels = pod_labels(pod);
    labels.insert("__meta_kubernetes_namespace".to_string(), ns.to_string());
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

/// The container labels of an endpoints target at container `c`'s port `port`, with `protocol`
/// (as Prometheus: the endpoint port's for a port an endpoint uses, else the container port's).
fn container_port_labels(c: &Value, init: bool, port: &Value, protocol: &str, t: &mut BTreeMap<String, String>) {
    let p = "__meta_kubernetes_pod";
    t.insert(format!("{p}_container_name"), s(c, &["name"]).to_string());
    t.insert(format!("{p}_container_image"), s(c, &["image"]).to_string());
    t.insert(format!("{p}_container_init"), init.to_string());
    t.insert(format!("{p}_container_port_name"), s(port, &["name"]).to_string());
    t.insert(format!("{p}_container_port_number"), port.get("containerPort").map(number).unwrap_or_default());
    t.insert(format!("{p}_container_port_protocol"), protocol.to_string());
}

/// A port's protocol (the API server's default, `TCP`, when absent).
fn protocol(port: &Value) -> &str {
    match s(port, &["protocol"]) {
        "" => "TCP",
        p => p,
    }
}

/// Every declared container port of a pod: (container, is init, port), containers first.
fn container_ports(pod: &Value) -> Vec<(&Value, bool, &Value)> {
    let mut out = Vec::new();
    for (field, init) in [("containers", false), ("initContainers", true)] {
        for c in pod.pointer(&format!("/spec/{field}")).and_then(Value::as_array).into_iter().flatten() {
            for port in c.get("ports").and_then(Value::as_array).into_iter().flatten() {
                out.push((c, init, port));
            }
        }
    }
    out
}

/// A Service's labels as the endpoints role attaches them to its Endpoints' group.
fn service_labels(svc: &Value, out: &mut BTreeMap<String, String>) {
    out.insert("__meta_kubernetes_service_name".to_string(), s(svc, &["metadata", "name"]).to_string());
    meta_maps(svc, "__meta_kubernetes_service", out);
}

/// An Endpoints object's target group, as Prometheus' endpoints role builds it: `pods` and
/// `services` (keyed `namespace/name`) give the pod and container labels of addresses whose
/// `targetRef` is a pod, and the labels of the Service of the same name.
pub fn endpoints_group(ep: &Value, pods: &BTreeMap<String, Value>, services: &BTreeMap<String, Value>) -> TargetGroup {
    let ns = s(ep, &["metadata", "namespace"]);
    let name = s(ep, &["metadata", "name"]);
    let mut labels = BTreeMap::new();
    labels.insert("__meta_kubernetes_namespace".to_string(), ns.to_string());
    labels.insert("__meta_kubernetes_endpoints_name".to_string(), name.to_string());
    if let Some(svc) = services.get(&format!("{ns}/{name}")) {
        service_labels(svc, &mut labels);
    }
    meta_maps(ep, "__meta_kubernetes_endpoints", &mut labels);
    labels.retain(|_, v| !v.is_empty());
    let mut g = TargetGroup { source: format!("endpoints/{ns}/{name}"), targets: Vec::new(), labels };
    let e = "__meta_kubernetes_endpoint";
    // Pods seen in this object, and the port numbers its endpoint ports use on them.
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for subset in ep.get("subsets").and_then(Value::as_array).into_iter().flatten() {
        for port in subset.get("ports").and_then(Value::as_array).into_iter().flatten() {
            let num = port.get("port").map(number).unwrap_or_default();
            let proto = protocol(port);
            for (field, ready) in [("addresses", "true"), ("notReadyAddresses", "false")] {
                for addr in subset.get(field).and_then(Value::as_array).into_iter().flatten() {
                    let mut t = BTreeMap::new();
                    t.insert("__address__".to_string(), join_host_port(s(addr, &["ip"]), &num));
                    t.insert(format!("{e}_port_name"), s(port, &["name"]).to_string());
                    t.insert(format!("{e}_port_protocol"), proto.to_string());
                    t.insert(format!("{e}_ready"), ready.to_string());
                    t.insert(format!("{e}_address_target_kind"), s(addr, &["targetRef", "kind"]).to_string());
                    t.insert(format!("{e}_address_target_name"), s(addr, &["targetRef", "name"]).to_string());
                    t.insert(format!("{e}_node_name"), s(addr, &["nodeName"]).to_string());
                    t.insert(format!("{e}_hostname"), s(addr, &["hostname"]).to_string());
                    let pod = (s(addr, &["targetRef", "kind"]) == "Pod")
                        .then(|| {
                            let pns = match s(addr, &["targetRef", "namespace"]) {
                                "" => ns,
                                other => other,
                            };
                            let key = format!("{pns}/{}", s(addr, &["targetRef", "name"]));
                            pods.get(&key).map(|p| (key, p))
                        })
                        .flatten();
                    if let Some((key, pod)) = pod {
                        t.extend(pod_labels(pod));
                        let found = container_ports(pod)
                            .into_iter()
                            .find(|(_, _, cp)| cp.get("containerPort").map(number).unwrap_or_default() == num);
                        if let Some((c, init, cp)) = found {
                            container_port_labels(c, init, cp, proto, &mut t);
                        }
                        seen.entry(key).or_default().push(num.clone());
                    }
                    t.retain(|_, v| !v.is_empty());
                    g.targets.push(t);
                }
            }
        }
    }
    // Container ports of those pods that no endpoint port uses: targets of their own.
    for (key, used) in &seen {
        let Some(pod) = pods.get(key) else { continue };
        let ip = s(pod, &["status", "podIP"]);
        if ip.is_empty() {
            continue;
        }
        for (c, init, cp) in container_ports(pod) {
            let num = cp.get("containerPort").map(number).unwrap_or_default();
            if used.contains(&num) {
                continue;
            }
            let mut t = pod_labels(pod);
            t.insert("__address__".to_string(), join_host_port(ip, &num));
            container_port_labels(c, init, cp, protocol(cp), &mut t);
            t.retain(|_, v| !v.is_empty());
            g.targets.push(t);
        }
    }
    g
}

/// Runs discovery until cancelled: one list + watch per namespace (or one for all); role
/// endpoints also lists and watches the pods and services of the same namespaces. The first
/// publication waits for every list.
pub async fn run(
    cfg: KubernetesSdConfig,
    role: Role,
    conn: ApiConn,
    namespaces: Vec<String>,
    slot: Slot,
    ctx: SdContext,
    cancel: CancellationToken,
) {
    let scopes: Vec<Option<&str>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.iter().map(|n| Some(n.as_str())).collect() };
    let watches: Vec<(&str, Query, Kind)> = match role {
        Role::Pod => vec![("pods", cfg.selector_query("pod"), Kind::Main)],
        Role::Endpoints => vec![
            ("endpoints", cfg.selector_query("endpoints"), Kind::Main),
            ("pods", cfg.selector_query("pod"), Kind::Pods),
            ("services", cfg.selector_query("service"), Kind::Services),
        ],
    };
    let store = Arc::new(Store {
        role,
        groups: Mutex::new(BTreeMap::new()),
        endpoints: Mutex::new(BTreeMap::new()),
        pods: Mutex::new(BTreeMap::new()),
        services: Mutex::new(BTreeMap::new()),
        unlisted: AtomicUsize::new(scopes.len() * watches.len()),
        slot,
        ctx,
    });
    let conn = conn.shared();
    let mut tasks = Vec::new();
    for ns in scopes {
        let prefix = ns.map(|n| format!("{n}/"));
        for (resource, query, kind) in &watches {
            let w = kube::Watch { path: kube::core_path(ns, resource), query: query.clone() };
            let feed = Arc::new(Feed {
                store: store.clone(),
                kind: *kind,
                prefix: prefix.clone(),
                listed: AtomicBool::new(false),
            });
            tasks.push(tokio::spawn(w.run(conn.clone(), feed, cancel.clone())));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
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
        let sel = |roles: &[&str]| {
            let s: Vec<_> = roles.iter().map(|r| serde_json::json!({"role": r, "label": "a=b"})).collect();
            c(serde_json::json!({"role": "endpoints", "selectors": s}))
        };
        assert!(sel(&["endpoints", "service", "pod"]).is_ok(), "role endpoints may select its services and pods");
        assert_eq!(sel(&["service", "node"]).unwrap_err().0, vec!["selectors".to_string(), "1".into(), "role".into()]);
        assert_eq!(sel(&["pod", "pod"]).unwrap_err().0, vec!["selectors".to_string(), "1".into(), "role".into()]);
    }

    const PODS: &str = include_str!("../../../tests/fixtures/k8s_pod_list.json");
    const ENDPOINTS: &str = include_str!("../../../tests/fixtures/k8s_endpoints_list.json");
    const SERVICES: &str = include_str!("../../../tests/fixtures/k8s_service_list.json");

    fn items(list: &str) -> Vec<Value> {
        let v: Value = serde_json::from_str(&list.replace("__PORT__", "8000")).unwrap();
        v["items"].as_array().unwrap().clone()
    }

    fn keyed(objects: Vec<Value>) -> BTreeMap<String, Value> {
        objects.into_iter().map(|o| (object_key(&o), o)).collect()
    }

    fn get<'a>(m: &'a BTreeMap<String, String>, k: &str) -> Option<&'a str> {
        m.get(k).map(String::as_str)
    }

    #[test]
    fn endpoints_targets_carry_service_pod_and_container_labels() {
        let eps = items(ENDPOINTS);
        let pods = keyed(items(PODS).into_iter().map(slim_pod).collect());
        let services = keyed(items(SERVICES).into_iter().map(slim_meta).collect());
        let g = endpoints_group(&eps[0], &pods, &services);
        assert_eq!(g.source, "endpoints/ml/vllm");
        for (k, v) in [
            ("__meta_kubernetes_namespace", "ml"),
            ("__meta_kubernetes_endpoints_name", "vllm"),
            ("__meta_kubernetes_endpoints_label_app", "vllm"),
            ("__meta_kubernetes_endpoints_annotationpresent_endpoints_kubernetes_io_last_change_trigger_time", "true"),
            ("__meta_kubernetes_service_name", "vllm"),
            ("__meta_kubernetes_service_label_app", "vllm"),
            ("__meta_kubernetes_service_label_tier", "inference"),
            ("__meta_kubernetes_service_labelpresent_app_kubernetes_io_name", "true"),
            ("__meta_kubernetes_service_annotation_prometheus_io_scrape", "true"),
            ("__meta_kubernetes_service_annotationpresent_prometheus_io_scrape", "true"),
        ] {
            assert_eq!(get(&g.labels, k), Some(v), "{k}: {:?}", g.labels);
        }
        // Per port, ready addresses then not-ready ones; no container port of the pod is left over.
        let addrs: Vec<&str> = g.targets.iter().map(|t| t["__address__"].as_str()).collect();
        assert_eq!(addrs, ["127.0.0.1:8000", "127.0.0.2:8000", "127.0.0.1:50051", "127.0.0.2:50051"]);
        let t = &g.targets[0];
        for (k, v) in [
            ("__meta_kubernetes_endpoint_ready", "true"),
            ("__meta_kubernetes_endpoint_port_name", "http"),
            ("__meta_kubernetes_endpoint_port_protocol", "TCP"),
            ("__meta_kubernetes_endpoint_node_name", "gpu-node-1"),
            ("__meta_kubernetes_endpoint_address_target_kind", "Pod"),
            ("__meta_kubernetes_endpoint_address_target_name", "vllm-7d9f8b6c5-x2x7k"),
            ("__meta_kubernetes_pod_name", "vllm-7d9f8b6c5-x2x7k"),
            ("__meta_kubernetes_pod_ip", "127.0.0.1"),
            ("__meta_kubernetes_pod_node_name", "gpu-node-1"),
            ("__meta_kubernetes_pod_label_app", "vllm"),
            ("__meta_kubernetes_pod_ready", "true"),
            ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
            ("__meta_kubernetes_pod_container_name", "vllm"),
            ("__meta_kubernetes_pod_container_image", "vllm/vllm-openai:v0.8.5"),
            ("__meta_kubernetes_pod_container_init", "false"),
            ("__meta_kubernetes_pod_container_port_name", "http"),
            ("__meta_kubernetes_pod_container_port_number", "8000"),
            ("__meta_kubernetes_pod_container_port_protocol", "TCP"),
        ] {
            assert_eq!(get(t, k), Some(v), "{k}: {t:?}");
        }
        // Not ready, referring to a pod that is not (yet) known: endpoint labels only.
        let t = &g.targets[1];
        assert_eq!(get(t, "__meta_kubernetes_endpoint_ready"), Some("false"));
        assert_eq!(get(t, "__meta_kubernetes_endpoint_node_name"), Some("gpu-node-2"));
        assert_eq!(get(t, "__meta_kubernetes_endpoint_address_target_name"), Some("vllm-7d9f8b6c5-b4n9m"));
        assert!(!t.keys().any(|k| k.starts_with("__meta_kubernetes_pod_")), "{t:?}");
        // The pod is known but declares no container port 50051: pod labels, no container labels.
        let t = &g.targets[2];
        assert_eq!(get(t, "__meta_kubernetes_pod_name"), Some("vllm-7d9f8b6c5-x2x7k"));
        assert_eq!(get(t, "__meta_kubernetes_endpoint_port_name"), Some("grpc"));
        assert!(!t.keys().any(|k| k.starts_with("__meta_kubernetes_pod_container")), "{t:?}");

        // Without its Service, no service labels, whatever the Endpoints object's labels say.
        let g = endpoints_group(&eps[0], &pods, &BTreeMap::new());
        assert!(!g.labels.keys().any(|k| k.starts_with("__meta_kubernetes_service")), "{:?}", g.labels);
        let g = endpoints_group(&eps[2], &pods, &services);
        assert_eq!(get(&g.labels, "__meta_kubernetes_endpoints_label_app"), Some("vllm"));
        assert!(!g.labels.keys().any(|k| k.starts_with("__meta_kubernetes_service")), "{:?}", g.labels);
        assert_eq!(g.targets.len(), 1);
        assert!(!g.targets[0].contains_key("__meta_kubernetes_endpoint_address_target_kind"));
        // redis: its own Service and pod.
        let g = endpoints_group(&eps[1], &pods, &services);
        assert_eq!(get(&g.labels, "__meta_kubernetes_service_label_app"), Some("redis"));
        assert_eq!(get(&g.targets[0], "__meta_kubernetes_pod_container_name"), Some("redis"));
    }

    #[test]
    fn unused_container_ports_of_a_referenced_pod_are_targets() {
        let pod = serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1",
                "containers": [{"name": "a", "image": "img", "ports": [
                    {"name": "web", "containerPort": 80, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]}],
                "initContainers": [{"name": "i", "image": "init", "ports": [{"containerPort": 9999}]}]},
            "status": {"podIP": "10.1.1.1", "phase": "Running"}});
        let ep = serde_json::json!({"metadata": {"name": "svc", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "10.1.1.1", "targetRef": {"kind": "Pod", "name": "p", "namespace": "ns"}}],
                         "ports": [{"name": "web", "port": 80, "protocol": "TCP"}]}]});
        let pods = keyed(vec![slim_pod(pod)]);
        let g = endpoints_group(&ep, &pods, &BTreeMap::new());
        let addrs: Vec<&str> = g.targets.iter().map(|t| t["__address__"].as_str()).collect();
        assert_eq!(addrs, ["10.1.1.1:80", "10.1.1.1:9090", "10.1.1.1:9999"]);
        assert_eq!(get(&g.targets[0], "__meta_kubernetes_pod_container_port_name"), Some("web"));
        let t = &g.targets[1];
        assert_eq!(get(t, "__meta_kubernetes_pod_container_port_name"), Some("metrics"));
        assert_eq!(get(t, "__meta_kubernetes_pod_name"), Some("p"));
        assert_eq!(get(t, "__meta_kubernetes_pod_label_app"), Some("x"));
        assert!(!t.keys().any(|k| k.starts_with("__meta_kubernetes_endpoint_")), "not an endpoint: {t:?}");
        let t = &g.targets[2];
        assert_eq!(get(t, "__meta_kubernetes_pod_container_init"), Some("true"));
        assert_eq!(get(t, "__meta_kubernetes_pod_container_port_protocol"), Some("TCP"));
    }

    #[test]
    fn in_cluster_needs_the_environment() {
        assert_eq!(in_cluster_url(Some("10.0.0.1".into()), Some("443".into())).unwrap(), "https://10.0.0.1:443");
        assert_eq!(in_cluster_url(Some("fd00::1".into()), Some("443".into())).unwrap(), "https://[fd00::1]:443");
        assert!(in_cluster_url(None, Some("443".into())).is_err());
    }
}
