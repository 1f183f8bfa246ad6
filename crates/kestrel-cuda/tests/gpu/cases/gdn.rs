//! Gated DeltaNet layers: prefill, mixed steps, a snapshot and a reset, then
//! the CUDA paths on carried state.

use kestrel_core::{
    Backend, BackendError, CacheSpec, ForwardBatch, GdnGate, GdnSpec, GdnWeights, HostTensor,
    Result, SeqChunk,
};

use kestrel_cuda::Precision;

use super::{Ctx, Outputs, TOL_GDN, TOL_GDN_TF32, out};

/// Every GDN case in the serving precision, whose chunked prefill runs one
/// TF32 pass per product, and again in the reference precision (3xTF32, to
/// f32 rounding; labels start with "f32").
pub fn gated_delta_net(c: &mut Ctx) {
    gdn_cases(c, "", TOL_GDN_TF32);
    c.gpu.set_precision(Precision::F32);
    gdn_cases(c, "f32 ", TOL_GDN);
    c.gpu.set_precision(Precision::Bf16);
}

fn gdn_cases(c: &mut Ctx, prefix: &str, tol: f64) {
    gdn_two_layers(c, prefix, tol, GdnGate::Silu);
    // Qwen3.8-Flash-Next's gate, through the chunked prefill's gated norm
    // and the decode kernel.
    gdn_two_layers(c, prefix, tol, GdnGate::Sigmoid);
    gated_delta_net_paths(c, prefix, tol);
    gdn_long_prefill(c, prefix, tol);
    super::gdn_verify::gdn_verify(c, prefix, tol);
    super::gdn_snapshot::gdn_snapshot(c, prefix, tol);
}

/// Prefill, a mixed step, a state snapshot, and a reset, over two GDN layers.
fn gdn_two_layers(c: &mut Ctx, prefix: &str, tol: f64, gate: GdnGate) {
    let spec = GdnSpec {
        output_gate: gate,
        ..gdn_spec(2, 4, 128)
    };
    let cache = gdn_cache(spec, 4);
    // (batch, action before it): slots 1 and 3 run, 1 is snapshotted into 0, 3 is reset.
    let steps = vec![
        batch(&[(70, 1), (2, 3)]),
        batch(&[(1, 1), (5, 3)]),
        batch(&[(3, 0), (1, 1), (4, 3)]),
    ];
    let inputs: Vec<Vec<f32>> = steps
        .iter()
        .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
        .collect();
    let c_dim = spec.conv_dim();
    let w = GdnWeights {
        conv: c.data.mat_bf16(&[c_dim, spec.conv_kernel], 0.5),
        // A = exp(A_log) in (0.37, 15): decays from mild to strong.
        a_log: HostTensor::from_f32(vec![4], &c.data.uniform(4, -1.0, 2.7)),
        dt_bias: c.data.vector(4, 0.0, 1.0),
        norm: c.data.vector(spec.head_v_dim, 1.0, 0.2),
    };
    fn run<B: Backend>(
        b: &B,
        spec: &GdnSpec,
        cache: &CacheSpec,
        steps: &[ForwardBatch],
        inputs: &[Vec<f32>],
        w: &GdnWeights<HostTensor>,
    ) -> Result<Outputs> {
        let w = upload(b, w)?;
        let mut cache = b.new_cache(cache)?;
        for slot in 0..4 {
            b.zero_state(&mut cache, slot);
        }
        let mut outs = Vec::new();
        for (i, (batch, x)) in steps.iter().zip(inputs).enumerate() {
            if i == 2 {
                b.copy_state(&mut cache, 1, 0);
                b.zero_state(&mut cache, 3);
            }
            let proj = b.from_host(batch.num_tokens(), spec.proj_width(), x);
            for layer in 0..2 {
                let o = b.gated_delta_net(&proj, &w, spec, &mut cache, layer, batch);
                outs.push(out(b, &format!("step{i}.l{layer}"), &o));
            }
        }
        Ok(outs)
    }
    let cpu = run(&c.cpu, &spec, &cache, &steps, &inputs, &w);
    let gpu = run(&c.gpu, &spec, &cache, &steps, &inputs, &w);
    c.record(
        &format!("{prefix}gated_delta_net Hk2 Hv4 D128 K4 {gate:?} gate"),
        tol,
        cpu,
        gpu,
    );
}

