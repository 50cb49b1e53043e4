//! Service discovery of the `prometheus` receiver. The Kubernetes API cannot run on this
//! machine: discovery is tested against recorded API responses of the real shape (`PodList`,
//! `EndpointsList`, `ServiceList` and watch streams of newline-delimited events, in
//! `fixtures/k8s_*`, shaped after the Kubernetes API reference; `__PORT__` is replaced by the
//! test server's port) served by a
//! local axum server, through the same reqwest client and list + watch code the agent uses in a
//! cluster. File and HTTP discovery, target_limit, the loop count as targets come and go, and
//! config errors are tested here too.

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::prometheus::PrometheusReceiver;
use inferwatch_receivers::prometheus::config::PrometheusConfig;
use inferwatch_testkit::harness::Sink;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const VLLM: &str = include_str!("fixtures/vllm_v1.prom");
const POD_LIST: &str = include_str!("fixtures/k8s_pod_list.json");
const POD_WATCH: &str = include_str!("fixtures/k8s_pod_watch.jsonl");
const WATCH_GONE: &str = include_str!("fixtures/k8s_watch_gone.jsonl");
const ENDPOINTS_LIST: &str = include_str!("fixtures/k8s_endpoints_list.json");
const ENDPOINTS_WATCH: &str = include_str!("fixtures/k8s_endpoints_watch.jsonl");
const SERVICE_LIST: &str = include_str!("fixtures/k8s_service_list.json");
const SERVICE_WATCH: &str = include_str!("fixtures/k8s_service_watch.jsonl");
const DEADLINE: Duration = Duration::from_secs(10);

/// What the scrapes forwarded, read from the request capture.
trait Seen {
    fn points(&self) -> Vec<(String, HashMap<String, String>)>;
    fn gauges_of(&self, instance: &str) -> Vec<(String, HashMap<String, String>, f64)>;
    fn resources(&self) -> Vec<HashMap<String, String>>;
}

impl Seen for Sink {
    /// (metric name, point attributes) of every point of every request so far.
    fn points(&self) -> Vec<(String, HashMap<String, String>)> {
        let mut out = Vec::new();
        for r in self.metrics().iter() {
            for m in r.resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).flat_map(|sm| &sm.metrics) {
                use opentelemetry_proto::tonic::metrics::v1::metric::Data;
                let attrs: Vec<_> = match &m.data {
                    Some(Data::Gauge(g)) => g.data_points.iter().map(|p| p.attributes.clone()).collect(),
                    Some(Data::Sum(s)) => s.data_points.iter().map(|p| p.attributes.clone()).collect(),
                    Some(Data::Histogram(h)) => h.data_points.iter().map(|p| p.attributes.clone()).collect(),
                    _ => vec![],
                };
                for a in attrs {
                    let map = a
                        .iter()
                        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                            AnyV::StringValue(s) => Some((kv.key.clone(), s.clone())),
                            _ => None,
                        })
                        .collect();
                    out.push((m.name.clone(), map));
                }
            }
        }
        out
    }

    /// (metric name, point attributes, numeric value) of every gauge point scraped from `instance`.
    fn gauges_of(&self, instance: &str) -> Vec<(String, HashMap<String, String>, f64)> {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumV;
        let mut out = Vec::new();
        for rm in self.metrics().iter().flat_map(|r| &r.resource_metrics) {
            let res = rm.resource.iter().flat_map(|r| &r.attributes);
            let of = |key: &str| {
                res.clone().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyV::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
            };
            if of("service.instance.id").as_deref() != Some(instance) {
                continue;
            }
            for m in rm.scope_metrics.iter().flat_map(|sm| &sm.metrics) {
                let Some(Data::Gauge(g)) = &m.data else { continue };
                for p in &g.data_points {
                    let attrs = p
                        .attributes
                        .iter()
                        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                            AnyV::StringValue(s) => Some((kv.key.clone(), s.clone())),
                            _ => None,
                        })
                        .chain(of("service.name").map(|j| ("service.name".to_string(), j)))
                        .collect();
                    let v = match p.value {
                        Some(NumV::AsDouble(d)) => d,
                        Some(NumV::AsInt(i)) => i as f64,
                        None => f64::NAN,
                    };
                    out.push((m.name.clone(), attrs, v));
                }
            }
        }
        out
    }

    fn resources(&self) -> Vec<HashMap<String, String>> {
        self.metrics()
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .map(|rm| {
                rm.resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        AnyV::StringValue(s) => Some((kv.key.clone(), s.clone())),
                        _ => None,
                    })
                    .collect()
            })
            .collect()
    }
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn start(cfg: serde_json::Value) -> (PrometheusReceiver, Arc<Sink>, Arc<Telemetry>) {
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("prometheus").unwrap(), telemetry.clone());
    let mut r = PrometheusReceiver::new(ctx, PrometheusConfig::from_value(&cfg).unwrap()).unwrap();
    let cap = Sink::new();
    r.start(ReceiverConsumers { metrics: Some(cap.clone()), ..Default::default() }).await.unwrap();
    (r, cap, telemetry)
}

