//! The operations Qwen3.8-Flash-Next (`qwen4_exp`) adds to the Qwen3.5 set:
//! four-stream hyper-connections, the PLE (hashed n-gram) gate with its
//! dilated causal conv, and QSA block-sparse attention chosen by a learned
//! indexer.
//!
//! They live in their own trait so that the other architectures' backend
//! surface stays as it is. Every method has a default that computes on the
//! host through [`Backend::to_host`] / [`Backend::from_host`] with the
//! functions of [`host`]: correct on any backend, and slow on a GPU (each call
//! copies its activations both ways). The CPU backend runs the same functions
//! on its data without the copies. Small per-channel parameters (norm weights,
//! conv taps) come as [`Channels`]: host values for the host functions and a
//! backend weight for device kernels.

pub mod host;
pub mod selection;
pub mod topk;

use std::ops::Range;

use crate::{AttentionSpec, AttentionWeights, Backend, ForwardBatch, RopeSpec};

/// A per-channel parameter (a norm weight in plain form, conv taps): its
/// values on the host, which the host implementations read, and the same
/// values as a backend weight (a 1-D f32 vector), which device kernels read.
#[derive(Clone, Debug, PartialEq)]
pub struct Channels<W> {
    pub host: Vec<f32>,
    pub weight: W,
}

impl<W> Channels<W> {
    /// `host` with its backend copy.
    pub fn new<B: Backend<Weight = W>>(b: &B, host: Vec<f32>) -> crate::Result<Self> {
        let weight = b.upload(&crate::HostTensor::from_f32(vec![host.len()], &host))?;
        Ok(Channels { host, weight })
    }
}

/// An in-place edit of some rows of a state pool (`FlashNextOps::edit_rows`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowEdit {
    /// The rows set to zero.
    Zero(Range<usize>),
    /// Rows `src` copied to the rows from `dst` on (the ranges do not overlap).
    Copy { src: Range<usize>, dst: usize },
}

/// Hyper-connection sizes: `streams` residual streams of `hidden` features,
/// stored side by side in rows of `streams * hidden`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperSpec {
    pub streams: usize,
    pub hidden: usize,
    pub eps: f32,
}

impl HyperSpec {
    pub fn width(&self) -> usize {
        self.streams * self.hidden
    }
}

/// The learned indexer of QSA sparse attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QsaSpec {
    /// Query heads of the indexer; it has one key head.
    pub num_heads: usize,
    pub head_dim: usize,
    /// Tokens kept from complete blocks per query (`budget / compress_ratio` blocks).
    pub budget: usize,
    /// Consecutive positions mean-pooled into one block key.
    pub compress_ratio: usize,
    /// The attention layer's RoPE (its rotary dims fit inside `head_dim`).
    pub rope: RopeSpec,
    pub eps: f32,
}

impl QsaSpec {
    pub fn top_blocks(&self) -> usize {
        self.budget / self.compress_ratio
    }
    /// Columns of the indexer projection: `[q (heads * D) | key (D)]`.
    pub fn proj_width(&self) -> usize {
        (self.num_heads + 1) * self.head_dim
    }
}

/// One attention layer's indexer store, rows addressed through the block
/// tables: `raw` holds every paged position's key (`[pages * block_size,
/// head_dim]`), `pooled` every complete block's pooled, normalised and
/// rotated key (`[pages * block_size / compress_ratio, head_dim]`), written
/// when the block's last position is. Both follow the pages, so a prefix
/// cache that shares pages shares them; a rejected draft that completed a
/// block leaves a key that the accepted token at that position rewrites.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerKeys<T> {
    pub raw: T,
    pub pooled: T,
}

impl QsaSpec {
    /// Row of `pooled` holding block `b` of a sequence with `block_table`.
    pub fn pooled_row(&self, block_table: &[u32], block_size: usize, b: usize) -> usize {
        let first = b * self.compress_ratio;
        block_table[first / block_size] as usize * (block_size / self.compress_ratio)
            + first % block_size / self.compress_ratio
    }
}

/// Plain-form norm weights of the indexer (`1 + w` already added).
#[derive(Clone, Debug, PartialEq)]
pub struct QsaNorms<W> {
    pub q: Channels<W>,
    pub k: Channels<W>,
}

