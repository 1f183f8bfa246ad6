//! Row-wise operations, data movement and upload.

use std::borrow::Cow;

use kestrel_core::{Backend, DType, HostTensor};

use super::{assert_close, naive, rng::Rng};
use crate::{CpuBackend, CpuWeight};

pub fn weight(shape: &[usize], data: Vec<f32>) -> CpuWeight {
    CpuBackend::new()
        .upload(&HostTensor::from_f32(shape.to_vec(), &data))
        .unwrap()
}

#[test]
fn upload_widens_half_types_and_rejects_bad_sizes() {
    let vals = [1.5f32, -2.25, 0.125];
    let f16: Vec<u8> = vals
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = vals
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    for (dtype, bytes) in [(DType::F16, f16), (DType::BF16, bf16)] {
        let t = HostTensor {
            dtype,
            shape: vec![3],
            data: Cow::Owned(bytes),
        };
        assert_eq!(CpuBackend::new().upload(&t).unwrap().data, vals);
    }
    let bad = HostTensor {
        dtype: DType::F32,
        shape: vec![2, 2],
        data: Cow::Owned(vec![0u8; 12]),
    };
    assert!(CpuBackend::new().upload(&bad).is_err());
}

#[test]
fn rms_norm_and_add_rms_norm_match_naive() {
    let mut rng = Rng::new(10);
    let (rows, cols) = (13, 37);
    let x = rng.vec(rows * cols);
    let r = rng.vec(rows * cols);
    let w = weight(&[cols], rng.vec(cols));
    let be = CpuBackend::new();
    let xt = be.from_host(rows, cols, &x);
    let got = be.to_host(&be.rms_norm(&xt, &w, 1e-6));
    let mut want = Vec::new();
    let mut sum_want = Vec::new();
    let mut res_want = Vec::new();
    for i in 0..rows {
        let row: Vec<f64> = x[i * cols..(i + 1) * cols]
            .iter()
            .map(|&v| v as f64)
            .collect();
        want.extend(naive::rms_norm(&row, &w.data, 1e-6));
        let s: Vec<f64> = (0..cols)
            .map(|c| (x[i * cols + c] + r[i * cols + c]) as f64)
            .collect();
        sum_want.extend(naive::rms_norm(&s, &w.data, 1e-6));
        res_want.extend(s.iter().map(|&v| v as f32));
    }
    assert_close(&got, &naive::to_f32(&want), 1e-5, "rms_norm");
    let mut res = be.from_host(rows, cols, &r);
    let normed = be.add_rms_norm(&mut res, &xt, &w, 1e-6);
    assert_close(&be.to_host(&res), &res_want, 1e-6, "add_rms_norm residual");
    assert_close(
        &be.to_host(&normed),
        &naive::to_f32(&sum_want),
        1e-5,
        "add_rms_norm output",
    );
}

#[test]
fn swiglu_matches_naive() {
    let mut rng = Rng::new(11);
    let (rows, inter) = (9, 21);
    let x = rng.vec(rows * 2 * inter);
    let be = CpuBackend::new();
    let got = be.to_host(&be.swiglu(&be.from_host(rows, 2 * inter, &x)));
    let want: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let x = &x;
            (0..inter).map(move |c| {
                (naive::silu(x[r * 2 * inter + c] as f64) * x[r * 2 * inter + inter + c] as f64)
                    as f32
            })
        })
        .collect();
    assert_close(&got, &want, 1e-5, "swiglu");
}

#[test]
fn matmul_embedding_gather_add() {
    let mut rng = Rng::new(12);
    let be = CpuBackend::new();
    let (vocab, hidden, out) = (11, 16, 24);
    let table = weight(&[vocab, hidden], rng.vec(vocab * hidden));
    let ids = [3u32, 0, 10, 3, 7, 1];
    let emb = be.embedding(&table, &ids);
    assert_eq!(be.dims(&emb), (ids.len(), hidden));
    for (r, &id) in ids.iter().enumerate() {
        assert_eq!(
            emb.row(r),
            &table.data[id as usize * hidden..(id as usize + 1) * hidden]
        );
    }
    let w = weight(&[out, hidden], rng.vec(out * hidden));
    let y = be.matmul(&emb, &w);
    let want = naive::matmul(&emb.data, ids.len(), hidden, &w.data, out);
    assert_close(&be.to_host(&y), &naive::to_f32(&want), 1e-5, "matmul");
    let g = be.gather_rows(&y, &[5, 0]);
    assert_eq!(g.row(0), y.row(5));
    assert_eq!(g.row(1), y.row(0));
    let mut a = be.from_host(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    be.add_assign(&mut a, &be.from_host(2, 3, &[0.5; 6]));
    assert_eq!(a.data, [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]);
}
