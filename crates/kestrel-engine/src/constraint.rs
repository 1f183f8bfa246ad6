//! Per-sequence output constraints (structured outputs): something outside
//! the engine (a grammar compiled by the server) decides which ids may come
//! next, and the engine applies that to every row it samples for the
//! sequence.
//!
//! The rules, which make constrained output the same with speculation on or
//! off and greedy or sampled:
//! - a constrained row is masked (disallowed ids at `-inf`) before the
//!   sampler's penalties, temperature, top-k, top-p and min-p: by the backend
//!   where the logits are ([`kestrel_core::Backend::mask_rows`]), after which
//!   it takes the device argmax or candidates like any row, or on the host
//!   when the row comes there whole anyway (logprobs, which are taken before
//!   the mask, or a logits observer);
//! - the masks of a step are computed after its forward is queued and before
//!   its logits are read, so on an asynchronous backend the grammar runs
//!   while the device computes;
//! - every emitted token is fed to the constraint, in order, before the next
//!   row is masked, so each verify row of a speculative step is masked with
//!   the state after the tokens before it;
//! - drafts are cut at the first one the constraint rejects before they go
//!   to verification (they could never be accepted);
//! - once the constraint is complete (only EOS may follow) the sequence
//!   finishes with a stop, without sampling the EOS.
//!
//! The engine stops feeding a sequence's constraint when it finishes, so an
//! EOS (or a stop token) is never fed. After a preemption the generated
//! tokens stay, and so does the constraint's state.

/// What a grammar matcher offers the engine. Calls come from the engine
/// thread only, one sequence at a time.
pub trait TokenConstraint: Send {
    /// The ids that may come next among the first `ids`, a bit per id (see
    /// [`kestrel_core::token_mask`]; `ids.div_ceil(32)` words). The EOS ids
    /// must be allowed when the grammar may end here.
    fn allowed(&mut self, ids: usize) -> Result<Vec<u32>, String>;

    /// Set the logits of every id that may not come next to `-inf`. The row
    /// may be longer than the grammar's vocabulary (padded ids).
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.allowed(logits.len())?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !kestrel_core::token_mask::is_allowed(&allowed, id) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// The masks of a verify step's rows: at the current state, then after
    /// each of `drafts` (which the constraint allows, see
    /// [`Self::valid_prefix`]), without advancing.
    fn allowed_along(&mut self, drafts: &[u32], ids: usize) -> Result<Vec<Vec<u32>>, String> {
        let mut masks = vec![self.allowed(ids)?];
        if drafts.is_empty() {
            return Ok(masks);
        }
        let mut ahead = self.boxed_clone();
        for &draft in drafts {
            ahead.accept(draft)?;
            masks.push(ahead.allowed(ids)?);
        }
        Ok(masks)
    }

    /// Advance past `token`, which `mask` allowed.
    fn accept(&mut self, token: u32) -> Result<(), String>;

    /// How many of `tokens`, in order from the current state, the grammar
    /// allows (without advancing).
    fn valid_prefix(&mut self, tokens: &[u32]) -> usize;

    /// The grammar is complete and nothing but EOS may follow.
    fn is_complete(&self) -> bool;

    /// An independent copy in the same state.
    fn boxed_clone(&self) -> Box<dyn TokenConstraint>;
}

/// A request's constraint, as carried by [`crate::GenerateRequest`].
pub struct Constraint(pub Box<dyn TokenConstraint>);

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint(self.0.boxed_clone())
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    pub fn new(inner: impl TokenConstraint + 'static) -> Self {
        Constraint(Box::new(inner))
    }
}
