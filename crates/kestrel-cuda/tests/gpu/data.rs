//! Random inputs and host tensors for the checks.

use std::borrow::Cow;

use half::{bf16, f16};
use kestrel_core::{DType, HostTensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Data {
    pub rng: ChaCha8Rng,
}

impl Data {
    pub fn seeded(seed: u64) -> Self {
        Data {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Standard normal values (Box-Muller), scaled.
    pub fn randn(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1: f32 = self.rng.random_range(f32::EPSILON..1.0);
                let u2: f32 = self.rng.random();
                (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * scale
            })
            .collect()
    }

    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.random_range(lo..hi)).collect()
    }

    pub fn index(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    /// A matrix stored as bf16, the checkpoints' usual type: both backends then
    /// hold identical weights and differences come from the kernels alone.
    pub fn mat_bf16(&mut self, shape: &[usize], scale: f32) -> HostTensor<'static> {
        let v = self.randn(shape.iter().product(), scale);
        bf16_tensor(shape, &v)
    }

    /// A matrix stored as f16 or f32: the CUDA backend rounds it to bf16 on upload.
    pub fn mat_other(&mut self, shape: &[usize], scale: f32, dtype: DType) -> HostTensor<'static> {
        let v = self.randn(shape.iter().product(), scale);
        let data: Vec<u8> = match dtype {
            DType::F16 => v
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
            DType::F32 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
            DType::BF16 => return bf16_tensor(shape, &v),
        };
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: Cow::Owned(data),
        }
    }

    /// A 1-D f32 vector around `center`.
    pub fn vector(&mut self, n: usize, center: f32, scale: f32) -> HostTensor<'static> {
        let v: Vec<f32> = self
            .randn(n, scale)
            .into_iter()
            .map(|x| x + center)
            .collect();
        HostTensor::from_f32(vec![n], &v)
    }
}

pub fn bf16_tensor(shape: &[usize], v: &[f32]) -> HostTensor<'static> {
    let data = v
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    HostTensor {
        dtype: DType::BF16,
        shape: shape.to_vec(),
        data: Cow::Owned(data),
    }
}
