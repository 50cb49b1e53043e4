//! A job's target manager: the union of its static targets and discovered groups goes through
//! Prometheus' target label pipeline ([`populate`]) and `relabel_configs`; one scrape loop runs
//! per resulting target, started and stopped as the set changes. Bounded by `target_limit`
//! (over it, the job's targets are all stopped and `reason="target_limit"` is counted, as
//! Prometheus fails them), and every loop that stops is reaped.

use super::config::{Job, TargetAddr};
use super::relabel::{LabelSet, process};
use super::sd::{Slots, TargetGroup, prom_duration};
use inferwatch_core::settings::parse_go_duration;
use inferwatch_core::telemetry::Telemetry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One target after relabeling: where and how to scrape it, and its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeTarget {
    /// Identity (URL and labels): a target whose key is unchanged keeps its loop.
    pub key: String,
    /// The exposition URL.
    pub url: reqwest::Url,
    /// The TGI `/info` URL.
    pub info_url: reqwest::Url,
    /// `host:port`.
    pub addr: TargetAddr,
    /// `http` or `https`.
    pub scheme: String,
    /// Time between scrapes.
    pub interval: Duration,
    /// Most time a scrape may take.
    pub timeout: Duration,
    /// The `job` label (empty when relabeling removed it).
    pub job: String,
    /// The `instance` label.
    pub instance: String,
    /// The other labels, sorted.
    pub labels: Vec<(String, String)>,
}

fn has_port(addr: &str) -> bool {
    match addr.strip_prefix('[') {
        Some(rest) => rest.contains("]:"),
        None => addr.contains(':'),
    }
}

/// Prometheus' `PopulateLabels`: the group's and target's labels, the job's defaults (`job`,
/// `__scheme__`, `__metrics_path__`, `__scrape_interval__`, `__scrape_timeout__`,
/// `__param_<name>`), `relabel_configs`, then the checks and `instance`; `__`-labels are removed.
/// `Ok(None)`: relabeling dropped the target.
pub fn populate(
    job: &Job,
    group: &BTreeMap<String, String>,
    target: &BTreeMap<String, String>,
) -> Result<Option<ScrapeTarget>, String> {
    let mut l: LabelSet = group.clone();
    for (k, v) in target {
        l.insert(k.clone(), v.clone());
    }
    let defaults = [
        ("job", job.name.clone()),
        ("__scheme__", job.scheme.clone()),
        ("__metrics_path__", job.metrics_path.clone()),
        ("__scrape_interval__", prom_duration(job.interval)),
        ("__scrape_timeout__", prom_duration(job.timeout)),
    ];
    for (k, v) in defaults {
        l.entry(k.to_string()).or_insert(v);
    }
    for (k, vs) in &job.param_map {
        if let Some(v) = vs.first() {
            l.entry(format!("__param_{k}")).or_insert_with(|| v.clone());
        }
    }
    if !process(&mut l, &job.relabel) {
        return Ok(None);
    }
    let address = l.get("__address__").cloned().unwrap_or_default();
    if address.is_empty() {
        return Err("no address (__address__ is empty after relabeling)".into());
    }
    let scheme = l.get("__scheme__").cloned().unwrap_or_default();
    if scheme != "http" && scheme != "https" {
        return Err(format!("{address}: __scheme__ {scheme:?} is not http or https"));
    }
    let address =
        if has_port(&address) { address } else { format!("{address}:{}", if scheme == "https" { 443 } else { 80 }) };
    let addr = TargetAddr::parse(&address)?;
    let dur = |k: &str, d: Duration| -> Result<Duration, String> {
        match l.get(k) {
            None => Ok(d),
            Some(v) => match parse_go_duration(v) {
                Ok(x) if !x.is_zero() => Ok(x),
                _ => Err(format!("{address}: {k} {v:?} is not a positive duration")),
            },
        }
    };
    let interval = dur("__scrape_interval__", job.interval)?;
    let timeout = dur("__scrape_timeout__", job.timeout)?;
    if timeout > interval {
        return Err(format!("{address}: scrape timeout {timeout:?} is greater than the interval {interval:?}"));
    }
    let path = l.get("__metrics_path__").cloned().unwrap_or_else(|| "/metrics".into());
    let mut params = job.param_map.clone();
    for (k, v) in &l {
        if let Some(name) = k.strip_prefix("__param_") {
            let e = params.entry(name.to_string()).or_default();
            match e.first_mut() {
                Some(first) => *first = v.clone(),
                None => e.push(v.clone()),
            }
        }
    }
    let path = if path.starts_with('/') { path } else { format!("/{path}") };
    let mut url = reqwest::Url::parse(&format!("{scheme}://{}{path}", addr.instance()))
        .map_err(|e| format!("{address}: not usable in a URL: {e}"))?;
    if params.values().any(|v| !v.is_empty()) {
        let mut q = url.query_pairs_mut();
        for (k, vs) in &params {
            for v in vs {
                q.append_pair(k, v);
            }
        }
    }
    let info_url = reqwest::Url::parse(&format!("{scheme}://{}/info", addr.instance()))
        .map_err(|e| format!("{address}: not usable in a URL: {e}"))?;
    if !l.contains_key("instance") {
        l.insert("instance".into(), address.clone());
    }
    l.retain(|k, v| !k.starts_with("__") && !v.is_empty());
    let job_label = l.remove("job").unwrap_or_default();
    let instance = l.remove("instance").unwrap_or_default();
    let labels: Vec<(String, String)> = l.into_iter().collect();
    let mut key = format!("{url}\u{0}{job_label}\u{0}{instance}");
    for (k, v) in &labels {
        key.push('\u{0}');
        key.push_str(k);
        key.push('=');
        key.push_str(v);
    }
    Ok(Some(ScrapeTarget { key, url, info_url, addr, scheme, interval, timeout, job: job_label, instance, labels }))
}

