//! The attention family's kernels (`attention.cu`, `attention_decode.cu`,
//! `attention_block.cu`, `attention_prefill.cu`, `attention_prefill_sm90.cu`), their launch
//! constants and shared-memory sizes. A kernel the device cannot run is not
//! loaded (`None`): the plan then picks among the others.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use kestrel_core::Result;
pub use kestrel_kernels::abi::{BLOCK_ATTN_KEYS, BLOCK_ATTN_ROWS};

use crate::device::{Gpu, function, function_with_smem};
use crate::plan::FAST_HEAD_DIMS;

pub const THREADS: u32 = 128;
/// Mirrors `QKN_WARPS` in `kernels/attention.cu`: heads of one token per
/// block, a warp each.
pub const QKN_WARPS: usize = 8;
/// The generic kernel keeps at most 4 output dims per thread.
pub const MAX_HEAD_DIM: usize = 4 * THREADS as usize;

/// Mirror `kernels/attention_decode.cu`.
pub const DECODE_HEADS: usize = 8;
pub const DECODE_MAX_SPLITS: usize = 128;
/// Most new tokens of one sequence the decode kernels take (one plus the
/// drafts of a verify step; a longer chunk is a prefill).
pub const DECODE_MAX_ROWS: usize = 16;
/// Splits of every decode launch in the batch-invariant mode.
pub const BATCH_INVARIANT_SPLITS: usize = 16;
/// Most rows per decode launch in the batch-invariant mode.
pub const BATCH_INVARIANT_ROWS: usize = 256;
pub const COMBINE_THREADS: u32 = 256;
/// Mirror `kernels/attention_prefill.cu`.
pub const PREFILL_ROWS: usize = 64;
pub const PREFILL_KEYS: usize = 64;

/// Mirror `PF2_ROWS` / `PF2_THREADS` (version 2 of the prefill kernel).
pub const PREFILL_V2_ROWS: usize = 128;
pub const PREFILL_V2_THREADS: u32 = 256;
/// Static shared memory of every prefill kernel (the staged cache rows).
pub const PREFILL_STATIC_SMEM: u32 = 2 * PREFILL_KEYS as u32 * 8;

/// Warpgroups of 64 queries per block of the wgmma prefill kernel, per head
/// dim of `FAST_HEAD_DIMS` (mirror the instantiations `attention_prefill_wg_d{D}`
/// in `kernels/attention_prefill_sm90.cu`; its K/V tiles are `PREFILL_KEYS`).
pub const WG_WARPGROUPS: [usize; 3] = [3, 3, 2];

/// Dynamic shared memory of the wgmma prefill kernel: the Q tile and two
/// buffers of K and V tiles, bf16, plus 1 KiB to align them to 1,024 bytes
/// (the swizzle's period).
pub fn prefill_wg_smem_bytes(warpgroups: usize, d: usize) -> u32 {
    ((64 * warpgroups + 2 * 2 * PREFILL_KEYS) * d * 2 + 1024) as u32
}

/// Dynamic shared memory of the prefill kernel: Q, K and V tiles of bf16.
pub fn prefill_smem_bytes(d: usize) -> u32 {
    ((PREFILL_ROWS + 2 * PREFILL_KEYS) * d * 2) as u32
}

/// Dynamic shared memory of version 2: a 128-query Q tile and two buffers of
/// K and V tiles, all bf16 (48, 96 and 192 KiB at head_dim 64, 128, 256).
pub fn prefill_v2_smem_bytes(d: usize) -> u32 {
    ((PREFILL_V2_ROWS + 2 * 2 * PREFILL_KEYS) * d * 2) as u32
}

