//! Greedy sampling on the device: one token id per row of logits, so a decode
//! step hands the host a few integers instead of a vocabulary of floats, and
//! the arg-max can be part of a recorded CUDA graph.

use cudarc::driver::CudaSlice;

use crate::device::{Arg, Gpu, ptr};
use crate::tensor::CudaTensor;

/// Threads per row: a 250k vocabulary is 62k float4 loads, ~60 per thread.
const THREADS: u32 = 1024;

/// The column of each row's largest logit among its first `cols`, on the
/// device (one `i32` per row): ties go to the lowest index and NaN never wins
/// (a row of NaN gives 0). `cols` below the row length keeps a vocabulary's
/// padded tail out. Only a kernel launch: safe to record in a CUDA graph.
pub fn argmax_rows(gpu: &Gpu, logits: &CudaTensor, cols: usize) -> CudaSlice<i32> {
    assert!(
        (1..=logits.cols).contains(&cols) && logits.cols <= i32::MAX as usize,
        "argmax over {cols} of {} columns",
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
            Arg::I32(cols as i32),
            Arg::I32(logits.cols as i32),
        ],
    );
    out
}

/// [`argmax_rows`], read back to the host (waits for the stream).
pub fn argmax_rows_host(gpu: &Gpu, logits: &CudaTensor, cols: usize) -> Vec<u32> {
    let ids = argmax_rows(gpu, logits, cols);
    gpu.download(&ids, logits.rows)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}
