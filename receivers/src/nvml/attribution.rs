//! GPU → pod and process → pod, from the two sources a node offers: the kubelet's pod-resources
//! assignment (GPU → namespace / pod / container names; [`super::pod_resources`]) and each
//! process's cgroup (pid → pod UID / container id; [`super::cgroup`]).
//!
//! Neither source alone names a process's pod: pod-resources carries no UIDs and no container
//! ids, and a cgroup carries no names. They are joined through the GPU: in one round, a GPU
//! assigned to exactly one pod whose processes (as NVML lists them) all sit in one pod UID ties
//! that UID to that pod's namespace and name. What each item gets:
//!
//! | | both sources | cgroups only (no socket) | pod-resources only (no proc root) |
//! |---|---|---|---|
//! | a GPU assigned to one container | namespace, pod, container; + pod UID when its processes agree | pod UID, when its processes are all in one pod | namespace, pod, container |
//! | a GPU shared by several pods (time-slicing) | none (each process is attributed) | as above | none |
//! | a process in a pod | pod UID, container id; + namespace, pod, container when the UID is tied | pod UID, container id | nothing |
//! | a process in no pod (host daemon) | nothing | nothing | nothing |
//!
//! A UID tied to two different pods in one round (a process using a GPU assigned to another
//! pod), and a pod tied to two UIDs, are not named; a pod using GPUs of two containers gets no
//! container name on its processes. What cannot be told apart: a process of pod B alone on a GPU
//! assigned to pod A (B sees GPUs it did not claim, e.g. `NVIDIA_VISIBLE_DEVICES=all`) while A
//! shows no process anywhere is named A; its `k8s.pod.uid` and `container.id` are still B's.
//! A process that resolves to the agent's **own** pod (as `/proc/self/cgroup` says) is not
//! attributed: the agent runs no GPU work, so that answer means `proc_root` is not the host's
//! procfs (pids of another namespace); it is logged once and counted (`event="own_pod"`).

use super::cgroup::{CacheCounts, Lookup, PidCache, parse_cgroup};
use super::pod_resources::{Assigned, Assignments, PodResourcesWatcher};
use super::source::{DeviceInfo, GpuSample};
use inferwatch_core::telemetry::Telemetry;
use prometheus_client::metrics::counter::Counter;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Who a GPU or a process belongs to; every field is optional (see the module's table).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    /// `k8s.namespace.name` (dcgm: `namespace`).
    pub namespace: Option<String>,
    /// `k8s.pod.name` (dcgm: `pod`).
    pub pod: Option<String>,
    /// `k8s.container.name` (dcgm: `container`).
    pub container: Option<String>,
    /// `k8s.pod.uid` (dcgm: `pod_uid`).
    pub pod_uid: Option<String>,
    /// `container.id` (dcgm: `container_id`), processes only.
    pub container_id: Option<String>,
}

impl PodIdentity {
    fn named(a: &Assigned) -> Self {
        PodIdentity {
            namespace: Some(a.namespace.clone()),
            pod: Some(a.pod.clone()),
            container: Some(a.container.clone()),
            ..PodIdentity::default()
        }
    }
}

/// The attribution of one GPU's sample: the GPU, and its processes by pid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The GPU's pod, if any.
    pub gpu: Option<PodIdentity>,
    /// Each process's pod (pids in no pod are absent).
    pub processes: HashMap<u32, PodIdentity>,
}

/// The self-metric counters of the pid cache (`inferwatch_nvml_pid_cache_events{receiver, event}`).
struct CacheCounters {
    reads: Counter,
    unreadable: Counter,
    pid_reused: Counter,
    evicted: Counter,
    own_pod: Counter,
}

/// Attributes each round's samples (blocking: reads procfs; moved to the sampling thread).
pub struct Attributor {
    cache: Option<PidCache>,
    pods: Option<Arc<PodResourcesWatcher>>,
    counters: Option<CacheCounters>,
    seen: CacheCounts,
    own_pod_uid: Option<String>,
    warned_own_pod: bool,
}

/// What a UID is tied to in one round.
#[derive(Clone, PartialEq)]
enum Tie {
    Pod(String, String, Option<String>),
    Conflict,
}

