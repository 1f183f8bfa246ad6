//! Held-out evaluation: perplexity and top-1 accuracy of the model, and of
//! its MTP head (token t+2), over fixed token windows.

use anyhow::{Result, bail};
use kestrel_core::Backend;

use crate::Model;
use crate::runner::SequenceRunner;

/// Sums over windows; each window is one sequence from an empty state.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct EvalReport {
    pub windows: usize,
    /// Next-token predictions scored (window length - 1 per window).
    pub lm_tokens: usize,
    pub lm_nll: f64,
    pub lm_correct: usize,
    /// MTP slots scored: slot t reads position t and token t+1, predicts t+2.
    pub mtp_tokens: usize,
    pub mtp_nll: f64,
    pub mtp_correct: usize,
    /// Slots where the MTP draft equals the model's own greedy token at t+2:
    /// the acceptance rate of a one-token draft under greedy verification.
    pub mtp_accepted: usize,
}

impl EvalReport {
    pub fn lm_perplexity(&self) -> f64 {
        (self.lm_nll / self.lm_tokens as f64).exp()
    }
    pub fn lm_top1(&self) -> f64 {
        self.lm_correct as f64 / self.lm_tokens as f64
    }
    pub fn mtp_perplexity(&self) -> f64 {
        (self.mtp_nll / self.mtp_tokens as f64).exp()
    }
    pub fn mtp_top1(&self) -> f64 {
        self.mtp_correct as f64 / self.mtp_tokens as f64
    }
    pub fn mtp_acceptance(&self) -> f64 {
        self.mtp_accepted as f64 / self.mtp_tokens as f64
    }
}

/// Negative log-likelihood of `target` under `logits` (f64 log-sum-exp), and
/// whether `target` is the argmax.
fn score(logits: &[f32], target: u32) -> (f64, bool, u32) {
    let (mut best, mut max) = (0u32, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            max = v;
            best = i as u32;
        }
    }
    let sum: f64 = logits.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let nll = (max as f64 + sum.ln()) - logits[target as usize] as f64;
    (nll, best == target, best)
}

pub fn evaluate<B: Backend>(
    backend: &B,
    model: &Model<B>,
    windows: &[Vec<u32>],
) -> Result<EvalReport> {
    let vocab = model.config().vocab_size;
    let mut r = EvalReport::default();
    for w in windows {
        if w.len() < 3 {
            bail!("evaluation windows need at least 3 tokens");
        }
        let inputs = &w[..w.len() - 1];
        let mut runner = SequenceRunner::new(backend, model, inputs.len())?;
        let (lm, mtp) = runner.teacher_forced(inputs)?;
        let mut greedy = Vec::with_capacity(inputs.len());
        for (t, row) in lm.chunks_exact(vocab).enumerate() {
            let (nll, ok, best) = score(row, w[t + 1]);
            r.lm_nll += nll;
            r.lm_correct += ok as usize;
            greedy.push(best);
        }
        r.lm_tokens += inputs.len();
        if let Some(mtp) = mtp {
            for (t, row) in mtp.chunks_exact(vocab).enumerate() {
                let (nll, ok, best) = score(row, w[t + 2]);
                r.mtp_nll += nll;
                r.mtp_correct += ok as usize;
                r.mtp_accepted += (best == greedy[t + 1]) as usize;
                r.mtp_tokens += 1;
            }
        }
        r.windows += 1;
    }
    Ok(r)
}
