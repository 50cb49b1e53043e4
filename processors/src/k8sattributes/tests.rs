//! Unit tests: names derived from owners, label / annotation rules, association, the cap, the
//! delete grace period and the settings' errors. Pod objects are shaped as the Kubernetes API
//! reference's `Pod` (core/v1).

use super::cache::{Association, Cache, Rules, cronjob_of_job, deployment_of_replicaset, parse_image};
use super::config::K8sAttributesConfig;
use super::*;
use inferwatch_core::component::parse_config;
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
fn the_cap_counts_what_is_not_cached_and_deleted_pods_leave_after_the_grace() {
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

    c.delete(&pod("a", "ua", "10.0.0.1", "2025-01-01T00:00:00Z"), t0);
    // Within the grace period the deleted pod is still found, and still takes room.
    c.sweep(t0 + grace - Duration::from_secs(1));
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).as_deref(), Some("a"));
    c.upsert(&pod("c", "uc", "10.0.0.3", "2025-01-01T00:00:00Z"), t0 + Duration::from_secs(1));
    assert_eq!(not_cached.get(), 2);
    // After it, the pod is gone and a new one fits.
    c.sweep(t0 + grace);
    assert!(found_name(c.associate(&attrs(&[]), Some("10.0.0.1"))).is_none());
    c.upsert(&pod("c", "uc", "10.0.0.3", "2025-01-01T00:00:00Z"), t0 + grace);
    assert_eq!((c.len(), not_cached.get()), (2, 2));
    assert_eq!(found_name(c.associate(&attrs(&[]), Some("10.0.0.3"))).as_deref(), Some("c"));
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
    r.resource_spans[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| (kv.key.clone(), str_value(kv).unwrap()))
        .collect()
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