/// Counts running scrape loops: +1 while the guard lives.
pub struct LoopGuard(Arc<AtomicUsize>);

impl LoopGuard {
    /// Counts one more loop.
    pub fn new(n: Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        LoopGuard(n)
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts the loop of one target; returns its task.
pub type Spawn = Box<dyn Fn(&ScrapeTarget, CancellationToken) -> Option<JoinHandle<()>> + Send + Sync>;

/// One job's target manager.
pub struct Manager {
    /// The job.
    pub job: Arc<Job>,
    /// Static targets as groups.
    pub static_groups: Vec<TargetGroup>,
    /// Where the job's providers publish.
    pub slots: Slots,
    /// Starts a loop.
    pub spawn: Spawn,
    /// Self-telemetry.
    pub telemetry: Arc<Telemetry>,
    /// Number of targets now scraped (for tests and logs).
    pub targets: Arc<AtomicUsize>,
    /// Set when the receiver stops.
    pub cancel: CancellationToken,
}

/// How long stopping loops get at shutdown.
const GRACE: Duration = Duration::from_secs(2);

impl Manager {
    /// The targets wanted now.
    fn wanted(&self) -> BTreeMap<String, ScrapeTarget> {
        let mut out = BTreeMap::new();
        let discovered = self.slots.snapshot();
        for g in self.static_groups.iter().chain(&discovered) {
            for t in &g.targets {
                match populate(&self.job, &g.labels, t) {
                    Ok(Some(st)) => {
                        out.insert(st.key.clone(), st);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        super::SCRAPE_FAILURES
                            .get(&self.telemetry, [&self.job.name, &g.source, "invalid_target"])
                            .inc();
                        tracing::debug!(job = %self.job.name, source = %g.source, error = %e, "target refused");
                    }
                }
            }
        }
        out
    }

    /// Runs until cancelled, then stops every loop.
    pub async fn run(self) {
        let mut running: HashMap<String, (CancellationToken, JoinHandle<()>)> = HashMap::new();
        let mut stopping: Vec<JoinHandle<()>> = Vec::new();
        let mut over_limit = false;
        loop {
            let mut wanted = self.wanted();
            if wanted.len() > self.job.target_limit {
                super::SCRAPE_FAILURES.get(&self.telemetry, [&self.job.name, "", "target_limit"]).inc();
                if !over_limit {
                    tracing::warn!(job = %self.job.name, targets = wanted.len(), limit = self.job.target_limit,
                        "target_limit exceeded: none of the job's targets is scraped");
                }
                over_limit = true;
                wanted.clear();
            } else {
                over_limit = false;
            }
            let gone: Vec<String> = running.keys().filter(|k| !wanted.contains_key(*k)).cloned().collect();
            for k in gone {
                if let Some((c, h)) = running.remove(&k) {
                    c.cancel();
                    stopping.push(h);
                }
            }
            stopping.retain(|h| !h.is_finished());
            for (k, t) in wanted {
                if running.contains_key(&k) {
                    continue;
                }
                let c = self.cancel.child_token();
                if let Some(h) = (self.spawn)(&t, c.clone()) {
                    running.insert(k, (c, h));
                }
            }
            self.targets.store(running.len(), Ordering::SeqCst);
            tracing::debug!(job = %self.job.name, targets = running.len(), "targets synced");
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = self.slots.changed() => {}
            }
        }
        let deadline = tokio::time::Instant::now() + GRACE;
        for (_, (c, h)) in running.drain() {
            c.cancel();
            stopping.push(h);
        }
        for mut h in stopping {
            if tokio::time::timeout_at(deadline, &mut h).await.is_err() {
                tracing::warn!(job = %self.job.name, "a scrape loop did not stop in time; abandoning it");
                h.abort();
            }
        }
        self.targets.store(0, Ordering::SeqCst);
    }
}
