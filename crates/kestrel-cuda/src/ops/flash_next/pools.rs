//! Tensors the model keeps between steps: rows written from the host (a
//! step's staged inputs) and per-slot state pools edited in place.

use kestrel_core::flash_next::RowEdit;

use crate::context::Cx;
use crate::device::ptr;
use crate::tensor::CudaTensor;

/// See `FlashNextOps::write_rows`: a copy into `t`'s own buffer, ordered on
/// the stream after the work queued before it (a step still reading `t`).
pub fn write_rows(cx: &Cx, t: &mut CudaTensor, data: &[f32]) {
    assert_eq!(
        data.len(),
        t.rows * t.cols,
        "write_rows: {} x {} values",
        t.rows,
        t.cols
    );
    t.bf16 = None;
    if data.is_empty() {
        return;
    }
    crate::device::check(
        cx.gpu
            .stream
            .memcpy_htod(data, &mut t.buf.slice_mut(..data.len())),
        "writing rows from the host",
    );
}

/// See `FlashNextOps::edit_rows`: device fills and copies.
pub fn edit_rows(cx: &Cx, t: &mut CudaTensor, edit: RowEdit) {
    let row_bytes = t.cols * 4;
    let base = ptr(&t.buf, &cx.gpu.stream);
    match edit {
        RowEdit::Zero(rows) => {
            assert!(rows.end <= t.rows, "zeroing rows {rows:?} of {}", t.rows);
            cx.gpu.fill_bytes(
                base + (rows.start * row_bytes) as u64,
                0,
                rows.len() * row_bytes,
            );
        }
        RowEdit::Copy { src, dst } => {
            assert!(
                src.end <= t.rows && dst + src.len() <= t.rows,
                "copying rows {src:?} to {dst} of {}",
                t.rows
            );
            if src.start != dst && !src.is_empty() {
                cx.gpu.copy_dtod(
                    base + (dst * row_bytes) as u64,
                    base + (src.start * row_bytes) as u64,
                    src.len() * row_bytes,
                );
            }
        }
    }
}
