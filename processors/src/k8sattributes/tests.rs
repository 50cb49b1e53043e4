//! Unit tests: names derived from owners, label / annotation rules, association, the cap, the
//! delete grace period and the settings' errors. Pod objects are shaped as the Kubernetes API
//! reference's `Pod` (core/v1).

use super::cache::{Association, Cache, Rules, cronjob_of_job, deployment_of_replicaset, parse_image};
use super::config::K8sAttributesConfig;
use super::*;
use inferwatch_core::component::parse_config;
use inferwatch_core::kube::EventType;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use serde_json::{Value as J, json};

fn pod(name: &str, uid: &str, ip: &str, created: &str) -> J {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": "ml", "uid": uid, "creationTimestamp": created,
            "labels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "server",
                       "pod-template-hash": "7d9f8b6c5", "team": "inference"},
            "annotations": {"resource.opentelemetry.io/service.name": "llama-svc", "git-sha": "abc123"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-7d9f8b6c5",
                                 "uid": "rs-uid-1", "controller": true}]
        },
        "spec": {"nodeName": "gpu-node-1", "containers": [
            {"name": "vllm", "image": "registry.local:5000/vllm/vllm-openai:v0.8.5"},
            {"name": "log-shipper", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": [
            {"name": "vllm", "restartCount": 1, "containerID": "containerd://c0ffee",
             "imageID": "registry.local:5000/vllm/vllm-openai@sha256:aaaa"},
            {"name": "log-shipper", "restartCount": 0, "containerID": "containerd://beef"}]}
    })
}

fn checked(cfg: J) -> Checked {
    parse_config::<K8sAttributesConfig>(&cfg).unwrap().check().unwrap()
}

fn cache(cfg: J, grace: Duration) -> (Arc<Cache>, prometheus_client::metrics::counter::Counter) {
    let c = prometheus_client::metrics::counter::Counter::default();
    (Arc::new(Cache::new(Rules::new(checked(cfg)), grace, c.clone(), Box::new(|_| {}))), c)
}

fn found_name(a: Association) -> Option<String> {
    match a {
        Association::Found(f, _) => Some(f.pod.name.clone()),
        _ => None,
    }
}

fn attrs(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: std::collections::HashMap<String, String> =
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| m.get(k).cloned()
}

#[test]
fn owner_names_are_trimmed_as_otelcol_does() {
    assert_eq!(deployment_of_replicaset("vllm-7d9f8b6c5", Some("7d9f8b6c5")).as_deref(), Some("vllm"));
    assert_eq!(deployment_of_replicaset("my-app-v2-5c8f9d", None).as_deref(), Some("my-app-v2"));
    // The template hash decides where a hyphenated hash-like tail begins.
    assert_eq!(deployment_of_replicaset("a-b-c", Some("b-c")).as_deref(), Some("a"));
    assert_eq!(deployment_of_replicaset("standalone", None), None);
    assert_eq!(cronjob_of_job("nightly-report-28912345").as_deref(), Some("nightly-report"));
    assert_eq!(cronjob_of_job("one-off-job"), None);
    assert_eq!(parse_image("registry.local:5000/vllm/vllm-openai:v0.8.5").0, "registry.local:5000/vllm/vllm-openai");
    assert_eq!(parse_image("registry.local:5000/vllm/vllm-openai:v0.8.5").1, "v0.8.5");
    assert_eq!(parse_image("busybox").1, "latest");
    assert_eq!(parse_image("img:1.0@sha256:ff").2, "1.0@sha256:ff");
}

#[test]
fn metadata_and_label_rules_are_extracted() {
    let rules = Rules::new(checked(json!({
        "extract": {
            "metadata": ["k8s.pod.name", "k8s.deployment.name", "k8s.replicaset.name", "k8s.replicaset.uid",
                         "k8s.node.name", "service.name", "k8s.statefulset.name"],
            "labels": [
                {"tag_name": "app.$1", "key_regex": "app\\.kubernetes\\.io/(.*)"},
                {"tag_name": "owner_team", "key": "team", "from": "pod"},
                {"key": "pod-template-hash"}
            ],
            "annotations": [{"tag_name": "$$1", "key_regex": "git-(.*)"}],
            "otel_annotations": true
        }
    })));
    let p = rules.pod(&pod("vllm-7d9f8b6c5-x2x7k", "u1", "10.1.0.7", "2025-01-01T00:00:00Z"));
    let get = |k: &str| p.attrs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("k8s.pod.name"), Some("vllm-7d9f8b6c5-x2x7k"));
    assert_eq!(get("k8s.deployment.name"), Some("vllm"));
    assert_eq!(get("k8s.replicaset.name"), Some("vllm-7d9f8b6c5"));
    assert_eq!(get("k8s.replicaset.uid"), Some("rs-uid-1"));
    assert_eq!(get("k8s.node.name"), Some("gpu-node-1"));
    assert_eq!(get("k8s.statefulset.name"), None, "no StatefulSet owner");
    assert_eq!(get("k8s.namespace.name"), None, "not asked for");
    // The pod's own resource.opentelemetry.io annotation wins over the labels.
    assert_eq!(get("service.name"), Some("llama-svc"));
    assert_eq!(get("app.name"), Some("vllm"));
    assert_eq!(get("app.component"), Some("server"));
    assert_eq!(get("owner_team"), Some("inference"));
    assert_eq!(get("k8s.pod.labels.pod-template-hash"), Some("7d9f8b6c5"), "otelcol's default tag name");
    assert_eq!(get("sha"), Some("abc123"), "$$1 is otelcol's escaped $1");
    let names: Vec<&str> = p.attrs.iter().map(|(k, _)| k.as_str()).collect();
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "one value per attribute: {names:?}");
}

