//! Token choice on the device: the argmax of each logits row, over a whole
//! row or over a prefix of it (a vocabulary padded past the tokenizer), and
//! each row's best sampling candidates after penalties, and the draw over a
//! row that no filter cuts.

use kestrel_core::candidates::KeptDraw;
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
                uniform: None,
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

/// How far the device's f64 sums may be from the reference's, relative: each
/// weight is an f32 `exp` a few ulp apart (kestrel-sampling's
/// `KEPT_WEIGHT_TOLERANCE`, which the sampler's acceptance test assumes).
const TOL_KEPT_WEIGHT: f64 = 2e-6;

/// The draw over every eligible logit (the sampler's request when nothing
/// cuts the row): the drawn id must match the CPU reference exactly, the
/// cumulative weights before and after it and the total to
/// [`TOL_KEPT_WEIGHT`] in f64; two runs must agree bit for bit. Rows of a
/// Qwen3.6-sized padded vocabulary, an odd width, and one narrower than a
/// warp's last step; Gaussian, peaked, flat (exact sums), tied with signed
/// zeros, NaN and -inf, penalised and masked rows; uniforms 0, random and
/// just below 1; rows with nothing eligible (no draw).
pub fn top_candidates_draw(c: &mut Ctx) {
    for (len, cols) in [(248_320, 248_077), (1001, 1000), (40, 37)] {
        let rows = 8;
        let mut v = c.data.randn(rows * len, 2.0);
        let row = |r: usize| r * len..(r + 1) * len;
        // Row 1: peaked, a few hot ids.
        for i in 0..4 {
            let id = c.data.index(cols);
            v[row(1)][id] = 12.0 + 2.0 * i as f32;
        }
        // Row 2: coarse values with ties, zeros of both signs, NaN and -inf.
        for (i, x) in v[row(2)].iter_mut().enumerate() {
            *x = match i % 11 {
                3 => -0.0,
                5 => f32::NAN,
                8 => f32::NEG_INFINITY,
                _ => (*x * 2.0).round() / 2.0,
            };
        }
        // Row 3: flat: every weight 1, the sums exact on both sides.
        v[row(3)].fill(0.0);
        // Row 6: NaN and -inf but for a few values; a big one in the padding.
        for (i, x) in v[row(6)].iter_mut().enumerate() {
            *x = match i % 3 {
                _ if i % 97 == 5 => (i % 11) as f32 * 0.5,
                0 => f32::NAN,
                _ => f32::NEG_INFINITY,
            };
        }
        if cols < len {
            v[row(6)][len - 1] = 100.0;
        }
        // Row 7: nothing eligible.
        v[row(7)].fill(f32::NEG_INFINITY);
        let requests = draw_requests(c, cols, rows);
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            len: usize,
            v: &[f32],
            reqs: &[CandidateRequest],
        ) -> Result<Vec<RowCandidates>> {
            let logits = b.from_host(rows, len, v);
            let first = b.top_candidates(&logits, reqs);
            let again = b.top_candidates(&logits, reqs);
            for (a, b) in draw_outputs(&first).into_iter().zip(draw_outputs(&again)) {
                repeatable(&a.0, a.1, b.1)?;
            }
            let bits = |answers: &[RowCandidates]| -> Vec<u64> {
                answers
                    .iter()
                    .flat_map(|a| sums(a).map(f64::to_bits))
                    .collect()
            };
            if bits(&first) != bits(&again) {
                return Err(kestrel_core::BackendError::Invalid(
                    "draw sums: two runs on the same input differ".into(),
                ));
            }
            Ok(first)
        }
        let case = format!("top_candidates draw [{rows}x{len}] first {cols}");
        let (cpu, gpu) = match (
            run(&c.cpu, rows, len, &v, &requests),
            run(&c.gpu, rows, len, &v, &requests),
        ) {
            (Ok(cpu), Ok(gpu)) => (cpu, gpu),
            (cpu, gpu) => {
                let outputs = |r: Result<Vec<RowCandidates>>| r.map(|a| draw_outputs(&a));
                c.record(&case, 0.0, outputs(cpu), outputs(gpu));
                continue;
            }
        };
        c.record(&case, 0.0, Ok(draw_outputs(&cpu)), Ok(draw_outputs(&gpu)));
        // Each f64 sum as 1 + its relative error against the reference's 1.
        let rel = |g: f64, r: f64| if g == r { 0.0 } else { (g - r).abs() / r.abs() };
        let errors: Vec<f32> = cpu
            .iter()
            .zip(&gpu)
            .flat_map(|(r, g)| {
                let (r, g) = (sums(r), sums(g));
                (0..3).map(move |i| 1.0 + rel(g[i], r[i]) as f32)
            })
            .collect();
        c.record(
            &format!("{case} f64 sums"),
            TOL_KEPT_WEIGHT,
            Ok(vec![("sums".into(), vec![1.0; errors.len()])]),
            Ok(vec![("sums".into(), errors)]),
        );
    }
}

