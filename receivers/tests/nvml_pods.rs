//! Pod attribution of the `nvml` receiver through its real path: the agent's opener with
//! `source: fake` and scripted `fake_processes`, a fixture procfs (`proc_root`) whose cgroup files
//! put those pids in two pods (cgroup v2 / systemd driver / containerd and cgroup v1 / cgroupfs
//! driver), and a real tonic gRPC server of the kubelet's `v1.PodResourcesLister/List` on a unix
//! socket in a temp dir, answering in the real proto shape (pods, containers, devices
//! `nvidia.com/gpu` with GPU UUIDs as device ids).

use super::nvml::Capture;
use inferwatch_core::component::{ComponentId, CreateContext, Receiver, ReceiverConsumers};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_receivers::nvml::config::NvmlConfig;
use inferwatch_receivers::nvml::pod_resources::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use inferwatch_receivers::nvml::pod_resources::{LIST_PATH, list};
use inferwatch_receivers::nvml::{NvmlReceiver, nvml_opener};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{Metric, NumberDataPoint};
use serde_json::json;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);
/// The fake GPUs' UUIDs (config.rs `fake_source`).
const GPU0: &str = "GPU-00000000-0000-0000-0000-fa4e00000000";
const GPU1: &str = "GPU-00000000-0000-0000-0000-fa4e00000001";
const UID_A: &str = "3f1c2b9e-8d4a-4e4b-9a57-0c2d1e6f7a88";
const UID_B: &str = "7c0e8d2a-1b3f-4a5e-9d6c-2f4e6a8b0c1d";
const CID_A: &str = "9b2f6a0c1d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";
const CID_B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// ---- the fake kubelet: a tonic server of v1.PodResourcesLister on a unix socket ---------------

/// What `List` answers.
type Answer = Result<ListPodResourcesResponse, tonic::Status>;

#[derive(Clone)]
struct Kubelet {
    answer: Arc<Mutex<Answer>>,
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for Kubelet {
    const NAME: &'static str = "v1.PodResourcesLister";
}

struct ListSvc(Kubelet);

impl tonic::server::UnaryService<ListPodResourcesRequest> for ListSvc {
    type Response = ListPodResourcesResponse;
    type Future = std::future::Ready<Result<tonic::Response<ListPodResourcesResponse>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(self.0.answer.lock().unwrap().clone().map(tonic::Response::new))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Kubelet {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            if req.uri().path() != LIST_PATH {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let codec = tonic_prost::ProstCodec::<ListPodResourcesResponse, ListPodResourcesRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(ListSvc(me), req).await)
        })
    }
}

/// A running fake kubelet; stops when dropped.
struct KubeletServer {
    kubelet: Kubelet,
    stop: CancellationToken,
}

impl KubeletServer {
    fn start(socket: &Path, answer: Answer) -> Self {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let kubelet = Kubelet { answer: Arc::new(Mutex::new(answer)), calls: Arc::new(AtomicUsize::new(0)) };
        let stop = CancellationToken::new();
        let server = tonic::transport::Server::builder().add_service(kubelet.clone()).serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
        tokio::spawn(server);
        KubeletServer { kubelet, stop }
    }

    fn answer(&self, a: Answer) {
        *self.kubelet.answer.lock().unwrap() = a;
    }

    fn calls(&self) -> usize {
        self.kubelet.calls.load(Ordering::SeqCst)
    }
}

