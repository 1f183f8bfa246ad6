//! `y = x @ w^T` for weights stored `[out, in]`, plus row gathers.

use rayon::prelude::*;

/// Input rows per `gemm` call. Every call has the same shape (a partial last
/// tile is zero-padded), so each output element is reduced over `k` in the same
/// order whatever the batch: a sequence's logits do not depend on which other
/// sequences share its step, and a prefix-cache hit (which prefills fewer rows)
/// computes exactly what a miss computes. Rows of `x` never mix in a product,
/// so padding changes nothing but wasted work.
pub const ROW_TILE: usize = 4;

/// Weight rows (output columns) per task: splits single-row decode steps over
/// both cores; columns are independent, so the split does not change results.
const COLS_PER_TASK: usize = 64;

/// `out[m, n] = x[m, k] @ w[n, k]^T`. `parallel` = false when the caller already
/// runs inside a parallel loop (e.g. one expert per task).
pub fn linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32], parallel: bool) {
    assert_eq!(x.len(), m * k, "matmul input is not [{m}, {k}]");
    assert_eq!(
        w.len(),
        n * k,
        "matmul weight has {} values, expected [{n}, {k}]",
        w.len()
    );
    assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let tiles = m.div_ceil(ROW_TILE);
    let col_blocks = n.div_ceil(COLS_PER_TASK);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (tile, cb) = (t / col_blocks, t % col_blocks);
        let (i0, j0) = (tile * ROW_TILE, cb * COLS_PER_TASK);
        let rows = ROW_TILE.min(m - i0);
        let cols = COLS_PER_TASK.min(n - j0);
        let mut padded = [0.0f32; 0].to_vec();
        let lhs = if rows == ROW_TILE {
            &x[i0 * k..(i0 + ROW_TILE) * k]
        } else {
            padded.resize(ROW_TILE * k, 0.0);
            padded[..rows * k].copy_from_slice(&x[i0 * k..(i0 + rows) * k]);
            &padded[..]
        };
        let mut tile_out = [0.0f32; ROW_TILE * COLS_PER_TASK];
        gemm_tile(lhs, k, &w[j0 * k..(j0 + cols) * k], cols, &mut tile_out);
        for r in 0..rows {
            // SAFETY: tasks write disjoint (row, column-block) regions of `out`,
            // which outlives the parallel loop; bounds follow from the asserts.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    tile_out[r * cols..].as_ptr(),
                    out_ptr.get().add((i0 + r) * n + j0),
                    cols,
                );
            }
        }
    };
    if parallel && tiles * col_blocks > 1 {
        (0..tiles * col_blocks).into_par_iter().for_each(task);
    } else {
        (0..tiles * col_blocks).for_each(task);
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[ROW_TILE, cols] = lhs[ROW_TILE, k] @ w[cols, k]^T` through `gemm`,
/// single-threaded (the caller parallelises over tiles).
fn gemm_tile(lhs: &[f32], k: usize, w: &[f32], cols: usize, out: &mut [f32]) {
    debug_assert!(lhs.len() == ROW_TILE * k && w.len() == cols * k && out.len() >= ROW_TILE * cols);
    // SAFETY: dst is ROW_TILE x cols row-major inside `out`, lhs ROW_TILE x k
    // row-major, rhs = w^T (k x cols) read from w [cols, k] with row stride 1
    // and column stride k. `read_dst` is false, so `out` is only written.
    unsafe {
        gemm::gemm(
            ROW_TILE,
            cols,
            k,
            out.as_mut_ptr(),
            1,
            cols as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::rng::Rng;

    fn naive(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for l in 0..k {
                    s += x[i * k + l] as f64 * w[j * k + l] as f64;
                }
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    #[test]
    fn linear_matches_naive_for_gemv_and_gemm_paths() {
        let mut rng = Rng::new(1);
        for &(m, k, n) in &[
            (1, 37, 45),
            (3, 64, 17),
            (4, 9, 100),
            (5, 33, 21),
            (40, 70, 50),
        ] {
            let x = rng.vec(m * k);
            let w = rng.vec(n * k);
            let want = naive(&x, m, k, &w, n);
            for parallel in [false, true] {
                let mut got = vec![f32::NAN; m * n];
                linear(&x, m, k, &w, n, &mut got, parallel);
                crate::tests::assert_close(&got, &want, 1e-5, &format!("linear {m}x{k}x{n}"));
            }
        }
    }

    /// Each row's result is bitwise the same whatever batch it is computed in.
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let mut rng = Rng::new(3);
        let (k, n) = (96, 150);
        let w = rng.vec(n * k);
        let x = rng.vec(13 * k);
        let mut all = vec![0.0; 13 * n];
        linear(&x, 13, k, &w, n, &mut all, true);
        for (start, len) in [(0, 1), (5, 1), (2, 3), (7, 6), (12, 1)] {
            let mut part = vec![0.0; len * n];
            linear(
                &x[start * k..(start + len) * k],
                len,
                k,
                &w,
                n,
                &mut part,
                false,
            );
            assert!(
                part.iter()
                    .zip(&all[start * n..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rows {start}..{} differ when computed alone",
                start + len
            );
        }
    }

    /// Timing probe: `cargo test -p kestrel-cpu --release -- --ignored --nocapture bench_`.
    #[test]
    #[ignore]
    fn bench_linear() {
        let mut rng = Rng::new(2);
        for &(k, n) in &[(1024, 1024), (256, 4096), (2048, 512)] {
            let w = rng.vec(n * k);
            for m in [1, 4, 16, 128] {
                let x = rng.vec(m * k);
                let mut out = vec![0.0; m * n];
                let reps = 20;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    linear(&x, m, k, &w, n, &mut out, true);
                }
                let per = t.elapsed().as_secs_f64() / reps as f64;
                println!(
                    "k={k} n={n} m={m}: {:.1} us, {:.2} GFLOP/s",
                    per * 1e6,
                    2.0 * (m * n * k) as f64 / per / 1e9
                );
            }
        }
    }
}
