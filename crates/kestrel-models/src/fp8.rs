//! Block-FP8 checkpoints (Qwen's official `-FP8` releases) and FP8 at load
//! time; the format itself is `kestrel_core::fp8`.
//!
//! - [`QuantConfig`]: `quantization_config` of `config.json`. Only the
//!   official format is read (`quant_method: fp8`, `fmt: e4m3`,
//!   `weight_block_size: [128, 128]`, `activation_scheme: dynamic`); any
//!   other is refused with its name and the config file.
//! - [`check_checkpoint`]: before anything is read, every `*_scale_inv` has
//!   its F8_E4M3 weight and every F8_E4M3 weight its scale, of the grid its
//!   shape needs and a dtype the file states (f32 or bf16). Tensors the
//!   checkpoint keeps in BF16 (lm_head, embeddings, norms, router, GDN
//!   `in_proj_a/b`, conv, `A_log`, `dt_bias`, `mtp.fc`, ...) have no scale
//!   and load as they are; which ones is read from the file, not assumed.
//! - [`quantizable`]: the weights the official checkpoints quantise, by
//!   name: what `--quantization fp8` quantises at load time and what a
//!   dummy FP8 model draws as FP8.

use std::borrow::Cow;
use std::path::Path;

use anyhow::{Context, Result, bail};
use kestrel_core::fp8::{BLOCK, E4M3_MAX, f32_to_e4m3, matrix_dims, quantize_band, scale_shape};
use kestrel_core::{BlockFp8, DType, HostTensor, HostWeight, dummy};
use rayon::prelude::*;
use serde_json::Value;

use crate::weights::{Stored, WeightFiles};

/// The suffix of a quantised weight's scale tensor.
pub const SCALE_SUFFIX: &str = "_scale_inv";

/// Where the weights of a model come from and in which form they are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantization {
    /// As the checkpoint stores them (block-FP8 where it is FP8).
    #[default]
    AsStored,
    /// Dense weights quantised to block-FP8 while loading (`--quantization fp8`).
    Fp8,
}

/// The form the weights are used in: `--quantization` and `--lm-head-dtype`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightForm {
    pub quantization: Quantization,
    /// The lm_head quantised to block-FP8 while loading (or drawn as FP8 in
    /// dummy mode), whatever the checkpoint stores; with tied embeddings the
    /// embedding stays as stored and the head is a quantised copy of it.
    /// Official FP8 checkpoints keep the lm_head BF16: this changes the
    /// model's logits (by the rounding of the head's weights to e4m3), which
    /// is why it is opt-in.
    pub lm_head_fp8: bool,
}

impl From<Quantization> for WeightForm {
    fn from(quantization: Quantization) -> Self {
        WeightForm {
            quantization,
            lm_head_fp8: false,
        }
    }
}

/// The name suffix of a weight loaded a second time as block-FP8 (the
/// lm_head of `--lm-head-dtype fp8`); the part before `#` is the stored name.
pub const FP8_COPY_SUFFIX: &str = "#fp8";

/// A checkpoint's `quantization_config` (the official block-FP8 one).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    pub modules_to_not_convert: Vec<String>,
}

