//! Shared test helpers and the cross-operation tests.

mod attention;
mod gdn;
mod moe;
pub mod naive;
mod ops;
pub mod rng;

/// Asserts `|got - want| <= tol * max(|want|, 1% of max|want|)` element-wise: a
/// relative tolerance, with a floor so that values near zero (where relative error
/// is meaningless after cancellation) are judged against the tensor's scale.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g}");
        let err = (g - w).abs();
        assert!(
            err <= tol * w.abs().max(scale * 1e-2),
            "{what}: element {i}: got {g}, want {w} (error {err:e}, tolerance {tol:e})"
        );
    }
}
