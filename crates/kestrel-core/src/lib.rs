//! The contract between model definitions and backends.
//!
//! Model files (in `kestrel-models`) are written once against [`Backend`]; the CPU
//! backend is the reference, the CUDA backend implements the same operations.
//! Everything here is plain data: no backend-specific types leak out.

pub mod backend;
pub mod batch;
pub mod block_attention;
pub mod candidates;
pub mod dummy;
pub mod flash_next;
pub mod fp8;
pub mod host;
pub mod token_mask;

pub use backend::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, GdnGate, GdnSpec, GdnWeights, MoeSpec,
    MoeWeights, PreNorm, RopeSpec, StepKey, argmax_host,
};
pub use batch::{ForwardBatch, SeqChunk, StateSnapshot};
pub use candidates::{CandidateRequest, RowCandidates, TokenPenalty, top_candidates_host};
pub use flash_next::FlashNextOps;
pub use fp8::{BlockFp8, HostWeight};
pub use host::{DType, HostTensor};
pub use token_mask::RowMask;

/// Errors a backend can report. Kernels assume validated inputs; these cover
/// resource and platform failures (no GPU, out of memory, bad upload).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Unavailable(String),
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;