/// The kernels, per head dim of [`FAST_HEAD_DIMS`] where they come in three.
pub struct AttentionKernels {
    pub qk_norm_rope_kv_write: CudaFunction,
    pub paged_attention: CudaFunction,
    /// The same two over an f32 cache (`Precision::F32`).
    pub qk_norm_rope_kv_write_f32: CudaFunction,
    pub paged_attention_f32: CudaFunction,
    pub decode: [CudaFunction; 3],
    /// The same with the new token's q/k norm, RoPE and cache write inside,
    /// for head dims up to [`FUSED_DECODE_MAX_HEAD_DIM`].
    pub decode_fused: [Option<CudaFunction>; 3],
    pub decode_combine: CudaFunction,
    /// A block drafter's non-causal attention, at the head dims up to
    /// [`BLOCK_ATTENTION_MAX_HEAD_DIM`].
    pub block: [Option<CudaFunction>; 3],
    /// The q/k norm + RoPE + store write of every sequence's block rows.
    pub block_norm_rope_write: CudaFunction,
    pub prefill: [CudaFunction; 3],
    /// The 128-query double-buffered prefill; `None` where its tiles exceed
    /// the device's shared memory per block.
    pub prefill_v2: [Option<CudaFunction>; 3],
    /// The wgmma prefill: loaded on compute capability 9.0 only.
    pub prefill_wg: [Option<CudaFunction>; 3],
}

impl AttentionKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let generic = gpu.module(kestrel_kernels::ATTENTION, "attention")?;
        let decode = gpu.module(kestrel_kernels::ATTENTION_DECODE, "attention_decode")?;
        let block = gpu.module(kestrel_kernels::ATTENTION_BLOCK, "attention_block")?;
        let prefill = gpu.module(kestrel_kernels::ATTENTION_PREFILL, "attention_prefill")?;
        let sm90 = gpu.module(
            kestrel_kernels::ATTENTION_PREFILL_SM90,
            "attention_prefill_sm90",
        )?;
        let smem_limit = gpu.smem_optin();
        let hopper = gpu.compute_capability() == (9, 0);
        let wg_smem = |d: usize| {
            let i = FAST_HEAD_DIMS
                .iter()
                .position(|&x| x == d)
                .expect("a fast head dim");
            prefill_wg_smem_bytes(WG_WARPGROUPS[i], d)
        };
        Ok(AttentionKernels {
            qk_norm_rope_kv_write: function(&generic, "qk_norm_rope_kv_write")?,
            paged_attention: function(&generic, "paged_attention")?,
            qk_norm_rope_kv_write_f32: function(&generic, "qk_norm_rope_kv_write_f32")?,
            paged_attention_f32: function(&generic, "paged_attention_f32")?,
            decode: every_head_dim(&decode, "attention_decode", decode_smem_bytes)?,
            decode_fused: per_head_dim(
                &decode,
                "attention_decode_fused",
                decode_smem_bytes,
                |d| d <= FUSED_DECODE_MAX_HEAD_DIM,
            )?,
            decode_combine: function(&decode, "attention_decode_combine")?,
            block: per_head_dim(&block, "attention_block", block_smem_bytes, |d| {
                d <= BLOCK_ATTENTION_MAX_HEAD_DIM
            })?,
            block_norm_rope_write: function(&block, "block_norm_rope_write")?,
            prefill: every_head_dim(&prefill, "attention_prefill", prefill_smem_bytes)?,
            prefill_v2: per_head_dim(
                &prefill,
                "attention_prefill_v2",
                prefill_v2_smem_bytes,
                |d| prefill_v2_smem_bytes(d) + PREFILL_STATIC_SMEM <= smem_limit,
            )?,
            prefill_wg: per_head_dim(&sm90, "attention_prefill_wg", wg_smem, |_| hopper)?,
        })
    }
}

/// Kernel `{prefix}_d{D}` for each D of `FAST_HEAD_DIMS` that `wanted`
/// accepts (`None` for the others), allowed the dynamic shared memory
/// `smem(D)` (above the default 48 KiB).
fn per_head_dim(
    m: &Arc<CudaModule>,
    prefix: &str,
    smem: impl Fn(usize) -> u32,
    wanted: impl Fn(usize) -> bool,
) -> Result<[Option<CudaFunction>; 3]> {
    let load = |d: usize| -> Result<Option<CudaFunction>> {
        if !wanted(d) {
            return Ok(None);
        }
        function_with_smem(m, &format!("{prefix}_d{d}"), smem(d)).map(Some)
    };
    Ok([
        load(FAST_HEAD_DIMS[0])?,
        load(FAST_HEAD_DIMS[1])?,
        load(FAST_HEAD_DIMS[2])?,
    ])
}

