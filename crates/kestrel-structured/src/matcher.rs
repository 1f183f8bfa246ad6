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
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let may_end = self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false);
        let known = allowed.len();
        for (id, logit) in logits.iter_mut().enumerate() {
            let ok = (id < known && allowed.is_allowed(id as u32))
                || (may_end && self.eos.contains(&(id as u32)));
            if !ok {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
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
