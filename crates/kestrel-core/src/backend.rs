//! The fused operations a backend implements.
//!
//! Operations work at the granularity of a model block (attention, MoE, Gated
//! DeltaNet) so that each backend is free to fuse inside them; the model files
//! only chain them. Activations are 2-D row-major `[tokens, features]`.
//! Weights are stored `[out, in]` as in Hugging Face checkpoints.

use std::borrow::Cow;

use crate::{
    CandidateRequest, DType, ForwardBatch, HostTensor, HostWeight, Result, RowCandidates, dummy,
    top_candidates_host,
};

/// Rotary embedding over the first `rotary_dim` dims of each head
/// (rotate-half pairing within those dims; `inv_freq[i] = theta^(-2i/rotary_dim)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub rotary_dim: usize,
}

/// Full (softmax) attention with per-head q/k RMSNorm and RoPE.
///
/// Input rows hold the fused projection in the column order
/// `[q (Hq*D) | gate (Hq*D), only if output_gate | k (Hkv*D) | v (Hkv*D)]`.
/// The model loader reorders checkpoint rows into this layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope: RopeSpec,
    pub norm_eps: f32,
    /// Qwen3.5 / Qwen3-Next: output multiplied by `sigmoid(gate)` per element.
    pub output_gate: bool,
    /// Softmax scale, `head_dim^-0.5` for every Qwen model.
    pub scale: f32,
}

impl AttentionSpec {
    pub fn q_width(&self) -> usize {
        self.num_q_heads * self.head_dim
    }
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    pub fn proj_width(&self) -> usize {
        self.q_width() * if self.output_gate { 2 } else { 1 } + 2 * self.kv_width()
    }
}

/// Plain RMSNorm weights (a `1 + w` checkpoint is converted by the loader).
#[derive(Debug)]
pub struct AttentionWeights<W> {
    pub q_norm: W,
    pub k_norm: W,
}

/// Sparse mixture of experts with an optional gated shared expert.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    /// Renormalise the top-k softmax weights to sum to one.
    pub norm_topk_prob: bool,
    pub shared_intermediate: Option<usize>,
}

#[derive(Debug)]
pub struct MoeWeights<W> {
    /// Router `[E, H]`.
    pub router: W,
    /// Experts' gate and up projections stacked: `[E, 2I, H]`, gate rows first.
    pub gate_up: W,
    /// Experts' down projections stacked: `[E, H, I]`.
    pub down: W,
    /// Shared expert `[2Is, H]` (gate rows first) and `[H, Is]`.
    pub shared_gate_up: Option<W>,
    pub shared_down: Option<W>,
    /// Shared expert gate `[1, H]`: output scaled by `sigmoid(gate . x)`.
    pub shared_gate: Option<W>,
}

impl<W> MoeWeights<W> {
    /// Panics with a clear message when a weight's size does not fit `spec`
    /// for hidden size `h` (`numel` reads a backend weight's element count).
    /// Backends call it before running the block.
    pub fn check_shapes(&self, h: usize, spec: &MoeSpec, numel: impl Fn(&W) -> usize) {
        let (e, i) = (spec.num_experts, spec.intermediate);
        assert!(
            spec.top_k >= 1 && spec.top_k <= e,
            "top_k {} must be in 1..={e}",
            spec.top_k
        );
        assert_eq!(numel(&self.router), e * h, "router must be [{e}, {h}]");
        assert_eq!(
            numel(&self.gate_up),
            e * 2 * i * h,
            "experts' gate_up must be [{e}, {}, {h}]",
            2 * i
        );
        assert_eq!(
            numel(&self.down),
            e * h * i,
            "experts' down must be [{e}, {h}, {i}]"
        );
        match (
            &self.shared_gate_up,
            &self.shared_down,
            spec.shared_intermediate,
        ) {
            (Some(gu), Some(d), Some(si)) => {
                assert_eq!(
                    numel(gu),
                    2 * si * h,
                    "shared gate_up must be [{}, {h}]",
                    2 * si
                );
                assert_eq!(numel(d), h * si, "shared down must be [{h}, {si}]");
            }
            (None, None, _) => {}
            _ => panic!("shared expert needs both weights and shared_intermediate"),
        }
        if let Some(g) = &self.shared_gate {
            assert_eq!(numel(g), h, "shared expert gate must be [1, {h}]");
        }
    }
}

