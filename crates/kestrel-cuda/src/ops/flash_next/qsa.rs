//! QSA on the device: the indexer's keys, block keys and block scores, and
//! attention over each token's selected positions.
//!
//! Selection: the raw keys are stored in their paged rows, each block a new
//! token completes is pooled, normalised and rotated into its paged row of
//! the pooled store (a warp per block), and the tokens with more complete
//! blocks than the budget score them all from that store. The scores come back to
//! the host, where the bookkeeping the CPU backend runs too
//! (`kestrel_core::flash_next::selection`: which tokens score, where, and
//! the top blocks in the reference's tie order) turns them into the
//! selection: it must not depend on how a device sorts. Tokens within the
//! budget select everything without scoring.
//!
//! Attention: each token becomes a one-row sequence whose block table lists
//! its selected blocks as pages of `compress_ratio` cache slots (then its
//! tail's page), so the split-KV decode kernels (or the generic kernel on
//! f32 caches) read exactly those keys (its own, which the first attention
//! kernel has just written, only when it selects it). A step in which no
//! token chooses is ordinary causal attention (the backend's `attention`).
//! Which tokens complete a block, and so pool it, the kernel reads from the
//! step's layout: within the budget nothing is uploaded, and a decode step
//! can be recorded as a CUDA graph.

use kestrel_core::flash_next::selection::ScoreLayout;
use kestrel_core::flash_next::{IndexerKeys, QsaNorms, QsaSpec, TokenSelection};
use kestrel_core::{AttentionSpec, AttentionWeights, ForwardBatch, SeqChunk};

use super::kernels::{QSA_MAX_HEAD_DIM, QSA_WARPS};
use crate::cache::CudaCache;
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::ops::attention::attend::Attend;
use crate::ops::attention::block::{RowsAt, norm_rope_write};
use crate::ops::attention::{check_inputs, write_new_keys};
use crate::plan::FAST_HEAD_DIMS;
use crate::precision::Precision;
use crate::step::temporary_layout;
use crate::tensor::{CudaTensor, CudaWeight};

/// See `FlashNextOps::qsa_select`.
pub fn select(
    cx: &Cx,
    proj: &CudaTensor,
    norms: &QsaNorms<CudaWeight>,
    spec: &QsaSpec,
    keys: &mut IndexerKeys<CudaTensor>,
    block_size: usize,
    batch: &ForwardBatch,
) -> TokenSelection {
    let (nh, d, r) = (spec.num_heads, spec.head_dim, spec.compress_ratio);
    let t = batch.num_tokens();
    assert_eq!(
        (proj.rows, proj.cols),
        (t, spec.proj_width()),
        "qsa_select: projection [T, (heads + 1) * head_dim]"
    );
    assert_eq!(
        (keys.raw.cols, keys.pooled.cols),
        (d, d),
        "qsa_select: key rows of head_dim"
    );
    assert!(
        block_size.is_multiple_of(r),
        "pages of {block_size} positions are not whole blocks of {r}"
    );
    assert!(
        d <= QSA_MAX_HEAD_DIM && spec.rope.rotary_dim <= d,
        "indexer head dim {d} (at most {QSA_MAX_HEAD_DIM}, rotary dims inside it)"
    );
    assert_eq!(norms.q.weight.numel(), d, "indexer q norm of head_dim");
    assert_eq!(norms.k.weight.numel(), d, "indexer k norm of head_dim");
    if t == 0 {
        return TokenSelection::default();
    }
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let l = cx.layout(batch, block_size);
    gpu.launch(
        &cx.k.flash_next.qsa_store_keys,
        (t as u32, 1, 1),
        128,
        0,
        &[
            Arg::Ptr(ptr(&keys.raw.buf, s)),
            Arg::Ptr(ptr(&proj.buf, s)),
            Arg::I32(proj.cols as i32),
            Arg::I32((nh * d) as i32),
            Arg::Ptr(l.slot_mapping()),
            Arg::I32(d as i32),
        ],
    );
    let layout = ScoreLayout::new(spec, batch);
    let table_args = [Arg::Ptr(l.table_offset()), Arg::Ptr(l.block_tables())];
    // Launched whether or not a token completes a block (which a recorded
    // decode step replays with other positions): the kernel finds the
    // completing tokens in the layout.
    let mut args = vec![
        Arg::Ptr(ptr(&keys.pooled.buf, s)),
        Arg::Ptr(ptr(&keys.raw.buf, s)),
        Arg::Ptr(l.positions()),
        Arg::Ptr(l.token_seq()),
        Arg::I32(t as i32),
    ];
    args.extend(table_args);
    args.extend([
        Arg::Ptr(ptr(norms.k.weight.f32("indexer k norm"), s)),
        Arg::I32(block_size as i32),
        Arg::I32(r as i32),
        Arg::I32(d as i32),
        Arg::I32(spec.rope.rotary_dim as i32),
        Arg::F32(spec.rope.theta),
        Arg::F32(spec.eps),
    ]);
    gpu.launch(
        &cx.k.flash_next.qsa_pool_blocks,
        (blocks(t, QSA_WARPS), 1, 1),
        32 * QSA_WARPS as u32,
        (QSA_WARPS * d * 4) as u32,
        &args,
    );
    let scores = if layout.scored.is_empty() {
        Vec::new()
    } else {
        // The queries: the attention family's first kernel with no key heads
        // (each head normalised, then RoPE at the token's position).
        let q = gpu.alloc::<f32>(t * nh * d);
        let q_norm = ptr(norms.q.weight.f32("indexer q norm"), s);
        let index_spec = AttentionSpec {
            num_q_heads: nh,
            num_kv_heads: 0,
            head_dim: d,
            rope: spec.rope,
            norm_eps: spec.eps,
            output_gate: false,
            scale: 1.0,
        };
        norm_rope_write(
            cx,
            RowsAt::all(proj, s),
            ptr(&q, s),
            (0, 0),
            (q_norm, q_norm),
            &l,
            &index_spec,
            (nh, 0),
            false,
        );
        // Per scored token: [row, sequence, blocks, score offset].
        let rows: Vec<i32> = layout
            .scored
            .iter()
            .flat_map(|u| [u.row, u.seq, u.blocks, u.at].map(|v| v as i32))
            .collect();
        let rows = gpu.upload(&rows);
        let out = gpu.alloc::<f32>(layout.score_len);
        let max_scored = layout.scored.iter().map(|u| u.blocks).max().unwrap_or(0);
        let mut args = vec![
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&q, s)),
            Arg::Ptr(ptr(&keys.pooled.buf, s)),
            Arg::Ptr(ptr(&rows, s)),
        ];
        args.extend(table_args);
        args.extend([
            Arg::I32(block_size as i32),
            Arg::I32(r as i32),
            Arg::I32(nh as i32),
            Arg::I32(d as i32),
        ]);
        gpu.launch(
            &cx.k.flash_next.qsa_scores,
            (blocks(max_scored, QSA_WARPS), layout.scored.len() as u32, 1),
            32 * QSA_WARPS as u32,
            (nh * d * 4) as u32,
            &args,
        );
        gpu.download(&out, layout.score_len)
    };
    layout.selection(spec, batch, &scores)
}