/// The fake API server and vLLM: what it saw and what it streams.
struct Fake {
    port: u16,
    metrics_hits: AtomicUsize,
    lists: AtomicUsize,
    watches: AtomicUsize,
    queries: Mutex<Vec<HashMap<String, String>>>,
    /// The watch stream of the second watch (the first answers 410 Gone as an ERROR event).
    watch_rx: Mutex<Option<mpsc::Receiver<Result<String, std::io::Error>>>>,
    sd_body: Mutex<String>,
}

async fn metrics(State(f): State<Arc<Fake>>) -> impl IntoResponse {
    f.metrics_hits.fetch_add(1, Ordering::SeqCst);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], VLLM)
}

async fn pods(State(f): State<Arc<Fake>>, Query(q): Query<HashMap<String, String>>) -> Response {
    f.queries.lock().unwrap().push(q.clone());
    let port = f.port.to_string();
    if q.get("watch").map(String::as_str) != Some("1") {
        f.lists.fetch_add(1, Ordering::SeqCst);
        return ([(header::CONTENT_TYPE, "application/json")], POD_LIST.replace("__PORT__", &port)).into_response();
    }
    if f.watches.fetch_add(1, Ordering::SeqCst) == 0 {
        return ([(header::CONTENT_TYPE, "application/json")], WATCH_GONE.to_string()).into_response();
    }
    match f.watch_rx.lock().unwrap().take() {
        Some(rx) => {
            let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        // Later watches: hang until the client goes away.
        None => Body::from_stream(futures::stream::pending::<Result<String, std::io::Error>>()).into_response(),
    }
}

async fn sd(State(f): State<Arc<Fake>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], f.sd_body.lock().unwrap().clone())
}

