//! Token choice on the device: the argmax of each logits row, over a whole
//! row or over a prefix of it (a vocabulary padded past the tokenizer), and
//! each row's best sampling candidates after penalties.

use kestrel_core::{Backend, CandidateRequest, Result, RowCandidates, TokenPenalty};

use super::{Ctx, Outputs, TOL_F32, repeatable};

/// Token ids must match exactly.
const TOL_EXACT: f64 = 0.0;

pub fn argmax_rows(c: &mut Ctx) {
    // (rows, row length, columns searched): a Qwen3.6-sized vocabulary in
    // full and without its padding, and an odd row length (no float4 loads).
    for (rows, len, cols) in [
        (3, 248_320, 248_320),
        (3, 248_320, 248_077),
        (5, 1001, 1000),
    ] {
        let mut v = c.data.randn(rows * len, 1.0);
        let row = |r: usize| r * len;
        // Row 0: the maximum twice, so the lower index must win.
        v[row(0) + 17] = 9.0;
        v[row(0) + cols - 3] = 9.0;
        // Row 1: NaN everywhere but one finite value near the end; a larger
        // value in the excluded tail (when there is one) must not win.
        v[row(1)..row(1) + len].fill(f32::NAN);
        v[row(1) + cols - 1] = -5.0;
        if cols < len {
            v[row(1) + cols] = 100.0;
        }
        // Row 2: -inf everywhere but the last allowed column.
        v[row(2)..row(2) + len].fill(f32::NEG_INFINITY);
        v[row(2) + cols - 1] = -1e30;
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            len: usize,
            cols: usize,
            v: &[f32],
        ) -> Result<Outputs> {
            let ids = b.argmax_rows(&b.from_host(rows, len, v), cols);
            Ok(vec![(
                "ids".into(),
                ids.iter().map(|&i| i as f32).collect(),
            )])
        }
        let (cpu, gpu) = (
            run(&c.cpu, rows, len, cols, &v),
            run(&c.gpu, rows, len, cols, &v),
        );
        c.record(
            &format!("argmax_rows [{rows}x{len}] first {cols}"),
            TOL_EXACT,
            cpu,
            gpu,
        );
    }
}

/// Rows of a Qwen3.6-sized padded vocabulary and of an odd width, with ties,
/// NaN, -inf, signed zeros, penalties and masks; candidate counts below,
/// at and above the eligible logits. Ids and logits must match the CPU
/// reference exactly, the weight sums to f32 rounding.
pub fn top_candidates(c: &mut Ctx) {
    for (len, cols) in [(248_320, 248_077), (1001, 1000)] {
        let rows = 6;
        let mut v = c.data.randn(rows * len, 2.0);
        let row = |r: usize| r * len..(r + 1) * len;
        // Row 0: coarse values, so ties straddle every boundary; zeros of both signs.
        v[row(0)]
            .iter_mut()
            .for_each(|x| *x = (*x * 4.0).round() / 4.0);
        v[row(0)].iter_mut().step_by(7).for_each(|x| *x = -0.0);
        // Row 1: NaN and -inf everywhere but a few values; a big one in the padding.
        for (i, x) in v[row(1)].iter_mut().enumerate() {
            *x = match i % 3 {
                _ if i % 97 == 5 => (i % 11) as f32,
                0 => f32::NAN,
                _ => f32::NEG_INFINITY,
            };
        }
        v[len + len - 1] = 100.0;
        // Row 2: all -inf (nothing eligible). Rows 3-5: plain Gaussian.
        v[row(2)].fill(f32::NEG_INFINITY);
        let requests = candidate_requests(c, cols, rows);
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            len: usize,
            v: &[f32],
            reqs: &[CandidateRequest],
        ) -> Result<Outputs> {
            let logits = b.from_host(rows, len, v);
            let first = flatten(&b.top_candidates(&logits, reqs));
            let again = flatten(&b.top_candidates(&logits, reqs));
            first
                .into_iter()
                .zip(again)
                .map(|((name, a), (_, b))| repeatable(&name, a, b))
                .collect()
        }
        let cpu = run(&c.cpu, rows, len, &v, &requests);
        let gpu = run(&c.gpu, rows, len, &v, &requests);
        let (cpu_sums, gpu_sums): (Outputs, Outputs) = match (cpu, gpu) {
            (Ok(cpu), Ok(gpu)) => {
                let (ce, cs) = split_sums(cpu);
                let (ge, gs) = split_sums(gpu);
                c.record(
                    &format!("top_candidates [{rows}x{len}] first {cols}"),
                    0.0,
                    Ok(ce),
                    Ok(ge),
                );
                (cs, gs)
            }
            (cpu, gpu) => {
                c.record(&format!("top_candidates [{rows}x{len}]"), 0.0, cpu, gpu);
                continue;
            }
        };
        c.record(
            &format!("top_candidates [{rows}x{len}] weights"),
            TOL_F32,
            Ok(cpu_sums),
            Ok(gpu_sums),
        );
    }
}

