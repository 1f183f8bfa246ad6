//! Random weights for benchmarking full-size models without their files
//! (vLLM's `--load-format dummy`).
//!
//! Values come from a counter-based hash, so element `i` of a tensor depends
//! only on `(seed, i)`: a GPU kernel can fill billions of elements in
//! parallel and produce exactly the values the host version produces
//! (`kernels/dummy.cu` in kestrel-kernels repeats this function).

/// SplitMix64's output mix: a bijection of u64 with good avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of a dummy tensor: uniform in `[offset - scale, offset + scale)`.
pub fn dummy_value(seed: u64, i: u64, offset: f32, scale: f32) -> f32 {
    let z = mix64(seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    // 24 random bits: exactly representable, so host and device agree bit for bit.
    let u = (z >> 40) as f32 * (1.0 / 16_777_216.0);
    scale.mul_add(2.0 * u - 1.0, offset)
}

/// A 64-bit seed for one named tensor (FNV-1a of the name, mixed with `seed`).
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h ^ mix64(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_in_range_and_roughly_uniform() {
        let n = 100_000;
        let v: Vec<f32> = (0..n).map(|i| dummy_value(7, i, 1.0, 0.5)).collect();
        assert!(v.iter().all(|&x| (0.5..1.5).contains(&x)));
        let mean = v.iter().sum::<f32>() / n as f32;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n as f32;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        // Uniform on a width of 1: variance 1/12.
        assert!((var - 1.0 / 12.0).abs() < 0.003, "variance {var}");
    }

    #[test]
    fn seeds_and_names_give_different_streams() {
        assert_ne!(tensor_seed(0, "a.weight"), tensor_seed(0, "b.weight"));
        assert_ne!(tensor_seed(0, "a.weight"), tensor_seed(1, "a.weight"));
        let a: Vec<f32> = (0..8)
            .map(|i| dummy_value(tensor_seed(0, "a"), i, 0.0, 1.0))
            .collect();
        let b: Vec<f32> = (0..8)
            .map(|i| dummy_value(tensor_seed(0, "b"), i, 0.0, 1.0))
            .collect();
        assert_ne!(a, b);
        assert_eq!(dummy_value(3, 5, 0.0, 1.0), dummy_value(3, 5, 0.0, 1.0));
    }
}
