//! Qwen3.8-Flash-Next's operations: the hyper-connection steps (also the
//! fused norm that adds a pending sublayer output first) and the PLE
//! gate and dilated conv with its state (checkpoints and a snapshot inside a
//! pass, then a step that continues from them). The indexer and the sparse
//! attention are checked at model level (`flash_next_fixture.rs`), where the
//! selection they make is held to transformers' logits.

use kestrel_core::flash_next::{Channels, FlashNextOps, HyperSpec, PleParams, PleSpec, RowEdit};
use kestrel_core::{ForwardBatch, HostTensor, Result, SeqChunk, StateSnapshot};

use super::{Ctx, Outputs, TOL_BF16_MATMUL, TOL_F32, out};

/// The Flash-Next group: the hyper-connection steps, then the PLE mix.
pub fn flash_next(c: &mut Ctx) {
    // The fused hyper-connection kernels where the build has them
    // (`experiments`), whatever the environment says.
    let was = fused(c);
    c.gpu.set_hyper_fusion(true);
    hyper_connections(c);
    c.gpu.set_hyper_fusion(was);
    ple(c);
}

fn fused(c: &Ctx) -> bool {
    c.gpu.plan().hyper_fusion
}

/// Four streams of 640 (rows not a multiple of a block), as in the real
/// model's shape family (4 x 2560), over 13 rows.
fn hyper_connections(c: &mut Ctx) {
    let spec = HyperSpec {
        streams: 4,
        hidden: 640,
        eps: 1e-6,
    };
    let rows = 13;
    let x = c.data.randn(rows * spec.hidden, 1.0);
    let norm = c.data.uniform(spec.width(), 0.5, 1.5);
    let gate = c.data.randn(rows * spec.width(), 2.0);
    let sub = c.data.randn(rows * spec.hidden, 1.0);
    let inject = c.data.randn(rows * spec.streams, 2.0);
    let inject_w = c.data.mat_bf16(&[spec.streams, spec.width()], 0.05);
    /// The inputs: hidden rows, norm weight, gate logits, a sublayer's
    /// output, inject logits.
    type HyperInputs<'a> = [&'a [f32]; 5];
    fn hyper<B: FlashNextOps>(
        b: &B,
        spec: &HyperSpec,
        rows: usize,
        [x, norm, gate, sub, inject]: HyperInputs<'_>,
    ) -> Result<Outputs> {
        let norm = Channels::new(b, norm.to_vec())?;
        let mut streams = b.repeat_streams(&b.from_host(rows, spec.hidden, x), spec.streams);
        let normed = b.grouped_rms_norm(&streams, &norm, spec.hidden, spec.eps);
        let gate = b.from_host(rows, spec.width(), gate);
        let act = b.hyper_low_rank_act(&gate, spec.streams);
        let mixed = b.hyper_mix(&normed, &gate, spec);
        let inject = b.from_host(rows, spec.streams, inject);
        b.hyper_inject(
            &mut streams,
            &b.from_host(rows, spec.hidden, sub),
            &inject,
            spec,
        );
        Ok(vec![
            out(b, "grouped_rms_norm", &normed),
            out(b, "low_rank_act", &act),
            out(b, "mix", &mixed),
            out(b, "inject", &streams),
        ])
    }
    /// The step before a sublayer: the pending output added, the norm, the
    /// inject logits; and the norm alone (the final mixer's).
    fn norm_step<B: FlashNextOps>(
        b: &B,
        spec: &HyperSpec,
        rows: usize,
        [x, norm, _, sub, inject]: HyperInputs<'_>,
        inject_w: &HostTensor,
    ) -> Result<Outputs> {
        let norm = Channels::new(b, norm.to_vec())?;
        let mut fused = b.repeat_streams(&b.from_host(rows, spec.hidden, x), spec.streams);
        let (pending_out, pending_logits) = (
            b.from_host(rows, spec.hidden, sub),
            b.from_host(rows, spec.streams, inject),
        );
        let inject_w = b.upload(inject_w)?;
        let (fused_normed, fused_logits) = b.hyper_norm(
            &mut fused,
            Some((&pending_out, &pending_logits)),
            &norm,
            Some(&inject_w),
            spec,
        );
        let mut unchanged = b.repeat_streams(&b.from_host(rows, spec.hidden, x), spec.streams);
        let (plain_normed, none) = b.hyper_norm(&mut unchanged, None, &norm, None, spec);
        assert!(none.is_none(), "no inject projection, no logits");
        let logits = fused_logits.expect("an inject projection gives logits");
        Ok(vec![
            out(b, "streams", &fused),
            out(b, "normed", &fused_normed),
            out(b, "logits", &logits),
            out(b, "norm alone", &plain_normed),
        ])
    }
    let inputs = [&x[..], &norm[..], &gate[..], &sub[..], &inject[..]];
    let (cpu, gpu) = (
        hyper(&c.cpu, &spec, rows, inputs),
        hyper(&c.gpu, &spec, rows, inputs),
    );
    c.record("flash_next hyper-connections 4x640", TOL_F32, cpu, gpu);
    let (cpu, gpu) = (
        norm_step(&c.cpu, &spec, rows, inputs, &inject_w),
        norm_step(&c.gpu, &spec, rows, inputs, &inject_w),
    );
    // The separate path forms the logits as a product of 13 rows (bf16
    // operands); the fused kernel in f32.
    let tol = if fused(c) { TOL_F32 } else { TOL_BF16_MATMUL };
    c.record("flash_next hyper norm after inject 4x640", tol, cpu, gpu);
    gate_mix(c, &spec);
}

