//! The kubelet's pod-resources API (`v1.PodResourcesLister/List` over the unix socket
//! `/var/lib/kubelet/pod-resources/kubelet.sock`), as dcgm-exporter reads it: which pod and
//! container each GPU is assigned to. The messages are hand-written prost structs of the vendored
//! `proto/kubelet/podresources/v1/api.proto` (checked against it by a test below); the client is
//! tonic's generic unary call, as tonic-build would generate it.
//!
//! [`PodResourcesWatcher`] lists every `refresh_interval` (each call bounded by `timeout`) and
//! keeps the last answer for readers. A missing socket is logged once as a warning (attribution
//! then comes from cgroups alone); failures are counted by reason in
//! `inferwatch_nvml_pod_resources_errors{receiver, reason}`.

use super::source::DeviceInfo;
use inferwatch_core::telemetry::Telemetry;
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The messages of `proto/kubelet/podresources/v1/api.proto` (package `v1`).
pub mod proto {
    /// `ListPodResourcesRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ListPodResourcesRequest {}

    /// `ListPodResourcesResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ListPodResourcesResponse {
        /// `repeated PodResources pod_resources = 1`.
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `PodResources`: one pod's assigned resources.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct PodResources {
        /// `string name = 1`.
        #[prost(string, tag = "1")]
        pub name: String,
        /// `string namespace = 2`.
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// `repeated ContainerResources containers = 3`.
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources`: one container's assigned resources.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerResources {
        /// `string name = 1`.
        #[prost(string, tag = "1")]
        pub name: String,
        /// `repeated ContainerDevices devices = 2`.
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        /// `repeated int64 cpu_ids = 3`.
        #[prost(int64, repeated, tag = "3")]
        pub cpu_ids: Vec<i64>,
    }

    /// `ContainerDevices`: devices of one resource assigned to a container.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerDevices {
        /// `string resource_name = 1`, e.g. `nvidia.com/gpu`.
        #[prost(string, tag = "1")]
        pub resource_name: String,
        /// `repeated string device_ids = 2`: what the device plugin reported (GPU UUIDs by default).
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
        /// `TopologyInfo topology = 3`.
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }

    /// `TopologyInfo`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct TopologyInfo {
        /// `repeated NUMANode nodes = 1`.
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }

    /// `NUMANode`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct NumaNode {
        /// `int64 ID = 1`.
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
}

use proto::{ListPodResourcesRequest, ListPodResourcesResponse};

/// The gRPC path of `List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// The kubelet's socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Largest `List` answer accepted (a node with hundreds of pods stays far below).
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Why `List` gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodResourcesError {
    /// No socket at the path (not mounted, or not a Kubernetes node).
    #[error("no pod-resources socket at {0}")]
    Missing(String),
    /// The socket (or its directory) is not accessible to this process.
    #[error("no permission to use {0} (the kubelet's pod-resources directory is root-only on most nodes)")]
    Permission(String),
    /// Connecting failed.
    #[error("cannot connect to {path}: {message}")]
    Connect {
        /// The socket.
        path: String,
        /// The error.
        message: String,
    },
    /// No answer within the timeout.
    #[error("no answer from the kubelet within {0:?}")]
    Timeout(Duration),
    /// The call failed.
    #[error("List failed: {0}")]
    Rpc(String),
}

impl PodResourcesError {
    /// The `reason` label: `missing_socket`, `permission`, `connect`, `timeout`, `rpc`.
    pub fn reason(&self) -> &'static str {
        match self {
            PodResourcesError::Missing(_) => "missing_socket",
            PodResourcesError::Permission(_) => "permission",
            PodResourcesError::Connect { .. } => "connect",
            PodResourcesError::Timeout(_) => "timeout",
            PodResourcesError::Rpc(_) => "rpc",
        }
    }
}

