//! Full attention over the paged KV cache: one kernel normalises q/k, applies
//! RoPE and writes k/v into the pages; then either
//! - decode (every sequence has at most [`DECODE_MAX_ROWS`] new tokens: a
//!   decode step, or the verify step of speculative decoding): split-KV
//!   flash decoding on tensor cores plus a combine kernel, every query row
//!   taken as a one-token sequence that attends to the keys up to its own
//!   (the step layout's row sections), so that a verify chunk's rows see
//!   what consecutive decode steps would. Replayable as a CUDA graph (the
//!   grid depends only on the row count and the heads; lengths are read on
//!   the device). Only steps of one token per sequence fuse the first
//!   kernel's work into it (rows of a verify chunk read each other's keys);
//!   or
//! - prefill (anything else): causal flash attention on tensor cores: blocks
//!   of 128-192 queries over double-buffered K/V tiles, on wgmma where the
//!   GPU has it (compute capability 9.0) and on mma.sync elsewhere (version
//!   2); where version 2's tiles do not fit the device's shared memory
//!   (head_dim 256 on sm_121), the older 64-query single-buffered kernel.
//!   Which one runs per head dim is the plan's `attention.prefill`.
//!
//! Head dims without a tensor-core kernel, and f32 caches (`Precision::F32`),
//! go through a generic kernel.

pub mod attend;
pub mod block;
pub mod kernels;

use kestrel_core::{AttentionSpec, AttentionWeights, ForwardBatch};

use crate::cache::CudaCache;
use crate::context::Cx;
use crate::device::ptr;
use crate::plan::{AttnDecode, FAST_HEAD_DIMS};
use crate::precision::Precision;
use crate::tensor::{CudaTensor, CudaWeight};
use attend::{Attend, NewTokenArgs};
use kernels::{DECODE_MAX_ROWS, MAX_HEAD_DIM};

pub fn attention(
    cx: &Cx,
    proj: &CudaTensor,
    w: &AttentionWeights<CudaWeight>,
    spec: &AttentionSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) -> CudaTensor {
    check_inputs(proj, w, spec, cache, layer, batch);
    let d = spec.head_dim;
    let t = batch.num_tokens();

    let gpu = cx.gpu;
    let l = cx.layout(batch, cache.spec.block_size);
    let s = &gpu.stream;
    let q_width = spec.q_width();
    let k_offset = k_offset(spec);
    let v_offset = k_offset + spec.kv_width();
    let (k_cache, v_cache) = (ptr(&cache.k[layer], s), ptr(&cache.v[layer], s));

    let f32_cache = cache.kv_precision == Precision::F32;
    let fast = FAST_HEAD_DIMS.iter().position(|&x| x == d);
    let decode =
        l.tokens > 0 && (cx.few_rows(l.max_new, DECODE_MAX_ROWS) || cx.plan.batch_invariant);
    // The fused decode kernel does the first kernel's work itself: only when
    // no row reads a key another row of the step writes.
    let fused = fast.is_some_and(|i| cx.plan.attention.decode.get(i) == AttnDecode::Fused)
        && decode
        && l.max_new == 1
        && !f32_cache;
    // q from the first kernel (the fused decode kernel forms its own).
    let q = (!fused).then(|| gpu.alloc::<f32>(t * q_width));
    let q_ptr = q.as_ref().map_or(0, |q| ptr(q, s));
    if !fused {
        write_new_keys(cx, proj, q_ptr, (k_cache, v_cache), w, &l, spec, f32_cache);
    }

    let out = gpu.alloc::<f32>(t * q_width);
    let a = Attend {
        cx,
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

/// Column of `proj` where the keys start (after q and, with an output gate,
/// the gate).
fn k_offset(spec: &AttentionSpec) -> usize {
    spec.q_width() * if spec.output_gate { 2 } else { 1 }
}

/// The first attention kernel on every new token of the layout `l`: q
/// normalised and rotated into `q`, k and v (k normalised and rotated)
/// written into the cache pages `caches`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_new_keys(
    cx: &Cx,
    proj: &CudaTensor,
    q: u64,
    caches: (u64, u64),
    w: &AttentionWeights<CudaWeight>,
    l: &crate::step::StepLayout,
    spec: &AttentionSpec,
    f32_cache: bool,
) {
    let s = &cx.gpu.stream;
    block::norm_rope_write(
        cx,
        block::RowsAt::all(proj, s),
        q,
        caches,
        (
            ptr(w.q_norm.f32("q_norm"), s),
            ptr(w.k_norm.f32("k_norm"), s),
        ),
        l,
        spec,
        (spec.num_q_heads, k_offset(spec)),
        f32_cache,
    );
}

/// The shapes every attention over the paged cache needs (dense, and the
/// sparse attention of `ops::flash_next`), and the step's pages.
pub(crate) fn check_inputs(
    proj: &CudaTensor,
    w: &AttentionWeights<CudaWeight>,
    spec: &AttentionSpec,
    cache: &CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) {
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
}
