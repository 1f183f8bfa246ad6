//! Speculative decoding never changes the output: every scenario runs with
//! speculation off and then on with one proposer after another (drafts all
//! right, all wrong, none, k alternating 0/3/1, random, n-gram lookup, MTP,
//! a random DFlash drafter on the hybrid golden model), and
//! the tokens, finish reasons, usage and every sampled logits row must be
//! bit-identical. Scenarios cover prefix-cache hits on and one token past a
//! block boundary, forced preemption, the context limit, stop tokens inside
//! an accepted run, mixed batches and seeded sampling.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{
    DflashOptions, DraftRows, DraftSource, NgramConfig, SpeculativeConfig, SpeculativeMethod,
};
use kestrel_engine::{Engine, EngineConfig, EngineOptions, EngineStats, GenerateRequest};
use kestrel_sampling::{FinishReason, SamplingParams};

/// The reference continuation of every request, from a run without speculation.
type Reference = Arc<HashMap<String, Vec<u32>>>;

#[derive(Clone, Copy, Debug)]
enum Drafts {
    AllRight,
    AllWrong,
    Zero,
    Alternating,
    Random,
}

/// Drafts derived from the reference continuation.
struct Adversary {
    kind: Drafts,
    reference: Reference,
    vocab: u32,
    calls: Mutex<(u64, HashMap<String, usize>)>,
}

impl DraftSource for Adversary {
    fn drafts(&self, id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let Some(want) = self.reference.get(id) else {
            return Vec::new();
        };
        let generated = tokens.len() - prompt_len;
        let right: Vec<u32> = want.iter().skip(generated).take(max).copied().collect();
        let mut calls = self.calls.lock().unwrap();
        let (rng, per_request) = &mut *calls;
        let call = per_request.entry(id.to_string()).or_default();
        *call += 1;
        match self.kind {
            Drafts::AllRight => right,
            Drafts::AllWrong => right.iter().map(|t| (t + 1) % self.vocab).collect(),
            Drafts::Zero => Vec::new(),
            Drafts::Alternating => right.into_iter().take([0, 3, 1][*call % 3]).collect(),
            Drafts::Random => {
                let mut next = || {
                    *rng ^= *rng << 13;
                    *rng ^= *rng >> 7;
                    *rng ^= *rng << 17;
                    *rng
                };
                let k = (next() % 5) as usize;
                (0..k.min(max))
                    .map(|i| {
                        let good = right.get(i).copied().unwrap_or(7);
                        if next() % 3 == 0 {
                            (good + 5) % self.vocab
                        } else {
                            good
                        }
                    })
                    .collect()
            }
        }
    }
}

fn adversary(kind: Drafts, reference: &Reference, vocab: u32) -> SpeculativeMethod {
    SpeculativeMethod::External(Arc::new(Adversary {
        kind,
        reference: Arc::clone(reference),
        vocab,
        calls: Mutex::new((0x2545_F491_4F6C_DD1D, HashMap::new())),
    }))
}

/// How the requests of a scenario are submitted.
#[derive(Clone, Copy)]
enum Arrival {
    Together,
    Staggered,
    OneByOne,
}

struct Scenario {
    name: &'static str,
    config: EngineConfig,
    requests: Vec<GenerateRequest>,
    arrival: Arrival,
}

struct Run {
    outputs: Vec<Output>,
    logits: LogitsByRequest,
    stats: EngineStats,
}

fn run(model: TestModel, s: &Scenario, method: Option<SpeculativeMethod>, k: usize) -> Run {
    run_on(CpuBackend::new(), |_| {}, model, s, method, k)
}

/// `tune` sets the options besides the proposer and the observer.
fn run_on(
    backend: CpuBackend,
    tune: impl FnOnce(&mut EngineOptions),
    model: TestModel,
    s: &Scenario,
    method: Option<SpeculativeMethod>,
    k: usize,
) -> Run {
    let recorder = Recorder::default();
    let mut options = EngineOptions {
        speculative: method.map(|method| SpeculativeConfig {
            method,
            num_speculative_tokens: k,
        }),
        observer: Some(recorder.observer()),
        ..EngineOptions::default()
    };
    tune(&mut options);
    let engine = Engine::spawn_with_options(backend, model.target(), s.config.clone(), options)
        .expect("engine starts");
    let outputs = match s.arrival {
        Arrival::Together => run_together(&engine, &s.requests),
        Arrival::Staggered => run_staggered(&engine, &s.requests),
        Arrival::OneByOne => s
            .requests
            .iter()
            .map(|r| run_one(&engine, r.clone()))
            .collect(),
    };
    let stats = wait_idle(&engine);
    Run {
        outputs,
        logits: recorder.take(),
        stats,
    }
}

