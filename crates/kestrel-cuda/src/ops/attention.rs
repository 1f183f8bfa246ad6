//! Full attention over the paged KV cache: one kernel normalises q/k, applies
//! RoPE and writes k/v into the pages; then either
//! - decode (every sequence has one new token): split-KV flash decoding on
//!   tensor cores plus a combine kernel, replayable as a CUDA graph (the grid
//!   depends only on the sequence count and the heads; lengths are read on
//!   the device), or
//! - prefill (anything else): causal flash attention on tensor cores: blocks
//!   of 128-192 queries over double-buffered K/V tiles, on wgmma where the
//!   GPU has it (compute capability 9.0) and on mma.sync elsewhere (version 2,
//!   `KESTREL_ATTN_PREFILL=v2`); where version 2's tiles do not fit the
//!   device's shared memory (head_dim 256 on sm_121), or with
//!   `KESTREL_ATTN_PREFILL=v1`, the older 64-query single-buffered kernel.
//!
//! Head dims without a tensor-core kernel, and f32 caches (`Precision::F32`),
//! go through a generic kernel.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use kestrel_core::{AttentionSpec, AttentionWeights, BackendError, ForwardBatch, Result};

use crate::cache::CudaCache;
use crate::device::{Arg, Gpu, ptr};
use crate::precision::Precision;
use crate::step::StepLayout;
use crate::switches::AttnPrefillChoice;
use crate::tensor::{CudaTensor, CudaWeight};

const THREADS: u32 = 128;
/// Mirrors `QKN_WARPS` in `kernels/attention.cu`: heads of one token per
/// block, a warp each.
const QKN_WARPS: usize = 8;
/// The generic kernel keeps at most 4 output dims per thread.
const MAX_HEAD_DIM: usize = 4 * THREADS as usize;
/// Head dims of the tensor-core kernels (`_d64`, `_d128`, `_d256`), in the
/// order of `Kernels::attention_decode` / `attention_prefill`.
pub const FAST_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Mirror `kernels/attention_decode.cu`.
const DECODE_HEADS: usize = 8;
const DECODE_MAX_SPLITS: usize = 128;
const COMBINE_THREADS: u32 = 256;
/// Mirror `kernels/attention_prefill.cu`.
const PREFILL_ROWS: usize = 64;
const PREFILL_KEYS: usize = 64;

/// Mirror `PF2_ROWS` / `PF2_THREADS` (version 2 of the prefill kernel).
const PREFILL_V2_ROWS: usize = 128;
const PREFILL_V2_THREADS: u32 = 256;
/// Static shared memory of every prefill kernel (the staged cache rows).
const PREFILL_STATIC_SMEM: u32 = 2 * PREFILL_KEYS as u32 * 8;

/// Warpgroups of 64 queries per block of the wgmma prefill kernel, per head
/// dim of `FAST_HEAD_DIMS` (mirror the instantiations `attention_prefill_wg_d{D}`
/// in `kernels/attention_prefill_sm90.cu`; its K/V tiles are `PREFILL_KEYS`).
const WG_WARPGROUPS: [usize; 3] = [3, 3, 2];

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
        let name = format!("{prefix}_d{d}");
        let f = m
            .load_function(&name)
            .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem(d) as i32,
        )
        .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
        Ok(Some(f))
    };
    Ok([
        load(FAST_HEAD_DIMS[0])?,
        load(FAST_HEAD_DIMS[1])?,
        load(FAST_HEAD_DIMS[2])?,
    ])
}

/// `attention_prefill_v2_d{D}` for every D of `FAST_HEAD_DIMS` whose tiles
/// fit the device's opt-in shared memory per block; `None` for the others.
pub fn prefill_v2_kernels(
    ctx: &Arc<CudaContext>,
    m: &Arc<CudaModule>,
) -> Result<[Option<CudaFunction>; 3]> {
    let limit = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .unwrap_or(0)
        .max(0) as u32;
    per_head_dim(m, "attention_prefill_v2", prefill_v2_smem_bytes, |d| {
        prefill_v2_smem_bytes(d) + PREFILL_STATIC_SMEM <= limit
    })
}

