//! `resolver.k8s`: the ready endpoints of a Kubernetes Service, from a list + watch of its
//! EndpointSlices (`discovery.k8s.io/v1`, label `kubernetes.io/service-name=<name>`, in the
//! Service's namespace), as otelcol-contrib's loadbalancing exporter's k8s resolver.
//!
//! - `service`: `name` or `name.namespace`; without a namespace, the pod's own (the service
//!   account's `namespace` file), else `default` (as otelcol).
//! - `ports` (default `[4317]`): each ready address gives one backend per port, `ip:port`
//!   (`[ip]:port` for IPv6).
//! - `return_hostnames`: an endpoint with a `hostname` (a StatefulSet pod behind its headless
//!   Service) gives `<hostname>.<service>.<namespace>:port`, the name cluster DNS resolves to that
//!   pod; an endpoint without one keeps its address (otelcol refuses the whole object instead).
//! - `timeout` (default `1s`): most time a list page or the start of a watch may take.
//!
//! Endpoints whose `conditions.ready` is `false` are left out (absent means ready, per the API).
//! The backends of all slices of the Service are merged, sorted and deduplicated, and published
//! only when they change (and once on the first list, even when empty). A `DELETED` slice
//! removes its endpoints; `410 Gone` lists again (slices missing from the new list are gone).
//! A failed list or watch keeps the last published list: it is counted in
//! `otelcol_loadbalancer_num_resolutions_total{exporter,resolver="k8s",success="false"}` and
//! logged once per change of reason (and again after a recovery). Each successful list and each
//! watch chunk that changed a slice counts `success="true"`.
//!
//! RBAC: `get`, `list`, `watch` on `endpointslices` (API group `discovery.k8s.io`) in the
//! Service's namespace.

use super::Resolver;
use async_trait::async_trait;
use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::kube::{self, ApiConn, EventType, Failure, WatchSink, str_at};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::telemetry::{Counters, Telemetry};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Port of a backend when `ports` is not set.
pub const DEFAULT_PORT: u16 = 4317;
/// `timeout` when not set (otelcol's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Most EndpointSlices of one Service kept (at 100 endpoints a slice, 100 000 endpoints).
pub const MAX_SLICES: usize = 1_000;
/// The label the EndpointSlice controller sets to the name of the slice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The namespace used when `service` names none and the pod's own is not known (as otelcol).
pub const FALLBACK_NAMESPACE: &str = "default";

/// `otelcol_loadbalancer_num_resolutions_total{exporter,resolver,success}`: resolutions by outcome.
pub const NUM_RESOLUTIONS: Counters<3> = Counters::new(
    "otelcol_loadbalancer_num_resolutions",
    "Number of times the resolver of a loadbalancing exporter resolved its backends, by outcome",
    ["exporter", "resolver", "success"],
);

/// Settings of `resolver.k8s` (otelcol's shape).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct K8sResolverConfig {
    /// `name` or `name.namespace` of the Service whose endpoints are the backends.
    #[serde(default)]
    pub service: String,
    /// Ports of each endpoint to use as backends (default 4317).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Most time a list page or the start of a watch may take (default 1s).
    #[serde(default)]
    pub timeout: Option<GoDuration>,
    /// Backends by the endpoints' hostnames (`<hostname>.<service>.<namespace>`) instead of IPs.
    #[serde(default)]
    pub return_hostnames: bool,
}

