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
//!
//! The queues, pools, prefix cache and counters are private: the engine and
//! the step change them only through the methods here, so every rule about
//! pages, slots and what the prefix cache holds lives in this module
//! ([`plan`] plans a step, [`counters`] counts).

mod counters;
mod plan;

use std::collections::VecDeque;
use std::sync::Arc;

use kestrel_sampling::{Finish, FinishReason};

use counters::Counters;

use crate::cache::{BlockAllocator, CacheError, RadixCache, StateSlots};
use crate::client::Shared;
use crate::handle::{EngineConfig, EngineEvent};
use crate::prefill::ChunkPolicy;
use crate::sequence::SeqId;
use crate::sequence::Sequence;
use crate::spec::{DraftSource, Retired};

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
    /// A prefix-cache snapshot point inside this pass: its position and the
    /// state slot the snapshot goes to, if the cache takes one (hybrid
    /// models, see `prefill`).
    pub snapshot: Option<(usize, Option<u32>)>,
}

#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub chunks: Vec<ScheduledChunk>,
    pub state_ops: Vec<StateOp>,
}

pub(crate) struct Scheduler {
    config: EngineConfig,
    policy: ChunkPolicy,
    hybrid: bool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    blocks: BlockAllocator,
    slots: StateSlots,
    radix: RadixCache,
    counters: Counters,
    /// Refuse new admissions (shutdown in progress).
    stopping: bool,
    shared: Arc<Shared>,
    /// Told about every request that leaves (a draft source that records
    /// outputs).
    retirements: Option<Arc<dyn DraftSource>>,
}

/// Where [`Scheduler::take`] found a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Waiting,
    Running,
}