/// `attention_prefill_wg_d{D}` (`kernels/attention_prefill_sm90.cu`) for
/// every D of `FAST_HEAD_DIMS` on compute capability 9.0; all `None` on
/// other GPUs, where the kernels only trap.
pub fn prefill_wg_kernels(
    ctx: &Arc<CudaContext>,
    m: &Arc<CudaModule>,
) -> Result<[Option<CudaFunction>; 3]> {
    let hopper = ctx.compute_capability().is_ok_and(|cc| cc == (9, 0));
    let smem = |d: usize| {
        let i = FAST_HEAD_DIMS
            .iter()
            .position(|&x| x == d)
            .expect("a fast head dim");
        prefill_wg_smem_bytes(WG_WARPGROUPS[i], d)
    };
    per_head_dim(m, "attention_prefill_wg", smem, |_| hopper)
}

/// Warps per decode block (`dec_warps` in `kernels/attention_decode.cu`).
fn decode_warps(d: usize) -> usize {
    if d >= 256 { 2 } else { 4 }
}

/// Dynamic shared memory of the decode kernel: per warp a ring of 3 steps of
/// 16 K rows and 16 V rows of bf16.
pub fn decode_smem_bytes(d: usize) -> u32 {
    (decode_warps(d) * 3 * 2 * 16 * d * 2) as u32
}

/// The tensor-core kernels `{prefix}_d{D}` for every D of `FAST_HEAD_DIMS`,
/// allowed the dynamic shared memory they need.
pub fn fast_kernels(
    m: &Arc<CudaModule>,
    prefix: &str,
    smem: fn(usize) -> u32,
) -> Result<[CudaFunction; 3]> {
    let [a, b, c] = per_head_dim(m, prefix, smem, |_| true)?;
    let all = |f: Option<CudaFunction>| f.expect("every head dim was loaded");
    Ok([all(a), all(b), all(c)])
}

/// Largest head dim with a fused decode kernel (`attention_decode_fused_d*`):
/// its blocks have 128 threads up to here, 64 above (too few to form the new
/// token's rows faster than a kernel of their own).
pub const FUSED_DECODE_MAX_HEAD_DIM: usize = 128;

/// `attention_decode_fused_d{D}` per head dim of `FAST_HEAD_DIMS` up to
/// [`FUSED_DECODE_MAX_HEAD_DIM`], configured like the unfused ones.
pub fn fused_decode_kernels(m: &Arc<CudaModule>) -> Result<[Option<CudaFunction>; 3]> {
    per_head_dim(m, "attention_decode_fused", decode_smem_bytes, |d| {
        d <= FUSED_DECODE_MAX_HEAD_DIM
    })
}

/// Splits of the decode kernel: a function of the launch shape and the
/// device only, never of sequence lengths (recorded steps replay with other
/// lengths). At most one wave of blocks (a second, partial wave would leave
/// most of the device idle): enough to stream the cache of a single long
/// sequence at full bandwidth, while a batch that fills the device on its own
/// is not split (fewer partials to merge).
fn decode_splits(target_blocks: usize, seqs: usize, blocks_per_seq: usize) -> usize {
    (target_blocks / (seqs * blocks_per_seq)).clamp(1, DECODE_MAX_SPLITS)
}

/// Decode blocks that fit on the device at once (two per SM at 96 KiB of
/// shared memory each).
fn decode_target_blocks(gpu: &Gpu) -> usize {
    2 * gpu.sm_count()
}