/// Whether `s` is a DNS label (RFC 1123: at most 63 of `a-z`, `0-9`, `-`, not at either end),
/// the form of Service and namespace names.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl K8sResolverConfig {
    /// Checks the settings (field paths relative to `resolver.k8s`).
    pub fn check(&self) -> Result<(), FieldError> {
        if self.service.is_empty() {
            return Err(FieldError::at("service", "the Service to resolve is required (`name` or `name.namespace`)"));
        }
        let (name, namespace) = self.split_service();
        if !is_dns_label(name) || namespace.is_some_and(|n| !is_dns_label(n)) {
            return Err(FieldError::at(
                "service",
                format!(
                    "{:?} is not `name` or `name.namespace` (each a DNS label: lowercase letters, digits and '-')",
                    self.service
                ),
            ));
        }
        if let Some(i) = self.ports.iter().position(|&p| p == 0) {
            return Err(FieldError {
                path: vec![PathSeg::Key("ports".into()), PathSeg::Index(i)],
                message: "port 0 is not a port a backend listens on".into(),
            });
        }
        if self.timeout.is_some_and(|t| t.0.is_zero()) {
            return Err(FieldError::at("timeout", "must be more than 0"));
        }
        Ok(())
    }

    /// The Service's name and, when `service` gives one, its namespace.
    pub fn split_service(&self) -> (&str, Option<&str>) {
        match self.service.split_once('.') {
            Some((n, ns)) => (n, Some(ns)),
            None => (self.service.as_str(), None),
        }
    }

    /// The ports used (`ports`, or [`DEFAULT_PORT`]), sorted and without duplicates.
    pub fn effective_ports(&self) -> Vec<u16> {
        let mut p = if self.ports.is_empty() { vec![DEFAULT_PORT] } else { self.ports.clone() };
        p.sort_unstable();
        p.dedup();
        p
    }

    /// `timeout`, or [`DEFAULT_TIMEOUT`].
    pub fn effective_timeout(&self) -> Duration {
        self.timeout.map(|t| t.0).unwrap_or(DEFAULT_TIMEOUT)
    }

    /// The resolver these settings describe (`component` names it in logs and self-metrics).
    pub fn resolver(&self, component: &str) -> Result<Box<dyn Resolver>, String> {
        self.in_cluster(component, None)
    }

    /// [`K8sResolverConfig::resolver`] counting its resolutions in `telemetry`
    /// ([`NUM_RESOLUTIONS`], `exporter` = `component`).
    pub fn resolver_with(&self, component: &str, telemetry: &Telemetry) -> Result<Box<dyn Resolver>, String> {
        self.in_cluster(component, Some(telemetry))
    }

    fn in_cluster(&self, component: &str, telemetry: Option<&Telemetry>) -> Result<Box<dyn Resolver>, String> {
        let conn = ApiConn::in_cluster().map_err(|e| format!("resolver.k8s: {e}"))?;
        let own = own_namespace(kube::SERVICE_ACCOUNT_DIR);
        Ok(Box::new(self.build(component, conn, own.as_deref(), telemetry)?))
    }

    /// The resolver over `conn`, `pod_namespace` being the namespace used when `service` names
    /// none (`None`: [`FALLBACK_NAMESPACE`], with a warning).
    pub fn build(
        &self,
        component: &str,
        conn: ApiConn,
        pod_namespace: Option<&str>,
        telemetry: Option<&Telemetry>,
    ) -> Result<K8sResolver, String> {
        self.check().map_err(|e| format!("resolver.k8s.{}: {e}", e.dotted()))?;
        let (name, namespace) = self.split_service();
        let namespace = match (namespace, pod_namespace) {
            (Some(ns), _) => ns.to_string(),
            (None, Some(ns)) => ns.to_string(),
            (None, None) => {
                tracing::warn!(exporter = %component, service = %name,
                    "resolver.k8s: the service names no namespace and this pod's own is not known; using {FALLBACK_NAMESPACE:?}");
                FALLBACK_NAMESPACE.to_string()
            }
        };
        let counter = |success: &str| match telemetry {
            Some(t) => NUM_RESOLUTIONS.get(t, [component, "k8s", success]),
            None => Counter::default(),
        };
        Ok(K8sResolver {
            component: component.to_string(),
            name: name.to_string(),
            namespace,
            ports: self.effective_ports(),
            timeout: self.effective_timeout(),
            return_hostnames: self.return_hostnames,
            conn,
            resolved: counter("true"),
            failed: counter("false"),
        })
    }
}

