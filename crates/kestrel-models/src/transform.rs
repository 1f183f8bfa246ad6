//! Host-side rearrangements applied while loading: checkpoint layouts are
//! turned into the layouts the fused operations expect, once, at load time.
//!
//! They take weights in either form. A block-FP8 weight stays block-FP8
//! when the rows moved are whole 128-row blocks (as in the full-size
//! models, whose head and projection sizes are multiples of 128): codes and
//! scales move together. Otherwise a block would be cut, and the weight is
//! dequantised (exactly, to f32) first, which changes no value.

use std::borrow::Cow;

use anyhow::{Result, bail};
use kestrel_core::{BlockFp8, HostTensor, HostWeight};

fn row_bytes(t: &HostTensor) -> usize {
    t.shape[1..].iter().product::<usize>() * t.dtype.size()
}

/// Stack weights along the first dimension (all must share trailing dims).
pub fn concat_rows(parts: &[HostWeight]) -> Result<HostWeight<'static>> {
    let fp8: Vec<&BlockFp8> = parts
        .iter()
        .filter_map(|p| match p {
            HostWeight::BlockFp8(q) => Some(q),
            HostWeight::Dense(_) => None,
        })
        .collect();
    if fp8.is_empty() {
        let dense: Vec<&HostTensor> = parts.iter().filter_map(dense_part).collect();
        return Ok(concat_dense(&dense)?.into());
    }
    let first = fp8[0];
    let whole_blocks = fp8.len() == parts.len()
        && fp8
            .iter()
            .all(|q| q.shape.len() == 2 && q.cols() == first.cols() && q.block == first.block)
        && fp8[..fp8.len() - 1]
            .iter()
            .all(|q| q.rows().is_multiple_of(q.block[0]));
    if whole_blocks {
        let rows = fp8.iter().map(|q| q.rows()).sum();
        return Ok(HostWeight::BlockFp8(BlockFp8 {
            shape: vec![rows, first.cols()],
            codes: Cow::Owned(fp8.iter().flat_map(|q| q.codes.iter().copied()).collect()),
            block: first.block,
            scale_inv: fp8
                .iter()
                .flat_map(|q| q.scale_inv.iter().copied())
                .collect(),
        }));
    }
    let dense: Vec<HostTensor> = parts.iter().map(|p| p.clone().into_dense()).collect();
    Ok(concat_dense(&dense.iter().collect::<Vec<_>>())?.into())
}

fn dense_part<'a>(w: &'a HostWeight) -> Option<&'a HostTensor<'a>> {
    match w {
        HostWeight::Dense(t) => Some(t),
        HostWeight::BlockFp8(_) => None,
    }
}

fn concat_dense(parts: &[&HostTensor]) -> Result<HostTensor<'static>> {
    let Some(first) = parts.first() else {
        bail!("nothing to concatenate")
    };
    let tail = &first.shape[1..];
    if parts
        .iter()
        .any(|p| p.shape.is_empty() || &p.shape[1..] != tail)
    {
        let shapes: Vec<_> = parts.iter().map(|p| p.shape.clone()).collect();
        bail!("cannot stack tensors of shapes {shapes:?}");
    }
    let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
    let mut shape = vec![rows];
    shape.extend_from_slice(tail);
    if parts.iter().all(|p| p.dtype == first.dtype) {
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(&p.data);
        }
        return Ok(HostTensor {
            dtype: first.dtype,
            shape,
            data: Cow::Owned(data),
        });
    }
    let values: Vec<f32> = parts.iter().flat_map(|p| p.to_f32()).collect();
    Ok(HostTensor::from_f32(shape, &values))
}

/// New weight whose row `i` is row `order[i]` of `w`.
pub fn gather_rows(w: &HostWeight, order: &[usize]) -> HostWeight<'static> {
    match w {
        HostWeight::Dense(t) => gather_dense(t, order).into(),
        HostWeight::BlockFp8(q) => match gather_blocks(q, order) {
            Some(q) => HostWeight::BlockFp8(q),
            None => gather_dense(&q.dequantize(), order).into(),
        },
    }
}

/// The gather as whole blocks of rows, if `order` moves only whole blocks
/// (the last block of the matrix may be partial, and then comes last).
fn gather_blocks(q: &BlockFp8, order: &[usize]) -> Option<BlockFp8<'static>> {
    let (rows, cols, br) = (q.rows(), q.cols(), q.block[0]);
    if q.shape.len() != 2 {
        return None;
    }
    let chunks: Vec<&[usize]> = order.chunks(br).collect();
    let mut codes = Vec::with_capacity(order.len() * cols);
    let mut scale_inv = Vec::new();
    let sc = q.scale_cols();
    for (i, chunk) in chunks.iter().enumerate() {
        let start = chunk[0];
        let consecutive = chunk.iter().enumerate().all(|(k, &r)| r == start + k);
        let whole = chunk.len() == br || (start + chunk.len() == rows && i + 1 == chunks.len());
        if !start.is_multiple_of(br) || !consecutive || !whole {
            return None;
        }
        codes.extend_from_slice(&q.codes[start * cols..(start + chunk.len()) * cols]);
        scale_inv.extend_from_slice(&q.scale_inv[(start / br) * sc..][..sc]);
    }
    Some(BlockFp8 {
        shape: vec![order.len(), cols],
        codes: Cow::Owned(codes),
        block: q.block,
        scale_inv,
    })
}

