//! What verification must reproduce exactly: greedy tokens bit-identical to
//! sampling row by row, the RNG values a sampled verification uses, seeded
//! reproducibility, and the edge cases' outcomes.

use kestrel_sampling::{DraftProbs, SampleError, Sampler, SamplingParams, Verified, accept_greedy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const EOS: u32 = 0;
const VOCAB: usize = 40;

/// A deterministic pseudo-random logits row for the position after
/// `history` (a stand-in for the model), with EOS favoured so that the
/// `min_tokens` mask matters.
fn model_row(history: &[u32]) -> Vec<f32> {
    let hash = history.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = ChaCha20Rng::seed_from_u64(hash);
    let mut row: Vec<f32> = (0..VOCAB).map(|_| rng.random_range(-3.0..3.0)).collect();
    row[EOS as usize] += 2.5;
    row
}

fn penalised(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        repetition_penalty: 1.3,
        frequency_penalty: 0.4,
        presence_penalty: 0.6,
        min_tokens: 8,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

#[test]
fn greedy_verification_gives_the_tokens_of_sampling_row_by_row() {
    let params = penalised(0.0, 1);
    let prompt = [3u32, 9, 9, 14, 3];
    let steps = 80;
    // Without speculation: each token sampled from its row.
    let mut plain = Sampler::new(&params, prompt.len(), &[EOS]).unwrap();
    let mut want = prompt.to_vec();
    let mut want_rows = Vec::new();
    for _ in 0..steps {
        let mut row = model_row(&want);
        let token = plain.sample(&mut row, &want).unwrap();
        want_rows.push(row);
        want.push(token);
    }
    // With drafts that are right or wrong at random, 0..=4 per step.
    let mut spec = Sampler::new(&params, prompt.len(), &[EOS]).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let mut got = prompt.to_vec();
    let mut rejections = 0;
    while got.len() < want.len() {
        let k = rng.random_range(0..=4).min(want.len() - got.len() - 1);
        let drafts: Vec<u32> = (0..k)
            .map(|j| match want.get(got.len() + j) {
                Some(&t) if rng.random_bool(0.75) => t,
                _ => rng.random_range(0..VOCAB as u32),
            })
            .collect();
        let mut rows: Vec<Vec<f32>> = (0..=k)
            .map(|i| model_row(&[&got[..], &drafts[..i]].concat()))
            .collect();
        let v = spec
            .verify(&mut rows, &got, &drafts, DraftProbs::Deterministic)
            .unwrap();
        rejections += usize::from(v.accepted < k);
        // The rows examined were penalised and masked exactly as `sample` did.
        let at = got.len() - prompt.len();
        for (i, row) in rows.iter().enumerate().take(v.accepted + 1) {
            let bits = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(row),
                bits(&want_rows[at + i]),
                "row {i} at output {at}"
            );
        }
        got.extend_from_slice(&drafts[..v.accepted]);
        got.push(v.next);
        assert_eq!(
            got[..],
            want[..got.len()],
            "diverged at output {}",
            got.len() - prompt.len()
        );
    }
    assert!(
        rejections > 5,
        "the drafts were almost never wrong ({rejections})"
    );
    assert!(
        want[prompt.len()..].contains(&EOS),
        "EOS was never generated"
    );
}

#[test]
fn greedy_acceptance_from_known_targets() {
    assert_eq!(
        accept_greedy(&[4, 5, 6, 7], &[4, 5, 6]),
        Verified {
            accepted: 3,
            next: 7
        }
    );
    assert_eq!(
        accept_greedy(&[4, 5, 6, 7], &[4, 9, 6]),
        Verified {
            accepted: 1,
            next: 5
        }
    );
    assert_eq!(
        accept_greedy(&[4], &[]),
        Verified {
            accepted: 0,
            next: 4
        }
    );
}

#[test]
fn verifying_no_drafts_samples_like_sample() {
    let params = penalised(0.9, 11);
    let mut plain = Sampler::new(&params, 2, &[EOS]).unwrap();
    let mut spec = Sampler::new(&params, 2, &[EOS]).unwrap();
    let mut history = vec![1u32, 2];
    for _ in 0..200 {
        let token = plain.sample(&mut model_row(&history), &history).unwrap();
        let v = spec
            .verify(
                &mut [model_row(&history)],
                &history,
                &[],
                DraftProbs::Deterministic,
            )
            .unwrap();
        assert_eq!(
            v,
            Verified {
                accepted: 0,
                next: token
            }
        );
        history.push(token);
    }
}

/// Tokens `sample` draws from a flat row of 1000 after `s`'s stream: they
/// pin down its next RNG values.
fn stream_probe(s: &mut Sampler) -> Vec<u32> {
    (0..16)
        .map(|_| s.sample(&mut vec![0.0; 1000], &[]).unwrap())
        .collect()
}

#[test]
fn a_sampled_verification_uses_one_value_per_examined_draft_plus_one() {
    let params = SamplingParams {
        seed: Some(99),
        ..SamplingParams::default()
    };
    // Each case: drafts, rows, drafts accepted, RNG values used. In the
    // first, row 0 certainly accepts draft 2 (p = 1) and row 1 certainly
    // rejects draft 3 (p = 0): accepted 1, so 1 + 2 = 3 values.
    let sure = |token: usize| {
        let mut row = vec![f32::NEG_INFINITY; 6];
        row[token] = 0.0;
        row
    };
    type Case<'a> = (&'a [u32], Vec<Vec<f32>>, usize, usize);
    let cases: [Case; 3] = [
        (&[2, 3], vec![sure(2), sure(1), sure(4)], 1, 3),
        (&[2, 1], vec![sure(2), sure(1), sure(4)], 2, 3),
        (
            &[4],
            vec![
                vec![f32::NEG_INFINITY, 0.0, 0.0, 0.0, f32::NEG_INFINITY, 0.0],
                sure(0),
            ],
            0,
            2,
        ),
    ];
    for (drafts, mut rows, accepted, values) in cases {
        let mut spec = Sampler::new(&params, 0, &[]).unwrap();
        let v = spec
            .verify(&mut rows, &[], drafts, DraftProbs::Deterministic)
            .unwrap();
        assert_eq!(v.accepted, accepted, "{drafts:?}");
        let mut reference = Sampler::new(&params, 0, &[]).unwrap();
        for _ in 0..values {
            reference.sample(&mut [0.0; 4], &[]).unwrap();
        }
        assert_eq!(
            stream_probe(&mut spec),
            stream_probe(&mut reference),
            "{drafts:?}"
        );
    }
    // Greedy verification uses none.
    let greedy = SamplingParams {
        temperature: 0.0,
        ..params.clone()
    };
    let mut spec = Sampler::new(&greedy, 0, &[]).unwrap();
    spec.verify(
        &mut [sure(2), sure(1)],
        &[],
        &[2],
        DraftProbs::Deterministic,
    )
    .unwrap();
    let mut fresh = Sampler::new(&greedy, 0, &[]).unwrap();
    assert_eq!(stream_probe(&mut spec), stream_probe(&mut fresh));
}

