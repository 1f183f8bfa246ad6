//! The host defaults of `FlashNextOps` (what a backend without its own
//! Flash-Next kernels runs, CUDA today) give the CPU backend's logits: a
//! backend that forwards every `Backend` operation to the CPU but keeps the
//! trait's defaults runs the golden fixture. Its sparse attention only takes
//! a selection of every visible position, and says so otherwise.

use std::path::PathBuf;

use kestrel_core::block_attention::HostBlockKeys;
use kestrel_core::{Backend, FlashNextOps};
use kestrel_cpu::{CpuBackend, CpuCache, CpuTensor, CpuWeight};
use kestrel_models::flash_next::FlashNext;
use kestrel_models::flash_next::runner::FlashNextRunner;

/// The CPU backend without its Flash-Next overrides.
struct HostDefaults(CpuBackend);

impl FlashNextOps for HostDefaults {}

impl Backend for HostDefaults {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Cache = CpuCache;
    type BlockKeys = HostBlockKeys;

    fn name(&self) -> String {
        "cpu without Flash-Next overrides".into()
    }

    kestrel_cpu::forward_required_to_cpu!(0);
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp/model")
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 512).collect()
}

fn logits<B: FlashNextOps>(b: &B, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let model = FlashNext::load(&model_dir(), b).unwrap();
    let mut runner = FlashNextRunner::new(b, &model, tokens.len()).unwrap();
    runner.feed_all_logits_in_chunks(tokens, chunks).unwrap()
}

#[test]
fn host_defaults_give_the_cpu_logits_within_the_indexer_budget() {
    // 19 positions: the budget's 4 blocks and the tail cover every one.
    let t = tokens(19);
    let cpu = logits(&CpuBackend::new(), &t, &[5, 1, 13]);
    let defaults = logits(&HostDefaults(CpuBackend::new()), &t, &[5, 1, 13]);
    assert!(cpu == defaults, "the defaults differ from the CPU backend");
}

#[test]
#[should_panic(expected = "sparse attention over a partial selection is not implemented")]
fn the_sparse_attention_default_refuses_a_partial_selection() {
    logits(&HostDefaults(CpuBackend::new()), &tokens(21), &[21]);
}