/// Each request's continuation in `off`, by request id.
fn reference_of(s: &Scenario, off: &Run) -> Reference {
    Arc::new(
        s.requests
            .iter()
            .zip(&off.outputs)
            .map(|(r, o)| (r.request_id.clone(), o.tokens.clone()))
            .collect(),
    )
}

/// The scenario called `name`, its run without speculation and the
/// continuations of that run.
fn scenario_with_reference(model: TestModel, name: &str) -> (Scenario, Run, Reference) {
    let s = scenarios(model)
        .into_iter()
        .find(|s| s.name == name)
        .expect("scenario");
    let off = run(model, &s, None, 0);
    let reference = reference_of(&s, &off);
    (s, off, reference)
}

fn check_all_proposers(model: TestModel, s: &Scenario) {
    let off = run(model, s, None, 0);
    let reference = reference_of(s, &off);
    let vocab = model.vocab();
    let mut methods: Vec<(String, SpeculativeMethod, usize)> = [
        Drafts::AllRight,
        Drafts::AllWrong,
        Drafts::Zero,
        Drafts::Alternating,
        Drafts::Random,
    ]
    .into_iter()
    .map(|d| (format!("{d:?}"), adversary(d, &reference, vocab), 4))
    .collect();
    methods.push((
        "ngram".into(),
        SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
        4,
    ));
    if model.has_mtp_head() {
        methods.push(("mtp".into(), SpeculativeMethod::mtp(), 3));
    }
    if let Some(drafter) = model.dflash_drafter() {
        // The random drafter's whole block, and a shorter one.
        for k in [7, 3] {
            let options = DflashOptions::new(&drafter);
            methods.push((
                format!("dflash k={k}"),
                SpeculativeMethod::Dflash(options),
                k,
            ));
        }
        let mut narrow = DflashOptions::new(&drafter);
        narrow.window = 6;
        methods.push((
            "dflash window 6".into(),
            SpeculativeMethod::Dflash(narrow),
            7,
        ));
    }
    for (name, method, k) in methods {
        let on = run(model, s, Some(method), k);
        let what = format!("{model:?} / {} / {name}", s.name);
        assert_eq!(on.outputs, off.outputs, "{what}: outputs");
        assert_same_logits(&on.logits, &off.logits, &what);
        let st = &on.stats;
        if name == "AllRight" {
            assert!(
                st.spec_decode_num_draft_tokens_total > 0,
                "{what}: drafts were verified"
            );
            assert_eq!(
                st.spec_decode_num_accepted_tokens_total, st.spec_decode_num_draft_tokens_total,
                "{what}: right drafts are all accepted"
            );
            assert!(
                st.engine_steps_total < off.stats.engine_steps_total,
                "{what}: accepted drafts save steps ({} vs {})",
                st.engine_steps_total,
                off.stats.engine_steps_total
            );
        }
        if name == "AllWrong" {
            assert_eq!(st.spec_decode_num_accepted_tokens_total, 0, "{what}");
            assert!(st.spec_decode_num_draft_tokens_total > 0, "{what}");
        }
        if name.starts_with("dflash") {
            assert!(
                st.spec_decode_num_draft_tokens_total > 0,
                "{what}: the drafter drafted"
            );
        }
        if name == "Zero" {
            assert_eq!(st.spec_decode_num_drafts_total, 0, "{what}");
        }
        assert_eq!(
            st.generation_tokens_total, off.stats.generation_tokens_total,
            "{what}: generation tokens counted once"
        );
    }
}

fn requests(vocab: u32, lens: &[usize], params: SamplingParams) -> Vec<GenerateRequest> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            named(
                &format!("r{i}"),
                &prompt(40 + i as u64, n, vocab),
                params.clone(),
            )
        })
        .collect()
}