/// Requests over `rows` rows: counts 1, 20, 1024 and 5000, penalties on random
/// ids (some past `cols`), masks, min-p lines and weight sums.
fn candidate_requests(c: &mut Ctx, cols: usize, rows: usize) -> Vec<CandidateRequest> {
    let counts = [1024, 20, 5000, 1, 1024, 300];
    (0..rows)
        .map(|r| {
            let penalties = if r % 2 == 0 {
                (0..200)
                    .map(|i| TokenPenalty {
                        id: (c.data.index(cols / 200) * 200 + i) as u32
                            + (r == 4 && i == 0) as u32 * cols as u32,
                        seen: i % 3 != 0,
                        output_count: (i % 4) as u32,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            CandidateRequest {
                row: r,
                cols,
                count: counts[r].min(cols),
                penalties,
                masked: if r >= 3 {
                    (0..5).map(|_| c.data.index(cols) as u32).collect()
                } else {
                    Vec::new()
                },
                repetition: [1.0, 1.3, 0.8][r % 3],
                frequency: 0.4,
                presence: -0.3,
                min_p_offset: if r == 5 {
                    f32::NEG_INFINITY
                } else {
                    0.9 * 0.05f32.ln()
                },
                inv_temperature: if r == 3 { 0.0 } else { 1.0 / 0.9 },
            }
        })
        .collect()
}

/// Every answer as outputs: ids, logits, their signs (so -0 vs +0 counts),
/// max, kept count, and (last) the weight sums.
fn flatten(answers: &[RowCandidates]) -> Outputs {
    let all =
        |f: &dyn Fn(&RowCandidates) -> Vec<f32>| answers.iter().flat_map(f).collect::<Vec<f32>>();
    vec![
        (
            "ids".into(),
            all(&|a| a.ids.iter().map(|&i| i as f32 + 1.0).collect()),
        ),
        ("logits".into(), all(&|a| a.logits.clone())),
        (
            "signs".into(),
            all(&|a| {
                a.logits
                    .iter()
                    .map(|l| 1.0 + l.is_sign_negative() as u8 as f32)
                    .collect()
            }),
        ),
        ("found".into(), all(&|a| vec![a.ids.len() as f32 + 1.0])),
        ("max_logit".into(), all(&|a| vec![a.max_logit.max(-1e30)])),
        ("kept".into(), all(&|a| vec![a.kept as f32 + 1.0])),
        ("weight".into(), all(&|a| vec![a.kept_weight as f32 + 1.0])),
    ]
}

/// The exact outputs and the weight sums (compared with a tolerance).
fn split_sums(mut outputs: Outputs) -> (Outputs, Outputs) {
    let sums = outputs.split_off(outputs.len() - 1);
    (outputs, sums)
}
