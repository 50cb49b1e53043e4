//! The backward as-of join: which GPUs serve an item, and their latest samples within the tolerance.

use super::config::GpuRef;
use super::store::{Field, GpuEntry, GpuStore, HostGpus};

/// How the server's GPU set is found on a host.
#[derive(Debug, Clone, Default)]
pub struct GpuSelector {
    /// Fixed set (config `gpus`, else `CUDA_VISIBLE_DEVICES`); wins when present.
    pub fixed: Option<Vec<GpuRef>>,
    /// Server pid, matched on the per-process samples.
    pub server_pid: Option<i64>,
    /// Server executable name, matched on the per-process samples.
    pub server_process: Option<String>,
}

impl GpuSelector {
    /// The GPUs of `host` serving the items: the fixed set; else the GPUs where the server process
    /// was seen; else (no process configured or seen yet) every GPU of the host.
    pub fn select<'a>(&self, host: &'a HostGpus) -> Vec<&'a GpuEntry> {
        let gpus = host.gpus();
        if let Some(refs) = &self.fixed {
            return gpus.iter().filter(|g| refs.iter().any(|r| r.matches(g.uuid.as_deref(), g.index))).collect();
        }
        let by_process = host.process_gpus(self.server_pid, self.server_process.as_deref());
        if !by_process.is_empty() {
            return by_process.into_iter().filter_map(|i| gpus.get(i)).collect();
        }
        gpus.iter().collect()
    }
}

/// What the join adds to one item; each measurement only where some GPU had a sample of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Enrichment {
    /// Memory used, bytes, summed over the joined GPUs.
    pub memory_used: Option<i64>,
    /// Utilisation, mean over the joined GPUs.
    pub utilization: Option<f64>,
    /// Power draw, W, summed over the joined GPUs.
    pub power: Option<f64>,
    /// True when any joined GPU was throttled.
    pub throttled: Option<bool>,
    /// GPUs with at least one sample within the tolerance.
    pub count: usize,
}

/// Combines per-GPU values (in [`Field::ALL`] order) into one enrichment; `None` when no GPU had any.
pub fn aggregate<I: IntoIterator<Item = [Option<f64>; 4]>>(per_gpu: I) -> Option<Enrichment> {
    let (mut mem, mut util, mut power, mut thr) = (None::<f64>, (0.0, 0usize), None::<f64>, None::<bool>);
    let mut count = 0;
    for v in per_gpu {
        if v.iter().all(Option::is_none) {
            continue;
        }
        count += 1;
        if let Some(m) = v[Field::MemoryUsed.index()] {
            mem = Some(mem.unwrap_or(0.0) + m);
        }
        if let Some(u) = v[Field::Utilization.index()] {
            util = (util.0 + u, util.1 + 1);
        }
        if let Some(p) = v[Field::Power.index()] {
            power = Some(power.unwrap_or(0.0) + p);
        }
        if let Some(t) = v[Field::Throttled.index()] {
            thr = Some(thr.unwrap_or(false) || t > 0.0);
        }
    }
    (count > 0).then(|| Enrichment {
        memory_used: mem.map(|m| m.round() as i64),
        utilization: (util.1 > 0).then(|| util.0 / util.1 as f64),
        power,
        throttled: thr,
        count,
    })
}

/// Joins the item at event time `t` on `host`: for each selected GPU and measurement, the latest
/// sample with `ts ≤ t` and `t − ts ≤ tolerance`. `None` when no GPU had one.
pub fn join(store: &GpuStore, selector: &GpuSelector, host: &str, t: u64, tolerance: u64) -> Option<Enrichment> {
    let h = store.host(host)?;
    let gpus = selector.select(h);
    aggregate(gpus.into_iter().map(|g| Field::ALL.map(|f| g.ring(f).as_of(t, tolerance).map(|s| s.1))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_enrich::store::GpuIdent;

    fn store() -> GpuStore {
        let mut s = GpuStore::new(64);
        for i in 0..3 {
            let g = GpuIdent::new(Some(format!("GPU-{i}")), Some(i));
            s.insert("h", &g, Field::MemoryUsed, 100, 1000.0 * (i + 1) as f64);
            s.insert("h", &g, Field::Utilization, 100, 0.1 * (i + 1) as f64);
            s.insert("h", &g, Field::Power, 100, 100.0);
            s.insert("h", &g, Field::Throttled, 100, if i == 2 { 1.0 } else { 0.0 });
        }
        s.note_process("h", &GpuIdent::new(Some("GPU-1".into()), Some(1)), Some(42), None, 100);
        s
    }

    #[test]
    fn several_gpus_sum_mean_and_any() {
        let e = join(&store(), &GpuSelector::default(), "h", 101, 10).unwrap();
        assert_eq!(e.memory_used, Some(6000));
        assert!((e.utilization.unwrap() - 0.2).abs() < 1e-12);
        assert_eq!(e.power, Some(300.0));
        assert_eq!(e.throttled, Some(true));
        assert_eq!(e.count, 3);
        assert_eq!(join(&store(), &GpuSelector::default(), "other", 101, 10), None);
        assert_eq!(join(&store(), &GpuSelector::default(), "h", 111, 10), None);
    }

    #[test]
    fn selection_order_fixed_then_process_then_all() {
        let fixed =
            GpuSelector { fixed: Some(vec![GpuRef::Index(0), GpuRef::Uuid("GPU-2".into())]), ..Default::default() };
        let e = join(&store(), &fixed, "h", 100, 0).unwrap();
        assert_eq!((e.memory_used, e.count, e.throttled), (Some(4000), 2, Some(true)));
        let by_pid = GpuSelector { server_pid: Some(42), ..Default::default() };
        let e = join(&store(), &by_pid, "h", 100, 0).unwrap();
        assert_eq!((e.memory_used, e.count, e.throttled), (Some(2000), 1, Some(false)));
        let unseen = GpuSelector { server_pid: Some(9), ..Default::default() };
        assert_eq!(join(&store(), &unseen, "h", 100, 0).unwrap().count, 3, "pid not seen: every GPU");
        let none = GpuSelector { fixed: Some(vec![GpuRef::Index(7)]), ..Default::default() };
        assert_eq!(join(&store(), &none, "h", 100, 0), None);
    }
}