fn gather_dense(t: &HostTensor, order: &[usize]) -> HostTensor<'static> {
    let rb = row_bytes(t);
    let mut data = Vec::with_capacity(order.len() * rb);
    for &r in order {
        data.extend_from_slice(&t.data[r * rb..(r + 1) * rb]);
    }
    let mut shape = t.shape.clone();
    shape[0] = order.len();
    HostTensor {
        dtype: t.dtype,
        shape,
        data: Cow::Owned(data),
    }
}

/// The same values viewed with another shape of equal size. A block-FP8
/// weight keeps its blocks when the matrices it is split into (or joined
/// from) are whole blocks of rows, as a stack of experts is.
pub fn reshape<'a>(w: HostWeight<'a>, shape: &[usize]) -> Result<HostWeight<'a>> {
    if w.shape().iter().product::<usize>() != shape.iter().product::<usize>() {
        bail!("cannot view shape {:?} as {shape:?}", w.shape());
    }
    let q = match w {
        HostWeight::Dense(t) => {
            return Ok(HostTensor {
                shape: shape.to_vec(),
                ..t
            }
            .into());
        }
        HostWeight::BlockFp8(q) => q,
    };
    let n = shape.len();
    let same_matrices = n >= 2 && shape[n - 2..] == q.shape[q.shape.len() - 2..];
    let aligned = n >= 2
        && shape[n - 1] == q.cols()
        && shape[n - 2].is_multiple_of(q.block[0])
        && q.rows().is_multiple_of(q.block[0]);
    if same_matrices || aligned {
        return Ok(HostWeight::BlockFp8(BlockFp8 {
            shape: shape.to_vec(),
            ..q
        }));
    }
    reshape(q.dequantize().into(), shape)
}

/// An f32 copy with `offset` added: turns a zero-centred `1 + w` RMSNorm weight
/// into the plain form (exactly what the reference computes in f32).
pub fn to_f32_plus(t: &HostWeight, offset: f32) -> HostTensor<'static> {
    let values: Vec<f32> = t.to_f32().into_iter().map(|v| v + offset).collect();
    HostTensor::from_f32(t.shape().to_vec(), &values)
}

#[cfg(test)]
mod tests {
    use kestrel_core::fp8::BLOCK;

    use super::*;

    fn fp8(rows: usize, cols: usize, seed: usize) -> HostWeight<'static> {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7 + seed) as f32 * 0.37).sin() * (1 + (i / cols) / 100) as f32)
            .collect();
        let t = HostTensor::from_f32(vec![rows, cols], &values);
        HostWeight::BlockFp8(BlockFp8::quantize(&t, BLOCK))
    }

    fn is_fp8(w: &HostWeight) -> bool {
        matches!(w, HostWeight::BlockFp8(_))
    }

    #[test]
    fn whole_blocks_of_rows_move_with_their_scales() {
        let (a, b) = (fp8(256, 200, 1), fp8(130, 200, 2));
        let joined = concat_rows(&[a.clone(), b.clone()]).unwrap();
        assert!(is_fp8(&joined));
        let want: Vec<f32> = a.to_f32().into_iter().chain(b.to_f32()).collect();
        assert_eq!(joined.to_f32(), want);
        // Blocks 2 and 0 of `joined`, then its partial last block.
        let order: Vec<usize> = (256..384).chain(0..128).chain(384..386).collect();
        let gathered = gather_rows(&joined, &order);
        assert!(is_fp8(&gathered));
        let dense = gather_rows(&joined.clone().into_dense().into(), &order);
        assert_eq!(gathered.to_f32(), dense.to_f32());
        // A stack of two [128, 200] matrices viewed as [2, 128, 200].
        let stacked = reshape(
            concat_rows(&[fp8(128, 200, 3), fp8(128, 200, 4)]).unwrap(),
            &[2, 128, 200],
        )
        .unwrap();
        assert!(is_fp8(&stacked));
        let HostWeight::BlockFp8(q) = &stacked else {
            unreachable!()
        };
        assert_eq!(
            q.scale_row(128),
            1,
            "the second matrix starts the second row of blocks"
        );
    }

    #[test]
    fn cut_blocks_are_dequantised_to_the_same_values() {
        let (a, b) = (fp8(100, 64, 5), fp8(28, 64, 6));
        let joined = concat_rows(&[a.clone(), b.clone()]).unwrap();
        assert!(!is_fp8(&joined), "100 rows cut a block");
        let want: Vec<f32> = a.to_f32().into_iter().chain(b.to_f32()).collect();
        assert_eq!(joined.to_f32(), want);
        let order: Vec<usize> = (0..100).rev().collect();
        let gathered = gather_rows(&a, &order);
        assert!(!is_fp8(&gathered));
        let values = a.to_f32();
        let want: Vec<f32> = order
            .iter()
            .flat_map(|&r| values[r * 64..(r + 1) * 64].to_vec())
            .collect();
        assert_eq!(gathered.to_f32(), want);
        let mixed = concat_rows(&[
            fp8(128, 64, 7),
            HostTensor::from_f32(vec![2, 64], &[0.5; 128]).into(),
        ])
        .unwrap();
        assert!(!is_fp8(&mixed), "FP8 and dense parts");
        assert_eq!(&mixed.to_f32()[128 * 64..], &[0.5; 128][..]);
    }
}
