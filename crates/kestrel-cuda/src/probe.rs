//! Device-side helpers that are not model operations: dummy weights filled
//! on the GPU and a memory-bandwidth probe for benchmark floors.

use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUevent_flags;
use kestrel_core::{BackendError, DType, Result};

use crate::device::{Gpu, function, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaWeight, WeightData};

/// The kernels of `dummy.cu`.
pub struct ProbeKernels {
    pub dummy_fill_bf16: CudaFunction,
    pub dummy_fill_f32: CudaFunction,
}

impl ProbeKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::DUMMY, "dummy")?;
        Ok(ProbeKernels {
            dummy_fill_bf16: function(&m, "dummy_fill_bf16")?,
            dummy_fill_f32: function(&m, "dummy_fill_f32")?,
        })
    }
}

/// Enough blocks to fill the chip; the kernels loop over the rest.
const FILL_GRID: u32 = 132 * 16;

/// A weight of `shape` with `kestrel_core::dummy` values, generated on the
/// device. Stored like an upload: vectors f32 (rounded through bf16 when
/// `dtype` is BF16, as an uploaded bf16 vector would be), matrices bf16.
pub fn dummy_weight(
    gpu: &Gpu,
    k: &ProbeKernels,
    shape: &[usize],
    dtype: DType,
    seed: u64,
    offset: f32,
    scale: f32,
) -> Result<CudaWeight> {
    let n: usize = shape.iter().product();
    let grid = (FILL_GRID.min(n.div_ceil(256).max(1) as u32), 1, 1);
    let data = if shape.len() <= 1 {
        let buf = try_alloc::<f32>(gpu, n)?;
        let round = i32::from(dtype == DType::BF16);
        gpu.launch(
            &k.dummy_fill_f32,
            grid,
            256,
            0,
            &[
                Arg::Ptr(ptr(&buf, &gpu.stream)),
                Arg::U64(n as u64),
                Arg::U64(seed),
                Arg::F32(offset),
                Arg::F32(scale),
                Arg::I32(round),
            ],
        );
        WeightData::F32(buf)
    } else {
        let buf = try_alloc::<u16>(gpu, n)?;
        gpu.launch(
            &k.dummy_fill_bf16,
            grid,
            256,
            0,
            &[
                Arg::Ptr(ptr(&buf, &gpu.stream)),
                Arg::U64(n as u64),
                Arg::U64(seed),
                Arg::F32(offset),
                Arg::F32(scale),
            ],
        );
        WeightData::Bf16(buf)
    };
    Ok(CudaWeight {
        shape: shape.to_vec(),
        data,
    })
}

fn try_alloc<T: cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    n: usize,
) -> Result<cudarc::driver::CudaSlice<T>> {
    unsafe { gpu.stream.alloc::<T>(n.max(1)) }.map_err(|e| {
        BackendError::OutOfMemory(format!(
            "allocating {n} elements of {} bytes: {e:?}",
            size_of::<T>()
        ))
    })
}

/// Memory bandwidth in GB/s: a 2 GiB device-to-device copy timed with
/// events (median of 10 after 3 warm-ups), counting bytes read plus bytes
/// written. On HBM this total is close to the rate of a pure streaming read,
/// which is what a decode step's weight reads can reach at best.
pub fn measure_bandwidth_gbs(gpu: &Gpu) -> Option<f64> {
    let bytes: usize = 2 << 30;
    let src = try_alloc::<u8>(gpu, bytes).ok()?;
    let dst = try_alloc::<u8>(gpu, bytes).ok()?;
    gpu.fill_bytes(ptr(&src, &gpu.stream), 0x5a, bytes);
    let (s, d) = (ptr(&src, &gpu.stream), ptr(&dst, &gpu.stream));
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = Vec::new();
    for i in 0..13 {
        let start = gpu.stream.record_event(timing).ok()?;
        gpu.copy_dtod(d, s, bytes);
        let end = gpu.stream.record_event(timing).ok()?;
        let ms = start.elapsed_ms(&end).ok()? as f64;
        if i >= 3 {
            times.push(ms);
        }
    }
    times.sort_by(f64::total_cmp);
    let ms = times[times.len() / 2];
    Some(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
}
