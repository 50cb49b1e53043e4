//! pid → container → pod through `<proc_root>/<pid>/cgroup`, and a bounded cache of the answers
//! that a reused pid cannot fool.
//!
//! The kubelet names a pod's cgroup `pod<uid>` under its QoS class (`kubepods` for Guaranteed,
//! `kubepods/burstable`, `kubepods/besteffort`) with the cgroupfs driver, and converts the same
//! name for the systemd driver by escaping `-` as `_` and prefixing the parents' names joined by
//! `-`, with a `.slice` suffix (`kubepods-burstable-pod<uid_with_underscores>.slice`; kubelet
//! `pkg/kubelet/cm/cgroup_manager_linux.go`, `ConvertCgroupNameToSystemd`, and
//! `pkg/kubelet/cm/pod_container_manager_linux.go`, `GetPodContainerName`). The container's
//! cgroup below it is named by the runtime: its 64-hex id with cgroupfs, or a systemd scope
//! `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O), `docker-<id>.scope`
//! (cri-dockerd). Static pods have a 32-hex config hash as UID instead of a UUID.
//!
//! Both cgroup formats are read: v1 (`<hierarchy>:<controllers>:<path>` lines, one per
//! hierarchy) and v2 (one `0::<path>` line). From inside a container with a private cgroup
//! namespace, the paths of other containers start with `/..` segments; the pod and container
//! segments are searched anywhere in the path, so those are read too.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pod and container a process runs in, as its cgroup path says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupIdentity {
    /// The pod's UID (a UUID, or a static pod's 32-hex hash), with `-` as in the API.
    pub pod_uid: String,
    /// The container's runtime id (64 hex), when the path names the container.
    pub container_id: Option<String>,
    /// The runtime the container scope names: `containerd`, `cri-o` or `docker` (systemd driver only).
    pub runtime: Option<&'static str>,
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID as the API writes it: 8-4-4-4-12 hex, or 32 hex (static pods). Lowercase.
fn pod_uid(s: &str) -> Option<String> {
    let groups: Vec<&str> = s.split('-').collect();
    let ok = match groups.as_slice() {
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12] && groups.iter().all(|g| is_hex(g))
        }
        [one] => one.len() == 32 && is_hex(one),
        _ => false,
    };
    ok.then(|| s.to_ascii_lowercase())
}

/// The pod UID a path segment names: `pod<uid>` (cgroupfs) or `...-pod<uid_>.slice` (systemd).
fn pod_segment(seg: &str) -> Option<String> {
    if let Some(rest) = seg.strip_suffix(".slice") {
        let (_, tail) = rest.rsplit_once("-pod")?;
        return pod_uid(&tail.replace('_', "-"));
    }
    pod_uid(seg.strip_prefix("pod")?)
}

/// The container id a path segment names, with the runtime when a systemd scope says it.
fn container_segment(seg: &str) -> Option<(String, Option<&'static str>)> {
    let id_of = |s: &str| (s.len() == 64 && is_hex(s)).then(|| s.to_ascii_lowercase());
    if let Some(scope) = seg.strip_suffix(".scope") {
        // crio-conmon-<id>.scope holds CRI-O's monitor process, not the container's.
        for (prefix, runtime) in [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker")] {
            if let Some(id) = scope.strip_prefix(prefix) {
                return id_of(id).map(|id| (id, Some(runtime)));
            }
        }
        return None;
    }
    // cgroupfs: the bare id; containerd under systemd also writes `cri-containerd:<id>` in places.
    let bare = seg.rsplit_once(':').map_or(seg, |(_, id)| id);
    id_of(bare).map(|id| (id, None))
}

/// The identity in one cgroup path, if the path is under a pod.
fn parse_path(path: &str) -> Option<CgroupIdentity> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (at, uid) = segs.iter().enumerate().rev().find_map(|(i, s)| pod_segment(s).map(|u| (i, u)))?;
    let container = segs.get(at + 1).and_then(|s| container_segment(s));
    Some(CgroupIdentity {
        pod_uid: uid,
        container_id: container.as_ref().map(|(id, _)| id.clone()),
        runtime: container.and_then(|(_, r)| r),
    })
}

