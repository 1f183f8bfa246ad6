//! The prefix cache: full blocks of tokens already computed by earlier
//! requests, found again by the hash of the block and its whole prefix.
//!
//! Rules:
//! * Only **full** blocks are cached. A sequence's last partial block stays
//!   private, so a shared page is never written and no copy-on-write exists.
//! * A hit always leaves at least one prompt token to compute, because the
//!   logits of the next token come from running the last prompt token. A
//!   prompt that is an exact multiple of the block size therefore reuses all
//!   but its last block and recomputes that block (the page is fresh, so the
//!   rewrite does not touch the cached copy).
//! * The cache holds one reference on every page it knows; each sequence
//!   using a page holds another. Only leaves whose page has no reference but
//!   the cache's are evicted (least recently used first), so pages in use are
//!   never evicted and a parent goes only after its children.
//! * Hybrid models (Gated DeltaNet layers) also need the recurrent state at
//!   the resume point. Blocks may carry a snapshot slot taken at their end;
//!   a hit is usable only up to the deepest matched block with a snapshot.
//!
//! Blocks are keyed by [`BlockHash`]; the stored tokens are compared as well,
//! so even a hash collision cannot return another prompt's keys/values.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::{BlockAllocator, BlockHash, CacheError, StateSlots};

/// What [`RadixCache::match_prefix`] found. The pages are already retained
/// for the caller: hand them to [`super::SequenceCache::from_prefix`], whose
/// release gives them back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    pub blocks: Vec<u32>,
    /// Positions covered by `blocks` (a multiple of the block size).
    pub num_tokens: usize,
    /// The cache's snapshot of the recurrent state after `num_tokens`
    /// positions, if the deepest matched block has one. It stays owned by the
    /// cache: copy it into the sequence's own slot before the next eviction.
    pub state_snapshot: Option<u32>,
}

/// Counters in tokens, as vLLM's `prefix_cache_queries_total` / `_hits_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queried_tokens: u64,
    pub hit_tokens: u64,
}

#[derive(Clone, Debug)]
struct Node {
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
    page: u32,
    snapshot: Option<u32>,
    num_children: u32,
    last_access: u64,
}

/// A tree of cached blocks, each node linked to its parent by hash.
#[derive(Clone, Debug)]
pub struct RadixCache {
    block_size: usize,
    enabled: bool,
    require_snapshots: bool,
    nodes: HashMap<BlockHash, Node>,
    /// Logical time for LRU; advanced once per match or insert.
    clock: u64,
    stats: PrefixCacheStats,
}

impl RadixCache {
    /// A prefix cache for attention-only models.
    pub fn new(block_size: usize) -> Result<Self, CacheError> {
        if block_size == 0 {
            return Err(CacheError::Invalid("block_size must be positive".into()));
        }
        Ok(Self {
            block_size,
            enabled: true,
            require_snapshots: false,
            nodes: HashMap::new(),
            clock: 0,
            stats: PrefixCacheStats::default(),
        })
    }

    /// A prefix cache for hybrid models: hits end at a state snapshot.
    pub fn new_hybrid(block_size: usize) -> Result<Self, CacheError> {
        Ok(Self {
            require_snapshots: true,
            ..Self::new(block_size)?
        })
    }

