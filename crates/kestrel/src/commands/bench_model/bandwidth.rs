//! Host memory bandwidth: a multi-threaded streaming read of a buffer far
//! larger than the caches, the rate a CPU decode step's weight reads can
//! reach at best.

use std::time::Instant;

/// Read rate in GB/s over a `bytes`-sized buffer, median of 5 passes after
/// one warm-up, one thread per available core.
pub fn host_read_gbs(bytes: usize) -> f64 {
    let words = bytes / 8;
    // Distinct non-zero values so no page is shared or skipped.
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = words.div_ceil(threads);
    let mut times = Vec::new();
    let mut checksum = 0u64;
    for pass in 0..6 {
        let start = Instant::now();
        let sum = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .fold(0u64, u64::wrapping_add)
        });
        let secs = start.elapsed().as_secs_f64();
        checksum = checksum.wrapping_add(sum);
        if pass > 0 {
            times.push(secs);
        }
    }
    std::hint::black_box(checksum);
    times.sort_by(f64::total_cmp);
    (words * 8) as f64 / times[times.len() / 2] / 1e9
}

/// Eight independent accumulators so the loop is bound by loads, not by
/// one add chain.
fn sum_words(part: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = part.chunks_exact(8);
    for c in &mut it {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(x);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |s, &x| s.wrapping_add(x));
    acc.iter().fold(tail, |s, &x| s.wrapping_add(x))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_word() {
        let v: Vec<u64> = (1..=21).collect();
        assert_eq!(super::sum_words(&v), 231);
    }

    #[test]
    fn measures_a_plausible_rate() {
        let gbs = super::host_read_gbs(16 << 20);
        assert!(gbs.is_finite() && gbs > 0.1, "{gbs}");
    }
}
