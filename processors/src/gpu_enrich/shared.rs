//! One sample store per component id and running graph, shared by every pipeline instance of it.
//!
//! The graph builds a processor once per pipeline, so the instance in the metrics pipeline (which
//! sees the GPU samples) and the one in the traces pipeline (which enriches spans) are different
//! objects. They find their common store here, keyed by the graph's [`Host`] and the component id;
//! entries die with the graph (weak references) and the map is bounded.

use super::store::GpuStore;
use inferwatch_core::component::ComponentId;
use inferwatch_core::host::Host;
use inferwatch_core::pdata::Signal;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

/// Stores held at most (live graphs × gpu_enrich ids); beyond it an instance gets a private store.
pub const MAX_SHARED: usize = 4096;

/// `inferwatch_gpu_enrich_items{processor, data_type, result}`: items gpu_enrich saw, matched or not.
pub const GPU_ENRICH_ITEMS: inferwatch_core::telemetry::Counters<3> = inferwatch_core::telemetry::Counters::new(
    "inferwatch_gpu_enrich_items",
    "Items gpu_enrich saw, by processor, signal and result (matched, unmatched)",
    ["processor", "data_type", "result"],
);

/// Items joined and not joined, per signal.
#[derive(Debug, Default)]
pub struct JoinCounts {
    spans_matched: AtomicU64,
    spans_unmatched: AtomicU64,
    points_matched: AtomicU64,
    points_unmatched: AtomicU64,
    /// `inferwatch_gpu_enrich_items_total` counters, once attached: traces matched/unmatched, metrics matched/unmatched.
    exported: std::sync::OnceLock<[prometheus_client::metrics::counter::Counter; 4]>,
}

impl JoinCounts {
    /// Counts one item of `signal`.
    pub fn count(&self, signal: Signal, matched: bool) {
        let c = match (signal, matched) {
            (Signal::Traces, true) => &self.spans_matched,
            (Signal::Traces, false) => &self.spans_unmatched,
            (_, true) => &self.points_matched,
            (_, false) => &self.points_unmatched,
        };
        c.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = self.exported.get() {
            let i = match (signal, matched) {
                (Signal::Traces, true) => 0,
                (Signal::Traces, false) => 1,
                (_, true) => 2,
                (_, false) => 3,
            };
            e[i].inc();
        }
    }

    /// Exports the counts as `inferwatch_gpu_enrich_items_total{processor, data_type, result}` (first call wins).
    pub fn attach(&self, telemetry: &inferwatch_core::telemetry::Telemetry, id: &ComponentId) {
        let id = id.to_string();
        let c = |s: Signal, result: &str| GPU_ENRICH_ITEMS.get(telemetry, [&id, s.as_str(), result]);
        let _ = self.exported.set([
            c(Signal::Traces, "matched"),
            c(Signal::Traces, "unmatched"),
            c(Signal::Metrics, "matched"),
            c(Signal::Metrics, "unmatched"),
        ]);
    }

    /// Items of `signal` enriched so far.
    pub fn matched(&self, signal: Signal) -> u64 {
        match signal {
            Signal::Traces => self.spans_matched.load(Ordering::Relaxed),
            _ => self.points_matched.load(Ordering::Relaxed),
        }
    }

    /// Items of `signal` passed on unchanged because no GPU sample was within the tolerance.
    pub fn unmatched(&self, signal: Signal) -> u64 {
        match signal {
            Signal::Traces => self.spans_unmatched.load(Ordering::Relaxed),
            _ => self.points_unmatched.load(Ordering::Relaxed),
        }
    }
}

/// What the instances of one component share.
#[derive(Debug)]
pub struct Shared {
    /// The samples.
    pub store: RwLock<GpuStore>,
    /// Join outcomes.
    pub counts: JoinCounts,
}

impl Shared {
    /// A fresh store keeping `cap` samples per GPU and measurement.
    pub fn new(cap: usize) -> Self {
        Shared { store: RwLock::new(GpuStore::new(cap)), counts: JoinCounts::default() }
    }
}

struct Entry {
    host: Weak<Host>,
    id: ComponentId,
    shared: Weak<Shared>,
}

static REGISTRY: LazyLock<Mutex<Vec<Entry>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The store of component `id` in the graph of `host`, created (with capacity `cap`) on first use.
pub fn shared_for(host: &Arc<Host>, id: &ComponentId, cap: usize) -> Arc<Shared> {
    let mut reg = REGISTRY.lock();
    reg.retain(|e| e.host.strong_count() > 0 && e.shared.strong_count() > 0);
    let found = reg
        .iter()
        .find(|e| &e.id == id && e.host.upgrade().is_some_and(|h| Arc::ptr_eq(&h, host)))
        .and_then(|e| e.shared.upgrade());
    if let Some(s) = found {
        return s;
    }
    let s = Arc::new(Shared::new(cap));
    if reg.len() < MAX_SHARED {
        reg.push(Entry { host: Arc::downgrade(host), id: id.clone(), shared: Arc::downgrade(&s) });
    } else {
        tracing::warn!(processor = %id, "gpu_enrich: too many live stores; this instance's samples are not shared");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_graph_and_id_share_others_do_not() {
        let id = ComponentId::parse("gpu_enrich").unwrap();
        let other = ComponentId::parse("gpu_enrich/b").unwrap();
        let (h1, h2) = (Host::new(), Host::new());
        let a = shared_for(&h1, &id, 8);
        let b = shared_for(&h1, &id, 8);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &shared_for(&h2, &id, 8)));
        assert!(!Arc::ptr_eq(&a, &shared_for(&h1, &other, 8)));
        let w = Arc::downgrade(&a);
        drop((a, b));
        assert!(w.upgrade().is_none(), "the registry holds no strong reference");
        assert_eq!(Arc::strong_count(&h1), 1, "nor to the host");
    }
}