impl Attributor {
    /// An attributor reading cgroups through `cache` (none: no cgroups) and assignments from
    /// `pods` (none: no pod-resources); counts on `telemetry` under `receiver`, when given.
    pub fn new(
        cache: Option<PidCache>,
        pods: Option<Arc<PodResourcesWatcher>>,
        telemetry: Option<(&Telemetry, &str)>,
    ) -> Self {
        let counters = telemetry.map(|(t, receiver)| {
            let c = |event: &str| {
                t.component_counter(
                    "inferwatch_nvml_pid_cache_events",
                    "pid → pod cache of an nvml receiver: cgroup reads, failed reads, reused pids, evictions",
                    &[("receiver", receiver), ("event", event)],
                )
            };
            CacheCounters {
                reads: c("read"),
                unreadable: c("unreadable"),
                pid_reused: c("pid_reused"),
                evicted: c("evicted"),
                own_pod: c("own_pod"),
            }
        });
        let own_pod_uid =
            std::fs::read_to_string("/proc/self/cgroup").ok().as_deref().and_then(parse_cgroup).map(|c| c.pod_uid);
        Attributor { cache, pods, counters, seen: CacheCounts::default(), own_pod_uid, warned_own_pod: false }
    }

    /// The same, treating `uid` as the agent's own pod (tests; normally read from `/proc/self/cgroup`).
    pub fn with_own_pod_uid(mut self, uid: Option<String>) -> Self {
        self.own_pod_uid = uid;
        self
    }

    /// `l`, unless it is the agent's own pod (then not in a pod; logged once, counted).
    fn not_own(&mut self, pid: u32, l: Lookup) -> Lookup {
        match &l {
            Lookup::Pod(c) if self.own_pod_uid.as_deref() == Some(c.pod_uid.as_str()) => {
                if let Some(c) = &self.counters {
                    c.own_pod.inc();
                }
                if !self.warned_own_pod {
                    self.warned_own_pod = true;
                    tracing::warn!(pid, pod_uid = %c.pod_uid,
                        "a GPU process resolves to the agent's own pod: pod_attribution.proc_root is not the host's \
                         procfs (mount the host's /proc, e.g. at /host/proc); such processes are not attributed");
                }
                Lookup::NotInPod
            }
            _ => l,
        }
    }

    /// The pid cache, if cgroups are read.
    pub fn cache(&self) -> Option<&PidCache> {
        self.cache.as_ref()
    }

    /// The attribution of each `(device, sample)` of one round, in order (`None` samples: failed devices).
    pub fn attribute(&mut self, round: &[(&DeviceInfo, Option<&GpuSample>)]) -> Vec<Attribution> {
        let assignments: Option<Arc<Assignments>> = self.pods.as_ref().and_then(|w| w.current());
        // Pass 1: each process's cgroup, each GPU's assignment, and the UIDs tied to pods.
        let mut per_gpu = Vec::with_capacity(round.len());
        let mut ties: HashMap<String, Tie> = HashMap::new();
        for (d, s) in round {
            let looked: Vec<(u32, Lookup)> = match (s.and_then(|s| s.processes.as_ref()), self.cache.as_mut()) {
                (Some(ps), Some(cache)) => ps.iter().map(|p| (p.pid, cache.lookup(p.pid))).collect(),
                _ => Vec::new(),
            };
            let procs: Vec<(u32, Lookup)> = looked.into_iter().map(|(pid, l)| (pid, self.not_own(pid, l))).collect();
            let assigned: Vec<Assigned> =
                assignments.as_ref().map(|a| a.for_device(d).into_iter().cloned().collect()).unwrap_or_default();
            let uids: BTreeSet<&str> = procs
                .iter()
                .filter_map(|(_, l)| match l {
                    Lookup::Pod(c) => Some(c.pod_uid.as_str()),
                    _ => None,
                })
                .collect();
            let sole_uid = (uids.len() == 1).then(|| uids.iter().next().map(|u| u.to_string())).flatten();
            if let ([a], Some(uid)) = (assigned.as_slice(), &sole_uid) {
                let tie = Tie::Pod(a.namespace.clone(), a.pod.clone(), Some(a.container.clone()));
                let merged = match ties.get(uid) {
                    None => tie,
                    Some(Tie::Pod(ns, pod, c)) if *ns == a.namespace && *pod == a.pod => {
                        let container = c.clone().filter(|c| *c == a.container);
                        Tie::Pod(ns.clone(), pod.clone(), container)
                    }
                    Some(_) => Tie::Conflict,
                };
                ties.insert(uid.clone(), merged);
            }
            per_gpu.push((procs, assigned, sole_uid));
        }
        // One pod has one UID: a pod tied to two UIDs (a process of another pod alone on a GPU
        // assigned to this one) names neither.
        let mut uids_of: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
        for (uid, t) in &ties {
            if let Tie::Pod(ns, pod, _) = t {
                uids_of.entry((ns.as_str(), pod.as_str())).or_default().push(uid.as_str());
            }
        }
        let ambiguous: Vec<String> =
            uids_of.into_values().filter(|u| u.len() > 1).flatten().map(str::to_string).collect();
        for uid in ambiguous {
            ties.insert(uid, Tie::Conflict);
        }
        // Pass 2: the identities.
        let out = per_gpu
            .into_iter()
            .map(|(procs, assigned, sole_uid)| {
                let gpu = match assigned.as_slice() {
                    [a] => Some(PodIdentity {
                        pod_uid: sole_uid.clone().filter(|u| {
                            matches!(ties.get(u), Some(Tie::Pod(ns, pod, _)) if *ns == a.namespace && *pod == a.pod)
                        }),
                        ..PodIdentity::named(a)
                    }),
                    [] => sole_uid.map(|u| PodIdentity { pod_uid: Some(u), ..PodIdentity::default() }),
                    _ => None,
                };
                let processes = procs
                    .into_iter()
                    .filter_map(|(pid, l)| {
                        let Lookup::Pod(c) = l else { return None };
                        let mut id = PodIdentity {
                            pod_uid: Some(c.pod_uid.clone()),
                            container_id: c.container_id.clone(),
                            ..PodIdentity::default()
                        };
                        if let Some(Tie::Pod(ns, pod, container)) = ties.get(&c.pod_uid) {
                            id.namespace = Some(ns.clone());
                            id.pod = Some(pod.clone());
                            id.container = container.clone();
                        }
                        Some((pid, id))
                    })
                    .collect();
                Attribution { gpu, processes }
            })
            .collect();
        self.publish_counts();
        out
    }

