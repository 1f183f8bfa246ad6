//! Mixture-of-experts blocks: a few layouts, then decode-sized and
//! prefill-sized ones.

use kestrel_core::{Backend, HostTensor, MoeSpec, MoeWeights, Result};

use super::{Ctx, Outputs, TOL_MOE, out, repeatable};

pub fn moe(c: &mut Ctx) {
    let configs = [
        (
            "E16 k4 renorm shared+gate T23",
            16,
            4,
            96,
            256,
            23,
            true,
            Some(128),
            true,
        ),
        ("E8 k2 no-shared T1", 8, 2, 64, 256, 1, false, None, false),
        (
            "E32 k8 renorm shared T70",
            32,
            8,
            64,
            512,
            70,
            true,
            Some(96),
            false,
        ),
    ];
    for (label, e, k, inter, h, t, renorm, shared, shared_gate) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        let x = c.data.randn(t * h, 1.0);
        let w = random_weights(c, &spec, h, shared_gate);
        let (cpu, gpu) = (
            run_block(&c.cpu, &spec, t, h, &x, &w),
            run_block(&c.gpu, &spec, t, h, &x, &w),
        );
        c.record(&format!("moe {label}"), TOL_MOE, cpu, gpu);
    }
    moe_decode(c);
    moe_prefill(c);
}

/// Prefill-sized MoE blocks (more than 8 tokens), which route on the device
/// and run the experts as grouped tensor-core GEMMs: Qwen3.6- and Qwen3-30B-
/// like layouts scaled down at 9..2000 tokens (partial tiles, experts with
/// one token and with many), a Qwen3-Next-like 512 experts top-10 (the
/// prefill top-k's widest form), the full Qwen3.6 expert shape (H 2048, I 512,
/// 256 experts top-8, gated shared expert of 512) at 1,000 tokens (every
/// expert tile partial), two shapes whose dimensions are multiples of 8 but
/// not of 64 or 128 (row, K and N tails of the GEMM tiles), and a
/// routing skewed onto one expert that also leaves experts unpicked, and a
/// shape large enough for 128 x 256 tiles, with N and K tails. Each
/// block runs twice and the two results must be bit-identical.
///
/// Two experts whose logits differ by about the f32 rounding (~1e-6) at the
/// k-th place would be picked differently by the reference and the kernels
/// without any bug, and over thousands of tokens that becomes likely. So the
/// router weights are multiples of 2^-10 below 1/2 and, from 700 tokens on,
/// the inputs multiples of 1/4 below 8: every logit is then a multiple of
/// 2^-12 below 2^11 (H <= 512), exact in f32 whatever the summation order,
/// and ties go to the lower index in both. Above H = 512 the router weights
/// are multiples of 2^-9 below 1/4 instead: multiples of 2^-11 below 2^12
/// (H <= 2048), again within f32's 24 bits.
fn moe_prefill(c: &mut Ctx) {
    // (label, E, k, I, H, renormalise, shared I, shared gate, skewed)
    type Config = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
        bool,
        bool,
    );
    let configs: [(Config, &[usize]); 8] = [
        (
            (
                "3.6-like E64 k8 renorm shared+gate",
                64,
                8,
                128,
                512,
                true,
                Some(128),
                true,
                false,
            ),
            &[9, 100, 700, 2000],
        ),
        (
            (
                "30B-like E32 k4 I192 renorm",
                32,
                4,
                192,
                256,
                true,
                None,
                false,
                false,
            ),
            &[9, 100, 700, 2000],
        ),
        (
            // More than 256 experts: the prefill top-k's widest form (16 slots a lane).
            (
                "Next-like E512 k10 I64 H128 renorm shared Is64+gate",
                512,
                10,
                64,
                128,
                true,
                Some(64),
                true,
                false,
            ),
            &[200],
        ),
        (
            (
                "tails E20 k3 I40 H200 shared Is24+gate",
                20,
                3,
                40,
                200,
                false,
                Some(24),
                true,
                false,
            ),
            &[130],
        ),
        (
            (
                "tails E24 k6 I168 H328 renorm shared Is136+gate",
                24,
                6,
                168,
                328,
                true,
                Some(136),
                true,
                false,
            ),
            &[300, 1100],
        ),
        (
            (
                "Qwen3.6 E256 k8 I512 renorm shared Is512+gate",
                256,
                8,
                512,
                2048,
                true,
                Some(512),
                true,
                false,
            ),
            &[1000],
        ),
        (
            (
                "skewed E64 k4 shared+gate",
                64,
                4,
                128,
                256,
                false,
                Some(64),
                true,
                true,
            ),
            &[700, 2000],
        ),
        (
            // 128-row tiles, enough of them for the 128 x 256 gate_up tiles
            // on an H200 (two blocks per SM; down keeps 128 x 128), routed
            // and shared, with N and K tails: I and H not multiples of 128
            // or 64.
            (
                "wide E16 k4 I1000 H264 shared Is2304+gate",
                16,
                4,
                1000,
                264,
                true,
                Some(2304),
                true,
                false,
            ),
            &[2048],
        ),
    ];
    for ((label, e, k, inter, h, renorm, shared, shared_gate, skewed), tokens) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        // Skewed: inputs get a positive offset and the router a constant
        // component along it, large for expert 3 (picked by nearly every
        // token) and negative for the last 3/8 of the experts (never picked).
        let mut router = c.data.randn(e * h, 0.1);
        if skewed {
            for (row, r) in router.chunks_exact_mut(h).enumerate() {
                let bias = match row {
                    3 => 0.05,
                    _ if row >= e * 5 / 8 => -0.05,
                    _ => 0.0,
                };
                r.iter_mut().for_each(|v| *v += bias);
            }
        }
        assert!(h <= 2048, "the exact-logit argument above covers H <= 2048");
        let (steps, top) = if h <= 512 {
            (1024.0, 511.0)
        } else {
            (512.0, 127.0)
        };
        for v in &mut router {
            *v = ((*v * steps).round() / steps).clamp(-top / steps, top / steps);
        }
        let w = MoeWeights {
            router: crate::data::bf16_tensor(&[e, h], &router),
            gate_up: c.data.mat_bf16(&[e, 2 * inter, h], 0.06),
            down: c.data.mat_bf16(&[e, h, inter], 0.1),
            shared_gate_up: shared.map(|si| c.data.mat_bf16(&[2 * si, h], 0.06)),
            shared_down: shared.map(|si| c.data.mat_bf16(&[h, si], 0.1)),
            shared_gate: shared_gate.then(|| c.data.mat_bf16(&[1, h], 0.1)),
        };
        for &t in tokens {
            let offset = if skewed { 0.5 } else { 0.0 };
            let exact = t >= 700;
            let x: Vec<f32> = c
                .data
                .randn(t * h, 1.0)
                .into_iter()
                .map(|v| v + offset)
                .map(|v| {
                    if exact {
                        ((v * 4.0).round() / 4.0).clamp(-7.75, 7.75)
                    } else {
                        v
                    }
                })
                .collect();
            let (cpu, gpu) = (
                run_twice(&c.cpu, &spec, t, h, &x, &w),
                run_twice(&c.gpu, &spec, t, h, &x, &w),
            );
            c.record(&format!("moe prefill {label} H{h} T{t}"), TOL_MOE, cpu, gpu);
        }
    }
}

