//! The rejection sampler emits tokens with the target's distribution,
//! whatever the drafts' distribution: each case runs many seeded episodes
//! of speculative steps (two drafts each) until two tokens are emitted, and
//! checks the first token, the second token and their joint distribution
//! against the target's filtered distributions (computed here, apart from
//! the sampler's code) by chi-square and total variation. The same check
//! rejects verifiers with a known-wrong rule, so it is not vacuous.

mod stats;

use kestrel_sampling::{DraftProbs, Sampler, SamplingParams, TokenDistribution};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use stats::{check_fit, chi_square_sf};

const VOCAB: usize = 6;
const EPISODES: usize = 200_000;

/// How a case's drafts are proposed.
#[derive(Clone, Copy)]
enum Drafter {
    /// Drawn from the target's own filtered distribution, reported exactly
    /// (`Sampler::distribution`): `q = p`.
    Target,
    /// Drawn from a distribution of the context, reported as dense rows.
    Dist(fn(&[u32]) -> Vec<f32>),
    /// A token of the context, reported as deterministic: a Dirac `q`.
    Dirac(fn(&[u32]) -> u32),
}

/// How a step's drafts are verified.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    /// `Sampler::verify`.
    Sampler,
    /// Wrong: every draft accepted.
    AcceptAll,
    /// Wrong: the right acceptance test, but a rejected draft is replaced
    /// by a draw from `p` instead of the residual `max(p - q, 0)`.
    ReplaceFromTarget,
}

struct Case {
    params: SamplingParams,
    target: fn(&[u32]) -> Vec<f32>,
    drafter: Drafter,
}

/// Target logits that depend on the last token (its successor is favoured).
fn target_logits(ctx: &[u32]) -> Vec<f32> {
    let mut logits = vec![1.0, 0.2, -0.5, 0.8, -1.0, 0.3];
    if let Some(&last) = ctx.last() {
        logits[(last as usize + 1) % VOCAB] += 1.5;
    }
    logits
}

/// Target logits supported on tokens 0..3 only.
fn low_half_logits(ctx: &[u32]) -> Vec<f32> {
    let mut logits = vec![
        0.5,
        0.0,
        -0.4,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
    ];
    if let Some(&last) = ctx.last() {
        logits[(last as usize + 1) % 3] += 1.0;
    }
    logits
}

fn high_half_q(_: &[u32]) -> Vec<f32> {
    vec![0.0, 0.0, 0.0, 0.5, 0.3, 0.2]
}

/// Zero where the target has mass (tokens 3..6), and context-dependent.
fn low_half_q(ctx: &[u32]) -> Vec<f32> {
    match ctx.last() {
        Some(&last) if last % 2 == 1 => vec![0.2, 0.2, 0.6, 0.0, 0.0, 0.0],
        _ => vec![0.6, 0.3, 0.1, 0.0, 0.0, 0.0],
    }
}

fn one_hot_q(ctx: &[u32]) -> Vec<f32> {
    let mut q = vec![0.0; VOCAB];
    q[ctx.last().map_or(3, |&l| (l as usize + 2) % VOCAB)] = 1.0;
    q
}

fn uniform_q(_: &[u32]) -> Vec<f32> {
    vec![1.0 / VOCAB as f32; VOCAB]
}

