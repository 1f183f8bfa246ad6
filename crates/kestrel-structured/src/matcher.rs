//! The engine-facing side of a compiled grammar: llguidance's `Matcher`
//! behind [`TokenConstraint`].

use std::sync::Arc;

use kestrel_engine::TokenConstraint;
use llguidance::Matcher;

/// One sequence's grammar state.
#[derive(Clone)]
pub struct GrammarConstraint {
    matcher: Matcher,
    /// The model's end-of-sequence ids, allowed wherever the grammar may end.
    eos: Arc<[u32]>,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, eos: Arc<[u32]>) -> Self {
        GrammarConstraint { matcher, eos }
    }
}

impl TokenConstraint for GrammarConstraint {
    fn allowed(&mut self, ids: usize) -> Result<Vec<u32>, String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let mut words = vec![0u32; ids.div_ceil(32)];
        // Ids past the grammar's vocabulary or past the row are never allowed.
        let limit = allowed.len().min(ids);
        let n = limit.div_ceil(32);
        words[..n].copy_from_slice(&allowed.as_slice()[..n]);
        if limit % 32 != 0 {
            words[n - 1] &= (1u32 << (limit % 32)) - 1;
        }
        let may_end = self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false);
        if may_end {
            for &eos in self.eos.iter().filter(|&&e| (e as usize) < ids) {
                words[eos as usize / 32] |= 1 << (eos % 32);
            }
        }
        Ok(words)
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}
