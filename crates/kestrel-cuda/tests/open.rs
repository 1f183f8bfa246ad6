//! Opening the backend never panics: without a driver, a device or compiled
//! kernels it returns an error that says which is missing.

use kestrel_core::Backend;
use kestrel_cuda::CudaBackend;

#[test]
fn new_reports_missing_cuda_as_an_error() {
    match CudaBackend::new(0) {
        Ok(b) => assert!(b.name().starts_with("cuda:0")),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("CUDA") || msg.contains("cuBLAS"),
                "error should name what is missing: {msg}"
            );
        }
    }
}

#[test]
fn absurd_device_ordinal_is_an_error() {
    let err = CudaBackend::new(1 << 20)
        .err()
        .expect("no machine has a million GPUs");
    assert!(!err.to_string().is_empty());
}