async fn fake() -> (Arc<Fake>, mpsc::Sender<Result<String, std::io::Error>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (tx, rx) = mpsc::channel(16);
    let f = Arc::new(Fake {
        port: listener.local_addr().unwrap().port(),
        metrics_hits: AtomicUsize::new(0),
        lists: AtomicUsize::new(0),
        watches: AtomicUsize::new(0),
        queries: Mutex::new(Vec::new()),
        watch_rx: Mutex::new(Some(rx)),
        sd_body: Mutex::new("[]".into()),
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/namespaces/ml/pods", get(pods))
        .route("/sd", get(sd))
        .with_state(f.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, tx)
}

#[tokio::test]
async fn a_vllm_pod_is_discovered_relabeled_scraped_and_forgotten_when_deleted() {
    let (f, tx) = fake().await;
    let cfg = json!({"config": {"scrape_configs": [{
        "job_name": "vllm-pods", "scrape_interval": "100ms", "scrape_timeout": "100ms",
        "kubernetes_sd_configs": [{"role": "pod", "api_server": format!("http://127.0.0.1:{}", f.port),
            "namespaces": {"names": ["ml"]}, "selectors": [{"role": "pod", "label": "app=vllm"}]}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "action": "keep", "regex": "http"},
            {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
             "regex": "([^:]+)(?::\\d+)?;(\\d+)", "replacement": "$1:$2", "target_label": "__address__"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_controller_kind", "__meta_kubernetes_pod_ready",
                               "__meta_kubernetes_pod_node_name", "__meta_kubernetes_pod_container_name"],
             "separator": "/", "target_label": "k8s"}
        ],
        "metric_relabel_configs": [
            {"source_labels": ["__name__"], "regex": "vllm:cache_config_info", "action": "drop"}
        ]
    }]}});
    let (mut r, cap, _) = start(cfg).await;
    // 410 Gone on the first watch: listed again.
    until("a relist after 410 Gone", || f.lists.load(Ordering::SeqCst) >= 2).await;
    until("the vLLM pod's metrics", || cap.points().iter().any(|(n, _)| n == "vllm:num_requests_running")).await;
    assert_eq!(
        r.active_loops(),
        1,
        "one target: the vllm container's http port (redis has no scrape annotation, the log shipper no port)"
    );
    let points = cap.points();
    let (_, attrs) = points.iter().find(|(n, _)| n == "vllm:num_requests_running").unwrap();
    assert_eq!(attrs.get("pod").map(String::as_str), Some("vllm-7d9f8b6c5-x2x7k"));
    assert_eq!(attrs.get("namespace").map(String::as_str), Some("ml"));
    assert_eq!(attrs.get("k8s").map(String::as_str), Some("ReplicaSet/true/gpu-node-1/vllm"));
    assert!(!attrs.keys().any(|k| k.starts_with("__")), "__ labels are removed: {attrs:?}");
    assert!(!points.iter().any(|(n, _)| n == "vllm:cache_config_info"), "metric_relabel_configs dropped it");
    let res = &cap.resources()[0];
    assert_eq!(res.get("service.name").map(String::as_str), Some("vllm-pods"));
    assert_eq!(res.get("service.instance.id"), Some(&format!("127.0.0.1:{}", f.port)));
    {
        let qs = f.queries.lock().unwrap();
        assert!(qs.iter().all(|q| q.get("labelSelector").map(String::as_str) == Some("app=vllm")), "{qs:?}");
        let w = qs.iter().rfind(|q| q.contains_key("watch")).unwrap();
        assert_eq!(w.get("resourceVersion").map(String::as_str), Some("1000"));
        assert_eq!(w.get("allowWatchBookmarks").map(String::as_str), Some("true"));
    }

    // The recorded watch stream: MODIFIED (same target: same loop), BOOKMARK, DELETED.
    let mut lines =
        POD_WATCH.replace("__PORT__", &f.port.to_string()).lines().map(|l| format!("{l}\n")).collect::<Vec<_>>();
    let deleted = lines.pop().unwrap();
    for l in lines {
        tx.send(Ok(l)).await.unwrap();
    }
    let hits = f.metrics_hits.load(Ordering::SeqCst);
    until("scrapes go on after MODIFIED", || f.metrics_hits.load(Ordering::SeqCst) > hits + 1).await;
    assert_eq!(r.active_loops(), 1);
    tx.send(Ok(deleted)).await.unwrap();
    until("the loop stops after DELETED", || r.active_loops() == 0).await;
    assert_eq!(r.active_targets(), 0);
    let hits = f.metrics_hits.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await; // three intervals: no scrape may come
    assert_eq!(f.metrics_hits.load(Ordering::SeqCst), hits, "a deleted pod is no longer scraped");
    r.shutdown().await;
}

/// A fake API server for role endpoints (endpoints, pods and services of namespace `ml`) and
/// a vLLM-like `/metrics`.
struct Api {
    port: u16,
    /// (resource, query) of every request.
    requests: Mutex<Vec<(&'static str, HashMap<String, String>)>>,
    /// The stream of the first watch of each resource (later ones hang).
    streams: Mutex<HashMap<&'static str, mpsc::Receiver<Result<String, std::io::Error>>>>,
}

async fn api(resource: &'static str, f: Arc<Api>, q: HashMap<String, String>) -> Response {
    f.requests.lock().unwrap().push((resource, q.clone()));
    let json = [(header::CONTENT_TYPE, "application/json")];
    if q.get("watch").map(String::as_str) != Some("1") {
        let list = match resource {
            "endpoints" => ENDPOINTS_LIST,
            "services" => SERVICE_LIST,
            _ => POD_LIST,
        };
        return (json, list.replace("__PORT__", &f.port.to_string())).into_response();
    }
    match f.streams.lock().unwrap().remove(resource) {
        Some(rx) => (json, Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))).into_response(),
        None => Body::from_stream(futures::stream::pending::<Result<String, std::io::Error>>()).into_response(),
    }
}

type Feed = mpsc::Sender<Result<String, std::io::Error>>;

