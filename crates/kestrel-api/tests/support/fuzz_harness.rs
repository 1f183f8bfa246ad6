//! The seeded fuzzing harness the fuzz targets of several crates share
//! (each includes this file with `#[path]`): iterations and seed from the
//! environment, a small generator, and a runner whose failure names the
//! target, seed and iteration that reproduce it.
//!
//! `KESTREL_FUZZ_ITERS` sets the iterations per target (default 300, for
//! `cargo test`); `KESTREL_FUZZ_SEED` the seed.

#![allow(dead_code)]

pub fn iterations() -> u64 {
    std::env::var("KESTREL_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

pub fn seed() -> u64 {
    std::env::var("KESTREL_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed)
}

/// splitmix64: small, seeded, and good enough to pick among pieces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, iteration: u64) -> Self {
        Rng(seed ^ iteration.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Runs `target` for each iteration; a panic names the seed and iteration.
pub fn fuzz(name: &str, mut target: impl FnMut(&mut Rng)) {
    let (n, seed) = (iterations(), seed());
    for i in 0..n {
        let mut rng = Rng::new(seed, i);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&mut rng)));
        if let Err(e) = result {
            // A fresh panic, not resume_unwind: that skips the panic hook,
            // and the test harness prints no payload, so the iteration would
            // go unreported.
            let message = e
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| e.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            panic!("{name}: iteration {i} of seed {seed} failed: {message}");
        }
    }
    eprintln!("{name}: {n} iterations, seed {seed}");
}