/// The low-rank gate and stream mean in one operation, at the row counts
/// the fused decode kernels take (1, 3, 8) and past them (13, the products).
fn gate_mix(c: &mut Ctx, spec: &HyperSpec) {
    let rank = 40;
    let down = c.data.mat_bf16(&[rank, spec.width()], 0.05);
    let up = c.data.mat_bf16(&[spec.width(), rank], 0.3);
    for rows in [1, 3, 8, 13] {
        let normed = c.data.randn(rows * spec.width(), 1.0);
        fn run<B: FlashNextOps>(
            b: &B,
            spec: &HyperSpec,
            rows: usize,
            normed: &[f32],
            [down, up]: [&HostTensor; 2],
        ) -> Result<Outputs> {
            let (down, up) = (b.upload(down)?, b.upload(up)?);
            let normed = b.from_host(rows, spec.width(), normed);
            let mixed = b.hyper_gate_mix(&normed, &down, &up, spec);
            Ok(vec![out(b, "mixed", &mixed)])
        }
        let (cpu, gpu) = (
            run(&c.cpu, spec, rows, &normed, [&down, &up]),
            run(&c.gpu, spec, rows, &normed, [&down, &up]),
        );
        // Past 8 rows the products take bf16 operands.
        let tol = if rows <= 8 { TOL_F32 } else { TOL_BF16_MATMUL };
        let name = format!("flash_next hyper gate_mix 4x640 rank {rank}, {rows} rows");
        c.record(&name, tol, cpu, gpu);
    }
}

/// The PLE mix over a pool of seven state slots, after a slot is zeroed and
/// one copied: a step of two sequences (one with a snapshot after 5 of its 9
/// tokens, one with per-token checkpoints), then a step from the snapshot's
/// and a checkpoint's slots; every output and the whole state pool compared.
fn ple(c: &mut Ctx) {
    let spec = PleSpec {
        hyper: HyperSpec {
            streams: 4,
            hidden: 96,
            eps: 1e-6,
        },
        conv_kernel: 4,
        conv_dilation: 3,
    };
    let (width, len) = (spec.hyper.width(), spec.state_len());
    // Slots 0-5 are read or written by the steps; slot 6 only by the zeroing.
    let slots = 7;
    let mut first = SeqChunk::new(9, 0, vec![0], 0);
    first.state_snapshot = Some(StateSnapshot {
        after: 5,
        slot: Some(2),
    });
    let mut second = SeqChunk::new(3, 0, vec![1], 1);
    second.state_checkpoints = vec![3, 4, 5];
    let steps = [
        ForwardBatch {
            seqs: vec![first, second],
        },
        ForwardBatch {
            seqs: vec![
                SeqChunk::new(2, 5, vec![0], 2),
                SeqChunk::new(1, 2, vec![1], 4),
            ],
        },
    ];
    let params = [
        c.data.uniform(width, 0.5, 1.5),
        c.data.uniform(width, 0.5, 1.5),
        c.data.uniform(width, 0.5, 1.5),
        c.data.randn(width * spec.conv_kernel, 0.5),
    ];
    let inputs: Vec<[Vec<f32>; 3]> = steps
        .iter()
        .map(|s| {
            let t = s.num_tokens();
            [
                c.data.randn(t * width, 1.0),
                c.data.randn(t * width, 1.0),
                c.data.randn(t * spec.hyper.hidden, 1.0),
            ]
        })
        .collect();
    let initial = c.data.randn(slots * len * width, 1.0);
    fn run<B: FlashNextOps>(
        b: &B,
        spec: &PleSpec,
        steps: &[ForwardBatch],
        inputs: &[[Vec<f32>; 3]],
        params: &[Vec<f32>; 4],
        initial: &[f32],
    ) -> Result<Outputs> {
        let (width, len) = (spec.hyper.width(), spec.state_len());
        let p = PleParams {
            norm_key: Channels::new(b, params[0].clone())?,
            norm_query: Channels::new(b, params[1].clone())?,
            norm_conv: Channels::new(b, params[2].clone())?,
            conv: Channels::new(b, params[3].clone())?,
        };
        let mut state = b.from_host(initial.len() / width, width, initial);
        // Slot 6 starts over; slot 1 starts from slot 0's state.
        b.edit_rows(&mut state, RowEdit::Zero(6 * len..7 * len));
        b.edit_rows(
            &mut state,
            RowEdit::Copy {
                src: 0..len,
                dst: len,
            },
        );
        let mut outs = Vec::new();
        for (i, (batch, [streams, key, value])) in steps.iter().zip(inputs).enumerate() {
            let t = batch.num_tokens();
            let o = b.ple_mix(
                &b.from_host(t, width, streams),
                &b.from_host(t, width, key),
                &b.from_host(t, spec.hyper.hidden, value),
                &p,
                spec,
                &mut state,
                batch,
            );
            outs.push(out(b, &format!("step{i}"), &o));
            outs.push(out(b, &format!("state after step{i}"), &state));
        }
        Ok(outs)
    }
    let cpu = run(&c.cpu, &spec, &steps, &inputs, &params, &initial);
    let gpu = run(&c.gpu, &spec, &steps, &inputs, &params, &initial);
    c.record("flash_next ple_mix 4x96 K4 dilation 3", 1e-4, cpu, gpu);
}
