//! A small seeded generator of non-zero test values.

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// A value in ±[0.05, 1): never zero, so no term silently vanishes.
    pub fn value(&mut self) -> f32 {
        let m: f32 = self.0.random_range(0.05..1.0);
        if self.0.random_bool(0.5) { m } else { -m }
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }

    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.random_range(lo..hi)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        use rand::seq::SliceRandom;
        v.shuffle(&mut self.0);
    }
}
