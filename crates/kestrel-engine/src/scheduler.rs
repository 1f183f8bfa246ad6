//! Continuous batching: which sequences run in the next forward pass and
//! which tokens of each, under the token budget, the sequence cap and the KV
//! pages available. Plain bookkeeping; the step module runs the plan.
//!
//! Each step: a decode token for every decoding sequence, then whole prefill
//! chunks (see [`crate::prefill`]) of the running sequences, oldest first,
//! then admissions from the waiting queue in arrival order. When pages run
//! out for a running sequence, unused prefix-cache pages are evicted first,
//! then the newest running sequence is preempted by recompute: its pages and
//! slot are freed and it goes back to the front of the queue with its
//! generated tokens appended to its prompt, keeping its sampler.

use std::collections::VecDeque;
use std::sync::Arc;

use kestrel_sampling::{Finish, FinishReason};

use crate::cache::{
    BlockAllocator, CacheError, PrefixMatch, RadixCache, SequenceCache, StateSlots,
};
use crate::client::{SeqId, Shared};
use crate::handle::{EngineConfig, EngineEvent, EngineStats};
use crate::prefill::ChunkPolicy;
use crate::sequence::Sequence;

/// Recurrent-state work to do before the forward pass, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StateOp {
    /// A sequence starting from scratch.
    Zero(u32),
    /// A sequence resuming from a prefix-cache snapshot.
    Copy { src: u32, dst: u32 },
}

/// Positions `start..end` of sequence `id` are computed in this step; the
/// last `drafts` of them are speculative (the sequence's draft tokens,
/// beyond its known tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScheduledChunk {
    pub id: SeqId,
    pub start: usize,
    pub end: usize,
    pub drafts: usize,
}

#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub chunks: Vec<ScheduledChunk>,
    pub state_ops: Vec<StateOp>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    /// Speculative decoding (vLLM's `spec_decode_*` counters): steps of a
    /// sequence that carried drafts, their drafts, the accepted ones, and
    /// the accepted ones by draft position.
    pub spec_drafts: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_accepted_per_position: Vec<u64>,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub finished_stop: u64,
    pub finished_length: u64,
    pub finished_abort: u64,
    pub failed: u64,
    pub steps: u64,
}

pub(crate) struct Scheduler {
    pub config: EngineConfig,
    pub policy: ChunkPolicy,
    pub hybrid: bool,
    pub waiting: VecDeque<Sequence>,
    pub running: Vec<Sequence>,
    pub blocks: BlockAllocator,
    pub slots: StateSlots,
    pub radix: RadixCache,
    pub counters: Counters,
    /// Refuse new admissions (shutdown in progress).
    pub stopping: bool,
    shared: Arc<Shared>,
}

impl Counters {
    /// A sequence's step verified `drafts` drafts and kept the first `accepted`.
    pub fn record_drafts(&mut self, drafts: usize, accepted: usize) {
        self.spec_drafts += 1;
        self.spec_draft_tokens += drafts as u64;
        self.spec_accepted_tokens += accepted as u64;
        if self.spec_accepted_per_position.len() < drafts {
            self.spec_accepted_per_position.resize(drafts, 0);
        }
        for n in &mut self.spec_accepted_per_position[..accepted] {
            *n += 1;
        }
    }
}

impl Scheduler {
    pub fn new(config: EngineConfig, hybrid: bool, shared: Arc<Shared>) -> Result<Self, String> {
        let policy = ChunkPolicy::new(&config, hybrid)?;
        let block_size = config.block_size;
        let radix = match (config.enable_prefix_cache, hybrid) {
            (false, _) => RadixCache::disabled(block_size),
            (true, false) => RadixCache::new(block_size),
            (true, true) => RadixCache::new_hybrid(block_size),
        }
        .map_err(|e| e.to_string())?;
        let to_u32 = |n: usize, what: &str| {
            u32::try_from(n).map_err(|_| format!("{what} ({n}) does not fit in 32 bits"))
        };
        Ok(Self {
            blocks: BlockAllocator::new(to_u32(config.num_blocks, "num_blocks")?),
            slots: StateSlots::new(to_u32(config.num_state_slots, "num_state_slots")?),
            radix,
            policy,
            hybrid,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
            stopping: false,
            shared,
            config,
        })
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn running_index(&self, id: SeqId) -> Option<usize> {
        self.running.iter().position(|s| s.id == id)
    }

    pub fn running_seq(&self, id: SeqId) -> Option<&Sequence> {
        self.running.iter().find(|s| s.id == id)
    }

    /// A speculative step of `id` verified `drafts` drafts and kept
    /// `accepted`: give its checkpoint slots back and count them.
    pub fn end_speculation(
        &mut self,
        id: SeqId,
        drafts: usize,
        accepted: usize,
    ) -> Result<(), CacheError> {
        if let Some(i) = self.running_index(id) {
            self.running[i]
                .cache
                .release_checkpoint_slots(&mut self.slots)?;
        }
        self.counters.record_drafts(drafts, accepted);
        Ok(())
    }

    pub fn running_mut(&mut self) -> impl Iterator<Item = &mut Sequence> {
        self.running.iter_mut()
    }

    pub fn running_seq_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.running.iter_mut().find(|s| s.id == id)
    }

