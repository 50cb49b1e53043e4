//! Service discovery for the `prometheus` receiver: `file_sd_configs`, `http_sd_configs` and
//! `kubernetes_sd_configs` (roles `pod` and `endpoints`), each producing Prometheus target
//! groups. Every provider publishes its whole current set into its [`Slot`]; the job's target
//! manager (`super::targets`) is woken, relabels the union and starts / stops scrape loops.

pub mod file;
pub mod http;
pub mod kubernetes;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Notify;

/// Most target groups one provider may publish; more are cut (and counted).
pub const MAX_GROUPS: usize = 100_000;
/// Most targets in one provider's groups together; more are cut (and counted).
pub const MAX_PROVIDER_TARGETS: usize = 100_000;

/// A Prometheus target group: targets (each a label set with `__address__`) sharing labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetGroup {
    /// Where the group comes from (file and index, URL and index, pod uid).
    pub source: String,
    /// Each target's own labels (at least `__address__`).
    pub targets: Vec<BTreeMap<String, String>>,
    /// Labels of every target of the group (targets' own labels win).
    pub labels: BTreeMap<String, String>,
}

/// `{targets: [...], labels: {...}}` as file and HTTP discovery read it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroup {
    /// `host:port` of each target.
    #[serde(default)]
    pub targets: Vec<String>,
    /// The group's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl RawGroup {
    /// The group with its source and the provider's `__meta_*` label.
    pub fn into_group(self, source: String, meta: (&str, &str)) -> TargetGroup {
        let mut labels = self.labels;
        labels.insert(meta.0.to_string(), meta.1.to_string());
        TargetGroup {
            source,
            targets: self.targets.into_iter().map(|t| BTreeMap::from([("__address__".to_string(), t)])).collect(),
            labels,
        }
    }
}

/// Where the providers of one job publish; the manager reads every slot on each wake-up.
#[derive(Clone)]
pub struct Slots {
    inner: Arc<Mutex<Vec<Option<Vec<TargetGroup>>>>>,
    notify: Arc<Notify>,
}

impl Slots {
    /// `n` empty slots (`None`: the provider has not published yet).
    pub fn new(n: usize) -> Self {
        Slots { inner: Arc::new(Mutex::new(vec![None; n])), notify: Arc::new(Notify::new()) }
    }

    /// The slot of provider `i`.
    pub fn slot(&self, i: usize) -> Slot {
        Slot { slots: self.clone(), index: i }
    }

    /// Every published group.
    pub fn snapshot(&self) -> Vec<TargetGroup> {
        self.inner.lock().iter().flatten().flatten().cloned().collect()
    }

    /// Waits until a provider publishes.
    pub async fn changed(&self) {
        self.notify.notified().await
    }
}

/// One provider's place in [`Slots`].
#[derive(Clone)]
pub struct Slot {
    slots: Slots,
    index: usize,
}

impl Slot {
    /// Replaces the provider's groups (cut to the bounds; returns how many targets were cut).
    pub fn publish(&self, mut groups: Vec<TargetGroup>) -> usize {
        let mut cut = 0;
        if groups.len() > MAX_GROUPS {
            cut += groups[MAX_GROUPS..].iter().map(|g| g.targets.len()).sum::<usize>();
            groups.truncate(MAX_GROUPS);
        }
        let mut total = 0usize;
        for g in &mut groups {
            let room = MAX_PROVIDER_TARGETS.saturating_sub(total);
            if g.targets.len() > room {
                cut += g.targets.len() - room;
                g.targets.truncate(room);
            }
            total += g.targets.len();
        }
        if let Some(s) = self.slots.inner.lock().get_mut(self.index) {
            *s = Some(groups);
        }
        self.slots.notify.notify_one();
        cut
    }
}

/// Replaces characters that may not appear in a legacy label name with `_` (Prometheus'
/// `strutil.SanitizeLabelName`, used for `__meta_*_label_<name>`).
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// What a provider needs besides its settings: who to count failures against.
#[derive(Clone)]
pub struct SdContext {
    /// The job name.
    pub job: String,
    /// Self-telemetry.
    pub telemetry: Arc<inferwatch_core::telemetry::Telemetry>,
}

impl SdContext {
    /// Counts a discovery failure in `inferwatch_scrape_failures{job, target="<mechanism>_sd", reason}`.
    pub fn failed(&self, mechanism: &str, reason: &str) {
        super::SCRAPE_FAILURES.get(&self.telemetry, [&self.job, &format!("{mechanism}_sd"), reason]).inc();
    }
}

/// A duration as Prometheus' `model.Duration` prints it (`1m`, `15s`, `1m30s`, `500ms`).
pub fn prom_duration(d: std::time::Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("y", 365 * 24 * 3_600_000u128),
        ("w", 7 * 24 * 3_600_000),
        ("d", 24 * 3_600_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}
