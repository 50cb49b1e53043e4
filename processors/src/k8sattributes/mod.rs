//! Processor `k8sattributes` (also `k8s_attributes`), in otelcol-contrib's shape: finds the pod
//! each resource comes from and inserts its metadata as resource attributes (never replacing
//! one the data already has), on traces, metrics and logs.
//!
//! - Pods (and namespaces, when a rule reads them or `k8s.cluster.uid` is asked for) are cached
//!   from a list + watch of the API server ([`inferwatch_core::kube`]), filtered by
//!   `filter.node` / `node_from_env_var` / `namespace` / `labels` / `fields` on the server side,
//!   at most `max_pods` of them (more are counted in
//!   `inferwatch_k8sattributes_pods_not_cached_total`); a deleted pod stays associable for two
//!   minutes, as in otelcol (unless a live pod needs its room under `max_pods`). A watch that
//!   ends resumes from the last `resourceVersion` (bookmarks included); `410 Gone` lists again,
//!   and pods missing from the new list are deleted (with the grace period). The pipelines of
//!   one processor id share one cache.
//! - `pod_association`: rules in order; the first whose sources all have a value decides
//!   (`connection`: the client's peer IP, which the OTLP receivers keep for the pipeline call
//!   whatever `include_metadata` says; `resource_attribute`: `k8s.pod.ip`, `k8s.pod.uid`,
//!   `k8s.pod.name`, `k8s.namespace.name`, `container.id` or any extracted attribute). No rule:
//!   the connection. Associated by the connection, `k8s.pod.ip` is added too. Put the processor
//!   before `batch`, which drops the client.
//! - `passthrough: true` only adds `k8s.pod.ip` from the connection (no API access).
//! - `k8s.deployment.name` is the ReplicaSet owner's name less its pod-template hash (what
//!   otelcol's `deployment_name_from_replicaset` does; no ReplicaSet watch); `k8s.cronjob.name`
//!   is the Job owner's name less its schedule suffix. Refused with a reason:
//!   `k8s.deployment.uid`, `k8s.cronjob.uid`, `k8s.node.uid`, rules `from` node / deployment /
//!   statefulset / daemonset / job, `auth_type: kubeConfig`, `extract.service_attributes`.
//!
//! Not otelcol: `api_server` (an explicit API URL, e.g. `kubectl proxy` with `auth_type: none`;
//! the tests point it at a fixture server) and `max_pods`.

pub mod cache;
pub mod config;

use crate::resource::map_resources;
use async_trait::async_trait;
use cache::{Association, Cache, NamespaceFeed, PodFeed, Rules};
use config::{ApiTarget, Checked, K8sAttributesConfig};
use inferwatch_core::auth::ClientInfo;
use inferwatch_core::component::{
    ComponentError, ComponentId, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::kube::{self, ApiConn, Failure};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::TlsClientSettings;
use inferwatch_core::telemetry::Telemetry;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often deleted pods past their grace period are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Factory of `k8sattributes`.
pub struct K8sAttributesFactory;

impl ProcessorFactory for K8sAttributesFactory {
    fn type_name(&self) -> &'static str {
        "k8sattributes"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(Arc::new(parse_config::<K8sAttributesConfig>(cfg)?.check()?))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        _signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        // One cache per processor id and running graph, shared by its pipelines.
        let key = format!("k8sattributes-cache:{}", ctx.id);
        let shared = match ctx.host.services.get::<Arc<Shared>>(&key) {
            Some(s) => s,
            None => {
                let s = Arc::new(Shared::new(&ctx.id, &ctx.telemetry, checked)?);
                ctx.host.services.provide(&key, s.clone());
                s
            }
        };
        Ok(Arc::new(K8sAttributes { shared, next }))
    }
}

/// The counter of pods `max_pods` kept out of `processor`'s cache.
pub fn not_cached_counter(t: &Telemetry, id: &ComponentId) -> prometheus_client::metrics::counter::Counter {
    t.component_counter(
        "inferwatch_k8sattributes_pods_not_cached",
        "Pods a k8sattributes processor did not cache because max_pods were cached",
        &[("processor", &id.to_string())],
    )
}