    pub fn enqueue(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// A request leaves the queue for good before ever running.
    fn leave_queue(&self, seq: &Sequence) {
        if seq.cached_tokens.is_none() {
            self.shared.dequeued();
        }
    }

    /// Give back a sequence's pages and slot. Attention-only models first
    /// offer its computed blocks to the prefix cache (exact whatever their
    /// origin, since those layers compute every row independently); hybrid
    /// models cached their snapshot points while prefilling.
    fn retire(&mut self, seq: &mut Sequence) -> Result<(), CacheError> {
        if !self.hybrid && self.radix.is_enabled() {
            let computed = seq.num_computed();
            self.radix.insert(
                &seq.tokens[..computed],
                &seq.salt,
                seq.cache.block_table(),
                &[],
                &mut self.blocks,
                &mut self.slots,
            )?;
        }
        seq.cache.release(&mut self.blocks, &mut self.slots)
    }

    /// Remove a request wherever it is; `true` if it was still alive. The
    /// abort is counted here, once.
    pub fn abort(&mut self, id: SeqId) -> Result<bool, CacheError> {
        let mut seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(i).expect("index from position");
            self.leave_queue(&seq);
            seq
        } else if let Some(i) = self.running_index(id) {
            let mut seq = self.running.remove(i);
            self.retire(&mut seq)?;
            seq
        } else {
            return Ok(false);
        };
        seq.cache.release(&mut self.blocks, &mut self.slots)?;
        self.counters.finished_abort += 1;
        seq.emit(EngineEvent::Finished {
            reason: FinishReason::Abort,
            stop_token: None,
            usage: seq.usage(),
        });
        Ok(true)
    }