/// The unfiltered softmax of the target at temperature 1: mass on tokens
/// the filters remove.
fn unfiltered_q(ctx: &[u32]) -> Vec<f32> {
    let logits = target_logits(ctx);
    let e: Vec<f32> = logits.iter().map(|l| l.exp()).collect();
    let z: f32 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

fn successor_draft(ctx: &[u32]) -> u32 {
    ctx.last().map_or(0, |&l| (l + 1) % VOCAB as u32)
}

fn seeded(params: SamplingParams) -> SamplingParams {
    SamplingParams {
        seed: Some(2024),
        ..params
    }
}

fn sampled(temperature: f32) -> SamplingParams {
    seeded(SamplingParams {
        temperature,
        ..SamplingParams::default()
    })
}

/// The filtered distribution the target samples from after `ctx` (all of
/// it output), written independently of the sampler: penalties, softmax at
/// the temperature, min-p, top-k, top-p, renormalised.
fn reference(params: &SamplingParams, logits: &[f32], ctx: &[u32]) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    let mut distinct = ctx.to_vec();
    distinct.sort();
    distinct.dedup();
    for &t in &distinct {
        let x = &mut l[t as usize];
        let rep = f64::from(params.repetition_penalty);
        *x = if *x > 0.0 { *x / rep } else { *x * rep };
        let count = ctx.iter().filter(|&&c| c == t).count() as f64;
        *x -= f64::from(params.frequency_penalty) * count + f64::from(params.presence_penalty);
    }
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let temperature = f64::from(params.temperature);
    let mut p: Vec<f64> = l.iter().map(|&x| ((x - max) / temperature).exp()).collect();
    let p_max = p.iter().copied().fold(0.0, f64::max);
    for x in &mut p {
        if *x < f64::from(params.min_p) * p_max {
            *x = 0.0;
        }
    }
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| p[i] > 0.0).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    if params.top_k > 0 {
        for &i in order.iter().skip(params.top_k as usize) {
            p[i] = 0.0;
        }
        order.truncate(params.top_k as usize);
    }
    let z: f64 = p.iter().sum();
    let mut mass = 0.0;
    for &i in &order {
        if mass >= f64::from(params.top_p) {
            p[i] = 0.0;
        }
        mass += p[i] / z;
    }
    let z: f64 = p.iter().sum();
    p.iter().map(|x| x / z).collect()
}

/// A draw from `probs` (summing to 1) with the drafter's RNG.
fn draw(probs: impl IntoIterator<Item = f64>, rng: &mut ChaCha20Rng) -> u32 {
    let u: f64 = rng.random();
    let mut mass = 0.0;
    let mut last = 0;
    for (id, p) in probs.into_iter().enumerate() {
        mass += p;
        if p > 0.0 {
            last = id as u32;
        }
        if u < mass {
            return id as u32;
        }
    }
    last
}

fn dense(dist: &TokenDistribution) -> Vec<f64> {
    (0..VOCAB as u32).map(|id| dist.prob(id)).collect()
}

/// One speculative step after `ctx` with two drafts: the tokens it emits.
fn step(
    case: &Case,
    rule: Rule,
    s: &mut Sampler,
    p_of: &mut Sampler,
    rng: &mut ChaCha20Rng,
    ctx: &[u32],
) -> Vec<u32> {
    const DRAFTS: usize = 2;
    let mut drafts = Vec::new();
    let (mut sparse, mut rows_q) = (Vec::new(), Vec::new());
    let seen = |drafts: &[u32]| [ctx, drafts].concat();
    for _ in 0..DRAFTS {
        let draft = match case.drafter {
            Drafter::Target => {
                let mut row = (case.target)(&seen(&drafts));
                let q = p_of.distribution(&mut row, ctx, &drafts).unwrap();
                let d = draw(dense(&q), rng);
                sparse.push(q);
                d
            }
            Drafter::Dist(q_of) => {
                let q = q_of(&seen(&drafts));
                let d = draw(q.iter().map(|&x| f64::from(x)), rng);
                rows_q.push(q);
                d
            }
            Drafter::Dirac(pick) => pick(&seen(&drafts)),
        };
        drafts.push(draft);
    }
    let q = match case.drafter {
        Drafter::Target => DraftProbs::Sparse(&sparse),
        Drafter::Dist(_) => DraftProbs::Distributions(&rows_q),
        Drafter::Dirac(_) => DraftProbs::Deterministic,
    };
    let mut rows: Vec<Vec<f32>> = (0..=DRAFTS)
        .map(|i| (case.target)(&seen(&drafts[..i])))
        .collect();
    let mut p_row = |i: usize, rows: &mut [Vec<f32>]| {
        dense(&p_of.distribution(&mut rows[i], ctx, &drafts[..i]).unwrap())
    };
    let q_at = |i: usize, token: u32| match q {
        DraftProbs::Deterministic => f64::from(u8::from(token == drafts[i])),
        DraftProbs::Distributions(r) => f64::from(r[i][token as usize]),
        DraftProbs::Sparse(d) => d[i].prob(token),
    };
    let (accepted, next) = match rule {
        Rule::Sampler => {
            let v = s.verify(&mut rows, ctx, &drafts, q).unwrap();
            (v.accepted, v.next)
        }
        Rule::AcceptAll => (DRAFTS, draw(p_row(DRAFTS, &mut rows), rng)),
        Rule::ReplaceFromTarget => {
            let mut out = (DRAFTS, 0);
            for i in 0..=DRAFTS {
                let p = p_row(i, &mut rows);
                if i == DRAFTS || rng.random::<f64>() * q_at(i, drafts[i]) >= p[drafts[i] as usize]
                {
                    out = (i, draw(p, rng));
                    break;
                }
            }
            out
        }
    };
    let mut emitted = drafts[..accepted].to_vec();
    emitted.push(next);
    emitted
}

