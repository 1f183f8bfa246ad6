//! Summary statistics over rounds: median and coefficient of variation.

/// Median of the finite values; the mean of the two middle values for an even count.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / values.len() as f64)
}

/// Sample standard deviation (divisor n - 1); undefined below two values.
pub fn sample_std(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let m = mean(values)?;
    let ss: f64 = values.iter().map(|x| (x - m) * (x - m)).sum();
    Some((ss / (values.len() - 1) as f64).sqrt())
}

/// Coefficient of variation = sample std / mean.
///
/// Undefined (None) with fewer than two values, a non-positive mean, or any
/// non-finite value: such a series cannot demonstrate that a run was stable.
pub fn coefficient_of_variation(values: &[f64]) -> Option<f64> {
    if values.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let m = mean(values)?;
    if m <= 0.0 {
        return None;
    }
    Some(sample_std(values)? / m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn cv_is_sample_std_over_mean() {
        // mean 100, deviations -3, 0, +3: sample variance 9, std 3, CV 3%.
        let cv = coefficient_of_variation(&[97.0, 100.0, 103.0]).unwrap();
        assert!((cv - 0.03).abs() < 1e-15, "{cv}");
        assert_eq!(coefficient_of_variation(&[5.0, 5.0, 5.0]), Some(0.0));
        assert_eq!(coefficient_of_variation(&[5.0]), None);
        assert_eq!(coefficient_of_variation(&[0.0, 0.0]), None);
        assert_eq!(coefficient_of_variation(&[1.0, f64::NAN]), None);
    }
}
