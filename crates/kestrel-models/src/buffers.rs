//! Host buffers reused from one packed tensor to the next.
//!
//! A fresh buffer costs a page fault per page on its first write, and the
//! faults, not the copy, set the speed of reading a checkpoint into new
//! memory (measured in `docs/benchmarks/2026-12-01-cpu-cold-load/`). The
//! layers of a model repeat the same shapes, so the buffer a tensor leaves
//! behind after its upload fits a tensor of the next layer: the loader takes
//! buffers from here and the uploading thread gives them back. The pool
//! keeps a few buffers only, so it adds a bounded amount to the host memory
//! a load holds.

use std::sync::Mutex;

/// Smaller buffers come from the allocator (cheap; its heap reuses them).
const MIN_POOLED: usize = 1 << 20;

pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool holding at most `keep` idle buffers.
    pub fn new(keep: usize) -> Self {
        BufferPool {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A buffer of `len` bytes, with unspecified contents: the idle one of
    /// the smallest capacity between `len` and twice that (so that a small
    /// tensor does not hold a large buffer), or a new zeroed one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len < MIN_POOLED {
            return vec![0u8; len];
        }
        let mut free = self.free.lock().unwrap();
        let fitting = free
            .iter()
            .enumerate()
            .filter(|(_, b)| (len..=2 * len).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let Some(i) = fitting else {
            drop(free);
            return vec![0u8; len];
        };
        let mut buffer = free.swap_remove(i);
        drop(free);
        // Within the capacity: no new pages, at most a fill of the tail.
        buffer.resize(len, 0);
        buffer
    }

    /// Hands a buffer back; past `keep` idle buffers the smallest is dropped.
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() < MIN_POOLED {
            return;
        }
        let mut free = self.free.lock().unwrap();
        free.push(buffer);
        if free.len() > self.keep
            && let Some((i, _)) = free.iter().enumerate().min_by_key(|(_, b)| b.capacity())
        {
            free.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BufferPool;

    #[test]
    fn a_buffer_of_a_fitting_capacity_is_reused_and_the_pool_stays_small() {
        const MB: usize = 1 << 20;
        let pool = BufferPool::new(3);
        pool.give(vec![1u8; 10 * MB]);
        pool.give(vec![2u8; 4 * MB]);
        let b = pool.take(3 * MB);
        assert_eq!((b.len(), b[0]), (3 * MB, 2), "the 4 MB buffer, shortened");
        assert_eq!(
            pool.take(2 * MB),
            vec![0u8; 2 * MB],
            "10 MB is too large for 2 MB"
        );
        let fresh = pool.take(20 * MB);
        assert_eq!(
            fresh,
            vec![0u8; 20 * MB],
            "nothing fits: a new zeroed buffer"
        );
        pool.give(b);
        pool.give(fresh);
        let again = pool.take(4 * MB);
        assert_eq!((again.len(), again[0]), (4 * MB, 2), "its capacity is kept");
        pool.give(again);
        pool.give(vec![3u8; 2 * MB]);
        // Kept: the three largest (20, 10 and 4 MB); the 2 MB one went.
        assert_eq!(pool.take(6 * MB)[0], 1);
        assert_eq!(pool.take(15 * MB).capacity(), 20 * MB);
        assert_eq!(pool.take(2 * MB).capacity(), 4 * MB);
        assert_eq!(pool.take(2 * MB)[0], 0, "the pool is empty");
    }
}