pub fn attention(
    gpu: &Gpu,
    proj: &CudaTensor,
    w: &AttentionWeights<CudaWeight>,
    spec: &AttentionSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) -> CudaTensor {
    let (hq, hkv, d) = (spec.num_q_heads, spec.num_kv_heads, spec.head_dim);
    let t = batch.num_tokens();
    assert_eq!(
        proj.rows, t,
        "attention input has {} rows for {t} tokens",
        proj.rows
    );
    assert_eq!(
        proj.cols,
        spec.proj_width(),
        "attention input width {} != {}",
        proj.cols,
        spec.proj_width()
    );
    assert!(
        layer < cache.k.len(),
        "attention layer {layer} out of range ({} layers)",
        cache.k.len()
    );
    assert_eq!(
        (cache.spec.num_kv_heads, cache.spec.head_dim),
        (hkv, d),
        "cache shape does not match attention"
    );
    assert!(
        hkv > 0 && hq % hkv == 0,
        "{hq} q heads are not a multiple of {hkv} kv heads"
    );
    assert!(
        d <= MAX_HEAD_DIM,
        "head_dim {d} above the supported {MAX_HEAD_DIM}"
    );
    assert!(
        spec.rope.rotary_dim <= d && spec.rope.rotary_dim.is_multiple_of(2),
        "bad rotary_dim {}",
        spec.rope.rotary_dim
    );
    assert_eq!(w.q_norm.numel(), d, "q_norm must have head_dim values");
    assert_eq!(w.k_norm.numel(), d, "k_norm must have head_dim values");
    cache.check_pages(batch);

    let l = gpu.layout(batch, cache.spec.block_size);
    let s = &gpu.stream;
    let q_width = spec.q_width();
    let k_offset = q_width * if spec.output_gate { 2 } else { 1 };
    let v_offset = k_offset + spec.kv_width();
    let (k_cache, v_cache) = (ptr(&cache.k[layer], s), ptr(&cache.v[layer], s));

    let f32_cache = cache.kv_precision == Precision::F32;
    let fast = FAST_HEAD_DIMS.iter().position(|&x| x == d);
    // Sequences without new tokens (if any) have no output row: not decode.
    let decode = l.max_new == 1 && l.tokens == l.seqs;
    // The fused decode kernel does the first kernel's work itself.
    let fused = fast.is_some_and(|i| gpu.k.attention_decode_fused[i].is_some())
        && decode
        && !f32_cache
        && gpu.attn_decode_fused;
    // q from the first kernel (the fused decode kernel forms its own).
    let q = (!fused).then(|| gpu.alloc::<f32>(t * q_width));
    let q_ptr = q.as_ref().map_or(0, |q| ptr(q, s));
    if !fused {
        gpu.launch(
            if f32_cache {
                &gpu.k.qk_norm_rope_kv_write_f32
            } else {
                &gpu.k.qk_norm_rope_kv_write
            },
            (t as u32, (hq + 2 * hkv).div_ceil(QKN_WARPS) as u32, 1),
            32 * QKN_WARPS as u32,
            ((spec.rope.rotary_dim + QKN_WARPS * d) * 4) as u32,
            &[
                Arg::Ptr(ptr(&proj.buf, s)),
                Arg::I32(proj.cols as i32),
                Arg::Ptr(q_ptr),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(ptr(w.q_norm.f32("q_norm"), s)),
                Arg::Ptr(ptr(w.k_norm.f32("k_norm"), s)),
                Arg::Ptr(l.positions()),
                Arg::Ptr(l.slot_mapping()),
                Arg::I32(hq as i32),
                Arg::I32(hkv as i32),
                Arg::I32(d as i32),
                Arg::I32(spec.rope.rotary_dim as i32),
                Arg::F32(spec.rope.theta),
                Arg::F32(spec.norm_eps),
                Arg::I32(k_offset as i32),
                Arg::I32(v_offset as i32),
            ],
        );
    }

    let out = gpu.alloc::<f32>(t * q_width);
    let a = Attend {
        gpu,
        spec,
        l: &l,
        out: ptr(&out, s),
        q: q_ptr,
        k_cache,
        v_cache,
        block_size: cache.spec.block_size,
        proj: ptr(&proj.buf, s),
        proj_stride: proj.cols,
        gate_offset: if spec.output_gate { q_width as i32 } else { -1 },
        f32_cache,
        new_token: fused.then(|| NewTokenArgs {
            q_norm: ptr(w.q_norm.f32("q_norm"), s),
            k_norm: ptr(w.k_norm.f32("k_norm"), s),
            k_offset,
            v_offset,
        }),
    };
    match fast {
        // The tensor-core kernels read bf16 pages.
        _ if f32_cache => a.generic(),
        Some(i) if decode => a.decode(i),
        Some(i) => a.prefill(i),
        None => a.generic(),
    }
    CudaTensor {
        bf16: None,
        rows: t,
        cols: q_width,
        buf: out,
    }
}

