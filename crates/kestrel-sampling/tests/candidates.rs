//! The candidate path (`Sampler::candidate_request`, a backend's
//! `top_candidates`, `Sampler::sample_candidates`) against `Sampler::sample`
//! on the whole row: the same token and the same RNG stream, or a detected
//! fallback. The backend here is the host reference, `top_candidates_host`,
//! with its sums skewed as a device's rounding would.

use kestrel_core::candidates::KeptDraw;
use kestrel_core::{CandidateRequest, RowCandidates, top_candidates_host};
use kestrel_sampling::{SampleError, Sampler, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const EOS: u32 = 2;

/// How one step was decided on the candidate side.
#[derive(Debug, Default)]
struct Paths {
    exact: usize,
    /// Of `exact`: decided by the backend's draw.
    drawn: usize,
    fallback: usize,
    no_request: usize,
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, options: &[T]) -> T {
    options[rng.random_range(0..options.len())]
}

fn random_params(rng: &mut ChaCha8Rng) -> SamplingParams {
    SamplingParams {
        temperature: pick(rng, &[0.0, 0.3, 0.7, 1.0, 1.6]),
        top_k: pick(rng, &[0, 0, -1, 1, 7, 40, 64, 300, 5000]),
        top_p: pick(rng, &[1.0, 1.0, 0.3, 0.8, 0.9, 0.95, 0.999]),
        min_p: pick(rng, &[0.0, 0.0, 0.001, 0.05, 0.3]),
        repetition_penalty: pick(rng, &[1.0, 1.0, 1.3, 0.8]),
        frequency_penalty: pick(rng, &[0.0, 0.0, 0.5, -0.7]),
        presence_penalty: pick(rng, &[0.0, 0.0, 1.2, -0.4]),
        seed: Some(rng.random()),
        stop_token_ids: vec![rng.random_range(0..64)],
        min_tokens: pick(rng, &[0, 0, 3]),
        ..SamplingParams::default()
    }
}

/// A logits row: Gaussian with a random spread (flat to peaked), some hot
/// ids, and sometimes ties, NaN, -inf and signed zeros.
fn random_row(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    let spread = pick(rng, &[0.2, 1.0, 3.0, 8.0]);
    let mut row: Vec<f32> = (0..len)
        .map(|_| {
            let (u1, u2): (f32, f32) = (rng.random_range(1e-7..1.0), rng.random());
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * spread
        })
        .collect();
    for _ in 0..rng.random_range(0..5) {
        row[rng.random_range(0..len)] = rng.random_range(5.0..25.0);
    }
    if rng.random_bool(0.3) {
        // Coarse values: many ties, also at the candidates' boundary.
        row.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0);
    }
    if rng.random_bool(0.3) {
        for _ in 0..len / 10 {
            let special = pick(rng, &[f32::NAN, f32::NEG_INFINITY, 0.0, -0.0]);
            row[rng.random_range(0..len)] = special;
        }
    }
    row
}

/// The row as the engine hands it to `sample`: ids past `cols` at -inf.
fn full_row(row: &[f32], cols: usize) -> Vec<f32> {
    let mut r = row.to_vec();
    r[cols..].fill(f32::NEG_INFINITY);
    r
}

/// Relative skews of a backend's sums (kept weight; a draw's before and
/// after), as a device's `exp` and summation order would give.
type Skew = [f64; 3];

fn random_skew(rng: &mut ChaCha8Rng) -> Skew {
    std::array::from_fn(|_| rng.random_range(-4e-7..4e-7))
}

/// The candidate side of one step.
fn candidate_step(
    s: &mut Sampler,
    row: &[f32],
    cols: usize,
    history: &[u32],
    cap: usize,
    skew: Skew,
    paths: &mut Paths,
) -> Result<u32, SampleError> {
    let Some(req) = s.candidate_request(history, 0, cols, cap) else {
        paths.no_request += 1;
        return s.sample(&mut full_row(row, cols), history);
    };
    let mut found = top_candidates_host(row, row.len(), std::slice::from_ref(&req)).remove(0);
    found.kept_weight *= 1.0 + skew[0];
    if let Some(d) = found.draw.as_mut() {
        d.before *= 1.0 + skew[1];
        d.after *= 1.0 + skew[2];
    }
    match s.sample_candidates(&req, &found) {
        Some(result) => {
            paths.exact += 1;
            paths.drawn += usize::from(req.uniform.is_some() && req.count < found.kept);
            result
        }
        None => {
            paths.fallback += 1;
            s.sample(&mut full_row(row, cols), history)
        }
    }
}

