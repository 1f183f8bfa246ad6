//! Flash-Next decode steps recorded as CUDA graphs compute what eager steps
//! compute, bit for bit.
//!
//! A decode-shaped step is recorded while every sequence's context is within
//! the indexer budget (the fixture's is 16 tokens): its n-gram embeddings
//! are staged before the step where the recording reads them, and the
//! indexer pools the blocks its tokens complete by reading the step layout.
//! Past the budget the steps run eagerly again. Three sequences decode
//! side by side from prompts of different lengths, so that they complete
//! indexer blocks at different steps and cross the budget at different
//! steps; then single requests through the engine with n-gram speculation
//! bring verify steps of several tokens with their state checkpoints.

use std::path::PathBuf;

use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_cuda::{CudaBackend, Precision};
use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineConfig, EngineOptions};
use kestrel_models::Target;
use kestrel_models::flash_next::FlashNext;

use crate::device::with_gpu;
use crate::engine_runs::{differing_rows, row_recorder, tokens_of};
use crate::mixed_steps::request;

const BLOCK_SIZE: usize = 16;
const PAGES: usize = 4;
const STEPS: usize = 24;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp/model")
}

fn backend(precision: Precision, graphs: bool) -> CudaBackend {
    let mut gpu = CudaBackend::new(0).expect("the device opened before opens again");
    gpu.set_precision(precision);
    gpu.set_graphs(graphs);
    gpu
}

/// The logits of every decode step of three sequences decoding greedily
/// side by side, and the backend's (captures, replays).
fn decode_side_by_side(precision: Precision, graphs: bool) -> (Vec<Vec<f32>>, (u64, u64)) {
    let gpu = backend(precision, graphs);
    let model = FlashNext::load(&model_dir(), &gpu).expect("the Flash-Next fixture loads");
    let vocab = model.config.base.vocab_size;
    let prompts: [Vec<u32>; 3] = [
        vec![3, 17, 5],
        vec![40, 41, 42, 43, 44, 45],
        vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 100],
    ];
    let seqs = prompts.len();
    let mut cache = model
        .new_cache(&gpu, seqs * PAGES, BLOCK_SIZE, seqs)
        .expect("cache");
    let table = |s: usize| ((s * PAGES) as u32..((s + 1) * PAGES) as u32).collect::<Vec<_>>();
    let mut next = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        cache.zero_state(&gpu, s as u32);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk::new(p.len(), 0, table(s), s as u32)],
        };
        let logits = model
            .step_logits(&gpu, p, &batch, &mut cache, &[p.len() - 1])
            .expect("prefill");
        next.push(gpu.argmax_rows(&logits, vocab)[0]);
    }
    let mut lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut all = Vec::new();
    for _ in 0..STEPS {
        let batch = ForwardBatch {
            seqs: (0..seqs)
                .map(|s| SeqChunk::new(1, lens[s], table(s), s as u32))
                .collect(),
        };
        let rows: Vec<usize> = (0..seqs).collect();
        let logits = model
            .step_logits(&gpu, &next, &batch, &mut cache, &rows)
            .expect("decode step");
        next = gpu.argmax_rows(&logits, vocab);
        all.push(gpu.to_host(&logits));
        lens.iter_mut().for_each(|l| *l += 1);
    }
    drop(cache);
    drop(model);
    (all, gpu.graph_counts())
}

#[test]
fn recorded_flash_next_decode_steps_match_eager_ones() {
    with_gpu(|_gpu| {
        for precision in [Precision::F32, Precision::Bf16] {
            let (eager, _) = decode_side_by_side(precision, false);
            let (recorded, (captures, replays)) = decode_side_by_side(precision, true);
            let bad = differing_rows(&eager, &recorded);
            println!(
                "{precision:?}: {STEPS} steps of 3 sequences, {captures} captures, {replays} replays, {bad} steps differ"
            );
            assert_eq!(
                bad, 0,
                "{precision:?}: recorded steps differ from eager ones"
            );
            assert!(
                captures > 0 && replays > 0,
                "{precision:?}: no step was recorded"
            );
        }
    });
}

/// One request at a time, n-gram speculation on repeating prompts (so that
/// drafts are found and verify steps of several tokens run): every sampled
/// logits row with graphs as without.
#[test]
fn recorded_flash_next_verify_steps_match_eager_ones() {
    let run = |graphs: bool| {
        let gpu = backend(Precision::Bf16, graphs);
        let model: Target<CudaBackend> = FlashNext::load(&model_dir(), &gpu)
            .expect("the Flash-Next fixture loads")
            .into();
        let (rows, observer) = row_recorder();
        let options = EngineOptions {
            observer: Some(observer),
            speculative: Some(SpeculativeConfig {
                method: SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
                num_speculative_tokens: 4,
            }),
            ..EngineOptions::default()
        };
        let config = EngineConfig {
            max_num_seqs: 4,
            max_queued_requests: 16,
            max_num_batched_tokens: 256,
            block_size: BLOCK_SIZE,
            num_blocks: 64,
            num_state_slots: 24,
            enable_prefix_cache: false,
            max_model_len: 256,
            force_preempt_at: None,
            sampled_vocab: None,
        };
        let engine =
            Engine::spawn_with_options(gpu, model, config, options).expect("engine starts");
        let prompts: [Vec<u32>; 3] = [
            vec![5, 6, 7, 5, 6],
            vec![1, 2, 1, 2, 1, 2, 1],
            vec![9, 9, 9],
        ];
        let out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let id = format!("r{i}");
                let mut stream = engine
                    .submit(request(&id, p.clone(), 20))
                    .expect("submitted");
                let tokens = tokens_of(&mut stream, &id);
                (tokens, rows.lock().unwrap().remove(&id).unwrap_or_default())
            })
            .collect();
        let stats = engine.stats();
        engine.shutdown();
        (out, stats.spec_decode_num_draft_tokens_total)
    };
    with_gpu(|_gpu| {
        let (eager, _) = run(false);
        let (recorded, drafts) = run(true);
        for (i, ((et, er), (rt, rr))) in eager.iter().zip(&recorded).enumerate() {
            let bad = differing_rows(er, rr);
            println!("request {i}: {} tokens, {bad} rows differ", et.len());
            assert_eq!(et, rt, "request {i}: tokens");
            assert_eq!(bad, 0, "request {i}: sampled rows");
        }
        assert!(drafts > 0, "no drafts were verified");
    });
}
