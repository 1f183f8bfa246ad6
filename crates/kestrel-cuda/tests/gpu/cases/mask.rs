//! Structured outputs' token masks applied where the logits are: the masked
//! rows of a Qwen3.6-sized padded vocabulary and of an odd width, masks
//! shorter than the row (ids past them disallowed), a row masked twice in
//! one call, and the argmax after the mask. Must match the CPU exactly.

use kestrel_core::{Backend, Result, RowMask};

use super::{Ctx, Outputs};

/// Masked logits are `-inf` on both backends; compared as this marker.
const MASKED: f32 = -1.0e30;

pub fn mask_rows(c: &mut Ctx) {
    for (rows, len) in [(4usize, 248_320usize), (3, 1001)] {
        let v = c.data.randn(rows * len, 1.0);
        // Row 0: a random mask over the whole row; row 2: a sparse mask that
        // covers only part of the row; row 1 unmasked; for 4 rows, row 3
        // masked twice (the intersection).
        let words = len.div_ceil(32);
        let dense: Vec<u32> = (0..words)
            .map(|_| (c.data.index(1 << 16) as u32) << 16 | c.data.index(1 << 16) as u32)
            .collect();
        let mut sparse = vec![0u32; words / 2];
        for _ in 0..20 {
            let id = c.data.index(sparse.len() * 32);
            sparse[id / 32] |= 1 << (id % 32);
        }
        let mut masks = vec![
            RowMask {
                row: 0,
                allowed: &dense,
            },
            RowMask {
                row: 2,
                allowed: &sparse,
            },
        ];
        if rows == 4 {
            masks.push(RowMask {
                row: 3,
                allowed: &dense,
            });
            masks.push(RowMask {
                row: 3,
                allowed: &sparse,
            });
        }
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            len: usize,
            v: &[f32],
            masks: &[RowMask<'_>],
        ) -> Result<Outputs> {
            let mut logits = b.from_host(rows, len, v);
            b.mask_rows(&mut logits, masks);
            let ids = b.argmax_rows(&logits, len);
            let values = b
                .to_host(&logits)
                .into_iter()
                .map(|x| if x == f32::NEG_INFINITY { MASKED } else { x })
                .collect();
            Ok(vec![
                ("logits".into(), values),
                ("argmax".into(), ids.iter().map(|&i| i as f32).collect()),
            ])
        }
        let (cpu, gpu) = (
            run(&c.cpu, rows, len, &v, &masks),
            run(&c.gpu, rows, len, &v, &masks),
        );
        c.record(&format!("mask_rows [{rows}x{len}]"), 0.0, cpu, gpu);
    }
}
