//! Qwen3 model definitions, written once against `kestrel_core::Backend`.
//!
//! - [`config`]: `config.json` of qwen3, qwen3_moe, qwen3_5_moe and qwen3_next.
//! - [`weights`]: safetensors files, memory-mapped and bounds-checked.
//! - [`blocks`]: attention, Gated DeltaNet, dense and MoE feed-forward.
//! - [`decoder`]: the layer stack shared by all four architectures.
//! - [`mtp`]: the Qwen3.5/3.6 multi-token-prediction head.

pub mod blocks;
pub mod config;
pub mod decoder;
pub mod loader;
pub mod mtp;
pub mod runner;
pub mod transform;
pub mod weights;

use std::path::Path;

use anyhow::{Context, Result};
use kestrel_core::Backend;

pub use config::{Arch, LayerKind, ModelConfig};
pub use decoder::Decoder;
pub use mtp::MtpHead;
pub use weights::WeightFiles;

/// A loaded model: the decoder and, when the checkpoint has one, its MTP head.
pub struct Model<B: Backend> {
    pub decoder: Decoder<B>,
    pub mtp: Option<MtpHead<B>>,
}

impl<B: Backend> Model<B> {
    /// Load `config.json` and the safetensors weights of a model folder.
    pub fn load(dir: &Path, backend: &B) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let files = WeightFiles::open(dir)?;
        let loader = loader::Loader {
            files: &files,
            backend,
            zero_centred_norms: config.arch.is_hybrid(),
        };
        let decoder = Decoder::load(&loader, &config)
            .with_context(|| format!("cannot load model from {}", dir.display()))?;
        let mtp = if config.mtp_layers > 0 && files.contains("mtp.fc.weight") {
            Some(MtpHead::load(&loader, &config)?)
        } else {
            None
        };
        Ok(Model { decoder, mtp })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.decoder.config
    }
}