#[test]
fn candidates_choose_what_the_full_row_chooses() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (len, cols) = (3000, 2990);
    let mut paths = Paths::default();
    for case in 0..600 {
        let params = random_params(&mut rng);
        let cap = pick(&mut rng, &[16, 64, 256, 4096]);
        let prompt: Vec<u32> = (0..rng.random_range(1..40))
            .map(|_| rng.random_range(0..len as u32))
            .collect();
        let mut reference = Sampler::new(&params, prompt.len(), &[EOS]).unwrap();
        let mut candidate = reference.clone();
        let mut history = prompt.clone();
        for step in 0..5 {
            let row = random_row(&mut rng, len);
            let skew = random_skew(&mut rng);
            let want = reference.sample(&mut full_row(&row, cols), &history);
            let got = candidate_step(&mut candidate, &row, cols, &history, cap, skew, &mut paths);
            assert_eq!(got, want, "case {case} step {step} cap {cap} {params:?}");
            match want {
                Ok(token) => history.push(token),
                Err(_) => break,
            }
        }
    }
    println!("{paths:?}");
    assert!(paths.exact > 1000, "{paths:?}");
    assert!(paths.fallback > 20, "{paths:?}");
    assert!(paths.no_request > 20, "{paths:?}");
}

fn request_for(
    params: &SamplingParams,
    row: &[f32],
    cap: usize,
) -> (Sampler, Option<CandidateRequest>) {
    let mut s = Sampler::new(params, 1, &[EOS]).unwrap();
    let req = s.candidate_request(&[5], 0, row.len(), cap);
    (s, req)
}

fn answer(row: &[f32], req: &CandidateRequest) -> RowCandidates {
    top_candidates_host(row, row.len(), std::slice::from_ref(req)).remove(0)
}

#[test]
fn rows_that_need_the_whole_row_are_detected() {
    let flat: Vec<f32> = (0..2000).map(|i| (i % 7) as f32 * 0.01).collect();
    let sampled = |top_p, min_p, top_k| SamplingParams {
        temperature: 1.0,
        top_p,
        min_p,
        top_k,
        seed: Some(1),
        ..SamplingParams::default()
    };
    // A top-k beyond the cap cuts a 2000-id row, but not to 64.
    assert!(request_for(&sampled(1.0, 0.0, 100), &flat, 64).1.is_none());
    // Min-p keeps nearly everything, top-p needs ~1800 ids: both fall back.
    for params in [sampled(1.0, 0.5, 0), sampled(0.9, 0.0, 0)] {
        let (mut s, req) = request_for(&params, &flat, 64);
        let req = req.unwrap();
        assert_eq!(req.count, 64);
        assert!(
            s.sample_candidates(&req, &answer(&flat, &req)).is_none(),
            "{params:?}"
        );
    }
    // Within the candidates: decided, greedy and top-k always.
    let peaked: Vec<f32> = (0..2000)
        .map(|i| if i == 77 { 30.0 } else { 0.0 })
        .collect();
    for params in [
        sampled(0.9, 0.0, 0),
        sampled(1.0, 0.0, 50),
        SamplingParams::greedy(),
    ] {
        let (mut s, req) = request_for(&params, &peaked, 64);
        let req = req.unwrap();
        let token = s.sample_candidates(&req, &answer(&peaked, &req));
        assert_eq!(token, Some(Ok(77)), "{params:?}");
    }
}

#[test]
fn errors_match_the_full_row() {
    let mut with_inf = vec![0.0; 10];
    with_inf[4] = f32::INFINITY;
    for params in [SamplingParams::default(), SamplingParams::greedy()] {
        let params = SamplingParams {
            top_k: 3,
            seed: Some(3),
            ..params
        };
        for row in [
            vec![f32::NAN; 10],
            vec![f32::NEG_INFINITY; 10],
            with_inf.clone(),
        ] {
            let (mut s, req) = request_for(&params, &row, 4);
            let req = req.unwrap();
            let mut reference = Sampler::new(&params, 1, &[EOS]).unwrap();
            let want = reference.sample(&mut row.clone(), &[5]);
            assert_eq!(
                s.sample_candidates(&req, &answer(&row, &req)),
                Some(want),
                "{row:?}"
            );
        }
    }
}

/// Parameters under which nothing cuts the row (OpenAI's defaults and kin):
/// the backend draws.
fn unfiltered_params(rng: &mut ChaCha8Rng) -> SamplingParams {
    SamplingParams {
        temperature: pick(rng, &[0.3, 0.7, 1.0, 1.0, 1.6]),
        top_k: pick(rng, &[0, 0, -1, 5000]),
        top_p: 1.0,
        min_p: 0.0,
        ..random_params(rng)
    }
}

