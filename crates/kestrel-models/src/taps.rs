//! Target feature capture: a step of the target that also hands back its
//! hidden states after chosen layers, for a drafter that reads them
//! (DFlash's context feature is the target's states after
//! `target_layer_ids`).
//!
//! The capture is a hook on the decoder's layer loop: it copies the hidden
//! state of a tapped layer and leaves the stream alone, so the logits are
//! the ones [`Decoder::step_logits`] computes, bit for bit, and models run
//! without taps never pay for it.

use kestrel_core::{Backend, ForwardBatch};

use crate::decoder::Decoder;

/// What a tapped step returns.
pub struct TappedStep<T> {
    /// Logits of the requested rows; `None` when no row was requested.
    pub logits: Option<T>,
    /// Per tap, in the order asked, `[tokens, hidden]`: the state after
    /// that layer (the residual stream plus the layer's output) of every
    /// new token of the step.
    pub taps: Vec<T>,
}

impl<B: Backend> Decoder<B> {
    /// One step over `batch` (like [`Decoder::step_logits`], or
    /// [`Decoder::forward`] when `rows` is empty) that also records the
    /// hidden states after each layer of `taps`. Not keyed for replay: the
    /// recording of a step returns one tensor.
    pub fn step_with_taps(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
        rows: &[usize],
        taps: &[usize],
    ) -> TappedStep<B::Tensor> {
        let n = self.layers.len();
        assert!(
            taps.iter().all(|&t| t < n),
            "tapped layers {taps:?} must be below the model's {n}"
        );
        let mut tapped = None;
        let mut logits = None;
        let last = b.run_step(ids, batch, cache, None, &mut |cache| {
            let ((residual, out), states) = self.forward_layers_tapped(b, ids, batch, cache, taps);
            tapped = Some(states);
            if rows.is_empty() {
                // The step's value is unused; hand back the stream.
                return residual;
            }
            logits = Some(());
            self.logits_of_sum(b, residual, out, rows)
        });
        TappedStep {
            logits: logits.map(|()| last),
            taps: tapped.expect("an unkeyed step runs its closure"),
        }
    }
}