/// See `FlashNextOps::sparse_attention`.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention(
    cx: &Cx,
    proj: &CudaTensor,
    w: &AttentionWeights<CudaWeight>,
    spec: &AttentionSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
    selection: &TokenSelection,
) -> CudaTensor {
    check_inputs(proj, w, spec, cache, layer, batch);
    let d = spec.head_dim;
    let t = batch.num_tokens();
    assert_eq!(selection.tokens.len(), t, "one selection per new token");
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let q_width = spec.q_width();
    let out = gpu.alloc::<f32>(t * q_width);
    if t == 0 {
        return CudaTensor {
            bf16: None,
            rows: 0,
            cols: q_width,
            buf: out,
        };
    }
    let block_size = cache.spec.block_size;
    let l = cx.layout(batch, block_size);
    let (k_cache, v_cache) = (ptr(&cache.k[layer], s), ptr(&cache.v[layer], s));
    let f32_cache = cache.kv_precision == Precision::F32;
    let q = gpu.alloc::<f32>(t * q_width);
    let caches = (k_cache, v_cache);
    write_new_keys(cx, proj, ptr(&q, s), caches, w, &l, spec, f32_cache);
    // Every token as a sequence of one row over its selected blocks, all of
    // them visible to it. Its own key, just written, is among them unless
    // the token completes a block the indexer did not pick (the reference
    // then attends without it too).
    let ratio = selection.ratio;
    let rows = ForwardBatch {
        seqs: selection
            .pages(batch, block_size)
            .into_iter()
            .map(|(pages, len)| SeqChunk::new(1, len - 1, pages, 0))
            .collect(),
    };
    let rl = temporary_layout(gpu, &rows, ratio);
    let a = Attend {
        cx,
        spec,
        l: &rl,
        out: ptr(&out, s),
        q: ptr(&q, s),
        k_cache,
        v_cache,
        block_size: ratio,
        proj: ptr(&proj.buf, s),
        proj_stride: proj.cols,
        gate_offset: if spec.output_gate { q_width as i32 } else { -1 },
        f32_cache,
        new_token: None,
    };
    // Split each row's keys as a decode step of `t` rows would: a long
    // prefill fills the device with rows alone.
    match FAST_HEAD_DIMS.iter().position(|&x| x == d) {
        Some(i) if !f32_cache => a.decode_rows_of(i, t),
        _ => a.generic(),
    }
    CudaTensor {
        bf16: None,
        rows: t,
        cols: q_width,
        buf: out,
    }
}