impl QuantConfig {
    /// `None` for a checkpoint without `quantization_config`.
    pub fn from_file(path: &Path) -> Result<Option<Self>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let root: Value = serde_json::from_str(&text)
            .with_context(|| format!("invalid model config {}", path.display()))?;
        let q = root
            .get("quantization_config")
            .or_else(|| root.get("text_config")?.get("quantization_config"));
        q.map(|q| Self::parse(q, path)).transpose()
    }

    fn parse(q: &Value, path: &Path) -> Result<Self> {
        let field = |k: &str| q.get(k).cloned().unwrap_or(Value::Null);
        let method = field("quant_method");
        let expected = "kestrel reads quant_method \"fp8\" with fmt \"e4m3\", \
                        weight_block_size [128, 128] and activation_scheme \"dynamic\"";
        if method != "fp8" {
            bail!(
                "{}: unsupported quantization: quant_method {method} ({expected})",
                path.display()
            );
        }
        let unsupported = |what: &str, value: Value| {
            anyhow::anyhow!(
                "{}: unsupported quantization: quant_method \"fp8\" with {what} {value} ({expected})",
                path.display()
            )
        };
        let fmt = field("fmt");
        if !(fmt.is_null() || fmt == "e4m3" || fmt == "float8_e4m3fn") {
            return Err(unsupported("fmt", fmt));
        }
        let block = field("weight_block_size");
        if block != serde_json::json!([128, 128]) {
            return Err(unsupported("weight_block_size", block));
        }
        let scheme = field("activation_scheme");
        if !(scheme.is_null() || scheme == "dynamic") {
            return Err(unsupported("activation_scheme", scheme));
        }
        let modules_to_not_convert = match field("modules_to_not_convert") {
            Value::Null => vec![],
            Value::Array(v) => v
                .iter()
                .map(|m| m.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .with_context(|| {
                    format!(
                        "{}: modules_to_not_convert must be a list of module names",
                        path.display()
                    )
                })?,
            other => bail!(
                "{}: modules_to_not_convert must be a list, got {other}",
                path.display()
            ),
        };
        Ok(QuantConfig {
            modules_to_not_convert,
        })
    }

    /// Whether `tensor` belongs to a module listed in `modules_to_not_convert`
    /// (whole dotted components: `mlp.gate` is not `mlp.gate_proj`).
    pub fn keeps_dense(&self, tensor: &str) -> bool {
        let parts: Vec<&str> = tensor.split('.').collect();
        self.modules_to_not_convert.iter().any(|m| {
            let want: Vec<&str> = m.split('.').collect();
            parts.windows(want.len()).any(|w| w == want.as_slice())
        })
    }
}

/// Whether the official checkpoints quantise this weight (a linear layer's
/// matrix other than the BF16 exceptions), by its name.
pub fn quantizable(name: &str) -> bool {
    let base = name.split('#').next().unwrap_or(name);
    let experts = base.ends_with("experts.gate_up_proj") || base.ends_with("experts.down_proj");
    // Gated DeltaNet's input projections are named by what they make
    // (`in_proj_qkv`, `in_proj_z`, Qwen3-Next's `in_proj_qkvz`).
    let gdn_input = [
        "in_proj_qkv.weight",
        "in_proj_z.weight",
        "in_proj_qkvz.weight",
    ]
    .iter()
    .any(|x| base.ends_with(x));
    let linear = (base.ends_with("_proj.weight") || gdn_input)
        && !base.starts_with("mtp.fc")
        && !base.contains("visual.")
        && !["in_proj_a.", "in_proj_b.", "in_proj_ba."]
            .iter()
            .any(|x| base.contains(x));
    experts || linear
}