/// Gated DeltaNet (linear attention) dimensions.
///
/// Input rows hold the fused projection `[qkv (conv_dim) | z (Hv*Dv) | b (Hv) | a (Hv)]`
/// with `qkv = [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnSpec {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
    pub norm_eps: f32,
    /// Activation of `z` in the gated RMSNorm.
    pub output_gate: GdnGate,
}

/// The activation applied to the gate `z` of the Gated DeltaNet output norm:
/// SiLU in Qwen3.5/3.6 and Qwen3-Next, sigmoid in Qwen3.8-Flash-Next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdnGate {
    #[default]
    Silu,
    Sigmoid,
}

impl GdnSpec {
    pub fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
    }
    /// f32 values of one sequence's conv state (the last `conv_kernel - 1`
    /// inputs of the causal conv) in one layer.
    pub fn conv_state_len(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1)
    }
    /// f32 values of one sequence's recurrent state in one layer.
    pub fn recurrent_state_len(&self) -> usize {
        self.num_v_heads * self.head_k_dim * self.head_v_dim
    }
    pub fn value_width(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }
    pub fn proj_width(&self) -> usize {
        self.conv_dim() + self.value_width() + 2 * self.num_v_heads
    }
}

#[derive(Debug)]
pub struct GdnWeights<W> {
    /// Depthwise causal conv `[conv_dim, kernel]`.
    pub conv: W,
    /// `A_log` and `dt_bias`, `[Hv]`, f32.
    pub a_log: W,
    pub dt_bias: W,
    /// Gated RMSNorm weight `[Dv]` (plain form: `w * norm(o) * silu(z)`).
    pub norm: W,
}

/// Sizes of the per-sequence caches a model needs.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSpec {
    /// Paged KV cache: one pool per full-attention layer.
    pub attn_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Recurrent and conv state: one slot per sequence in each linear-attention layer.
    pub gdn_layers: usize,
    pub num_state_slots: usize,
    pub gdn: Option<GdnSpec>,
}

impl CacheSpec {
    /// Bytes of the KV pools at `kv_bytes` per element plus the f32
    /// recurrent and conv state slots.
    pub fn bytes(&self, kv_bytes: usize) -> usize {
        let kv = self.attn_layers
            * 2
            * self.num_blocks
            * self.block_size
            * self.num_kv_heads
            * self.head_dim
            * kv_bytes;
        let state = match (&self.gdn, self.gdn_layers) {
            (Some(g), n) if n > 0 => {
                n * self.num_state_slots * (g.conv_state_len() + g.recurrent_state_len()) * 4
            }
            _ => 0,
        };
        kv + state
    }
}

/// Identifies a step whose work a backend may record once and replay (see
/// [`Backend::run_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepKey(pub u64);

/// Row-wise argmax of a host matrix with `row_len` columns over the first
/// `cols` of them (lowest index on ties, NaN never wins).
pub fn argmax_host(values: &[f32], row_len: usize, cols: usize) -> Vec<u32> {
    values
        .chunks_exact(row_len.max(1))
        .map(|row| {
            let row = &row[..cols.min(row.len())];
            let mut best = 0usize;
            let mut best_v = f32::NEG_INFINITY;
            for (i, &v) in row.iter().enumerate() {
                if v > best_v {
                    best = i;
                    best_v = v;
                }
            }
            best as u32
        })
        .collect()
}

/// A block's input that is still to be formed: `residual += delta` (when
/// there is a delta), then the RMSNorm of the residual with `weight`. Blocks
/// hand it to their first operation ([`Backend::norm_matmul`],
/// [`Backend::norm_moe`]) so that a backend can fuse the norm into it.
pub struct PreNorm<'a, T, W> {
    pub residual: &'a mut T,
    /// The previous block's output; `None` for the first block, whose
    /// residual is the embedding.
    pub delta: Option<&'a T>,
    pub weight: &'a W,
    pub eps: f32,
}