/// What `attention_decode_fused` reads to form the new token's q, k and v.
struct NewTokenArgs {
    q_norm: u64,
    k_norm: u64,
    k_offset: usize,
    v_offset: usize,
}

/// Everything the attention kernels read, by device address.
struct Attend<'a> {
    gpu: &'a Gpu,
    spec: &'a AttentionSpec,
    l: &'a StepLayout,
    out: u64,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    block_size: usize,
    proj: u64,
    proj_stride: usize,
    gate_offset: i32,
    f32_cache: bool,
    /// Set: decode runs the fused kernel (no q was computed beforehand).
    new_token: Option<NewTokenArgs>,
}

impl Attend<'_> {
    fn scale_log2(&self) -> f32 {
        self.spec.scale * std::f32::consts::LOG2_E
    }

    /// One token per sequence: split-KV partials, then the combine kernel.
    fn decode(&self, dim_index: usize) {
        let (gpu, l) = (self.gpu, self.l);
        let (hq, hkv, d) = (
            self.spec.num_q_heads,
            self.spec.num_kv_heads,
            self.spec.head_dim,
        );
        let seqs = l.seqs;
        let blocks_per_seq = hkv * (hq / hkv).div_ceil(DECODE_HEADS);
        let splits = decode_splits(decode_target_blocks(gpu), seqs, blocks_per_seq);
        // Stream-ordered allocations: part of a recorded graph when captured.
        let part_o = gpu.alloc::<f32>(seqs * hq * splits * d);
        let part_ml = gpu.alloc::<f32>(seqs * hq * splits * 2);
        let s = &gpu.stream;
        let grid = (blocks_per_seq as u32, seqs as u32, splits as u32);
        let (threads, smem) = (32 * decode_warps(d) as u32, decode_smem_bytes(d));
        let common = [
            Arg::Ptr(l.seq_start()),
            Arg::Ptr(l.seq_len()),
            Arg::Ptr(l.table_offset()),
            Arg::Ptr(l.block_tables()),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            Arg::I32(self.block_size as i32),
            Arg::F32(self.scale_log2()),
            Arg::I32(splits as i32),
        ];
        let (parts, caches) = (
            [Arg::Ptr(ptr(&part_o, s)), Arg::Ptr(ptr(&part_ml, s))],
            [Arg::Ptr(self.k_cache), Arg::Ptr(self.v_cache)],
        );
        match &self.new_token {
            None => {
                let mut args = parts.to_vec();
                args.push(Arg::Ptr(self.q));
                args.extend(caches);
                args.extend(common);
                gpu.launch(
                    &gpu.k.attention_decode[dim_index],
                    grid,
                    threads,
                    smem,
                    &args,
                );
            }
            Some(nt) => {
                let rope = self.spec.rope;
                let mut args = parts.to_vec();
                args.extend(caches);
                args.extend(common);
                args.extend([
                    Arg::Ptr(self.proj),
                    Arg::I32(self.proj_stride as i32),
                    Arg::I32(nt.k_offset as i32),
                    Arg::I32(nt.v_offset as i32),
                    Arg::Ptr(nt.q_norm),
                    Arg::Ptr(nt.k_norm),
                    Arg::Ptr(l.positions()),
                    Arg::Ptr(l.slot_mapping()),
                    Arg::I32(rope.rotary_dim as i32),
                    Arg::F32(rope.theta),
                    Arg::F32(self.spec.norm_eps),
                ]);
                let f = gpu.k.attention_decode_fused[dim_index]
                    .as_ref()
                    .expect("a fused decode kernel for this head dim");
                gpu.launch(f, grid, threads, smem, &args);
            }
        }
        gpu.launch(
            &gpu.k.attention_decode_combine,
            (hq as u32, seqs as u32, 1),
            COMBINE_THREADS,
            0,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(ptr(&part_o, s)),
                Arg::Ptr(ptr(&part_ml, s)),
                Arg::Ptr(l.seq_start()),
                Arg::I32(hq as i32),
                Arg::I32(d as i32),
                Arg::I32(splits as i32),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }

    /// Causal query tiles per (sequence, q head); eager only: the grid
    /// follows this step's longest chunk.
    fn prefill(&self, dim_index: usize) {
        let (gpu, l) = (self.gpu, self.l);
        let (hq, d) = (self.spec.num_q_heads, self.spec.head_dim);
        let choice = gpu.overrides.attn_prefill;
        let wg = gpu.k.attention_prefill_wg[dim_index]
            .as_ref()
            .filter(|_| choice == AttnPrefillChoice::Best);
        let v2 = gpu.k.attention_prefill_v2[dim_index]
            .as_ref()
            .filter(|_| choice != AttnPrefillChoice::V1);
        // Versions 2 and wgmma put the query tile last (heaviest tiles of
        // every head first); version 1 has it first.
        let query_tiles_last =
            |rows: usize| (hq as u32, l.seqs as u32, l.max_new.div_ceil(rows) as u32);
        let (f, grid, threads, smem) = match (wg, v2) {
            (Some(f), _) => {
                let warpgroups = WG_WARPGROUPS[dim_index];
                (
                    f,
                    query_tiles_last(64 * warpgroups),
                    128 * warpgroups as u32,
                    prefill_wg_smem_bytes(warpgroups, d),
                )
            }
            (None, Some(f)) => (
                f,
                query_tiles_last(PREFILL_V2_ROWS),
                PREFILL_V2_THREADS,
                prefill_v2_smem_bytes(d),
            ),
            (None, None) => (
                &gpu.k.attention_prefill[dim_index],
                (
                    l.max_new.div_ceil(PREFILL_ROWS) as u32,
                    hq as u32,
                    l.seqs as u32,
                ),
                THREADS,
                prefill_smem_bytes(d),
            ),
        };
        gpu.launch(
            f,
            grid,
            threads,
            smem,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(self.q),
                Arg::Ptr(self.k_cache),
                Arg::Ptr(self.v_cache),
                Arg::Ptr(l.seq_start()),
                Arg::Ptr(l.seq_len()),
                Arg::Ptr(l.table_offset()),
                Arg::Ptr(l.block_tables()),
                Arg::I32(hq as i32),
                Arg::I32(self.spec.num_kv_heads as i32),
                Arg::I32(self.block_size as i32),
                Arg::F32(self.scale_log2()),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }

    /// Any head dim up to `MAX_HEAD_DIM`, one block per (q head, token).
    fn generic(&self) {
        let (gpu, l) = (self.gpu, self.l);
        let (hq, d) = (self.spec.num_q_heads, self.spec.head_dim);
        gpu.launch(
            if self.f32_cache {
                &gpu.k.paged_attention_f32
            } else {
                &gpu.k.paged_attention
            },
            (hq as u32, l.tokens as u32, 1),
            THREADS,
            ((d + THREADS as usize) * 4) as u32,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(self.q),
                Arg::Ptr(self.k_cache),
                Arg::Ptr(self.v_cache),
                Arg::Ptr(l.positions()),
                Arg::Ptr(l.token_seq()),
                Arg::Ptr(l.table_offset()),
                Arg::Ptr(l.block_tables()),
                Arg::I32(hq as i32),
                Arg::I32(self.spec.num_kv_heads as i32),
                Arg::I32(d as i32),
                Arg::I32(self.block_size as i32),
                Arg::F32(self.spec.scale),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_splits_depend_on_shape_only() {
        // One long sequence on a 2-kv-head model gets the most splits.
        assert_eq!(decode_splits(264, 1, 2), DECODE_MAX_SPLITS);
        assert_eq!(decode_splits(264, 1, 4), 66);
        // A batch that fills the device is not split.
        assert_eq!(decode_splits(264, 64, 8), 1);
        assert_eq!(decode_splits(264, 8, 4), 8);
        assert_eq!(decode_splits(264, 64, 2), 2);
    }

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
