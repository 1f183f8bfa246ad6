//! End-to-end behaviour of `Sampler` on hand-made logits.

use kestrel_sampling::{SampleError, Sampler, SamplingParams};

const EOS: u32 = 0;

fn seeded(params: SamplingParams, seed: u64) -> SamplingParams {
    SamplingParams {
        seed: Some(seed),
        ..params
    }
}

fn sampler(params: SamplingParams, prompt_len: usize) -> Sampler {
    Sampler::new(&params, prompt_len, &[EOS]).unwrap()
}

/// Draw `n` tokens from the same logits row and count them per id.
fn histogram(params: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = sampler(params, 0);
    let mut counts = vec![0; logits.len()];
    for _ in 0..n {
        let mut row = logits.to_vec();
        counts[s.sample(&mut row, &[]).unwrap() as usize] += 1;
    }
    counts
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature as f64).exp())
        .collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// Pearson's chi-square statistic of observed counts against probabilities;
/// zero-probability ids must have no draws at all.
fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    let mut chi = 0.0;
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            assert_eq!(c, 0, "drew a token of probability 0");
            continue;
        }
        let expected = p * n as f64;
        chi += (c as f64 - expected).powi(2) / expected;
    }
    chi
}

/// 99.9th percentile of chi-square with 1..=4 degrees of freedom.
const CHI2_999: [f64; 5] = [0.0, 10.83, 13.82, 16.27, 18.47];

#[test]
fn greedy_is_argmax_and_lowest_id_wins_ties() {
    let mut s = sampler(SamplingParams::greedy(), 0);
    assert_eq!(s.sample(&mut [0.1, 2.0, -1.0, 1.9], &[]), Ok(1));
    assert_eq!(s.sample(&mut [0.1, 2.0, -1.0, 2.0], &[]), Ok(1));
    assert_eq!(s.sample(&mut [f32::NAN, -5.0, -7.0], &[]), Ok(1));
    // Greedy ignores top-k / top-p / min-p (they never remove the argmax).
    let p = SamplingParams {
        top_k: 1,
        top_p: 0.1,
        min_p: 0.9,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(p, 0);
    assert_eq!(s.sample(&mut [3.0, 2.0, 4.0], &[]), Ok(2));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
    let params = seeded(
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 50,
            ..SamplingParams::default()
        },
        1234,
    );
    let run = |params: SamplingParams| {
        let mut s = sampler(params, 3);
        let mut history = vec![5, 6, 7];
        for _ in 0..200 {
            let token = s.sample(&mut logits.clone(), &history).unwrap();
            history.push(token);
        }
        history
    };
    let first = run(params.clone());
    assert_eq!(first, run(params.clone()));
    // A different seed gives a different stream (200 draws over ~50 tokens).
    assert_ne!(first, run(seeded(params, 1235)));
}

#[test]
fn temperature_one_matches_softmax() {
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let counts = histogram(seeded(SamplingParams::default(), 7), &logits, 20_000);
    let chi = chi_square(&counts, &softmax(&logits, 1.0));
    assert!(chi < CHI2_999[4], "chi2 {chi} counts {counts:?}");
}

#[test]
fn temperature_scales_the_distribution() {
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    for t in [0.5f32, 1.7] {
        let params = seeded(
            SamplingParams {
                temperature: t,
                ..SamplingParams::default()
            },
            99,
        );
        let counts = histogram(params, &logits, 20_000);
        let chi = chi_square(&counts, &softmax(&logits, t));
        assert!(chi < CHI2_999[4], "T={t}: chi2 {chi} counts {counts:?}");
        // The wrong temperature is clearly rejected by the same statistic.
        assert!(chi_square(&counts, &softmax(&logits, 1.0)) > 100.0);
    }
}

#[test]
fn top_k_renormalises_over_the_k_best() {
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let params = seeded(
        SamplingParams {
            top_k: 3,
            ..SamplingParams::default()
        },
        3,
    );
    let counts = histogram(params, &logits, 20_000);
    let masked = [1.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY, 2.0, 0.5];
    let chi = chi_square(&counts, &softmax(&masked, 1.0));
    assert!(chi < CHI2_999[2], "chi2 {chi} counts {counts:?}");
}

