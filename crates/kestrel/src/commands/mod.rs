pub mod bench;
pub mod bench_load;
pub mod bench_model;
pub mod draft_vocab;
pub mod eval;
pub mod generate;
pub mod serve;
pub mod speculative;
