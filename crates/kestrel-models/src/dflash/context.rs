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
    /// One store per drafter layer; empty before the first append.
    layers: Vec<B::BlockKeys>,
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

    /// Layer `i`'s store (the context is not empty).
    pub(crate) fn layer_mut(&mut self, i: usize) -> &mut B::BlockKeys {
        &mut self.layers[i]
    }

    /// Appends the committed tokens whose tapped target hidden states are
    /// `taps` (one `[n, H]` per target layer tapped, positions
    /// `end()..end()+n`), then drops the oldest rows beyond the window.
    pub fn append(&mut self, b: &B, drafter: &DflashDrafter<B>, taps: &[B::Tensor]) {
        let n = taps.first().map_or(0, |t| b.dims(t).0);
        Self::append_all(b, drafter, &mut [self], taps, &[n]);
    }

    /// [`DraftContext::append`] of several contexts in one call (the
    /// drafter's products once over every row): `taps` hold the rows of
    /// `contexts[i]`, `counts[i]` of them, one context after another.
    pub fn append_all(
        b: &B,
        drafter: &DflashDrafter<B>,
        contexts: &mut [&mut Self],
        taps: &[B::Tensor],
        counts: &[usize],
    ) {
        assert_eq!(contexts.len(), counts.len(), "one row count per context");
        let (mut appending, mut firsts, mut ns) = (Vec::new(), Vec::new(), Vec::new());
        for (ctx, &n) in contexts.iter_mut().zip(counts) {
            if n == 0 {
                continue;
            }
            if ctx.layers.is_empty() {
                ctx.layers = drafter.new_context_keys(b);
            }
            firsts.push(ctx.end());
            ns.push(n);
            appending.push(&mut **ctx);
        }
        if appending.is_empty() {
            return;
        }
        {
            let mut stores: Vec<&mut [B::BlockKeys]> = appending
                .iter_mut()
                .map(|c| c.layers.as_mut_slice())
                .collect();
            drafter.append_contexts(b, &mut stores, taps, &firsts, &ns);
        }
        for (ctx, n) in appending.into_iter().zip(ns) {
            ctx.len += n;
            if ctx.len > ctx.window {
                let drop = ctx.len - ctx.window;
                for store in &mut ctx.layers {
                    b.keep_block_keys(store, drop..ctx.len);
                }
                ctx.first += drop;
                ctx.len = ctx.window;
            }
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
        let keep = end - self.first;
        for store in &mut self.layers {
            b.keep_block_keys(store, 0..keep);
        }
        self.len = keep;
    }
}
