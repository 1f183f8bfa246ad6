//! `--quantization fp8`, shared by the commands that load a model: vLLM's
//! flag, with the one method kestrel has.

use kestrel_models::Quantization;

#[derive(clap::Args, Clone, Copy, Debug)]
pub struct QuantizationArgs {
    /// `fp8`: quantise the linear-layer weights of a BF16 checkpoint to
    /// block-FP8 while loading (e4m3, one scale per 128x128 block, as in
    /// Qwen's -FP8 checkpoints; embeddings, lm_head, norms, router and the
    /// other exceptions stay as stored); with `--load-format dummy`, random
    /// FP8 weights and scales. FP8 checkpoints load as FP8 without it.
    #[arg(long, value_enum)]
    quantization: Option<QuantMethod>,
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
}
