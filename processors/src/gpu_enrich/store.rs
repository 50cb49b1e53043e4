//! The GPU sample store: per host, per GPU, one sorted ring per measurement, and which processes
//! run on which GPU (from per-process GPU memory samples).

use super::ring::{Merge, SampleRing};
use std::collections::HashMap;

/// Hosts held at most; samples of further hosts are refused.
pub const MAX_HOSTS: usize = 1024;
/// GPUs held per host at most.
pub const MAX_GPUS_PER_HOST: usize = 64;
/// Processes remembered per host at most; beyond it the least recently seen is forgotten.
pub const MAX_PROCESSES_PER_HOST: usize = 1024;

/// A GPU measurement joined to items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// Memory used, bytes.
    MemoryUsed,
    /// Utilisation, 0..1.
    Utilization,
    /// Power draw, W.
    Power,
    /// Throttled, 0 or 1.
    Throttled,
}

impl Field {
    /// Every measurement, in storage order.
    pub const ALL: [Field; 4] = [Field::MemoryUsed, Field::Utilization, Field::Power, Field::Throttled];

    /// Position in [`Field::ALL`].
    pub fn index(self) -> usize {
        match self {
            Field::MemoryUsed => 0,
            Field::Utilization => 1,
            Field::Power => 2,
            Field::Throttled => 3,
        }
    }

    /// How two samples at the same instant combine: throttle flags of several reasons OR together.
    pub fn merge(self) -> Merge {
        match self {
            Field::Throttled => Merge::Max,
            _ => Merge::Replace,
        }
    }
}

/// How a sample names its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuIdent {
    /// NVML UUID.
    pub uuid: Option<String>,
    /// NVML index.
    pub index: Option<i64>,
}

impl GpuIdent {
    /// From the attributes a sample has; neither = GPU 0 (the simulator's samples name no GPU).
    pub fn new(uuid: Option<String>, index: Option<i64>) -> Self {
        let index = if uuid.is_none() && index.is_none() { Some(0) } else { index };
        GpuIdent { uuid, index }
    }

    /// GPU `i` without a UUID.
    pub fn index(i: i64) -> Self {
        GpuIdent { uuid: None, index: Some(i) }
    }
}

/// One GPU's samples.
#[derive(Debug, Clone)]
pub struct GpuEntry {
    /// NVML UUID, once a sample named it.
    pub uuid: Option<String>,
    /// NVML index, once a sample named it.
    pub index: Option<i64>,
    rings: [SampleRing; 4],
}

impl GpuEntry {
    fn new(id: &GpuIdent, cap: usize) -> Self {
        GpuEntry { uuid: id.uuid.clone(), index: id.index, rings: std::array::from_fn(|_| SampleRing::new(cap)) }
    }

    /// The samples of one measurement.
    pub fn ring(&self, f: Field) -> &SampleRing {
        &self.rings[f.index()]
    }

    fn is(&self, id: &GpuIdent) -> bool {
        match (&self.uuid, &id.uuid) {
            (Some(a), Some(b)) => a == b,
            _ => self.index.is_some() && self.index == id.index,
        }
    }
}

#[derive(Debug, Clone)]
struct Process {
    pid: Option<i64>,
    name: Option<String>,
    gpus: Vec<usize>,
    last_seen: u64,
}

/// The GPUs and processes of one host.
#[derive(Debug, Clone, Default)]
pub struct HostGpus {
    gpus: Vec<GpuEntry>,
    processes: Vec<Process>,
}

impl HostGpus {
    /// Every GPU seen on this host, in order of first sample.
    pub fn gpus(&self) -> &[GpuEntry] {
        &self.gpus
    }

