//! `y = x @ w^T` for weights stored `[out, in]`, plus row gathers.

use rayon::prelude::*;

use crate::math::dot;

/// Below this many input rows the weight is streamed once with row-parallel dot
/// products (each weight row is used for every input row while it is in cache);
/// from here on the blocked `gemm` kernel wins. Measured on x86-64 AVX2 with
/// 1024x1024 and 2048x512 weights (see `linear::tests::bench_*`).
pub const GEMV_MAX_ROWS: usize = 4;

/// Output rows (of `w`) per rayon task in the GEMV path: large enough to amortise
/// scheduling, small enough to balance two cores on small matrices.
const GEMV_ROWS_PER_TASK: usize = 16;

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
    if m <= GEMV_MAX_ROWS {
        gemv(x, m, k, w, n, out, parallel);
    } else {
        gemm_f32(x, m, k, w, n, out, parallel);
    }
}

/// Each task takes a block of weight rows and produces those columns for every input row.
fn gemv(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32], parallel: bool) {
    let block = |j0: usize, cols: &mut [f32]| {
        // `cols` is [m, rows_in_block] for this block; scattered into `out` below.
        let rows = cols.len() / m;
        for (jj, wr) in w[j0 * k..(j0 + rows) * k].chunks_exact(k).enumerate() {
            for i in 0..m {
                cols[i * rows + jj] = dot(&x[i * k..(i + 1) * k], wr);
            }
        }
    };
    if m == 1 {
        // Output row is contiguous: write directly.
        if parallel {
            out.par_chunks_mut(GEMV_ROWS_PER_TASK)
                .enumerate()
                .for_each(|(b, o)| block(b * GEMV_ROWS_PER_TASK, o));
        } else {
            block(0, out);
        }
        return;
    }
    let mut tmp = vec![0.0f32; m * n];
    let task = GEMV_ROWS_PER_TASK * m;
    if parallel {
        tmp.par_chunks_mut(task)
            .enumerate()
            .for_each(|(b, o)| block(b * GEMV_ROWS_PER_TASK, o));
    } else {
        tmp.chunks_mut(task)
            .enumerate()
            .for_each(|(b, o)| block(b * GEMV_ROWS_PER_TASK, o));
    }
    // tmp holds blocks of [m, rows]; transpose into out [m, n].
    for (b, blk) in tmp.chunks(task).enumerate() {
        let j0 = b * GEMV_ROWS_PER_TASK;
        let rows = blk.len() / m;
        for i in 0..m {
            out[i * n + j0..i * n + j0 + rows].copy_from_slice(&blk[i * rows..(i + 1) * rows]);
        }
    }
}

fn gemm_f32(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32], parallel: bool) {
    let par = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts in `linear` guarantee every strided access below stays in
    // bounds: dst is m x n row-major, lhs m x k row-major, rhs = w^T (k x n) read
    // from w [n, k] with row stride 1 and column stride k. `read_dst` is false, so
    // `out` is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
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
            par,
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

    /// Timing probe behind `GEMV_MAX_ROWS`: `cargo test -p kestrel-cpu --release -- --ignored --nocapture bench_`.
    #[test]
    #[ignore]
    fn bench_gemv_vs_gemm() {
        let mut rng = Rng::new(2);
        for &(k, n) in &[(1024, 1024), (512, 2048), (2048, 512)] {
            let w = rng.vec(n * k);
            for m in [1, 2, 4, 8, 16] {
                let x = rng.vec(m * k);
                let mut out = vec![0.0; m * n];
                let reps = 50;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    gemv(&x, m, k, &w, n, &mut out, true);
                }
                let a = t.elapsed() / reps;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    gemm_f32(&x, m, k, &w, n, &mut out, true);
                }
                let b = t.elapsed() / reps;
                println!("k={k} n={n} m={m}: gemv {a:?} gemm {b:?}");
            }
        }
    }
}