/// The pod and container in the text of a `/proc/<pid>/cgroup` file (v1 or v2), `None` when the
/// process is not in a pod. The v2 line wins; else the first v1 hierarchy under a pod (with the
/// container named, if any hierarchy names it).
pub fn parse_cgroup(text: &str) -> Option<CgroupIdentity> {
    let mut v1: Option<CgroupIdentity> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hier), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some(id) = parse_path(path.trim_end()) else { continue };
        if hier == "0" {
            return Some(id);
        }
        match &v1 {
            Some(have) if have.container_id.is_some() || id.container_id.is_none() => {}
            _ => v1 = Some(id),
        }
    }
    v1
}

/// The start time (field 22, clock ticks since boot) in the text of a `/proc/<pid>/stat` file.
/// The command name (field 2) may hold spaces and parentheses: fields are counted after its last `)`.
pub fn parse_starttime(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // rest starts at field 3 (state); starttime is field 22, the 20th of rest.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The process is in this pod.
    Pod(Arc<CgroupIdentity>),
    /// The process exists and is in no pod (a host process, or not under the kubelet).
    NotInPod,
    /// `<pid>/cgroup` could not be read (the process ended, or no access).
    Unreadable,
}

/// Counts of the cache's work, for the receiver's self-metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// `<pid>/cgroup` files read (misses, pid reuse, expiry).
    pub reads: u64,
    /// Reads that failed.
    pub unreadable: u64,
    /// Entries dropped because a pid's start time changed (the pid was reused).
    pub pid_reused: u64,
    /// Entries evicted to stay within the capacity.
    pub evicted: u64,
}

#[derive(Debug)]
struct Entry {
    start: Option<u64>,
    read_at: Instant,
    last_used: u64,
    found: Option<Arc<CgroupIdentity>>,
}

/// pid → pod answers, at most `capacity` of them. An entry is trusted while the pid's start time
/// (`<pid>/stat`, field 22) is the one seen when the cgroup was read; where the start time cannot
/// be read, for `ttl` only. A changed start time means the pid was reused: the cgroup is read
/// again. Beyond the capacity the least recently used entry goes, counted.
#[derive(Debug)]
pub struct PidCache {
    root: PathBuf,
    capacity: usize,
    ttl: Duration,
    entries: HashMap<u32, Entry>,
    clock: u64,
    counts: CacheCounts,
}

