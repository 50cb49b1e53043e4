//! The pod (and namespace) cache of `k8sattributes`: filled from list + watch, bounded by
//! `max_pods`, indexed by each association rule, with deleted pods kept for a grace period (as
//! otelcol does: data sent just before a pod's deletion still finds it).

use super::config::{Checked, From, Source};
use inferwatch_core::kube::{EventType, Failure, WatchSink, str_at as s};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a deleted pod stays associable (otelcol's `podDeleteGracePeriod`).
pub const DELETE_GRACE: Duration = Duration::from_secs(120);

/// One container's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    /// `k8s.container.name`.
    pub name: String,
    /// `container.image.name`.
    pub image_name: String,
    /// `container.image.tag`.
    pub image_tag: String,
    /// service.version from the image (tag, digest or `tag@digest`).
    pub image_version: String,
    /// (restart count, container id without the runtime prefix, image repo digest).
    pub statuses: Vec<(i64, String, String)>,
}

/// A cached pod: what association and extraction need.
#[derive(Debug, Clone, Default)]
pub struct Pod {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.creationTimestamp` (RFC 3339; orders pods sharing an identifier).
    pub created: String,
    /// Pod-level attributes, first one of a name wins.
    pub attrs: Vec<(String, String)>,
    /// Values a resource attribute is associated by (`k8s.pod.ip` -> pod IPs, ...).
    pub ident: HashMap<String, Vec<String>>,
    /// Containers, when container attributes are asked for.
    pub containers: Vec<Container>,
}

/// A cached namespace.
#[derive(Debug, Clone, Default)]
pub struct Namespace {
    /// `metadata.uid`.
    pub uid: String,
    /// Attributes of the namespace rules.
    pub attrs: Vec<(String, String)>,
}

/// `name-<hash>` of a ReplicaSet to its Deployment's name: the pod's `pod-template-hash` label
/// when the name ends with it, else otelcol's rule (`^(.*)-[0-9a-zA-Z]+$`).
pub fn deployment_of_replicaset(rs: &str, template_hash: Option<&str>) -> Option<String> {
    if let Some(h) = template_hash.filter(|h| !h.is_empty())
        && let Some(d) = rs.strip_suffix(h).and_then(|r| r.strip_suffix('-'))
        && !d.is_empty()
    {
        return Some(d.to_string());
    }
    let (d, hash) = rs.rsplit_once('-')?;
    (!d.is_empty() && !hash.is_empty() && hash.chars().all(|c| c.is_ascii_alphanumeric())).then(|| d.to_string())
}

/// A Job's CronJob name (`<cronjob>-<scheduled minute>`, otelcol's `^(.*)-[0-9]+$`).
pub fn cronjob_of_job(job: &str) -> Option<String> {
    let (c, n) = job.rsplit_once('-')?;
    (!c.is_empty() && !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())).then(|| c.to_string())
}

/// `repo[:tag][@digest]` as (name, tag, service.version).
pub fn parse_image(image: &str) -> (String, String, String) {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, d),
        None => (image, ""),
    };
    // A `:` after the last `/` is the tag (a registry's port comes before a `/`).
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], &rest[slash + i + 1..]),
        None => (rest, if digest.is_empty() { "latest" } else { "" }),
    };
    let version = match (tag, digest) {
        (t, "") => t.to_string(),
        ("", d) => d.to_string(),
        (t, d) => format!("{t}@{d}"),
    };
    (name.to_string(), tag.to_string(), version)
}

fn obj<'a>(v: &'a Value, path: &str) -> Option<&'a Map<String, Value>> {
    v.pointer(path).and_then(Value::as_object)
}

/// Pod-level extraction, as configured.
pub struct Rules {
    checked: Checked,
}

impl Rules {
    /// Rules of the checked settings.
    pub fn new(checked: Checked) -> Self {
        Rules { checked }
    }

    /// The settings.
    pub fn checked(&self) -> &Checked {
        &self.checked
    }

    fn wants(&self, m: &str) -> bool {
        self.checked.metadata.contains(m)
    }

    /// The cached form of a pod object.
    pub fn pod(&self, v: &Value) -> Pod {
        let name = s(v, &["metadata", "name"]).to_string();
        let namespace = s(v, &["metadata", "namespace"]).to_string();
        let uid = s(v, &["metadata", "uid"]).to_string();
        let created = s(v, &["metadata", "creationTimestamp"]).to_string();
        let labels = obj(v, "/metadata/labels").cloned().unwrap_or_default();
        let annotations = obj(v, "/metadata/annotations").cloned().unwrap_or_default();
        let label = |k: &str| labels.get(k).and_then(Value::as_str).filter(|x| !x.is_empty());
        let mut all: Vec<(String, String)> = Vec::new();
        // Highest precedence first: the pod's own `resource.opentelemetry.io/` annotations.
        let annotated = |k: &str| annotations.get(&format!("resource.opentelemetry.io/{k}")).and_then(Value::as_str);
        if self.checked.otel_annotations {
            for (k, val) in &annotations {
                if let (Some(key), Some(val)) = (k.strip_prefix("resource.opentelemetry.io/"), val.as_str())
                    && !key.is_empty()
                {
                    all.push((key.to_string(), val.to_string()));
                }
            }
        }
        let mut ips: Vec<String> = v
            .pointer("/status/podIPs")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|i| s(i, &["ip"]).to_string()).filter(|i| !i.is_empty()).collect())
            .unwrap_or_default();
        let ip = s(v, &["status", "podIP"]).to_string();
        if !ip.is_empty() && !ips.contains(&ip) {
            ips.insert(0, ip.clone());
        }
        let host_network = v.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true);
        let mut owners: HashMap<&str, (String, String)> = HashMap::new();
        for o in v.pointer("/metadata/ownerReferences").and_then(Value::as_array).into_iter().flatten() {
            owners.entry(s(o, &["kind"])).or_insert((s(o, &["name"]).to_string(), s(o, &["uid"]).to_string()));
        }
        let deployment =
            owners.get("ReplicaSet").and_then(|(rs, _)| deployment_of_replicaset(rs, label("pod-template-hash")));
        let cronjob = owners.get("Job").and_then(|(j, _)| cronjob_of_job(j));
        let mut put = |k: &str, val: &str| {
            if self.wants(k) && !val.is_empty() {
                all.push((k.to_string(), val.to_string()));
            }
        };
        put("k8s.namespace.name", &namespace);
        put("k8s.pod.name", &name);
        put("k8s.pod.uid", &uid);
        put("k8s.pod.hostname", s(v, &["spec", "hostname"]));
        put("k8s.pod.ip", &ip);
        put("k8s.pod.start_time", &created);
        put("k8s.node.name", s(v, &["spec", "nodeName"]));
        for (kind, base) in
            [("ReplicaSet", "replicaset"), ("DaemonSet", "daemonset"), ("StatefulSet", "statefulset"), ("Job", "job")]
        {
            if let Some((n, u)) = owners.get(kind) {
                put(&format!("k8s.{base}.name"), n);
                put(&format!("k8s.{base}.uid"), u);
            }
        }
        put("k8s.deployment.name", deployment.as_deref().unwrap_or(""));
        put("k8s.cronjob.name", cronjob.as_deref().unwrap_or(""));
        // service.* as the semantic conventions compute them (k8s-attributes, non-normative).
        if self.wants("service.namespace") {
            all.push(("service.namespace".into(), annotated("service.namespace").unwrap_or(&namespace).to_string()));
        }
        if self.wants("service.name") {
            let owner = |k: &str| owners.get(k).map(|(n, _)| n.clone());
            let service = annotated("service.name")
                .map(str::to_string)
                .or_else(|| label("app.kubernetes.io/instance").map(str::to_string))
                .or_else(|| label("app.kubernetes.io/name").map(str::to_string))
                .or(deployment.clone())
                .or_else(|| owner("ReplicaSet"))
                .or_else(|| owner("StatefulSet"))
                .or_else(|| owner("DaemonSet"))
                .or(cronjob.clone())
                .or_else(|| owner("Job"))
                .unwrap_or_else(|| name.clone());
            all.push(("service.name".into(), service));
        }
        if self.wants("service.version")
            && let Some(ver) = annotated("service.version").or_else(|| label("app.kubernetes.io/version"))
        {
            all.push(("service.version".into(), ver.to_string()));
        }
        if self.wants("service.instance.id")
            && let Some(id) = annotated("service.instance.id")
        {
            all.push(("service.instance.id".into(), id.to_string()));
        }
        for r in self.checked.labels.iter().filter(|r| r.from == From::Pod) {
            all.extend(r.apply(&labels, "labels"));
        }
        for r in self.checked.annotations.iter().filter(|r| r.from == From::Pod) {
            all.extend(r.apply(&annotations, "annotations"));
        }
        let mut seen = HashSet::new();
        all.retain(|(k, _)| seen.insert(k.clone()));

        let containers = if self.checked.needs_containers() { containers_of(v) } else { Vec::new() };
        let mut ident: HashMap<String, Vec<String>> = HashMap::new();
        for (k, val) in &all {
            ident.entry(k.clone()).or_default().push(val.clone());
        }
        // Host-network pods share the node's IP: not associable by IP (as otelcol).
        let ips = if host_network { Vec::new() } else { ips };
        ident.insert("k8s.pod.ip".into(), ips);
        ident.insert("k8s.pod.uid".into(), vec![uid.clone()]);
        ident.insert("k8s.pod.name".into(), vec![name.clone()]);
        ident.insert("k8s.namespace.name".into(), vec![namespace.clone()]);
        let ids: Vec<String> = containers
            .iter()
            .flat_map(|c| c.statuses.iter().map(|(_, id, _)| id.clone()))
            .filter(|i| !i.is_empty())
            .collect();
        ident.insert("container.id".into(), ids);
        Pod { uid, name, namespace, created, attrs: all, ident, containers }
    }

    /// The cached form of a namespace object.
    pub fn namespace(&self, v: &Value) -> Namespace {
        let labels = obj(v, "/metadata/labels").cloned().unwrap_or_default();
        let annotations = obj(v, "/metadata/annotations").cloned().unwrap_or_default();
        let mut attrs = Vec::new();
        for r in self.checked.labels.iter().filter(|r| r.from == From::Namespace) {
            attrs.extend(r.apply(&labels, "labels"));
        }
        for r in self.checked.annotations.iter().filter(|r| r.from == From::Namespace) {
            attrs.extend(r.apply(&annotations, "annotations"));
        }
        Namespace { uid: s(v, &["metadata", "uid"]).to_string(), attrs }
    }
}

fn containers_of(v: &Value) -> Vec<Container> {
    let mut out: Vec<Container> = Vec::new();
    for field in ["containers", "initContainers"] {
        for c in v.pointer(&format!("/spec/{field}")).and_then(Value::as_array).into_iter().flatten() {
            let (image_name, image_tag, image_version) = parse_image(s(c, &["image"]));
            out.push(Container {
                name: s(c, &["name"]).to_string(),
                image_name,
                image_tag,
                image_version,
                statuses: Vec::new(),
            });
        }
    }
    for field in ["containerStatuses", "initContainerStatuses"] {
        for st in v.pointer(&format!("/status/{field}")).and_then(Value::as_array).into_iter().flatten() {
            let name = s(st, &["name"]);
            let id = s(st, &["containerID"]);
            let id = id.split_once("://").map_or(id, |(_, i)| i).to_string();
            let restarts = st.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            // imageID is `<runtime>://<repo>@sha256:..` or `<repo>@sha256:..`.
            let image_id = s(st, &["imageID"]);
            let digest = image_id.split_once("://").map_or(image_id, |(_, i)| i);
            let digest = if digest.contains("@sha256:") { digest.to_string() } else { String::new() };
            match out.iter_mut().find(|c| c.name == name) {
                Some(c) => c.statuses.push((restarts, id, digest)),
                None => out.push(Container {
                    name: name.to_string(),
                    statuses: vec![(restarts, id, digest)],
                    ..Default::default()
                }),
            }
        }
    }
    out
}

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Arc<Pod>>,
    /// One index per association rule: joined source values -> pod uid.
    index: Vec<HashMap<String, String>>,
    /// Deleted pods (uid) by deletion time, removed after the grace period.
    deleted: VecDeque<(Instant, String)>,
    deleted_set: HashSet<String>,
    namespaces: HashMap<String, Arc<Namespace>>,
}

