//! Block-FP8 weights: the format of Qwen's official `-FP8` checkpoints.
//!
//! A quantised matrix `W [rows, cols]` is stored as e4m3 codes (OCP
//! `float8_e4m3fn`: no infinities, one NaN code per sign, largest finite
//! value 448) with one f32 scale per `block` of rows x columns, named
//! `scale_inv` as in the checkpoints: `W[r][c] = e4m3(code[r][c]) *
//! scale_inv[r / b0][c / b1]`. Edge blocks are partial, so the scale grid is
//! `[ceil(rows / b0), ceil(cols / b1)]`. Stacks of experts carry leading
//! dimensions on both (`[E, rows, cols]` and `[E, ceil.., ceil..]`).
//!
//! Dequantising is exact by definition: the e4m3 value widened to f32 and
//! multiplied by its scale in f32, which is what the CPU reference uses.
//! Quantising (for `--quantization fp8` at load time) follows the rule the
//! official checkpoints are made with: per block, `scale_inv = amax / 448`,
//! codes rounded to nearest (ties to even) from `w / scale_inv`.

use std::borrow::Cow;

use crate::{DType, HostTensor};

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The only block shape kestrel reads (Qwen's and DeepSeek's).
pub const BLOCK: [usize; 2] = [128, 128];

/// The value of an e4m3 code (NaN for the two NaN codes).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = (code >> 3) & 0x0f;
    let mantissa = (code & 0x07) as f32;
    if exponent == 0x0f && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exponent == 0 {
        mantissa * (1.0 / 512.0)
    } else {
        (1.0 + mantissa / 8.0) * f32::powi(2.0, exponent as i32 - 7)
    };
    sign * magnitude
}

/// The nearest e4m3 code to `x` (ties to even), saturating at ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below the smallest normal (2^-6) the step is 2^-9; a result of 8 is
    // the smallest normal's code, so the formula carries over.
    if a < 1.0 / 64.0 {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let exponent = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    // Exact: scaling by a power of two, then a 3-bit shift of the fraction.
    let fraction = (a / f32::powi(2.0, exponent) - 1.0) * 8.0;
    let mut m = fraction.round_ties_even() as i32;
    let mut e = exponent + 7;
    if m == 8 {
        m = 0;
        e += 1;
    }
    sign | ((e << 3) as u8 | m as u8).min(0x7e)
}

/// The scale grid of a quantised tensor of `shape`.
pub fn scale_shape(shape: &[usize], block: [usize; 2]) -> Vec<usize> {
    let n = shape.len();
    let mut s = shape.to_vec();
    if n >= 2 {
        s[n - 2] = shape[n - 2].div_ceil(block[0]);
        s[n - 1] = shape[n - 1].div_ceil(block[1]);
    }
    s
}

/// A block-FP8 tensor in host memory, `[.., rows, cols]`.
#[derive(Clone, Debug)]
pub struct BlockFp8<'a> {
    pub shape: Vec<usize>,
    /// e4m3 codes, row-major.
    pub codes: Cow<'a, [u8]>,
    pub block: [usize; 2],
    /// `[.., ceil(rows / b0), ceil(cols / b1)]`, row-major.
    pub scale_inv: Vec<f32>,
}

impl<'a> BlockFp8<'a> {
    /// Checks that codes and scales fit `shape`.
    pub fn new(
        shape: Vec<usize>,
        codes: Cow<'a, [u8]>,
        block: [usize; 2],
        scale_inv: Vec<f32>,
    ) -> Result<Self, String> {
        let numel: usize = shape.iter().product();
        let scales: usize = scale_shape(&shape, block).iter().product();
        if shape.len() < 2 || block[0] == 0 || block[1] == 0 {
            return Err(format!(
                "block-FP8 tensor of shape {shape:?} must be a matrix"
            ));
        }
        if codes.len() != numel || scale_inv.len() != scales {
            return Err(format!(
                "block-FP8 tensor of shape {shape:?} needs {numel} codes and {scales} scales, got {} and {}",
                codes.len(),
                scale_inv.len()
            ));
        }
        Ok(BlockFp8 {
            shape,
            codes,
            block,
            scale_inv,
        })
    }

    /// Rows of one matrix.
    pub fn rows(&self) -> usize {
        self.shape[self.shape.len() - 2]
    }

    pub fn cols(&self) -> usize {
        self.shape[self.shape.len() - 1]
    }