/// The CUDA GDN paths on carried state: decode steps of 1..=8 sequences (the
/// fused decode kernel), single prefills of 1, 63, 64, 65 and 300 tokens (the
/// chunked kernels), a mixed batch, and decode after all of them; for each
/// Hv/Hk group the decode kernel has, and a head size that takes the general
/// kernels, and a shape for the general conv. The GPU side runs twice: the
/// outputs must agree bit for bit.
fn gated_delta_net_paths(c: &mut Ctx, prefix: &str, tol: f64) {
    // (1, 3, 64): rows of 518 floats, not a multiple of 4, so the conv runs
    // one channel per thread, and a Hv/Hk group no decode kernel has.
    for (hk, hv, d) in [
        (2, 4, 128),
        (4, 4, 128),
        (1, 4, 128),
        (2, 4, 64),
        (1, 3, 64),
    ] {
        let spec = gdn_spec(hk, hv, d);
        let slots = 8;
        let cache = gdn_cache(spec, slots);
        let mut steps = vec![batch(&[
            (5, 0),
            (17, 1),
            (64, 2),
            (1, 3),
            (40, 4),
            (3, 5),
            (70, 6),
            (9, 7),
        ])];
        // Decode: n sequences on slots in a shuffled order.
        for n in 1..=8u32 {
            let seqs: Vec<(usize, u32)> = (0..n).map(|i| (1, (i * 5 + n) % slots as u32)).collect();
            steps.push(batch(&seqs));
        }
        for (n, slot) in [(1, 3), (63, 1), (64, 0), (65, 5), (300, 6)] {
            steps.push(batch(&[(n, slot)]));
        }
        steps.push(batch(&[(1, 2), (130, 4), (1, 7), (64, 0), (2, 6)]));
        steps.push(batch(&(0..8).map(|i| (1, 7 - i)).collect::<Vec<_>>()));
        let inputs: Vec<Vec<f32>> = steps
            .iter()
            .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
            .collect();
        let w = random_weights(c, &spec);
        let cpu = run_layer1(&c.cpu, &spec, &cache, &steps, &inputs, &w);
        let gpu = run_twice(&c.gpu, &spec, &cache, &steps, &inputs, &w);
        c.record(
            &format!("{prefix}gdn paths Hk{hk} Hv{hv} D{d}"),
            tol,
            cpu,
            gpu,
        );
    }
}

/// Runs `steps` on GDN layer 1 of a fresh cache (all slots zeroed), one
/// output per step; layer 0's state must stay untouched.
fn run_layer1<B: Backend>(
    b: &B,
    spec: &GdnSpec,
    cache: &CacheSpec,
    steps: &[ForwardBatch],
    inputs: &[Vec<f32>],
    w: &GdnWeights<HostTensor>,
) -> Result<Outputs> {
    let w = upload(b, w)?;
    let slots = cache.num_state_slots as u32;
    let mut cache = b.new_cache(cache)?;
    for slot in 0..slots {
        b.zero_state(&mut cache, slot);
    }
    let mut outs = Vec::new();
    for (i, (batch, x)) in steps.iter().zip(inputs).enumerate() {
        let proj = b.from_host(batch.num_tokens(), spec.proj_width(), x);
        let o = b.gated_delta_net(&proj, &w, spec, &mut cache, 1, batch);
        let sizes: Vec<String> = batch
            .seqs
            .iter()
            .map(|q| q.num_tokens.to_string())
            .collect();
        outs.push(out(b, &format!("step{i} [{}]", sizes.join(",")), &o));
    }
    Ok(outs)
}

/// [`run_layer1`] twice on `b`: the two runs must agree bit for bit.
fn run_twice<B: Backend>(
    b: &B,
    spec: &GdnSpec,
    cache: &CacheSpec,
    steps: &[ForwardBatch],
    inputs: &[Vec<f32>],
    w: &GdnWeights<HostTensor>,
) -> Result<Outputs> {
    let first = run_layer1(b, spec, cache, steps, inputs, w)?;
    let again = run_layer1(b, spec, cache, steps, inputs, w)?;
    let same = first.iter().zip(&again).all(|((_, a), (_, b))| {
        a.iter()
            .map(|v| v.to_bits())
            .eq(b.iter().map(|v| v.to_bits()))
    });
    if same {
        Ok(first)
    } else {
        Err(kestrel_core::BackendError::Invalid(
            "two runs on the same input differ".into(),
        ))
    }
}

