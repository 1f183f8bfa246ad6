//! `--quantization fp8` and `--lm-head-dtype`, shared by the commands that
//! load a model: vLLM's flag, with the one method kestrel has, and the
//! opt-in FP8 lm_head.

use kestrel_models::{Quantization, WeightForm};

#[derive(clap::Args, Clone, Copy, Debug)]
pub struct QuantizationArgs {
    /// `fp8`: quantise the linear-layer weights of a BF16 checkpoint to
    /// block-FP8 while loading (e4m3, one scale per 128x128 block, as in
    /// Qwen's -FP8 checkpoints; embeddings, lm_head, norms, router and the
    /// other exceptions stay as stored); with `--load-format dummy`, random
    /// FP8 weights and scales. FP8 checkpoints load as FP8 without it.
    #[arg(long, value_enum)]
    quantization: Option<QuantMethod>,
    /// `fp8`: the lm_head quantised to block-FP8 while loading (half its
    /// bytes a token; the logits change by the rounding of its weights,
    /// which is why it is off by default). `auto`: as the checkpoint stores
    /// it (BF16 in Qwen's FP8 checkpoints too).
    #[arg(long, value_enum, default_value = "auto")]
    lm_head_dtype: LmHeadDtype,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LmHeadDtype {
    Auto,
    Fp8,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum QuantMethod {
    Fp8,
}

impl QuantizationArgs {
    pub fn get(&self) -> Quantization {
        match self.quantization {
            Some(QuantMethod::Fp8) => Quantization::Fp8,
            None => Quantization::AsStored,
        }
    }

    /// The weights' form, the lm_head's included.
    pub fn form(&self) -> WeightForm {
        WeightForm {
            quantization: self.get(),
            lm_head_fp8: self.lm_head_dtype == LmHeadDtype::Fp8,
        }
    }
}
