//! The candidate path (`Sampler::candidate_request`, a backend's
//! `top_candidates`, `Sampler::sample_candidates`) against `Sampler::sample`
//! on the whole row: the same token and the same RNG stream, or a detected
//! fallback. The backend here is the host reference, `top_candidates_host`.

use kestrel_core::{CandidateRequest, RowCandidates, top_candidates_host};
use kestrel_sampling::{SampleError, Sampler, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const EOS: u32 = 2;

/// How one step was decided on the candidate side.
#[derive(Debug, Default)]
struct Paths {
    exact: usize,
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

/// The candidate side of one step; `skew` perturbs the reported weight sum
/// relatively, as a device's `exp` would.
fn candidate_step(
    s: &mut Sampler,
    row: &[f32],
    cols: usize,
    history: &[u32],
    cap: usize,
    skew: f64,
    paths: &mut Paths,
) -> Result<u32, SampleError> {
    let Some(req) = s.candidate_request(history, 0, cols, cap) else {
        paths.no_request += 1;
        return s.sample(&mut full_row(row, cols), history);
    };
    let mut found = top_candidates_host(row, row.len(), std::slice::from_ref(&req)).remove(0);
    found.kept_weight *= 1.0 + skew;
    match s.sample_candidates(&req, &found) {
        Some(result) => {
            paths.exact += 1;
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
            let skew = rng.random_range(-4e-7..4e-7);
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
    // No filter can cut a 2000-id row to 64: nothing to ask the device.
    assert!(request_for(&sampled(1.0, 0.0, 0), &flat, 64).1.is_none());
    // A top-k beyond the cap alone cannot either.
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