/// Calls `List` on the socket at `socket`, the whole call bounded by `timeout`.
pub async fn list(socket: &Path, timeout: Duration) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let shown = socket.display().to_string();
    match std::fs::metadata(socket) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(PodResourcesError::Missing(shown)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(PodResourcesError::Permission(shown));
        }
        Err(e) => return Err(PodResourcesError::Connect { path: shown, message: e.to_string() }),
    }
    let call = async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("unix:{shown}"))
            .map_err(|e| PodResourcesError::Connect { path: shown.clone(), message: e.to_string() })?
            .connect_timeout(timeout)
            .timeout(timeout);
        let channel = endpoint.connect().await.map_err(|e| {
            let message = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
            if message.contains("ermission denied") {
                PodResourcesError::Permission(shown.clone())
            } else {
                PodResourcesError::Connect { path: shown.clone(), message }
            }
        })?;
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
        grpc.ready().await.map_err(|e| PodResourcesError::Connect { path: shown.clone(), message: e.to_string() })?;
        let codec = tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
        grpc.unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            http::uri::PathAndQuery::from_static(LIST_PATH),
            codec,
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| match s.code() {
            tonic::Code::DeadlineExceeded => PodResourcesError::Timeout(timeout),
            _ => PodResourcesError::Rpc(format!("{}: {}", s.code(), s.message())),
        })
    };
    tokio::time::timeout(timeout, call).await.unwrap_or(Err(PodResourcesError::Timeout(timeout)))
}

/// A container a GPU is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Assigned {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
}

/// How a device plugin's id names a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum DeviceKey {
    /// A GPU UUID (lowercase).
    Uuid(String),
    /// An NVML index (`DEVICE_ID_STRATEGY=index`, or GKE's `nvidia<N>`).
    Index(u32),
}

/// The GPU a device id names: a UUID (time-slicing replicas `<uuid>::<n>` name their GPU), an
/// index (`3`, GKE's `nvidia3`). MIG devices (`MIG-...`, GKE's `nvidia0/gi1`) name no whole GPU.
fn device_key(id: &str) -> Option<DeviceKey> {
    let id = id.split_once("::").map_or(id, |(gpu, _)| gpu).trim();
    if id.contains('/') || id.to_ascii_uppercase().starts_with("MIG-") {
        return None;
    }
    if let Ok(i) = id.parse::<u32>() {
        return Some(DeviceKey::Index(i));
    }
    if let Some(i) = id.strip_prefix("nvidia").and_then(|n| n.parse::<u32>().ok()) {
        return Some(DeviceKey::Index(i));
    }
    (!id.is_empty()).then(|| DeviceKey::Uuid(id.to_ascii_lowercase()))
}

/// GPU → the containers it is assigned to, from one `List` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignments {
    by_device: HashMap<DeviceKey, Vec<Assigned>>,
}

impl Assignments {
    /// The GPU assignments of `resp`: devices of the resources in `resource_names`.
    pub fn from_list(resp: &ListPodResourcesResponse, resource_names: &[String]) -> Self {
        let mut by_device: HashMap<DeviceKey, Vec<Assigned>> = HashMap::new();
        for pod in &resp.pod_resources {
            for c in &pod.containers {
                for d in c.devices.iter().filter(|d| resource_names.iter().any(|r| r == &d.resource_name)) {
                    for key in d.device_ids.iter().filter_map(|id| device_key(id)) {
                        let a = Assigned {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: c.name.clone(),
                        };
                        let v = by_device.entry(key).or_default();
                        if !v.contains(&a) {
                            v.push(a);
                        }
                    }
                }
            }
        }
        for v in by_device.values_mut() {
            v.sort();
        }
        Assignments { by_device }
    }

