//! Processor `memory_limiter`: refuses new data while the process's memory is above the soft limit.
//!
//! Every `check_interval` it reads the resident set size. Above the soft limit
//! (`limit - spike_limit`) it first asks the allocator to return free memory to the system and
//! measures again; if still above, each `consume` is refused with a retryable
//! [`RefuseReason::MemoryLimit`] (gRPC RESOURCE_EXHAUSTED / HTTP 429 at the receiver); once
//! memory falls below the soft limit, data flows again.
//!
//! The bytes the listeners are decompressing or hold decompressed
//! ([`inferwatch_core::server::inflate::inflight_bytes`]) count on top of the last reading at
//! every `consume`, so a burst of compressed requests is refused before it shows in the RSS.

use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, CreateContext, FieldError, Node, NodeRef, ProcessorFactory, parse_config,
};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef, RefuseReason};
use inferwatch_core::pdata::{Payload, Signal};
use inferwatch_core::settings::GoDuration;
use inferwatch_core::telemetry::{ProcessorMetrics, process};
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

const MIB: u64 = 1024 * 1024;

/// Settings of `memory_limiter` (otelcol's keys).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryLimiterConfig {
    /// How often memory is measured (required, > 0).
    pub check_interval: GoDuration,
    /// Hard limit in MiB.
    pub limit_mib: u64,
    /// Headroom below the hard limit in MiB (default 20 % of the limit).
    pub spike_limit_mib: u64,
    /// Hard limit as a percentage of the cgroup (or total) memory.
    pub limit_percentage: u64,
    /// Headroom as a percentage of the cgroup (or total) memory.
    pub spike_limit_percentage: u64,
}

/// Hard and soft limits in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Above this the allocator is asked to release memory.
    pub hard: u64,
    /// Above this new data is refused.
    pub soft: u64,
}

impl MemoryLimiterConfig {
    /// Checks the settings as otelcol does.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.check_interval.0.is_zero() {
            return Err(FieldError::at("check_interval", "must be greater than zero (e.g. 1s)"));
        }
        if self.limit_mib == 0 && self.limit_percentage == 0 {
            return Err(FieldError::at("limit_mib", "set limit_mib or limit_percentage"));
        }
        if self.limit_mib > 0 && self.spike_limit_mib >= self.limit_mib {
            return Err(FieldError::at("spike_limit_mib", "must be smaller than limit_mib"));
        }
        if self.limit_mib > u64::MAX / MIB {
            return Err(FieldError::at("limit_mib", "is too large"));
        }
        if self.limit_percentage > 100 {
            return Err(FieldError::at("limit_percentage", "must be between 1 and 100"));
        }
        if self.limit_percentage > 0 && self.spike_limit_percentage >= self.limit_percentage {
            return Err(FieldError::at("spike_limit_percentage", "must be smaller than limit_percentage"));
        }
        Ok(())
    }

    /// Resolves the limits, reading the cgroup limit (or total memory) for percentages.
    pub fn limits(&self) -> Limits {
        if self.limit_mib > 0 {
            let hard = self.limit_mib * MIB;
            let spike = if self.spike_limit_mib > 0 { self.spike_limit_mib * MIB } else { hard / 5 };
            return Limits { hard, soft: hard - spike };
        }
        let total = available_memory();
        let hard = total / 100 * self.limit_percentage;
        let spike = if self.spike_limit_percentage > 0 { total / 100 * self.spike_limit_percentage } else { hard / 5 };
        Limits { hard, soft: hard.saturating_sub(spike) }
    }
}

/// The cgroup v2 / v1 memory limit, or the machine's total memory.
pub fn available_memory() -> u64 {
    let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .find(|&v| v > 0 && v < (1 << 60));
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    match (cgroup, total) {
        (Some(c), Some(t)) => c.min(t),
        (Some(c), None) => c,
        (None, Some(t)) => t,
        (None, None) => 0,
    }
}

