//! Gated DeltaNet (linear attention): one fused input projection, the
//! backend's conv + delta-rule recurrence + gated norm, `out_proj`.

use anyhow::Result;
use kestrel_core::{Backend, ForwardBatch, GdnSpec, GdnWeights, HostWeight, PreNorm};

use crate::config::{Arch, ModelConfig};
use crate::loader::Loader;
use crate::transform;

pub struct GatedDeltaNet<B: Backend> {
    in_proj: B::Weight,
    out_proj: B::Weight,
    weights: GdnWeights<B::Weight>,
    pub spec: GdnSpec,
    cache_layer: usize,
}

pub fn gdn_spec(cfg: &ModelConfig) -> Option<GdnSpec> {
    let la = cfg.linear_attn.as_ref()?;
    Some(GdnSpec {
        num_k_heads: la.num_k_heads,
        num_v_heads: la.num_v_heads,
        head_k_dim: la.head_k_dim,
        head_v_dim: la.head_v_dim,
        conv_kernel: la.conv_kernel,
        norm_eps: cfg.rms_norm_eps,
        output_gate: la.output_gate,
    })
}

impl<B: Backend> GatedDeltaNet<B> {
    /// `p` is the module prefix, e.g. `model.layers.0.linear_attn.`.
    pub fn load(l: &Loader<B>, p: &str, cfg: &ModelConfig, cache_layer: usize) -> Result<Self> {
        let spec = gdn_spec(cfg).expect("hybrid config has linear attention");
        let h = cfg.hidden_size;
        let (conv, vw, hv) = (spec.conv_dim(), spec.value_width(), spec.num_v_heads);
        let in_proj = if cfg.arch == Arch::Qwen3Next {
            Self::in_proj_from_next(l, p, &spec, h)?
        } else {
            let names = ["qkv", "z", "b", "a"].map(|x| format!("{p}in_proj_{x}.weight"));
            l.stacked(
                &format!("{p}in_proj"),
                &[
                    (&names[0], &[conv, h]),
                    (&names[1], &[vw, h]),
                    (&names[2], &[hv, h]),
                    (&names[3], &[hv, h]),
                ],
            )?
        };
        let conv_name = format!("{p}conv1d.weight");
        let conv_w = l.materialize(&conv_name, &[conv, spec.conv_kernel], || {
            let w = l.tensor(&conv_name, &[conv, 1, spec.conv_kernel])?;
            transform::reshape(w, &[conv, spec.conv_kernel])
        })?;
        Ok(GatedDeltaNet {
            in_proj,
            out_proj: l.weight(&format!("{p}out_proj.weight"), &[h, vw])?,
            weights: GdnWeights {
                conv: conv_w,
                a_log: l.vector_f32(&format!("{p}A_log"), hv)?,
                dt_bias: l.vector_f32(&format!("{p}dt_bias"), hv)?,
                // The gated norm inside DeltaNet keeps the plain weight.
                norm: l.vector_f32(&format!("{p}norm.weight"), spec.head_v_dim)?,
            },
            spec,
            cache_layer,
        })
    }

    /// Qwen3-Next fuses the projections per key head:
    /// `in_proj_qkvz` rows are, for each key head, `[q (Dk) | k (Dk) | v (r*Dv) | z (r*Dv)]`
    /// and `in_proj_ba` rows `[b (r) | a (r)]`, with `r = Hv / Hk`. Regroup them
    /// into `[q | k | v | z | b | a]`, each in head order: one weight, or,
    /// when qkvz is block-FP8 and ba is not (an FP8 checkpoint), the two
    /// regrouped apart and stacked by the backend, as [`Loader::stacked`].
    fn in_proj_from_next(l: &Loader<B>, p: &str, s: &GdnSpec, h: usize) -> Result<B::Weight> {
        let (hk, dk, dv) = (s.num_k_heads, s.head_k_dim, s.head_v_dim);
        let r = s.num_v_heads / hk;
        let group = 2 * dk + 2 * r * dv;
        let (qkvz_name, ba_name) = (
            format!("{p}in_proj_qkvz.weight"),
            format!("{p}in_proj_ba.weight"),
        );
        let (qkvz_shape, ba_shape) = ([hk * group, h], [hk * 2 * r, h]);
        let pick = |offset: usize, len: usize, stride: usize| -> Vec<usize> {
            (0..hk)
                .flat_map(|g| (g * stride + offset)..(g * stride + offset + len))
                .collect()
        };
        let mut qkvz_order = pick(0, dk, group);
        qkvz_order.extend(pick(dk, dk, group));
        qkvz_order.extend(pick(2 * dk, r * dv, group));
        qkvz_order.extend(pick(2 * dk + r * dv, r * dv, group));
        let mut ba_order = pick(0, r, 2 * r);
        ba_order.extend(pick(r, r, 2 * r));
        let qkvz = || -> Result<HostWeight<'static>> {
            Ok(transform::gather_rows(
                &l.tensor(&qkvz_name, &qkvz_shape)?,
                &qkvz_order,
            ))
        };
        let ba = || -> Result<HostWeight<'static>> {
            Ok(transform::gather_rows(
                &l.tensor(&ba_name, &ba_shape)?,
                &ba_order,
            ))
        };
        if l.is_fp8(&qkvz_name, &qkvz_shape) == l.is_fp8(&ba_name, &ba_shape) {
            return l.materialize(&format!("{p}in_proj"), &[s.proj_width(), h], || {
                transform::concat_rows(&[qkvz()?, ba()?])
            });
        }
        let parts = vec![
            l.materialize(&qkvz_name, &qkvz_shape, qkvz)?,
            l.materialize(&ba_name, &ba_shape, ba)?,
        ];
        l.stack_weights(&format!("{p}in_proj"), parts)
    }

    pub fn forward(
        &self,
        b: &B,
        x: PreNorm<'_, B::Tensor, B::Weight>,
        cache: &mut B::Cache,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let proj = b.norm_matmul(x, &self.in_proj);
        self.run_projection(b, &proj, cache, batch)
    }

    /// The block on an input that is already normalised (Flash-Next's
    /// hyper-connections form it).
    pub fn forward_input(
        &self,
        b: &B,
        x: &B::Tensor,
        cache: &mut B::Cache,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let proj = b.matmul(x, &self.in_proj);
        self.run_projection(b, &proj, cache, batch)
    }

    fn run_projection(
        &self,
        b: &B,
        proj: &B::Tensor,
        cache: &mut B::Cache,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let out = b.gated_delta_net(
            proj,
            &self.weights,
            &self.spec,
            cache,
            self.cache_layer,
            batch,
        );
        b.matmul(&out, &self.out_proj)
    }
}