/// The values of `rule` a pod offers: one key per combination (several IPs, container ids).
fn pod_keys(rule: &[Source], pod: &Pod) -> Vec<String> {
    let mut keys = vec![String::new()];
    for (i, src) in rule.iter().enumerate() {
        let name = match src {
            Source::Connection => "k8s.pod.ip",
            Source::Attribute(n) => n.as_str(),
        };
        let vals = pod.ident.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let mut next = Vec::new();
        for k in &keys {
            for v in vals {
                next.push(if i == 0 { v.clone() } else { format!("{k}\u{0}{v}") });
            }
        }
        keys = next;
        if keys.is_empty() {
            break;
        }
    }
    keys
}

/// What an association found.
pub struct Found {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its namespace, when namespaces are watched and it is known.
    pub namespace: Option<Arc<Namespace>>,
    /// `kube-system`'s uid, when known.
    pub cluster_uid: Option<String>,
}

/// The result of one association attempt.
pub enum Association {
    /// No rule had all its values on the resource.
    NoValues,
    /// Rule `.0` had its values, and they identify no cached pod.
    NotFound(usize),
    /// The pod, found by rule `.1`.
    Found(Box<Found>, usize),
}

/// The cache shared by the processor's pipelines.
pub struct Cache {
    rules: Rules,
    max_pods: usize,
    delete_grace: Duration,
    inner: RwLock<Inner>,
    not_cached: Counter,
    watch_failures: Box<dyn Fn(Failure) + Send + Sync>,
    pods_synced: AtomicBool,
    namespaces_synced: AtomicBool,
    synced: tokio::sync::Notify,
}

