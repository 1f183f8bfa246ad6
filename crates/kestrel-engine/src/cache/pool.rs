//! Fixed pools of ids with reference counts: KV pages and state slots.

use super::CacheError;

/// Ids `0..total`, each free or held with a positive reference count.
#[derive(Clone, Debug)]
struct RefCountedPool {
    kind: &'static str,
    ref_counts: Vec<u32>,
    /// Free ids, popped from the back; starts so that low ids go first.
    free: Vec<u32>,
}

impl RefCountedPool {
    fn new(kind: &'static str, total: u32) -> Self {
        Self {
            kind,
            ref_counts: vec![0; total as usize],
            free: (0..total).rev().collect(),
        }
    }

    fn check(&self, id: u32) -> Result<usize, CacheError> {
        let index = id as usize;
        if index >= self.ref_counts.len() {
            return Err(CacheError::UnknownId {
                kind: self.kind,
                id,
                total: self.ref_counts.len(),
            });
        }
        if self.ref_counts[index] == 0 {
            return Err(CacheError::NotAllocated {
                kind: self.kind,
                id,
            });
        }
        Ok(index)
    }

    fn allocate_into(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
        if n > self.free.len() {
            return false;
        }
        let start = self.free.len() - n;
        for &id in self.free[start..].iter().rev() {
            self.ref_counts[id as usize] = 1;
            out.push(id);
        }
        self.free.truncate(start);
        true
    }

    fn retain(&mut self, id: u32) -> Result<(), CacheError> {
        let index = self.check(id)?;
        self.ref_counts[index] += 1;
        Ok(())
    }

    /// Drop one reference; `true` when the id went back to the free list.
    fn release(&mut self, id: u32) -> Result<bool, CacheError> {
        let index = self.check(id)?;
        self.ref_counts[index] -= 1;
        if self.ref_counts[index] == 0 {
            self.free.push(id);
            return Ok(true);
        }
        Ok(false)
    }

    fn ref_count(&self, id: u32) -> u32 {
        self.ref_counts.get(id as usize).copied().unwrap_or(0)
    }
}

/// Reference-counted KV page ids.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    pool: RefCountedPool,
}

impl BlockAllocator {
    pub fn new(num_blocks: u32) -> Self {
        Self {
            pool: RefCountedPool::new("KV page", num_blocks),
        }
    }

    /// `n` fresh pages with one reference each, all or nothing.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<u32>, CacheError> {
        let mut pages = Vec::with_capacity(n);
        self.allocate_into(n, &mut pages)?;
        Ok(pages)
    }

    /// Append `n` fresh pages to `out`, all or nothing.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<u32>) -> Result<(), CacheError> {
        if self.pool.allocate_into(n, out) {
            Ok(())
        } else {
            Err(CacheError::OutOfBlocks {
                requested: n,
                free: self.num_free(),
            })
        }
    }

    /// Add a reference to an allocated page (sharing it).
    pub fn retain(&mut self, page: u32) -> Result<(), CacheError> {
        self.pool.retain(page)
    }

    /// Drop one reference; `true` when the page became free.
    pub fn free(&mut self, page: u32) -> Result<bool, CacheError> {
        self.pool.release(page)
    }

    /// References held on `page`; 0 when it is free.
    pub fn ref_count(&self, page: u32) -> u32 {
        self.pool.ref_count(page)
    }

    pub fn num_free(&self) -> usize {
        self.pool.free.len()
    }

    pub fn num_total(&self) -> usize {
        self.pool.ref_counts.len()
    }

    /// Fraction of pages in use, for `kv_cache_usage_perc`.
    pub fn usage(&self) -> f64 {
        match self.num_total() {
            0 => 0.0,
            total => 1.0 - self.num_free() as f64 / total as f64,
        }
    }
}

/// Recurrent-state slot ids, each owned by exactly one holder (a running
/// sequence or a prefix-cache snapshot); a sequence resuming from a snapshot
/// copies it into its own slot rather than sharing it, since the state is
/// updated in place.
#[derive(Clone, Debug)]
pub struct StateSlots {
    pool: RefCountedPool,
}

impl StateSlots {
    pub fn new(num_slots: u32) -> Self {
        Self {
            pool: RefCountedPool::new("state slot", num_slots),
        }
    }

    pub fn allocate(&mut self) -> Result<u32, CacheError> {
        let mut slot = Vec::with_capacity(1);
        if self.pool.allocate_into(1, &mut slot) {
            Ok(slot[0])
        } else {
            Err(CacheError::OutOfStateSlots {
                total: self.num_total(),
            })
        }
    }

    pub fn free(&mut self, slot: u32) -> Result<(), CacheError> {
        self.pool.release(slot).map(|_| ())
    }

    pub fn is_allocated(&self, slot: u32) -> bool {
        self.pool.ref_count(slot) > 0
    }

    pub fn num_free(&self) -> usize {
        self.pool.free.len()
    }

    pub fn num_total(&self) -> usize {
        self.pool.ref_counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_and_free_round_trip() {
        let mut a = BlockAllocator::new(4);
        assert_eq!(a.num_free(), 4);
        let pages = a.allocate(3).unwrap();
        assert_eq!(pages, vec![0, 1, 2]);
        assert_eq!(a.num_free(), 1);
        assert!((a.usage() - 0.75).abs() < 1e-12);
        assert_eq!(
            a.allocate(2),
            Err(CacheError::OutOfBlocks {
                requested: 2,
                free: 1
            })
        );
        assert_eq!(a.num_free(), 1, "a failed allocation takes nothing");
        for p in pages {
            assert_eq!(a.free(p), Ok(true));
        }
        assert_eq!(a.num_free(), 4);
        assert_eq!(a.allocate(0).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn shared_pages_free_on_last_reference() {
        let mut a = BlockAllocator::new(2);
        let p = a.allocate(1).unwrap()[0];
        a.retain(p).unwrap();
        assert_eq!(a.ref_count(p), 2);
        assert_eq!(a.free(p), Ok(false));
        assert_eq!(a.num_free(), 1);
        assert_eq!(a.free(p), Ok(true));
        assert_eq!(a.num_free(), 2);
    }

    #[test]
    fn misuse_is_an_error() {
        let mut a = BlockAllocator::new(2);
        let p = a.allocate(1).unwrap()[0];
        a.free(p).unwrap();
        assert_eq!(
            a.free(p),
            Err(CacheError::NotAllocated {
                kind: "KV page",
                id: p
            })
        );
        assert!(matches!(a.retain(p), Err(CacheError::NotAllocated { .. })));
        assert!(matches!(
            a.free(7),
            Err(CacheError::UnknownId { id: 7, .. })
        ));
        assert_eq!(a.num_free(), 2, "errors leave the pool unchanged");
    }

    #[test]
    fn state_slots_are_exclusive() {
        let mut s = StateSlots::new(2);
        let a = s.allocate().unwrap();
        let b = s.allocate().unwrap();
        assert_ne!(a, b);
        assert_eq!(s.allocate(), Err(CacheError::OutOfStateSlots { total: 2 }));
        s.free(a).unwrap();
        assert!(!s.is_allocated(a));
        assert!(matches!(s.free(a), Err(CacheError::NotAllocated { .. })));
        assert_eq!(s.allocate(), Ok(a));
        s.free(a).unwrap();
        s.free(b).unwrap();
        assert_eq!(s.num_free(), 2);
    }
}
