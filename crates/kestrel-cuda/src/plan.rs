//! The kernel plan: every kernel-path choice of the backend, decided once
//! when it opens.
//!
//! [`Plan::resolve`] takes what the device can run (its compute capability,
//! and which attention kernels fit its shared memory), the precision and the
//! parsed switches ([`Overrides`]) and fixes the attention, MoE, GDN, norm,
//! dense-product, launch and CUDA-graph paths. Operations `match` on it;
//! what they still decide per call are shape checks (a decode-sized batch, a
//! head dim with tensor-core kernels, an expert count the kernels take).
//! Knowing what runs for a model on a GPU is then reading one printed plan.

use std::fmt;

use serde::Serialize;

use crate::precision::Precision;
use crate::switches::{AttnPrefillChoice, GdnMathChoice, Overrides};

/// Head dims with tensor-core attention kernels (`_d64`, `_d128`, `_d256`).
pub const FAST_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// One value per head dim of [`FAST_HEAD_DIMS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PerHeadDim<T> {
    pub d64: T,
    pub d128: T,
    pub d256: T,
}

impl<T: Copy> PerHeadDim<T> {
    pub fn from_fn(f: impl Fn(usize) -> T) -> Self {
        PerHeadDim {
            d64: f(0),
            d128: f(1),
            d256: f(2),
        }
    }
    /// The value of `FAST_HEAD_DIMS[i]`.
    pub fn get(&self, i: usize) -> T {
        [self.d64, self.d128, self.d256][i]
    }
}

/// What the device offers, as far as the plan depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    pub compute_capability: (i32, i32),
    pub sms: usize,
    /// Which attention kernels the device loaded (they fit its shared
    /// memory, or its architecture has the instructions).
    pub attn_prefill_wgmma: [bool; 3],
    pub attn_prefill_v2: [bool; 3],
    pub attn_decode_fused: [bool; 3],
}