/// The pod's own namespace: the service account's `namespace` file under `dir`, if readable.
pub fn own_namespace(dir: &str) -> Option<String> {
    let ns = std::fs::read_to_string(format!("{dir}/namespace")).ok()?;
    let ns = ns.trim();
    is_dns_label(ns).then(|| ns.to_string())
}

/// The k8s resolver of one exporter.
pub struct K8sResolver {
    component: String,
    name: String,
    namespace: String,
    ports: Vec<u16>,
    timeout: Duration,
    return_hostnames: bool,
    conn: ApiConn,
    resolved: Counter,
    failed: Counter,
}

impl K8sResolver {
    /// The resource path listed and watched.
    pub fn path(&self) -> String {
        format!("apis/discovery.k8s.io/v1/namespaces/{}/endpointslices", self.namespace)
    }

    /// The label selector of every request.
    pub fn label_selector(&self) -> String {
        format!("{SERVICE_NAME_LABEL}={}", self.name)
    }
}

#[async_trait]
impl Resolver for K8sResolver {
    async fn run(self: Box<Self>, tx: watch::Sender<Vec<String>>, cancel: CancellationToken) {
        let w = kube::Watch { path: self.path(), query: vec![("labelSelector".into(), self.label_selector())] };
        tracing::info!(exporter = %self.component, service = %self.name, namespace = %self.namespace,
            ports = ?self.ports, "resolver.k8s: watching the Service's EndpointSlices");
        let conn = self.conn.clone();
        let feed = Arc::new(Feed::new(*self, tx));
        w.run(conn, feed, cancel).await
    }
}

/// The backends of one EndpointSlice object: its ready endpoints' addresses (or hostnames) ×
/// `ports`, as `host:port`. `service` / `namespace` form the hostnames.
pub fn slice_backends(slice: &Value, ports: &[u16], hostnames: Option<(&str, &str)>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(endpoints) = slice.get("endpoints").and_then(Value::as_array) else { return out };
    for ep in endpoints {
        // `ready` absent (or null) means ready; only an explicit false leaves the endpoint out.
        if ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let hostname = str_at(ep, &["hostname"]);
        let hosts: Vec<String> = match hostnames {
            Some((svc, ns)) if !hostname.is_empty() => vec![format!("{hostname}.{svc}.{ns}")],
            _ => ep
                .get("addresses")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).filter(|s| !s.is_empty()).map(bracketed).collect())
                .unwrap_or_default(),
        };
        for h in &hosts {
            for p in ports {
                out.push(format!("{h}:{p}"));
            }
        }
    }
    out
}

/// An IPv6 address in brackets (`[fd00::1]`), anything else as it is.
fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() }
}

/// The part of a failure message that names its reason: without the request URL (whose query
/// carries the changing `resourceVersion`).
fn reason_of(error: &str) -> &str {
    if (error.starts_with("http://") || error.starts_with("https://"))
        && let Some(i) = error.find(": ")
    {
        return &error[i + 2..];
    }
    error
}

struct State {
    /// Slice name -> its backends.
    slices: BTreeMap<String, Vec<String>>,
    /// What was published last (`None`: nothing yet).
    published: Option<Vec<String>>,
    /// The reason of the failure logged last, until a list succeeds.
    failing: Option<String>,
}

/// The watch sink: slices of the Service, merged and published on `tx`.
struct Feed {
    r: K8sResolver,
    tx: watch::Sender<Vec<String>>,
    state: Mutex<State>,
}

impl Feed {
    fn new(r: K8sResolver, tx: watch::Sender<Vec<String>>) -> Self {
        Feed { r, tx, state: Mutex::new(State { slices: BTreeMap::new(), published: None, failing: None }) }
    }

