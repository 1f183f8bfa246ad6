//! Activations and weights on the GPU.
//!
//! Activations are f32 `[rows, cols]`: simple and exact enough to track the CPU
//! reference; matrix products round them to bf16 on the way into cuBLAS.
//! Weights: matrices (2-D and up) are stored bf16 whatever the checkpoint's
//! dtype, except that an f16 checkpoint keeps f16 matrices when uploaded
//! under `Precision::F32` (exact; only the decode-style kernels that
//! precision uses read them); vectors (norm weights, `A_log`, `dt_bias`) are
//! stored f32. Block-FP8 matrices (`kestrel_core::fp8`) keep their e4m3
//! codes and block scales: the decode kernels read them as they are, and
//! products without an FP8 kernel read a bf16 copy made for the call
//! (`ops::fp8::bf16_matrix`).

use std::borrow::Cow;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use kestrel_core::{BackendError, DType, HostTensor, Result};

pub struct CudaTensor {
    pub rows: usize,
    pub cols: usize,
    pub buf: CudaSlice<f32>,
    /// The same values rounded to bf16, written by the kernel that produced
    /// `buf` when a cuBLAS product (a prefill) is expected to read it, so
    /// that the product needs no conversion pass; `None` otherwise. Ops that
    /// change `buf` in place clear it.
    pub bf16: Option<CudaSlice<u16>>,
}

pub enum WeightData {
    /// bf16 bit patterns.
    Bf16(CudaSlice<u16>),
    /// f16 bit patterns (see the module docs).
    F16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    /// Block-FP8: e4m3 codes in the weight's shape, and one f32 scale per
    /// 128 x 128 block, `[.., ceil(rows / 128), ceil(cols / 128)]`.
    Fp8 {
        codes: CudaSlice<u8>,
        scale_inv: CudaSlice<f32>,
    },
    /// A matrix whose rows are those of several matrices of different
    /// formats, in order, all as long: a Gated DeltaNet in_proj of an FP8
    /// checkpoint, its q/k/v and z rows block-FP8 and its b and a rows bf16
    /// (`Backend::stack_rows`). Products take it part by part
    /// (`ops::linear`).
    Stacked(Vec<CudaWeight>),
}

/// The element format of a matrix weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Bf16,
    F16,
    Fp8,
}

/// A matrix weight as kernels take it: the device address of its elements
/// and, for FP8, of its block scales (0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub ptr: u64,
    pub scales: u64,
    pub format: Format,
}

impl Matrix {
    /// A 16-bit matrix at `ptr`.
    pub fn half(ptr: u64, format: Format) -> Self {
        debug_assert!(format != Format::Fp8, "an FP8 matrix needs its scales");
        Matrix {
            ptr,
            scales: 0,
            format,
        }
    }
}

pub struct CudaWeight {
    pub shape: Vec<usize>,
    pub data: WeightData,
}

