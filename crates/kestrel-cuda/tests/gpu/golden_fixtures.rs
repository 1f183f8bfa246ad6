//! The golden fixtures, a module of tests per architecture: teacher-forced
//! logits and greedy continuations against transformers in the reference
//! arithmetic, the serving arithmetic run to finite logits, and recorded
//! decode equal to eager decode; plus dummy weights filled on the device.

use std::path::PathBuf;

use kestrel_cuda::Precision;
use serde_json::Value;

use crate::device::with_gpu;
use crate::golden::{self, ARCHS, arch_line, check_arch, passed};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden")
}

/// `check_arch` in `precision`, its line printed; a load or run error fails.
fn arch_record(arch: &str, precision: Precision) -> Option<Value> {
    let mut record = None;
    with_gpu(|mut gpu| {
        gpu.set_precision(precision);
        let r = check_arch(&gpu, &fixtures().join(arch))
            .unwrap_or_else(|e| panic!("{arch} in {precision:?}: {e}"));
        println!("{}", arch_line(arch, &r));
        record = Some(r);
    });
    record
}

/// Held to the fixtures' tolerance and to every greedy token.
fn f32_matches_transformers(arch: &str) {
    if let Some(r) = arch_record(arch, Precision::F32) {
        assert!(passed(&r), "{}", arch_line(arch, &r));
    }
}

/// The fixtures' routing and greedy margins are below bf16 rounding, so the
/// serving arithmetic is held only to running every prompt to finite logits
/// (`golden_check` reports how close it comes).
fn bf16_runs_to_finite_logits(arch: &str) {
    if let Some(r) = arch_record(arch, Precision::Bf16) {
        let non_finite = r["teacher_forced"]
            .as_array()
            .expect("teacher-forced records")
            .iter()
            .filter(|c| c["non_finite"].as_bool() != Some(false))
            .count();
        assert_eq!(non_finite, 0, "{}", arch_line(arch, &r));
    }
}

fn recorded_decode_equals_eager(arch: &str) {
    with_gpu(|gpu| {
        // The check opens a backend per mode; this one only proved the device.
        drop(gpu);
        let r = golden::graph_replay(&fixtures(), arch);
        assert!(passed(&r), "{r}");
    });
}

macro_rules! arch_tests {
    ($($arch:ident),* $(,)?) => {
        $(
            mod $arch {
                #[test]
                fn f32_matches_transformers() {
                    super::f32_matches_transformers(stringify!($arch));
                }

                #[test]
                fn bf16_runs_to_finite_logits() {
                    super::bf16_runs_to_finite_logits(stringify!($arch));
                }

                #[test]
                fn recorded_decode_equals_eager() {
                    super::recorded_decode_equals_eager(stringify!($arch));
                }
            }
        )*

        /// The architectures given tests above.
        const TESTED: &[&str] = &[$(stringify!($arch)),*];
    };
}

arch_tests!(qwen3, qwen3_moe, qwen3_5_moe, qwen3_next);

#[test]
fn every_fixture_architecture_has_tests() {
    assert_eq!(ARCHS.as_slice(), TESTED);
}

#[test]
fn dummy_weights_filled_on_the_device_equal_the_hosts() {
    with_gpu(|gpu| {
        let r = golden::check_dummy(&gpu);
        assert!(passed(&r), "{r}");
    });
}