    /// A cache that never matches and never stores (`--no-prefix-caching`).
    pub fn disabled(block_size: usize) -> Result<Self, CacheError> {
        Ok(Self {
            enabled: false,
            ..Self::new(block_size)?
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Turn caching on or off at run time; turning it off drops every entry.
    pub fn set_enabled(
        &mut self,
        enabled: bool,
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<(), CacheError> {
        if !enabled {
            self.clear(allocator, slots)?;
        }
        self.enabled = enabled;
        Ok(())
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Cached blocks (each holds one page reference).
    pub fn num_blocks(&self) -> usize {
        self.nodes.len()
    }

    /// Cached pages no sequence uses (only the cache's reference): they can
    /// all be evicted, children first. At idle, `allocator.num_free()` plus
    /// this equals the pool size.
    pub fn num_unused_blocks(&self, allocator: &BlockAllocator) -> usize {
        self.nodes
            .values()
            .filter(|n| allocator.ref_count(n.page) == 1)
            .count()
    }

    /// State slots owned by the cache as snapshots.
    pub fn num_snapshots(&self) -> usize {
        self.nodes.values().filter(|n| n.snapshot.is_some()).count()
    }

    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Find the longest usable cached prefix of `tokens` (under `salt`, the
    /// request's `cache_salt`, empty for none) and retain its pages for the caller.
    pub fn match_prefix(
        &mut self,
        tokens: &[u32],
        salt: &[u8],
        allocator: &mut BlockAllocator,
    ) -> Result<PrefixMatch, CacheError> {
        self.match_prefix_where(tokens, salt, allocator, |_| true)
    }

    /// [`RadixCache::match_prefix`] limited to resume points the caller can
    /// use: the hit ends at the deepest matched length `n` (in tokens) with
    /// `usable(n)` (and, for hybrid caches, a snapshot). The engine uses it
    /// to resume only where a cache miss would have split the prefill too.
    pub fn match_prefix_where(
        &mut self,
        tokens: &[u32],
        salt: &[u8],
        allocator: &mut BlockAllocator,
        usable: impl Fn(usize) -> bool,
    ) -> Result<PrefixMatch, CacheError> {
        if !self.enabled {
            return Ok(PrefixMatch::default());
        }
        self.stats.queried_tokens += tokens.len() as u64;
        let now = self.tick();
        // Leave at least one token to compute so the request gets logits.
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut path = Vec::new();
        let mut hash = BlockHash::root(salt);
        for block in tokens.chunks_exact(self.block_size).take(max_blocks) {
            hash = hash.chain(block);
            match self.nodes.get(&hash) {
                Some(node) if *node.tokens == *block => path.push(hash),
                _ => break,
            }
        }
        let keep = path
            .iter()
            .enumerate()
            .rposition(|(i, h)| {
                (!self.require_snapshots || self.nodes[h].snapshot.is_some())
                    && usable((i + 1) * self.block_size)
            })
            .map_or(0, |i| i + 1);
        path.truncate(keep);
        let mut found = PrefixMatch::default();
        for hash in &path {
            let node = self.nodes.get_mut(hash).expect("path nodes exist");
            allocator.retain(node.page)?;
            node.last_access = now;
            found.blocks.push(node.page);
        }
        found.num_tokens = path.len() * self.block_size;
        found.state_snapshot = path.last().and_then(|h| self.nodes[h].snapshot);
        self.stats.hit_tokens += found.num_tokens as u64;
        Ok(found)
    }

    /// Offer a sequence's computed blocks to the cache. `tokens` are the
    /// positions whose keys/values are in `block_table` (only its full blocks
    /// are taken); `snapshots` lists `(block index, slot)` pairs holding the
    /// recurrent state after that block.
    ///
    /// Ownership: every snapshot slot passes to the cache, which keeps it or,
    /// when the block already has one or is not cached, frees it. Pages are
    /// retained, so the sequence still releases its own references as usual.
    /// On an error nothing has changed and the caller still owns the snapshots.
    /// Returns the number of blocks newly cached.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        salt: &[u8],
        block_table: &[u32],
        snapshots: &[(usize, u32)],
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<usize, CacheError> {
        let full_blocks = tokens.len() / self.block_size;
        if block_table.len() < full_blocks {
            return Err(CacheError::Invalid(format!(
                "{} tokens need {full_blocks} full pages, the block table has {}",
                tokens.len(),
                block_table.len()
            )));
        }
        if let Some(&page) = block_table[..full_blocks]
            .iter()
            .find(|&&p| allocator.ref_count(p) == 0)
        {
            return Err(CacheError::NotAllocated {
                kind: "KV page",
                id: page,
            });
        }
        if let Some(&(_, slot)) = snapshots.iter().find(|&&(_, s)| !slots.is_allocated(s)) {
            return Err(CacheError::NotAllocated {
                kind: "state slot",
                id: slot,
            });
        }

        let mut unclaimed: Vec<Option<(usize, u32)>> =
            snapshots.iter().copied().map(Some).collect();
        let mut inserted = 0;
        if self.enabled {
            let now = self.tick();
            let mut parent: Option<BlockHash> = None;
            let mut hash = BlockHash::root(salt);
            for (index, block) in tokens.chunks_exact(self.block_size).enumerate() {
                hash = hash.chain(block);
                let offered = unclaimed
                    .iter_mut()
                    .find(|s| s.is_some_and(|(i, _)| i == index));
                match self.nodes.get_mut(&hash) {
                    Some(node) if *node.tokens == *block => {
                        node.last_access = now;
                        if node.snapshot.is_none()
                            && let Some(taken) = offered
                        {
                            node.snapshot = taken.take().map(|(_, slot)| slot);
                        }
                    }
                    // A hash collision: never mix the two prompts.
                    Some(_) => break,
                    None => {
                        allocator.retain(block_table[index])?;
                        let snapshot = offered.and_then(|s| s.take()).map(|(_, slot)| slot);
                        self.nodes.insert(
                            hash,
                            Node {
                                parent,
                                tokens: block.into(),
                                page: block_table[index],
                                snapshot,
                                num_children: 0,
                                last_access: now,
                            },
                        );
                        if let Some(p) = parent {
                            self.nodes.get_mut(&p).expect("parent exists").num_children += 1;
                        }
                        inserted += 1;
                    }
                }
                parent = Some(hash);
            }
        }
        for (_, slot) in unclaimed.into_iter().flatten() {
            slots.free(slot)?;
        }
        Ok(inserted)
    }

    /// Is this node a leaf whose page only the cache references?
    fn evictable(&self, node: &Node, allocator: &BlockAllocator) -> bool {
        node.num_children == 0 && allocator.ref_count(node.page) == 1
    }

    fn remove(
        &mut self,
        hash: &BlockHash,
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<Option<BlockHash>, CacheError> {
        let node = self.nodes.remove(hash).expect("removed node exists");
        if let Some(p) = node.parent
            && let Some(parent) = self.nodes.get_mut(&p)
        {
            parent.num_children -= 1;
        }
        allocator.free(node.page)?;
        if let Some(slot) = node.snapshot {
            slots.free(slot)?;
        }
        Ok(node.parent)
    }

    /// Free up to `n_blocks` pages by dropping unreferenced leaves, least
    /// recently used first (a parent becomes a candidate once its children
    /// are gone). Snapshots of dropped blocks are freed too. Returns the
    /// number of pages freed. Costs a scan of the cache: call it when the
    /// allocator runs low, for all the pages needed at once.
    pub fn evict(
        &mut self,
        n_blocks: usize,
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<usize, CacheError> {
        if n_blocks == 0 {
            return Ok(0);
        }
        let mut heap: BinaryHeap<Reverse<(u64, BlockHash)>> = self
            .nodes
            .iter()
            .filter(|(_, n)| self.evictable(n, allocator))
            .map(|(h, n)| Reverse((n.last_access, *h)))
            .collect();
        let mut freed = 0;
        while freed < n_blocks {
            let Some(Reverse((_, hash))) = heap.pop() else {
                break;
            };
            let parent = self.remove(&hash, allocator, slots)?;
            freed += 1;
            if let Some(p) = parent
                && let Some(node) = self.nodes.get(&p)
                && self.evictable(node, allocator)
            {
                heap.push(Reverse((node.last_access, p)));
            }
        }
        Ok(freed)
    }

    /// Free up to `n` snapshot slots, least recently used first, from blocks
    /// no running sequence uses; the blocks stay cached (for hybrid models
    /// they are matchable again only up to a shallower snapshot).
    pub fn evict_snapshots(
        &mut self,
        n: usize,
        allocator: &BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<usize, CacheError> {
        let mut candidates: Vec<(u64, BlockHash)> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.snapshot.is_some() && allocator.ref_count(node.page) == 1)
            .map(|(h, node)| (node.last_access, *h))
            .collect();
        candidates.sort_unstable();
        let mut freed = 0;
        for (_, hash) in candidates.into_iter().take(n) {
            let node = self.nodes.get_mut(&hash).expect("candidate exists");
            if let Some(slot) = node.snapshot.take() {
                slots.free(slot)?;
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Drop every entry: the cache's page references and all its snapshots.
    /// Pages still used by sequences stay allocated until they are released.
    pub fn clear(
        &mut self,
        allocator: &mut BlockAllocator,
        slots: &mut StateSlots,
    ) -> Result<(), CacheError> {
        let mut first_error = None;
        for (_, node) in self.nodes.drain() {
            if let Err(e) = allocator.free(node.page) {
                first_error.get_or_insert(e);
            }
            if let Some(slot) = node.snapshot
                && let Err(e) = slots.free(slot)
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
