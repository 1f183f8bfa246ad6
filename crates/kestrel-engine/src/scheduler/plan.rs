//! Planning one step: decode tokens, whole prefill chunks and admissions
//! under the token budget and the pages available (the policy is written at
//! the top of [`super`]).

use super::{ScheduledChunk, Scheduler, StateOp, StepPlan};
use crate::cache::{CacheError, PrefixMatch, SequenceCache};
use crate::sequence::SeqId;

impl Scheduler {
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
                    let snapshot = self.plan_snapshot(id, start, end)?;
                    plan.chunks.push(ScheduledChunk {
                        id,
                        start,
                        end,
                        drafts: 0,
                        snapshot,
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
        // A hit would skip positions whose prompt logprobs are still owed.
        let hit = if self.radix.is_enabled() && !seq.owes_prompt_logprobs() {
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
            seq.timing.admitted();
            seq.cached_tokens = Some(start);
            self.counters.prompt_tokens += seq.prompt_len as u64;
            if self.radix.is_enabled() {
                self.counters.prefix_queries += seq.prompt_len as u64;
                self.counters.prefix_hits += start as u64;
            }
            self.shared.dequeued();
        }
        let id = seq.id;
        *budget -= end - start;
        self.running.push(seq);
        let snapshot = self.plan_snapshot(id, start, end)?;
        plan.chunks.push(ScheduledChunk {
            id,
            start,
            end,
            drafts: 0,
            snapshot,
        });
        Ok(true)
    }
}
