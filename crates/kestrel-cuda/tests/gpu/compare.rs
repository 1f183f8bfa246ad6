//! Error measures and the record of one comparison.

/// One output of one case, CUDA against the CPU reference.
pub struct Outcome {
    pub case: String,
    pub output: String,
    pub len: usize,
    /// `||cuda - cpu|| / ||cpu||`.
    pub rel_l2: f64,
    /// `max |cuda - cpu| / max |cpu|`.
    pub max_rel: f64,
    pub non_finite: usize,
    pub tol: f64,
    pub pass: bool,
    pub note: Option<String>,
}

pub fn compare(case: &str, output: &str, cuda: &[f32], cpu: &[f32], tol: f64) -> Outcome {
    let mut o = Outcome {
        case: case.into(),
        output: output.into(),
        len: cpu.len(),
        rel_l2: f64::NAN,
        max_rel: f64::NAN,
        non_finite: 0,
        tol,
        pass: false,
        note: None,
    };
    if cuda.len() != cpu.len() {
        o.note = Some(format!("length {} != reference {}", cuda.len(), cpu.len()));
        return o;
    }
    o.non_finite = cuda.iter().filter(|v| !v.is_finite()).count();
    let (mut diff2, mut ref2, mut max_diff, mut max_ref) = (0f64, 0f64, 0f64, 0f64);
    for (&a, &b) in cuda.iter().zip(cpu) {
        let (a, b) = (a as f64, b as f64);
        diff2 += (a - b) * (a - b);
        ref2 += b * b;
        max_diff = max_diff.max((a - b).abs());
        max_ref = max_ref.max(b.abs());
    }
    let tiny = 1e-30;
    o.rel_l2 = diff2.sqrt() / ref2.sqrt().max(tiny);
    o.max_rel = max_diff / max_ref.max(tiny);
    if cpu.iter().any(|v| !v.is_finite()) {
        o.note = Some("reference is not finite".into());
    } else if max_ref == 0.0 {
        o.note = Some("reference is all zeros".into());
    } else {
        o.pass = o.non_finite == 0 && o.rel_l2 <= tol && o.max_rel <= tol;
    }
    o
}

impl Outcome {
    pub fn line(&self) -> String {
        format!(
            "{:<5} {:<34} {:<12} rel_l2 {:>9.2e}  max_rel {:>9.2e}  tol {:>7.1e}  n {:>7}{}{}",
            if self.pass { "PASS" } else { "FAIL" },
            self.case,
            self.output,
            self.rel_l2,
            self.max_rel,
            self.tol,
            self.len,
            if self.non_finite > 0 {
                format!("  non-finite {}", self.non_finite)
            } else {
                String::new()
            },
            self.note
                .as_deref()
                .map(|n| format!("  ({n})"))
                .unwrap_or_default(),
        )
    }
}