    /// The backends of `slice`, or `None` when it is not a slice of the Service (a server that
    /// ignored the selector).
    fn backends(&self, slice: &Value) -> Option<Vec<String>> {
        if str_at(slice, &["metadata", "labels", SERVICE_NAME_LABEL]) != self.r.name {
            return None;
        }
        let names = self.r.return_hostnames.then_some((self.r.name.as_str(), self.r.namespace.as_str()));
        Some(slice_backends(slice, &self.r.ports, names))
    }

    /// Publishes the merged backends if they differ from the last published (or none was).
    fn publish(&self, st: &mut State) {
        let mut all: Vec<String> = st.slices.values().flatten().cloned().collect();
        all.sort_unstable();
        all.dedup();
        if st.published.as_ref() == Some(&all) {
            return;
        }
        tracing::info!(exporter = %self.r.component, service = %self.r.name, backends = all.len(),
            "resolver.k8s: the backends changed");
        st.published = Some(all.clone());
        self.tx.send_replace(all);
    }
}

impl WatchSink for Feed {
    fn replace(&self, objects: Vec<Value>) {
        let mut st = self.state.lock();
        st.slices = objects
            .iter()
            .filter_map(|o| Some((str_at(o, &["metadata", "name"]).to_string(), self.backends(o)?)))
            .collect();
        if st.failing.take().is_some() {
            tracing::info!(exporter = %self.r.component, service = %self.r.name,
                "resolver.k8s: the EndpointSlices are listed again");
        }
        self.r.resolved.inc();
        self.publish(&mut st);
    }

    fn apply(&self, event: EventType, object: Value) -> bool {
        let name = str_at(&object, &["metadata", "name"]).to_string();
        let mut st = self.state.lock();
        match (event, self.backends(&object)) {
            (EventType::Deleted, _) | (_, None) => st.slices.remove(&name).is_some(),
            (_, Some(b)) => {
                if st.slices.get(&name) == Some(&b) {
                    return false;
                }
                if !st.slices.contains_key(&name) && st.slices.len() >= MAX_SLICES {
                    drop(st);
                    self.failed(Failure::ObjectsCut);
                    return false;
                }
                st.slices.insert(name, b);
                true
            }
        }
    }

    fn flush(&self) {
        self.r.resolved.inc();
        let mut st = self.state.lock();
        self.publish(&mut st);
    }

    fn failed(&self, failure: Failure) {
        match failure {
            Failure::Error => {
                self.r.failed.inc();
            }
            Failure::ObjectsCut => tracing::warn!(exporter = %self.r.component, service = %self.r.name,
                "resolver.k8s: the Service has more than {MAX_SLICES} EndpointSlices; the others are not used"),
            // Followed by Failure::Error for the same request: counted there.
            Failure::EventTooLarge => {}
        }
    }

    fn max_objects(&self) -> usize {
        MAX_SLICES
    }

    fn request_timeout(&self) -> Duration {
        self.r.timeout
    }

