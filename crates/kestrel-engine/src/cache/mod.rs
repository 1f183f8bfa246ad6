//! Plain bookkeeping of cache resources; no device memory is touched here.
//!
//! * [`BlockAllocator`]: reference-counted KV page ids. A page is shared by
//!   every sequence using it and by the prefix cache; it returns to the free
//!   list when the last reference goes.
//! * [`StateSlots`]: recurrent-state slot ids of the Gated DeltaNet layers,
//!   each owned by one running sequence or one prefix-cache snapshot.
//! * [`SequenceCache`]: one sequence's block table, token count and slot.
//! * [`RadixCache`]: the prefix cache over full blocks.
//!
//! The backend owns the memory behind these ids (`kestrel_core::CacheSpec`:
//! `num_blocks` pages of `block_size` positions, `num_state_slots` slots).

mod block_hash;
mod pool;
mod radix;
mod sequence;

pub use block_hash::BlockHash;
pub use pool::{BlockAllocator, StateSlots};
pub use radix::{PrefixCacheStats, PrefixMatch, RadixCache};
pub use sequence::SequenceCache;

/// Misuse or exhaustion of a cache resource. Exhaustion is expected under
/// load (the scheduler evicts or preempts and retries); the other variants
/// point at a bookkeeping bug and must not be silently ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("out of KV pages: {requested} requested, {free} free")]
    OutOfBlocks { requested: usize, free: usize },
    #[error("out of recurrent-state slots ({total} in all)")]
    OutOfStateSlots { total: usize },
    #[error("{kind} {id} does not exist (pool of {total})")]
    UnknownId {
        kind: &'static str,
        id: u32,
        total: usize,
    },
    #[error("{kind} {id} is not allocated (double free or use after free)")]
    NotAllocated { kind: &'static str, id: u32 },
    #[error("{0}")]
    Invalid(String),
}