fn scenarios(model: TestModel) -> Vec<Scenario> {
    let vocab = model.vocab();
    let base = prompt(7, 80, vocab);
    let shared = |cut: usize, tail_seed: u64, id: &str| {
        let mut p = base[..cut].to_vec();
        p.extend(prompt(tail_seed, 9, vocab));
        named(id, &p, greedy(14))
    };
    let near_limit = {
        let mut c = config();
        c.max_model_len = 96;
        c
    };
    let preempting = {
        let mut c = config();
        c.force_preempt_at = Some(2);
        c
    };
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(11),
        max_tokens: Some(20),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    vec![
        Scenario {
            name: "staggered",
            config: config(),
            requests: requests(vocab, &[5, 37, 150], greedy(24)),
            arrival: Arrival::Staggered,
        },
        Scenario {
            name: "prefix hits on and past a block boundary",
            config: config(),
            requests: vec![
                named("a", &base, greedy(12)),
                shared(64, 1, "on-boundary"),
                shared(65, 2, "past-boundary"),
                named("again", &base, greedy(12)),
            ],
            arrival: Arrival::OneByOne,
        },
        Scenario {
            name: "forced preemption",
            config: preempting,
            requests: requests(vocab, &[20, 33, 18], greedy(26)),
            arrival: Arrival::Together,
        },
        Scenario {
            name: "context limit",
            config: near_limit,
            // Each request may grow exactly to the context length.
            requests: [70usize, 90]
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    named(
                        &format!("r{i}"),
                        &prompt(50 + i as u64, n, vocab),
                        greedy(96 - n),
                    )
                })
                .collect(),
            arrival: Arrival::Together,
        },
        Scenario {
            name: "mixed batch",
            config: config(),
            requests: requests(vocab, &[3, 120, 9, 64], greedy(20)),
            arrival: Arrival::Staggered,
        },
        Scenario {
            name: "seeded sampling",
            config: config(),
            requests: requests(vocab, &[12, 30], sampled),
            arrival: Arrival::Together,
        },
    ]
}

/// The context-limit scenario's requests finish by length at 96 tokens.
fn check_context_limit(model: TestModel) {
    let s = &scenarios(model)[3];
    let off = run(model, s, None, 0);
    for o in &off.outputs {
        assert_eq!(o.reason, FinishReason::Length);
        assert_eq!(o.usage.prompt_tokens + o.usage.completion_tokens, 96);
    }
}

/// A stop token the reference emits mid-run ends the request there, with
/// speculation as without, even when it sits inside an accepted draft run.
fn check_stop_token_inside_accepted_run(model: TestModel) {
    let vocab = model.vocab();
    let p = prompt(99, 21, vocab);
    let probe = Scenario {
        name: "stop probe",
        config: config(),
        requests: vec![named("s", &p, greedy(30))],
        arrival: Arrival::OneByOne,
    };
    let full = run(model, &probe, None, 0).outputs.remove(0).tokens;
    let stop = full[9];
    let first = full.iter().position(|&t| t == stop).unwrap();
    let mut params = greedy(30);
    params.stop_token_ids = vec![stop];
    let s = Scenario {
        name: "stop token inside an accepted run",
        config: config(),
        requests: vec![named("s", &p, params)],
        arrival: Arrival::OneByOne,
    };
    let off = run(model, &s, None, 0);
    assert_eq!(off.outputs[0].reason, FinishReason::Stop);
    assert_eq!(off.outputs[0].tokens, full[..=first]);
    check_all_proposers(model, &s);
}

fn check_model(model: TestModel) {
    for s in scenarios(model) {
        check_all_proposers(model, &s);
    }
    check_context_limit(model);
    check_stop_token_inside_accepted_run(model);
}

#[test]
fn speculation_is_lossless_on_the_attention_only_moe() {
    check_model(TestModel::Moe);
}

#[test]
fn speculation_is_lossless_on_the_hybrid_golden_model() {
    check_model(TestModel::HybridGolden);
}

#[test]
fn speculation_is_lossless_on_the_bundled_model() {
    check_model(TestModel::Bundled);
}

/// Flash-Next's PLE conv state and n-gram context are checkpointed and
/// rolled back with the Gated DeltaNet state.
#[test]
fn speculation_is_lossless_on_flash_next() {
    check_model(TestModel::FlashNext);
}

