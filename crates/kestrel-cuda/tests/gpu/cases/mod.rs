//! The checks: each draws fresh inputs, runs the same function on the CPU
//! reference and on CUDA, and records every output's error.
//!
//! A group is the unit that runs on its own: one `#[test]` in `tests/gpu`
//! and one entry of `kernel_check --only`. Each group draws from its own
//! generator seeded with the run's seed, so a group sees the same inputs
//! whether it runs alone, in the test harness or in the full example run.

mod attention;
mod block_attention;
mod elementwise;
mod flash_next;
mod fp8;
mod gdn;
mod gdn_snapshot;
mod gdn_verify;
mod mask;
mod matmul;
mod moe;
mod norm_fused;
mod precision;
mod sample;

use kestrel_core::{Backend, BackendError, Result};
use kestrel_cpu::CpuBackend;
use kestrel_cuda::CudaBackend;

use crate::compare::{Outcome, compare};
use crate::data::Data;

pub use attention::attention;
pub use block_attention::{block_attention, block_attention_batch};
pub use elementwise::{elementwise, embedding, norms};
pub use flash_next::flash_next;
pub use fp8::fp8;
pub use gdn::gated_delta_net;
pub use mask::mask_rows;
pub use matmul::matmul;
pub use moe::moe;
pub use norm_fused::{norm_matmul, norm_moe};
pub use precision::precision_f32;
pub use sample::{argmax_rows, top_candidates, top_candidates_draw};

type Outputs = Vec<(String, Vec<f32>)>;

/// One group of checks: it records an outcome for every output it compares.
pub type Group = fn(&mut Ctx);

/// Every group, in the order the example runs them.
pub const GROUPS: [(&str, Group); 18] = [
    ("embedding", embedding),
    ("elementwise", elementwise),
    ("norms", norms),
    ("norm_matmul", norm_matmul),
    ("norm_moe", norm_moe),
    ("matmul", matmul),
    ("attention", attention),
    ("block_attention", block_attention),
    ("block_attention_batch", block_attention_batch),
    ("moe", moe),
    ("gated_delta_net", gated_delta_net),
    ("argmax_rows", argmax_rows),
    ("top_candidates", top_candidates),
    ("top_candidates_draw", top_candidates_draw),
    ("mask_rows", mask_rows),
    ("precision_f32", precision_f32),
    ("fp8", fp8),
    ("flash_next", flash_next),
];

/// The seed a run uses unless told otherwise (`kernel_check --seed`).
pub const DEFAULT_SEED: u64 = 0x6b65_7374;

/// f32 arithmetic only (summation order differs).
const TOL_F32: f64 = 1e-5;
/// Activations rounded to bf16 before a matrix product, f32 accumulation.
const TOL_BF16_MATMUL: f64 = 1e-2;
/// bf16 KV cache.
const TOL_ATTENTION: f64 = 1e-2;
/// bf16 activations into two chained expert products.
const TOL_MOE: f64 = 2e-2;
/// f32 state; long recurrences amplify rounding slightly.
const TOL_GDN: f64 = 1e-4;
/// The serving precision's chunked prefill: products of TF32-rounded
/// operands (~5e-4 relative each), carried through the state.
const TOL_GDN_TF32: f64 = 5e-3;

pub struct Ctx {
    pub cpu: CpuBackend,
    pub gpu: CudaBackend,
    pub data: Data,
    pub outcomes: Vec<Outcome>,
    /// Every group's generator starts from this.
    seed: u64,
}

impl Ctx {
    /// A context on `gpu` (outputs poisoned with NaN before every kernel, so
    /// unwritten elements fail) with no outcomes yet.
    pub fn new(mut gpu: CudaBackend, seed: u64) -> Self {
        gpu.set_poison_outputs(true);
        Ctx {
            cpu: CpuBackend::new(),
            gpu,
            data: Data::seeded(seed),
            outcomes: Vec::new(),
            seed,
        }
    }

    /// Runs one group on inputs drawn afresh from the seed; its outcomes are
    /// added to those already recorded.
    pub fn run_group(&mut self, group: Group) {
        self.data = Data::seeded(self.seed);
        group(self);
    }

    fn record(&mut self, case: &str, tol: f64, cpu: Result<Outputs>, gpu: Result<Outputs>) {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            let mut o = compare(case, what, &[], &[0.0], tol);
            o.note = Some(format!("{what} failed: {e}"));
            o
        };
        let sync = self.gpu.synchronize();
        let first = self.outcomes.len();
        match (cpu, gpu, sync) {
            (Err(e), _, _) => self.outcomes.push(failed("cpu", &e)),
            (_, Err(e), _) | (_, _, Err(e)) => self.outcomes.push(failed("cuda", &e)),
            (Ok(cpu), Ok(gpu), Ok(())) => {
                if cpu.len() != gpu.len() {
                    self.outcomes.push(failed(
                        "outputs",
                        &format!("{} vs {} outputs", gpu.len(), cpu.len()),
                    ));
                }
                for ((name, c), (_, g)) in cpu.iter().zip(&gpu) {
                    self.outcomes.push(compare(case, name, g, c, tol));
                }
            }
        }
        for o in &self.outcomes[first..] {
            println!("{}", o.line());
        }
    }
}

fn out<B: Backend>(b: &B, name: &str, t: &B::Tensor) -> (String, Vec<f32>) {
    (name.to_string(), b.to_host(t))
}

/// The same output twice from one backend, bit for bit: decode kernels must
/// not depend on timing (no atomics), or graph replays would drift from eager runs.
fn repeatable(name: &str, first: Vec<f32>, again: Vec<f32>) -> Result<(String, Vec<f32>)> {
    if first
        .iter()
        .map(|v| v.to_bits())
        .ne(again.iter().map(|v| v.to_bits()))
    {
        return Err(BackendError::Invalid(format!(
            "{name}: two runs on the same input differ"
        )));
    }
    Ok((name.to_string(), first))
}