/// For every new token of a batch, the cache positions its attention reads:
/// whole blocks of `ratio` positions, then the token's incomplete tail
/// block (`complete * ratio ..= position`, empty when the token completes a
/// block). Kept as blocks, not positions: a long prefill has thousands of
/// tokens each reading `budget` positions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenSelection {
    /// Positions per block (the indexer's compress ratio).
    pub ratio: usize,
    pub tokens: Vec<SelectedBlocks>,
}

/// One token's selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectedBlocks {
    pub position: u32,
    /// The complete blocks it reads, ascending; `None`: all of them.
    pub blocks: Option<Vec<u32>>,
}

impl SelectedBlocks {
    /// Blocks wholly at or before the token: `(position + 1) / ratio`.
    pub fn complete(&self, ratio: usize) -> usize {
        (self.position as usize + 1) / ratio
    }

    /// The positions it reads, ascending.
    pub fn positions(&self, ratio: usize) -> Vec<u32> {
        let complete = self.complete(ratio);
        let tail = (complete * ratio) as u32..=self.position;
        match &self.blocks {
            None => (0..=self.position).collect(),
            Some(blocks) => blocks
                .iter()
                .flat_map(|&b| b * ratio as u32..(b + 1) * ratio as u32)
                .chain(tail)
                .collect(),
        }
    }
}

impl TokenSelection {
    /// Whether every token reads all of `0 ..= its position` (then sparse
    /// attention is ordinary causal attention).
    pub fn is_dense(&self) -> bool {
        self.tokens.iter().all(|t| t.blocks.is_none())
    }

    /// The positions each token reads, ascending.
    pub fn positions(&self) -> Vec<Vec<u32>> {
        self.tokens
            .iter()
            .map(|t| t.positions(self.ratio))
            .collect()
    }
}

/// The host values of [`QsaNorms`], for the host implementations.
pub struct HostQsaNorms<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
}

impl<W> QsaNorms<W> {
    pub fn host(&self) -> HostQsaNorms<'_> {
        HostQsaNorms {
            q: &self.q.host,
            k: &self.k.host,
        }
    }
}

/// The host values of [`PleParams`], for the host implementations.
pub struct HostPleParams<'a> {
    pub norm_key: &'a [f32],
    pub norm_query: &'a [f32],
    pub norm_conv: &'a [f32],
    pub conv: &'a [f32],
}

impl<W> PleParams<W> {
    pub fn host(&self) -> HostPleParams<'_> {
        HostPleParams {
            norm_key: &self.norm_key.host,
            norm_query: &self.norm_query.host,
            norm_conv: &self.norm_conv.host,
            conv: &self.conv.host,
        }
    }
}

/// The PLE layer's gate and conv sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PleSpec {
    pub hyper: HyperSpec,
    pub conv_kernel: usize,
    pub conv_dilation: usize,
}

impl PleSpec {
    /// Past inputs the dilated conv needs per sequence.
    pub fn state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dilation
    }
}

/// Plain-form norm weights and conv taps of a PLE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct PleParams<W> {
    pub norm_key: Channels<W>,
    pub norm_query: Channels<W>,
    pub norm_conv: Channels<W>,
    /// `[streams * hidden, kernel]`, depthwise.
    pub conv: Channels<W>,
}

pub trait FlashNextOps: Backend {
    /// `streams` copies of each row side by side: the initial residual streams.
    fn repeat_streams(&self, x: &Self::Tensor, streams: usize) -> Self::Tensor {
        let (rows, cols) = self.dims(x);
        let out = host::repeat_streams(&self.to_host(x), cols, streams);
        self.from_host(rows, cols * streams, &out)
    }

