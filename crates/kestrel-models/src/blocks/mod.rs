//! The blocks a Qwen decoder layer is made of, each a thin chain of fused
//! backend operations plus the checkpoint layout it loads from.

pub mod attention;
pub mod ffn;
pub mod gdn;

pub use attention::Attention;
pub use ffn::FeedForward;
pub use gdn::GatedDeltaNet;