#[test]
fn top_p_renormalises_over_the_nucleus() {
    // softmax ≈ [.207, .076, .028, .563, .126] → sorted .563, .207, .126 …:
    // top_p 0.75 keeps {3, 0} (.770).
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let params = seeded(
        SamplingParams {
            top_p: 0.75,
            ..SamplingParams::default()
        },
        5,
    );
    let counts = histogram(params, &logits, 20_000);
    let masked = [
        1.0f32,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        2.0,
        f32::NEG_INFINITY,
    ];
    let chi = chi_square(&counts, &softmax(&masked, 1.0));
    assert!(chi < CHI2_999[1], "chi2 {chi} counts {counts:?}");
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // p / p_max = e^(l - 2): [.368, .135, .050, 1, .223]; min_p 0.2 keeps {0, 3, 4}.
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let params = seeded(
        SamplingParams {
            min_p: 0.2,
            ..SamplingParams::default()
        },
        8,
    );
    let counts = histogram(params, &logits, 20_000);
    let masked = [1.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY, 2.0, 0.5];
    let chi = chi_square(&counts, &softmax(&masked, 1.0));
    assert!(chi < CHI2_999[2], "chi2 {chi} counts {counts:?}");
}

#[test]
fn filters_compose_in_vllm_order() {
    // min_p 0.1 keeps {0, 1, 3, 4} (drops .050); top_k 3 keeps {3, 0, 4};
    // renormalised [.628, .231, .141]; top_p 0.7 keeps {3, 0} (.859).
    let logits = [1.0f32, 0.0, -1.0, 2.0, 0.5];
    let params = seeded(
        SamplingParams {
            min_p: 0.1,
            top_k: 3,
            top_p: 0.7,
            ..SamplingParams::default()
        },
        9,
    );
    let counts = histogram(params, &logits, 5_000);
    assert_eq!(counts[1] + counts[2] + counts[4], 0, "{counts:?}");
    assert!(counts[0] > 0 && counts[3] > 0);
}

#[test]
fn large_vocab_top_k_and_top_p() {
    // A 248K-wide row with a clear head: top-k 5 returns only head tokens.
    let vocab = 248_320;
    let mut logits = vec![-5.0f32; vocab];
    let head = [17u32, 100_000, 200_001, 248_319, 4];
    for (i, &id) in head.iter().enumerate() {
        logits[id as usize] = 10.0 - i as f32;
    }
    let params = seeded(
        SamplingParams {
            top_k: 5,
            ..SamplingParams::default()
        },
        1,
    );
    let mut s = sampler(params, 0);
    for _ in 0..100 {
        let t = s.sample(&mut logits.clone(), &[]).unwrap();
        assert!(head.contains(&t), "{t}");
    }
    // top_p 0.9: the head holds > 0.9 of the mass (e^10 vs 248K * e^-5 ≈ 1673).
    let params = seeded(
        SamplingParams {
            top_p: 0.9,
            ..SamplingParams::default()
        },
        2,
    );
    let mut s = sampler(params, 0);
    for _ in 0..100 {
        let t = s.sample(&mut logits.clone(), &[]).unwrap();
        assert!(head.contains(&t), "{t}");
    }
}

#[test]
fn repetition_penalty_covers_prompt_and_output() {
    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, 2);
    // Prompt [1, 2], output [3]. Token 4 is unseen.
    let mut logits = [0.0f32, 4.0, -1.0, 3.0, 1.0];
    s.sample(&mut logits, &[1, 2, 3]).unwrap();
    assert_eq!(logits, [0.0, 2.0, -2.0, 1.5, 1.0]);
}

#[test]
fn frequency_and_presence_cover_output_only() {
    let params = SamplingParams {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, 2);
    // Prompt [1, 1]; output has token 2 three times and token 3 once.
    let mut logits = [0.0f32, 1.0, 1.0, 1.0];
    s.sample(&mut logits, &[1, 1, 2, 3, 2, 2]).unwrap();
    assert_eq!(logits, [0.0, 1.0, 1.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25]);
}