/// The connection of checked settings (`None`: passthrough).
pub fn connection(checked: &Checked) -> Result<Option<ApiConn>, String> {
    let in_cluster_url = || {
        kube::in_cluster_url(
            std::env::var("KUBERNETES_SERVICE_HOST").ok(),
            std::env::var("KUBERNETES_SERVICE_PORT").ok(),
        )
        .map_err(|e| format!("{e} (set api_server, or run in a pod)"))
    };
    Ok(match &checked.api {
        None => None,
        Some(ApiTarget::ServiceAccount(url)) => {
            let url = match url {
                Some(u) => u.clone(),
                None => in_cluster_url()?,
            };
            Some(ApiConn::service_account(&url, kube::SERVICE_ACCOUNT_DIR)?)
        }
        Some(ApiTarget::Anonymous(url)) => {
            let url = match url {
                Some(u) => u.clone(),
                None => in_cluster_url()?,
            };
            Some(ApiConn::new(&url, None, &TlsClientSettings::default())?)
        }
    })
}

/// What the pipelines of one processor id share: the cache and its watches.
pub struct Shared {
    id: ComponentId,
    cache: Arc<Cache>,
    conn: Option<ApiConn>,
    started: AtomicUsize,
    cancel: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Shared {
    fn new(id: &ComponentId, telemetry: &Arc<Telemetry>, checked: Checked) -> Result<Self, ComponentError> {
        let err = |m: String| ComponentError::Start(format!("processor {id}: {m}"));
        let conn = connection(&checked).map_err(err)?;
        let t = telemetry.clone();
        let pid = id.to_string();
        let failures = Box::new(move |f: Failure| {
            let reason = match f {
                Failure::Error => "error",
                Failure::ObjectsCut => "objects_cut",
                Failure::EventTooLarge => "event_too_large",
            };
            t.component_counter(
                "inferwatch_k8sattributes_watch_failures",
                "List / watch failures of a k8sattributes processor, by reason",
                &[("processor", &pid), ("reason", reason)],
            )
            .inc();
        });
        let cache =
            Arc::new(Cache::new(Rules::new(checked), cache::DELETE_GRACE, not_cached_counter(telemetry, id), failures));
        Ok(Shared {
            id: id.clone(),
            cache,
            conn,
            started: AtomicUsize::new(0),
            cancel: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    fn start_watches(&self) -> Result<(), String> {
        let Some(conn) = &self.conn else { return Ok(()) };
        let c = self.cache.rules().checked();
        let mut fields = c.field_selector.clone();
        let node = match &c.node_from_env_var {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                format!("filter.node_from_env_var is configured but the environment variable {var:?} is not set")
            })?),
            None => c.node.clone(),
        };
        if let Some(n) = node.filter(|n| !n.is_empty()) {
            fields.push(format!("spec.nodeName={n}"));
        }
        let mut query = Vec::new();
        if !c.label_selector.is_empty() {
            query.push(("labelSelector".to_string(), c.label_selector.join(",")));
        }
        if !fields.is_empty() {
            query.push(("fieldSelector".to_string(), fields.join(",")));
        }
        let pods = kube::Watch { path: kube::core_path(c.namespace.as_deref(), "pods"), query };
        let mut tasks = self.tasks.lock();
        tasks.push(tokio::spawn(pods.run(conn.clone(), Arc::new(PodFeed(self.cache.clone())), self.cancel.clone())));
        if c.needs_namespaces() {
            let mut query = Vec::new();
            if let Some(ns) = &c.namespace
                && !c.metadata.contains("k8s.cluster.uid")
            {
                query.push(("fieldSelector".to_string(), format!("metadata.name={ns}")));
            }
            let w = kube::Watch { path: "api/v1/namespaces".into(), query };
            let feed = Arc::new(NamespaceFeed(self.cache.clone()));
            tasks.push(tokio::spawn(w.run(conn.clone(), feed, self.cancel.clone())));
        }
        let (cache, cancel) = (self.cache.clone(), self.cancel.clone());
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => cache.sweep(Instant::now()),
                }
            }
        }));
        tracing::info!(processor = %self.id, url = %conn.base, "k8sattributes: watching pods");
        Ok(())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The running processor of one pipeline.
