//! Greedy token choice on the device: the argmax of each logits row, over a
//! whole row or over a prefix of it (a vocabulary padded past the tokenizer).

use kestrel_core::{Backend, Result};

use super::{Ctx, Outputs};

/// Token ids must match exactly.
const TOL_EXACT: f64 = 0.0;

pub fn argmax_rows(c: &mut Ctx) {
    // (rows, row length, columns searched): a Qwen3.6-sized vocabulary in
    // full and without its padding, and an odd row length (no float4 loads).
    for (rows, len, cols) in [
        (3, 248_320, 248_320),
        (3, 248_320, 248_077),
        (5, 1001, 1000),
    ] {
        let mut v = c.data.randn(rows * len, 1.0);
        let row = |r: usize| r * len;
        // Row 0: the maximum twice, so the lower index must win.
        v[row(0) + 17] = 9.0;
        v[row(0) + cols - 3] = 9.0;
        // Row 1: NaN everywhere but one finite value near the end; a larger
        // value in the excluded tail (when there is one) must not win.
        v[row(1)..row(1) + len].fill(f32::NAN);
        v[row(1) + cols - 1] = -5.0;
        if cols < len {
            v[row(1) + cols] = 100.0;
        }
        // Row 2: -inf everywhere but the last allowed column.
        v[row(2)..row(2) + len].fill(f32::NEG_INFINITY);
        v[row(2) + cols - 1] = -1e30;
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            len: usize,
            cols: usize,
            v: &[f32],
        ) -> Result<Outputs> {
            let ids = b.argmax_rows(&b.from_host(rows, len, v), cols);
            Ok(vec![(
                "ids".into(),
                ids.iter().map(|&i| i as f32).collect(),
            )])
        }
        let (cpu, gpu) = (
            run(&c.cpu, rows, len, cols, &v),
            run(&c.gpu, rows, len, cols, &v),
        );
        c.record(
            &format!("argmax_rows [{rows}x{len}] first {cols}"),
            TOL_EXACT,
            cpu,
            gpu,
        );
    }
}