/// Factory of `memory_limiter`.
pub struct MemoryLimiterFactory;

impl ProcessorFactory for MemoryLimiterFactory {
    fn type_name(&self) -> &'static str {
        "memory_limiter"
    }
    fn signals(&self) -> &'static [Signal] {
        &Signal::ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        let c: MemoryLimiterConfig = parse_config(cfg)?;
        c.check()?;
        Ok(Arc::new(c))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<MemoryLimiterConfig>(parsed)?;
        let limits = c.limits();
        tracing::info!(processor = %ctx.id, hard_mib = limits.hard / MIB, soft_mib = limits.soft / MIB, "memory limiter");
        Ok(Arc::new(MemoryLimiter {
            id: ctx.id.to_string(),
            next,
            limits,
            interval: c.check_interval.0,
            state: Arc::new(State { refusing: AtomicBool::new(false), last_rss: AtomicU64::new(0) }),
            metrics: ctx.telemetry.processor(&ctx.id, signal),
            checker: parking_lot::Mutex::new(None),
            probe: Arc::new(|| process::rss_bytes().unwrap_or(0)),
        }))
    }
}

struct State {
    refusing: AtomicBool,
    last_rss: AtomicU64,
}

/// The running processor.
pub struct MemoryLimiter {
    id: String,
    next: ConsumerRef,
    limits: Limits,
    interval: Duration,
    state: Arc<State>,
    metrics: ProcessorMetrics,
    checker: parking_lot::Mutex<Option<JoinHandle<()>>>,
    probe: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl MemoryLimiter {
    /// Measures once and updates the refusing state; returns the reading.
    fn check(&self) -> u64 {
        check_once(&self.state, self.limits, &*self.probe, &self.id)
    }
}

fn check_once(state: &State, limits: Limits, probe: &(dyn Fn() -> u64 + Send + Sync), id: &str) -> u64 {
    let inflating = inferwatch_core::server::inflate::inflight_bytes() as u64;
    let mut rss = probe();
    if rss.saturating_add(inflating) > limits.soft {
        // Freed memory may still be held by the allocator: hand it back, then measure again.
        process::release_free_memory();
        rss = probe();
    }
    state.last_rss.store(rss, Ordering::Relaxed);
    let was = state.refusing.load(Ordering::Relaxed);
    let now = rss.saturating_add(inflating) > limits.soft;
    if now != was {
        state.refusing.store(now, Ordering::Relaxed);
        if now {
            tracing::warn!(processor = %id, rss_mib = rss / MIB, soft_mib = limits.soft / MIB,
                "memory usage is above the soft limit; refusing data");
        } else {
            tracing::info!(processor = %id, rss_mib = rss / MIB, "memory usage back within limits; accepting data");
        }
    }
    rss
}

#[async_trait]
impl Consumer for MemoryLimiter {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        let inflating = inferwatch_core::server::inflate::inflight_bytes() as u64;
        let over = self.state.last_rss.load(Ordering::Relaxed).saturating_add(inflating) > self.limits.soft;
        if self.state.refusing.load(Ordering::Relaxed) || over {
            let n = data.item_count() as u64;
            self.metrics.refused.inc_by(n);
            return Err(ConsumeError::refused(
                RefuseReason::MemoryLimit,
                Some(self.interval.max(Duration::from_secs(1))),
                format!(
                    "memory usage {} MiB (with {} MiB being decompressed) is above the soft limit {} MiB",
                    (self.state.last_rss.load(Ordering::Relaxed) + inflating) / MIB,
                    inflating / MIB,
                    self.limits.soft / MIB
                ),
            ));
        }
        self.next.consume(data).await
    }
}

