//! Hyper-connections: the residual is `streams` parallel copies of the
//! hidden state. Before each sublayer they are normalised per stream, gated
//! by a low-rank projection and averaged into the sublayer's input; its
//! output is added back to every stream with a learned per-stream weight.

use anyhow::Result;
use kestrel_core::flash_next::{Channels, FlashNextOps, HyperSpec};

use crate::loader::Loader;

pub struct HyperConnection<B: FlashNextOps> {
    /// Grouped RMSNorm weight, plain form (`1 + w`), `[streams * hidden]`.
    norm: Channels<B::Weight>,
    down: B::Weight,
    up: B::Weight,
    /// `None` for the final mixer, which only averages.
    inject: Option<B::Weight>,
    pub spec: HyperSpec,
}

/// A 1-D zero-centred norm weight in the plain form `1 + w`.
pub fn norm_channels<B: FlashNextOps>(
    l: &Loader<B>,
    name: &str,
    len: usize,
) -> Result<Channels<B::Weight>> {
    let host = l
        .host_f32(name, &[len])?
        .into_iter()
        .map(|w| 1.0 + w)
        .collect();
    Ok(Channels::new(l.backend, host)?)
}

impl<B: FlashNextOps> HyperConnection<B> {
    /// `p` is the module prefix, e.g. `model.language_model.layers.0.attn_hyper_connection.`.
    pub fn load(
        l: &Loader<B>,
        p: &str,
        spec: HyperSpec,
        rank: usize,
        with_inject: bool,
    ) -> Result<Self> {
        let w = spec.width();
        Ok(HyperConnection {
            norm: norm_channels(l, &format!("{p}hc_norm.weight"), w)?,
            down: l.weight(&format!("{p}input_mix_weight_down.weight"), &[rank, w])?,
            up: l.weight(&format!("{p}input_mix_weight_up.weight"), &[w, rank])?,
            inject: if with_inject {
                Some(l.weight(
                    &format!("{p}block_inject_weight.weight"),
                    &[spec.streams, w],
                )?)
            } else {
                None
            },
            spec,
        })
    }

    /// The sublayer input `[T, hidden]` of the streams `x` and, with an
    /// inject projection, its per-stream logits `[T, streams]`. The previous
    /// sublayer's output, when `pending`, is added to the streams first
    /// (in the same device pass as the norm).
    pub fn mix(
        &self,
        b: &B,
        x: &mut B::Tensor,
        pending: Option<PendingInject<B::Tensor>>,
    ) -> (B::Tensor, Option<B::Tensor>) {
        let s = &self.spec;
        let pending = pending.as_ref().map(|p| (&p.out, &p.logits));
        let (normed, inject) = b.hyper_norm(x, pending, &self.norm, self.inject.as_ref(), s);
        let mixed = b.hyper_gate_mix(&normed, &self.down, &self.up, s);
        (mixed, inject)
    }
}

/// A sublayer's output not yet added to the streams, with its inject
/// logits: the next hyper-connection adds it as it normalises them, which
/// saves a pass over the streams and two launches a sublayer.
pub struct PendingInject<T> {
    pub out: T,
    pub logits: T,
}

impl<T> PendingInject<T> {
    /// Adds the output to the streams now (before something other than a
    /// hyper-connection reads them).
    pub fn apply<B: FlashNextOps<Tensor = T>>(self, b: &B, x: &mut T, spec: &HyperSpec) {
        b.hyper_inject(x, &self.out, &self.logits, spec);
    }
}