pub struct K8sAttributes {
    shared: Arc<Shared>,
    next: ConsumerRef,
}

fn str_value(v: &KeyValue) -> Option<String> {
    match v.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn string_kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(AnyValue { value: Some(Value::StringValue(v.to_string())) }),
        key_strindex: 0,
    }
}

impl K8sAttributes {
    /// A processor over a shared cache (for tests and embedding).
    pub fn new(shared: Arc<Shared>, next: ConsumerRef) -> Self {
        K8sAttributes { shared, next }
    }

    /// Adds the pod attributes to every resource of `data`, the peer being `conn`.
    pub fn process(&self, data: Payload, conn: Option<&str>) -> Payload {
        let cache = &self.shared.cache;
        let passthrough = self.shared.conn.is_none();
        map_resources(data, &mut |r| {
            let attrs = &mut r.attributes;
            let before = attrs.len();
            let insert = |attrs: &mut Vec<KeyValue>, kv: KeyValue| {
                if !attrs.iter().any(|a| a.key == kv.key) {
                    attrs.push(kv);
                }
            };
            if passthrough {
                if let Some(ip) = conn {
                    insert(attrs, string_kv("k8s.pod.ip", ip));
                }
                return attrs.len() != before;
            }
            let lookup = |k: &str| attrs.iter().find(|a| a.key == k).and_then(str_value);
            let rules = cache.rules();
            let by_conn = |i: usize| rules.checked().associations[i].contains(&config::Source::Connection);
            let (add, from_conn): (Vec<KeyValue>, bool) = match cache.associate(&lookup, conn) {
                Association::Found(found, i) => {
                    let mut out: Vec<KeyValue> = Vec::new();
                    for (k, v) in found.attributes(rules, &lookup) {
                        if k == "container.image.repo_digests" {
                            let arr = ArrayValue { values: vec![AnyValue { value: Some(Value::StringValue(v)) }] };
                            let value = Some(AnyValue { value: Some(Value::ArrayValue(arr)) });
                            out.push(KeyValue { key: k, value, key_strindex: 0 });
                        } else {
                            out.push(string_kv(&k, &v));
                        }
                    }
                    (out, by_conn(i))
                }
                Association::NotFound(i) => (Vec::new(), by_conn(i)),
                Association::NoValues => (Vec::new(), false),
            };
            if from_conn && let Some(ip) = conn {
                insert(attrs, string_kv("k8s.pod.ip", ip));
            }
            for kv in add {
                insert(attrs, kv);
            }
            attrs.len() != before
        })
        .0
    }
}

/// The peer IP of the request being processed (IPv4-mapped addresses as IPv4).
pub fn current_peer_ip() -> Option<String> {
    ClientInfo::current().and_then(|c| c.addr).map(|a| a.ip().to_canonical().to_string())
}

#[async_trait]
impl Consumer for K8sAttributes {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let peer = current_peer_ip();
        self.next.consume(self.process(data, peer.as_deref())).await
    }
}

#[async_trait]
impl Node for K8sAttributes {
    async fn start(&self) -> Result<(), ComponentError> {
        let s = &self.shared;
        if s.started.fetch_add(1, Ordering::SeqCst) == 0 {
            s.start_watches().map_err(|e| ComponentError::Start(format!("processor {}: {e}", s.id)))?;
        }
        if s.conn.is_some()
            && let Some(t) = s.cache.rules().checked().wait
            && tokio::time::timeout(t, s.cache.wait_synced()).await.is_err()
        {
            return Err(ComponentError::Start(format!(
                "processor {}: wait_for_metadata: the pods were not listed within {t:?}",
                s.id
            )));
        }
        Ok(())
    }

    async fn shutdown(&self, _deadline: Instant) -> u64 {
        let s = &self.shared;
        let before = s.started.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).unwrap_or(0);
        if before == 1 {
            s.cancel.cancel();
            let tasks: Vec<_> = std::mem::take(&mut *s.tasks.lock());
            for t in tasks {
                let _ = t.await;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests;