#[async_trait]
impl Node for MemoryLimiter {
    async fn start(&self) -> Result<(), ComponentError> {
        self.check();
        let state = self.state.clone();
        let (limits, interval, probe, id) = (self.limits, self.interval, self.probe.clone(), self.id.clone());
        let h = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                check_once(&state, limits, &*probe, &id);
            }
        });
        *self.checker.lock() = Some(h);
        Ok(())
    }

    async fn shutdown(&self, _deadline: Instant) -> u64 {
        if let Some(h) = self.checker.lock().take() {
            h.abort();
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::ComponentId;
    use inferwatch_core::telemetry::Telemetry;

    struct Sink;
    #[async_trait]
    impl Consumer for Sink {
        async fn consume(&self, _d: Payload) -> Result<(), ConsumeError> {
            Ok(())
        }
    }

    fn limiter(probe: Arc<dyn Fn() -> u64 + Send + Sync>) -> MemoryLimiter {
        let t = Telemetry::new();
        let id = ComponentId::parse("memory_limiter").unwrap();
        MemoryLimiter {
            id: id.to_string(),
            next: Arc::new(Sink),
            limits: MemoryLimiterConfig {
                check_interval: GoDuration(Duration::from_secs(1)),
                limit_mib: 100,
                ..Default::default()
            }
            .limits(),
            interval: Duration::from_secs(1),
            state: Arc::new(State { refusing: AtomicBool::new(false), last_rss: AtomicU64::new(0) }),
            metrics: t.processor(&id, Signal::Traces),
            checker: parking_lot::Mutex::new(None),
            probe,
        }
    }

    #[tokio::test]
    async fn refuses_above_soft_limit_and_recovers() {
        let rss = Arc::new(AtomicU64::new(10 * MIB));
        let r2 = rss.clone();
        let l = limiter(Arc::new(move || r2.load(Ordering::SeqCst)));
        assert_eq!(l.limits, Limits { hard: 100 * MIB, soft: 80 * MIB });
        l.check();
        assert!(l.consume(Payload::empty(Signal::Traces)).await.is_ok());
        rss.store(85 * MIB, Ordering::SeqCst);
        l.check();
        let e = l.consume(Payload::empty(Signal::Traces)).await.unwrap_err();
        assert!(matches!(e, ConsumeError::Refused { reason: RefuseReason::MemoryLimit, retry_after: Some(_), .. }));
        rss.store(50 * MIB, Ordering::SeqCst);
        l.check();
        assert!(l.consume(Payload::empty(Signal::Traces)).await.is_ok());
    }

    #[tokio::test]
    async fn bytes_being_decompressed_count_towards_the_limit() {
        // 70 MiB RSS is under the 80 MiB soft limit; 20 MiB being inflated puts it over.
        let l = limiter(Arc::new(|| 70 * MIB));
        l.check();
        assert!(l.consume(Payload::empty(Signal::Traces)).await.is_ok());
        let budget = inferwatch_core::server::inflate::global();
        let mut r = budget.reservation();
        r.grow(20 * MIB as usize, Duration::ZERO).await.unwrap();
        let e = l.consume(Payload::empty(Signal::Traces)).await.unwrap_err();
        assert!(e.to_string().contains("being decompressed"), "{e}");
        drop(r);
        assert!(l.consume(Payload::empty(Signal::Traces)).await.is_ok());
    }

    #[test]
    fn config_rules() {
        let f = MemoryLimiterFactory;
        assert!(f.validate(&serde_json::json!({"check_interval": "1s", "limit_mib": 512})).is_ok());
        let e = f.validate(&serde_json::json!({"limit_mib": 512})).unwrap_err();
        assert_eq!(e.path, vec![inferwatch_core::component::PathSeg::Key("check_interval".into())]);
        assert!(f.validate(&serde_json::json!({"check_interval": "1s"})).is_err());
        assert!(
            f.validate(&serde_json::json!({"check_interval": "1s", "limit_mib": 100, "spike_limit_mib": 100})).is_err()
        );
        let p = MemoryLimiterConfig {
            check_interval: GoDuration(Duration::from_secs(1)),
            limit_percentage: 50,
            ..Default::default()
        };
        let l = p.limits();
        assert!(l.hard > 0 && l.soft < l.hard);
    }
}