    /// RMSNorm of each `group`-wide slice of every row, times `w` (plain
    /// form, as wide as the row).
    fn grouped_rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Channels<Self::Weight>,
        group: usize,
        eps: f32,
    ) -> Self::Tensor {
        let (rows, cols) = self.dims(x);
        let out = host::grouped_rms_norm(&self.to_host(x), cols, &w.host, group, eps);
        self.from_host(rows, cols, &out)
    }

    /// `silu(x / streams)`: the activation between the low-rank gate projections.
    fn hyper_low_rank_act(&self, x: &Self::Tensor, streams: usize) -> Self::Tensor {
        let (rows, cols) = self.dims(x);
        let out = host::scaled_silu(&self.to_host(x), streams as f32);
        self.from_host(rows, cols, &out)
    }

    /// The sublayer input: the mean over streams of `sigmoid(gate) * normed`.
    fn hyper_mix(
        &self,
        normed: &Self::Tensor,
        gate: &Self::Tensor,
        spec: &HyperSpec,
    ) -> Self::Tensor {
        let rows = self.dims(normed).0;
        let out = host::hyper_mix(&self.to_host(normed), &self.to_host(gate), spec);
        self.from_host(rows, spec.hidden, &out)
    }

    /// `x[s] += out * 2 * sigmoid(inject[s] / streams)` for every stream `s`.
    fn hyper_inject(
        &self,
        x: &mut Self::Tensor,
        out: &Self::Tensor,
        inject: &Self::Tensor,
        spec: &HyperSpec,
    ) {
        let rows = self.dims(x).0;
        let mut xs = self.to_host(x);
        host::hyper_inject(&mut xs, &self.to_host(out), &self.to_host(inject), spec);
        *x = self.from_host(rows, spec.width(), &xs);
    }

    /// What comes before a sublayer, in one operation: the previous
    /// sublayer's output added to the streams when `pending` holds it (its
    /// output and inject logits, as [`Self::hyper_inject`]), then the
    /// streams' grouped RMSNorm (`norm`, groups of `spec.hidden`) and, with
    /// `inject` (`[streams, streams * hidden]`), this sublayer's inject
    /// logits `normed . inject^T`, `[T, streams]`. A device does it in one
    /// pass over each row; the default composes the three operations.
    fn hyper_norm(
        &self,
        x: &mut Self::Tensor,
        pending: Option<(&Self::Tensor, &Self::Tensor)>,
        norm: &Channels<Self::Weight>,
        inject: Option<&Self::Weight>,
        spec: &HyperSpec,
    ) -> (Self::Tensor, Option<Self::Tensor>) {
        composed_hyper_norm(self, x, pending, norm, inject, spec)
    }

    /// The sublayer input from the normalised streams `[T, streams *
    /// hidden]`: the low-rank gate `up . silu((down . normed) / streams)`
    /// (`down`: `[rank, width]`, `up`: `[width, rank]`), then
    /// [`Self::hyper_mix`]. A device may run a decode-shaped step in two
    /// kernels; the default composes the four operations.
    fn hyper_gate_mix(
        &self,
        normed: &Self::Tensor,
        down: &Self::Weight,
        up: &Self::Weight,
        spec: &HyperSpec,
    ) -> Self::Tensor {
        composed_hyper_gate_mix(self, normed, down, up, spec)
    }

    /// The PLE output added to all streams: the per-stream sigmoid gate of
    /// the value by the normalised key and stream, plus the dilated causal
    /// conv (SiLU) of its norm. `state` holds `spec.state_len()` past conv
    /// inputs per state slot (`[slots * state_len, width]`).
    #[allow(clippy::too_many_arguments)]
    fn ple_mix(
        &self,
        streams: &Self::Tensor,
        key: &Self::Tensor,
        value: &Self::Tensor,
        p: &PleParams<Self::Weight>,
        spec: &PleSpec,
        state: &mut Self::Tensor,
        batch: &ForwardBatch,
    ) -> Self::Tensor {
        let rows = self.dims(streams).0;
        let (srows, scols) = self.dims(state);
        let mut st = self.to_host(state);
        let out = host::ple_mix(
            &self.to_host(streams),
            &self.to_host(key),
            &self.to_host(value),
            &p.host(),
            spec,
            &mut st,
            batch,
        );
        *state = self.from_host(srows, scols, &st);
        self.from_host(rows, spec.hyper.width(), &out)
    }

    /// Stores each new token's raw indexer key and the pooled key of every
    /// block a new token completes in `keys` (see [`IndexerKeys`]; pages of
    /// `block_size` positions through the batch's block tables) and picks,
    /// for every new token, the `budget / compress_ratio` best complete
    /// blocks of its visible positions plus the incomplete tail block.
    fn qsa_select(
        &self,
        proj: &Self::Tensor,
        norms: &QsaNorms<Self::Weight>,
        spec: &QsaSpec,
        keys: &mut IndexerKeys<Self::Tensor>,
        block_size: usize,
        batch: &ForwardBatch,
    ) -> TokenSelection {
        let (raw_dims, pooled_dims) = (self.dims(&keys.raw), self.dims(&keys.pooled));
        let mut host_keys = IndexerKeys {
            raw: self.to_host(&keys.raw),
            pooled: self.to_host(&keys.pooled),
        };
        let sel = host::qsa_select(
            &self.to_host(proj),
            &norms.host(),
            spec,
            &mut host_keys,
            block_size,
            batch,
        );
        keys.raw = self.from_host(raw_dims.0, raw_dims.1, &host_keys.raw);
        keys.pooled = self.from_host(pooled_dims.0, pooled_dims.1, &host_keys.pooled);
        sel
    }

    /// [`Backend::attention`] reading only the selected positions of each
    /// token. The default runs dense attention when the selection is every
    /// visible position and panics otherwise: a backend without its own
    /// sparse attention cannot run contexts longer than the indexer budget.
    #[allow(clippy::too_many_arguments)]
    fn sparse_attention(
        &self,
        proj: &Self::Tensor,
        w: &AttentionWeights<Self::Weight>,
        spec: &AttentionSpec,
        cache: &mut Self::Cache,
        layer: usize,
        batch: &ForwardBatch,
        selection: &TokenSelection,
    ) -> Self::Tensor {
        assert!(
            selection.is_dense(),
            "{}: sparse attention over a partial selection is not implemented on this backend",
            self.name()
        );
        self.attention(proj, w, spec, cache, layer, batch)
    }

    /// Overwrites `t` with `data` (as many values as `t` holds) from the
    /// host. A backend that records steps writes where `t` already is, so a
    /// step recorded reading `t` reads the new values when replayed; the
    /// default makes a new tensor.
    fn write_rows(&self, t: &mut Self::Tensor, data: &[f32]) {
        let (rows, cols) = self.dims(t);
        assert_eq!(
            data.len(),
            rows * cols,
            "write_rows: {rows} x {cols} values"
        );
        *t = self.from_host(rows, cols, data);
    }

    /// Zeroes or copies rows of a per-slot state pool in place (a sequence
    /// starting over, a snapshot, a rollback).
    fn edit_rows(&self, t: &mut Self::Tensor, edit: RowEdit) {
        let (rows, cols) = self.dims(t);
        let mut data = self.to_host(t);
        host::edit_rows(&mut data, cols, edit);
        *t = self.from_host(rows, cols, &data);
    }
}

