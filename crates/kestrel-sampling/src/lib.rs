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
//! [`SamplingParams`] holds and validates the request's parameters,
//! [`Sampler`] carries a sequence's RNG and token counts between steps, and
//! [`StopConditions`] decides when generation ends.

mod filters;
mod params;
mod penalties;
mod sampler;
mod stop;

pub use params::{InvalidParam, SamplingParams};
pub use sampler::{SampleError, Sampler};
pub use stop::{Finish, FinishReason, StopConditions};
