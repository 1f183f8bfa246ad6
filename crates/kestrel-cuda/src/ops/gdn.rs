//! Gated DeltaNet: conv1d with carried state, the per-token delta-rule
//! recurrence (f32 state; also used for prefill in this first version), and
//! the gated RMSNorm.

use kestrel_core::{ForwardBatch, GdnSpec, GdnWeights};

use crate::cache::CudaCache;
use crate::device::{Arg, Gpu, blocks, ptr};
use crate::tensor::{CudaTensor, CudaWeight};

/// Mirrors `GDN_MAX_KERNEL` and `GDN_COLS` in `kernels/gdn.cu`.
const MAX_CONV_KERNEL: usize = 8;
const COLS_PER_BLOCK: usize = 32;

pub fn gated_delta_net(
    gpu: &Gpu,
    proj: &CudaTensor,
    w: &GdnWeights<CudaWeight>,
    spec: &GdnSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) -> CudaTensor {
    let t = batch.num_tokens();
    let (hk, hv, dk, dv) = (
        spec.num_k_heads,
        spec.num_v_heads,
        spec.head_k_dim,
        spec.head_v_dim,
    );
    let c = spec.conv_dim();
    assert_eq!(
        proj.rows, t,
        "gated_delta_net input has {} rows for {t} tokens",
        proj.rows
    );
    assert_eq!(
        proj.cols,
        spec.proj_width(),
        "gated_delta_net input width {} != {}",
        proj.cols,
        spec.proj_width()
    );
    assert!(
        layer < cache.conv.len(),
        "GDN layer {layer} out of range ({} layers)",
        cache.conv.len()
    );
    assert_eq!(
        cache.spec.gdn.as_ref(),
        Some(spec),
        "cache was built for another GdnSpec"
    );
    assert!(
        hk > 0 && hv % hk == 0,
        "{hv} value heads are not a multiple of {hk} key heads"
    );
    assert!(
        (1..=MAX_CONV_KERNEL).contains(&spec.conv_kernel),
        "conv kernel {} outside 1..={MAX_CONV_KERNEL}",
        spec.conv_kernel
    );
    assert!(dk <= 256, "head_k_dim {dk} above the supported 256");
    assert_eq!(
        w.conv.numel(),
        c * spec.conv_kernel,
        "conv weight must be [{c}, {}]",
        spec.conv_kernel
    );
    assert_eq!(w.a_log.numel(), hv, "A_log must have {hv} values");
    assert_eq!(w.dt_bias.numel(), hv, "dt_bias must have {hv} values");
    assert_eq!(
        w.norm.numel(),
        dv,
        "gated norm weight must have {dv} values"
    );

    let mut seq_start = vec![0i32];
    let mut seq_slot = Vec::new();
    for seq in &batch.seqs {
        assert!(
            (seq.state_slot as usize) < cache.spec.num_state_slots,
            "state slot {} out of range",
            seq.state_slot
        );
        seq_start.push(seq_start.last().unwrap() + seq.num_tokens as i32);
        seq_slot.push(seq.state_slot as i32);
    }
    let nseq = batch.seqs.len() as u32;
    let s = &gpu.stream;
    let seq_start_dev = gpu.upload(&seq_start);
    let seq_slot_dev = gpu.upload(&seq_slot);

    let conv_out = gpu.alloc::<f32>(t * c);
    if t > 0 {
        gpu.launch(
            &gpu.k.gdn_conv,
            (blocks(c, 128), nseq, 1),
            128,
            0,
            &[
                Arg::Ptr(ptr(&conv_out, s)),
                Arg::Ptr(ptr(&proj.buf, s)),
                Arg::I32(proj.cols as i32),
                Arg::Ptr(ptr(w.conv.bf16("conv1d"), s)),
                Arg::Ptr(ptr(&cache.conv[layer], s)),
                Arg::Ptr(ptr(&seq_start_dev, s)),
                Arg::Ptr(ptr(&seq_slot_dev, s)),
                Arg::I32(c as i32),
                Arg::I32(spec.conv_kernel as i32),
            ],
        );
    }

    let value_width = spec.value_width();
    let b_offset = c + value_width;
    let a_offset = b_offset + hv;
    let core = gpu.alloc::<f32>(t * value_width);
    if t > 0 {
        gpu.launch(
            &gpu.k.gdn_recurrent,
            (blocks(dv, COLS_PER_BLOCK), hv as u32, nseq),
            128,
            ((dk * COLS_PER_BLOCK + 2 * dk) * 4) as u32,
            &[
                Arg::Ptr(ptr(&core, s)),
                Arg::Ptr(ptr(&conv_out, s)),
                Arg::Ptr(ptr(&proj.buf, s)),
                Arg::I32(proj.cols as i32),
                Arg::I32(b_offset as i32),
                Arg::I32(a_offset as i32),
                Arg::Ptr(ptr(w.a_log.f32("A_log"), s)),
                Arg::Ptr(ptr(w.dt_bias.f32("dt_bias"), s)),
                Arg::Ptr(ptr(&cache.recurrent[layer], s)),
                Arg::Ptr(ptr(&seq_start_dev, s)),
                Arg::Ptr(ptr(&seq_slot_dev, s)),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(dk as i32),
                Arg::I32(dv as i32),
            ],
        );
    }

    let out = gpu.alloc::<f32>(t * value_width);
    gpu.launch(
        &gpu.k.gdn_gated_norm,
        (hv as u32, t as u32, 1),
        128,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&core, s)),
            Arg::Ptr(ptr(&proj.buf, s)),
            Arg::I32(proj.cols as i32),
            Arg::I32(c as i32),
            Arg::Ptr(ptr(w.norm.f32("gated norm"), s)),
            Arg::I32(hv as i32),
            Arg::I32(dv as i32),
            Arg::F32(spec.norm_eps),
        ],
    );
    CudaTensor {
        rows: t,
        cols: value_width,
        buf: out,
    }
}