pub trait Backend: Send + Sync + Sized + 'static {
    /// Activations, `[rows, cols]`, f32 semantics.
    type Tensor: Send;
    /// A parameter resident on the backend.
    type Weight: Send + Sync;
    /// Paged KV pools and recurrent-state slots of all layers.
    type Cache: Send;
    /// Keys and values of one attention layer outside the paged cache
    /// ([`Backend::new_block_keys`]).
    type BlockKeys: Send;

    fn name(&self) -> String;

    // ---- data movement -------------------------------------------------
    fn upload(&self, t: &HostTensor) -> Result<Self::Weight>;
    /// How this backend takes block-FP8 weights: `Some(dtype)` when the
    /// loader is to dequantise them (exactly, in parallel) to a dense tensor
    /// of `dtype` and hand that to [`Backend::upload`]; `None` when they go
    /// to [`Backend::upload_weight`] as they are (codes and block scales),
    /// for a backend whose kernels read the format directly.
    fn fp8_dequantize_to(&self) -> Option<DType> {
        Some(DType::F32)
    }
    /// A parameter in either form; block-FP8 arrives here only when
    /// [`Backend::fp8_dequantize_to`] is `None`. The default dequantises to
    /// f32 and uploads.
    fn upload_weight(&self, w: &HostWeight) -> Result<Self::Weight> {
        match w {
            HostWeight::Dense(t) => self.upload(t),
            HostWeight::BlockFp8(q) => self.upload(&q.dequantize()),
        }
    }
    /// One matrix whose rows are those of `parts` in order (matrices with
    /// rows of one length), each part kept in the form it was uploaded in:
    /// how the loader joins the block-FP8 and the dense rows of one
    /// projection (a Gated DeltaNet in_proj of an FP8 checkpoint: q/k/v and
    /// z FP8, b and a bf16) without dequantising the FP8 ones.
    fn stack_rows(&self, parts: Vec<Self::Weight>) -> Result<Self::Weight>;
    // A constructor on the backend instance: the device decides where it lives.
    #[allow(clippy::wrong_self_convention)]
    fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Self::Tensor;
    fn to_host(&self, t: &Self::Tensor) -> Vec<f32>;
    fn dims(&self, t: &Self::Tensor) -> (usize, usize);
    /// A parameter of `shape` filled with uniform values in
    /// `[offset - scale, offset + scale)` drawn by [`dummy::dummy_value`] from
    /// `seed`, rounded to `dtype`: benchmark weights without model files.
    /// The default builds it on the host and uploads it; a GPU backend fills
    /// it on the device (same values) so that full-size models load in seconds.
    fn dummy_weight(
        &self,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        offset: f32,
        scale: f32,
    ) -> Result<Self::Weight> {
        let n: usize = shape.iter().product();
        let values = (0..n as u64).map(|i| dummy::dummy_value(seed, i, offset, scale));
        let data: Vec<u8> = match dtype {
            DType::F32 => values.flat_map(f32::to_le_bytes).collect(),
            DType::BF16 => values
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            DType::F16 => values
                .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
        };
        self.upload(&HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: Cow::Owned(data),
        })
    }

    /// A random block-FP8 weight of `shape` for the dummy load format, its
    /// codes drawn as the loader draws them on the host (the value
    /// [`dummy::dummy_value`]`(seed, i, 0, 448)` rounded to e4m3) and its
    /// block scales `scale_inv` given: `Some` from a backend that fills the
    /// codes itself (a GPU, in seconds instead of minutes), `None` to let the
    /// loader draw them on the host and upload them.
    fn dummy_fp8_weight(
        &self,
        _shape: &[usize],
        _seed: u64,
        _scale_inv: &[f32],
    ) -> Option<Result<Self::Weight>> {
        None
    }

    /// Wait until every queued operation has finished (a no-op for backends
    /// that compute synchronously). Timing code calls it before reading a clock.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Device-memory read bandwidth in GB/s measured by the backend itself
    /// (a large device-to-device copy), or `None` where it has no such probe.
    fn measure_bandwidth_gbs(&self) -> Option<f64> {
        None
    }

    /// Whether [`Backend::gated_delta_net`] honours
    /// [`crate::SeqChunk::state_checkpoints`] (speculative decoding on hybrid
    /// models needs it; the engine refuses to speculate there otherwise).
    fn supports_state_checkpoints(&self) -> bool {
        false
    }

    /// Whether [`Backend::gated_delta_net`] takes a
    /// [`crate::SeqChunk::state_snapshot`], and where: `Some(a)` when the
    /// snapshot's `after` must be a multiple of `a` (the backend's state
    /// form has chunk boundaries only there), `None` when it takes none (the
    /// engine then ends a pass at each snapshot point instead). A backend
    /// that takes them must compute the prompt rows after a snapshot
    /// ([`crate::SeqChunk::prompt`]) as a later pass resuming from it would:
    /// a prefix-cache hit does exactly that.
    fn state_snapshot_alignment(&self) -> Option<usize> {
        None
    }

    /// Whether `batch` runs as two forward passes, its first `n` sequences
    /// and then the rest (`Some(n)`), or as one (`None`). A backend whose
    /// kernels for a row depend on the step's shape cuts a step that mixes
    /// decode and verify rows with prefill chunks, so that those rows
    /// compute what they would in a step of their own: speculation and the
    /// arrival of other requests then leave a sequence's output as it is.
    /// The engine orders short chunks first (see
    /// [`ForwardBatch::short_prefix_cut`]). The passes together read the
    /// weights twice; a backend whose rows never depend on the step (the
    /// CPU) runs one.
    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        let _ = batch;
        None
    }

    /// The most decode and verify rows one step should bring for this
    /// backend: past it a step reads the weights once more (the CUDA `gemv`
    /// passes take 16 rows), which costs more than the extra drafts gain, so
    /// the engine shortens drafts to fit. `None`: no such edge (the CPU).
    fn decode_rows_hint(&self) -> Option<usize> {
        None
    }

    /// Free and total bytes of the memory this backend's weights and caches
    /// live in, where it is a device's own (`None` on the CPU, whose caches
    /// take host memory). `serve` sizes its KV cache from it.
    fn device_memory(&self) -> Option<(usize, usize)> {
        None
    }

    /// Bytes [`new_cache`](Backend::new_cache) allocates for `spec`
    /// (f32 elements unless a backend stores them narrower).
    fn cache_bytes(&self, spec: &CacheSpec) -> usize {
        spec.bytes(4)
    }

    fn new_cache(&self, spec: &CacheSpec) -> Result<Self::Cache>;
    /// Reset a sequence's recurrent and conv state to zero in every GDN layer.
    fn zero_state(&self, cache: &mut Self::Cache, slot: u32);
    /// Snapshot a sequence's recurrent and conv state (all GDN layers).
    fn copy_state(&self, cache: &mut Self::Cache, src: u32, dst: u32);

    /// Run one forward step: `f` computes it over `batch`, whose new tokens are
    /// `ids`. Backends use the call to stage the step's layout (positions,
    /// pages, state slots) on the device once for all layers.
    ///
    /// With a `key`, a backend may record the work `f` queues the first times
    /// it sees that key and afterwards replay the recording instead of calling
    /// `f` (CUDA graphs). The caller promises that for one key the queued work
    /// differs only in the values of `ids`, `batch` and the cache contents:
    /// same model, same number of sequences and tokens, same returned shape,
    /// and that `f` reads nothing back to the host.
    fn run_step(
        &self,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut Self::Cache,
        key: Option<StepKey>,
        f: &mut dyn FnMut(&mut Self::Cache) -> Self::Tensor,
    ) -> Self::Tensor {
        let _ = (ids, batch, key);
        f(cache)
    }

    /// Index of the largest of the first `cols` values of each row (the
    /// lowest index on ties; NaN never wins): greedy sampling without copying
    /// logits to the host. `cols` below the row length keeps padded
    /// vocabulary entries (ids no tokenizer can decode) from being picked.
    fn argmax_rows(&self, x: &Self::Tensor, cols: usize) -> Vec<u32> {
        let (_, row_len) = self.dims(x);
        argmax_host(&self.to_host(x), row_len, cols)
    }

    /// For each request, its row's best candidates after the sampler's
    /// penalties and mask (see [`crate::candidates`]): the `count` largest
    /// penalised logits among the first `cols` (NaN and `-inf` never; ties to
    /// the lower id), the row's largest, and the count and weight of those
    /// above the min-p line, and, given the sampler's uniform draw, where the
    /// kept weights summed in id order cross it. A sampler finishes on them
    /// instead of copying the row. The default copies the logits to the host
    /// and is the reference.
    fn top_candidates(
        &self,
        logits: &Self::Tensor,
        rows: &[CandidateRequest],
    ) -> Vec<RowCandidates> {
        if rows.is_empty() {
            return Vec::new();
        }
        let (_, row_len) = self.dims(logits);
        top_candidates_host(&self.to_host(logits), row_len, rows)
    }

    /// Set every id a row's mask does not allow to `-inf`, in place (see
    /// [`crate::token_mask`]), so that a constrained row can be chosen like
    /// any other. The default copies the logits to the host and back.
    fn mask_rows(&self, logits: &mut Self::Tensor, masks: &[crate::token_mask::RowMask<'_>]) {
        if masks.is_empty() {
            return;
        }
        let (rows, row_len) = self.dims(logits);
        let mut values = self.to_host(logits);
        crate::token_mask::mask_rows_host(&mut values, row_len, masks);
        *logits = self.from_host(rows, row_len, &values);
    }

    // ---- operations ----------------------------------------------------
    fn embedding(&self, table: &Self::Weight, ids: &[u32]) -> Self::Tensor;
    /// `x @ w^T` for `w` stored `[out, in]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Self::Tensor;
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Self::Tensor;
    /// `residual += x`, then return `rms_norm(residual)`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Self::Tensor;
    fn add_assign(&self, a: &mut Self::Tensor, b: &Self::Tensor);

    /// The normalised input `pre` stands for (and the residual updated).
    fn pre_norm(&self, pre: PreNorm<'_, Self::Tensor, Self::Weight>) -> Self::Tensor {
        match pre.delta {
            Some(d) => self.add_rms_norm(pre.residual, d, pre.weight, pre.eps),
            None => self.rms_norm(pre.residual, pre.weight, pre.eps),
        }
    }
    /// [`Backend::pre_norm`], then `matmul` with `w`: one operation, so that
    /// a backend can compute the norm inside the product.
    fn norm_matmul(
        &self,
        pre: PreNorm<'_, Self::Tensor, Self::Weight>,
        w: &Self::Weight,
    ) -> Self::Tensor {
        let x = self.pre_norm(pre);
        self.matmul(&x, w)
    }
    /// [`Backend::pre_norm`], then [`Backend::moe`], for the same reason.
    fn norm_moe(
        &self,
        pre: PreNorm<'_, Self::Tensor, Self::Weight>,
        w: &MoeWeights<Self::Weight>,
        spec: &MoeSpec,
    ) -> Self::Tensor {
        let x = self.pre_norm(pre);
        self.moe(&x, w, spec)
    }
    /// `silu(gate) * up` for rows `[gate | up]`.
    fn swiglu(&self, gate_up: &Self::Tensor) -> Self::Tensor;
    fn gather_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Self::Tensor;

    /// q/k norm, RoPE, KV write into the pages of `batch`, causal GQA attention
    /// over each sequence's cached and new tokens, optional sigmoid output gate.
    /// Returns `[T, Hq*D]`. `layer` indexes the attention layers of `cache`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        proj: &Self::Tensor,
        w: &AttentionWeights<Self::Weight>,
        spec: &AttentionSpec,
        cache: &mut Self::Cache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> Self::Tensor;

    /// An empty store of keys and values of one attention layer kept
    /// outside the paged cache, for [`Backend::block_attention`]: a block
    /// drafter's (DFlash) context. Rows are appended at the end and dropped
    /// from either end; their order does not matter to the attention.
    fn new_block_keys(&self, spec: &AttentionSpec) -> Self::BlockKeys;

    /// Rows held by `keys`.
    fn block_keys_len(&self, keys: &Self::BlockKeys) -> usize;

    /// Appends the rows of `kv` (`[n, 2 * Hkv * D]`: the projections
    /// `[k | v]`): each key head gets its RMSNorm with `k_norm` and RoPE at
    /// its row's position (`first_position + row`); values as they are.
    fn append_block_keys(
        &self,
        keys: &mut Self::BlockKeys,
        kv: &Self::Tensor,
        k_norm: &Self::Weight,
        spec: &AttentionSpec,
        first_position: usize,
    );

    /// [`Backend::append_block_keys`] for several stores in one call: store
    /// `s` takes the next `counts[s]` rows of `kv` at positions
    /// `first_positions[s]..`. The default appends one store at a time.
    fn append_block_keys_batch(
        &self,
        keys: &mut [&mut Self::BlockKeys],
        kv: &Self::Tensor,
        k_norm: &Self::Weight,
        spec: &AttentionSpec,
        first_positions: &[usize],
        counts: &[usize],
    ) {
        crate::block_attention::append_each(self, keys, kv, k_norm, spec, first_positions, counts)
    }

    /// Keeps only the rows `range` of `keys` (the oldest dropped out of a
    /// window, or the newest rolled back).
    fn keep_block_keys(&self, keys: &mut Self::BlockKeys, range: std::ops::Range<usize>);

    /// Non-causal GQA attention of a block of new rows, no output gate:
    /// `qkv` (`[T, Hq*D + 2 * Hkv*D]`, the block's projections `[q | k |
    /// v]`, normed with `q_norm` / `k_norm` and rotated at positions
    /// `first_position..` here) attends with every query to every row of
    /// `keys` and every one of the block's own keys. The block's keys are
    /// not kept (`keys` is `&mut` so that a backend may stage them in its
    /// spare rows). Returns `[T, Hq*D]`.
    fn block_attention(
        &self,
        qkv: &Self::Tensor,
        q_norm: &Self::Weight,
        k_norm: &Self::Weight,
        keys: &mut Self::BlockKeys,
        spec: &AttentionSpec,
        first_position: usize,
    ) -> Self::Tensor;

    /// [`Backend::block_attention`] of several sequences' blocks of `block`
    /// rows each, in one call: rows `s * block..(s + 1) * block` of `qkv`
    /// are sequence `s`'s block, over `keys[s]` at positions
    /// `first_positions[s]..`. Returns `[keys.len() * block, Hq*D]`. The
    /// default attends one sequence at a time and joins the outputs.
    #[allow(clippy::too_many_arguments)]
    fn block_attention_batch(
        &self,
        qkv: &Self::Tensor,
        q_norm: &Self::Weight,
        k_norm: &Self::Weight,
        keys: &mut [&mut Self::BlockKeys],
        spec: &AttentionSpec,
        first_positions: &[usize],
        block: usize,
    ) -> Self::Tensor {
        crate::block_attention::attend_each(
            self,
            qkv,
            q_norm,
            k_norm,
            keys,
            spec,
            first_positions,
            block,
        )
    }

    /// The rows of `a` followed by the rows of `b` (same width; either may
    /// have no rows). The default copies through the host (correct but slow
    /// on a device).
    fn concat_rows(&self, a: &Self::Tensor, b: &Self::Tensor) -> Self::Tensor {
        crate::block_attention::concat_rows_on_host(self, a, b)
    }

    /// Router (softmax, top-k, optional renormalise), the selected experts and
    /// the gated shared expert. Returns `[T, H]`.
    fn moe(&self, x: &Self::Tensor, w: &MoeWeights<Self::Weight>, spec: &MoeSpec) -> Self::Tensor;

    /// Causal conv1d with carried state, SiLU, L2-normalised q/k, decay and
    /// beta, the delta-rule recurrence with carried state, and the gated
    /// RMSNorm. Returns `[T, Hv*Dv]` (before `out_proj`). `layer` indexes the
    /// linear-attention layers of `cache`.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_net(
        &self,
        proj: &Self::Tensor,
        w: &GdnWeights<Self::Weight>,
        spec: &GdnSpec,
        cache: &mut Self::Cache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> Self::Tensor;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_is_per_row_with_lowest_index_on_ties_and_nan_never_winning() {
        let v = [0.0, 2.0, 2.0, 5.0, -1.0, 4.0, f32::NAN, -3.0, f32::NAN];
        assert_eq!(argmax_host(&v, 3, 3), vec![1, 0, 1]);
        // Only the first two columns compete.
        assert_eq!(
            argmax_host(&[1.0, 2.0, 9.0, 4.0, 3.0, 9.0], 3, 2),
            vec![1, 0]
        );
    }
}