/// A backend that runs a step's decode and verify rows as one pass and its
/// prefill chunks as another (what the CUDA backend does, so that those rows
/// take the decode kernels) gives the same tokens and logits rows as one
/// pass, with speculation off and with drafts from n-gram lookups, the MTP
/// head and the DFlash drafter (which read states captured in both passes).
#[test]
fn steps_cut_in_two_passes_give_the_same_output() {
    for model in [TestModel::HybridGolden, TestModel::Bundled] {
        let mut methods: Vec<(&str, Option<SpeculativeMethod>, usize)> = vec![
            ("off", None, 0),
            (
                "ngram",
                Some(SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap())),
                4,
            ),
        ];
        if model.has_mtp_head() {
            methods.push(("mtp", Some(SpeculativeMethod::mtp()), 3));
        }
        if let Some(drafter) = model.dflash_drafter() {
            let options = DflashOptions::new(&drafter);
            methods.push(("dflash", Some(SpeculativeMethod::Dflash(options)), 7));
        }
        let mixed: Vec<Scenario> = scenarios(model)
            .into_iter()
            .filter(|s| matches!(s.name, "staggered" | "mixed batch"))
            .collect();
        for s in &mixed {
            for (name, method, k) in &methods {
                let what = format!("{model:?} / {} / {name}", s.name);
                let one = run(model, s, method.clone(), *k);
                let cut = run_on(
                    CpuBackend::cutting_mixed_steps(),
                    |_| {},
                    model,
                    s,
                    method.clone(),
                    *k,
                );
                assert!(
                    cut.stats.engine_steps_split_total > 0,
                    "{what}: some steps mixed decode rows with prefill chunks"
                );
                assert_eq!(one.stats.engine_steps_split_total, 0, "{what}");
                assert_eq!(cut.outputs, one.outputs, "{what}: outputs");
                assert_same_logits(&cut.logits, &one.logits, &what);
            }
        }
    }
}

/// A budget of 8 decode and verify rows a step (three requests decoding
/// together get one draft each, two get three) shortens the drafts of right
/// proposers, and of the MTP head's chains, without changing the output.
#[test]
fn a_row_budget_shortens_drafts_and_leaves_the_output() {
    let model = TestModel::HybridGolden;
    let (s, off, reference) = scenario_with_reference(model, "forced preemption");
    let methods = [
        (
            "AllRight",
            adversary(Drafts::AllRight, &reference, model.vocab()),
        ),
        ("mtp", SpeculativeMethod::mtp()),
    ];
    for (name, method) in methods {
        let free = run(model, &s, Some(method.clone()), 4);
        let capped = run_on(
            CpuBackend::new(),
            |o| o.draft_rows = DraftRows::AtMost(8),
            model,
            &s,
            Some(method),
            4,
        );
        assert_eq!(capped.outputs, off.outputs, "{name}: outputs");
        assert_same_logits(&capped.logits, &off.logits, name);
        let (f, c) = (&free.stats, &capped.stats);
        assert!(c.spec_decode_num_draft_tokens_total > 0, "{name}: drafted");
        assert!(
            c.spec_decode_num_draft_tokens_total * f.spec_decode_num_drafts_total
                < f.spec_decode_num_draft_tokens_total * c.spec_decode_num_drafts_total,
            "{name}: shorter drafts a step under the budget ({} in {} steps against {} in {})",
            c.spec_decode_num_draft_tokens_total,
            c.spec_decode_num_drafts_total,
            f.spec_decode_num_draft_tokens_total,
            f.spec_decode_num_drafts_total
        );
    }
}

