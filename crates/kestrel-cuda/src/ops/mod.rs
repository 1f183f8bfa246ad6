//! One module per family of operations; each function enqueues its kernels on
//! the backend's stream and returns without waiting.

pub mod attention;
pub mod elementwise;
pub mod flash_next;
pub mod fp8;
pub mod gdn;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod sample;
