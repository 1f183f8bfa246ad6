//! One sequence's share of the cache: its pages, how many positions hold
//! keys/values, and its recurrent-state slot.

use super::{BlockAllocator, CacheError, StateSlots};

/// Pages `block_table[i]` hold positions `i * block_size .. (i + 1) * block_size`.
/// The sequence owns one reference on each page (some may also be held by the
/// prefix cache or by other sequences sharing a prefix) and owns its slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SequenceCache {
    block_table: Vec<u32>,
    num_tokens: usize,
    state_slot: Option<u32>,
    /// Slots holding the state after each verified token during a
    /// speculative step (hybrid models); held for that step only.
    checkpoint_slots: Vec<u32>,
}

impl SequenceCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start from a prefix-cache hit: `blocks` (already retained for this
    /// sequence by [`super::RadixCache::match_prefix`]) hold `num_tokens` positions.
    pub fn from_prefix(blocks: Vec<u32>, num_tokens: usize) -> Self {
        Self {
            block_table: blocks,
            num_tokens,
            state_slot: None,
            checkpoint_slots: Vec::new(),
        }
    }

    pub fn block_table(&self) -> &[u32] {
        &self.block_table
    }

    /// Positions whose keys/values (and state) are computed.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn state_slot(&self) -> Option<u32> {
        self.state_slot
    }

    /// Positions the current pages can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.block_table.len() * block_size
    }

    /// Pages still to allocate before the sequence can hold `new_len` positions.
    pub fn blocks_needed(&self, new_len: usize, block_size: usize) -> usize {
        new_len
            .div_ceil(block_size.max(1))
            .saturating_sub(self.block_table.len())
    }

    /// Grow the block table to hold `new_len` positions, all or nothing: on
    /// `OutOfBlocks` nothing was taken, so the caller can evict or preempt and retry.
    pub fn ensure_capacity(
        &mut self,
        new_len: usize,
        block_size: usize,
        allocator: &mut BlockAllocator,
    ) -> Result<(), CacheError> {
        if block_size == 0 {
            return Err(CacheError::Invalid("block_size must be positive".into()));
        }
        let needed = self.blocks_needed(new_len, block_size);
        allocator.allocate_into(needed, &mut self.block_table)
    }

    /// Record that positions `0..num_tokens` are now computed.
    pub fn set_num_tokens(
        &mut self,
        num_tokens: usize,
        block_size: usize,
    ) -> Result<(), CacheError> {
        if num_tokens > self.capacity(block_size) {
            return Err(CacheError::Invalid(format!(
                "{num_tokens} tokens do not fit in {} pages of {block_size}",
                self.block_table.len()
            )));
        }
        self.num_tokens = num_tokens;
        Ok(())
    }

    /// Take a state slot for this sequence (hybrid models); the engine then
    /// zeroes it or copies a prefix-cache snapshot into it.
    pub fn attach_state_slot(&mut self, slots: &mut StateSlots) -> Result<u32, CacheError> {
        if let Some(slot) = self.state_slot {
            return Ok(slot);
        }
        let slot = slots.allocate()?;
        self.state_slot = Some(slot);
        Ok(slot)
    }

    pub fn checkpoint_slots(&self) -> &[u32] {
        &self.checkpoint_slots
    }

    /// Take `n` checkpoint slots for a speculative step, all or nothing.
    pub fn attach_checkpoint_slots(
        &mut self,
        n: usize,
        slots: &mut StateSlots,
    ) -> Result<(), CacheError> {
        if n > slots.num_free() {
            return Err(CacheError::Invalid(format!(
                "{n} checkpoint slots asked, {} free",
                slots.num_free()
            )));
        }
        for _ in 0..n {
            let slot = slots.allocate()?;
            self.checkpoint_slots.push(slot);
        }
        Ok(())
    }

    /// Keep checkpoint `i`'s state as the sequence's state: the two slots
    /// trade places, so the old live slot goes back with the other
    /// checkpoints and no state is copied. False when there is no such
    /// checkpoint or no live slot.
    pub fn keep_checkpoint(&mut self, i: usize) -> bool {
        match (self.checkpoint_slots.get_mut(i), self.state_slot.as_mut()) {
            (Some(checkpoint), Some(live)) => {
                std::mem::swap(checkpoint, live);
                true
            }
            _ => false,
        }
    }

    /// Give the checkpoint slots back (the step is over).
    pub fn release_checkpoint_slots(&mut self, slots: &mut StateSlots) -> Result<(), CacheError> {
        let mut first_error = None;
        for slot in self.checkpoint_slots.drain(..) {
            if let Err(e) = slots.free(slot) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Give back every page reference and the slot; the sequence is empty
    /// afterwards (finished, aborted, or preempted for recompute). All
    /// references are dropped even if one fails; the first error is returned.
    pub fn release(
        &mut self,
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<(), CacheError> {
        let mut first_error = None;
        for page in self.block_table.drain(..) {
            if let Err(e) = allocator.free(page) {
                first_error.get_or_insert(e);
            }
        }
        if let Some(slot) = self.state_slot.take()
            && let Err(e) = slots.free(slot)
        {
            first_error.get_or_insert(e);
        }
        if let Err(e) = self.release_checkpoint_slots(slots) {
            first_error.get_or_insert(e);
        }
        self.num_tokens = 0;
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_checkpoint_becomes_the_live_slot_and_the_old_one_goes_back() {
        let mut slots = StateSlots::new(4);
        let mut s = SequenceCache::new();
        let live = s.attach_state_slot(&mut slots).unwrap();
        s.attach_checkpoint_slots(3, &mut slots).unwrap();
        let checkpoints = s.checkpoint_slots().to_vec();
        assert!(!s.keep_checkpoint(3), "no fourth checkpoint");
        assert!(s.keep_checkpoint(1));
        assert_eq!(s.state_slot(), Some(checkpoints[1]));
        assert_eq!(s.checkpoint_slots(), [checkpoints[0], live, checkpoints[2]]);
        s.release_checkpoint_slots(&mut slots).unwrap();
        assert_eq!(slots.num_free(), 3);
        assert!(!s.keep_checkpoint(0), "the step is over");
    }

    #[test]
    fn grows_by_whole_blocks() {
        let mut a = BlockAllocator::new(8);
        let mut s = StateSlots::new(1);
        let mut seq = SequenceCache::new();
        assert_eq!(seq.blocks_needed(1, 4), 1);
        seq.ensure_capacity(5, 4, &mut a).unwrap();
        assert_eq!(seq.block_table().len(), 2);
        seq.ensure_capacity(8, 4, &mut a).unwrap();
        assert_eq!(
            seq.block_table().len(),
            2,
            "8 positions fit in 2 pages of 4"
        );
        seq.ensure_capacity(9, 4, &mut a).unwrap();
        assert_eq!(seq.block_table().len(), 3);
        seq.set_num_tokens(9, 4).unwrap();
        assert!(seq.set_num_tokens(13, 4).is_err());
        seq.attach_state_slot(&mut s).unwrap();
        assert_eq!(a.num_free(), 5);
        seq.release(&mut a, &mut s).unwrap();
        assert_eq!((a.num_free(), s.num_free()), (8, 1));
        assert_eq!(seq, SequenceCache::new());
    }

    #[test]
    fn exhaustion_takes_nothing() {
        let mut a = BlockAllocator::new(3);
        let mut seq = SequenceCache::new();
        seq.ensure_capacity(4, 4, &mut a).unwrap();
        assert!(matches!(
            seq.ensure_capacity(20, 4, &mut a),
            Err(CacheError::OutOfBlocks {
                requested: 4,
                free: 2
            })
        ));
        assert_eq!(seq.block_table().len(), 1);
        assert_eq!(a.num_free(), 2);
        assert!(seq.ensure_capacity(4, 0, &mut a).is_err());
    }
}