#[test]
fn unfiltered_rows_are_drawn_like_the_full_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (len, cols) = (3000, 2990);
    let mut paths = Paths::default();
    let mut steps = 0;
    for case in 0..400 {
        let params = unfiltered_params(&mut rng);
        let cap = pick(&mut rng, &[16, 64, 256, 1024]);
        let prompt: Vec<u32> = (0..rng.random_range(1..40))
            .map(|_| rng.random_range(0..len as u32))
            .collect();
        let mut reference = Sampler::new(&params, prompt.len(), &[EOS]).unwrap();
        let mut candidate = reference.clone();
        let mut history = prompt.clone();
        for step in 0..6 {
            let mut row = random_row(&mut rng, len);
            match rng.random_range(0..12) {
                // Rows no token can be drawn from: the same error, no draw.
                0 => row.fill(pick(&mut rng, &[f32::NAN, f32::NEG_INFINITY])),
                // One eligible id (decided by the candidate alone), or a few.
                1 => {
                    row.fill(f32::NEG_INFINITY);
                    for _ in 0..rng.random_range(1..4) {
                        row[rng.random_range(0..cols)] = rng.random_range(-3.0..3.0);
                    }
                }
                _ => {}
            }
            let skew = random_skew(&mut rng);
            let want = reference.sample(&mut full_row(&row, cols), &history);
            let got = candidate_step(&mut candidate, &row, cols, &history, cap, skew, &mut paths);
            assert_eq!(got, want, "case {case} step {step} cap {cap} {params:?}");
            steps += 1;
            // After an error the next row is drawn with the uniform still pending.
            if let Ok(token) = want {
                history.push(token);
            }
        }
    }
    println!("{paths:?} of {steps}");
    assert_eq!(paths.no_request, 0, "{paths:?}");
    assert!(paths.drawn > steps * 3 / 4, "{paths:?} of {steps}");
}

#[test]
fn draws_too_close_to_call_fall_back_with_the_same_uniform() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let row: Vec<f32> = (0..2000).map(|_| rng.random_range(-2.0..2.0)).collect();
    let params = SamplingParams {
        seed: Some(9),
        ..SamplingParams::default()
    };
    let (s, req) = request_for(&params, &row, 64);
    let req = req.expect("an unfiltered row is drawn by the backend");
    let uniform = req.uniform.unwrap();
    assert_eq!((req.count, req.inv_temperature), (1, 1.0));
    let honest = answer(&row, &req);
    let d = honest.draw.unwrap();
    let target = uniform * honest.kept_weight;
    let with_draw = |draw: Option<KeptDraw>| RowCandidates {
        draw,
        ..honest.clone()
    };
    let mut reference = Sampler::new(&params, 1, &[EOS]).unwrap();
    let want = reference.sample(&mut row.clone(), &[5]);
    assert_eq!(
        s.clone().sample_candidates(&req, &honest),
        Some(want.clone())
    );
    for (what, found) in [
        ("no draw", with_draw(None)),
        (
            "target at the sum before",
            with_draw(Some(KeptDraw {
                before: target,
                ..d
            })),
        ),
        (
            "target just below the sum after",
            with_draw(Some(KeptDraw {
                after: target * (1.0 + 1e-7),
                ..d
            })),
        ),
        (
            "total off by the tolerance",
            RowCandidates {
                kept_weight: (d.after / uniform) * (1.0 + 1e-6),
                ..honest.clone()
            },
        ),
    ] {
        let mut s = s.clone();
        assert_eq!(s.sample_candidates(&req, &found), None, "{what}");
        // The row is then sampled with the uniform the request carried, and
        // the stream goes on as the reference's.
        assert_eq!(s.sample(&mut row.clone(), &[5]), want, "{what}");
        let next: Vec<f32> = (0..2000).map(|i| (i % 13) as f32 * 0.1).collect();
        assert_eq!(
            s.sample(&mut next.clone(), &[5, 1]),
            reference.clone().sample(&mut next.clone(), &[5, 1]),
            "{what}"
        );
    }
}

#[test]
fn a_repeated_request_carries_the_same_uniform() {
    let params = SamplingParams {
        seed: Some(4),
        ..SamplingParams::default()
    };
    let row = vec![0.0f32; 500];
    let (mut s, first) = request_for(&params, &row, 64);
    // A step abandoned after the request (no sample): the uniform stays.
    let again = s.candidate_request(&[5], 0, row.len(), 64);
    assert_eq!(first.unwrap().uniform, again.unwrap().uniform);
}