#[test]
fn association_rules_in_order_first_with_values_decides() {
    let (c, _) = cache(
        json!({"pod_association": [
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.name"},
                         {"from": "resource_attribute", "name": "k8s.namespace.name"}]},
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
            {"sources": [{"from": "connection"}]}
        ]}),
        cache::DELETE_GRACE,
    );
    let now = Instant::now();
    c.replace(
        &[pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), pod("b", "ub", "10.0.0.2", "2025-01-01T00:00:00Z")],
        now,
    );
    assert!(c.is_synced());
    assert_eq!(found_name(c.associate(&attrs(&[("k8s.pod.uid", "ub")]), None)).as_deref(), Some("b"));
    assert_eq!(
        found_name(c.associate(&attrs(&[("k8s.pod.name", "a"), ("k8s.namespace.name", "ml")]), None)).as_deref(),
        Some("a")
    );
    // Name without namespace: that rule lacks a value; the IP rule then decides.
    assert_eq!(
        found_name(c.associate(&attrs(&[("k8s.pod.name", "a"), ("k8s.pod.ip", "10.0.0.2")]), None)).as_deref(),
        Some("b")
    );
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).as_deref(), Some("a"));
    // A rule whose values match no pod ends the search (as otelcol): the connection is not tried.
    assert!(matches!(c.associate(&attrs(&[("k8s.pod.uid", "nope")]), Some("10.0.0.1")), Association::NotFound(0)));
    assert!(matches!(c.associate(&attrs(&[]), None), Association::NoValues));
}

#[test]
fn the_cap_counts_what_is_not_cached_and_a_live_pod_takes_a_deleted_ones_room() {
    let grace = Duration::from_secs(120);
    let (c, not_cached) = cache(json!({"max_pods": 2}), grace);
    let t0 = Instant::now();
    c.upsert(&pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), t0);
    c.upsert(&pod("b", "ub", "10.0.0.2", "2025-01-01T00:00:00Z"), t0);
    c.upsert(&pod("c", "uc", "10.0.0.3", "2025-01-01T00:00:00Z"), t0);
    assert_eq!((c.len(), not_cached.get()), (2, 1));
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.3"))).is_none());
    // An update of a cached pod is not refused.
    c.upsert(&pod("b", "ub", "10.0.0.2", "2025-01-01T00:00:00Z"), t0);
    assert_eq!(not_cached.get(), 1);
    // A deleted pod in its grace period gives its room to a live one.
    c.delete(&pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), t0);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).as_deref(), Some("a"));
    c.upsert(&pod("c", "uc", "10.0.0.3", "2025-01-01T00:00:00Z"), t0 + Duration::from_secs(1));
    assert_eq!((c.len(), not_cached.get()), (2, 1));
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.3"))).as_deref(), Some("c"));
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).is_none(), "evicted for c");
    // No deleted pod left to evict: refused and counted again.
    c.upsert(&pod("d", "ud", "10.0.0.4", "2025-01-01T00:00:00Z"), t0 + Duration::from_secs(2));
    assert_eq!((c.len(), not_cached.get()), (2, 2));
}

#[test]
fn a_deleted_pod_stays_associable_for_the_grace_period_only() {
    let grace = Duration::from_secs(120);
    let (c, _) = cache(json!({}), grace);
    let t0 = Instant::now();
    let a = pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z");
    let b = pod("b", "ub", "10.0.0.2", "2025-01-01T00:00:00Z");
    c.upsert(&a, t0);
    c.upsert(&b, t0);
    c.delete(&a, t0);
    c.delete(&b, t0 + Duration::from_secs(60));
    c.sweep(t0 + grace - Duration::from_millis(1));
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).as_deref(), Some("a"), "in its grace period");
    c.sweep(t0 + grace);
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).is_none(), "after it");
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.2"))).as_deref(), Some("b"), "its own grace");
    // Added again (a pod recreated under the same uid, or a relist): no longer deleted.
    c.upsert(&b, t0 + Duration::from_secs(90));
    c.sweep(t0 + grace * 3);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.2"))).as_deref(), Some("b"));
    assert_eq!(c.len(), 1);
    // Deleting an unknown pod changes nothing.
    c.delete(&pod("x", "ux", "10.0.0.9", "2025-01-01T00:00:00Z"), t0);
    assert_eq!(c.len(), 1);
}