/// The fake API server, and the feeds of its endpoints and services watch streams.
async fn api_server() -> (Arc<Api>, Feed, Feed) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (etx, erx) = mpsc::channel(16);
    let (stx, srx) = mpsc::channel(16);
    let f = Arc::new(Api {
        port: listener.local_addr().unwrap().port(),
        requests: Mutex::new(Vec::new()),
        streams: Mutex::new(HashMap::from([("endpoints", erx), ("services", srx)])),
    });
    let route =
        |r: &'static str| get(move |State(f): State<Arc<Api>>, Query(q): Query<HashMap<String, String>>| api(r, f, q));
    let app = Router::new()
        .route("/metrics", get(|| async { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], VLLM) }))
        .route("/api/v1/namespaces/ml/endpoints", route("endpoints"))
        .route("/api/v1/namespaces/ml/pods", route("pods"))
        .route("/api/v1/namespaces/ml/services", route("services"))
        .with_state(f.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, etx, stx)
}

fn lines_of(stream: &str, port: u16) -> Vec<String> {
    stream.replace("__PORT__", &port.to_string()).lines().map(|l| format!("{l}\n")).collect()
}

#[tokio::test]
async fn endpoints_are_selected_by_their_service_labels_and_carry_pod_labels() {
    let (f, endpoints_tx, services_tx) = api_server().await;
    let cfg = json!({"config": {"scrape_configs": [{
        "job_name": "vllm-endpoints", "scrape_interval": "100ms", "scrape_timeout": "100ms",
        "kubernetes_sd_configs": [{"role": "endpoints", "api_server": format!("http://127.0.0.1:{}", f.port),
            "namespaces": {"names": ["ml"]},
            "selectors": [{"role": "endpoints", "label": "app"}, {"role": "service", "field": "metadata.name!=kubernetes"}]}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_service_label_app"], "action": "keep", "regex": "vllm"},
            {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "action": "keep", "regex": "http"},
            {"source_labels": ["__meta_kubernetes_endpoint_ready"], "action": "keep", "regex": "true"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name", "__meta_kubernetes_pod_container_port_name",
                               "__meta_kubernetes_endpoint_node_name", "__meta_kubernetes_pod_node_name",
                               "__meta_kubernetes_pod_ip", "__meta_kubernetes_service_annotation_prometheus_io_scrape",
                               "__meta_kubernetes_service_labelpresent_tier"],
             "separator": "/", "target_label": "k8s"}
        ]
    }]}});
    let (mut r, cap, _) = start(cfg).await;
    let here = format!("127.0.0.1:{}", f.port);
    until("the vLLM endpoint's metrics", || {
        cap.gauges_of(&here).iter().any(|(n, _, _)| n == "vllm:num_requests_running")
    })
    .await;
    // vllm-external has app=vllm on the Endpoints object but no Service: not selected; redis
    // and the grpc port are dropped; the not-ready replica is dropped.
    assert_eq!(r.active_loops(), 1);
    let points = cap.gauges_of(&here);
    let (_, attrs, _) = points.iter().find(|(n, _, _)| n == "vllm:num_requests_running").unwrap();
    let want = |k: &str, v: &str| assert_eq!(attrs.get(k).map(String::as_str), Some(v), "{k}: {attrs:?}");
    want("service.name", "vllm-endpoints");
    want("namespace", "ml");
    want("service", "vllm");
    want("pod", "vllm-7d9f8b6c5-x2x7k");
    want("k8s", "vllm/http/gpu-node-1/gpu-node-1/127.0.0.1/true/true");
    // The health series carry the same target labels.
    let (_, up, v) = points.iter().find(|(n, _, _)| n == "up").unwrap();
    assert_eq!(*v, 1.0);
    let target: HashMap<String, String> = ["service.name", "namespace", "service", "pod", "k8s"]
        .iter()
        .map(|k| (k.to_string(), attrs[*k].clone()))
        .collect();
    assert_eq!(up, &target, "up has the target's labels, and only those");
    {
        let reqs = f.requests.lock().unwrap();
        for (res, want) in [
            ("endpoints", Some(("labelSelector", "app"))),
            ("services", Some(("fieldSelector", "metadata.name!=kubernetes"))),
            ("pods", None),
        ] {
            let of: Vec<_> = reqs.iter().filter(|(r, _)| *r == res).map(|(_, q)| q).collect();
            assert!(!of.is_empty(), "{res} is listed");
            for q in of {
                let sel = q.iter().find(|(k, _)| k.ends_with("Selector")).map(|(k, v)| (k.as_str(), v.as_str()));
                assert_eq!(sel, want, "{res}: {q:?}");
            }
        }
    }

    // The not-ready replica becomes ready; nothing listens at its address: up = 0, with its labels.
    for l in lines_of(ENDPOINTS_WATCH, f.port) {
        endpoints_tx.send(Ok(l)).await.unwrap();
    }
    until("two loops", || r.active_loops() == 2).await;
    let there = format!("127.0.0.2:{}", f.port);
    until("a failed scrape of the second replica", || cap.gauges_of(&there).iter().any(|(n, _, _)| n == "up")).await;
    let points = cap.gauges_of(&there);
    let (_, attrs, v) = points.iter().find(|(n, _, _)| n == "up").unwrap();
    assert_eq!(*v, 0.0);
    assert_eq!(attrs.get("service").map(String::as_str), Some("vllm"), "{attrs:?}");
    assert_eq!(attrs.get("service.name").map(String::as_str), Some("vllm-endpoints"));
    assert!(!attrs.contains_key("pod"), "the pod is not in the pod list: no pod labels: {attrs:?}");

    // The Service is relabelled: its endpoints no longer match.
    for l in lines_of(SERVICE_WATCH, f.port) {
        services_tx.send(Ok(l)).await.unwrap();
    }
    until("no loop once the Service is relabelled", || r.active_loops() == 0).await;
    r.shutdown().await;
}

