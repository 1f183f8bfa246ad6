//! Goodness of fit of observed token counts to a distribution: Pearson's
//! chi-square with its p-value, and a total-variation bound from the sample
//! size. Shared by the distribution tests of the verifier.

/// Fits are rejected below this chi-square p-value. With a fixed seed every
/// test is deterministic; a correct sampler fails a given check with
/// probability 1e-4 over seeds, so a failure is a real discrepancy.
pub const MIN_P_VALUE: f64 = 1e-4;

/// How many times the expected total variation of a correct sampler a fit
/// may show: for `V` cells and `N` samples `E[TV] <= sqrt(V / N) / 2`
/// (each `E|n_x/N - p_x| <= sqrt(p_x / N)`, then Cauchy-Schwarz), so the
/// bound `3 * sqrt(V / N)` is six times that.
const TV_FACTOR: f64 = 3.0;

/// Check `counts` against `probs` (one entry per cell): no draws where the
/// probability is 0, chi-square p-value at least [`MIN_P_VALUE`] over the
/// other cells, and total variation below `3 * sqrt(V / N)` with `V` those
/// cells. The error says which failed and by how much.
pub fn check_fit(counts: &[usize], probs: &[f64]) -> Result<(), String> {
    assert_eq!(counts.len(), probs.len());
    let n: usize = counts.iter().sum();
    assert!(n > 0, "no samples");
    let mut chi = 0.0;
    let mut cells = 0usize;
    let mut tv = 0.0;
    for (x, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        if p == 0.0 {
            if c > 0 {
                return Err(format!("cell {x} of probability 0 was drawn {c} times"));
            }
            continue;
        }
        cells += 1;
        let expected = p * n as f64;
        chi += (c as f64 - expected).powi(2) / expected;
        tv += (c as f64 / n as f64 - p).abs() / 2.0;
    }
    let tv_bound = TV_FACTOR * (cells as f64 / n as f64).sqrt();
    if tv >= tv_bound {
        return Err(format!("total variation {tv:.5} >= {tv_bound:.5}"));
    }
    if cells > 1 {
        let p_value = chi_square_sf(chi, (cells - 1) as f64);
        if p_value < MIN_P_VALUE {
            return Err(format!(
                "chi-square {chi:.2} with {} dof: p-value {p_value:.2e}",
                cells - 1
            ));
        }
    }
    Ok(())
}

/// `P(X >= x)` for `X` chi-square with `dof` degrees of freedom.
pub fn chi_square_sf(x: f64, dof: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    upper_regularized_gamma(dof / 2.0, x / 2.0)
}

/// `Q(a, x) = Γ(a, x) / Γ(a)`: by its power series for `x < a + 1`,
/// otherwise by its continued fraction (modified Lentz).
fn upper_regularized_gamma(a: f64, x: f64) -> f64 {
    let prefactor = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let mut term = 1.0 / a;
        let mut sum = term;
        for n in 1..1000 {
            term *= x / (a + n as f64);
            sum += term;
            if term < sum * 1e-15 {
                break;
            }
        }
        return (1.0 - sum * prefactor).max(0.0);
    }
    let tiny = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / tiny;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..1000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < tiny {
            d = tiny;
        }
        c = b + an / c;
        if c.abs() < tiny {
            c = tiny;
        }
        d = 1.0 / d;
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    prefactor * h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, nine terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const COEFFS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFS[0];
    for (i, &c) in COEFFS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}
