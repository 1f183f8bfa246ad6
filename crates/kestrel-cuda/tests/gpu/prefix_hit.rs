//! A prefix-cache hit computes what the cold prompt computed, in the default
//! bf16 mode, with the cold prompt in one pass.
//!
//! A cold hybrid prompt takes its prefix-cache snapshot inside its pass, at
//! the last multiple of 64 tokens that leaves a token (`L`); the same prompt
//! again resumes there and computes its last 1-63 tokens in a pass of their
//! own. With invariant prompt rows (`Plan::invariant_prompts`) those rows
//! take the same kernels and sums as in the cold pass of hundreds of rows,
//! so every logits row of the hit, and every token it generates after, has
//! the cold request's bits. Tails of 1, 5, 12, 20 and 40 tokens cover the sizes
//! where the kernels sized by row count would otherwise differ (`gemv` and
//! the MoE decode path up to 8 and 16 rows, the decode attention and GDN
//! kernels up to 16, cuBLAS's kernel choice at every size).
//!
//! The other mode (`KESTREL_PROMPT_ROWS=by-size`) ends the cold pass at `L`
//! and repeats that split on a hit: it runs too, as a control, and must
//! agree as well, in one more step per cold prompt.
//!
//! Flash-Next's fixture (indexer budget 16 tokens) runs the same way: past
//! the budget its sparse attention reads every row's selected blocks through
//! the decode kernels, one split a row in a prompt step.

use kestrel_cuda::{CudaBackend, Precision};
use kestrel_engine::{Engine, EngineConfig, EngineHandle, EngineOptions};
use kestrel_models::flash_next::FlashNext;
use kestrel_models::{Model, Target};

use crate::device::with_gpu;
use crate::engine_runs::{Rows, differing_rows, row_recorder, tokens_of, worst_diff};
use crate::mixed_steps::{prompt, request};
use crate::speculative_shapes::four_layer_config;

const NEW_TOKENS: usize = 6;
/// Qwen3.6 prompt lengths whose tails after `L` are 40, 5, 12, 1 and 20
/// tokens; the last is long enough for the MoE's 128-row expert tiles (the
/// tail's are 64).
const QWEN36_LENS: [usize; 5] = [1000, 1029, 1100, 1153, 4500];
/// Flash-Next fixture prompt lengths: tails of 22, 8, 1 and 44 tokens.
const FLASH_NEXT_LENS: [usize; 4] = [150, 200, 257, 300];

#[derive(Clone, Copy, Debug)]
enum Source {
    /// Qwen3.6-35B-A3B's shapes, four layers, random weights.
    Qwen36,
    /// The Flash-Next golden fixture.
    FlashNext,
}

fn config(max_model_len: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_queued_requests: 64,
        max_num_batched_tokens: 8192,
        block_size: 16,
        num_blocks: 1024,
        num_state_slots: 24,
        enable_prefix_cache: true,
        max_model_len,
        force_preempt_at: None,
        sampled_vocab: None,
    }
}

/// One request's tokens and sampled logits rows, and the engine steps it took.
struct Run {
    tokens: Vec<u32>,
    rows: Vec<Vec<f32>>,
    steps: u64,
}

