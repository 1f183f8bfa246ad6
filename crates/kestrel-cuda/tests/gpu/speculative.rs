//! Speculative decoding on the CUDA backend never changes greedy output in
//! the reference precision: on each golden architecture and the bundled
//! model, four requests decode together with speculation off, then with
//! drafts that are all right, all wrong, random, n-gram lookups and (where
//! the model has one) the MTP head, and every request's tokens must be the
//! same. In the serving precision (bf16) a decode-shaped step's rows compute
//! what plain decode rows would (`speculative_shapes` checks that at full
//! size), but steps that also carry prefill chunks take the prefill
//! kernels, whose rows depend on the step, so outputs may diverge there;
//! that test reports how many requests did, and asserts only that all-right
//! drafts are accepted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kestrel_cuda::{CudaBackend, Precision};
use kestrel_engine::spec::{
    DraftSource, DraftVocab, MtpOptions, NgramConfig, SpeculativeConfig, SpeculativeMethod,
};
use kestrel_engine::{Engine, EngineConfig, EngineOptions, EngineStats, GenerateRequest};
use kestrel_models::Model;
use kestrel_sampling::SamplingParams;

use crate::device::with_gpu;
use crate::engine_runs::tokens_of;

const MODELS: [&str; 4] = [
    "testdata/golden/qwen3_5_moe/model",
    "testdata/golden/qwen3_next/model",
    "testdata/golden/qwen3_moe/model",
    "models/kestrel-tiny-qwen35",
];
const NEW_TOKENS: usize = 40;

pub(crate) type Reference = Arc<HashMap<String, Vec<u32>>>;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Drafts {
    AllRight,
    AllWrong,
    Random,
}

/// Drafts from the reference continuation (the run without speculation).
pub(crate) struct Adversary {
    pub(crate) kind: Drafts,
    pub(crate) reference: Reference,
    pub(crate) vocab: u32,
    pub(crate) rng: Mutex<u64>,
}

impl DraftSource for Adversary {
    fn drafts(&self, id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let Some(want) = self.reference.get(id) else {
            return Vec::new();
        };
        let right = want.iter().skip(tokens.len() - prompt_len).take(max);
        let mut rng = self.rng.lock().unwrap();
        let mut next = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng
        };
        match self.kind {
            Drafts::AllRight => right.copied().collect(),
            Drafts::AllWrong => right.map(|t| (t + 1) % self.vocab).collect(),
            Drafts::Random => {
                let k = (next() % 5) as usize;
                right
                    .take(k)
                    .map(|&t| {
                        if next() % 3 == 0 {
                            (t + 5) % self.vocab
                        } else {
                            t
                        }
                    })
                    .collect()
            }
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_queued_requests: 64,
        max_num_batched_tokens: 160,
        block_size: 16,
        num_blocks: 96,
        num_state_slots: 24,
        enable_prefix_cache: true,
        max_model_len: 640,
        force_preempt_at: None,
        sampled_vocab: None,
    }
}

/// Four greedy requests of pseudo-random prompts, one of them repetitive
/// (so that n-gram lookups find drafts).
fn requests(vocab: u32) -> Vec<GenerateRequest> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut id = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        3 + (state % u64::from(vocab - 3)) as u32
    };
    let mut prompts: Vec<Vec<u32>> = [23, 57, 9]
        .iter()
        .map(|&n| (0..n).map(|_| id()).collect())
        .collect();
    let phrase: Vec<u32> = (0..6).map(|_| id()).collect();
    prompts.push(phrase.iter().cycle().take(60).copied().collect());
    prompts
        .into_iter()
        .enumerate()
        .map(|(i, prompt_ids)| GenerateRequest {
            request_id: format!("r{i}"),
            prompt_ids,
            params: SamplingParams {
                ignore_eos: true,
                max_tokens: Some(NEW_TOKENS),
                ..SamplingParams::greedy()
            },
            cache_salt: Vec::new(),
            constraint: None,
        })
        .collect()
}

