//! Full attention over the paged KV cache: one kernel normalises q/k, applies
//! RoPE and writes k/v into the pages; a second attends causally.

use kestrel_core::{AttentionSpec, AttentionWeights, ForwardBatch};

use crate::cache::CudaCache;
use crate::device::{Arg, Gpu, ptr};
use crate::tensor::{CudaTensor, CudaWeight};

const THREADS: u32 = 128;
/// The attention kernel keeps at most 4 output dims per thread.
const MAX_HEAD_DIM: usize = 4 * THREADS as usize;

/// Per-token indices the kernels read, flattened over the batch.
struct TokenLayout {
    positions: Vec<i32>,
    token_seq: Vec<i32>,
    slot_mapping: Vec<i64>,
    seq_table_offset: Vec<i32>,
    block_tables: Vec<i32>,
}

fn layout(batch: &ForwardBatch, cache: &CudaCache) -> TokenLayout {
    let bs = cache.spec.block_size;
    let mut l = TokenLayout {
        positions: Vec::new(),
        token_seq: Vec::new(),
        slot_mapping: Vec::new(),
        seq_table_offset: Vec::new(),
        block_tables: Vec::new(),
    };
    for (s, seq) in batch.seqs.iter().enumerate() {
        let pages_needed = seq.total_len().div_ceil(bs);
        assert!(
            seq.block_table.len() >= pages_needed,
            "sequence {s} holds {} tokens but its block table has {} of {pages_needed} pages",
            seq.total_len(),
            seq.block_table.len()
        );
        if let Some(&bad) = seq
            .block_table
            .iter()
            .find(|&&p| p as usize >= cache.spec.num_blocks)
        {
            panic!("page {bad} out of range ({} pages)", cache.spec.num_blocks);
        }
        l.seq_table_offset.push(l.block_tables.len() as i32);
        l.block_tables
            .extend(seq.block_table.iter().map(|&p| p as i32));
        for pos in seq.cached_len..seq.total_len() {
            l.positions.push(pos as i32);
            l.token_seq.push(s as i32);
            l.slot_mapping
                .push((seq.block_table[pos / bs] as usize * bs + pos % bs) as i64);
        }
    }
    l
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

    let l = layout(batch, cache);
    let s = &gpu.stream;
    let positions = gpu.upload(&l.positions);
    let token_seq = gpu.upload(&l.token_seq);
    let slot_mapping = gpu.upload(&l.slot_mapping);
    let seq_table_offset = gpu.upload(&l.seq_table_offset);
    let block_tables = gpu.upload(&l.block_tables);

    let q_width = spec.q_width();
    let k_offset = q_width * if spec.output_gate { 2 } else { 1 };
    let v_offset = k_offset + spec.kv_width();
    let gate_offset = if spec.output_gate { q_width as i32 } else { -1 };
    let (k_cache, v_cache) = (ptr(&cache.k[layer], s), ptr(&cache.v[layer], s));

    let q = gpu.alloc::<f32>(t * q_width);
    gpu.launch(
        &gpu.k.qk_norm_rope_kv_write,
        ((hq + 2 * hkv) as u32, t as u32, 1),
        THREADS,
        (d * 4) as u32,
        &[
            Arg::Ptr(ptr(&proj.buf, s)),
            Arg::I32(proj.cols as i32),
            Arg::Ptr(ptr(&q, s)),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(ptr(w.q_norm.f32("q_norm"), s)),
            Arg::Ptr(ptr(w.k_norm.f32("k_norm"), s)),
            Arg::Ptr(ptr(&positions, s)),
            Arg::Ptr(ptr(&slot_mapping, s)),
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

    let out = gpu.alloc::<f32>(t * q_width);
    gpu.launch(
        &gpu.k.paged_attention,
        (hq as u32, t as u32, 1),
        THREADS,
        ((d + THREADS as usize) * 4) as u32,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&q, s)),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(ptr(&positions, s)),
            Arg::Ptr(ptr(&token_seq, s)),
            Arg::Ptr(ptr(&seq_table_offset, s)),
            Arg::Ptr(ptr(&block_tables, s)),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            Arg::I32(d as i32),
            Arg::I32(cache.spec.block_size as i32),
            Arg::F32(spec.scale),
            Arg::Ptr(ptr(&proj.buf, s)),
            Arg::I32(proj.cols as i32),
            Arg::I32(gate_offset),
        ],
    );
    CudaTensor {
        rows: t,
        cols: q_width,
        buf: out,
    }
}
