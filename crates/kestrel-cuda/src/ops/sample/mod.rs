//! Greedy sampling on the device: one token id per row of logits, so a decode
//! step hands the host a few integers instead of a vocabulary of floats, and
//! the arg-max can be part of a recorded CUDA graph. For sampled rows,
//! `top_candidates` hands back each row's best candidates after penalties,
//! and, given the sampler's uniform, where its kept weights cross it.

use cudarc::driver::CudaSlice;
use kestrel_core::candidates::{KeptDraw, check_request};
use kestrel_core::{CandidateRequest, RowCandidates};

use crate::context::Cx;
use crate::device::ptr;
use crate::launch::Arg;
use crate::tensor::CudaTensor;

pub mod kernels;
mod mask;

pub use mask::mask_rows;

/// Threads per `top_candidates` row: a 250k vocabulary is 62k float4 loads,
/// ~60 per thread.
const THREADS: u32 = 1024;

/// Threads of an `argmax_parts` block and the columns each block scans: one
/// round of four 16-byte loads per thread.
const ARGMAX_THREADS: u32 = 256;
const ARGMAX_SPAN: usize = 16 * ARGMAX_THREADS as usize;

/// The column of each row's largest logit among its first `cols`, on the
/// device (one `i32` per row): ties go to the lowest index and NaN never wins
/// (a row of NaN gives 0). `cols` below the row length keeps a vocabulary's
/// padded tail out. Each row is split over blocks of [`ARGMAX_SPAN`]
/// columns, whose bests a second kernel merges. Only kernel launches: safe
/// to record in a CUDA graph.
pub fn argmax_rows(cx: &Cx, logits: &CudaTensor, cols: usize) -> CudaSlice<i32> {
    let gpu = cx.gpu;
    assert!(
        (1..=logits.cols).contains(&cols) && logits.cols <= i32::MAX as usize,
        "argmax over {cols} of {} columns",
        logits.cols
    );
    let rows = logits.rows;
    let parts = cols.div_ceil(ARGMAX_SPAN);
    let part_v = gpu.alloc::<f32>(rows * parts);
    let part_i = gpu.alloc::<i32>(rows * parts);
    let out = gpu.alloc::<i32>(rows);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.sample.argmax_parts,
        (rows as u32, parts as u32, 1),
        ARGMAX_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&part_v, s)),
            Arg::Ptr(ptr(&part_i, s)),
            Arg::Ptr(ptr(&logits.buf, s)),
            Arg::I32(cols as i32),
            Arg::I32(logits.cols as i32),
            Arg::I32(ARGMAX_SPAN as i32),
        ],
    );
    gpu.launch(
        &cx.k.sample.argmax_merge,
        (rows as u32, 1, 1),
        32,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&part_v, s)),
            Arg::Ptr(ptr(&part_i, s)),
            Arg::I32(parts as i32),
        ],
    );
    out
}

/// [`argmax_rows`], read back to the host (waits for the stream).
pub fn argmax_rows_host(cx: &Cx, logits: &CudaTensor, cols: usize) -> Vec<u32> {
    let ids = argmax_rows(cx, logits, cols);
    cx.gpu
        .download(&ids, logits.rows)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}

/// Words per request descriptor and of each answer's header
/// (`TOPC_DESC_WORDS`, `TOPC_HEADER` in `sample.cu`).
const DESC_WORDS: usize = 16;
const HEADER_WORDS: usize = 10;
/// The header's drawn id when there is none (`TOPC_NO_DRAW`).
const NO_DRAW: u32 = u32::MAX;

/// Where one request's inputs and answer lie in the shared buffers.
struct Layout {
    /// Descriptors, then penalties (id, output count, seen) and masked ids.
    words: Vec<i32>,
    scratch_floats: usize,
    out_words: usize,
}

