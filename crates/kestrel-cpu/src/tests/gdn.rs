//! Gated DeltaNet: the two recurrence forms agree, the layer matches a naive f64
//! reference, and results do not depend on how tokens are split or batched.

use kestrel_core::{
    Backend, CacheSpec, ForwardBatch, GdnSpec, GdnWeights, SeqChunk, StateSnapshot,
};

use super::ops::weight;
use super::{assert_close, naive, rng::Rng};
use crate::gdn::{self, HeadInputs};
use crate::{CpuBackend, CpuCache, CpuWeight};

fn spec() -> GdnSpec {
    GdnSpec {
        num_k_heads: 2,
        num_v_heads: 4,
        head_k_dim: 8,
        head_v_dim: 6,
        conv_kernel: 4,
        norm_eps: 1e-6,
        output_gate: Default::default(),
    }
}

fn cache(s: &GdnSpec, slots: usize) -> CpuCache {
    CpuBackend::new()
        .new_cache(&CacheSpec {
            attn_layers: 0,
            num_blocks: 0,
            block_size: 16,
            num_kv_heads: 1,
            head_dim: 1,
            gdn_layers: 2,
            num_state_slots: slots,
            gdn: Some(*s),
        })
        .unwrap()
}

fn weights(rng: &mut Rng, s: &GdnSpec) -> GdnWeights<CpuWeight> {
    let hv = s.num_v_heads;
    GdnWeights {
        conv: weight(
            &[s.conv_dim(), s.conv_kernel],
            rng.vec(s.conv_dim() * s.conv_kernel),
        ),
        a_log: weight(&[hv], (0..hv).map(|_| rng.range(-2.0, 1.0)).collect()),
        dt_bias: weight(&[hv], rng.vec(hv)),
        norm: weight(&[s.head_v_dim], rng.vec(s.head_v_dim)),
    }
}

/// Random per-head inputs shaped like the layer produces them.
struct Head {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn random_head(rng: &mut Rng, n: usize, dk: usize, dv: usize) -> Head {
    let mut q = rng.vec(n * dk);
    let mut k = rng.vec(n * dk);
    for t in 0..n {
        gdn::prepare_qk(&mut q[t * dk..(t + 1) * dk], gdn::query_scale(dk));
        gdn::prepare_qk(&mut k[t * dk..(t + 1) * dk], 1.0);
    }
    Head {
        q,
        k,
        v: rng.vec(n * dv),
        g: (0..n).map(|_| rng.range(-1.5, -0.01)).collect(),
        beta: (0..n).map(|_| rng.range(0.05, 0.95)).collect(),
    }
}

impl Head {
    fn inputs(&self, dk: usize, dv: usize) -> HeadInputs<'_> {
        HeadInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            dk,
            dv,
        }
    }
}

#[test]
fn chunked_and_recurrent_agree_with_carried_state() {
    let (dk, dv) = (16, 12);
    let mut rng = Rng::new(30);
    for n in [1, 7, 63, 64, 65, 130, 200] {
        let head = random_head(&mut rng, n, dk, dv);
        let init = rng.vec(dk * dv);
        let (mut s_rec, mut s_chk) = (init.clone(), init);
        let (mut o_rec, mut o_chk) = (vec![0.0; n * dv], vec![0.0; n * dv]);
        gdn::recurrent(&head.inputs(dk, dv), &mut s_rec, &mut o_rec);
        gdn::chunked(&head.inputs(dk, dv), &mut s_chk, &mut o_chk);
        assert_close(&o_chk, &o_rec, 1e-4, &format!("outputs, {n} tokens"));
        assert_close(&s_chk, &s_rec, 1e-4, &format!("final state, {n} tokens"));
    }
}

fn run(
    be: &CpuBackend,
    c: &mut CpuCache,
    w: &GdnWeights<CpuWeight>,
    s: &GdnSpec,
    layer: usize,
    seqs: &[(usize, u32)],
    proj: &[f32],
) -> Vec<f32> {
    let batch = ForwardBatch {
        seqs: seqs
            .iter()
            .map(|&(n, slot)| SeqChunk {
                prompt: false,
                num_tokens: n,
                cached_len: 0,
                block_table: vec![],
                state_slot: slot,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            })
            .collect(),
    };
    let x = be.from_host(batch.num_tokens(), s.proj_width(), proj);
    be.to_host(&be.gated_delta_net(&x, w, s, c, layer, &batch))
}