/// Checks the FP8 tensors of a checkpoint against each other and against
/// its `quantization_config` (see the module docs).
pub fn check_checkpoint(files: &WeightFiles, config: Option<&QuantConfig>) -> Result<()> {
    let mut names: Vec<&str> = files.names().collect();
    names.sort_unstable();
    for name in names {
        let file = files.file_of(name).display();
        let (stored, shape) = files.stored(name).expect("listed tensor");
        if let Some(weight) = name.strip_suffix(SCALE_SUFFIX) {
            match files.stored(weight) {
                Some((Stored::F8E4M3, _)) => {}
                Some((dtype, _)) => bail!(
                    "{file}: scale tensor {name} belongs to {weight}, which is {dtype}, not F8_E4M3"
                ),
                None => bail!("{file}: scale tensor {name} has no weight {weight}"),
            }
            continue;
        }
        if stored != Stored::F8E4M3 {
            continue;
        }
        let Some(config) = config else {
            bail!("{file}: tensor {name} is F8_E4M3 but config.json has no quantization_config")
        };
        if config.keeps_dense(name) {
            bail!("{file}: tensor {name} is F8_E4M3 but its module is in modules_to_not_convert");
        }
        let scale = format!("{name}{SCALE_SUFFIX}");
        let Some((scale_dtype, scale_dims)) = files.stored(&scale) else {
            bail!("{file}: FP8 weight {name} has no scale tensor {scale}")
        };
        let want = scale_shape(shape, BLOCK);
        if shape.len() < 2 || scale_dims != want {
            bail!(
                "{}: scale tensor {scale} has shape {scale_dims:?}; weight {name} of shape {shape:?} \
                 needs {want:?} (one scale per 128x128 block)",
                files.file_of(&scale).display()
            );
        }
        if !matches!(scale_dtype, Stored::Dense(DType::F32 | DType::BF16)) {
            bail!(
                "{}: scale tensor {scale} is {scale_dtype} (expected F32 or BF16)",
                files.file_of(&scale).display()
            );
        }
    }
    Ok(())
}

/// Reads a block-FP8 weight and its scales into `codes` (a buffer of the
/// weight's length); also returns the bytes read.
pub fn read(
    files: &WeightFiles,
    name: &str,
    shape: &[usize],
    mut codes: Vec<u8>,
) -> Result<(BlockFp8<'static>, usize)> {
    files.read_into(name, &mut codes)?;
    let scale_name = format!("{name}{SCALE_SUFFIX}");
    let scale = files.get(&scale_name, &scale_shape(shape, BLOCK))?;
    let read = codes.len() + scale.data.len();
    let q = BlockFp8::new(shape.to_vec(), Cow::Owned(codes), BLOCK, scale.to_f32())
        .map_err(|e| anyhow::anyhow!("{}: {name}: {e}", files.file_of(name).display()))?;
    Ok((q, read))
}

/// Rows handled by one parallel task of quantising or dequantising.
const ROWS_PER_TASK: usize = 128;

/// [`BlockFp8::quantize`] with the bands of rows on all cores.
pub fn quantize(t: &HostTensor) -> BlockFp8<'static> {
    let values = t.to_f32();
    let (rows, cols) = matrix_dims(&t.shape);
    // Bands never straddle two matrices of a stack.
    let bands: Vec<(usize, usize)> = (0..values.len() / cols / rows)
        .flat_map(|m| {
            (0..rows)
                .step_by(BLOCK[0])
                .map(move |r| (m * rows + r, (rows - r).min(BLOCK[0])))
        })
        .collect();
    let mut codes = vec![0u8; values.len()];
    let mut places = Vec::with_capacity(bands.len());
    let mut rest = &mut codes[..];
    for &(_, n) in &bands {
        let (place, after) = rest.split_at_mut(n * cols);
        places.push(place);
        rest = after;
    }
    let scale_inv: Vec<f32> = places
        .into_par_iter()
        .zip(bands.par_iter())
        .flat_map_iter(|(place, &(first, n))| {
            quantize_band(
                &values[first * cols..(first + n) * cols],
                cols,
                BLOCK[1],
                place,
            )
        })
        .collect();
    BlockFp8 {
        shape: t.shape.clone(),
        codes: Cow::Owned(codes),
        block: BLOCK,
        scale_inv,
    }
}

/// The exact values of `q` as a dense tensor of `dtype` (rounded once from
/// the f32 product where `dtype` is narrower), on all cores.
pub fn dequantize(q: &BlockFp8, dtype: DType) -> HostTensor<'static> {
    let cols = q.cols().max(1);
    let mut data = vec![0u8; q.codes.len() * dtype.size()];
    data.par_chunks_mut(ROWS_PER_TASK * cols * dtype.size())
        .enumerate()
        .for_each(|(i, out)| {
            let mut values = vec![0f32; out.len() / dtype.size()];
            q.dequantize_rows(i * ROWS_PER_TASK, &mut values);
            match dtype {
                DType::F32 => out.copy_from_slice(bytemuck::cast_slice(&values)),
                DType::BF16 => out
                    .chunks_exact_mut(2)
                    .zip(&values)
                    .for_each(|(o, &v)| o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
                DType::F16 => out
                    .chunks_exact_mut(2)
                    .zip(&values)
                    .for_each(|(o, &v)| o.copy_from_slice(&half::f16::from_f32(v).to_le_bytes())),
            }
        });
    HostTensor {
        dtype,
        shape: q.shape.clone(),
        data: Cow::Owned(data),
    }
}

