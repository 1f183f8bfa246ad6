//! Greedy sampling on the device: one token id per row of logits, so a decode
//! step hands the host a few integers instead of a vocabulary of floats, and
//! the arg-max can be part of a recorded CUDA graph.

use cudarc::driver::CudaSlice;

use crate::device::{Arg, Gpu, ptr};
use crate::tensor::CudaTensor;

/// Threads per row: a 250k vocabulary is 62k float4 loads, ~60 per thread.
const THREADS: u32 = 1024;

/// The column of each row's largest logit, on the device (one `i32` per row):
/// ties go to the lowest index and NaN never wins (a row of NaN gives 0).
/// Only a kernel launch: safe to record in a CUDA graph.
pub fn argmax_rows(gpu: &Gpu, logits: &CudaTensor) -> CudaSlice<i32> {
    assert!(
        logits.cols > 0 && logits.cols <= i32::MAX as usize,
        "argmax_rows: {} columns",
        logits.cols
    );
    let out = gpu.alloc::<i32>(logits.rows);
    let s = &gpu.stream;
    gpu.launch(
        &gpu.k.argmax_rows,
        (logits.rows as u32, 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&logits.buf, s)),
            Arg::I32(logits.cols as i32),
        ],
    );
    out
}

/// The argmax of the first `cols` columns of each row, read back to the host
/// (waits for the stream). All columns: one launch over every row. Fewer
/// (a vocabulary padded beyond the tokenizer's): one single-row launch per
/// row, the kernel reading `cols` values from the row's start.
pub fn argmax_rows_host(gpu: &Gpu, logits: &CudaTensor, cols: usize) -> Vec<u32> {
    assert!(
        (1..=logits.cols).contains(&cols),
        "argmax over {cols} of {} columns",
        logits.cols
    );
    let ids = if cols == logits.cols {
        argmax_rows(gpu, logits)
    } else {
        let out = gpu.alloc::<i32>(logits.rows);
        let s = &gpu.stream;
        for r in 0..logits.rows {
            gpu.launch(
                &gpu.k.argmax_rows,
                (1, 1, 1),
                THREADS,
                0,
                &[
                    Arg::Ptr(ptr(&out, s) + (r * 4) as u64),
                    Arg::Ptr(ptr(&logits.buf, s) + (r * logits.cols * 4) as u64),
                    Arg::I32(cols as i32),
                ],
            );
        }
        out
    };
    gpu.download(&ids, logits.rows)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}