    /// Positions in [`HostGpus::gpus`] of the GPUs where a process matching `pid` and `name` (each
    /// when given) was seen using memory; empty when neither is given or none matched.
    pub fn process_gpus(&self, pid: Option<i64>, name: Option<&str>) -> Vec<usize> {
        if pid.is_none() && name.is_none() {
            return Vec::new();
        }
        let mut out: Vec<usize> = self
            .processes
            .iter()
            .filter(|p| pid.is_none_or(|x| p.pid == Some(x)) && name.is_none_or(|x| p.name.as_deref() == Some(x)))
            .flat_map(|p| p.gpus.iter().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The position of `id`, adding it when there is room.
    fn entry(&mut self, id: &GpuIdent, cap: usize) -> Option<usize> {
        let found = id
            .uuid
            .as_ref()
            .and_then(|u| self.gpus.iter().position(|g| g.uuid.as_ref() == Some(u)))
            .or_else(|| self.gpus.iter().position(|g| g.is(id)));
        if let Some(i) = found {
            let g = &mut self.gpus[i];
            if g.uuid.is_none() {
                g.uuid = id.uuid.clone();
            }
            if g.index.is_none() {
                g.index = id.index;
            }
            return Some(i);
        }
        if self.gpus.len() >= MAX_GPUS_PER_HOST {
            return None;
        }
        self.gpus.push(GpuEntry::new(id, cap));
        Some(self.gpus.len() - 1)
    }
}

/// Samples of every host and GPU seen, bounded per GPU and measurement.
#[derive(Debug, Clone)]
pub struct GpuStore {
    hosts: HashMap<String, HostGpus>,
    cap: usize,
    refused: u64,
}

impl GpuStore {
    /// An empty store keeping `cap` samples per GPU and measurement.
    pub fn new(cap: usize) -> Self {
        GpuStore { hosts: HashMap::new(), cap: cap.max(1), refused: 0 }
    }

    /// The GPUs of `host`, if any sample named it.
    pub fn host(&self, host: &str) -> Option<&HostGpus> {
        self.hosts.get(host)
    }

    /// Samples refused so far (over the host or GPU bounds, or too old for a full ring).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    fn host_mut(&mut self, host: &str) -> Option<&mut HostGpus> {
        if !self.hosts.contains_key(host) {
            if self.hosts.len() >= MAX_HOSTS {
                return None;
            }
            self.hosts.insert(host.to_string(), HostGpus::default());
        }
        self.hosts.get_mut(host)
    }

    /// Adds one sample; false when it was refused (and counted).
    pub fn insert(&mut self, host: &str, gpu: &GpuIdent, field: Field, ts: u64, value: f64) -> bool {
        let cap = self.cap;
        let kept = self
            .host_mut(host)
            .and_then(|h| {
                let i = h.entry(gpu, cap)?;
                Some(h.gpus[i].rings[field.index()].insert(ts, value, field.merge()))
            })
            .unwrap_or(false);
        if !kept {
            self.refused += 1;
        }
        kept
    }

    /// Records that process `pid` / `name` used memory on `gpu` of `host` at `ts`.
    pub fn note_process(&mut self, host: &str, gpu: &GpuIdent, pid: Option<i64>, name: Option<&str>, ts: u64) -> bool {
        let cap = self.cap;
        let Some(h) = self.host_mut(host) else {
            self.refused += 1;
            return false;
        };
        let Some(g) = h.entry(gpu, cap) else {
            self.refused += 1;
            return false;
        };
        if let Some(p) = h.processes.iter_mut().find(|p| p.pid == pid && p.name.as_deref() == name) {
            if !p.gpus.contains(&g) {
                p.gpus.push(g);
            }
            p.last_seen = p.last_seen.max(ts);
            return true;
        }
        if h.processes.len() >= MAX_PROCESSES_PER_HOST
            && let Some(oldest) = h.processes.iter().enumerate().min_by_key(|(_, p)| p.last_seen).map(|(i, _)| i)
        {
            h.processes.swap_remove(oldest);
        }
        h.processes.push(Process { pid, name: name.map(str::to_string), gpus: vec![g], last_seen: ts });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_and_index_samples_land_on_one_gpu() {
        let mut s = GpuStore::new(16);
        assert!(s.insert("h", &GpuIdent::index(1), Field::Power, 10, 100.0));
        assert!(s.insert("h", &GpuIdent::new(Some("GPU-a".into()), Some(1)), Field::Power, 20, 110.0));
        assert!(s.insert("h", &GpuIdent::new(Some("GPU-a".into()), None), Field::Power, 30, 120.0));
        assert!(s.insert("h", &GpuIdent::new(None, None), Field::Power, 30, 50.0));
        let h = s.host("h").unwrap();
        assert_eq!(h.gpus().len(), 2, "GPU 1 (learned its UUID) and GPU 0");
        assert_eq!(h.gpus()[0].uuid.as_deref(), Some("GPU-a"));
        assert_eq!(h.gpus()[0].ring(Field::Power).len(), 3);
        assert_eq!(h.gpus()[1].index, Some(0));
    }

    #[test]
    fn processes_map_to_their_gpus() {
        let mut s = GpuStore::new(4);
        s.note_process("h", &GpuIdent::index(2), Some(42), Some("vllm"), 10);
        s.note_process("h", &GpuIdent::index(3), Some(42), Some("vllm"), 10);
        s.note_process("h", &GpuIdent::index(0), Some(7), Some("other"), 10);
        let h = s.host("h").unwrap();
        let idx = |i: usize| h.gpus()[i].index;
        let by_pid: Vec<_> = h.process_gpus(Some(42), None).into_iter().map(idx).collect();
        assert_eq!(by_pid, vec![Some(2), Some(3)]);
        let by_name: Vec<_> = h.process_gpus(None, Some("other")).into_iter().map(idx).collect();
        assert_eq!(by_name, vec![Some(0)]);
        assert!(h.process_gpus(Some(42), Some("other")).is_empty());
        assert!(h.process_gpus(None, None).is_empty());
    }

    #[test]
    fn bounds_refuse_and_count() {
        let mut s = GpuStore::new(4);
        for i in 0..MAX_GPUS_PER_HOST as i64 {
            assert!(s.insert("h", &GpuIdent::index(i), Field::MemoryUsed, 1, 1.0));
        }
        assert!(!s.insert("h", &GpuIdent::index(999), Field::MemoryUsed, 1, 1.0));
        assert_eq!(s.refused(), 1);
    }
}