    fn retrying(&self, path: &str, error: &str, backoff: Duration) {
        let reason = reason_of(error);
        let mut st = self.state.lock();
        if st.failing.as_deref() == Some(reason) {
            tracing::debug!(exporter = %self.r.component, path = %path, error = %error,
                "resolver.k8s: list/watch failed again; retrying in {backoff:?}");
            return;
        }
        st.failing = Some(reason.to_string());
        let kept = st.published.as_ref().map(Vec::len);
        tracing::warn!(exporter = %self.r.component, service = %self.r.name, path = %path, error = %error,
            kept_backends = ?kept, "resolver.k8s: listing the EndpointSlices failed; the last backends are kept, retrying in {backoff:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Value) -> Result<K8sResolverConfig, FieldError> {
        let c: K8sResolverConfig = inferwatch_core::component::parse_config(&v)?;
        c.check().map(|()| c)
    }

    #[test]
    fn k8s_settings_are_checked_naming_the_field() {
        let e = cfg(json!({})).unwrap_err();
        assert_eq!(e.dotted(), "service");
        let e = cfg(json!({"service": "gw.ns.svc.cluster.local"})).unwrap_err();
        assert_eq!(e.dotted(), "service");
        let e = cfg(json!({"service": "Gateway"})).unwrap_err();
        assert_eq!(e.dotted(), "service");
        let e = cfg(json!({"service": "gw", "ports": [4317, 0]})).unwrap_err();
        assert_eq!(e.dotted(), "ports.1", "{e}");
        let e = cfg(json!({"service": "gw", "ports": [70000]})).unwrap_err();
        assert_eq!(e.dotted(), "ports.0", "{e}");
        let e = cfg(json!({"service": "gw", "timeout": "0s"})).unwrap_err();
        assert_eq!(e.dotted(), "timeout");
        let e = cfg(json!({"service": "gw", "namespace": "x"})).unwrap_err();
        assert_eq!(e.dotted(), "namespace", "unknown keys are refused");

        let c = cfg(json!({"service": "inferwatch-gateway.inferwatch"})).unwrap();
        assert_eq!(c.split_service(), ("inferwatch-gateway", Some("inferwatch")));
        assert_eq!(c.effective_ports(), vec![4317], "ports default to 4317");
        assert_eq!(c.effective_timeout(), Duration::from_secs(1));
        let c =
            cfg(json!({"service": "gw", "ports": [4318, 4317, 4318], "timeout": "250ms", "return_hostnames": true}))
                .unwrap();
        assert_eq!(c.split_service(), ("gw", None));
        assert_eq!(c.effective_ports(), vec![4317, 4318]);
        assert_eq!(c.effective_timeout(), Duration::from_millis(250));
        assert!(c.return_hostnames);
    }

    fn slice() -> Value {
        json!({"addressType": "IPv4", "metadata": {"name": "gw-abc12"}, "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "hostname": "gw-0"},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "terminating": true}, "hostname": "gw-1"},
            {"addresses": ["10.0.0.3"], "conditions": {}},
            {"addresses": ["10.0.0.4"]},
            {"addresses": ["fd00::5"], "conditions": {"ready": null}},
        ]})
    }

    #[test]
    fn k8s_ready_endpoints_times_ports_and_hostnames() {
        let b = slice_backends(&slice(), &[4317, 4318], None);
        assert_eq!(
            b,
            [
                "10.0.0.1:4317",
                "10.0.0.1:4318",
                "10.0.0.3:4317",
                "10.0.0.3:4318",
                "10.0.0.4:4317",
                "10.0.0.4:4318",
                "[fd00::5]:4317",
                "[fd00::5]:4318"
            ]
        );
        let b = slice_backends(&slice(), &[4317], Some(("gw", "inferwatch")));
        assert_eq!(b, ["gw-0.gw.inferwatch:4317", "10.0.0.3:4317", "10.0.0.4:4317", "[fd00::5]:4317"]);
        assert!(slice_backends(&json!({"endpoints": null}), &[4317], None).is_empty());
    }

    #[test]
    fn k8s_failure_reasons_drop_the_url() {
        assert_eq!(reason_of("http://127.0.0.1:1/apis/x?resourceVersion=5: HTTP 500"), "HTTP 500");
        assert_eq!(reason_of("watch stream silent for too long"), "watch stream silent for too long");
    }

    #[test]
    fn k8s_own_namespace_from_the_service_account_dir() {
        let dir = std::env::temp_dir().join(format!("iw-k8s-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("namespace"), "inferwatch\n").unwrap();
        assert_eq!(own_namespace(dir.to_str().unwrap()).as_deref(), Some("inferwatch"));
        std::fs::write(dir.join("namespace"), "../etc").unwrap();
        assert_eq!(own_namespace(dir.to_str().unwrap()), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(own_namespace("/nonexistent-dir"), None);
    }
}
