//! Names and shapes of checkpoint tensors, uploaded to a backend.

use anyhow::{Context, Result};
use kestrel_core::{Backend, HostTensor};

use crate::transform;
use crate::weights::WeightFiles;

pub struct Loader<'a, B: Backend> {
    pub files: &'a WeightFiles,
    pub backend: &'a B,
    /// Zero-centred decoder norms (`1 + w`), as in Qwen3.5 and Qwen3-Next.
    pub zero_centred_norms: bool,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<HostTensor<'a>> {
        self.files.get(name, shape)
    }

    pub fn upload(&self, name: &str, t: &HostTensor) -> Result<B::Weight> {
        self.backend
            .upload(t)
            .with_context(|| format!("{}: cannot upload tensor {name}", self.files.file_of(name).display()))
    }

    /// A matrix `[out, in]` (or any fixed shape), uploaded as stored.
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        let t = self.tensor(name, shape)?;
        self.upload(name, &t)
    }

    /// A 1-D parameter kept in f32 (decays, biases of recurrences).
    pub fn vector_f32(&self, name: &str, len: usize) -> Result<B::Weight> {
        let t = self.tensor(name, &[len])?;
        self.upload(name, &transform::to_f32_plus(&t, 0.0))
    }

    /// A decoder RMSNorm weight in the plain form the backends use.
    pub fn norm(&self, name: &str, len: usize) -> Result<B::Weight> {
        let t = self.tensor(name, &[len])?;
        let offset = if self.zero_centred_norms { 1.0 } else { 0.0 };
        self.upload(name, &transform::to_f32_plus(&t, offset))
    }

    /// Several matrices stacked along rows, uploaded as one.
    pub fn fused(&self, parts: &[(&str, &[usize])]) -> Result<B::Weight> {
        let tensors = parts
            .iter()
            .map(|(n, s)| self.tensor(n, s))
            .collect::<Result<Vec<_>>>()?;
        let fused = transform::concat_rows(&tensors)
            .with_context(|| format!("cannot fuse {}", parts[0].0))?;
        self.upload(parts[0].0, &fused)
    }
}
