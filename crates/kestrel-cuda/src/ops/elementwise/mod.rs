//! Embedding lookup, row gather, residual add, SwiGLU, and the f32 -> bf16
//! conversion the dense products read.

use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaTensor, CudaWeight, Format};

pub mod kernels;

const THREADS: u32 = 256;

pub fn embedding(cx: &Cx, table: &CudaWeight, ids: &[u32]) -> CudaTensor {
    let gpu = cx.gpu;
    assert_eq!(
        table.shape.len(),
        2,
        "embedding table must be [vocab, hidden], got {:?}",
        table.shape
    );
    let (vocab, cols) = (table.shape[0], table.shape[1]);
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        panic!("token id {bad} out of range for a vocabulary of {vocab}");
    }
    let out = gpu.alloc::<f32>(ids.len() * cols);
    // Inside a step the ids are already on the device (and must be read
    // from there for the step to be replayable).
    let staged = cx.step_ids(ids);
    let ids_dev = if staged.is_none() {
        Some(gpu.upload(ids))
    } else {
        None
    };
    let s = &gpu.stream;
    let ids_ptr = staged.unwrap_or_else(|| ptr(ids_dev.as_ref().unwrap(), s));
    let m = table.matrix("embedding", s);
    let k = &cx.k.elementwise;
    // FP8 checkpoints keep the embedding bf16; an FP8 table is the lm_head
    // of --lm-head-dtype fp8, read by rows for a draft vocabulary, and its
    // kernel takes the block scales after the codes.
    let (f, scales) = match m.format {
        Format::Bf16 => (&k.embedding_bf16, None),
        Format::F16 => (&k.embedding_f16, None),
        Format::Fp8 => (&k.embedding_fp8, Some(Arg::Ptr(m.scales))),
    };
    let mut args = vec![Arg::Ptr(ptr(&out, s)), Arg::Ptr(m.ptr)];
    args.extend(scales);
    args.extend([Arg::Ptr(ids_ptr), Arg::I32(cols as i32)]);
    gpu.launch(
        f,
        (blocks(cols, THREADS as usize), ids.len() as u32, 1),
        THREADS,
        0,
        &args,
    );
    CudaTensor {
        bf16: None,
        rows: ids.len(),
        cols,
        buf: out,
    }
}

/// The rows of `a`, then those of `b`: two device copies.
pub fn concat_rows(cx: &Cx, a: &CudaTensor, b: &CudaTensor) -> CudaTensor {
    assert_eq!(
        a.cols, b.cols,
        "concat_rows: {} columns against {}",
        a.cols, b.cols
    );
    let gpu = cx.gpu;
    let s = &gpu.stream;
    let (na, nb) = (a.rows * a.cols, b.rows * b.cols);
    let out = gpu.alloc::<f32>(na + nb);
    let base = ptr(&out, s);
    gpu.copy_dtod(base, ptr(&a.buf, s), na * 4);
    gpu.copy_dtod(base + (na * 4) as u64, ptr(&b.buf, s), nb * 4);
    CudaTensor {
        bf16: None,
        rows: a.rows + b.rows,
        cols: a.cols,
        buf: out,
    }
}

pub fn gather_rows(cx: &Cx, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
    let gpu = cx.gpu;
    if let Some(&bad) = rows.iter().find(|&&r| r >= x.rows) {
        panic!("gather_rows: row {bad} out of range for {} rows", x.rows);
    }
    if rows.iter().copied().eq(0..x.rows) {
        // Every row in order (a decode step's logits): a plain copy, which
        // needs no index upload and so stays replayable.
        let out = gpu.alloc::<f32>(x.rows * x.cols);
        let s = &gpu.stream;
        gpu.copy_dtod(ptr(&out, s), ptr(&x.buf, s), x.rows * x.cols * 4);
        return CudaTensor {
            bf16: None,
            rows: x.rows,
            cols: x.cols,
            buf: out,
        };
    }
    let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let idx_dev = gpu.upload(&idx);
    let out = gpu.alloc::<f32>(rows.len() * x.cols);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.elementwise.gather_rows_f32,
        (blocks(x.cols, THREADS as usize), rows.len() as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(&idx_dev, s)),
            Arg::I32(x.cols as i32),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: rows.len(),
        cols: x.cols,
        buf: out,
    }
}

pub fn add_assign(cx: &Cx, a: &mut CudaTensor, b: &CudaTensor) {
    let gpu = cx.gpu;
    // Changed in place: a bf16 copy would be stale.
    a.bf16 = None;
    assert_eq!(
        (a.rows, a.cols),
        (b.rows, b.cols),
        "add_assign shape mismatch"
    );
    let n = a.rows * a.cols;
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.elementwise.add_assign_f32,
        (blocks(n, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&a.buf, s)),
            Arg::Ptr(ptr(&b.buf, s)),
            Arg::U64(n as u64),
        ],
    );
}

pub fn swiglu(cx: &Cx, gate_up: &CudaTensor) -> CudaTensor {
    let gpu = cx.gpu;
    assert!(
        gate_up.cols.is_multiple_of(2),
        "swiglu needs an even width, got {}",
        gate_up.cols
    );
    let inter = gate_up.cols / 2;
    let out = gpu.alloc::<f32>(gate_up.rows * inter);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.elementwise.swiglu_f32,
        (blocks(inter, THREADS as usize), gate_up.rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&gate_up.buf, s)),
            Arg::I32(inter as i32),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: gate_up.rows,
        cols: inter,
        buf: out,
    }
}
