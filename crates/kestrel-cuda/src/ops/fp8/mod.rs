//! Block-FP8 weights (Qwen's `-FP8` checkpoints, `kestrel_core::fp8`) on the
//! device: kept as e4m3 codes and one f32 scale per 128 x 128 block, which
//! the decode kernels (`gemv`, the MoE decode path) read directly, halving
//! the bytes a decode step streams. Products without an FP8 kernel (the
//! cuBLAS and grouped prefill GEMMs) read a bf16 copy made for the call
//! ([`bf16_matrix`]): a prefill's arithmetic dwarfs the copy.
//!
//! A weight whose layout the kernels cannot take as it is ([`kept_as_fp8`])
//! is stored dequantised to bf16 instead, the format of every other matrix.

pub mod kernels;

use cudarc::driver::CudaSlice;
use kestrel_core::{BackendError, BlockFp8, Result, fp8};

use crate::context::Cx;
use crate::device::{Gpu, blocks, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaWeight, WeightData};
use kernels::Fp8Kernels;

/// Codes per 16-byte load of the FP8 kernels.
const CHUNK: usize = 16;

/// Grid of the grid-stride kernels here.
const GRID: u32 = 1024;

/// Whether the kernels take a block-FP8 weight of `shape` as it is: a
/// matrix (or a stack of them) with rows of whole 16-byte chunks; in a
/// stack, matrices of whole 128-row blocks, so that a row's scale row
/// follows from its index in the stack.
pub fn kept_as_fp8(shape: &[usize], block: [usize; 2]) -> bool {
    let n = shape.len();
    n >= 2
        && block == fp8::BLOCK
        && shape[n - 1].is_multiple_of(CHUNK)
        && (n == 2 || shape[n - 2].is_multiple_of(block[0]))
}

/// `q` as the device stores it: codes and scales as they are.
pub fn upload(gpu: &Gpu, q: &BlockFp8) -> Result<CudaWeight> {
    debug_assert!(kept_as_fp8(&q.shape, q.block));
    let codes = gpu.stream.clone_htod(&q.codes[..]).map_err(|e| {
        BackendError::OutOfMemory(format!("uploading {} FP8 codes: {e:?}", q.codes.len()))
    })?;
    let scale_inv = gpu.stream.clone_htod(&q.scale_inv[..]).map_err(|e| {
        BackendError::OutOfMemory(format!("uploading {} FP8 scales: {e:?}", q.scale_inv.len()))
    })?;
    Ok(CudaWeight {
        shape: q.shape.clone(),
        data: WeightData::Fp8 { codes, scale_inv },
    })
}

/// A random FP8 weight of `shape`: codes drawn on the device as
/// `kestrel_models::fp8::dummy_weight` draws them on the host, and the
/// host's `scale_inv`.
pub fn dummy(
    gpu: &Gpu,
    k: &Fp8Kernels,
    shape: &[usize],
    seed: u64,
    scale_inv: &[f32],
) -> Result<CudaWeight> {
    let n: usize = shape.iter().product();
    let codes = unsafe { gpu.stream.alloc::<u8>(n.max(1)) }
        .map_err(|e| BackendError::OutOfMemory(format!("allocating {n} FP8 codes: {e:?}")))?;
    gpu.launch(
        &k.dummy_codes,
        (GRID.min(blocks(n, 256).max(1)), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(ptr(&codes, &gpu.stream)),
            Arg::U64(n as u64),
            Arg::U64(seed),
        ],
    );
    let scale_inv = gpu.stream.clone_htod(scale_inv).map_err(|e| {
        BackendError::OutOfMemory(format!("uploading {} FP8 scales: {e:?}", scale_inv.len()))
    })?;
    Ok(CudaWeight {
        shape: shape.to_vec(),
        data: WeightData::Fp8 { codes, scale_inv },
    })
}

/// A weight as a bf16 matrix: its own storage, or for FP8 a copy made on
/// the stream (`code * scale` rounded once), freed when this is dropped,
/// after the launches that read it were queued (stream-ordered).
pub struct Bf16Matrix {
    pub ptr: u64,
    _copy: Option<CudaSlice<u16>>,
}

/// `w` as bf16, for a product that reads nothing else.
pub fn bf16_matrix(cx: &Cx, w: &CudaWeight, what: &str) -> Bf16Matrix {
    let gpu = cx.gpu;
    let s = &gpu.stream;
    match &w.data {
        WeightData::Fp8 { .. } | WeightData::Stacked(_) => {}
        _ => {
            return Bf16Matrix {
                ptr: ptr(w.bf16(what), s),
                _copy: None,
            };
        }
    }
    let copy = gpu.alloc::<u16>(w.numel());
    let base = ptr(&copy, s);
    // A stacked weight's parts, in row order, each at its place.
    let mut offset = 0;
    for part in w.parts() {
        let n = part.numel();
        let dst = base + (offset * 2) as u64;
        match &part.data {
            WeightData::Fp8 { codes, scale_inv } => {
                fp8_to_bf16(cx, dst, codes, scale_inv, &part.shape)
            }
            WeightData::Bf16(b) => {
                gpu.copy_dtod(dst, ptr(b, s), n * 2);
            }
            _ => panic!("{what}: a stacked weight's parts are block-FP8 or bf16"),
        }
        offset += n;
    }
    Bf16Matrix {
        ptr: base,
        _copy: Some(copy),
    }
}

/// The bf16 values of an FP8 weight of `shape` written to `dst`.
fn fp8_to_bf16(
    cx: &Cx,
    dst: u64,
    codes: &CudaSlice<u8>,
    scale_inv: &CudaSlice<f32>,
    shape: &[usize],
) {
    let gpu = cx.gpu;
    let s = &gpu.stream;
    let n: usize = shape.iter().product();
    let dims = shape.len();
    let (rows, cols) = (shape[dims - 2], shape[dims - 1]);
    gpu.launch(
        &cx.k.fp8.to_bf16,
        (GRID.min(blocks(n / 4, 256).max(1)), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(dst),
            Arg::Ptr(ptr(codes, s)),
            Arg::Ptr(ptr(scale_inv, s)),
            Arg::U64((n / (rows * cols).max(1)) as u64),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_is_kept_for_whole_chunks_and_stacks_of_whole_blocks() {
        let b = fp8::BLOCK;
        // Qwen3.6: a projection, the expert stacks, a short-row matrix.
        assert!(kept_as_fp8(&[12352, 2048], b));
        assert!(kept_as_fp8(&[256, 1024, 2048], b));
        assert!(kept_as_fp8(&[256, 2048, 512], b));
        assert!(
            kept_as_fp8(&[300, 48], b),
            "a matrix may end inside a block"
        );
        assert!(
            !kept_as_fp8(&[300, 40], b),
            "rows must be whole 16-code loads"
        );
        assert!(
            !kept_as_fp8(&[8, 64, 64], b),
            "stacked matrices of cut blocks"
        );
        assert!(!kept_as_fp8(&[2048], b), "vectors are never FP8 here");
        assert!(!kept_as_fp8(&[256, 256], [64, 64]), "only 128 x 128 blocks");
    }
}
