//! The gate every GPU test goes through: the device to itself, or a skip
//! (or, with `KESTREL_REQUIRE_CUDA=1`, a failure) when there is none.

use std::io::Write;
use std::sync::{Mutex, PoisonError};

use kestrel_cuda::CudaBackend;

/// Held for the whole of a test: one test on the GPU at a time.
static GPU: Mutex<()> = Mutex::new(());

/// Runs `check` on a fresh backend on device 0 with no other test on the
/// GPU. Without one, prints why and returns, unless `KESTREL_REQUIRE_CUDA=1`,
/// when it panics.
pub fn with_gpu(check: impl FnOnce(CudaBackend)) {
    // A test that failed while holding the lock leaves the GPU usable.
    let _alone = GPU.lock().unwrap_or_else(PoisonError::into_inner);
    match CudaBackend::new(0) {
        Ok(gpu) => check(gpu),
        Err(e) if cuda_required() => panic!("KESTREL_REQUIRE_CUDA=1 but no CUDA device: {e}"),
        // Straight to stderr, as one write: the harness captures `println!`
        // of passing tests, and other tests' lines run alongside.
        Err(e) => {
            let line = format!("skipped: no CUDA device: {e}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// `KESTREL_REQUIRE_CUDA`: `1` requires a device, unset or `0` allows a skip;
/// anything else is a mistake that must not pass as a skip.
fn cuda_required() -> bool {
    match std::env::var("KESTREL_REQUIRE_CUDA") {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v == "0" => false,
        Ok(v) if v == "1" => true,
        other => panic!("KESTREL_REQUIRE_CUDA must be 0 or 1, not {other:?}"),
    }
}