    /// The containers `d` is assigned to (by UUID or by index), each once, sorted.
    pub fn for_device(&self, d: &DeviceInfo) -> Vec<&Assigned> {
        let mut out: Vec<&Assigned> = Vec::new();
        for key in [DeviceKey::Uuid(d.uuid.to_ascii_lowercase()), DeviceKey::Index(d.index)] {
            for a in self.by_device.get(&key).into_iter().flatten() {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
        out.sort();
        out
    }

    /// GPUs with an assignment.
    pub fn len(&self) -> usize {
        self.by_device.len()
    }

    /// Whether no GPU is assigned.
    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }
}

/// The last answer and when it came.
struct Snapshot {
    assignments: Arc<Assignments>,
    at: Instant,
}

/// Lists the pod resources periodically and keeps the last answer.
pub struct PodResourcesWatcher {
    receiver: String,
    socket: PathBuf,
    interval: Duration,
    timeout: Duration,
    resource_names: Vec<String>,
    telemetry: Arc<Telemetry>,
    current: RwLock<Option<Snapshot>>,
    last_error: Mutex<Option<PodResourcesError>>,
    refreshes: Counter,
}

impl PodResourcesWatcher {
    /// A watcher of `socket` for `receiver` (nothing is listed before [`Self::refresh`]).
    pub fn new(
        receiver: &str,
        socket: PathBuf,
        interval: Duration,
        timeout: Duration,
        resource_names: Vec<String>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let refreshes = telemetry.component_counter(
            "inferwatch_nvml_pod_resources_refreshes",
            "Successful List calls of the kubelet pod-resources API by an nvml receiver",
            &[("receiver", receiver)],
        );
        PodResourcesWatcher {
            receiver: receiver.to_string(),
            socket,
            interval,
            timeout,
            resource_names,
            telemetry,
            current: RwLock::new(None),
            last_error: Mutex::new(None),
            refreshes,
        }
    }

    /// The last answer, unless it is older than three refresh intervals (pods may have moved).
    pub fn current(&self) -> Option<Arc<Assignments>> {
        let g = self.current.read();
        g.as_ref().filter(|s| s.at.elapsed() <= self.interval.saturating_mul(3)).map(|s| s.assignments.clone())
    }

    /// Makes `a` the current answer (what a successful `List` does; tests feed answers directly).
    pub fn publish(&self, a: Assignments) {
        *self.current.write() = Some(Snapshot { assignments: Arc::new(a), at: Instant::now() });
    }

    /// Lists once; logs a change of state (the first missing socket is one warning), counts failures.
    pub async fn refresh(&self) {
        match list(&self.socket, self.timeout).await {
            Ok(resp) => {
                let a = Assignments::from_list(&resp, &self.resource_names);
                self.refreshes.inc();
                let before = self.last_error.lock().take();
                if before.is_some() || self.current.read().is_none() {
                    tracing::info!(receiver = %self.receiver, socket = %self.socket.display(),
                        pods = resp.pod_resources.len(), gpus_assigned = a.len(),
                        "kubelet pod-resources answered; GPUs are attributed to their pods");
                }
                self.publish(a);
            }
            Err(e) => {
                self.telemetry
                    .component_counter(
                        "inferwatch_nvml_pod_resources_errors",
                        "Failed List calls of the kubelet pod-resources API by an nvml receiver, by reason",
                        &[("receiver", &self.receiver), ("reason", e.reason())],
                    )
                    .inc();
                let mut last = self.last_error.lock();
                if last.as_ref().map(PodResourcesError::reason) != Some(e.reason()) {
                    tracing::warn!(receiver = %self.receiver, reason = e.reason(),
                        "kubelet pod-resources unavailable: {e}; GPUs and processes are attributed from /proc cgroups only \
                         (pod UID and container id, no pod name); retrying every {:?}", self.interval);
                } else {
                    tracing::debug!(receiver = %self.receiver, error = %e, "kubelet pod-resources still unavailable");
                }
                *last = Some(e);
            }
        }
    }

    /// Refreshes every interval until cancelled (the first after one interval).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + self.interval,
            self.interval.max(Duration::from_millis(1)),
        );
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = self.refresh() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;
    use prost::Message;
    use std::collections::BTreeMap;

    const VENDORED: &str = include_str!("../../../proto/kubelet/podresources/v1/api.proto");

