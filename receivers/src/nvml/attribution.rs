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
//! pod) is not named; a pod using GPUs of two containers gets no container name on its processes.
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