fn write(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn group(port: u16, n: usize) -> serde_json::Value {
    json!(
        (0..n)
            .map(|i| json!({"targets": [format!("127.0.0.1:{port}")], "labels": {"shard": i.to_string()}}))
            .collect::<Vec<_>>()
    )
}

#[tokio::test]
async fn file_sd_targets_come_and_go_and_the_loop_count_returns() {
    let (f, _tx) = fake().await;
    let dir = std::env::temp_dir().join(format!("iw-file-sd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_file = dir.join("tg_a.json");
    write(&json_file, &group(f.port, 40).to_string());
    let cfg = json!({"config": {"scrape_configs": [{
        "job_name": "files", "scrape_interval": "1s",
        "file_sd_configs": [{"files": [dir.join("tg_*.json").to_string_lossy(), dir.join("tg_*.yaml").to_string_lossy()],
                             "refresh_interval": "50ms"}],
        "relabel_configs": [{"source_labels": ["__meta_filepath"], "regex": ".*/(tg_[a-z]+)\\..*", "target_label": "sd_file"}]
    }]}});
    let (mut r, cap, _) = start(cfg).await;
    until("40 loops", || r.active_loops() == 40).await;
    until("a scrape", || !cap.points().is_empty()).await;
    let points = cap.points();
    let bad: Vec<_> = points
        .iter()
        .filter(|(n, _)| n.starts_with("vllm:"))
        .filter(|(_, a)| a.get("sd_file").map(String::as_str) != Some("tg_a"))
        .take(3)
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    // A YAML file is added by the glob.
    write(&dir.join("tg_b.yaml"), &format!("- targets: ['127.0.0.1:{}']\n  labels: {{shard: yaml}}\n", f.port));
    until("41 loops", || r.active_loops() == 41).await;
    // The JSON file shrinks, then everything goes.
    write(&json_file, &group(f.port, 3).to_string());
    until("4 loops", || r.active_loops() == 4).await;
    std::fs::remove_file(&json_file).unwrap();
    std::fs::remove_file(dir.join("tg_b.yaml")).unwrap();
    until("no loop", || r.active_loops() == 0).await;
    // Loops come back when targets do.
    write(&json_file, &group(f.port, 2).to_string());
    until("2 loops", || r.active_loops() == 2).await;
    r.shutdown().await;
    assert_eq!(r.active_loops(), 0, "shutdown stops every loop");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn http_sd_and_target_limit() {
    let (f, _tx) = fake().await;
    *f.sd_body.lock().unwrap() = group(f.port, 2).to_string();
    let cfg = json!({"config": {"scrape_configs": [{
        "job_name": "http", "scrape_interval": "1s", "target_limit": 2,
        "http_sd_configs": [{"url": format!("http://127.0.0.1:{}/sd", f.port), "refresh_interval": "50ms"}],
        "relabel_configs": [{"source_labels": ["__meta_url"], "target_label": "sd_url"}]
    }]}});
    let (mut r, cap, telemetry) = start(cfg).await;
    until("2 loops", || r.active_loops() == 2).await;
    until("a scrape", || !cap.points().is_empty()).await;
    assert_eq!(cap.points()[0].1.get("sd_url"), Some(&format!("http://127.0.0.1:{}/sd", f.port)));
    *f.sd_body.lock().unwrap() = group(f.port, 3).to_string();
    until("target_limit stops the job's loops", || r.active_loops() == 0).await;
    assert!(telemetry.render().contains("reason=\"target_limit\""), "target_limit is counted");
    *f.sd_body.lock().unwrap() = group(f.port, 1).to_string();
    until("1 loop", || r.active_loops() == 1).await;
    r.shutdown().await;
}

#[test]
fn discovery_errors_name_the_field() {
    let err = |job: serde_json::Value| {
        let mut j = json!({"job_name": "j"});
        for (k, v) in job.as_object().unwrap() {
            j[k] = v.clone();
        }
        PrometheusConfig::from_value(&json!({"config": {"scrape_configs": [j]}})).unwrap_err()
    };
    let path = |e: inferwatch_core::component::FieldError| e.dotted();
    let e = err(json!({"kubernetes_sd_configs": [{"role": "node"}]}));
    assert!(e.message.contains("node"), "{e:?}");
    assert_eq!(path(e), "config.scrape_configs.0.kubernetes_sd_configs.0.role");
    let e = err(json!({"kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": "~/.kube/config"}]}));
    assert_eq!(path(e), "config.scrape_configs.0.kubernetes_sd_configs.0.kubeconfig_file");
    let e = err(
        json!({"static_configs": [{"targets": ["a:1"]}], "relabel_configs": [{"target_label": "b"}, {"regex": "(", "target_label": "x"}]}),
    );
    assert_eq!(path(e), "config.scrape_configs.0.relabel_configs.1.regex");
    let e = err(json!({"static_configs": [{"targets": ["a:1"]}], "metric_relabel_configs": [{"action": "nope"}]}));
    assert_eq!(path(e), "config.scrape_configs.0.metric_relabel_configs.0.action");
    let e = err(json!({"http_sd_configs": [{"refresh_interval": "1m"}]}));
    assert_eq!(path(e), "config.scrape_configs.0.http_sd_configs.0.url");
    let e = err(json!({"http_sd_configs": [{"url": "ftp://x/"}]}));
    assert_eq!(path(e), "config.scrape_configs.0.http_sd_configs.0.url");
    let e = err(json!({"file_sd_configs": [{"files": ["a.json", "b.txt"]}]}));
    assert_eq!(path(e), "config.scrape_configs.0.file_sd_configs.0.files.1");
    let e = err(json!({"kubernetes_sd_configs": [{"role": "pod", "selectors": [{"role": "node", "label": "a=b"}]}]}));
    assert_eq!(path(e), "config.scrape_configs.0.kubernetes_sd_configs.0.selectors.0.role");
    let e = err(json!({"kubernetes_sd_configs": [{"role": "pod", "api_server": "https://k:6443",
        "authorization": {"credentials": "a", "credentials_file": "b"}}]}));
    assert_eq!(path(e), "config.scrape_configs.0.kubernetes_sd_configs.0.authorization.credentials");
    let e = err(json!({}));
    assert_eq!(path(e), "config.scrape_configs.0.static_configs");
    // A job with discovery only is accepted.
    PrometheusConfig::from_value(&json!({"config": {"scrape_configs": [{"job_name": "k",
        "kubernetes_sd_configs": [{"role": "endpoints"}]}]}}))
    .unwrap();
}

#[tokio::test]
async fn in_cluster_without_the_environment_is_refused_at_start() {
    if std::env::var("KUBERNETES_SERVICE_HOST").is_ok() {
        return;
    }
    let cfg = json!({"config": {"scrape_configs": [{"job_name": "k", "kubernetes_sd_configs": [{"role": "pod"}]}]}});
    let ctx = CreateContext::new(ComponentId::parse("prometheus").unwrap(), Arc::new(Telemetry::new()));
    let mut r = PrometheusReceiver::new(ctx, PrometheusConfig::from_value(&cfg).unwrap()).unwrap();
    let cap = Sink::new();
    let e = r.start(ReceiverConsumers { metrics: Some(cap), ..Default::default() }).await.unwrap_err();
    assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
}