    /// Rows of all matrices, one after the other.
    pub fn total_rows(&self) -> usize {
        self.codes.len() / self.cols().max(1)
    }

    /// Scale columns of one row of blocks.
    pub fn scale_cols(&self) -> usize {
        self.cols().div_ceil(self.block[1])
    }

    /// The scale row of global row `r` (rows of all matrices in order).
    pub fn scale_row(&self, r: usize) -> usize {
        let (rows, br) = (self.rows(), self.block[0]);
        (r / rows) * rows.div_ceil(br) + (r % rows) / br
    }

    /// Writes the values of global rows `first..first + out.len() / cols`.
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        let (cols, sc, bc) = (self.cols(), self.scale_cols(), self.block[1]);
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            let r = first + i;
            let scales = &self.scale_inv[self.scale_row(r) * sc..][..sc];
            let codes = &self.codes[r * cols..(r + 1) * cols];
            for (c, (v, &code)) in row.iter_mut().zip(codes).enumerate() {
                *v = e4m3_to_f32(code) * scales[c / bc];
            }
        }
    }

    /// Every value, as an f32 tensor of the same shape.
    pub fn dequantize(&self) -> HostTensor<'static> {
        let mut values = vec![0f32; self.codes.len()];
        self.dequantize_rows(0, &mut values);
        HostTensor::from_f32(self.shape.clone(), &values)
    }

    /// `t` quantised with the official rule (see the module docs); the
    /// scales are f32.
    pub fn quantize(t: &HostTensor, block: [usize; 2]) -> BlockFp8<'static> {
        let values = t.to_f32();
        let (rows, cols) = matrix_dims(&t.shape);
        let mut codes = vec![0u8; values.len()];
        let mut scale_inv = Vec::new();
        let band = block[0] * cols;
        for (m, matrix) in values.chunks(rows * cols).enumerate() {
            for (b, rows_in) in matrix.chunks(band).enumerate() {
                let start = m * rows * cols + b * band;
                let out = &mut codes[start..start + rows_in.len()];
                scale_inv.extend(quantize_band(rows_in, cols, block[1], out));
            }
        }
        BlockFp8 {
            shape: t.shape.clone(),
            codes: Cow::Owned(codes),
            block,
            scale_inv,
        }
    }

    pub fn into_owned(self) -> BlockFp8<'static> {
        BlockFp8 {
            codes: Cow::Owned(self.codes.into_owned()),
            ..self
        }
    }
}

/// Rows and columns of each matrix of a tensor of `shape` (a vector is one
/// row; a stack's leading dimensions count matrices), each at least 1.
pub fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let rows = shape.len().checked_sub(2).map_or(1, |i| shape[i]).max(1);
    (rows, cols)
}

/// Quantises one band of up to `block[0]` rows (`values`, `cols` wide)
/// into `codes`; returns the band's scales.
pub fn quantize_band(values: &[f32], cols: usize, block_cols: usize, codes: &mut [u8]) -> Vec<f32> {
    let scales: Vec<f32> = (0..cols.div_ceil(block_cols))
        .map(|b| {
            let amax = values
                .chunks_exact(cols)
                .flat_map(|row| &row[b * block_cols..((b + 1) * block_cols).min(cols)])
                .fold(0f32, |m, v| m.max(v.abs()));
            // An all-zero block: any scale gives zero codes.
            if amax > 0.0 { amax / E4M3_MAX } else { 1.0 }
        })
        .collect();
    for (i, (code, &v)) in codes.iter_mut().zip(values).enumerate() {
        *code = f32_to_e4m3(v / scales[(i % cols) / block_cols]);
    }
    scales
}