impl Cache {
    /// An empty cache; `not_cached` counts pods left out by `max_pods`, `watch_failures` the
    /// list / watch failures.
    pub fn new(
        rules: Rules,
        delete_grace: Duration,
        not_cached: Counter,
        watch_failures: Box<dyn Fn(Failure) + Send + Sync>,
    ) -> Self {
        let n = rules.checked.associations.len();
        let max_pods = rules.checked.max_pods;
        let namespaces_synced = AtomicBool::new(!rules.checked.needs_namespaces());
        Cache {
            rules,
            max_pods,
            delete_grace,
            inner: RwLock::new(Inner { index: vec![HashMap::new(); n], ..Default::default() }),
            not_cached,
            watch_failures,
            pods_synced: AtomicBool::new(false),
            namespaces_synced,
            synced: tokio::sync::Notify::new(),
        }
    }

    /// The extraction rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Number of pods cached (deleted ones still in their grace period included).
    pub fn len(&self) -> usize {
        self.inner.read().pods.len()
    }

    /// Whether no pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first lists (pods, and namespaces when needed) have arrived.
    pub fn is_synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst) && self.namespaces_synced.load(Ordering::SeqCst)
    }

    /// Waits until [`Cache::is_synced`].
    pub async fn wait_synced(&self) {
        loop {
            let n = self.synced.notified();
            if self.is_synced() {
                return;
            }
            n.await;
        }
    }

    fn mark_synced(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::SeqCst);
        self.synced.notify_waiters();
    }

    /// Adds or replaces a pod object (a pod that does not fit under `max_pods` is counted).
    pub fn upsert(&self, v: &Value, now: Instant) {
        let name = s(v, &["metadata", "name"]);
        if self.rules.checked.exclude.iter().any(|re| re.is_match(name)) {
            return;
        }
        let pod = Arc::new(self.rules.pod(v));
        if pod.uid.is_empty() {
            return;
        }
        let mut g = self.inner.write();
        Self::sweep_locked(&mut g, now, self.delete_grace);
        if !g.pods.contains_key(&pod.uid) && g.pods.len() >= self.max_pods {
            // A live pod takes the room of the longest-deleted one still in its grace period.
            let mut room = false;
            while let Some((_, uid)) = g.deleted.pop_front() {
                if g.deleted_set.remove(&uid) {
                    Self::remove_locked(&mut g, &uid);
                    room = true;
                    break;
                }
            }
            if !room {
                drop(g);
                self.not_cached.inc();
                return;
            }
        }
        if g.deleted_set.remove(&pod.uid) {
            let uid = pod.uid.clone();
            g.deleted.retain(|(_, u)| *u != uid);
        }
        let old = g.pods.insert(pod.uid.clone(), pod.clone());
        let rules = &self.rules.checked.associations;
        let inner = &mut *g;
        for (i, rule) in rules.iter().enumerate() {
            if let Some(old) = &old {
                for k in pod_keys(rule, old) {
                    if inner.index[i].get(&k) == Some(&old.uid) {
                        inner.index[i].remove(&k);
                    }
                }
            }
            for k in pod_keys(rule, &pod) {
                // A key shared with another pod (a reused IP) goes to the newer pod, or to
                // this one if the other is deleted.
                let keep_other = inner.index[i].get(&k).and_then(|u| inner.pods.get(u)).is_some_and(|other| {
                    other.uid != pod.uid && !inner.deleted_set.contains(&other.uid) && other.created > pod.created
                });
                if !keep_other {
                    inner.index[i].insert(k, pod.uid.clone());
                }
            }
        }
    }

    /// Marks a pod deleted; it stays associable for the grace period.
    pub fn delete(&self, v: &Value, now: Instant) {
        let uid = s(v, &["metadata", "uid"]).to_string();
        let mut g = self.inner.write();
        if g.pods.contains_key(&uid) && g.deleted_set.insert(uid.clone()) {
            g.deleted.push_back((now, uid));
        }
        Self::sweep_locked(&mut g, now, self.delete_grace);
    }

    /// A complete pod list: pods not in it are deleted (with the grace period), the others upserted.
    pub fn replace(&self, objects: &[Value], now: Instant) {
        let present: HashSet<&str> = objects.iter().map(|o| s(o, &["metadata", "uid"])).collect();
        {
            let mut g = self.inner.write();
            let gone: Vec<String> = g
                .pods
                .keys()
                .filter(|u| !present.contains(u.as_str()) && !g.deleted_set.contains(*u))
                .cloned()
                .collect();
            for uid in gone {
                g.deleted_set.insert(uid.clone());
                g.deleted.push_back((now, uid));
            }
        }
        for o in objects {
            self.upsert(o, now);
        }
        self.mark_synced(&self.pods_synced);
    }

    /// Removes the pods deleted longer than the grace period ago.
    pub fn sweep(&self, now: Instant) {
        Self::sweep_locked(&mut self.inner.write(), now, self.delete_grace);
    }

    fn sweep_locked(g: &mut Inner, now: Instant, grace: Duration) {
        while let Some((at, _)) = g.deleted.front() {
            if now.saturating_duration_since(*at) < grace {
                break;
            }
            let Some((_, uid)) = g.deleted.pop_front() else { break };
            if !g.deleted_set.remove(&uid) {
                continue;
            }
            Self::remove_locked(g, &uid);
        }
    }

    fn remove_locked(g: &mut Inner, uid: &str) {
        if g.pods.remove(uid).is_some() {
            for idx in g.index.iter_mut() {
                idx.retain(|_, u| u != uid);
            }
        }
    }

    /// A complete namespace list.
    pub fn replace_namespaces(&self, objects: &[Value]) {
        let m = objects
            .iter()
            .map(|o| (s(o, &["metadata", "name"]).to_string(), Arc::new(self.rules.namespace(o))))
            .collect();
        self.inner.write().namespaces = m;
        self.mark_synced(&self.namespaces_synced);
    }

    /// A namespace event.
    pub fn namespace_event(&self, event: EventType, v: &Value) {
        let name = s(v, &["metadata", "name"]).to_string();
        let mut g = self.inner.write();
        if event == EventType::Deleted {
            g.namespaces.remove(&name);
        } else {
            g.namespaces.insert(name, Arc::new(self.rules.namespace(v)));
        }
    }

    /// The pod of a resource with `attr` (its string attributes) sent from `conn` (peer IP).
    pub fn associate(&self, attr: &dyn Fn(&str) -> Option<String>, conn: Option<&str>) -> Association {
        let g = self.inner.read();
        for (i, rule) in self.rules.checked.associations.iter().enumerate() {
            let mut values = Vec::new();
            for src in rule {
                let v = match src {
                    Source::Connection => conn.map(str::to_string),
                    Source::Attribute(n) => attr(n),
                };
                match v {
                    Some(v) if !v.is_empty() => values.push(v),
                    _ => break,
                }
            }
            if values.len() < rule.len() {
                continue;
            }
            let key = values.join("\u{0}");
            let Some(pod) = g.index[i].get(&key).and_then(|u| g.pods.get(u)) else {
                return Association::NotFound(i);
            };
            let namespace = g.namespaces.get(&pod.namespace).cloned();
            let cluster_uid = g.namespaces.get("kube-system").map(|n| n.uid.clone()).filter(|u| !u.is_empty());
            return Association::Found(Box::new(Found { pod: pod.clone(), namespace, cluster_uid }), i);
        }
        Association::NoValues
    }
}