    /// `message` → field number → (name, type, repeated), from the vendored file.
    fn proto_fields() -> BTreeMap<String, BTreeMap<u32, (String, String, bool)>> {
        let mut out = BTreeMap::new();
        let mut current: Option<String> = None;
        for raw in VENDORED.lines() {
            let line = raw.split("//").next().unwrap_or("").trim();
            if let Some(rest) = line.strip_prefix("message ") {
                let name = rest.trim_end_matches('{').trim().trim_end_matches("{}").trim().to_string();
                out.insert(name.clone(), BTreeMap::new());
                current = (!line.ends_with("{}")).then_some(name);
            } else if line == "}" {
                current = None;
            } else if let (Some(m), Some(decl)) = (&current, line.strip_suffix(';')) {
                if decl.starts_with("reserved") {
                    continue;
                }
                let (lhs, num) = decl.split_once('=').unwrap();
                let words: Vec<&str> = lhs.split_whitespace().collect();
                let (repeated, ty, name) = match words.as_slice() {
                    ["repeated", ty, name] => (true, *ty, *name),
                    [ty, name] => (false, *ty, *name),
                    other => panic!("unexpected field {other:?}"),
                };
                out.get_mut(m).unwrap().insert(num.trim().parse().unwrap(), (name.into(), ty.into(), repeated));
            }
        }
        out
    }

