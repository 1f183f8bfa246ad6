//! Host-side rearrangements applied while loading: checkpoint layouts are
//! turned into the layouts the fused operations expect, once, at load time.

use std::borrow::Cow;

use anyhow::{Result, bail};
use kestrel_core::HostTensor;

fn row_bytes(t: &HostTensor) -> usize {
    t.shape[1..].iter().product::<usize>() * t.dtype.size()
}

/// Stack tensors along the first dimension (all must share trailing dims).
pub fn concat_rows(parts: &[HostTensor]) -> Result<HostTensor<'static>> {
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

/// New tensor whose row `i` is row `order[i]` of `t`.
pub fn gather_rows(t: &HostTensor, order: &[usize]) -> HostTensor<'static> {
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

/// The same bytes viewed with another shape of equal size.
pub fn reshape<'a>(t: HostTensor<'a>, shape: &[usize]) -> Result<HostTensor<'a>> {
    if t.numel() != shape.iter().product::<usize>() {
        bail!("cannot view shape {:?} as {shape:?}", t.shape);
    }
    Ok(HostTensor {
        shape: shape.to_vec(),
        ..t
    })
}

/// An f32 copy with `offset` added: turns a zero-centred `1 + w` RMSNorm weight
/// into the plain form (exactly what the reference computes in f32).
pub fn to_f32_plus(t: &HostTensor, offset: f32) -> HostTensor<'static> {
    let values: Vec<f32> = t.to_f32().into_iter().map(|v| v + offset).collect();
    HostTensor::from_f32(t.shape.clone(), &values)
}