#[test]
fn the_first_rule_with_values_wins_even_when_a_later_one_names_another_pod() {
    let (c, _) = cache(
        json!({"pod_association": [
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}
        ]}),
        cache::DELETE_GRACE,
    );
    c.replace(
        &[pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), pod("b", "ub", "10.0.0.2", "2025-01-01T00:00:00Z")],
        Instant::now(),
    );
    let both = attrs(&[("k8s.pod.ip", "10.0.0.1"), ("k8s.pod.uid", "ub")]);
    assert!(matches!(c.associate(&both, Some("10.0.0.2")), Association::Found(ref f, 0) if f.pod.name == "a"));
    assert!(
        matches!(c.associate(&attrs(&[("k8s.pod.uid", "ub")]), None), Association::Found(ref f, 1) if f.pod.name == "b")
    );
    // No connection rule configured: the peer is not used.
    assert!(matches!(c.associate(&attrs(&[]), Some("10.0.0.1")), Association::NoValues));
}

#[test]
fn namespace_rules_cluster_uid_and_anchored_key_regexes() {
    let (c, _) = cache(
        json!({"extract": {
            "metadata": ["k8s.pod.name", "k8s.cluster.uid"],
            "labels": [
                {"tag_name": "partial", "key_regex": "tea"},
                {"key": "tier", "from": "namespace"},
                {"tag_name": "l.$1", "key_regex": "app\\.kubernetes\\.io/(name)"}
            ],
            "annotations": [
                {"tag_name": "ns.owner", "key": "owner", "from": "namespace"},
                {"key": "git-sha"}
            ]
        }}),
        cache::DELETE_GRACE,
    );
    assert!(c.rules().checked().needs_namespaces());
    let now = Instant::now();
    c.replace(&[pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z")], now);
    assert!(!c.is_synced(), "the namespaces are not listed yet");
    c.replace_namespaces(&[
        json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "ml", "uid": "ns-ml",
               "labels": {"tier": "gold", "kubernetes.io/metadata.name": "ml"}, "annotations": {"owner": "alice"}}}),
        json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "kube-system", "uid": "cluster-7"}}),
    ]);
    assert!(c.is_synced());
    let none = attrs(&[]);
    let Association::Found(f, _) = c.associate(&none, Some("10.0.0.1")) else { panic!("not found") };
    let out = f.attributes(c.rules(), &none);
    let get = |k: &str| out.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("partial"), None, "key_regex matches whole keys only");
    assert_eq!(get("l.name"), Some("vllm"));
    assert_eq!(get("k8s.namespace.labels.tier"), Some("gold"), "otelcol's default name of a namespace label");
    assert_eq!(get("ns.owner"), Some("alice"));
    assert_eq!(get("k8s.pod.annotations.git-sha"), Some("abc123"));
    assert_eq!(get("k8s.cluster.uid"), Some("cluster-7"), "kube-system's uid");
    // A namespace MODIFIED event changes what later data gets; DELETED removes it.
    c.namespace_event(
        EventType::Modified,
        &json!({"metadata": {"name": "ml", "uid": "ns-ml", "labels": {"tier": "silver"}}}),
    );
    let Association::Found(f, _) = c.associate(&none, Some("10.0.0.1")) else { panic!("not found") };
    assert!(f.attributes(c.rules(), &none).contains(&("k8s.namespace.labels.tier".into(), "silver".into())));
    c.namespace_event(EventType::Deleted, &json!({"metadata": {"name": "ml"}}));
    let Association::Found(f, _) = c.associate(&none, Some("10.0.0.1")) else { panic!("not found") };
    assert!(!f.attributes(c.rules(), &none).iter().any(|(k, _)| k == "k8s.namespace.labels.tier"));
}

#[test]
fn host_network_pods_and_excluded_names_are_not_associated_by_ip() {
    let (c, _) = cache(json!({"exclude": {"pods": [{"name": "^otel-agent"}]}}), cache::DELETE_GRACE);
    let now = Instant::now();
    let mut host = pod("node-exporter-x", "uh", "10.0.0.5", "2025-01-01T00:00:00Z");
    host["spec"]["hostNetwork"] = json!(true);
    c.upsert(&host, now);
    c.upsert(&pod("otel-agent-abc", "uo", "10.0.0.6", "2025-01-01T00:00:00Z"), now);
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.5"))).is_none(), "shares the node's IP");
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.6"))).is_none(), "excluded");
    assert_eq!(c.len(), 1);
}