    /// (field number, wire type) of each top-level field in `buf`.
    fn wire_fields(mut buf: &[u8]) -> Vec<(u32, u8)> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let key = prost::encoding::decode_varint(&mut buf).unwrap();
            let (num, wt) = ((key >> 3) as u32, (key & 7) as u8);
            match wt {
                0 => {
                    prost::encoding::decode_varint(&mut buf).unwrap();
                }
                2 => {
                    let n = prost::encoding::decode_varint(&mut buf).unwrap() as usize;
                    buf = &buf[n..];
                }
                other => panic!("wire type {other}"),
            }
            out.push((num, wt));
        }
        out
    }

    fn wire_type(ty: &str, repeated: bool) -> u8 {
        match ty {
            "int64" if !repeated => 0,
            _ => 2, // strings, messages, and packed repeated scalars (proto3)
        }
    }

    /// Every mirrored message, populated in every field, with its Debug text.
    fn populated() -> Vec<(&'static str, Vec<u8>, String)> {
        let numa = NumaNode { id: 1 };
        let topo = TopologyInfo { nodes: vec![numa.clone()] };
        let dev = ContainerDevices {
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec!["GPU-a".into()],
            topology: Some(topo.clone()),
        };
        let c = ContainerResources { name: "vllm".into(), devices: vec![dev.clone()], cpu_ids: vec![2, 3] };
        let pod = PodResources { name: "p".into(), namespace: "ns".into(), containers: vec![c.clone()] };
        let resp = ListPodResourcesResponse { pod_resources: vec![pod.clone()] };
        vec![
            ("NUMANode", numa.encode_to_vec(), format!("{numa:?}")),
            ("TopologyInfo", topo.encode_to_vec(), format!("{topo:?}")),
            ("ContainerDevices", dev.encode_to_vec(), format!("{dev:?}")),
            ("ContainerResources", c.encode_to_vec(), format!("{c:?}")),
            ("PodResources", pod.encode_to_vec(), format!("{pod:?}")),
            ("ListPodResourcesResponse", resp.encode_to_vec(), format!("{resp:?}")),
            ("ListPodResourcesRequest", ListPodResourcesRequest {}.encode_to_vec(), String::new()),
        ]
    }

    #[test]
    fn proto_matches_vendored_file() {
        let fields = proto_fields();
        let ours = populated();
        assert_eq!(
            fields.keys().cloned().collect::<Vec<_>>().len(),
            ours.len(),
            "messages in the .proto: {:?}",
            fields.keys()
        );
        for (msg, bytes, debug) in ours {
            let want = fields.get(msg).unwrap_or_else(|| panic!("{msg} not in the vendored .proto"));
            let mut got: BTreeMap<u32, u8> = BTreeMap::new();
            for (n, wt) in wire_fields(&bytes) {
                got.insert(n, wt);
            }
            let want_wire: BTreeMap<u32, u8> = want.iter().map(|(n, (_, ty, rep))| (*n, wire_type(ty, *rep))).collect();
            assert_eq!(got, want_wire, "{msg}: field numbers / wire types");
            for (name, _, _) in want.values() {
                assert!(
                    debug.contains(&format!("{}: ", name.to_ascii_lowercase())),
                    "{msg}: no field {name} in {debug}"
                );
            }
        }
        assert!(VENDORED.contains("service PodResourcesLister") && VENDORED.contains("package v1;"));
        assert!(VENDORED.contains("rpc List(ListPodResourcesRequest) returns (ListPodResourcesResponse)"));
        assert_eq!(LIST_PATH, "/v1.PodResourcesLister/List");
    }

    fn resp(pods: &[(&str, &str, &str, &str, &[&str])]) -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(ns, pod, container, resource, ids)| PodResources {
                    name: (*pod).into(),
                    namespace: (*ns).into(),
                    containers: vec![ContainerResources {
                        name: (*container).into(),
                        devices: vec![ContainerDevices {
                            resource_name: (*resource).into(),
                            device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                            topology: None,
                        }],
                        cpu_ids: vec![],
                    }],
                })
                .collect(),
        }
    }

    fn dev(index: u32, uuid: &str) -> DeviceInfo {
        DeviceInfo { index, uuid: uuid.into(), name: "H100".into() }
    }

    #[test]
    fn assignments_by_uuid_index_and_shares() {
        let names = vec!["nvidia.com/gpu".to_string()];
        let r = resp(&[
            ("llm", "vllm-0", "vllm", "nvidia.com/gpu", &["GPU-AAA", "GPU-bbb"]),
            ("llm", "vllm-1", "vllm", "nvidia.com/gpu", &["2"]),
            ("gke", "job", "main", "nvidia.com/gpu", &["nvidia3"]),
            // Time-slicing: two pods on replicas of one GPU.
            ("a", "s1", "c", "nvidia.com/gpu", &["GPU-ccc::0"]),
            ("b", "s2", "c", "nvidia.com/gpu", &["GPU-ccc::1"]),
            // Another resource, and MIG devices: not whole GPUs.
            ("x", "nic", "c", "rdma/hca", &["GPU-ddd"]),
            ("x", "mig", "c", "nvidia.com/gpu", &["MIG-9e5c0f4e-5d3b-5c3a-9f7d-1e2a3b4c5d6e", "nvidia0/gi1"]),
        ]);
        let a = Assignments::from_list(&r, &names);
        let one = |d: &DeviceInfo| {
            a.for_device(d).iter().map(|x| format!("{}/{}/{}", x.namespace, x.pod, x.container)).collect::<Vec<_>>()
        };
        assert_eq!(one(&dev(0, "GPU-aaa")), ["llm/vllm-0/vllm"]);
        assert_eq!(one(&dev(1, "GPU-BBB")), ["llm/vllm-0/vllm"]);
        assert_eq!(one(&dev(2, "GPU-zzz")), ["llm/vllm-1/vllm"]);
        assert_eq!(one(&dev(3, "GPU-yyy")), ["gke/job/main"]);
        assert_eq!(one(&dev(4, "GPU-ccc")), ["a/s1/c", "b/s2/c"]);
        assert!(one(&dev(5, "GPU-ddd")).is_empty());
        assert_eq!(a.len(), 5);
    }

    #[tokio::test]
    async fn missing_socket_is_reported_without_waiting() {
        let e = list(Path::new("/nonexistent/kubelet.sock"), Duration::from_secs(30)).await.unwrap_err();
        assert_eq!(e.reason(), "missing_socket");
        let t = Arc::new(Telemetry::new());
        let w = PodResourcesWatcher::new(
            "nvml",
            "/nonexistent/kubelet.sock".into(),
            Duration::from_secs(30),
            Duration::from_secs(1),
            vec!["nvidia.com/gpu".into()],
            t.clone(),
        );
        w.refresh().await;
        w.refresh().await;
        assert!(w.current().is_none());
        let text = t.render();
        assert!(
            text.contains(r#"inferwatch_nvml_pod_resources_errors_total{receiver="nvml",reason="missing_socket"} 2"#),
            "{text}"
        );
    }
}