#[test]
fn layer_matches_naive_on_both_paths() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(31);
    let w = weights(&mut rng, &s);
    for n in [10, 100] {
        let proj = rng.vec(n * s.proj_width());
        let mut c = cache(&s, 2);
        let got = run(&be, &mut c, &w, &s, 1, &[(n, 1)], &proj);
        let p = naive::GdnParams {
            conv: &w.conv.data,
            a_log: &w.a_log.data,
            dt_bias: &w.dt_bias.data,
            norm: &w.norm.data,
        };
        let (want, state) = naive::gdn(&proj, &p, &s);
        assert_close(&got, &want, 1e-4, &format!("GDN layer, {n} tokens"));
        let rl = c.recurrent_slot_len();
        assert_close(
            &c.gdn[1].recurrent[rl..2 * rl],
            &naive::to_f32(&state),
            1e-4,
            "final state",
        );
        assert!(
            c.gdn[0].recurrent.iter().all(|&v| v == 0.0),
            "other layer untouched"
        );
        // The conv state holds the last kernel-1 inputs.
        let (cd, h) = (s.conv_dim(), s.conv_kernel - 1);
        for r in 0..h {
            let src = &proj[(n - h + r) * s.proj_width()..][..cd];
            assert_eq!(&c.gdn[1].conv[(h + r) * cd..(h + r + 1) * cd], src);
        }
    }
}

#[test]
fn split_calls_equal_one_call() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(32);
    let w = weights(&mut rng, &s);
    let n = 150;
    let width = s.proj_width();
    let proj = rng.vec(n * width);
    let mut c = cache(&s, 1);
    let whole = run(&be, &mut c, &w, &s, 0, &[(n, 0)], &proj);
    let mut c = cache(&s, 1);
    let mut split = Vec::new();
    let mut done = 0;
    // Chunked, recurrent (decode), recurrent, then chunked again.
    for part in [70, 1, 5, 74] {
        split.extend(run(
            &be,
            &mut c,
            &w,
            &s,
            0,
            &[(part, 0)],
            &proj[done * width..(done + part) * width],
        ));
        done += part;
    }
    assert_close(&split, &whole, 1e-4, "split vs one call");
}

#[test]
fn batch_of_two_equals_each_alone_and_state_slots_work() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(33);
    let w = weights(&mut rng, &s);
    let width = s.proj_width();
    let (na, nb) = (9, 70);
    let a = rng.vec(na * width);
    let b = rng.vec(nb * width);
    let mut c = cache(&s, 3);
    let alone_a = run(&be, &mut c, &w, &s, 0, &[(na, 2)], &a);
    let alone_b = run(&be, &mut c, &w, &s, 0, &[(nb, 0)], &b);
    let mut c2 = cache(&s, 3);
    let mut ab = a.clone();
    ab.extend_from_slice(&b);
    let both = run(&be, &mut c2, &w, &s, 0, &[(na, 2), (nb, 0)], &ab);
    assert_close(&both[..na * 24], &alone_a, 1e-6, "sequence A in a batch");
    assert_close(&both[na * 24..], &alone_b, 1e-6, "sequence B in a batch");

    // Snapshot slot 2 into slot 1; continuing either gives the same result.
    let next = rng.vec(3 * width);
    be.copy_state(&mut c2, 2, 1);
    let from_1 = run(&be, &mut c2, &w, &s, 0, &[(3, 1)], &next);
    let from_2 = run(&be, &mut c2, &w, &s, 0, &[(3, 2)], &next);
    assert_eq!(from_1, from_2);
    // A zeroed slot behaves like a fresh sequence.
    be.zero_state(&mut c2, 1);
    let fresh = run(&be, &mut cache(&s, 3), &w, &s, 0, &[(3, 0)], &next);
    assert_eq!(run(&be, &mut c2, &w, &s, 0, &[(3, 1)], &next), fresh);
    assert_ne!(from_1, fresh, "the carried state matters");
}

