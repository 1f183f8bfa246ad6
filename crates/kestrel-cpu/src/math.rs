//! Scalar and vector helpers shared by the operations.
//!
//! Reductions use eight independent f32 accumulators: the compiler can keep them
//! in one SIMD register (a single sequential f32 sum cannot be vectorised because
//! float addition is not associative), and the shorter dependency chains are also
//! more accurate than one running sum.

const LANES: usize = 8;

/// `sum(a[i] * b[i])` in f32.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ac, ar) = a.split_at(a.len() - a.len() % LANES);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(LANES).zip(bc.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    reduce_lanes(acc) + tail
}

/// `sum(a[i])` in f32.
#[inline]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, ar) = a.split_at(a.len() - a.len() % LANES);
    for x in ac.chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    reduce_lanes(acc) + ar.iter().sum::<f32>()
}

/// `sum(a[i]^2)` in f32.
#[inline]
pub fn sum_sq(a: &[f32]) -> f32 {
    dot(a, a)
}

#[inline]
fn reduce_lanes(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `y += a * x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// `1 / (1 + exp(-x))`, PyTorch's formula.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / (1 + exp(-x))`, PyTorch's formula for SiLU.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// PyTorch's `softplus` with beta 1 and threshold 20.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `1 / sqrt(mean(x^2) + eps)`.
#[inline]
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    let mean = sum_sq(x) / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// In-place softmax with the maximum subtracted first.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = (*v - max).exp();
    }
    let total = sum(x);
    for v in x.iter_mut() {
        *v /= total;
    }
}