/// Warps per decode block (`dec_warps` in `kernels/attention_decode.cu`).
pub fn decode_warps(d: usize) -> usize {
    if d >= 256 { 2 } else { 4 }
}

/// Dynamic shared memory of the decode kernel: per warp a ring of 3 steps of
/// 16 K rows and 16 V rows of bf16.
pub fn decode_smem_bytes(d: usize) -> u32 {
    (decode_warps(d) * 3 * 2 * 16 * d * 2) as u32
}

/// Largest head dim of `attention_block_d*`: its warps keep a row's
/// output in registers (D / 2 floats a lane).
pub const BLOCK_ATTENTION_MAX_HEAD_DIM: usize = 128;

/// Dynamic shared memory of `attention_block_d*`: two stages of a K and a V
/// tile of `BLOCK_ATTN_KEYS` bf16 rows.
pub fn block_smem_bytes(d: usize) -> u32 {
    (2 * 2 * BLOCK_ATTN_KEYS * d * 2) as u32
}

/// Largest head dim with a fused decode kernel (`attention_decode_fused_d*`):
/// its blocks have 128 threads up to here, 64 above (too few to form the new
/// token's rows faster than a kernel of their own).
pub const FUSED_DECODE_MAX_HEAD_DIM: usize = 128;

/// The tensor-core kernels `{prefix}_d{D}` for every D of `FAST_HEAD_DIMS`,
/// allowed the dynamic shared memory they need.
fn every_head_dim(
    m: &Arc<CudaModule>,
    prefix: &str,
    smem: fn(usize) -> u32,
) -> Result<[CudaFunction; 3]> {
    let [a, b, c] = per_head_dim(m, prefix, smem, |_| true)?;
    let all = |f: Option<CudaFunction>| f.expect("every head dim was loaded");
    Ok([all(a), all(b), all(c)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_in_shared_memory() {
        // Two blocks per SM on Hopper (228 KiB), and one block within the
        // 99 KiB of sm_121, at every head dim.
        for d in FAST_HEAD_DIMS {
            for bytes in [prefill_smem_bytes(d), decode_smem_bytes(d)] {
                assert!(2 * bytes <= 228 * 1024 - 4 * 1024, "{d}: {bytes}");
                assert!(bytes <= 99 * 1024 - 2 * 1024, "{d}: {bytes}");
            }
            // Version 2 (with its static rows) fits one block per SM on
            // Hopper's 227 KiB per block, and sm_121's 99 KiB up to head_dim
            // 128; it is not loaded where it does not fit.
            if d <= BLOCK_ATTENTION_MAX_HEAD_DIM {
                // attention_block: one block per SM with its registers;
                // within sm_121's 99 KiB.
                assert!(block_smem_bytes(d) <= 99 * 1024 - 2 * 1024, "{d}");
            }
            let v2 = prefill_v2_smem_bytes(d) + PREFILL_STATIC_SMEM;
            assert!(v2 <= 227 * 1024, "{d}: {v2}");
            if d <= 128 {
                // Two blocks per SM on Hopper.
                assert!(2 * (v2 + 1024) <= 228 * 1024, "{d}: {v2}");
                assert!(v2 <= 99 * 1024, "{d}: {v2}");
            }
            // The wgmma kernel (Hopper only), with its static rows of
            // 8 bytes a key for two tiles.
            let warpgroups = WG_WARPGROUPS[FAST_HEAD_DIMS.iter().position(|&x| x == d).unwrap()];
            let wg = prefill_wg_smem_bytes(warpgroups, d) + PREFILL_STATIC_SMEM;
            assert!(wg <= 227 * 1024, "{d}: {wg}");
        }
    }
}