impl CudaWeight {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn dim0(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// A bf16 matrix, for paths that read nothing else (an FP8 weight goes
    /// through `ops::fp8::bf16_matrix` there).
    pub fn bf16(&self, what: &str) -> &CudaSlice<u16> {
        match &self.data {
            WeightData::Bf16(b) => b,
            WeightData::F16(_) => panic!(
                "{what}: this path reads bf16 weights, but they were uploaded as f16 \
                 (an f16 checkpoint loaded under the f32 precision runs with that precision only)"
            ),
            WeightData::Fp8 { .. } | WeightData::Stacked(_) => {
                panic!("{what}: an FP8 or stacked weight where a bf16 copy was expected")
            }
            WeightData::F32(_) => panic!(
                "{what}: expected a matrix weight, got a vector of shape {:?}",
                self.shape
            ),
        }
    }

    /// The matrix format, `None` for a vector or a stacked matrix (whose
    /// parts each have theirs).
    pub fn format(&self) -> Option<Format> {
        match &self.data {
            WeightData::Bf16(_) => Some(Format::Bf16),
            WeightData::F16(_) => Some(Format::F16),
            WeightData::Fp8 { .. } => Some(Format::Fp8),
            WeightData::F32(_) | WeightData::Stacked(_) => None,
        }
    }

    /// The rows of `parts` in order, as one matrix (`Backend::stack_rows`):
    /// a part already stacked gives its own parts.
    pub fn stack_rows(parts: Vec<CudaWeight>) -> Result<CudaWeight> {
        let mut flat = Vec::with_capacity(parts.len());
        for part in parts {
            match part.data {
                WeightData::Stacked(inner) => flat.extend(inner),
                _ => flat.push(part),
            }
        }
        let cols = match flat.first() {
            Some(p) if p.shape.len() == 2 => p.shape[1],
            _ => {
                return Err(BackendError::Invalid(
                    "stack_rows: no matrix to stack".into(),
                ));
            }
        };
        if let Some(p) = flat
            .iter()
            .find(|p| p.shape.len() != 2 || p.shape[1] != cols || p.format().is_none())
        {
            return Err(BackendError::Invalid(format!(
                "stack_rows: a part of shape {:?} among matrices with rows of {cols}",
                p.shape
            )));
        }
        let rows = flat.iter().map(|p| p.shape[0]).sum();
        Ok(CudaWeight {
            shape: vec![rows, cols],
            data: WeightData::Stacked(flat),
        })
    }

    /// The matrices whose rows make up this one, in order: its parts when
    /// stacked, else itself.
    pub fn parts(&self) -> &[CudaWeight] {
        match &self.data {
            WeightData::Stacked(parts) => parts,
            _ => std::slice::from_ref(self),
        }
    }

    /// The matrix as kernels take it, its addresses on stream `s`.
    pub fn matrix(&self, what: &str, s: &CudaStream) -> Matrix {
        let p16 = |b: &CudaSlice<u16>| crate::device::ptr(b, s);
        match &self.data {
            WeightData::Bf16(b) => Matrix::half(p16(b), Format::Bf16),
            WeightData::F16(b) => Matrix::half(p16(b), Format::F16),
            WeightData::Fp8 { codes, scale_inv } => Matrix {
                ptr: crate::device::ptr(codes, s),
                scales: crate::device::ptr(scale_inv, s),
                format: Format::Fp8,
            },
            WeightData::F32(_) => panic!(
                "{what}: expected a matrix weight, got a vector of shape {:?}",
                self.shape
            ),
            WeightData::Stacked(_) => {
                panic!("{what}: this path takes a matrix of one format, not one stacked from parts")
            }
        }
    }

    pub fn f32(&self, what: &str) -> &CudaSlice<f32> {
        match &self.data {
            WeightData::F32(b) => b,
            WeightData::Bf16(_)
            | WeightData::F16(_)
            | WeightData::Fp8 { .. }
            | WeightData::Stacked(_) => panic!(
                "{what}: expected a vector weight, got a matrix of shape {:?}",
                self.shape
            ),
        }
    }
}

/// Host-side conversion of an uploaded tensor to the stored element type.
/// 16-bit matrices already in the stored type are the host bytes themselves,
/// viewed as `u16` (no copy on the uploading thread) when they are aligned.
pub enum Converted<'a> {
    Bf16(Cow<'a, [u16]>),
    F16(Cow<'a, [u16]>),
    F32(Vec<f32>),
}

/// Little-endian 16-bit values: borrowed where the bytes allow it.
fn bits_of(b: &[u8]) -> Cow<'_, [u16]> {
    match bytemuck::try_cast_slice::<u8, u16>(b) {
        Ok(bits) if cfg!(target_endian = "little") => Cow::Borrowed(bits),
        _ => Cow::Owned(
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
    }
}

/// Validate the byte length and convert: vectors to f32, matrices to bf16.
/// With `keep_f16`, f16 matrices whose rows are a multiple of 8 values stay
/// f16: those are the ones the f16 kernels (16-byte row loads) read; others
/// (e.g. Gated DeltaNet's `[C, 1, 4]` conv) go to bf16-only kernels.
pub fn convert<'a>(t: &'a HostTensor, keep_f16: bool) -> Result<Converted<'a>> {
    let expected = t.numel() * t.dtype.size();
    if t.data.len() != expected {
        return Err(BackendError::Invalid(format!(
            "{:?} tensor of shape {:?} needs {expected} bytes, got {}",
            t.dtype,
            t.shape,
            t.data.len()
        )));
    }
    if t.shape.len() <= 1 {
        return Ok(Converted::F32(t.to_f32()));
    }
    let b = &t.data[..];
    let row = t.shape.last().copied().unwrap_or(0);
    if keep_f16 && t.dtype == DType::F16 && row.is_multiple_of(8) {
        return Ok(Converted::F16(bits_of(b)));
    }
    let bits = match t.dtype {
        DType::BF16 => return Ok(Converted::Bf16(bits_of(b))),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32()).to_bits())
            .collect(),
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_bits())
            .collect(),
    };
    Ok(Converted::Bf16(Cow::Owned(bits)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn tensor(dtype: DType, shape: &[usize], data: Vec<u8>) -> HostTensor<'static> {
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: Cow::Owned(data),
        }
    }

    #[test]
    fn vectors_become_f32_whatever_their_dtype() {
        let v = [1.5f32, -2.25, 3.0];
        let t = tensor(
            DType::BF16,
            &[3],
            v.iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
        );
        match convert(&t, false).unwrap() {
            Converted::F32(got) => assert_eq!(got, v),
            Converted::Bf16(_) | Converted::F16(_) => panic!("a vector must be stored f32"),
        }
    }

    #[test]
    fn bf16_matrices_are_uploaded_from_the_host_bytes_aligned_or_not() {
        let want: Vec<u16> = (0..64u16).map(|i| i * 1031).collect();
        let bytes: Vec<u8> = want.iter().flat_map(|b| b.to_le_bytes()).collect();
        let aligned = HostTensor {
            dtype: DType::BF16,
            shape: vec![8, 8],
            data: Cow::Borrowed(bytemuck::cast_slice(&want)),
        };
        let Converted::Bf16(bits) = convert(&aligned, false).unwrap() else {
            panic!("a bf16 matrix must stay bf16")
        };
        assert!(
            matches!(bits, Cow::Borrowed(_)),
            "aligned bytes are not copied"
        );
        assert_eq!(&bits[..], &want[..]);
        // The same bytes one byte into a buffer: copied, same values.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        let odd = HostTensor {
            dtype: DType::BF16,
            shape: vec![8, 8],
            data: Cow::Borrowed(&shifted[1..]),
        };
        let Converted::Bf16(bits) = convert(&odd, false).unwrap() else {
            panic!("a bf16 matrix must stay bf16")
        };
        assert_eq!(&bits[..], &want[..]);
    }

    #[test]
    fn matrices_become_bf16_with_round_to_nearest() {
        // 1 + 2^-9 is halfway between two bf16 values: ties go to even (1.0);
        // 1 + 3*2^-9 rounds up to 1 + 2^-7.
        let v = [1.0f32 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-9), -0.5, 7.0];
        let t = tensor(
            DType::F32,
            &[2, 2],
            v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        );
        let Converted::Bf16(bits) = convert(&t, false).unwrap() else {
            panic!("a matrix must be stored bf16")
        };
        let got: Vec<f32> = bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
        assert_eq!(got, [1.0, 1.0 + 2f32.powi(-7), -0.5, 7.0]);

        let h = [0.333f32, -65504.0];
        let t = tensor(
            DType::F16,
            &[1, 2],
            h.iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        );
        let Converted::Bf16(bits) = convert(&t, false).unwrap() else {
            panic!("a matrix must be stored bf16")
        };
        for (&b, &x) in bits.iter().zip(&h) {
            let want = bf16::from_f32(f16::from_f32(x).to_f32());
            assert_eq!(bf16::from_bits(b), want);
        }
    }

    #[test]
    fn f16_matrices_stay_f16_only_when_asked() {
        let bits_in = [0x3555u16, 0xfbff, 0, 1, 2, 3, 0x8001, 0x7bff];
        let t = tensor(
            DType::F16,
            &[1, 8],
            bits_in.iter().flat_map(|b| b.to_le_bytes()).collect(),
        );
        let Converted::F16(bits) = convert(&t, true).unwrap() else {
            panic!("an f16 matrix must stay f16 when asked")
        };
        assert_eq!(&bits[..], &bits_in[..]);
        assert!(matches!(convert(&t, false).unwrap(), Converted::Bf16(_)));
        // Vectors are f32 either way.
        let v = tensor(DType::F16, &[8], t.data.to_vec());
        assert!(matches!(convert(&v, true).unwrap(), Converted::F32(_)));
        // Rows the f16 kernels cannot load (a conv's [C, 1, 4]) go to bf16.
        let conv = tensor(DType::F16, &[2, 1, 4], vec![0; 16]);
        assert!(matches!(convert(&conv, true).unwrap(), Converted::Bf16(_)));
    }

    #[test]
    fn bf16_matrices_keep_their_bits() {
        let bits_in = [0x3f80u16, 0xc000, 0x7f7f, 0x0001];
        let t = tensor(
            DType::BF16,
            &[2, 2],
            bits_in.iter().flat_map(|b| b.to_le_bytes()).collect(),
        );
        let Converted::Bf16(bits) = convert(&t, false).unwrap() else {
            panic!("a matrix must be stored bf16")
        };
        assert_eq!(&bits[..], &bits_in[..]);
    }

    #[test]
    fn wrong_byte_length_is_an_error() {
        let t = tensor(DType::F32, &[2, 2], vec![0u8; 12]);
        let err = convert(&t, false)
            .err()
            .expect("short data must be rejected");
        assert!(err.to_string().contains("needs 16 bytes"), "{err}");
    }
}