#[test]
fn state_checkpoints_hold_the_state_after_each_token_bit_for_bit() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(34);
    let w = weights(&mut rng, &s);
    let width = s.proj_width();
    let prefix = rng.vec(20 * width);
    let verify = rng.vec(4 * width);
    // Reference: the prefix, then the four tokens one decode step at a time,
    // snapshotting the state after each into slots 1..=4.
    let mut want = cache(&s, 8);
    run(&be, &mut want, &w, &s, 0, &[(20, 0)], &prefix);
    let mut want_out = Vec::new();
    for t in 0..4 {
        want_out.extend(run(
            &be,
            &mut want,
            &w,
            &s,
            0,
            &[(1, 0)],
            &verify[t * width..(t + 1) * width],
        ));
        be.copy_state(&mut want, 0, 1 + t as u32);
    }
    // One verify call over the four tokens with checkpoints 5, 6, 7.
    let mut got = cache(&s, 8);
    run(&be, &mut got, &w, &s, 0, &[(20, 0)], &prefix);
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            prompt: false,
            state_checkpoints: vec![5, 6, 7],
            state_snapshot: None,
            ..SeqChunk::new(4, 20, vec![], 0)
        }],
    };
    let x = be.from_host(4, width, &verify);
    let got_out = be.to_host(&be.gated_delta_net(&x, &w, &s, &mut got, 0, &batch));
    assert_eq!(got_out, want_out, "outputs equal decode steps bit for bit");
    let (cl, rl) = (got.conv_slot_len(), got.recurrent_slot_len());
    for (ckpt, reference) in [(5usize, 1usize), (6, 2), (7, 3), (0, 4)] {
        let layer = (&got.gdn[0], &want.gdn[0]);
        assert_eq!(
            layer.0.recurrent[ckpt * rl..(ckpt + 1) * rl],
            layer.1.recurrent[reference * rl..(reference + 1) * rl],
            "recurrent state in slot {ckpt}"
        );
        assert_eq!(
            layer.0.conv[ckpt * cl..(ckpt + 1) * cl],
            layer.1.conv[reference * cl..(reference + 1) * cl],
            "conv window in slot {ckpt}"
        );
    }
    // Resuming from a checkpoint continues exactly like the reference.
    let next = rng.vec(2 * width);
    be.copy_state(&mut got, 6, 0);
    be.copy_state(&mut want, 2, 0);
    assert_eq!(
        run(&be, &mut got, &w, &s, 0, &[(2, 0)], &next),
        run(&be, &mut want, &w, &s, 0, &[(2, 0)], &next)
    );
}

#[test]
#[should_panic(expected = "used twice")]
fn a_checkpoint_may_not_alias_a_live_slot() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(35);
    let w = weights(&mut rng, &s);
    let mut c = cache(&s, 4);
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            prompt: false,
            state_checkpoints: vec![1, 0],
            state_snapshot: None,
            ..SeqChunk::new(3, 0, vec![], 0)
        }],
    };
    let x = be.from_host(3, s.proj_width(), &rng.vec(3 * s.proj_width()));
    be.gated_delta_net(&x, &w, &s, &mut c, 0, &batch);
}

#[test]
fn a_snapshot_inside_a_pass_equals_two_passes_split_there_bit_for_bit() {
    let be = CpuBackend::new();
    let s = spec();
    let mut rng = Rng::new(36);
    let w = weights(&mut rng, &s);
    let width = s.proj_width();
    // (tokens, snapshot after): runs of both forms on either side.
    for (n, after) in [(150usize, 100usize), (200, 70), (40, 13), (90, 80)] {
        let x = rng.vec(n * width);
        let mut want = cache(&s, 4);
        let mut want_out = run(
            &be,
            &mut want,
            &w,
            &s,
            0,
            &[(after, 0)],
            &x[..after * width],
        );
        be.copy_state(&mut want, 0, 1);
        want_out.extend(run(
            &be,
            &mut want,
            &w,
            &s,
            0,
            &[(n - after, 0)],
            &x[after * width..],
        ));

        let mut got = cache(&s, 4);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                prompt: false,
                state_snapshot: Some(StateSnapshot {
                    after,
                    slot: Some(2),
                }),
                ..SeqChunk::new(n, 0, vec![], 0)
            }],
        };
        let got_out = be.to_host(&be.gated_delta_net(
            &be.from_host(n, width, &x),
            &w,
            &s,
            &mut got,
            0,
            &batch,
        ));
        assert_eq!(
            got_out, want_out,
            "{n} tokens, snapshot after {after}: outputs"
        );
        let (cl, rl) = (got.conv_slot_len(), got.recurrent_slot_len());
        let (g, r) = (&got.gdn[0], &want.gdn[0]);
        for (mine, theirs, what) in [(0usize, 0usize, "live state"), (2, 1, "snapshot")] {
            assert_eq!(
                g.recurrent[mine * rl..(mine + 1) * rl],
                r.recurrent[theirs * rl..(theirs + 1) * rl],
                "{n} tokens, snapshot after {after}: recurrent {what}"
            );
            assert_eq!(
                g.conv[mine * cl..(mine + 1) * cl],
                r.conv[theirs * cl..(theirs + 1) * cl],
                "{n} tokens, snapshot after {after}: conv {what}"
            );
        }
    }
}