/// The engine's step count once it has published the end of its last
/// request (statistics follow the tokens by a moment).
fn steps_when_idle(engine: &EngineHandle) -> u64 {
    loop {
        let s = engine.stats();
        if s.num_running == 0 && s.num_waiting == 0 {
            return s.engine_steps_total;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn run_one(engine: &EngineHandle, rows: &Rows, id: &str, prompt_ids: Vec<u32>) -> Run {
    let before = steps_when_idle(engine);
    let mut stream = engine
        .submit(request(id, prompt_ids, NEW_TOKENS))
        .expect("submitted");
    let tokens = tokens_of(&mut stream, id);
    Run {
        tokens,
        rows: rows.lock().unwrap().remove(id).unwrap_or_default(),
        steps: steps_when_idle(engine) - before,
    }
}

/// For every prompt length: the cold run, the hit run, and the prefix-cache
/// hit tokens the second one found.
fn cold_and_hit(source: Source, invariant_prompts: bool, lens: &[usize]) -> Vec<(Run, Run, u64)> {
    let mut gpu = CudaBackend::new(0).expect("the device opened before opens again");
    gpu.set_precision(Precision::Bf16);
    gpu.set_batch_invariant(false);
    gpu.set_invariant_prompts(invariant_prompts);
    let mut temporary = None;
    let (model, vocab): (Target<CudaBackend>, u32) = match source {
        Source::Qwen36 => {
            let config_path = four_layer_config();
            let model = Model::load_dummy(&config_path, &gpu, 0).expect("dummy model builds");
            temporary = Some(config_path);
            let vocab = model.config().vocab_size as u32;
            (model.into(), vocab)
        }
        Source::FlashNext => {
            let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/golden/qwen4_exp/model");
            let model = FlashNext::load(&dir, &gpu).expect("the Flash-Next fixture loads");
            let vocab = model.config.base.vocab_size as u32;
            (model.into(), vocab)
        }
    };
    let (rows, observer) = row_recorder();
    let options = EngineOptions {
        observer: Some(observer),
        ..EngineOptions::default()
    };
    let max_model_len = match source {
        Source::Qwen36 => 8192,
        Source::FlashNext => 1024,
    };
    let engine = Engine::spawn_with_options(gpu, model, config(max_model_len), options)
        .expect("engine starts");
    let runs = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let p = prompt(i as u64, len, vocab);
            let cold = run_one(&engine, &rows, &format!("cold{i}"), p.clone());
            let hits = engine.stats().prefix_cache_hits_total;
            let hit = run_one(&engine, &rows, &format!("hit{i}"), p);
            let found = engine.stats().prefix_cache_hits_total - hits;
            (cold, hit, found)
        })
        .collect();
    engine.shutdown();
    if let Some(config_path) = temporary {
        let _ = std::fs::remove_dir_all(config_path.parent().expect("config has a folder"));
    }
    runs
}

#[test]
fn a_prefix_cache_hit_repeats_the_cold_prompt_in_one_pass_in_bf16() {
    with_gpu(|_gpu| {
        let mut failures = Vec::new();
        let cases = [
            (Source::Qwen36, true, &QWEN36_LENS[..]),
            (Source::Qwen36, false, &QWEN36_LENS[..]),
            (Source::FlashNext, true, &FLASH_NEXT_LENS[..]),
            (Source::FlashNext, false, &FLASH_NEXT_LENS[..]),
        ];
        for (source, invariant, lens) in cases {
            let mode = format!(
                "{source:?}, {}",
                if invariant { "invariant" } else { "by size" }
            );
            for ((cold, hit, found), &len) in cold_and_hit(source, invariant, lens).iter().zip(lens)
            {
                let tail = len - (len - 1) / 64 * 64;
                println!(
                    "{mode}, prompt {len} (tail {tail}): cold {} steps, hit {} steps, {found} tokens found in the cache; rows {}, max |diff| {:.3e}, tokens {}",
                    cold.steps,
                    hit.steps,
                    if differing_rows(&cold.rows, &hit.rows) == 0 {
                        "identical"
                    } else {
                        "differ"
                    },
                    worst_diff(&cold.rows, &hit.rows),
                    if cold.tokens == hit.tokens {
                        "the same"
                    } else {
                        "differ"
                    },
                );
                assert_eq!(cold.tokens.len(), NEW_TOKENS);
                assert_eq!(cold.rows.len(), NEW_TOKENS, "one sampled row a token");
                if *found == 0 {
                    failures.push(format!(
                        "{mode}, prompt {len}: the second run missed the cache"
                    ));
                }
                if differing_rows(&cold.rows, &hit.rows) != 0 {
                    failures.push(format!(
                        "{mode}, prompt {len}: the hit's logits differ from the cold run's"
                    ));
                }
                // One step a token, the first the prompt's: in one pass with
                // invariant prompt rows, two (the tail apart) otherwise.
                let passes = if invariant { 1 } else { 2 };
                if cold.steps != (NEW_TOKENS - 1 + passes) as u64 {
                    failures.push(format!(
                        "{mode}, prompt {len}: the cold request took {} steps, not {}",
                        cold.steps,
                        NEW_TOKENS - 1 + passes
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
}