/// Adapted draft lengths: wrong drafts shrink to one a step, right ones stay
/// at the configured length, and no proposer's output changes.
#[test]
fn adapted_draft_lengths_shrink_on_rejections_and_leave_the_output() {
    let model = TestModel::HybridGolden;
    let (s, off, reference) = scenario_with_reference(model, "forced preemption");
    let drafter = model
        .dflash_drafter()
        .expect("the golden model has a drafter");
    let vocab = model.vocab();
    let methods = [
        (
            "AllRight",
            adversary(Drafts::AllRight, &reference, vocab),
            4,
        ),
        (
            "AllWrong",
            adversary(Drafts::AllWrong, &reference, vocab),
            4,
        ),
        ("Random", adversary(Drafts::Random, &reference, vocab), 4),
        ("mtp", SpeculativeMethod::mtp(), 3),
        (
            "dflash",
            SpeculativeMethod::Dflash(DflashOptions::new(&drafter)),
            7,
        ),
    ];
    for (name, method, k) in methods {
        let fixed = run(model, &s, Some(method.clone()), k);
        let adapted = run_on(
            CpuBackend::new(),
            |o| o.adaptive_drafts = true,
            model,
            &s,
            Some(method),
            k,
        );
        assert_eq!(adapted.outputs, off.outputs, "{name}: outputs");
        assert_same_logits(&adapted.logits, &off.logits, name);
        let (f, a) = (&fixed.stats, &adapted.stats);
        assert!(a.spec_decode_num_draft_tokens_total > 0, "{name}: drafted");
        match name {
            "AllRight" => assert_eq!(
                (
                    a.spec_decode_num_drafts_total,
                    a.spec_decode_num_draft_tokens_total
                ),
                (
                    f.spec_decode_num_drafts_total,
                    f.spec_decode_num_draft_tokens_total
                ),
                "{name}: runs accepted whole keep their length"
            ),
            "AllWrong" => assert!(
                a.spec_decode_num_draft_tokens_total * f.spec_decode_num_drafts_total
                    < f.spec_decode_num_draft_tokens_total * a.spec_decode_num_drafts_total,
                "{name}: rejected runs shrink ({} in {} steps against {} in {})",
                a.spec_decode_num_draft_tokens_total,
                a.spec_decode_num_drafts_total,
                f.spec_decode_num_draft_tokens_total,
                f.spec_decode_num_drafts_total
            ),
            _ => {}
        }
    }
}

#[test]
fn mtp_at_every_depth_is_lossless() {
    for model in [TestModel::HybridGolden, TestModel::Bundled] {
        let s = &scenarios(model)[0];
        let off = run(model, s, None, 0);
        for k in [1, 2, 4] {
            let on = run(model, s, Some(SpeculativeMethod::mtp()), k);
            let what = format!("{model:?} / MTP k = {k}");
            assert_eq!(on.outputs, off.outputs, "{what}");
            assert_same_logits(&on.logits, &off.logits, &what);
            assert!(
                on.stats.spec_decode_num_draft_tokens_total > 0,
                "{what}: drafted"
            );
        }
    }
}

#[test]
fn a_dflash_drafter_is_refused_by_a_target_it_does_not_fit() {
    let drafter = TestModel::HybridGolden.dflash_drafter().unwrap();
    let start = |model: TestModel, dir: &std::path::Path| {
        let options = EngineOptions {
            speculative: Some(SpeculativeConfig {
                method: SpeculativeMethod::Dflash(DflashOptions::new(dir)),
                num_speculative_tokens: 7,
            }),
            ..EngineOptions::default()
        };
        let err = Engine::spawn_with_options(CpuBackend::new(), model.load(), config(), options)
            .err()
            .expect("refused");
        format!("{err:#}")
    };
    // The attention-only MoE has 4 layers; the drafter taps layer 5.
    let err = start(TestModel::Moe, &drafter);
    assert!(err.contains("target layer 5"), "{err}");
    let err = start(TestModel::HybridGolden, &drafter.join("absent"));
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn mtp_is_refused_without_an_mtp_head() {
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method: SpeculativeMethod::mtp(),
            num_speculative_tokens: 2,
        }),
        ..EngineOptions::default()
    };
    let err =
        Engine::spawn_with_options(CpuBackend::new(), TestModel::Moe.load(), config(), options)
            .err()
            .expect("refused");
    assert!(err.to_string().contains("MTP head"), "{err}");
}

#[test]
fn zero_speculative_tokens_is_refused() {
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method: SpeculativeMethod::Ngram(NgramConfig::new(1, 2, 2).unwrap()),
            num_speculative_tokens: 0,
        }),
        ..EngineOptions::default()
    };
    let err =
        Engine::spawn_with_options(CpuBackend::new(), TestModel::Moe.load(), config(), options)
            .err()
            .expect("refused");
    assert!(err.to_string().contains("num_speculative_tokens"), "{err}");
}
