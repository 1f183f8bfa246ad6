//! Sampling the next token of one sequence from its logits row.
//!
//! The pipeline follows vLLM's sampler (`vllm/v1/sample/sampler.py`):
//!
//! 1. min-tokens: stop tokens are masked while fewer than `min_tokens` were generated;
//! 2. penalties: repetition (prompt + output tokens), then frequency and
//!    presence (output tokens only);
//! 3. temperature 0 → greedy argmax (ties go to the lowest id), no RNG draw;
//! 4. otherwise temperature scaling, then min-p, then top-k, then top-p;
//! 5. one draw from the renormalised distribution, with a per-sequence ChaCha RNG.
//!
//! Every filter leaves its kept ids in id order, and the weight sums and the
//! draw walk them in that order, so the result depends only on which ids are
//! kept, never on how a selection or sort permuted them.
//!
//! # Sampling from a backend's candidates
//!
//! [`Sampler::candidate_request`] asks a backend (`Backend::top_candidates`)
//! for the row's `N` best penalised logits (`N` = 1 when greedy, `top_k` when
//! it is at most the cap, else the cap, [`DEFAULT_MAX_CANDIDATES`]), the row's
//! maximum, and the count and weight sum of the logits at or above the min-p
//! line. [`Sampler::sample_candidates`] then runs the same pipeline on the
//! candidates (as a short row in id order) and returns the token `sample`
//! would, with the same single RNG draw, when the kept set is known to lie
//! within them:
//!
//! - greedy (the argmax is the best candidate);
//! - fewer than `N` came back (every eligible logit is there);
//! - the largest logit is `+inf` (the same error);
//! - the worst candidate is below the min-p line (min-p cuts inside);
//! - `top_k <= N` (top-k of the row is top-k of the best `N`);
//! - the min-p count is at most `N` (the min-p set is the candidates).
//!
//! Otherwise, with top-p < 1 and no top-k below the min-p count, the nucleus
//! is searched within the candidates with the row's total weight known only
//! to [`KEPT_WEIGHT_TOLERANCE`] (a device's `exp` is not the host's): the
//! token is decided when the nucleus ends at the same candidate for every
//! total in that range. In every other case (top-p 1 over a min-p set longer
//! than `N`, a nucleus that ends past the candidates or too close to call, a
//! top-k above `N` that cuts the min-p set) it returns `None` without drawing
//! and the caller samples the whole row. `candidate_request` returns `None`
//! up front when only a top-k above the cap could cut the row (top-p 1,
//! min-p 0, more ids than the cap).
//!
//! # Drawing on the backend
//!
//! When nothing cuts the row (no top-k below its length, top-p 1, min-p 0:
//! OpenAI's defaults) and it is longer than the cap, every eligible id is
//! kept and the draw walks all of them. Then `candidate_request` takes the
//! token's uniform from the RNG up front and sends it with the request (one
//! candidate, weights at the row's temperature); the backend reports the id
//! where the kept weights, summed in id order, cross `uniform * total`, and
//! the sums just before and after it. `sample_candidates` accepts that id
//! when the host's own sums, within [`KEPT_WEIGHT_TOLERANCE`] of the
//! backend's, must cross at the same id; otherwise it returns `None` and the
//! caller samples the row, which uses the same uniform (the sampler keeps it
//! until a token is drawn), so the RNG stream is one value per sampled token
//! on every path.
//!
//! # Verifying draft tokens
//!
//! [`Sampler::verify`] checks a speculative step's drafts against the
//! target's rows: greedy acceptance that gives the tokens of sampling row
//! by row, and rejection sampling that keeps the target's distribution when
//! sampling ([`mod@verify`] states the rules and the RNG values used).
//! [`Sampler::distribution`] gives a row's filtered distribution, for
//! drafters that must report the `q` they drew from.
//!
//! [`RowLogprobs`] gives a row's log-softmax, for requests that ask for
//! logprobs.
//!
//! [`SamplingParams`] holds and validates the request's parameters,
//! [`Sampler`] carries a sequence's RNG and token counts between steps, and
//! [`StopConditions`] decides when generation ends.

mod filters;
mod logprobs;
mod params;
mod penalties;
mod sampler;
mod stop;
pub mod verify;

pub use logprobs::{MAX_TOP_LOGPROBS, RowLogprobs, TokenLogprobs};
pub use params::{InvalidParam, SamplingParams};
pub use sampler::{DEFAULT_MAX_CANDIDATES, KEPT_WEIGHT_TOLERANCE, SampleError, Sampler};
pub use stop::{Finish, FinishReason, StopConditions};
pub use verify::{DraftProbs, TokenDistribution, Verified, accept_greedy};
