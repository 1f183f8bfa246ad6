//! Rotary position embedding, rotate-half form on the first `rotary_dim` dims of a head.

use kestrel_core::RopeSpec;

/// cos and sin of every rotary frequency at a list of positions.
pub struct RopeTable {
    half: usize,
    /// `[positions, half]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// `inv_freq[j] = 1 / theta^(2j / rotary_dim)`, computed in f32 as transformers
/// does (`1.0 / base ** (arange(0, dim, 2, dtype=float) / dim)`).
pub fn inv_freq(rope: &RopeSpec) -> Vec<f32> {
    let dim = rope.rotary_dim as f32;
    (0..rope.rotary_dim / 2)
        .map(|j| 1.0 / rope.theta.powf((2 * j) as f32 / dim))
        .collect()
}

impl RopeTable {
    /// The angle is `position * inv_freq` in f32, then cos/sin in f32, matching
    /// transformers' rotary embedding (which forces f32 there).
    pub fn new(rope: &RopeSpec, positions: &[u32]) -> Self {
        let freqs = inv_freq(rope);
        let half = freqs.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &freqs {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Rotate one head in place at the `i`-th position of the table.
    /// Pairs dim `j` with `j + half`; dims from `2 * half` on pass through.
    #[inline]
    pub fn apply(&self, i: usize, head: &mut [f32]) {
        let h = self.half;
        let cos = &self.cos[i * h..(i + 1) * h];
        let sin = &self.sin[i * h..(i + 1) * h];
        let (lo, rest) = head.split_at_mut(h);
        let hi = &mut rest[..h];
        for j in 0..h {
            let (x1, x2) = (lo[j], hi[j]);
            // q * cos + rotate_half(q) * sin, with rotate_half(q) = [-x2, x1].
            lo[j] = x1 * cos[j] + (-x2) * sin[j];
            hi[j] = x2 * cos[j] + x1 * sin[j];
        }
    }
}