impl PidCache {
    /// A cache reading `<root>/<pid>/{cgroup,stat}`.
    pub fn new(root: impl Into<PathBuf>, capacity: usize, ttl: Duration) -> Self {
        PidCache {
            root: root.into(),
            capacity: capacity.max(1),
            ttl,
            entries: HashMap::new(),
            clock: 0,
            counts: CacheCounts::default(),
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The counts since the cache was made.
    pub fn counts(&self) -> CacheCounts {
        self.counts
    }

    fn start_time(&self, pid: u32) -> Option<u64> {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok().as_deref().and_then(parse_starttime)
    }

    /// Where `pid` runs (blocking: reads procfs).
    pub fn lookup(&mut self, pid: u32) -> Lookup {
        self.clock += 1;
        let start = self.start_time(pid);
        let now = Instant::now();
        if let Some(e) = self.entries.get_mut(&pid) {
            let fresh = match (e.start, start) {
                (Some(a), Some(b)) => a == b,
                (None, None) => now.duration_since(e.read_at) < self.ttl,
                _ => false,
            };
            if fresh {
                e.last_used = self.clock;
                return e.found.clone().map_or(Lookup::NotInPod, Lookup::Pod);
            }
            if matches!((e.start, start), (Some(a), Some(b)) if a != b) {
                self.counts.pid_reused += 1;
            }
            self.entries.remove(&pid);
        }
        self.counts.reads += 1;
        let text = match std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")) {
            Ok(t) => t,
            Err(e) => {
                self.counts.unreadable += 1;
                tracing::debug!(pid, error = %e, "cannot read the process's cgroup");
                return Lookup::Unreadable;
            }
        };
        let found = parse_cgroup(&text).map(Arc::new);
        if self.entries.len() >= self.capacity
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(p, _)| *p)
        {
            self.entries.remove(&oldest);
            self.counts.evicted += 1;
        }
        self.entries.insert(pid, Entry { start, read_at: now, last_used: self.clock, found: found.clone() });
        found.map_or(Lookup::NotInPod, Lookup::Pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f1c2b9e-8d4a-4e4b-9a57-0c2d1e6f7a88";
    const CID: &str = "9b2f6a0c1d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";

    fn id(container: bool, runtime: Option<&'static str>) -> Option<CgroupIdentity> {
        Some(CgroupIdentity { pod_uid: UID.into(), container_id: container.then(|| CID.into()), runtime })
    }

    #[test]
    fn cgroup_v1_cgroupfs_driver() {
        // kubelet --cgroup-driver=cgroupfs, containerd, Burstable pod: every hierarchy alike.
        let text = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{CID}\n\
             11:memory:/kubepods/burstable/pod{UID}/{CID}\n\
             10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n\
             1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
        );
        assert_eq!(parse_cgroup(&text), id(true, None));
        // Guaranteed pods sit directly under kubepods.
        assert_eq!(parse_cgroup(&format!("4:memory:/kubepods/pod{UID}/{CID}\n")), id(true, None));
    }

    #[test]
    fn cgroup_v1_systemd_driver_each_runtime() {
        let u = UID.replace('-', "_");
        for (scope, runtime) in [("cri-containerd", "containerd"), ("crio", "cri-o"), ("docker", "docker")] {
            let text = format!(
                "11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/{scope}-{CID}.scope\n\
                 1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/{scope}-{CID}.scope\n"
            );
            assert_eq!(parse_cgroup(&text), id(true, Some(runtime)), "{scope}");
        }
    }

    #[test]
    fn cgroup_v2_both_drivers() {
        let u = UID.replace('-', "_");
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n"
        );
        assert_eq!(parse_cgroup(&systemd), id(true, Some("containerd")));
        // Guaranteed, systemd: kubepods-pod<uid>.slice.
        let guaranteed = format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-{CID}.scope\n");
        assert_eq!(parse_cgroup(&guaranteed), id(true, Some("cri-o")));
        let cgroupfs = format!("0::/kubepods/besteffort/pod{UID}/{CID}\n");
        assert_eq!(parse_cgroup(&cgroupfs), id(true, None));
        // kind: the kubelet in a node container nests its slices under kubelet.slice.
        let kind = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope\n"
        );
        assert_eq!(parse_cgroup(&kind), id(true, Some("containerd")));
        // Read from a container with a private cgroup namespace: the path climbs out first.
        let climbed = format!("0::/../../kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(parse_cgroup(&climbed), id(true, Some("containerd")));
    }