/// Counts of (first, second) emitted token over [`EPISODES`] episodes.
fn joint_counts(case: &Case, rule: Rule) -> Vec<usize> {
    let mut s = Sampler::new(&case.params, 0, &[]).unwrap();
    let mut p_of = Sampler::new(&case.params, 0, &[]).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let mut joint = vec![0; VOCAB * VOCAB];
    for _ in 0..EPISODES {
        let mut ctx = Vec::new();
        while ctx.len() < 2 {
            let emitted = step(case, rule, &mut s, &mut p_of, &mut rng, &ctx);
            ctx.extend(emitted);
        }
        joint[ctx[0] as usize * VOCAB + ctx[1] as usize] += 1;
    }
    joint
}

/// The target's joint distribution of the first two tokens.
fn expected_joint(case: &Case) -> Vec<f64> {
    let first = reference(&case.params, &(case.target)(&[]), &[]);
    let mut joint = vec![0.0; VOCAB * VOCAB];
    for (x1, &p1) in first.iter().enumerate() {
        let ctx = [x1 as u32];
        let second = reference(&case.params, &(case.target)(&ctx), &ctx);
        for (x2, &p2) in second.iter().enumerate() {
            joint[x1 * VOCAB + x2] = p1 * p2;
        }
    }
    joint
}

fn marginals<T: Copy + std::iter::Sum<T> + Default + std::ops::AddAssign>(
    joint: &[T],
) -> (Vec<T>, Vec<T>) {
    let (mut first, mut second) = (vec![T::default(); VOCAB], vec![T::default(); VOCAB]);
    for (cell, &v) in joint.iter().enumerate() {
        first[cell / VOCAB] += v;
        second[cell % VOCAB] += v;
    }
    (first, second)
}

/// The fit of the first token, the second token and the pair under `rule`.
fn fit(case: &Case, rule: Rule) -> Result<(), String> {
    let joint = joint_counts(case, rule);
    let want = expected_joint(case);
    let (first, second) = marginals(&joint);
    let (want_first, want_second) = marginals(&want);
    check_fit(&first, &want_first).map_err(|e| format!("first token: {e}"))?;
    check_fit(&second, &want_second).map_err(|e| format!("second token: {e}"))?;
    check_fit(&joint, &want).map_err(|e| format!("joint: {e}"))
}

fn assert_lossless(case: Case) {
    if let Err(e) = fit(&case, Rule::Sampler) {
        panic!("the verifier's output is not the target's distribution: {e}");
    }
}