#[test]
fn a_reused_ip_goes_to_the_new_pod_and_a_relist_deletes_the_missing() {
    let grace = Duration::from_secs(120);
    let (c, _) = cache(json!({}), grace);
    let t0 = Instant::now();
    c.upsert(&pod("old", "u-old", "10.0.0.9", "2025-01-01T00:00:00Z"), t0);
    c.delete(&pod("old", "u-old", "10.0.0.9", "2025-01-01T00:00:00Z"), t0);
    c.upsert(&pod("new", "u-new", "10.0.0.9", "2025-01-02T00:00:00Z"), t0);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.9"))).as_deref(), Some("new"));
    // A late MODIFIED of the older pod does not take the IP back.
    c.upsert(&pod("old", "u-old", "10.0.0.9", "2025-01-01T00:00:00Z"), t0);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.9"))).as_deref(), Some("new"));
    // Sweeping the old pod keeps the new pod's index entry.
    c.replace(&[pod("new", "u-new", "10.0.0.9", "2025-01-02T00:00:00Z")], t0);
    c.sweep(t0 + grace);
    assert_eq!(c.len(), 1);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.9"))).as_deref(), Some("new"));
    c.replace(&[], t0 + grace);
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.9"))).as_deref(), Some("new"), "grace first");
    c.sweep(t0 + grace * 2);
    assert!(c.is_empty());
}

#[test]
fn container_attributes_need_the_container() {
    let (c, _) = cache(
        json!({"extract": {"metadata": ["k8s.pod.name", "k8s.container.name", "container.id", "container.image.name",
                                         "container.image.tag", "service.instance.id", "service.version"]}}),
        cache::DELETE_GRACE,
    );
    c.upsert(&pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), Instant::now());
    let with = |list: &[(&str, &str)]| {
        let a = attrs(list);
        match c.associate(&a, Some("10.0.0.1")) {
            Association::Found(f, _) => f.attributes(c.rules(), &a),
            _ => panic!("not found"),
        }
    };
    let by_id = with(&[("container.id", "c0ffee")]);
    let get = |l: &[(String, String)], k: &str| l.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get(&by_id, "k8s.container.name").as_deref(), Some("vllm"));
    assert_eq!(get(&by_id, "container.image.name").as_deref(), Some("registry.local:5000/vllm/vllm-openai"));
    assert_eq!(get(&by_id, "container.image.tag").as_deref(), Some("v0.8.5"));
    assert_eq!(get(&by_id, "service.version").as_deref(), Some("v0.8.5"));
    assert_eq!(get(&by_id, "service.instance.id").as_deref(), Some("ml.a.vllm"));
    let by_name = with(&[("k8s.container.name", "log-shipper")]);
    assert_eq!(get(&by_name, "container.id").as_deref(), Some("beef"));
    let none = with(&[]);
    assert_eq!(get(&none, "k8s.container.name"), None, "two containers: which one is not known");
    assert_eq!(get(&none, "k8s.pod.name").as_deref(), Some("a"));
}

fn spans(resource: &[(&str, &str)]) -> Payload {
    Payload::Traces(ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| string_kv(k, v)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
    })
}

fn resource_of(p: Payload) -> Vec<(String, String)> {
    let Payload::Traces(r) = p else { panic!("not traces") };
    let Some(res) = &r.resource_spans[0].resource else { return Vec::new() };
    res.attributes.iter().map(|kv| (kv.key.clone(), str_value(kv).unwrap())).collect()
}

#[derive(Default)]
struct Null;

#[async_trait]
impl Consumer for Null {
    async fn consume(&self, _data: Payload) -> Result<(), ConsumeError> {
        Ok(())
    }
}

fn processor(cfg: J) -> K8sAttributes {
    let id = ComponentId::parse("k8sattributes").unwrap();
    let shared = Arc::new(Shared::new(&id, &Arc::new(Telemetry::new()), checked(cfg)).unwrap());
    K8sAttributes::new(shared, Arc::new(Null))
}

#[test]
fn resources_get_the_pod_without_overwriting() {
    let p = processor(json!({"auth_type": "none", "api_server": "http://127.0.0.1:1"}));
    p.shared.cache().upsert(&pod("vllm-7d9f8b6c5-x2x7k", "u1", "10.0.0.1", "2025-01-01T00:00:00Z"), Instant::now());
    let out = resource_of(p.process(spans(&[("k8s.namespace.name", "mine")]), Some("10.0.0.1")));
    let get = |k: &str| out.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("k8s.namespace.name"), Some("mine"), "an existing attribute is kept");
    assert_eq!(get("k8s.pod.name"), Some("vllm-7d9f8b6c5-x2x7k"));
    assert_eq!(get("k8s.deployment.name"), Some("vllm"));
    assert_eq!(get("k8s.pod.start_time"), Some("2025-01-01T00:00:00Z"));
    assert_eq!(get("k8s.pod.ip"), Some("10.0.0.1"), "associated by the connection");
    assert_eq!(out.iter().filter(|(k, _)| k == "k8s.namespace.name").count(), 1);
    // Unknown peer: only its IP.
    let out = resource_of(p.process(spans(&[]), Some("10.9.9.9")));
    assert_eq!(out, vec![("k8s.pod.ip".to_string(), "10.9.9.9".to_string())]);
}