/// Decode-sized MoE blocks (1..8 tokens), which route on the device: Qwen3.6-
/// and Qwen3-30B-like layouts scaled down, with and without the shared expert,
/// its gate and renormalisation, a shared expert wider or narrower than the
/// routed ones, and a Qwen3-Next-like 512 experts with 10 picks. `moe_gate_up`
/// routes each token itself, so the expert counts also cover its routing's
/// shapes: Qwen3.6's 256 experts with 8 picks and a gated shared expert (at a
/// small H), counts that are not multiples of 32 (20, 48, 300), more experts
/// than the block has threads (300 with 4 picks), where threads take several
/// experts; and the full 2,048-wide rows and expert sizes of Qwen3.6 and
/// Qwen3-30B at one and two tokens.
fn moe_decode(c: &mut Ctx) {
    type Config = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
        bool,
    );
    let configs: [(Config, &[usize]); 10] = [
        (
            (
                "3.6-like E64 k8 renorm shared+gate",
                64,
                8,
                128,
                512,
                true,
                Some(128),
                true,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "3.6-like E64 k8 shared Is192",
                64,
                8,
                128,
                512,
                false,
                Some(192),
                false,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "30B-like E32 k8 I192 renorm",
                32,
                8,
                192,
                512,
                true,
                None,
                false,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "E48 k4 shared Is64+gate",
                48,
                4,
                160,
                256,
                false,
                Some(64),
                true,
            ),
            &[1, 8],
        ),
        (
            (
                "next-like E512 k10 shared+gate",
                512,
                10,
                64,
                256,
                true,
                Some(64),
                true,
            ),
            &[3],
        ),
        (
            (
                "3.6-like E256 k8 renorm shared+gate",
                256,
                8,
                64,
                256,
                true,
                Some(64),
                true,
            ),
            &[1, 2, 8],
        ),
        (
            ("E300 k4 renorm", 300, 4, 64, 128, true, None, false),
            &[1, 5],
        ),
        (
            ("E20 k3 shared Is24", 20, 3, 40, 200, false, Some(24), false),
            &[1, 4],
        ),
        // The real models' rows and expert sizes (fewer experts).
        (
            (
                "3.6 rows E64 k8 renorm shared+gate",
                64,
                8,
                512,
                2048,
                true,
                Some(512),
                true,
            ),
            &[1, 2],
        ),
        (
            (
                "30B rows E32 k8 renorm",
                32,
                8,
                768,
                2048,
                true,
                None,
                false,
            ),
            &[1, 2],
        ),
    ];
    for ((label, e, k, inter, h, renorm, shared, shared_gate), tokens) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        let w = random_weights(c, &spec, h, shared_gate);
        for &t in tokens {
            let x = c.data.randn(t * h, 1.0);
            let (cpu, gpu) = (
                run_twice(&c.cpu, &spec, t, h, &x, &w),
                run_twice(&c.gpu, &spec, t, h, &x, &w),
            );
            c.record(&format!("moe decode {label} H{h} T{t}"), TOL_MOE, cpu, gpu);
        }
    }
}

