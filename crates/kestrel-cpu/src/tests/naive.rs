//! Straightforward f64 implementations of each operation, written from the
//! transformers formulas without any of the optimisations of the backend, used
//! as independent references.

use kestrel_core::{AttentionSpec, GdnSpec, MoeSpec};

pub fn matmul(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|l| x[i * k + l] as f64 * w[j * k + l] as f64)
                .sum();
        }
    }
    out
}

pub fn rms_norm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, &wi)| v * inv * wi as f64)
        .collect()
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

pub fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

fn rope(x: &mut [f64], pos: usize, theta: f32, rot: usize) {
    let half = rot / 2;
    for j in 0..half {
        let inv = 1.0 / (theta as f64).powf(2.0 * j as f64 / rot as f64);
        let (c, s) = ((pos as f64 * inv).cos(), (pos as f64 * inv).sin());
        let (a, b) = (x[j], x[j + half]);
        x[j] = a * c - b * s;
        x[j + half] = b * c + a * s;
    }
}

/// Causal attention of one whole sequence (all positions in `proj [T, width]`)
/// over contiguous K/V; returns `[T, Hq*D]`.
pub fn attention(proj: &[f32], q_norm: &[f32], k_norm: &[f32], spec: &AttentionSpec) -> Vec<f32> {
    let (hq, hkv, d) = (spec.num_q_heads, spec.num_kv_heads, spec.head_dim);
    let width = spec.proj_width();
    let t_len = proj.len() / width;
    let qw = hq * d;
    let (gate_col, k_col) = if spec.output_gate {
        (qw, 2 * qw)
    } else {
        (0, qw)
    };
    let v_col = k_col + hkv * d;
    let head = |t: usize, col: usize, h: usize| -> Vec<f64> {
        proj[t * width + col + h * d..t * width + col + (h + 1) * d]
            .iter()
            .map(|&v| v as f64)
            .collect()
    };
    let mut keys = vec![vec![Vec::new(); t_len]; hkv];
    for (h, kh) in keys.iter_mut().enumerate() {
        for (t, kt) in kh.iter_mut().enumerate() {
            let mut k = rms_norm(&head(t, k_col, h), k_norm, spec.norm_eps);
            rope(&mut k, t, spec.rope.theta, spec.rope.rotary_dim);
            *kt = k;
        }
    }
    let mut out = vec![0.0f32; t_len * qw];
    for t in 0..t_len {
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let mut q = rms_norm(&head(t, 0, h), q_norm, spec.norm_eps);
            rope(&mut q, t, spec.rope.theta, spec.rope.rotary_dim);
            let scores: Vec<f64> = (0..=t)
                .map(|j| {
                    q.iter().zip(&keys[kvh][j]).map(|(a, b)| a * b).sum::<f64>() * spec.scale as f64
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..d {
                let mut o: f64 = (0..=t).map(|j| e[j] / z * head(j, v_col, kvh)[c]).sum();
                if spec.output_gate {
                    o *= sigmoid(proj[t * width + gate_col + h * d + c] as f64);
                }
                out[t * qw + h * d + c] = o as f32;
            }
        }
    }
    out
}

/// Dense MoE: every expert evaluated for every token, weighted by the
/// (renormalised) top-k softmax probability or zero.
#[allow(clippy::too_many_arguments)]
pub fn moe(
    x: &[f32],
    h: usize,
    spec: &MoeSpec,
    router: &[f32],
    gate_up: &[f32],
    down: &[f32],
    shared: Option<(&[f32], &[f32], usize)>,
    shared_gate: Option<&[f32]>,
) -> Vec<f32> {
    let t_len = x.len() / h;
    let (ne, i) = (spec.num_experts, spec.intermediate);
    let mlp = |xt: &[f32], gu: &[f32], dn: &[f32], inter: usize| -> Vec<f64> {
        let g = matmul(xt, 1, h, gu, 2 * inter);
        let act: Vec<f32> = (0..inter)
            .map(|c| (silu(g[c]) * g[inter + c]) as f32)
            .collect();
        matmul(&act, 1, inter, dn, h)
    };
    let mut out = vec![0.0f32; t_len * h];
    for t in 0..t_len {
        let xt = &x[t * h..(t + 1) * h];
        let logits = matmul(xt, 1, h, router, ne);
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
        let probs: Vec<f64> = logits.iter().map(|l| (l - max).exp() / z).collect();
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..spec.top_k];
        let total: f64 = chosen.iter().map(|&e| probs[e]).sum();
        let mut acc = vec![0.0f64; h];
        for e in 0..ne {
            let weight = if chosen.contains(&e) {
                if spec.norm_topk_prob {
                    probs[e] / total
                } else {
                    probs[e]
                }
            } else {
                0.0
            };
            let y = mlp(
                xt,
                &gate_up[e * 2 * i * h..(e + 1) * 2 * i * h],
                &down[e * h * i..(e + 1) * h * i],
                i,
            );
            for c in 0..h {
                acc[c] += weight * y[c];
            }
        }
        if let Some((sgu, sdn, si)) = shared {
            let y = mlp(xt, sgu, sdn, si);
            let g = shared_gate.map_or(1.0, |sg| sigmoid(matmul(xt, 1, h, sg, 1)[0]));
            for c in 0..h {
                acc[c] += g * y[c];
            }
        }
        for c in 0..h {
            out[t * h + c] = acc[c] as f32;
        }
    }
    out
}