    /// The server matched a stop string: end the request as a `stop` finish.
    pub fn stop_on_client_request(&mut self, id: SeqId) -> Result<(), CacheError> {
        let mut seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(i).expect("index from position");
            self.leave_queue(&seq);
            seq
        } else if let Some(i) = self.running_index(id) {
            let mut seq = self.running.remove(i);
            self.retire(&mut seq)?;
            seq
        } else {
            return Ok(());
        };
        seq.cache.release(&mut self.blocks, &mut self.slots)?;
        self.counters.finished_stop += 1;
        Ok(())
    }

    /// Abort every request whose client dropped its stream.
    pub fn abort_disconnected(&mut self) -> Result<(), CacheError> {
        let gone: Vec<SeqId> = self
            .waiting
            .iter()
            .chain(&self.running)
            .filter(|s| s.client_gone())
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.abort(id)?;
        }
        Ok(())
    }

    /// Abort everything (shutdown).
    pub fn abort_all(&mut self) -> Result<(), CacheError> {
        let ids: Vec<SeqId> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(|s| s.id)
            .collect();
        for id in ids {
            self.abort(id)?;
        }
        Ok(())
    }

    /// End a request with an error. Bookkeeping is best effort: this also
    /// runs after a failed step, when the pools may be inconsistent.
    pub fn fail(&mut self, id: SeqId, message: &str) {
        let seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(i).expect("index from position");
            self.leave_queue(&seq);
            seq
        } else if let Some(i) = self.running_index(id) {
            self.running.remove(i)
        } else {
            return;
        };
        let mut seq = seq;
        let _ = seq.cache.release(&mut self.blocks, &mut self.slots);
        self.counters.failed += 1;
        seq.emit(EngineEvent::Error(message.to_string()));
    }

    pub fn fail_all(&mut self, message: &str) {
        let ids: Vec<SeqId> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(|s| s.id)
            .collect();
        for id in ids {
            self.fail(id, message);
        }
    }

    /// A running request reached a stop condition.
    pub fn finish(&mut self, id: SeqId, finish: Finish) -> Result<(), CacheError> {
        let Some(i) = self.running_index(id) else {
            return Ok(());
        };
        let mut seq = self.running.remove(i);
        self.retire(&mut seq)?;
        match finish.reason {
            FinishReason::Stop => self.counters.finished_stop += 1,
            FinishReason::Length => self.counters.finished_length += 1,
            FinishReason::Abort => self.counters.finished_abort += 1,
        }
        seq.emit(EngineEvent::Finished {
            reason: finish.reason,
            stop_token: finish.stop_token,
            usage: seq.usage(),
        });
        Ok(())
    }

    /// Preempt running sequence `index` by recompute.
    fn preempt(&mut self, index: usize) -> Result<(), CacheError> {
        let mut seq = self.running.remove(index);
        seq.drafts.clear();
        self.retire(&mut seq)?;
        seq.cache = SequenceCache::new();
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
        Ok(())
    }

    /// Plan the next step.
    pub fn schedule(&mut self) -> Result<StepPlan, CacheError> {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_num_batched_tokens;
        if let Some(n) = self.config.force_preempt_at
            && self.running.len() >= n
            && let Some(newest) = self.running.len().checked_sub(1)
        {
            self.preempt(newest)?;
        }
        for decoding in [true, false] {
            let ids: Vec<SeqId> = self
                .running
                .iter()
                .filter(|s| s.is_decoding() == decoding)
                .map(|s| s.id)
                .collect();
            for id in ids {
                let Some(seq) = self.running_seq(id) else {
                    continue; // preempted to make room for an older one
                };
                let start = seq.num_computed();
                let end = self
                    .policy
                    .chunk_end(start, seq.tokens.len(), seq.prompt_len);
                if end - start > budget {
                    continue; // whole chunks only; it fits in a later step
                }
                if self.make_room(id, end, &mut plan, &mut budget)? {
                    plan.chunks.push(ScheduledChunk {
                        id,
                        start,
                        end,
                        drafts: 0,
                    });
                    budget -= end - start;
                }
            }
        }
        while !self.stopping
            && self.running.len() < self.config.max_num_seqs
            && budget > 0
            && self.admit_next(&mut plan, &mut budget)?
        {}
        self.attach_drafts(&mut plan, &mut budget)?;
        Ok(plan)
    }

    /// Extend the decode chunks of sequences that carry drafts with as many
    /// of them as the leftover token budget, free pages and (hybrid models)
    /// free state slots for checkpoints allow. Drafts only ever use what is
    /// left: they never evict cached pages, preempt, or delay a prefill.
    fn attach_drafts(&mut self, plan: &mut StepPlan, budget: &mut usize) -> Result<(), CacheError> {
        let block_size = self.config.block_size;
        for chunk in &mut plan.chunks {
            let Some(index) = self.running_index(chunk.id) else {
                continue;
            };
            let seq = &mut self.running[index];
            if seq.drafts.is_empty() {
                continue;
            }
            let decoding = chunk.end == seq.tokens.len() && chunk.start + 1 == chunk.end;
            let mut k = if decoding {
                seq.drafts.len().min(*budget)
            } else {
                0
            };
            if self.hybrid {
                k = k.min(self.slots.num_free());
            }
            let free_positions =
                (seq.cache.block_table().len() + self.blocks.num_free()) * block_size;
            k = k.min(free_positions.saturating_sub(chunk.end));
            seq.drafts.truncate(k);
            if k == 0 {
                continue;
            }
            seq.cache
                .ensure_capacity(chunk.end + k, block_size, &mut self.blocks)?;
            if self.hybrid {
                seq.cache.attach_checkpoint_slots(k, &mut self.slots)?;
            }
            chunk.end += k;
            chunk.drafts = k;
            *budget -= k;
        }
        Ok(())
    }

    /// Grow running sequence `id` to hold `end` positions, evicting cached
    /// pages and then preempting the newest sequences as needed. `false` when
    /// `id` itself had to be preempted.
    fn make_room(
        &mut self,
        id: SeqId,
        end: usize,
        plan: &mut StepPlan,
        budget: &mut usize,
    ) -> Result<bool, CacheError> {
        let block_size = self.config.block_size;
        loop {
            let index = self.running_index(id).expect("caller checked");
            let needed = self.running[index].cache.blocks_needed(end, block_size);
            if needed <= self.blocks.num_free() {
                let seq = &mut self.running[index];
                seq.cache
                    .ensure_capacity(end, block_size, &mut self.blocks)?;
                return Ok(true);
            }
            let short = needed - self.blocks.num_free();
            if self.radix.evict(short, &mut self.blocks, &mut self.slots)? > 0 {
                continue;
            }
            let victim = self.running.len() - 1;
            let victim_id = self.running[victim].id;
            self.preempt(victim)?;
            if victim_id == id {
                return Ok(false);
            }
            // The victim may already be in this step's plan: take it out.
            if let Some(i) = plan.chunks.iter().position(|c| c.id == victim_id) {
                let chunk = plan.chunks.remove(i);
                *budget += chunk.end - chunk.start;
            }
        }
    }

    /// Pages for `end` positions of a sequence being admitted, evicting
    /// unused cached pages but never preempting. `false` if they are not there.
    fn reserve(&mut self, cache: &mut SequenceCache, end: usize) -> Result<bool, CacheError> {
        let block_size = self.config.block_size;
        let needed = cache.blocks_needed(end, block_size);
        if needed > self.blocks.num_free() {
            let short = needed - self.blocks.num_free();
            self.radix.evict(short, &mut self.blocks, &mut self.slots)?;
        }
        if needed > self.blocks.num_free() {
            return Ok(false);
        }
        cache.ensure_capacity(end, block_size, &mut self.blocks)?;
        Ok(true)
    }

    /// Admit the head of the waiting queue with its first chunk; `false` if
    /// it does not fit now (it keeps its place).
    fn admit_next(&mut self, plan: &mut StepPlan, budget: &mut usize) -> Result<bool, CacheError> {
        if self.waiting.is_empty() {
            return Ok(false);
        }
        if self.hybrid && self.slots.num_free() == 0 {
            self.radix
                .evict_snapshots(1, &self.blocks, &mut self.slots)?;
            if self.slots.num_free() == 0 {
                return Ok(false);
            }
        }
        let mut seq = self.waiting.pop_front().expect("checked non-empty");
        let hit = if self.radix.is_enabled() {
            let policy = self.policy;
            let prompt_len = seq.prompt_len;
            self.radix
                .match_prefix_where(&seq.tokens, &seq.salt, &mut self.blocks, |n| {
                    policy.is_resume_point(n, prompt_len)
                })?
        } else {
            PrefixMatch::default()
        };
        seq.cache = SequenceCache::from_prefix(hit.blocks, hit.num_tokens);
        let start = hit.num_tokens;
        let end = self
            .policy
            .chunk_end(start, seq.tokens.len(), seq.prompt_len);
        let fits = end - start <= *budget && self.reserve(&mut seq.cache, end)?;
        if !fits {
            seq.cache.release(&mut self.blocks, &mut self.slots)?;
            self.waiting.push_front(seq);
            return Ok(false);
        }
        if self.hybrid {
            let slot = seq.cache.attach_state_slot(&mut self.slots)?;
            plan.state_ops.push(match hit.state_snapshot {
                Some(src) => StateOp::Copy { src, dst: slot },
                None => StateOp::Zero(slot),
            });
        }
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(start);
            self.counters.prompt_tokens += seq.prompt_len as u64;
            if self.radix.is_enabled() {
                self.counters.prefix_queries += seq.prompt_len as u64;
                self.counters.prefix_hits += start as u64;
            }
            self.shared.dequeued();
        }
        plan.chunks.push(ScheduledChunk {
            id: seq.id,
            start,
            end,
            drafts: 0,
        });
        *budget -= end - start;
        self.running.push(seq);
        Ok(true)
    }

    /// A state slot for a prefix-cache snapshot, evicting the least recently
    /// used unused snapshot if none is free; `None` if every slot is busy.
    pub fn snapshot_slot(&mut self) -> Result<Option<u32>, CacheError> {
        if self.slots.num_free() == 0 {
            self.radix
                .evict_snapshots(1, &self.blocks, &mut self.slots)?;
        }
        if self.slots.num_free() == 0 {
            return Ok(None);
        }
        self.slots.allocate().map(Some)
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.counters;
        EngineStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_free_blocks: self.blocks.num_free(),
            num_total_blocks: self.blocks.num_total(),
            num_cached_blocks: self.radix.num_unused_blocks(&self.blocks),
            num_free_state_slots: self.slots.num_free(),
            num_total_state_slots: self.slots.num_total(),
            num_cached_state_slots: self.radix.num_snapshots(),
            prompt_tokens_total: c.prompt_tokens,
            generation_tokens_total: c.generation_tokens,
            num_preemptions_total: c.preemptions,
            prefix_cache_queries_total: c.prefix_queries,
            prefix_cache_hits_total: c.prefix_hits,
            requests_finished_stop: c.finished_stop,
            requests_finished_length: c.finished_length,
            requests_finished_abort: c.finished_abort,
            requests_failed: c.failed,
            engine_steps_total: c.steps,
            spec_decode_num_drafts_total: c.spec_drafts,
            spec_decode_num_draft_tokens_total: c.spec_draft_tokens,
            spec_decode_num_accepted_tokens_total: c.spec_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos_total: c.spec_accepted_per_position.clone(),
        }
    }
}
