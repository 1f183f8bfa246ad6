//! What the kernels and their launchers must agree on, written once: the
//! argument records of kernels with many parameters, and the constants
//! both sides use.
//!
//! This file is a module of the crate (the launchers in `kestrel-cuda`
//! fill the records) and is also included by `build.rs`, which writes
//! `kestrel_abi.h` from it for the `.cu` files: each record as a C struct
//! with a `static_assert` on its size and on every field's offset, each
//! constant as a `constexpr`. A kernel takes its record as one
//! `const __grid_constant__` parameter, read in place from the parameter
//! space (a plain by-value struct is copied to local memory, which costs
//! registers and spills). So a field added on one side only, or a changed
//! constant, fails the kernel build instead of corrupting a launch.
//!
//! It may only use `core`: the build script compiles it on its own.

/// One field of a record: its C type, name and byte offset.
pub struct AbiField {
    pub c_type: &'static str,
    pub name: &'static str,
    pub offset: usize,
}

/// One argument record as the header declares it.
pub struct AbiRecord {
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: &'static [AbiField],
}

/// One shared constant.
pub struct AbiConst {
    pub name: &'static str,
    pub value: i64,
    pub doc: &'static str,
}

/// Declares `#[repr(C)]` records (device pointers as `u64`, with the C
/// type each field has in the kernels) and [`RECORDS`] describing them.
macro_rules! kernel_records {
    ($(
        $(#[doc = $doc:literal])*
        pub struct $name:ident {
            $( $(#[doc = $fdoc:literal])* pub $field:ident : $ty:ty => $cty:literal ),* $(,)?
        }
    )*) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq)]
            pub struct $name { $( $(#[doc = $fdoc])* pub $field: $ty ),* }
        )*
        /// Every record, for the header and the layout test.
        pub const RECORDS: &[AbiRecord] = &[$(
            AbiRecord {
                name: stringify!($name),
                size: core::mem::size_of::<$name>(),
                align: core::mem::align_of::<$name>(),
                fields: &[$( AbiField {
                    c_type: $cty,
                    name: stringify!($field),
                    offset: core::mem::offset_of!($name, $field),
                } ),*],
            }
        ),*];
    };
}

/// Declares integer constants shared with the kernels and [`CONSTANTS`].
macro_rules! shared_constants {
    ($( $(#[doc = $doc:literal])* pub const $name:ident : $ty:ty = $value:expr; )*) => {
        $( $(#[doc = $doc])* pub const $name: $ty = $value; )*
        /// Every shared constant, for the header.
        pub const CONSTANTS: &[AbiConst] = &[$(
            AbiConst { name: stringify!($name), value: $name as i64, doc: concat!($($doc),*) }
        ),*];
    };
}

shared_constants! {
    /// Head size (Dk = Dv) of the fused GDN decode and chunked kernels.
    pub const GDN_HEAD_DIM: usize = 128;
    /// Tokens per chunk of the chunked GDN form.
    pub const GDN_CHUNK: usize = 64;
    /// Floats of one (chunk, value head) record of the chunked form's
    /// scratch: W, q, k^T and U (each chunk x head dim), the intra-chunk
    /// matrix, and the decay, padded to whole rows of 128 floats for the
    /// state pass's TMA boxes.
    pub const GDN_CHUNK_FLOATS: usize = 4 * GDN_HEAD_DIM * GDN_CHUNK + GDN_CHUNK * GDN_CHUNK + 128;
    /// Most conv taps the chunk preparation computes itself.
    pub const GDN_CONV_FUSED_MAX_KERNEL: usize = 4;
    /// Threads of a chunk state-pass block.
    pub const GDN_STATE_THREADS: usize = 256;
    /// Dynamic shared memory of the chunk state pass: seven padded tiles.
    pub const GDN_STATE_SMEM_BYTES: usize = 155_648;
    /// Dynamic shared memory of the chunk preparation: q and k rows padded
    /// by 4 floats, and A's.
    pub const GDN_PREP_SMEM_BYTES: usize =
        (2 * GDN_CHUNK * (GDN_HEAD_DIM + 4) + GDN_CHUNK * (GDN_CHUNK + 4)) * 4;
    /// Most new tokens per sequence the fused GDN decode kernel takes.
    pub const GDN_DECODE_MAX_TOKENS: usize = 16;
    /// The conv kernel size the fused GDN decode kernel is built for.
    pub const GDN_DECODE_CONV_KERNEL: usize = 4;
    /// State columns per block of the token-by-token GDN recurrence.
    pub const GDN_COLS_PER_BLOCK: usize = 32;
    /// Most past inputs per channel the PLE conv kernel keeps (Flash-Next).
    pub const PLE_MAX_STATE: usize = 32;
    /// Most hyper-connection streams `hc_norm` and `hc_gate_mix` take
    /// (Flash-Next has 4).
    pub const HC_MAX_STREAMS: usize = 8;
    /// Most token rows the decode-shaped hyper-connection gate kernels
    /// (`hc_low_rank`, `hc_gate_mix`) take.
    pub const HC_GATE_MAX_ROWS: usize = 8;
    /// Warps (indexer blocks, one each) per block of the QSA kernels.
    pub const QSA_WARPS: usize = 8;
    /// Largest indexer head dim of the QSA kernels (8 values a lane).
    pub const QSA_MAX_HEAD_DIM: usize = 256;
    /// Query rows (block rows x q heads of a kv group) per block of the
    /// block drafter's attention kernel, 16 a warp.
    pub const BLOCK_ATTN_ROWS: usize = 128;
    /// Keys per K/V tile of that kernel.
    pub const BLOCK_ATTN_KEYS: usize = 64;
}

kernel_records! {
    /// `block_norm_rope_write`: the q/k norm + RoPE of every sequence's
    /// rows (a drafter block's, or context rows to append), their keys and
    /// values written into each sequence's own store
    /// (`qk_norm_rope_kv_write` with a store per sequence).
    pub struct BlockNormRopeArgs {
        /// `[T, proj_stride]`: q | k | v of each row.
        pub proj: u64 => "const float*",
        /// `[T, hq, D]` (unused with `hq` 0).
        pub q_out: u64 => "float*",
        /// Per sequence: its K and V stores (`[slot, hkv, D]` bf16).
        pub k_base: u64 => "const uint64_t*",
        pub v_base: u64 => "const uint64_t*",
        pub q_norm: u64 => "const float*",
        pub k_norm: u64 => "const float*",
        /// `[T]`: each row's position and the slot of its store it takes.
        pub positions: u64 => "const int*",
        pub slot_mapping: u64 => "const int*",
        /// `[T]`: each row's sequence (its store).
        pub row_seq: u64 => "const int*",
        pub proj_stride: i32 => "int",
        pub hq: i32 => "int",
        pub hkv: i32 => "int",
        pub d: i32 => "int",
        pub rotary_dim: i32 => "int",
        pub theta: f32 => "float",
        pub eps: f32 => "float",
        pub k_offset: i32 => "int",
        pub v_offset: i32 => "int",
    }

    /// `attention_block_d*`: non-causal attention of every sequence's block
    /// of drafter rows over that sequence's own key store.
    pub struct BlockAttentionArgs {
        /// `[T, hq, splits, D]`, unnormalised (relative to m).
        pub part_o: u64 => "float*",
        /// `[T, hq, splits, 2]`: (m in log2 units, l).
        pub part_ml: u64 => "float*",
        /// `[T, hq, D]`: normalised and rotated queries, T = sequences x rows.
        pub q: u64 => "const float*",
        /// Per sequence: the device address of its K store and of its V
        /// store (`[slot, hkv, D]` bf16).
        pub k_base: u64 => "const uint64_t*",
        pub v_base: u64 => "const uint64_t*",
        /// Per sequence: the first key's slot and the number of keys.
        pub key_lo: u64 => "const int*",
        pub key_len: u64 => "const int*",
        /// Block rows of every sequence.
        pub rows: i32 => "int",
        pub hq: i32 => "int",
        pub hkv: i32 => "int",
        pub splits: i32 => "int",
        pub scale_log2: f32 => "float",
    }

    /// `gdn_decode_g*`: a decode or verify step of one GDN layer.
    pub struct GdnDecodeArgs {
        /// `[T, Hv*Dv]`, after the gated norm.
        pub out: u64 => "float*",
        /// `[T, proj_stride]`: qkv | z | b | a.
        pub proj: u64 => "const float*",
        pub proj_stride: i32 => "int",
        /// `[conv_dim, kernel]`.
        pub conv_w: u64 => "const __nv_bfloat16*",
        /// `[slots, conv_dim, kernel - 1]`.
        pub conv_state: u64 => "float*",
        /// `[slots, Hv, Dk, Dv]`.
        pub state: u64 => "float*",
        pub a_log: u64 => "const float*",
        pub dt_bias: u64 => "const float*",
        /// `[Dv]`.
        pub norm_w: u64 => "const float*",
        /// `[S + 1]`: each sequence's first new-token row.
        pub seq_start: u64 => "const int*",
        /// `[S]`: each sequence's state slot.
        pub seq_slot: u64 => "const int*",
        /// `[T]`: a slot that also receives the state after the token, or -1.
        pub token_ckpt: u64 => "const int*",
        pub hk: i32 => "int",
        pub hv: i32 => "int",
        pub q_scale: f32 => "float",
        pub eps: f32 => "float",
        /// The gated norm's activation of z: 0 SiLU, 1 sigmoid (`GdnGate`).
        pub sigmoid_gate: i32 => "int",
    }

    /// `gdn_recurrent`: the token-by-token delta rule after the conv.
    pub struct GdnRecurrentArgs {
        /// `[T, Hv*Dv]`, before the gated norm.
        pub core: u64 => "float*",
        /// `[T, conv_dim]`: the conv output.
        pub qkv: u64 => "const float*",
        /// `[T, proj_stride]`, for b and a.
        pub proj: u64 => "const float*",
        pub proj_stride: i32 => "int",
        pub b_offset: i32 => "int",
        pub a_offset: i32 => "int",
        pub a_log: u64 => "const float*",
        pub dt_bias: u64 => "const float*",
        pub state: u64 => "float*",
        pub seq_start: u64 => "const int*",
        pub seq_slot: u64 => "const int*",
        pub token_ckpt: u64 => "const int*",
        pub hk: i32 => "int",
        pub hv: i32 => "int",
        pub dk: i32 => "int",
        pub dv: i32 => "int",
    }

    /// `moe_gate_up` / `moe_gate_up_f16` / `moe_gate_up_fp8`: SwiGLU
    /// activations of each token's picked experts and the shared one
    /// (decode path). The weight pointers are `uint16_t` matrices, or FP8
    /// codes (bytes) in the `_fp8` kernel, which also reads the scales.
    pub struct MoeGateUpArgs {
        /// `[T, items, act_ld]`.
        pub act: u64 => "float*",
        /// `[T, top_k]`: written here when the block routes, else read.
        pub ids: u64 => "int*",
        pub weights: u64 => "float*",
        /// `[T, logits_ld]` router logits, or null: routed beforehand.
        pub logits: u64 => "const float*",
        /// `[T, hidden]`.
        pub x: u64 => "const float*",
        /// `[E, 2 * inter, hidden]`.
        pub w_gate_up: u64 => "const void*",
        /// `[2 * shared_inter, hidden]`, or null.
        pub w_shared: u64 => "const void*",
        /// FP8 only: the block scales of `w_gate_up` (`[E * 2 * inter / 128,
        /// hidden / 128]`) and of `w_shared`; null otherwise.
        pub s_gate_up: u64 => "const float*",
        pub s_shared: u64 => "const float*",
        pub logits_ld: i32 => "int",
        pub experts: i32 => "int",
        pub renormalize: i32 => "int",
        pub hidden: i32 => "int",
        pub inter: i32 => "int",
        pub shared_inter: i32 => "int",
        pub top_k: i32 => "int",
        pub act_ld: i32 => "int",
        /// Intermediate rows per block (even).
        pub rows_per_block: i32 => "int",
    }

    /// `moe_down` / `moe_down_f16` / `moe_down_fp8`: down projections,
    /// weighted and added (weights as in `MoeGateUpArgs`).
    pub struct MoeDownArgs {
        /// `[T, hidden]`.
        pub out: u64 => "float*",
        pub act: u64 => "const float*",
        pub ids: u64 => "const int*",
        pub weights: u64 => "const float*",
        /// Router logits, for the shared-expert gate at column `gate_col`.
        pub logits: u64 => "const float*",
        /// `[E, hidden, inter]`.
        pub w_down: u64 => "const void*",
        pub w_shared: u64 => "const void*",
        /// FP8 only: the block scales of `w_down` (`[E * hidden / 128,
        /// ceil(inter / 128)]`) and of `w_shared`; null otherwise.
        pub s_down: u64 => "const float*",
        pub s_shared: u64 => "const float*",
        pub logits_ld: i32 => "int",
        /// Below 0: no shared-expert gate.
        pub gate_col: i32 => "int",
        pub hidden: i32 => "int",
        pub inter: i32 => "int",
        pub shared_inter: i32 => "int",
        pub top_k: i32 => "int",
        pub act_ld: i32 => "int",
        /// Hidden rows per block (a multiple of 8).
        pub rows_per_block: i32 => "int",
    }

    /// `hc_norm`: what comes before a Flash-Next sublayer, the previous
    /// sublayer's output added to the streams, their grouped RMSNorm and the
    /// inject logits.
    pub struct HcNormArgs {
        /// `[T, streams * hidden]`: the normalised streams.
        pub normed: u64 => "float*",
        /// `[T, streams]`, or null without an inject projection.
        pub logits: u64 => "float*",
        /// `[T, streams * hidden]`: the streams, updated in place.
        pub x: u64 => "float*",
        /// `[T, hidden]`: the previous sublayer's output, or null.
        pub out: u64 => "const float*",
        /// `[T, streams]`: its inject logits (read with `out`).
        pub out_logits: u64 => "const float*",
        /// `[streams * hidden]`, plain form (`1 + w`).
        pub norm_w: u64 => "const float*",
        /// `[streams, streams * hidden]`, 16-bit, or null.
        pub inject: u64 => "const uint16_t*",
        /// 1: `inject` holds f16 values; 0: bf16.
        pub inject_f16: i32 => "int",
        pub hidden: i32 => "int",
        pub streams: i32 => "int",
        pub eps: f32 => "float",
    }

    /// `hc_low_rank` and `hc_gate_mix`: a Flash-Next hyper-connection's
    /// low-rank gate and stream mean for a decode-shaped step.
    pub struct HcGateArgs {
        /// `[T, streams * hidden]`: the normalised streams.
        pub normed: u64 => "const float*",
        /// `[T, rank]`: `silu(down(normed) / streams)`, written by
        /// `hc_low_rank`, read by `hc_gate_mix`.
        pub low: u64 => "float*",
        /// `[rank, streams * hidden]`, 16-bit.
        pub down: u64 => "const uint16_t*",
        /// `[streams * hidden, rank]`, 16-bit.
        pub up: u64 => "const uint16_t*",
        /// `[T, hidden]`: the sublayer input.
        pub mixed: u64 => "float*",
        /// 1: the weights hold f16 values; 0: bf16.
        pub f16: i32 => "int",
        pub rows: i32 => "int",
        pub rank: i32 => "int",
        pub hidden: i32 => "int",
        pub streams: i32 => "int",
    }

    /// `gdn_chunk_state` and `gdn_chunk_state_wg`: the pass over chunks.
    pub struct GdnChunkStateArgs {
        pub core: u64 => "float*",
        pub scratch: u64 => "const float*",
        pub state: u64 => "float*",
        pub seq_start: u64 => "const int*",
        pub seq_slot: u64 => "const int*",
        pub hv: i32 => "int",
        pub tc: i32 => "int",
        /// The conv inputs whose state to advance when the preparation
        /// computed the conv (else `conv_state` is null).
        pub conv_x: u64 => "const float*",
        pub conv_x_stride: i32 => "int",
        pub conv_state: u64 => "float*",
        pub conv_kernel: i32 => "int",
        pub hk: i32 => "int",
        /// `[T]`, or null when the step has no checkpoints: a slot that
        /// receives the state after the token; only rows that end a chunk
        /// before the run's last may have one (`SeqChunk::state_snapshot`).
        pub token_ckpt: u64 => "const int*",
    }
}

/// `kestrel_abi.h`, the header `build.rs` writes for the kernels, as its
/// `Display` form.
pub struct Header;

impl core::fmt::Display for Header {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(
            f,
            "// Generated by kestrel-kernels' build script from src/abi.rs: do not edit."
        )?;
        writeln!(f, "#pragma once")?;
        writeln!(f, "#include <cstddef>")?;
        writeln!(f, "#include <cstdint>")?;
        writeln!(f, "#include <cuda_bf16.h>")?;
        writeln!(f)?;
        for c in CONSTANTS {
            writeln!(f, "// {}", c.doc.trim())?;
            writeln!(f, "constexpr int {} = {};", c.name, c.value)?;
        }
        for r in RECORDS {
            writeln!(f)?;
            writeln!(f, "struct {} {{", r.name)?;
            for field in r.fields {
                writeln!(f, "    {} {};", field.c_type, field.name)?;
            }
            writeln!(f, "}};")?;
            writeln!(
                f,
                "static_assert(sizeof({0}) == {1} && alignof({0}) == {2}, \"{0}: size or alignment differs from src/abi.rs\");",
                r.name, r.size, r.align
            )?;
            for field in r.fields {
                writeln!(
                    f,
                    "static_assert(offsetof({0}, {1}) == {2}, \"{0}.{1}: offset differs from src/abi.rs\");",
                    r.name, field.name, field.offset
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_packed_in_declaration_order_and_fit_a_launch_argument() {
        for r in RECORDS {
            let mut end = 0;
            for f in r.fields {
                let width = match f.c_type {
                    "int" | "float" => 4,
                    t if t.ends_with('*') => 8,
                    t => panic!("{}.{}: C type {t} has no known width", r.name, f.name),
                };
                assert!(
                    f.offset >= end,
                    "{}.{} overlaps the field before it",
                    r.name,
                    f.name
                );
                assert!(
                    f.offset.is_multiple_of(width),
                    "{}.{} is misaligned",
                    r.name,
                    f.name
                );
                // Padding only where C would put it: before an 8-byte field.
                assert!(
                    f.offset - end < width,
                    "{}.{}: unexpected padding",
                    r.name,
                    f.name
                );
                end = f.offset + width;
            }
            assert_eq!(r.size, end.next_multiple_of(r.align), "{}: size", r.name);
            // What `Arg::record` carries (and far below the kernel limit of 4 KB).
            assert!(r.size <= 128, "{} is {} bytes", r.name, r.size);
        }
    }

    #[test]
    fn the_header_declares_every_record_and_constant_with_its_checks() {
        let h = Header.to_string();
        for r in RECORDS {
            assert!(h.contains(&format!("struct {} {{", r.name)), "{}", r.name);
            assert!(h.contains(&format!("sizeof({}) == {}", r.name, r.size)));
            for f in r.fields {
                assert!(h.contains(&format!("    {} {};", f.c_type, f.name)));
                assert!(h.contains(&format!("offsetof({}, {}) == {}", r.name, f.name, f.offset)));
            }
        }
        for c in CONSTANTS {
            assert!(h.contains(&format!("constexpr int {} = {};", c.name, c.value)));
        }
    }
}