/// Weights of a GDN layer in plain vectors.
pub struct GdnParams<'a> {
    pub conv: &'a [f32],
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
    pub norm: &'a [f32],
}

/// A whole GDN layer over one fresh sequence `proj [T, width]`, token by token
/// in f64. Returns the output `[T, Hv*Dv]` and the final state `[Hv, Dk, Dv]`.
pub fn gdn(proj: &[f32], p: &GdnParams, spec: &GdnSpec) -> (Vec<f32>, Vec<f64>) {
    let (hk, hv, dk, dv, kern) = (
        spec.num_k_heads,
        spec.num_v_heads,
        spec.head_k_dim,
        spec.head_v_dim,
        spec.conv_kernel,
    );
    let width = spec.proj_width();
    let cd = spec.conv_dim();
    let t_len = proj.len() / width;
    // Conv with zero left padding, then SiLU.
    let mut mixed = vec![0.0f64; t_len * cd];
    for t in 0..t_len {
        for c in 0..cd {
            let mut s = 0.0;
            for j in 0..kern {
                let src = t as isize + j as isize - (kern as isize - 1);
                if src >= 0 {
                    s += p.conv[c * kern + j] as f64 * proj[src as usize * width + c] as f64;
                }
            }
            mixed[t * cd + c] = silu(s);
        }
    }
    let l2 = |x: &[f64]| -> Vec<f64> {
        let n = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|v| v * n).collect()
    };
    let mut state = vec![0.0f64; hv * dk * dv];
    let mut out = vec![0.0f32; t_len * hv * dv];
    for t in 0..t_len {
        let m = &mixed[t * cd..(t + 1) * cd];
        let row = &proj[t * width..(t + 1) * width];
        for h in 0..hv {
            let kh = h / (hv / hk);
            let q: Vec<f64> = l2(&m[kh * dk..(kh + 1) * dk])
                .iter()
                .map(|v| v / (dk as f64).sqrt())
                .collect();
            let k = l2(&m[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
            let v = &m[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let beta = sigmoid(row[cd + hv * dv + h] as f64);
            let a = row[cd + hv * dv + hv + h] as f64 + p.dt_bias[h] as f64;
            let softplus = if a > 20.0 { a } else { a.exp().ln_1p() };
            let g = -(p.a_log[h] as f64).exp() * softplus;
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            for x in s.iter_mut() {
                *x *= g.exp();
            }
            let mut o = vec![0.0f64; dv];
            for j in 0..dv {
                let kv: f64 = (0..dk).map(|i| s[i * dv + j] * k[i]).sum();
                let delta = (v[j] - kv) * beta;
                for i in 0..dk {
                    s[i * dv + j] += k[i] * delta;
                }
                o[j] = (0..dk).map(|i| s[i * dv + j] * q[i]).sum();
            }
            let ms = o.iter().map(|x| x * x).sum::<f64>() / dv as f64;
            let inv = 1.0 / (ms + spec.norm_eps as f64).sqrt();
            for j in 0..dv {
                let z = row[cd + h * dv + j] as f64;
                out[t * hv * dv + h * dv + j] = (p.norm[j] as f64 * o[j] * inv * silu(z)) as f32;
            }
        }
    }
    (out, state)
}