/// One MoE block over `t` tokens of width `h` on backend `b`.
pub(super) fn run_block<B: Backend>(
    b: &B,
    spec: &MoeSpec,
    t: usize,
    h: usize,
    x: &[f32],
    w: &MoeWeights<HostTensor>,
) -> Result<Outputs> {
    let w = upload(b, w)?;
    Ok(vec![out(b, "out", &b.moe(&b.from_host(t, h, x), &w, spec))])
}

/// The block's weights on backend `b`.
pub(super) fn upload<B: Backend>(
    b: &B,
    w: &MoeWeights<HostTensor>,
) -> Result<MoeWeights<B::Weight>> {
    let up = |o: &Option<HostTensor>| o.as_ref().map(|t| b.upload(t)).transpose();
    Ok(MoeWeights {
        router: b.upload(&w.router)?,
        gate_up: b.upload(&w.gate_up)?,
        down: b.upload(&w.down)?,
        shared_gate_up: up(&w.shared_gate_up)?,
        shared_down: up(&w.shared_down)?,
        shared_gate: up(&w.shared_gate)?,
    })
}

/// The block on `x` twice: the output, which must repeat bit for bit.
fn run_twice<B: Backend>(
    b: &B,
    spec: &MoeSpec,
    t: usize,
    h: usize,
    x: &[f32],
    w: &MoeWeights<HostTensor>,
) -> Result<Outputs> {
    let w = upload(b, w)?;
    let xt = b.from_host(t, h, x);
    let first = b.to_host(&b.moe(&xt, &w, spec));
    let again = b.to_host(&b.moe(&xt, &w, spec));
    Ok(vec![repeatable("out", first, again)?])
}

/// Random bf16 weights of a block (drawn in a fixed order: router, experts,
/// shared expert, its gate).
pub(super) fn random_weights(
    c: &mut Ctx,
    spec: &MoeSpec,
    h: usize,
    gated: bool,
) -> MoeWeights<HostTensor<'static>> {
    let (e, inter, shared) = (
        spec.num_experts,
        spec.intermediate,
        spec.shared_intermediate,
    );
    MoeWeights {
        router: c.data.mat_bf16(&[e, h], 0.1),
        gate_up: c.data.mat_bf16(&[e, 2 * inter, h], 0.06),
        down: c.data.mat_bf16(&[e, h, inter], 0.1),
        shared_gate_up: shared.map(|si| c.data.mat_bf16(&[2 * si, h], 0.06)),
        shared_down: shared.map(|si| c.data.mat_bf16(&[h, si], 0.1)),
        shared_gate: gated.then(|| c.data.mat_bf16(&[1, h], 0.1)),
    }
}