/// A weight in the form a backend takes it (see
/// `Backend::fp8_dequantize_to`).
pub fn for_backend(w: HostWeight<'_>, dequantize_to: Option<DType>) -> HostWeight<'_> {
    match (w, dequantize_to) {
        (HostWeight::BlockFp8(q), Some(dtype)) => HostWeight::Dense(dequantize(&q, dtype)),
        (w, _) => w,
    }
}

/// A random block-FP8 weight of `shape` drawn from `seed`: codes of values
/// uniform in `[-448, 448)` and scales near `scale / 448` ([`dummy_scales`]),
/// so that values spread like the dense dummy weights of the same `scale`.
pub fn dummy_weight(shape: &[usize], seed: u64, scale: f32) -> BlockFp8<'static> {
    let numel: usize = shape.iter().product();
    let mut codes = vec![0u8; numel];
    codes
        .par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(chunk, out)| {
            let base = (chunk << 20) as u64;
            for (i, c) in out.iter_mut().enumerate() {
                *c = f32_to_e4m3(dummy::dummy_value(seed, base + i as u64, 0.0, E4M3_MAX));
            }
        });
    BlockFp8 {
        shape: shape.to_vec(),
        codes: Cow::Owned(codes),
        block: BLOCK,
        scale_inv: dummy_scales(shape, seed, scale),
    }
}

/// The block scales of [`dummy_weight`] (a backend that draws the codes on
/// the device takes these from the host: they are few).
pub fn dummy_scales(shape: &[usize], seed: u64, scale: f32) -> Vec<f32> {
    let scales: usize = scale_shape(shape, BLOCK).iter().product();
    let scale_seed = dummy::mix64(seed ^ 0x5ca1e);
    (0..scales as u64)
        .map(|i| dummy::dummy_value(scale_seed, i, 1.0, 0.1) * scale / E4M3_MAX)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::quantizable;

    /// The official FP8 checkpoints' split, tensor by tensor (Qwen3.5/3.6
    /// and Qwen3-Next names; `docs/fp8.md`).
    #[test]
    fn quantizable_names_the_official_fp8_weights() {
        let l = "model.language_model.layers.0.";
        for name in [
            "linear_attn.in_proj_qkv.weight",
            "linear_attn.in_proj_z.weight",
            "linear_attn.in_proj_qkvz.weight",
            "linear_attn.out_proj.weight",
            "self_attn.q_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.shared_expert.gate_proj.weight",
            "mlp.experts.7.down_proj.weight",
            "mlp.experts.gate_up_proj",
        ] {
            assert!(quantizable(&format!("{l}{name}")), "{name} is FP8");
        }
        for name in [
            "linear_attn.in_proj_a.weight",
            "linear_attn.in_proj_b.weight",
            "linear_attn.in_proj_ba.weight",
            "linear_attn.conv1d.weight",
            "linear_attn.A_log",
            "linear_attn.norm.weight",
            "mlp.gate.weight",
            "mlp.shared_expert_gate.weight",
            "input_layernorm.weight",
        ] {
            assert!(!quantizable(&format!("{l}{name}")), "{name} stays BF16");
        }
        assert!(!quantizable("mtp.fc.weight"));
        assert!(!quantizable("lm_head.weight"));
        assert!(!quantizable("model.language_model.embed_tokens.weight"));
    }
}