#[test]
fn drafts_from_the_target_itself_keep_its_distribution() {
    assert_lossless(Case {
        params: sampled(1.0),
        target: target_logits,
        drafter: Drafter::Target,
    });
}

#[test]
fn drafts_outside_the_targets_support_are_always_replaced() {
    assert_lossless(Case {
        params: sampled(1.0),
        target: low_half_logits,
        drafter: Drafter::Dist(high_half_q),
    });
}

#[test]
fn a_one_hot_draft_distribution_keeps_the_target() {
    assert_lossless(Case {
        params: sampled(0.7),
        target: target_logits,
        drafter: Drafter::Dist(one_hot_q),
    });
}

#[test]
fn a_draft_distribution_without_some_target_tokens_keeps_the_target() {
    assert_lossless(Case {
        params: sampled(1.3),
        target: target_logits,
        drafter: Drafter::Dist(low_half_q),
    });
}

#[test]
fn deterministic_drafts_keep_the_target() {
    assert_lossless(Case {
        params: sampled(1.0),
        target: target_logits,
        drafter: Drafter::Dirac(successor_draft),
    });
}

#[test]
fn filters_apply_to_the_target_whatever_the_drafts() {
    let params = seeded(SamplingParams {
        temperature: 0.8,
        top_k: 4,
        top_p: 0.9,
        min_p: 0.05,
        ..SamplingParams::default()
    });
    assert_lossless(Case {
        params: params.clone(),
        target: target_logits,
        drafter: Drafter::Dist(unfiltered_q),
    });
    assert_lossless(Case {
        params: params.clone(),
        target: target_logits,
        drafter: Drafter::Target,
    });
    assert_lossless(Case {
        params,
        target: target_logits,
        drafter: Drafter::Dirac(successor_draft),
    });
}

#[test]
fn penalties_count_the_drafts_before_each_row() {
    let params = seeded(SamplingParams {
        presence_penalty: 1.0,
        frequency_penalty: 0.5,
        repetition_penalty: 1.5,
        ..SamplingParams::default()
    });
    assert_lossless(Case {
        params: params.clone(),
        target: target_logits,
        drafter: Drafter::Target,
    });
    assert_lossless(Case {
        params,
        target: target_logits,
        drafter: Drafter::Dist(uniform_q),
    });
}

#[test]
fn the_check_rejects_wrong_verification_rules() {
    let case = Case {
        params: sampled(1.3),
        target: target_logits,
        drafter: Drafter::Dist(low_half_q),
    };
    for rule in [Rule::AcceptAll, Rule::ReplaceFromTarget] {
        assert!(fit(&case, rule).is_err(), "{rule:?} passed the check");
    }
    let dirac = Case {
        params: sampled(1.0),
        target: target_logits,
        drafter: Drafter::Dirac(successor_draft),
    };
    assert!(
        fit(&dirac, Rule::AcceptAll).is_err(),
        "AcceptAll passed with Dirac drafts"
    );
}

#[test]
fn chi_square_p_values_match_tables() {
    for (x, dof, p) in [
        (3.841, 1.0, 0.05),
        (10.828, 1.0, 0.001),
        (18.467, 4.0, 0.001),
        (37.566, 20.0, 0.01),
        (0.5, 3.0, 0.918_7),
    ] {
        let got = chi_square_sf(x, dof);
        assert!(
            (got - p).abs() < 1e-3 * p.max(0.01),
            "sf({x}, {dof}) = {got}, want {p}"
        );
    }
    // A fit that is off by 1 % on 200k samples is rejected.
    let probs = [0.25, 0.25, 0.25, 0.25];
    assert!(check_fit(&[52_000, 48_000, 50_000, 50_000], &probs).is_err());
    assert!(check_fit(&[50_100, 49_900, 50_050, 49_950], &probs).is_ok());
    assert!(check_fit(&[1, 49_999, 50_000, 100_000], &[0.0, 0.25, 0.25, 0.5]).is_err());
}
