//! The scheduler and step execution of [`Engine`].

use super::cost::{SeqWork, StepCost};
use super::tokens::{mix64, unit};
use super::{Engine, EngineEvent, FinishReason, InFlight, Nanos, RequestRecord, Seq, StepInfo};

impl Engine {
    /// When the next step can start, given no step is in flight.
    pub(super) fn next_start_time(&self) -> Option<Nanos> {
        if !self.running.is_empty() {
            return Some(self.now);
        }
        let ready = !self.waiting.is_empty() || self.pending.front().is_some_and(|p| p.spec.arrival <= self.now);
        if ready {
            let fx = self.faults.effects(self.now, &self.cfg.version);
            return Some(fx.stall_until.map_or(self.now, |u| u.max(self.now)));
        }
        self.pending.front().map(|p| p.spec.arrival.max(self.now))
    }

    /// Schedules and starts a step at `self.now` (may schedule nothing).
    pub(super) fn start_step(&mut self, out: &mut Vec<EngineEvent>) {
        let s = self.now;
        let fx = self.faults.effects(s, &self.cfg.version);
        while self.pending.front().is_some_and(|p| p.spec.arrival <= s) {
            if let Some(p) = self.pending.pop_front() {
                self.waiting.push_back(p);
            }
        }
        if self.faults.cold_start_between(self.last_step_start, s) {
            self.prefix.clear();
        }
        self.last_step_start = Some(s);
        let target_pinned = (fx.kv_pinned_frac * f64::from(self.pool.total())) as u32;
        self.pool.pin_to(target_pinned);
        let bs = self.cfg.block_size;
        self.prefix.evict_to(u64::from(self.pool.num_free()) + self.prefix_blocks_in_use, bs);

        let mut budget = self.cfg.max_num_batched_tokens;
        let mut acc = StepCost::default();

        // 1. the running batch, in admission order; preempt from the back when out of blocks
        let mut i = 0;
        'running: while i < self.running.len() {
            if budget == 0 {
                break;
            }
            let (n, need) = {
                let seq = &self.running[i];
                let n = (seq.len() - seq.computed).min(budget);
                let need = self.pool.blocks_for(seq.computed + n).saturating_sub(seq.blocks.len() as u32);
                (n, need)
            };
            loop {
                if self.pool.alloc(need, &mut self.running[i].blocks) {
                    break;
                }
                let last = self.running.len() - 1;
                let Some(victim) = self.running.pop() else { break 'running };
                self.preempt(victim, s, out);
                if last == i {
                    continue 'running;
                }
            }
            let seq = &mut self.running[i];
            let is_prefill = n > 1 || seq.first_token.is_none();
            self.cost.add(&mut acc, SeqWork { tokens: n, context: seq.computed, total: seq.len() }, is_prefill, &fx);
            seq.sched = n;
            budget -= n;
            i += 1;
        }

        // 2. admit waiting requests (unless admission is stalled)
        if fx.stall_until.is_none() {
            while budget > 0 && (self.running.len() as u32) < self.cfg.max_num_seqs {
                let Some(mut seq) = self.waiting.pop_front() else { break };
                let len = seq.len();
                let hit = if seq.computed == 0 { self.prefix_hit(&seq, fx.prefix_invalidate) } else { 0 };
                let start = if seq.computed == 0 { hit } else { seq.computed };
                let n = (len - start).min(budget);
                let need = self.pool.blocks_for(start + n);
                if !self.pool.alloc(need, &mut seq.blocks) {
                    self.waiting.push_front(seq);
                    break;
                }
                if seq.computed == 0 {
                    self.stats.prefix_queries += u64::from(len);
                    self.stats.prefix_hits += u64::from(hit);
                    seq.computed = hit;
                }
                let resumed = seq.scheduled.is_some();
                if !resumed {
                    seq.scheduled = Some(s);
                    seq.cached_tokens = hit;
                }
                out.push(EngineEvent::Scheduled { id: seq.spec.id, t: s, resumed });
                self.cost.add(&mut acc, SeqWork { tokens: n, context: seq.computed, total: seq.len() }, true, &fx);
                seq.sched = n;
                budget -= n;
                self.running.push(seq);
            }
        }

        if acc.tokens == 0 {
            // nothing could run: if admission is not stalled and the batch is empty, the head
            // request cannot fit even in an empty pool (faults pinned it away): fail it.
            if fx.stall_until.is_none()
                && self.running.is_empty()
                && let Some(seq) = self.waiting.pop_front()
            {
                let record = self.retire(seq, FinishReason::Error, s);
                out.push(EngineEvent::Finished { record });
            }
            return;
        }
        let running = self.running.len() as u32;
        let dur = self.cost.finish(&acc, running, &fx);
        self.inflight = Some(InFlight {
            start: s,
            end: s + dur,
            util: fx.util_factor(running),
            tokens: acc.tokens,
            prefill_seqs: acc.prefill_seqs,
        });
    }

