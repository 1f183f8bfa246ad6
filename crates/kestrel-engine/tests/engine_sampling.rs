//! Sampling from the backend's best candidates (`Backend::top_candidates`)
//! gives exactly the tokens of sampling from whole rows copied to the host,
//! for seeded requests with every filter and penalty, alone and batched; so
//! does the backend's draw over rows that no filter cuts (OpenAI's defaults).

mod common;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::{Engine, EngineConfig, EngineHandle};
use kestrel_sampling::SamplingParams;

fn seeded(seed: u64, n: usize) -> SamplingParams {
    SamplingParams {
        seed: Some(seed),
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Requests covering each way a row is sampled: plain greedy, greedy with
/// penalties, top-k, top-p (nucleus inside or beyond the candidates), min-p,
/// no filter at all (drawn by the backend), and min_tokens masking.
fn requests(vocab: u32) -> Vec<kestrel_engine::GenerateRequest> {
    let params = [
        SamplingParams::greedy(),
        SamplingParams {
            repetition_penalty: 1.4,
            frequency_penalty: 0.6,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.8,
            ..seeded(1, 0)
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            presence_penalty: 0.5,
            ..seeded(2, 0)
        },
        SamplingParams {
            temperature: 1.5,
            top_p: 0.999,
            ..seeded(3, 0)
        },
        SamplingParams {
            temperature: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            ..seeded(4, 0)
        },
        SamplingParams {
            temperature: 1.0,
            ..seeded(5, 0)
        },
        SamplingParams {
            temperature: 0.8,
            top_k: 2000,
            top_p: 0.9,
            frequency_penalty: -0.5,
            min_tokens: 6,
            stop_token_ids: vec![7, 11],
            ignore_eos: false,
            ..seeded(6, 0)
        },
    ];
    params
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let p = SamplingParams {
                max_tokens: Some(24),
                ..p
            };
            named(
                &format!("r{i}"),
                &prompt(40 + i as u64, 12 + 9 * i, vocab),
                p,
            )
        })
        .collect()
}

fn both_paths(config: EngineConfig) -> (EngineHandle, EngineHandle) {
    let model = TestModel::Bundled;
    let candidates = Engine::spawn(CpuBackend::new(), model.load(), config.clone()).unwrap();
    let full_rows =
        Engine::spawn_with_full_row_sampling(CpuBackend::new(), model.load(), config).unwrap();
    (candidates, full_rows)
}

#[test]
fn candidate_sampling_matches_full_rows() {
    let vocab = TestModel::Bundled.vocab();
    for sampled_vocab in [None, Some(4000)] {
        let config = EngineConfig {
            sampled_vocab,
            ..config()
        };
        let (candidates, full_rows) = both_paths(config);
        let reqs = requests(vocab);
        for req in &reqs {
            let got = run_one(&candidates, req.clone());
            let want = run_one(&full_rows, req.clone());
            assert_eq!(
                got, want,
                "{} alone, sampled_vocab {sampled_vocab:?}",
                req.request_id
            );
            if let Some(v) = sampled_vocab {
                assert!(
                    got.tokens.iter().all(|&t| t < v as u32),
                    "padded id sampled"
                );
            }
        }
        // Batched: rows of every kind in the same steps.
        let got = run_together(&candidates, &reqs);
        let want = run_together(&full_rows, &reqs);
        assert_eq!(got, want, "batched, sampled_vocab {sampled_vocab:?}");
        wait_idle(&candidates);
        wait_idle(&full_rows);
    }
}

/// Default-parameter requests (temperature 1, no top-k, top-p 1, min-p 0)
/// and their kin: every row of the 4,096-id vocabulary is kept, so the
/// backend draws the token with the sampler's uniform.
fn unfiltered_requests(vocab: u32) -> Vec<kestrel_engine::GenerateRequest> {
    let params = [
        seeded(21, 0),
        seeded(22, 0),
        SamplingParams {
            temperature: 1.3,
            top_k: 5000,
            ..seeded(23, 0)
        },
        SamplingParams {
            temperature: 0.6,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            presence_penalty: -0.2,
            ..seeded(24, 0)
        },
        SamplingParams {
            min_tokens: 8,
            stop_token_ids: vec![3, 9],
            ignore_eos: false,
            ..seeded(25, 0)
        },
    ];
    params
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let p = SamplingParams {
                max_tokens: Some(32),
                ..p
            };
            named(
                &format!("u{i}"),
                &prompt(70 + i as u64, 5 + 7 * i, vocab),
                p,
            )
        })
        .collect()
}

#[test]
fn default_parameter_draws_match_full_rows() {
    let vocab = TestModel::Bundled.vocab();
    for sampled_vocab in [None, Some(4000)] {
        let config = EngineConfig {
            sampled_vocab,
            ..config()
        };
        let (drawn, full_rows) = both_paths(config);
        let reqs = unfiltered_requests(vocab);
        for req in &reqs {
            let got = run_one(&drawn, req.clone());
            let want = run_one(&full_rows, req.clone());
            assert_eq!(
                got, want,
                "{} alone, sampled_vocab {sampled_vocab:?}",
                req.request_id
            );
            assert!(!got.tokens.is_empty());
            if let Some(v) = sampled_vocab {
                assert!(
                    got.tokens.iter().all(|&t| t < v as u32),
                    "padded id sampled"
                );
            }
        }
        let got = run_together(&drawn, &reqs);
        let want = run_together(&full_rows, &reqs);
        assert_eq!(got, want, "batched, sampled_vocab {sampled_vocab:?}");
        wait_idle(&drawn);
        wait_idle(&full_rows);
    }
}