    #[test]
    fn cgroup_of_pod_without_container_and_static_pods() {
        // The pod's own cgroup (the pause process with some runtimes, or conmon): pod, no container.
        let u = UID.replace('-', "_");
        let conmon = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-conmon-{CID}.scope\n"
        );
        assert_eq!(parse_cgroup(&conmon), id(false, None));
        assert_eq!(parse_cgroup(&format!("0::/kubepods/burstable/pod{UID}\n")), id(false, None));
        // Static pods: the UID is the 32-hex config hash.
        let hash = "6f3b1c2a9d8e7f6a5b4c3d2e1f0a9b8c";
        let got = parse_cgroup(&format!("0::/kubepods/burstable/pod{hash}/{CID}\n")).unwrap();
        assert_eq!(got.pod_uid, hash);
        // Mixed v1 hierarchies: one names the container, another only the pod; the container wins.
        let mixed = format!("3:memory:/kubepods/pod{UID}\n2:cpu:/kubepods/pod{UID}/{CID}\n");
        assert_eq!(parse_cgroup(&mixed), id(true, None));
    }

    #[test]
    fn cgroup_not_in_a_pod() {
        for text in [
            "0::/system.slice/nvidia-persistenced.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "12:memory:/docker/9b2f6a0c1d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c\n",
            // Looks like a pod segment, is not a UID.
            "0::/kubepods/burstable/podcast\n",
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice\n",
            "",
            "garbage without colons\n",
        ] {
            assert_eq!(parse_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn start_time_after_the_command_name() {
        let stat = "4242 (python3 -m (vllm)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 50 10 0 0 20 0 12 0 987654 1000000 500 18446744073709551615";
        assert_eq!(parse_starttime(stat), Some(987654));
        assert_eq!(parse_starttime("4242 (x) S 1 2"), None);
        assert_eq!(parse_starttime("no parens"), None);
    }

    fn write_proc(root: &std::path::Path, pid: u32, cgroup: &str, start: Option<u64>) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
        match start {
            Some(s) => {
                std::fs::write(d.join("stat"), format!("{pid} (vllm) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {s} 0 0"))
                    .unwrap()
            }
            None => {
                let _ = std::fs::remove_file(d.join("stat"));
            }
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("inferwatch-cgroup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn cache_rereads_a_reused_pid() {
        let root = tmp("reuse");
        let other = "0::/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555\n";
        write_proc(&root, 7, &format!("0::/kubepods/pod{UID}/{CID}\n"), Some(100));
        let mut c = PidCache::new(&root, 16, Duration::from_secs(3600));
        let Lookup::Pod(first) = c.lookup(7) else { panic!("not found") };
        assert_eq!(first.pod_uid, UID);
        // Same start time: answered from the cache even though the file changed.
        write_proc(&root, 7, other, Some(100));
        assert_eq!(c.lookup(7), Lookup::Pod(first));
        assert_eq!(c.counts().reads, 1);
        // The pid is reused by another process (new start time): read again.
        write_proc(&root, 7, other, Some(200));
        let Lookup::Pod(second) = c.lookup(7) else { panic!("not found") };
        assert_eq!(second.pod_uid, "11111111-2222-3333-4444-555555555555");
        assert_eq!((c.counts().reads, c.counts().pid_reused), (2, 1));
        // A host process, then one that is gone.
        write_proc(&root, 8, "0::/system.slice/sshd.service\n", Some(5));
        assert_eq!(c.lookup(8), Lookup::NotInPod);
        assert_eq!(c.lookup(9), Lookup::Unreadable);
        assert_eq!(c.counts().unreadable, 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cache_without_start_times_expires_and_is_bounded() {
        let root = tmp("ttl");
        write_proc(&root, 1, &format!("0::/kubepods/pod{UID}\n"), None);
        let mut c = PidCache::new(&root, 2, Duration::ZERO);
        assert!(matches!(c.lookup(1), Lookup::Pod(_)));
        // No start time and a zero ttl: every lookup reads again, so a changed file shows.
        write_proc(&root, 1, "0::/system.slice/x.service\n", None);
        assert_eq!(c.lookup(1), Lookup::NotInPod);
        assert_eq!(c.counts().reads, 2);
        // Capacity 2: the least recently used of three goes.
        let mut c = PidCache::new(&root, 2, Duration::from_secs(3600));
        for pid in [1, 2, 3] {
            write_proc(&root, pid, &format!("0::/kubepods/pod{UID}\n"), Some(u64::from(pid)));
        }
        c.lookup(1);
        c.lookup(2);
        c.lookup(1);
        c.lookup(3);
        assert_eq!((c.len(), c.counts().evicted), (2, 1));
        let reads = c.counts().reads;
        c.lookup(1);
        assert_eq!(c.counts().reads, reads, "pid 1 was used last: kept");
        c.lookup(2);
        assert_eq!(c.counts().reads, reads + 1, "pid 2 was evicted: read again");
        let _ = std::fs::remove_dir_all(&root);
    }
}