    /// Tokens served from the prefix cache for a request about to be (re)computed.
    fn prefix_hit(&mut self, seq: &Seq, invalidate: f64) -> u32 {
        if !self.cfg.enable_prefix_caching {
            return 0;
        }
        let Some(p) = seq.spec.prefix else { return 0 };
        let bs = self.cfg.block_size;
        if invalidate > 0.0 {
            let draw = unit(mix64(self.cfg.seed ^ mix64(seq.spec.id) ^ u64::from(seq.preemptions)));
            if draw < invalidate {
                self.prefix.invalidate(p.hash, bs);
                return 0;
            }
        }
        let cached = self.prefix.lookup(p.hash);
        let cap = p.tokens.min(seq.spec.prompt_tokens).min(seq.len().saturating_sub(1));
        cached.min(cap) / bs * bs
    }

    /// Frees a running request's blocks and puts it at the head of the waiting queue.
    fn preempt(&mut self, mut seq: Seq, t: Nanos, out: &mut Vec<EngineEvent>) {
        self.pool.release(&mut seq.blocks);
        self.prefix_blocks_in_use -= u64::from(seq.prefix_held);
        seq.prefix_held = 0;
        seq.computed = 0;
        seq.sched = 0;
        seq.preemptions += 1;
        self.stats.preemptions += 1;
        out.push(EngineEvent::Preempted { id: seq.spec.id, t });
        self.waiting.push_front(seq);
    }

    /// Completes the in-flight step: emits its tokens and finishes requests.
    pub(super) fn finish_step(&mut self, out: &mut Vec<EngineEvent>) {
        let Some(f) = self.inflight.take() else { return };
        let end = f.end;
        let bs = self.cfg.block_size;
        let mut decode_seqs = 0u32;
        let mut finished = 0usize;
        for seq in self.running.iter_mut() {
            if seq.sched == 0 {
                continue;
            }
            seq.computed += seq.sched;
            seq.sched = 0;
            if seq.computed < seq.len() {
                continue; // partial prefill
            }
            let index = seq.generated;
            seq.generated += 1;
            if seq.first_token.is_none() {
                seq.first_token = Some(end);
                self.stats.prompt_tokens += u64::from(seq.spec.prompt_tokens);
                self.stats.prompt_tokens_cached += u64::from(seq.cached_tokens);
                out.push(EngineEvent::FirstToken { id: seq.spec.id, t: end });
            } else if seq.last_token.is_some() {
                decode_seqs += 1;
            }
            if self.cfg.enable_prefix_caching
                && seq.prefix_held == 0
                && let Some(p) = seq.spec.prefix
            {
                let tokens = p.tokens.min(seq.spec.prompt_tokens);
                self.prefix.insert(p.hash, tokens, bs);
                seq.prefix_held = tokens / bs;
                self.prefix_blocks_in_use += u64::from(seq.prefix_held);
            }
            seq.last_token = Some(end);
            self.stats.generation_tokens += 1;
            if self.cfg.token_events {
                out.push(EngineEvent::Token { id: seq.spec.id, index, t: end });
            }
            if seq.generated >= seq.target {
                finished += 1;
            }
        }
        self.stats.steps += 1;
        self.stats.step_tokens += u64::from(f.tokens);
        let dur = end - f.start;
        self.stats.busy_ns += dur;
        self.stats.util_ns += dur as f64 * f.util;
        if self.cfg.step_events {
            out.push(EngineEvent::Step(StepInfo {
                start: f.start,
                end,
                num_tokens: f.tokens,
                decode_seqs,
                prefill_seqs: f.prefill_seqs,
                gpu_util: f.util,
            }));
        }
        if finished > 0 {
            let mut keep = Vec::with_capacity(self.running.len());
            let running = std::mem::take(&mut self.running);
            for seq in running {
                if seq.generated >= seq.target {
                    let reason = if seq.spec.stop_after.is_some_and(|n| n < seq.spec.max_tokens) {
                        FinishReason::Stop
                    } else {
                        FinishReason::Length
                    };
                    let record = self.retire(seq, reason, end);
                    out.push(EngineEvent::Finished { record });
                } else {
                    keep.push(seq);
                }
            }
            self.running = keep;
        }
    }

    /// Releases a request's resources and builds its record.
    pub(super) fn retire(&mut self, mut seq: Seq, reason: FinishReason, t: Nanos) -> RequestRecord {
        self.pool.release(&mut seq.blocks);
        self.prefix_blocks_in_use -= u64::from(seq.prefix_held);
        self.live.remove(&seq.spec.id);
        self.stats.finished[reason.index()] += 1;
        RequestRecord {
            id: seq.spec.id,
            arrival: seq.spec.arrival,
            scheduled: seq.scheduled,
            first_token: seq.first_token,
            last_token: seq.last_token,
            finished: t.max(seq.spec.arrival),
            prompt_tokens: seq.spec.prompt_tokens,
            completion_tokens: seq.generated,
            max_tokens: seq.spec.max_tokens,
            cached_tokens: seq.cached_tokens,
            preemptions: seq.preemptions,
            finish_reason: reason,
        }
    }
}
