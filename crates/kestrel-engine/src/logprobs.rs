//! Logprobs of a sequence that asked for them: the log-softmax of the raw
//! row its token was chosen from (before its constraint's mask, penalties,
//! temperature and filters). Such a sequence's rows always come to the host
//! whole (see `step`), so every one of its sampled rows passes through here;
//! on a speculative step each verified position has its own row, so the
//! values are those of plain decoding.

use anyhow::{Result, bail};
use kestrel_sampling::{RowLogprobs, TokenLogprobs};

/// One sampled row's logprobs, between seeing the row and knowing its token.
pub(crate) struct RowRecorder {
    /// The number of alternatives asked for; `None`: no logprobs.
    top: Option<usize>,
    row: Option<RowLogprobs>,
}

impl RowRecorder {
    pub fn new(top: Option<usize>) -> Self {
        Self { top, row: None }
    }

    /// The raw row, as copied to the host (padded ids at `-inf`).
    pub fn observe(&mut self, row: &[f32]) {
        if self.top.is_some() {
            self.row = Some(RowLogprobs::new(row));
        }
    }

    /// The logprobs of the token chosen from the observed row, if asked for.
    pub fn token(&mut self, token: u32) -> Result<Option<TokenLogprobs>> {
        let Some(top) = self.top else {
            return Ok(None);
        };
        match self.row.take() {
            Some(row) => Ok(Some(row.token(token, top))),
            None => bail!("a sequence with logprobs was sampled without its row on the host"),
        }
    }
}