/// [`FlashNextOps::hyper_norm`] as its three operations: the default, and
/// what a backend with a fused form runs where the fused form does not apply.
pub fn composed_hyper_norm<B: FlashNextOps>(
    b: &B,
    x: &mut B::Tensor,
    pending: Option<(&B::Tensor, &B::Tensor)>,
    norm: &Channels<B::Weight>,
    inject: Option<&B::Weight>,
    spec: &HyperSpec,
) -> (B::Tensor, Option<B::Tensor>) {
    if let Some((out, logits)) = pending {
        b.hyper_inject(x, out, logits, spec);
    }
    let normed = b.grouped_rms_norm(x, norm, spec.hidden, spec.eps);
    let logits = inject.map(|w| b.matmul(&normed, w));
    (normed, logits)
}

/// [`FlashNextOps::hyper_gate_mix`] as its four operations (see
/// [`composed_hyper_norm`]).
pub fn composed_hyper_gate_mix<B: FlashNextOps>(
    b: &B,
    normed: &B::Tensor,
    down: &B::Weight,
    up: &B::Weight,
    spec: &HyperSpec,
) -> B::Tensor {
    let low = b.hyper_low_rank_act(&b.matmul(normed, down), spec.streams);
    let gate = b.matmul(&low, up);
    b.hyper_mix(normed, &gate, spec)
}
