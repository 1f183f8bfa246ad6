//! Host-side tensors: weights as they come off disk, before a backend takes them.

use std::borrow::Cow;

/// Element types that model files may store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// A dense row-major tensor in host memory. `data` may borrow an mmap.
#[derive(Clone, Debug)]
pub struct HostTensor<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Cow<'a, [u8]>,
}

impl<'a> HostTensor<'a> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Build an f32 tensor that owns its data.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> HostTensor<'static> {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        HostTensor {
            dtype: DType::F32,
            shape,
            data: Cow::Owned(bytemuck::cast_slice(values).to_vec()),
        }
    }

    /// Every element widened to f32 (exact for all supported dtypes).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.data[..];
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }

    pub fn into_owned(self) -> HostTensor<'static> {
        HostTensor {
            dtype: self.dtype,
            shape: self.shape,
            data: Cow::Owned(self.data.into_owned()),
        }
    }
}