#[test]
fn passthrough_only_adds_the_peer_ip() {
    let p = processor(json!({"passthrough": true}));
    let out = resource_of(p.process(spans(&[("service.name", "x")]), Some("10.0.0.4")));
    assert_eq!(out.len(), 2);
    assert_eq!(out[1], ("k8s.pod.ip".to_string(), "10.0.0.4".to_string()));
}

#[test]
fn settings_errors_name_the_key() {
    let err = |v: J| {
        let e = match parse_config::<K8sAttributesConfig>(&v) {
            Err(e) => e,
            Ok(c) => c.check().unwrap_err(),
        };
        (e.dotted(), e.message)
    };
    let (path, msg) = err(json!({"extract": {"metadat": []}}));
    assert_eq!(path, "extract.metadat");
    assert!(msg.contains("unknown field"), "{msg}");
    let (path, msg) = err(json!({"extract": {"metadata": ["k8s.pod.name", "k8s.deployment.uid"]}}));
    assert_eq!(path, "extract.metadata.1");
    assert!(msg.contains("k8s.deployment.uid") && msg.contains("ReplicaSet watch"), "{msg}");
    let (path, _) = err(json!({"extract": {"metadata": ["k8s.pod.nam"]}}));
    assert_eq!(path, "extract.metadata.0");
    let (path, msg) = err(json!({"extract": {"labels": [{"key": "a", "from": "node"}]}}));
    assert_eq!(path, "extract.labels.0.from");
    assert!(msg.contains("not supported by inferwatch"), "{msg}");
    let (path, _) = err(json!({"extract": {"labels": [{"key": "a", "key_regex": "b"}]}}));
    assert_eq!(path, "extract.labels.0.key_regex");
    let (path, msg) = err(json!({"auth_type": "kubeConfig"}));
    assert_eq!(path, "auth_type");
    assert!(msg.contains("kubeconfig"), "{msg}");
    let (path, _) = err(json!({"pod_association": [{"sources": [{"from": "resource_attribute"}]}]}));
    assert_eq!(path, "pod_association.0.sources.0.name");
    let (path, _) = err(json!({"filter": {"labels": [{"key": "a", "op": "in"}]}}));
    assert_eq!(path, "filter.labels.0.op");
    let (path, _) = err(json!({"extract": {"service_attributes": {"enabled": true}}}));
    assert_eq!(path, "extract.service_attributes");
    // What the helm chart's kubernetesAttributes example asks for is accepted.
    checked(json!({"extract": {"metadata": [
        "k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.node.name", "k8s.pod.start_time",
        "k8s.deployment.name", "k8s.replicaset.name", "k8s.replicaset.uid", "k8s.daemonset.name",
        "k8s.daemonset.uid", "k8s.job.name", "k8s.job.uid", "k8s.container.name", "k8s.cronjob.name",
        "k8s.statefulset.name", "k8s.statefulset.uid", "container.image.tag", "container.image.name",
        "k8s.cluster.uid", "service.namespace", "service.name", "service.version", "service.instance.id"],
        "otel_annotations": true}, "passthrough": false,
        "pod_association": [{"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
                            {"sources": [{"from": "connection"}]}]}));
}

fn get<'a>(out: &'a [(String, String)], k: &str) -> Option<&'a str> {
    out.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

