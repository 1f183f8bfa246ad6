//! Weights onto the device: a checkpoint's tensors converted to the stored
//! element type (`tensor::convert`), and dummy weights drawn on the device.

use kestrel_core::{BackendError, DType, HostTensor, Result};

use crate::tensor::{self, Converted, WeightData};
use crate::{CudaBackend, CudaWeight, Precision, probe};

impl CudaBackend {
    /// `Backend::upload`: matrices bf16 (f16 kept under the f32
    /// precision), vectors f32.
    pub(crate) fn upload_tensor(&self, t: &HostTensor) -> Result<CudaWeight> {
        let keep_f16 = self.plan.precision == Precision::F32;
        let data = match tensor::convert(t, keep_f16)? {
            Converted::Bf16(bits) => WeightData::Bf16(self.try_upload(&bits[..])?),
            Converted::F16(bits) => WeightData::F16(self.try_upload(&bits[..])?),
            Converted::F32(v) => WeightData::F32(self.try_upload(&v)?),
        };
        Ok(CudaWeight {
            shape: t.shape.clone(),
            data,
        })
    }

    /// `Backend::dummy_weight`: drawn on the device, except f16-rounded
    /// vectors, rare enough to build on the host.
    pub(crate) fn draw_dummy(
        &self,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        offset: f32,
        scale: f32,
    ) -> Result<CudaWeight> {
        if shape.len() <= 1 && dtype == DType::F16 {
            let n: usize = shape.iter().product();
            let v: Vec<u8> = (0..n as u64)
                .flat_map(|i| {
                    let x = kestrel_core::dummy::dummy_value(seed, i, offset, scale);
                    half::f16::from_f32(x).to_le_bytes()
                })
                .collect();
            return self.upload_tensor(&HostTensor {
                dtype,
                shape: shape.to_vec(),
                data: v.into(),
            });
        }
        probe::dummy_weight(
            &self.gpu,
            &self.kernels.probe,
            shape,
            dtype,
            seed,
            offset,
            scale,
        )
    }

    /// Upload with an out-of-memory error instead of a panic.
    fn try_upload<T: cudarc::driver::DeviceRepr>(
        &self,
        data: &[T],
    ) -> Result<cudarc::driver::CudaSlice<T>> {
        if data.is_empty() {
            return Ok(self.gpu.alloc_zeros(1));
        }
        self.gpu.stream.clone_htod(data).map_err(|e| {
            BackendError::OutOfMemory(format!("uploading {} elements: {e:?}", data.len()))
        })
    }
}
