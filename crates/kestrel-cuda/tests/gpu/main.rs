//! The GPU checks as tests: every kernel group against the CPU backend and
//! the golden fixtures, one `#[test]` each. Built only with
//! `--features gpu-tests` (`cargo test -p kestrel-cuda --features gpu-tests`).
//!
//! Without a usable CUDA device every test prints `skipped: no CUDA device:
//! <reason>` and passes, so the suite runs anywhere; with
//! `KESTREL_REQUIRE_CUDA=1` a missing device fails every test instead, so a
//! run on a GPU machine cannot pass by skipping.
//!
//! The tests take the GPU one at a time (see `device`), whatever
//! `--test-threads` says: each opens a backend of its own, and a kernel fault
//! in one context would otherwise be reported by whichever test ran next.
//!
//! `cases`, `compare`, `data` and `golden` are shared with the `kernel_check`
//! and `golden_check` examples, which run the same checks into JSON reports.

mod cases;
mod compare;
mod data;
mod device;
mod golden;

mod cuda_matches_cpu;
mod engine_runs;
mod flash_next_fixture;
mod flash_next_graphs;
mod fp8_fixtures;
mod golden_fixtures;
mod mixed_steps;
mod prefix_hit;
mod speculative;
mod speculative_shapes;