/// Long prefills through the chunked kernels: several sequences of odd
/// lengths (2,113 tokens = 33 chunks + 1 token, and others with partial last
/// chunks) in one step, decode, a second prefill that continues the carried
/// states, and decode again. One value head decays very weakly (A_log = -5,
/// a per-chunk decay around 0.7), so the state carries information across many
/// chunks and rounding in the state pass accumulates the most. The Hv/Hk
/// group is 2, as in Qwen3.6. The GPU side runs twice (bit-identical).
fn gdn_long_prefill(c: &mut Ctx, prefix: &str, tol: f64) {
    let (hk, hv, d) = (2, 4, 128);
    let spec = gdn_spec(hk, hv, d);
    let cache = gdn_cache(spec, 6);
    let decode = batch(&[(1, 4), (1, 0), (1, 5), (1, 2), (1, 1)]);
    let steps = vec![
        batch(&[(2113, 4), (1, 0), (777, 5), (1531, 2), (64, 1)]),
        decode.clone(),
        batch(&[(1000, 4), (333, 0), (65, 5), (2, 2), (129, 1)]),
        decode,
    ];
    let inputs: Vec<Vec<f32>> = steps
        .iter()
        .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
        .collect();
    let mut a_log = c.data.uniform(hv, -1.0, 2.7);
    a_log[1] = -5.0;
    let w = GdnWeights {
        conv: c.data.mat_bf16(&[spec.conv_dim(), spec.conv_kernel], 0.5),
        a_log: HostTensor::from_f32(vec![hv], &a_log),
        dt_bias: c.data.vector(hv, 0.0, 1.0),
        norm: c.data.vector(d, 1.0, 0.2),
    };
    let cpu = run_layer1(&c.cpu, &spec, &cache, &steps, &inputs, &w);
    let gpu = run_twice(&c.gpu, &spec, &cache, &steps, &inputs, &w);
    c.record(
        &format!("{prefix}gdn long prefill Hk{hk} Hv{hv} D{d}"),
        tol,
        cpu,
        gpu,
    );
}

/// Random weights for a layer of `spec`: decays `A = exp(A_log)` in (0.37,
/// 15), from mild to strong.
pub(super) fn random_weights(c: &mut Ctx, spec: &GdnSpec) -> GdnWeights<HostTensor<'static>> {
    let hv = spec.num_v_heads;
    GdnWeights {
        conv: c.data.mat_bf16(&[spec.conv_dim(), spec.conv_kernel], 0.5),
        a_log: HostTensor::from_f32(vec![hv], &c.data.uniform(hv, -1.0, 2.7)),
        dt_bias: c.data.vector(hv, 0.0, 1.0),
        norm: c.data.vector(spec.head_v_dim, 1.0, 0.2),
    }
}

/// The weights on backend `b` and a cache of `spec` with every state slot zeroed.
pub(super) fn fresh_layer<B: Backend>(
    b: &B,
    w: &GdnWeights<HostTensor>,
    spec: &CacheSpec,
) -> Result<(GdnWeights<B::Weight>, B::Cache)> {
    let w = upload(b, w)?;
    let mut cache = b.new_cache(spec)?;
    for slot in 0..spec.num_state_slots as u32 {
        b.zero_state(&mut cache, slot);
    }
    Ok((w, cache))
}

/// `got` equals `want` bit for bit, output by output (matched by name);
/// `what` names the two ways in the error.
pub(super) fn same_bits(got: &Outputs, want: &Outputs, what: &str) -> Result<()> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let by_name: std::collections::HashMap<&str, &Vec<f32>> =
        want.iter().map(|(n, v)| (n.as_str(), v)).collect();
    for (name, v) in got {
        match by_name.get(name.as_str()) {
            Some(w) if bits(v) == bits(w) => {}
            Some(_) => return Err(BackendError::Invalid(format!("{name}: {what} differ"))),
            None => {
                return Err(BackendError::Invalid(format!(
                    "{name}: no counterpart in {what}"
                )));
            }
        }
    }
    Ok(())
}

/// The layer's weights on backend `b`.
pub(super) fn upload<B: Backend>(
    b: &B,
    w: &GdnWeights<HostTensor>,
) -> Result<GdnWeights<B::Weight>> {
    Ok(GdnWeights {
        conv: b.upload(&w.conv)?,
        a_log: b.upload(&w.a_log)?,
        dt_bias: b.upload(&w.dt_bias)?,
        norm: b.upload(&w.norm)?,
    })
}

/// A layer with `hk` key heads, `hv` value heads, head dims `d` and a
/// 4-tap convolution.
pub(super) fn gdn_spec(hk: usize, hv: usize, d: usize) -> GdnSpec {
    GdnSpec {
        num_k_heads: hk,
        num_v_heads: hv,
        head_k_dim: d,
        head_v_dim: d,
        conv_kernel: 4,
        norm_eps: 1e-6,
        output_gate: Default::default(),
    }
}

/// Two GDN layers (the cases run layer 1) with `slots` state slots.
pub(super) fn gdn_cache(spec: GdnSpec, slots: usize) -> CacheSpec {
    CacheSpec {
        attn_layers: 0,
        num_blocks: 0,
        block_size: 16,
        num_kv_heads: 0,
        head_dim: 0,
        gdn_layers: 2,
        num_state_slots: slots,
        gdn: Some(spec),
    }
}

/// A step of fresh chunks, `(tokens, state slot)` each (GDN layers keep no
/// pages: the state slot carries everything).
fn batch(seqs: &[(usize, u32)]) -> ForwardBatch {
    ForwardBatch {
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
    }
}
