//! Structured outputs' token masks applied on the device: a constrained row
//! then takes the device argmax or candidates like any other, instead of
//! coming to the host whole to be masked there.

use kestrel_core::RowMask;
use kestrel_core::token_mask::mask_words;

use crate::context::Cx;
use crate::device::ptr;
use crate::launch::Arg;
use crate::tensor::CudaTensor;

const THREADS: u32 = 256;

/// [`Backend::mask_rows`](kestrel_core::Backend::mask_rows): one upload of
/// the masks (each padded to the row's words) and their rows, one launch.
pub fn mask_rows(cx: &Cx, logits: &mut CudaTensor, masks: &[RowMask<'_>]) {
    if masks.is_empty() {
        return;
    }
    assert!(
        logits.cols <= i32::MAX as usize,
        "masks over {} columns",
        logits.cols
    );
    let words = mask_words(logits.cols);
    let mut rows = Vec::with_capacity(masks.len());
    let mut allowed = vec![0u32; masks.len() * words];
    for (m, mask) in masks.iter().enumerate() {
        assert!(
            mask.row < logits.rows,
            "mask of row {} of {}",
            mask.row,
            logits.rows
        );
        rows.push(mask.row as i32);
        let n = mask.allowed.len().min(words);
        allowed[m * words..m * words + n].copy_from_slice(&mask.allowed[..n]);
    }
    let gpu = cx.gpu;
    let rows = gpu.upload(&rows);
    let allowed = gpu.upload(&allowed);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.sample.mask_logits,
        (
            (logits.cols as u32).div_ceil(THREADS),
            masks.len() as u32,
            1,
        ),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&logits.buf, s)),
            Arg::Ptr(ptr(&rows, s)),
            Arg::Ptr(ptr(&allowed, s)),
            Arg::I32(words as i32),
            Arg::I32(logits.cols as i32),
        ],
    );
    // The bf16 copy no longer matches.
    logits.bf16 = None;
}
