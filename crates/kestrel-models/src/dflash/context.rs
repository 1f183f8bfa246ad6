//! One sequence's drafter context: every drafter layer's keys and values of
//! the tokens the target has committed, limited to a window of the newest
//! ones.
//!
//! Why a window: the drafter was trained on bounded contexts, and long
//! prompts both slow its pass and lower its acceptance (serving engines keep
//! 8192 tokens, SGLang's default). Positions stay absolute: dropping old
//! rows does not move the newer ones.

use kestrel_core::Backend;

use super::DflashDrafter;

pub struct DraftContext<B: Backend> {
    /// Per drafter layer `[len, 2 * Hkv * D]`; empty before the first append.
    layers: Vec<B::Tensor>,
    /// Position of the first row kept.
    first: usize,
    len: usize,
    /// Most rows kept.
    window: usize,
}

impl<B: Backend> DraftContext<B> {
    /// An empty context keeping at most `window` tokens (at least one).
    pub fn new(window: usize) -> Self {
        Self::starting_at(0, window)
    }

    /// An empty context whose first row will be at `position` (the tokens
    /// before it are not drafted from).
    pub fn starting_at(position: usize, window: usize) -> Self {
        DraftContext {
            layers: Vec::new(),
            first: position,
            len: 0,
            window: window.max(1),
        }
    }

    /// Position after the newest row: where the next block's anchor sits.
    pub fn end(&self) -> usize {
        self.first + self.len
    }

    /// Position of the oldest row kept.
    pub fn first(&self) -> usize {
        self.first
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn layer(&self, i: usize) -> Option<&B::Tensor> {
        self.layers.get(i)
    }

    /// Appends the committed tokens whose tapped target hidden states are
    /// `taps` (one `[n, H]` per target layer tapped, positions
    /// `end()..end()+n`), then drops the oldest rows beyond the window.
    pub fn append(&mut self, b: &B, drafter: &DflashDrafter<B>, taps: &[B::Tensor]) {
        let n = taps.first().map_or(0, |t| b.dims(t).0);
        if n == 0 {
            return;
        }
        let new = drafter.context_kv(b, taps, self.end());
        self.layers = if self.layers.is_empty() {
            new
        } else {
            self.layers
                .iter()
                .zip(&new)
                .map(|(old, new)| b.concat_rows(old, new))
                .collect()
        };
        self.len += n;
        if self.len > self.window {
            let drop = self.len - self.window;
            let keep: Vec<usize> = (drop..self.len).collect();
            self.layers = self
                .layers
                .iter()
                .map(|t| b.gather_rows(t, &keep))
                .collect();
            self.first += drop;
            self.len = self.window;
        }
    }

    /// Forgets every row from position `end` on (a sequence that rolls
    /// back, or a context that ran ahead of what the target kept).
    pub fn truncate(&mut self, b: &B, end: usize) {
        if end >= self.end() {
            return;
        }
        if end <= self.first {
            *self = Self::starting_at(end, self.window);
            return;
        }
        let keep: Vec<usize> = (0..end - self.first).collect();
        self.layers = self
            .layers
            .iter()
            .map(|t| b.gather_rows(t, &keep))
            .collect();
        self.len = keep.len();
    }
}