#[test]
fn process_associates_by_pod_uid_then_pod_ip_then_the_connection() {
    let p = processor(json!({"auth_type": "none", "api_server": "http://127.0.0.1:1", "pod_association": [
        {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
        {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
        {"sources": [{"from": "connection"}]}
    ]}));
    let now = Instant::now();
    p.shared.cache().upsert(&pod("vllm-7d9f8b6c5-aaaaa", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), now);
    p.shared.cache().upsert(&pod("vllm-7d9f8b6c5-bbbbb", "ub", "10.0.0.2", "2025-01-01T00:00:00Z"), now);
    // By uid, sent through a gateway (another pod's connection): the uid decides.
    let out = resource_of(p.process(spans(&[("k8s.pod.uid", "ub")]), Some("10.0.0.1")));
    assert_eq!(get(&out, "k8s.pod.name"), Some("vllm-7d9f8b6c5-bbbbb"));
    assert_eq!(get(&out, "k8s.node.name"), Some("gpu-node-1"));
    assert_eq!(get(&out, "k8s.deployment.name"), Some("vllm"));
    assert_eq!(get(&out, "k8s.pod.ip"), None, "not associated by the connection: the peer is not the pod");
    let out = resource_of(p.process(spans(&[("k8s.pod.ip", "10.0.0.2")]), Some("10.0.0.1")));
    assert_eq!(get(&out, "k8s.pod.name"), Some("vllm-7d9f8b6c5-bbbbb"));
    assert_eq!(get(&out, "k8s.pod.uid"), Some("ub"));
    let out = resource_of(p.process(spans(&[]), Some("10.0.0.1")));
    assert_eq!(get(&out, "k8s.pod.name"), Some("vllm-7d9f8b6c5-aaaaa"));
    assert_eq!(get(&out, "k8s.pod.ip"), Some("10.0.0.1"));
    // An unknown uid decides too (nothing is added), as otelcol's first association with values.
    let out = resource_of(p.process(spans(&[("k8s.pod.uid", "gone")]), Some("10.0.0.1")));
    assert_eq!(out, vec![("k8s.pod.uid".to_string(), "gone".to_string())]);
}

#[test]
fn existing_attributes_are_never_replaced() {
    let p = processor(json!({"auth_type": "none", "api_server": "http://127.0.0.1:1",
        "extract": {"labels": [{"key": "team", "tag_name": "team"}]}}));
    p.shared.cache().upsert(&pod("vllm-7d9f8b6c5-aaaaa", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), Instant::now());
    let mine = [
        ("k8s.pod.name", "set-by-sdk"),
        ("k8s.deployment.name", "mine"),
        ("team", "their-own"),
        ("k8s.pod.ip", "192.168.1.1"),
    ];
    let out = resource_of(p.process(spans(&mine), Some("10.0.0.1")));
    for (k, v) in mine {
        assert_eq!(out.iter().filter(|(n, _)| n == k).count(), 1, "{k}");
        assert_eq!(get(&out, k), Some(v), "{k}");
    }
    assert_eq!(get(&out, "k8s.pod.uid"), Some("ua"), "missing ones are still added");
}

#[derive(Default)]
struct Capture(parking_lot::Mutex<Vec<Payload>>);

#[async_trait]
impl Consumer for Capture {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        self.0.lock().push(data);
        Ok(())
    }
}

#[tokio::test]
async fn consume_reads_the_receivers_peer_ipv4_mapped_as_ipv4() {
    let id = ComponentId::parse("k8s_attributes").unwrap();
    let cfg = json!({"auth_type": "none", "api_server": "http://127.0.0.1:1"});
    let shared = Arc::new(Shared::new(&id, &Arc::new(Telemetry::new()), checked(cfg)).unwrap());
    shared.cache().upsert(&pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), Instant::now());
    let cap = Arc::new(Capture::default());
    let p = K8sAttributes::new(shared, cap.clone());
    let info = ClientInfo { addr: Some("[::ffff:10.0.0.1]:40000".parse().unwrap()), ..Default::default() };
    ClientInfo::scope(Arc::new(info), p.consume(spans(&[]))).await.unwrap();
    // Outside a receiver's scope there is no peer: nothing to associate by.
    p.consume(spans(&[])).await.unwrap();
    let got: Vec<_> = std::mem::take(&mut *cap.0.lock()).into_iter().map(resource_of).collect();
    assert_eq!(get(&got[0], "k8s.pod.name"), Some("a"));
    assert_eq!(get(&got[0], "k8s.pod.ip"), Some("10.0.0.1"));
    assert!(got[1].is_empty(), "{:?}", got[1]);
}

// --- list + watch against a fixture API server -------------------------------------------------

mod api {
    //! A Kubernetes API server fixture: `GET /api/v1/pods` answers a `PodList` page (by the
    //! `continue` token), `?watch=1` streams the next scripted watch (newline-delimited
    //! `WatchEvent`s, fed by the test) or hangs when none is left.
    use axum::Router;
    use axum::body::Body;
    use axum::extract::{Query, State};
    use axum::http::header;
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use serde_json::{Value, json};
    use std::collections::{HashMap, VecDeque};
    use std::sync::Arc;
    use tokio::sync::mpsc;

    type Chunk = Result<String, std::io::Error>;

    #[derive(Default)]
    pub struct Api {
        pub port: u16,
        /// `continue` token ("" for the first page) -> the page.
        pub pages: parking_lot::Mutex<HashMap<String, Value>>,
        /// Every request's query, in order.
        pub queries: parking_lot::Mutex<Vec<HashMap<String, String>>>,
        watches: parking_lot::Mutex<VecDeque<mpsc::Receiver<Chunk>>>,
    }

    impl Api {
        pub fn lists(&self) -> usize {
            self.queries.lock().iter().filter(|q| !q.contains_key("watch") && !q.contains_key("continue")).count()
        }
        pub fn watch_queries(&self) -> Vec<HashMap<String, String>> {
            self.queries.lock().iter().filter(|q| q.contains_key("watch")).cloned().collect()
        }
        /// The sender of the next watch stream.
        pub fn script_watch(&self) -> Watch {
            let (tx, rx) = mpsc::channel(16);
            self.watches.lock().push_back(rx);
            Watch(tx)
        }
        pub fn set_list(&self, resource_version: &str, items: Vec<Value>) {
            let page = json!({"kind": "PodList", "apiVersion": "v1",
                              "metadata": {"resourceVersion": resource_version}, "items": items});
            *self.pages.lock() = HashMap::from([(String::new(), page)]);
        }
    }