impl Drop for KubeletServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `(container, resource, device ids)`.
type Container<'a> = (&'a str, &'a str, &'a [&'a str]);

/// `(namespace, pod, containers)` in the proto's shape.
fn pods(list: &[(&str, &str, &[Container<'_>])]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: list
            .iter()
            .map(|(ns, pod, containers)| PodResources {
                name: (*pod).into(),
                namespace: (*ns).into(),
                containers: containers
                    .iter()
                    .map(|(c, resource, ids)| ContainerResources {
                        name: (*c).into(),
                        devices: if ids.is_empty() {
                            vec![]
                        } else {
                            vec![ContainerDevices {
                                resource_name: (*resource).into(),
                                device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                                topology: None,
                            }]
                        },
                        cpu_ids: vec![2, 3],
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The node of these tests: vllm-0 holds GPU 0, vllm-1 GPU 1 (by UUID), a pod without devices,
/// and a NIC of another device plugin.
fn node_pods() -> ListPodResourcesResponse {
    pods(&[
        ("llm", "vllm-0", &[("vllm", "nvidia.com/gpu", &[GPU0])]),
        ("llm", "vllm-1", &[("engine", "nvidia.com/gpu", &[GPU1]), ("sidecar", "", &[])]),
        ("kube-system", "coredns-7db6d8ff4d-abcde", &[("coredns", "", &[])]),
        ("net", "sriov", &[("c", "rdma/hca", &[GPU1])]),
    ])
}

// ---- the fixture procfs and the receiver ----------------------------------------------------

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("inferwatch-nvml-pods-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("proc")).unwrap();
        TempDir(d)
    }

    fn proc(&self) -> PathBuf {
        self.0.join("proc")
    }

    fn socket(&self) -> PathBuf {
        self.0.join("kubelet.sock")
    }

    /// `<proc>/<pid>/cgroup` and a `stat` with a start time.
    fn pid(&self, pid: u32, cgroup: &str) {
        let d = self.proc().join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} (python3 -m vllm) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0"),
        )
        .unwrap();
    }

    /// pid 1001 (GPU 0) in pod A's container (cgroup v2, systemd driver, containerd); pid 2001
    /// (GPU 1) in pod B's (cgroup v1, cgroupfs driver); pid 3001 (GPU 1) a host daemon; pid 1002
    /// (GPU 0) has exited (no entry).
    fn two_pods(&self) {
        let a = UID_A.replace('-', "_");
        self.pid(
            1001,
            &format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{a}.slice/cri-containerd-{CID_A}.scope\n"
            ),
        );
        self.pid(
            2001,
            &format!(
                "12:pids:/kubepods/besteffort/pod{UID_B}/{CID_B}\n4:memory:/kubepods/besteffort/pod{UID_B}/{CID_B}\n\
                 1:name=systemd:/kubepods/besteffort/pod{UID_B}/{CID_B}\n"
            ),
        );
        self.pid(3001, "0::/system.slice/nvidia-persistenced.service\n");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits on the request capture by the points of one request.
trait PointsWait {
    /// Waits for a request whose points satisfy `pred`; returns that request's points.
    async fn wait_for_points(&self, what: &str, pred: impl Fn(&[Pt]) -> bool) -> Vec<Pt>;
    fn last_points(&self) -> Option<Vec<Pt>>;
}

impl PointsWait for Capture {
    async fn wait_for_points(&self, what: &str, pred: impl Fn(&[Pt]) -> bool) -> Vec<Pt> {
        let mut seen = 0;
        let found = self.wait_for(what, |c| {
            let reqs = c.metrics();
            let new = reqs[seen..].iter().map(flatten).find(|pts| pred(pts));
            seen = reqs.len();
            new
        });
        match tokio::time::timeout(DEADLINE, found).await {
            Ok(p) if !p.is_empty() => p,
            _ => panic!("timed out waiting for {what}; last points: {:?}", self.last_points()),
        }
    }

    fn last_points(&self) -> Option<Vec<Pt>> {
        self.metrics().last().map(flatten)
    }
}

/// One point: its metric's name and its string / int attributes.
#[derive(Debug, Clone)]
struct Pt {
    metric: String,
    attrs: BTreeMap<String, String>,
}

impl Pt {
    fn get(&self, k: &str) -> Option<&str> {
        self.attrs.get(k).map(String::as_str)
    }
}

fn points(m: &Metric) -> &[NumberDataPoint] {
    match &m.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

fn flatten(r: &ExportMetricsServiceRequest) -> Vec<Pt> {
    let mut out = Vec::new();
    for rm in &r.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                for p in points(m) {
                    let attrs = p
                        .attributes
                        .iter()
                        .filter_map(|kv| {
                            let v = match kv.value.as_ref()?.value.as_ref()? {
                                AnyV::StringValue(s) => s.clone(),
                                AnyV::IntValue(i) => i.to_string(),
                                _ => return None,
                            };
                            Some((kv.key.clone(), v))
                        })
                        .collect();
                    out.push(Pt { metric: m.name.clone(), attrs });
                }
            }
        }
    }
    out
}

/// The one point of `metric` whose `key` is `value`.
fn point<'a>(pts: &'a [Pt], metric: &str, key: &str, value: &str) -> &'a Pt {
    let found: Vec<&Pt> = pts.iter().filter(|p| p.metric == metric && p.get(key) == Some(value)).collect();
    assert_eq!(found.len(), 1, "{metric}{{{key}={value}}}: {found:?}");
    found[0]
}

/// The agent's receiver (the real opener: `source: fake` with these processes).
async fn start(
    dir: &TempDir,
    naming: &str,
    socket: &Path,
    refresh: &str,
) -> (NvmlReceiver, Arc<Capture>, Arc<Telemetry>) {
    let cfg = NvmlConfig::from_value(&json!({
        "collection_interval": "50ms", "peak_window": "0", "naming": naming, "host_name": "gpu-node-7",
        "source": "fake", "fake_gpus": 2,
        "fake_processes": [
            {"gpu": 0, "pid": 1001, "used_bytes": 30u64 << 30}, {"gpu": 0, "pid": 1002, "used_bytes": 1u64 << 30},
            {"gpu": 1, "pid": 2001, "used_bytes": 20u64 << 30}, {"gpu": 1, "pid": 3001, "used_bytes": 1u64 << 20},
        ],
        "pod_attribution": {"proc_root": dir.proc(), "pod_resources_socket": socket, "refresh_interval": refresh,
            "timeout": "1s"},
    }))
    .unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("nvml").unwrap(), telemetry.clone());
    let mut r = NvmlReceiver::new(ctx, cfg, nvml_opener());
    let capture = Capture::new();
    r.start(ReceiverConsumers { metrics: Some(capture.clone()), ..Default::default() }).await.unwrap();
    (r, capture, telemetry)
}

// ---- tests --------------------------------------------------------------------------------

#[tokio::test]
async fn kubelet_and_cgroups_put_each_pod_on_its_gpu_and_its_processes() {
    let dir = TempDir::new("both");
    dir.two_pods();
    let kubelet = KubeletServer::start(&dir.socket(), Ok(node_pods()));
    let (mut r, capture, telemetry) = start(&dir, "otel", &dir.socket(), "1s").await;
    // The kubelet is listed before the first round: the first request already carries the pods.
    let pts = capture.wait_for_points("a first request", |p| !p.is_empty()).await;
    r.shutdown().await;
    assert!(kubelet.calls() >= 1);

    // GPU series: the assigned pod (pod-resources) and its UID (its processes' cgroups agree).
    for (uuid, pod, container, uid) in [(GPU0, "vllm-0", "vllm", UID_A), (GPU1, "vllm-1", "engine", UID_B)] {
        for metric in ["hw.gpu.memory.usage", "hw.gpu.utilization", "hw.power", "hw.temperature"] {
            let p = point(&pts, metric, "gpu.uuid", uuid);
            assert_eq!(p.get("k8s.pod.name"), Some(pod), "{metric} {uuid}: {p:?}");
            assert_eq!(p.get("k8s.namespace.name"), Some("llm"));
            assert_eq!(p.get("k8s.container.name"), Some(container));
            assert_eq!(p.get("k8s.pod.uid"), Some(uid));
            assert_eq!(p.get("container.id"), None, "a GPU has no container id");
        }
    }
    // Per-process series: each process's own pod and container (cgroup), named through its GPU.
    let m = "process.gpu.memory.usage";
    let a = point(&pts, m, "process.pid", "1001");
    assert_eq!(
        (a.get("k8s.pod.name"), a.get("k8s.namespace.name"), a.get("k8s.container.name")),
        (Some("vllm-0"), Some("llm"), Some("vllm"))
    );
    assert_eq!((a.get("k8s.pod.uid"), a.get("container.id")), (Some(UID_A), Some(CID_A)));
    assert_eq!(a.get("gpu.uuid"), Some(GPU0));
    let b = point(&pts, m, "process.pid", "2001");
    assert_eq!((b.get("k8s.pod.name"), b.get("k8s.container.name")), (Some("vllm-1"), Some("engine")));
    assert_eq!((b.get("k8s.pod.uid"), b.get("container.id")), (Some(UID_B), Some(CID_B)));
    // The host daemon and the exited process keep their series, with no pod (not the GPU's).
    for pid in ["3001", "1002"] {
        let p = point(&pts, m, "process.pid", pid);
        assert!(p.attrs.keys().all(|k| !k.starts_with("k8s.") && k != "container.id"), "pid {pid}: {p:?}");
    }
    let text = telemetry.render();
    assert!(text.contains(r#"inferwatch_nvml_pod_resources_refreshes_total{receiver="nvml"} "#), "{text}");
    assert!(!text.contains("inferwatch_nvml_pod_resources_errors_total"), "{text}");
    assert!(text.contains(r#"inferwatch_nvml_pid_cache_events_total{receiver="nvml",event="unreadable"} "#), "{text}");
}

#[tokio::test]
async fn dcgm_naming_uses_dcgm_exporters_labels() {
    let dir = TempDir::new("dcgm");
    dir.two_pods();
    let _kubelet = KubeletServer::start(&dir.socket(), Ok(node_pods()));
    let (mut r, capture, _) = start(&dir, "dcgm", &dir.socket(), "1s").await;
    let pts = capture.wait_for_points("a first request", |p| !p.is_empty()).await;
    r.shutdown().await;
    let g = point(&pts, "DCGM_FI_DEV_FB_USED", "UUID", GPU0);
    assert_eq!((g.get("pod"), g.get("namespace"), g.get("container")), (Some("vllm-0"), Some("llm"), Some("vllm")));
    assert_eq!(g.get("pod_uid"), Some(UID_A));
    assert!(g.get("k8s.pod.name").is_none());
    let p = point(&pts, "inferwatch_gpu_process_fb_used", "pid", "2001");
    assert_eq!(
        (p.get("pod"), p.get("container"), p.get("container_id")),
        (Some("vllm-1"), Some("engine"), Some(CID_B))
    );
}

/// The `missing_socket` error count on `t`'s self-metrics.
fn missing_socket_errors(t: &Telemetry) -> Option<u64> {
    let key = r#"inferwatch_nvml_pod_resources_errors_total{receiver="nvml",reason="missing_socket"} "#;
    let text = t.render();
    text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn without_the_socket_cgroups_alone_attribute_and_list_is_not_called_per_sample() {
    let dir = TempDir::new("nosock");
    dir.two_pods();
    let (mut r, capture, telemetry) = start(&dir, "otel", &dir.socket(), "1h").await;
    let pts = capture.wait_for_points("a first request", |p| !p.is_empty()).await;
    // cgroups only: UIDs and container ids, no names.
    let g = point(&pts, "hw.gpu.memory.usage", "gpu.uuid", GPU0);
    assert_eq!((g.get("k8s.pod.uid"), g.get("k8s.pod.name")), (Some(UID_A), None));
    let p = point(&pts, "process.gpu.memory.usage", "process.pid", "2001");
    assert_eq!((p.get("k8s.pod.uid"), p.get("container.id"), p.get("k8s.pod.name")), (Some(UID_B), Some(CID_B), None));
    // 20 rounds later the socket was still tried once (at start), not once per sample.
    tokio::time::timeout(DEADLINE, capture.wait_metrics("20 requests", |r| r.len() >= 20)).await.unwrap();
    assert_eq!(missing_socket_errors(&telemetry), Some(1), "{}", telemetry.render());
    r.shutdown().await;
}

#[tokio::test]
async fn a_kubelet_that_comes_up_late_or_moves_a_gpu_is_followed() {
    let dir = TempDir::new("late");
    dir.two_pods();
    let (mut r, capture, telemetry) = start(&dir, "otel", &dir.socket(), "1s").await;
    capture.wait_for_points("a first request", |p| !p.is_empty()).await;
    assert!(missing_socket_errors(&telemetry).is_some_and(|n| n >= 1), "{}", telemetry.render());

    // The kubelet comes up (socket mounted late, kubelet restarted): the names follow.
    let kubelet = KubeletServer::start(&dir.socket(), Ok(node_pods()));
    let pts = capture
        .wait_for_points("GPU 0 named after its pod", |p| {
            p.iter().any(|x| x.metric == "hw.gpu.memory.usage" && x.get("k8s.pod.name") == Some("vllm-0"))
        })
        .await;
    let p = point(&pts, "process.gpu.memory.usage", "process.pid", "1001");
    assert_eq!((p.get("k8s.pod.name"), p.get("k8s.pod.uid")), (Some("vllm-0"), Some(UID_A)));

    // The kubelet moves GPU 1 to another pod (vllm-1 deleted, vllm-2 scheduled): followed.
    kubelet.answer(Ok(pods(&[
        ("llm", "vllm-0", &[("vllm", "nvidia.com/gpu", &[GPU0])]),
        ("llm", "vllm-2", &[("vllm", "nvidia.com/gpu", &[GPU1])]),
    ])));
    let pts = capture
        .wait_for_points("GPU 1 named after vllm-2", |p| {
            p.iter().any(|x| x.metric == "hw.gpu.memory.usage" && x.get("k8s.pod.name") == Some("vllm-2"))
        })
        .await;
    let p = point(&pts, "process.gpu.memory.usage", "process.pid", "2001");
    assert_eq!(p.get("k8s.pod.name"), Some("vllm-2"));
    r.shutdown().await;
}

#[tokio::test]
async fn list_reports_each_failure_by_reason() {
    let dir = TempDir::new("list");
    let t = Duration::from_secs(2);
    assert_eq!(list(&dir.socket(), t).await.unwrap_err().reason(), "missing_socket");
    // A file that is not a listening socket.
    std::fs::write(dir.socket(), b"").unwrap();
    assert_eq!(list(&dir.socket(), t).await.unwrap_err().reason(), "connect");
    std::fs::remove_file(dir.socket()).unwrap();
    // The kubelet answers with an error status.
    let kubelet = KubeletServer::start(&dir.socket(), Err(tonic::Status::unavailable("kubelet is starting")));
    let e = list(&dir.socket(), t).await.unwrap_err();
    assert_eq!(e.reason(), "rpc", "{e}");
    assert!(e.to_string().contains("kubelet is starting"), "{e}");
    // And then in the real shape.
    kubelet.answer(Ok(node_pods()));
    let resp = list(&dir.socket(), t).await.unwrap();
    assert_eq!(resp, node_pods());
    assert_eq!(kubelet.calls(), 2);
}