impl Found {
    /// Every attribute to insert, in precedence order, for a resource with `attr`.
    pub fn attributes(&self, rules: &Rules, attr: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut out = self.pod.attrs.clone();
        if let Some(ns) = &self.namespace {
            out.extend(ns.attrs.iter().cloned());
        }
        if rules.wants("k8s.cluster.uid")
            && let Some(u) = &self.cluster_uid
        {
            out.push(("k8s.cluster.uid".into(), u.clone()));
        }
        if rules.checked.needs_containers() {
            let by_id = attr("container.id");
            let by_name = attr("k8s.container.name");
            let c = match (&by_id, &by_name) {
                (Some(id), _) => self.pod.containers.iter().find(|c| c.statuses.iter().any(|(_, i, _)| i == id)),
                (None, Some(n)) => self.pod.containers.iter().find(|c| &c.name == n),
                (None, None) => None,
            };
            if let Some(c) = c {
                let status = match (&by_id, attr("k8s.container.restart_count").and_then(|r| r.parse::<i64>().ok())) {
                    (Some(id), _) => c.statuses.iter().find(|(_, i, _)| i == id),
                    (None, Some(r)) => c.statuses.iter().find(|(n, _, _)| *n == r),
                    (None, None) => c.statuses.iter().max_by_key(|(n, _, _)| *n),
                };
                let mut put = |k: &str, v: &str| {
                    if rules.wants(k) && !v.is_empty() {
                        out.push((k.to_string(), v.to_string()));
                    }
                };
                put("k8s.container.name", &c.name);
                put("container.image.name", &c.image_name);
                put("container.image.tag", &c.image_tag);
                if let Some((_, id, digest)) = status {
                    put("container.id", id);
                    put("container.image.repo_digests", digest);
                }
                put("service.version", &c.image_version);
                let instance = format!("{}.{}.{}", self.pod.namespace, self.pod.name, c.name);
                put("service.instance.id", &instance);
            }
        }
        out
    }
}

/// The pod watch's sink.
pub struct PodFeed(pub Arc<Cache>);

impl WatchSink for PodFeed {
    fn replace(&self, objects: Vec<Value>) {
        self.0.replace(&objects, Instant::now());
    }
    fn apply(&self, event: EventType, object: Value) -> bool {
        match event {
            EventType::Deleted => self.0.delete(&object, Instant::now()),
            _ => self.0.upsert(&object, Instant::now()),
        }
        true
    }
    fn failed(&self, failure: Failure) {
        (self.0.watch_failures)(failure)
    }
    fn objects_cut(&self, n: usize) {
        // The list had more pods than max_pods: those were not cached.
        self.0.not_cached.inc_by(n as u64);
    }
    fn max_objects(&self) -> usize {
        self.0.max_pods
    }
}

/// The namespace watch's sink.
pub struct NamespaceFeed(pub Arc<Cache>);

impl WatchSink for NamespaceFeed {
    fn replace(&self, objects: Vec<Value>) {
        self.0.replace_namespaces(&objects);
    }
    fn apply(&self, event: EventType, object: Value) -> bool {
        self.0.namespace_event(event, &object);
        true
    }
    fn failed(&self, failure: Failure) {
        (self.0.watch_failures)(failure)
    }
}