    fn publish_counts(&mut self) {
        let (Some(cache), Some(c)) = (&self.cache, &self.counters) else { return };
        let now = cache.counts();
        c.reads.inc_by(now.reads - self.seen.reads);
        c.unreadable.inc_by(now.unreadable - self.seen.unreadable);
        c.pid_reused.inc_by(now.pid_reused - self.seen.pid_reused);
        c.evicted.inc_by(now.evicted - self.seen.evicted);
        self.seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::pod_resources::proto::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };
    use crate::nvml::source::ProcessMemory;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    const UID_A: &str = "3f1c2b9e-8d4a-4e4b-9a57-0c2d1e6f7a88";
    const UID_B: &str = "11111111-2222-4333-8444-555555555555";
    const CID_A: &str = "9b2f6a0c1d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";
    const CID_B: &str = "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999";

    /// A fixture procfs: `<root>/<pid>/cgroup` and `stat`.
    struct Proc(PathBuf);

    impl Proc {
        fn new(name: &str) -> Self {
            let d = std::env::temp_dir().join(format!("inferwatch-attr-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Proc(d)
        }

        fn pid(&self, pid: u32, cgroup: &str) -> &Self {
            let d = self.0.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
            std::fs::write(
                d.join("stat"),
                format!("{pid} (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid}00 0 0"),
            )
            .unwrap();
            self
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A systemd-driver (cgroup v2, containerd) path of a Burstable pod's container.
    fn systemd(uid: &str, cid: &str) -> String {
        let u = uid.replace('-', "_");
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"
        )
    }

    /// A cgroupfs-driver (cgroup v1) path of a BestEffort pod's container.
    fn cgroupfs(uid: &str, cid: &str) -> String {
        format!("11:memory:/kubepods/besteffort/pod{uid}/{cid}\n1:name=systemd:/kubepods/besteffort/pod{uid}/{cid}\n")
    }

    fn dev(i: u32) -> DeviceInfo {
        DeviceInfo { index: i, uuid: format!("GPU-{i}"), name: "H100".into() }
    }

    fn sample(pids: &[u32]) -> GpuSample {
        GpuSample {
            processes: Some(pids.iter().map(|&pid| ProcessMemory { pid, used_bytes: Some(1 << 30) }).collect()),
            ..GpuSample::default()
        }
    }

    /// `(namespace, pod, container, device ids)` per container.
    fn watcher(assigned: &[(&str, &str, &str, &[&str])]) -> Arc<PodResourcesWatcher> {
        let resp = ListPodResourcesResponse {
            pod_resources: assigned
                .iter()
                .map(|(ns, pod, c, ids)| PodResources {
                    name: (*pod).into(),
                    namespace: (*ns).into(),
                    containers: vec![ContainerResources {
                        name: (*c).into(),
                        devices: vec![ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                            topology: None,
                        }],
                        cpu_ids: vec![],
                    }],
                })
                .collect(),
        };
        let w = PodResourcesWatcher::new(
            "nvml",
            "/nonexistent/kubelet.sock".into(),
            Duration::from_secs(30),
            Duration::from_secs(1),
            vec!["nvidia.com/gpu".into()],
            Arc::new(Telemetry::new()),
        );
        w.publish(Assignments::from_list(&resp, &["nvidia.com/gpu".to_string()]));
        Arc::new(w)
    }

    fn attributor(proc: Option<&Proc>, pods: Option<Arc<PodResourcesWatcher>>) -> Attributor {
        let cache = proc.map(|p| PidCache::new(p.path(), 64, Duration::from_secs(60)));
        Attributor::new(cache, pods, None).with_own_pod_uid(None)
    }

    fn run(a: &mut Attributor, gpus: &[&[u32]]) -> Vec<Attribution> {
        let devs: Vec<DeviceInfo> = (0..gpus.len() as u32).map(dev).collect();
        let samples: Vec<GpuSample> = gpus.iter().map(|p| sample(p)).collect();
        let round: Vec<_> = devs.iter().zip(&samples).map(|(d, s)| (d, Some(s))).collect();
        a.attribute(&round)
    }

    fn named(ns: &str, pod: &str, c: Option<&str>, uid: Option<&str>, cid: Option<&str>) -> PodIdentity {
        PodIdentity {
            namespace: Some(ns.into()),
            pod: Some(pod.into()),
            container: c.map(str::to_string),
            pod_uid: uid.map(str::to_string),
            container_id: cid.map(str::to_string),
        }
    }

    fn uid_only(uid: &str, cid: Option<&str>) -> PodIdentity {
        PodIdentity { pod_uid: Some(uid.into()), container_id: cid.map(str::to_string), ..PodIdentity::default() }
    }

    #[test]
    fn both_sources_name_gpus_and_processes_of_two_pods() {
        let proc = Proc::new("both");
        proc.pid(100, &systemd(UID_A, CID_A)).pid(200, &cgroupfs(UID_B, CID_B));
        proc.pid(300, "0::/system.slice/nvidia-persistenced.service\n");
        let pods = watcher(&[("llm", "vllm-0", "vllm", &["GPU-0"]), ("llm", "vllm-1", "engine", &["1"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        // pid 400 has exited (no /proc entry); pid 300 is a host daemon.
        let out = run(&mut a, &[&[100, 400], &[200, 300]]);
        assert_eq!(out[0].gpu, Some(named("llm", "vllm-0", Some("vllm"), Some(UID_A), None)));
        assert_eq!(out[1].gpu, Some(named("llm", "vllm-1", Some("engine"), Some(UID_B), None)));
        assert_eq!(out[0].processes.get(&100), Some(&named("llm", "vllm-0", Some("vllm"), Some(UID_A), Some(CID_A))));
        assert_eq!(out[1].processes.get(&200), Some(&named("llm", "vllm-1", Some("engine"), Some(UID_B), Some(CID_B))));
        assert_eq!(out[0].processes.len(), 1, "the exited pid is not attributed: {:?}", out[0].processes);
        assert_eq!(out[1].processes.len(), 1, "the host daemon is not attributed: {:?}", out[1].processes);
        let counts = a.cache().unwrap().counts();
        assert_eq!((counts.reads, counts.unreadable), (4, 1));
        // The next round is answered from the cache: no cgroup is read again.
        let again = run(&mut a, &[&[100, 400], &[200, 300]]);
        assert_eq!(again, out);
        assert_eq!(a.cache().unwrap().counts().reads, 5, "only the missing pid is tried again");
    }

    #[test]
    fn cgroups_alone_give_uids_and_container_ids() {
        let proc = Proc::new("cgonly");
        proc.pid(100, &systemd(UID_A, CID_A)).pid(101, &systemd(UID_A, CID_A)).pid(200, &cgroupfs(UID_B, CID_B));
        let mut a = attributor(Some(&proc), None);
        let out = run(&mut a, &[&[100, 101], &[100, 200]]);
        assert_eq!(out[0].gpu, Some(uid_only(UID_A, None)), "one pod's processes: the GPU gets its UID");
        assert_eq!(out[1].gpu, None, "processes of two pods: no GPU pod");
        assert_eq!(out[0].processes.get(&101), Some(&uid_only(UID_A, Some(CID_A))));
        assert_eq!(out[1].processes.get(&200), Some(&uid_only(UID_B, Some(CID_B))));
    }

    #[test]
    fn pod_resources_alone_names_gpus_only() {
        let pods = watcher(&[("llm", "vllm-0", "vllm", &["GPU-0"])]);
        let mut a = attributor(None, Some(pods));
        let out = run(&mut a, &[&[100], &[200]]);
        assert_eq!(out[0].gpu, Some(named("llm", "vllm-0", Some("vllm"), None, None)));
        assert_eq!(out[1].gpu, None, "GPU 1 is assigned to no pod");
        assert!(out.iter().all(|o| o.processes.is_empty()));
    }

    #[test]
    fn shared_gpus_and_conflicts_name_no_one_wrongly() {
        let proc = Proc::new("shared");
        proc.pid(100, &systemd(UID_A, CID_A)).pid(200, &cgroupfs(UID_B, CID_B));
        // GPU 0: time-sliced between two pods; GPU 1: vllm-0 alone, used by pod A.
        let pods =
            watcher(&[("llm", "vllm-0", "vllm", &["GPU-0::0", "GPU-1"]), ("batch", "job", "main", &["GPU-0::1"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        let out = run(&mut a, &[&[100, 200], &[100]]);
        assert_eq!(out[0].gpu, None, "a GPU shared by two pods names neither");
        // A's UID is tied through GPU 1; B's through nothing.
        assert_eq!(out[0].processes.get(&100), Some(&named("llm", "vllm-0", Some("vllm"), Some(UID_A), Some(CID_A))));
        assert_eq!(out[0].processes.get(&200), Some(&uid_only(UID_B, Some(CID_B))));

        // Pod A's process on GPUs assigned to two different pods: its UID is named after neither.
        let pods = watcher(&[("llm", "vllm-0", "vllm", &["GPU-0"]), ("llm", "vllm-1", "vllm", &["GPU-1"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        let out = run(&mut a, &[&[100], &[100]]);
        assert_eq!(out[0].processes.get(&100), Some(&uid_only(UID_A, Some(CID_A))));
        assert_eq!(out[0].gpu, Some(named("llm", "vllm-0", Some("vllm"), None, None)), "the GPU keeps its pod");
        assert_eq!(out[1].gpu, Some(named("llm", "vllm-1", Some("vllm"), None, None)));

        // Pods A and B each alone on a GPU of vllm-0: one pod, two UIDs; neither is named.
        let pods = watcher(&[("llm", "vllm-0", "vllm", &["GPU-0", "GPU-1"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        let out = run(&mut a, &[&[100], &[200]]);
        assert_eq!(out[0].processes.get(&100), Some(&uid_only(UID_A, Some(CID_A))));
        assert_eq!(out[1].processes.get(&200), Some(&uid_only(UID_B, Some(CID_B))));

        // One pod, two containers with a GPU each: the pod is named, the container is not.
        let pods = watcher(&[("llm", "vllm-0", "prefill", &["GPU-0"]), ("llm", "vllm-0", "decode", &["GPU-1"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        let out = run(&mut a, &[&[100], &[100]]);
        assert_eq!(out[0].processes.get(&100), Some(&named("llm", "vllm-0", None, Some(UID_A), Some(CID_A))));
        assert_eq!(out[1].gpu, Some(named("llm", "vllm-0", Some("decode"), Some(UID_A), None)));
    }

    #[test]
    fn the_agents_own_pod_is_not_attributed_and_is_counted() {
        // proc_root is not the host's procfs: NVML's host pids land on the agent's own pod.
        let proc = Proc::new("own");
        proc.pid(100, &systemd(UID_A, CID_A)).pid(200, &cgroupfs(UID_B, CID_B));
        let t = Telemetry::new();
        let cache = PidCache::new(proc.path(), 64, Duration::from_secs(60));
        let mut a = Attributor::new(Some(cache), None, Some((&t, "nvml"))).with_own_pod_uid(Some(UID_A.into()));
        for _ in 0..3 {
            let out = run(&mut a, &[&[100, 200]]);
            assert_eq!(out[0].processes.keys().copied().collect::<Vec<_>>(), vec![200]);
            assert_eq!(out[0].gpu, Some(uid_only(UID_B, None)));
        }
        assert!(a.warned_own_pod);
        let text = t.render();
        for line in [
            r#"inferwatch_nvml_pid_cache_events_total{receiver="nvml",event="own_pod"} 3"#,
            r#"inferwatch_nvml_pid_cache_events_total{receiver="nvml",event="read"} 2"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn failed_samples_and_stale_answers() {
        let proc = Proc::new("failed");
        proc.pid(100, &systemd(UID_A, CID_A));
        let pods = watcher(&[("llm", "vllm-0", "vllm", &["GPU-0"])]);
        let mut a = attributor(Some(&proc), Some(pods));
        let d = dev(0);
        let out = a.attribute(&[(&d, None)]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].gpu, Some(named("llm", "vllm-0", Some("vllm"), None, None)));
        assert!(out[0].processes.is_empty());
    }
}