/// A draw answer's f64 sums: the total, and the weights before and after the
/// drawn id (0 without a draw).
fn sums(a: &RowCandidates) -> [f64; 3] {
    let d = a.draw.unwrap_or(KeptDraw {
        id: 0,
        before: 0.0,
        after: 0.0,
    });
    [a.kept_weight, d.before, d.after]
}

/// One draw request per row: every eligible logit kept (no min-p line), one
/// candidate, temperatures 1, 0.7 and 1.6, penalties and masks on rows 2
/// and 5, uniforms 0 (row 5), just below 1 (row 4), a middle one for the flat
/// row 3, and random ones.
fn draw_requests(c: &mut Ctx, cols: usize, rows: usize) -> Vec<CandidateRequest> {
    (0..rows)
        .map(|r| {
            let penalised = r == 2 || r == 5;
            let penalties = if penalised {
                (0..(cols / 4).min(200))
                    .map(|i| TokenPenalty {
                        id: c.data.index(cols) as u32,
                        seen: i % 3 != 0,
                        output_count: (i % 4) as u32,
                    })
                    .collect::<Vec<_>>()
            } else {
                Vec::new()
            };
            // Penalty ids must be distinct.
            let mut seen_ids = std::collections::HashSet::new();
            let penalties = penalties
                .into_iter()
                .filter(|p| seen_ids.insert(p.id))
                .collect();
            let uniform = match r {
                3 => 0.618_034,
                4 => 0.999_999,
                5 => 0.0,
                _ => c.data.uniform(1, 0.0, 1.0)[0] as f64,
            };
            CandidateRequest {
                row: r,
                cols,
                count: 1,
                penalties,
                masked: if penalised {
                    (0..5).map(|_| c.data.index(cols) as u32).collect()
                } else {
                    Vec::new()
                },
                repetition: 1.3,
                frequency: 0.4,
                presence: -0.3,
                min_p_offset: f32::NEG_INFINITY,
                inv_temperature: 1.0 / [1.0f32, 0.7, 1.6][r % 3],
                uniform: Some(uniform),
            }
        })
        .collect()
}

/// The exactly compared outputs of draw answers: the drawn id (+1; 0 for
/// none), the best candidate, the max and the kept count.
fn draw_outputs(answers: &[RowCandidates]) -> Outputs {
    let all = |f: &dyn Fn(&RowCandidates) -> f32| answers.iter().map(f).collect::<Vec<f32>>();
    vec![
        (
            "draw_id".into(),
            all(&|a| a.draw.map_or(0.0, |d| d.id as f32 + 1.0)),
        ),
        (
            "best".into(),
            all(&|a| a.ids.first().map_or(0.0, |&i| i as f32 + 1.0)),
        ),
        ("max_logit".into(), all(&|a| a.max_logit.max(-1e30))),
        ("kept".into(), all(&|a| a.kept as f32 + 1.0)),
    ]
}
