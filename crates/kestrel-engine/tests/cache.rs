//! Prefix cache, allocator and sequence bookkeeping working together.

use kestrel_engine::cache::{
    BlockAllocator, CacheError, PrefixMatch, RadixCache, SequenceCache, StateSlots,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: usize = 4;

struct Pools {
    alloc: BlockAllocator,
    slots: StateSlots,
}

impl Pools {
    fn new(blocks: u32, slots: u32) -> Self {
        Self {
            alloc: BlockAllocator::new(blocks),
            slots: StateSlots::new(slots),
        }
    }

    /// Run a sequence over `tokens` the way the engine would: match, allocate
    /// the rest, "compute", then offer its blocks to the cache.
    fn run(&mut self, cache: &mut RadixCache, tokens: &[u32]) -> (SequenceCache, PrefixMatch) {
        let hit = cache.match_prefix(tokens, b"", &mut self.alloc).unwrap();
        let mut seq = SequenceCache::from_prefix(hit.blocks.clone(), hit.num_tokens);
        seq.ensure_capacity(tokens.len(), BS, &mut self.alloc)
            .unwrap();
        seq.set_num_tokens(tokens.len(), BS).unwrap();
        cache
            .insert(
                tokens,
                b"",
                seq.block_table(),
                &[],
                &mut self.alloc,
                &mut self.slots,
            )
            .unwrap();
        (seq, hit)
    }

    fn release(&mut self, mut seq: SequenceCache) {
        seq.release(&mut self.alloc, &mut self.slots).unwrap();
    }
}

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn shared_prefix_is_reused_and_refcounted() {
    let mut p = Pools::new(16, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    let a_tokens = toks(0..10); // 2 full blocks + 2 tokens
    let (a, hit) = p.run(&mut cache, &a_tokens);
    assert_eq!(hit.num_tokens, 0);
    assert_eq!(cache.num_blocks(), 2, "the partial block is not cached");
    // Same first 8 tokens, then different.
    let mut b_tokens = toks(0..8);
    b_tokens.extend([100, 101, 102]);
    let (b, hit) = p.run(&mut cache, &b_tokens);
    assert_eq!(hit.num_tokens, 8);
    assert_eq!(hit.blocks, a.block_table()[..2]);
    assert_eq!(b.block_table()[..2], a.block_table()[..2]);
    assert_ne!(b.block_table()[2], a.block_table()[2]);
    // Shared pages: held by a, b and the cache.
    for &page in &a.block_table()[..2] {
        assert_eq!(p.alloc.ref_count(page), 3);
    }
    assert_eq!(p.alloc.num_free(), 16 - 4);
    p.release(a);
    p.release(b);
    assert_eq!(p.alloc.num_free(), 16 - 2, "only the cache's pages remain");
    assert_eq!(cache.stats().hit_tokens, 8);
    assert_eq!(cache.stats().queried_tokens, 21);
}

#[test]
fn full_prompt_hit_leaves_the_last_block_to_compute() {
    let mut p = Pools::new(16, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    let tokens = toks(0..12); // exactly 3 blocks
    let (a, _) = p.run(&mut cache, &tokens);
    assert_eq!(cache.num_blocks(), 3);
    let hit = cache.match_prefix(&tokens, b"", &mut p.alloc).unwrap();
    assert_eq!(hit.num_tokens, 8, "at least one token must be recomputed");
    let mut seq = SequenceCache::from_prefix(hit.blocks, hit.num_tokens);
    seq.ensure_capacity(12, BS, &mut p.alloc).unwrap();
    assert_ne!(
        seq.block_table()[2],
        a.block_table()[2],
        "recomputed into a fresh page"
    );
    // One more token than a block boundary: all full blocks are usable.
    let hit13 = cache.match_prefix(&toks(0..13), b"", &mut p.alloc).unwrap();
    assert_eq!(hit13.num_tokens, 12);
    let seq13 = SequenceCache::from_prefix(hit13.blocks, hit13.num_tokens);
    p.release(seq);
    p.release(seq13);
    p.release(a);
    // Empty and single-token prompts never hit.
    assert_eq!(
        cache
            .match_prefix(&[], b"", &mut p.alloc)
            .unwrap()
            .num_tokens,
        0
    );
    assert_eq!(
        cache
            .match_prefix(&[0], b"", &mut p.alloc)
            .unwrap()
            .num_tokens,
        0
    );
}

#[test]
fn salts_isolate_tenants() {
    let mut p = Pools::new(8, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    let tokens = toks(0..9);
    let mut seq = SequenceCache::new();
    seq.ensure_capacity(9, BS, &mut p.alloc).unwrap();
    cache
        .insert(
            &tokens,
            b"alice",
            seq.block_table(),
            &[],
            &mut p.alloc,
            &mut p.slots,
        )
        .unwrap();
    assert_eq!(
        cache
            .match_prefix(&tokens, b"bob", &mut p.alloc)
            .unwrap()
            .num_tokens,
        0
    );
    assert_eq!(
        cache
            .match_prefix(&tokens, b"", &mut p.alloc)
            .unwrap()
            .num_tokens,
        0
    );
    let hit = cache.match_prefix(&tokens, b"alice", &mut p.alloc).unwrap();
    assert_eq!(hit.num_tokens, 8);
    p.release(SequenceCache::from_prefix(hit.blocks, hit.num_tokens));
    p.release(seq);
}

#[test]
fn eviction_is_lru_over_unreferenced_leaves() {
    let mut p = Pools::new(32, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    // Three prompts of 2 blocks, sharing no blocks.
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| toks(i * 100..i * 100 + 9)).collect();
    for prompt in &prompts {
        let (seq, _) = p.run(&mut cache, prompt);
        p.release(seq);
    }
    assert_eq!(cache.num_blocks(), 6);
    // Touch prompt 0 again so prompt 1 is now the least recently used.
    let hit = cache.match_prefix(&prompts[0], b"", &mut p.alloc).unwrap();
    p.release(SequenceCache::from_prefix(hit.blocks, hit.num_tokens));
    // Evicting 2 removes prompt 1 entirely (leaf first, then its parent).
    assert_eq!(cache.evict(2, &mut p.alloc, &mut p.slots), Ok(2));
    let probe = |cache: &mut RadixCache, p: &mut Pools, i: usize| {
        let hit = cache.match_prefix(&prompts[i], b"", &mut p.alloc).unwrap();
        let n = hit.num_tokens;
        p.release(SequenceCache::from_prefix(hit.blocks, n));
        n
    };
    assert_eq!(probe(&mut cache, &mut p, 1), 0);
    // Prompt 2 (inserted before prompt 0 was touched again) goes next.
    assert_eq!(cache.evict(1, &mut p.alloc, &mut p.slots), Ok(1));
    assert_eq!(probe(&mut cache, &mut p, 0), 8);
    assert_eq!(probe(&mut cache, &mut p, 2), 4, "its leaf went first");
    // Now prompt 2 is the most recent: prompt 0's leaf goes first.
    assert_eq!(cache.evict(1, &mut p.alloc, &mut p.slots), Ok(1));
    assert_eq!(probe(&mut cache, &mut p, 2), 4);
    assert_eq!(probe(&mut cache, &mut p, 0), 4);
    assert_eq!(cache.evict(100, &mut p.alloc, &mut p.slots), Ok(2));
    assert_eq!(cache.num_blocks(), 0);
    assert_eq!(p.alloc.num_free(), 32);
}

#[test]
fn pages_in_use_are_never_evicted() {
    let mut p = Pools::new(16, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    let (running, _) = p.run(&mut cache, &toks(0..9));
    let (done, _) = p.run(&mut cache, &toks(50..59));
    p.release(done);
    assert_eq!(cache.evict(10, &mut p.alloc, &mut p.slots), Ok(2));
    assert_eq!(cache.num_blocks(), 2, "the running sequence's blocks stay");
    // A sequence holding only the first block pins that block; its child is evictable.
    let hit = cache.match_prefix(&toks(0..5), b"", &mut p.alloc).unwrap();
    assert_eq!(hit.num_tokens, 4);
    let holder = SequenceCache::from_prefix(hit.blocks, hit.num_tokens);
    p.release(running);
    assert_eq!(cache.evict(10, &mut p.alloc, &mut p.slots), Ok(1));
    assert_eq!(cache.num_blocks(), 1);
    p.release(holder);
    assert_eq!(cache.evict(10, &mut p.alloc, &mut p.slots), Ok(1));
    assert_eq!(p.alloc.num_free(), 16);
}

#[test]
fn hybrid_hits_stop_at_the_deepest_snapshot() {
    let mut p = Pools::new(16, 4);
    let mut cache = RadixCache::new_hybrid(BS).unwrap();
    let tokens = toks(0..17); // 4 full blocks
    let mut seq = SequenceCache::new();
    seq.ensure_capacity(17, BS, &mut p.alloc).unwrap();
    seq.attach_state_slot(&mut p.slots).unwrap();
    // Snapshots after block 0 and block 2 (positions 4 and 12).
    let s0 = p.slots.allocate().unwrap();
    let s2 = p.slots.allocate().unwrap();
    let new = cache
        .insert(
            &tokens,
            b"",
            seq.block_table(),
            &[(0, s0), (2, s2)],
            &mut p.alloc,
            &mut p.slots,
        )
        .unwrap();
    assert_eq!(new, 4);
    assert_eq!(cache.num_snapshots(), 2);
    p.release(seq);

    let mut probe = |n: u32| {
        let hit = cache.match_prefix(&toks(0..n), b"", &mut p.alloc).unwrap();
        let out = (hit.num_tokens, hit.state_snapshot);
        p.release(SequenceCache::from_prefix(hit.blocks, hit.num_tokens));
        out
    };
    assert_eq!(probe(17), (12, Some(s2)), "block 3 has no snapshot");
    assert_eq!(probe(12), (4, Some(s0)), "block 2 must stay uncomputed");
    assert_eq!(probe(5), (4, Some(s0)));
    assert_eq!(probe(4), (0, None));

    // Dropping the deep snapshot shortens hits; the blocks stay.
    assert_eq!(cache.evict_snapshots(1, &p.alloc, &mut p.slots), Ok(1));
    assert_eq!(cache.num_snapshots(), 1);
    assert_eq!(p.slots.num_free(), 3);
    let hit = cache.match_prefix(&tokens, b"", &mut p.alloc).unwrap();
    assert_eq!(hit.state_snapshot, Some(s0), "LRU: s0 was touched later");
    p.release(SequenceCache::from_prefix(hit.blocks, hit.num_tokens));

    cache.evict(usize::MAX, &mut p.alloc, &mut p.slots).unwrap();
    assert_eq!((p.alloc.num_free(), p.slots.num_free()), (16, 4));
}

#[test]
fn snapshots_without_a_home_are_freed() {
    let mut p = Pools::new(16, 4);
    let mut cache = RadixCache::new_hybrid(BS).unwrap();
    let tokens = toks(0..9);
    let mut seq = SequenceCache::new();
    seq.ensure_capacity(9, BS, &mut p.alloc).unwrap();
    let a = p.slots.allocate().unwrap();
    let b = p.slots.allocate().unwrap();
    let beyond = p.slots.allocate().unwrap();
    // `beyond` names the partial block, which is never cached.
    cache
        .insert(
            &tokens,
            b"",
            seq.block_table(),
            &[(1, a), (2, beyond)],
            &mut p.alloc,
            &mut p.slots,
        )
        .unwrap();
    assert!(!p.slots.is_allocated(beyond));
    // The block already has a snapshot: the second one is freed.
    cache
        .insert(
            &tokens,
            b"",
            seq.block_table(),
            &[(1, b)],
            &mut p.alloc,
            &mut p.slots,
        )
        .unwrap();
    assert!(!p.slots.is_allocated(b));
    assert!(p.slots.is_allocated(a));
    // A block cached without a snapshot adopts one offered later.
    let hit = cache.match_prefix(&tokens, b"", &mut p.alloc).unwrap();
    assert_eq!((hit.num_tokens, hit.state_snapshot), (8, Some(a)));
    p.release(SequenceCache::from_prefix(hit.blocks, hit.num_tokens));
    let late = p.slots.allocate().unwrap();
    cache
        .insert(
            &tokens,
            b"",
            seq.block_table(),
            &[(0, late)],
            &mut p.alloc,
            &mut p.slots,
        )
        .unwrap();
    assert!(p.slots.is_allocated(late));
    assert_eq!(cache.num_snapshots(), 2);
    // A disabled cache frees what it is offered.
    let mut off = RadixCache::disabled(BS).unwrap();
    let c = p.slots.allocate().unwrap();
    assert_eq!(
        off.insert(
            &tokens,
            b"",
            seq.block_table(),
            &[(0, c)],
            &mut p.alloc,
            &mut p.slots
        ),
        Ok(0)
    );
    assert!(!p.slots.is_allocated(c));
    assert_eq!(
        off.match_prefix(&tokens, b"", &mut p.alloc)
            .unwrap()
            .num_tokens,
        0
    );
    p.release(seq);
    cache.clear(&mut p.alloc, &mut p.slots).unwrap();
    assert_eq!((p.alloc.num_free(), p.slots.num_free()), (16, 4));
}

#[test]
fn bad_inserts_change_nothing() {
    let mut p = Pools::new(8, 2);
    let mut cache = RadixCache::new(BS).unwrap();
    let tokens = toks(0..9);
    let mut seq = SequenceCache::new();
    seq.ensure_capacity(4, BS, &mut p.alloc).unwrap();
    // Too few pages for the tokens.
    assert!(matches!(
        cache.insert(
            &tokens,
            b"",
            seq.block_table(),
            &[],
            &mut p.alloc,
            &mut p.slots
        ),
        Err(CacheError::Invalid(_))
    ));
    // A page that is not allocated.
    assert!(matches!(
        cache.insert(&tokens[..4], b"", &[7], &[], &mut p.alloc, &mut p.slots),
        Err(CacheError::NotAllocated { .. })
    ));
    // A snapshot slot that is not allocated.
    assert!(matches!(
        cache.insert(
            &tokens[..4],
            b"",
            seq.block_table(),
            &[(0, 1)],
            &mut p.alloc,
            &mut p.slots
        ),
        Err(CacheError::NotAllocated { .. })
    ));
    assert_eq!(cache.num_blocks(), 0);
    p.release(seq);
    assert_eq!(p.alloc.num_free(), 8);
    assert!(RadixCache::new(0).is_err());
}

#[test]
fn turning_the_cache_off_drops_it() {
    let mut p = Pools::new(8, 0);
    let mut cache = RadixCache::new(BS).unwrap();
    let (seq, _) = p.run(&mut cache, &toks(0..9));
    cache
        .set_enabled(false, &mut p.alloc, &mut p.slots)
        .unwrap();
    assert_eq!(cache.num_blocks(), 0);
    assert_eq!(
        p.alloc.num_free(),
        8 - 3,
        "the running sequence keeps its pages"
    );
    p.release(seq);
    assert_eq!(p.alloc.num_free(), 8);
    let (seq, hit) = p.run(&mut cache, &toks(0..9));
    assert_eq!((hit.num_tokens, cache.num_blocks()), (0, 0));
    p.release(seq);
}

/// Many random sequences over a small alphabet (so prefixes are shared),
/// with snapshots, eviction under pressure, and random release order: at the
/// end every page and slot must be back.
#[test]
fn random_workload_leaks_nothing() {
    const PAGES: u32 = 64;
    const SLOTS: u32 = 24;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let mut p = Pools::new(PAGES, SLOTS);
    let mut cache = RadixCache::new_hybrid(BS).unwrap();
    let mut running: Vec<(SequenceCache, Vec<u32>)> = Vec::new();
    let mut hits = 0;
    for _ in 0..2000 {
        if !running.is_empty() && (running.len() >= 6 || rng.random_bool(0.5)) {
            let (mut seq, tokens) = running.swap_remove(rng.random_range(0..running.len()));
            // Snapshot every other full block, as a hybrid engine might.
            let mut snaps = Vec::new();
            for b in (0..tokens.len() / BS).step_by(2) {
                match p.slots.allocate() {
                    Ok(s) => snaps.push((b, s)),
                    Err(_) => {
                        if cache.evict_snapshots(1, &p.alloc, &mut p.slots).unwrap() == 1 {
                            snaps.push((b, p.slots.allocate().unwrap()));
                        }
                    }
                }
            }
            cache
                .insert(
                    &tokens,
                    b"",
                    seq.block_table(),
                    &snaps,
                    &mut p.alloc,
                    &mut p.slots,
                )
                .unwrap();
            seq.release(&mut p.alloc, &mut p.slots).unwrap();
            continue;
        }
        let len = rng.random_range(1..40);
        let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..2)).collect();
        let hit = cache.match_prefix(&tokens, b"", &mut p.alloc).unwrap();
        hits += hit.num_tokens;
        let mut seq = SequenceCache::from_prefix(hit.blocks, hit.num_tokens);
        let admitted = loop {
            match seq.ensure_capacity(tokens.len(), BS, &mut p.alloc) {
                Ok(()) => break true,
                Err(CacheError::OutOfBlocks { requested, .. }) => {
                    if cache.evict(requested, &mut p.alloc, &mut p.slots).unwrap() == 0 {
                        break false;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        };
        let slot = seq.attach_state_slot(&mut p.slots).or_else(|_| {
            cache.evict_snapshots(1, &p.alloc, &mut p.slots)?;
            seq.attach_state_slot(&mut p.slots)
        });
        if !admitted || slot.is_err() {
            seq.release(&mut p.alloc, &mut p.slots).unwrap();
            continue;
        }
        seq.set_num_tokens(tokens.len(), BS).unwrap();
        running.push((seq, tokens));
    }
    assert!(hits > 1000, "the workload should exercise hits, got {hits}");
    for (mut seq, _) in running {
        seq.release(&mut p.alloc, &mut p.slots).unwrap();
    }
    let cached = cache.num_blocks();
    assert!(cached > 0);
    assert_eq!(p.alloc.num_free(), PAGES as usize - cached);
    assert_eq!(
        cache.evict(usize::MAX, &mut p.alloc, &mut p.slots).unwrap(),
        cached
    );
    assert_eq!(p.alloc.num_free(), PAGES as usize);
    assert_eq!(p.slots.num_free(), SLOTS as usize);
    assert_eq!(cache.num_blocks(), 0);
}
