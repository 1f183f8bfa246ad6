//! Choosing tokens from a step's logits: on the device where every row is
//! plain greedy, from the device's best candidates where they decide the
//! token, else from the whole row copied to the host. One path for every
//! driver of the model (the engine, which `generate` and the server run, and
//! `bench-model`'s own timed loop), so that what they measure is what the
//! server runs.

use std::cell::Cell;

use anyhow::{Context, Result, bail};
use kestrel_core::{Backend, CandidateRequest, RowCandidates};
use kestrel_sampling::{SampleError, Sampler};

use crate::constraint::TokenConstraint;

/// Where a sampled row's token comes from.
pub enum RowSource {
    /// Picked on the device (plain greedy).
    Argmax(u32),
    /// The device's best candidates, or its draw over a row no filter cuts
    /// (row `row` of the logits); the whole row is fetched only if they
    /// cannot decide.
    Candidates {
        row: usize,
        request: CandidateRequest,
        found: RowCandidates,
    },
    /// The whole row, copied to the host.
    Logits(Vec<f32>),
}

/// The logits of one step and the vocabulary its tokens are drawn from.
pub struct StepLogits<'a, B: Backend> {
    pub backend: &'a B,
    pub logits: &'a B::Tensor,
    /// Ids that may be sampled (the tokenizer's vocabulary within the row).
    pub sampled_vocab: usize,
    /// Rows copied whole to the host so far (see [`Self::rows_copied`]).
    copied: Cell<usize>,
}

impl<'a, B: Backend> StepLogits<'a, B> {
    pub fn new(backend: &'a B, logits: &'a B::Tensor, sampled_vocab: Option<usize>) -> Self {
        let vocab = backend.dims(logits).1;
        Self {
            backend,
            logits,
            sampled_vocab: sampled_vocab.map_or(vocab, |v| v.min(vocab)),
            copied: Cell::new(0),
        }
    }

    /// How many rows were copied whole to the host: the rows without a
    /// candidate request and those whose candidates could not decide (dummy
    /// weights give flat distributions, where the second happens often).
    pub fn rows_copied(&self) -> usize {
        self.copied.get()
    }

    /// Decide, for every row in order, where its token comes from, and do
    /// the device work and the one copy that needs: the device argmax when
    /// every row is plain greedy; else the device's candidates for the rows
    /// with a request (see `Sampler::candidate_request`, which callers only
    /// ask for when `all_plain_argmax` is false: it draws from the RNG) and
    /// one copy of the other rows.
    pub fn sources(
        &self,
        requests: Vec<Option<CandidateRequest>>,
        all_plain_argmax: bool,
    ) -> Result<Vec<RowSource>> {
        if all_plain_argmax {
            let ids = self.backend.argmax_rows(self.logits, self.sampled_vocab);
            return Ok(ids.into_iter().map(RowSource::Argmax).collect());
        }
        let asked: Vec<CandidateRequest> = requests.iter().flatten().cloned().collect();
        let mut found = self.backend.top_candidates(self.logits, &asked).into_iter();
        let full: Vec<usize> = (0..requests.len())
            .filter(|&r| requests[r].is_none())
            .collect();
        let mut copied = self.host_rows(&full).into_iter();
        requests
            .into_iter()
            .enumerate()
            .map(|(row, request)| {
                Ok(match request {
                    Some(request) => RowSource::Candidates {
                        row,
                        request,
                        found: found.next().context("missing candidates")?,
                    },
                    None => RowSource::Logits(copied.next().context("missing logits row")?),
                })
            })
            .collect()
    }

    /// The token of one row. `observe` sees every raw row copied to the host.
    pub fn choose(
        &self,
        source: RowSource,
        sampler: &mut Sampler,
        history: &[u32],
        observe: &mut dyn FnMut(&[f32]),
    ) -> Result<Result<u32, SampleError>> {
        Ok(match source {
            RowSource::Argmax(token) => Ok(token),
            RowSource::Logits(mut row) => {
                observe(&row);
                sampler.sample(&mut row, history)
            }
            RowSource::Candidates {
                row,
                request,
                found,
            } => match sampler.sample_candidates(&request, &found) {
                Some(sampled) => sampled,
                None => {
                    let mut row = self.host_rows(&[row]).pop().context("missing row")?;
                    sampler.sample(&mut row, history)
                }
            },
        })
    }

    /// The token of a constrained row (see [`crate::constraint`]): the whole
    /// row on the host, `observe`d raw, masked by `constraint`, then sampled
    /// as any row is. Only the row's own failures are in the inner error.
    pub fn choose_constrained(
        &self,
        source: RowSource,
        sampler: &mut Sampler,
        history: &[u32],
        observe: &mut dyn FnMut(&[f32]),
        constraint: &mut dyn TokenConstraint,
    ) -> Result<Result<u32, String>> {
        let mut row = match source {
            RowSource::Logits(row) => row,
            // (Constrained rows never ask for candidates; if they did, the
            // whole row still decides.)
            RowSource::Candidates { row, .. } => {
                self.host_rows(&[row]).pop().context("missing row")?
            }
            RowSource::Argmax(_) => bail!("a constrained row was chosen on the device"),
        };
        observe(&row);
        if let Err(e) = constraint.mask(&mut row) {
            return Ok(Err(format!("the output constraint failed: {e}")));
        }
        Ok(sampler
            .sample(&mut row, history)
            .map_err(|e| format!("sampling failed: {e}")))
    }

    /// Rows `rows` of the logits, copied to the host in one transfer, with
    /// the padded ids (no token behind them) at `-inf` so they are never
    /// sampled.
    pub fn host_rows(&self, rows: &[usize]) -> Vec<Vec<f32>> {
        if rows.is_empty() {
            return Vec::new();
        }
        self.copied.set(self.copied.get() + rows.len());
        let b = self.backend;
        let (num_rows, vocab) = b.dims(self.logits);
        let all = rows.iter().copied().eq(0..num_rows);
        let values = if all {
            b.to_host(self.logits)
        } else {
            b.to_host(&b.gather_rows(self.logits, rows))
        };
        values
            .chunks_exact(vocab)
            .map(|row| {
                let mut row = row.to_vec();
                row[self.sampled_vocab..].fill(f32::NEG_INFINITY);
                row
            })
            .collect()
    }
}