/// What a run gives: every request's tokens, the engine's counters once it
/// is idle, the model's vocabulary and whether it has an MTP head.
pub(crate) struct Run {
    pub(crate) tokens: HashMap<String, Vec<u32>>,
    pub(crate) stats: EngineStats,
    pub(crate) vocab: u32,
    pub(crate) has_mtp: bool,
}

/// The arithmetic a run takes.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) struct Mode {
    pub(crate) precision: Precision,
    pub(crate) batch_invariant: bool,
}

const F32: Mode = Mode {
    precision: Precision::F32,
    batch_invariant: false,
};
pub(crate) const BF16: Mode = Mode {
    precision: Precision::Bf16,
    batch_invariant: false,
};
const BF16_INVARIANT: Mode = Mode {
    precision: Precision::Bf16,
    batch_invariant: true,
};

/// Where a run's model comes from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A model folder.
    Dir(&'a std::path::Path),
    /// Random weights (seed 0) at the shapes of a `config.json`.
    Dummy(&'a std::path::Path),
}

/// Runs the requests (`only`: just those) on a fresh engine.
fn run(
    dir: &std::path::Path,
    mode: Mode,
    speculative: Option<SpeculativeConfig>,
    only: Option<usize>,
) -> Run {
    let only = only.map(|i| vec![i]);
    run_from(Source::Dir(dir), mode, speculative, only.as_deref())
}

/// [`run`] on a model from `source`, of the requests in `only` (all without).
pub(crate) fn run_from(
    source: Source<'_>,
    mode: Mode,
    speculative: Option<SpeculativeConfig>,
    only: Option<&[usize]>,
) -> Run {
    let mut gpu = CudaBackend::new(0).expect("the device opened before opens again");
    gpu.set_precision(mode.precision);
    gpu.set_batch_invariant(mode.batch_invariant);
    let model = match source {
        Source::Dir(dir) => Model::load(dir, &gpu).expect("model loads"),
        Source::Dummy(config) => Model::load_dummy(config, &gpu, 0).expect("dummy model builds"),
    };
    let vocab = model.config().vocab_size as u32;
    let has_mtp = model.mtp.is_some();
    let options = EngineOptions {
        speculative,
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(gpu, model, config(), options).expect("engine starts");
    let mut streams: Vec<_> = requests(vocab)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| only.is_none_or(|o| o.contains(i)))
        .map(|(_, r)| r)
        .map(|r| (r.request_id.clone(), engine.submit(r).expect("submitted")))
        .collect();
    let mut out = HashMap::new();
    for (id, stream) in &mut streams {
        let tokens = tokens_of(stream, id);
        out.insert(id.clone(), tokens);
    }
    let stats = engine.stats();
    engine.shutdown();
    Run {
        tokens: out,
        stats,
        vocab,
        has_mtp,
    }
}

/// The proposers tried on `dir`, each with its speculative token count (at
/// most `k`).
pub(crate) fn methods(
    has_mtp: bool,
    reference: &Reference,
    vocab: u32,
    k: usize,
) -> Vec<(String, SpeculativeConfig)> {
    let config = |method, k| SpeculativeConfig {
        method,
        num_speculative_tokens: k,
    };
    let mut all: Vec<(String, SpeculativeConfig)> =
        [Drafts::AllRight, Drafts::AllWrong, Drafts::Random]
            .into_iter()
            .map(|kind| {
                let source = Adversary {
                    kind,
                    reference: Arc::clone(reference),
                    vocab,
                    rng: Mutex::new(0x2545_F491_4F6C_DD1D),
                };
                (
                    format!("{kind:?}"),
                    config(SpeculativeMethod::External(Arc::new(source)), k),
                )
            })
            .collect();
    all.push((
        "ngram".into(),
        config(
            SpeculativeMethod::Ngram(NgramConfig::new(1, 3, k).unwrap()),
            k,
        ),
    ));
    if has_mtp {
        for k in 1..=k {
            all.push((format!("mtp k={k}"), config(SpeculativeMethod::mtp(), k)));
        }
        // A reduced draft vocabulary (half the ids): the head's rows are
        // gathered on the device; output must not change.
        let half = DraftVocab::first(vocab as usize / 2).unwrap();
        let reduced = SpeculativeMethod::Mtp(MtpOptions {
            draft_vocab: Some(Arc::new(half)),
        });
        all.push((
            format!("mtp k={} draft vocab", k.min(3)),
            config(reduced, k.min(3)),
        ));
    }
    all
}

/// Runs every proposer on every model; returns (what, requests that
/// differed from speculation off).
fn compare(mode: Mode) -> Vec<(String, usize)> {
    let mut report = Vec::new();
    for m in MODELS {
        let dir = root().join(m);
        let Run {
            tokens: off,
            vocab,
            has_mtp,
            ..
        } = run(&dir, mode, None, None);
        let reference: Reference = Arc::new(off.clone());
        for (name, spec) in methods(has_mtp, &reference, vocab, 4) {
            let Run {
                tokens: on, stats, ..
            } = run(&dir, mode, Some(spec), None);
            let what = format!("{m} / {name}");
            let differ = off.iter().filter(|(id, t)| on.get(*id) != Some(t)).count();
            if name == "AllRight" && mode != BF16 {
                assert_eq!(
                    stats.spec_decode_num_accepted_tokens_total,
                    stats.spec_decode_num_draft_tokens_total,
                    "{what}: right drafts are all accepted"
                );
            }
            assert!(
                !name.starts_with("AllRight") || stats.spec_decode_num_draft_tokens_total > 0,
                "{what}: drafts were verified"
            );
            println!(
                "{what}: {differ} of {} requests differ; drafts {}, accepted {}",
                off.len(),
                stats.spec_decode_num_draft_tokens_total,
                stats.spec_decode_num_accepted_tokens_total
            );
            report.push((what, differ));
        }
    }
    report
}

/// Fails listing every (model, proposer) whose output speculation changed.
fn assert_unchanged(mode: Mode) {
    let differ: Vec<String> = compare(mode)
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what}: {n} requests"))
        .collect();
    assert!(
        differ.is_empty(),
        "speculation changed the output in {mode:?}:\n{}",
        differ.join("\n")
    );
}