    pub struct Watch(mpsc::Sender<Chunk>);

    impl Watch {
        pub async fn event(&self, kind: &str, object: Value) {
            let line = json!({"type": kind, "object": object}).to_string() + "\n";
            self.0.send(Ok(line)).await.unwrap();
        }
    }

    async fn pods(State(a): State<Arc<Api>>, Query(q): Query<HashMap<String, String>>) -> Response {
        a.queries.lock().push(q.clone());
        let json_type = [(header::CONTENT_TYPE, "application/json")];
        if q.get("watch").map(String::as_str) != Some("1") {
            let token = q.get("continue").cloned().unwrap_or_default();
            let page = a.pages.lock().get(&token).cloned();
            return match page {
                Some(p) => (json_type, p.to_string()).into_response(),
                None => (axum::http::StatusCode::BAD_REQUEST, "unknown continue token").into_response(),
            };
        }
        let next = a.watches.lock().pop_front();
        match next {
            Some(rx) => (json_type, Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))).into_response(),
            None => (json_type, Body::from_stream(futures::stream::pending::<Chunk>())).into_response(),
        }
    }

    pub async fn serve() -> Arc<Api> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = Arc::new(Api { port: listener.local_addr().unwrap().port(), ..Default::default() });
        let app = Router::new().route("/api/v1/pods", get(pods)).with_state(a.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        a
    }
}

const DEADLINE: Duration = Duration::from_secs(10);

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn with_rv(mut p: J, rv: &str) -> J {
    p["metadata"]["resourceVersion"] = json!(rv);
    p
}

fn watched(api: &api::Api, extra: J) -> (Arc<Shared>, K8sAttributes, Arc<Telemetry>) {
    let mut cfg = json!({"auth_type": "none", "api_server": format!("http://127.0.0.1:{}", api.port),
                         "wait_for_metadata": true});
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let t = Arc::new(Telemetry::new());
    let id = ComponentId::parse("k8s_attributes").unwrap();
    let shared = Arc::new(Shared::new(&id, &t, checked(cfg)).unwrap());
    (shared.clone(), K8sAttributes::new(shared, Arc::new(Null)), t)
}

#[tokio::test]
async fn watch_events_bookmarks_and_410_gone_keep_the_cache_current() {
    let api = api::serve().await;
    let a = with_rv(pod("vllm-7d9f8b6c5-aaaaa", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), "90");
    api.set_list("100", vec![a.clone()]);
    let w1 = api.script_watch();
    let w2 = api.script_watch();
    let w3 = api.script_watch();
    let (shared, p, _) = watched(&api, json!({"extract": {"labels": [{"key": "team", "tag_name": "team"}]}}));
    // wait_for_metadata: start returns once the pods are listed.
    p.start().await.unwrap();
    assert!(shared.cache().is_synced());
    let by_ip = |ip: &str| resource_of(p.process(spans(&[]), Some(ip)));
    let team = |ip: &str| get(&by_ip(ip), "team").map(str::to_string);
    assert_eq!(team("10.0.0.1").as_deref(), Some("inference"));
    {
        let q = api.queries.lock();
        assert_eq!(q[0].get("limit").map(String::as_str), Some("500"), "{q:?}");
        assert!(!q[0].contains_key("fieldSelector") && !q[0].contains_key("labelSelector"), "{q:?}");
    }

    // ADDED, MODIFIED (a label changes), then a BOOKMARK and the end of the stream.
    w1.event("ADDED", with_rv(pod("vllm-7d9f8b6c5-bbbbb", "ub", "10.0.0.2", "2025-01-02T00:00:00Z"), "101")).await;
    until("the ADDED pod", || get(&by_ip("10.0.0.2"), "k8s.pod.name") == Some("vllm-7d9f8b6c5-bbbbb")).await;
    let mut changed = with_rv(a.clone(), "102");
    changed["metadata"]["labels"]["team"] = json!("training");
    w1.event("MODIFIED", changed).await;
    until("the MODIFIED label", || team("10.0.0.1").as_deref() == Some("training")).await;
    w1.event("BOOKMARK", json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "150"}})).await;
    drop(w1);
    until("the second watch", || api.watch_queries().len() >= 2).await;
    let wq = api.watch_queries();
    assert_eq!(wq[0].get("resourceVersion").map(String::as_str), Some("100"), "from the list's version");
    assert_eq!(wq[0].get("allowWatchBookmarks").map(String::as_str), Some("true"));
    assert_eq!(wq[1].get("resourceVersion").map(String::as_str), Some("150"), "resumed from the bookmark");
    assert_eq!(api.lists(), 1, "an ended stream is resumed, not listed again");
    assert_eq!(shared.cache().len(), 2, "a bookmark is not a pod");

    // 410 Gone as an ERROR event: listed again; the pod missing from the new list is deleted.
    let b = with_rv(pod("vllm-7d9f8b6c5-bbbbb", "ub", "10.0.0.2", "2025-01-02T00:00:00Z"), "101");
    api.set_list("200", vec![b.clone()]);
    let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": "too old resource version: 150 (199)", "reason": "Expired", "code": 410});
    w2.event("ERROR", gone).await;
    until("a list after 410 Gone", || api.lists() == 2).await;
    until("the watch from the new list", || api.watch_queries().len() >= 3).await;
    assert_eq!(api.watch_queries()[2].get("resourceVersion").map(String::as_str), Some("200"));
    assert_eq!(team("10.0.0.1").as_deref(), Some("training"), "deleted by the relist, still in its grace period");
    shared.cache().sweep(Instant::now() + cache::DELETE_GRACE);
    assert_eq!(get(&by_ip("10.0.0.1"), "k8s.pod.name"), None, "gone after the grace period");
    assert_eq!(get(&by_ip("10.0.0.2"), "k8s.pod.name"), Some("vllm-7d9f8b6c5-bbbbb"), "still listed");

    // DELETED: associable for the grace period, then gone.
    w3.event("DELETED", with_rv(b, "201")).await;
    w3.event("ADDED", with_rv(pod("c", "uc", "10.0.0.3", "2025-01-03T00:00:00Z"), "202")).await;
    until("the event after DELETED", || get(&by_ip("10.0.0.3"), "k8s.pod.name") == Some("c")).await;
    assert_eq!(get(&by_ip("10.0.0.2"), "k8s.pod.name"), Some("vllm-7d9f8b6c5-bbbbb"), "in its grace period");
    shared.cache().sweep(Instant::now() + cache::DELETE_GRACE);
    assert_eq!(get(&by_ip("10.0.0.2"), "k8s.pod.name"), None);
    assert_eq!(get(&by_ip("10.0.0.3"), "k8s.pod.name"), Some("c"));
    p.shutdown(Instant::now()).await;
}

