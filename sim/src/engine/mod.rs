//! The discrete-event model of a continuous-batching engine (vLLM V1-like), driven by an
//! explicit clock in nanoseconds: nothing inside reads the wall clock.
//!
//! Model: requests wait in a FCFS queue; each step the scheduler first gives the running
//! batch its tokens (one per decoding sequence, a chunk per prefilling one) and then admits
//! waiting requests while `max_num_seqs`, the step's token budget (`max_num_batched_tokens`,
//! chunked prefill) and the KV block pool allow. KV memory is a paged pool of
//! `block_size`-token blocks ([`kv::BlockPool`]); when a running sequence needs a block and
//! none is free, the most recently admitted sequence is preempted (its blocks freed, its
//! KV recomputed later). A step's duration comes from [`cost::CostModel`]; its tokens are
//! emitted at its end. Prefix caching ([`prefix::PrefixCache`]) skips the computation of
//! cached prompt prefixes. Faults ([`crate::faults`]) modify cost, allocator and scheduler.
//!
//! Driving it (real time or simulated time alike):
//!
//! ```
//! use inferwatch_sim::engine::{Engine, EngineConfig, EngineEvent, RequestSpec};
//! let mut engine = Engine::new(EngineConfig::default()).unwrap();
//! engine.submit(RequestSpec::new(1, 0, 512, 16)).unwrap();
//! let mut events = Vec::new();
//! while let Some(t) = engine.next_event_time() {
//!     engine.advance_to(t, &mut events); // a real-time driver sleeps until t first
//! }
//! assert!(matches!(events.last(), Some(EngineEvent::Finished { .. })));
//! ```

pub mod config;
pub mod cost;
pub mod event;
pub mod kv;
pub mod prefix;
pub mod request;
pub mod stats;
mod step;
pub mod time;
pub mod tokens;

use std::collections::{HashSet, VecDeque};

pub use config::{EngineConfig, GpuProfile, ModelProfile, NamedOr};
pub use event::{EngineEvent, RejectReason, StepInfo};
pub use kv::{BlockPool, KvSnapshot, allocation_check};
pub use request::{FinishReason, PromptPrefix, RequestId, RequestRecord, RequestSpec};
pub use stats::EngineStats;
pub use time::{NANOS_PER_DAY, NANOS_PER_SEC, Nanos, SimDuration};

use crate::faults::{FaultEffects, FaultSet};
use cost::CostModel;
use prefix::PrefixCache;

/// Errors from building or reconfiguring an engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration is inconsistent.
    #[error("invalid engine config: {0}")]
    Config(String),
    /// A fault is out of range.
    #[error("invalid faults: {0}")]
    Faults(String),
}

/// A request inside the engine.
#[derive(Clone, Debug)]
struct Seq {
    spec: RequestSpec,
    target: u32,
    generated: u32,
    computed: u32,
    blocks: Vec<u32>,
    sched: u32,
    scheduled: Option<Nanos>,
    first_token: Option<Nanos>,
    last_token: Option<Nanos>,
    cached_tokens: u32,
    preemptions: u32,
    prefix_held: u32,
}

impl Seq {
    fn len(&self) -> u32 {
        self.spec.prompt_tokens + self.generated
    }
}

/// The step being executed.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    start: Nanos,
    end: Nanos,
    util: f64,
    tokens: u32,
    prefill_seqs: u32,
}

/// The engine. See the module documentation for the model and the driving loop.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    cost: CostModel,
    faults: FaultSet,
    now: Nanos,
    pending: VecDeque<Seq>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    inflight: Option<InFlight>,
    pool: BlockPool,
    prefix: PrefixCache,
    prefix_blocks_in_use: u64,
    live: HashSet<RequestId>,
    stats: EngineStats,
    last_step_start: Option<Nanos>,
}