impl Device {
    /// Compute capability 9.0: wgmma and TMA.
    pub fn hopper(&self) -> bool {
        self.compute_capability == (9, 0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttnPrefill {
    /// `attention_prefill_sm90.cu`: warpgroups of 64 queries on wgmma.
    Wgmma,
    /// `attention_prefill_v2`: 128 queries a block, double-buffered, mma.sync.
    V2,
    /// `attention_prefill`: 64 queries a block, single-buffered, mma.sync.
    V1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttnDecode {
    /// `attention_decode_fused`: the new token's norm, RoPE and cache write inside.
    Fused,
    /// `qk_norm_rope_kv_write`, then `attention_decode`.
    Unfused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AttentionPlan {
    pub prefill: PerHeadDim<AttnPrefill>,
    pub decode: PerHeadDim<AttnDecode>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoePrefill {
    /// Routing, grouped GEMMs and combine on the device (`moe_prefill.cu`);
    /// shapes those kernels refuse go host-routed.
    DeviceRouted,
    /// The decode kernels 8 tokens at a time (the f32 reference precision).
    DecodeChunks,
    /// Routing read back, per-expert cuBLAS products (forced, experiments).
    HostRouted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mma {
    /// Hopper's warpgroup instructions.
    Wgmma,
    /// `mma.sync`, on every GPU.
    MmaSync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MoePlan {
    /// Blocks of up to 8 tokens always take the graph-capturable decode path.
    pub prefill: MoePrefill,
    pub expert_gemm: Mma,
    /// 256-wide tiles where they still make two blocks an SM.
    pub wide_tiles: bool,
}

/// The arithmetic of the GDN chunked kernels' products (their `tc` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChunkMath {
    /// f32-accurate 3xTF32.
    Tf32x3 = 1,
    /// One TF32 pass.
    Tf32 = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GdnPlan {
    pub chunk_math: ChunkMath,
    /// The chunked state pass: wgmma fed by TMA (one TF32 pass only), or mma.sync.
    pub state_pass: Mma,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DenseGemm {
    /// `cublasGemmEx`: its kernel and K split follow the row count.
    CublasGemmEx,
    /// cuBLASLt with one unsplit algorithm per weight shape, whatever the
    /// row count (`blas_lt.rs`): a row's sums are the same in a product of
    /// any number of rows.
    CublasLtRowInvariant,
    #[cfg(feature = "experiments")]
    CublasLt { algo: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launch {
    Plain,
    /// Programmatic dependent launch (experiments).
    #[cfg(feature = "experiments")]
    ProgrammaticDependent,
}

/// How a decode-shaped step (decode and verify rows) picks the K split of
/// its `gemv` products and the key splits of its attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeSplits {
    /// By the step's sequence count, the fastest for it; a row's sums then
    /// depend on how many sequences share its step (a verify step's rows
    /// take the split of the decode step of the same sequences).
    Step,
    /// As for one sequence, whatever the count: a decode or verify row's
    /// sums are the same in any batch (prefill rows still depend on their
    /// pass), at some speed at batch 2-8. The batch-invariant mode has its
    /// own fixed splits.
    OneSequence,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub compute_capability: String,
    pub sms: usize,
    pub precision: Precision,
    pub attention: AttentionPlan,
    pub moe: MoePlan,
    pub gdn: GdnPlan,
    /// Decode norms inside the products that read them (`gemv_norm`), and a
    /// prefill MoE block's norm inside `moe_norm_split`.
    pub norm_fusion: bool,
    /// Flash-Next's hyper-connection steps in the fused kernels (`hc_norm`
    /// before each sublayer, `hc_low_rank` and `hc_gate_mix` in
    /// decode-shaped steps) rather than the separate kernels and products:
    /// exact, but measured slower at decode, so only a build with the
    /// `experiments` feature takes them.
    pub hyper_fusion: bool,
    /// Products of more than 8 rows (bf16).
    pub dense_gemm: DenseGemm,
    pub launch: Launch,
    /// Decode steps recorded once and replayed.
    pub graphs: bool,
    /// Every row's result independent of the other rows of its step and of
    /// how many rows its sequence brings (decode, verify, prefill chunk):
    /// every step takes the decode arithmetic (products through `gemv`
    /// eight rows at a time, the MoE decode path, the GDN recurrence, the
    /// attention decode kernels with a fixed split count, no norm fusion).
    /// Prefill is much slower; speculation on and off, a prompt alone and
    /// batched, give the same tokens.
    pub batch_invariant: bool,
    /// A step that mixes decode-shaped chunks (decode and verify rows of at
    /// most [`crate::context::DECODE_SHAPED_MAX_SEQS`] sequences) with
    /// prefill chunks runs as two passes, the decode-shaped part first, so
    /// that its rows take the decode kernels as in a step of their own
    /// ([`kestrel_core::Backend::step_cut`]). Off in the batch-invariant
    /// mode, where no row depends on its step anyway.
    pub split_mixed_steps: bool,
    pub decode_splits: DecodeSplits,
    /// Prompt rows are computed alike whatever their pass's row count: a
    /// step with prompt chunks ([`kestrel_core::SeqChunk::prompt`]) takes
    /// the prefill kernels however few rows it has
    /// ([`crate::context::Cx::prompt_step`]), and the dense products one
    /// cuBLASLt algorithm per weight shape ([`DenseGemm::CublasLtRowInvariant`]).
    /// A prefix-cache hit that recomputes a prompt's last tokens in a short
    /// pass then computes what the cold prompt's long pass did, so the
    /// engine takes the prefix-cache snapshot inside that pass instead of
    /// ending a pass at it ([`kestrel_core::Backend::state_snapshot_alignment`]).
    /// Off in the batch-invariant mode, which has its own arithmetic, and
    /// in f32, whose products go through `gemv` eight rows at a time.
    pub invariant_prompts: bool,
}

impl Plan {
    pub fn resolve(device: &Device, o: &Overrides) -> Plan {
        let hopper = device.hopper();
        let prefill = PerHeadDim::from_fn(|i| {
            match o.attn_prefill {
                AttnPrefillChoice::Best if device.attn_prefill_wgmma[i] => {
                    return AttnPrefill::Wgmma;
                }
                AttnPrefillChoice::V1 => return AttnPrefill::V1,
                _ => {}
            }
            if device.attn_prefill_v2[i] {
                AttnPrefill::V2
            } else {
                AttnPrefill::V1
            }
        });
        let bi = o.batch_invariant;
        let decode = PerHeadDim::from_fn(|i| {
            // The fused kernel forms q itself, so it is kept out of a mode
            // where prefill rows take the same kernels as decode rows.
            if device.attn_decode_fused[i] && o.attn_decode_fused && !bi {
                AttnDecode::Fused
            } else {
                AttnDecode::Unfused
            }
        });
        let chunk_math = match (o.gdn_math, o.precision) {
            (GdnMathChoice::Tf32x3, _) | (GdnMathChoice::Auto, Precision::F32) => ChunkMath::Tf32x3,
            (GdnMathChoice::Tf32, _) | (GdnMathChoice::Auto, Precision::Bf16) => ChunkMath::Tf32,
        };
        let wgmma_if = |allowed: bool| {
            if hopper && allowed {
                Mma::Wgmma
            } else {
                Mma::MmaSync
            }
        };
        let moe_prefill = if o.precision == Precision::F32 || bi {
            MoePrefill::DecodeChunks
        } else if o.moe_prefill_host {
            MoePrefill::HostRouted
        } else {
            MoePrefill::DeviceRouted
        };
        Plan {
            compute_capability: format!(
                "{}.{}",
                device.compute_capability.0, device.compute_capability.1
            ),
            sms: device.sms,
            precision: o.precision,
            attention: AttentionPlan { prefill, decode },
            moe: MoePlan {
                prefill: moe_prefill,
                expert_gemm: wgmma_if(o.moe_gemm_wgmma),
                wide_tiles: o.moe_wide_tiles,
            },
            gdn: GdnPlan {
                chunk_math,
                state_pass: wgmma_if(o.gdn_state_wgmma && chunk_math == ChunkMath::Tf32),
            },
            norm_fusion: o.norm_fusion && !bi,
            hyper_fusion: cfg!(feature = "experiments") && o.hyper_fusion,
            dense_gemm: dense_gemm(o),
            launch: launch(o),
            graphs: o.graphs,
            batch_invariant: bi,
            split_mixed_steps: o.split_mixed_steps && !bi,
            invariant_prompts: o.invariant_prompts && !bi && o.precision == Precision::Bf16,
            decode_splits: if o.decode_splits_one_sequence {
                DecodeSplits::OneSequence
            } else {
                DecodeSplits::Step
            },
        }
    }
}

fn dense_gemm(o: &Overrides) -> DenseGemm {
    #[cfg(feature = "experiments")]
    if o.dense_gemm_lt {
        return DenseGemm::CublasLt { algo: o.lt_algo };
    }
    if o.invariant_prompts && !o.batch_invariant && o.precision == Precision::Bf16 {
        DenseGemm::CublasLtRowInvariant
    } else {
        DenseGemm::CublasGemmEx
    }
}

#[cfg(feature = "experiments")]
fn launch(o: &Overrides) -> Launch {
    if o.pdl {
        Launch::ProgrammaticDependent
    } else {
        Launch::Plain
    }
}

#[cfg(not(feature = "experiments"))]
fn launch(_: &Overrides) -> Launch {
    Launch::Plain
}

/// The serialised (kebab-case) name of a plan value.
fn name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

impl<T: Serialize + Copy> fmt::Display for PerHeadDim<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = (name(&self.d64), name(&self.d128), name(&self.d256));
        if a == b && b == c {
            write!(f, "{a}")
        } else {
            write!(f, "d64 {a}, d128 {b}, d256 {c}")
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = |b: bool| if b { "on" } else { "off" };
        writeln!(
            f,
            "cuda plan: compute {}, {} SMs, {} arithmetic, batch-invariant {}, prompt rows {}, decode splits {}, mixed steps {}, graphs {}, dense products {}, launch {}",
            self.compute_capability,
            self.sms,
            name(&self.precision),
            on(self.batch_invariant),
            if self.invariant_prompts {
                "invariant"
            } else {
                "by size"
            },
            name(&self.decode_splits),
            if self.split_mixed_steps {
                "split"
            } else {
                "one pass"
            },
            on(self.graphs),
            name(&self.dense_gemm),
            name(&self.launch),
        )?;
        writeln!(
            f,
            "  attention: prefill {}; decode {}",
            self.attention.prefill, self.attention.decode
        )?;
        writeln!(
            f,
            "  moe: prefill {}, expert gemm {}, wide tiles {}; decode device-routed",
            name(&self.moe.prefill),
            name(&self.moe.expert_gemm),
            on(self.moe.wide_tiles),
        )?;
        write!(
            f,
            "  gdn: chunked {}, state pass {}; norm fusion {}; hyper-connection fusion {}",
            name(&self.gdn.chunk_math),
            name(&self.gdn.state_pass),
            on(self.norm_fusion),
            on(self.hyper_fusion),
        )
    }
}

#[cfg(test)]
mod tests;