#[tokio::test]
async fn a_paged_list_over_max_pods_counts_every_pod_left_out() {
    let api = api::serve().await;
    let pods: Vec<J> = (1..=5)
        .map(|i| pod(&format!("p{i}"), &format!("u{i}"), &format!("10.0.1.{i}"), "2025-01-01T00:00:00Z"))
        .collect();
    let page = |rv: &str, cont: &str, items: &[J]| {
        json!({"kind": "PodList", "apiVersion": "v1",
               "metadata": {"resourceVersion": rv, "continue": cont}, "items": items})
    };
    *api.pages.lock() = std::collections::HashMap::from([
        (String::new(), page("", "tok-2", &pods[..3])),
        ("tok-2".to_string(), page("300", "", &pods[3..])),
    ]);
    let (shared, p, t) = watched(
        &api,
        json!({"max_pods": 2, "filter": {"node": "gpu-node-1", "labels": [{"key": "app.kubernetes.io/name", "value": "vllm"}]}}),
    );
    p.start().await.unwrap();
    assert_eq!(shared.cache().len(), 2);
    let text = t.render();
    assert!(text.contains(r#"inferwatch_k8sattributes_pods_not_cached_total{processor="k8s_attributes"} 3"#), "{text}");
    assert!(
        text.contains(
            r#"inferwatch_k8sattributes_watch_failures_total{processor="k8s_attributes",reason="objects_cut"} 1"#
        ),
        "{text}"
    );
    until("the watch", || !api.watch_queries().is_empty()).await;
    let q = api.queries.lock().clone();
    assert_eq!(q[1].get("continue").map(String::as_str), Some("tok-2"), "{q:?}");
    for x in &q {
        assert_eq!(x.get("fieldSelector").map(String::as_str), Some("spec.nodeName=gpu-node-1"), "{x:?}");
        assert_eq!(x.get("labelSelector").map(String::as_str), Some("app.kubernetes.io/name=vllm"), "{x:?}");
    }
    assert_eq!(api.watch_queries()[0].get("resourceVersion").map(String::as_str), Some("300"));
    p.shutdown(Instant::now()).await;
}

#[tokio::test]
async fn wait_for_metadata_fails_the_start_when_the_api_does_not_answer() {
    // A port nothing listens on: every list fails (and is retried); the start gives up in time.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let cfg = json!({"auth_type": "none", "api_server": format!("http://127.0.0.1:{port}"),
                     "wait_for_metadata": true, "wait_for_metadata_timeout": "300ms"});
    let id = ComponentId::parse("k8sattributes").unwrap();
    let shared = Arc::new(Shared::new(&id, &Arc::new(Telemetry::new()), checked(cfg)).unwrap());
    let p = K8sAttributes::new(shared, Arc::new(Null));
    let err = p.start().await.unwrap_err().to_string();
    assert!(err.contains("wait_for_metadata"), "{err}");
    p.shutdown(Instant::now()).await;
}