impl Engine {
    /// A new, idle engine at time 0 with no faults.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate().map_err(EngineError::Config)?;
        let pool = BlockPool::new(cfg.num_gpu_blocks(), cfg.block_size);
        Ok(Engine {
            cost: CostModel::new(&cfg),
            cfg,
            faults: FaultSet::default(),
            now: 0,
            pending: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            inflight: None,
            pool,
            prefix: PrefixCache::new(),
            prefix_blocks_in_use: 0,
            live: HashSet::new(),
            stats: EngineStats::default(),
            last_step_start: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The engine's current time (the last `advance_to` target).
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The version label faults are matched against.
    pub fn version(&self) -> &str {
        &self.cfg.version
    }

    /// Changes the version label (a deploy); in-flight requests are unaffected.
    pub fn set_version(&mut self, version: impl Into<String>) {
        self.cfg.version = version.into();
    }

    /// Replaces the active faults (validated first; on error nothing changes).
    pub fn set_faults(&mut self, faults: FaultSet) -> Result<(), EngineError> {
        faults.validate().map_err(EngineError::Faults)?;
        self.faults = faults;
        Ok(())
    }

    /// The active faults.
    pub fn faults(&self) -> &FaultSet {
        &self.faults
    }

    /// What the faults do at the current time.
    pub fn fault_effects(&self) -> FaultEffects {
        self.faults.effects(self.now, &self.cfg.version)
    }

    /// Queues a request. Its arrival may be in the future (it is not scheduled before);
    /// an arrival before `now()` is treated as `now()` for scheduling but still counts from
    /// its own time in the record. Refused requests never produce events.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<(), RejectReason> {
        let reject = |engine: &mut Self, r| {
            engine.stats.rejected += 1;
            Err(r)
        };
        if spec.prompt_tokens == 0 || spec.max_tokens == 0 {
            return reject(self, RejectReason::Empty);
        }
        if u64::from(spec.prompt_tokens) + u64::from(spec.max_tokens) > u64::from(self.cfg.max_model_len) {
            return reject(self, RejectReason::TooLong);
        }
        if !self.live.insert(spec.id) {
            return reject(self, RejectReason::DuplicateId);
        }
        let seq = Seq {
            target: spec.target_output(),
            spec,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            sched: 0,
            scheduled: None,
            first_token: None,
            last_token: None,
            cached_tokens: 0,
            preemptions: 0,
            prefix_held: 0,
        };
        // keep `pending` sorted by arrival (stable for equal arrivals)
        let pos = self.pending.partition_point(|p| p.spec.arrival <= seq.spec.arrival);
        self.pending.insert(pos, seq);
        Ok(())
    }

    /// Aborts a request wherever it is (client disconnect); returns its record with reason
    /// `abort`, or `None` if the id is unknown or already finished.
    pub fn abort(&mut self, id: RequestId) -> Option<RequestRecord> {
        let seq = if let Some(i) = self.pending.iter().position(|s| s.spec.id == id) {
            self.pending.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.spec.id == id) {
            self.waiting.remove(i)
        } else if let Some(i) = self.running.iter().position(|s| s.spec.id == id) {
            Some(self.running.remove(i))
        } else {
            None
        }?;
        Some(self.retire(seq, FinishReason::Abort, self.now))
    }

    /// When the next thing happens: the end of the running step, or the start of the next
    /// one (an arrival, the end of a queue stall). `None` when idle with nothing queued.
    pub fn next_event_time(&self) -> Option<Nanos> {
        match self.inflight {
            Some(f) => Some(f.end),
            None => self.next_start_time(),
        }
    }

    /// Runs the model up to time `t` (inclusive), appending the events that happened, in
    /// time order, to `out`. Afterwards `now() == max(now(), t)`.
    pub fn advance_to(&mut self, t: Nanos, out: &mut Vec<EngineEvent>) {
        loop {
            if let Some(f) = self.inflight {
                if f.end > t {
                    break;
                }
                self.now = self.now.max(f.end);
                self.finish_step(out);
                continue;
            }
            match self.next_start_time() {
                Some(s) if s <= t => {
                    self.now = self.now.max(s);
                    self.start_step(out);
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
    }

    /// Runs until nothing is left to do (test and batch helper); returns the final time.
    pub fn run_until_idle(&mut self, out: &mut Vec<EngineEvent>) -> Nanos {
        while let Some(t) = self.next_event_time() {
            self.advance_to(t, out);
        }
        self.now
    }

    /// Requests in the running batch (`vllm:num_requests_running`).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting to be scheduled, arrived by now (`vllm:num_requests_waiting`).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.pending.iter().take_while(|p| p.spec.arrival <= self.now).count()
    }

    /// KV-cache usage fraction, O(1) (`vllm:kv_cache_usage_perc`).
    pub fn kv_usage(&self) -> f64 {
        let total = self.pool.total();
        if total == 0 { 0.0 } else { 1.0 - f64::from(self.pool.num_free()) / f64::from(total) }
    }

    /// KV pool snapshot with the fragmentation index (O(blocks): sample it).
    pub fn kv_snapshot(&self) -> KvSnapshot {
        self.pool.snapshot()
    }

    /// Cumulative counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Approximate GPU memory in use: weights, activation reserve and the KV blocks held.
    pub fn vram_used_bytes(&self) -> f64 {
        let m = self.cfg.model();
        let block = m.kv_bytes_per_token() * f64::from(self.cfg.block_size);
        m.weight_bytes()
            + self.cfg.gpu().activation_reserve_gib * 1024.0 * 1024.0 * 1024.0
            + block * f64::from(self.pool.num_used() + self.pool.num_pinned())
    }

    /// Drops the prefix cache (a restart or deploy).
    pub fn reset_prefix_cache(&mut self) {
        self.prefix.clear();
    }

    /// True when the KV pool's books balance and every running request's blocks cover its
    /// computed tokens (invariant check for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.pool.is_consistent() {
            return Err("block pool inconsistent".into());
        }
        let held: u64 = self.running.iter().map(|s| s.blocks.len() as u64).sum();
        if held != u64::from(self.pool.num_used()) {
            return Err(format!("running requests hold {held} blocks, pool says {}", self.pool.num_used()));
        }
        for s in &self.running {
            if self.pool.blocks_for(s.computed + s.sched) > s.blocks.len() as u32 {
                return Err(format!("request {} has too few blocks", s.spec.id));
            }
        }
        if self.waiting.iter().chain(self.pending.iter()).any(|s| !s.blocks.is_empty()) {
            return Err("a waiting request holds blocks".into());
        }
        Ok(())
    }
}
