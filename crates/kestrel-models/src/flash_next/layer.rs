//! One Flash-Next decoder layer: PLE (on some GDN layers), then the mixer
//! (Gated DeltaNet or QSA sparse attention) and the MoE, each between a
//! hyper-connection that forms its input from the streams and one that adds
//! its output back.

use anyhow::Result;
use kestrel_core::flash_next::{FlashNextOps, HyperSpec, QsaNorms, QsaSpec};
use kestrel_core::{ForwardBatch, MoeSpec, MoeWeights, RopeSpec};

use super::cache::Pools;
use super::config::FlashNextConfig;
use super::hyper::{HyperConnection, PendingInject, norm_channels};
use super::ple::Ple;
use crate::blocks::{Attention, FeedForward, GatedDeltaNet};
use crate::config::LayerKind;
use crate::loader::Loader;

/// Attention whose keys are chosen per query by the QSA indexer.
pub struct SparseAttention<B: FlashNextOps> {
    attn: Attention<B>,
    index_proj: B::Weight,
    norms: QsaNorms<B::Weight>,
    spec: QsaSpec,
}

impl<B: FlashNextOps> SparseAttention<B> {
    fn load(l: &Loader<B>, p: &str, cfg: &FlashNextConfig, cache_layer: usize) -> Result<Self> {
        let q = &cfg.qsa;
        let attn = Attention::load(l, p, &cfg.base, cache_layer)?;
        let spec = QsaSpec {
            num_heads: q.num_heads,
            head_dim: q.head_dim,
            budget: q.budget,
            compress_ratio: q.compress_ratio,
            rope: RopeSpec {
                theta: cfg.base.rope_theta,
                rotary_dim: cfg.base.rotary_dim,
            },
            eps: cfg.base.rms_norm_eps,
        };
        let ip = format!("{p}indexer.");
        Ok(SparseAttention {
            index_proj: l.weight(
                &format!("{ip}index_qk_proj.weight"),
                &[spec.proj_width(), cfg.base.hidden_size],
            )?,
            norms: QsaNorms {
                q: norm_channels(l, &format!("{ip}q_layernorm.weight"), q.head_dim)?,
                k: norm_channels(l, &format!("{ip}k_layernorm.weight"), q.head_dim)?,
            },
            attn,
            spec,
        })
    }

    fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        base: &mut B::Cache,
        pools: &mut Pools<'_, B>,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let layer = self.attn.cache_layer;
        let index = b.matmul(x, &self.index_proj);
        let selection = b.qsa_select(
            &index,
            &self.norms,
            &self.spec,
            &mut pools.indexer_keys[layer],
            pools.block_size,
            batch,
        );
        let proj = b.matmul(x, &self.attn.proj);
        let out = b.sparse_attention(
            &proj,
            &self.attn.weights,
            &self.attn.spec,
            base,
            layer,
            batch,
            &selection,
        );
        b.matmul(&out, &self.attn.o_proj)
    }
}

pub enum Mixer<B: FlashNextOps> {
    Sparse(SparseAttention<B>),
    GatedDeltaNet(GatedDeltaNet<B>),
}

pub struct FlashNextLayer<B: FlashNextOps> {
    pub ple: Option<Ple<B>>,
    attn_hc: HyperConnection<B>,
    mixer: Mixer<B>,
    mlp_hc: HyperConnection<B>,
    moe: (MoeWeights<B::Weight>, MoeSpec),
}

impl<B: FlashNextOps> FlashNextLayer<B> {
    /// `p` is the layer prefix; `cache_layer` its index among the cache
    /// layers of its kind.
    pub fn load(
        l: &Loader<B>,
        p: &str,
        cfg: &FlashNextConfig,
        kind: LayerKind,
        cache_layer: usize,
        hyper: HyperSpec,
        ple: Option<Ple<B>>,
    ) -> Result<Self> {
        let mixer = match kind {
            LayerKind::FullAttention => Mixer::Sparse(SparseAttention::load(
                l,
                &format!("{p}self_attn."),
                cfg,
                cache_layer,
            )?),
            LayerKind::LinearAttention => Mixer::GatedDeltaNet(GatedDeltaNet::load(
                l,
                &format!("{p}linear_attn."),
                &cfg.base,
                cache_layer,
            )?),
        };
        let moe_cfg = cfg
            .base
            .moe
            .as_ref()
            .expect("qwen4_exp is MoE in every layer");
        let moe =
            match FeedForward::load_moe(l, &format!("{p}mlp."), cfg.base.hidden_size, moe_cfg)? {
                FeedForward::Moe { weights, spec } => (weights, spec),
                FeedForward::Dense { .. } => unreachable!("load_moe builds the MoE"),
            };
        let rank = cfg.hc_lowrank;
        Ok(FlashNextLayer {
            ple,
            attn_hc: HyperConnection::load(
                l,
                &format!("{p}attn_hyper_connection."),
                hyper,
                rank,
                true,
            )?,
            mixer,
            mlp_hc: HyperConnection::load(
                l,
                &format!("{p}mlp_hyper_connection."),
                hyper,
                rank,
                true,
            )?,
            moe,
        })
    }

    /// The layer on the streams `x` (`[T, streams * hidden]`), in place,
    /// except for its last sublayer's output: that is left in `pending` for
    /// the next hyper-connection to add (as the previous layer's was).
    /// A PLE layer reads its module's embeddings of the new tokens from
    /// `pools.ple_input`.
    pub fn forward(
        &self,
        b: &B,
        x: &mut B::Tensor,
        pending: &mut Option<PendingInject<B::Tensor>>,
        base: &mut B::Cache,
        pools: &mut Pools<'_, B>,
        batch: &ForwardBatch,
    ) {
        if let Some(ple) = &self.ple {
            if let Some(p) = pending.take() {
                p.apply(b, x, &self.attn_hc.spec);
            }
            let i = ple.state_index;
            ple.forward(b, x, pools.ple_input[i], &mut pools.ple_conv[i], batch);
        }
        let (input, logits) = self.attn_hc.mix(b, x, pending.take());
        let out = match &self.mixer {
            Mixer::Sparse(a) => a.forward(b, &input, base, pools, batch),
            Mixer::GatedDeltaNet(g) => g.forward_input(b, &input, base, batch),
        };
        let logits = logits.expect("layer hyper-connections inject");
        let (input, logits) = self.mlp_hc.mix(b, x, Some(PendingInject { out, logits }));
        let out = b.moe(&input, &self.moe.0, &self.moe.1);
        let logits = logits.expect("layer hyper-connections inject");
        *pending = Some(PendingInject { out, logits });
    }
}