#[test]
fn greedy_output_is_the_same_with_speculation_on_and_off_in_f32() {
    with_gpu(|_gpu| assert_unchanged(F32));
}

#[test]
fn bf16_divergence_with_speculation_is_reported() {
    with_gpu(|_gpu| {
        let report = compare(BF16);
        let differ: usize = report.iter().map(|(_, n)| n).sum();
        println!(
            "bf16: {differ} of {} request runs differ from speculation off",
            report.len() * 4
        );
    });
}

#[test]
fn greedy_output_is_the_same_with_speculation_on_and_off_in_bf16_batch_invariant() {
    with_gpu(|_gpu| assert_unchanged(BF16_INVARIANT));
}

/// In the batch-invariant mode a request's tokens are the same alone and
/// beside the others (whose prompts prefill in the same steps as its decode).
#[test]
fn a_request_alone_and_batched_gives_the_same_tokens_in_bf16_batch_invariant() {
    with_gpu(|_gpu| {
        for m in MODELS {
            let dir = root().join(m);
            let together = run(&dir, BF16_INVARIANT, None, None).tokens;
            for i in 0..together.len() {
                let alone = run(&dir, BF16_INVARIANT, None, Some(i)).tokens;
                let id = format!("r{i}");
                assert_eq!(
                    alone.get(&id),
                    together.get(&id),
                    "{m}: {id} alone vs batched"
                );
            }
            println!("{m}: every request alone equals batched");
        }
    });
}