/// Pack the requests for `top_candidates` (descriptor fields in the
/// kernel's `TOPC_*` order, floats as their bits).
fn layout(requests: &[CandidateRequest]) -> Layout {
    let aux_len: usize = requests
        .iter()
        .map(|r| 3 * r.penalties.len() + r.masked.len())
        .sum();
    let mut desc = Vec::with_capacity(requests.len() * DESC_WORDS);
    let mut aux = Vec::with_capacity(aux_len);
    let (mut scratch_floats, mut out_words) = (0usize, 0usize);
    let word = |n: usize| i32::try_from(n).expect("candidate buffers past 2^31 words");
    for r in requests {
        let pen_begin = aux.len();
        // Ids past the columns have no logit to change.
        let in_row = |id: u32| (id as usize) < r.cols;
        for p in r.penalties.iter().filter(|p| in_row(p.id)) {
            aux.extend([
                word(p.id as usize),
                word(p.output_count as usize),
                p.seen as i32,
            ]);
        }
        let pen_count = (aux.len() - pen_begin) / 3;
        let mask_begin = aux.len();
        aux.extend(
            r.masked
                .iter()
                .filter(|&&id| in_row(id))
                .map(|&id| word(id as usize)),
        );
        let mask_count = aux.len() - mask_begin;
        // Rows without penalties or mask are read in place.
        let scratch = if pen_count + mask_count == 0 {
            -1
        } else {
            scratch_floats += r.cols;
            word(scratch_floats - r.cols)
        };
        desc.extend([
            word(r.row),
            word(r.cols),
            word(r.count),
            word(requests.len() * DESC_WORDS + pen_begin),
            word(pen_count),
            word(requests.len() * DESC_WORDS + mask_begin),
            word(mask_count),
            scratch,
            word(out_words),
            r.repetition.to_bits() as i32,
            r.frequency.to_bits() as i32,
            r.presence.to_bits() as i32,
            r.min_p_offset.to_bits() as i32,
            r.inv_temperature.to_bits() as i32,
        ]);
        // Negative: no draw (the kernel's test).
        let uniform = r.uniform.unwrap_or(-1.0).to_bits();
        desc.extend([uniform as u32 as i32, (uniform >> 32) as u32 as i32]);
        out_words += HEADER_WORDS + 2 * r.count;
    }
    desc.extend(aux);
    Layout {
        words: desc,
        scratch_floats,
        out_words,
    }
}

/// [`Backend::top_candidates`](kestrel_core::Backend::top_candidates) on the
/// device: one block per request, then one copy of every answer to the host
/// (a few kilobytes per row instead of the vocabulary). Waits for the stream.
pub fn top_candidates(
    cx: &Cx,
    logits: &CudaTensor,
    requests: &[CandidateRequest],
) -> Vec<RowCandidates> {
    if requests.is_empty() {
        return Vec::new();
    }
    assert!(
        logits.cols <= i32::MAX as usize,
        "candidates over {} columns",
        logits.cols
    );
    for r in requests {
        check_request(r, logits.rows, logits.cols);
    }
    let gpu = cx.gpu;
    let plan = layout(requests);
    let words = gpu.upload(&plan.words);
    let scratch = gpu.alloc::<f32>(plan.scratch_floats);
    let out = gpu.alloc::<u32>(plan.out_words);
    let s = &gpu.stream;
    let words_ptr = ptr(&words, s);
    gpu.launch(
        &cx.k.sample.top_candidates,
        (requests.len() as u32, 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&logits.buf, s)),
            Arg::Ptr(ptr(&scratch, s)),
            Arg::Ptr(words_ptr),
            Arg::Ptr(words_ptr),
            Arg::I32(logits.cols as i32),
        ],
    );
    let answers = gpu.download(&out, plan.out_words);
    let mut at = 0;
    requests
        .iter()
        .map(|r| {
            let answer = &answers[at..at + HEADER_WORDS + 2 * r.count];
            at += answer.len();
            parse_answer(answer, r.count)
        })
        .collect()
}

/// One request's answer: the header, then `count` ids and `count` logits.
fn parse_answer(words: &[u32], count: usize) -> RowCandidates {
    let f64_at = |i: usize| f64::from_bits(u64::from(words[i]) | (u64::from(words[i + 1]) << 32));
    let found = words[0] as usize;
    assert!(found <= count, "top_candidates found {found} of {count}");
    let (ids, logits) = words[HEADER_WORDS..].split_at(count);
    let pairs = ids[..found]
        .iter()
        .zip(&logits[..found])
        .map(|(&id, &bits)| (id, f32::from_bits(bits)))
        .collect();
    let draw = (words[3] != NO_DRAW).then(|| KeptDraw {
        id: words[3],
        before: f64_at(6),
        after: f64_at(8),
    });
    RowCandidates::new(
        pairs,
        f32::from_bits(words[1]),
        words[2] as usize,
        f64_at(4),
        draw,
    )
}