/// A parameter as a loader hands it to a backend: dense, or block-FP8.
#[derive(Clone, Debug)]
pub enum HostWeight<'a> {
    Dense(HostTensor<'a>),
    BlockFp8(BlockFp8<'a>),
}

impl<'a> HostWeight<'a> {
    pub fn shape(&self) -> &[usize] {
        match self {
            HostWeight::Dense(t) => &t.shape,
            HostWeight::BlockFp8(q) => &q.shape,
        }
    }

    /// Bytes held: data plus scales.
    pub fn byte_len(&self) -> usize {
        match self {
            HostWeight::Dense(t) => t.data.len(),
            HostWeight::BlockFp8(q) => q.codes.len() + 4 * q.scale_inv.len(),
        }
    }

    /// A dense tensor: itself, or the exact dequantised values in f32.
    pub fn into_dense(self) -> HostTensor<'a> {
        match self {
            HostWeight::Dense(t) => t,
            HostWeight::BlockFp8(q) => q.dequantize(),
        }
    }

    /// Every value widened to f32 (dequantised where quantised).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostWeight::Dense(t) => t.to_f32(),
            HostWeight::BlockFp8(q) => {
                let mut v = vec![0f32; q.codes.len()];
                q.dequantize_rows(0, &mut v);
                v
            }
        }
    }

    pub fn into_owned(self) -> HostWeight<'static> {
        match self {
            HostWeight::Dense(t) => HostWeight::Dense(t.into_owned()),
            HostWeight::BlockFp8(q) => HostWeight::BlockFp8(q.into_owned()),
        }
    }

    /// The dtype of a dense weight; `None` for block-FP8.
    pub fn dense_dtype(&self) -> Option<DType> {
        match self {
            HostWeight::Dense(t) => Some(t.dtype),
            HostWeight::BlockFp8(_) => None,
        }
    }
}

impl<'a> From<HostTensor<'a>> for HostWeight<'a> {
    fn from(t: HostTensor<'a>) -> Self {
        HostWeight::Dense(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let v = e4m3_to_f32(code);
            if v.is_nan() {
                assert!(code & 0x7f == 0x7f, "{code:#x}");
                continue;
            }
            // Negative zero encodes as itself.
            assert_eq!(f32_to_e4m3(v), code, "{code:#x} = {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
    }

    #[test]
    fn encoding_picks_the_nearest_code_and_ties_to_even() {
        let finite: Vec<(u8, f32)> = (0..=0x7eu8).map(|c| (c, e4m3_to_f32(c))).collect();
        for i in 0..20_000 {
            let x = (i as f32 * 0.0371).sin() * 2f32.powi(i % 19 - 10);
            let code = f32_to_e4m3(x);
            let got = e4m3_to_f32(code);
            let best = finite
                .iter()
                .map(|&(_, v)| (v - x.abs().min(448.0)).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((got.abs() - x.abs().min(448.0)).abs(), best, "x = {x}");
        }
        // 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1).
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        assert_eq!(f32_to_e4m3(1e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
    }

    #[test]
    fn quantising_keeps_each_block_within_half_a_step() {
        // Three row blocks and three column blocks, the last ones partial.
        let (rows, cols) = (300, 260);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 * 0.61).sin() * (1 + i / 9000) as f32) * 0.05)
            .collect();
        let t = HostTensor::from_f32(vec![rows, cols], &values);
        let q = BlockFp8::quantize(&t, BLOCK);
        assert_eq!(scale_shape(&q.shape, BLOCK), vec![3, 3]);
        assert_eq!(q.scale_inv.len(), 9);
        let back = q.dequantize().to_f32();
        for (i, (&v, &b)) in values.iter().zip(&back).enumerate() {
            let s = q.scale_inv[(i / cols / 128) * 3 + (i % cols) / 128];
            // e4m3 keeps 3 mantissa bits: relative error at most 2^-4.
            assert!(
                (v - b).abs() <= v.abs() / 16.0 + s / 1024.0,
                "{i}: {v} vs {b}"
            );
        }
        // The block's largest magnitude lands exactly on 448 * scale.
        let block0 = (0..128)
            .flat_map(|r| (0..128).map(move |c| r * cols + c))
            .map(|i| values[i].abs())
            .fold(0f32, f32::max);
        assert_eq!(q.scale_inv[0], block0 / 448.0);
    }

    #[test]
    fn stacked_matrices_index_their_own_scales() {
        let (e, rows, cols) = (3, 130, 20);
        let values: Vec<f32> = (0..e * rows * cols)
            .map(|i| (i % 97) as f32 * (1 + i / (rows * cols)) as f32)
            .collect();
        let t = HostTensor::from_f32(vec![e, rows, cols], &values);
        let q = BlockFp8::quantize(&t, BLOCK);
        assert_eq!(q.scale_inv.len(), e * 2);
        assert_eq!(q.scale_row(rows), 2);
        assert_eq!(q.scale_row(rows + 129), 3);
        let one = BlockFp8::quantize(
            &HostTensor::from_f32(vec![rows, cols], &values[rows * cols..2 * rows * cols]),
            BLOCK,
        );
        assert_eq!(&q.scale_inv[2..4], &one.scale_inv[..]);
        assert_eq!(&q.codes[rows * cols..2 * rows * cols], &one.codes[..]);
    }
}
