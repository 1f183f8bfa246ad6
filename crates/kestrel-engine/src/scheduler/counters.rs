//! The scheduler's counters and the statistics snapshot built from them
//! (`/metrics`, `/health`, the tests' leak checks).

use super::Scheduler;
use crate::handle::EngineStats;

#[derive(Clone, Debug, Default)]
pub(super) struct Counters {
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
    pub steps_split: u64,
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
    /// `n` tokens were generated (sampled and sent) in this step.
    pub fn record_generated(&mut self, n: usize) {
        self.counters.generation_tokens += n as u64;
    }

    /// A submission the engine could not turn into a sequence.
    pub fn record_rejected(&mut self) {
        self.counters.failed += 1;
    }

    /// A planned step ran its forward pass.
    pub fn record_step(&mut self) {
        self.counters.steps += 1;
    }

    /// The backend ran the step as two passes ([`kestrel_core::Backend::step_cut`]).
    pub fn record_split_step(&mut self) {
        self.counters.steps_split += 1;
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
            engine_steps_split_total: c.steps_split,
            spec_decode_num_drafts_total: c.spec_drafts,
            spec_decode_num_draft_tokens_total: c.spec_draft_tokens,
            spec_decode_num_accepted_tokens_total: c.spec_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos_total: c.spec_accepted_per_position.clone(),
        }
    }
}