/// Verifications of random drafts (from a uniform `q`) along a sequence.
fn seeded_run(seed: u64) -> Vec<Verified> {
    let params = penalised(1.0, seed);
    let mut s = Sampler::new(&params, 1, &[EOS]).unwrap();
    let mut drafter = ChaCha20Rng::seed_from_u64(3);
    let q = vec![vec![1.0 / VOCAB as f32; VOCAB]; 3];
    let mut history = vec![7u32];
    let mut out = Vec::new();
    for _ in 0..300 {
        let drafts: Vec<u32> = (0..3)
            .map(|_| drafter.random_range(0..VOCAB as u32))
            .collect();
        let mut rows: Vec<Vec<f32>> = (0..=3)
            .map(|i| model_row(&[&history[..], &drafts[..i]].concat()))
            .collect();
        let v = s
            .verify(&mut rows, &history, &drafts, DraftProbs::Distributions(&q))
            .unwrap();
        history.extend_from_slice(&drafts[..v.accepted]);
        history.push(v.next);
        out.push(v);
    }
    out
}

#[test]
fn seeded_verification_is_reproducible() {
    let first = seeded_run(42);
    assert_eq!(first, seeded_run(42));
    assert_ne!(first, seeded_run(43));
    assert!(
        first.iter().any(|v| v.accepted > 0),
        "no draft was ever accepted"
    );
}