impl Scheduler {
    /// `snapshot_alignment`: the backend's `state_snapshot_alignment`.
    pub fn new(
        config: EngineConfig,
        hybrid: bool,
        snapshot_alignment: Option<usize>,
        shared: Arc<Shared>,
    ) -> Result<Self, String> {
        let policy = ChunkPolicy::new(&config, hybrid)?.with_in_pass_snapshots(snapshot_alignment);
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
            retirements: None,
            config,
        })
    }

    /// Tell `source` about every request that leaves from now on.
    pub fn report_retirements_to(&mut self, source: Arc<dyn DraftSource>) {
        self.retirements = Some(source);
    }

    fn report_retired(&self, seq: &Sequence, completed: bool) {
        if let Some(source) = &self.retirements {
            source.retired(&Retired {
                request_id: &seq.request_id,
                tokens: &seq.tokens,
                prompt_len: seq.prompt_len,
                greedy: seq.sampler.params().is_greedy(),
                completed,
            });
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Admit nothing new from now on (shutdown in progress).
    pub fn stop_admitting(&mut self) {
        self.stopping = true;
    }

    /// When nothing runs and the head of the queue still does not fit, it
    /// never will: fail it. Called after a step planned nothing.
    pub fn fail_unrunnable_head(&mut self) {
        if self.running.is_empty()
            && let Some(head) = self.waiting.front()
        {
            let id = head.id;
            self.fail(id, "the request does not fit in the engine's cache");
        }
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

    /// Take a request out wherever it is; leaving the queue is counted here.
    fn take(&mut self, id: SeqId) -> Option<(Sequence, Place)> {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(i).expect("index from position");
            self.leave_queue(&seq);
            Some((seq, Place::Waiting))
        } else {
            let i = self.running_index(id)?;
            Some((self.running.remove(i), Place::Running))
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
        let Some((mut seq, place)) = self.take(id) else {
            return Ok(false);
        };
        if place == Place::Running {
            self.retire(&mut seq)?;
        }
        seq.cache.release(&mut self.blocks, &mut self.slots)?;
        self.counters.finished_abort += 1;
        self.report_retired(&seq, false);
        seq.emit(EngineEvent::Finished {
            reason: FinishReason::Abort,
            stop_token: None,
            usage: seq.usage(),
        });
        Ok(true)
    }

    /// The server matched a stop string: end the request as a `stop` finish.
    pub fn stop_on_client_request(&mut self, id: SeqId) -> Result<(), CacheError> {
        let Some((mut seq, place)) = self.take(id) else {
            return Ok(());
        };
        if place == Place::Running {
            self.retire(&mut seq)?;
        }
        seq.cache.release(&mut self.blocks, &mut self.slots)?;
        self.counters.finished_stop += 1;
        self.report_retired(&seq, false);
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
        let Some((mut seq, _)) = self.take(id) else {
            return;
        };
        let _ = seq.cache.release(&mut self.blocks, &mut self.slots);
        self.counters.failed += 1;
        self.report_retired(&seq, false);
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
        self.report_retired(&seq, finish.reason != FinishReason::Abort);
        seq.emit(EngineEvent::Finished {
            reason: finish.reason,
            stop_token: finish.stop_token,
            usage: seq.usage(),
        });
        Ok(())
    }

    /// Offer what a prefill chunk of `id` computed (positions `start..end`)
    /// to the prefix cache: on hybrid models a state snapshot at each resume
    /// point, copied by `copy_state(own slot, snapshot slot)`; on
    /// attention-only models the full prompt blocks (decoded blocks are
    /// offered when the sequence ends, see `retire`).
    pub fn cache_progress(
        &mut self,
        id: SeqId,
        start: usize,
        end: usize,
        copy_state: impl FnOnce(u32, u32),
    ) -> Result<(), CacheError> {
        if !self.radix.is_enabled() {
            return Ok(());
        }
        let vanished = || CacheError::Invalid(format!("sequence {id} is not running"));
        let (prompt_len, slot) = {
            let seq = self.running_seq(id).ok_or_else(vanished)?;
            (seq.prompt_len, seq.cache.state_slot())
        };
        let snapshot = if self.hybrid {
            if !self.policy.is_snapshot_point(end, prompt_len) {
                return Ok(());
            }
            let Some(own) = slot else { return Ok(()) };
            let Some(snap) = self.snapshot_slot()? else {
                return Ok(()); // every slot busy: resumable later from a shallower point
            };
            copy_state(own, snap);
            Some((end / self.config.block_size - 1, snap))
        } else if start < prompt_len {
            None
        } else {
            return Ok(());
        };
        let index = self.running_index(id).ok_or_else(vanished)?;
        let seq = &self.running[index];
        let snapshots: Vec<(usize, u32)> = snapshot.into_iter().collect();
        self.radix.insert(
            &seq.tokens[..end],
            &seq.salt,
            seq.cache.block_table(),
            &snapshots,
            &mut self.blocks,
            &mut self.slots,
        )?;
        Ok(())
    }

    /// The in-pass snapshot point of a prompt chunk `start..end` of `id`,
    /// where the chunk crosses its prompt's snapshot point, with a slot for
    /// the snapshot (none when the prefix cache is off or every slot is
    /// busy: the point is kept anyway, so outputs never depend on the cache).
    fn plan_snapshot(
        &mut self,
        id: SeqId,
        start: usize,
        end: usize,
    ) -> Result<Option<(usize, Option<u32>)>, CacheError> {
        let Some(prompt_len) = self.running_seq(id).map(|s| s.prompt_len) else {
            return Ok(None);
        };
        let Some(at) = self.policy.in_pass_snapshot(start, end, prompt_len) else {
            return Ok(None);
        };
        let slot = if self.radix.is_enabled() {
            self.snapshot_slot()?
        } else {
            None
        };
        Ok(Some((at, slot)))
    }

    /// Offer the in-pass snapshot a step took for `id` (see
    /// [`Scheduler::plan_snapshot`]) to the prefix cache, which keeps the
    /// slot or frees it.
    pub fn cache_snapshot(&mut self, id: SeqId, at: usize, slot: u32) -> Result<(), CacheError> {
        let Some(index) = self.running_index(id) else {
            return self.slots.free(slot);
        };
        let seq = &self.running[index];
        self.radix.insert(
            &seq.tokens[..at],
            &seq.salt,
            seq.cache.block_table(),
            &[(at / self.config.block_size - 1, slot)],
            &mut self.blocks,
            &mut self.slots,
        )?;
        Ok(())
    }

    /// A state slot for a prefix-cache snapshot, evicting the least recently
    /// used unused snapshot if none is free; `None` if every slot is busy.
    fn snapshot_slot(&mut self) -> Result<Option<u32>, CacheError> {
        if self.slots.num_free() == 0 {
            self.radix
                .evict_snapshots(1, &self.blocks, &mut self.slots)?;
        }
        if self.slots.num_free() == 0 {
            return Ok(None);
        }
        self.slots.allocate().map(Some)
    }
}