#[test]
fn penalties_combine_in_order() {
    // repetition first, then frequency, then presence:
    // token 1 (in output twice): 3 / 1.5 = 2, - 2 * 0.5 = 1, - 0.5 = 0.5
    // token 2 (prompt only): -2 * 1.5 = -3
    let params = SamplingParams {
        repetition_penalty: 1.5,
        frequency_penalty: 0.5,
        presence_penalty: 0.5,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, 1);
    let mut logits = [0.0f32, 3.0, -2.0];
    let token = s.sample(&mut logits, &[2, 1, 1]).unwrap();
    assert_eq!(logits, [0.0, 0.5, -3.0]);
    assert_eq!(token, 1);
    // Counts accumulate across steps as the history grows.
    let mut logits = [0.0f32, 3.0, -2.0];
    s.sample(&mut logits, &[2, 1, 1, 1]).unwrap();
    assert_eq!(logits, [0.0, 2.0 - 1.5 - 0.5, -3.0]);
}

#[test]
fn min_tokens_masks_stopping_ids() {
    let params = SamplingParams {
        min_tokens: 2,
        stop_token_ids: vec![3],
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, 1);
    // EOS (0) and stop id 3 are the best tokens but are masked for 2 steps.
    let row = [9.0f32, 1.0, 2.0, 8.0];
    assert_eq!(s.sample(&mut row.clone(), &[1]), Ok(2));
    assert_eq!(s.sample(&mut row.clone(), &[1, 2]), Ok(2));
    assert_eq!(s.sample(&mut row.clone(), &[1, 2, 2]), Ok(EOS));
    // With ignore_eos only the stop id is masked.
    let params = SamplingParams {
        min_tokens: 1,
        ignore_eos: true,
        stop_token_ids: vec![3],
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, 0);
    assert_eq!(s.sample(&mut [5.0f32, 1.0, 2.0, 8.0], &[]), Ok(EOS));
}

#[test]
fn unusable_rows_are_errors() {
    let mut s = sampler(SamplingParams::default(), 0);
    assert_eq!(s.sample(&mut [], &[]), Err(SampleError::EmptyLogits));
    assert_eq!(
        s.sample(&mut [f32::NAN, f32::NEG_INFINITY], &[]),
        Err(SampleError::NoCandidate)
    );
    assert_eq!(
        s.sample(&mut [0.0, f32::INFINITY], &[]),
        Err(SampleError::InfiniteLogit)
    );
    let mut g = sampler(SamplingParams::greedy(), 0);
    assert_eq!(
        g.sample(&mut [f32::NAN], &[]),
        Err(SampleError::NoCandidate)
    );
    // Out-of-vocabulary history ids are skipped, not a panic.
    let p = SamplingParams {
        repetition_penalty: 1.3,
        frequency_penalty: 1.0,
        ..SamplingParams::default()
    };
    let mut s = sampler(p, 0);
    assert!(s.sample(&mut [0.0, 1.0], &[999_999, 1]).is_ok());
}

#[test]
fn unseeded_samplers_work() {
    let mut s = sampler(SamplingParams::default(), 0);
    let t = s.sample(&mut [0.0, 0.0, 0.0], &[]).unwrap();
    assert!(t < 3);
}

#[test]
fn plain_argmax_only_when_sample_would_take_the_raw_argmax() {
    let prompt = [5, 6, 7];
    assert!(sampler(SamplingParams::greedy(), 3).is_plain_argmax(&prompt));
    let sampled = SamplingParams {
        temperature: 0.7,
        ..SamplingParams::greedy()
    };
    assert!(!sampler(sampled, 3).is_plain_argmax(&prompt));
    for penalised in [
        SamplingParams {
            repetition_penalty: 1.2,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            frequency_penalty: 0.5,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            presence_penalty: -0.5,
            ..SamplingParams::greedy()
        },
    ] {
        assert!(!sampler(penalised, 3).is_plain_argmax(&prompt));
    }
    // min_tokens masks the end token until enough were generated.
    let min2 = SamplingParams {
        min_tokens: 2,
        ..SamplingParams::greedy()
    };
    let s = sampler(min2, 3);
    assert!(!s.is_plain_argmax(&[5, 6, 7]));
    assert!(!s.is_plain_argmax(&[5, 6, 7, 1]));
    assert!(s.is_plain_argmax(&[5, 6, 7, 1, 2]));
}
