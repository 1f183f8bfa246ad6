//! The CPU backend's activation and weight types: dense row-major f32.

use kestrel_core::{BackendError, HostTensor, Result};

/// A 2-D activation `[rows, cols]`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "tensor data has {} values, shape [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        );
        CpuTensor { rows, cols, data }
    }

    pub fn zeros(rows: usize, cols: usize) -> Self {
        CpuTensor {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A parameter, widened to f32 on upload (the CPU backend is the exact reference,
/// so it never computes in reduced precision).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuWeight {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl CpuWeight {
    pub fn from_host(t: &HostTensor) -> Result<Self> {
        let expected = t.numel() * t.dtype.size();
        if t.data.len() != expected {
            return Err(BackendError::Invalid(format!(
                "{:?} tensor of shape {:?} needs {expected} bytes, got {}",
                t.dtype,
                t.shape,
                t.data.len()
            )));
        }
        Ok(CpuWeight {
            shape: t.shape.clone(),
            data: t.to_f32(),
        })
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The rows of `parts` in order, as one matrix (`Backend::stack_rows`).
    pub fn stack_rows(parts: Vec<CpuWeight>) -> Result<Self> {
        let cols = match parts.first() {
            Some(p) if p.shape.len() == 2 => p.shape[1],
            _ => {
                return Err(BackendError::Invalid(
                    "stack_rows: no matrix to stack".into(),
                ));
            }
        };
        if let Some(p) = parts
            .iter()
            .find(|p| p.shape.len() != 2 || p.shape[1] != cols)
        {
            return Err(BackendError::Invalid(format!(
                "stack_rows: a part of shape {:?} among rows of {cols}",
                p.shape
            )));
        }
        let rows = parts.iter().map(|p| p.shape[0]).sum();
        Ok(CpuWeight {
            shape: vec![rows, cols],
            data: parts.into_iter().flat_map(|p| p.data).collect(),
        })
    }

    /// Size of the first dimension (rows of a matrix, experts of a stacked tensor).
    pub fn dim0(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
}