#[test]
fn impossible_drafts_are_rejected_and_a_zero_residual_falls_back_to_the_target() {
    let params = SamplingParams {
        seed: Some(8),
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(&params, 0, &[]).unwrap();
    let mut p_of = Sampler::new(&params, 0, &[]).unwrap();
    let logits = [0.3f32, f32::NEG_INFINITY, 1.0, -0.2];
    let p = p_of.distribution(&mut logits.to_vec(), &[], &[]).unwrap();
    assert_eq!(p.ids, [0, 2, 3]);
    let mut seen = [0usize; 4];
    for _ in 0..2000 {
        // p(1) = 0: rejected; q = p leaves no residual, so the token is drawn from p.
        let rows = &mut [logits.to_vec(), logits.to_vec()];
        let v = s
            .verify(
                rows,
                &[],
                &[1],
                DraftProbs::Sparse(std::slice::from_ref(&p)),
            )
            .unwrap();
        assert_eq!(v.accepted, 0);
        seen[v.next as usize] += 1;
        // q(0) = 0 although p(0) > 0: rejected, and token 2 (all of q's mass) is never the replacement.
        let one_hot = vec![vec![0.0, 0.0, 1.0, 0.0]];
        let rows = &mut [logits.to_vec(), logits.to_vec()];
        let v = s
            .verify(rows, &[], &[0], DraftProbs::Distributions(&one_hot))
            .unwrap();
        assert_eq!(v.accepted, 0);
        assert!(v.next == 0 || v.next == 3, "{v:?}");
    }
    assert_eq!(seen[1], 0);
    assert!(seen[0] > 300 && seen[2] > 800 && seen[3] > 200, "{seen:?}");
}

#[test]
fn rows_without_a_finite_logit_are_errors_and_rows_after_a_rejection_are_not_read() {
    let dead = vec![f32::NEG_INFINITY, f32::NAN];
    for temperature in [0.0, 1.0] {
        let params = SamplingParams {
            temperature,
            seed: Some(1),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&params, 0, &[]).unwrap();
        let err = s.verify(
            &mut [vec![0.0, 1.0], dead.clone()],
            &[],
            &[1],
            DraftProbs::Deterministic,
        );
        if temperature == 0.0 {
            assert_eq!(err, Err(SampleError::NoCandidate));
        } else {
            // The draft may be rejected before the dead row is read.
            assert!(matches!(
                err,
                Err(SampleError::NoCandidate) | Ok(Verified { accepted: 0, .. })
            ));
        }
        let mut rows = [vec![f32::NEG_INFINITY, 0.0], dead.clone()];
        assert_eq!(
            s.verify(&mut rows, &[], &[0], DraftProbs::Deterministic)
                .unwrap()
                .next,
            1
        );
        assert_eq!(
            s.verify(
                &mut [Vec::<f32>::new()],
                &[],
                &[],
                DraftProbs::Deterministic
            ),
            Err(SampleError::EmptyLogits)
        );
    }
    let mut s = Sampler::new(&SamplingParams::default(), 0, &[]).unwrap();
    let inf = s.verify(
        &mut [vec![0.0, f32::INFINITY]],
        &[],
        &[],
        DraftProbs::Deterministic,
    );
    assert_eq!(inf, Err(SampleError::InfiniteLogit));
}

#[test]
fn the_distribution_is_what_sample_draws_from() {
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 3,
        min_p: 0.05,
        seed: Some(4),
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(&params, 0, &[]).unwrap();
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let dist = s.distribution(&mut logits.to_vec(), &[], &[]).unwrap();
    assert_eq!(dist.ids, [0, 3, 4]);
    assert!((dist.probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    let dense = dist.to_dense(5);
    assert_eq!(dense[1], 0.0);
    assert!((f64::from(dense[3]) - dist.prob(3)).abs() < 1e-7);
    let mut counts = [0usize; 5];
    for _ in 0..50_000 {
        counts[s.sample(&mut logits.to_vec(), &[]).unwrap() as usize] += 1;
    }
    for (id, &c) in counts.iter().enumerate() {
        let want = dist.prob(id as u32) * 50_000.0;
        assert!(
            (c as f64 - want).abs() < 5.0 * want.sqrt().max(1.0),
            "id {id}: {c} vs {want}"
        );
    }
    // Pending drafts count for the penalties: with a presence penalty,
    // pending token 3 loses mass.
    let params = SamplingParams {
        presence_penalty: 2.0,
        ..params
    };
    let mut s = Sampler::new(&params, 0, &[]).unwrap();
    let after = s.distribution(&mut logits.to_vec(), &[], &[3]).unwrap();
    assert!(after.prob(3) < dist.prob(3) - 0.2, "{after:?}");
    let greedy = SamplingParams::greedy();
    let mut g = Sampler::new(&greedy, 0, &[]).unwrap();
    let one_hot = g.distribution(&mut logits.to_vec(), &[], &[]).unwrap();
    assert_eq!((one_hot.ids, one_hot.probs), (vec![3], vec![1.0]));
}
